"""Elementwise ops: unary math, binary arithmetic and comparisons, where, clamp, masked_fill; and
the grad rules of those whose decomposition's gradient differs from eager's (a rounded ``div``,
half-precision ``tanh``, ``clamp`` at ties, whose conventions ``special.py``'s fmax and fmin share).
"""

from typing import TYPE_CHECKING

import torch
from torch.torch_version import TorchVersion

from thunder_rs import clang, prims
from thunder_rs.clang import ALWAYS_BOOL, DEFAULT, INT_TO_FLOAT
from thunder_rs.core.base import dtypes
from thunder_rs.core.lang import values
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH, refuse_data_dependent, user_location
from thunder_rs.core.lang.vmap import batch_as_elementwise
from thunder_rs.core.lang.symfloat import SymFloat
from thunder_rs.errors import (
    ThunderNotImplementedError,
    ThunderRuntimeError,
    ThunderTypeError,
    check,
    thunder_error_like,
)
from thunder_rs.torch import creation
from thunder_rs.torch.common import LOW_PRECISION, cast, conj_for, in_opmath, is_number, rounded, sum_to, upcast
from thunder_rs.torch.symbols import ltorch, torchsymbol

T = torch.Tensor
__all__ = ["where", "masked_fill", "clamp", "clamp_min", "clamp_max", "true_divide", "div", "floor_divide", "rsub"]


def _torch_fns(name: str, dunders: tuple[str, ...] = ()):
    """The torch callables the prim ``name`` stands for: the functions, methods and functionals
    of that name (``torch.tanh``, ``Tensor.tanh``, ``F.tanh``), then the operators ``dunders``."""
    owners = (torch, T, torch.special, torch.nn.functional)
    fns = [f for f in dict.fromkeys(getattr(o, name, None) for o in owners) if f is not None]
    return (*fns, *(getattr(T, d) for d in dunders))


def _define_unary(name: str, kind: int, dunders=()):
    prim = getattr(prims, name)

    @torchsymbol(*_torch_fns(name, dunders), name=name)
    def unary(a):
        return clang.elementwise(prim, f"ltorch.{name}", a, kind=kind)

    return unary


def _define_binary(name: str, kind: int, dunders=(), reflected=()):
    prim = getattr(prims, name)

    # Parameters named as torch's schemas name them, for keyword calls (``x.maximum(other=y)``).
    if name == "pow":

        def binary(input, exponent):
            return clang.elementwise(prim, "ltorch.pow", input, exponent, kind=kind)
    elif name == "mul":

        def binary(input, other):
            return cpu_scalar_arithmetic(prim, "ltorch.mul", first_as_tensor(input, other), other, kind=kind)
    else:

        def binary(input, other):
            return clang.elementwise(prim, f"ltorch.{name}", input, other, kind=kind)

    binary.__name__ = binary.__qualname__ = name
    binary = torchsymbol(*_torch_fns(name, dunders), name=name)(binary)

    if reflected:

        @torchsymbol(*(getattr(T, r) for r in reflected), name=f"r{name}")
        def reflected_binary(a, b):
            return clang.elementwise(prim, f"ltorch.{name}", b, a, kind=kind)

        globals()[f"r{name}"] = reflected_binary
        __all__.append(f"r{name}")
    return binary


def cpu_scalar_arithmetic(prim, op: str, a, b, kind=DEFAULT):
    """``a * b`` or ``a / b`` as eager's CPU kernels compute them: a second operand that is a 0-d
    CPU tensor of another dtype than a half-precision result (type promotion leaves it out:
    ``x / torch.tensor(d).sqrt()``, DeBERTa's scale) is taken at its float32 value
    (``original_scalar_value<opmath_t>``), not rounded to the result's dtype first, and the result
    is rounded once. (Its other operand's position, addition and CUDA's kernels round it; a
    product's gradient puts it second again: ``cpu_scalar_times``.)"""
    if _cpu_scalar_pair(a, b):
        _, result = clang.promote(op, (a, b), kind)
        if result in LOW_PRECISION and b.dtype != result and prim is prims.mul and kind == DEFAULT:
            return cpu_times_scalar(a, b)
        if result in LOW_PRECISION and b.dtype != result:
            wide = clang.elementwise(
                prim, op, clang.maybe_convert(a, torch.float32), clang.maybe_convert(b, torch.float32), kind=kind
            )
            return clang.maybe_convert(wide, result)
    elif prim is prims.mul and _cpu_scalar_pair(b, a):
        _, result = clang.promote(op, (a, b), kind)
        if result in LOW_PRECISION and a.dtype != result:
            return cpu_scalar_times(a, b)
    return clang.elementwise(prim, op, a, b, kind=kind)


