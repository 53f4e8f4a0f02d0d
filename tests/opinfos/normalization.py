"""Normalisation layers: group norm (and its aten kernel), instance norm, local response norm."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

from .core import ACCUMULATING, ErrorInput, OpInfo, SampleInput, Strided, Transposed, cpu, make, tensor

NORM_TOLERANCE = {torch.float32: ACCUMULATING[torch.float32]}


def group_norm_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    yield SampleInput(make((2, 6, 5, 4), dtype, device), 3, make((6,), dtype, device), make((6,), dtype, device))
    yield SampleInput(make((2, 6, 5, 4), dtype, device), 2)
    yield SampleInput(make((3, 4, 7), dtype, device), 4, make((4,), dtype, device), eps=1e-3)
    yield SampleInput(make((2, 6), dtype, device), 3, bias=make((6,), dtype, device))
    yield SampleInput(make((0, 6, 3), dtype, device), 3)
    yield SampleInput(tensor(Transposed((2, 4, 5, 3)), dtype, device), 2, make((4,), dtype, device))
    yield SampleInput(tensor(Strided((2, 4, 3, 6)), dtype, device), 1)


def group_norm_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((4,)), 2), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 6, 3)), 4), RuntimeError)
    yield ErrorInput(SampleInput(cpu((1, 2)), 2), ValueError)
    yield ErrorInput(SampleInput(cpu((2, 6, 3)), 3, cpu((5,))), RuntimeError)


def native_group_norm_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    x = make((2, 6, 5, 4), dtype, device)
    yield SampleInput(x, make((6,), dtype, device), make((6,), dtype, device), 2, 6, 20, 3, 1e-5)
    yield SampleInput(make((3, 4, 7), dtype, device), None, None, 3, 4, 7, 2, 1e-3)


def instance_norm_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def stats():
        return make((4,), dtype, device), make((4,), dtype, device, low=0.5, high=2.0)

    yield SampleInput(make((2, 4, 5, 3), dtype, device))
    yield SampleInput(make((2, 4, 7), dtype, device), weight=make((4,), dtype, device), bias=make((4,), dtype, device))
    yield SampleInput(make((2, 4, 3, 2, 2), dtype, device), *stats(), use_input_stats=False)
    yield SampleInput(make((2, 4, 5), dtype, device), *stats(), make((4,), dtype, device), None, False, eps=1e-3)
    yield SampleInput(make((0, 4, 5), dtype, device))
    yield SampleInput(tensor(Transposed((2, 4, 5, 3)), dtype, device))
    yield SampleInput(tensor(Strided((2, 4, 3, 6)), dtype, device), momentum=0.5)


def instance_norm_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((2, 4, 1))), ValueError)
    yield ErrorInput(SampleInput(cpu((2, 4, 5)), cpu((3,)), cpu((3,))), RuntimeError)


def running_stats_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Running statistics with input statistics, which eager updates in place."""
    yield SampleInput(make((2, 4, 5, 3), dtype, device), make((4,), dtype, device), make((4,), dtype, device, low=0.5))
    yield SampleInput(
        make((3, 4, 6), dtype, device),
        make((4,), dtype, device),
        make((4,), dtype, device, low=0.5),
        make((4,), dtype, device),
        make((4,), dtype, device),
        momentum=0.3,
    )


def instance_norm_with_stats(input, running_mean, running_var, *args, **kwargs):
    """The output and the updated statistics, of copies: the samples' own stay as they are."""
    running_mean, running_var = running_mean.clone(), running_var.clone()
    out = F.instance_norm(input, running_mean, running_var, *args, **kwargs)
    return out, running_mean, running_var


def local_response_norm_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    yield SampleInput(make((2, 6, 5, 4), dtype, device), 3)
    yield SampleInput(make((2, 6, 7), dtype, device), 4, 1e-2, 0.5, 2.0)
    yield SampleInput(make((2, 5, 3, 4, 2), dtype, device), 2, alpha=0.1)
    yield SampleInput(make((0, 6, 3), dtype, device), 3)
    yield SampleInput(tensor(Transposed((2, 4, 5, 3)), dtype, device), 5)
    yield SampleInput(tensor(Strided((2, 4, 3, 6)), dtype, device), 1, k=0.5)


def local_response_norm_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((2, 4)), 2), ValueError)


OPS = [
    OpInfo("group_norm", F.group_norm, group_norm_samples, group_norm_errors, tolerances=NORM_TOLERANCE),
    OpInfo("native_group_norm", torch.native_group_norm, native_group_norm_samples, tolerances=NORM_TOLERANCE),
    OpInfo("instance_norm", F.instance_norm, instance_norm_samples, instance_norm_errors, tolerances=NORM_TOLERANCE),
    # The statistics are not differentiable; the input, weight and bias are.
    OpInfo(
        "instance_norm",
        instance_norm_with_stats,
        running_stats_samples,
        variant="running_stats",
        tolerances=NORM_TOLERANCE,
        supports_grad=False,
    ),
    OpInfo(
        "local_response_norm",
        F.local_response_norm,
        local_response_norm_samples,
        local_response_norm_errors,
        tolerances=NORM_TOLERANCE,
    ),
]
