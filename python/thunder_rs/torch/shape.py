"""Shape ops: views (reshape, permute, expand, squeeze), joining and splitting, and dtype/device moves.

Every op here is a composite of the shape prims (reshape, transpose, broadcast_in_dim, slice,
squeeze, cat, flip). An op that leaves its input as it is returns the input itself, so its
composite dissolves from the trace. Shape arguments follow torch: varargs or one sequence, and
a single -1 stands for the inferred size.
"""

import math
import warnings

import torch

from thunder_rs import clang, prims
from thunder_rs.core import dtypes
from thunder_rs.core.fallback import fallback
from thunder_rs.core.langctx import TORCH_TO_LTORCH
from thunder_rs.errors import (
    ThunderIndexError,
    ThunderNotImplementedError,
    ThunderRuntimeError,
    ThunderTypeError,
    ThunderValueError,
    check,
)
from thunder_rs.torch.symbols import torchsymbol

Tensor = torch.Tensor
__all__ = [
    "reshape", "view", "view_as", "reshape_as", "permute", "transpose", "swapaxes", "t", "T", "mT",
    "contiguous", "clone", "expand", "expand_as", "broadcast_to", "unsqueeze", "squeeze", "flatten",
    "ravel", "unflatten", "cat", "concatenate", "stack", "hstack", "vstack", "split", "chunk",
    "tensor_split", "movedim", "flip", "roll", "narrow", "repeat", "to", "type_as", "tensor_type",
    "atleast_1d", "atleast_2d", "pad",
]


# -- helpers ------------------------------------------------------------------------------------


def _sizes(op: str, args, arg: str = "shape") -> tuple[int, ...]:
    """Sizes given as varargs (``view(2, 3)``) or as one sequence (``view((2, 3))``)."""
    if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)):
        args = tuple(args[0])
    for s in args:
        check(isinstance(s, int) and not isinstance(s, bool), op,
              lambda: f"expected a sequence of ints for {arg}, got {list(args)!r} (argument {arg})", ThunderTypeError)
    return tuple(args)


def _one_of(op: str, args, keyword, arg: str) -> tuple:
    """Positional sizes, or the same given by keyword; not both."""
    if keyword is None:
        return _sizes(op, args, arg)
    check(not args, op, f"got {arg} both positionally and by keyword (argument {arg})", ThunderTypeError)
    return _sizes(op, (keyword,), arg)


def infer_shape(op: str, shape, numel: int) -> tuple[int, ...]:
    """``shape`` with its one -1 replaced by the size that keeps ``numel`` elements."""
    shape = list(shape)
    check(shape.count(-1) <= 1, op, "only one dimension can be inferred (argument shape)", ThunderRuntimeError)
    for i, s in enumerate(shape):
        check(s >= -1, op, f"invalid shape dimension {s} at index {i} of shape {shape} (argument shape)", ThunderRuntimeError)
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        check(known != 0, op, lambda: (
            f"cannot reshape tensor of 0 elements into shape {shape} because the unspecified dimension "
            "size -1 can be any value and is ambiguous (argument shape)"), ThunderRuntimeError)
        check(numel % known == 0, op, f"shape '{shape}' is invalid for input of size {numel} (argument shape)", ThunderRuntimeError)
        shape[shape.index(-1)] = numel // known
    check(math.prod(shape) == numel, op, f"shape '{shape}' is invalid for input of size {numel} (argument shape)", ThunderRuntimeError)
    return tuple(shape)


def reshape_to(a, shape):
    """``a`` with ``shape`` (same number of elements); ``a`` itself when it has it already."""
    shape = tuple(shape)
    return a if tuple(a.shape) == shape else prims.reshape(a, shape)


def slice_in_dim(a, dim: int, start: int, stop: int, step: int = 1):
    """``a[..., start:stop:step, ...]`` along canonical ``dim`` with in-range bounds."""
    if start == 0 and stop == a.shape[dim] and step == 1:
        return a
    starts, stops, steps = [0] * a.ndim, list(a.shape), [1] * a.ndim
    starts[dim], stops[dim], steps[dim] = start, stop, step
    return prims.slice(a, starts, stops, steps)


