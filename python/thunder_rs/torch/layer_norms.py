"""Layer and RMS norm (``torch.nn.functional``): their decompositions, the fused
``native_layer_norm`` kernel and its backward, which eager's autograd runs, and their grad rules.

The kernels' statistics have the dtypes aten's kernels give them (see ``_norm_stats_dtype``), so
that a trace's metadata is what runs. Half-precision values are computed in float32 and returned
in their input's dtype, as eager kernels do. ``batch_norms.py`` shares the rules' parameter grads.
"""

import math

import torch
import torch.nn.functional as F

from thunder_rs import clang, prims
from thunder_rs.core.base.proxies import requires_grad_of
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.errors import ThunderRuntimeError, ThunderTypeError, check
from thunder_rs.torch.common import (
    LOW_PRECISION,
    broadcast_back,
    cast,
    compute_dtype,
    flows,
    like,
    masked_meta,
    one_or_tuple,
    require_float,
    sum_to,
    to_compute_dtype,
    upcast,
)
from thunder_rs.torch.symbols import ltorch, torchsymbol
from thunder_rs.core.lang.symint import same_shape


__all__ = ["layer_norm", "rms_norm", "native_layer_norm", "native_layer_norm_backward"]


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
        a.ndim >= len(shape) and same_shape(a.shape[a.ndim - len(shape) :], shape),
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
    _check_param(op, a, param, shape, arg)
    return combine(x, clang.expand_to(clang.maybe_convert(param, x.dtype), x.shape))


def _check_param(op: str, a, param, shape, arg: str) -> None:
    """``param`` (a weight or bias) of ``shape`` and of ``a``'s dtype (or float32 for half precision)."""
    check(
        same_shape(param.shape, shape),
        op,
        lambda: (
            f"Expected {arg} to be of same shape as normalized_shape, but got {arg} of shape "
            f"{list(param.shape)} and normalized_shape = {list(shape)} (argument {arg})"
        ),
        ThunderRuntimeError,
    )
    mixed_ok = a.dtype in LOW_PRECISION and param.dtype == torch.float32
    check(
        param.dtype == a.dtype or mixed_ok,
        op,
        lambda: f"expected {arg} to have dtype {a.dtype}, but got {param.dtype} (argument {arg})",
        ThunderRuntimeError,
    )


@torchsymbol(F.layer_norm)
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-05):
    op = "ltorch.layer_norm"
    dims = _normalized_dims(op, input, normalized_shape)
    require_float(op, input)
    x = upcast(input)
    var, mean = prims.var_mean(x, dims, 0)
    rstd = prims.rsqrt(prims.add(var, eps))
    out = prims.mul(prims.sub(x, broadcast_back(mean, x.shape, dims)), broadcast_back(rstd, x.shape, dims))
    out = _affine(op, input, out, weight, normalized_shape, "weight", prims.mul)
    out = _affine(op, input, out, bias, normalized_shape, "bias", prims.add)
    return clang.maybe_convert(out, input.dtype)


@torchsymbol(F.rms_norm, torch.rms_norm)
def rms_norm(input, normalized_shape, weight=None, eps=None):
    op = "ltorch.rms_norm"
    dims = _normalized_dims(op, input, normalized_shape)
    require_float(op, input)
    x = upcast(input)
    if eps is None:  # eager uses the epsilon of the dtype it computes in
        eps = torch.finfo(x.dtype).eps
    count = math.prod(input.shape[d] for d in dims)
    mean_square = prims.div(prims.sum(prims.mul(x, x), dims), float(count))
    out = prims.mul(x, broadcast_back(prims.rsqrt(prims.add(mean_square, eps)), x.shape, dims))
    if weight is not None:
        check(
            same_shape(weight.shape, normalized_shape),
            op,
            lambda: (
                f"Expected weight to be of same shape as normalized_shape, but got weight of shape "
                f"{list(weight.shape)} and normalized_shape = {list(normalized_shape)} (argument weight)"
            ),
            ThunderRuntimeError,
        )
        out = clang.elementwise(prims.mul, op, out, weight)
    return clang.maybe_convert(out, input.dtype)


# -- kernels ---------------------------------------------------------------------------------------


def _norm_stats_dtype(input, *params):
    """The dtype of native_layer_norm's mean and rstd: on CPU the parameters' dtype (the input's
    without them); elsewhere the compute dtype (CUDA accumulates half precision in float32)."""
    if input.device.type != "cpu":
        return compute_dtype(input.dtype)
    present = [p for p in params if p is not None]
    return present[0].dtype if present else input.dtype


