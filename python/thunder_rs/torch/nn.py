"""Neural-network ops (``torch.nn.functional``) of layers: activations, softmax, normalisation,
dropout, linear and embedding. The base losses are in ``base_losses.py`` (the rest in
``losses.py``) and scaled dot-product attention in ``attention.py``.

Half-precision inputs are computed in float32 and converted back, as eager kernels do. Where
eager has a kernel only for floating dtypes, an integer input raises NotImplementedError as there.
"""

import math

import torch
import torch.nn.functional as F

from thunder_rs import clang, prims
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.errors import (
    ThunderAssertionError,
    ThunderNotImplementedError,
    ThunderRuntimeError,
    ThunderTypeError,
    ThunderValueError,
    check,
)
from thunder_rs.torch.symbols import torchsymbol
from thunder_rs.torch.elementwise import tanh, where

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
    "softmax",
    "log_softmax",
    "tensor_softmax",
    "tensor_log_softmax",
    "layer_norm",
    "rms_norm",
    "batch_norm",
    "dropout",
    "linear",
    "embedding",
]


# -- helpers ---------------------------------------------------------------------------------------

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _upcast(a):
    """``a`` in the dtype eager kernels compute in: float32 for half-precision floats."""
    return clang.maybe_convert(a, torch.float32) if a.dtype in _LOW_PRECISION else a


def _require_float(op: str, a, arg: str = "input") -> None:
    check(
        isinstance(a, torch.Tensor),
        op,
        lambda: f"expected a tensor, got {type(a).__name__} (argument {arg})",
        ThunderTypeError,
    )
    check(
        a.dtype.is_floating_point,
        op,
        lambda: f"not implemented for {a.dtype} (argument {arg})",
        ThunderNotImplementedError,
    )


def _float_op(op: str, a, body):
    """``body`` applied to ``a`` in its compute dtype, converted back; floating inputs only."""
    _require_float(op, a)
    return clang.maybe_convert(body(_upcast(a)), a.dtype)


def _keepdim(x, shape, dims):
    """Broadcasts ``x``, reduced over ``dims`` of ``shape``, back to ``shape``."""
    return prims.broadcast_in_dim(x, tuple(shape), tuple(d for d in range(len(shape)) if d not in dims))


def _sum_all(a):
    return prims.sum(a, tuple(range(a.ndim)))


def _alias(symbol, *torch_fns) -> None:
    """Maps more torch callables to an existing symbol (whose first callable still runs it)."""
    for fn in torch_fns:
        TORCH_TO_LTORCH[fn] = symbol
    symbol.torch_fns = (*symbol.torch_fns, *torch_fns)


# -- activations -----------------------------------------------------------------------------------

_alias(tanh, F.tanh)


@torchsymbol(torch.sigmoid, T.sigmoid, F.sigmoid)
def sigmoid(input):
    x = input if input.dtype.is_floating_point else clang.maybe_convert(input, torch.get_default_dtype())
    out = prims.reciprocal(prims.add(prims.exp(prims.neg(_upcast(x))), 1.0))
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
        soft = prims.div(prims.log1p(prims.exp(scaled)), beta)
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

    def body(x):
        if approximate == "tanh":
            cubic = prims.mul(prims.mul(prims.mul(x, x), x), 0.044715)
            inner = prims.mul(prims.add(x, cubic), math.sqrt(2 / math.pi))
            cdf = prims.mul(prims.add(prims.tanh(inner), 1.0), 0.5)
        else:
            cdf = prims.mul(prims.add(prims.erf(prims.mul(x, math.sqrt(0.5))), 1.0), 0.5)
        return prims.mul(x, cdf)

    return _float_op(op, input, body)


@torchsymbol(F.silu)
def silu(input, inplace=False):
    return _float_op("ltorch.silu", input, lambda x: prims.div(x, prims.add(prims.exp(prims.neg(x)), 1.0)))


# -- softmax ---------------------------------------------------------------------------------------


