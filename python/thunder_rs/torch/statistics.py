"""Order statistics and searches: kthvalue, median, nanmedian, quantile, nanquantile, mode, histc,
bucketize, searchsorted and isin; and the grad rules of median, nanmedian, mode and kthvalue.

Order statistics sort (stably, NaN last, as torch.sort does) along the reduced dim and select a
position, so their indices are the first of equal values in input order where eager's selection
algorithm agrees (median, nanmedian); kthvalue's index among ties follows eager's quickselect,
which a sort does not reproduce (values agree). Searches count comparisons against every
boundary, which takes memory proportional to both sizes.
"""

import math
from typing import Any, Callable

import torch

from thunder_rs import clang, prims
from thunder_rs.torch.common import is_int, require_tensor
from thunder_rs.torch.symbols import ltorch
from thunder_rs.core.base import dtypes
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.errors import (
    ThunderIndexError,
    ThunderNotImplementedError,
    ThunderRuntimeError,
    ThunderTypeError,
    check,
)
from thunder_rs.torch.autograd import with_zero_gradient
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.torch.reductions import _evenly_distributed
from thunder_rs.torch.symbols import torchsymbol
from thunder_rs.torch.elementwise import add, round as round_, sub
from thunder_rs.core.lang.symint import same_shape

T = torch.Tensor
__all__ = [
    "kthvalue",
    "median",
    "nanmedian",
    "quantile",
    "nanquantile",
    "mode",
    "histc",
    "bucketize",
    "searchsorted",
    "isin",
]


def _along_last(x, dim, op: str):
    """``x`` with ``dim`` moved last (a 0-d tensor as one element) and that dim's index."""
    if x.ndim == 0:
        return ltorch.reshape(x, (1,)), 0
    d = clang.canonicalize_dim(x.ndim, dim, op)
    return ltorch.movedim(x, d, -1), d


def _finish(out, x, d: int, keepdim: bool):
    """A selection of shape ``(*batch, 1)`` along the moved dim, with ``x``'s reduced shape."""
    out = ltorch.squeeze(out, -1)
    if x.ndim == 0:
        return ltorch.reshape(out, ())
    return ltorch.unsqueeze(out, d) if keepdim else out


def _select(x, dim, keepdim: bool, position, op: str):
    """Values and input indices at sorted ``position`` (an int, or an int64 tensor ``(*batch, 1)``)
    along ``dim``."""
    moved, d = _along_last(x, dim, op)
    values, indices = ltorch.sort(moved, dim=-1, stable=True)
    if callable(position):
        position = position(values)
    if is_int(position):
        picked = ltorch.narrow(values, -1, position, 1), ltorch.narrow(indices, -1, position, 1)
    else:
        picked = ltorch.take_along_dim(values, position, -1), ltorch.take_along_dim(indices, position, -1)
    return tuple(_finish(p, x, d, keepdim) for p in picked)


def _check_reducible(op: str, x, dim) -> None:
    require_tensor(op, x)
    check(
        x.dtype != torch.bool and not x.dtype.is_complex,
        op,
        f"not implemented for {x.dtype} (argument input)",
        ThunderNotImplementedError,
    )
    if x.ndim:
        d = clang.canonicalize_dim(x.ndim, dim, op)
        check(
            x.shape[d] != 0, op, f"Expected reduction dim {d} to have non-zero size. (argument dim)", ThunderIndexError
        )


@torchsymbol(torch.kthvalue, T.kthvalue)
def kthvalue(input, k, dim=-1, keepdim=False):
    op = "ltorch.kthvalue"
    require_tensor(op, input)
    size = input.shape[clang.canonicalize_dim(input.ndim, dim, op)] if input.ndim else 1
    check(
        is_int(k) and 1 <= k <= size,
        op,
        f"kthvalue(): selected number k out of range for dimension {dim} (argument k)",
        ThunderRuntimeError,
    )
    _check_reducible(op, input, dim)
    return torch.return_types.kthvalue(_select(input, dim, keepdim, k - 1, op))


def _nan_count(values):
    return ltorch.sum(ltorch.ne(values, values), -1, True)


