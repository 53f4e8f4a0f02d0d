"""Op fidelity, stop 64 (the OpInfo sweep's fourth round of leftovers): what
``benchmarks/op_fidelity.py`` and its leftovers found different from eager
(benchmarks/results/op_fidelity_stop64.md).

- A Python int number argument no Scalar of eager's holds (below int64, past uint64) raises eager's
  ``OverflowError`` whatever the tensor's dtype: an integer or bool tensor's traced op took it as an
  unknown constant (``TypeError: unsupported operand``, ``got PyConst(1)``) and ``x == 2**70``
  answered ``False``. One past int64 but within uint64 (eager's uint64 Scalar) with a bool tensor
  raises eager's promotion error, with an integer tensor a refusal naming the op and the line
  (eager's kernels wrap it, each its own way), a floating one computes as eager's.
"""

from __future__ import annotations

import pytest
import torch

import thunder_rs

#: Programs taking one Python int ``v`` as a number argument of a tensor op.
SCALAR_PROGRAMS = {
    "mul": lambda x, v: x * v,
    "rmul": lambda x, v: v * x,
    "add": lambda x, v: x + v,
    "div": lambda x, v: x / v,
    "floor_divide": lambda x, v: x // v,
    "pow": lambda x, v: x**v,
    "rpow": lambda x, v: v**x,
    "clamp": lambda x, v: x.clamp(max=v),
    "eq": lambda x, v: x == v,
    "remainder": lambda x, v: x % v,
    "fmod": lambda x, v: torch.fmod(x, v),
    "add_alpha": lambda x, v: torch.add(x, x, alpha=v),
    "mul_": lambda x, v: x.clone().mul_(v),
    "fill_": lambda x, v: x.clone().fill_(v),
    "full_like": lambda x, v: torch.full_like(x, v),
    "where": lambda x, v: torch.where(torch.ones(x.shape, dtype=torch.bool), x, v),
    "masked_fill": lambda x, v: x.masked_fill(torch.ones(x.shape, dtype=torch.bool), v),
}
TENSORS = {
    "int64": torch.arange(3),
    "uint8": torch.arange(3, dtype=torch.uint8),
    "bool": torch.tensor([True, False, True]),
    "float32": torch.tensor([0.5, -1.0, 2.0]),
    "complex64": torch.tensor([0.5 + 1j, -1.0, 2j]),
}


def _raised(fn, *args) -> BaseException | None:
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001
        return e
    return None


@pytest.mark.parametrize("value", [2**70, 2**64, -(2**63) - 1, -(2**70)], ids=str)
@pytest.mark.parametrize("kind", TENSORS)
@pytest.mark.parametrize("name", SCALAR_PROGRAMS)
def test_an_int_no_scalar_holds_raises_eagers_overflow_error(name, kind, value):
    program, x = SCALAR_PROGRAMS[name], TENSORS[kind]
    expected = _raised(program, x, value)
    assert isinstance(expected, OverflowError)
    with pytest.raises(OverflowError) as raised:
        thunder_rs.jit(program)(x, value)
    assert str(expected) in str(raised.value)


@pytest.mark.parametrize("value", [2**63, 2**64 - 1], ids=str)
@pytest.mark.parametrize("name", ["mul", "add", "eq", "clamp", "mul_"])
def test_a_uint64_scalar_with_a_bool_tensor_raises_eagers_promotion_error(name, value):
    program, x = SCALAR_PROGRAMS[name], TENSORS["bool"]
    expected = _raised(program, x, value)
    assert isinstance(expected, RuntimeError)
    with pytest.raises(RuntimeError) as raised:
        thunder_rs.jit(program)(x, value)
    assert str(expected) in str(raised.value)


@pytest.mark.parametrize("value", [2**63, 2**64 - 1], ids=str)
@pytest.mark.parametrize("kind", ["int64", "uint8"])
@pytest.mark.parametrize("name", ["mul", "add", "eq", "clamp", "mul_", "pow"])
def test_a_uint64_scalar_with_an_integer_tensor_is_refused_naming_the_op_and_line(name, kind, value):
    # Eager wraps it (``arange(3) * 2**63`` is ``[0, -2**63, 0]``) or raises (``pow``): a refusal,
    # a RuntimeError as eager's are, naming the op and this file's line.
    program, x = SCALAR_PROGRAMS[name], TENSORS[kind]
    with pytest.raises(RuntimeError, match="past int64") as raised:
        thunder_rs.jit(program)(x, value)
    assert __file__ in str(raised.value)
    assert f"ltorch.{name.rstrip('_')}" in str(raised.value)


