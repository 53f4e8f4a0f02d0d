"""Diagonals, triangles and strided windows: diag, diag_embed, diagflat, trace, tril_indices,
triu_indices, ``Tensor.unfold`` and ``as_strided``.

A vector is placed on a diagonal by one pad prim: ``m`` elements with ``m`` zeros between each
two of them are the ``m * m`` elements of a matrix whose diagonal they are. ``unfold`` and
``as_strided`` read input elements at positions known while tracing, computed from iotas, so
their gradients sum what the windows share, as eager's do.
"""

import math

import torch

from thunder_rs import clang, prims
from thunder_rs.core.lang.devices import indexed
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH, user_location
from thunder_rs.core.lang.fallback import fallback
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, check
from thunder_rs.core.lang.symint import SymInt
from thunder_rs.torch.symbols import read_numbers, torchsymbol
from thunder_rs.torch.padding import fresh
from thunder_rs.torch.reductions import sum as _sum
from thunder_rs.torch.shape import _sizes, flatten, reshape, reshape_to, slice_in_dim
from thunder_rs.torch.strides import FALLBACK_LAYOUTS, contiguous_strides, strides_of
from thunder_rs.torch.view_scatters import diagonal
from thunder_rs.torch.views import PrimStep, opaque

Tensor = torch.Tensor
__all__ = ["diag", "diag_embed", "diagflat", "trace", "tril_indices", "triu_indices", "unfold", "as_strided"]


def _embed(v, offset: int, dims: tuple[int, int] | None = None):
    """A tensor with ``v`` (shape (..., m)) on the ``offset`` diagonal of its ``dims`` (default
    the last two), n = m + |offset| long each, zeros elsewhere; its other dims are ``v``'s
    batch dims in order."""
    ndim = v.ndim + 1
    d1, d2 = (ndim - 2, ndim - 1) if dims is None else dims
    *batch, m = v.shape
    zero = clang.maybe_convert(0, v.dtype)
    if type(m) is SymInt:
        square = _on_diagonal(v, zero, d1, d2)
    else:
        spread = prims.pad(v, zero, (*((0, 0, 0),) * len(batch), (0, 0, m))) if m > 1 else v
        square = reshape_to(spread, (*batch, m, m))
        # square's batch dims fill the output's other dims in order; its last two go to d1 and d2.
        rest = iter(range(ndim - 2))
        perm = tuple(ndim - 2 if d == d1 else ndim - 1 if d == d2 else next(rest) for d in range(ndim))
        square = square if perm == tuple(range(ndim)) else prims.transpose(square, perm)
    k = abs(offset)
    if k == 0:
        return square
    config = [(0, 0, 0)] * ndim
    config[d1], config[d2] = ((0, k, 0), (k, 0, 0)) if offset > 0 else ((k, 0, 0), (0, k, 0))
    return prims.pad(square, zero, tuple(config))


def _on_diagonal(v, zero, d1: int, d2: int):
    """``v`` (shape (..., m), ``m`` symbolic: a pad's dilation is a number) on the diagonal of
    dims ``d1`` and ``d2`` of a new tensor, made in that order (a fresh row-major tensor, as
    eager's): ``v`` where row and column agree, zero elsewhere."""
    *batch, m = v.shape
    ndim = v.ndim + 1
    others = [d for d in range(ndim) if d not in (d1, d2)]
    shape = [m] * ndim
    for d, size in zip(others, batch):
        shape[d] = size
    rows = prims.broadcast_in_dim(prims.iota(m, 0, 1, v.device, torch.int64), tuple(shape), (d1,))
    cols = prims.broadcast_in_dim(prims.iota(m, 0, 1, v.device, torch.int64), tuple(shape), (d2,))
    # v's dims where they go (its batch dims to the others, its last to d1), in increasing order
    targets = (*others, d1)
    order = sorted(range(v.ndim), key=targets.__getitem__)
    ordered = v if order == list(range(v.ndim)) else prims.transpose(v, tuple(order))
    spread = prims.broadcast_in_dim(ordered, tuple(shape), tuple(sorted(targets)))
    return prims.where(prims.eq(rows, cols), spread, zero)