def _permute_to(a, perm):
    perm = tuple(perm)
    return a if perm == tuple(range(a.ndim)) else prims.transpose(a, perm)


def _unique_dims(op: str, ndim: int, dims, arg: str = "dim") -> tuple[int, ...]:
    """Canonical dims; a repeated dim is a RuntimeError, as torch raises it."""
    out = tuple(clang.canonicalize_dim(ndim, d, op, arg) for d in dims)
    dup = next((d for i, d in enumerate(out) if d in out[:i]), None)
    check(dup is None, op, f"dim {dup} appears multiple times in the list of dims (argument {arg})", ThunderRuntimeError)
    return out


# -- views ----------------------------------------------------------------------------------------


@torchsymbol(Tensor.reshape, torch.reshape)
def reshape(a, *args, shape=None):
    shape = _one_of("ltorch.reshape", args, shape, "shape")
    return reshape_to(a, infer_shape("ltorch.reshape", shape, a.numel()))


# The torch executor runs the view symbols as reshapes: ``contiguous()`` dissolves from traces, so
# the tensor a view receives may be strided where eager's was contiguous, and a trace has no
# aliasing for a view to preserve.
def _view_as_reshape(a, *args, size=None, dtype=None):
    return a.reshape(*args) if size is None else a.reshape(size)


def _view_as_as_reshape_as(a, other):
    return a.reshape_as(other)


@torchsymbol(_view_as_reshape, Tensor.view)
def view(a, *args, size=None, dtype=None):
    if dtype is not None or (len(args) == 1 and isinstance(args[0], torch.dtype)):
        raise ThunderNotImplementedError(
            "ltorch.view: reinterpreting a tensor's bytes as another dtype (Tensor.view(dtype)) is not supported (argument dtype)")
    shape = _one_of("ltorch.view", args, size, "size")
    return reshape_to(a, infer_shape("ltorch.view", shape, a.numel()))


@torchsymbol(_view_as_as_reshape_as, Tensor.view_as)
def view_as(a, other):
    return reshape_to(a, infer_shape("ltorch.view_as", other.shape, a.numel()))


@torchsymbol(Tensor.reshape_as)
def reshape_as(a, other):
    return reshape_to(a, infer_shape("ltorch.reshape_as", other.shape, a.numel()))


@torchsymbol(torch.flatten, Tensor.flatten)
def flatten(a, start_dim=0, end_dim=-1):
    op = "ltorch.flatten"
    start = clang.canonicalize_dim(a.ndim, start_dim, op, "start_dim")
    end = clang.canonicalize_dim(a.ndim, end_dim, op, "end_dim")
    check(start <= end, op, "flatten() has invalid args: start_dim cannot come after end_dim (argument start_dim)", ThunderRuntimeError)
    if a.ndim == 0:
        return reshape_to(a, (1,))
    shape = (*a.shape[:start], math.prod(a.shape[start:end + 1]), *a.shape[end + 1:])
    return reshape_to(a, shape)


@torchsymbol(torch.ravel, Tensor.ravel)
def ravel(a):
    return reshape_to(a, (a.numel(),))


@torchsymbol(torch.unflatten, Tensor.unflatten)
def unflatten(a, dim, sizes):
    op = "ltorch.unflatten"
    check(a.ndim > 0, op, "Dimension specified as 0 but tensor has no dimensions (argument dim)", ThunderRuntimeError)
    d = clang.canonicalize_dim(a.ndim, dim, op)
    sizes = _sizes(op, (sizes,), "sizes")
    check(len(sizes) > 0, op, "unflatten: sizes must be non-empty (argument sizes)", ThunderRuntimeError)
    check(sizes.count(-1) <= 1, op, "only one dimension can be inferred (argument sizes)", ThunderRuntimeError)
    known = math.prod(s for s in sizes if s != -1)
    fits = a.shape[d] % known == 0 if -1 in sizes and known else known == a.shape[d]
    check(fits, op, lambda: (f"unflatten: Provided sizes {list(sizes)} don't multiply up to the size of dim {dim} "
                             f"({a.shape[d]}) in the input tensor (argument sizes)"), ThunderRuntimeError)
    sizes = infer_shape(op, sizes, a.shape[d])
    return reshape_to(a, (*a.shape[:d], *sizes, *a.shape[d + 1:]))


