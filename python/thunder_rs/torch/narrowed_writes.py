"""The gradient an in-place ``add_``, ``sub_`` or ``mul_`` gives its tensor operand where the
result is written into a narrower dtype (``h += bias`` with ``h`` bfloat16 under autocast and
``bias`` a float32 parameter: MobileBERT's prediction head).

Eager computes the value in the promoted dtype and rounds it into ``h``; its backward then runs
the op's formula on ``h``'s gradient, in ``h``'s dtype (``grad``, ``-grad``, ``grad * self``),
sums that to the operand's shape in the same dtype (autograd's ``validate_outputs``) and only then
casts it to the operand's. The trace's out-of-place op differentiates in the promoted dtype, where
the sum over the broadcast dims rounds otherwise. So the operand enters the op expanded to the
written shape through ``_GradientIn``, whose backward rounds the gradient to the written dtype:
the custom Function's own summing and casting (``core.lang.custom_function``) then do what
autograd does. ``div_`` is left as it is: its formula for the operand computes in the promoted
dtype in eager too.
"""

import torch
from torch.autograd.function import Function

from thunder_rs.core.base.proxies import TensorProxy

#: The in-place calls whose formula for the operand gives a gradient in the written tensor's dtype.
_ROUNDED_IN_WRITTEN_DTYPE = frozenset(
    {"add_", "sub_", "subtract_", "mul_", "multiply_", "__iadd__", "__isub__", "__imul__"}
)


class _GradientIn(Function):
    """``other`` expanded to ``shape``; its gradient rounded to ``dtype`` before it is summed."""

    @staticmethod
    def forward(ctx, other, shape, dtype):
        ctx.dtype = dtype
        return other.expand(shape)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.dtype), None, None


def _meta(t) -> torch.Tensor:
    """A tensor that promotes as ``t`` does (its dtype and whether it has dims)."""
    return torch.empty((1,) * t.ndim, dtype=t.dtype, device="meta")


def operands(name: str, a, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``args`` and ``kwargs`` of the in-place call ``name`` on ``a``, its tensor operand routed
    through ``_GradientIn`` where eager's gradient of it is computed and summed in ``a``'s dtype."""
    if name not in _ROUNDED_IN_WRITTEN_DTYPE or not isinstance(a, TensorProxy) or not torch.is_grad_enabled():
        return args, kwargs
    other = args[0] if args else kwargs.get("other")
    if not isinstance(other, TensorProxy) or not other.requires_grad or not a.dtype.is_floating_point:
        return args, kwargs
    if torch.result_type(_meta(a), _meta(other)) == a.dtype:
        return args, kwargs
    routed = _GradientIn.apply(other, tuple(a.shape), a.dtype)
    return ((routed, *args[1:]), kwargs) if args else (args, {**kwargs, "other": routed})
