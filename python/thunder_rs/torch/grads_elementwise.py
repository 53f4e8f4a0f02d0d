"""Grad rules for symbols of ``elementwise.py``, ``special.py``, ``nn.py``, ``activations.py`` and
``losses.py`` whose decomposition's gradient differs from eager's at edges.

``clamp``, ``fmax``, ``fmin``: at ties (a value at a bound, equal operands) and NaN operands eager's
subgradient is a convention, which torch changed in 2.14 and 2.15 (see ``SPLIT_TIES``); the VJP of
the decompositions' prims (maximum's split of every tie) is eager's in none or only some releases.

``binary_cross_entropy``: eager's backward divides by ``max(p * (1 - p), 1e-12)``, so a
probability of exactly 0 or 1 (a saturated float32 sigmoid) still gets a gradient; the
decomposition's logs are clamped at -100 there and pass none.
"""

import torch
from torch.torch_version import TorchVersion

from thunder_rs.torch.symbols import ltorch
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.torch.activations import _SELU_ALPHA, _SELU_SCALE
from thunder_rs.torch.kernels import cast as _cast, sum_to as _sum_to
from thunder_rs.torch.base_losses import _reduction
from thunder_rs.torch.nn import _LOW_PRECISION, _upcast

_BCE_EPSILON = 1e-12


def _loss_cotangent(g, reduction: str, like):
    """The cotangent of a reduced loss, spread over the elements of ``like``."""
    if reduction == "mean":
        g = g / max(like.numel(), 1)
    return ltorch.expand(g, like.shape) if reduction != "none" else g


