"""Scatters and index writes: scatter (src and value forms, ``reduce=``), scatter_reduce,
index_put, put, take and fill (index_reduce, index_copy and index_fill: ``index_scatter``).

Writing ``src`` at indexed positions is a scatter-add into zeros, kept where some index points
(a count scattered the same way), the input elsewhere; its gradient is the VJP of those prims,
as eager's. Sums and means are scatter-adds. Products and extrema scatter through a dense
comparison of each index with every position of its dim (index elements x dim size), reduced
over the index's dim: the torch executor runs these ops whole, and their gradients follow
eager's formulas (a grad rule), so the dense form is only a decomposition for other executors.
Index values are data: out-of-range ones raise eager's error when the op runs.
"""

import math

import torch

from thunder_rs import clang, prims
from thunder_rs.torch.symbols import ltorch
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.errors import (
    ThunderIndexError,
    ThunderNotImplementedError,
    ThunderRuntimeError,
    ThunderTypeError,
    check,
)
from thunder_rs.torch.symbols import torchsymbol
from thunder_rs.torch.gathers import _check_no_larger, unscattered
from thunder_rs.torch.indexing import _check_index
from thunder_rs.torch.shape import reshape_to
from thunder_rs.core.lang.symint import SymInt, same_shape
from thunder_rs.torch.common import flows, size_value, sum_to

Tensor = torch.Tensor
__all__ = [
    "scatter",
    "scatter_reduce",
    "index_put",
    "put",
    "take",
    "fill",
    "masked_scatter",
]

_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")
#: Names eager's scatter_reduce also accepts.
_ALIASES = {"max": "amax", "min": "amin"}


# -- dense scatter helpers ---------------------------------------------------------------------------


def _identity(reduce: str, dtype):
    if reduce in ("sum", "mean"):
        return clang.maybe_convert(0, dtype)
    if reduce == "prod":
        return clang.maybe_convert(1, dtype)
    if dtype.is_floating_point:
        return -math.inf if reduce == "amax" else math.inf
    info = torch.iinfo(dtype)
    return info.min if reduce == "amax" else info.max


def _sliced_to(src, shape):
    if same_shape(src.shape, shape):
        return src
    return prims.slice(src, (0,) * src.ndim, tuple(shape), (1,) * src.ndim)


def _one_hot(index, d: int, n: int):
    """index[..., None] == arange(n): where each index element points along a dim of size ``n``."""
    shape = (*index.shape, n)
    wide = prims.broadcast_in_dim(index, shape, tuple(range(index.ndim)))
    positions = prims.broadcast_in_dim(prims.iota(n, 0, 1, index.device, torch.int64), shape, (index.ndim,))
    return prims.eq(wide, positions)


def _placed(reduced, d: int, like_shape, fill):
    """``reduced`` (the index's shape without ``d``, then the dim of size n) with n moved to
    ``d`` and every other dim padded with ``fill`` to ``like_shape``."""
    ndim = reduced.ndim
    perm = tuple(range(d)) + (ndim - 1,) + tuple(range(d, ndim - 1))
    moved = prims.transpose(reduced, perm) if perm != tuple(range(ndim)) else reduced
    config = tuple((0, like_shape[k] - moved.shape[k], 0) for k in range(ndim))
    return moved if all(c == (0, 0, 0) for c in config) else prims.pad(moved, fill, config)


_DENSE = {"prod": prims.prod, "amax": prims.amax, "amin": prims.amin}


def _counts(input, d: int, index):
    """How many index elements point at each position of ``input`` (int64, ``input``'s shape)."""
    ones = prims.full(tuple(index.shape), 1, index.device, torch.int64)
    zeros = prims.full(tuple(input.shape), 0, input.device, torch.int64)
    return prims.scatter_add(zeros, index, ones, d)


