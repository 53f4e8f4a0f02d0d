"""The nvFuser executor's calls against ``nvfuser_direct`` 0.2.36's bindings (NVIDIA/Fuser 81c4b22,
``python/version.txt`` 0.2.36; ``python/python_direct/ops.cpp``, ``ir.cpp``): the stand-in
``fake_nvfuser_direct`` takes only the overloads the real module registers
(``fake_nvfuser_signatures``) and refuses what the bindings refuse with their exception types:
pybind11's ``TypeError`` for arguments no overload takes, nvFuser's ``RuntimeError`` (``NVF_CHECK``)
for values an op refuses. Each refusal is checked on the stand-in here and on the real bindings on
a GPU (``gpu``)."""

import re
import warnings
from pathlib import Path

import pytest
import torch

import thunder_rs

import fake_nvfuser_direct as fake
import fake_nvfuser_signatures as signatures

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the named executor warns that the real nvfuser_direct is absent
    from thunder_rs.executors import nvfuser_ex

EXECUTORS = Path(nvfuser_ex.__file__).parent
#: ``DataType``'s names in 0.2.36 (python_direct/enum.cpp).
DATA_TYPES = (
    "Double Float Half Int Int32 UInt64 Index Bool BFloat16 Float8_e4m3fn Float8_e5m2 Float8_e8m0fnu "
    "Float4_e2m1fn Float4_e2m1fn_x2 ComplexFloat ComplexDouble Null"
).split()


def _ops_called(path: Path) -> set:
    """The ``ops.<name>`` the executor's source calls by name (``getattr`` ones are its tables)."""
    return set(re.findall(r"\bops\.(\w+)\(", path.read_text()))


def test_every_op_the_executor_calls_is_one_of_nvfuser_direct_0_2_36():
    called = _ops_called(EXECUTORS / "nvfuser_ex.py") | _ops_called(EXECUTORS / "nvfuser_symbolic.py")
    called |= set(nvfuser_ex.UNARY) | set(nvfuser_ex.BINARY)
    assert {"pad", "iota", "stride_order", "size", "mod"} <= called  # the scan finds the calls
    assert called - set(signatures.OPS) == set()
    assert set(nvfuser_ex.DTYPES.values()) <= set(DATA_TYPES)


@pytest.mark.gpu
def test_the_real_bindings_have_every_op_and_data_type_of_the_table(real_nvfuser):
    """The table the stand-in checks calls against (``fake_nvfuser_signatures.OPS``), read from
    the sources, against the installed module."""
    assert [name for name in signatures.OPS if not hasattr(real_nvfuser.ops, name)] == []
    assert set(DATA_TYPES) <= set(real_nvfuser.DataType.__members__)


# -- what the bindings refuse ----------------------------------------------------------------------


def _tensor(module, fd, shape=(2, 3), dtype="Float"):
    return fd.define_tensor(list(shape), [True] * len(shape), getattr(module.DataType, dtype))


def _sum_with_dims_named_dim(module, fd):
    fd.ops.sum(_tensor(module, fd), dim=[0])  # the int overload's name for a list of dims


def _slice_of_a_list_and_a_tuple(module, fd):
    fd.ops.slice(_tensor(module, fd), [0, 0], (1, 1))  # one ShapeType for all of a slice's bounds


def _binary_op_by_keyword(module, fd):
    fd.ops.add(_tensor(module, fd), rhs=1.0)  # the binary macros name no argument


def _reshape_to_a_float_extent(module, fd):
    fd.ops.reshape(_tensor(module, fd), [6.0])


def _broadcast_to_an_extent_below_minus_one(module, fd):
    fd.ops.broadcast_in_dim(_tensor(module, fd), [-2, 2, 3], [1, 2])


def _broadcast_dim_named_twice(module, fd):
    fd.ops.broadcast_in_dim(_tensor(module, fd), [2, 3], [0, 0])


def _slice_ending_before_it_starts(module, fd):
    fd.ops.slice(_tensor(module, fd), [1, 2], [2, 1])


def _slice_from_a_negative_start(module, fd):
    fd.ops.slice(_tensor(module, fd), [-1, 0], [2, 3])