def _cpu_scalar_pair(a, b) -> bool:
    """Whether ``b`` is a 0-d CPU tensor and ``a`` a CPU tensor with dims."""
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and b.ndim == 0
        and a.ndim > 0
        and a.device.type == b.device.type == "cpu"
    )


@torchsymbol(name="cpu_scalar_times")
def cpu_scalar_times(scalar, tensor):
    """``scalar * tensor`` of a 0-d CPU tensor of another dtype than the half-precision result
    (CLIP's ``logit_scale.exp() * image_features`` under autocast): eager rounds the scalar to
    the result's dtype first, as the plain product does."""
    return clang.elementwise(prims.mul, "ltorch.mul", scalar, tensor)


@register_grad(cpu_scalar_times)
def cpu_scalar_times_grad(scalar, tensor):
    """Eager's ``MulBackward0``: the tensor's gradient is ``grad * scalar``, the scalar second,
    taken at its own value and rounded once (the forward's rounded scalar made it up to 0.2% off
    in bfloat16); the scalar's, ``grad * tensor`` in the result's dtype summed to it."""
    out = cpu_scalar_times(scalar, tensor)
    g = get_grad(out)
    if tensor.requires_grad:
        grad = cpu_scalar_arithmetic(prims.mul, "ltorch.mul", g, scalar)
        put_grad(tensor, cast(sum_to(grad, tensor.shape), tensor.dtype))
    if scalar.requires_grad:
        put_grad(scalar, cast(sum_to(ltorch.mul(g, tensor), scalar.shape), scalar.dtype))
    return out


@torchsymbol(name="cpu_times_scalar")
def cpu_times_scalar(tensor, scalar):
    """``tensor * scalar`` of a 0-d CPU tensor of another dtype than the half-precision result
    (CLIP's ``logits_per_text * self.logit_scale.exp()`` under autocast), as eager's CPU kernel
    computes it: the scalar at its float32 value, the product rounded once (``cpu_scalar_arithmetic``)."""
    _, result = clang.promote("ltorch.mul", (tensor, scalar), DEFAULT)
    f32 = torch.float32
    wide = clang.elementwise(
        prims.mul, "ltorch.mul", clang.maybe_convert(tensor, f32), clang.maybe_convert(scalar, f32)
    )
    return clang.maybe_convert(wide, result)


@register_grad(cpu_times_scalar)
def cpu_times_scalar_grad(tensor, scalar):
    """Eager's ``MulBackward0``: the tensor's gradient is ``grad * scalar`` (the scalar at its own
    value, rounded once); the scalar's ``grad * tensor`` in the result's dtype, summed to it in
    that dtype and then cast to the scalar's (the wide product's VJP summed it in float32: CLIP's
    ``logit_scale`` gradient under bfloat16 autocast 0.1% off)."""
    out = cpu_times_scalar(tensor, scalar)
    g = get_grad(out)
    if tensor.requires_grad:
        put_grad(tensor, cast(sum_to(cpu_times_scalar(g, scalar), tensor.shape), tensor.dtype))
    if scalar.requires_grad:
        put_grad(scalar, cast(sum_to(ltorch.mul(g, tensor), scalar.shape), scalar.dtype))
    return out


#: The operators of the derived symbols: (dunders, reflected dunders). Only reflected dunders that
#: torch writes in Python reach ``__torch_function__`` as themselves: ``__radd__``, ``__rmul__``,
#: ``__rand__``, ``__ror__`` and ``__rxor__`` are C methods that dispatch as ``Tensor.add(a, 2)``
#: and so on, which the forward symbols take, so they have no symbol of their own.
_OPERATORS = {
    "neg": (("__neg__",), ()),
    "abs": (("__abs__",), ()),
    "bitwise_not": (("__invert__",), ()),
    "mul": (("__mul__",), ()),
    "pow": (("__pow__",), ("__rpow__",)),
    "remainder": (("__mod__",), ("__rmod__",)),
    "eq": (("__eq__",), ()),
    "ne": (("__ne__",), ()),
    "lt": (("__lt__",), ()),
    "le": (("__le__",), ()),
    "gt": (("__gt__",), ()),
    "ge": (("__ge__",), ()),
    "bitwise_and": (("__and__",), ()),
    "bitwise_or": (("__or__",), ()),
    "bitwise_xor": (("__xor__",), ()),
}

