"""Activations (``torch.nn.functional``): sigmoid, the relu family and its hard and leaky
variants, elu/selu/celu, softplus, logsigmoid, gelu, silu, mish; shrinkage, gated and smooth
variants, PReLU, RReLU in evaluation, softsign and softmin. Beside them the backward kernels of
eager's autograd they differentiate with (``gelu_backward``, ``threshold_backward``, ...) and
their grad rules.

Half-precision inputs are computed in float32 and converted back, as eager kernels do. Where
eager has a kernel only for floating dtypes, an integer input raises NotImplementedError as there.
Cuts select with ``where`` on eager's own comparison so that the gradient at the cut is eager's.
Their ``inplace=True`` forms and ``torch.selu_``-style in-place calls come from ``inplace.py``,
which maps each to these.

Differentiated through their decompositions, some give NaN where eager's kernels give 0 or the
cotangent: sigmoid's exp(-x) is inf below about -89 (float32), and elu's and softplus's unused
``where`` branch overflows above about 89, which ``0 * inf`` carries into the gradient. Their
rules are eager's backward kernels, computed in float32 for half-precision inputs.
"""

import math

import torch
import torch.nn.functional as F

from thunder_rs import clang, prims
from thunder_rs.core.lang.fallback import fallback
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.core.lang.rng import is_random
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, ThunderTypeError, check
from thunder_rs.torch.common import cast, in_opmath, require_float, rounded, to_compute_dtype, upcast
from thunder_rs.torch.elementwise import abs as abs_, neg, sub, tanh, true_divide, where
from thunder_rs.torch.nn import tensor_softmax
from thunder_rs.torch.onednn import gelu_at_inf
from thunder_rs.torch.random import rrelu
from thunder_rs.torch.symbols import ltorch, torchsymbol

T = torch.Tensor


__all__ = [
    "sigmoid",
    "relu",
    "relu6",
    "hardtanh",
    "threshold",
    "leaky_relu",
    "elu",
    "softplus",
    "logsigmoid",
    "gelu",
    "silu",
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
    "gelu_backward",
    "threshold_backward",
    "leaky_relu_backward",
    "hardtanh_backward",
    "softplus_backward",
    "elu_backward",
    "silu_backward",
    "sigmoid_backward",
    "mish_backward",
    "hardswish_backward",
]


def _float_op(op: str, a, body):
    """``body`` applied to ``a`` in its compute dtype, converted back; floating inputs only."""
    require_float(op, a)
    return clang.maybe_convert(body(upcast(a)), a.dtype)


# -- activations -----------------------------------------------------------------------------------
# ``F.tanh`` is ``ltorch.tanh``'s, declared with the elementwise prims.


@torchsymbol(torch.sigmoid, T.sigmoid, F.sigmoid)
def sigmoid(input):
    """``1 / (1 + exp(-x))``, as eager's kernel computes it; integers and bool in the default dtype,
    complex values as they are (eager's complex kernel: they were converted to float32)."""
    inexact = input.dtype.is_floating_point or input.dtype.is_complex
    x = input if inexact else clang.maybe_convert(input, torch.get_default_dtype())
    out = prims.reciprocal(prims.add(prims.exp(prims.neg(upcast(x))), 1.0))
    return clang.maybe_convert(out, x.dtype)


# Activations that cut at a threshold select with ``where`` on eager's comparison, so that their
# gradient at the threshold itself (and at NaN) is eager's: 0 for relu at 0, not maximum's 1/2.


@torchsymbol(F.relu, torch.relu, T.relu)
def relu(input, inplace=False):
    check(
        input.dtype != torch.bool,
        "ltorch.relu",
        "Boolean inputs not supported for relu (argument input)",
        ThunderNotImplementedError,
    )
    zero = clang.maybe_convert(0, input.dtype)
    return prims.where(prims.le(input, zero), zero, input)


def _clamp(op: str, a, low, high):
    """``a`` clamped to [low, high], the bounds cast to ``a``'s dtype (NaN stays NaN); the gradient
    is zero at the bounds, as eager's hardtanh_backward gives."""
    check(
        a.dtype != torch.bool, op, "Bool inputs not supported for hardtanh (argument input)", ThunderNotImplementedError
    )
    low, high = clang.maybe_convert(low, a.dtype), clang.maybe_convert(high, a.dtype)
    return prims.where(prims.le(a, low), low, prims.where(prims.ge(a, high), high, a))


