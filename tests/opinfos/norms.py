"""Norms and NaN-aware reductions: vector/matrix norms, linalg.norm, torch.norm, nuclear_norm, dist, renorm,
nansum, nanmean, aminmax, msort, diff."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from .core import ACCUMULATING, ALL, NUMERIC, ErrorInput, OpInfo, SampleInput, cpu, make, strided, transposed

LA = torch.linalg
INF = math.inf


def with_zero_row(shape, dtype, device):
    """A tensor whose first row is zero: where a norm's gradient needs eager's convention."""
    x = make(shape, dtype, device)
    x[0] = 0
    return x


def vector_norm_samples(dtype, device) -> Iterable[SampleInput]:
    for ord in (2, 1, 0, 3, 0.5, 1.5, INF, -INF, -1):
        yield SampleInput(with_zero_row((3, 4), dtype, device), ord, 1)
    yield SampleInput(make((3, 4), dtype, device))
    yield SampleInput(make((), dtype, device), 3)
    yield SampleInput(transposed((3, 4), dtype, device), 2, (0, 1), True)
    yield SampleInput(strided((2, 3, 4), dtype, device), INF, -1, True)
    yield SampleInput(make((0, 3), dtype, device), 2, 0)
    yield SampleInput(make((3,), torch.float32, device), dtype=torch.float64)


def vector_norm_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,), torch.int64)), NotImplementedError)
    yield ErrorInput(SampleInput(cpu((0,)), INF), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3,), torch.float64), dtype=torch.float32), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3,)), dtype=torch.int64), RuntimeError)


def matrix_norm_samples(dtype, device) -> Iterable[SampleInput]:
    for ord in ("fro", "nuc", 1, -1, 2, -2, INF, -INF):
        yield SampleInput(make((2, 3, 4), dtype, device), ord)
        yield SampleInput(make((2, 3, 4), dtype, device), ord, (0, 2), True)
    yield SampleInput(transposed((3, 4), dtype, device), 1, (1, 0))


def matrix_norm_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 3), torch.int64)), NotImplementedError)
    yield ErrorInput(SampleInput(cpu((3,))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 3)), 3), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 3)), dim=(0, 0)), RuntimeError)


def linalg_norm_samples(dtype, device) -> Iterable[SampleInput]:
    yield SampleInput(make((2, 3, 4), dtype, device))
    yield SampleInput(make((3, 4), dtype, device), 2)
    yield SampleInput(make((3, 4), dtype, device), "nuc")
    yield SampleInput(make((4,), dtype, device), 3)
    yield SampleInput(make((3, 4), dtype, device), 3, 1)
    yield SampleInput(make((2, 3, 4), dtype, device), INF, (1, 2), True)
    yield SampleInput(make((2, 3, 4), dtype, device), None, (0, 2))


def linalg_norm_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((2, 3, 4)), 2), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 3, 4)), 2, (0, 1, 2)), RuntimeError)


def torch_norm_samples(dtype, device) -> Iterable[SampleInput]:
    yield SampleInput(make((3, 4), dtype, device))
    yield SampleInput(make((3, 4), dtype, device), 3, 1)
    yield SampleInput(make((3, 4), dtype, device), "nuc")
    yield SampleInput(make((2, 3, 4), dtype, device), "fro", (0, 1), True)
    yield SampleInput(make((3, 4), dtype, device), INF)
    yield SampleInput(make((2, 3, 4), dtype, device), 1, -1, dtype=torch.float64)


def nuclear_norm_samples(dtype, device) -> Iterable[SampleInput]:
    yield SampleInput(make((3, 4), dtype, device))
    yield SampleInput(make((2, 3, 4), dtype, device), True)
    yield SampleInput(transposed((3, 4), dtype, device), (1, 0), keepdim=True)


def nuclear_norm_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 3), torch.int64)), NotImplementedError)
    yield ErrorInput(SampleInput(cpu((3,))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 3)), (0,)), RuntimeError)


def dist_samples(dtype, device) -> Iterable[SampleInput]:
    for p in (2, 1, 0, 3, INF):
        yield SampleInput(make((3, 4), dtype, device), make((4,), dtype, device), p)
    yield SampleInput(make((), dtype, device), make((2, 3), dtype, device))
    yield SampleInput(make((3, 4), dtype, device), make((3, 4), torch.float64, device))


def dist_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,), torch.int64), cpu((3,), torch.int64)), NotImplementedError)
    yield ErrorInput(SampleInput(cpu((3,)), cpu((4,))), RuntimeError)


def renorm_samples(dtype, device) -> Iterable[SampleInput]:
    yield SampleInput(make((3, 4), dtype, device), 2, 0, 1.0)
    yield SampleInput(make((3, 4), dtype, device), 1, 1, 2.0)
    yield SampleInput(make((2, 3, 4), dtype, device), 3, -1, 5.0)
    yield SampleInput(transposed((3, 4), dtype, device), INF, 0, 0.5)
    yield SampleInput(make((0, 4), dtype, device), 2, 1, 1.0)


def renorm_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), 0, 0, 1.0), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 2, 0, -1.0), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4), torch.int64), 2, 0, 1.0), NotImplementedError)


def with_nans(dtype, device, shape=(3, 4)):
    x = make(shape, dtype, device)
    if dtype.is_floating_point:
        x.view(-1)[::3] = math.nan
    return x


def nan_reduction_samples(dtype, device) -> Iterable[SampleInput]:
    yield SampleInput(with_nans(dtype, device))
    yield SampleInput(with_nans(dtype, device), 1)
    yield SampleInput(with_nans(dtype, device, (2, 3, 4)), (0, 2), True)
    yield SampleInput(make((), dtype, device))
    yield SampleInput(make((0, 3), dtype, device), 1)
    yield SampleInput(transposed((3, 4), dtype, device), 0)


def aminmax_samples(dtype, device) -> Iterable[SampleInput]:
    yield SampleInput(make((3, 4), dtype, device))
    yield SampleInput(make((3, 4), dtype, device), dim=1)
    yield SampleInput(make((3, 4), dtype, device), dim=0, keepdim=True)
    yield SampleInput(make((), dtype, device))
    yield SampleInput(make((0, 3), dtype, device), dim=1)
    yield SampleInput(strided((2, 3, 4), dtype, device), dim=-1)


def aminmax_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((0,))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((0, 3)), dim=0), IndexError)


def sort_samples(dtype, device) -> Iterable[SampleInput]:
    yield SampleInput(make((5,), dtype, device))
    yield SampleInput(make((4, 3), dtype, device))
    yield SampleInput(make((), dtype, device))
    yield SampleInput(make((0, 3), dtype, device))
    yield SampleInput(transposed((3, 4), dtype, device))


def diff_samples(dtype, device) -> Iterable[SampleInput]:
    yield SampleInput(make((3, 4), dtype, device))
    yield SampleInput(make((3, 4), dtype, device), 2, 0)
    yield SampleInput(make((3, 4), dtype, device), 5)
    yield SampleInput(make((3, 4), dtype, device), 0)
    yield SampleInput(make((3, 4), dtype, device), 1, -1, make((3, 1), dtype, device), make((3, 2), dtype, device))
    yield SampleInput(transposed((3, 4), dtype, device), append=make((3, 1), torch.float64, device))
    yield SampleInput(make((0,), dtype, device))


def diff_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu(())), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3,)), -1), RuntimeError)


OPS = [
    OpInfo("linalg_vector_norm", LA.vector_norm, vector_norm_samples, vector_norm_errors, tolerances=ACCUMULATING),
    OpInfo("linalg_matrix_norm", LA.matrix_norm, matrix_norm_samples, matrix_norm_errors, tolerances=ACCUMULATING),
    OpInfo("linalg_norm", LA.norm, linalg_norm_samples, linalg_norm_errors, tolerances=ACCUMULATING),
    OpInfo("norm", torch.norm, torch_norm_samples, tolerances=ACCUMULATING),
    OpInfo(
        "tensor_norm", lambda a, *args, **kwargs: a.norm(*args, **kwargs), torch_norm_samples, tolerances=ACCUMULATING
    ),
    OpInfo("nuclear_norm", torch.nuclear_norm, nuclear_norm_samples, nuclear_norm_errors, tolerances=ACCUMULATING),
    OpInfo("dist", torch.dist, dist_samples, dist_errors, tolerances=ACCUMULATING),
    OpInfo("renorm", torch.renorm, renorm_samples, renorm_errors, tolerances=ACCUMULATING),
    OpInfo("nansum", torch.nansum, nan_reduction_samples, dtypes=ALL, tolerances=ACCUMULATING),
    OpInfo("nanmean", torch.nanmean, nan_reduction_samples, tolerances=ACCUMULATING),
    OpInfo("aminmax", torch.aminmax, aminmax_samples, aminmax_errors, ALL),
    OpInfo("msort", torch.msort, sort_samples, dtypes=NUMERIC),
    OpInfo("diff", torch.diff, diff_samples, diff_errors, ALL),
]
