"""Adaptive pooling (``torch.nn.functional``): adaptive average and max pooling over 1 to 3
spatial dims, their backward kernels (symbols whose prim body is what eager's kernel computes; the
torch executor runs each as that aten call, its torch callable) and the grad rules that call them, as
eager's autograd does. Windows are gathered with ``pooling.py``'s geometry, from tables of aten's
adaptive windows (``adaptive_table``). Over a symbolic input size pooled to a constant output size
the table is as wide as the longest window can be (``adaptive_longest``) and computed from the size
on each call, so one trace serves every size.
"""

import math

import torch
import torch.nn.functional as F

from thunder_rs import prims
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.errors import (
    ThunderRuntimeError,
    ThunderTypeError,
    ThunderValueError,
    check,
)
from thunder_rs.torch.common import is_int
from thunder_rs.torch.symbols import ltorch, torchsymbol
from thunder_rs.torch.pooling import (
    _require_dtype,
    check_pool_input,
    eager_argmax,
    flat_positions,
    gather_windows,
    scatter_along,
)
from thunder_rs.torch.pooling import _as_2d, _scatter_to_indices
from thunder_rs.core.lang.symint import identical, is_symbolic


__all__ = [
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool1d",
    "adaptive_max_pool2d",
    "adaptive_max_pool3d",
    "adaptive_max_pool1d_with_indices",
    "adaptive_max_pool2d_with_indices",
    "adaptive_max_pool3d_with_indices",
    "adaptive_max_pool2d_backward",
    "adaptive_max_pool3d_backward",
    "adaptive_avg_pool2d_backward",
    "adaptive_avg_pool3d_backward",
]


_aten = torch.ops.aten


# -- adaptive pooling ------------------------------------------------------------------------------


