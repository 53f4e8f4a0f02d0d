"""Gathers and scatters along a dim by an index tensor: gather, take_along_dim, scatter_add,
index_add (``indexing``'s index checks; the other scatters and index writes: ``scatter``,
``index_scatter``)."""

import functools

import torch

from thunder_rs import clang, prims
from thunder_rs.errors import (
    ThunderIndexError,
    ThunderNotImplementedError,
    ThunderRuntimeError,
    ThunderTypeError,
    check,
)
from thunder_rs.torch.indexing import _check_index
from thunder_rs.torch.shape import clone, reshape_to, slice_in_dim
from thunder_rs.torch.symbols import ltorch, torchsymbol

Tensor = torch.Tensor
__all__ = ["gather", "take_along_dim", "scatter_add", "index_add", "unscattered"]


def _check_no_larger(op: str, index, a, d: int, what: str):
    bad = next((k for k in range(index.ndim) if k != d and index.shape[k] > a.shape[k]), None)
    check(
        bad is None,
        op,
        lambda: (
            f"Size does not match at dimension {bad} expected index {list(index.shape)} to be no larger than {what} "
            f"{list(a.shape)} apart from dimension {d} (argument index)"
        ),
        ThunderRuntimeError,
    )


@torchsymbol(torch.gather, Tensor.gather)
def gather(a, dim, index, *, sparse_grad=False, out=None):
    op = "ltorch.gather"
    check(out is None, op, "out= is not supported (argument out)", ThunderNotImplementedError)
    d = clang.canonicalize_dim(a.ndim, dim, op)
    check(
        isinstance(index, torch.Tensor),
        op,
        f"expected a tensor for index, got {type(index).__name__} (argument index)",
        ThunderTypeError,
    )
    if index.numel() == 0:  # eager reads nothing and checks nothing else: an empty view of a
        none = slice_in_dim(reshape_to(a, (a.numel(),)), 0, 0, 0)
        return reshape_to(none, tuple(index.shape))
    index = _check_index(op, index, a)
    if a.ndim == 0 and index.ndim <= 1:  # a 0-dim tensor gathers as one of one element
        out = gather(reshape_to(a, (1,)), 0, reshape_to(index, (1,)))
        return reshape_to(out, tuple(index.shape))
    check(
        index.ndim == a.ndim,
        op,
        "Index tensor must have the same number of dimensions as input tensor (argument index)",
        ThunderRuntimeError,
    )
    _check_no_larger(op, index, a, d, "self")
    return prims.gather(a, clang.maybe_convert(index, torch.int64), d)


@torchsymbol(torch.take_along_dim, Tensor.take_along_dim)
def take_along_dim(a, indices, dim=None, *, out=None):
    op = "ltorch.take_along_dim"
    check(out is None, op, "out= is not supported (argument out)", ThunderNotImplementedError)
    check(
        isinstance(indices, torch.Tensor) and indices.dtype == torch.int64,
        op,
        lambda: (
            "torch.take_along_dim(): dtype of indices should be Long but got "
            f"{getattr(indices, 'dtype', type(indices).__name__)} (argument indices)"
        ),
        ThunderRuntimeError,
    )
    indices = _check_index(op, indices, a)
    if dim is None:
        return prims.take_along_axis(reshape_to(a, (a.numel(),)), reshape_to(indices, (indices.numel(),)), 0)
    d = clang.canonicalize_dim(a.ndim, dim, op)
    check(
        indices.ndim == a.ndim,
        op,
        lambda: (
            f"torch.take_along_dim(): input and indices should have the same number of dimensions, but got {a.ndim} "
            f"dimensions for input, and {indices.ndim} dimensions for indices (argument indices)"
        ),
        ThunderRuntimeError,
    )
    if a.ndim == 0:
        return prims.take_along_axis(a, indices, 0)
    if _take_along_dim_wraps() and not _is_zero(a.shape[d]):
        # eager's (newer releases') indices taken modulo the dim's size, which its gather (and
        # its gradient's scatter) is given: the gradient's scatter of -1 raised
        indices = ltorch.remainder(indices, a.shape[d])
    shape = list(clang.broadcast_shapes(op, [*a.shape[:d], indices.shape[d], *a.shape[d + 1 :]], indices.shape))
    a_shape = [*shape[:d], a.shape[d], *shape[d + 1 :]]
    return prims.take_along_axis(clang.expand_to(a, a_shape), clang.expand_to(indices, shape), d)


