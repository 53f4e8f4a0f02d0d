"""Rearranging ops beyond ``shape.py``: rotations and flips, splits along fixed dims, stacking,
tiling and repetition, broadcasting several tensors, grids and products of tensors, and
pixel and channel shuffles.

Each is a composite of the shape symbols and prims. Ops whose eager result is a view of their
input (the splits, ``broadcast_tensors``, ``meshgrid``, ``atleast_3d``) link their outputs to it
(``views``), so that a write through one reaches the input; ops eager computes into a new
tensor return a fresh value even when they have nothing to do.
"""

import operator
import warnings

import torch
import torch.nn.functional as F

from thunder_rs import clang, prims
from thunder_rs.core.base import dtypes
from thunder_rs.core.lang import values
from thunder_rs.core.lang.fallback import fallback
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.recorder import start_prim_log, stop_prim_log
from thunder_rs.errors import (
    ThunderIndexError,
    ThunderNotImplementedError,
    ThunderRuntimeError,
    ThunderTypeError,
    check,
)
from thunder_rs.torch.common import is_int, require_tensors
from thunder_rs.torch.symbols import torchsymbol
from thunder_rs.torch.elementwise import mul
from thunder_rs.torch.padding import fresh
from thunder_rs.torch.reductions import sum as _sum
from thunder_rs.torch.joins import cat, chunk, hstack, repeat, split, tensor_split
from thunder_rs.torch.shape import _one_of, _sizes, flatten, flip, reshape_to, transpose
from thunder_rs.torch.views import PrimStep, attach, tracked, tracked_each, unsafe_pieces
from thunder_rs.core.lang.symint import same_shape

Tensor = torch.Tensor
__all__ = [
    "rot90",
    "fliplr",
    "flipud",
    "split_with_sizes",
    "unsafe_split",
    "unsafe_chunk",
    "hsplit",
    "vsplit",
    "dsplit",
    "atleast_3d",
    "column_stack",
    "dstack",
    "tile",
    "repeat_interleave",
    "sum_to_size",
    "broadcast_tensors",
    "meshgrid",
    "cartesian_prod",
    "block_diag",
    "kron",
    "pixel_shuffle",
    "pixel_unshuffle",
    "channel_shuffle",
]


def _permuted(a, perm):
    perm = tuple(perm)
    return a if perm == tuple(range(a.ndim)) else prims.transpose(a, perm)


# -- rotations and flips ---------------------------------------------------------------------------


@torchsymbol(torch.rot90, Tensor.rot90)
def rot90(input, k=1, dims=(0, 1)):
    op = "ltorch.rot90"
    dims = tuple(dims)
    check(
        len(dims) == 2,
        op,
        f"expected total rotation dims == 2, but got dims = {len(dims)} (argument dims)",
        ThunderRuntimeError,
    )
    check(
        input.ndim >= 2,
        op,
        f"expected total dims >= 2, but got total dims = {input.ndim} (argument input)",
        ThunderRuntimeError,
    )
    d0, d1 = (clang.canonicalize_dim(input.ndim, d, op, "dims") for d in dims)
    check(
        d0 != d1,
        op,
        f"expected rotation dims to be different, but got dim0 = {dims[0]} and dim1 = {dims[1]} (argument dims)",
        ThunderRuntimeError,
    )
    k %= 4
    if k == 1:
        out = transpose(flip(input, d1), d0, d1)
    elif k == 2:
        out = flip(input, d0, d1)
    elif k == 3:
        out = transpose(flip(input, d0), d0, d1)
    else:
        out = input
    return fresh(out, input)


@torchsymbol(torch.fliplr, Tensor.fliplr)
def fliplr(input):
    check(input.ndim >= 2, "ltorch.fliplr", "Input must be >= 2-d. (argument input)", ThunderRuntimeError)
    return fresh(flip(input, 1), input)


@torchsymbol(torch.flipud, Tensor.flipud)
def flipud(input):
    check(input.ndim >= 1, "ltorch.flipud", "Input must be >= 1-d. (argument input)", ThunderRuntimeError)
    return fresh(flip(input, 0), input)


# -- splitting -------------------------------------------------------------------------------------


@torchsymbol(torch.split_with_sizes, Tensor.split_with_sizes, sequence=True)
def split_with_sizes(input, split_sizes, dim=0):
    sizes = _sizes("ltorch.split_with_sizes", (split_sizes,), "split_sizes")
    return split(input, list(sizes), dim)