def _permute_of_too_few_dims(module, fd):
    fd.ops.permute(_tensor(module, fd), [0])


def _pad_with_too_many_widths(module, fd):
    fd.ops.pad(_tensor(module, fd), [1, 1, 1, 1, 1, 1])


def _iota_of_an_int_with_a_float_start(module, fd):
    fd.ops.iota(4, 0.5, 1, module.DataType.Int)


def _broadcast_dim_out_of_range(module, fd):
    fd.ops.broadcast_in_dim(_tensor(module, fd), [2, 3, 3], [0, 4])  # (the stand-in took it as dim 1)


def _broadcast_dims_out_of_order(module, fd):
    # The input's dims go to the named ones in order ([2, 1] is [1, 2]): its 2 onto an extent 3
    # (the stand-in read it as x's dim 0 to dim 2, reshaping x to (1, 3, 2)).
    fd.ops.broadcast_in_dim(_tensor(module, fd), [4, 3, 2], [2, 1])


def _squeeze_of_an_extent_3(module, fd):
    fd.ops.squeeze(_tensor(module, fd), [1])  # (the stand-in's torch squeeze left the dim as it was)


def _squeeze_of_dim_2_of_2(module, fd):
    fd.ops.squeeze(_tensor(module, fd), [2])


def _squeeze_of_an_expanded_dim(module, fd):
    x = fd.ops.broadcast_in_dim(_tensor(module, fd), [4, 2, 3], [1, 2])
    fd.ops.squeeze(x, [0])  # (squeeze_expanded=False)


def _gather_along_a_dim_out_of_range(module, fd):
    fd.ops.gather(_tensor(module, fd), _tensor(module, fd, dtype="Int"), 2)


def _sum_of_a_0_dim_tensor_over_all_dims(module, fd):
    fd.ops.sum(_tensor(module, fd, shape=()))  # (all of its dims: none; the stand-in copied it)


def _sum_over_no_dims(module, fd):
    fd.ops.sum(_tensor(module, fd), [])  # (the stand-in copied it)


def _max_of_a_complex_tensor(module, fd):
    fd.ops.max(_tensor(module, fd, dtype="ComplexFloat"), [0])  # (the stand-in failed at execute)


def _min_of_a_complex_tensor(module, fd):
    fd.ops.min(_tensor(module, fd, dtype="ComplexFloat"), [0])


def _stride_order_named_twice(module, fd):
    fd.define_tensor([2, 3], [True, True], module.DataType.Float, stride_order=[0, -2])  # (an AssertionError)


def _stride_order_out_of_range(module, fd):
    fd.define_tensor([2, 3], [True, True], module.DataType.Float, stride_order=[0, 2])


def _nextafter_of_ints(module, fd):
    fd.ops.nextafter(_tensor(module, fd, dtype="Int"), _tensor(module, fd, dtype="Int"))  # (an AssertionError)


def _var_over_no_dims(module, fd):
    fd.ops.var(_tensor(module, fd), [])  # (its mean's sum; the stand-in's torch.var took all dims)