@functools.cache
def _take_along_dim_wraps() -> bool:
    """Whether the installed torch's ``take_along_dim`` along a dim takes its indices modulo the
    dim's size (2.15 does: ``-1`` is the last, ``size`` the first); older releases raise."""
    try:
        torch.take_along_dim(torch.zeros(1, 2), torch.tensor([[-1]]), 1)
    except (RuntimeError, IndexError):
        return False
    return True


def _is_zero(size) -> bool:
    return type(size) is int and size == 0


def unscattered(input, src):
    """What a scatter by an empty index returns: a copy of ``input``, which in eager still follows
    ``src`` (it requires grad where ``src`` does, whose gradient is zero: a sequence of length 0
    scattered into a buffer). A ``where`` on a false scalar between ``src``'s sum and the copy
    keeps that link and every value of ``input`` as it is."""
    if not isinstance(src, torch.Tensor) or not src.requires_grad or not torch.is_grad_enabled():
        return prims.convert_element_type(input, input.dtype)
    nothing = ltorch.zeros((), dtype=torch.bool, device=input.device)
    row_major = clone(input, memory_format=torch.contiguous_format)  # (as eager's output)
    return ltorch.where(nothing, ltorch.sum(src), row_major)


@torchsymbol(torch.scatter_add, Tensor.scatter_add)
def scatter_add(a, dim, index, src):
    op = "ltorch.scatter_add"
    d = clang.canonicalize_dim(a.ndim, dim, op)
    index = _check_index(op, index, a)
    check(
        isinstance(src, torch.Tensor) and src.dtype == a.dtype,
        op,
        "scatter(): Expected self.dtype to be equal to src.dtype (argument src)",
        ThunderRuntimeError,
    )
    if index.numel() == 0:  # eager checks no shapes against an empty index and adds nothing
        return unscattered(a, src)
    check(
        index.ndim == a.ndim == src.ndim,
        op,
        "Index tensor must have the same number of dimensions as self tensor (argument index)",
        ThunderRuntimeError,
    )
    _check_no_larger(op, index, a, d, "self")
    bad = next((k for k in range(index.ndim) if index.shape[k] > src.shape[k]), None)
    check(
        bad is None,
        op,
        lambda: f"Expected index {list(index.shape)} to be no larger size than src {list(src.shape)} (argument index)",
        ThunderRuntimeError,
    )
    return prims.scatter_add(a, clang.maybe_convert(index, torch.int64), src, d)


@torchsymbol(torch.index_add, Tensor.index_add)
def index_add(a, dim, index, source, *, alpha=1, out=None):
    op = "ltorch.index_add"
    check(out is None, op, "out= is not supported (argument out)", ThunderNotImplementedError)
    d = clang.canonicalize_dim(a.ndim, dim, op)
    index = _check_index(op, index, a, what="int32/int64")
    check(
        index.ndim <= 1,
        op,
        f"index_add_(): Index is supposed to be a vector, but got dim: {index.ndim} (argument index)",
        ThunderIndexError,
    )
    check(
        isinstance(source, torch.Tensor) and source.dtype == a.dtype,
        op,
        lambda: (
            f"index_add_(): self ({a.dtype}) and source ({getattr(source, 'dtype', None)}) must have the same scalar "
            "type (argument source)"
        ),
        ThunderRuntimeError,
    )
    if a.ndim > 0 and source.ndim > 0:
        check(
            source.shape[d] == index.numel(),
            op,
            lambda: (
                f"index_add_(): Number of indices ({index.numel()}) should be equal to source.size(dim): "
                f"({source.shape[d]}), for dim: {d} (argument source)"
            ),
            ThunderRuntimeError,
        )
        same = source.ndim == a.ndim and all(k == d or source.shape[k] == a.shape[k] for k in range(a.ndim))
        check(
            same,
            op,
            lambda: (
                "source tensor shape must match self tensor shape, excluding the specified dimension. "
                f"Got self.shape = {list(a.shape)} source.shape = {list(source.shape)} (argument source)"
            ),
            ThunderRuntimeError,
        )
    if alpha != 1:
        source = clang.maybe_convert(clang.elementwise(prims.mul, op, source, alpha), a.dtype)
    return prims.index_add(a, index, source, d)
