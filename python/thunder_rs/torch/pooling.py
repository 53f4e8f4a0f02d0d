"""Pooling (``torch.nn.functional``): max, average and power-average pooling over 1 to 3 spatial
dims (max un-pooling is ``unpooling.py``'s), with the window geometry the adaptive pools and sliding blocks share
(``adaptive_pooling.py``, ``sliding_blocks.py``).

A pool gathers its windows with one ``take`` per spatial dim, from index tables built with
``iota`` (``window_table``): the input of shape (lead..., s1, ..., sn) becomes
(lead..., o1, ..., on, K), the K = k1 * ... * kn elements of each window last, which one
reduction then pools. Padding is a ``pad`` with -inf (max) or 0 (average) in front of it. The
indices that ``return_indices`` asks for are gathered the same way from a table of each input
element's flat spatial position.

The torch executor runs each symbol whole as its torch callable; the grad rules here differentiate
them with eager's backward kernels, symbols here too whose body, written with prims, is what that
kernel computes (the torch executor runs it as that one aten call, its torch callable), so a window's
gradient goes where eager's goes at ties. A pool's backward is the transpose of its window
gathering (``gather_windows``): one ``index_add`` per spatial dim, in reverse order. Max pooling's
goes straight to the saved indices with a ``scatter_add``, which is what eager's kernels do.

Over symbolic input sizes (a size that changes between calls) the geometry is computed, never
decided on the size's value, so one trace serves every size: the right padding that covers the
windows is a bound and a slice (``_covering_pad``), ceil_mode's dropped last window a floor
division (``pool_out_size``). Constant sizes keep the exact geometry.

Max pooling's forward is asked for its indices (one aten call, as eager's forward with grad
makes). One-dimensional pools run as eager runs them: through the 2-d kernels, on the input with a
size-1 dim inserted before the last.
"""

import math

import torch
import torch.nn.functional as F

from thunder_rs import prims
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.errors import (
    ThunderIndexError,
    ThunderNotImplementedError,
    ThunderRuntimeError,
    ThunderValueError,
    check,
)
from thunder_rs.torch.common import flows, is_int, like
from thunder_rs.torch.symbols import ltorch, torchsymbol
from thunder_rs.core.lang.symint import identical, is_symbolic


__all__ = [
    "max_pool1d",
    "max_pool2d",
    "max_pool3d",
    "max_pool1d_with_indices",
    "max_pool2d_with_indices",
    "max_pool3d_with_indices",
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool3d",
    "lp_pool1d",
    "lp_pool2d",
    "lp_pool3d",
    "max_pool2d_with_indices_backward",
    "max_pool3d_with_indices_backward",
    "avg_pool2d_backward",
    "avg_pool3d_backward",
]


_aten = torch.ops.aten


# -- arguments -------------------------------------------------------------------------------------


def spatial_tuple(op: str, value, n: int, arg: str) -> tuple[int, ...]:
    """An int or a sequence of 1 or ``n`` ints as ``n`` ints, as torch's ``_ntuple`` and aten read them."""
    if is_int(value):
        return (value,) * n
    values = tuple(value)
    check(
        len(values) in (1, n),
        op,
        lambda: f"{arg} must either be a single int, or a tuple of {n} ints (argument {arg})",
        ThunderRuntimeError,
    )
    return values * n if len(values) == 1 else values


def check_pool_input(op: str, input, n: int, allow_empty_batch: bool = True) -> None:
    """A (C, s1..sn) or (N, C, s1..sn) input with nonzero sizes after the batch dim."""
    check(
        input.ndim in (n + 1, n + 2),
        op,
        lambda: (
            f"Expected {n + 1}D or {n + 2}D (batch mode) tensor for input, "
            f"but got {input.ndim}D input of shape {list(input.shape)} (argument input)"
        ),
        ThunderRuntimeError,
    )
    inner = input.shape[1:] if input.ndim == n + 2 and allow_empty_batch else input.shape
    check(
        all(s > 0 for s in inner),
        op,
        lambda: (
            f"expected non-empty dims (optional 0 batch size) for input, got shape {list(input.shape)} (argument input)"
        ),
        ThunderRuntimeError,
    )


