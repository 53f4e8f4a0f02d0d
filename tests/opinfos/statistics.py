"""Order statistics and searches: kthvalue, median, nanmedian, quantile, nanquantile, mode, histc,
bucketize, searchsorted, isin. Float samples have distinct values (ties make eager's kthvalue index
implementation-defined); ties and NaNs are sampled where eager's choice is reproduced."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from .core import NUMERIC, ErrorInput, OpInfo, SampleInput, cpu, make, strided, transposed

NAN = math.nan


def distinct(shape, dtype, device):
    """Distinct values in random order (integers too)."""
    n = math.prod(shape)
    return (torch.randperm(n, device=device).to(dtype) - n // 2).reshape(shape)


def kthvalue_samples(dtype, device) -> Iterable[SampleInput]:
    yield SampleInput(distinct((3, 5), dtype, device), 2)
    yield SampleInput(distinct((3, 5), dtype, device), 3, 0, True)
    yield SampleInput(distinct((), dtype, device), 1)
    yield SampleInput(distinct((4,), dtype, device), 4, keepdim=True)
    yield SampleInput(distinct((4, 3), dtype, device).mT, 1, 1)
    yield SampleInput(distinct((0, 3), dtype, device), 2)


def kthvalue_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), 5), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 0), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 1, 2), IndexError)


def with_nans(dtype, device):
    x = distinct((3, 5), dtype, device)
    if dtype.is_floating_point:
        x[0, 1] = x[0, 3] = x[2, 0] = NAN
        x[1] = NAN
    return x


def median_samples(dtype, device) -> Iterable[SampleInput]:
    yield SampleInput(distinct((3, 5), dtype, device))
    yield SampleInput(distinct((3, 5), dtype, device), 1)
    yield SampleInput(distinct((3, 4), dtype, device), 0, True)
    yield SampleInput(distinct((), dtype, device))
    yield SampleInput(distinct((), dtype, device), 0)
    yield SampleInput(make((0,), dtype, device))
    yield SampleInput(torch.tensor([1, 2, 2, 3, 2, 2], device=device).to(dtype))  # ties share the gradient
    yield SampleInput(torch.tensor([[1, 2, 2, 0], [3, 3, 1, 3]], device=device).to(dtype), 1)
    yield SampleInput(with_nans(dtype, device), 1)
    yield SampleInput(with_nans(dtype, device))
    yield SampleInput(transposed((3, 4), dtype, device), -1)


def median_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 0)), 1), IndexError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 2), IndexError)


def quantile_samples(dtype, device) -> Iterable[SampleInput]:
    for interpolation in ("linear", "lower", "higher", "midpoint", "nearest"):
        yield SampleInput(distinct((3, 5), dtype, device), 0.3, 1, interpolation=interpolation)
        yield SampleInput(
            distinct((4, 3), dtype, device),
            torch.tensor([0.0, 0.25, 0.5, 1.0], dtype=dtype, device=device),
            0,
            True,
            interpolation=interpolation,
        )
    yield SampleInput(distinct((3, 5), dtype, device), 0.75)
    yield SampleInput(
        distinct((2, 3), dtype, device), torch.tensor([0.2, 0.9], dtype=dtype, device=device), keepdim=True
    )
    yield SampleInput(distinct((), dtype, device), 0.5)
    yield SampleInput(with_nans(dtype, device), 0.4, 1)
    yield SampleInput(
        with_nans(dtype, device), torch.tensor(0.6, dtype=dtype, device=device), -1, interpolation="nearest"
    )
    yield SampleInput(strided((3, 4), dtype, device), 0.5, 0)


def quantile_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), 1.5), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3,), torch.int64), 0.5), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3,)), cpu((2,), torch.float64)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3,)), 0.5, interpolation="cubic"), RuntimeError)
    yield ErrorInput(SampleInput(cpu((0,)), 0.5), RuntimeError)


def mode_samples(dtype, device) -> Iterable[SampleInput]:
    def t(values):
        return torch.tensor(values, device=device).to(dtype)

    yield SampleInput(t([[1, 2, 2, 1, 3], [3, 3, 2, 2, 1]]))
    yield SampleInput(t([[1, 2], [2, 2], [1, 3]]), 0, True)
    yield SampleInput(t([5, 1, 1, 5]))
    yield SampleInput(t(4))
    yield SampleInput(make((3, 4), dtype, device).mT, 1)
    yield SampleInput(make((0, 3), dtype, device), 1)
    if dtype.is_floating_point:
        yield SampleInput(t([1, NAN, NAN, 2]))


def histc_samples(dtype, device) -> Iterable[SampleInput]:
    yield SampleInput(make((100,), dtype, device), 10)
    yield SampleInput(make((4, 25), dtype, device), 7, -3, 3)
    yield SampleInput(torch.ones(5, dtype=dtype, device=device), 4)
    yield SampleInput(make((0,), dtype, device), 3)
    yield SampleInput(torch.tensor([0.0, 0.5, 1.0, 2.0, -1.0], dtype=dtype, device=device), 4, 0, 1)
    yield SampleInput(transposed((5, 4), dtype, device))


def histc_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((5,)), -1), RuntimeError)
    yield ErrorInput(SampleInput(cpu((5,)), 4, 2, 1), RuntimeError)
    yield ErrorInput(SampleInput(cpu((5,), torch.int64)), NotImplementedError)


def bucketize_samples(dtype, device) -> Iterable[SampleInput]:
    boundaries = torch.tensor([-3, 0, 1, 4], device=device).to(dtype)
    values = torch.tensor([[-5, -3, 0], [2, 4, 9]], device=device).to(dtype)
    yield SampleInput(values, boundaries)
    yield SampleInput(values, boundaries, right=True)
    yield SampleInput(values.mT, boundaries, out_int32=True)
    yield SampleInput(make((), dtype, device), boundaries)
    yield SampleInput(make((0, 2), dtype, device), boundaries)
    if dtype.is_floating_point:
        yield SampleInput(torch.tensor([NAN, 0.5], dtype=dtype, device=device), boundaries)


def bucketize_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), cpu((2, 2))), RuntimeError)


def searchsorted_samples(dtype, device) -> Iterable[SampleInput]:
    sequence = torch.tensor([-3, 0, 1, 4], device=device).to(dtype)
    values = torch.tensor([[-5, -3, 0], [2, 4, 9]], device=device).to(dtype)
    yield SampleInput(sequence, values)
    yield SampleInput(sequence, values, right=True)
    yield SampleInput(sequence, values, side="right", out_int32=True)
    rows = torch.tensor([[1, 2, 3, 5], [-2, 0, 6, 7]], device=device).to(dtype)
    yield SampleInput(rows, values)
    yield SampleInput(rows, values, side="left")
    yield SampleInput(
        torch.tensor([4, -3, 1, 0], device=device).to(dtype), values, sorter=torch.tensor([1, 3, 2, 0], device=device)
    )


def searchsorted_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((2, 4)), cpu((3, 2))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((4,)), cpu((2,)), right=True, side="left"), RuntimeError)


def isin_samples(dtype, device) -> Iterable[SampleInput]:
    elements = torch.tensor([[0, 1, 2], [3, 4, 5]], device=device).to(dtype)
    tests = torch.tensor([1, 4, 9], device=device).to(dtype)
    yield SampleInput(elements, tests)
    yield SampleInput(elements, tests, invert=True)
    yield SampleInput(elements.mT, tests.reshape(3, 1))
    yield SampleInput(elements, 1)
    yield SampleInput(make((0,), dtype, device), tests)


def isin_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,), torch.bool), cpu((2,), torch.bool)), NotImplementedError)


OPS = [
    OpInfo("kthvalue", torch.kthvalue, kthvalue_samples, kthvalue_errors, NUMERIC),
    OpInfo("median", torch.median, median_samples, median_errors, NUMERIC),
    # Of a row of NaNs eager returns the index its quickselect stops at (0, 0, 0, 2, 2, 3, 5 for
    # 1 to 7 elements); the decomposition returns the first.
    OpInfo("nanmedian", torch.nanmedian, median_samples, median_errors, NUMERIC, decomposition_skips=(8,)),
    OpInfo("quantile", torch.quantile, quantile_samples, quantile_errors),
    OpInfo("nanquantile", torch.nanquantile, quantile_samples, quantile_errors),
    OpInfo("mode", torch.mode, mode_samples, median_errors, NUMERIC),
    OpInfo("histc", torch.histc, histc_samples, histc_errors),
    OpInfo("bucketize", torch.bucketize, bucketize_samples, bucketize_errors, NUMERIC, supports_grad=False),
    OpInfo("searchsorted", torch.searchsorted, searchsorted_samples, searchsorted_errors, NUMERIC, supports_grad=False),
    OpInfo("isin", torch.isin, isin_samples, isin_errors, NUMERIC, supports_grad=False),
]


def histogramdd_samples(dtype, device) -> Iterable[SampleInput]:
    """Bin counts (one for all dims, one per dim), a range, weights, density, given edges (one set
    out of order, as eager takes them), points outside and on the last edge, an empty input and
    one whose dims hold a single value (the range widened)."""
    points = make((40, 3), dtype, device)
    yield SampleInput(points, 4)
    yield SampleInput(points, [2, 3, 5], range=[-1.0, 1.0, 0.0, 2.0, -3.0, 3.0], weight=make((40,), dtype, device))
    yield SampleInput(transposed((30, 4), dtype, device), [3, 2, 2, 4], density=True)
    edges = [torch.tensor(e, dtype=dtype, device=device) for e in ([-2.0, 0.0, 1.0], [0.0, -1.0, 2.0, 3.0])]
    yield SampleInput(make((5, 6, 2), dtype, device), edges)
    yield SampleInput(torch.tensor([[0.0, 1.0], [1.0, 1.0], [2.0, 0.0]], dtype=dtype, device=device), [2, 3])
    yield SampleInput(make((0, 2), dtype, device), [2, 2])
    yield SampleInput(torch.full((4, 2), 3.0, dtype=dtype, device=device), [3, 1], density=True)


def histogramdd_errors() -> Iterable[ErrorInput]:
    x = cpu((10, 2))
    yield ErrorInput(SampleInput(x, [2]), RuntimeError)
    yield ErrorInput(SampleInput(x, [2, 0]), RuntimeError)
    yield ErrorInput(SampleInput(x, [2, 2], range=[0.0, 1.0]), RuntimeError)
    yield ErrorInput(SampleInput(x, [2, 2], range=[1.0, 0.0, 0.0, 1.0]), RuntimeError)
    yield ErrorInput(SampleInput(x, [2, 2], weight=cpu((9,))), RuntimeError)
    yield ErrorInput(SampleInput(x, [torch.zeros(2, dtype=torch.float64), torch.zeros(2)]), RuntimeError)
    yield ErrorInput(SampleInput(cpu((10, 2), torch.int64), [2, 2]), NotImplementedError)
    yield ErrorInput(SampleInput(cpu((10,)), [2]), RuntimeError)


def histogram_samples(dtype, device) -> Iterable[SampleInput]:
    yield SampleInput(make((50,), dtype, device), 7)
    yield SampleInput(transposed((5, 6), dtype, device), 4, range=(-1.0, 1.0), weight=make((5, 6), dtype, device))
    yield SampleInput(make((30,), dtype, device), torch.tensor([-1.0, 0.0, 0.5, 2.0], dtype=dtype, device=device))
    yield SampleInput(make((), dtype, device), 3, density=True)


def histogram_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((5,)), 0), RuntimeError)
    yield ErrorInput(SampleInput(cpu((5,)), 3, range=(0.0, 1.0, 2.0)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((5,)), torch.zeros(0)), RuntimeError)
    yield ErrorInput(SampleInput(torch.tensor([1.0, math.inf]), 3), RuntimeError, match="not finite")


OPS += [
    OpInfo("histogramdd", torch.histogramdd, histogramdd_samples, histogramdd_errors, supports_grad=False),
    OpInfo("histogram", torch.histogram, histogram_samples, histogram_errors, supports_grad=False),
]