@torchsymbol(torch.unsafe_split, Tensor.unsafe_split, sequence=True)
def unsafe_split(input, split_size, dim=0):
    check(
        isinstance(split_size, int) and not isinstance(split_size, bool),
        "ltorch.unsafe_split",
        f"argument 'split_size' must be int, not {type(split_size).__name__} (argument split_size)",
        ThunderTypeError,
    )
    return split(input, split_size, dim)


@torchsymbol(torch.unsafe_chunk, Tensor.unsafe_chunk, sequence=True)
def unsafe_chunk(input, chunks, dim=0):
    return chunk(input, chunks, dim)


def _define_directional_split(name: str, min_ndim: int, dim_of):
    op = f"ltorch.{name}"

    @torchsymbol(getattr(torch, name), getattr(Tensor, name), name=name, sequence=True)
    def directional_split(input, indices_or_sections):
        check(
            input.ndim >= min_ndim,
            op,
            lambda: (
                f"torch.{name} requires a tensor with at least {min_ndim} dimension, but got a tensor with "
                f"{input.ndim} dimensions! (argument input)"
            ),
            ThunderRuntimeError,
        )
        d = dim_of(input)
        if is_int(indices_or_sections):
            n = indices_or_sections = operator.index(indices_or_sections)  # the number of outputs
            check(
                n != 0 and input.shape[d] % n == 0,
                op,
                lambda: (
                    f"torch.{name} attempted to split along dimension {d}, but the size of the dimension "
                    f"{input.shape[d]} is not divisible by the split_size {n}! (argument indices_or_sections)"
                ),
                ThunderRuntimeError,
            )
        return tensor_split(input, indices_or_sections, d)

    return directional_split


hsplit = _define_directional_split("hsplit", 1, lambda a: 1 if a.ndim > 1 else 0)
vsplit = _define_directional_split("vsplit", 2, lambda a: 0)
dsplit = _define_directional_split("dsplit", 3, lambda a: 2)


# -- joining ---------------------------------------------------------------------------------------


def _at_least_3d(a):
    check(
        isinstance(a, torch.Tensor), "ltorch.atleast_3d", f"expected a tensor, got {type(a).__name__}", ThunderTypeError
    )
    if a.ndim in (1, 2):  # (eager's unsqueezes, whose new dims have its strides)
        dims = (1,) if a.ndim == 1 else (0, 1)
        return prims.broadcast_in_dim(a, (1, *a.shape, 1) if a.ndim == 1 else (*a.shape, 1), dims)
    return reshape_to(a, (1, 1, 1)) if a.ndim == 0 else a


@torchsymbol(torch.atleast_3d, sequence=True)
def atleast_3d(*tensors):
    if len(tensors) == 1 and isinstance(tensors[0], (tuple, list)):
        return tuple(_at_least_3d(a) for a in tensors[0])
    if len(tensors) == 1:
        return _at_least_3d(tensors[0])
    return tuple(_at_least_3d(a) for a in tensors)


def _tensors(op: str, tensors, what: str):
    check(
        isinstance(tensors, (tuple, list)),
        op,
        f"expected a sequence of tensors, got {type(tensors).__name__} (argument tensors)",
        ThunderTypeError,
    )
    check(len(tensors) > 0, op, f"{what} expects a non-empty TensorList (argument tensors)", ThunderRuntimeError)
    return list(tensors)


@torchsymbol(torch.column_stack)
def column_stack(tensors, *, out=None):
    op = "ltorch.column_stack"
    check(out is None, op, "out= is not supported (argument out)", ThunderNotImplementedError)
    tensors = _tensors(op, tensors, "column_stack")
    return hstack([reshape_to(t, (t.numel(), 1)) if t.ndim <= 1 else t for t in tensors])


@torchsymbol(torch.dstack)
def dstack(tensors, *, out=None):
    op = "ltorch.dstack"
    check(out is None, op, "out= is not supported (argument out)", ThunderNotImplementedError)
    return cat([_at_least_3d(t) for t in _tensors(op, tensors, "dstack")], 2)


# -- tiling and repetition -------------------------------------------------------------------------


@torchsymbol(Tensor.tile, torch.tile)
def tile(input, *args, dims=None):
    dims = _one_of("ltorch.tile", args, dims, "dims")
    return repeat(input, (1,) * (input.ndim - len(dims)) + tuple(dims))