#: (what, define(module, fd), the exception, what its message says)
REFUSED = [
    ("var over dims []", _var_over_no_dims, RuntimeError, "No reduction axis specified"),
    ("nextafter of Int", _nextafter_of_ints, RuntimeError, "Promoted type must be single or double precision"),
    ("stride_order [0, -2]", _stride_order_named_twice, RuntimeError, "duplicated stride_order entries"),
    ("stride_order [0, 2]", _stride_order_out_of_range, RuntimeError, "stride_order argument is out of range"),
    ("sum of a 0-dim tensor", _sum_of_a_0_dim_tensor_over_all_dims, RuntimeError, "No reduction axis specified"),
    ("sum over dims []", _sum_over_no_dims, RuntimeError, "No reduction axis specified"),
    ("max of ComplexFloat", _max_of_a_complex_tensor, RuntimeError, "Could not generate a min op for tensor"),
    ("min of ComplexFloat", _min_of_a_complex_tensor, RuntimeError, "Could not generate a max op for tensor"),
    ("sum(dim=[0])", _sum_with_dims_named_dim, TypeError, "incompatible function arguments"),
    ("slice bounds of a list and a tuple", _slice_of_a_list_and_a_tuple, TypeError, "incompatible function arguments"),
    ("add(x, rhs=1.0)", _binary_op_by_keyword, TypeError, "incompatible function arguments"),
    (
        "reshape to [6.0]",
        _reshape_to_a_float_extent,
        RuntimeError,
        "Unsupported iterable object type for define_vector",
    ),
    ("broadcast to -2", _broadcast_to_an_extent_below_minus_one, RuntimeError, "was neither symbolic"),
    ("broadcast dim named twice", _broadcast_dim_named_twice, RuntimeError, "is specified more than once"),
    ("broadcast dim 4 of 3", _broadcast_dim_out_of_range, RuntimeError, "Tried to access out of boundary index 4"),
    ("broadcast dims out of order", _broadcast_dims_out_of_order, RuntimeError, "Invalid expand size"),
    ("squeeze of extent 3", _squeeze_of_an_extent_3, RuntimeError, "Can not squeeze non-broadcasting dimension"),
    ("squeeze dim 2 of 2", _squeeze_of_dim_2_of_2, RuntimeError, "Squeeze dim is outside of Tensor size"),
    ("squeeze of an expanded dim", _squeeze_of_an_expanded_dim, RuntimeError, "Refusing to squeeze expanded"),
    ("slice end before start", _slice_ending_before_it_starts, RuntimeError, "greater than or equal to start_indices"),
    ("slice start -1", _slice_from_a_negative_start, RuntimeError, "start_indices must be greater than or equal to 0"),
    ("permute [0] of 2 dims", _permute_of_too_few_dims, RuntimeError, "Operator permute expects `dims`"),
    ("pad of 6 widths, 2 dims", _pad_with_too_many_widths, RuntimeError, "Number of pad widths must be at most twice"),
    ("iota Int from 0.5", _iota_of_an_int_with_a_float_start, RuntimeError, "iota: start dtype does not match"),
    ("gather along dim 2 of 2", _gather_along_a_dim_out_of_range, RuntimeError, "so dim argument must satisfy"),
]


def _check_refused(module, define, error, match):
    with pytest.raises(error, match=match), module.FusionDefinition() as fd:
        define(module, fd)


@pytest.mark.parametrize(("what", "define", "error", "match"), REFUSED, ids=[r[0] for r in REFUSED])
def test_the_stand_in_refuses_what_the_bindings_refuse(what, define, error, match):
    _check_refused(fake, define, error, match)


@pytest.mark.gpu
@pytest.mark.parametrize(("what", "define", "error", "match"), REFUSED, ids=[r[0] for r in REFUSED])
def test_the_real_bindings_refuse_it(what, define, error, match, real_nvfuser):
    _check_refused(real_nvfuser, define, error, match)


def _accepted(module, device):
    """Forms the executor uses that the bindings take: keywords by their names, tuples for shapes,
    a ``torch.Size``, a ``DataType`` positionally as ``define_scalar``'s symbolic overload, and a
    value of None as a symbolic scalar of the constant overload."""
    with module.FusionDefinition() as fd:
        x = fd.define_tensor(shape=[2, 3], contiguity=[True, True], dtype=module.DataType.Float, is_cpu=False)
        n = fd.define_scalar(module.DataType.Int)
        m = fd.define_scalar(value=None, dtype=module.DataType.Int)  # no value: an input too
        y = fd.ops.broadcast_in_dim(arg=x, shape=torch.Size([4, 2, 3]), broadcast_dims=[1, 2])
        y = fd.ops.sum(y, dims=(0,), keepdim=False, dtype=module.DataType.Float)
        y = fd.ops.slice(y, (0, 1), (2, 3), (1, 1))
        y = fd.ops.add(y, fd.ops.cast(fd.ops.mul(n, m), module.DataType.Float))
        fd.add_output(fd.ops.reshape(y, new_shape=(4,)))
    x = torch.arange(6.0, device=device).reshape(2, 3)
    (out,) = fd.execute([x, 2, 1], device=None)
    torch.testing.assert_close(out, (4 * x[:, 1:] + 2).reshape(4), rtol=0, atol=0)
    assert n.is_symbolic() and m.is_symbolic()