def adaptive_longest(size, out):
    """The length of the longest adaptive window of ``size`` elements pooled to ``out``: exact
    where both are constants. Where ``size`` is symbolic, a bound that holds for every size (no
    guard): each window's end - start is below size / out + 2, so at most ceil(size / out) + 1;
    exact for a global pool (out 1: the whole size) and where out is size itself (``None`` in
    output_size: windows of one element)."""
    if not is_symbolic((size, out)):
        return max(-(-(o + 1) * size // out) - (o * size // out) for o in range(out))
    if identical(size, out):
        return 1
    if identical(out, 1):
        return size
    return (size + out - 1) // out + 1


def adaptive_table(device, size, out: int):
    """Adaptive window o covers [floor(o * size / out), ceil((o + 1) * size / out)), as aten's
    ``start_index`` and ``end_index``; its elements past the window's length (up to
    ``adaptive_longest``) repeat its last one (harmless to max and argmax, masked out by average
    pooling). Returns the table and each window's length. ``size`` may be symbolic: the table is
    computed from it on each call, so one trace serves every size."""
    longest = adaptive_longest(size, out)
    o = prims.iota(out, 0, 1, device, torch.int64)
    start = prims.div(prims.mul(o, size), out)
    end = prims.div(prims.add(prims.mul(o, size), size + out - 1), out)
    grid = (out, longest)
    table = prims.add(
        prims.broadcast_in_dim(start, grid, (0,)),
        prims.broadcast_in_dim(prims.iota(longest, 0, 1, device, torch.int64), grid, (1,)),
    )
    last = prims.broadcast_in_dim(prims.sub(end, 1), grid, (0,))
    return prims.minimum(table, last), prims.sub(end, start)


def adaptive_sizes(op: str, input, n: int, output_size) -> tuple[int, ...]:
    """The output's spatial sizes; None keeps the input's size along that dim."""
    check(
        n > 1 or output_size is not None,
        op,
        "output_size must be an int or a tuple of one int, not None (argument output_size)",
        ThunderTypeError,
    )
    sizes: tuple = (output_size,) * n if output_size is None or is_int(output_size) else tuple(output_size)
    check(
        len(sizes) in (1, n),
        op,
        f"output_size must be {n} ints, got {output_size} (argument output_size)",
        ThunderRuntimeError,
    )
    sizes = sizes * n if len(sizes) == 1 else sizes
    sizes = tuple(input.shape[input.ndim - n + i] if s is None else s for i, s in enumerate(sizes))
    check(
        all(s >= 0 for s in sizes),
        op,
        f"output_size must be non-negative, got {sizes} (argument output_size)",
        ThunderRuntimeError,
    )
    return sizes


def _check_listed_rank(op: str, n: int, input, output_size) -> None:
    """Eager's ValueError (``F._list_with_default``, before the kernel's checks) for an input of no
    more dims than a listed ``output_size`` of a 2-d or 3-d pool has sizes."""
    if n > 1 and isinstance(output_size, (tuple, list)):
        check(
            input.ndim > len(output_size),
            op,
            f"Input dimension should be at least {len(output_size) + 1} (argument input of shape {list(input.shape)})",
            ThunderValueError,
        )


def _adaptive_avg(op: str, n: int, input, output_size):
    _check_listed_rank(op, n, input, output_size)
    check_pool_input(op, input, n)
    _require_dtype(op, input, floats_only=True)
    outs = adaptive_sizes(op, input, n, output_size)
    x = input
    # An average over a box is the average along each dim in turn.
    for i, out in enumerate(outs):
        axis = input.ndim - n + i
        if out == 0:
            return prims.full((*input.shape[:-n], *outs), 0.0, input.device, input.dtype)
        table, lengths = adaptive_table(input.device, x.shape[axis], out)
        longest = table.shape[1]
        taken = prims.take(x, prims.reshape(table, (out * longest,)), axis)
        taken = prims.reshape(taken, (*taken.shape[:axis], out, longest, *taken.shape[axis + 1 :]))
        inside = prims.lt(
            prims.broadcast_in_dim(prims.iota(longest, 0, 1, input.device, torch.int64), table.shape, (1,)),
            prims.broadcast_in_dim(lengths, table.shape, (0,)),
        )
        mask = prims.broadcast_in_dim(inside, taken.shape, (axis, axis + 1))
        total = prims.sum(prims.where(mask, taken, 0.0), (axis + 1,))
        count = prims.broadcast_in_dim(prims.convert_element_type(lengths, input.dtype), total.shape, (axis,))
        x = prims.div(total, count)
    return x


@torchsymbol(F.adaptive_avg_pool1d, torch.adaptive_avg_pool1d)
def adaptive_avg_pool1d(input, output_size):
    return _adaptive_avg("ltorch.adaptive_avg_pool1d", 1, input, output_size)


@torchsymbol(F.adaptive_avg_pool2d)
def adaptive_avg_pool2d(input, output_size):
    return _adaptive_avg("ltorch.adaptive_avg_pool2d", 2, input, output_size)


@torchsymbol(F.adaptive_avg_pool3d)
def adaptive_avg_pool3d(input, output_size):
    return _adaptive_avg("ltorch.adaptive_avg_pool3d", 3, input, output_size)


def _adaptive_max(op: str, n: int, input, output_size, return_indices):
    _check_listed_rank(op, n, input, output_size)
    check_pool_input(op, input, n)
    _require_dtype(op, input, floats_only=True)
    outs = adaptive_sizes(op, input, n, output_size)
    check(
        all(o > 0 for o in outs),
        op,
        f"output_size must be positive, got {outs} (argument output_size)",
        ThunderRuntimeError,
    )
    sizes = tuple(input.shape[-n:])
    tables = [adaptive_table(input.device, size, out)[0] for size, out in zip(sizes, outs)]
    windows = gather_windows(input, tables)
    last = windows.ndim - 1
    out = prims.amax(windows, (last,))
    if not return_indices:
        return out
    which = eager_argmax(windows, out, None)
    positions = prims.broadcast_in_dim(
        gather_windows(flat_positions(input.device, sizes), tables), windows.shape, tuple(range(last - n, last + 1))
    )
    return out, prims.reshape(prims.take_along_axis(positions, which, last), out.shape)


@torchsymbol(F.adaptive_max_pool1d)
def adaptive_max_pool1d(input, output_size, return_indices=False):
    return _adaptive_max("ltorch.adaptive_max_pool1d", 1, input, output_size, return_indices)


@torchsymbol(F.adaptive_max_pool2d)
def adaptive_max_pool2d(input, output_size, return_indices=False):
    return _adaptive_max("ltorch.adaptive_max_pool2d", 2, input, output_size, return_indices)


@torchsymbol(F.adaptive_max_pool3d)
def adaptive_max_pool3d(input, output_size, return_indices=False):
    return _adaptive_max("ltorch.adaptive_max_pool3d", 3, input, output_size, return_indices)


# F.adaptive_max_poolNd_with_indices return the indices whatever return_indices says.
@torchsymbol(F.adaptive_max_pool1d_with_indices)
def adaptive_max_pool1d_with_indices(input, output_size, return_indices=False):
    return adaptive_max_pool1d(input, output_size, True)


@torchsymbol(F.adaptive_max_pool2d_with_indices)
def adaptive_max_pool2d_with_indices(input, output_size, return_indices=False):
    return adaptive_max_pool2d(input, output_size, True)


@torchsymbol(F.adaptive_max_pool3d_with_indices)
def adaptive_max_pool3d_with_indices(input, output_size, return_indices=False):
    return adaptive_max_pool3d(input, output_size, True)


# -- backward kernels ------------------------------------------------------------------------------


@torchsymbol(_aten.adaptive_max_pool2d_backward.default, name="adaptive_max_pool2d_backward")
def adaptive_max_pool2d_backward(grad_output, input, indices):
    return _scatter_to_indices(grad_output, input, indices, 2)


@torchsymbol(_aten.adaptive_max_pool3d_backward.default, name="adaptive_max_pool3d_backward")
def adaptive_max_pool3d_backward(grad_output, input, indices):
    return _scatter_to_indices(grad_output, input, indices, 3)


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


# -- grad rules ------------------------------------------------------------------------------------


_ADAPTIVE_MAX_BACKWARD = {2: adaptive_max_pool2d_backward, 3: adaptive_max_pool3d_backward}
_ADAPTIVE_AVG_BACKWARD = {2: adaptive_avg_pool2d_backward, 3: adaptive_avg_pool3d_backward}


# -- adaptive pooling ------------------------------------------------------------------------------


def _adaptive_avg_grad(n: int, symbol, input, output_size):
    out = symbol(input, output_size)
    g = get_grad(out)
    if all(type(size) is int and size == 1 for size in out.shape[-n:]):
        # Eager pools to one element as ``input.mean(dims, keepdim=True)``: its gradient is the
        # cotangent expanded, then divided, a new contiguous tensor (the pooling kernel's would
        # have the input's layout, channels_last).
        count = math.prod(input.shape[-n:])
        put_grad(input, ltorch.true_divide(ltorch.expand(g, tuple(input.shape)), count))
        return out
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
