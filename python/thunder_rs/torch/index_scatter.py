"""The index_* writes along one dim: index_reduce, index_copy, index_fill (their dim's positions
given by an index vector; ``scatter``'s ops along that vector widened to the source's shape).
Gradients follow eager's formulas (``index_reduce_backward``, ``index_fill``'s value backward).
"""

import torch

from thunder_rs import clang, prims
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.errors import ThunderIndexError, ThunderRuntimeError, check
from thunder_rs.torch.indexing import _check_index
from thunder_rs.torch.scatter import (
    _as_1d,
    _put_reduced_grads,
    _reduced_grads,
    _written,
    scatter,
    scatter_reduce,
)
from thunder_rs.torch.shape import reshape_to
from thunder_rs.torch.symbols import ltorch, torchsymbol

Tensor = torch.Tensor
__all__ = ["index_reduce", "index_copy", "index_fill"]


def _along(op: str, input, dim, index, source, count_exc=ThunderRuntimeError):
    """(dim, index as a scatter index of ``source``'s shape) for ops that index one dim with a vector."""
    d = clang.canonicalize_dim(input.ndim, dim, op)
    index = _check_index(op, index, input, (torch.int64, torch.int32), "int64 or int32")
    check(
        index.ndim <= 1,
        op,
        f"Index is supposed to be a vector, but got dim: {index.ndim} (argument index)",
        ThunderIndexError,
    )
    if source.ndim:
        check(
            source.ndim == input.ndim,
            op,
            lambda: (
                f"source and self must have the same number of dimensions, got {source.ndim} and {input.ndim} "
                "(argument source)"
            ),
            ThunderRuntimeError,
        )
        check(
            source.shape[d] == index.numel(),
            op,
            lambda: (
                f"Number of indices ({index.numel()}) should be equal to source.size(dim) ({source.shape[d]}) "
                "(argument index)"
            ),
            count_exc,
        )
        same = all(k == d or source.shape[k] == input.shape[k] for k in range(input.ndim))
        check(
            same,
            op,
            lambda: (
                "source tensor shape must match self tensor shape, excluding the specified dimension. "
                f"Got self.shape = {list(input.shape)} source.shape = {list(source.shape)} (argument source)"
            ),
            ThunderRuntimeError,
        )
    else:
        check(
            index.numel() == 1,
            op,
            f"Number of indices ({index.numel()}) should be equal to source.size(dim) (1) (argument index)",
            count_exc,
        )
    shape = tuple(source.shape) if source.ndim else (1,)
    wide = prims.broadcast_in_dim(
        reshape_to(clang.maybe_convert(index, torch.int64), (index.numel(),)), shape, (d if input.ndim else 0,)
    )
    wrapped = prims.where(prims.lt(wide, 0), prims.add(wide, input.shape[d] if input.ndim else 1), wide)
    return d, wrapped


@torchsymbol(torch.index_copy, Tensor.index_copy)
def index_copy(input, dim, index, source):
    op = "ltorch.index_copy"
    check(
        source.dtype == input.dtype,
        op,
        f"index_copy_(): self and source expected to have the same dtype, but got "
        f"(self) {input.dtype} and (source) {source.dtype} (argument source)",
        ThunderRuntimeError,
    )
    d, wide = _along(op, input, dim, index, source, ThunderIndexError)
    a, src = _as_1d(input, source)
    return reshape_to(_written(a, d, wide, src), tuple(input.shape))


@torchsymbol(torch.index_reduce, Tensor.index_reduce)
def index_reduce(input, dim, index, source, reduce, *, include_self=True):
    op = "ltorch.index_reduce"
    check(
        reduce in ("prod", "mean", "amax", "amin"),
        op,
        f"index_reduce(): Expected reduce to be one of prod, mean, amax or amin but got {reduce}. (argument reduce)",
        ThunderRuntimeError,
    )
    check(
        source.dtype == input.dtype,
        op,
        f"index_reduce_(): self ({input.dtype}) and source ({source.dtype}) must "
        "have the same scalar type (argument source)",
        ThunderRuntimeError,
    )
    d, wide = _along(op, input, dim, index, source)
    a, src = _as_1d(input, source)
    return reshape_to(scatter_reduce(a, d, wide, src, reduce, include_self=include_self), tuple(input.shape))


