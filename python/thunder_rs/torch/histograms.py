"""``torch.histogram`` and ``torch.histogramdd``: counts (or summed weights) of the points of
``input`` (its last dim the coordinates, for histogramdd) in a grid of bins, and the bins' edges.

As eager's kernel (``histogramdd_cpu_contiguous``): a number of bins per dim gives edges spaced
evenly (``linspace``) over ``range``, or by default the data's per-dim minimum and maximum (an
empty input: [0, 1]; equal ends widened by 0.5 each way); given edges are taken as they are. A
point outside a dim's first and last edge (NaN too) is dropped; its bin is where ``upper_bound``
of its value finds it in the edges (emulated step by step, so that edges out of order give
eager's bins), the last edge belonging to the last bin. The points' weights are added in order;
``density`` divides by their total and by each bin's widths.

The data's range is data: its checks (finite; eager raises otherwise) and its widening are made
where it is computed, by a kernel the torch executor runs (``histogram_range``). Eager defines no
derivative (its outputs require grad, their backward raises): an input or weight that requires
grad leaves the call to eager's op, a fallback.
"""

import builtins
import math

import torch
from torch._subclasses.fake_tensor import FakeTensor

from thunder_rs.core.lang.fallback import user_fallback
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, check
from thunder_rs.torch.common import OpaqueKernel, flows, is_int, require_tensor
from thunder_rs.torch.symbols import ltorch, torchsymbol

__all__ = ["histogram", "histogramdd"]

_FLOATS = (torch.float32, torch.float64)


def _range_meta(points):
    return [((points.shape[1], 2), points.dtype, False, None)]


#: ``(points (N, D))`` -> each dim's (first, last) edge from the data (D, 2), checked finite and
#: widened where equal, as eager's ``select_outer_bin_edges``.
histogram_range = OpaqueKernel("histogram_range", _range_meta)


def _aten_histogram_range(points):
    dims = points.shape[1]
    if points.shape[0] == 0:
        bounds = [(0.0, 1.0)] * dims
    elif points.is_meta or isinstance(points, FakeTensor):  # (no values: a program traced for metadata)
        return torch.empty((dims, 2), dtype=points.dtype, device=points.device)
    else:
        low, high = torch.aminmax(points, dim=0)
        bounds = list(zip(low.tolist(), high.tolist()))
    return torch.tensor([_outer_edges(d, lo, hi) for d, (lo, hi) in enumerate(bounds)], dtype=points.dtype)


def _outer_edges(dim: int, low: float, high: float) -> tuple[float, float]:
    """A dim's first and last edge (Python floats, eager's doubles), checked as eager does."""
    check(
        math.isfinite(low) and math.isfinite(high),
        "ltorch.histogramdd",
        lambda: f"torch.histogramdd: dimension {dim}'s range [{low:g}, {high:g}] is not finite",
        ThunderRuntimeError,
    )
    check(
        low <= high,
        "ltorch.histogramdd",
        lambda: f"torch.histogramdd: min should not exceed max, but got min {low:g} max {high:g} for dimension {dim}",
        ThunderRuntimeError,
    )
    return (low - 0.5, high + 0.5) if low == high else (low, high)


def _check(op: str, input, dims: int, bins, range, weight) -> None:
    """eager's ``histogramdd_check_inputs`` and the bins' checks, in its order."""
    check(
        input.dtype in _FLOATS,
        op,
        lambda: f'"histogramdd" not implemented for {input.dtype} (argument input)',
        ThunderNotImplementedError,
    )
    for d, b in enumerate(bins):
        if isinstance(b, torch.Tensor):
            check(
                b.dtype == input.dtype,
                op,
                lambda: (
                    f"torch.histogramdd: input tensor and bins tensors should have the same dtype, but got "
                    f"input with dtype {input.dtype} and bins for dimension {d} with dtype {b.dtype} (argument bins)"
                ),
                ThunderRuntimeError,
            )
            check(
                b.ndim == 1,
                op,
                f"torch.histogramdd: bins tensor should have one dimension (dimension {d}, argument bins)",
                ThunderRuntimeError,
            )
            check(
                b.numel() > 0,
                op,
                f"torch.histogramdd: bins tensor should have at least 1 element (dimension {d}, argument bins)",
                ThunderRuntimeError,
            )
        else:
            check(
                is_int(b) and b > 0,
                op,
                f"torch.histogram(): bins must be > 0, but got {b} for dimension {d} (argument bins)",
                ThunderRuntimeError,
            )
    if weight is not None:
        require_tensor(op, weight, "weight")
        check(
            weight.dtype == input.dtype,
            op,
            "torch.histogramdd: if weight tensor is provided, input tensor and weight tensor should have the "
            "same dtype (argument weight)",
            ThunderRuntimeError,
        )
        check(
            tuple(weight.shape) == tuple(input.shape[:-1]),
            op,
            "torch.histogramdd: if weight tensor is provided it should have the same shape as the input tensor "
            "excluding its innermost dimension (argument weight)",
            ThunderRuntimeError,
        )
    check(
        range is None or len(range) == 2 * dims,
        op,
        lambda: (
            f"torch.histogramdd: for a {dims}-dimensional histogram range should have {2 * dims} elements, "
            f"but got {len(range)} (argument range)"
        ),
        ThunderRuntimeError,
    )