def _scatter_reduced(input, d: int, index, src, reduce: str, include_self: bool):
    """``input`` with the ``src`` elements ``index`` points at each position reduced into it."""
    src = _sliced_to(clang.maybe_convert(src, input.dtype), index.shape)
    counts = _counts(input, d, index)
    covered = prims.gt(counts, 0)
    if reduce in ("sum", "mean"):
        base = input if include_self else prims.where(covered, clang.maybe_convert(0, input.dtype), input)
        total = prims.scatter_add(base, index, src, d)
        if reduce == "sum":
            return total
        n = prims.add(counts, 1) if include_self else prims.where(covered, counts, 1)
        n = prims.convert_element_type(n, input.dtype)
        mean = ltorch.div(total, n, rounding_mode=None if input.dtype.is_floating_point else "floor")
        return prims.where(covered, mean, input)
    ident = _identity(reduce, input.dtype)
    hot = _one_hot(index, d, input.shape[d] if input.ndim else 1)
    spread = prims.broadcast_in_dim(src, tuple(hot.shape), tuple(range(src.ndim)))
    values = prims.where(hot, spread, clang.maybe_convert(ident, input.dtype))
    reduced = _placed(_DENSE[reduce](values, (d,)), d, tuple(input.shape), ident)
    if include_self:
        combine = {"prod": prims.mul, "amax": prims.maximum, "amin": prims.minimum}[reduce]
        reduced = combine(reduced, input)
    return prims.where(covered, reduced, input)


def _written(input, d: int, index, src):
    """``input`` with ``src`` written where ``index`` points (one of the written values where
    indices repeat, as eager leaves it undefined which; all of them get the gradient there)."""
    return prims.scatter(input, index, _sliced_to(clang.maybe_convert(src, input.dtype), index.shape), d)


# -- scatter and scatter_reduce ----------------------------------------------------------------------


def _scatter_index_dtypes() -> tuple[tuple, str]:
    """int64, and int32 where the installed torch's scatters take it (newer releases do)."""
    try:
        torch.zeros(1).scatter(0, torch.zeros(1, dtype=torch.int32), 1.0)
    except RuntimeError:
        return (torch.int64,), "int64"
    return (torch.int64, torch.int32), "int64 or int32"


_SCATTER_INDEX_DTYPES, _SCATTER_INDEX_WHAT = _scatter_index_dtypes()


def _check_scatter(op: str, input, dim, index, src):
    d = clang.canonicalize_dim(input.ndim, dim, op)
    index = clang.maybe_convert(_check_index(op, index, input, _SCATTER_INDEX_DTYPES, _SCATTER_INDEX_WHAT), torch.int64)
    check(
        not isinstance(src, torch.Tensor) or src.dtype == input.dtype,
        op,
        "Expected self.dtype to be equal to src.dtype (argument src)",
        ThunderRuntimeError,
    )
    if index.numel() == 0:  # eager checks no shapes against an empty index (scatter_shape_check)
        return d, index
    check(
        index.ndim == input.ndim or (index.ndim <= 1 and input.ndim <= 1),
        op,
        "Index tensor must have the same number of dimensions as self tensor (argument index)",
        ThunderRuntimeError,
    )
    if isinstance(src, torch.Tensor):
        check(
            src.ndim == index.ndim or (index.ndim <= 1 and src.ndim <= 1),
            op,
            "Index tensor must have the same number of dimensions as src tensor (argument src)",
            ThunderRuntimeError,
        )
        bad = next((k for k in range(index.ndim) if index.shape[k] > src.shape[k]), None)
        check(
            bad is None,
            op,
            lambda: (
                f"Expected index {list(index.shape)} to be no larger size than src {list(src.shape)} (argument index)"
            ),
            ThunderRuntimeError,
        )
    _check_no_larger(op, index, input, d, "self")
    return d, index


def _as_1d(*tensors):
    """0-d operands of a scatter as 1-d ones (torch treats them so)."""
    return [reshape_to(t, (1,)) if isinstance(t, torch.Tensor) and t.ndim == 0 else t for t in tensors]