@torchsymbol(torch.diag_embed, Tensor.diag_embed)
def diag_embed(input, offset=0, dim1=-2, dim2=-1):
    op = "ltorch.diag_embed"
    ndim = input.ndim + 1
    d1 = clang.canonicalize_dim(ndim, dim1, op, "dim1")
    d2 = clang.canonicalize_dim(ndim, dim2, op, "dim2")
    check(d1 != d2, op, f"diagonal dimensions cannot be identical {dim1}, {dim2} (argument dim2)", ThunderRuntimeError)
    return _embed(reshape_to(input, (1,)) if input.ndim == 0 else input, offset, (d1, d2))


@torchsymbol(torch.diag, Tensor.diag)
def diag(input, diagonal=0, *, out=None):
    op = "ltorch.diag"
    check(out is None, op, "out= is not supported (argument out)", ThunderNotImplementedError)
    check(
        input.ndim in (1, 2),
        op,
        f"diag(): Supports 1D or 2D tensors. Got {input.ndim}D (argument input)",
        ThunderRuntimeError,
    )
    if input.ndim == 1:
        return _embed(input, diagonal)
    return fresh(_diagonal(input, diagonal), input)


def _diagonal(input, offset):
    # The symbol itself, not the view op langctx maps torch.diagonal to: these ops copy.
    return diagonal(input, offset, 0, 1)


@torchsymbol(torch.diagflat, Tensor.diagflat)
def diagflat(input, offset=0):
    return _embed(flatten(input), offset)


# Eager's gradients of the embeddings are diagonals of the cotangent, views of it (its strides);
# differentiating the decompositions gave new tensors. A diagonal's step is an int, which a
# symbolic size or offset would specialise: those keep the decomposition's VJP.


def _known(input, offset) -> bool:
    return type(offset) is not SymInt and all(type(n) is int for n in input.shape)


@register_grad(diag_embed)
def diag_embed_grad(input, offset=0, dim1=-2, dim2=-1):
    out = diag_embed(input, offset, dim1, dim2)
    if input.ndim == 0 or not _known(input, offset):
        return out  # the decomposition's VJP
    put_grad(input, diagonal(get_grad(out), offset, dim1, dim2), complex_values=True)
    return out


@register_grad(diagflat)
def diagflat_grad(input, offset=0):
    """``input.contiguous().view(-1).diag(offset)``'s: the diagonal viewed as the input's sizes."""
    out = diagflat(input, offset)
    if not _known(input, offset):
        return out  # the decomposition's VJP
    put_grad(input, reshape(diagonal(get_grad(out), offset, 0, 1), tuple(input.shape)), complex_values=True)
    return out


@torchsymbol(torch.trace, Tensor.trace)
def trace(input):
    op = "ltorch.trace"
    check(
        input.ndim == 2,
        op,
        f"trace: expected a matrix, but got tensor with dim {input.ndim} (argument input)",
        ThunderRuntimeError,
    )
    check(
        input.dtype != torch.bool,
        op,
        "\"trace\" not implemented for 'Bool' (argument input)",
        ThunderNotImplementedError,
    )
    return _sum(_diagonal(input, 0))


# -- triangles -------------------------------------------------------------------------------------


def known_ints(values, device, dtype):
    """A 1-D tensor of the known ``values``: one iota per arithmetic run of them."""
    runs, i = [], 0
    while i < len(values):
        j = i + 1
        step = values[j] - values[i] if j < len(values) else 1
        while j < len(values) and values[j] - values[j - 1] == step:
            j += 1
        length = j - i
        if step == 0 and length > 1:
            runs.append(prims.full((length,), values[i], device, torch.int64))
        else:
            runs.append(prims.iota(length, values[i], step if length > 1 else 1, device, torch.int64))
        i = j
    flat = prims.full((0,), 0, device, torch.int64) if not runs else runs[0] if len(runs) == 1 else prims.cat(runs, 0)
    return clang.maybe_convert(flat, dtype)


