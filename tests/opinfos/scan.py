"""Scans: cumsum, cumprod, cummax, cummin, logcumsumexp."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .core import (
    ACCUMULATING,
    ALL,
    FLOATS,
    ErrorInput,
    OpInfo,
    SampleInput,
    Strided,
    Transposed,
    cases,
    chain_samples,
    cpu,
    make,
)

# (tensor, dim): 0-d, empty, every dim of a 3-d tensor, negative dims, non-contiguous layouts.
SCAN_CASES = cases(
    ((), 0),
    ((), -1),
    ((0,), 0),
    ((5,), 0),
    ((2, 0, 3), 1),
    ((2, 3, 4), 0),
    ((2, 3, 4), 1),
    ((2, 3, 4), -1),
    (Transposed((3, 4)), 0),
    (Strided((2, 3, 4)), 2),
)


def with_zeros(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Zeros, where cumprod's gradient takes its special path: none, one, several in a row."""
    a = make((3, 6), dtype, device, low=0.5, high=2.0)
    a[0, 2] = 0
    a[1, 1] = 0
    a[1, 4] = 0
    a[2, 0] = 0
    yield SampleInput(a, 1)
    yield SampleInput(a.t().contiguous(), 0)


def ties(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Repeated values, where cummax/cummin pick the last index of the extremum."""
    yield SampleInput(torch.tensor([[1, 3, 3, 2, 3], [0, 0, -1, -1, 5]], dtype=dtype, device=device), 1)


def with_dtype(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    yield SampleInput(make((2, 3), dtype, device), 1, dtype=torch.float64)
    yield SampleInput(make((4,), dtype, device), 0, dtype=torch.int64)


def dim_errors(op) -> callable:
    def errors() -> Iterable[ErrorInput]:
        yield ErrorInput(SampleInput(cpu((2, 3)), 2), IndexError)
        yield ErrorInput(SampleInput(cpu(()), 1), IndexError)

    return errors


def logcumsumexp_errors() -> Iterable[ErrorInput]:
    yield from dim_errors(torch.logcumsumexp)()
    yield ErrorInput(SampleInput(cpu((3,), torch.int64), 0), NotImplementedError)


def trapezoid_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Unit and scalar spacing along each dim, sample points as a 1-d and a full tensor, an empty
    dim, a 0-d spacing tensor and a non-contiguous input."""
    y = make((3, 5), dtype, device)
    points = (
        make((5,), dtype, device, low=0, high=1).cumsum(0)
        if dtype.is_floating_point
        else torch.arange(5, device=device)
    )
    yield SampleInput(y)
    yield SampleInput(y, dx=0.5, dim=0)
    yield SampleInput(y, points)
    yield SampleInput(y, points.expand(3, 5), dim=-1)
    yield SampleInput(make((3, 0), dtype, device))
    yield SampleInput(make((4,), dtype, device))
    yield SampleInput(make((2, 6), dtype, device, noncontiguous=True), dx=2)


def trapezoid_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 5)), cpu((4,))), RuntimeError, "one `x` value")


OPS = [
    OpInfo("trapezoid", torch.trapezoid, trapezoid_samples, trapezoid_errors, dtypes=ALL[:3], tolerances=ACCUMULATING),
    OpInfo("trapezoid", torch.trapz, trapezoid_samples, dtypes=FLOATS, variant="trapz", tolerances=ACCUMULATING),
    OpInfo(
        "cumulative_trapezoid",
        torch.cumulative_trapezoid,
        trapezoid_samples,
        trapezoid_errors,
        dtypes=ALL[:3],
        tolerances=ACCUMULATING,
    ),
    OpInfo(
        "cumsum",
        torch.cumsum,
        chain_samples(SCAN_CASES, with_dtype),
        dim_errors(torch.cumsum),
        dtypes=ALL,
        tolerances=ACCUMULATING,
        nondifferentiable=("dtype",),
    ),
    OpInfo("cumsum", torch.Tensor.cumsum, SCAN_CASES, dtypes=ALL, variant="method", tolerances=ACCUMULATING),
    OpInfo(
        "cumprod",
        torch.cumprod,
        chain_samples(SCAN_CASES, with_zeros),
        dim_errors(torch.cumprod),
        dtypes=ALL,
        tolerances=ACCUMULATING,
    ),
    OpInfo("cummax", torch.cummax, chain_samples(SCAN_CASES, ties), dim_errors(torch.cummax), dtypes=ALL),
    OpInfo("cummin", torch.cummin, chain_samples(SCAN_CASES, ties), dim_errors(torch.cummin), dtypes=ALL),
    OpInfo("logcumsumexp", torch.logcumsumexp, SCAN_CASES, logcumsumexp_errors, dtypes=FLOATS, tolerances=ACCUMULATING),
]