# One ltorch symbol per parameterless elementwise prim whose Rust declaration gives a promotion.
for _name, _kind in prims.DERIVED["Unary"].items():
    globals()[_name] = _define_unary(_name, _kind, _OPERATORS.get(_name, ((), ()))[0])
    __all__.append(_name)
for _name, _kind in prims.DERIVED["Binary"].items():
    globals()[_name] = _define_binary(_name, _kind, *_OPERATORS.get(_name, ((), ())))
    __all__.append(_name)

if TYPE_CHECKING:
    # The symbols above are made from the prim table at import, which type checkers cannot follow.
    # Unannotated on purpose: an annotated return type is left unanalyzed by mypy inside the
    # ltorch import cycle (python/mypy#5345), whereas an unannotated one is plain Any.
    def __getattr__(name): ...


@register_grad(ltorch.abs)
def _abs_grad(a):
    """``abs`` of a complex tensor: eager's ``grad * self.sgn()`` (the real cotangent times the
    complex sign); of a real one the prim's rule (the decomposition's VJP)."""
    out = ltorch.abs(a)
    if a.dtype.is_complex:
        put_grad(a, ltorch.mul(get_grad(out), prims.sgn(a)), complex_values=True)
    return out


@torchsymbol(torch.round, T.round)
def round(a, *, decimals=0):
    if decimals == 0:
        return clang.elementwise(prims.round, "ltorch.round", a)
    scale = 10.0**decimals
    return clang.elementwise(
        prims.div, "ltorch.round", clang.elementwise(prims.round, "ltorch.round", a * scale), scale
    )


def _scaled(b, alpha, op):
    if type(alpha) is not SymFloat and alpha == 1:  # a float of sizes is kept: its value changes
        return b
    check(
        is_number(alpha),
        op,
        f"expected a number for alpha, got {type(alpha).__name__}",
        ThunderTypeError,
    )
    if not isinstance(b, torch.Tensor):
        return b * alpha
    return clang.elementwise(prims.mul, op, b, alpha)


def first_as_tensor(input, other):
    """``input`` as eager's ``torch.add``, ``sub``, ``mul`` and ``div`` take it: of two numbers
    (``torch.div(seq_len, w, rounding_mode="trunc")`` of sizes, in Longformer), a 0-d tensor of
    its kind of number, as aten wraps it, so that the result is a tensor as eager's is."""
    if isinstance(input, torch.Tensor) or isinstance(other, torch.Tensor) or not is_number(input):
        return input
    return creation.filled((), input, torch.get_default_device(), creation.fill_dtype(input))