def _triangle_indices(op: str, row, col, offset, dtype, device, layout, lower: bool):
    check(row >= 0, op, f"row must be non-negative, got{row} (argument row)", ThunderRuntimeError)
    check(col >= 0, op, f"col must be non-negative, got{col} (argument col)", ThunderRuntimeError)
    check(
        layout in (None, torch.strided),
        op,
        f"layout {layout} is not supported (argument layout)",
        ThunderNotImplementedError,
    )
    dtype = torch.int64 if dtype is None else dtype
    check(
        dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8),
        op,
        lambda: (
            f"\"{op.removeprefix('ltorch.')}\" not implemented for '{str(dtype).removeprefix('torch.').capitalize()}' "
            "(argument dtype)"
        ),
        ThunderNotImplementedError,
    )
    device = torch.get_default_device() if device is None else indexed(torch.device(device))
    if any(type(v) is SymInt for v in (row, col, offset)):
        return clang.maybe_convert(_symbolic_triangle(row, col, offset, device, lower), dtype)
    rows: list[int] = []
    cols: list[int] = []
    for r in range(row):
        lo, hi = (0, min(col, max(r + offset + 1, 0))) if lower else (min(col, max(r + offset, 0)), col)
        rows += [r] * (hi - lo)
        cols += range(lo, hi)
    return reshape_to(known_ints(rows + cols, device, dtype), (2, len(rows)))


def _clamped(x, low, high):
    return prims.minimum(prims.maximum(x, low), high)


def _clamped_sum(row, col, o):
    """``sum(clamp(r + o, 0, col) for r in range(row))`` for sizes that may be symbolic: rows
    ``[0, z)`` count 0, rows ``[z, f)`` count ``r + o``, rows ``[f, row)`` count ``col``."""
    z = min(max(1 - o, 0), row)
    f = max(z, min(col - o, row))
    return (f - z) * (2 * o + z + f - 1) // 2 + (row - f) * col


def _symbolic_triangle(row, col, offset, device, lower: bool):
    """``tril_indices``/``triu_indices`` (int64) where a size is symbolic: each row's columns
    ``[lo, hi)``, and for each of the ``n`` indices its row (how many rows start at or before
    it, less one: a cumulative count of the rows' starts) and its column (its distance from its
    row's start past ``lo``)."""
    r = prims.iota(row, 0, 1, device, torch.int64)
    zeros = prims.full((row,), 0, device, torch.int64)
    if lower:
        lo, hi = zeros, _clamped(prims.add(r, offset + 1), 0, col)
        n = _clamped_sum(row, col, offset + 1)
    else:  # (a full prim's value is a number: ``col`` is added, read on each call)
        lo, hi = _clamped(prims.add(r, offset), 0, col), prims.add(zeros, col)
        n = row * col - _clamped_sum(row, col, offset)
    counts = prims.sub(hi, lo)
    starts = prims.sub(prims.cumsum(counts, 0), counts)
    # (a start at n is an empty last row's: counted past the indices)
    at = prims.minimum(starts, n)
    ones = prims.full((row,), 1, device, torch.int64)
    marks = prims.scatter_add(prims.full((n + 1,), 0, device, torch.int64), at, ones, 0)
    rows = prims.sub(slice_in_dim(prims.cumsum(marks, 0), 0, 0, n), 1)
    index = prims.iota(n, 0, 1, device, torch.int64)
    cols = prims.add(prims.sub(index, prims.take(starts, rows, 0)), prims.take(lo, rows, 0))
    return reshape_to(prims.cat([rows, cols], 0), (2, n))


@torchsymbol(torch.tril_indices)
def tril_indices(row, col, offset=0, *, dtype=None, device=None, layout=None, pin_memory=False):
    return _triangle_indices("ltorch.tril_indices", row, col, offset, dtype, device, layout, lower=True)