@pytest.mark.parametrize("value", [2**63, 2**64 - 1, -(2**63)], ids=str)
@pytest.mark.parametrize("kind", ["float32", "complex64"])
@pytest.mark.parametrize("name", ["mul", "add", "div", "eq", "mul_", "fill_", "full_like", "where"])
def test_an_int_past_int64_with_a_floating_tensor_computes_as_eager(name, kind, value):
    program, x = SCALAR_PROGRAMS[name], TENSORS[kind]
    expected, actual = program(x, value), thunder_rs.jit(program)(x, value)
    assert actual.dtype == expected.dtype and torch.equal(actual, expected)


# -- in-place ops on complex values ----------------------------------------------------------------

COMPLEX = [torch.complex64, torch.complex128]
#: In-place ops of complex values with gradients whose out-of-place symbols are traced for them
#: (``complex_grads``): each ran eager's op on a copy, now traced, values and gradients eager's.
COMPLEX_IN_PLACE = {
    "mul_": lambda x, w: x.mul_(w),
    "add_": lambda x, w: x.add_(w, alpha=2),
    "sub_": lambda x, w: x.sub_(w),
    "imul": lambda x, w: x.__imul__(w),
    "neg_": lambda x, w: x.neg_().mul_(w),
    "sin_": lambda x, w: x.sin_(),
    "exp_": lambda x, w: x.exp_(),
    "sqrt_": lambda x, w: x.sqrt_(),
    "reciprocal_": lambda x, w: x.reciprocal_(),
    "div_complex128": lambda x, w: x.div_(w) if x.dtype == torch.complex128 else x.mul_(w),
}


def _complex_inputs(dtype):
    gen = torch.Generator().manual_seed(3)
    return [torch.randn(5, 7, dtype=dtype, generator=gen) for _ in range(2)]


@pytest.mark.parametrize("dtype", COMPLEX, ids=str)
@pytest.mark.parametrize("name", COMPLEX_IN_PLACE)
def test_an_in_place_op_of_complex_values_with_gradients_is_traced_as_eager(name, dtype):
    op = COMPLEX_IN_PLACE[name]

    def program(z, w):
        x = z * 1  # (a non-leaf: written in place)
        return op(x, w) * 2, x

    z, w = _complex_inputs(dtype)
    leaves = [z.requires_grad_(), w.requires_grad_()]
    assert thunder_rs.examine(program, *leaves).fallbacks == {}  # (traced, not eager's op on a copy)
    results = []
    for fn in (program, thunder_rs.jit(program)):
        out, written = fn(*leaves)
        cotangent = torch.randn(out.shape, dtype=dtype, generator=torch.Generator().manual_seed(4))
        grads = torch.autograd.grad(out, leaves, cotangent, allow_unused=True)
        results.append([out.detach(), written.detach(), *grads])
    for e, a in zip(*results):
        assert (a is None) == (e is None)
        assert a is None or (torch.equal(a, e) and a.stride() == e.stride())


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("name", ["div_", "true_divide_", "itruediv"])
def test_an_in_place_complex64_division_is_eagers_in_place_kernel(name, requires_grad):
    """Eager's in-place complex64 division rounds otherwise than its out-of-place one (for some
    values, at most lengths: 12 here), which the trace computed as ``z / w``."""
    ops = {"div_": torch.Tensor.div_, "true_divide_": torch.Tensor.true_divide_, "itruediv": torch.Tensor.__itruediv__}

    def program(z, w):
        x = z * 1
        return ops[name](x, w)

    torch.manual_seed(1)
    z, w = torch.randn(4, 3, dtype=torch.complex64), torch.randn(4, 3, dtype=torch.complex64)
    results = []
    for fn in (program, thunder_rs.jit(program)):
        leaves = [z.detach().clone().requires_grad_(requires_grad), w.detach().clone().requires_grad_(requires_grad)]
        out = fn(*leaves)
        grads = torch.autograd.grad(out, leaves, torch.ones_like(out)) if requires_grad else ()
        results.append([out.detach(), *grads])
    assert all(torch.equal(a, e) for a, e in zip(*results))


