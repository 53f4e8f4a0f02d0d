"""The grad rule of linalg.vector_norm: eager's ``norm_backward``, which every norm here reaches.

Differentiating the decomposition gives NaN where the norm is zero (``x / sqrt(0)``) and splits
ties of the inf-norm differently; eager's formula is zero there and divides the gradient evenly
among the elements that attain the maximum (or are NaN).
"""

import math

from thunder_rs.torch.symbols import ltorch
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.torch.reductions import _dims


def _kept(t, shape, dims):
    """``t`` (reduced over ``dims`` without keepdim) reshaped to ``shape`` with those dims of size 1."""
    return ltorch.reshape(t, tuple(1 if i in dims else s for i, s in enumerate(shape)))


def _norm_backward(g, x, p: float, norm, dims):
    """Eager's ``norm_backward`` for real ``x``: ``g`` and ``norm`` have ``x``'s rank."""
    if p == 0:
        return ltorch.zeros_like(x)
    if p == 1:
        return ltorch.mul(ltorch.sign(x), g)
    if p == 2:
        return ltorch.mul(g, ltorch.where(ltorch.eq(norm, 0), 0.0, ltorch.true_divide(x, norm)))
    if math.isinf(p):
        magnitude = ltorch.abs(x)
        attains = ltorch.bitwise_or(ltorch.eq(magnitude, norm), ltorch.ne(magnitude, magnitude))
        share = ltorch.true_divide(g, ltorch.sum(attains, dims, True))
        return ltorch.mul(ltorch.sign(x), ltorch.where(attains, share, 0.0))
    if p < 1:
        scaled = ltorch.where(ltorch.eq(x, 0), 0.0, ltorch.mul(ltorch.sign(x), ltorch.pow(ltorch.abs(x), p - 1)))
        return ltorch.mul(ltorch.mul(scaled, g), ltorch.pow(norm, 1 - p))
    if p < 2:
        scaled = ltorch.mul(ltorch.sign(x), ltorch.pow(ltorch.abs(x), p - 1))
    else:
        scaled = ltorch.mul(x, ltorch.pow(ltorch.abs(x), p - 2))
    scale = ltorch.where(ltorch.eq(norm, 0), 0.0, ltorch.true_divide(g, ltorch.pow(norm, p - 1)))
    return ltorch.mul(scaled, scale)


@register_grad(ltorch.linalg_vector_norm)
def vector_norm_grad(x, ord=2, dim=None, keepdim=False, *, dtype=None, out=None):
    result = ltorch.linalg_vector_norm(x, ord, dim, keepdim, dtype=dtype)
    g = get_grad(result)
    dims = _dims(x, dim, "ltorch.linalg_vector_norm")
    norm = result
    if not keepdim and x.ndim:
        g, norm = _kept(g, x.shape, dims), _kept(norm, x.shape, dims)
    wide = ltorch.to(x, result.dtype)
    put_grad(x, ltorch.to(_norm_backward(g, wide, float(ord), norm, dims), x.dtype))
    return result
