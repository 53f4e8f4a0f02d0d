"""Shape ops that rearrange one tensor: views (reshape, permute, expand, squeeze) and reordering
(flip, roll). Joining, splitting and padding are in ``joins.py``; dtype and device moves in
``conversions.py``.

Every op here is a composite of the shape prims (reshape, transpose, broadcast_in_dim, slice,
squeeze, cat, flip). An op that leaves its input as it is returns the input itself, so its
composite dissolves from the trace. Shape arguments follow torch: varargs or one sequence, and
a single -1 stands for the inferred size.
"""

import math
import warnings

import torch

from thunder_rs import clang, prims
from thunder_rs.core.base.proxies import numel_of
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.errors import (
    ThunderIndexError,
    ThunderNotImplementedError,
    ThunderRuntimeError,
    ThunderTypeError,
    check,
)
from thunder_rs.torch.common import is_int
from thunder_rs.torch.symbols import torchsymbol
from thunder_rs.core.lang.symint import SymInt, identical, same_shape

Tensor = torch.Tensor
__all__ = [
    "reshape",
    "view",
    "view_as",
    "reshape_as",
    "permute",
    "transpose",
    "swapaxes",
    "t",
    "T",
    "mT",
    "contiguous",
    "clone",
    "alias",
    "expand",
    "expand_as",
    "broadcast_to",
    "unsqueeze",
    "squeeze",
    "flatten",
    "ravel",
    "unflatten",
    "movedim",
    "flip",
    "roll",
    "atleast_1d",
    "atleast_2d",
]


# -- helpers ------------------------------------------------------------------------------------


def _sizes(op: str, args, arg: str = "shape") -> tuple[int, ...]:
    """Sizes given as varargs (``view(2, 3)``) or as one sequence (``view((2, 3))``)."""
    if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)):
        args = tuple(args[0])
    for s in args:
        check(
            is_int(s),
            op,
            lambda: f"expected a sequence of ints for {arg}, got {list(args)!r} (argument {arg})",
            ThunderTypeError,
        )
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
        check(
            s >= -1,
            op,
            f"invalid shape dimension {s} at index {i} of shape {shape} (argument shape)",
            ThunderRuntimeError,
        )
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        check(
            known != 0,
            op,
            lambda: (
                f"cannot reshape tensor of 0 elements into shape {shape} because the unspecified dimension "
                "size -1 can be any value and is ambiguous (argument shape)"
            ),
            ThunderRuntimeError,
        )
        check(
            numel % known == 0,
            op,
            f"shape '{shape}' is invalid for input of size {numel} (argument shape)",
            ThunderRuntimeError,
        )
        shape[shape.index(-1)] = numel // known
    check(
        math.prod(shape) == numel,
        op,
        f"shape '{shape}' is invalid for input of size {numel} (argument shape)",
        ThunderRuntimeError,
    )
    return tuple(shape)


def reshape_to(a, shape):
    """``a`` with ``shape`` (same number of elements); ``a`` itself when it has it already."""
    shape = tuple(shape)
    return a if same_shape(a.shape, shape) else prims.reshape(a, shape)


def slice_in_dim(a, dim: int, start: int, stop: int, step: int = 1):
    """``a[..., start:stop:step, ...]`` along canonical ``dim`` with in-range bounds (compared as
    data: a symbolic bound that may be the whole dim's slices, with no guard)."""
    if identical(start, 0) and identical(stop, a.shape[dim]) and identical(step, 1):
        return a
    starts, stops, steps = [0] * a.ndim, list(a.shape), [1] * a.ndim
    # (a slice prim's step is a number: one from a symbolic size is specialised)
    starts[dim], stops[dim], steps[dim] = start, stop, int(step)
    return prims.slice(a, starts, stops, steps)


def every_step(a, dim: int, start, count, step):
    """The ``count`` (> 0) elements at ``start``, ``start + step``, ... along canonical ``dim``,
    where ``step`` may be a symbolic size (a diagonal's ``cols + 1``), which a slice prim's step
    cannot be: the ``(count - 1) * step`` elements from ``start`` as ``count - 1`` rows of
    ``step``, their first column, then the last element."""
    if type(step) is not SymInt:
        return slice_in_dim(a, dim, start, start + (count - 1) * step + 1, step)
    last = start + (count - 1) * step
    before, after = tuple(a.shape[:dim]), tuple(a.shape[dim + 1 :])
    rows = reshape_to(slice_in_dim(a, dim, start, last), (*before, count - 1, step, *after))
    firsts = reshape_to(slice_in_dim(rows, dim + 1, 0, 1), (*before, count - 1, *after))
    return prims.cat([firsts, slice_in_dim(a, dim, last, last + 1)], dim)


def _permute_to(a, perm):
    perm = tuple(perm)
    return a if perm == tuple(range(a.ndim)) else prims.transpose(a, perm)


def _unique_dims(op: str, ndim: int, dims, arg: str = "dim") -> tuple[int, ...]:
    """Canonical dims; a repeated dim is a RuntimeError, as torch raises it."""
    out = tuple(clang.canonicalize_dim(ndim, d, op, arg) for d in dims)
    dup = next((d for i, d in enumerate(out) if d in out[:i]), None)
    check(
        dup is None, op, f"dim {dup} appears multiple times in the list of dims (argument {arg})", ThunderRuntimeError
    )
    return out


