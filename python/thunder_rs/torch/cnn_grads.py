"""Grad rules for the layers of CNNs (pooling, interpolation, group norm): the backward kernels
eager's autograd runs (``pool_kernels``, ``interpolate.upsample_backward``,
``normalization.native_group_norm_backward``).

Max pooling's forward is asked for its indices (one aten call, as eager's forward with grad
makes), and its backward sends each window's gradient to the element those indices name, so
ties go where eager sends them. One-dimensional pools run as eager runs them: through the 2-d
kernels, on the input with a size-1 dim inserted before the last.
"""

import math

from thunder_rs.torch.symbols import ltorch
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.torch import pool_kernels as pk
from thunder_rs.torch.interpolate import check_resize, upsample_backward
from thunder_rs.torch.normalization import check_group_norm, native_group_norm, native_group_norm_backward
from thunder_rs.torch.pooling import spatial_tuple

_MAX_BACKWARD = {2: pk.max_pool2d_with_indices_backward, 3: pk.max_pool3d_with_indices_backward}
_AVG_BACKWARD = {2: pk.avg_pool2d_backward, 3: pk.avg_pool3d_backward}
_ADAPTIVE_MAX_BACKWARD = {2: pk.adaptive_max_pool2d_backward, 3: pk.adaptive_max_pool3d_backward}
_ADAPTIVE_AVG_BACKWARD = {2: pk.adaptive_avg_pool2d_backward, 3: pk.adaptive_avg_pool3d_backward}


def _as_2d(*tensors):
    return [ltorch.unsqueeze(t, -2) for t in tensors]


def _window_args(op: str, n: int, kernel_size, stride, padding, dilation):
    """Kernel, stride, padding and dilation as the aten backwards take them: n ints each (1-d
    pools as 2-d ones with a size-1 window along the inserted dim)."""
    kernel = spatial_tuple(op, kernel_size, n, "kernel_size")
    strides = (
        kernel
        if stride is None or (not isinstance(stride, int) and len(stride) == 0)
        else spatial_tuple(op, stride, n, "stride")
    )
    args = [kernel, strides, spatial_tuple(op, padding, n, "padding"), spatial_tuple(op, dilation, n, "dilation")]
    if n == 1:
        args = [(fill, *a) for fill, a in zip((1, 1, 0, 1), args)]
    return args


# -- max pooling -----------------------------------------------------------------------------------


def _max_pool_grad(n: int, symbol, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices):
    out, indices = symbol(input, kernel_size, stride, padding, dilation, ceil_mode, True)
    kernel, strides, pads, dils = _window_args(symbol.symbol_name, n, kernel_size, stride, padding, dilation)
    g = get_grad(out)
    if n == 1:
        g2, x2, i2 = _as_2d(g, input, indices)
        grad = ltorch.squeeze(_MAX_BACKWARD[2](g2, x2, kernel, strides, pads, dils, ceil_mode, i2), -2)
    else:
        grad = _MAX_BACKWARD[n](g, input, kernel, strides, pads, dils, ceil_mode, indices)
    put_grad(input, grad)
    return (out, indices) if return_indices else out


