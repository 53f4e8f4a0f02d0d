"""Convolutions: conv1d/2d/3d, conv_transpose1d/2d/3d and torch.convolution."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

from .core import ACCUMULATING, ErrorInput, OpInfo, SampleInput, cpu, make, transposed

# (input shape, weight shape, bias, keyword arguments) per spatial rank.
CONV_CASES = {
    1: [
        ((2, 4, 9), (6, 4, 3), True, {}),
        ((4, 9), (6, 4, 3), False, {"padding": 1}),  # unbatched
        ((2, 4, 9), (6, 2, 3), True, {"stride": 2, "groups": 2}),
        ((2, 4, 10), (4, 4, 4), False, {"padding": "same", "dilation": 2}),
        ((1, 3, 7), (5, 3, 2), True, {"padding": "same"}),  # an odd total padding
        ((2, 3, 7), (5, 3, 3), False, {"padding": "valid", "dilation": (2,)}),
    ],
    2: [
        ((2, 3, 8, 7), (4, 3, 3, 3), True, {}),
        ((2, 4, 8, 8), (6, 2, 3, 2), True, {"stride": (2, 1), "padding": (1, 0), "groups": 2}),
        ((3, 6, 6), (4, 3, 3, 3), False, {"dilation": 2, "padding": 2}),  # unbatched
        ((1, 2, 6, 5), (3, 2, 2, 3), True, {"padding": "same"}),
        ((0, 3, 5, 5), (4, 3, 3, 3), True, {}),  # empty batch
    ],
    3: [
        ((1, 2, 5, 4, 4), (3, 2, 2, 3, 2), True, {"stride": (1, 2, 1), "padding": 1}),
        ((2, 4, 4, 4, 4), (4, 1, 3, 3, 3), False, {"groups": 4}),  # depthwise
    ],
}

# (input shape, weight shape, bias, keyword arguments); weight is (in, out / groups, *kernel).
TRANSPOSE_CASES = {
    1: [
        ((2, 4, 6), (4, 3, 3), True, {"stride": 2, "output_padding": 1}),
        ((4, 6), (4, 3, 3), False, {"padding": 1}),  # unbatched
    ],
    2: [
        ((2, 4, 5, 5), (4, 3, 3, 3), True, {"stride": 2, "padding": 1, "output_padding": 1}),
        ((1, 4, 4, 5), (4, 2, 2, 3), True, {"groups": 2, "dilation": (2, 1)}),
    ],
    3: [((1, 2, 3, 3, 3), (2, 2, 2, 2, 2), True, {"stride": 2})],
}


def conv_samples(cases: list, *, transpose: bool = False):
    """The cases, then the first one with a non-contiguous input."""

    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        for in_shape, w_shape, has_bias, kwargs in cases:
            channels = w_shape[1] * kwargs.get("groups", 1) if transpose else w_shape[0]
            bias = make((channels,), dtype, device) if has_bias else None
            yield SampleInput(make(in_shape, dtype, device), make(w_shape, dtype, device), bias, **kwargs)
        in_shape, w_shape, _, kwargs = cases[0]
        yield SampleInput(transposed(in_shape, dtype, device), make(w_shape, dtype, device), None, **kwargs)

    return generate


def conv_errors(n: int):
    def errors() -> Iterable[ErrorInput]:
        spatial = (5,) * n
        yield ErrorInput(SampleInput(cpu((1, 3, *spatial)), cpu((4, 2, *(3,) * n))), RuntimeError, "channels")
        yield ErrorInput(SampleInput(cpu((1, 3, *spatial)), cpu((4, 3))), RuntimeError, "weight")
        yield ErrorInput(
            SampleInput(cpu((1, 3, *spatial)), cpu((4, 3, *(3,) * n)), stride=2, padding="same"),
            RuntimeError,
            "strided",
        )
        yield ErrorInput(SampleInput(cpu((1, 3, *spatial)), cpu((4, 3, *(9,) * n))), RuntimeError, "too small")
        yield ErrorInput(SampleInput(cpu((1, 3, *(0,) * n)), cpu((4, 3, *(1,) * n))), RuntimeError, "too small")

    return errors


def _convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    return torch.convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups)


def convolution_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    x, w, b = make((2, 3, 6, 6), dtype, device), make((4, 3, 3, 3), dtype, device), make((4,), dtype, device)
    yield SampleInput(x, w, b, [1, 2], [1, 0], [1, 1], False, [0, 0], 1)
    xt, wt = make((2, 4, 3, 3), dtype, device), make((4, 2, 3, 3), dtype, device)
    yield SampleInput(xt, wt, None, [2, 2], [0, 0], [1, 1], True, [1, 1], 1)


OPS = [
    *(
        OpInfo(
            f"conv{n}d", getattr(F, f"conv{n}d"), conv_samples(CONV_CASES[n]), conv_errors(n), tolerances=ACCUMULATING
        )
        for n in (1, 2, 3)
    ),
    *(
        OpInfo(
            f"conv_transpose{n}d",
            getattr(F, f"conv_transpose{n}d"),
            conv_samples(TRANSPOSE_CASES[n], transpose=True),
            tolerances=ACCUMULATING,
        )
        for n in (1, 2, 3)
    ),
    OpInfo("convolution", _convolution, convolution_samples, tolerances=ACCUMULATING),
]