@torchsymbol(F.threshold, torch.threshold)
def threshold(input, threshold, value, inplace=False):
    op = "ltorch.threshold"
    check(
        input.dtype != torch.bool,
        op,
        "\"threshold_cpu\" not implemented for 'Bool' (argument input)",
        ThunderNotImplementedError,
    )
    return where(
        clang.elementwise(prims.le, op, input, threshold, kind=clang.ALWAYS_BOOL),
        clang.maybe_convert(value, input.dtype),
        input,
    )


@torchsymbol(F.hardtanh)
def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    check(min_val <= max_val, "ltorch.hardtanh", "min_val cannot be greater than max_val (argument min_val)")
    return _clamp("ltorch.hardtanh", input, min_val, max_val)


@torchsymbol(F.relu6)
def relu6(input, inplace=False):
    return _clamp("ltorch.relu6", input, 0, 6)


@torchsymbol(F.leaky_relu)
def leaky_relu(input, negative_slope=0.01, inplace=False):
    return _float_op(
        "ltorch.leaky_relu", input, lambda x: prims.where(prims.gt(x, 0.0), x, prims.mul(x, negative_slope))
    )


@torchsymbol(F.elu)
def elu(input, alpha=1.0, inplace=False):
    return _float_op("ltorch.elu", input, lambda x: prims.where(prims.le(x, 0.0), prims.mul(prims.expm1(x), alpha), x))


@torchsymbol(F.softplus)
def softplus(input, beta=1.0, threshold=20.0):
    def body(x):
        scaled = prims.mul(x, beta)
        # Eager's kernels divide by beta in opmath: a 0-d tensor of it stays a division where a
        # number divisor is CUDA's ``div`` kernel's, a product with its reciprocal (nvfuser_numbers).
        # (a float of sizes stays one)
        number = type(beta) in (int, float) and beta != 1
        divisor = clang.expand_to(prims.full((), beta, x.device, x.dtype), x.shape) if number else beta
        soft = prims.div(prims.log1p(prims.exp(scaled)), divisor)
        return prims.where(prims.gt(scaled, threshold), x, soft)

    return _float_op("ltorch.softplus", input, body)


@torchsymbol(F.logsigmoid)
def logsigmoid(input):
    # log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)), which neither overflows nor loses small values.
    return _float_op(
        "ltorch.logsigmoid",
        input,
        lambda x: prims.sub(prims.minimum(x, 0.0), prims.log1p(prims.exp(prims.neg(prims.abs(x))))),
    )


@torchsymbol(F.gelu)
def gelu(input, approximate="none"):
    op = "ltorch.gelu"
    check(
        approximate in ("none", "tanh"),
        op,
        f"approximate argument must be either none or tanh, got {approximate!r} (argument approximate)",
        ThunderRuntimeError,
    )

    at_inf = gelu_at_inf(input, approximate)  # (oneDNN's NaN at +inf, where eager runs it)

    def body(x):
        if approximate == "tanh":
            cubic = prims.mul(prims.mul(prims.mul(x, x), x), 0.044715)
            inner = prims.mul(prims.add(x, cubic), math.sqrt(2 / math.pi))
            cdf = prims.mul(prims.add(prims.tanh(inner), 1.0), 0.5)
        else:
            cdf = prims.mul(prims.add(prims.erf(prims.mul(x, math.sqrt(0.5))), 1.0), 0.5)
        out = prims.mul(x, cdf)
        return out if at_inf is None else prims.where(prims.eq(x, math.inf), at_inf, out)

    return _float_op(op, input, body)


@torchsymbol(F.silu)
def silu(input, inplace=False):
    return _float_op("ltorch.silu", input, lambda x: prims.div(x, prims.add(prims.exp(prims.neg(x)), 1.0)))