def _cuda_half_scaled(prim, op: str, a, b, alpha):
    """``a + alpha * b`` (``prim`` add or sub) of half tensors as CUDA's kernel computes it (ufunc
    add.h ``self + alpha * other`` in opmath, ``opmath_symmetric_gpu_kernel_with_scalars``): in
    float32 with alpha a float32, rounded once (the decomposition rounded ``alpha * b`` to the half
    dtype first); None where that is not the case (the CPU's kernel rounds alpha and the product)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and is_number(alpha)):
        return None
    if (type(alpha) is not SymFloat and alpha == 1) or "cuda" not in (a.device.type, b.device.type):
        return None
    _, result = clang.promote(op, (a, b))
    if result not in LOW_PRECISION:
        return None
    f32 = torch.float32
    scaled = clang.elementwise(prims.mul, op, clang.maybe_convert(b, f32), alpha)
    return clang.maybe_convert(clang.elementwise(prim, op, clang.maybe_convert(a, f32), scaled), result)


@torchsymbol(torch.add, T.add, T.__add__)
def add(input, other, *, alpha=1):
    a = first_as_tensor(input, other)
    fused = _cuda_half_scaled(prims.add, "ltorch.add", a, other, alpha)
    if fused is not None:
        return fused
    return clang.elementwise(prims.add, "ltorch.add", a, _scaled(other, alpha, "ltorch.add"))


def _not_bools(a, b, op: str) -> None:
    """Eager's errors for a subtraction with a bool (BinaryOps.cpp ``sub_check``: a bool tensor or a
    Python bool, which aten wraps as a bool tensor), naming the user's line: two bools were prims.sub's
    "not implemented for b8", one ran as an eager fallback raising at execution with a trace line)."""
    bools = [x.dtype == torch.bool if isinstance(x, torch.Tensor) else type(x) is bool for x in (a, b)]
    if not any(bools):
        return
    if all(bools):
        advice = "with two bool tensors is not supported. Use the `^` or `logical_xor()` operator instead."
    else:
        advice = (
            "with a bool tensor is not supported. If you are trying to invert a mask, use the `~` or "
            "`logical_not()` operator instead."
        )
    message = f"Subtraction, the `-` operator, {advice} (at {user_location()})"
    raise ThunderNotImplementedError(f"{op}: {message}")


@torchsymbol(torch.sub, T.sub, T.__sub__)
def sub(input, other, *, alpha=1):
    _not_bools(input, other, "ltorch.sub")
    a = first_as_tensor(input, other)
    fused = _cuda_half_scaled(prims.sub, "ltorch.sub", a, other, alpha)
    if fused is not None:
        return fused
    return clang.elementwise(prims.sub, "ltorch.sub", a, _scaled(other, alpha, "ltorch.sub"))


@torchsymbol(torch.rsub, T.__rsub__)
def rsub(a, b, *, alpha=1):
    _not_bools(a, b, "ltorch.rsub")
    fused = _cuda_half_scaled(prims.sub, "ltorch.rsub", b, a, alpha)
    if fused is not None:
        return fused
    return clang.elementwise(prims.sub, "ltorch.rsub", b, _scaled(a, alpha, "ltorch.rsub"))


@torchsymbol(torch.true_divide, T.true_divide, T.__truediv__)
def true_divide(input, other):
    return cpu_scalar_arithmetic(prims.div, "ltorch.true_divide", first_as_tensor(input, other), other, INT_TO_FLOAT)


@torchsymbol(T.__rtruediv__)
def rtruediv(a, b):
    """``b / a`` of a number ``b``: eager's ``a.reciprocal() * b``, which rounds twice (and so
    does its gradient, ``-(g * b) * (r * r)``) where a quotient rounds once."""
    op = "ltorch.rtruediv"
    if not isinstance(a, torch.Tensor):  # (``Tensor.__rdiv__(2, x)``: eager's ``self.reciprocal()`` of the number)
        raise thunder_error_like(
            AttributeError(),
            f"{op}: torch.Tensor.__rdiv__ called with a {type(a).__name__} for self: "
            f"'{type(a).__name__}' object has no attribute 'reciprocal' (at {user_location()})",
        )
    return clang.elementwise(prims.mul, op, clang.elementwise(prims.reciprocal, op, a, kind=INT_TO_FLOAT), b)


def _floor_div(a, b, op):
    compute, _ = clang.promote(op, (a, b))
    if compute.is_floating_point:
        return clang.elementwise(prims.floor, op, clang.elementwise(prims.div, op, a, b))
    quotient = clang.elementwise(prims.div, op, a, b)
    remainder = clang.elementwise(prims.fmod, op, a, b)

    def negative(x):
        return clang.elementwise(prims.lt, op, x, 0, kind=ALWAYS_BOOL) if isinstance(x, torch.Tensor) else x < 0

    signs_differ = clang.elementwise(prims.ne, op, negative(a), negative(b), kind=ALWAYS_BOOL)
    inexact = clang.elementwise(prims.ne, op, remainder, 0, kind=ALWAYS_BOOL)
    adjust = clang.elementwise(prims.bitwise_and, op, signs_differ, inexact)
    return where(adjust, clang.elementwise(prims.sub, op, quotient, 1), quotient)


@torchsymbol(torch.div, T.div, torch.divide, T.divide)
def div(input, other, *, rounding_mode=None):
    a, b, op = first_as_tensor(input, other), other, "ltorch.div"
    if rounding_mode is None:
        return cpu_scalar_arithmetic(prims.div, op, a, b, kind=INT_TO_FLOAT)
    if rounding_mode == "trunc":
        compute, _ = clang.promote(op, (a, b))
        quotient = clang.elementwise(prims.div, op, a, b)
        return clang.elementwise(prims.trunc, op, quotient) if compute.is_floating_point else quotient
    if rounding_mode == "floor":
        return _floor_div(a, b, op)
    raise ThunderRuntimeError(
        f"{op}: div expected rounding_mode to be one of None, 'trunc', or 'floor' but found {rounding_mode!r} "
        "(argument rounding_mode)"
    )


@torchsymbol(torch.floor_divide, T.floor_divide, T.__floordiv__)
def floor_divide(input, other):
    return _floor_div(first_as_tensor(input, other), other, "ltorch.floor_divide")


@torchsymbol(torch.where)
def where(condition, input=None, other=None):
    op = "ltorch.where"
    if input is None and other is None:
        refuse_data_dependent(torch.nonzero)  # torch.where(condition) is condition.nonzero(as_tuple=True)
    check(
        isinstance(condition, torch.Tensor) and condition.dtype == torch.bool,
        op,
        lambda: (
            "where expected condition to be a boolean tensor, but got a tensor with dtype "
            f"{getattr(condition, 'dtype', type(condition).__name__)} (argument condition)"
        ),
        ThunderRuntimeError,
    )
    compute, _ = clang.promote(op, (input, other))
    tensors = [x for x in (condition, input, other) if isinstance(x, torch.Tensor)]
    shape = clang.broadcast_shapes(op, *(t.shape for t in tensors))
    args = [
        clang.expand_to(clang.maybe_convert(x, compute), shape)
        if isinstance(x, torch.Tensor)
        else clang.maybe_convert(x, compute)
        for x in (input, other)
    ]
    if not any(isinstance(x, torch.Tensor) for x in args):
        args[0] = clang.expand_to(prims.full((), args[0], condition.device, compute), shape)
    return prims.where(clang.expand_to(condition, shape), *args)


def _where_method(self, condition, other):
    """``Tensor.where(condition, other)``: the receiver is the values taken where ``condition``
    holds, ``torch.where(condition, self, other)``, not the condition."""
    return where(condition, self, other)


TORCH_TO_LTORCH[T.where] = _where_method


def _where_or_indices(condition, input=None, other=None):
    """``torch.where(condition)`` alone is ``condition.nonzero(as_tuple=True)``: sized by the
    condition's values where the jit reads them (``core.values``), and called before a ``where``
    symbol opens, since what it records is read at the top level of the trace."""
    if input is None and other is None and values.active() is not None:
        return torch.nonzero(condition, as_tuple=True)
    return where(condition, input, other)


TORCH_TO_LTORCH[torch.where] = _where_or_indices


@torchsymbol(torch.masked_fill, T.masked_fill)
def masked_fill(a, mask, value):
    op = "ltorch.masked_fill"
    check(
        isinstance(mask, torch.Tensor) and mask.dtype == torch.bool,
        op,
        "masked_fill_ only supports boolean masks (argument mask)",
        ThunderRuntimeError,
    )
    if isinstance(value, torch.Tensor):
        check(
            value.ndim == 0,
            op,
            f"only supports a 0-dimensional value tensor, but got tensor with {value.ndim} dimension(s) "
            "(argument value)",
            ThunderRuntimeError,
        )
    return where(mask, clang.maybe_convert(value, a.dtype), a)


def _masked_sum(g, mask):
    return g.masked_select(mask).sum()


@torchsymbol(_masked_sum, name="masked_sum")
def masked_sum(g, mask):
    """The sum of ``g``'s elements where ``mask`` (broadcast together): eager's
    ``masked_fill_backward``, ``g.masked_select(mask).sum()``, which the torch executor runs (the
    selected elements summed as one row; this decomposition's sum with zeros between them
    groups the additions otherwise, an ulp off)."""
    return ltorch.sum(where(mask, g, 0))


@register_grad(masked_fill)
def masked_fill_grad(a, mask, value):
    """Eager's: ``grad.masked_fill(mask, 0)``, a new contiguous tensor (the decomposition's
    ``where`` took the mask's layout), and a tensor value's the masked cotangent's sum."""
    out = masked_fill(a, mask, value)
    g = get_grad(out)
    if a.requires_grad:
        put_grad(a, sum_to(masked_fill(g, mask, 0), a.shape), complex_values=True)
    if isinstance(value, torch.Tensor) and value.requires_grad:
        put_grad(value, masked_sum(g, mask).to(value.dtype), complex_values=True)
    return out


