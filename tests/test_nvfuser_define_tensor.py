"""``define_tensor(sizes, strides, dtype, static_sizes, is_cpu)`` and ``ops.real``/``ops.imag`` of
``nvfuser_direct`` 0.2.36 (NVIDIA/Fuser 81c4b22: ``python/python_direct/ir.cpp``'s third
``define_tensor`` overload, ``ops.cpp``, ``csrc/ops/arith.cpp``), checked on the stand-in
``fake_nvfuser_direct`` here and on the real module on a GPU (``gpu``): the layouts, extents,
dtypes and values they give, against eager, and the errors they raise."""

import pytest
import torch

import fake_nvfuser_direct as fake


def _column_major(rows: int, cols: int, device) -> torch.Tensor:
    return torch.arange(float(rows * cols), device=device).reshape(cols, rows).t()


def _of_sizes_and_strides(module, device):
    """A tensor defined by its sizes and strides takes their contiguity and stride order
    (``computeTensorDescriptor``) and symbolic extents but at size 1 (``getTensorViewBuilderSizes``);
    ``static_sizes`` keeps them. Positionally, two lists of ints are sizes and strides: an int is no
    contiguity flag to pybind11 before its conversions. (The stand-in had no such overload, and took
    the strides for contiguity.)"""
    with module.FusionDefinition() as fd:
        a = fd.define_tensor(sizes=[2, 3], strides=[1, 2], dtype=module.DataType.Float)  # column-major
        b = fd.define_tensor([4, 1], [1, 1], module.DataType.Float, static_sizes=True)
        c = fd.define_tensor(sizes=[3, 5], strides=[0, 1])  # an expanded broadcast, a Float
        fd.add_output(fd.ops.mul(a, 2.0))
        fd.add_output(fd.ops.add(b, 1.0))
        fd.add_output(fd.ops.neg(c))
    a, b = _column_major(2, 3, device), torch.arange(4.0, device=device).reshape(4, 1)
    c = torch.arange(5.0, device=device).expand(3, 5)
    doubled, added, negated = fd.execute([a, b, c])
    assert torch.equal(doubled, a * 2) and doubled.stride() == (1, 2)  # (the input's stride order)
    assert torch.equal(added, b + 1) and torch.equal(negated, -c)
    assert [o.dtype for o in (doubled, added, negated)] == [torch.float32] * 3
    other = _column_major(5, 4, device)  # symbolic extents: another size, of the same layout
    doubled, _, _ = fd.execute([other, b, c])
    assert torch.equal(doubled, other * 2)
    with pytest.raises(RuntimeError):  # static sizes: 5 is not 4
        fd.execute([a, torch.ones(5, 1, device=device), c])


def _positionally(module, device):
    """Two lists of ints are sizes and strides, even where the strides are ones: ``[4, 1], [1, 1]``
    is no contiguity. (The stand-in took the first overload that took them with conversions.)"""
    with module.FusionDefinition() as fd:
        x = fd.define_tensor([3, 4], [1, 3])
        fd.add_output(fd.ops.exp(x))
    x = _column_major(3, 4, device)
    (out,) = fd.execute([x])
    assert torch.equal(out, x.exp()) and out.stride() == x.stride()


def test_the_stand_in_reads_two_lists_of_ints_as_sizes_and_strides_as_the_bindings_do():
    _positionally(fake, "cpu")


@pytest.mark.gpu
def test_the_real_bindings_read_two_lists_of_ints_as_sizes_and_strides(real_nvfuser):
    _positionally(real_nvfuser, "cuda")


def test_the_stand_in_defines_tensors_of_sizes_and_strides_as_the_bindings_do():
    _of_sizes_and_strides(fake, "cpu")


@pytest.mark.gpu
def test_the_real_bindings_define_tensors_of_sizes_and_strides(real_nvfuser):
    _of_sizes_and_strides(real_nvfuser, "cuda")