@torchsymbol(torch.scatter, Tensor.scatter)
def scatter(input, dim, index, src=None, value=None, *, reduce=None):
    op = "ltorch.scatter"
    src = value if src is None else src
    check(src is not None, op, "expected a src tensor or a value (argument src)", ThunderTypeError)
    d, index = _check_scatter(op, input, dim, index, src)
    check(
        reduce in (None, "add", "multiply"),
        op,
        f"reduce argument must be either add or multiply, got {reduce} (argument reduce)",
        ThunderRuntimeError,
    )
    # Eager has no derivative for scatter with reduce= (its backward raises): refused rather than
    # differentiated, as scatter_reduce, which has one, is not.
    wants_grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (input, src))
    check(
        reduce is None or not wants_grad,
        op,
        "the derivative of scatter with reduce= is not implemented (in torch "
        "either); use scatter_reduce, or detach the inputs (argument reduce)",
        ThunderNotImplementedError,
    )
    if type(src) is SymInt:  # a size: read on each call
        src = clang.expand_to(size_value(input.device, input.dtype, src), tuple(index.shape))
    elif not isinstance(src, torch.Tensor):
        src = prims.full(tuple(index.shape), clang.maybe_convert(src, input.dtype), input.device, input.dtype)
    if index.numel() == 0:
        return unscattered(input, src)
    a, index_, src_ = _as_1d(input, index, src)
    if reduce is None:
        out = _written(a, d, index_, src_)
    else:
        out = _scatter_reduced(a, d, index_, src_, "sum" if reduce == "add" else "prod", True)
    return reshape_to(out, tuple(input.shape))


@torchsymbol(torch.scatter_reduce, Tensor.scatter_reduce)
def scatter_reduce(input, dim, index, src, reduce, *, include_self=True):
    op = "ltorch.scatter_reduce"
    d, index = _check_scatter(op, input, dim, index, src)
    reduce = _ALIASES.get(reduce, reduce)
    check(
        reduce in _REDUCTIONS,
        op,
        f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce} (argument reduce)",
        ThunderRuntimeError,
    )
    check(
        input.dtype != torch.bool,
        op,
        "\"scatter_reduce\" is not implemented for 'Bool' (argument input)",
        ThunderNotImplementedError,
    )
    if index.numel() == 0:
        return unscattered(input, src)
    a, index_, src_ = _as_1d(input, index, src)
    return reshape_to(_scatter_reduced(a, d, index_, src_, reduce, include_self), tuple(input.shape))


def _padded_to(grad, shape):
    """The gradient of a ``src`` larger than its index: zero past the index."""
    if same_shape(grad.shape, shape):
        return grad
    return prims.pad(grad, 0.0, tuple((0, s - i, 0) for s, i in zip(shape, grad.shape)))


def _extremum_grads(g, input, d, index, src, out):
    """Eager's amax/amin backward: the gradient is shared evenly by every element equal to the result."""
    value = ltorch.gather(out, d, index)
    self_is = ltorch.eq(input, out)
    src_is = ltorch.eq(_sliced_to(src, index.shape), value)
    n = ltorch.scatter_add(clang.maybe_convert(self_is, g.dtype), d, index, clang.maybe_convert(src_is, g.dtype))
    share = ltorch.div(g, n)
    return ltorch.where(self_is, share, 0.0), ltorch.where(src_is, ltorch.gather(share, d, index), 0.0)


def _prod_grads(g, input, d, index, src, out, include_self, product=None):
    """Eager's prod backward: products without each element, exact where elements are zero.
    ``product(self, src)``: the op's own product of ``src`` into ``self`` (``index_reduce``'s
    kernel rounds a bfloat16 product otherwise than ``scatter_reduce``'s); ``scatter_reduce``'s
    along ``index`` when None."""
    src_ = _sliced_to(src, index.shape)
    if product is None:
        product = lambda a, s: scatter_reduce(a, d, index, s, "prod", include_self=include_self)  # noqa: E731
    masked_self = ltorch.masked_fill(input, ltorch.eq(input, 0), 1)
    masked_self_result = product(masked_self, src_)
    grad_self = ltorch.div(ltorch.mul(g, masked_self_result), masked_self)
    src_zero = ltorch.eq(src_, 0)
    zeros = ltorch.scatter_add(ltorch.zeros_like(input), d, index, clang.maybe_convert(src_zero, input.dtype))
    single_zero = ltorch.bitwise_and(src_zero, ltorch.eq(ltorch.gather(zeros, d, index), 1))
    masked_src_result = product(input, ltorch.masked_fill(src_, single_zero, 1))
    grad_src = ltorch.where(
        single_zero,
        ltorch.gather(ltorch.mul(g, masked_src_result), d, index),
        ltorch.div(ltorch.gather(ltorch.mul(g, out), d, index), ltorch.masked_fill(src_, src_zero, 1)),
    )
    return grad_self, grad_src


