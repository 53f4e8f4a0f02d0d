"""What ``nvfuser_direct`` does with Double inputs, size-1 symbolic extents, definitions without
tensor inputs and mismatched inputs (NVIDIA/Fuser 81c4b22, ``fake_nvfuser_binding``), checked on
the stand-in here and on the real module on a GPU (``gpu``); and the nvFuser executor on fake CUDA
tensors (``FakeTensorMode``: the executor claims them as CUDA ones) against eager."""

import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import thunder_rs

import fake_nvfuser_direct as fake

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the named executor warns that the real nvfuser_direct is absent
    from thunder_rs.executors.nvfuser_ex import NvFuserExecutor
    from thunder_rs.executors.nvfuser_symbolic import symbolic_dims


def _run(module, define, *inputs, **options):
    with module.FusionDefinition() as fd:
        define(fd, module.DataType)
    return fd, fd.execute(list(inputs), **options)


# -- Double: float64 tensors, Python floats as scalars -------------------------------------------------


def _double_definition(fd, dt):
    x = fd.define_tensor(shape=[-1], contiguity=[True], dtype=dt.Double)
    s = fd.define_scalar(dtype=dt.Double)  # a symbolic scalar: an input
    fd.add_output(fd.ops.add(fd.ops.mul(x, s), fd.define_scalar(0.1)))  # a constant of a float: Double


def _check_double_inputs(module, device):
    x = torch.randn(5, dtype=torch.float64, device=device)
    fd, (out,) = _run(module, _double_definition, x, 1 / 3)
    assert out.dtype == torch.float64 and out.device == x.device
    torch.testing.assert_close(out, x * (1 / 3) + 0.1, rtol=0, atol=0)
    # A Python int is no Double scalar, a float32 tensor no Double tensor: RuntimeErrors (nvfError).
    with pytest.raises(RuntimeError, match="Scalar value 3 is not compatible with the expected data type: Double"):
        fd.execute([x, 3])
    with pytest.raises(RuntimeError, match="to be bound to a tensor of dtype Double, but got a tensor of dtype Float"):
        fd.execute([x.float(), 0.5])


def test_the_stand_in_takes_double_inputs_as_nvfuser_does():
    _check_double_inputs(fake, "cpu")


@pytest.mark.gpu
def test_the_real_bindings_take_double_inputs(real_nvfuser):
    _check_double_inputs(real_nvfuser, "cuda")


# -- a symbolic extent that is 1 ---------------------------------------------------------------------


def _iteration(fd, dt):
    x = fd.define_tensor(shape=[-1, 8], contiguity=[True, True], dtype=dt.Float)
    fd.add_output(fd.ops.mul(x, 2.0))


def _broadcast(fd, dt):  # compute_tensor_descriptor of a size-1 dim: None, an expanded broadcast at -1
    x = fd.define_tensor(shape=[-1, 8], contiguity=[None, True], dtype=dt.Float)
    fd.add_output(fd.ops.sum(fd.ops.mul(x, 2.0), [1], False, dt.Float))


def _check_size_one_extents(module, device):
    """A -1 dim defined as an iteration (contiguity True/False) binds any extent, 1 included, and
    never checks a size-1 dim's stride; defined as a broadcast (contiguity None, as
    ``compute_tensor_descriptor`` gives a size-1 dim) it is expanded to the symbolic extent: size
    1, or any size of stride 0."""
    x = torch.randn(1, 16, device=device)[:, :8]  # size 1 at the symbolic dim, stride 16
    fd, (out,) = _run(module, _iteration, x)
    torch.testing.assert_close(out, x * 2, rtol=0, atol=0)
    torch.testing.assert_close(fd.execute([torch.randn(3, 8, device=device)])[0].shape, torch.Size([3, 8]))
    assert module.compute_tensor_descriptor([1, 8], [16, 1]) == ([None, True], [1, 0])
    fd, (out,) = _run(module, _broadcast, x)
    torch.testing.assert_close(out, (x * 2).sum(1), rtol=1e-6, atol=1e-6)
    row = torch.randn(1, 8, device=device)
    torch.testing.assert_close(fd.execute([row.expand(3, 8)])[0], (row.expand(3, 8) * 2).sum(1), rtol=1e-6, atol=1e-6)
    with pytest.raises(RuntimeError, match="has expanded extent but input tensor has size 3 and stride 8"):
        fd.execute([torch.randn(3, 8, device=device)])
    with pytest.raises(RuntimeError, match="stride mismatch with contiguity info"):
        _run(module, _iteration, torch.randn(3, 16, device=device)[:, ::2])
    with pytest.raises(RuntimeError, match="The contiguity of a broadcast/reduction dimension must be None"):
        with module.FusionDefinition() as fd:  # a constant extent of 1 is a broadcast
            fd.define_tensor(shape=[1, 8], contiguity=[True, True], dtype=module.DataType.Float)


