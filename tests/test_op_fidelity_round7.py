"""Op fidelity, round 7: outputs and gradients bit-equal to eager's (``torch.equal``) where
eager's kernels are the ones compiled calls run.

- ``torch.cat`` skips a legacy empty operand of shape ``(0,)``; eager's ``cat_tensors_backward``
  still gives it a gradient, ``zeros((0,))``, where the trace gave none (``None``).
- ``torch.remainder``/``fmod`` of operands of two dtypes: the divisor's gradient is eager's
  ``-grad * dividend.div(divisor, rounding_mode=...)`` in the result's dtype, summed, then
  converted; round 6's rule took one dtype only and the VJP divided the converted operands (an
  integer dividend over a bfloat16 divisor: whole units off). A number dividend has no
  derivative in eager (its backward raises): a divisor requiring grad is refused, not
  differentiated.
"""

from __future__ import annotations

import pytest
import torch

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError

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
def test_a_remainder_of_a_number_by_a_tensor_requiring_grad_is_refused(program):
    divisor = torch.rand(8) + 0.5
    with pytest.raises(RuntimeError, match="derivative for aten::remainder is not implemented"):
        program(divisor.requires_grad_()).sum().backward()
    with pytest.raises(ThunderNotImplementedError, match="derivative for aten::remainder is not implemented"):
        thunder_rs.jit(program)(divisor)
    divisor.requires_grad_(False)
    assert torch.equal(thunder_rs.jit(program)(divisor), program(divisor))