@torchsymbol(torch.clamp, T.clamp, torch.clip, T.clip)
def clamp(a, min=None, max=None):
    op = "ltorch.clamp"
    check(
        min is not None or max is not None, op, "At least one of 'min' or 'max' must not be None", ThunderRuntimeError
    )
    out = a
    if min is not None:
        out = clang.elementwise(prims.maximum, op, out, min)
    if max is not None:
        out = clang.elementwise(prims.minimum, op, out, max)
    return out


@torchsymbol(torch.clamp_min, T.clamp_min)
def clamp_min(a, min):
    return clamp(a, min, None)


@torchsymbol(torch.clamp_max, T.clamp_max)
def clamp_max(a, max):
    return clamp(a, None, max)


# torch.vmap over traced tensors batches every op of this family by broadcasting.
batch_as_elementwise(*(fn for symbol in list(globals().values()) for fn in getattr(symbol, "torch_fns", ())))
batch_as_elementwise(T.where)  # registered apart from the where symbol (its receiver binds differently)


# -- grad rules ------------------------------------------------------------------------------------


@register_grad(ltorch.div)
def div_grad(input, other, *, rounding_mode=None):
    """A rounded division has eager's zero gradients: differentiating the rounding gave zeros
    too, but NaN where ``other`` is 0 (zero times the infinite quotient's derivative)."""
    out = ltorch.div(input, other, rounding_mode=rounding_mode)
    if (
        rounding_mode is None
        and _cpu_scalar_pair(input, other)
        and out.dtype in LOW_PRECISION
        and other.dtype != out.dtype
    ):
        _put_scalar_quotient_grads(get_grad(out), input, other)
        return out
    if rounding_mode is None or not out.dtype.is_floating_point:
        return out  # the decomposition's VJP
    g = get_grad(out)
    for x in (input, other):
        if isinstance(x, torch.Tensor) and x.requires_grad:
            # eager's zeros_like(grad): the cotangent's layout, not the operand's
            put_grad(x, sum_to(ltorch.zeros_like(g, dtype=x.dtype), x.shape))
    return out


