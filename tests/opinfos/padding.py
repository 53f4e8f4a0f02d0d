"""Padding: F.pad's reflect, replicate and circular modes (1 to 3 padded dims, with and without a
batch dim, negative amounts that crop) and constant_pad_nd. Constant F.pad is in `joins.py`."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

from .core import ALL, FLOATS, ErrorInput, OpInfo, SampleInput, Strided, Transposed, cases, cpu

# Rows of (input, pad) valid in every non-constant mode.
MODE_ROWS = (
    ((3, 4), (1, 2)),
    ((2, 3, 4), (2, 1)),
    ((2, 3, 4), (0, 0)),  # nothing padded: still a copy
    ((2, 3, 4), (-1, 2)),  # crops on the left
    ((2, 3, 4), (2, -1)),
    ((2, 3, 4), (1, 1, 2, 0)),
    ((1, 2, 3, 4), (2, 3, -1, 1)),
    ((0, 3, 4), (1, 1)),  # an empty batch
    ((2, 3, 3, 4), (1, 1, 0, 2, 1, 1)),
    ((1, 2, 2, 3, 4), (1, 2, 1, 1, 1, 0)),
    ((3, 1), (0, 0)),
    (Transposed((2, 3, 4)), (2, 2, 1, 1)),
    (Strided((2, 3, 4)), (1, 3)),
)


def mode_samples(mode: str, extra: tuple = ()):
    rows = MODE_ROWS + extra
    return cases(*((spec, pad, mode) for spec, pad in rows))


def mode_errors(mode: str) -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((2, 3, 4)), (1, 1), "wrap"), NotImplementedError, "mode")
    yield ErrorInput(SampleInput(cpu((2, 3, 4)), (1, 1), mode, 1.0), RuntimeError, "value")
    yield ErrorInput(SampleInput(cpu((4,)), (1, 1), mode), NotImplementedError, "padding size")
    yield ErrorInput(SampleInput(cpu((1, 2, 3, 4)), (1, 1), mode), NotImplementedError, "padding size")
    yield ErrorInput(SampleInput(cpu((2, 3, 4)), (1, 1, 1), mode), RuntimeError, "divisible")


def reflect_errors() -> Iterable[ErrorInput]:
    yield from mode_errors("reflect")
    yield ErrorInput(SampleInput(cpu((2, 3, 4)), (4, 0), "reflect"), RuntimeError, "less than")
    yield ErrorInput(SampleInput(cpu((2, 3, 4)), (-2, -2), "reflect"), RuntimeError, "too small")
    yield ErrorInput(SampleInput(cpu((2, 0, 4)), (1, 1), "reflect"), RuntimeError, "non-zero")
    yield ErrorInput(SampleInput(cpu((2, 3, 4), torch.bool), (1, 1), "reflect"), NotImplementedError, "Bool")


def replicate_errors() -> Iterable[ErrorInput]:
    yield from mode_errors("replicate")
    yield ErrorInput(SampleInput(cpu((2, 3, 4)), (-3, -2), "replicate"), RuntimeError, "too small")
    yield ErrorInput(SampleInput(cpu((2, 3, 0)), (1, 1), "replicate"), RuntimeError, "non-zero")


def circular_errors() -> Iterable[ErrorInput]:
    yield from mode_errors("circular")
    yield ErrorInput(SampleInput(cpu((2, 3, 4)), (-3, -2), "circular"), RuntimeError, "empty dimension")
    yield ErrorInput(SampleInput(cpu((2, 3, 4)), (5, 0), "circular"), RuntimeError, "more than once")


PAD_CONSTANT_ND = cases(
    ((3, 4), (1, 2)),
    ((3, 4), (1, 2), 2),
    ((3, 4), [0, 1, -1, 2], -1.5),
    ((2, 3, 4), (0, 0)),
    ((), ()),
    ((0, 4), (1, 1), 3),
    (Transposed((3, 4)), (2, -1, 1, 1), 0.5),
)


def constant_pad_nd_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), (1, 1, 1, 1, 1, 1)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), (1,)), RuntimeError, "pad")
    yield ErrorInput(SampleInput(cpu((3, 4)), (-3, -2)), RuntimeError, "pad")


OPS = [
    OpInfo(
        "reflection_pad", F.pad, mode_samples("reflect"), reflect_errors, FLOATS + (torch.int64,), variant="reflect"
    ),
    OpInfo(
        "replication_pad",
        F.pad,
        mode_samples("replicate", (((2, 3, 4), (-5, 2)),)),
        replicate_errors,
        FLOATS + (torch.int64,),
        variant="replicate",
    ),
    OpInfo(
        "circular_pad",
        F.pad,
        mode_samples("circular", (((2, 3, 4), (4, 0)), ((2, 3, 4), (-4, 0)), ((2, 3, 4), (-2, 2)))),
        circular_errors,
        ALL,
        variant="circular",
    ),
    OpInfo("constant_pad_nd", torch.constant_pad_nd, PAD_CONSTANT_ND, constant_pad_nd_errors, ALL),
]