@torchsymbol(Tensor.permute, torch.permute)
def permute(a, *args, dims=None):
    op = "ltorch.permute"
    dims = _one_of(op, args, dims, "dims")
    check(len(dims) == a.ndim, op, lambda: (
        "number of dimensions in the tensor input does not match the length of the desired ordering of "
        f"dimensions i.e. input.dim() = {a.ndim} is not equal to len(dims) = {len(dims)} (argument dims)"), ThunderRuntimeError)
    perm = tuple(clang.canonicalize_dim(a.ndim, d, op, "dims") for d in dims)
    check(len(set(perm)) == len(perm), op, "permute(): duplicate dims are not allowed. (argument dims)", ThunderRuntimeError)
    return _permute_to(a, perm)


@torchsymbol(torch.transpose, Tensor.transpose, torch.swapdims, Tensor.swapdims)
def transpose(a, dim0, dim1):
    d0 = clang.canonicalize_dim(a.ndim, dim0, "ltorch.transpose", "dim0")
    d1 = clang.canonicalize_dim(a.ndim, dim1, "ltorch.transpose", "dim1")
    if a.ndim == 0:
        return a
    perm = list(range(a.ndim))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return _permute_to(a, perm)


@torchsymbol(torch.swapaxes, Tensor.swapaxes)
def swapaxes(a, axis0, axis1):
    return transpose(a, axis0, axis1)


@torchsymbol(torch.t, Tensor.t)
def t(a):
    check(a.ndim <= 2, "ltorch.t", f"t() expects a tensor with <= 2 dimensions, but self is {a.ndim}D (argument a)",
          ThunderRuntimeError)
    return transpose(a, 0, 1) if a.ndim == 2 else a


@torchsymbol(properties=("T",))
def T(a):
    if a.ndim not in (0, 2):
        warnings.warn("The use of `x.T` on tensors of dimension other than 2 to reverse their shape is deprecated and "
                      "it will throw an error in a future release. Consider `x.mT` to transpose batches of matrices "
                      "or `x.permute(*torch.arange(x.ndim - 1, -1, -1))` to reverse the dimensions of a tensor.",
                      UserWarning, stacklevel=2)
    return _permute_to(a, range(a.ndim - 1, -1, -1))


@torchsymbol(properties=("mT",))
def mT(a):
    check(a.ndim >= 2, "ltorch.mT", f"tensor.mT is only supported on matrices or batches of matrices. Got {a.ndim}-D tensor.",
          ThunderRuntimeError)
    return transpose(a, -2, -1)


@torchsymbol(torch.movedim, Tensor.movedim, torch.moveaxis, Tensor.moveaxis)
def movedim(a, source, destination):
    op = "ltorch.movedim"
    source = (source,) if isinstance(source, int) else tuple(source)
    destination = (destination,) if isinstance(destination, int) else tuple(destination)
    check(len(source) == len(destination), op, lambda: (
        f"movedim: Invalid source or destination dims: source ({list(source)} dims) should contain the same number "
        f"of dims as destination ({list(destination)} dims)"), ThunderRuntimeError)
    src = tuple(clang.canonicalize_dim(a.ndim, d, op, "source") for d in source)
    dst = tuple(clang.canonicalize_dim(a.ndim, d, op, "destination") for d in destination)
    for name, dims in (("source", src), ("destination", dst)):
        check(len(set(dims)) == len(dims), op, f"movedim: repeated dim in `{name}` ({list(dims)}) (argument {name})",
              ThunderRuntimeError)
    perm = [-1] * max(a.ndim, 1)
    for s, d in zip(src, dst):
        perm[d] = s
    rest = iter(d for d in range(a.ndim) if d not in src)
    perm = [p if p != -1 else next(rest) for p in perm]
    return a if a.ndim == 0 else _permute_to(a, perm)


def contiguous(a, memory_format=torch.contiguous_format):
    """``Tensor.contiguous``: the tensor itself (``views`` gives a copy where eager makes one). Not a
    symbol: a composite that returns its input dissolves from the trace, so it would never appear."""
    return a


