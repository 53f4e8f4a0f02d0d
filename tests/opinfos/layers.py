"""Layers with weights beyond linear and embedding: bilinear and embedding_bag."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

from .core import ACCUMULATING, ErrorInput, Tolerance, OpInfo, SampleInput, Strided, Transposed, cpu, make, tensor


def bilinear_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def weight():
        return make((6, 4, 5), dtype, device)

    yield SampleInput(make((3, 4), dtype, device), make((3, 5), dtype, device), weight(), make((6,), dtype, device))
    yield SampleInput(make((2, 3, 4), dtype, device), make((2, 3, 5), dtype, device), weight())
    yield SampleInput(make((4,), dtype, device), make((5,), dtype, device), weight(), make((6,), dtype, device))
    yield SampleInput(make((0, 4), dtype, device), make((0, 5), dtype, device), weight())
    yield SampleInput(tensor(Transposed((4, 3)), dtype, device).mT, tensor(Strided((3, 5)), dtype, device), weight())


def bilinear_errors() -> Iterable[ErrorInput]:
    w = cpu((6, 4, 5))
    yield ErrorInput(SampleInput(cpu((2, 4)), cpu((3, 5)), w), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 3)), cpu((2, 5)), w), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 4)), cpu((2, 5)), w, cpu((5,))), RuntimeError)


def bag_inputs(device: str):
    indices = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 2, 2], device=device)
    return indices, torch.tensor([0, 4, 4, 7], device=device)


def embedding_bag_samples(mode: str):
    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        indices, offsets = bag_inputs(device)
        weight = make((10, 3), dtype, device)
        yield SampleInput(indices, weight, offsets, mode=mode)  # one bag empty
        yield SampleInput(indices.reshape(2, 5), weight, mode=mode)
        yield SampleInput(
            indices, weight, torch.tensor([0, 4, 4, 7, 10], device=device), mode=mode, include_last_offset=True
        )
        yield SampleInput(indices, weight, offsets, mode=mode, padding_idx=2)
        yield SampleInput(indices.int(), tensor(Transposed((10, 3)), dtype, device), offsets.int(), mode=mode)
        yield SampleInput(indices, weight.round(), offsets, mode=mode)  # ties
        if mode != "max":  # (eager's max refuses it)
            yield SampleInput(indices, weight, offsets, mode=mode, scale_grad_by_freq=True)
        if mode == "sum":
            yield SampleInput(indices, weight, offsets, mode=mode, per_sample_weights=make((10,), dtype, device))

    return generate


def embedding_bag_errors() -> Iterable[ErrorInput]:
    indices, offsets = bag_inputs("cpu")
    w = cpu((10, 3))
    yield ErrorInput(SampleInput(indices, w, offsets, mode="bogus"), ValueError)
    yield ErrorInput(SampleInput(indices.reshape(2, 5), w, offsets), ValueError)
    yield ErrorInput(SampleInput(indices, w), ValueError)
    yield ErrorInput(SampleInput(indices, w, offsets, mode="mean", per_sample_weights=cpu((10,))), NotImplementedError)
    yield ErrorInput(SampleInput(indices.float(), w, offsets), RuntimeError)
    yield ErrorInput(SampleInput(indices, cpu((10,)), offsets), ValueError)
    yield ErrorInput(SampleInput(indices, w, torch.tensor([1, 4])), RuntimeError)
    yield ErrorInput(SampleInput(indices, w, torch.tensor([0, 4, 12])), RuntimeError)


OPS = [
    # Sums of products of three values in [-9, 9]: float32 rounding in another order is near 1e-4.
    # float64 only: under autocast eager lowers float32 inside aten's _trilinear, which thunder_rs
    # refuses (tests/test_pool_decompositions.py checks that it says so).
    OpInfo(
        "bilinear",
        F.bilinear,
        bilinear_samples,
        bilinear_errors,
        (torch.float64,),
        tolerances={torch.float32: Tolerance(1e-4, 1e-4)},
    ),
    *(
        OpInfo(
            "embedding_bag",
            F.embedding_bag,
            embedding_bag_samples(mode),
            embedding_bag_errors if mode == "sum" else (lambda: ()),
            variant=mode,
            tolerances=ACCUMULATING,
        )
        for mode in ("sum", "mean", "max")
    ),
]
