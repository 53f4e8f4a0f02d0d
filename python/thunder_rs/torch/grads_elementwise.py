"""Grad rules for symbols of ``special.py``, ``nn.py``, ``activations.py`` and ``losses.py``
whose decomposition's gradient differs from eager's at edges.

``binary_cross_entropy``: eager's backward divides by ``max(p * (1 - p), 1e-12)``, so a
probability of exactly 0 or 1 (a saturated float32 sigmoid) still gets a gradient; the
decomposition's logs are clamped at -100 there and pass none.
"""

import torch

from thunder_rs import torch as ltorch
from thunder_rs.core.grad import get_grad, put_grad, register_grad
from thunder_rs.torch.activations import _SELU_ALPHA, _SELU_SCALE
from thunder_rs.torch.nn import _LOW_PRECISION, _reduction, _upcast

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
    g = _loss_cotangent(get_grad(out), _reduction("ltorch.binary_cross_entropy", reduction, size_average, reduce), input)
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