def _softmax(op: str, a, dim, dtype, log: bool):
    """(log-)softmax of ``a`` along ``dim``, shifted by the max so that exp cannot overflow."""
    if dim is None:  # F.softmax's deprecated implicit dim
        dim = 0 if a.ndim in (0, 1, 3) else 1
    dim = clang.canonicalize_dim(a.ndim, dim, op)
    if dtype is not None:
        a = clang.maybe_convert(a, dtype)
    _require_float(op, a)
    x = _upcast(a)
    dims = (dim,) if x.ndim else ()
    # A zero-size dim has no max; sums over it are empty, so nothing can overflow.
    shifted = x if x.ndim and x.shape[dim] == 0 else prims.sub(x, _keepdim(prims.amax(x, dims), x.shape, dims))
    exps = prims.exp(shifted)
    total = _keepdim(prims.sum(exps, dims), x.shape, dims)
    out = prims.sub(shifted, prims.log(total)) if log else prims.div(exps, total)
    return clang.maybe_convert(out, a.dtype)


@torchsymbol(F.softmax)
def softmax(input, dim=None, _stacklevel=3, dtype=None):
    return _softmax("ltorch.softmax", input, dim, dtype, log=False)


@torchsymbol(F.log_softmax)
def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    return _softmax("ltorch.log_softmax", input, dim, dtype, log=True)


# torch.softmax and Tensor.softmax take dtype as their third positional argument where F.softmax
# takes _stacklevel, so they are symbols of their own.
@torchsymbol(torch.softmax, T.softmax, torch.special.softmax)
def tensor_softmax(input, dim, dtype=None):
    return _softmax("ltorch.softmax", input, dim, dtype, log=False)


@torchsymbol(torch.log_softmax, T.log_softmax, torch.special.log_softmax)
def tensor_log_softmax(input, dim, dtype=None):
    return _softmax("ltorch.log_softmax", input, dim, dtype, log=True)


# -- normalisation ---------------------------------------------------------------------------------


def _normalized_dims(op: str, a, normalized_shape) -> tuple[int, ...]:
    """The trailing dims of ``a`` that ``normalized_shape`` names, checked as torch checks them."""
    check(
        isinstance(normalized_shape, (tuple, list, torch.Size)),
        op,
        f"normalized_shape must be a tuple of ints, not {type(normalized_shape).__name__} (argument normalized_shape)",
        ThunderTypeError,
    )
    shape = tuple(normalized_shape)
    check(
        len(shape) >= 1,
        op,
        "Expected normalized_shape to be at least 1-dimensional, but got normalized_shape = [] "
        "(argument normalized_shape)",
        ThunderRuntimeError,
    )
    check(
        a.ndim >= len(shape) and tuple(a.shape[a.ndim - len(shape) :]) == shape,
        op,
        lambda: (
            f"Given normalized_shape={list(shape)}, expected input with shape [*, {str(list(shape))[1:-1]}], "
            f"but got input of size {list(a.shape)} (argument normalized_shape)"
        ),
        ThunderRuntimeError,
    )
    return tuple(range(a.ndim - len(shape), a.ndim))


def _affine(op: str, a, x, param, shape, arg: str, combine):
    """``combine(x, param)`` with ``param`` (of ``shape``) broadcast over ``x``; None leaves ``x`` as is."""
    if param is None:
        return x
    check(
        tuple(param.shape) == tuple(shape),
        op,
        lambda: (
            f"Expected {arg} to be of same shape as normalized_shape, but got {arg} of shape "
            f"{list(param.shape)} and normalized_shape = {list(shape)} (argument {arg})"
        ),
        ThunderRuntimeError,
    )
    mixed_ok = a.dtype in _LOW_PRECISION and param.dtype == torch.float32
    check(
        param.dtype == a.dtype or mixed_ok,
        op,
        lambda: f"expected {arg} to have dtype {a.dtype}, but got {param.dtype} (argument {arg})",
        ThunderRuntimeError,
    )
    return combine(x, clang.expand_to(clang.maybe_convert(param, x.dtype), x.shape))


@torchsymbol(F.layer_norm)
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-05):
    op = "ltorch.layer_norm"
    dims = _normalized_dims(op, input, normalized_shape)
    _require_float(op, input)
    x = _upcast(input)
    var, mean = prims.var_mean(x, dims, 0)
    rstd = prims.rsqrt(prims.add(var, eps))
    out = prims.mul(prims.sub(x, _keepdim(mean, x.shape, dims)), _keepdim(rstd, x.shape, dims))
    out = _affine(op, input, out, weight, normalized_shape, "weight", prims.mul)
    out = _affine(op, input, out, bias, normalized_shape, "bias", prims.add)
    return clang.maybe_convert(out, input.dtype)