def _taken_as_the_bindings_take_them(module, device):
    """Broadcast dims out of order map the input's dims in order (a mask of the broadcast dims);
    a bool contiguity with a stride order leaves the broadcast dims' contiguity None in allocation
    order (``getContiguityVec``); ``squeeze_expanded`` removes an expanded broadcast. The stand-in
    broadcast x's dim 0 to dim 2, refused the column-major (1, 4) input ("The contiguity of a
    broadcast/reduction dimension must be None") and left the expanded dim 4 wide."""
    with module.FusionDefinition() as fd:
        x = fd.define_tensor([2, 3], [True, True], module.DataType.Float)
        c = fd.define_tensor([1, 4], contiguity=True, dtype=module.DataType.Float, stride_order=[0, 1])
        fd.add_output(fd.ops.broadcast_in_dim(x, [4, 2, 3], [2, 1]))
        fd.add_output(fd.ops.mul(c, 2.0))
        wide = fd.ops.broadcast_in_dim(x, [4, 2, 3], [1, 2])
        fd.add_output(fd.ops.squeeze(wide, [0], squeeze_expanded=True))  # (the stand-in left it 4 wide)
    x = torch.arange(6.0, device=device).reshape(2, 3)
    c = torch.arange(4.0, device=device).reshape(4, 1).t()
    broadcast, doubled, squeezed = fd.execute([x, c])
    torch.testing.assert_close(squeezed, x, rtol=0, atol=0)
    torch.testing.assert_close(broadcast, x.expand(4, 2, 3), rtol=0, atol=0)
    torch.testing.assert_close(doubled, c * 2, rtol=0, atol=0)


def test_the_stand_in_takes_broadcast_dims_and_contiguity_as_the_bindings_do():
    _taken_as_the_bindings_take_them(fake, "cpu")


@pytest.mark.gpu
def test_the_real_bindings_take_broadcast_dims_and_contiguity_so(real_nvfuser):
    _taken_as_the_bindings_take_them(real_nvfuser, "cuda")


def _reduced_as_the_bindings_reduce(module, device):
    """A complex sum stays complex, a bool product is an Int one, and a max or min over an empty
    dim is a full of its init (RemoveEmptyPass), where torch's raises. The stand-in summed complex
    values as Int, and its max and min of an empty dim raised torch's error."""
    with module.FusionDefinition() as fd:
        z = fd.define_tensor([-1, -1], [True, True], module.DataType.ComplexFloat)
        b = fd.define_tensor([-1], [True], module.DataType.Bool)
        e = fd.define_tensor([-1, -1], [True, True], module.DataType.Float)
        i = fd.define_tensor([-1, -1], [True, True], module.DataType.Int)
        fd.add_output(fd.ops.sum(z, [1]))
        fd.add_output(fd.ops.prod(b, [0]))
        fd.add_output(fd.ops.max(e, [1]))
        fd.add_output(fd.ops.min(e, [1], keepdim=True))
        fd.add_output(fd.ops.max(i, [1]))
    z = torch.randn(2, 3, dtype=torch.complex64, device=device)
    b = torch.tensor([True, False, True], device=device)
    e, i = torch.empty(3, 0, device=device), torch.empty(3, 0, dtype=torch.int64, device=device)
    summed, product, high, low, int_high = fd.execute([z, b, e, i])
    assert summed.dtype == torch.complex64 and product.dtype == torch.int64
    torch.testing.assert_close(summed, z.sum(1))
    assert torch.equal(product, b.prod(0))
    assert torch.equal(high, torch.full((3,), -float("inf"), device=device))
    assert torch.equal(low, torch.full((3, 1), float("inf"), device=device))
    assert torch.equal(int_high, torch.full((3,), torch.iinfo(torch.int64).min, device=device))


def _negative_stride_order(module, device):
    """A negative stride order entry counts from the end (``normalizeStrideOrder``): [-2, -1] is
    column-major. (The stand-in refused it with an AssertionError.)"""
    with module.FusionDefinition() as fd:
        c = fd.define_tensor([-1, -1], [True, True], module.DataType.Float, stride_order=[-2, -1])
        fd.add_output(fd.ops.mul(c, 2.0))
    c = torch.arange(6.0, device=device).reshape(3, 2).t()
    (doubled,) = fd.execute([c])
    assert torch.equal(doubled, c * 2)