@register_grad(ltorch.max_pool1d)
def max_pool1d_grad(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return _max_pool_grad(
        1, ltorch.max_pool1d, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices
    )


@register_grad(ltorch.max_pool2d)
def max_pool2d_grad(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return _max_pool_grad(
        2, ltorch.max_pool2d, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices
    )


@register_grad(ltorch.max_pool3d)
def max_pool3d_grad(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return _max_pool_grad(
        3, ltorch.max_pool3d, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices
    )


# -- average pooling -------------------------------------------------------------------------------


def _avg_pool_grad(n: int, symbol, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    extra = () if n == 1 else (divisor_override,)
    out = symbol(input, kernel_size, stride, padding, ceil_mode, count_include_pad, *extra)
    kernel, strides, pads, _ = _window_args(symbol.symbol_name, n, kernel_size, stride, padding, 1)
    g = get_grad(out)
    if n == 1:
        g2, x2 = _as_2d(g, input)
        grad = ltorch.squeeze(_AVG_BACKWARD[2](g2, x2, kernel, strides, pads, ceil_mode, count_include_pad, None), -2)
    else:
        grad = _AVG_BACKWARD[n](g, input, kernel, strides, pads, ceil_mode, count_include_pad, divisor_override)
    put_grad(input, grad)
    return out


@register_grad(ltorch.avg_pool1d)
def avg_pool1d_grad(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    return _avg_pool_grad(1, ltorch.avg_pool1d, input, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


@register_grad(ltorch.avg_pool2d)
def avg_pool2d_grad(
    input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None
):
    return _avg_pool_grad(
        2, ltorch.avg_pool2d, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )


@register_grad(ltorch.avg_pool3d)
def avg_pool3d_grad(
    input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None
):
    return _avg_pool_grad(
        3, ltorch.avg_pool3d, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )


# -- adaptive pooling ------------------------------------------------------------------------------


def _adaptive_avg_grad(n: int, symbol, input, output_size):
    out = symbol(input, output_size)
    g = get_grad(out)
    if n == 1:
        g2, x2 = _as_2d(g, input)
        grad = ltorch.squeeze(_ADAPTIVE_AVG_BACKWARD[2](g2, x2), -2)
    else:
        grad = _ADAPTIVE_AVG_BACKWARD[n](g, input)
    put_grad(input, grad)
    return out


@register_grad(ltorch.adaptive_avg_pool1d)
def adaptive_avg_pool1d_grad(input, output_size):
    return _adaptive_avg_grad(1, ltorch.adaptive_avg_pool1d, input, output_size)


@register_grad(ltorch.adaptive_avg_pool2d)
def adaptive_avg_pool2d_grad(input, output_size):
    return _adaptive_avg_grad(2, ltorch.adaptive_avg_pool2d, input, output_size)


@register_grad(ltorch.adaptive_avg_pool3d)
def adaptive_avg_pool3d_grad(input, output_size):
    return _adaptive_avg_grad(3, ltorch.adaptive_avg_pool3d, input, output_size)


def _adaptive_max_grad(n: int, symbol, input, output_size, return_indices):
    out, indices = symbol(input, output_size, True)
    g = get_grad(out)
    if n == 1:
        g2, x2, i2 = _as_2d(g, input, indices)
        grad = ltorch.squeeze(_ADAPTIVE_MAX_BACKWARD[2](g2, x2, i2), -2)
    else:
        grad = _ADAPTIVE_MAX_BACKWARD[n](g, input, indices)
    put_grad(input, grad)
    return (out, indices) if return_indices else out


@register_grad(ltorch.adaptive_max_pool1d)
def adaptive_max_pool1d_grad(input, output_size, return_indices=False):
    return _adaptive_max_grad(1, ltorch.adaptive_max_pool1d, input, output_size, return_indices)


@register_grad(ltorch.adaptive_max_pool2d)
def adaptive_max_pool2d_grad(input, output_size, return_indices=False):
    return _adaptive_max_grad(2, ltorch.adaptive_max_pool2d, input, output_size, return_indices)


@register_grad(ltorch.adaptive_max_pool3d)
def adaptive_max_pool3d_grad(input, output_size, return_indices=False):
    return _adaptive_max_grad(3, ltorch.adaptive_max_pool3d, input, output_size, return_indices)


# -- unpooling -------------------------------------------------------------------------------------


def _max_unpool_grad(n: int, symbol, input, indices, kernel_size, stride, padding, output_size):
    """Eager's: each input element gets the gradient at its index, also where a later equal
    index overwrote it in the forward."""
    out = symbol(input, indices, kernel_size, stride, padding, output_size)
    g = get_grad(out)
    lead = tuple(input.shape[:-n])
    flat = ltorch.reshape(g, (*lead, math.prod(g.shape[-n:])))
    picked = ltorch.gather(flat, len(lead), ltorch.reshape(indices, (*lead, math.prod(input.shape[-n:]))))
    put_grad(input, ltorch.reshape(picked, input.shape))
    return out


@register_grad(ltorch.max_unpool1d)
def max_unpool1d_grad(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    return _max_unpool_grad(1, ltorch.max_unpool1d, input, indices, kernel_size, stride, padding, output_size)


@register_grad(ltorch.max_unpool2d)
def max_unpool2d_grad(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    return _max_unpool_grad(2, ltorch.max_unpool2d, input, indices, kernel_size, stride, padding, output_size)


@register_grad(ltorch.max_unpool3d)
def max_unpool3d_grad(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    return _max_unpool_grad(3, ltorch.max_unpool3d, input, indices, kernel_size, stride, padding, output_size)


# -- interpolation ---------------------------------------------------------------------------------


def _resize_grad(op: str, forward, input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias):
    sizes, scales = check_resize(op, input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)
    n = input.ndim - 2
    if mode == "area":  # adaptive average pooling, as F.interpolate computes it
        return _adaptive_avg_grad(
            n,
            (None, ltorch.adaptive_avg_pool1d, ltorch.adaptive_avg_pool2d, ltorch.adaptive_avg_pool3d)[n],
            input,
            sizes,
        )
    out = forward()
    put_grad(input, upsample_backward(get_grad(out), tuple(input.shape), mode, bool(align_corners), scales))
    return out


@register_grad(ltorch.interpolate)
def interpolate_grad(
    input,
    size=None,
    scale_factor=None,
    mode="nearest",
    align_corners=None,
    recompute_scale_factor=None,
    antialias=False,
):
    args = (input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)
    return _resize_grad("ltorch.interpolate", lambda: ltorch.interpolate(*args), *args)


# -- group norm ------------------------------------------------------------------------------------


@register_grad(ltorch.group_norm)
def group_norm_grad(input, num_groups, weight=None, bias=None, eps=1e-05):
    check_group_norm("ltorch.group_norm", input, num_groups, weight, bias)
    n, c = input.shape[:2]
    hxw = math.prod(input.shape[2:])
    out, mean, rstd = native_group_norm(input, weight, bias, n, c, hxw, num_groups, eps)
    wanted = [x for x in (input, weight, bias) if x is not None and x.requires_grad]
    if not wanted:
        return out
    mask = [x is not None and x.requires_grad for x in (input, weight, bias)]
    grads = native_group_norm_backward(get_grad(out), input, mean, rstd, weight, n, c, hxw, num_groups, mask)
    for x, grad in zip(wanted, grads if isinstance(grads, tuple) else (grads,)):
        put_grad(x, grad)
    return out


# -- sliding blocks --------------------------------------------------------------------------------
# im2col and col2im are each other's transpose, one aten call each, as in eager's autograd.


@register_grad(ltorch.im2col)
def im2col_grad(input, kernel_size, dilation=1, padding=0, stride=1):
    out = ltorch.im2col(input, kernel_size, dilation, padding, stride)
    put_grad(input, ltorch.col2im(get_grad(out), tuple(input.shape[-2:]), kernel_size, dilation, padding, stride))
    return out


@register_grad(ltorch.col2im)
def col2im_grad(input, output_size, kernel_size, dilation=1, padding=0, stride=1):
    out = ltorch.col2im(input, output_size, kernel_size, dilation, padding, stride)
    put_grad(input, ltorch.im2col(get_grad(out), kernel_size, dilation, padding, stride))
    return out