def _put_scalar_quotient_grads(g, input, other) -> None:
    """Eager's ``DivBackward0`` of a half-precision tensor over a 0-d CPU tensor of another dtype
    (``cpu_scalar_arithmetic``'s): ``grad / other`` and ``-grad * ((input / other) / other)``,
    each in the quotient's dtype, summed there, then cast to the operand's (the wide quotient's
    VJP computed and summed the divisor's in float32: a learnt temperature's gradient under
    bfloat16 autocast off)."""
    if input.requires_grad:
        put_grad(input, cast(sum_to(ltorch.div(g, other), input.shape), input.dtype))
    if other.requires_grad:
        ratio = ltorch.div(ltorch.div(input, other), other)
        put_grad(other, cast(sum_to(ltorch.mul(ltorch.neg(g), ratio), other.shape), other.dtype))


def _remainder_grad(symbol, rounding_mode: str, reflected: bool = False):
    """Eager's gradient of ``remainder``/``fmod`` (``reflected``: ``__rmod__``, the divisor first):
    ``grad`` for the dividend and ``-grad * dividend.div(divisor, rounding_mode=...)`` for the
    divisor, eager's rounded division (the prim's VJP rounded ``a / b`` to the dtype before the
    floor: a whole ``grad`` off where that rounding crosses an integer, bfloat16's often), each
    summed to its operand's shape in the result's dtype, then converted to the operand's (as
    eager's engine does): mixed dtypes too (an integer dividend, a bfloat16 tensor over a float32
    0-d one), where the VJP divided the converted operands. A number divisor keeps the
    decomposition's VJP; a number dividend has no derivative in eager (``remainder.Scalar_Tensor``
    raises in backward), so a divisor requiring grad is refused."""

    def rule(a, b):
        out = symbol(a, b)
        dividend, divisor = (b, a) if reflected else (a, b)
        check(
            isinstance(dividend, torch.Tensor) or not getattr(divisor, "requires_grad", False),
            symbol.symbol_name,
            lambda: (
                "the derivative of remainder with a number dividend is not implemented (in torch either: "
                f"derivative for aten::remainder is not implemented); detach the divisor (at {user_location()})"
            ),
            ThunderNotImplementedError,
        )
        tensors = isinstance(dividend, torch.Tensor) and isinstance(divisor, torch.Tensor)
        if not (tensors and divisor.requires_grad and out.dtype.is_floating_point):
            return out  # the decomposition's VJP
        g = get_grad(out)
        if dividend.requires_grad:
            put_grad(dividend, clang.maybe_convert(sum_to(g, dividend.shape), dividend.dtype))
        quotient = ltorch.div(dividend, divisor, rounding_mode=rounding_mode)
        put_grad(divisor, clang.maybe_convert(sum_to(-g * quotient, divisor.shape), divisor.dtype))
        return out

    register_grad(symbol, rule)