# -- views ----------------------------------------------------------------------------------------


@torchsymbol(Tensor.reshape, torch.reshape, reads_numbers_from=1)
def reshape(a, *args, shape=None):
    shape = _one_of("ltorch.reshape", args, shape, "shape")
    return reshape_to(a, infer_shape("ltorch.reshape", shape, numel_of(a)))


# The torch executor runs the view symbols as reshapes: ``contiguous()`` dissolves from traces, so
# the tensor a view receives may be strided where eager's was contiguous, and a trace has no
# aliasing for a view to preserve.
def _view_as_reshape(a, *args, size=None, dtype=None):
    return a.reshape(*args) if size is None else a.reshape(size)


def _view_as_as_reshape_as(a, other):
    return a.reshape_as(other)


@torchsymbol(_view_as_reshape, Tensor.view, reads_numbers_from=1)
def view(a, *args, size=None, dtype=None):
    if dtype is not None or (len(args) == 1 and isinstance(args[0], torch.dtype)):
        raise ThunderNotImplementedError(
            "ltorch.view: reinterpreting a tensor's bytes as another dtype (Tensor.view(dtype)) is not supported "
            "(argument dtype)"
        )
    shape = _one_of("ltorch.view", args, size, "size")
    return reshape_to(a, infer_shape("ltorch.view", shape, numel_of(a)))


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
    check(
        start <= end,
        op,
        "flatten() has invalid args: start_dim cannot come after end_dim (argument start_dim)",
        ThunderRuntimeError,
    )
    if a.ndim == 0:
        return reshape_to(a, (1,))
    shape = (*a.shape[:start], math.prod(a.shape[start : end + 1]), *a.shape[end + 1 :])
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
    check(
        fits,
        op,
        lambda: (
            f"unflatten: Provided sizes {list(sizes)} don't multiply up to the size of dim {dim} "
            f"({a.shape[d]}) in the input tensor (argument sizes)"
        ),
        ThunderRuntimeError,
    )
    sizes = infer_shape(op, sizes, a.shape[d])
    return reshape_to(a, (*a.shape[:d], *sizes, *a.shape[d + 1 :]))


@torchsymbol(Tensor.permute, torch.permute)
def permute(a, *args, dims=None):
    op = "ltorch.permute"
    dims = _one_of(op, args, dims, "dims")
    check(
        len(dims) == a.ndim,
        op,
        lambda: (
            "number of dimensions in the tensor input does not match the length of the desired ordering of "
            f"dimensions i.e. input.dim() = {a.ndim} is not equal to len(dims) = {len(dims)} (argument dims)"
        ),
        ThunderRuntimeError,
    )
    perm = tuple(clang.canonicalize_dim(a.ndim, d, op, "dims") for d in dims)
    check(
        len(set(perm)) == len(perm),
        op,
        "permute(): duplicate dims are not allowed. (argument dims)",
        ThunderRuntimeError,
    )
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
    check(
        a.ndim <= 2,
        "ltorch.t",
        f"t() expects a tensor with <= 2 dimensions, but self is {a.ndim}D (argument a)",
        ThunderRuntimeError,
    )
    return transpose(a, 0, 1) if a.ndim == 2 else a


@torchsymbol(properties=("T",))
def T(a):
    if a.ndim not in (0, 2):
        warnings.warn(
            "The use of `x.T` on tensors of dimension other than 2 to reverse their shape is deprecated and "
            "it will throw an error in a future release. Consider `x.mT` to transpose batches of matrices "
            "or `x.permute(*torch.arange(x.ndim - 1, -1, -1))` to reverse the dimensions of a tensor.",
            UserWarning,
            stacklevel=2,
        )
    return _permute_to(a, range(a.ndim - 1, -1, -1))


@torchsymbol(properties=("mT",))
def mT(a):
    check(
        a.ndim >= 2,
        "ltorch.mT",
        f"tensor.mT is only supported on matrices or batches of matrices. Got {a.ndim}-D tensor.",
        ThunderRuntimeError,
    )
    return transpose(a, -2, -1)


@torchsymbol(torch.movedim, Tensor.movedim, torch.moveaxis, Tensor.moveaxis)
def movedim(a, source, destination):
    op = "ltorch.movedim"
    source = (source,) if isinstance(source, int) else tuple(source)
    destination = (destination,) if isinstance(destination, int) else tuple(destination)
    check(
        len(source) == len(destination),
        op,
        lambda: (
            f"movedim: Invalid source or destination dims: source ({list(source)} dims) should contain the same number "
            f"of dims as destination ({list(destination)} dims)"
        ),
        ThunderRuntimeError,
    )
    src = tuple(clang.canonicalize_dim(a.ndim, d, op, "source") for d in source)
    dst = tuple(clang.canonicalize_dim(a.ndim, d, op, "destination") for d in destination)
    for name, dims in (("source", src), ("destination", dst)):
        check(
            len(set(dims)) == len(dims),
            op,
            f"movedim: repeated dim in `{name}` ({list(dims)}) (argument {name})",
            ThunderRuntimeError,
        )
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


