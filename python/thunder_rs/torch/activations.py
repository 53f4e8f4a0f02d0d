"""More activations (``torch.nn.functional``): shrinkage, gated, hard and smooth variants of relu
and sigmoid, SELU/CELU, PReLU, RReLU in evaluation, softsign and softmin.

As in ``nn.py``, cuts select with ``where`` on eager's own comparison so that the gradient at the
cut is eager's, and half-precision inputs are computed in float32. Their ``inplace=True`` forms
and ``torch.selu_``-style in-place calls come from ``inplace.py``, which maps each to these.
"""

import torch
import torch.nn.functional as F

from thunder_rs import clang, prims
from thunder_rs.core.lang.fallback import fallback
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.core.lang.rng import is_random
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, ThunderTypeError, check
from thunder_rs.torch.symbols import torchsymbol
from thunder_rs.torch.elementwise import abs as abs_, neg, sub, tanh, true_divide
from thunder_rs.torch.nn import _float_op, _require_float, sigmoid, tensor_softmax
from thunder_rs.torch.random import rrelu

T = torch.Tensor
__all__ = [
    "glu",
    "hardshrink",
    "softshrink",
    "tanhshrink",
    "mish",
    "hardswish",
    "hardsigmoid",
    "selu",
    "celu",
    "prelu",
    "softsign",
    "softmin",
]

# SELU's constants, as eager's kernel spells them.
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


