"""A CUDA device named without an index (``"cuda"``, ``torch.device("cuda")``, ``Tensor.cuda()``)
is the current CUDA device, as in eager: factories put their tensors there, ``Tensor.to`` and
``Tensor.cuda`` move a tensor on another CUDA device there, and the tensor itself where it is there
already. Checked on fake CUDA tensors (``FakeTensorMode`` puts ``cuda`` on ``cuda:0``), with a GPU
twin on real tensors (gpu_check's selection).
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import thunder_rs
from thunder_rs.core.lang import devices
from thunder_rs.errors import ThunderRuntimeError

#: Programs that meet a CUDA tensor with a tensor made on ``"cuda"``.
FACTORIES = {
    "ones": lambda x: x + torch.ones(5, device="cuda"),
    "full": lambda x: x + torch.full((5,), 2.0, device=torch.device("cuda")),
    "arange": lambda x: x + torch.arange(5, device="cuda"),
    "linspace": lambda x: x + torch.linspace(0, 1, 5, device="cuda"),
    "eye": lambda x: x @ torch.eye(5, device="cuda"),
    "zeros_like": lambda x: x + torch.zeros_like(x, device="cuda"),
    "new_ones": lambda x: x + x.new_ones(5, device="cuda"),
    "randn": lambda x: x + torch.randn(5, device="cuda"),
    "randint": lambda x: x + torch.randint(0, 4, (5,), device="cuda"),
    "tril_indices": lambda x: x[:2, :3] + torch.tril_indices(3, 3, device="cuda")[:, :3],
    "empty_filled": lambda x: x + torch.empty(5, device="cuda").fill_(1),
    "Tensor.cuda": lambda x: x + torch.ones(5).cuda(),
}
#: Moves to a CUDA device named without an index.
MOVES = {
    "to": lambda x: x.to("cuda"),
    "to_device_dtype": lambda x: x.to(torch.device("cuda"), torch.float64),
    "cuda": lambda x: x.cuda(),
    "as_tensor": lambda x: torch.as_tensor(x, device="cuda"),
}

#: Calls run as eager fallbacks that take a CPU tensor and put their result where ``device`` says.
NAMED_DEVICES = {
    "randn_like": lambda x, y: y + torch.randn_like(x, device="cuda"),
    "rand_like": lambda x, y: y + torch.rand_like(x, device="cuda:0"),
    "randint_like": lambda x, y: y + torch.randint_like(x, 3, device="cuda"),
    "new_tensor": lambda x, y: y + x.new_tensor([1.0, 2.0, 3.0, 4.0, 5.0], device="cuda"),
}


def _metadata(t):
    return (t.device, t.dtype, tuple(t.shape), t.stride())


@pytest.mark.parametrize("name", FACTORIES)
def test_a_tensor_made_on_cuda_without_an_index_meets_a_cuda_tensor_as_in_eager(name):
    """It was made on ``cuda`` where the input is on ``cuda:0``: the compile raised "expected all
    tensors on one device, got ['cuda', 'cuda:0']" (``Tensor.cuda()``'s result was traced on the
    CPU) where eager computes."""
    fn = FACTORIES[name]
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.randn(2, 5, device="cuda")
        assert _metadata(thunder_rs.jit(fn)(x)) == _metadata(fn(x))


@pytest.mark.parametrize("name", MOVES)
@pytest.mark.parametrize("device", ["cuda:0", "cuda:1"])
def test_a_move_to_cuda_without_an_index_goes_to_the_current_device_as_in_eager(name, device):
    """A tensor on ``cuda:1`` sent to ``cuda`` while ``cuda:0`` is current is copied there (it was
    returned as it was, on ``cuda:1``); one on ``cuda:0`` is returned itself."""
    fn = MOVES[name]
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.randn(2, 5, device=device)
        expected, out = fn(x), thunder_rs.jit(fn)(x)
        assert _metadata(out) == _metadata(expected)
        assert (out is x) == (expected is x)


def test_tensor_cuda_takes_eagers_arguments():
    """``Tensor.cuda(device, non_blocking, memory_format)``: an index, a memory format, and eager's
    error for a device that is not a CUDA one, naming the op."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.randn(2, 3, 4, 5)
        for fn in (
            lambda x: x.cuda(1) * 2,
            lambda x: x.cuda(non_blocking=True, memory_format=torch.channels_last) * 2,
            lambda x: x.cuda("cuda:1").cuda() + 1,
        ):
            assert _metadata(thunder_rs.jit(fn)(x)) == _metadata(fn(x))
        with pytest.raises(RuntimeError, match="Invalid device, must be cuda device"):
            x.cuda("cpu")
        with pytest.raises(ThunderRuntimeError, match="ltorch.cuda: Invalid device, must be cuda device"):
            thunder_rs.jit(lambda x: x.cuda("cpu"))(x)


