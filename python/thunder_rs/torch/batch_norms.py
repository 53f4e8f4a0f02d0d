"""Batch norm (``torch.nn.functional``): its decomposition and checks, the fused
``native_batch_norm`` kernels (with and without running statistics) and their backward, which
eager's autograd runs, and the grad rules. The in-place update of the running statistics is
``forward_writes.py``'s; instance norm (``normalization.py``) normalises with these kernels.
"""

import math

import torch

import torch.nn.functional as F

from thunder_rs import clang, prims
from thunder_rs.core.base.userframe import user_location
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, ThunderValueError, check
from thunder_rs.torch.common import (
    cast,
    compute_dtype,
    flows,
    like,
    masked_meta,
    one_or_tuple,
    require_float,
    to_compute_dtype,
    upcast,
)
from thunder_rs.torch.strides import overlaps, strides_of
from thunder_rs.torch.symbols import ltorch, torchsymbol
from thunder_rs.torch.layer_norms import _wants_grad
from thunder_rs.core.lang.symint import same_shape


__all__ = ["batch_norm", "native_batch_norm", "native_batch_norm_no_stats", "native_batch_norm_backward"]


# -- batch norm ------------------------------------------------------------------------------------


def check_batch_norm(op: str, input, running_mean, running_var, weight, bias, training: bool) -> None:
    """eager's checks of batch norm's arguments: running statistics that do not require grad
    (with grad on), a floating (N, C, ...) input, (C,) statistics and parameters."""
    check_stats_not_differentiable(op, running_mean, running_var)
    require_float(op, input)
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
    check_per_channel(op, channels, running_mean, running_var, weight, bias)


def check_stats_not_differentiable(op: str, running_mean, running_var) -> None:
    """eager's autograd refuses running statistics that require grad (``native_batch_norm`` is not
    differentiable in them) before the kernel runs: the call raises, with or without training."""
    if not torch.is_grad_enabled():
        return
    for name, t in (("running_mean", running_mean), ("running_var", running_var)):
        check(
            t is None or not t.requires_grad,
            op,
            f"The function 'native_batch_norm' is not differentiable with respect to argument '{name}'. This input "
            f"cannot have requires_grad True. (argument {name})",
            ThunderRuntimeError,
        )


def check_per_channel(op: str, channels: int, running_mean, running_var, weight, bias) -> None:
    """eager's check that the statistics and parameters given (None: absent) are (C,) tensors."""
    for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight), ("bias", bias)):
        check(
            t is None or same_shape(t.shape, (channels,)),
            op,
            lambda: f"{name} should contain {channels} elements not {t.numel()} (argument {name})",
            ThunderRuntimeError,
        )


