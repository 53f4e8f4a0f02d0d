"""Op fidelity, round 7: outputs and gradients bit-equal to eager's (``torch.equal``) where
eager's kernels are the ones compiled calls run.

- ``torch.cat`` skips a legacy empty operand of shape ``(0,)``; eager's ``cat_tensors_backward``
  still gives it a gradient, ``zeros((0,))``, where the trace gave none (``None``).
- ``torch.remainder``/``fmod`` of operands of two dtypes: the divisor's gradient is eager's
  ``-grad * dividend.div(divisor, rounding_mode=...)`` in the result's dtype, summed, then
  converted; round 6's rule took one dtype only and the VJP divided the converted operands (an
  integer dividend over a bfloat16 divisor: whole units off). A number dividend has no
  derivative in eager (its backward raises): with a divisor requiring grad the call runs as
  eager's, its backward raising eager's error.
- ``torch.cumprod``'s gradient is eager's ``cumprod_backward`` kernel, which the torch executor
  runs (``ltorch.cumprod_backward``): without a zero it is ``reversed_cumsum(out * g) / x``, with
  one an O(n) pass whose sums round otherwise than the prim's VJP (ulps, bfloat16's more).
- ``index_fill``'s value gradient is eager's ``grad.index_select(dim, _unique(index)).sum()``
  (``ltorch.index_fill_value_backward``), the selected slices summed in the index's sorted order,
  each once; the VJP summed the filled elements where they lie (an ulp off).
- ``Tensor.__rpow__`` of two tensors (``b ** a``) has pow's rule with the operands swapped: the
  VJP had no ``exponent == 0`` mask and summed broadcast operands in another order (ulps).
- ``torch.linalg.multi_dot`` of three matrices: eager multiplies ``A(BC)`` where its cost is lower,
  else ``(AB)C`` (ties too); the comparison was inverted (ulps in outputs and gradients).
- ``torch.quantile``/``nanquantile`` (their decomposition, when the input requires grad) interpolate
  with ``torch.lerp``, eager's ``values_below.lerp_(values_above, weights)``, whose vector loop takes
  each value as one FMA; the formula's ops rounded apart (an ulp off). Their ranks are float64
  (eager's ``q.to(kDouble) * last_index``) and the weights those fractions cast to the dtype: the
  float32 ranks of a float32 ``q`` were off where ``q * (n - 1)`` rounds (``0.37 * 36``).
"""

from __future__ import annotations

import pytest
import torch

import thunder_rs

pytestmark = pytest.mark.usefixtures("one_thread")


def _grads(fn, args, cotangent_seed=7):
    """The outputs of ``fn`` on ``args`` and the gradients of the ones requiring grad."""
    out = fn(*args)
    wanting = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    g = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(cotangent_seed))
    grads = torch.autograd.grad(out, wanting, g.to(out.dtype), allow_unused=True)
    return out.detach(), grads


def _assert_eager(fn, *args):
    expected, expected_grads = _grads(fn, args)
    actual, actual_grads = _grads(thunder_rs.jit(fn), args)
    assert actual.dtype == expected.dtype and torch.equal(actual, expected)
    assert len(actual_grads) == len(expected_grads)
    for i, (a, e) in enumerate(zip(actual_grads, expected_grads)):
        assert (a is None) == (e is None), (i, a, e)
        if e is not None:
            assert a.dtype == e.dtype and a.shape == e.shape and torch.equal(a, e), (i, a, e)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("where", ["first", "middle", "all"])
def test_a_legacy_empty_cat_operand_gets_eager_s_empty_gradient(dtype, where):
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(2, 3, generator=gen).to(dtype).requires_grad_()
    c = torch.randn(2, 2, generator=gen).to(dtype).requires_grad_()
    empty = torch.zeros(0, dtype=torch.float64, requires_grad=True)
    other = torch.zeros(0, dtype=dtype, requires_grad=True)
    if where == "first":
        _assert_eager(lambda e, a, c: torch.cat([e, a, c], 1), empty, a, c)
    elif where == "middle":
        _assert_eager(lambda a, e, c: torch.cat([a, e, c], -1), a, empty, c)
    else:
        _assert_eager(lambda e, o: torch.cat([e, o]), other, empty)


_MIXED = [
    (torch.int64, torch.bfloat16),
    (torch.int64, torch.float32),
    (torch.bfloat16, torch.float32),
    (torch.float32, torch.bfloat16),
    (torch.float64, torch.bfloat16),
]


