"""Grad rules of the order statistics whose decomposition routes the gradient elsewhere than eager:
median and nanmedian of a whole tensor, and max and min of a whole tensor, share it among every
element equal to the result (NaN ones when it is NaN; amax's rule, which the decomposition of
max would take, gives NaN everywhere then, as eager's amax does); along a dim median, mode and
kthvalue send it to the index eager's kernel returns (for ties, kthvalue's and median's selection
picks another than a stable sort's).
"""

from thunder_rs.torch.symbols import ltorch
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad


def _evenly_distributed(g, x, value):
    """Eager's ``evenly_distribute_backward``."""
    value_is_nan = ltorch.ne(value, value)
    mask = ltorch.where(value_is_nan, ltorch.ne(x, x), ltorch.eq(x, value))
    return ltorch.where(mask, ltorch.true_divide(g, ltorch.sum(mask)), 0.0)


def _to_the_returned_index(out, input, dim, keepdim):
    """``out`` (values, indices) of a selection along ``dim``, run as eager's kernel, with the
    gradient of its values scattered to its indices (eager's value_selecting_reduction_backward)."""
    g = get_grad(out.values)
    if input.ndim == 0:
        put_grad(input, g)
        return out
    indices = out.indices
    if not keepdim:
        g, indices = ltorch.unsqueeze(g, dim), ltorch.unsqueeze(indices, dim)
    put_grad(input, ltorch.scatter_add(ltorch.zeros_like(input), dim, indices, g))
    return out


def _define_full_median_grad(symbol):
    @register_grad(symbol)
    def full_median_grad(input, dim=None, keepdim=False):
        out = symbol(input, dim, keepdim)
        if input.numel() == 0:
            return out
        if dim is not None:
            return _to_the_returned_index(out, input, dim, keepdim)
        put_grad(input, ltorch.to(_evenly_distributed(get_grad(out), input, out), input.dtype))
        return out

    return full_median_grad


median_grad = _define_full_median_grad(ltorch.median)
nanmedian_grad = _define_full_median_grad(ltorch.nanmedian)


@register_grad(ltorch.mode)
def mode_grad(input, dim=-1, keepdim=False):
    return _to_the_returned_index(ltorch.mode(input, dim, keepdim), input, dim, keepdim)


@register_grad(ltorch.kthvalue)
def kthvalue_grad(input, k, dim=-1, keepdim=False):
    return _to_the_returned_index(ltorch.kthvalue(input, k, dim, keepdim), input, dim, keepdim)


def _define_full_extremum_grad(symbol):
    """``torch.max(x)``/``torch.min(x)``: eager's ``evenly_distribute_backward``. The other forms
    (along a dim, elementwise) differentiate their decomposition."""

    @register_grad(symbol)
    def full_extremum_grad(input, dim=None, keepdim=False, *, other=None):
        out = symbol(input, dim, keepdim, other=other)
        if dim is not None or other is not None or not input.dtype.is_floating_point:
            return out
        put_grad(input, ltorch.to(_evenly_distributed(get_grad(out), input, out), input.dtype))
        return out

    return full_extremum_grad


max_grad = _define_full_extremum_grad(ltorch.max)
min_grad = _define_full_extremum_grad(ltorch.min)