TORCH_TO_LTORCH[Tensor.contiguous] = contiguous


@torchsymbol(torch.clone, Tensor.clone)
def clone(a, *, memory_format=torch.preserve_format):
    # A copy is a conversion to the same dtype: a fresh value that later ops may not alias.
    return prims.convert_element_type(a, a.dtype)


# -- broadcasting and size-1 dims -----------------------------------------------------------------


def _expand(op: str, a, sizes):
    check(len(sizes) >= a.ndim, op, lambda: (
        f"the number of sizes provided ({len(sizes)}) must be greater or equal to the number of dimensions in the "
        f"tensor ({a.ndim}) (argument size)"), ThunderRuntimeError)
    lead = len(sizes) - a.ndim
    shape = []
    for i, size in enumerate(sizes):
        if i < lead:
            check(size >= 0, op, f"The expanded size of the tensor ({size}) isn't allowed in a leading, non-existing dimension {i} (argument size)",
                  ThunderRuntimeError)
            shape.append(size)
            continue
        have = a.shape[i - lead]
        size = have if size == -1 else size
        check(size == have or have == 1, op, lambda: (
            f"The expanded size of the tensor ({sizes[i]}) must match the existing size ({have}) at non-singleton "
            f"dimension {i}.  Target sizes: {list(sizes)}.  Tensor sizes: {list(a.shape)} (argument size)"), ThunderRuntimeError)
        check(size >= 0, op, f"invalid expanded size {size} at dimension {i} (argument size)", ThunderRuntimeError)
        shape.append(size)
    return clang.expand_to(a, shape)


@torchsymbol(Tensor.expand)
def expand(a, *args, size=None, implicit=False):
    return _expand("ltorch.expand", a, _one_of("ltorch.expand", args, size, "size"))


@torchsymbol(Tensor.expand_as)
def expand_as(a, other):
    return _expand("ltorch.expand_as", a, tuple(other.shape))


@torchsymbol(torch.broadcast_to, Tensor.broadcast_to)
def broadcast_to(a, size):
    return _expand("ltorch.broadcast_to", a, _sizes("ltorch.broadcast_to", (size,), "size"))


@torchsymbol(torch.unsqueeze, Tensor.unsqueeze)
def unsqueeze(a, dim):
    d = clang.canonicalize_dim(a.ndim + 1, dim, "ltorch.unsqueeze")
    shape = (*a.shape[:d], 1, *a.shape[d:])
    return prims.broadcast_in_dim(a, shape, tuple(i for i in range(a.ndim + 1) if i != d))


@torchsymbol(torch.squeeze, Tensor.squeeze)
def squeeze(a, dim=None):
    op = "ltorch.squeeze"
    if dim is None:
        dims = tuple(range(a.ndim))
    else:
        dims = _unique_dims(op, a.ndim, (dim,) if isinstance(dim, int) else tuple(dim))
    dims = tuple(d for d in dims if a.ndim > 0 and a.shape[d] == 1)
    return prims.squeeze(a, dims) if dims else a


def _atleast(op: str, a, ndim: int):
    check(isinstance(a, torch.Tensor), op, f"expected a tensor, got {type(a).__name__}", ThunderTypeError)
    return reshape_to(a, (1,) * (ndim - a.ndim) + tuple(a.shape)) if a.ndim < ndim else a


def _define_atleast(ndim: int):
    torch_fn = getattr(torch, f"atleast_{ndim}d")

    @torchsymbol(torch_fn, name=f"atleast_{ndim}d")
    def atleast(*tensors):
        op = f"ltorch.atleast_{ndim}d"
        if len(tensors) == 1 and isinstance(tensors[0], (tuple, list)):
            return tuple(_atleast(op, a, ndim) for a in tensors[0])
        if len(tensors) == 1:
            return _atleast(op, tensors[0], ndim)
        return tuple(_atleast(op, a, ndim) for a in tensors)

    return atleast


atleast_1d = _define_atleast(1)
atleast_2d = _define_atleast(2)


# -- joining --------------------------------------------------------------------------------------