def _upper_bound(edges, values):
    """``std::upper_bound(edges, edges + n, value) - edges`` for each value, step by step as the
    standard library's binary search (any order of edges, as eager's kernel takes them)."""
    n = edges.shape[0]
    first = ltorch.zeros_like(values, dtype=torch.int64)
    count = ltorch.full_like(first, n)
    for _ in range(n.bit_length()):
        step = ltorch.floor_divide(count, 2)
        middle = ltorch.add(first, step)
        at = ltorch.take(edges, ltorch.clamp(middle, max=n - 1))
        right = ltorch.logical_and(ltorch.gt(count, 0), ltorch.logical_not(ltorch.lt(values, at)))
        first = ltorch.where(right, ltorch.add(middle, 1), first)
        count = ltorch.where(right, ltorch.sub(ltorch.sub(count, step), 1), step)
    return first


def _edges(points, d: int, b, outer):
    """Dim ``d``'s edges: the given tensor, or ``b + 1`` spaced over its outer edges."""
    if isinstance(b, torch.Tensor):
        return b
    low, high = outer[d] if isinstance(outer, list) else (outer[d, 0], outer[d, 1])
    return ltorch.linspace(low, high, b + 1, dtype=points.dtype, device=points.device)


def _histogramdd(op: str, input, bins, range, weight, density):
    require_tensor(op, input, "input")
    check(
        input.ndim >= 2,
        op,
        "torch.histogramdd: input tensor should have at least 2 dimensions (argument input)",
        ThunderRuntimeError,
    )
    dims = input.shape[-1]
    bins = [bins] * dims if is_int(bins) else list(bins)
    check(
        len(bins) == dims,
        op,
        "histogramdd: The size of bins must be equal to the innermost dimension of the input. (argument bins)",
        ThunderRuntimeError,
    )
    _check(op, input, dims, bins, range, weight)
    if dims == 0:
        return ltorch.zeros((), dtype=input.dtype, device=input.device), ()
    points = ltorch.reshape(input, (-1, dims))
    outer = None
    if not all(isinstance(b, torch.Tensor) for b in bins):
        if range is not None:
            outer = [_outer_edges(d, float(range[2 * d]), float(range[2 * d + 1])) for d in builtins.range(dims)]
        else:
            outer = histogram_range(points)[0]
    edges = [_edges(points, d, b, outer) for d, b in enumerate(bins)]
    counts = tuple(e.shape[0] - 1 for e in edges)
    flat, inside = None, None
    for d, e in enumerate(edges):
        values = ltorch.select(points, 1, d)
        within = ltorch.logical_and(ltorch.ge(values, e[0]), ltorch.le(values, e[-1]))
        position = ltorch.clamp(ltorch.sub(_upper_bound(e, values), 1), max=max(counts[d] - 1, 0))
        term = ltorch.mul(position, math.prod(counts[d + 1 :]))
        flat = term if flat is None else ltorch.add(flat, term)
        inside = within if inside is None else ltorch.logical_and(inside, within)
    total = math.prod(counts)
    flat = ltorch.where(inside, flat, total)  # (dropped points: a spare bin cut off after)
    added = ltorch.ones_like(ltorch.select(points, 1, 0)) if weight is None else ltorch.reshape(weight, (-1,))
    hist = ltorch.zeros(total + 1, dtype=input.dtype, device=input.device)
    hist = ltorch.reshape(ltorch.narrow(ltorch.scatter_add(hist, 0, flat, added), 0, 0, total), counts)
    if density:
        hist = ltorch.true_divide(hist, ltorch.sum(hist))
        for d, e in enumerate(edges):
            shape = [1] * dims
            shape[d] = -1
            hist = ltorch.true_divide(hist, ltorch.reshape(ltorch.diff(e), shape))
    return hist, tuple(edges)


@torchsymbol(torch.histogramdd)
def histogramdd(input, bins, *, range=None, weight=None, density=False):
    hist, edges = _histogramdd("ltorch.histogramdd", input, bins, range, weight, density)
    return torch.return_types.histogramdd((hist, edges))


@torchsymbol(torch.histogram, torch.Tensor.histogram)
def histogram(input, bins, *, range=None, weight=None, density=False, out=None):
    op = "ltorch.histogram"
    require_tensor(op, input, "input")
    points = ltorch.reshape(input, (-1, 1))
    weight = None if weight is None else ltorch.reshape(weight, (-1,))
    hist, (edges,) = _histogramdd(op, points, [bins], range, weight, density)
    return torch.return_types.histogram((hist, edges))


#: The aten calls the torch executor runs for the kernels.
TORCH_IMPLS = {histogram_range: _aten_histogram_range}


def _traced_or_eager(symbol, torch_fn):
    """``symbol``, unless the input or weight requires grad: eager's outputs then require grad and
    their backward raises (no derivative is defined), which only eager's own call gives, so the
    call stays an eager fallback."""

    def call(input, *args, **kwargs):
        if flows(input, kwargs.get("weight")):
            return user_fallback(torch_fn, (input, *args), kwargs)
        return symbol(input, *args, **kwargs)

    return call


TORCH_TO_LTORCH[torch.histogramdd] = _traced_or_eager(histogramdd, torch.histogramdd)
TORCH_TO_LTORCH[torch.histogram] = _traced_or_eager(histogram, torch.histogram)
TORCH_TO_LTORCH[torch.Tensor.histogram] = _traced_or_eager(histogram, torch.Tensor.histogram)
