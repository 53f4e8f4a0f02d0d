"""Pooling ops: max, average, power-average, adaptive and un-pooling over 1 to 3 spatial dims."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

from .core import (
    ACCUMULATING,
    FLOATS,
    ErrorInput,
    OpInfo,
    SampleInput,
    Strided,
    Transposed,
    cpu,
    make,
    tensor,
)
from .random import seeded

FLOATS_AND_LONG = FLOATS + (torch.int64,)


def spatial(n: int, *sizes: int) -> tuple[int, ...]:
    """A (N, C, s...) shape with ``n`` spatial dims, the sizes given cycled."""
    return (*sizes[:2], *(sizes[2 + i % (len(sizes) - 2)] for i in range(n)))


def ties(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    """Small integers, so that windows hold equal maxima: gradients at ties."""
    return torch.randint(-2, 3, shape, device=device).to(dtype)


# -- max pooling -----------------------------------------------------------------------------------


def max_pool_samples(n: int, with_indices: bool = False):
    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        kw = {"return_indices": True} if with_indices else {}
        yield SampleInput(make(spatial(n, 2, 3, 7, 6), dtype, device), 3, **kw)
        yield SampleInput(make(spatial(n, 2, 3, 9, 8), dtype, device), 3, 2, 1, **kw)
        yield SampleInput(make(spatial(n, 1, 2, 9, 8), dtype, device), (3,) * n, (2,) * n, 1, 2, True, **kw)
        yield SampleInput(make(spatial(n, 2, 7, 5), dtype, device)[0], 2, ceil_mode=True, **kw)  # unbatched
        yield SampleInput(make(spatial(n, 0, 3, 6), dtype, device), 2, **kw)  # empty batch
        yield SampleInput(tensor(Transposed(spatial(n, 2, 3, 6, 5)), dtype, device), 2, 1, **kw)
        yield SampleInput(tensor(Strided(spatial(n, 2, 3, 6, 5)), dtype, device), 2, padding=1, **kw)
        yield SampleInput(ties(spatial(n, 2, 2, 6, 5), dtype, device), 3, 1, 1, **kw)
        if dtype.is_floating_point:  # -inf and NaN in windows: NaN wins
            special = torch.tensor([-float("inf"), 1.0, float("nan"), 2.0], dtype=dtype, device=device).repeat(4)
            yield SampleInput(special.reshape({1: (1, 4, 4), 2: (1, 1, 4, 4), 3: (1, 1, 2, 2, 4)}[n]), 2, **kw)
        if not with_indices:
            yield SampleInput(make(spatial(n, 2, 3, 6), dtype, device), 2, return_indices=True)

    return generate


def max_pool_errors(fn, n: int):
    def generate() -> Iterable[ErrorInput]:
        x = cpu(spatial(n, 1, 2, 5))
        yield ErrorInput(SampleInput(x, 0), RuntimeError)
        yield ErrorInput(SampleInput(x, 2, padding=2), RuntimeError)
        yield ErrorInput(SampleInput(x, 2, dilation=0), RuntimeError)
        yield ErrorInput(SampleInput(x, 6), RuntimeError)
        yield ErrorInput(SampleInput(cpu((5,) * n), 2), RuntimeError)
        yield ErrorInput(SampleInput(cpu(spatial(n, 1, 2, 5), torch.bool), 2), NotImplementedError)

    return generate


# -- average pooling -------------------------------------------------------------------------------


def avg_pool_samples(n: int):
    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        yield SampleInput(make(spatial(n, 2, 3, 7, 6), dtype, device), 3)
        yield SampleInput(make(spatial(n, 2, 3, 9, 8), dtype, device), 3, 2, 1)
        yield SampleInput(make(spatial(n, 2, 3, 9, 8), dtype, device), 3, 2, 1, True, False)
        yield SampleInput(make(spatial(n, 1, 2, 8, 7), dtype, device), (3,) * n, (2,) * n, 1, ceil_mode=True)
        yield SampleInput(make(spatial(n, 2, 7, 5), dtype, device)[0], 2, ceil_mode=True, count_include_pad=False)
        yield SampleInput(make(spatial(n, 0, 3, 6), dtype, device), 2)
        yield SampleInput(tensor(Transposed(spatial(n, 2, 3, 6, 5)), dtype, device), 2, 1)
        yield SampleInput(tensor(Strided(spatial(n, 2, 3, 6, 5)), dtype, device), 2, padding=1)
        if n > 1:
            yield SampleInput(make(spatial(n, 2, 3, 7, 6), dtype, device), 3, 2, 1, divisor_override=5)

    return generate


def avg_pool_errors(n: int):
    def generate() -> Iterable[ErrorInput]:
        x = cpu(spatial(n, 1, 2, 5))
        yield ErrorInput(SampleInput(x, 2, padding=2), RuntimeError)
        yield ErrorInput(SampleInput(x, 6), RuntimeError)
        # aten's avg_pool2d reads the channel dim of a 2-D input before it checks the dims.
        yield ErrorInput(SampleInput(cpu((5,) * n), 2), IndexError if n == 2 else RuntimeError)
        if n > 1:
            yield ErrorInput(SampleInput(x, 2, divisor_override=0), RuntimeError)

    return generate


# -- adaptive pooling ------------------------------------------------------------------------------


def adaptive_samples(n: int, max_pool: bool):
    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        kw = {"return_indices": True} if max_pool else {}
        yield SampleInput(make(spatial(n, 2, 3, 7, 6), dtype, device), 3)
        yield SampleInput(make(spatial(n, 2, 3, 9, 8), dtype, device), (4, 5, 2)[:n], **kw)
        yield SampleInput(make(spatial(n, 2, 3, 5), dtype, device), 1)
        yield SampleInput(make(spatial(n, 2, 3, 4), dtype, device), 7)  # larger than the input: windows overlap
        # Unbatched; None keeps the input's size along a dim.
        yield SampleInput(make(spatial(n, 1, 3, 5), dtype, device)[0], {1: 2, 2: (None, 3), 3: (2, None, 3)}[n])
        yield SampleInput(make(spatial(n, 0, 3, 6), dtype, device), 2)
        yield SampleInput(tensor(Transposed(spatial(n, 2, 3, 6, 5)), dtype, device), 4, **kw)
        yield SampleInput(tensor(Strided(spatial(n, 2, 3, 6, 5)), dtype, device), 3)
        yield SampleInput(ties(spatial(n, 2, 2, 7, 5), dtype, device), 3, **kw)

    return generate


def adaptive_errors(n: int):
    def generate() -> Iterable[ErrorInput]:
        if n == 1:
            yield ErrorInput(SampleInput(cpu((1, 2, 5)), None), TypeError)
        yield ErrorInput(SampleInput(cpu((5,) * n), 2), RuntimeError)
        yield ErrorInput(SampleInput(cpu(spatial(n, 1, 2, 5), torch.int64), 2), NotImplementedError)

    return generate


# -- power-average pooling and unpooling -----------------------------------------------------------


def lp_pool_samples(n: int):
    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        yield SampleInput(make(spatial(n, 2, 3, 7, 6), dtype, device, low=0.1, high=2.0), 2, 3)
        yield SampleInput(make(spatial(n, 2, 3, 9, 8), dtype, device, low=0.1, high=2.0), 3.0, 3, 2, True)
        yield SampleInput(make(spatial(n, 2, 3, 6), dtype, device), 1, 2)
        yield SampleInput(make(spatial(n, 2, 3, 6), dtype, device), float("inf"), 2)
        yield SampleInput(tensor(Transposed(spatial(n, 2, 3, 6, 5)), dtype, device), float("-inf"), 2, 1)
        yield SampleInput(tensor(Strided(spatial(n, 2, 3, 6, 5)), dtype, device, low=0.1, high=2.0), 2, 2)

    return generate


def lp_pool_errors(n: int):
    def generate() -> Iterable[ErrorInput]:
        yield ErrorInput(SampleInput(cpu(spatial(n, 1, 2, 5)), 0, 2), ValueError)

    return generate


def unpool_samples(n: int):
    pool = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[n - 1]

    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        x = make(spatial(n, 2, 3, 6), dtype, device)
        out, indices = pool(x, 2, return_indices=True)
        yield SampleInput(out, indices, 2)
        yield SampleInput(out, indices, 2, output_size=spatial(n, 2, 3, 7)[2:])
        out, indices = pool(make(spatial(n, 2, 3, 7), dtype, device), 3, 2, 1, return_indices=True)
        yield SampleInput(out, indices, 3, 2, 1, output_size=spatial(n, 2, 3, 7))
        # Overlapping windows: one element is the maximum of several, written once per window.
        out, indices = pool(ties(spatial(n, 1, 2, 6), dtype, device), 3, 1, 1, return_indices=True)
        yield SampleInput(out, indices, 3, 1, 1)
        yield SampleInput(out[0], indices[0], 3, 1, 1)

    return generate


def unpool_errors(n: int):
    def generate() -> Iterable[ErrorInput]:
        x = cpu(spatial(n, 1, 2, 3))
        indices = torch.zeros(x.shape, dtype=torch.int64)
        yield ErrorInput(SampleInput(x, indices.float(), 2), RuntimeError)
        yield ErrorInput(SampleInput(x, indices[..., :2], 2), RuntimeError)
        yield ErrorInput(SampleInput(x, indices, 2, output_size=(1,) * n), ValueError)

    return generate


def _pool_ops(n: int) -> list[OpInfo]:
    d = f"{n}d"
    max_pool = getattr(F, f"max_pool{d}")
    long_ok = FLOATS_AND_LONG if n > 1 else FLOATS
    return [
        OpInfo(f"max_pool{d}", max_pool, max_pool_samples(n), max_pool_errors(max_pool, n), long_ok),
        OpInfo(
            f"max_pool{d}",
            getattr(F, f"max_pool{d}_with_indices"),
            max_pool_samples(n, True),
            dtypes=FLOATS,
            variant="with_indices",
        ),
        OpInfo(
            f"avg_pool{d}",
            getattr(F, f"avg_pool{d}"),
            avg_pool_samples(n),
            avg_pool_errors(n),
            FLOATS_AND_LONG,
            tolerances=ACCUMULATING,
        ),
        OpInfo(
            f"adaptive_avg_pool{d}",
            getattr(F, f"adaptive_avg_pool{d}"),
            adaptive_samples(n, False),
            adaptive_errors(n),
            tolerances=ACCUMULATING,
        ),
        OpInfo(
            f"adaptive_max_pool{d}", getattr(F, f"adaptive_max_pool{d}"), adaptive_samples(n, True), adaptive_errors(n)
        ),
        OpInfo(
            f"adaptive_max_pool{d}",
            getattr(F, f"adaptive_max_pool{d}_with_indices"),
            adaptive_samples(n, False),
            variant="with_indices",
        ),
        OpInfo(
            f"lp_pool{d}", getattr(F, f"lp_pool{d}"), lp_pool_samples(n), lp_pool_errors(n), tolerances=ACCUMULATING
        ),
        OpInfo(f"max_unpool{d}", getattr(F, f"max_unpool{d}"), unpool_samples(n), unpool_errors(n)),
    ]


OPS = [op for n in (1, 2, 3) for op in _pool_ops(n)]


# -- sliding blocks --------------------------------------------------------------------------------

BLOCK_ARGS = ((2,), (3, 1, 1, 1), ((2, 3), (1, 2), (1, 0), (2, 1)), (3, 1, 3, 2))


def unfold_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for args in BLOCK_ARGS:
        yield SampleInput(make((2, 3, 7, 6), dtype, device), *args)
    yield SampleInput(make((3, 7, 6), dtype, device), 2, stride=2)  # unbatched
    yield SampleInput(make((0, 3, 5, 5), dtype, device), 2)
    yield SampleInput(tensor(Transposed((2, 3, 6, 5)), dtype, device), 3, padding=1)
    yield SampleInput(tensor(Strided((2, 3, 6, 5)), dtype, device), (2, 1), dilation=2)


def unfold_errors() -> Iterable[ErrorInput]:
    x = cpu((2, 3, 5, 5))
    yield ErrorInput(SampleInput(x, 6), RuntimeError)
    yield ErrorInput(SampleInput(x, 0), RuntimeError)
    yield ErrorInput(SampleInput(x, 2, padding=-1), RuntimeError)
    yield ErrorInput(SampleInput(x, 2, stride=0), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 0, 5, 5)), 2), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 3, 5, 5), torch.int64), 2), NotImplementedError)


def fold_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for args in BLOCK_ARGS:
        columns = F.unfold(make((2, 3, 7, 6), torch.float64, device), *args).to(dtype)
        yield SampleInput(columns, (7, 6), *args)
    yield SampleInput(make((12, 16), dtype, device), 5, 2)  # unbatched
    yield SampleInput(make((0, 12, 16), dtype, device), (5, 5), 2)
    yield SampleInput(tensor(Transposed((2, 12, 16)), dtype, device), (5, 5), (2, 2))
    yield SampleInput(tensor(Strided((2, 8, 9)), dtype, device), (4, 5), (2, 1), stride=(1, 2))


def fold_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((2, 12, 15)), (5, 5), 2), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 11, 16)), (5, 5), 2), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 12, 16), torch.int64), (5, 5), 2), NotImplementedError)


OPS += [
    OpInfo("unfold", F.unfold, unfold_samples, unfold_errors, FLOATS + (torch.bool,), variant="im2col"),
    OpInfo("fold", F.fold, fold_samples, fold_errors, FLOATS + (torch.bool,), tolerances=ACCUMULATING),
]


def _fractional_samples(n: int):
    """Output sizes and ratios, a window as large as the output allows, one output position,
    unbatched, transposed, channels-last and empty-batch inputs, indices asked for."""

    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        shape = (2, 3, 9, 8, 7)[: n + 2]
        yield SampleInput(make(shape, dtype, device), 2, output_size=4)
        yield SampleInput(make(shape, dtype, device), (3,) * n, output_ratio=(0.5,) * n, return_indices=True)
        yield SampleInput(make(shape[1:], dtype, device), 2, output_size=(1,) * n)
        yield SampleInput(tensor(Transposed(shape), dtype, device), 2, output_size=(3,) * n)
        yield SampleInput(make(shape, dtype, device).to(memory_format=_CHANNELS_LAST[n]), 3, output_size=(4,) * n)
        yield SampleInput(make((0, *shape[1:]), dtype, device), 2, output_size=3, return_indices=True)

    return generate


def _fractional_kernel_samples(n: int):
    """aten's kernel with given samples: more sample rows than the batch, samples at 0 and near 1."""

    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        shape = (2, 3, 9, 8, 7)[: n + 2]
        samples = torch.rand(3, 3, n, dtype=dtype, device=device)
        samples[0, 0], samples[1, 1] = 0.0, 0.999
        yield SampleInput(make(shape, dtype, device), (2,) * n, (5,) * n, samples)
        yield SampleInput(make(shape[1:], dtype, device), 3, 4, samples[:1])

    return generate