@torchsymbol(F.rms_norm, torch.rms_norm)
def rms_norm(input, normalized_shape, weight=None, eps=None):
    op = "ltorch.rms_norm"
    dims = _normalized_dims(op, input, normalized_shape)
    _require_float(op, input)
    x = _upcast(input)
    if eps is None:  # eager uses the epsilon of the dtype it computes in
        eps = torch.finfo(x.dtype).eps
    count = math.prod(input.shape[d] for d in dims)
    mean_square = prims.div(prims.sum(prims.mul(x, x), dims), float(count))
    out = prims.mul(x, _keepdim(prims.rsqrt(prims.add(mean_square, eps)), x.shape, dims))
    if weight is not None:
        check(
            tuple(weight.shape) == tuple(normalized_shape),
            op,
            lambda: (
                f"Expected weight to be of same shape as normalized_shape, but got weight of shape "
                f"{list(weight.shape)} and normalized_shape = {list(normalized_shape)} (argument weight)"
            ),
            ThunderRuntimeError,
        )
        out = clang.elementwise(prims.mul, op, out, weight)
    return clang.maybe_convert(out, input.dtype)


# -- batch norm ------------------------------------------------------------------------------------


def check_batch_norm(op: str, input, running_mean, running_var, weight, bias, training: bool) -> None:
    """eager's checks of batch norm's arguments: a floating (N, C, ...) input, (C,) statistics and parameters."""
    _require_float(op, input)
    check(
        input.ndim >= 2, op, f"Expected 2D or more input, got {input.ndim}D input (argument input)", ThunderValueError
    )
    channels = input.shape[1]
    if training:
        count = math.prod(input.shape) // max(channels, 1)
        check(
            count != 1,
            op,
            f"Expected more than 1 value per channel when training, got input size {input.shape}",
            ThunderValueError,
        )
    else:
        check(
            running_mean is not None and running_var is not None,
            op,
            "running_mean and running_var must be defined in evaluation mode (argument running_mean)",
            ThunderRuntimeError,
        )
    for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight), ("bias", bias)):
        check(
            t is None or tuple(t.shape) == (channels,),
            op,
            lambda: f"{name} should contain {channels} elements not {t.numel()} (argument {name})",
            ThunderRuntimeError,
        )


def channel_dims(input) -> tuple[int, ...]:
    """The dims batch norm reduces over: all but the channels (dim 1)."""
    return (0, *range(2, input.ndim))


def per_channel(t, ndim: int):
    """A (C,) tensor shaped to broadcast along dim 1 of an ``ndim``-dim input."""
    return prims.reshape(t, (1, t.shape[0], *(1,) * (ndim - 2)))


def batch_norm_stats(x, eps):
    """The batch mean and inverse standard deviation (biased variance) of ``x`` per channel, and
    the biased variance."""
    var, mean = prims.var_mean(x, channel_dims(x), 0)
    return mean, prims.reciprocal(prims.sqrt(prims.add(var, eps))), var


def batch_normalized(input, x, mean, invstd, weight, bias):
    """``x`` (the input in its compute dtype) normalised per channel, as eager's CPU kernel
    computes it: x * alpha + beta with alpha = weight * invstd and beta = bias - mean * alpha."""
    dtype = x.dtype
    alpha = invstd if weight is None else prims.mul(clang.maybe_convert(weight, dtype), invstd)
    beta = prims.neg(prims.mul(mean, alpha))
    if bias is not None:
        beta = prims.add(clang.maybe_convert(bias, dtype), beta)
    out = prims.add(
        prims.mul(x, clang.expand_to(per_channel(alpha, x.ndim), x.shape)),
        clang.expand_to(per_channel(beta, x.ndim), x.shape),
    )
    return clang.maybe_convert(out, input.dtype)


@torchsymbol(F.batch_norm)
def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-05):
    """Batch norm that writes nothing: in eval mode (with the running statistics) or in training
    mode without them. ``F.batch_norm`` in training mode with running statistics updates them in
    place: ``thunder_rs.torch.inplace`` traces it through ``kernels.native_batch_norm``."""
    op = "ltorch.batch_norm"
    check_batch_norm(op, input, running_mean, running_var, weight, bias, training)
    check(
        not training or running_mean is None,
        op,
        "training with running statistics updates them in place; call torch.nn.functional.batch_norm "
        "(argument training)",
        ThunderNotImplementedError,
    )
    x = _upcast(input)
    if training:
        mean, invstd, _ = batch_norm_stats(x, eps)
    else:
        mean = clang.maybe_convert(running_mean, x.dtype)
        invstd = prims.reciprocal(prims.sqrt(prims.add(clang.maybe_convert(running_var, x.dtype), eps)))
    return batch_normalized(input, x, mean, invstd, weight, bias)


