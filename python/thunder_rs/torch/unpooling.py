"""Max un-pooling (``torch.nn.functional.max_unpool1d`` to ``3d``): each input element written at
its flat spatial index of the output, the last of several equal indices winning as in eager's
kernel, and its grad rule (eager's: the gradient gathered at the indices).
"""

import math

import torch
import torch.nn.functional as F

from thunder_rs import prims
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.errors import ThunderRuntimeError, ThunderValueError, check
from thunder_rs.torch.pooling import spatial_tuple
from thunder_rs.torch.symbols import ltorch, torchsymbol
from thunder_rs.core.lang.symint import same_shape

__all__ = ["max_unpool1d", "max_unpool2d", "max_unpool3d"]


# -- unpooling -------------------------------------------------------------------------------------


def unpool_sizes(op: str, input, n: int, kernel_size, stride, padding, output_size) -> tuple[int, ...]:
    """The output's spatial sizes, as ``F._unpool_output_size`` computes and checks them."""
    kernel = spatial_tuple(op, kernel_size, n, "kernel_size")
    strides = kernel if stride is None else spatial_tuple(op, stride, n, "stride")
    pads = spatial_tuple(op, padding, n, "padding")
    default = tuple((input.shape[input.ndim - n + i] - 1) * strides[i] + kernel[i] - 2 * pads[i] for i in range(n))
    if output_size is None:
        sizes = default
    else:
        sizes = tuple(output_size)
        sizes = sizes[2:] if len(sizes) == n + 2 else sizes
        check(
            len(sizes) == n,
            op,
            f"output_size should be a sequence containing {n} or {n + 2} elements, but it has "
            f"a length of '{len(sizes)}' (argument output_size)",
            ThunderValueError,
        )
        for d in range(n):
            low, high = default[d] - strides[d], default[d] + strides[d]
            check(
                low < sizes[d] < high,
                op,
                f'invalid output_size "{list(sizes)}" (dim {d} must be between {low} and '
                f"{high}) (argument output_size)",
                ThunderValueError,
            )
    check(
        all(s >= 0 for s in sizes),
        op,
        f"output_size must contain non-negative spatial dimensions, but got {list(sizes)} (argument output_size)",
        ThunderValueError,
    )
    return sizes


def _max_unpool(op: str, n: int, input, indices, kernel_size, stride, padding, output_size):
    check(
        input.ndim in (n + 1, n + 2),
        op,
        f"Expected {n + 1}D or {n + 2}D tensor for input, but got {input.ndim}D (argument input)",
        ThunderRuntimeError,
    )
    check(
        indices.dtype == torch.int64,
        op,
        f"elements in indices should be type int64 but got: {indices.dtype} (argument indices)",
        ThunderRuntimeError,
    )
    check(
        same_shape(indices.shape, input.shape),
        op,
        f"Expected shape of indices to be same as that of the input "
        f"tensor ({list(input.shape)}) but got indices tensor with shape: {list(indices.shape)} (argument indices)",
        ThunderRuntimeError,
    )
    sizes = unpool_sizes(op, input, n, kernel_size, stride, padding, output_size)
    lead = tuple(input.shape[:-n])
    count = math.prod(input.shape[-n:])
    values, targets = prims.reshape(input, (*lead, count)), prims.reshape(indices, (*lead, count))
    last = len(lead)
    # Eager writes the values in order, so the last of several equal indices wins: sorted
    # stably, each run of equal indices keeps its last value.
    sorted_targets, order = prims.sort(targets, last, False, True)
    sorted_values = prims.take_along_axis(values, order, last)
    rest = prims.slice(sorted_targets, (0,) * last + (1,), (*lead, count), (1,) * (last + 1))
    following = prims.pad(rest, -1, (*((0, 0, 0),) * last, (0, 1, 0)))
    kept = prims.where(prims.ne(sorted_targets, following), sorted_values, 0)
    zeros = prims.full((*lead, math.prod(sizes)), 0, input.device, input.dtype)
    return prims.reshape(prims.scatter_add(zeros, sorted_targets, kept, last), (*lead, *sizes))


@torchsymbol(F.max_unpool1d)
def max_unpool1d(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    return _max_unpool("ltorch.max_unpool1d", 1, input, indices, kernel_size, stride, padding, output_size)


@torchsymbol(F.max_unpool2d)
def max_unpool2d(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    return _max_unpool("ltorch.max_unpool2d", 2, input, indices, kernel_size, stride, padding, output_size)


@torchsymbol(F.max_unpool3d)
def max_unpool3d(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    return _max_unpool("ltorch.max_unpool3d", 3, input, indices, kernel_size, stride, padding, output_size)


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