@torchsymbol(torch.repeat_interleave, Tensor.repeat_interleave)
def repeat_interleave(input, repeats=None, dim=None, *, output_size=None):
    op = "ltorch.repeat_interleave"
    check(
        is_int(repeats),
        op,
        lambda: (
            "repeats given as a tensor make the output's shape depend on their values, which a trace cannot; pass an "
            "int (argument repeats)"
        ),
        ThunderNotImplementedError,
    )
    check(repeats >= 0, op, "Repeats must be non-negative (argument repeats)", ThunderRuntimeError)
    check(
        dim is None or input.ndim > 0,
        op,
        f"Dimension out of range (expected to be in range of [-1, 0], but got {dim}) (argument dim)",
        ThunderIndexError,
    )
    a = flatten(input) if dim is None else input
    d = 0 if dim is None else clang.canonicalize_dim(a.ndim, dim, op)
    size = a.shape[d] * repeats
    check(
        output_size is None or output_size == size,
        op,
        f"repeat_interleave: Invalid output_size, expected {size} but got {output_size} (argument output_size)",
        ThunderRuntimeError,
    )
    shape = (*a.shape[: d + 1], repeats, *a.shape[d + 1 :])
    dims = tuple(i for i in range(len(shape)) if i != d + 1)
    out = reshape_to(prims.broadcast_in_dim(a, shape, dims), (*a.shape[:d], size, *a.shape[d + 1 :]))
    return fresh(out, input)


@torchsymbol(Tensor.sum_to_size)
def sum_to_size(a, *size):
    op = "ltorch.sum_to_size"
    size = _sizes(op, size, "size")
    lead = a.ndim - len(size)
    fits = lead >= 0 and all(s == n or s == 1 for s, n in zip(size, a.shape[lead:]))
    check(
        fits,
        op,
        f"size {{{list(size)}}} is not expandable to size {{{list(a.shape)}}}. (argument size)",
        ThunderRuntimeError,
    )
    if not size:  # (eager's ``sum_to`` takes ``tensor.sum()`` for an empty size: integers and bool to int64)
        return _sum(a)
    dims = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(size) if s == 1 and a.shape[lead + i] != 1)
    if not dims:
        return a
    return reshape_to(_sum(a, dims, True), size)


# -- several tensors at once -----------------------------------------------------------------------


def _broadcast_view(a, shape, dims):
    """``a`` broadcast to ``shape`` (``dims``: where its dims go); ``a`` itself when it has that shape."""
    if same_shape(a.shape, shape):
        return a
    return prims.broadcast_in_dim(a, tuple(shape), tuple(dims))


def _linked_views(symbol):
    """``symbol`` over several tensors, whose outputs are broadcasts of its inputs: each output is
    linked to the input it broadcasts, as eager's expanded view of it is."""

    def views_of(*args, **kwargs):
        log = []
        start_prim_log(log)
        try:
            out = symbol(*args, **kwargs)
        finally:
            stop_prim_log()
        reshaped: dict = {}  # id of a reshape's output -> (its input, the step)
        for name, prim_args, outs in log:
            source = prim_args[0]
            returned = any(o is outs[0] for o in out)
            if name == "reshape" and type(source) is TensorProxy:  # (``meshgrid``'s view of each tensor)
                reshaped[id(outs[0])] = (source, (PrimStep(name, tuple(prim_args[1:])),))
                if returned:  # (a grid of one element along each dim: the view is the output)
                    attach(source, outs[0], reshaped[id(outs[0])][1])
            if name == "broadcast_in_dim" and type(source) is TensorProxy and returned:
                root, steps = reshaped.get(id(source), (source, ()))
                attach(root, outs[0], (*steps, PrimStep(name, tuple(prim_args[1:]))))
        return out

    views_of.__wrapped__ = symbol
    return views_of


@torchsymbol(torch.broadcast_tensors, sequence=True)
def broadcast_tensors(*tensors):
    op = "ltorch.broadcast_tensors"
    require_tensors(op, tensors)
    shape = clang.broadcast_shapes(op, *(t.shape for t in tensors))
    return tuple(_broadcast_view(t, shape, range(len(shape) - t.ndim, len(shape))) for t in tensors)