def _fractional_errors(n: int):
    def generate() -> Iterable[ErrorInput]:
        x = cpu((2, 3, 9, 8, 7)[: n + 2])
        yield ErrorInput(SampleInput(x, 2), ValueError)
        yield ErrorInput(SampleInput(x, 0, output_size=3), RuntimeError, match="kernel size")
        yield ErrorInput(SampleInput(x, 2, output_size=8), RuntimeError, match="too large")
        yield ErrorInput(SampleInput(cpu((2, 3, 0, 8, 7)[: n + 2]), 2, output_size=3), RuntimeError)
        yield ErrorInput(SampleInput(x, 2, output_size=3, _random_samples=torch.rand(1, 3, n)), RuntimeError)
        yield ErrorInput(SampleInput(x, 2, output_size=3, _random_samples=torch.rand(2, 3, n).double()), RuntimeError)
        yield ErrorInput(SampleInput(x.long(), 2, output_size=3), NotImplementedError)

    return generate


_CHANNELS_LAST = {2: torch.channels_last, 3: torch.channels_last_3d}
OPS += [
    *(
        OpInfo(f"fractional_max_pool{n}d", seeded(fn), _fractional_samples(n), _fractional_errors(n))
        for n, fn in ((2, F.fractional_max_pool2d), (3, F.fractional_max_pool3d))
    ),
    *(
        OpInfo(f"fractional_max_pool{n}d_kernel", fn, _fractional_kernel_samples(n))
        for n, fn in ((2, torch._C._nn.fractional_max_pool2d), (3, torch._C._nn.fractional_max_pool3d))
    ),
]