@torchsymbol(torch.triu_indices)
def triu_indices(row, col, offset=0, *, dtype=None, device=None, layout=None, pin_memory=False):
    return _triangle_indices("ltorch.triu_indices", row, col, offset, dtype, device, layout, lower=False)


# -- strided windows -------------------------------------------------------------------------------


def _positions(shape, strides, offset: int, device):
    """The flat positions ``offset + sum(i_k * strides[k])`` of every index of ``shape``, as an int64 tensor."""
    total = prims.full(tuple(shape), offset, device, torch.int64)
    for d, (size, stride) in enumerate(zip(shape, strides)):
        if size > 1 and stride != 0:
            # A symbolic stride (a window over a changing length) multiplies the positions: iota's
            # step is an int.
            symbolic = type(stride) is SymInt
            along = prims.iota(size, 0, 1 if symbolic else stride, device, torch.int64)
            along = prims.mul(along, stride) if symbolic else along
            total = prims.add(total, prims.broadcast_in_dim(along, tuple(shape), (d,)))
    return total


def _gathered(a, positions):
    """The elements of ``a`` (read in row-major order) at ``positions``, shaped as them."""
    flat = reshape_to(a, (a.numel(),))
    return reshape_to(prims.take(flat, reshape_to(positions, (positions.numel(),)), 0), tuple(positions.shape))


@torchsymbol(Tensor.unfold)
def unfold(a, dimension, size, step):
    op = "ltorch.unfold"
    d = clang.canonicalize_dim(a.ndim, dimension, op, "dimension")
    length = a.shape[d] if a.ndim else 1
    check(
        size <= length,
        op,
        f"maximum size for tensor at dimension {d} is {length} but size is {size} (argument size)",
        ThunderRuntimeError,
    )
    check(size >= 0, op, f"size is {size} but must be >= 0 (argument size)", ThunderRuntimeError)
    check(step > 0, op, f"step is {step} but must be > 0 (argument step)", ThunderRuntimeError)
    if a.ndim == 0:
        return slice_in_dim(reshape_to(a, (1,)), 0, 0, size)
    windows = (length - size) // step + 1
    shape = (*a.shape[:d], windows, *a.shape[d + 1 :], size)
    return _gathered(a, _positions(shape, _unfold_strides(a.shape, d, step), 0, a.device))


def _unfold_strides(sizes, d: int, step):
    """The strides of ``unfold``'s windows over dim ``d`` of a contiguous tensor of ``sizes``."""
    strides = list(contiguous_strides(sizes))
    return (*strides[:d], strides[d] * step, *strides[d + 1 :], strides[d])


def _unfold_backward_meta(grad, input_sizes, dimension, size, step):
    return [(tuple(input_sizes), grad.dtype)]


@torchsymbol(torch.ops.aten.unfold_backward.default, name="unfold_backward", meta=_unfold_backward_meta)
def unfold_backward(grad, input_sizes, dimension, size, step):
    """``unfold``'s gradient: each window's cotangent added at the elements of the input it
    took, a new contiguous tensor of ``input_sizes``."""
    input_sizes = tuple(input_sizes)
    d = dimension % len(input_sizes)
    positions = _positions(tuple(grad.shape), _unfold_strides(input_sizes, d, step), 0, grad.device)
    zeros = prims.full((math.prod(input_sizes),), 0.0, grad.device, grad.dtype)
    flat = prims.index_add(zeros, reshape_to(positions, (grad.numel(),)), reshape_to(grad, (grad.numel(),)), 0)
    return reshape_to(flat, input_sizes)


@register_grad(unfold)
def unfold_grad(a, dimension, size, step):
    """Eager's: the output a view of the input (its strides), the gradient ``unfold_backward``'s.
    A 0-dim input or symbolic sizes keep the decomposition's VJP."""
    out = unfold(a, dimension, size, step)
    if a.ndim == 0 or not all(type(n) is int for n in a.shape):
        return out
    put_grad(a, unfold_backward(get_grad(out), tuple(a.shape), dimension, size, step))
    return out