def _reduced_grads(g, input, d, index, src, out, reduce, include_self, product=None):
    """Eager's ``scatter_reduce_backward`` (and ``index_reduce_backward`` along a wide index)
    before the positions written are cleared from the input's gradient where it is excluded
    (``product``: ``_prod_grads``')."""
    if reduce == "sum":
        return g, ltorch.gather(g, d, index)
    if reduce == "mean":
        n = ltorch.scatter_add(
            ltorch.ones_like(g) if include_self else ltorch.zeros_like(g),
            d,
            index,
            ltorch.ones_like(_sliced_to(src, index.shape)),
        )
        n = ltorch.masked_fill(n, ltorch.eq(n, 0), 1)
        return ltorch.div(g, n), ltorch.div(ltorch.gather(g, d, index), ltorch.gather(n, d, index))
    if reduce == "prod":
        return _prod_grads(g, input, d, index, src, out, include_self, product)
    return _extremum_grads(g, input, d, index, src, out)


def _put_reduced_grads(input, src, grad_self, grad_src) -> None:
    if input.requires_grad:
        put_grad(input, grad_self)
    if src.requires_grad:
        put_grad(src, _padded_to(grad_src, src.shape))


@register_grad(scatter_reduce)
def _scatter_reduce_grad(input, dim, index, src, reduce, *, include_self=True):
    out = scatter_reduce(input, dim, index, src, reduce, include_self=include_self)
    if out.dtype.is_floating_point and index.numel() == 0:  # nothing scattered: a copy of the input
        _put_reduced_grads(input, src, get_grad(out), ltorch.zeros_like(src))
        return out
    if not out.dtype.is_floating_point or input.ndim == 0:
        return out
    d = clang.canonicalize_dim(input.ndim, dim, "ltorch.scatter_reduce")
    g = get_grad(out)
    grad_self, grad_src = _reduced_grads(g, input, d, index, src, out, _ALIASES.get(reduce, reduce), include_self)
    if not include_self:
        # eager's ``grad_self.scatter(dim, index, 0)``, a new contiguous tensor: zeros where a new
        # contiguous mask of the written positions holds (scattered into in place, ``grad_self``
        # kept the layout of the input it was computed from)
        written = scatter(ltorch.zeros(tuple(input.shape), dtype=torch.bool, device=input.device), d, index, value=True)
        grad_self = ltorch.where(written, 0.0, grad_self)
    _put_reduced_grads(input, src, grad_self, grad_src)
    return out


# -- flat indexing ---------------------------------------------------------------------------------


def _flat_index(op: str, input, index):
    index = _check_index(op, index, input, (torch.int64,), "int64")
    flat = reshape_to(index, (index.numel(),))
    return prims.where(prims.lt(flat, 0), prims.add(flat, input.numel()), flat)


@torchsymbol(torch.take, Tensor.take)
def take(input, index):
    op = "ltorch.take"
    flat = _flat_index(op, input, index)
    check(
        input.numel() > 0 or index.numel() == 0,
        op,
        "cannot do a non-empty take from an empty axes. (argument index)",
        ThunderIndexError,
    )
    return reshape_to(prims.take(reshape_to(input, (input.numel(),)), flat, 0), tuple(index.shape))


@register_grad(take)
def take_grad(input, index):
    """Eager's ``take_backward``: the cotangent put (accumulated) into ``zeros_like(input)``, so
    that the gradient takes the input's layout."""
    out = take(input, index)
    if input.dtype.is_floating_point:
        put_grad(input, torch.zeros_like(input).put(index, get_grad(out), accumulate=True))
    return out


@torchsymbol(torch.put, Tensor.put)
def put(input, index, source, accumulate=False):
    op = "ltorch.put"
    check(
        source.dtype == input.dtype,
        op,
        f"put_(): self and source expected to have the same dtype, but got "
        f"self.dtype = {input.dtype} and source.dtype = {source.dtype} (argument source)",
        ThunderRuntimeError,
    )
    check(
        index.numel() == source.numel(),
        op,
        f"put_(): Expected source and index to have the same number of elements, "
        f"but got source.numel() = {source.numel()}, index.numel() = {index.numel()} (argument source)",
        ThunderIndexError,
    )
    flat_index = _flat_index(op, input, index)
    flat = reshape_to(input, (input.numel(),))
    values = reshape_to(source, (source.numel(),))
    out = prims.index_add(flat, flat_index, values, 0) if accumulate else _written(flat, 0, flat_index, values)
    return reshape_to(out, tuple(input.shape))


