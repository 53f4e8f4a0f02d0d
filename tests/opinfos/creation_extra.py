"""More creation ops: eye, linspace, logspace (number and 0-d tensor endpoints), and the
conjugation ops of real tensors."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .core import ALL, FLOATS, NUMERIC, ErrorInput, OpInfo, SampleInput, cpu
from .creation import FINITE


def eye_samples(dtype, device) -> Iterable[SampleInput]:
    if dtype == torch.get_default_dtype():
        yield SampleInput(3, device=device)
        yield SampleInput(2, 4, device=device)
    for args in ((3,), (3, 2), (0,), (0, 3), (1, 1)):
        yield SampleInput(*args, dtype=dtype, device=device)


def eye_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(-1), RuntimeError)
    yield ErrorInput(SampleInput(2, -3), RuntimeError)


def spaced_samples(dtype, device) -> Iterable[SampleInput]:
    if dtype == torch.get_default_dtype():
        for args in ((0, 1, 7), (-3, 10, 100), (2, -2, 5), (0, 1, 1), (0, 1, 0), (1.5, 2.5, 4)):
            yield SampleInput(*args, device=device)
        yield SampleInput(torch.tensor(1.0, device=device), torch.tensor(3.0, device=device), 6)
        yield SampleInput(torch.tensor(1.0, device=device), 4, 5)
    for args in ((0, 10, 5), (-4, 4, 9), (3, -3, 4)):
        yield SampleInput(*args, dtype=dtype, device=device)


def logspace_samples(dtype, device) -> Iterable[SampleInput]:
    yield from spaced_samples(dtype, device)
    yield SampleInput(0, 4, 5, base=2, dtype=dtype, device=device)
    yield SampleInput(1, -1, 3, 0.5, dtype=dtype, device=device)


def spaced_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(0, 1, -1), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2,)), 1, 3), RuntimeError)


def real_samples(dtype, device) -> Iterable[SampleInput]:
    yield from FINITE(dtype, device)


OPS = [
    OpInfo("eye", torch.eye, eye_samples, eye_errors, ALL, supports_grad=False),
    OpInfo("linspace", torch.linspace, spaced_samples, spaced_errors, NUMERIC, supports_grad=False),
    OpInfo("logspace", torch.logspace, logspace_samples, spaced_errors, FLOATS, supports_grad=False),
    OpInfo("conj", torch.conj, real_samples, dtypes=ALL),
    OpInfo("conj", lambda a: torch.conj(a) * 2, real_samples, variant="used", dtypes=NUMERIC),
    OpInfo("conj_physical", torch.conj_physical, real_samples, dtypes=ALL),
    OpInfo("resolve_conj", torch.resolve_conj, real_samples, dtypes=ALL),
    OpInfo("resolve_neg", torch.resolve_neg, real_samples, dtypes=ALL),
]