_remainder_grad(ltorch.remainder, "floor")
_remainder_grad(ltorch.rremainder, "floor", reflected=True)
_remainder_grad(ltorch.fmod, "trunc")


@register_grad(ltorch.pow)
def pow_grad(input, exponent):
    """A float of sizes as the exponent (``x.pow(T / 8)``): eager's ``pow_backward``, zeros where
    the exponent is 0, else ``g * (input ** (exponent - 1) * exponent)`` as the prim's VJP
    computes with a number (which it takes, not a float of sizes). The exponent's arithmetic is
    kept symbolic and its zero test is a 0-d float64 tensor's, so no size is decided."""
    if isinstance(exponent, torch.Tensor) and isinstance(input, torch.Tensor):
        return _pow_tensors_grad(input, exponent)
    out = ltorch.pow(input, exponent)
    if type(exponent) in (int, float) and isinstance(input, torch.Tensor) and input.dtype.is_complex:
        # eager's ``pow_backward`` of complex values: ``g * conj(exponent * input ** (exponent - 1))``
        if input.requires_grad:
            derivative = ltorch.mul(ltorch.pow(input, exponent - 1.0), float(exponent))
            grad = ltorch.zeros_like(input) if exponent == 0 else ltorch.mul(get_grad(out), prims.conj(derivative))
            put_grad(input, grad, complex_values=True)
        return out
    if type(exponent) is not SymFloat or not (isinstance(input, torch.Tensor) and input.requires_grad):
        return out  # the decomposition's VJP
    g = get_grad(out)
    grad = ltorch.mul(g, ltorch.mul(ltorch.pow(input, exponent - 1.0), exponent))
    zero = ltorch.eq(ltorch.full((), exponent, dtype=torch.float64, device=input.device), 0.0)
    put_grad(input, ltorch.where(zero, ltorch.zeros_like(grad), grad))
    return out


@register_grad(ltorch.rpow)
def rpow_grad(a, b):
    """``a.__rpow__(b)``, ``b ** a``: pow's rule of two tensors with the operands swapped (eager
    runs ``torch.pow(b, a)``); the decomposition's VJP had no ``exponent == 0`` mask and summed
    broadcast operands in another order (ulps)."""
    out = ltorch.rpow(a, b)
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return _pow_tensors_grad(b, a, out)
    return out


def _pow_tensors_grad(input, exponent, out=None):
    """A tensor exponent: eager's ``pow_backward_self`` and ``pow_backward_exponent`` on the
    operands as given, so that a broadcast one is compared before it is expanded (``exponent ==
    0`` of a 0-d or a row exponent is an expanded mask, which leaves the layout to the gradient
    where the decomposition's mask of the expanded exponent was a new contiguous tensor), then
    summed to each operand's shape and cast to its dtype as the autograd engine does."""
    out = ltorch.pow(input, exponent) if out is None else out
    if not dtypes.is_inexact(out.dtype) or not (input.requires_grad or exponent.requires_grad):
        return out
    g = get_grad(out)
    zero = ltorch.zeros((), dtype=g.dtype, device=g.device)
    complex_values = out.dtype.is_complex  # (each derivative conjugated; a real operand's grad is its real part)
    conj = conj_for(out)
    if input.requires_grad:
        grad = ltorch.mul(g, conj(ltorch.mul(exponent, ltorch.pow(input, ltorch.sub(exponent, 1.0)))))
        grad = _real_part_for(input, ltorch.where(ltorch.eq(exponent, 0.0), zero, grad))
        put_grad(input, cast(sum_to(grad, input.shape), input.dtype), complex_values=complex_values)
    if exponent.requires_grad:
        at_zero = ltorch.logical_and(ltorch.eq(input, 0.0), _real_nonnegative(exponent))
        grad = ltorch.mul(g, ltorch.where(at_zero, zero, conj(ltorch.mul(out, ltorch.log(cast(input, out.dtype))))))
        grad = _real_part_for(exponent, grad)
        put_grad(exponent, cast(sum_to(grad, exponent.shape), exponent.dtype), complex_values=complex_values)
    return out