@register_grad(ltorch.binary_cross_entropy)
def binary_cross_entropy_grad(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    out = ltorch.binary_cross_entropy(input, target, weight, size_average, reduce, reduction)
    if weight is not None and weight.requires_grad:
        return out  # eager has no derivative for weight; the decomposition's is used
    g = _loss_cotangent(
        get_grad(out), _reduction("ltorch.binary_cross_entropy", reduction, size_average, reduce), input
    )
    if weight is not None:
        g = g * weight
    if input.requires_grad:
        put_grad(input, g * (input - target) / ltorch.clamp_min((1 - input) * input, _BCE_EPSILON))
    if target.requires_grad:
        put_grad(target, g * (ltorch.log1p(-input) - ltorch.log(input)))  # unclamped, as eager's
    return out


# -- activations whose decomposition overflows --------------------------------------------------
# Differentiated through their decompositions, these give NaN where eager's kernels give 0 or the
# cotangent: sigmoid's exp(-x) is inf below about -89 (float32), and elu's and softplus's unused
# ``where`` branch overflows above about 89, which ``0 * inf`` carries into the gradient. The
# rules are eager's backward kernels, computed in float32 for half-precision inputs.


def _in_opmath(g, like):
    """``g`` and the dtype to round the gradient back to (float32 math for half precision)."""
    return (ltorch.to(g, torch.float32), like.dtype) if like.dtype in _LOW_PRECISION else (g, None)


def _rounded(grad, dtype):
    return grad if dtype is None else ltorch.to(grad, dtype)


def _sigmoid_of(x):
    return ltorch.reciprocal(ltorch.exp(-x) + 1.0)


@register_grad(ltorch.sigmoid)
def sigmoid_grad(input):
    out = ltorch.sigmoid(input)
    if input.dtype.is_floating_point:
        g, dtype = _in_opmath(get_grad(out), out)
        s = _upcast(out)
        put_grad(input, _rounded(g * (1.0 - s) * s, dtype))
    return out


@register_grad(ltorch.silu)
def silu_grad(input, inplace=False):
    out = ltorch.silu(input, inplace)
    g, dtype = _in_opmath(get_grad(out), input)
    x = _upcast(input)
    s = _sigmoid_of(x)
    put_grad(input, _rounded(g * s * (1.0 + x * (1.0 - s)), dtype))
    return out


@register_grad(ltorch.softplus)
def softplus_grad(input, beta=1.0, threshold=20.0):
    out = ltorch.softplus(input, beta, threshold)
    g, dtype = _in_opmath(get_grad(out), input)
    scaled = _upcast(input) * beta
    z = ltorch.exp(scaled)
    put_grad(input, _rounded(ltorch.where(scaled > threshold, g, g * z / (z + 1.0)), dtype))
    return out


def _elu_grad(out, input, negative_coef: float, positive_coef: float, input_scale: float):
    g, dtype = _in_opmath(get_grad(out), input)
    x = _upcast(input)
    negative = g * (input_scale * negative_coef) * ltorch.exp(x * input_scale)
    put_grad(input, _rounded(ltorch.where(x <= 0.0, negative, g * positive_coef), dtype))
    return out


@register_grad(ltorch.elu)
def elu_grad(input, alpha=1.0, inplace=False):
    return _elu_grad(ltorch.elu(input, alpha, inplace), input, alpha, 1.0, 1.0)


@register_grad(ltorch.selu)
def selu_grad(input, inplace=False):
    return _elu_grad(ltorch.selu(input, inplace), input, _SELU_ALPHA * _SELU_SCALE, _SELU_SCALE, 1.0)


@register_grad(ltorch.celu)
def celu_grad(input, alpha=1.0, inplace=False):
    # Eager's derivative takes 1 / alpha with alpha rounded to float32 (``alpha.toFloat()``).
    input_scale = 1.0 / torch.tensor(alpha, dtype=torch.float32).item()
    return _elu_grad(ltorch.celu(input, alpha, inplace), input, alpha, 1.0, input_scale)


@register_grad(ltorch.mish)
def mish_grad(input, inplace=False):
    out = ltorch.mish(input, inplace)
    g, dtype = _in_opmath(get_grad(out), input)
    x = _upcast(input)
    tanh_softplus = ltorch.tanh(ltorch.log1p(ltorch.exp(x)))
    put_grad(input, _rounded(g * (tanh_softplus + x * _sigmoid_of(x) * (1.0 - tanh_softplus * tanh_softplus)), dtype))
    return out


@register_grad(ltorch.tanh)
def tanh_grad(input):
    # Eager's tanh_backward computes g * (1 - y²) in float32 for half precision; rounding after
    # each op of the prim's VJP differs in a third of bfloat16 elements.
    out = ltorch.tanh(input)
    if input.dtype in _LOW_PRECISION:
        g, dtype = _in_opmath(get_grad(out), out)
        y = _upcast(out)
        put_grad(input, _rounded(g * (1.0 - y * y), dtype))
    elif input.dtype.is_floating_point:
        g = get_grad(out)
        put_grad(input, g * (1.0 - out * out))
    return out


@register_grad(ltorch.logsigmoid)
def logsigmoid_grad(input):
    # Eager's logsigmoid_backward: g * (max_deriv - sign * z / (1 + z)) with z = exp(-|x|) the
    # buffer its forward kept in the input's dtype, computed in float32 for half precision
    # (DPO-style losses call it on bfloat16 logits).
    out = ltorch.logsigmoid(input)
    g, dtype = _in_opmath(get_grad(out), input)
    x = _upcast(input)
    negative = x < 0.0
    z = ltorch.exp(-ltorch.abs(x))
    if dtype is not None:
        z = _upcast(ltorch.to(z, dtype))
    max_deriv = ltorch.where(negative, 1.0, 0.0)
    sign = ltorch.where(negative, 1.0, -1.0)
    put_grad(input, _rounded(g * (max_deriv - sign * (z / (1.0 + z))), dtype))
    return out


# -- ties: clamp, fmax, fmin ----------------------------------------------------------------------
# Eager's formulas (derivatives.yaml, the same on every device), compared with the eager of torch
# 2.11 to 2.15 on the CPU (2.9 and 2.10 have 2.11's formulas). Up to torch 2.13 a value at a clamp
# bound keeps the whole gradient and fmax/fmin give a tie to ``self``. From 2.14 a scalar bound
# passes none at a tie, and tensor ties split the gradient in halves as maximum's does; in 2.14
# fmax/fmin are maximum/minimum's formula, which gives a NaN operand's gradient to both operands,
# and from 2.15 the operand fmax selects gets it. A nightly of 2.14 (``2.14.0.dev``) counts as 2.13.
_TORCH = TorchVersion(torch.__version__)
SPLIT_TIES = _TORCH >= "2.14"
NAN_SELECTING_FMAX = _TORCH >= "2.15"


def _clamp_numbers_grad(g, a, min, max):
    """Scalar bounds: the gradient passes inside them (and at them, up to torch 2.13), not at NaN."""
    above, below = (ltorch.gt, ltorch.lt) if SPLIT_TIES else (ltorch.ge, ltorch.le)
    keep = None
    for bound, compare in ((min, above), (max, below)):
        if bound is not None:
            inside = compare(a, bound)
            keep = inside if keep is None else ltorch.bitwise_and(keep, inside)
    return ltorch.where(keep, g, 0.0)


def _clamp_tensors_grads_inclusive(g, a, min, max):
    """Tensor bounds up to torch 2.13: ``a`` keeps the gradient inside its bounds and at them; a
    bound gets it where it clamps strictly, ``max`` also wherever ``max < min``; a NaN gets none."""
    if max is None:
        return ltorch.where(a >= min, g, 0.0), ltorch.where(a < min, g, 0.0), None
    if min is None:
        return ltorch.where(a <= max, g, 0.0), None, ltorch.where(a > max, g, 0.0)
    inside = ltorch.bitwise_and(a >= min, a <= max)
    grad_min = ltorch.where(ltorch.bitwise_and(a < min, min < max), g, 0.0)
    grad_max = ltorch.where(ltorch.bitwise_or(a > max, max < min), g, 0.0)
    return ltorch.where(inside, g, 0.0), grad_min, grad_max


def _clamp_tensors_grads_split(g, a, min, max):
    """Tensor bounds from torch 2.14: ties with a bound split the gradient in halves; a NaN operand
    passes it to ``a``; with ``min > max`` the result, and the gradient, is ``max``'s; a NaN bound
    gets none."""
    if max is None:  # maximum(a, min)
        tie, half = a == min, g * 0.5
        return (
            ltorch.where(tie, half, ltorch.where(a < min, 0.0, g)),
            ltorch.where(tie, half, ltorch.where(a > min, 0.0, g)),
            None,
        )
    if min is None:  # minimum(a, max)
        tie, half = a == max, g * 0.5
        return (
            ltorch.where(tie, half, ltorch.where(a > max, 0.0, g)),
            None,
            ltorch.where(tie, half, ltorch.where(a < max, 0.0, g)),
        )
    ordered, below, above = min <= max, a < min, a > max
    tie_low = ltorch.bitwise_and(ltorch.bitwise_and(a == min, a != max), ordered)
    tie_high = ltorch.bitwise_and(ltorch.bitwise_and(a == max, a != min), ordered)
    half = g * 0.5
    inside = ltorch.bitwise_not(ltorch.bitwise_or(below, above))
    grad_a = ltorch.where(inside, ltorch.where(ltorch.bitwise_or(tie_low, tie_high), half, g), 0.0)
    grad_min = ltorch.where(ordered, ltorch.where(below, g, ltorch.where(tie_low, half, 0.0)), 0.0)
    grad_max = ltorch.where(
        ordered, ltorch.where(above, g, ltorch.where(tie_high, half, 0.0)), ltorch.where(min > max, g, 0.0)
    )
    return grad_a, grad_min, grad_max


def _put_operand_grads(operands, grads) -> None:
    """Each gradient, computed in the result's shape and dtype, reduced to its operand's shape and
    cast to its dtype, as eager's engine does for broadcast or promoted inputs."""
    for x, grad in zip(operands, grads):
        if grad is not None and isinstance(x, torch.Tensor) and x.requires_grad:
            put_grad(x, _cast(_sum_to(grad, x.shape), x.dtype))


@register_grad(ltorch.clamp)
def clamp_grad(a, min=None, max=None):
    out = ltorch.clamp(a, min, max)
    if not out.dtype.is_floating_point:
        return out
    g = get_grad(out)
    if not any(isinstance(b, torch.Tensor) for b in (min, max)):
        _put_operand_grads((a,), (_clamp_numbers_grad(g, a, min, max),))
        return out
    bounds = [b if b is None or isinstance(b, torch.Tensor) else ltorch.full_like(a, b) for b in (min, max)]
    tensor_grads = _clamp_tensors_grads_split if SPLIT_TIES else _clamp_tensors_grads_inclusive
    _put_operand_grads((a, *bounds), tensor_grads(g, a, *bounds))
    return out


def _fmax_grads(g, a, b, wins):
    """The gradients of fmax (``wins`` is ``ltorch.gt``) or fmin (``ltorch.lt``) of ``a`` and ``b``."""
    if not SPLIT_TIES:  # a tie, and a NaN ``b``, give ``a`` the gradient
        a_selected = ltorch.bitwise_or(ltorch.bitwise_or(wins(a, b), a == b), ltorch.isnan(b))
        return ltorch.where(a_selected, g, 0.0), ltorch.where(a_selected, 0.0, g)
    tie, half = a == b, g * 0.5
    if not NAN_SELECTING_FMAX:  # maximum's rule: where neither wins (a NaN), both get the gradient
        return (
            ltorch.where(tie, half, ltorch.where(wins(b, a), 0.0, g)),
            ltorch.where(tie, half, ltorch.where(wins(a, b), 0.0, g)),
        )
    a_selected = ltorch.bitwise_or(wins(a, b), ltorch.isnan(b))
    return ltorch.where(tie, half, ltorch.where(a_selected, g, 0.0)), ltorch.where(
        tie, half, ltorch.where(a_selected, 0.0, g)
    )


def _fmax_grad(symbol, wins, input, other):
    out = symbol(input, other)
    if out.dtype.is_floating_point and isinstance(input, torch.Tensor) and isinstance(other, torch.Tensor):
        _put_operand_grads((input, other), _fmax_grads(get_grad(out), input, other, wins))
    return out


@register_grad(ltorch.fmax)
def fmax_grad(input, other):
    return _fmax_grad(ltorch.fmax, ltorch.gt, input, other)


@register_grad(ltorch.fmin)
def fmin_grad(input, other):
    return _fmax_grad(ltorch.fmin, ltorch.lt, input, other)