@pytest.mark.parametrize(
    "op",
    [
        lambda x, z: x.mul_(z),
        lambda x, z: x.add_(z),
        lambda x, z: x.div_(z),
        lambda x, z: x.mul_(2j),
        lambda x, z: x.__iadd__(z),
    ],
)
def test_a_complex_result_written_into_a_real_tensor_raises_eagers_error(op):
    z = torch.randn(3, dtype=torch.complex64)

    def program(x, z):
        return op(x.clone(), z)

    with pytest.raises(RuntimeError) as expected:
        program(torch.randn(3), z)
    with pytest.raises(RuntimeError) as raised:
        thunder_rs.jit(program)(torch.randn(3), z)
    assert str(expected.value) in str(raised.value)


# -- complex ops with gradients made native --------------------------------------------------------

_MASK = torch.tensor([[True, False, True, False, False, True, True]] * 5)
#: Complex ops with gradients that ran eager's op: traced (their decompositions move, select,
#: repeat, multiply or scale by real numbers, and their grad rules move or scale the cotangent).
COMPLEX_NATIVE = {
    "mean": lambda z, w: z.mean(),
    "mean_dim": lambda z, w: torch.mean(z, 1, keepdim=True) * w,
    "masked_fill": lambda z, w: z.masked_fill(_MASK, 0.5) * w,
    "masked_fill_tensor": lambda z, w: z.masked_fill(_MASK, w[0, 0]),
    "diff": lambda z, w: torch.diff(z, dim=1, prepend=w[:, :1]),
    "outer": lambda z, w: torch.outer(z[0], w[1]),
    "kron": lambda z, w: torch.kron(z[:2, :3], w[:3, :2]),
    "repeat_interleave": lambda z, w: z.repeat_interleave(2, dim=0) * 2,
    "fill": lambda z, w: torch.fill(z * w, 2.0),
    "diag_embed": lambda z, w: torch.diag_embed(z, offset=1) * 3,
    "diagflat": lambda z, w: torch.diagflat(z[:2]),
    "diagonal_scatter": lambda z, w: torch.diagonal_scatter(z, w.diagonal()),
    "cartesian_prod": lambda z, w: torch.cartesian_prod(z[0, :3], w[1, :2]),
    "to_complex128": lambda z, w: z.to(torch.complex128) * 2,
}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("dtype", COMPLEX, ids=str)
@pytest.mark.parametrize("name", COMPLEX_NATIVE)
def test_a_complex_op_with_gradients_is_traced_as_eager(name, dtype):
    program = COMPLEX_NATIVE[name]
    z, w = (t.requires_grad_() for t in _complex_inputs(dtype))
    assert thunder_rs.examine(program, z, w).fallbacks == {}  # (traced, not eager's op)
    results = []
    for fn in (program, thunder_rs.jit(program)):
        out = fn(z, w)
        cotangent = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(6))
        results.append([out.detach(), *torch.autograd.grad(out, [z, w], cotangent, allow_unused=True)])
    for e, a in zip(*results):
        assert (a is None) == (e is None)
        assert a is None or (a.dtype == e.dtype and torch.equal(a, e) and a.stride() == e.stride())


@pytest.mark.parametrize("op", [torch.select_scatter, torch.slice_scatter])
def test_scatters_into_complex_values_with_gradients_raise_eagers_error(op):
    # (eager's autograd refuses their complex outputs: they stay eager's op)
    z, w = (t.requires_grad_() for t in _complex_inputs(torch.complex64))
    args = (w[1], 0, 2) if op is torch.select_scatter else (w[:, 1:3], 1, 2, 4)
    with pytest.raises(NotImplementedError, match="does not support automatic differentiation"):
        op(z, *args)
    with pytest.raises(NotImplementedError, match="does not support automatic differentiation"):
        thunder_rs.jit(op)(z, *args)


def _column_major(t):
    return t.t().contiguous().t()