def _real_part_for(x, grad):
    """Eager's ``handle_r_to_c``: a complex gradient of a real ``x`` is its real part, a view of it
    (strides of 2 elements, which the engine passes on where no broadcast is summed)."""
    return prims.real(grad) if grad.dtype.is_complex and not x.dtype.is_complex else grad


def _real_nonnegative(exponent):
    """``exponent >= 0``, of complex values with no imaginary part (eager's ``is_real_exp``)."""
    if not exponent.dtype.is_complex:
        return ltorch.ge(exponent, 0.0)
    return ltorch.logical_and(ltorch.eq(prims.imag(exponent), 0), ltorch.ge(prims.real(exponent), 0))


def _tanh_backward_meta(grad_output, output):
    return [(clang.broadcast_shapes("tanh_backward", grad_output.shape, output.shape), grad_output.dtype)]


@torchsymbol(name="tanh_backward", meta=_tanh_backward_meta, elementwise=True)
def tanh_backward(grad_output, output):
    """``g * (1 - y²)``: eager's kernel, one aten call on the torch executor (its vector code
    rounds ``1 - y²`` as one fused multiply-add, 1 ulp from the ops'), computed in float32 for
    half precision (rounding after each op differs in a third of bfloat16 elements); of complex
    values ``g * conj(1 - y²)``, as the kernel's complex loop computes it."""
    g, dtype = in_opmath(grad_output, output)
    y = upcast(output)
    derivative = 1.0 - y * y
    return rounded(g * (prims.conj(derivative) if derivative.dtype.is_complex else derivative), dtype)


@register_grad(ltorch.tanh)
def tanh_grad(input):
    """Eager's ``tanh_backward`` kernel, complex values too (the prim's VJP rounded the complex
    product otherwise than the kernel's vector loop: an ulp apart in some elements)."""
    out = ltorch.tanh(input)
    if input.dtype.is_floating_point or input.dtype.is_complex:
        put_grad(input, tanh_backward(get_grad(out), out), complex_values=True)
    return out


@register_grad(ltorch.rsqrt)
def rsqrt_grad(input):
    """Eager's ``-0.5 * grad * result.pow(3)``: float16's ``pow`` is one float32 ``powf`` rounded
    once, where the prim's VJP multiplied ``y * y * y`` in float16 (an ulp off in a fifth of the
    elements); other dtypes' ``pow(y, 3)`` is that product, as eager's kernel takes it."""
    out = ltorch.rsqrt(input)
    if input.dtype.is_floating_point:
        put_grad(input, ltorch.mul(ltorch.mul(get_grad(out), -0.5), ltorch.pow(out, 3)))
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


def put_operand_grads(operands, grads) -> None:
    """Each gradient, computed in the result's shape and dtype, reduced to its operand's shape and
    cast to its dtype, as eager's engine does for broadcast or promoted inputs."""
    for x, grad in zip(operands, grads):
        if grad is not None and isinstance(x, torch.Tensor) and x.requires_grad:
            put_grad(x, cast(sum_to(_real_part_for(x, grad), x.shape), x.dtype), complex_values=grad.dtype.is_complex)


@register_grad(ltorch.clamp)
def clamp_grad(a, min=None, max=None):
    out = ltorch.clamp(a, min, max)
    if not out.dtype.is_floating_point:
        return out
    g = get_grad(out)
    if not any(isinstance(b, torch.Tensor) for b in (min, max)):
        put_operand_grads((a,), (_clamp_numbers_grad(g, a, min, max),))
        return out
    bounds = [b if b is None or isinstance(b, torch.Tensor) else ltorch.full_like(a, b) for b in (min, max)]
    tensor_grads = _clamp_tensors_grads_split if SPLIT_TIES else _clamp_tensors_grads_inclusive
    put_operand_grads((a, *bounds), tensor_grads(g, a, *bounds))
    return out