@register_grad(index_reduce)
def _index_reduce_grad(input, dim, index, source, reduce, *, include_self=True):
    """scatter_reduce's along the index widened to ``source``'s shape; eager clears the excluded
    input's gradient by ``index_fill``, which keeps its layout."""
    out = index_reduce(input, dim, index, source, reduce, include_self=include_self)
    if not out.dtype.is_floating_point or input.ndim == 0 or index.numel() == 0:
        return out
    d, wide = _along("ltorch.index_reduce", input, dim, index, source)
    g = get_grad(out)
    # eager's products in the backward are ``index_reduce``'s too (``scatter_reduce``'s kernel
    # rounds a bfloat16 product otherwise: ulps in the input's gradient)
    product = lambda a, s: index_reduce(a, dim, index, s, "prod", include_self=include_self)  # noqa: E731
    grad_self, grad_src = _reduced_grads(g, input, d, wide, source, out, reduce, include_self, product)
    if not include_self:
        grad_self = scatter(grad_self, d, wide, value=0)
    _put_reduced_grads(input, source, grad_self, grad_src)
    return out


@torchsymbol(torch.index_fill, Tensor.index_fill)
def index_fill(input, dim, index, value):
    op = "ltorch.index_fill"
    d = clang.canonicalize_dim(input.ndim, dim, op)
    index = _check_index(op, index, input, (torch.int64,), "int64")
    check(index.ndim <= 1, op, "Index has to be a vector/scalar (argument index)", ThunderIndexError)
    if isinstance(value, torch.Tensor):
        check(
            value.ndim == 0,
            op,
            f"only supports a 0-dimensional value tensor, but got tensor with {value.ndim} "
            "dimension(s). (argument value)",
            ThunderRuntimeError,
        )
    return ltorch.where(_filled(input, d, index), clang.maybe_convert(value, input.dtype), input)


def _filled(input, d: int, index):
    """Where ``index_fill`` along ``d`` writes: a bool mask of ``input``'s shape."""
    n = input.shape[d] if input.ndim else 1
    flat = reshape_to(index, (index.numel(),))
    flat = prims.where(prims.lt(flat, 0), prims.add(flat, n), flat)
    hits = prims.index_add(
        prims.full((n,), 0, input.device, torch.int64),
        flat,
        prims.full((index.numel(),), 1, input.device, torch.int64),
        0,
    )
    hit = prims.gt(hits, 0)
    return prims.broadcast_in_dim(hit, tuple(input.shape), (d,)) if input.ndim else reshape_to(hit, ())


@torchsymbol(name="index_fill_value_backward")
def index_fill_value_backward(grad, dim: int, index):
    """Eager's gradient of ``index_fill``'s value tensor, ``grad.index_select(dim,
    _unique(index)).sum()``, which the torch executor runs (``TORCH_IMPLS``): a sum of the
    selected slices in the index's sorted order (a negative index raises there, as in eager's
    backward). The decomposition sums the filled elements where they lie (an ulp off)."""
    return ltorch.sum(ltorch.where(_filled(grad, dim, index), grad, 0))


@register_grad(index_fill)
def index_fill_grad(input, dim, index, value):
    """Eager's: ``grad.index_fill(dim, index, 0)`` for the input, ``index_fill_value_backward``
    for a value tensor (converted to its dtype). A number value too: the forward stays one
    ``index_fill`` call, which checks the index as eager's does (in the decomposition an index
    out of range raised from its inner ``index_add``, naming neither the op nor its dim)."""
    out = index_fill(input, dim, index, value)
    value_grad = isinstance(value, TensorProxy) and value.requires_grad
    if not ((input.requires_grad or value_grad) and out.dtype.is_floating_point):
        return out
    d = clang.canonicalize_dim(input.ndim, dim, "ltorch.index_fill")
    g = get_grad(out)
    if input.requires_grad:
        put_grad(input, index_fill(g, d, index, 0))
    if value_grad:
        put_grad(value, clang.maybe_convert(index_fill_value_backward(g, d, index), value.dtype))
    return out


#: The aten calls the torch executor runs for the backward kernels.
TORCH_IMPLS = {
    index_fill_value_backward: lambda g, dim, index: g.index_select(dim, torch._unique(index, sorted=False)[0]).sum()
}