def _tensor_list(op: str, tensors, empty_exc=ThunderRuntimeError, empty_msg="expected a non-empty list of Tensors"):
    check(isinstance(tensors, (tuple, list)), op, lambda: (
        f"expected a tuple or list of tensors, got {type(tensors).__name__} (argument tensors)"), ThunderTypeError)
    check(len(tensors) > 0, op, f"{empty_msg} (argument tensors)", empty_exc)
    for i, x in enumerate(tensors):
        check(isinstance(x, torch.Tensor), op, f"expected a tensor at position {i}, got {type(x).__name__} (argument tensors)",
              ThunderTypeError)
    return list(tensors)


def _cat(op: str, tensors, dim):
    tensors = _tensor_list(op, tensors, ThunderValueError, "torch.cat(): expected a non-empty list of Tensors")
    for i, x in enumerate(tensors):
        check(x.ndim > 0, op, f"zero-dimensional tensor (at position {i}) cannot be concatenated (argument tensors)",
              ThunderRuntimeError)
    dtype = dtypes.result_type(*tensors)
    # torch still skips legacy empty tensors of shape (0,) whatever the other tensors' rank.
    kept = [(i, x) for i, x in enumerate(tensors) if tuple(x.shape) != (0,)] or [(0, tensors[0])]
    first = kept[0][1]
    d = clang.canonicalize_dim(first.ndim, dim, op)
    for i, x in kept:
        check(x.ndim == first.ndim, op, f"Tensors must have same number of dimensions: got {first.ndim} and {x.ndim} (argument tensors)",
              ThunderRuntimeError)
        bad = next((k for k in range(x.ndim) if k != d and x.shape[k] != first.shape[k]), None)
        check(bad is None, op, lambda: (
            f"Sizes of tensors must match except in dimension {d}. Expected size {first.shape[bad]} but got size "
            f"{x.shape[bad]} for tensor number {i} in the list. (argument tensors)"), ThunderRuntimeError)
    kept_tensors = [x for _, x in kept]
    devices = {str(x.device) for x in kept_tensors}
    check(len(devices) == 1, op, f"Expected all tensors to be on the same device, but found {sorted(devices)} (argument tensors)",
          ThunderRuntimeError)
    return prims.cat([clang.maybe_convert(x, dtype) for x in kept_tensors], d)


@torchsymbol(torch.cat, torch.concat)
def cat(tensors, dim=0, *, out=None):
    check(out is None, "ltorch.cat", "out= is not supported (argument out)", ThunderNotImplementedError)
    return _cat("ltorch.cat", tensors, dim)


@torchsymbol(torch.concatenate)
def concatenate(tensors, axis=0, out=None):
    check(out is None, "ltorch.concatenate", "out= is not supported (argument out)", ThunderNotImplementedError)
    return _cat("ltorch.concatenate", tensors, axis)