def _require_dtype(op: str, input, floats_only: bool) -> None:
    integral = input.dtype != torch.bool and not input.dtype.is_complex
    ok = input.dtype.is_floating_point or (not floats_only and integral)
    check(ok, op, lambda: f"not implemented for {input.dtype} (argument input)", ThunderNotImplementedError)


# -- window geometry -------------------------------------------------------------------------------


def pool_out_size(size, k: int, s: int, p: int, d: int, ceil_mode: bool):
    """The output length of a pool along one dim, as aten's ``pooling_output_shape``: with
    ceil_mode a last window may start in the input or the left padding, never the right.

    Whether ceil_mode's last window starts past the input depends on the span's residue modulo
    s; for a symbolic size it is computed rather than decided (a decision would compile once per
    residue): the last start (out - 1) * s lies r = (out - 1) * s - span past the span, r in
    [0, s), and starts in the right padding where r >= c = d * (k - 1) + 1 - p (c >= 1, as
    p <= (d * (k - 1) + 1) // 2): the window dropped is (r + s - c) // s, 0 or 1 where c <= s."""
    span = size + 2 * p - d * (k - 1) - 1
    out = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and is_symbolic((out,)):
        c = d * (k - 1) + 1 - p
        return out if c > s else out - ((out - 1) * s - span + s - c) // s
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def pool_geometry(op: str, input, n: int, kernel_size, stride, padding, dilation, ceil_mode):
    """Per spatial dim: (size, kernel, stride, padding, dilation, out), checked as aten checks them."""
    kernel = spatial_tuple(op, kernel_size, n, "kernel_size")
    strides = (
        kernel
        if stride is None or (not is_int(stride) and len(stride) == 0)
        else spatial_tuple(op, stride, n, "stride")
    )
    pads, dils = spatial_tuple(op, padding, n, "padding"), spatial_tuple(op, dilation, n, "dilation")
    check(
        all(k > 0 for k in kernel),
        op,
        f"kernel size should be greater than zero, but got {kernel} (argument kernel_size)",
        ThunderRuntimeError,
    )
    check(
        all(s > 0 for s in strides),
        op,
        f"stride should be greater than zero, but got {strides} (argument stride)",
        ThunderRuntimeError,
    )
    check(
        all(d > 0 for d in dils),
        op,
        f"dilation should be greater than zero, but got {dils} (argument dilation)",
        ThunderRuntimeError,
    )
    check(
        all(0 <= p <= (d * (k - 1) + 1) // 2 for k, p, d in zip(kernel, pads, dils)),
        op,
        f"pad should be at most half of effective kernel size, but got pad={pads}, kernel_size={kernel} and "
        f"dilation={dils} (argument padding)",
        ThunderRuntimeError,
    )
    sizes = tuple(input.shape[-n:])
    geometry = [
        (size, k, s, p, d, pool_out_size(size, k, s, p, d, ceil_mode))
        for size, k, s, p, d in zip(sizes, kernel, strides, pads, dils)
    ]
    outs = tuple(g[-1] for g in geometry)
    check(
        all(o > 0 for o in outs),
        op,
        f"Given input size {sizes}, the calculated output size {outs} is too small (argument kernel_size)",
        ThunderRuntimeError,
    )
    return geometry


def steps(device, length, start: int, step):
    """The int64 range ``start + i * step`` for i < length; ``step`` may be a symbolic size (a
    kernel that is one, as a pool's default stride), which an iota's step cannot be."""
    if type(step) is int:
        return prims.iota(length, start, step, device, torch.int64)
    return prims.add(prims.mul(prims.iota(length, 0, 1, device, torch.int64), step), start)


def _index_grid(device, rows: int, row_step: int, cols: int, col_step: int):
    """The int64 (rows, cols) table r * row_step + c * col_step."""
    r, c = steps(device, rows, 0, row_step), steps(device, cols, 0, col_step)
    return prims.add(prims.broadcast_in_dim(r, (rows, cols), (0,)), prims.broadcast_in_dim(c, (rows, cols), (1,)))


def window_table(device, out: int, k: int, s: int, d: int):
    """Window o's element j sits at o * s + j * d of the padded input."""
    return _index_grid(device, out, s, k, d)


def gather_windows(x, tables):
    """``x`` (lead..., s1..sn) as (lead..., o1..on, K): the windows that the (o_i, k_i) index
    ``tables`` pick along each spatial dim, their elements last."""
    n = len(tables)
    lead = x.ndim - n
    for i, table in enumerate(tables):
        axis = lead + 2 * i  # each earlier dim is now (o, k)
        out, k = table.shape
        taken = prims.take(x, prims.reshape(table, (out * k,)), axis)
        x = prims.reshape(taken, (*taken.shape[:axis], out, k, *taken.shape[axis + 1 :]))
    order = (*range(lead), *(lead + 2 * i for i in range(n)), *(lead + 2 * i + 1 for i in range(n)))
    x = prims.transpose(x, order)
    return prims.reshape(x, (*x.shape[: lead + n], math.prod(x.shape[lead + n :])))


def scatter_along(grad, axis: int, table, length: int):
    """The transpose of taking ``table``'s (out, k) positions along ``axis``: ``grad``'s
    (out, k) dims at ``axis`` added into ``length`` positions."""
    out, k = table.shape
    merged = prims.reshape(grad, (*grad.shape[:axis], out * k, *grad.shape[axis + 2 :]))
    zeros = prims.full((*merged.shape[:axis], length, *merged.shape[axis + 1 :]), 0, grad.device, grad.dtype)
    return prims.index_add(zeros, prims.reshape(table, (out * k,)), merged, axis)


def scatter_windows(windows, tables, lengths):
    """The transpose of ``gather_windows``: the (lead..., o1..on, K) window elements added into
    (lead..., l1..ln), one dim at a time from the last."""
    n = len(tables)
    lead = windows.ndim - n - 1
    outs, kernel = [t.shape[0] for t in tables], [t.shape[1] for t in tables]
    x = prims.reshape(windows, (*windows.shape[:lead], *outs, *kernel))
    x = prims.transpose(x, (*range(lead), *(d for i in range(n) for d in (lead + i, lead + n + i))))
    for i in reversed(range(n)):
        x = scatter_along(x, lead + 2 * i, tables[i], lengths[i])
    return x


def window_tables(device, geometry):
    return [window_table(device, out, k, s, d) for size, k, s, p, d, out in geometry]


def padded_lengths(geometry) -> list:
    """Each spatial dim's length once padded to cover its windows (``_pad_spatial`` before its
    trim). Where the size is symbolic, the bound ``_covering_pad`` pads by (no guard)."""
    return [
        size + p + _covering_pad(size, k, s, p, d, out)
        if is_symbolic((size, out))
        else max((out - 1) * s + d * (k - 1) + 1, size + p)
        for size, k, s, p, d, out in geometry
    ]


def unpad_spatial(x, geometry):
    """``x`` (lead..., padded spatial dims) without the padding ``padded_lengths`` added."""
    n = len(geometry)
    start = (0,) * (x.ndim - n) + tuple(p for size, k, s, p, d, out in geometry)
    end = tuple(x.shape[: x.ndim - n]) + tuple(p + size for size, k, s, p, d, out in geometry)
    return prims.slice(x, start, end, (1,) * x.ndim)


def flat_positions(device, sizes):
    """Each spatial element's flat index into the (s1..sn) plane, as int64 of that shape."""
    return prims.reshape(prims.iota(math.prod(sizes), 0, 1, device, torch.int64), tuple(sizes))


def _covering_pad(size, k: int, s: int, p: int, d: int, out) -> int:
    """The right padding past ``p`` that covers every window: the exact amount for constant sizes;
    for a symbolic size a bound instead. The last window ends at (out - 1) * s + d * (k - 1) + 1,
    at most size + 2p + s - 1 (out's floor or ceil division by s), while whether it ends past the
    input depends on the size's residue modulo s: a decision would compile once per residue."""
    if is_symbolic((size, out)):
        return p + s - 1
    return max((out - 1) * s + d * (k - 1) + 1 - size - p, 0)


def _pad_spatial(x, geometry, fill):
    """``x`` padded (or trimmed) on each spatial dim to just cover its windows."""
    n = len(geometry)
    config, ends = [(0, 0, 0)] * (x.ndim - n), list(x.shape[:-n])
    for size, k, s, p, d, out in geometry:
        ends.append((out - 1) * s + d * (k - 1) + 1)
        config.append((p, _covering_pad(size, k, s, p, d, out), 0))
    padded = prims.pad(x, fill, tuple(config))
    if all(identical(a, b) for a, b in zip(ends, padded.shape)):
        return padded
    return prims.slice(padded, (0,) * x.ndim, tuple(ends), (1,) * x.ndim)


def pool_windows(x, geometry, tables, fill):
    """``x``'s windows: ``gather_windows`` of it padded with ``fill``. A global pool's (each window
    the whole of its dim, as in ``F.max_pool2d(x, x.shape[2:])``) are ``x`` reshaped, no gather:
    the pool is a reduction over the spatial dims."""
    n = len(geometry)
    if all(p == 0 and identical(k, size) and identical(out, 1) for size, k, s, p, d, out in geometry):
        return prims.reshape(x, (*x.shape[:-n], *(1,) * n, math.prod(x.shape[-n:])))
    return gather_windows(_pad_spatial(x, geometry, fill), tables)


def _lowest(dtype):
    return -math.inf if dtype.is_floating_point else torch.iinfo(dtype).min


# -- max pooling -----------------------------------------------------------------------------------


def _max_pool(op: str, n: int, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices):
    check_pool_input(op, input, n)
    _require_dtype(op, input, floats_only=False)
    geometry = pool_geometry(op, input, n, kernel_size, stride, padding, dilation, ceil_mode)
    tables = [window_table(input.device, out, k, s, d) for size, k, s, p, d, out in geometry]
    windows = pool_windows(input, geometry, tables, _lowest(input.dtype))
    last = windows.ndim - 1
    out = prims.amax(windows, (last,))
    if not return_indices:
        return out
    positions = flat_positions(input.device, [g[0] for g in geometry])
    position_windows = prims.broadcast_in_dim(
        pool_windows(positions, geometry, tables, -1), windows.shape, tuple(range(last - n, last + 1))
    )
    which = eager_argmax(windows, out, prims.ge(position_windows, 0))
    return out, prims.reshape(prims.take_along_axis(position_windows, which, last), out.shape)


def eager_argmax(windows, maxima, valid):
    """Which element of each window (last dim) eager's max pooling kernels pick: the first
    ``valid`` one (not padding) equal to the maximum, or the last NaN when there is one. A
    window of -inf alone picks its first valid element. Returned with a size-1 last dim."""
    last = windows.ndim - 1
    as_int = lambda mask: prims.convert_element_type(mask, torch.int64)  # noqa: E731
    hit = prims.eq(windows, prims.broadcast_in_dim(maxima, windows.shape, tuple(range(last))))
    first = prims.argmax(as_int(hit if valid is None else prims.bitwise_and(hit, valid)), last)
    nan = as_int(prims.ne(windows, windows))
    if not windows.dtype.is_floating_point:
        return prims.reshape(first, (*first.shape, 1))
    last_nan = prims.sub(windows.shape[last] - 1, prims.argmax(prims.flip(nan, (last,)), last))
    which = prims.where(prims.gt(prims.amax(nan, (last,)), 0), last_nan, first)
    return prims.reshape(which, (*which.shape, 1))


@torchsymbol(F.max_pool1d, torch.max_pool1d)
def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    op = "ltorch.max_pool1d"
    check(
        return_indices or input.dtype.is_floating_point,
        op,
        lambda: f'"max_pool1d_impl" not implemented for {input.dtype} (argument input)',
        ThunderNotImplementedError,
    )
    return _max_pool(op, 1, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


@torchsymbol(F.max_pool2d, torch.max_pool2d)
def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return _max_pool("ltorch.max_pool2d", 2, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


@torchsymbol(F.max_pool3d, torch.max_pool3d)
def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return _max_pool("ltorch.max_pool3d", 3, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


# F.max_poolNd_with_indices return the indices whatever return_indices says.
@torchsymbol(F.max_pool1d_with_indices)
def max_pool1d_with_indices(
    input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False
):
    return max_pool1d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


@torchsymbol(F.max_pool2d_with_indices)
def max_pool2d_with_indices(
    input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False
):
    return max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


@torchsymbol(F.max_pool3d_with_indices)
def max_pool3d_with_indices(
    input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False
):
    return max_pool3d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


# -- average pooling -------------------------------------------------------------------------------


def window_counts(device, geometry, count_include_pad: bool):
    """Per spatial dim, each window's element count that average pooling divides by: the part
    inside the padded input (count_include_pad), or inside the input itself."""
    counts = []
    for size, k, s, p, d, out in geometry:
        start = steps(device, out, -p, s)
        end = prims.minimum(prims.add(start, k), size + p)
        if not count_include_pad:
            start, end = prims.maximum(start, 0), prims.minimum(end, size)
        counts.append(prims.sub(end, start))
    return counts


def outer_product(vectors, shape):
    """The product of 1-D ``vectors``, one along each of the last len(vectors) dims of ``shape``."""
    n, total = len(vectors), None
    for i, v in enumerate(vectors):
        b = prims.broadcast_in_dim(v, shape, (len(shape) - n + i,))
        total = b if total is None else prims.mul(total, b)
    return total


def _avg_pool(op: str, n: int, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    # aten's avg_pool2d reads the channel dim before it checks the input's dims.
    check(
        n != 2 or input.ndim >= 3,
        op,
        f"Dimension out of range: expected a 3-D or 4-D input, got {input.ndim}-D (argument input)",
        ThunderIndexError,
    )
    check_pool_input(op, input, n)
    _require_dtype(op, input, floats_only=False)
    check(
        divisor_override is None or divisor_override != 0,
        op,
        "divisor must be not zero (argument divisor_override)",
        ThunderRuntimeError,
    )
    geometry = pool_geometry(op, input, n, kernel_size, stride, padding, 1, ceil_mode)
    tables = [window_table(input.device, out, k, s, d) for size, k, s, p, d, out in geometry]
    windows = pool_windows(input, geometry, tables, 0)
    total = prims.sum(windows, (windows.ndim - 1,))
    if divisor_override is not None:
        return prims.div(total, float(divisor_override) if input.dtype.is_floating_point else int(divisor_override))
    counts = outer_product(window_counts(input.device, geometry, count_include_pad), total.shape)
    return prims.div(total, prims.convert_element_type(counts, input.dtype))


@torchsymbol(F.avg_pool1d, torch.avg_pool1d)
def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    return _avg_pool("ltorch.avg_pool1d", 1, input, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


@torchsymbol(F.avg_pool2d)
def avg_pool2d(
    input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None
):
    return _avg_pool(
        "ltorch.avg_pool2d", 2, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )


@torchsymbol(F.avg_pool3d)
def avg_pool3d(
    input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None
):
    return _avg_pool(
        "ltorch.avg_pool3d", 3, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )


# -- power-average pooling -------------------------------------------------------------------------


def _lp_pool(op: str, n: int, max_pool, avg_pool, input, norm_type, kernel_size, stride, ceil_mode):
    """F.lp_poolNd as torch writes it: the p-th root of the windows' sum of p-th powers."""
    check(
        norm_type != 0,
        op,
        f"norm_type must be a non-zero value, but got {norm_type} (argument norm_type)",
        ThunderValueError,
    )
    if norm_type == math.inf:
        return max_pool(ltorch.abs(input), kernel_size, stride, 0, 1, ceil_mode)
    if norm_type == -math.inf:
        return ltorch.neg(max_pool(ltorch.neg(ltorch.abs(input)), kernel_size, stride, 0, 1, ceil_mode))
    out = avg_pool(ltorch.pow(input, norm_type), kernel_size, stride, 0, ceil_mode)
    window = math.prod(spatial_tuple(op, kernel_size, n, "kernel_size"))
    signed = ltorch.mul(ltorch.sign(out), ltorch.relu(ltorch.abs(out)))
    return ltorch.pow(ltorch.mul(signed, window), 1.0 / norm_type)


@torchsymbol(F.lp_pool1d)
def lp_pool1d(input, norm_type, kernel_size, stride=None, ceil_mode=False):
    return _lp_pool("ltorch.lp_pool1d", 1, max_pool1d, avg_pool1d, input, norm_type, kernel_size, stride, ceil_mode)


@torchsymbol(F.lp_pool2d)
def lp_pool2d(input, norm_type, kernel_size, stride=None, ceil_mode=False):
    return _lp_pool("ltorch.lp_pool2d", 2, max_pool2d, avg_pool2d, input, norm_type, kernel_size, stride, ceil_mode)


@torchsymbol(F.lp_pool3d)
def lp_pool3d(input, norm_type, kernel_size, stride=None, ceil_mode=False):
    return _lp_pool("ltorch.lp_pool3d", 3, max_pool3d, avg_pool3d, input, norm_type, kernel_size, stride, ceil_mode)


# -- backward kernels ------------------------------------------------------------------------------


def _scatter_to_indices(grad_output, input, indices, n: int):
    """``grad_output`` added into a zero gradient of ``input`` at the flat spatial ``indices``."""
    lead = tuple(input.shape[:-n])
    grads = prims.reshape(grad_output, (*lead, math.prod(grad_output.shape[-n:])))
    targets = prims.reshape(indices, grads.shape)
    zeros = prims.full((*lead, math.prod(input.shape[-n:])), 0.0, input.device, input.dtype)
    return prims.reshape(prims.scatter_add(zeros, targets, grads, len(lead)), tuple(input.shape))


def _max_pool_backward_meta(grad_output, input, kernel_size, stride, padding, dilation, ceil_mode, indices):
    # (``input``, whose values the result does not read, requires grad of it as in eager)
    return [(*like(input), flows(grad_output, input))]


@torchsymbol(
    _aten.max_pool2d_with_indices_backward.default,
    name="max_pool2d_with_indices_backward",
    meta=_max_pool_backward_meta,
)
def max_pool2d_with_indices_backward(grad_output, input, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_to_indices(grad_output, input, indices, 2)


@torchsymbol(
    _aten.max_pool3d_with_indices_backward.default,
    name="max_pool3d_with_indices_backward",
    meta=_max_pool_backward_meta,
)
def max_pool3d_with_indices_backward(grad_output, input, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_to_indices(grad_output, input, indices, 3)


def _max_pool_backward_grad(
    n: int, symbol, grad_output, input, kernel_size, stride, padding, dilation, ceil_mode, indices
):
    """Eager's: ``grad_output`` gets the cotangent gathered at the indices
    (``max_pool_double_backward``), ``input``, which the result depends on through its shape
    only, zeros (``zeros_like(self)``), so that the result requires grad as eager's does."""
    out = symbol(grad_output, input, kernel_size, stride, padding, dilation, ceil_mode, indices)
    return indexed_backward_grad(n, out, grad_output, input, indices)


def indexed_backward_grad(n: int, out, grad_output, input, indices):
    """The gradients of ``out``, a max pool's backward scattering ``grad_output`` to ``indices``
    over the last ``n`` dims (max and fractional max pools): ``grad_output`` gets the cotangent
    gathered at the indices, ``input`` zeros."""
    g = get_grad(out)
    if grad_output.requires_grad:
        lead = tuple(indices.shape[:-n])
        flat = ltorch.reshape(g, (*lead, math.prod(g.shape[-n:])))
        picked = ltorch.gather(flat, len(lead), ltorch.reshape(indices, (*lead, math.prod(indices.shape[-n:]))))
        put_grad(grad_output, ltorch.reshape(picked, tuple(indices.shape)))
    if input.requires_grad:
        put_grad(input, ltorch.zeros_like(input))
    return out


@register_grad(ltorch.max_pool2d_with_indices_backward)
def max_pool2d_with_indices_backward_grad(*args, **kwargs):
    return _max_pool_backward_grad(2, ltorch.max_pool2d_with_indices_backward, *args, **kwargs)


@register_grad(ltorch.max_pool3d_with_indices_backward)
def max_pool3d_with_indices_backward_grad(*args, **kwargs):
    return _max_pool_backward_grad(3, ltorch.max_pool3d_with_indices_backward, *args, **kwargs)


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


# -- grad rules ------------------------------------------------------------------------------------


_MAX_BACKWARD = {2: max_pool2d_with_indices_backward, 3: max_pool3d_with_indices_backward}
_AVG_BACKWARD = {2: avg_pool2d_backward, 3: avg_pool3d_backward}


def _as_2d(*tensors):
    return [ltorch.unsqueeze(t, -2) for t in tensors]


def _window_args(op: str, n: int, kernel_size, stride, padding, dilation):
    """Kernel, stride, padding and dilation as the aten backwards take them: n ints each (1-d
    pools as 2-d ones with a size-1 window along the inserted dim)."""
    kernel = spatial_tuple(op, kernel_size, n, "kernel_size")
    strides = (
        kernel
        if stride is None or (not is_int(stride) and len(stride) == 0)
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