def _needed(size, stride, offset: int) -> int:
    """How many elements from the start of memory a strided layout reads."""
    return 0 if 0 in size else offset + 1 + sum((n - 1) * s for n, s in zip(size, stride))


def _as_strided_positions(op: str, a, size, stride, storage_offset):
    size = _sizes(op, (size,), "size")
    stride = _sizes(op, (stride,), "stride")
    check(
        len(size) == len(stride), op, "mismatch in length of strides and shape (argument stride)", ThunderRuntimeError
    )
    check(
        all(s >= 0 for s in stride),
        op,
        f"as_strided: Negative strides are not supported at the moment, got strides: {list(stride)} (argument stride)",
        ThunderRuntimeError,
    )
    offset = storage_offset or 0
    check(offset >= 0, op, f"Tensor: invalid storage offset {offset} (argument storage_offset)", ThunderRuntimeError)
    needed = _needed(size, stride, offset)
    check(
        needed <= a.numel(),
        op,
        lambda: (
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset}, and itemsize "
            f"{a.element_size()} requiring a storage size of {needed * a.element_size()} are out of bounds for storage "
            f"of size {a.numel() * a.element_size()} (argument size)"
        ),
        ThunderRuntimeError,
    )
    return _positions(size, stride, offset, a.device)


@torchsymbol(torch.as_strided, Tensor.as_strided)
def as_strided(input, size, stride, storage_offset=None):
    """The elements of ``input``'s memory at ``storage_offset + sum(i_k * stride[k])``, its
    memory being its elements in row-major order (``_as_strided_view`` says when it is)."""
    return _gathered(input, _as_strided_positions("ltorch.as_strided", input, size, stride, storage_offset))


@register_grad(as_strided)
def as_strided_grad(input, size, stride, storage_offset=None):
    """Eager's: the output a view of the input (the strides it asks for), the gradient
    ``as_strided_backward``'s (``_as_strided_backward``)."""
    out = as_strided(input, size, stride, storage_offset)
    size, stride = (_sizes("ltorch.as_strided", (v,), "size") for v in (size, stride))
    put_grad(input, _as_strided_backward(get_grad(out), tuple(input.shape), size, stride, storage_offset or 0))
    return out


def _as_strided_backward(grad, input_shape, size, stride, offset: int):
    """``as_strided``'s gradient as eager's ``as_strided_backward`` computes it for an input that
    is its own row-major memory: dims of size 1 dropped, those of stride 0 summed (the last
    first), then the cotangent scattered into zeros at the positions it was read from, added
    where they may repeat (``_may_overlap``), a new contiguous tensor of ``input_shape``."""
    zeros = prims.full((math.prod(input_shape),), 0.0, grad.device, grad.dtype)
    if 0 in size:
        return reshape_to(zeros, input_shape)
    kept: list[int] = []
    for d in reversed(range(len(size))):
        if size[d] == 1:
            grad = reshape_to(grad, (*grad.shape[:d], *grad.shape[d + 1 :]))
        elif stride[d] == 0:
            grad = _sum(grad, d)
        else:
            kept.insert(0, d)
    sizes, strides = tuple(size[d] for d in kept), tuple(stride[d] for d in kept)
    flat = (grad.numel(),)
    positions = reshape_to(_positions(sizes, strides, offset, grad.device), flat)
    place = prims.index_add if _may_overlap(sizes, strides) else prims.scatter
    return reshape_to(place(zeros, positions, reshape_to(grad, flat), 0), input_shape)


def _may_overlap(sizes, strides) -> bool:
    """Whether a layout may read an element twice, as eager decides it (its
    ``_maybe_overlapping_memory``): by increasing stride, each must pass what the smaller span."""
    span = 0
    for d in sorted(range(len(sizes)), key=lambda d: strides[d]):
        if strides[d] <= span:
            return True
        span += strides[d] * (sizes[d] - 1)
    return False


