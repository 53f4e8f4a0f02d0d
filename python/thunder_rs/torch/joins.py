"""Shape ops that join tensors or split, narrow and pad one along a dim: cat, stack, repeat,
split, chunk, tensor_split, narrow and constant pad; and the splits' grad rules (one cat of the
pieces' gradients).

Each is a composite of the cat, slice, broadcast_in_dim and pad prims; see ``shape.py`` for the
conventions the shape ops share.
"""

import math
import operator

import torch

from thunder_rs import clang, prims
from thunder_rs.core.base import dtypes
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.fallback import fallback
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.errors import (
    ThunderIndexError,
    ThunderNotImplementedError,
    ThunderRuntimeError,
    ThunderTypeError,
    ThunderValueError,
    check,
)
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.torch.autograd import also_zero_gradient
from thunder_rs.torch.common import SCALAR_NAMES, is_int, pieces, read_ints, require_tensors, size_value, slice_indices
from thunder_rs.torch.indexing import put_slice_gradient
from thunder_rs.torch.symbols import ltorch, read_numbers, torchsymbol
from thunder_rs.torch.shape import _atleast, _one_of, _sizes, reshape_to, slice_in_dim, unsqueeze
from thunder_rs.core.lang.symint import SymInt, identical, same_shape
from thunder_rs.core.base.userframe import user_location

Tensor = torch.Tensor
__all__ = [
    "cat",
    "chunk_cat",
    "concatenate",
    "stack",
    "hstack",
    "vstack",
    "repeat",
    "split",
    "chunk",
    "tensor_split",
    "narrow",
    "pad",
]


# -- joining --------------------------------------------------------------------------------------


def _tensor_list(op: str, tensors, empty_exc=ThunderRuntimeError, empty_msg="expected a non-empty list of Tensors"):
    check(
        isinstance(tensors, (tuple, list)),
        op,
        lambda: f"expected a tuple or list of tensors, got {type(tensors).__name__} (argument tensors)",
        ThunderTypeError,
    )
    check(len(tensors) > 0, op, f"{empty_msg} (argument tensors)", empty_exc)
    require_tensors(op, tensors)
    return list(tensors)


def _cat(op: str, tensors, dim):
    tensors = _tensor_list(op, tensors, ThunderValueError, "torch.cat(): expected a non-empty list of Tensors")
    for i, x in enumerate(tensors):
        check(
            x.ndim > 0,
            op,
            f"zero-dimensional tensor (at position {i}) cannot be concatenated (argument tensors)",
            ThunderRuntimeError,
        )
    dtype = dtypes.result_type(*tensors)
    # torch still skips legacy empty tensors of shape (0,) whatever the other tensors' rank.
    kept = [(i, x) for i, x in enumerate(tensors) if not same_shape(x.shape, (0,))] or [(0, tensors[0])]
    first = kept[0][1]
    d = clang.canonicalize_dim(first.ndim, dim, op)
    for i, x in kept:
        check(
            x.ndim == first.ndim,
            op,
            f"Tensors must have same number of dimensions: got {first.ndim} and {x.ndim} (argument tensors)",
            ThunderRuntimeError,
        )
        bad = next((k for k in range(x.ndim) if k != d and x.shape[k] != first.shape[k]), None)
        check(
            bad is None,
            op,
            lambda: (
                f"Sizes of tensors must match except in dimension {d}. Expected size {first.shape[bad]} but got size "
                f"{x.shape[bad]} for tensor number {i} in the list. (argument tensors)"
            ),
            ThunderRuntimeError,
        )
    kept_tensors = [x for _, x in kept]
    devices = {str(x.device) for x in kept_tensors}
    check(
        len(devices) == 1,
        op,
        f"Expected all tensors to be on the same device, but found {sorted(devices)} (argument tensors)",
        ThunderRuntimeError,
    )
    out = prims.cat([clang.maybe_convert(x, dtype) for x in kept_tensors], d)
    # eager's cat_tensors_backward gives a skipped legacy empty operand an empty gradient (zeros((0,)))
    skipped = [x for x in tensors if not any(x is k for k in kept_tensors)]
    return also_zero_gradient(out, *skipped) if skipped else out