#: (what, the call's arguments, the exception, what its message says)
REFUSED = [
    ("2 sizes, 1 stride", dict(sizes=[2, 3], strides=[1]), RuntimeError, "number of sizes does not match"),
    ("a negative stride", dict(sizes=[2, 3], strides=[3, -1]), RuntimeError, r"negative stride .*strides\[1\]=-1"),
    ("a negative size", dict(sizes=[-1, 3], strides=[3, 1]), RuntimeError, "Size of -1 is not supported"),
    ("on the CPU", dict(sizes=[2], strides=[1], is_cpu=True), RuntimeError, "CPU non-scalar tensor is not supported"),
    ("sizes with a contiguity", dict(sizes=[2], contiguity=[True]), TypeError, "incompatible function arguments"),
    ("shape with strides", dict(shape=[2], strides=[1]), TypeError, "incompatible function arguments"),
]


def _refused(module, kwargs, error, match):
    with pytest.raises(error, match=match), module.FusionDefinition() as fd:
        fd.define_tensor(**kwargs)


@pytest.mark.parametrize(("what", "kwargs", "error", "match"), REFUSED, ids=[r[0] for r in REFUSED])
def test_the_stand_in_refuses_sizes_and_strides_the_bindings_refuse(what, kwargs, error, match):
    _refused(fake, kwargs, error, match)


@pytest.mark.gpu
@pytest.mark.parametrize(("what", "kwargs", "error", "match"), REFUSED, ids=[r[0] for r in REFUSED])
def test_the_real_bindings_refuse_them(what, kwargs, error, match, real_nvfuser):
    _refused(real_nvfuser, kwargs, error, match)


def test_the_descriptor_of_a_negative_stride_is_the_bindings_runtime_error():
    """``compute_tensor_descriptor``'s checks are ``NVF_CHECK``s (the stand-in's were asserts)."""
    with pytest.raises(RuntimeError, match=r"negative stride on tensor is not supported: strides\[0\]=-1"):
        fake.compute_tensor_descriptor([2], [-1])
    with pytest.raises(RuntimeError, match="Sizes and strides must have the same number of dimensions"):
        fake.compute_tensor_descriptor([2, 3], [1])


def _parts(module, device):
    """``real`` and ``imag`` of a complex tensor are its parts, of its real dtype; ``real`` of a
    real tensor is a copy of its dtype, a Half one's too (a ``set``). (The stand-in had neither.)"""
    with module.FusionDefinition() as fd:
        z = fd.define_tensor([-1], [True], module.DataType.ComplexFloat)
        w = fd.define_tensor([-1, -1], [True, True], module.DataType.ComplexDouble)
        h = fd.define_tensor([-1], [True], module.DataType.Half)
        for value in (z, w):
            fd.add_output(fd.ops.real(value))
            fd.add_output(fd.ops.imag(value))
        fd.add_output(fd.ops.real(h))
    z = torch.randn(5, dtype=torch.complex64, device=device)
    w = torch.randn(2, 3, dtype=torch.complex128, device=device)
    h = torch.randn(5, dtype=torch.float16, device=device)
    outs = fd.execute([z, w, h])
    expected = [z.real, z.imag, w.real, w.imag, h]
    assert [o.dtype for o in outs] == [e.dtype for e in expected]
    assert all(torch.equal(o, e) for o, e in zip(outs, expected))
    assert outs[-1].data_ptr() != h.data_ptr()


def test_the_stand_in_takes_complex_parts_as_the_bindings_do():
    _parts(fake, "cpu")


@pytest.mark.gpu
def test_the_real_bindings_take_complex_parts(real_nvfuser):
    _parts(real_nvfuser, "cuda")


def _imag_of_a_real_tensor(module):
    with (
        pytest.raises(RuntimeError, match="imag not supported for non-complex tensors"),
        module.FusionDefinition() as fd,
    ):
        fd.ops.imag(fd.define_tensor([-1], [True], module.DataType.Float))


def test_the_stand_in_refuses_imag_of_a_real_tensor_as_the_bindings_do():
    _imag_of_a_real_tensor(fake)


@pytest.mark.gpu
def test_the_real_bindings_refuse_imag_of_a_real_tensor(real_nvfuser):
    _imag_of_a_real_tensor(real_nvfuser)