def reads_own_memory(a, size, stride, storage_offset) -> bool:
    """Whether eager's ``as_strided`` of ``a`` reads ``a``'s own elements in row-major order:
    ``a`` is contiguous and no view, and the offset counts from its first element (None), or
    ``a`` is computed in the program (its memory is its own, from offset 0). Of an input, it
    must also read no element past ``a``'s last (which eager reads where ``a`` views more)."""
    if a._view is not None or tuple(strides_of(a)) != contiguous_strides(a.shape):
        return False
    if getattr(a, "_input_vid", None) is None:
        return True
    try:
        return storage_offset is None and _needed(tuple(size), tuple(stride), 0) <= a.numel()
    except TypeError:
        return True  # malformed arguments: the symbol raises eager's error


#: The shape prims whose views start at their root's first element: their storage offset is 0.
_AT_ROOT_START = frozenset({"reshape", "squeeze", "transpose", "broadcast_in_dim"})


def memory_root(a):
    """Whose memory ``as_strided`` of ``a`` reads as ``a``'s storage: of a view that starts at its
    root's first element (Longformer's chunks, ``as_strided`` of a transposed ``view``), the root,
    since ``as_strided`` reads the storage and ignores the strides; else ``a``."""
    link = a._view
    if link is None or link.root._view is not None:
        return a
    at_start = all(type(step) is PrimStep and step.name in _AT_ROOT_START for step in link.steps)
    return link.root if at_start else a


def _as_strided_view(native, eager):
    """``as_strided``: reads known positions where ``reads_own_memory``; of an input tensor
    otherwise an eager fallback, which runs on that very tensor and its memory; else refused:
    a tensor computed in the program may have another layout at run time than in eager. Each is
    a pair: the view of an argument as the caller passed it (unwritten), which a training call
    returns as eager's view, taken of the caller's tensor after it; the view of anything else."""

    def as_strided_view(input, size, stride, storage_offset=None):
        (size, stride, storage_offset), _ = read_numbers((size, stride, storage_offset), {}, 0)
        source = memory_root(input)
        if reads_own_memory(source, size, stride, storage_offset):
            return native[_unwritten(source)](source, size, stride, storage_offset)
        check(
            input._view is None and getattr(input, "_input_vid", None) is not None,
            "ltorch.as_strided",
            lambda: (
                "as_strided of a view, or of a non-contiguous tensor computed in the program, reads memory whose "
                "layout thunder_rs does not reproduce; clone() it first (argument input)"
            ),
            ThunderNotImplementedError,
        )
        return eager[_unwritten(input)](input, size, stride, storage_offset)

    return as_strided_view


def _unwritten(a) -> bool:
    """Whether ``a`` is a trace input the program has not written (``_input_vid``)."""
    return a._input_vid is not None and a._input_vid == a._vid


def _eager_as_strided(input, size, stride, storage_offset=None):
    return fallback(torch.as_strided, (input, size, stride, storage_offset), {})


def _register() -> None:
    """``unfold`` and ``as_strided`` return views eager can write through; writing through these
    (windows that may share elements) is refused."""
    refusal = "{}: writing through its output, a view, is not supported; clone() it first"
    unfold_view = opaque(
        unfold, None, FALLBACK_LAYOUTS[Tensor.unfold], refusal=refusal.format("Tensor.unfold"), eager=Tensor.unfold
    )
    TORCH_TO_LTORCH[Tensor.unfold] = unfold_view
    layout, refused = FALLBACK_LAYOUTS[torch.as_strided], refusal.format("torch.as_strided")

    def unwritable(parent, new, *args, **kwargs):
        # (a view eager's op takes again is otherwise written by eager's ops on a copy, which
        # adds once where eager's in-place op, over overlapping windows, adds twice)
        raise ThunderNotImplementedError(f"{refused} (at {user_location()})")

    native, eager = (
        (
            opaque(fn, None, layout, refusal=refused),
            opaque(fn, unwritable, layout, refusal=refused, eager=torch.as_strided),
        )
        for fn in (as_strided, _eager_as_strided)
    )
    for fn in as_strided.torch_fns:
        TORCH_TO_LTORCH[fn] = _as_strided_view(native, eager)


_register()