@torchsymbol(torch.stack)
def stack(tensors, dim=0, *, out=None):
    op = "ltorch.stack"
    check(out is None, op, "out= is not supported (argument out)", ThunderNotImplementedError)
    tensors = _tensor_list(op, tensors, empty_msg="stack expects a non-empty TensorList")
    first = tensors[0]
    d = clang.canonicalize_dim(first.ndim + 1, dim, op)
    for i, x in enumerate(tensors):
        check(tuple(x.shape) == tuple(first.shape), op, lambda: (
            f"stack expects each tensor to be equal size, but got {list(first.shape)} at entry 0 and "
            f"{list(x.shape)} at entry {i} (argument tensors)"), ThunderRuntimeError)
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
    check(len(reps) >= a.ndim, op, lambda: (
        "Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor (argument repeats)"),
          ThunderRuntimeError)
    check(all(r >= 0 for r in reps), op, f"Trying to create tensor with negative dimension: {list(reps)} (argument repeats)",
          ThunderRuntimeError)
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
    if isinstance(split_size_or_sections, int):
        step = split_size_or_sections
        check(step >= 0, op, f"split expects split_size be non-negative, but got split_size={step} (argument split_size_or_sections)",
              ThunderRuntimeError)
        check(step > 0 or size == 0, op, lambda: (
            f"split_size can only be 0 if dimension size is 0, but got dimension size of {size} (argument split_size_or_sections)"),
              ThunderRuntimeError)
        count = max(-(-size // step) if step else 1, 1)
        sizes = [min(step, size - i * step) for i in range(count)]
    else:
        sizes = list(_sizes(op, (split_size_or_sections,), "split_size_or_sections"))
        check(all(s >= 0 for s in sizes), op, lambda: (
            f"split_with_sizes expects split_sizes have only non-negative entries, but got split_sizes={sizes} "
            "(argument split_size_or_sections)"), ThunderRuntimeError)
        check(sum(sizes) == size, op, lambda: (
            f"split_with_sizes expects split_sizes to sum exactly to {size} (input tensor's size at dimension {d}), "
            f"but got split_sizes={sizes} (argument split_size_or_sections)"), ThunderRuntimeError)
    return _split_sizes(a, sizes, d)


@torchsymbol(torch.chunk, Tensor.chunk, sequence=True)
def chunk(a, chunks, dim=0):
    op = "ltorch.chunk"
    d = _split_dim(op, a, dim, "chunk")
    check(chunks > 0, op, f"chunk expects `chunks` to be greater than 0, got: {chunks} (argument chunks)", ThunderRuntimeError)
    size = a.shape[d]
    step = -(-size // chunks)
    if step == 0:
        return _split_sizes(a, [0] * chunks, d)
    count = -(-size // step)
    return _split_sizes(a, [min(step, size - i * step) for i in range(count)], d)


@torchsymbol(torch.tensor_split, Tensor.tensor_split, sequence=True)
def tensor_split(a, sections=None, dim=0, *, indices=None, tensor_indices_or_sections=None):
    op = "ltorch.tensor_split"
    indices_or_sections = next((x for x in (sections, indices, tensor_indices_or_sections) if x is not None), None)
    check(a.ndim > 0, op, f"tensor_split expected at least a 1-dimensional tensor, but got a tensor with {a.ndim} dims (argument a)",
          ThunderRuntimeError)
    d = clang.canonicalize_dim(a.ndim, dim, op)
    size = a.shape[d]
    if isinstance(indices_or_sections, torch.Tensor):
        raise ThunderNotImplementedError(f"{op}: split points given as a tensor are data-dependent; pass ints (argument indices_or_sections)")
    if isinstance(indices_or_sections, int):
        n = indices_or_sections
        check(n > 0, op, f"number of sections must be larger than 0, got {n} (argument indices_or_sections)", ThunderRuntimeError)
        small, extra = divmod(size, n)
        bounds = [i * small + min(i, extra) for i in range(n + 1)]
    else:
        bounds = [0, *_sizes(op, (indices_or_sections,), "indices_or_sections"), size]
    out = []
    for lo, hi in zip(bounds, bounds[1:]):
        start, stop, _ = slice(lo, hi).indices(size)
        out.append(slice_in_dim(a, d, start, max(start, stop)))
    return tuple(out)


@torchsymbol(torch.narrow, Tensor.narrow)
def narrow(a, dim, start, length):
    op = "ltorch.narrow"
    check(a.ndim > 0, op, "narrow() cannot be applied to a 0-dim tensor. (argument a)", ThunderRuntimeError)
    check(not isinstance(start, torch.Tensor), op, "a tensor start is data-dependent; pass an int (argument start)",
          ThunderNotImplementedError)
    d = clang.canonicalize_dim(a.ndim, dim, op)
    size = a.shape[d]
    check(-size <= start <= size, op, f"start out of range (expected to be in range of [{-size}, {size}], but got {start}) (argument start)",
          ThunderIndexError)
    start = start + size if start < 0 else start
    check(length >= 0, op, "narrow(): length must be non-negative. (argument length)", ThunderRuntimeError)
    check(start + length <= size, op, f"start ({start}) + length ({length}) exceeds dimension size ({size}). (argument length)",
          ThunderRuntimeError)
    return slice_in_dim(a, d, start, start + length)


def _pad_value(value, dtype: torch.dtype):
    """The fill value as ``constant_pad_nd`` stores it in ``dtype``: truncated toward zero for
    integers, truthiness for bool."""
    value = 0 if value is None else value
    if dtype == torch.bool:
        return bool(value)
    if not (dtype.is_floating_point or dtype.is_complex):
        check(math.isfinite(value), "ltorch.pad", f"value cannot be converted to type {dtype} without overflow "
              f"(argument value)", ThunderRuntimeError)
        return int(value)
    return value


@torchsymbol(torch.nn.functional.pad)
def pad(input, pad, mode="constant", value=None):
    """Constant padding of the last ``len(pad) // 2`` dims (``pad`` lists (left, right) pairs from
    the last dim backwards); negative amounts crop."""
    op = "ltorch.pad"
    check(mode == "constant", op, f"only mode='constant' has a decomposition, got {mode!r} (argument mode)",
          ThunderNotImplementedError)
    pad = tuple(pad)
    check(all(isinstance(p, int) and not isinstance(p, bool) for p in pad), op,
          f"argument 'pad' must be tuple of ints, got {pad!r} (argument pad)", ThunderTypeError)
    check(len(pad) % 2 == 0, op, "Padding length must be divisible by 2 (argument pad)", ThunderRuntimeError)
    check(len(pad) // 2 <= input.ndim, op, f"Padding length should be less than or equal to two times the input "
          f"dimension but got padding length {len(pad)} and input of dimension {input.ndim} (argument pad)",
          ThunderRuntimeError)
    config = [(0, 0, 0)] * input.ndim
    for i in range(len(pad) // 2):
        d = input.ndim - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        check(input.shape[d] + lo + hi >= 0, op, f"narrow(): length must be non-negative: padding ({lo}, {hi}) "
              f"of dimension {d} of size {input.shape[d]} (argument pad)", ThunderRuntimeError)
        config[d] = (lo, hi, 0)
    if all(c == (0, 0, 0) for c in config):
        return input
    return prims.pad(input, _pad_value(value, input.dtype), tuple(config))


def _pad_or_fallback(input, pad_, mode="constant", value=None):
    """``F.pad``: the ``pad`` symbol for constant padding; reflect, replicate and circular
    padding run eagerly as a fallback."""
    if mode == "constant":
        return pad(input, pad_, mode, value)
    return fallback(torch.nn.functional.pad, (input, pad_, mode, value), {})


TORCH_TO_LTORCH[torch.nn.functional.pad] = _pad_or_fallback


# -- reordering -----------------------------------------------------------------------------------


@torchsymbol(Tensor.flip, torch.flip)
def flip(a, *args, dims=None):
    op = "ltorch.flip"
    dims = _unique_dims(op, a.ndim, _one_of(op, args, dims, "dims"), "dims")
    dims = tuple(d for d in dims if a.ndim > 0 and a.shape[d] > 1)
    return prims.flip(a, dims) if dims else a


@torchsymbol(torch.roll, Tensor.roll)
def roll(a, shifts, dims=None):
    op = "ltorch.roll"
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    check(len(shifts) > 0, op, "`shifts` required (argument shifts)", ThunderRuntimeError)
    if dims is None:
        check(len(shifts) == 1, op, f"shifts and dimensions must align. shifts: {len(shifts)}, dims:0 (argument dims)",
              ThunderRuntimeError)
        return reshape_to(roll(flatten(a), shifts, 0), a.shape)
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    check(len(shifts) == len(dims), op, f"shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)} (argument dims)",
          ThunderRuntimeError)
    check(a.ndim > 0, op, "Dimension specified as 0 but tensor has no dimensions (argument dims)", ThunderIndexError)
    out = a
    for shift, dim in zip(shifts, dims):
        d = clang.canonicalize_dim(a.ndim, dim, op, "dims")
        size = a.shape[d]
        if size == 0 or shift % size == 0:
            continue
        cut = size - shift % size
        out = prims.cat([slice_in_dim(out, d, cut, size), slice_in_dim(out, d, 0, cut)], d)
    return out


# -- dtype and device -----------------------------------------------------------------------------


def _device(op: str, device) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ThunderRuntimeError(f"{op}: {e} (argument device)") from None


def _same_device(a, device: torch.device) -> bool:
    return device.type == a.device.type and device.index in (None, a.device.index)


def _parse_to(args, kwargs):
    """(device, dtype, copy) from the three forms of ``Tensor.to``."""
    kwargs = dict(kwargs)
    device, dtype, copy = kwargs.pop("device", None), kwargs.pop("dtype", None), kwargs.pop("copy", False)
    other = kwargs.pop("other", None)
    kwargs.pop("non_blocking", None)
    kwargs.pop("memory_format", None)
    check(not kwargs, "ltorch.to", lambda: f"unexpected keyword arguments {sorted(kwargs)}", ThunderTypeError)
    args = list(args)
    if args and isinstance(args[0], torch.Tensor):
        other = args.pop(0)
    elif args and isinstance(args[0], torch.dtype):
        dtype = args.pop(0)
    elif args and (args[0] is None or isinstance(args[0], (str, int, torch.device))):
        device = args.pop(0)
        if args and (args[0] is None or isinstance(args[0], torch.dtype)):
            dtype = args.pop(0)
    check(len(args) <= 2, "ltorch.to", f"unexpected arguments {args!r}", ThunderTypeError)
    if len(args) == 2:
        copy = args[1]
    if other is not None:
        device, dtype = other.device, other.dtype
    return None if device is None else _device("ltorch.to", device), dtype, copy


@torchsymbol(Tensor.to)
def to(a, *args, **kwargs):
    device, dtype, copy = _parse_to(args, kwargs)
    out = a
    if dtype is not None and dtype != a.dtype:
        out = prims.convert_element_type(out, dtype)
    if device is not None and not _same_device(a, device):
        out = prims.device_put(out, device)
    return clone(out) if copy and out is a else out


@torchsymbol(Tensor.type_as)
def type_as(a, other):
    return clang.maybe_convert(a, other.dtype)


_TENSOR_TYPES = {
    "FloatTensor": torch.float32, "DoubleTensor": torch.float64, "HalfTensor": torch.float16,
    "BFloat16Tensor": torch.bfloat16, "ByteTensor": torch.uint8, "CharTensor": torch.int8,
    "ShortTensor": torch.int16, "IntTensor": torch.int32, "LongTensor": torch.int64, "BoolTensor": torch.bool,
}


def _type_name(a) -> str:
    name = next((n for n, d in _TENSOR_TYPES.items() if d == a.dtype), None)
    check(name is not None, "ltorch.type", f"no legacy tensor type name for {a.dtype} (argument a)", ThunderNotImplementedError)
    return f"torch.cuda.{name}" if a.device.type == "cuda" else f"torch.{name}"


@torchsymbol(Tensor.type, name="type")
def tensor_type(a, dtype=None, non_blocking=False, **kwargs):
    """``Tensor.type``: the type name without ``dtype``, else a conversion (and device move for cuda types)."""
    if dtype is None:
        return _type_name(a)
    if not isinstance(dtype, (str, torch.dtype)):
        dtype = f"{dtype.__module__}.{dtype.__name__}"
    if isinstance(dtype, torch.dtype):
        return clang.maybe_convert(a, dtype)
    *prefix, name = dtype.split(".")
    check(name in _TENSOR_TYPES and prefix in (["torch"], ["torch", "cuda"]), "ltorch.type",
          f"invalid type: '{dtype}' (argument dtype)", ThunderValueError)
    out = clang.maybe_convert(a, _TENSOR_TYPES[name])
    device = torch.device("cuda" if "cuda" in prefix else "cpu")
    return out if _same_device(a, device) else prims.device_put(out, device)


def _define_conversion(method: str, dtype: torch.dtype):
    @torchsymbol(getattr(Tensor, method), name=method)
    def convert(a, memory_format=torch.preserve_format):
        return clang.maybe_convert(a, dtype)

    return convert


#: ``Tensor.float()`` and friends, by method name. Not module globals: they would shadow builtins.
CONVERSIONS = {
    method: _define_conversion(method, dtype)
    for method, dtype in {
        "float": torch.float32, "double": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16,
        "int": torch.int32, "long": torch.int64, "short": torch.int16, "char": torch.int8, "byte": torch.uint8,
        "bool": torch.bool,
    }.items()
}