@torchsymbol(torch.ops.aten.alias.default, torch.ops.aten.alias, name="alias")
def alias(a):
    """``aten.alias``: a view of ``a`` with its shape and strides (``view_ops`` links it to ``a``,
    so that a write through either is seen by the other, as in eager)."""
    return prims.reshape(a, tuple(a.shape))


@torchsymbol(torch.clone, Tensor.clone)
def clone(a, *, memory_format=torch.preserve_format):
    # A copy is a conversion to the same dtype: a fresh value that later ops may not alias.
    return prims.convert_element_type(a, a.dtype)


# -- broadcasting and size-1 dims -----------------------------------------------------------------


def _expand(op: str, a, sizes):
    check(
        len(sizes) >= a.ndim,
        op,
        lambda: (
            f"the number of sizes provided ({len(sizes)}) must be greater or equal to the number of dimensions in the "
            f"tensor ({a.ndim}) (argument size)"
        ),
        ThunderRuntimeError,
    )
    lead = len(sizes) - a.ndim
    shape = []
    for i, size in enumerate(sizes):
        if i < lead:
            check(
                size >= 0,
                op,
                f"The expanded size of the tensor ({size}) isn't allowed in a leading, non-existing dimension {i} "
                "(argument size)",
                ThunderRuntimeError,
            )
            shape.append(size)
            continue
        have = a.shape[i - lead]
        size = have if size == -1 else size
        check(
            size == have or have == 1,
            op,
            lambda: (
                f"The expanded size of the tensor ({sizes[i]}) must match the existing size ({have}) at non-singleton "
                f"dimension {i}.  Target sizes: {list(sizes)}.  Tensor sizes: {list(a.shape)} (argument size)"
            ),
            ThunderRuntimeError,
        )
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


# -- reordering -----------------------------------------------------------------------------------


@torchsymbol(Tensor.flip, torch.flip)
def flip(a, *args, dims=None):
    op = "ltorch.flip"
    dims = _unique_dims(op, a.ndim, _one_of(op, args, dims, "dims"), "dims")
    dims = tuple(d for d in dims if a.ndim > 0 and a.shape[d] > 1)
    # Nothing to reverse is still eager's new tensor, made here: returned as ``a``, the copy the
    # output needs came at the trace's end, and its gradient reached ``a`` first in the backward,
    # where eager's engine adds it in at the flip's place (``_kept``).
    return prims.flip(a, dims) if dims else _kept(a)


@torchsymbol(torch.roll, Tensor.roll)
def roll(a, shifts, dims=None):
    op = "ltorch.roll"
    shifts = (shifts,) if is_int(shifts) else tuple(shifts)
    check(len(shifts) > 0, op, "`shifts` required (argument shifts)", ThunderRuntimeError)
    if dims is None:
        check(
            len(shifts) == 1,
            op,
            f"shifts and dimensions must align. shifts: {len(shifts)}, dims:0 (argument dims)",
            ThunderRuntimeError,
        )
        return reshape_to(roll(flatten(a), shifts, 0), a.shape)
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    check(
        len(shifts) == len(dims),
        op,
        f"shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)} (argument dims)",
        ThunderRuntimeError,
    )
    check(a.ndim > 0, op, "Dimension specified as 0 but tensor has no dimensions (argument dims)", ThunderIndexError)
    out = a
    for shift, dim in zip(shifts, dims):
        d = clang.canonicalize_dim(a.ndim, dim, op, "dims")
        size = a.shape[d]
        if type(size) is int and size == 0:
            continue
        # A symbolic shift or size gives a symbolic remainder (or one whose quotient is guarded),
        # not compared with 0: a cut at the size is an empty slice and the whole.
        rest = shift % size
        if type(rest) is int and rest == 0:
            continue
        cut = size - rest
        out = prims.cat([slice_in_dim(out, d, cut, size), slice_in_dim(out, d, 0, cut)], d)
    return _kept(out) if out is a else out


def _kept(a):
    """A new tensor of ``a``'s values, recorded where the op that keeps them all in place is called
    (a flip or roll of length 1): eager's node for it, whose gradient its engine adds to ``a``'s
    others in the order of the ops that made them (several uses of one input at length 1 add up
    as eager's do)."""
    return prims.convert_element_type(a, a.dtype)


# -- sizes as aten reads them (Dynamo's graphs: ``torch.ops.aten.sym_size.int(t, 0)``) -------------


def _sym_size(a, dim=None):
    """A size of ``a`` as its proxy holds it (symbolic where it is): not a value read."""
    return a.shape if dim is None else a.shape[clang.canonicalize_dim(a.ndim, dim, "aten.sym_size")]


TORCH_TO_LTORCH[torch.ops.aten.sym_size.int] = _sym_size
TORCH_TO_LTORCH[torch.ops.aten.sym_size.default] = _sym_size
TORCH_TO_LTORCH[torch.ops.aten.sym_numel.default] = lambda a: math.prod(a.shape)