#: ``mm`` and ``addmm`` of complex values with gradients: eager's ``mm_mat1_backward`` and
#: ``mm_mat2_backward`` conjugated (``g @ mat2.t().conj()``, ``mat1.t().conj() @ g``), laid out as
#: eager's (column-major where the operand is).
PRODUCTS = {
    "mm": (lambda a, b, c: a.mm(b), lambda t: t),
    "mm_column_major": (lambda a, b, c: torch.mm(a, b), _column_major),
    "addmm": (lambda a, b, c: torch.addmm(c, a, b, beta=0.5, alpha=2), lambda t: t),
    "addmm_broadcast": (lambda a, b, c: torch.addmm(c[0], a, b), _column_major),
}


@pytest.mark.parametrize("dtype", COMPLEX, ids=str)
@pytest.mark.parametrize("shapes", [((7, 9), (9, 5)), ((33, 17), (17, 40))], ids=str)
@pytest.mark.parametrize("name", PRODUCTS)
def test_a_complex_matrix_product_with_gradients_is_traced_as_eager(name, shapes, dtype):
    program, layout = PRODUCTS[name]
    gen = torch.Generator().manual_seed(7)
    a, b = (
        layout(torch.randn(shapes[0], dtype=dtype, generator=gen)),
        torch.randn(shapes[1], dtype=dtype, generator=gen),
    )
    c = torch.randn(shapes[0][0], shapes[1][1], dtype=dtype, generator=gen)
    leaves = [t.requires_grad_() for t in (a, b, c)]
    assert thunder_rs.examine(program, *leaves).fallbacks == {}
    results = []
    for fn in (program, thunder_rs.jit(program)):
        out = fn(*leaves)
        cotangent = torch.randn(out.shape, dtype=dtype, generator=torch.Generator().manual_seed(8))
        results.append([out.detach(), *torch.autograd.grad(out, leaves, cotangent, allow_unused=True)])
    for e, a in zip(*results):
        assert (a is None) == (e is None)
        assert a is None or (torch.equal(a, e) and a.stride() == e.stride())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, *COMPLEX], ids=str)
@pytest.mark.parametrize("argument", ["end", "weight"])
def test_lerp_of_mixed_dtypes_raises_eagers_message(argument, dtype):
    # (eager names the dtypes by their C++ types: ``float``, ``c10::complex<float>``)
    other = torch.float64 if dtype != torch.float64 else torch.complex64
    x, y = torch.ones(3, dtype=dtype), torch.ones(3, dtype=other)

    def program(x, y):
        return torch.lerp(x, y, 0.5) if argument == "end" else torch.lerp(x, x, y)

    with pytest.raises(RuntimeError) as expected:
        program(x, y)
    with pytest.raises(RuntimeError) as raised:
        thunder_rs.jit(program)(x, y)
    assert str(expected.value) in str(raised.value)


@pytest.mark.parametrize("dtype", COMPLEX, ids=str)
@pytest.mark.parametrize(
    ("shapes", "traced"),
    [(((7, 9), (9, 5)), True), (((9,), (9,)), True), (((7, 9), (9,)), True), (((9,), (9, 5)), False)],
    ids=str,
)
def test_a_complex_matmul_of_matrices_and_vectors_with_gradients_is_traced_as_eager(shapes, traced, dtype):
    # (``torch.matmul``: eager's mm/mv/dot backward conjugated; a vector times a matrix, whose
    # vector gradient eager's mm of a conjugate view sums otherwise, stays eager's op)
    gen = torch.Generator().manual_seed(9)
    leaves = [torch.randn(s, dtype=dtype, generator=gen).requires_grad_() for s in shapes]

    def program(a, b):
        return a @ b

    assert (thunder_rs.examine(program, *leaves).fallbacks == {}) == traced
    results = []
    for fn in (program, thunder_rs.jit(program)):
        out = fn(*leaves)
        cotangent = torch.randn(out.shape, dtype=dtype, generator=torch.Generator().manual_seed(10))
        results.append([out.detach(), *torch.autograd.grad(out, leaves, cotangent)])
    assert all(torch.equal(a, e) and a.stride() == e.stride() for a, e in zip(*results))