@torchsymbol(torch.index_put, Tensor.index_put)
def index_put(input, indices, values, accumulate=False):
    """``input[indices] = values`` (``+=`` when ``accumulate``) for integer index tensors on the
    leading dims, broadcast together."""
    op = "ltorch.index_put"
    indices = tuple(indices)
    check(
        0 < len(indices) <= input.ndim,
        op,
        f"too many indices for tensor of dimension {input.ndim} (got {len(indices)}) (argument indices)",
        ThunderIndexError,
    )
    for i, idx in enumerate(indices):
        check(
            isinstance(idx, torch.Tensor),
            op,
            f"index {i} is {type(idx).__name__}: only index tensors are supported (argument indices)",
            ThunderNotImplementedError,
        )
    check(
        values.dtype == input.dtype,
        op,
        f"Index put requires the source and destination dtypes match, got "
        f"{input.dtype} for the destination and {values.dtype} for the source. (argument values)",
        ThunderRuntimeError,
    )
    if len(indices) == 1 and indices[0].dtype == torch.bool:
        return _put_masked(op, input, indices[0], values, accumulate)
    check(
        all(idx.dtype != torch.bool for idx in indices),
        op,
        "boolean mask indices mixed with other indices are not supported (argument indices)",
        ThunderNotImplementedError,
    )
    k = len(indices)
    wrapped = [_check_index(op, idx, input) for idx in indices]
    shape = clang.broadcast_shapes(op, *(idx.shape for idx in wrapped))
    linear = None
    for size, idx in zip(input.shape[:k], wrapped):
        idx = clang.maybe_convert(idx, torch.int64)
        idx = prims.where(prims.lt(idx, 0), prims.add(idx, size), idx)
        linear = (
            idx
            if linear is None
            else clang.elementwise(prims.add, op, clang.elementwise(prims.mul, op, linear, size), idx)
        )
    rest = tuple(input.shape[k:])
    count = math.prod(shape)
    linear = reshape_to(clang.expand_to(linear, shape), (count,))
    target = (*shape, *rest)
    check(
        clang.broadcast_shapes(op, target, values.shape) == target,
        op,
        lambda: (
            f"shape mismatch: value tensor of shape {list(values.shape)} cannot be broadcast to indexing result of "
            f"shape {list(target)} (argument values)"
        ),
        ThunderRuntimeError,
    )
    flat_values = reshape_to(clang.expand_to(values, target), (count, *rest))
    flat = reshape_to(input, (math.prod(input.shape[:k]), *rest))
    out = prims.index_add(flat, linear, flat_values, 0) if accumulate else _written_rows(flat, linear, flat_values)
    return reshape_to(out, tuple(input.shape))


# Eager's gradients (derivatives.yaml): the cotangent with zeros written where the op wrote (in
# the cotangent's layout), and what the op wrote read back from the cotangent.


@register_grad(put)
def put_rule(input, index, source, accumulate=False):
    out = put(input, index, source, accumulate)
    g = get_grad(out)
    if input.requires_grad:
        put_grad(input, g if accumulate else put(g, index, ltorch.zeros_like(source)))
    if source.requires_grad:
        put_grad(source, ltorch.reshape(take(g, index), tuple(source.shape)))
    return out


@register_grad(index_put)
def index_put_rule(input, indices, values, accumulate=False):
    out = index_put(input, indices, values, accumulate)
    g = get_grad(out)
    if input.requires_grad:
        put_grad(input, g if accumulate else index_put(g, indices, ltorch.zeros_like(values)))
    if values.requires_grad:
        if len(indices) == 1 and indices[0].dtype == torch.bool:
            put_grad(values, masked_rows_sum(g, indices[0], 0, tuple(values.shape)))
        else:
            put_grad(values, sum_to(g[tuple(indices)], values.shape))
    return out


def _masked_rows_sum_meta(g, mask, start: int, shape):
    return [(tuple(shape), g.dtype, flows(g))]