def test_the_stand_in_binds_size_one_symbolic_extents_as_nvfuser_does():
    _check_size_one_extents(fake, "cpu")


@pytest.mark.gpu
def test_the_real_bindings_bind_size_one_symbolic_extents(real_nvfuser):
    _check_size_one_extents(real_nvfuser, "cuda")


# -- a definition without tensor inputs, and the device --------------------------------------------------


def _factories(fd, dt):
    fd.add_output(fd.ops.iota(4, 0, 1, dt.Int))
    fd.add_output(fd.ops.full([2, 3], 1.5, dt.Float))


def _check_device(module):
    """With no tensor input the tensors are made on device 0 unless ``device`` says otherwise (an
    index, a CUDA ``torch.device`` or string); a CPU device is refused, as an empty definition."""
    for options in ({}, {"device": 0}, {"device": "cuda"}, {"device": torch.device("cuda:0")}):
        _, outputs = _run(module, _factories, **options)
        assert [o.device for o in outputs] == [torch.device("cuda:0")] * 2, options
        assert (outputs[0].shape, outputs[0].dtype, outputs[1].shape) == ((4,), torch.int64, (2, 3))
    with pytest.raises(AssertionError, match="must be a CUDA device"):
        _run(module, _factories, device="cpu")
    with module.FusionDefinition() as fd:
        fd.define_tensor(shape=[-1], contiguity=[True], dtype=module.DataType.Float)
    with pytest.raises(NotImplementedError, match="Fusion is empty!"):
        fd.execute([torch.randn(2, device="cuda")])


def test_the_stand_in_makes_a_definitions_tensors_without_inputs_on_device_0_or_the_one_told():
    with FakeTensorMode():  # fake CUDA tensors: the stand-in makes them where nvFuser would
        _check_device(fake)
        _, outputs = _run(fake, _factories, device=1)
        assert [o.device for o in outputs] == [torch.device("cuda:1")] * 2
    _, outputs = _run(fake, _factories)  # without: its own GPU, the CPU
    assert torch.equal(outputs[0], torch.arange(4)) and torch.equal(outputs[1], torch.full((2, 3), 1.5))


@pytest.mark.gpu
def test_the_real_bindings_make_a_definitions_tensors_without_inputs_on_device_0_or_the_one_told(real_nvfuser):
    _check_device(real_nvfuser)


# -- mismatched inputs -----------------------------------------------------------------------------------


def _two_inputs(fd, dt):
    x = fd.define_tensor(shape=[-1, 4], contiguity=[True, True], dtype=dt.Float)
    n = fd.define_scalar(dtype=dt.Int)
    fd.add_output(fd.ops.mul(x, n))


def _check_mismatched_inputs(module, device):
    """nvFuser's checks fail as ``RuntimeError``s (``nvfError`` through pybind11), with the messages
    of ``validateValWithConcreteValue`` and ``FusionKernelRuntime``."""
    x = torch.randn(3, 4, device=device)
    fd, (out,) = _run(module, _two_inputs, x, 2)
    torch.testing.assert_close(out, x * 2)
    mismatched = {
        "Inputs were not set up correctly": [x],
        "to be a scalar but got Float tensor of rank 2": [x, x],
        "to be an at::Tensor but got scalar": [2, 2],
        "to be bound to a tensor of rank 2, but got a tensor of rank 1": [x[0], 2],
        "to be bound to a tensor of dtype Float, but got a tensor of dtype Int": [x.long(), 2],
        "Tried to bind to a constant value: 4 as 5": [torch.randn(3, 5, device=device), 2],
    }
    for message, inputs in mismatched.items():
        with pytest.raises(RuntimeError, match=message):
            fd.execute(inputs)


def test_the_stand_in_refuses_mismatched_inputs_as_nvfuser_does():
    _check_mismatched_inputs(fake, "cpu")


@pytest.mark.gpu
def test_the_real_bindings_refuse_mismatched_inputs_so(real_nvfuser):
    _check_mismatched_inputs(real_nvfuser, "cuda")


# -- the executor on fake CUDA tensors ---------------------------------------------------------------------