def _grid_inputs(op: str, tensors):
    if len(tensors) == 1 and isinstance(tensors[0], (tuple, list)):
        tensors = tuple(tensors[0])
    check(len(tensors) > 0, op, "meshgrid expects a non-empty TensorList (argument tensors)", ThunderRuntimeError)
    require_tensors(op, tensors)
    for i, t in enumerate(tensors):
        check(
            t.ndim <= 1,
            op,
            f"torch.meshgrid: Expected 0D or 1D tensor in the tensor list but got a {t.ndim}D tensor "
            f"at position {i} (argument tensors)",
            ThunderRuntimeError,
        )
        check(
            t.dtype == tensors[0].dtype,
            op,
            "meshgrid expects all tensors to have the same dtype (argument tensors)",
            ThunderRuntimeError,
        )
        check(
            t.device == tensors[0].device,
            op,
            "meshgrid expects all tensors to have the same device (argument tensors)",
            ThunderRuntimeError,
        )
    return tensors


@torchsymbol(torch.meshgrid, sequence=True)
def meshgrid(*tensors, indexing=None):
    op = "ltorch.meshgrid"
    tensors = _grid_inputs(op, tensors)
    if indexing is None:
        warnings.warn(
            "torch.meshgrid: in an upcoming release, it will be required to pass the indexing argument.",
            UserWarning,
            stacklevel=2,
        )
        indexing = "ij"
    check(
        indexing in ("ij", "xy"),
        op,
        f'torch.meshgrid: indexing must be one of "xy" or "ij", but received: {indexing} (argument indexing)',
        ThunderRuntimeError,
    )
    place = list(range(len(tensors)))
    if indexing == "xy" and len(tensors) >= 2:
        place[0], place[1] = 1, 0
    shape = [0] * len(tensors)
    for t, p in zip(tensors, place):
        shape[p] = t.numel()
    # eager views each tensor as ``shape`` with its elements at its dim and 1 elsewhere, then
    # expands: dims of size 1 keep the view's strides, where a broadcast of the tensor made the
    # strides of all its new dims 0
    return tuple(
        _broadcast_view(_grid_view(t, len(shape), p), shape, tuple(range(len(shape)))) for t, p in zip(tensors, place)
    )


def _grid_view(t, rank: int, p: int):
    """``t.view(1, ..., -1 at p, ..., 1)``: ``t`` itself where it has that shape."""
    view_shape = tuple(t.numel() if d == p else 1 for d in range(rank))
    return t if same_shape(t.shape, view_shape) else prims.reshape(t, view_shape)


@torchsymbol(torch.cartesian_prod)
def cartesian_prod(*tensors):
    op = "ltorch.cartesian_prod"
    for t in tensors:
        check(
            isinstance(t, torch.Tensor) and t.ndim == 1,
            op,
            lambda: f"Expect a 1D vector, but got shape {list(getattr(t, 'shape', ()))} (argument tensors)",
            ThunderRuntimeError,
        )
    if len(tensors) == 1:
        return tensors[0]
    grids = meshgrid(*tensors, indexing="ij")
    return prims.cat([reshape_to(g, (g.numel(), 1)) for g in grids], 1)


@torchsymbol(torch.block_diag)
def block_diag(*tensors):
    op = "ltorch.block_diag"
    blocks = []
    require_tensors(op, tensors)
    for i, t in enumerate(tensors):
        check(
            t.ndim <= 2,
            op,
            f"torch.block_diag: Input tensors must have 2 or fewer dimensions. Input {i} has {t.ndim} "
            "dimensions (argument tensors)",
            ThunderRuntimeError,
        )
        blocks.append(reshape_to(t, {0: (1, 1), 1: (1, t.numel())}.get(t.ndim, tuple(t.shape))))
    if not blocks:
        return prims.full((1, 0), 0.0, torch.get_default_device(), torch.get_default_dtype())
    devices = {str(t.device) for t in blocks}
    check(
        len(devices) == 1,
        op,
        f"torch.block_diag: input tensors must all be on the same device, got {sorted(devices)} (argument tensors)",
        ThunderRuntimeError,
    )
    dtype = dtypes.result_type(*tensors)
    width = sum(b.shape[1] for b in blocks)
    rows, left = [], 0
    for b in blocks:
        config = ((0, 0, 0), (left, width - left - b.shape[1], 0))
        rows.append(prims.pad(clang.maybe_convert(b, dtype), clang.maybe_convert(0, dtype), config))
        left += b.shape[1]
    return prims.cat(rows, 0)