@torchsymbol(torch.cat, torch.concat)
def cat(tensors, dim=0, *, out=None):
    check(out is None, "ltorch.cat", "out= is not supported (argument out)", ThunderNotImplementedError)
    return _cat("ltorch.cat", tensors, dim)


@torchsymbol(torch._chunk_cat, name="chunk_cat")
def chunk_cat(tensors, dim, num_chunks, *, out=None):
    """Each tensor zero-padded along ``dim`` to a multiple of ``num_chunks``, split into
    ``num_chunks`` chunks there, each chunk's trailing dims flattened, and the tensors' chunks
    joined chunk by chunk: ``cat`` along ``dim + 1`` (FSDP's gradient reduce-scatter input)."""
    op = "ltorch.chunk_cat"
    check(out is None, op, "out= is not supported (argument out)", ThunderNotImplementedError)
    tensors = _tensor_list(op, tensors, empty_msg="_chunk_cat expects a non-empty input tensor list")
    dim = _chunk_cat_dim(op, tensors, dim, num_chunks)
    # Eager has no derivative for it (its backward raises): refused rather than differentiated.
    check(
        not (torch.is_grad_enabled() and any(x.requires_grad for x in tensors)),
        op,
        "the derivative of _chunk_cat is not implemented (in torch either); detach the inputs (argument tensors)",
        ThunderNotImplementedError,
    )
    padded = []
    for x in tensors:
        size = x.shape[dim]
        extra = -size % num_chunks
        if extra:
            x = ltorch.constant_pad_nd(x, [0, 0] * (x.ndim - dim - 1) + [0, extra], 0)
        padded.append(reshape_to(x, (*x.shape[:dim], num_chunks, math.prod(x.shape[dim:]) // num_chunks)))
    return _cat(op, padded, dim + 1)


def _chunk_cat_dim(op: str, tensors, dim: int, num_chunks: int) -> int:
    """``dim`` as a non-negative dim of every tensor, with ``_chunk_cat``'s checks, eager's words."""
    check(num_chunks >= 1, op, "_chunk_cat expects positive num_chunks (argument num_chunks)", ThunderRuntimeError)
    first = tensors[0]
    for x in tensors:
        check(x.numel() > 0, op, "_chunk_cat expects non-empty tensor (argument tensors)", ThunderRuntimeError)
        check(
            x.dtype == first.dtype,
            op,
            "_chunk_cat expects all input tensors with the same dtype (argument tensors)",
            ThunderRuntimeError,
        )
        check(
            x.device == first.device,
            op,
            "_chunk_cat expects all inputs tensors on the same device (argument tensors)",
            ThunderRuntimeError,
        )
    if all(x.ndim == first.ndim for x in tensors):
        dim = clang.canonicalize_dim(first.ndim, dim, op)
    else:
        check(
            dim >= 0,
            op,
            "_chunk_cat expects non-negative dim when input tensors have different ndims (argument dim)",
            ThunderRuntimeError,
        )
    # (A 0-dim tensor is refused too: eager's kernel crashes on one.)
    check(
        all(dim < x.ndim for x in tensors),
        op,
        "_chunk_cat expects dim < ndim for all input tensors (argument dim)",
        ThunderRuntimeError,
    )
    check(
        all(same_shape(x.shape[:dim], first.shape[:dim]) for x in tensors),
        op,
        "_chunk_cat expects same sizes of 0,...,dim-1 dimensions for all tensors (argument tensors)",
        ThunderRuntimeError,
    )
    return dim


@torchsymbol(torch.concatenate)
def concatenate(tensors, dim=0, *, out=None):
    check(out is None, "ltorch.concatenate", "out= is not supported (argument out)", ThunderNotImplementedError)
    return _cat("ltorch.concatenate", tensors, dim)


@torchsymbol(torch.stack)
def stack(tensors, dim=0, *, out=None):
    op = "ltorch.stack"
    check(out is None, op, "out= is not supported (argument out)", ThunderNotImplementedError)
    tensors = _tensor_list(op, tensors, empty_msg="stack expects a non-empty TensorList")
    first = tensors[0]
    d = clang.canonicalize_dim(first.ndim + 1, dim, op)
    for i, x in enumerate(tensors):
        check(
            same_shape(x.shape, first.shape),
            op,
            lambda: (
                f"stack expects each tensor to be equal size, but got {list(first.shape)} at entry 0 and "
                f"{list(x.shape)} at entry {i} (argument tensors)"
            ),
            ThunderRuntimeError,
        )
    return _cat(op, [unsqueeze(x, d) for x in tensors], d)


@torchsymbol(torch.hstack)
def hstack(tensors, *, out=None):
    op = "ltorch.hstack"
    check(out is None, op, "out= is not supported (argument out)", ThunderNotImplementedError)
    tensors = [_atleast(op, x, 1) for x in _tensor_list(op, tensors, empty_msg="hstack expects a non-empty TensorList")]
    return _cat(op, tensors, 0 if tensors[0].ndim == 1 else 1)


@torchsymbol(torch.vstack)
def vstack(tensors, *, out=None):
    op = "ltorch.vstack"
    check(out is None, op, "out= is not supported (argument out)", ThunderNotImplementedError)
    tensors = [_atleast(op, x, 2) for x in _tensor_list(op, tensors, empty_msg="vstack expects a non-empty TensorList")]
    return _cat(op, tensors, 0)


@torchsymbol(Tensor.repeat)
def repeat(a, *args, repeats=None):
    op = "ltorch.repeat"
    reps = _one_of(op, args, repeats, "repeats")
    check(
        len(reps) >= a.ndim,
        op,
        lambda: (
            "Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor "
            "(argument repeats)"
        ),
        ThunderRuntimeError,
    )
    check(
        all(r >= 0 for r in reps),
        op,
        f"Trying to create tensor with negative dimension: {list(reps)} (argument repeats)",
        ThunderRuntimeError,
    )
    shape = (1,) * (len(reps) - a.ndim) + tuple(a.shape)
    # Interleave a size-r broadcast dim before each dim of size s, then merge each pair.
    paired = tuple(x for r, s in zip(reps, shape) for x in (r, s))
    dims = tuple(range(1, 2 * len(shape), 2))
    expanded = prims.broadcast_in_dim(reshape_to(a, shape), paired, dims)
    return reshape_to(expanded, tuple(r * s for r, s in zip(reps, shape)))


# -- splitting ------------------------------------------------------------------------------------


def _split_sizes(a, sizes, d):
    out, start = [], 0
    for size in sizes:
        out.append(slice_in_dim(a, d, start, start + size))
        start += size
    return tuple(out)


def _split_dim(op: str, a, dim, what: str):
    check(a.ndim > 0, op, f"{what} expects at least a 1-dimensional tensor (argument a)", ThunderRuntimeError)
    return clang.canonicalize_dim(a.ndim, dim, op)


@torchsymbol(torch.split, Tensor.split, sequence=True)
def split(a, split_size_or_sections, dim=0):
    op = "ltorch.split"
    d = _split_dim(op, a, dim, "split")
    size = a.shape[d]
    if is_int(split_size_or_sections):
        step = split_size_or_sections
        check(
            step >= 0,
            op,
            f"split expects split_size be non-negative, but got split_size={step} (argument split_size_or_sections)",
            ThunderRuntimeError,
        )
        check(
            step > 0 or size == 0,
            op,
            lambda: (
                f"split_size can only be 0 if dimension size is 0, but got dimension size of {size} "
                "(argument split_size_or_sections)"
            ),
            ThunderRuntimeError,
        )
        sizes = pieces(size, step)
    else:
        sizes = list(_sizes(op, (split_size_or_sections,), "split_size_or_sections"))
        check(
            all(s >= 0 for s in sizes),
            op,
            lambda: (
                f"split_with_sizes expects split_sizes have only non-negative entries, but got split_sizes={sizes} "
                "(argument split_size_or_sections)"
            ),
            ThunderRuntimeError,
        )
        check(
            sum(sizes) == size,
            op,
            lambda: (
                f"split_with_sizes expects split_sizes to sum exactly to {size} (input tensor's size at dimension "
                f"{d}), but got split_sizes={sizes} (argument split_size_or_sections)"
            ),
            ThunderRuntimeError,
        )
    return _split_sizes(a, sizes, d)


@torchsymbol(torch.chunk, Tensor.chunk, sequence=True)
def chunk(a, chunks, dim=0):
    op = "ltorch.chunk"
    d = _split_dim(op, a, dim, "chunk")
    check(
        chunks > 0,
        op,
        f"chunk expects `chunks` to be greater than 0, got: {chunks} (argument chunks)",
        ThunderRuntimeError,
    )
    size = a.shape[d]
    step = -(-size // chunks)
    if step == 0:
        return _split_sizes(a, [0] * chunks, d)
    return _split_sizes(a, pieces(size, step), d)


def _split_points_read(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``tensor_split``'s split points given as a tensor, checked and read as eager's overload
    (``tensor_indices_or_sections``: a CPU int64 tensor, 0-dim for a number of sections, 1-D for
    indices), before the symbol is recorded: the compiled call checks the values read."""
    key = next((k for k in ("tensor_indices_or_sections", "sections", "indices") if k in kwargs), None)
    points = args[1] if len(args) > 1 else kwargs.get(key) if key else None
    if not (isinstance(points, torch.Tensor) and isinstance(args[0], torch.Tensor) and args[0].ndim > 0):
        return args, kwargs
    op, say = "ltorch.tensor_split", "tensor_split expected tensor_indices_or_sections to"
    where = f"(argument indices_or_sections, at {user_location()})"
    check(points.device.type == "cpu", op, f"{say} be on cpu, but it's on {points.device} {where}", ThunderRuntimeError)
    check(
        points.dtype == torch.int64,
        op,
        f"{say} have dtype of long, but got {SCALAR_NAMES.get(points.dtype, points.dtype)} {where}",
        ThunderRuntimeError,
    )
    check(
        points.ndim <= 1,
        op,
        f"{say} be a zero-dimensional or one-dimensional tensor, but got a tensor with {points.ndim} dims {where}",
        ThunderRuntimeError,
    )
    read = points.item() if points.ndim == 0 else tuple(points.tolist())
    if len(args) > 1:
        return (args[0], read, *args[2:]), kwargs
    kwargs = {k: v for k, v in kwargs.items() if k != key}  # (named as eager's overload for the values)
    return args, {**kwargs, ("sections" if points.ndim == 0 else "indices"): read}


@torchsymbol(torch.tensor_split, Tensor.tensor_split, sequence=True, reads=_split_points_read)
def tensor_split(a, sections=None, dim=0, *, indices=None, tensor_indices_or_sections=None):
    op = "ltorch.tensor_split"
    indices_or_sections = next((x for x in (sections, indices, tensor_indices_or_sections) if x is not None), None)
    check(
        a.ndim > 0,
        op,
        f"tensor_split expected at least a 1-dimensional tensor, but got a tensor with {a.ndim} dims (argument a)",
        ThunderRuntimeError,
    )
    d = clang.canonicalize_dim(a.ndim, dim, op)
    size = a.shape[d]
    if isinstance(indices_or_sections, torch.Tensor):
        raise ThunderNotImplementedError(
            f"{op}: split points given as a tensor are data-dependent; pass ints (argument indices_or_sections)"
        )
    if is_int(indices_or_sections):
        n = operator.index(indices_or_sections)  # the number of outputs: a symbolic one is specialised
        check(
            n > 0,
            op,
            f"number of sections must be larger than 0, got {n} (argument indices_or_sections)",
            ThunderRuntimeError,
        )
        small, extra = divmod(size, n)
        bounds = [i * small + min(i, extra) for i in range(n + 1)]  # in order, within the dim
        return tuple(slice_in_dim(a, d, lo, hi) for lo, hi in zip(bounds, bounds[1:]))
    bounds = [0, *_sizes(op, (indices_or_sections,), "indices_or_sections"), size]
    out = []
    for lo, hi in zip(bounds, bounds[1:]):
        start, stop, _ = slice_indices(slice(lo, hi), size)  # (symbolic bounds kept so)
        out.append(slice_in_dim(a, d, start, max(start, stop)))
    return tuple(out)


def _narrow_reads(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``narrow``'s start read (``read_numbers``) after eager's check of a tensor one
    (``narrow.Tensor``: 0-dim and integral; read unchecked, ``tensor([1])`` was a start of 1)."""
    start = args[2] if len(args) > 2 else kwargs.get("start")
    if isinstance(start, torch.Tensor):
        check(
            start.ndim == 0
            and not (start.dtype.is_floating_point or start.dtype.is_complex)
            and start.dtype != torch.bool,
            "ltorch.narrow",
            f"start must be an 0-dim integral Tensor. (argument start, at {user_location()})",
            ThunderRuntimeError,
        )
    return read_numbers(args, kwargs, 2)


@torchsymbol(torch.narrow, Tensor.narrow, reads=_narrow_reads)
def narrow(a, dim, start, length):
    op = "ltorch.narrow"
    check(a.ndim > 0, op, "narrow() cannot be applied to a 0-dim tensor. (argument a)", ThunderRuntimeError)
    d = clang.canonicalize_dim(a.ndim, dim, op)
    size = a.shape[d]
    check(
        -size <= start <= size,
        op,
        f"start out of range (expected to be in range of [{-size}, {size}], but got {start}) (argument start)",
        ThunderIndexError,
    )
    start = start + size if start < 0 else start
    check(length >= 0, op, "narrow(): length must be non-negative. (argument length)", ThunderRuntimeError)
    check(
        start + length <= size,
        op,
        f"start ({start}) + length ({length}) exceeds dimension size ({size}). (argument length)",
        ThunderRuntimeError,
    )
    return slice_in_dim(a, d, start, start + length)


@register_grad(narrow)
def narrow_grad(a, dim, start, length):
    out = narrow(a, dim, start, length)
    if type(start) is int and type(length) is int:
        d = clang.canonicalize_dim(a.ndim, dim, "ltorch.narrow")
        begin = start + a.shape[d] if start < 0 else start
        return put_slice_gradient(a, out, d, begin, begin + length)
    return out


# -- padding ---------------------------------------------------------------------------------------


def _pad_value(value, dtype: torch.dtype):
    """The fill value as ``constant_pad_nd`` stores it in ``dtype``: truncated toward zero for
    integers, truthiness for bool."""
    value = 0 if value is None else value
    if dtype == torch.bool:
        return bool(value)
    if not (dtype.is_floating_point or dtype.is_complex):
        check(
            math.isfinite(value),
            "ltorch.pad",
            f"value cannot be converted to type {dtype} without overflow (argument value)",
            ThunderRuntimeError,
        )
        return int(value)
    return value


@torchsymbol(torch.nn.functional.pad)
def pad(input, pad, mode="constant", value=None):
    """Constant padding of the last ``len(pad) // 2`` dims (``pad`` lists (left, right) pairs from
    the last dim backwards); negative amounts crop."""
    op = "ltorch.pad"
    check(
        mode == "constant",
        op,
        f"only mode='constant' has a decomposition, got {mode!r} (argument mode)",
        ThunderNotImplementedError,
    )
    pad = read_ints(tuple(pad))
    check(
        all(is_int(p) for p in pad),
        op,
        f"argument 'pad' must be tuple of ints, got {pad!r} (argument pad)",
        ThunderTypeError,
    )
    check(len(pad) % 2 == 0, op, "Padding length must be divisible by 2 (argument pad)", ThunderRuntimeError)
    check(
        len(pad) // 2 <= input.ndim,
        op,
        f"Padding length should be less than or equal to two times the input "
        f"dimension but got padding length {len(pad)} and input of dimension {input.ndim} (argument pad)",
        ThunderRuntimeError,
    )
    config = [(0, 0, 0)] * input.ndim
    for i in range(len(pad) // 2):
        d = input.ndim - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        check(
            input.shape[d] + lo + hi >= 0,
            op,
            f"narrow(): length must be non-negative: padding ({lo}, {hi}) "
            f"of dimension {d} of size {input.shape[d]} (argument pad)",
            ThunderRuntimeError,
        )
        config[d] = (lo, hi, 0)
    # As data: an amount that is a size (Swin's ``(4 - W % 4) % 4``) pads where it is 0 too.
    if all(identical(amount, 0) for c in config for amount in c):
        return input
    if type(value) is SymInt and input.dtype != torch.bool:
        return _padded_with_size(input, value, tuple(config))
    return prims.pad(input, _pad_value(value, input.dtype), tuple(config))


def _padded_with_size(input, value, config):
    """``input`` padded with a size (a pad prim's value is a number): its 0-d tensor, read on
    each call, selected where the padding is."""
    padded = prims.pad(input, _pad_value(0, input.dtype), config)
    inside = prims.pad(prims.full(tuple(input.shape), True, input.device, torch.bool), False, config)
    filled = clang.expand_to(size_value(input.device, input.dtype, value), tuple(padded.shape))
    return prims.where(inside, padded, filled)


@register_grad(pad)
def pad_grad(input, pad_, mode="constant", value=None):
    """Eager's ``constant_pad_nd_backward``: the cotangent padded back, a new tensor (a crop is
    ``narrow(...).clone()``). The pad prim's VJP crops the cotangent as a view of it, with its
    strides: ``(7, 1)`` for a ``[3, 4]`` input padded to ``[3, 7]``, where eager's are ``(4, 1)``."""
    out = pad(input, pad_, mode, value)
    if out is not input:  # (a crop: its elements moved, for complex values too)
        put_grad(input, pad(get_grad(out), [-amount for amount in pad_]), complex_values=True)
    return out


def _pad_or_fallback(input, pad_, mode="constant", value=None):
    """``F.pad``: the ``pad`` symbol for constant padding; reflect, replicate and circular
    padding run eagerly as a fallback."""
    if mode == "constant":
        return pad(input, pad_, mode, value)
    return fallback(torch.nn.functional.pad, (input, pad_, mode, value), {})


TORCH_TO_LTORCH[torch.nn.functional.pad] = _pad_or_fallback


# -- grad rules of the splits ----------------------------------------------------------------------


def _tiles_grad(a, pieces, dim: int):
    """Puts the gradient of ``a`` from those of ``pieces``, which tile it along ``dim``: eager's
    ``SplitBackward0``, one cat (a new tensor also for one whole piece, then an alias of ``a``:
    eager's cat of a transposed cotangent is row-major)."""
    pieces = _aliased(a, pieces)
    if not a.dtype.is_complex:  # (complex: the slices' VJPs)
        put_grad(a, ltorch.cat([get_grad(p) for p in pieces], dim))
    return pieces


def _aliased(a, pieces):
    """``pieces`` with ``a`` itself, a whole piece, an alias of it (a rule's outputs are new values)."""
    return type(pieces)(prims.reshape(a, tuple(a.shape)) if p is a else p for p in pieces)


@register_grad(ltorch.split)
def split_grad(a, split_size_or_sections, dim=0):
    return _tiles_grad(a, ltorch.split(a, split_size_or_sections, dim), dim)


@register_grad(ltorch.chunk)
def chunk_grad(a, chunks, dim=0):
    return _tiles_grad(a, ltorch.chunk(a, chunks, dim), dim)


@register_grad(ltorch.tensor_split)
def tensor_split_grad(a, sections=None, dim=0, *, indices=None, tensor_indices_or_sections=None):
    """Eager's gradient of ``tensor_split``, a slice per piece (``SliceBackward0`` each, summed):
    a new row-major tensor, here the cat of the pieces' cotangents copied by one ``slice_backward``
    of all of ``a`` (a channels_last cotangent's cat is channels_last)."""
    pieces = ltorch.tensor_split(
        a, sections, dim, indices=indices, tensor_indices_or_sections=tensor_indices_or_sections
    )
    d = clang.canonicalize_dim(a.ndim, dim, "ltorch.tensor_split")
    if a.dtype.is_complex:
        return pieces  # (the slices' VJPs)
    if not all(type(n) is int for n in a.shape):
        return _tiles_grad(a, pieces, d)
    pieces = _aliased(a, pieces)
    joined = ltorch.cat([get_grad(p) for p in pieces], d)
    put_grad(a, ltorch.slice_backward(joined, tuple(a.shape), d, 0, a.shape[d], 1))
    return pieces


@register_grad(stack)
def stack_grad(tensors, dim=0, *, out=None):
    """Eager's ``stack_tensors_backward``: each tensor's gradient is ``grad.select(dim, i)``, a view
    that keeps the gradient's strides (the VJP of ``cat`` of unsqueezes reshaped slices, which
    gave a dim of size 1 another stride)."""
    result = stack(tensors, dim, out=out)
    wanting = [(i, x) for i, x in enumerate(tensors) if isinstance(x, TensorProxy) and x.requires_grad]
    if not wanting:
        return result
    d = clang.canonicalize_dim(result.ndim, dim, "ltorch.stack")
    g = get_grad(result)
    for i, x in wanting:
        put_grad(x, clang.maybe_convert(ltorch.select(g, d, i), x.dtype), complex_values=True)  # (selected)
    return result