# SELU's constants, as eager's kernel spells them.
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _halves(input, dim):
    """``input``'s halves along ``dim`` (canonical), as glu splits it."""
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
    require_float(op, input)

    def half(start):
        starts, stops = [0] * input.ndim, list(input.shape)
        starts[dim], stops[dim] = start, start + size // 2
        return prims.slice(input, starts, stops, [1] * input.ndim)

    return dim, half(0), half(size // 2)


@torchsymbol(F.glu)
def glu(input, dim=-1):
    # Eager's kernel: ``a * sigmoid(b)`` in float32 for half precision, rounded once.
    _, first, second = _halves(input, dim)
    return clang.maybe_convert(prims.mul(upcast(first), sigmoid(upcast(second))), input.dtype)


@register_grad(ltorch.glu)
def glu_grad(input, dim=-1):
    """Eager's ``glu_backward``: ``g * s`` with ``s = sigmoid(b)`` in the input's dtype for the
    first half, ``(1 - s) * s * a * g`` (in float32 for half precision) for the second."""
    out = ltorch.glu(input, dim)
    dim, first, second = _halves(input, dim)
    s = ltorch.sigmoid(second)
    g = get_grad(out)
    opmath, dtype = in_opmath(g, input)
    gated = rounded((1.0 - upcast(s)) * upcast(s) * upcast(first) * opmath, dtype)
    put_grad(input, ltorch.cat([s * g, gated], dim))
    return out


def _in_dtype(number: float, dtype: torch.dtype) -> float:
    """``number`` rounded to ``dtype``, as kernels take their scalar parameters (``lambd.to<scalar_t>()``)."""
    plain = type(number) in (int, float)  # (a symbolic number stays as it is)
    return torch.tensor(number, dtype=dtype).item() if plain and dtype.is_floating_point else number


@torchsymbol(F.hardshrink, T.hardshrink)
def hardshrink(input, lambd=0.5):
    # Eager: 0 for -lambd <= x <= lambd, else x (NaN passes), lambd in the input's dtype.
    lambd = _in_dtype(lambd, input.dtype)

    def body(x):
        inside = prims.bitwise_and(prims.ge(x, -lambd), prims.le(x, lambd))
        return prims.where(inside, clang.maybe_convert(0.0, x.dtype), x)

    return _float_op("ltorch.hardshrink", input, body)


@torchsymbol(F.softshrink)
def softshrink(input, lambd=0.5):
    op = "ltorch.softshrink"
    require_float(op, input)
    high = torch.finfo(input.dtype).max
    check(
        0 <= lambd <= high,
        op,
        f"lambda must be in range [0, {high:g}] for input dtype {input.dtype}, but found {lambd} (argument lambd)",
        ThunderRuntimeError,
    )

    lambd = _in_dtype(lambd, input.dtype)  # (then computed in float32 for half precision)

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


#: The activations whose in-place forms eager differentiates from their result (derivatives.yaml's
#: ``elu_``, ``celu_``, ``leaky_relu_``; ``selu_`` is an ``elu_``), which rounds differently from
#: the input's formula: ``thunder_rs.torch.inplace`` calls them with ``inplace=True``, which only
#: their grad rules read (the call is recorded out of place, ``core.lang.recorder``).
DIFFERENTIATED_FROM_RESULT = frozenset({elu, selu, celu, leaky_relu})


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
    require_float(op, input)
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


# -- backward kernels ------------------------------------------------------------------------------


_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_TANH_CUBIC = 0.044715


def _gelu_backward_meta(grad_output, input, approximate="none"):
    shape = clang.broadcast_shapes("gelu_backward", grad_output.shape, input.shape)
    return [(shape, input.dtype)]


@torchsymbol(name="gelu_backward", meta=_gelu_backward_meta)
def gelu_backward(grad_output, input, approximate="none"):
    x = to_compute_dtype(input)
    if approximate == "tanh":
        # d/dx [x (1 + t) / 2] with t = tanh(u), u = k (x + c x^3):
        # (1 + t) / 2 + x (1 - t)(1 + t) k (1 + 3 c x^2) / 2 = (1 + t)(1 + x (1 - t) u') / 2
        x2 = x * x
        t = ltorch.tanh(x * (_SQRT_2_OVER_PI + _SQRT_2_OVER_PI * _TANH_CUBIC * x2))
        du = _SQRT_2_OVER_PI + 3 * _SQRT_2_OVER_PI * _TANH_CUBIC * x2
        slope = (0.5 + 0.5 * t) * (1 + x * (1 - t) * du)
    else:
        # d/dx [x Phi(x)] = Phi(x) + x phi(x)
        cdf = 0.5 + 0.5 * ltorch.erf(x * math.sqrt(0.5))
        slope = cdf + x * ltorch.exp(-0.5 * x * x) * (1 / math.sqrt(2 * math.pi))
    return cast(to_compute_dtype(grad_output) * slope, input.dtype)


def _elementwise_backward_meta(grad_output, input, *params):
    # (clang's: the sizes of a count the same on both sides decide nothing, where torch's would
    # compare them with 1)
    shape = clang.broadcast_shapes("an activation's backward", grad_output.shape, input.shape)
    return [(shape, grad_output.dtype)]


# The piecewise activations' backward kernels, one aten call each on the torch executor (on the
# CPU, torch.where with a number runs about 18x slower than leaky_relu_backward); the
# decompositions select on eager's comparisons, so the gradient at the kinks and at NaN is eager's.


@torchsymbol(name="threshold_backward", meta=_elementwise_backward_meta, elementwise=True)
def threshold_backward(grad_output, input, threshold):
    """``grad_output`` where ``input > threshold``, else 0 (NaN passes nothing, as eager's)."""
    return ltorch.where(ltorch.le(input, threshold), 0.0, grad_output)


@torchsymbol(name="leaky_relu_backward", meta=_elementwise_backward_meta, elementwise=True)
def leaky_relu_backward(grad_output, input, negative_slope, self_is_result=False):
    """``grad_output`` where ``input > 0``, else ``grad_output * negative_slope``. From the result of
    an in-place call (``self_is_result``) with a negative slope, eager's kernel raises when run."""
    return ltorch.where(ltorch.gt(input, 0.0), grad_output, grad_output * negative_slope)


@torchsymbol(name="hardtanh_backward", meta=_elementwise_backward_meta, elementwise=True)
def hardtanh_backward(grad_output, input, min_val, max_val):
    """``grad_output`` strictly inside (min_val, max_val) and at NaN, else 0."""
    outside = ltorch.bitwise_or(ltorch.le(input, min_val), ltorch.ge(input, max_val))
    return ltorch.where(outside, 0.0, grad_output)


# The smooth activations' backward kernels, one aten call each on the torch executor: their
# exponentials are the kernels' own (vectorized), which torch.exp (MKL's on the CPU) rounds
# differently, so that a decomposition's gradients were 1 ulp apart from eager's.


@torchsymbol(name="softplus_backward", meta=_elementwise_backward_meta, elementwise=True)
def softplus_backward(grad_output, input, beta, threshold):
    """``g * z / (z + 1)`` with ``z = exp(input * beta)``; ``g`` where ``input * beta > threshold``."""
    g, dtype = in_opmath(grad_output, input)
    scaled = upcast(input) * beta
    z = ltorch.exp(scaled)
    return rounded(ltorch.where(scaled > threshold, g, g * z / (z + 1.0)), dtype)


def _elu_backward_meta(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    return _elementwise_backward_meta(grad_output, self_or_result)


@torchsymbol(name="elu_backward", meta=_elu_backward_meta, elementwise=True)
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    """``g * input_scale * (alpha * scale) * exp(x * input_scale)`` (from the result ``y``: ``g *
    input_scale * (y + alpha * scale)``) where ``x <= 0``, else ``g * scale``: the coefficients
    rounded to the compute dtype as the kernel's (``alpha.to<scalar_t>() * scale.to<scalar_t>()``)."""
    g, dtype = in_opmath(grad_output, self_or_result)
    x = upcast(self_or_result)
    negative_coef = torch.tensor(alpha, dtype=x.dtype) * torch.tensor(scale, dtype=x.dtype)
    negative_coef, input_scale = negative_coef.item(), torch.tensor(input_scale, dtype=x.dtype).item()
    if is_result:
        negative = g * input_scale * (x + negative_coef)
    else:
        negative = g * input_scale * negative_coef * ltorch.exp(x * input_scale)
    return rounded(ltorch.where(x <= 0.0, negative, g * scale), dtype)


@torchsymbol(name="silu_backward", meta=_elementwise_backward_meta, elementwise=True)
def silu_backward(grad_output, input):
    """``g * s * (1 + x * (1 - s))`` with ``s = sigmoid(x)``."""
    g, dtype = in_opmath(grad_output, input)
    x = upcast(input)
    s = _sigmoid_of(x)
    return rounded(g * s * (1.0 + x * (1.0 - s)), dtype)


@torchsymbol(name="sigmoid_backward", meta=_elementwise_backward_meta, elementwise=True)
def sigmoid_backward(grad_output, output):
    """``g * (1 - y) * y``. The CPU kernel computes bfloat16 in float32 but float16 in float16,
    rounding each product (CUDA's computes both in float32): float32 math gave 1 ulp differences
    in a tenth of the float16 gradients of squeeze-excitation gates (EfficientNet, RegNet)."""
    if output.dtype.is_complex:  # (the complex kernel's: ``g * conj((1 - y) * y)``)
        return grad_output * prims.conj((1.0 - output) * output)
    if output.dtype == torch.float16 and output.device.type == "cpu":
        return grad_output * (1.0 - output) * output
    g, dtype = in_opmath(grad_output, output)
    y = upcast(output)
    return rounded(g * (1.0 - y) * y, dtype)


@torchsymbol(name="mish_backward", meta=_elementwise_backward_meta, elementwise=True)
def mish_backward(grad_output, input):
    """``g * (t + x * sigmoid(x) * (1 - t * t))`` with ``t = tanh(softplus(x))``."""
    g, dtype = in_opmath(grad_output, input)
    x = upcast(input)
    t = ltorch.tanh(ltorch.log1p(ltorch.exp(x)))
    return rounded(g * (t + x * _sigmoid_of(x) * (1.0 - t * t)), dtype)


@torchsymbol(name="hardswish_backward", meta=_elementwise_backward_meta, elementwise=True)
def hardswish_backward(grad_output, input):
    """0 up to -3 inclusive, ``g * (x / 3 + 0.5)`` below 3, ``g`` from 3 on."""
    g, dtype = in_opmath(grad_output, input)
    x = upcast(input)
    middle = ltorch.where(x < 3.0, g * (x / 3.0 + 0.5), g)
    return rounded(ltorch.where(x <= -3.0, 0.0, middle), dtype)


# -- grad rules ------------------------------------------------------------------------------------


@register_grad(ltorch.gelu)
def gelu_grad(input, approximate="none"):
    out = ltorch.gelu(input, approximate)
    put_grad(input, gelu_backward(get_grad(out), input, approximate))
    return out


def _put_floating(input, grad) -> None:
    if input.dtype.is_floating_point:
        put_grad(input, grad)


@register_grad(ltorch.relu)
def relu_grad(input, inplace=False):
    out = ltorch.relu(input)
    _put_floating(input, threshold_backward(get_grad(out), out, 0))  # eager's: from the result
    return out


@register_grad(ltorch.threshold)
def threshold_grad(input, threshold, value, inplace=False):
    out = ltorch.threshold(input, threshold, value)
    _put_floating(input, threshold_backward(get_grad(out), input, threshold))
    return out


@register_grad(ltorch.leaky_relu)
def leaky_relu_grad(input, negative_slope=0.01, inplace=False):
    # (computed in place, eager's formula reads the result, which refuses a negative slope)
    out = ltorch.leaky_relu(input, negative_slope)
    _put_floating(input, leaky_relu_backward(get_grad(out), out if inplace else input, negative_slope, inplace))
    return out


@register_grad(ltorch.hardtanh)
def hardtanh_grad(input, min_val=-1.0, max_val=1.0, inplace=False):
    out = ltorch.hardtanh(input, min_val, max_val)
    _put_floating(input, hardtanh_backward(get_grad(out), input, min_val, max_val))
    return out


@register_grad(ltorch.relu6)
def relu6_grad(input, inplace=False):
    out = ltorch.relu6(input)
    _put_floating(input, hardtanh_backward(get_grad(out), input, 0.0, 6.0))
    return out


#: Eager's hardsigmoid backward multiplies by 1/6 rounded to float32 (``1.0f / 6.0f``), in
#: every dtype: dividing by 6 gives float64 gradients 3e-8 apart from eager's.
_ONE_SIXTH_F32 = torch.tensor(1.0 / 6.0, dtype=torch.float32).item()


@register_grad(ltorch.hardsigmoid)
def hardsigmoid_grad(input, inplace=False):
    out = ltorch.hardsigmoid(input)
    inside = ltorch.bitwise_and(ltorch.gt(input, -3.0), ltorch.lt(input, 3.0))
    put_grad(input, ltorch.where(inside, ltorch.mul(get_grad(out), _ONE_SIXTH_F32), 0.0))
    return out


def _sigmoid_of(x):
    return ltorch.reciprocal(ltorch.exp(-x) + 1.0)


@register_grad(ltorch.sigmoid)
def sigmoid_grad(input):
    out = ltorch.sigmoid(input)
    if input.dtype.is_floating_point:
        put_grad(input, sigmoid_backward(get_grad(out), out))
    elif input.dtype.is_complex:
        put_grad(input, sigmoid_backward(get_grad(out), out), complex_values=True)
    return out


@register_grad(ltorch.silu)
def silu_grad(input, inplace=False):
    out = ltorch.silu(input)
    put_grad(input, silu_backward(get_grad(out), input))
    return out


@register_grad(ltorch.softplus)
def softplus_grad(input, beta=1.0, threshold=20.0):
    out = ltorch.softplus(input, beta, threshold)
    put_grad(input, softplus_backward(get_grad(out), input, beta, threshold))
    return out


def _elu_grad(out, input, alpha: float, scale: float, input_scale: float, inplace: bool):
    # (an activation computed in place differentiates from its result, as eager's elu_)
    put_grad(input, elu_backward(get_grad(out), alpha, scale, input_scale, inplace, out if inplace else input))
    return out


@register_grad(ltorch.elu)
def elu_grad(input, alpha=1.0, inplace=False):
    return _elu_grad(ltorch.elu(input, alpha), input, alpha, 1.0, 1.0, inplace)


@register_grad(ltorch.selu)
def selu_grad(input, inplace=False):
    return _elu_grad(ltorch.selu(input), input, _SELU_ALPHA, _SELU_SCALE, 1.0, inplace)


@register_grad(ltorch.celu)
def celu_grad(input, alpha=1.0, inplace=False):
    # Eager's derivative takes 1 / alpha with alpha rounded to float32 (``alpha.toFloat()``).
    input_scale = 1.0 / torch.tensor(alpha, dtype=torch.float32).item()
    return _elu_grad(ltorch.celu(input, alpha), input, alpha, 1.0, input_scale, inplace)


@register_grad(ltorch.mish)
def mish_grad(input, inplace=False):
    out = ltorch.mish(input)
    put_grad(input, mish_backward(get_grad(out), input))
    return out


@register_grad(ltorch.hardswish)
def hardswish_grad(input, inplace=False):
    out = ltorch.hardswish(input)
    put_grad(input, hardswish_backward(get_grad(out), input))
    return out


def _log_sigmoid_forward_meta(input):
    return [(tuple(input.shape), input.dtype), (tuple(input.shape), input.dtype)]


@torchsymbol(torch.ops.aten.log_sigmoid_forward.default, name="log_sigmoid_forward", meta=_log_sigmoid_forward_meta)
def log_sigmoid_forward(input):
    """logsigmoid and the buffer its backward reads, z = exp(-|x|), in the input's dtype, as eager's
    kernel (``aten.log_sigmoid_forward``) computes them: its exp is the vectorised one for every
    element, where ``torch.exp`` takes another for the elements past the last full vector (a
    float64 z an ulp apart, and so the gradient)."""
    x = upcast(input)
    z = prims.exp(prims.neg(prims.abs(x)))
    out = prims.sub(prims.minimum(x, 0.0), prims.log1p(z))
    return clang.maybe_convert(out, input.dtype), clang.maybe_convert(z, input.dtype)


@register_grad(ltorch.logsigmoid)
def logsigmoid_grad(input):
    # Eager's logsigmoid_backward: g * (max_deriv - sign * z / (1 + z)) with z = exp(-|x|) the
    # buffer its forward kept in the input's dtype, computed in float32 for half precision
    # (DPO-style losses call it on bfloat16 logits).
    if not input.dtype.is_floating_point:
        return ltorch.logsigmoid(input)
    out, z = log_sigmoid_forward(input)
    g, dtype = in_opmath(get_grad(out), input)
    x = upcast(input)
    negative = x < 0.0
    z = upcast(z)
    max_deriv = ltorch.where(negative, 1.0, 0.0)
    sign = ltorch.where(negative, 1.0, -1.0)
    put_grad(input, rounded(g * (max_deriv - sign * (z / (1.0 + z))), dtype))
    return out