@pytest.fixture
def cuda_ex(monkeypatch):
    """An nvFuser executor on the stand-in that claims only CUDA tensors (fake ones here)."""
    import sys  # noqa: PLC0415

    monkeypatch.setitem(sys.modules, "nvfuser_direct", fake)
    ex = NvFuserExecutor("nvfuser_fake_cuda", module=fake)
    fused, fuse = [], ex.fuse
    ex.fuse = lambda region: fused.append(fuse(region)) or fused[-1]
    ex.fused = fused
    return ex


def _mask(x):
    a = torch.arange(8, device="cuda:1", dtype=torch.float32)
    return (a[:, None] >= a[None, :]).float() * 2


def _mask_and_double(x):
    return _mask(x), x * 2


def _devices_on_fake_cuda(cuda_ex, fn) -> None:
    """``fn`` jitted with the executor on fake CUDA tensors: its outputs on eager's devices."""
    with FakeTensorMode():
        jfn = thunder_rs.jit(fn, executors=[cuda_ex, "torch"])
        x = torch.randn(3, device="cuda:0")
        for _ in range(2):
            outputs, expected = jfn(x), fn(x)
            assert [t.device for t in outputs] == [t.device for t in expected]


def test_on_fake_cuda_a_region_without_tensor_inputs_makes_its_tensors_on_eagers_device(cuda_ex):
    """nvFuser would make the mask on cuda:0; the executor tells it cuda:1 (``_told_device``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _devices_on_fake_cuda(cuda_ex, lambda x: (_mask(x),))
    assert [r.region.num_inputs for r in cuda_ex.fused] == [0] and cuda_ex.stats["failures"] == 0


def test_on_fake_cuda_a_region_whose_factories_are_on_another_device_runs_its_eager_calls(cuda_ex):
    """One region makes a mask on cuda:1 and doubles an input on cuda:0: nvFuser would make both on
    cuda:0 (one device per definition). The region runs its eager calls, with a warning."""
    with pytest.warns(UserWarning, match=r"on cuda:0, cuda:1, and nvFuser runs a definition on one device"):
        _devices_on_fake_cuda(cuda_ex, _mask_and_double)
    assert len(cuda_ex.fused) == 1 and cuda_ex.stats["failures"] == 1


def scaled(x, s):
    return (x * s + 0.1).tanh() * x.shape[0] ** -0.5


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_double_and_float_tensors_with_python_floats_are_eagers_to_the_bit(fake_ex, dtype):
    """A Python float argument is a Double scalar input: with a float64 tensor nvFuser computes in
    double as eager; with a float32 one the region casts it to Float first, as eager computes."""
    jfn = thunder_rs.jit(scaled, executors=[fake_ex, "torch"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (3, 5, 7):
            x = torch.randn(n, 4, dtype=dtype)
            for s in (1 / 3, 0.7):
                out, expected = jfn(x, s), scaled(x, s)
                assert out.dtype == expected.dtype and torch.equal(out, expected)
    assert fake_ex.stats["definitions"] >= 1 and fake_ex.stats["failures"] == 0


def test_on_fake_cuda_symbolic_regions_have_one_definition_and_eagers_layouts(cuda_ex):
    """Changing lengths on fake CUDA tensors: each region of the symbolic trace one definition
    (-1 extents, size inputs), every output eager's dtype, strides and device, each definition's
    outputs pinned to eager's layouts (the causal mask's region has factories on the device)."""
    from test_nvfuser_symbolic import causal_attention, gelu_softmax  # noqa: PLC0415

    with FakeTensorMode(allow_non_fake_inputs=True):  # the program's CPU mask buffer
        params = {
            gelu_softmax: [torch.randn(8, 8, device="cuda", dtype=torch.bfloat16)],
            causal_attention: [torch.randn(8, 8, device="cuda"), torch.randn(8, 8, device="cuda")],
        }
        for fn, rest in params.items():
            jfn = thunder_rs.jit(fn, executors=[cuda_ex, "torch"], dynamic=fn is causal_attention)
            for n in (3, 5, 7, 4):
                x = torch.randn(*(2,) * (fn is causal_attention), n, 8, device="cuda", dtype=rest[0].dtype)
                out, expected = jfn(x, *rest), fn(x, *rest)
                assert (out.dtype, out.shape, out.stride(), out.device) == (
                    expected.dtype,
                    expected.shape,
                    expected.stride(),
                    expected.device,
                )
    symbolic = [r for r in cuda_ex.fused if any(symbolic_dims(r.region.input_shapes))]
    assert len(symbolic) >= 3 and all(len(r.definitions) == 1 for r in cuda_ex.fused)
    assert (cuda_ex.stats["failures"], cuda_ex.stats["unpinned"]) == (0, 0), cuda_ex.fallbacks