def _trailing(input, normalized_shape) -> tuple[int, ...]:
    return tuple(range(input.ndim - len(normalized_shape), input.ndim))


def _native_layer_norm_meta(input, normalized_shape, weight, bias, eps):
    stats = (*input.shape[: input.ndim - len(normalized_shape)], *(1,) * len(normalized_shape))
    dtype = _norm_stats_dtype(input, weight, bias)
    grad = requires_grad_of(input)
    return [like(input), (stats, dtype, grad), (stats, dtype, grad)]


@torchsymbol(name="native_layer_norm", meta=_native_layer_norm_meta)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    """layer_norm's output, with the mean and reciprocal standard deviation it normalised by
    (kept as size-1 dims)."""
    dims = _trailing(input, normalized_shape)
    x = to_compute_dtype(input)
    var, mean = ltorch.var_mean(x, dims, correction=0, keepdim=True)
    rstd = ltorch.rsqrt(var + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    stats = _norm_stats_dtype(input, weight, bias)
    return cast(out, input.dtype), cast(mean, stats), cast(rstd, stats)


def _native_layer_norm_call(input, normalized_shape, weight, bias, eps):
    """``torch.native_layer_norm`` called by the program: its arguments checked as eager checks
    them, then the kernel (``native_layer_norm``), whose mean and rstd eager gives no gradient."""
    op = "ltorch.native_layer_norm"
    _normalized_dims(op, input, normalized_shape)
    require_float(op, input)
    for param, arg in ((weight, "weight"), (bias, "bias")):
        if param is not None:
            _check_param(op, input, param, tuple(normalized_shape), arg)
    out, mean, rstd = native_layer_norm(input, tuple(normalized_shape), weight, bias, eps)
    detach = TORCH_TO_LTORCH[torch.Tensor.detach]
    return out, detach(mean), detach(rstd)


TORCH_TO_LTORCH[torch.native_layer_norm] = _native_layer_norm_call
TORCH_TO_LTORCH[torch.ops.aten.native_layer_norm.default] = _native_layer_norm_call


def _native_layer_norm_backward_meta(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    params = tuple(input.shape[input.ndim - len(normalized_shape) :])
    xhat = (grad_out, input, mean, rstd)
    return masked_meta(
        output_mask,
        (*like(input), flows(*xhat, weight)),
        (params, getattr(weight, "dtype", None), flows(*xhat)),
        (params, getattr(bias, "dtype", None), flows(grad_out)),
    )


@torchsymbol(name="native_layer_norm_backward", meta=_native_layer_norm_backward_meta)
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    """The gradients of layer_norm's input, weight and bias that ``output_mask`` asks for."""
    dims = _trailing(input, normalized_shape)
    x, g = to_compute_dtype(input), to_compute_dtype(grad_out)
    mean, rstd = to_compute_dtype(mean), to_compute_dtype(rstd)
    xhat = (x - mean) * rstd
    grads = []
    if output_mask[0]:
        gxhat = g if weight is None else g * weight
        centred = gxhat - ltorch.mean(gxhat, dims, keepdim=True)
        grad = rstd * (centred - xhat * ltorch.mean(gxhat * xhat, dims, keepdim=True))
        grads.append(cast(grad, input.dtype))
    lead = dims[0]
    if output_mask[1]:
        grads.append(cast(sum_to(g * xhat, xhat.shape[lead:]), weight.dtype))
    if output_mask[2]:
        grads.append(cast(sum_to(g, xhat.shape[lead:]), bias.dtype))
    return one_or_tuple(grads)


# -- grad rules ------------------------------------------------------------------------------------


def _rule_dims(input, normalized_shape, *params):
    """The trailing dims a norm normalises, or None for a call the rule leaves to the
    decomposition: malformed ones (the decomposition reports them) or parameters of a dtype
    other than the input's (or one float32 for a half-precision input)."""
    if not isinstance(normalized_shape, (tuple, list, torch.Size)) or not input.dtype.is_floating_point:
        return None
    shape = tuple(normalized_shape)
    if not 1 <= len(shape) <= input.ndim or not same_shape(input.shape[input.ndim - len(shape) :], shape):
        return None
    present = [p for p in params if p is not None]
    dtypes = (input.dtype, torch.float32) if input.dtype in LOW_PRECISION else (input.dtype,)
    if not all(isinstance(p, torch.Tensor) and same_shape(p.shape, shape) for p in present):
        return None
    if len({p.dtype for p in present}) > 1 or any(p.dtype not in dtypes for p in present):
        return None
    return tuple(range(input.ndim - len(shape), input.ndim))


def _wants_grad(x) -> bool:
    return x is not None and requires_grad_of(x)


def _put_param_grads(g, xhat, lead: int, weight, bias) -> None:
    """The gradients of an elementwise ``weight`` and ``bias`` applied to ``xhat``, summed over
    the ``lead`` batch dims."""
    if _wants_grad(weight):
        put_grad(weight, cast(sum_to(g * xhat, xhat.shape[lead:]), weight.dtype))
    if _wants_grad(bias):
        put_grad(bias, cast(sum_to(g, xhat.shape[lead:]), bias.dtype))


@register_grad(ltorch.layer_norm)
def layer_norm_grad(input, normalized_shape, weight=None, bias=None, eps=1e-05):
    if _rule_dims(input, normalized_shape, weight, bias) is None:
        return ltorch.layer_norm(input, normalized_shape, weight, bias, eps)
    return _layer_norm_kernels(input, tuple(normalized_shape), weight, bias, eps)[0]


@register_grad(native_layer_norm)
def native_layer_norm_grad(input, normalized_shape, weight, bias, eps):
    """Eager's: the gradients from the output's alone (those of the mean and rstd are dropped)."""
    if _rule_dims(input, normalized_shape, weight, bias) is None:
        return native_layer_norm(input, normalized_shape, weight, bias, eps)
    return _layer_norm_kernels(input, tuple(normalized_shape), weight, bias, eps)


def _layer_norm_kernels(input, shape, weight, bias, eps):
    """``native_layer_norm``'s results, with the gradients ``native_layer_norm_backward`` gives
    from the output's put on the inputs that want them."""
    out, mean, rstd = native_layer_norm(input, shape, weight, bias, eps)
    g = get_grad(out)
    wanted = [(x, _wants_grad(x)) for x in (input, weight, bias)]
    grads = native_layer_norm_backward(g, input, shape, mean, rstd, weight, bias, [w for _, w in wanted])
    grads = grads if isinstance(grads, tuple) else (grads,)
    for x, grad in zip([x for x, w in wanted if w], grads):
        put_grad(x, grad)
    return out, mean, rstd


def _rms_norm_composite(input, dims, weight, eps):
    """Eager's CPU ``rms_norm``, a composite its autograd differentiates op by op (so does the VJP
    pass these ops): ``x * rsqrt(mean(x ** 2) + eps)`` times the weight in the compute dtype,
    rounded to the input's dtype. (The rule's hand-written backward rounded otherwise in half
    precision: the weight's and the input's gradients differed in bfloat16 and float16.)"""
    x = to_compute_dtype(input)
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    rstd = ltorch.rsqrt(ltorch.mean(ltorch.pow(x, 2), dims, keepdim=True) + eps)
    out = x * rstd
    return cast(out if weight is None else out * weight, input.dtype)


@register_grad(ltorch.rms_norm)
def rms_norm_grad(input, normalized_shape, weight=None, eps=None):
    dims = _rule_dims(input, normalized_shape, weight)
    if dims is None:
        return ltorch.rms_norm(input, normalized_shape, weight, eps)
    if input.device.type == "cpu":
        return _rms_norm_composite(input, dims, weight, eps)
    # The forward is spelled out so that the backward reuses its rstd.
    x = to_compute_dtype(input)
    if eps is None:  # eager uses the epsilon of the dtype it computes in
        eps = torch.finfo(x.dtype).eps
    rstd = ltorch.rsqrt(ltorch.mean(x * x, dims, keepdim=True) + eps)
    out = x * rstd
    if weight is not None:
        out = out * weight
    out = cast(out, input.dtype)

    g = to_compute_dtype(get_grad(out))
    xhat = x * rstd
    if input.requires_grad:
        gxhat = g if weight is None else g * weight
        grad = rstd * (gxhat - xhat * ltorch.mean(gxhat * xhat, dims, keepdim=True))
        put_grad(input, cast(grad, input.dtype))
    _put_param_grads(g, xhat, dims[0], weight, None)
    return out