def test_a_change_of_the_current_cuda_device_compiles_again(monkeypatch):
    """The program was traced with ``cuda`` as ``cuda:0``: after ``torch.cuda.set_device(1)`` eager
    makes its tensors on ``cuda:1``, so the entry holds only while the current device is the one
    it was traced with (the trace then names ``cuda:1``). Programs that name no such device read
    nothing."""
    current = [0]
    monkeypatch.setattr(devices, "current_cuda_index", lambda: current[0])
    jf = thunder_rs.jit(lambda x: (x * 2, torch.ones(5, device="cuda")))
    plain = thunder_rs.jit(lambda x: x * 2)
    x = torch.randn(2, 5)
    with FakeTensorMode(allow_non_fake_inputs=True):
        for index in (0, 1, 1):
            current[0] = index
            jf(x)
            plain(x)
            assert f"cuda:{index} f32[5]" in str(thunder_rs.last_traces(jf)[-1])
    assert thunder_rs.cache_misses(jf) == 2 and thunder_rs.cache_misses(plain) == 1


@pytest.mark.parametrize("in_dims", [0, 1])
def test_device_moves_under_vmap_are_batched_as_in_eager(in_dims):
    """``r.cuda()`` and ``r.cpu()`` of a mapped tensor move its physical tensor, the levels where
    they were (they had no batching rule: the compile raised where eager computes)."""
    fn = torch.vmap(lambda r: r.cuda().cpu().cuda(0) * 2, in_dims=in_dims)
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.randn(2, 3)
        assert _metadata(thunder_rs.jit(fn)(x)) == _metadata(fn(x))


class _MovesItself(torch.nn.Module):
    """A module whose forward moves itself to the current CUDA device (where it is already)."""

    def __init__(self, device):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4, device=device)

    def forward(self, x):
        self.cuda()
        self.to("cuda")
        return self.linear(x.cuda())


def test_a_module_moving_itself_to_the_cuda_device_it_is_on_is_left_as_eager_leaves_it():
    """``self.cuda()`` in a forward, the parameters on the current device already: eager's
    ``Tensor.cuda`` returns each parameter itself, so the module stays as it is. The fallback that
    ran ``Tensor.cuda`` made new tensors, and the compile refused it as a conversion of the
    module's parameters."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        module, x = _MovesItself("cuda"), torch.randn(2, 4)
        expected = module.linear(x.cuda())
        assert _metadata(thunder_rs.jit(module)(x)) == _metadata(expected)


@pytest.mark.gpu
def test_on_cuda_devices_without_an_index_are_the_current_one_as_in_eager():
    """The GPU twin: values as eager's, aliases as eager's, and on a machine with two GPUs a
    tensor on the second one moved to ``cuda``, and the current device changed between calls."""
    x, on_cpu = torch.randn(2, 5, device="cuda"), torch.randn(2, 5)
    calls = [(fn, (x,)) for fn in (*FACTORIES.values(), *MOVES.values())]
    for fn, args in calls + [(fn, (on_cpu, x)) for fn in NAMED_DEVICES.values()]:
        torch.manual_seed(0)
        expected = fn(*args)
        torch.manual_seed(0)
        out = thunder_rs.jit(fn)(*args)
        assert _metadata(out) == _metadata(expected) and (out is x) == (expected is x)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
    module = _MovesItself("cuda")
    torch.testing.assert_close(thunder_rs.jit(module)(x.cpu()), module(x.cpu()), rtol=0, atol=0)
    if torch.cuda.device_count() < 2:
        return
    x1 = torch.randn(2, 5, device="cuda:1")
    jf = thunder_rs.jit(lambda x: x.to("cuda") + torch.ones(5, device="cuda"))
    assert jf(x1).device == torch.device("cuda:0")
    with torch.cuda.device(1):
        assert jf(x1).device == torch.device("cuda:1")


@pytest.mark.parametrize("name", NAMED_DEVICES)
def test_a_call_run_eagerly_puts_its_result_on_the_device_it_names(name):
    """Its output was traced on its first tensor's device (the CPU): the compile raised "expected
    all tensors on one device, got ['cpu', 'cuda:0']" where eager computes."""
    fn = NAMED_DEVICES[name]
    with FakeTensorMode(allow_non_fake_inputs=True):
        x, y = torch.randn(2, 5), torch.randn(2, 5, device="cuda")
        assert _metadata(thunder_rs.jit(fn)(x, y)) == _metadata(fn(x, y))