def _wide_mask(mask, shape: tuple, start: int):
    """``mask`` (bool) over dims ``start`` on of a tensor of ``shape``, broadcast to it."""
    dims = tuple(range(start, start + mask.ndim))
    return prims.broadcast_in_dim(clang.maybe_convert(mask, torch.bool), shape, dims)


@torchsymbol(name="masked_rows_sum", meta=_masked_rows_sum_meta)
def masked_rows_sum(g, mask, start: int, shape):
    """The gradient of the values of ``input[mask] = values`` (``mask`` over ``g``'s dims from
    ``start``, the dims before it whole): the rows of ``g`` the mask picks summed to the values'
    ``shape``. Eager sums the picked rows compacted (autograd's ``sum_to(g[..., mask], shape)``, a
    data-dependent count of rows); summed with zeros in place of the rows left out they round
    otherwise (HuBERT's ``masked_spec_embed`` an ulp off), so the torch executor runs eager's
    expression (``torch_ex``)."""
    picked = prims.where(_wide_mask(mask, tuple(g.shape), start), g, clang.maybe_convert(0, g.dtype))
    shape = tuple(shape)
    full = (1,) * (g.ndim - mask.ndim + 1 - len(shape)) + shape  # as the rows (*before, K, *rest)
    target = (*full[:start], *(1,) * mask.ndim, *full[start + 1 :])
    return reshape_to(sum_to(picked, target), shape)


@torchsymbol(name="masked_put")
def masked_put(a, mask, value, start: int):
    """``a[(:,) * start + (mask,)] = value`` on a copy of ``a``, where ``value`` (of ``a``'s dtype)
    broadcasts to one row the mask picks: a ``where``."""
    rest = a.ndim - start - mask.ndim
    at_mask = value.ndim - rest - 1  # the dim of value that lines up with the picked rows
    if at_mask >= 0:
        value = reshape_to(value, (*value.shape[:at_mask], *(1,) * mask.ndim, *value.shape[at_mask + 1 :]))
    return prims.where(_wide_mask(mask, tuple(a.shape), start), clang.expand_to(value, tuple(a.shape)), a)


@register_grad(masked_put)
def masked_put_rule(a, mask, value, start: int):
    out = masked_put(a, mask, value, start)
    g = get_grad(out)
    if a.requires_grad:
        # eager's: the gradient with zeros where the mask is, not added to zeros
        put_grad(a, prims.where(_wide_mask(mask, tuple(g.shape), start), clang.maybe_convert(0, g.dtype), g))
    if value.requires_grad:
        put_grad(value, masked_rows_sum(g, mask, start, tuple(value.shape)))
    return out


def _put_masked(op: str, input, mask, values, accumulate: bool):
    """``input[mask] = values`` where every masked position takes the same values (``values``
    broadcasts from one row): a select, whatever the mask holds. Values per masked position
    would be placed by a running count of the mask, which the trace has no prim for."""
    m = mask.ndim
    check(
        same_shape(mask.shape, input.shape[:m]),
        op,
        lambda: (
            f"The shape of the mask {list(mask.shape)} at index 0 does not match the shape of the indexed tensor "
            f"{list(input.shape)} at index 0 (argument indices)"
        ),
        ThunderIndexError,
    )
    rest = tuple(input.shape[m:])
    lead = values.shape[: max(values.ndim - len(rest), 0)]
    check(
        all(s == 1 for s in lead),
        op,
        lambda: (
            f"values of shape {list(values.shape)} give each masked position its own value: placing them depends on "
            "the mask's values (a running count), which thunder_rs does not trace; use torch.where (argument values)"
        ),
        ThunderNotImplementedError,
    )
    tail = tuple(values.shape[len(lead) :])
    check(
        all(t in (r, 1) for t, r in zip(reversed(tail), reversed(rest))),
        op,
        lambda: (
            f"shape mismatch: value tensor of shape {list(values.shape)} cannot be broadcast to indexing result of "
            f"shape [N, {', '.join(map(str, rest))}] (argument values)"
        ),
        ThunderRuntimeError,
    )
    row = clang.expand_to(reshape_to(values, tail), tuple(input.shape))
    wide = prims.broadcast_in_dim(mask, tuple(input.shape), tuple(range(m)))
    if accumulate:
        row = prims.add(input, prims.where(wide, row, clang.maybe_convert(0, input.dtype)))
    return prims.where(wide, row, input)