# -- dropout, linear, embedding --------------------------------------------------------------------


@torchsymbol(F.dropout)
def dropout(input, p=0.5, training=True, inplace=False):
    op = "ltorch.dropout"
    check(0.0 <= p <= 1.0, op, f"dropout probability has to be between 0 and 1, but got {p} (argument p)")
    if not training or p == 0:
        return input
    if p == 1:  # eager multiplies by zero, so NaN and inf stay NaN
        return prims.mul(input, 0)
    check(
        input.dtype.is_floating_point,
        op,
        f"result type Float can't be cast to the desired output type {input.dtype} (argument input)",
        ThunderRuntimeError,
    )
    noise = prims.uniform(tuple(input.shape), 0.0, 1.0, input.device, _upcast(input).dtype)
    keep = prims.convert_element_type(prims.lt(noise, 1.0 - p), input.dtype)
    # input * (keep / (1 - p)), as eager computes it: dropped NaNs stay NaN.
    return prims.mul(input, prims.mul(keep, 1.0 / (1.0 - p)))


@torchsymbol(F.linear)
def linear(input, weight, bias=None):
    op = "ltorch.linear"
    check(
        input.ndim >= 1,
        op,
        f"both arguments to linear need to be at least 1D, but they are {input.ndim}D and "
        f"{weight.ndim}D (argument input)",
        ThunderRuntimeError,
    )
    check(
        weight.ndim in (1, 2),
        op,
        f"expected a 1-D or 2-D weight, got {weight.ndim}-D (argument weight)",
        ThunderRuntimeError,
    )
    check(
        input.dtype == weight.dtype,
        op,
        f"expected input and weight to have the same dtype, but got {input.dtype} and {weight.dtype} (argument weight)",
        ThunderRuntimeError,
    )
    check(
        input.shape[-1] == weight.shape[-1],
        op,
        f"input {list(input.shape)} and weight {list(weight.shape)}^T cannot be multiplied "
        f"({input.shape[-1]} != {weight.shape[-1]}) (argument weight)",
        ThunderRuntimeError,
    )
    if bias is not None:
        check(weight.ndim == 2, op, "a 1-D weight takes no bias (argument bias)", ThunderRuntimeError)
        check(
            bias.dtype == input.dtype,
            op,
            f"expected bias to have dtype {input.dtype}, but got {bias.dtype} (argument bias)",
            ThunderRuntimeError,
        )
        out_shape = (*input.shape[:-1], weight.shape[0])
        check(
            clang.broadcast_shapes(op, bias.shape, out_shape) == out_shape,
            op,
            f"bias of shape {list(bias.shape)} does not broadcast to the output shape {list(out_shape)} "
            "(argument bias)",
            ThunderRuntimeError,
        )
    return prims.linear(input, weight, bias)


@torchsymbol(F.embedding)
def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False):
    op = "ltorch.embedding"
    check(
        max_norm is None,
        op,
        "max_norm renormalises weight in place, which is not supported (argument max_norm)",
        ThunderNotImplementedError,
    )
    check(
        input.dtype in (torch.int64, torch.int32),
        op,
        f"Expected indices to have one of the following scalar types: Long, Int; but got {input.dtype} "
        "(argument input)",
        ThunderRuntimeError,
    )
    check(weight.ndim == 2, op, f"'weight' must be 2-D, got {weight.ndim}-D (argument weight)", ThunderRuntimeError)
    # Eager's weight gradient would be a sparse tensor (for SparseAdam); thunder_rs's are dense.
    check(
        not (sparse and weight.requires_grad and torch.is_grad_enabled()),
        op,
        "sparse gradients are not supported; use sparse=False (a dense gradient) (argument sparse)",
        ThunderNotImplementedError,
    )
    if padding_idx is not None:
        # padding_idx only changes the gradient; eager checks its range with assertions.
        check(
            -weight.shape[0] <= padding_idx < weight.shape[0],
            op,
            "Padding_idx must be within num_embeddings (argument padding_idx)",
            ThunderAssertionError,
        )
    return prims.embedding(input, weight)
