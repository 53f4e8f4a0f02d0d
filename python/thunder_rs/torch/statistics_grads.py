"""Grad rules of the order statistics whose decomposition routes the gradient elsewhere than eager:
median and nanmedian of a whole tensor share it among every element equal to the result (NaN
ones when it is NaN); mode sends it to the index it returns, the last occurrence of its value.
"""

from thunder_rs import torch as ltorch
from thunder_rs.core.grad import get_grad, put_grad, register_grad


def _evenly_distributed(g, x, value):
    """Eager's ``evenly_distribute_backward``."""
    value_is_nan = ltorch.ne(value, value)
    mask = ltorch.where(value_is_nan, ltorch.ne(x, x), ltorch.eq(x, value))
    return ltorch.where(mask, ltorch.true_divide(g, ltorch.sum(mask)), 0.0)


def _define_full_median_grad(symbol):
    @register_grad(symbol)
    def full_median_grad(input, dim=None, keepdim=False):
        out = symbol(input, dim, keepdim)
        if dim is not None or input.numel() == 0:
            return out  # along a dim: the decomposition's gather sends it to the returned index
        put_grad(input, ltorch.to(_evenly_distributed(get_grad(out), input, out), input.dtype))
        return out

    return full_median_grad


median_grad = _define_full_median_grad(ltorch.median)
nanmedian_grad = _define_full_median_grad(ltorch.nanmedian)


@register_grad(ltorch.mode)
def mode_grad(input, dim=-1, keepdim=False):
    out = ltorch.mode(input, dim, keepdim)
    g = get_grad(out.values)
    if input.ndim == 0:
        put_grad(input, g)
        return out
    indices = out.indices
    if not keepdim:
        g, indices = ltorch.unsqueeze(g, dim), ltorch.unsqueeze(indices, dim)
    put_grad(input, ltorch.scatter_add(ltorch.zeros_like(input), dim, indices, g))
    return out
