"""Normalisation layers beyond layer and batch norm (``torch.nn.functional``): group norm,
instance norm and local response norm, and group norm's grad rule.

Group norm is its own kernel pair (``native_group_norm`` and its backward), as in eager's
autograd. Instance norm is batch norm over a (1, N * C, ...) view, as aten computes it, so
batch norm's kernels and grad rule serve it; with running statistics and input statistics it
updates the statistics in place, which ``instance_norm_updating`` traces as ``F.batch_norm``
does. Local response norm is written as ``F.local_response_norm`` writes it, on average pooling.
"""

import math

import torch
import torch.nn.functional as F

from thunder_rs.torch.symbols import ltorch
from thunder_rs.core.lang import autocast
from thunder_rs.core.lang.langctx import MUTATING, TORCH_TO_LTORCH
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, ThunderValueError, check
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.torch.batch_norms import check_per_channel, native_batch_norm
from thunder_rs.torch.symbols import torchsymbol
from thunder_rs.torch.inplace import assign
from thunder_rs.torch.common import cast, require_float, to_compute_dtype

__all__ = ["group_norm", "native_group_norm", "native_group_norm_backward", "instance_norm", "local_response_norm"]


# -- group norm ------------------------------------------------------------------------------------


def _grouped(x, n: int, groups: int):
    """``x`` (N, C, *) as (N, groups, C // groups * prod(*))."""
    return ltorch.reshape(x, (n, groups, x.numel() // (n * groups) if n * groups else 0))


def _per_channel(t, ndim: int):
    return ltorch.reshape(t, (1, t.shape[0], *(1,) * (ndim - 2)))


@torchsymbol(torch.native_group_norm, name="native_group_norm")
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    """group_norm's output, with the mean and reciprocal standard deviation of each (sample,
    group), shaped (N, group), in the input's dtype."""
    op = "ltorch.native_group_norm"
    check(
        C % group == 0,
        op,
        f"Expected number of channels in input to be divisible by num_groups, but got input of "
        f"shape {list(input.shape)} and num_groups={group} (argument group)",
        ThunderRuntimeError,
    )
    x = to_compute_dtype(input)
    grouped = _grouped(x, N, group)
    var, mean = ltorch.var_mean(grouped, 2, correction=0, keepdim=True)
    rstd = ltorch.rsqrt(var + eps)
    out = ltorch.reshape((grouped - mean) * rstd, x.shape)
    if weight is not None:
        out = out * _per_channel(to_compute_dtype(weight), x.ndim)
    if bias is not None:
        out = out + _per_channel(to_compute_dtype(bias), x.ndim)
    stats = (N, group)
    return (
        cast(out, input.dtype),
        cast(ltorch.reshape(mean, stats), input.dtype),
        cast(ltorch.reshape(rstd, stats), input.dtype),
    )


@torchsymbol(name="native_group_norm_backward")
def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    """The gradients of group_norm's input, weight and bias that ``output_mask`` asks for."""
    x, g = to_compute_dtype(input), to_compute_dtype(grad_out)
    stats_shape = (N, group, 1)
    mean, rstd = (
        ltorch.reshape(to_compute_dtype(mean), stats_shape),
        ltorch.reshape(to_compute_dtype(rstd), stats_shape),
    )
    xhat = ltorch.reshape((_grouped(x, N, group) - mean) * rstd, x.shape)
    grads = []
    if output_mask[0]:
        gxhat = g if weight is None else g * _per_channel(to_compute_dtype(weight), x.ndim)
        gx, xh = _grouped(gxhat, N, group), _grouped(xhat, N, group)
        centred = gx - ltorch.mean(gx, 2, keepdim=True) - xh * ltorch.mean(gx * xh, 2, keepdim=True)
        grads.append(cast(ltorch.reshape(rstd * centred, x.shape), input.dtype))
    dims = (0, *range(2, x.ndim))
    if output_mask[1]:
        grads.append(cast(ltorch.sum(g * xhat, dims), weight.dtype))
    if output_mask[2]:
        grads.append(cast(ltorch.sum(g, dims), weight.dtype if weight is not None else input.dtype))
    return grads[0] if len(grads) == 1 else tuple(grads)


def check_group_norm(op: str, input, num_groups: int, weight, bias) -> None:
    check(
        input.ndim >= 2,
        op,
        f"Expected at least 2 dimensions for input tensor but received {input.ndim} (argument input)",
        ThunderRuntimeError,
    )
    require_float(op, input)
    channels = input.shape[1]
    per_group = [input.shape[0] * channels // num_groups, num_groups, *input.shape[2:]]
    check(
        math.prod(per_group[:1] + per_group[2:]) != 1,
        op,
        f"Expected more than 1 value per channel when training, got input size {per_group} (argument input)",
        ThunderValueError,
    )
    check(
        num_groups > 0 and channels % num_groups == 0,
        op,
        f"Expected number of channels in input to be divisible "
        f"by num_groups, but got input of shape {list(input.shape)} and num_groups={num_groups} (argument num_groups)",
        ThunderRuntimeError,
    )
    for name, t in (("weight", weight), ("bias", bias)):
        check(
            t is None or (t.ndim == 1 and t.shape[0] == channels),
            op,
            lambda: (
                f"Expected {name} to be a vector of "
                f"size equal to the number of channels in input, but got {name} of shape {list(t.shape)} and input of "
                f"shape {list(input.shape)} (argument {name})"
            ),
            ThunderRuntimeError,
        )


@torchsymbol(F.group_norm)
def group_norm(input, num_groups, weight=None, bias=None, eps=1e-05):
    check_group_norm("ltorch.group_norm", input, num_groups, weight, bias)
    n, c = input.shape[:2]
    return native_group_norm(input, weight, bias, n, c, input.numel() // max(n * c, 1), num_groups, eps)[0]


# -- instance norm ---------------------------------------------------------------------------------


def _check_instance_norm(op: str, input, running_mean, running_var, weight, bias, use_input_stats: bool) -> None:
    check(
        input.ndim >= 3, op, f"Expected 3D or more input, got {input.ndim}D input (argument input)", ThunderValueError
    )
    require_float(op, input)
    check(
        not use_input_stats or math.prod(input.shape[2:]) != 1,
        op,
        f"Expected more than 1 spatial element when training, got input size {list(input.shape)} (argument input)",
        ThunderValueError,
    )
    check(
        use_input_stats or (running_mean is not None and running_var is not None),
        op,
        "Expected running_mean and running_var to be defined when use_input_stats is false (argument use_input_stats)",
        ThunderRuntimeError,
    )
    check_per_channel(op, input.shape[1], running_mean, running_var, weight, bias)


def _as_batch(input, *per_channel):
    """``input`` (N, C, *) as (1, N * C, *), and each (C,) tensor repeated N times to match."""
    n, c = input.shape[:2]
    flat = ltorch.reshape(input, (1, n * c, *input.shape[2:]))
    return (flat, *(None if t is None else ltorch.reshape(ltorch.expand(t, (n, c)), (n * c,)) for t in per_channel))


@torchsymbol(F.instance_norm)
def instance_norm(
    input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True, momentum=0.1, eps=1e-05
):
    """Instance norm that writes nothing: normalised by each instance's statistics, or by the
    running ones (use_input_stats=False). With running statistics and use_input_stats, eager
    updates them in place: ``instance_norm_updating`` traces that call."""
    op = "ltorch.instance_norm"
    _check_instance_norm(op, input, running_mean, running_var, weight, bias, use_input_stats)
    check(
        not use_input_stats or running_mean is None,
        op,
        "with running statistics and use_input_stats the "
        "statistics are updated in place; call torch.nn.functional.instance_norm (argument running_mean)",
        ThunderNotImplementedError,
    )
    if input.numel() == 0:  # nothing to normalise (batch norm's kernels divide by the channel count)
        return ltorch.clone(input)
    if use_input_stats:
        flat, w, b = _as_batch(input, weight, bias)
        out = ltorch.batch_norm(flat, None, None, w, b, True, momentum, eps)
    else:
        flat, rm, rv, w, b = _as_batch(input, running_mean, running_var, weight, bias)
        out = ltorch.batch_norm(flat, rm, rv, w, b, False, momentum, eps)
    return ltorch.reshape(out, input.shape)


def instance_norm_updating(
    input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True, momentum=0.1, eps=1e-05
):
    """``F.instance_norm``: with running statistics and input statistics, the output and the
    statistics updated as aten updates them (batch norm's update of the N repeated copies,
    averaged over N), written where autograd does not see."""
    if not use_input_stats or running_mean is None or running_var is None:
        return instance_norm(input, running_mean, running_var, weight, bias, use_input_stats, momentum, eps)
    op = "instance_norm"
    _check_instance_norm(op, input, running_mean, running_var, weight, bias, use_input_stats)
    n, c = input.shape[:2]
    flat, rm, rv, w, b = _as_batch(input, running_mean, running_var, weight, bias)
    out, _, _, new_mean, new_var = native_batch_norm(flat, w, b, rm, rv, True, momentum, eps)
    assign(running_mean, ltorch.mean(ltorch.reshape(new_mean, (n, c)), 0), op, tracked=False)
    assign(running_var, ltorch.mean(ltorch.reshape(new_var, (n, c)), 0), op, tracked=False)
    return ltorch.reshape(out, input.shape)


TORCH_TO_LTORCH[F.instance_norm] = instance_norm_updating
MUTATING.add(F.instance_norm)


# -- local response norm ---------------------------------------------------------------------------


def _local_response_norm(input, size, alpha, beta, k):
    op = "ltorch.local_response_norm"
    check(
        input.ndim >= 3,
        op,
        f"Expected 3D or higher dimensionality input (got {input.ndim} dimensions) (argument input)",
        ThunderValueError,
    )
    if input.numel() == 0:
        return input
    require_float(op, input)
    div = input * input
    if input.ndim == 3:
        div = ltorch.pad(ltorch.unsqueeze(div, 1), (0, 0, size // 2, (size - 1) // 2))
        div = ltorch.squeeze(ltorch.avg_pool2d(*autocast.cast_inside("avg_pool2d", div), (size, 1), stride=1), 1)
    else:
        sizes = tuple(input.shape)
        div = ltorch.reshape(div, (sizes[0], 1, sizes[1], sizes[2], math.prod(sizes[3:])))
        div = ltorch.pad(div, (0, 0, 0, 0, size // 2, (size - 1) // 2))
        div = ltorch.avg_pool3d(*autocast.cast_inside("avg_pool3d", div), (size, 1, 1), stride=1)
        div = ltorch.reshape(ltorch.squeeze(div, 1), sizes)
    return input / ltorch.pow(*autocast.cast_inside("pow", div * alpha + k), beta)


@torchsymbol(F.local_response_norm)
def local_response_norm(input, size, alpha=0.0001, beta=0.75, k=1.0):
    """As F.local_response_norm computes it: each element over (k + alpha * the mean of the
    squares of ``size`` neighbouring channels) ** beta."""
    return _local_response_norm(input, size, alpha, beta, k)


def local_response_norm_call(input, size, alpha=0.0001, beta=0.75, k=1.0):
    """``F.local_response_norm``: one symbol, or under autocast its ops one by one from the
    program's code. Eager's function is Python, so autocast casts each op it calls by that op's
    policy (avg_pool3d to float32 on the CPU, pow on CUDA), which a composite (run whole, with
    autocast off, by the torch executor) would not."""
    if autocast.state() is None:
        return local_response_norm(input, size, alpha, beta, k)
    return _local_response_norm(input, size, alpha, beta, k)


TORCH_TO_LTORCH[F.local_response_norm] = local_response_norm_call


def _aten_group_norm_backward(*args):
    outs = [o for o in torch.ops.aten.native_group_norm_backward.default(*args) if o is not None]
    return outs[0] if len(outs) == 1 else tuple(outs)


# -- grad rule of group norm -----------------------------------------------------------------------


def _put_group_norm_grads(g, input, weight, bias, mean, rstd, n, c, hxw, groups) -> None:
    """The gradients ``native_group_norm_backward`` (eager's kernel) gives of the inputs that
    require grad, from the output's cotangent ``g``."""
    mask = [x is not None and x.requires_grad for x in (input, weight, bias)]
    if not any(mask):
        return
    grads = native_group_norm_backward(g, input, mean, rstd, weight, n, c, hxw, groups, mask)
    wanted = [x for x, w in zip((input, weight, bias), mask) if w]
    for x, grad in zip(wanted, grads if isinstance(grads, tuple) else (grads,)):
        put_grad(x, grad)


@register_grad(ltorch.group_norm)
def group_norm_grad(input, num_groups, weight=None, bias=None, eps=1e-05):
    check_group_norm("ltorch.group_norm", input, num_groups, weight, bias)
    n, c = input.shape[:2]
    hxw = math.prod(input.shape[2:])
    out, mean, rstd = native_group_norm(input, weight, bias, n, c, hxw, num_groups, eps)
    if any(x is not None and x.requires_grad for x in (input, weight, bias)):
        _put_group_norm_grads(get_grad(out), input, weight, bias, mean, rstd, n, c, hxw, num_groups)
    return out


def _through_stats(input, rstd, g_mean, g_rstd, n: int, c: int, hxw: int, groups: int):
    """The input's gradient through the mean and rstd outputs of ``native_group_norm``, as
    eager's backward adds it to the kernel's: ``var_mean_backward`` of the variance's cotangent
    (-rstd^3 / 2 times rstd's) and the mean's over each group, ops of their own in the input's
    dtype, the group's mean taken again from a contiguous copy of the input (as eager's sums it)."""
    shape, stats = (n, groups, c // groups, hxw), (n, groups, 1, 1)
    x = ltorch.reshape(ltorch.clone(input, memory_format=torch.contiguous_format), shape)
    rstd = ltorch.reshape(rstd, stats)
    g_var = -0.5 * (rstd * rstd * rstd) * ltorch.reshape(g_rstd, stats)
    size = c // groups * hxw
    through_var = (2.0 / size) * g_var * (x - ltorch.mean(x, (2, 3), keepdim=True))
    through_mean = ltorch.expand(ltorch.reshape(g_mean, stats), shape) / size
    return ltorch.reshape(through_var + through_mean, input.shape)


@register_grad(native_group_norm)
def native_group_norm_grad(input, weight, bias, N, C, HxW, group, eps):
    """``torch.native_group_norm`` called directly: its kernel and eager's backward kernel, as
    ``group_norm``; cotangents of the mean and rstd outputs (zeros when the program does not
    differentiate them) add their terms to the input's gradient."""
    out, mean, rstd = native_group_norm(input, weight, bias, N, C, HxW, group, eps)
    g = get_grad(out)
    g_mean, g_rstd = get_grad(mean), get_grad(rstd)
    mask = [x is not None and x.requires_grad for x in (input, weight, bias)]
    if not any(mask):
        return out, mean, rstd
    grads = native_group_norm_backward(g, input, mean, rstd, weight, N, C, HxW, group, mask)
    grads = list(grads) if isinstance(grads, tuple) else [grads]
    if input.requires_grad:
        grads[0] = grads[0] + _through_stats(input, rstd, g_mean, g_rstd, N, C, HxW, group)
    for x, grad in zip([x for x, w in zip((input, weight, bias), mask) if w], grads):
        put_grad(x, grad)
    return out, mean, rstd


#: The aten call the torch executor runs for the backward kernel.
TORCH_IMPLS = {native_group_norm_backward: _aten_group_norm_backward}