@torchsymbol(torch.kron, Tensor.kron)
def kron(input, other, *, out=None):
    op = "ltorch.kron"
    check(out is None, op, "out= is not supported (argument out)", ThunderNotImplementedError)
    ndim = max(input.ndim, other.ndim)
    a_shape = (1,) * (ndim - input.ndim) + tuple(input.shape)
    b_shape = (1,) * (ndim - other.ndim) + tuple(other.shape)
    a = reshape_to(input, tuple(x for s in a_shape for x in (s, 1)))
    b = reshape_to(other, tuple(x for s in b_shape for x in (1, s)))
    return reshape_to(mul(a, b), tuple(s * t for s, t in zip(a_shape, b_shape)))


# -- shuffles --------------------------------------------------------------------------------------


@torchsymbol(F.pixel_shuffle, torch.pixel_shuffle)
def pixel_shuffle(input, upscale_factor):
    op = "ltorch.pixel_shuffle"
    r = upscale_factor
    check(
        input.ndim >= 3,
        op,
        f"pixel_shuffle expects input to have at least 3 dimensions, but got input with "
        f"{input.ndim} dimension(s) (argument input)",
        ThunderRuntimeError,
    )
    check(
        r > 0,
        op,
        f"pixel_shuffle expects a positive upscale_factor, but got {r} (argument upscale_factor)",
        ThunderRuntimeError,
    )
    *batch, c, h, w = input.shape
    check(
        c % (r * r) == 0,
        op,
        lambda: (
            "pixel_shuffle expects its input's 'channel' dimension to be divisible by the square of upscale_factor, "
            f"but input.size(-3)={c} is not divisible by {r * r} (argument input)"
        ),
        ThunderRuntimeError,
    )
    n = len(batch)
    split_ = reshape_to(input, (*batch, c // (r * r), r, r, h, w))
    moved = _permuted(split_, (*range(n), n, n + 3, n + 1, n + 4, n + 2))
    return fresh(reshape_to(moved, (*batch, c // (r * r), h * r, w * r)), input)


@torchsymbol(F.pixel_unshuffle, torch.pixel_unshuffle)
def pixel_unshuffle(input, downscale_factor):
    op = "ltorch.pixel_unshuffle"
    r = downscale_factor
    check(
        input.ndim >= 3,
        op,
        f"pixel_unshuffle expects input to have at least 3 dimensions, but got input with "
        f"{input.ndim} dimension(s) (argument input)",
        ThunderRuntimeError,
    )
    check(
        r > 0,
        op,
        f"pixel_unshuffle expects a positive downscale_factor, but got {r} (argument downscale_factor)",
        ThunderRuntimeError,
    )
    *batch, c, h, w = input.shape
    for name, size, at in (("height", h, -2), ("width", w, -1)):
        check(
            size % r == 0,
            op,
            f"pixel_unshuffle expects {name} to be divisible by downscale_factor, but "
            f"input.size({at})={size} is not divisible by {r} (argument input)",
            ThunderRuntimeError,
        )
    n = len(batch)
    split_ = reshape_to(input, (*batch, c, h // r, r, w // r, r))
    moved = _permuted(split_, (*range(n), n, n + 2, n + 4, n + 1, n + 3))
    return fresh(reshape_to(moved, (*batch, c * r * r, h // r, w // r)), input)


# Eager's gradients: the inverse shuffle of the cotangent, laid out as its kernel lays it out
# (channels_last for a channels_last cotangent), where the decomposition's is contiguous.


@register_grad(pixel_shuffle)
def pixel_shuffle_grad(input, upscale_factor):
    out = pixel_shuffle(input, upscale_factor)
    put_grad(input, pixel_unshuffle(get_grad(out), upscale_factor), complex_values=True)  # (moved)
    return out


@register_grad(pixel_unshuffle)
def pixel_unshuffle_grad(input, downscale_factor):
    out = pixel_unshuffle(input, downscale_factor)
    put_grad(input, pixel_shuffle(get_grad(out), downscale_factor), complex_values=True)  # (moved)
    return out


@torchsymbol(torch.channel_shuffle, torch.native_channel_shuffle)
def channel_shuffle(input, groups):
    op = "ltorch.channel_shuffle"
    check(
        input.ndim > 2,
        op,
        f"channel_shuffle expects input with > 2 dims, but got input with sizes {list(input.shape)} (argument input)",
        ThunderRuntimeError,
    )
    check(
        groups > 0,
        op,
        f"Number of groups to divide channels in must be positive. Value of groups:{groups} (argument groups)",
        ThunderRuntimeError,
    )
    n, c, *rest = input.shape
    check(
        c % groups == 0,
        op,
        f"Number of channels must be divisible by groups. Got {c} channels and {groups} groups. (argument groups)",
        ThunderRuntimeError,
    )
    split_ = reshape_to(input, (n, groups, c // groups, *rest))
    moved = _permuted(split_, (0, 2, 1, *range(3, split_.ndim)))
    return fresh(reshape_to(moved, tuple(input.shape)), input)


def _register_views() -> None:
    """The splits and ``atleast_3d`` return views of their input; ``broadcast_tensors`` and
    ``meshgrid`` views of each of theirs."""
    for symbol in (split_with_sizes, hsplit, vsplit, dsplit, sum_to_size):
        for fn in symbol.torch_fns:  # (``x.sum_to_size(x.shape)`` is ``x``)
            TORCH_TO_LTORCH[fn] = tracked(symbol, returns_self=symbol is sum_to_size)
    for symbol in (unsafe_split, unsafe_chunk):  # (no views to autograd: pieces sharing memory apart)
        for fn in symbol.torch_fns:
            TORCH_TO_LTORCH[fn] = unsafe_pieces(symbol)
    for fn in atleast_3d.torch_fns:
        TORCH_TO_LTORCH[fn] = tracked_each(atleast_3d)  # (of each of several tensors)
    for symbol in (broadcast_tensors, meshgrid):
        for fn in symbol.torch_fns:
            TORCH_TO_LTORCH[fn] = _linked_views(symbol)


_register_views()


def _repeats_by_values(symbol):
    """``repeat_interleave`` with tensor repeats (or of a tensor of repeats alone): its output's
    size is the repeats' sum, which only their values tell. Where the jit reads values
    (``core.values``) it is an eager fallback sized by them, recorded before the symbol opens (a
    check inside a symbol an executor runs whole would not run)."""

    def call(input, repeats=None, dim=None, *, output_size=None):
        if values.active() is not None and (repeats is None or isinstance(repeats, torch.Tensor)):
            if repeats is None:  # the repeats alone: each index as often as it says
                return fallback(torch.repeat_interleave, (input,), {"output_size": output_size})
            if torch.is_grad_enabled() and input.requires_grad and _indexable(input, repeats, dim):
                return _by_index(input, repeats, dim, output_size)
            return fallback(torch.repeat_interleave, (input, repeats), {"dim": dim, "output_size": output_size})
        return symbol(input, repeats, dim, output_size=output_size)

    return call


def _indexable(input, repeats, dim) -> bool:
    """Whether eager's ``repeat_interleave`` of ``input`` takes these tensor ``repeats``: one per
    element along ``dim`` (of the flattened input without one), or one for all."""
    if dim is not None and not -input.ndim <= dim < input.ndim:
        return False
    if repeats.ndim == 0 or (repeats.ndim == 1 and repeats.shape[0] == 1):
        return True
    return repeats.ndim == 1 and repeats.shape[0] == (input.numel() if dim is None else input.shape[dim])


def _by_index(input, repeats, dim, output_size):
    """``repeat_interleave`` with tensor repeats as eager computes it (``Repeat.cpp``): ``input``
    (flattened without a ``dim``) indexed along ``dim`` by the repeats' own ``repeat_interleave``.
    Only that index is sized by the repeats' values, a call without gradient, so the output's
    length stays symbolic where the input requires grad (a fallback sized by values has no
    backward), and the gradient is ``index_select``'s, as eager's is."""
    if dim is None:
        input, dim = flatten(input), 0
    if repeats.ndim == 0 or repeats.shape[0] == 1:
        repeats = clang.expand_to(reshape_to(repeats, (1,)), (input.shape[dim],))
    index = fallback(torch.repeat_interleave, (repeats,), {"output_size": output_size})
    return torch.index_select(input, dim, index)


for _fn in repeat_interleave.torch_fns:
    TORCH_TO_LTORCH[_fn] = _repeats_by_values(repeat_interleave)
