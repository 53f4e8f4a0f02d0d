"""The backward kernels of eager's pooling autograd, as symbols.

Each symbol takes the arguments of the aten backward it stands for and its body, written with
prims, is what that kernel computes; the torch executor runs it as that one aten call
(``TORCH_IMPLS``), a fusion executor may take the decomposition. ``cnn_grads`` calls them, so a
compiled training step makes as many torch calls for its pools as eager's autograd.

A pool's backward is the transpose of its window gathering (``pooling.gather_windows``): one
``index_add`` per spatial dim, in reverse order. Max pooling's goes straight to the saved
indices with a ``scatter_add``, which is what eager's kernels do: an element that is the
maximum of several windows gets the sum of their gradients.
"""

import math

import torch

from thunder_rs import prims
from thunder_rs.torch.symbols import torchsymbol
from thunder_rs.torch.pooling import (
    adaptive_table,
    outer_product,
    padded_lengths,
    pool_out_size,
    scatter_along,
    scatter_windows,
    unpad_spatial,
    window_counts,
    window_tables,
)

__all__ = [
    "max_pool2d_with_indices_backward",
    "max_pool3d_with_indices_backward",
    "adaptive_max_pool2d_backward",
    "adaptive_max_pool3d_backward",
    "avg_pool2d_backward",
    "avg_pool3d_backward",
    "adaptive_avg_pool2d_backward",
    "adaptive_avg_pool3d_backward",
]

_aten = torch.ops.aten


# -- max pooling -----------------------------------------------------------------------------------


def _scatter_to_indices(grad_output, input, indices, n: int):
    """``grad_output`` added into a zero gradient of ``input`` at the flat spatial ``indices``."""
    lead = tuple(input.shape[:-n])
    grads = prims.reshape(grad_output, (*lead, math.prod(grad_output.shape[-n:])))
    targets = prims.reshape(indices, grads.shape)
    zeros = prims.full((*lead, math.prod(input.shape[-n:])), 0.0, input.device, input.dtype)
    return prims.reshape(prims.scatter_add(zeros, targets, grads, len(lead)), tuple(input.shape))


@torchsymbol(_aten.max_pool2d_with_indices_backward.default, name="max_pool2d_with_indices_backward")
def max_pool2d_with_indices_backward(grad_output, input, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_to_indices(grad_output, input, indices, 2)


@torchsymbol(_aten.max_pool3d_with_indices_backward.default, name="max_pool3d_with_indices_backward")
def max_pool3d_with_indices_backward(grad_output, input, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_to_indices(grad_output, input, indices, 3)


@torchsymbol(_aten.adaptive_max_pool2d_backward.default, name="adaptive_max_pool2d_backward")
def adaptive_max_pool2d_backward(grad_output, input, indices):
    return _scatter_to_indices(grad_output, input, indices, 2)


@torchsymbol(_aten.adaptive_max_pool3d_backward.default, name="adaptive_max_pool3d_backward")
def adaptive_max_pool3d_backward(grad_output, input, indices):
    return _scatter_to_indices(grad_output, input, indices, 3)


# -- average pooling -------------------------------------------------------------------------------


def _avg_pool_backward(
    n: int, grad_output, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
):
    kernel, pads = tuple(kernel_size), tuple(padding)
    strides = tuple(stride) if len(stride) else kernel
    sizes = tuple(input.shape[-n:])
    geometry = [
        (size, k, s, p, 1, pool_out_size(size, k, s, p, 1, ceil_mode))
        for size, k, s, p in zip(sizes, kernel, strides, pads)
    ]
    if divisor_override is not None:
        g = prims.div(grad_output, float(divisor_override))
    else:
        counts = outer_product(window_counts(input.device, geometry, count_include_pad), tuple(grad_output.shape))
        g = prims.div(grad_output, prims.convert_element_type(counts, grad_output.dtype))
    # Each window element gets its window's share.
    spread = prims.broadcast_in_dim(g, (*g.shape, math.prod(kernel)), tuple(range(g.ndim)))
    return unpad_spatial(
        scatter_windows(spread, window_tables(input.device, geometry), padded_lengths(geometry)), geometry
    )


@torchsymbol(_aten.avg_pool2d_backward.default, name="avg_pool2d_backward")
def avg_pool2d_backward(
    grad_output, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
):
    return _avg_pool_backward(
        2, grad_output, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )


@torchsymbol(_aten.avg_pool3d_backward.default, name="avg_pool3d_backward")
def avg_pool3d_backward(
    grad_output, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
):
    return _avg_pool_backward(
        3, grad_output, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )


def _adaptive_avg_backward(n: int, grad_output, input):
    """The transpose of ``pooling._adaptive_avg``'s average along each dim in turn."""
    g = grad_output
    for i in reversed(range(n)):
        axis = input.ndim - n + i
        out, size = g.shape[axis], input.shape[axis]
        table, lengths = adaptive_table(input.device, size, out)
        longest = table.shape[1]
        share = prims.div(g, prims.broadcast_in_dim(prims.convert_element_type(lengths, g.dtype), g.shape, (axis,)))
        spread_shape = (*g.shape[:axis], out, longest, *g.shape[axis + 1 :])
        spread = prims.broadcast_in_dim(share, spread_shape, tuple(d if d <= axis else d + 1 for d in range(g.ndim)))
        inside = prims.lt(
            prims.broadcast_in_dim(prims.iota(longest, 0, 1, input.device, torch.int64), table.shape, (1,)),
            prims.broadcast_in_dim(lengths, table.shape, (0,)),
        )
        spread = prims.where(prims.broadcast_in_dim(inside, spread_shape, (axis, axis + 1)), spread, 0.0)
        g = scatter_along(spread, axis, table, size)
    return g


@torchsymbol(_aten._adaptive_avg_pool2d_backward.default, name="adaptive_avg_pool2d_backward")
def adaptive_avg_pool2d_backward(grad_output, input):
    return _adaptive_avg_backward(2, grad_output, input)


@torchsymbol(_aten._adaptive_avg_pool3d_backward.default, name="adaptive_avg_pool3d_backward")
def adaptive_avg_pool3d_backward(grad_output, input):
    return _adaptive_avg_backward(3, grad_output, input)


#: The aten call the torch executor runs for each kernel symbol.
TORCH_IMPLS = {
    max_pool2d_with_indices_backward: _aten.max_pool2d_with_indices_backward.default,
    max_pool3d_with_indices_backward: _aten.max_pool3d_with_indices_backward.default,
    adaptive_max_pool2d_backward: _aten.adaptive_max_pool2d_backward.default,
    adaptive_max_pool3d_backward: _aten.adaptive_max_pool3d_backward.default,
    avg_pool2d_backward: _aten.avg_pool2d_backward.default,
    avg_pool3d_backward: _aten.avg_pool3d_backward.default,
    adaptive_avg_pool2d_backward: _aten._adaptive_avg_pool2d_backward.default,
    adaptive_avg_pool3d_backward: _aten._adaptive_avg_pool3d_backward.default,
}