@torchsymbol(F.glu)
def glu(input, dim=-1):
    op = "ltorch.glu"
    check(
        input.ndim > 0,
        op,
        "glu does not support scalars because halving size must be even (argument input)",
        ThunderRuntimeError,
    )
    dim = clang.canonicalize_dim(input.ndim, dim, op)
    size = input.shape[dim]
    check(
        size % 2 == 0,
        op,
        f"Halving dimension must be even, but dimension {dim} is size {size} (argument dim)",
        ThunderRuntimeError,
    )
    _require_float(op, input)

    def half(start):
        starts, stops = [0] * input.ndim, list(input.shape)
        starts[dim], stops[dim] = start, start + size // 2
        return prims.slice(input, starts, stops, [1] * input.ndim)

    return clang.maybe_convert(prims.mul(half(0), sigmoid(half(size // 2))), input.dtype)


@torchsymbol(F.hardshrink, T.hardshrink)
def hardshrink(input, lambd=0.5):
    # Eager: 0 for -lambd <= x <= lambd, else x (NaN passes).
    def body(x):
        inside = prims.bitwise_and(prims.ge(x, -lambd), prims.le(x, lambd))
        return prims.where(inside, clang.maybe_convert(0.0, x.dtype), x)

    return _float_op("ltorch.hardshrink", input, body)


@torchsymbol(F.softshrink)
def softshrink(input, lambd=0.5):
    op = "ltorch.softshrink"
    _require_float(op, input)
    high = torch.finfo(input.dtype).max
    check(
        0 <= lambd <= high,
        op,
        f"lambda must be in range [0, {high:g}] for input dtype {input.dtype}, but found {lambd} (argument lambd)",
        ThunderRuntimeError,
    )

    def body(x):
        shrunk = prims.where(prims.lt(x, -lambd), prims.add(x, lambd), clang.maybe_convert(0.0, x.dtype))
        shrunk = prims.where(prims.gt(x, lambd), prims.sub(x, lambd), shrunk)
        return prims.where(prims.ne(x, x), x, shrunk)  # NaN passes

    return _float_op(op, input, body)


@torchsymbol(F.tanhshrink)
def tanhshrink(input):
    return sub(input, tanh(input))


@torchsymbol(F.softsign)
def softsign(input):
    return true_divide(input, abs_(input) + 1)


@torchsymbol(F.mish)
def mish(input, inplace=False):
    # Eager's kernel: x * tanh(log1p(exp(x))), without softplus's threshold.
    return _float_op("ltorch.mish", input, lambda x: prims.mul(x, prims.tanh(prims.log1p(prims.exp(x)))))


@torchsymbol(F.hardswish)
def hardswish(input, inplace=False):
    # Eager's backward is 0 up to -3 inclusive, x / 3 + 0.5 below 3, 1 from 3 on. Its forward
    # x * clamp(x + 3, 0, 6) / 6 gives x * 0 below -3: NaN at -inf.
    def body(x):
        middle = prims.div(prims.mul(x, prims.add(x, 3.0)), 6.0)
        return prims.where(prims.le(x, -3.0), prims.mul(x, 0.0), prims.where(prims.lt(x, 3.0), middle, x))

    return _float_op("ltorch.hardswish", input, body)


@torchsymbol(F.hardsigmoid)
def hardsigmoid(input, inplace=False):
    # Eager's backward passes grad / 6 strictly between -3 and 3.
    def body(x):
        ramp = prims.div(prims.add(x, 3.0), 6.0)
        low, high = clang.maybe_convert(0.0, x.dtype), clang.maybe_convert(1.0, x.dtype)
        return prims.where(prims.le(x, -3.0), low, prims.where(prims.ge(x, 3.0), high, ramp))

    return _float_op("ltorch.hardsigmoid", input, body)


def _elu(op: str, input, negative_coef: float, positive_coef: float, input_scale: float):
    """Eager's elu kernel: x <= 0 ? expm1(x * input_scale) * negative_coef : x * positive_coef."""
    return _float_op(
        op,
        input,
        lambda x: prims.where(
            prims.le(x, 0.0),
            prims.mul(prims.expm1(prims.mul(x, input_scale)), negative_coef),
            prims.mul(x, positive_coef),
        ),
    )


@torchsymbol(F.selu, torch.selu)
def selu(input, inplace=False):
    return _elu("ltorch.selu", input, _SELU_ALPHA * _SELU_SCALE, _SELU_SCALE, 1.0)


@torchsymbol(F.celu, torch.celu)
def celu(input, alpha=1.0, inplace=False):
    op = "ltorch.celu"
    check(alpha != 0, op, "ZeroDivisionError: alpha cannot be 0 for CELU (argument alpha)", ThunderRuntimeError)
    return _elu(op, input, alpha, 1.0, 1.0 / alpha)


def _rrelu_call(fn):
    """``torch.rrelu``: the symbol (``thunder_rs.torch.random.rrelu``) in evaluation; with
    ``training=True`` and its ``generator=``, one eager call."""

    def call(input, lower=1.0 / 8, upper=1.0 / 3, training=False, *args, **kwargs):
        if training:
            return fallback(fn, (input, lower, upper, training, *args), kwargs, effect=is_random(fn))
        kwargs.pop("inplace", None)
        kwargs.pop("generator", None)
        return rrelu(input, lower, upper, False)

    return call


TORCH_TO_LTORCH[torch.rrelu] = _rrelu_call(torch.rrelu)


@torchsymbol(F.prelu, T.prelu)
def prelu(input, weight):
    op = "ltorch.prelu"
    check(isinstance(weight, torch.Tensor), op, "expected a tensor for weight (argument weight)", ThunderTypeError)
    check(
        weight.ndim <= 1,
        op,
        f"prelu: Expected `weight` to be a scalar or 1D tensor, but got: ndim = {weight.ndim} (argument weight)",
        ThunderRuntimeError,
    )
    channels = input.shape[1] if input.ndim >= 2 else 1
    count = weight.numel()
    check(
        count == 1 or count == channels,
        op,
        f"Mismatch of parameter numbers and input channel size. Found parameter "
        f"numbers = {count} and channel size = {channels}. (argument weight)",
        ThunderRuntimeError,
    )
    check(
        weight.dtype == input.dtype,
        op,
        f"prelu: Type promoting not supported. Got {input.dtype} and {weight.dtype} (argument weight)",
        ThunderRuntimeError,
    )
    _require_float(op, input)
    if count == 1:
        w = clang.expand_to(prims.reshape(weight, ()), tuple(input.shape))
    else:
        w = prims.broadcast_in_dim(weight, tuple(input.shape), (1,))
    # Eager's backward: grad where x > 0, weight * grad elsewhere.
    return prims.where(prims.gt(input, clang.maybe_convert(0, input.dtype)), input, prims.mul(w, input))


@torchsymbol(F.softmin)
def softmin(input, dim=None, _stacklevel=3, dtype=None):
    # Eager negates first, then casts to dtype inside softmax.
    check(
        input.dtype != torch.bool,
        "ltorch.softmin",
        "Negation, the `-` operator, on a bool tensor is not supported. (argument input)",
        ThunderNotImplementedError,
    )
    return tensor_softmax(neg(input), dim, dtype)