def test_the_stand_in_wraps_a_negative_stride_order_as_the_bindings_do():
    _negative_stride_order(fake, "cpu")


@pytest.mark.gpu
def test_the_real_bindings_wrap_a_negative_stride_order(real_nvfuser):
    _negative_stride_order(real_nvfuser, "cuda")


def _promoted_to_complex(module, device):
    """A complex operand's category wins, at a floating operand's precision (``combineCategories``):
    Float and a Python complex are ComplexFloat, Int and one ComplexDouble, Double and a 0-dim
    ComplexFloat ComplexDouble. (The stand-in left out the complex operand's category: Float, Int
    and Double.)"""
    with module.FusionDefinition() as fd:
        f = fd.define_tensor([-1], [True], module.DataType.Float)
        i = fd.define_tensor([-1], [True], module.DataType.Int)
        d = fd.define_tensor([-1], [True], module.DataType.Double)
        z = fd.define_tensor([], [], module.DataType.ComplexFloat)
        fd.add_output(fd.ops.add(f, 2j))
        fd.add_output(fd.ops.mul(i, 2j))
        fd.add_output(fd.ops.add(d, z))
    f, i = torch.randn(3, device=device), torch.arange(3, device=device)
    d, z = (
        torch.randn(3, dtype=torch.float64, device=device),
        torch.tensor(1 + 2j, dtype=torch.complex64, device=device),
    )
    outs = fd.execute([f, i, d, z])
    assert [o.dtype for o in outs] == [torch.complex64, torch.complex128, torch.complex128]
    for out, expected in zip(outs, (f + 2j, i.to(torch.complex128) * 2j, d + z)):
        torch.testing.assert_close(out, expected.to(out.dtype))


def test_the_stand_in_promotes_complex_operands_as_the_bindings_do():
    _promoted_to_complex(fake, "cpu")


@pytest.mark.gpu
def test_the_real_bindings_promote_complex_operands_so(real_nvfuser):
    _promoted_to_complex(real_nvfuser, "cuda")


def test_the_stand_in_reduces_as_the_bindings_do():
    _reduced_as_the_bindings_reduce(fake, "cpu")


@pytest.mark.gpu
def test_the_real_bindings_reduce_so(real_nvfuser):
    _reduced_as_the_bindings_reduce(real_nvfuser, "cuda")


def test_the_stand_in_takes_the_forms_the_bindings_take():
    _accepted(fake, "cpu")


@pytest.mark.gpu
def test_the_real_bindings_take_them(real_nvfuser):
    _accepted(real_nvfuser, "cuda")


def test_an_execute_keyword_the_bindings_lack_is_a_type_error():
    with fake.FusionDefinition() as fd:
        fd.add_output(fd.ops.add(_tensor(fake, fd), 1.0))
    with pytest.raises(TypeError, match="unexpected keyword argument 'stream'"):
        fd.execute([torch.ones(2, 3)], stream=0)


def _sliced(x):
    return (x * 2)[1:3].exp()


def test_a_translation_calling_the_bindings_wrongly_runs_eagerly_with_their_type_error(fake_ex, monkeypatch, capsys):
    """The stand-in catches a wrong call of the executor's (a slice's bounds of a list and a tuple,
    which the old stand-in took): the region warns and runs its eager calls. Nothing is printed:
    ``FusionDefinition.__exit__`` prints an exception leaving its block, with its traceback, so the
    definition's failure is raised after the block."""
    wrong = lambda cx, a, start, end, strides: cx.ops.slice(a, list(start), tuple(end), list(strides))  # noqa: E731
    monkeypatch.setitem(nvfuser_ex.TRANSLATIONS, "slice", wrong)
    x = torch.randn(6, 4)
    with pytest.warns(UserWarning, match="incompatible function arguments"):
        out = thunder_rs.jit(_sliced, executors=[fake_ex])(x)
    torch.testing.assert_close(out, _sliced(x), rtol=0, atol=0)
    assert fake_ex.stats["failures"] == 1
    printed = capsys.readouterr()
    assert "Exception occurred" not in printed.out and "Traceback" not in printed.err