def check_stats_apart(op: str, running_mean, running_var) -> None:
    """Refuses to update running statistics whose channels share memory (``zeros(1).expand(C)``):
    eager's kernel reads and writes each channel's statistic there in turn, so the result is
    the last channel's update of the one before, or on several threads whichever writes last."""
    for name, t in (("running_mean", running_mean), ("running_var", running_var)):
        check(
            not overlaps(t.shape, strides_of(t)),
            op,
            lambda: (
                f"updating {name}, whose channels share memory (an expanded tensor), is not supported: eager "
                "updates them in turn, in an order that depends on its threads; pass a tensor of its own memory "
                f"(clone() it), or None to normalise by the batch statistics alone (argument {name}, at "
                f"{user_location()})"
            ),
            ThunderNotImplementedError,
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
    place: ``thunder_rs.torch.inplace`` traces it through ``native_batch_norm``."""
    op = "ltorch.batch_norm"
    check_batch_norm(op, input, running_mean, running_var, weight, bias, training)
    check(
        not training or running_mean is None,
        op,
        "training with running statistics updates them in place; call torch.nn.functional.batch_norm "
        "(argument training)",
        ThunderNotImplementedError,
    )
    x = upcast(input)
    if training:
        mean, invstd, _ = batch_norm_stats(x, eps)
    else:
        mean = clang.maybe_convert(running_mean, x.dtype)
        invstd = prims.reciprocal(prims.sqrt(prims.add(clang.maybe_convert(running_var, x.dtype), eps)))
    return batch_normalized(input, x, mean, invstd, weight, bias)


# -- kernels ---------------------------------------------------------------------------------------


def stats_dtype(input, *params):
    """The dtype of the batch statistics ATen's kernels return: on CUDA the accumulate dtype; on
    the CPU the input's, float32 for a half input only with float32 parameters (its "mixed type"):
    a bfloat16 module's saved mean is bfloat16 there, which its backward kernel requires."""
    dtype = compute_dtype(input.dtype)
    if input.device.type != "cpu" or dtype == input.dtype:
        return dtype
    return dtype if any(p is not None and p.dtype == torch.float32 for p in params) else input.dtype


def _batch_stats_meta(input, *params):
    channels, dtype = (input.shape[1],), stats_dtype(input, *params)
    return [(channels, dtype, input.requires_grad), (channels, dtype, input.requires_grad)]


def _native_batch_norm_meta(input, weight, bias, running_mean, running_var, training, momentum, eps):
    return [
        (*like(input), flows(input, weight, bias)),
        *_batch_stats_meta(input, weight, bias, running_mean, running_var),
        (*like(running_mean), flows(input, running_mean, momentum)),
        (*like(running_var), flows(input, running_var, momentum)),
    ]


@torchsymbol(name="native_batch_norm", meta=_native_batch_norm_meta)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """Batch norm in training mode, as aten's ``_native_batch_norm_legit_functional``: the output,
    the batch mean and inverse standard deviation, and the running statistics updated with
    ``momentum`` (a number, or a 0-d tensor for ``nn.BatchNorm``'s cumulative average); the
    running variance takes the unbiased batch variance."""
    x = to_compute_dtype(input)
    mean, invstd, var = batch_norm_stats(x, eps)
    out = batch_normalized(input, x, mean, invstd, weight, bias)
    count = x.numel() // x.shape[1]
    # As ATen's update (the sum of squares over n - 1), in tensor ops: Python's ``count / (count -
    # 1)`` is a float of sizes, which specialises a symbolic batch (a compile per batch size).
    unbiased = var * count / (count - 1)
    new_mean = mean * momentum + running_mean * (1 - momentum)
    new_var = unbiased * momentum + running_var * (1 - momentum)
    dtype = stats_dtype(input, weight, bias, running_mean, running_var)
    return (
        out,
        cast(mean, dtype),
        cast(invstd, dtype),
        cast(new_mean, running_mean.dtype),
        cast(new_var, running_var.dtype),
    )


def _native_batch_norm_no_stats_meta(input, weight, bias, eps):
    return [like(input), *_batch_stats_meta(input, weight, bias)]


@torchsymbol(name="native_batch_norm_no_stats", meta=_native_batch_norm_no_stats_meta)
def native_batch_norm_no_stats(input, weight, bias, eps):
    """Batch norm in training mode without running statistics: the output, and the batch mean
    and inverse standard deviation."""
    x = to_compute_dtype(input)
    mean, invstd, _ = batch_norm_stats(x, eps)
    dtype = stats_dtype(input, weight, bias)
    return batch_normalized(input, x, mean, invstd, weight, bias), cast(mean, dtype), cast(invstd, dtype)


def _native_batch_norm_backward_meta(
    grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask
):
    channels = (input.shape[1],)
    param_dtype = input.dtype if weight is None else weight.dtype
    stats = (save_mean, save_invstd) if train else (running_mean, running_var)
    scale = (input, *stats) if train else (running_var,)
    return masked_meta(
        output_mask,
        (*like(input), flows(grad_out, weight, *scale)),
        (channels, getattr(weight, "dtype", None), flows(grad_out, input, *stats)),
        (channels, param_dtype, flows(grad_out)),
    )


@torchsymbol(name="native_batch_norm_backward", meta=_native_batch_norm_backward_meta)
def native_batch_norm_backward(
    grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask
):
    """The gradients of batch norm's input, weight and bias that ``output_mask`` asks for: in
    training mode from the batch statistics saved by the forward, in eval mode from the running
    ones."""
    x, g = to_compute_dtype(input), to_compute_dtype(grad_out)
    dims = channel_dims(x)
    if train:
        mean, invstd = save_mean, save_invstd
    else:
        mean = cast(running_mean, x.dtype)
        invstd = 1 / ltorch.sqrt(cast(running_var, x.dtype) + eps)
    mean_b, invstd_b = per_channel(mean, x.ndim), per_channel(invstd, x.ndim)
    xhat = (x - mean_b) * invstd_b
    sum_g = ltorch.sum(g, dims)
    sum_gx = ltorch.sum(g * xhat, dims)
    grads = []
    if output_mask[0]:
        scale = invstd_b if weight is None else invstd_b * per_channel(cast(weight, x.dtype), x.ndim)
        if train:
            count = x.numel() // x.shape[1]
            centred = g - per_channel(sum_g, x.ndim) / count - xhat * per_channel(sum_gx, x.ndim) / count
            grads.append(cast(centred * scale, input.dtype))
        else:
            grads.append(cast(g * scale, input.dtype))
    if output_mask[1]:
        grads.append(cast(sum_gx, weight.dtype))
    if output_mask[2]:
        grads.append(cast(sum_g, weight.dtype if weight is not None else input.dtype))
    return one_or_tuple(grads)


# -- grad rules ------------------------------------------------------------------------------------


def _put_batch_norm_grads(g, input, weight, bias, running_mean, running_var, save_mean, save_invstd, train: bool, eps):
    wanted = [(x, _wants_grad(x)) for x in (input, weight, bias)]
    if not any(w for _, w in wanted):
        return
    grads = native_batch_norm_backward(
        g, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, [w for _, w in wanted]
    )
    for x, grad in zip([x for x, w in wanted if w], grads if isinstance(grads, tuple) else (grads,)):
        put_grad(x, grad)


@register_grad(native_batch_norm)
def native_batch_norm_grad(input, weight, bias, running_mean, running_var, training, momentum, eps):
    outs = native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)
    _put_batch_norm_grads(get_grad(outs[0]), input, weight, bias, None, None, outs[1], outs[2], True, eps)
    return outs


@register_grad(native_batch_norm_no_stats)
def native_batch_norm_no_stats_grad(input, weight, bias, eps):
    outs = native_batch_norm_no_stats(input, weight, bias, eps)
    _put_batch_norm_grads(get_grad(outs[0]), input, weight, bias, None, None, outs[1], outs[2], True, eps)
    return outs


@register_grad(ltorch.batch_norm)
def batch_norm_grad(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-05):
    if training and running_mean is not None:  # the decomposition refuses it
        return ltorch.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    if training:
        out, mean, invstd = native_batch_norm_no_stats(input, weight, bias, eps)
        _put_batch_norm_grads(get_grad(out), input, weight, bias, None, None, mean, invstd, True, eps)
        return out
    out = ltorch.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    _put_batch_norm_grads(get_grad(out), input, weight, bias, running_mean, running_var, None, None, False, eps)
    return out
