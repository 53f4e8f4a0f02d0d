"""Grad rules for symbols of ``special.py``, ``activations.py`` and ``losses.py`` whose
decomposition's gradient differs from eager's at edges.

``binary_cross_entropy``: eager's backward divides by ``max(p * (1 - p), 1e-12)``, so a
probability of exactly 0 or 1 (a saturated float32 sigmoid) still gets a gradient; the
decomposition's logs are clamped at -100 there and pass none.
"""

from thunder_rs import torch as ltorch
from thunder_rs.core.grad import get_grad, put_grad, register_grad
from thunder_rs.torch.nn import _reduction

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