@pytest.mark.parametrize("op", [torch.remainder, torch.fmod])
@pytest.mark.parametrize(("dividend_dtype", "divisor_dtype"), _MIXED)
@pytest.mark.parametrize("divisor_shape", [(64,), (), (4, 1)])
def test_the_divisor_s_gradient_of_a_mixed_dtype_remainder_is_eager_s(op, dividend_dtype, divisor_shape, divisor_dtype):
    gen = torch.Generator().manual_seed(1)
    dividend = (torch.randn(4, 64, generator=gen) * 1000).to(dividend_dtype)
    if dividend_dtype.is_floating_point:
        dividend.requires_grad_()
    divisor = (torch.rand(divisor_shape, generator=gen) * 5 + 0.5).to(divisor_dtype).requires_grad_()
    _assert_eager(lambda a, b: op(a, b), dividend, divisor)


@pytest.mark.parametrize("program", [lambda b: torch.remainder(764.0, b), lambda b: 3 % b])
def test_a_remainder_of_a_number_by_a_tensor_requiring_grad_raises_at_the_backward_as_eager(program):
    divisor = torch.rand(8) + 0.5
    for fn in (program, thunder_rs.jit(program)):
        with pytest.raises(RuntimeError, match="derivative for aten::remainder is not implemented"):
            fn(divisor.requires_grad_()).sum().backward()
    divisor.requires_grad_(False)
    assert torch.equal(thunder_rs.jit(program)(divisor), program(divisor))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("zeros", [0, 1, 3])
def test_cumprod_s_gradient_is_eager_s_kernel(dtype, zeros):
    gen = torch.Generator().manual_seed(zeros)
    for shape, dim in [((300,), 0), ((40, 33), 0), ((3, 4, 5), -1)]:
        x = torch.randn(shape, generator=gen).to(dtype)
        x.view(-1)[torch.randperm(x.numel(), generator=gen)[:zeros]] = 0
        _assert_eager(lambda x: torch.cumprod(x, dim), x.requires_grad_())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("value_dtype", ["same", "float64"])
def test_index_fill_s_value_gradient_is_eager_s_sum(dtype, value_dtype):
    gen = torch.Generator().manual_seed(2)
    for shape, dim, index in [((5, 7), 1, [0, 2, 6, 6, 2]), ((40, 33), 0, [3, 1, 0, 0, 39, 3]), ((300,), 0, [7, 299])]:
        x = torch.randn(shape, generator=gen).to(dtype).requires_grad_()
        value = torch.tensor(0.25, dtype=dtype if value_dtype == "same" else torch.float64, requires_grad=True)
        i = torch.tensor(index)
        _assert_eager(lambda x, v: torch.index_fill(x, dim, i, v), x, value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("shape", "other_shape"), [((), ()), ((5, 1), (5,)), ((5, 10, 5), (10, 5)), ((10, 1, 5), (1, 10, 5))]
)
def test_rpow_of_two_tensors_has_pow_s_gradients(dtype, shape, other_shape):
    gen = torch.Generator().manual_seed(3)
    exponent = (torch.rand(shape, generator=gen) * 4 - 2).to(dtype).requires_grad_()
    base = (torch.rand(other_shape, generator=gen) * 3 + 0.1).to(dtype).requires_grad_()
    _assert_eager(lambda a, b: a.__rpow__(b), exponent, base)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "shapes",
    [
        [(2, 2), (2, 2), (2, 2)],
        [(2, 3), (3, 4), (4, 5)],
        [(5, 4), (4, 3), (3, 2)],
        [(7, 2), (2, 9), (9, 3)],
        [(6,), (6, 5), (5,)],
    ],
)
def test_multi_dot_of_three_multiplies_in_eager_s_order(dtype, shapes):
    gen = torch.Generator().manual_seed(4)
    mats = [torch.randn(s, generator=gen).to(dtype).requires_grad_() for s in shapes]
    _assert_eager(lambda a, b, c: torch.linalg.multi_dot([a, b, c]), *mats)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("shape", "dim"), [((1000,), None), ((5, 300), 1), ((64, 37), 1), ((300, 5), 0)])
@pytest.mark.parametrize("op", [torch.quantile, torch.nanquantile])
@pytest.mark.parametrize("q", ["grid", "drawn", 0.37])
def test_quantile_interpolates_with_eager_s_ranks_and_lerp_kernel(dtype, shape, dim, op, q):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(shape, generator=gen).to(dtype)
    if op is torch.nanquantile:
        x.view(-1)[torch.randperm(x.numel(), generator=gen)[:7]] = float("nan")
    if q == "grid":
        q = torch.linspace(0, 1, 17, dtype=dtype)
    elif q == "drawn":
        q = torch.rand(9, generator=gen).to(dtype)
    for interpolation in ("linear", "midpoint", "nearest"):
        _assert_eager(lambda x: op(x, q, dim=dim, interpolation=interpolation), x.requires_grad_())