def _median_position(values):
    """The lower median, or the first NaN when there is one (eager's median)."""
    n = values.shape[-1]
    nans = _nan_count(values)
    return ltorch.where(ltorch.gt(nans, 0), sub(n, nans), (n - 1) // 2)


def _nanmedian_position(values):
    """The lower median of the values that are not NaN (the first NaN when all are)."""
    valid = sub(values.shape[-1], _nan_count(values))
    return ltorch.where(ltorch.gt(valid, 0), ltorch.floor_divide(sub(valid, 1), 2), 0)


def _full_median(op: str, input, position):
    """The median of every element. An empty input gives NaN (for integers, NaN as eager casts it:
    the lowest value)."""
    if input.numel() == 0:
        fill = math.nan if dtypes.is_inexact(input.dtype) else torch.iinfo(input.dtype).min
        return with_zero_gradient(ltorch.full((), fill, dtype=input.dtype, device=input.device), input)
    values, _ = _select(ltorch.reshape(input, (-1,)), 0, False, position, op)
    return values


def _define_median(name: str, position, return_type):
    op = f"ltorch.{name}"

    @torchsymbol(getattr(torch, name), getattr(T, name), name=name)
    def median_(input, dim=None, keepdim=False):
        if dim is None:
            check(
                input.dtype != torch.bool,
                op,
                f"not implemented for {input.dtype} (argument input)",
                ThunderNotImplementedError,
            )
            return _full_median(op, input, position)
        _check_reducible(op, input, dim)
        return return_type(_select(input, dim, keepdim, position, op))

    return median_


median: Callable[..., Any] = _define_median("median", _median_position, torch.return_types.median)
nanmedian: Callable[..., Any] = _define_median("nanmedian", _nanmedian_position, torch.return_types.nanmedian)


# -- quantiles -------------------------------------------------------------------------------------

_INTERPOLATIONS = ("linear", "lower", "higher", "midpoint", "nearest")


def _quantile_q(op: str, input, q):
    """``q`` as a tensor of ``input``'s dtype (eager makes a number one) and whether it was 0-d."""
    if isinstance(q, TensorProxy):
        check(q.ndim <= 1, op, "quantile() q must be a scalar or 1D tensor (argument q)", ThunderRuntimeError)
        check(
            q.dtype == input.dtype,
            op,
            "quantile() q tensor must be same dtype as the input tensor (argument q)",
            ThunderRuntimeError,
        )
        return q, q.ndim == 0
    check(
        isinstance(q, (int, float)) and not isinstance(q, bool),
        op,
        f"expected a number or a tensor for q, got {type(q).__name__}",
        ThunderTypeError,
    )
    check(0 <= q <= 1, op, f"quantile() q must be in the range [0, 1] but got {q} (argument q)", ThunderRuntimeError)
    return ltorch.full((), q, dtype=input.dtype, device=input.device), True


def _ranks(q, values, ignore_nan: bool):
    """Fractional positions in the sorted ``values`` (``(*batch, n)``) of each quantile: ``(*batch, nq)``."""
    n = values.shape[-1]
    nans = _nan_count(values)
    if ignore_nan:
        ranks = ltorch.mul(q, ltorch.to(sub(sub(n, nans), 1), q.dtype))
        return ltorch.where(ltorch.lt(ranks, 0), 0.0, ranks)
    # Eager's ``q * last_index``, the last index where a row holds NaN; a symbolic size stays a
    # size computed each call (``float`` would specialise it).
    return ltorch.mul(ltorch.where(ltorch.gt(nans, 0), 1.0, q), n - 1)


def _quantile(op: str, input, q, dim, keepdim: bool, interpolation: str, ignore_nan: bool):
    require_tensor(op, input)
    check(
        input.dtype in (torch.float32, torch.float64),
        op,
        "quantile() input tensor must be either float or double dtype",
        ThunderRuntimeError,
    )
    check(
        interpolation in _INTERPOLATIONS,
        op,
        f"quantile() interpolation must be one of linear, lower, higher, midpoint or nearest. Got {interpolation}",
        ThunderRuntimeError,
    )
    check(input.numel() > 0, op, "quantile() input tensor must be non-empty", ThunderRuntimeError)
    q, scalar_q = _quantile_q(op, input, q)
    flat = dim is None
    moved, d = _along_last(ltorch.reshape(input, (-1,)) if flat else input, 0 if flat else dim, op)
    values = ltorch.sort(moved, -1)[0]
    batch = values.shape[:-1]
    # eager's ranks are float64 (``q.to(kDouble)``), its weights their fractions cast to the dtype
    q = ltorch.to(q, torch.float64)
    qs = ltorch.expand(ltorch.reshape(q, (1,) * len(batch) + (-1,)), (*batch, q.numel()))
    ranks = _ranks(qs, values, ignore_nan)
    if interpolation in ("lower", "higher", "nearest"):
        ranks = {"lower": ltorch.floor, "higher": ltorch.ceil, "nearest": round_}[interpolation](ranks)
    below = ltorch.to(ranks, torch.int64)
    out = ltorch.take_along_dim(values, below, -1)
    if interpolation in ("linear", "midpoint"):
        weights = (
            ltorch.full_like(ranks, 0.5, dtype=input.dtype)
            if interpolation == "midpoint"
            else ltorch.to(sub(ranks, ltorch.to(below, ranks.dtype)), input.dtype)
        )
        # eager's ``values_below.lerp_(values_above, weights)``: the lerp kernel, whose vector loop
        # takes each value as one FMA (the formula's ops rounded apart were an ulp off)
        out = ltorch.lerp(out, ltorch.take_along_dim(values, ltorch.to(ltorch.ceil(ranks), torch.int64), -1), weights)
    # eager computes ``(*kept, nq)`` contiguous (``kept``: the reduced shape, a kept dim in its
    # place), then moves the quantiles first or squeezes a 0-d ``q``'s dim: a kept dim of size 1
    # has the stride of that layout (moved first, then unsqueezed, it had another)
    if keepdim and (flat or input.ndim > 0):  # (a 0-d input's reduced shape is its own: 0-d)
        out = ltorch.reshape(out, (*(1 for _ in input.shape), out.shape[-1])) if flat else ltorch.unsqueeze(out, d)
    return ltorch.squeeze(out, -1) if scalar_q else ltorch.movedim(out, -1, 0)


@torchsymbol(torch.quantile, T.quantile)
def quantile(input, q, dim=None, keepdim=False, *, interpolation="linear", out=None):
    return _quantile("ltorch.quantile", input, q, dim, keepdim, interpolation, False)


@torchsymbol(torch.nanquantile, T.nanquantile)
def nanquantile(input, q, dim=None, keepdim=False, *, interpolation="linear", out=None):
    return _quantile("ltorch.nanquantile", input, q, dim, keepdim, interpolation, True)


# -- mode ------------------------------------------------------------------------------------------


@torchsymbol(torch.mode, T.mode)
def mode(input, dim=-1, keepdim=False):
    """The most frequent value along ``dim`` (the smallest among equally frequent ones) and the
    index of its last occurrence, as eager returns them. Counts compare every pair of elements."""
    op = "ltorch.mode"
    _check_reducible(op, input, dim)
    moved, d = _along_last(input, dim, op)
    n = moved.shape[-1]
    ordered = ltorch.sort(moved, dim=-1, stable=True)[0]
    same = ltorch.eq(ltorch.unsqueeze(ordered, -1), ltorch.unsqueeze(ordered, -2))
    same = ltorch.bitwise_or(
        same,
        prims.broadcast_in_dim(
            ltorch.eye(n, dtype=torch.bool, device=input.device), same.shape, (same.ndim - 2, same.ndim - 1)
        ),
    )
    counts = ltorch.sum(same, -1)
    value = ltorch.take_along_dim(ordered, ltorch.argmax(counts, -1, True), -1)
    positions = ltorch.expand(ltorch.arange(n, device=input.device), moved.shape)
    index = ltorch.amax(ltorch.where(ltorch.eq(moved, value), positions, -1), -1, True)
    return torch.return_types.mode((_finish(value, input, d, keepdim), _finish(index, input, d, keepdim)))


# -- histograms and searches -----------------------------------------------------------------------


@torchsymbol(torch.histc, T.histc)
def histc(input, bins=100, min=0, max=0, *, out=None):
    """Counts in ``bins`` equal bins over ``[min, max]`` (the data's range when they are equal);
    the bin of ``x`` is ``trunc((x - min) * bins / (max - min))`` in ``input``'s dtype, ``max`` in
    the last bin, as eager's kernel computes. Eager's errors for a non-finite data range depend
    on values and are not raised."""
    op = "ltorch.histc"
    require_tensor(op, input)
    check(
        dtypes.is_float(input.dtype),
        op,
        f'"histogram_cpu" not implemented for {input.dtype} (argument input)',
        ThunderNotImplementedError,
    )
    check(
        is_int(bins) and bins > 0,
        op,
        f"bins must be > 0, but got {bins} for dimension 0 (argument bins)",
        ThunderRuntimeError,
    )
    check(not min > max, op, "max must be larger than min (argument max)", ThunderRuntimeError)
    flat = ltorch.reshape(input, (-1,))
    if min == max and flat.numel() > 0:
        low, high = ltorch.amin(flat), ltorch.amax(flat)
    else:
        low, high = (ltorch.full((), v, dtype=input.dtype, device=input.device) for v in (min, max))
    equal = ltorch.eq(low, high)
    low, high = ltorch.where(equal, sub(low, 1), low), ltorch.where(equal, add(high, 1), high)
    inside = ltorch.bitwise_and(ltorch.ge(flat, low), ltorch.le(flat, high))
    position = ltorch.to(ltorch.true_divide(ltorch.mul(sub(flat, low), bins), sub(high, low)), torch.int64)
    position = ltorch.where(inside, ltorch.clamp(position, max=bins - 1), bins)  # outside: a bin dropped below
    counts = ltorch.scatter_add(
        ltorch.zeros(bins + 1, dtype=input.dtype, device=input.device), 0, position, ltorch.ones_like(flat)
    )
    return ltorch.narrow(counts, 0, 0, bins)


def _count_below(boundaries, values, right: bool, out_int32: bool):
    """For each value, how many ``boundaries`` (along their last dim) lie below it (at or below
    for ``right``); NaN counts past every boundary, as eager's binary search does."""
    above = ltorch.gt(boundaries, values) if right else ltorch.ge(boundaries, values)
    return ltorch.sum(ltorch.bitwise_not(above), -1, dtype=torch.int32 if out_int32 else torch.int64)


def _search_operand(op: str, x, like):
    if isinstance(x, TensorProxy):
        return x
    check(
        isinstance(x, (int, float)) and not isinstance(x, bool),
        op,
        f"expected a tensor or a number, got {type(x).__name__}",
        ThunderTypeError,
    )
    return ltorch.full((), x, dtype=like.dtype, device=like.device)


@torchsymbol(torch.bucketize)
def bucketize(input, boundaries, *, out_int32=False, right=False, out=None):
    op = "ltorch.bucketize"
    check(
        isinstance(boundaries, TensorProxy) and boundaries.ndim == 1,
        op,
        "boundaries tensor must be 1 dimension (argument boundaries)",
        ThunderRuntimeError,
    )
    values = _search_operand(op, input, boundaries)
    return _count_below(boundaries, ltorch.unsqueeze(values, -1), right, out_int32)


@torchsymbol(torch.searchsorted)
def searchsorted(sorted_sequence, input, *, out_int32=False, right=False, side=None, sorter=None, out=None):
    op = "ltorch.searchsorted"
    check(
        isinstance(sorted_sequence, TensorProxy), op, "expected a tensor (argument sorted_sequence)", ThunderTypeError
    )
    check(
        side in (None, "left", "right"),
        op,
        f"side can only be 'left' or 'right' but got {side!r} (argument side)",
        ThunderRuntimeError,
    )
    check(
        side is None or not right or side == "right",
        op,
        "side and right can't be set to opposites, got side of left while right was True (argument side)",
        ThunderRuntimeError,
    )
    right = right or side == "right"
    sequence = sorted_sequence
    if sorter is not None:
        check(
            isinstance(sorter, TensorProxy) and same_shape(sorter.shape, sequence.shape),
            op,
            "boundaries and sorter must have the same size (argument sorter)",
            ThunderRuntimeError,
        )
        sequence = ltorch.take_along_dim(sequence, sorter, -1)
    values = _search_operand(op, input, sequence)
    if sequence.ndim == 1:
        return _count_below(sequence, ltorch.unsqueeze(values, -1), right, out_int32)
    check(
        values.ndim == sequence.ndim and same_shape(values.shape[:-1], sequence.shape[:-1]),
        op,
        "boundaries tensor should be 1 dimension or the first N-1 dimensions of boundaries tensor and input value "
        f"tensor must match, but we got boundaries tensor {list(sequence.shape)} and input value tensor "
        f"{list(values.shape)}",
        ThunderRuntimeError,
    )
    return _count_below(ltorch.unsqueeze(sequence, -2), ltorch.unsqueeze(values, -1), right, out_int32)


@torchsymbol(torch.isin)
def isin(elements, test_elements, *, assume_unique=False, invert=False):
    """Whether each element equals some test element; compares every pair."""
    op = "ltorch.isin"
    check(
        isinstance(elements, TensorProxy) or isinstance(test_elements, TensorProxy),
        op,
        "expected elements or test_elements to be a tensor",
        ThunderTypeError,
    )
    like = elements if isinstance(elements, TensorProxy) else test_elements
    elements, test_elements = _search_operand(op, elements, like), _search_operand(op, test_elements, like)
    for x in (elements, test_elements):
        check(
            x.dtype != torch.bool and not x.dtype.is_complex,
            op,
            f"Unsupported input type encountered for isin(): {x.dtype}",
            ThunderNotImplementedError,
        )
    found = ltorch.any(ltorch.eq(ltorch.unsqueeze(elements, -1), ltorch.reshape(test_elements, (-1,))), -1)
    return ltorch.bitwise_not(found) if invert else found


# -- grad rules ------------------------------------------------------------------------------------
# Median and nanmedian of a whole tensor share the gradient among every element equal to the result
# (NaN ones when it is NaN; eager's ``evenly_distribute_backward``, as max and min in
# ``reductions.py``); along a dim median, mode and kthvalue send it to the index eager's kernel
# returns (for ties, kthvalue's and median's selection picks another than a stable sort's).


def _to_the_returned_index(out, input, dim, keepdim):
    """``out`` (values, indices) of a selection along ``dim``, run as eager's kernel, with the
    gradient of its values scattered to its indices (eager's value_selecting_reduction_backward)
    into new zeros, contiguous as eager's (``zeros(sizes)``), not in the input's layout."""
    g = get_grad(out.values)
    if input.ndim == 0:
        put_grad(input, g)
        return out
    indices = out.indices
    if not keepdim:
        g, indices = ltorch.unsqueeze(g, dim), ltorch.unsqueeze(indices, dim)
    put_grad(input, ltorch.scatter_add(ltorch.new_zeros(g, input.shape), dim, indices, g))
    return out


def _define_full_median_grad(symbol):
    @register_grad(symbol)
    def full_median_grad(input, dim=None, keepdim=False):
        out = symbol(input, dim, keepdim)
        if input.numel() == 0:
            return out
        if dim is not None:
            return _to_the_returned_index(out, input, dim, keepdim)
        put_grad(input, ltorch.to(_evenly_distributed(get_grad(out), input, out), input.dtype))
        return out

    return full_median_grad


median_grad = _define_full_median_grad(ltorch.median)
nanmedian_grad = _define_full_median_grad(ltorch.nanmedian)


@register_grad(ltorch.mode)
def mode_grad(input, dim=-1, keepdim=False):
    return _to_the_returned_index(ltorch.mode(input, dim, keepdim), input, dim, keepdim)


@register_grad(ltorch.kthvalue)
def kthvalue_grad(input, k, dim=-1, keepdim=False):
    return _to_the_returned_index(ltorch.kthvalue(input, k, dim, keepdim), input, dim, keepdim)