def _written_rows(flat, rows, values):
    """``flat`` with ``values[i]`` written to row ``rows[i]`` (one of them where rows repeat)."""
    index = prims.broadcast_in_dim(rows, tuple(values.shape), (0,))
    return prims.scatter(flat, index, values, 0)


@torchsymbol(torch.masked_scatter, Tensor.masked_scatter)
def masked_scatter(input, mask, source):
    """The masked positions, in row-major order, take ``source``'s elements one after another:
    the k-th true position reads ``source.flatten()[k]``, its index a running count of the mask.
    Too short a source fails when the op runs (the count is data), as in eager."""
    op = "ltorch.masked_scatter"
    check(
        isinstance(mask, torch.Tensor) and mask.dtype == torch.bool,
        op,
        f"masked_scatter_ only supports boolean masks, but got mask with dtype {getattr(mask, 'dtype', None)} "
        "(argument mask)",
        ThunderRuntimeError,
    )
    check(
        isinstance(source, torch.Tensor) and source.dtype == input.dtype,
        op,
        f"masked_scatter: expected self and source to have same dtypes but got {input.dtype} and "
        f"{getattr(source, 'dtype', None)} (argument source)",
        ThunderRuntimeError,
    )
    shape = clang.broadcast_shapes(op, input.shape, mask.shape)
    input, mask = clang.expand_to(input, shape), clang.expand_to(mask, shape)
    n = math.prod(shape)
    flat_mask = reshape_to(mask, (n,))
    if n == 0 or source.numel() == 0:
        return ltorch.where(mask, input, input) if n == 0 else ltorch.where(mask, ltorch.zeros_like(input), input)
    position = prims.cumsum(prims.convert_element_type(flat_mask, torch.int64), 0)
    index = prims.maximum(prims.sub(position, 1), 0)
    values = prims.take(reshape_to(source, (source.numel(),)), index, 0)
    return prims.where(mask, reshape_to(values, shape), input)


@register_grad(masked_scatter)
def masked_scatter_rule(input, mask, source):
    """Eager's: ``grad.masked_fill(mask, 0)`` for the input (a new contiguous tensor, where the
    decomposition's ``where`` took the mask's layout), and for the source the cotangent at the
    masked positions in order, zero past them."""
    out = masked_scatter(input, mask, source)
    g = get_grad(out)
    if input.requires_grad:
        put_grad(input, sum_to(ltorch.masked_fill(g, mask, 0), input.shape))
    if source.requires_grad and source.numel() == 0:
        put_grad(source, ltorch.zeros_like(source))
    elif source.requires_grad:
        n = g.numel()
        flat_mask = reshape_to(clang.expand_to(mask, tuple(g.shape)), (n,))
        read = ltorch.clamp_min(ltorch.cumsum(ltorch.to(flat_mask, torch.int64), 0) - 1, 0)
        picked = reshape_to(ltorch.where(mask, g, 0), (n,))
        grad = ltorch.index_add(ltorch.zeros(source.numel(), dtype=g.dtype, device=g.device), 0, read, picked)
        put_grad(source, reshape_to(grad, tuple(source.shape)))
    return out


@torchsymbol(torch.fill)
def fill(input, value):
    """``input``'s shape filled with ``value``; like eager's, the result requires grad as ``input``
    does (its gradient is zero), so it selects the value everywhere rather than building it anew."""
    op = "ltorch.fill"
    if isinstance(value, torch.Tensor):
        check(
            value.ndim == 0,
            op,
            f"fill only supports 0-dimension value tensor but got tensor with {value.ndim} "
            "dimensions. (argument value)",
            ThunderRuntimeError,
        )
        filled = clang.maybe_convert(value, input.dtype)
    elif type(value) is SymInt:  # a size: read on each call
        filled = size_value(input.device, input.dtype, value)
    else:
        filled = prims.full((), clang.maybe_convert(value, input.dtype), input.device, input.dtype)
    # Broadcasts of 0-dim tensors, whose strides are all zero, leave the layout of the result to
    # ``input``, as eager's ``empty_like(input).fill_(value)`` does (channels_last stays so).
    shape = tuple(input.shape)
    everywhere = clang.expand_to(prims.full((), True, input.device, torch.bool), shape)
    return prims.where(everywhere, clang.expand_to(filled, shape), input)
