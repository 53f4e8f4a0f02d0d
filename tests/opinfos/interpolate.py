"""Resampling: F.interpolate in every mode it supports, antialiased (bilinear, bicubic) or not, the
upsample aliases, affine_grid and grid_sample."""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

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
    no_errors,
    tensor,
)

#: mode -> the number of spatial dims it takes (None: any of 1 to 3).
MODES = {"nearest": None, "nearest-exact": None, "area": None, "linear": 1, "bilinear": 2, "trilinear": 3, "bicubic": 2}
SHAPES = {1: (2, 3, 7), 2: (2, 3, 7, 5), 3: (2, 2, 4, 5, 3)}


def resize_samples(mode: str, align_corners=None):
    dims = (1, 2, 3) if MODES[mode] is None else (MODES[mode],)

    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        kw = {"mode": mode} if align_corners is None else {"mode": mode, "align_corners": align_corners}
        for n in dims:
            shape = SHAPES[n]
            yield SampleInput(make(shape, dtype, device), scale_factor=2, **kw)
            yield SampleInput(make(shape, dtype, device), scale_factor=1.7, **kw)
            yield SampleInput(make(shape, dtype, device), scale_factor=(0.6, 1.5, 2.0)[:n], **kw)
            yield SampleInput(make(shape, dtype, device), size=(11, 4, 6)[:n], **kw)
            yield SampleInput(make(shape, dtype, device), size=1, **kw)
            yield SampleInput(make(shape, dtype, device), scale_factor=1.3, recompute_scale_factor=True, **kw)
            yield SampleInput(make((0, *shape[1:]), dtype, device), scale_factor=2, **kw)  # empty batch
            yield SampleInput(tensor(Transposed(shape), dtype, device), size=(5, 9, 4)[:n], **kw)
            yield SampleInput(tensor(Strided(shape), dtype, device), scale_factor=0.5, **kw)

    return generate


def resize_errors() -> Iterable[ErrorInput]:
    x = cpu((1, 2, 4, 4))
    yield ErrorInput(SampleInput(x, size=3, scale_factor=2), ValueError)
    yield ErrorInput(SampleInput(x), ValueError)
    yield ErrorInput(SampleInput(x, size=(3, 3, 3)), ValueError)
    yield ErrorInput(SampleInput(x, scale_factor=2, align_corners=True), ValueError)
    yield ErrorInput(SampleInput(x, size=3, recompute_scale_factor=True), ValueError)
    yield ErrorInput(SampleInput(x, scale_factor=0.1), RuntimeError)
    yield ErrorInput(SampleInput(x, scale_factor=2, mode="linear"), NotImplementedError)
    yield ErrorInput(SampleInput(cpu((4, 4)), scale_factor=2), NotImplementedError)
    yield ErrorInput(SampleInput(cpu((1, 2, 4, 4), torch.int64), scale_factor=2), NotImplementedError)
    yield ErrorInput(SampleInput(cpu((1, 0, 4, 4)), scale_factor=2), RuntimeError)


def antialiased_samples(mode: str):
    """Downsampling (the filter widened by the scale), upsampling, sizes kept, a given scale."""

    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        for align in (False, True):
            kw = {"mode": mode, "align_corners": align, "antialias": True}
            yield SampleInput(make(SHAPES[2], dtype, device), size=(3, 2), **kw)
            yield SampleInput(make(SHAPES[2], dtype, device), size=(11, 4), **kw)
            yield SampleInput(make(SHAPES[2], dtype, device), size=(7, 5), **kw)
            yield SampleInput(make(SHAPES[2], dtype, device), size=1, **kw)
        kw = {"mode": mode, "antialias": True}
        yield SampleInput(make(SHAPES[2], dtype, device), scale_factor=(0.4, 1.1), **kw)  # 5 * 1.1 keeps 5
        yield SampleInput(make(SHAPES[2], dtype, device), scale_factor=0.3, recompute_scale_factor=True, **kw)
        yield SampleInput(tensor(Transposed(SHAPES[2]), dtype, device), size=(5, 9), **kw)
        yield SampleInput(tensor(Strided(SHAPES[2]), dtype, device), scale_factor=0.5, **kw)

    return generate


def antialiased_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((1, 2, 4, 4)), scale_factor=2, antialias=True), ValueError)
    yield ErrorInput(SampleInput(cpu((1, 2, 4)), scale_factor=2, mode="linear", antialias=True), ValueError)
    x = cpu((1, 2, 4, 4), torch.bfloat16)
    yield ErrorInput(SampleInput(x, scale_factor=0.5, mode="bilinear", antialias=True), NotImplementedError)


def alias_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    yield SampleInput(make(SHAPES[2], dtype, device), scale_factor=2)
    yield SampleInput(make(SHAPES[2], dtype, device), size=(9, 4))
    yield SampleInput(tensor(Transposed(SHAPES[2]), dtype, device), 3)


def uint8_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for mode in ("nearest", "nearest-exact"):
        x = torch.randint(0, 256, SHAPES[2], dtype=torch.uint8, device=device)
        yield SampleInput(x, scale_factor=1.7, mode=mode)


def _entries() -> list[OpInfo]:
    ops = []
    for mode in MODES:
        corners = (None,) if MODES[mode] is None else (False, True)
        for align in corners:
            variant = mode.replace("-", "_") + ("" if align is None else f"_align{int(align)}")
            ops.append(
                OpInfo(
                    "interpolate",
                    F.interpolate,
                    resize_samples(mode, align),
                    dtypes=FLOATS,
                    variant=variant,
                    tolerances=ACCUMULATING,
                )
            )
    ops[0] = OpInfo("interpolate", F.interpolate, resize_samples("nearest"), resize_errors, FLOATS, variant="nearest")
    # Sample 9 resizes to a width of 1: aten's CPU kernel then gives every output row the first
    # one's value (a contiguous input; a channels-last one is resized right), as the decomposition does.
    for mode, errors in (("bilinear", antialiased_errors), ("bicubic", no_errors)):
        samples = antialiased_samples(mode)
        ops.append(OpInfo("interpolate", F.interpolate, samples, errors, variant=f"{mode}_aa", tolerances=ACCUMULATING))
    return ops


OPS = [
    *_entries(),
    # uint8 stands in for the dtype: only nearest modes take it.
    OpInfo("interpolate", F.interpolate, uint8_samples, dtypes=(torch.float32,), variant="uint8", supports_grad=False),
    OpInfo("upsample_nearest", F.upsample_nearest, alias_samples),
    OpInfo("upsample_bilinear", F.upsample_bilinear, alias_samples, tolerances=ACCUMULATING),
    OpInfo("upsample", partial(F.upsample, mode="bicubic"), alias_samples, variant="bicubic", tolerances=ACCUMULATING),
]


# -- spatial transformers --------------------------------------------------------------------------


def affine_grid_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for align in (False, True):
        yield SampleInput(make((2, 2, 3), dtype, device), (2, 3, 5, 4), align_corners=align)
        yield SampleInput(make((2, 3, 4), dtype, device), (2, 3, 5, 4, 3), align_corners=align)
    yield SampleInput(make((1, 2, 3), dtype, device), (1, 1, 1, 7), align_corners=False)
    yield SampleInput(tensor(Transposed((2, 3, 2)), dtype, device).mT, (2, 1, 3, 3), align_corners=False)


def affine_grid_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((2, 2, 3), torch.int64), (2, 1, 3, 3), align_corners=False), ValueError)
    yield ErrorInput(SampleInput(cpu((2, 3, 3)), (2, 1, 3, 3), align_corners=False), ValueError)
    yield ErrorInput(SampleInput(cpu((2, 2, 3)), (2, 3), align_corners=False), NotImplementedError)
    yield ErrorInput(SampleInput(cpu((2, 2, 3)), (2, 1, 0, 3), align_corners=False), ValueError)


def grid_sample_samples(mode: str):
    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        for padding in ("zeros", "border", "reflection"):
            for align in (False, True):
                grid = make((2, 4, 7, 2), dtype, device, low=-1.2, high=1.2)
                yield SampleInput(make((2, 3, 5, 6), dtype, device), grid, mode, padding, align)
        yield SampleInput(
            tensor(Transposed((2, 3, 6, 5)), dtype, device),
            tensor(Strided((2, 3, 4, 2)), dtype, device, low=-1, high=1),
            mode,
            align_corners=False,
        )
        yield SampleInput(
            make((0, 3, 5, 6), dtype, device), make((0, 4, 7, 2), dtype, device), mode, align_corners=True
        )
        yield SampleInput(
            make((2, 3, 1, 1), dtype, device),
            make((2, 2, 2, 2), dtype, device, low=-1, high=1),
            mode,
            "reflection",
            True,
        )

    return generate


def grid_sample_errors() -> Iterable[ErrorInput]:
    x, grid = cpu((2, 3, 5, 6)), cpu((2, 4, 7, 2))
    yield ErrorInput(SampleInput(x, grid, "bogus", align_corners=False), ValueError)
    yield ErrorInput(SampleInput(x, grid, padding_mode="bogus", align_corners=False), ValueError)
    yield ErrorInput(SampleInput(x, cpu((3, 4, 7, 2)), align_corners=False), RuntimeError)
    yield ErrorInput(SampleInput(x, cpu((2, 4, 7, 3)), align_corners=False), RuntimeError)
    yield ErrorInput(SampleInput(x, grid.double(), align_corners=False), RuntimeError)


OPS += [
    OpInfo("affine_grid", F.affine_grid, affine_grid_samples, affine_grid_errors, tolerances=ACCUMULATING),
    OpInfo(
        "grid_sample",
        F.grid_sample,
        grid_sample_samples("bilinear"),
        grid_sample_errors,
        variant="bilinear",
        tolerances=ACCUMULATING,
    ),
    OpInfo("grid_sample", F.grid_sample, grid_sample_samples("nearest"), variant="nearest", tolerances=ACCUMULATING),
]


def grid_sampler_2d_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """aten's op by name: bilinear and nearest (their numbers), every padding, both alignments."""
    for interpolation in (0, 1):
        for padding in (0, 1, 2):
            for align in (False, True):
                grid = make((2, 4, 7, 2), dtype, device, low=-1.2, high=1.2)
                yield SampleInput(make((2, 3, 5, 6), dtype, device), grid, interpolation, padding, align)
    grid = tensor(Strided((2, 3, 4, 2)), dtype, device, low=-1, high=1)
    yield SampleInput(tensor(Transposed((2, 3, 6, 5)), dtype, device), grid, 0, 0, False)


def grid_sampler_2d_errors() -> Iterable[ErrorInput]:
    x, grid = cpu((2, 3, 5, 6)), cpu((2, 4, 7, 2))
    yield ErrorInput(SampleInput(x, cpu((3, 4, 7, 2)), 0, 0, False), RuntimeError)
    yield ErrorInput(SampleInput(x, grid.double(), 0, 0, False), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 3, 4, 5, 6)), cpu((2, 4, 4, 4, 3)), 0, 0, False), RuntimeError)


OPS.append(
    OpInfo(
        "grid_sampler_2d",
        torch.grid_sampler_2d,
        grid_sampler_2d_samples,
        grid_sampler_2d_errors,
        tolerances=ACCUMULATING,
    )
)


def grid_sampler_3d_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for interpolation, padding in ((0, 0), (1, 2), (0, 1)):
        grid = make((2, 3, 4, 2, 3), dtype, device, low=-1.2, high=1.2)
        yield SampleInput(make((2, 3, 4, 5, 3), dtype, device), grid, interpolation, padding, True)


# (3-D sampling has no decomposition into prims: only eager's kernel runs it)
OPS.append(
    OpInfo(
        "grid_sampler_3d",
        torch.grid_sampler_3d,
        grid_sampler_3d_samples,
        tolerances=ACCUMULATING,
        decomposition_skips=(0, 1, 2),
    )
)


def aten_aa_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """aten's antialiased kernels called by name (``vec``): an output size, scale factors (down
    and up), aligned corners, a transposed input."""
    x = make((2, 3, 10, 20), dtype, device)
    yield SampleInput(x, [3, 3], False, None)
    yield SampleInput(x, None, False, [1.7, 0.9])
    yield SampleInput(x, None, True, [0.8, 1.0])
    yield SampleInput(x.mT, [5, 4], False, None)


def aten_aa_errors() -> Iterable[ErrorInput]:
    x = cpu((2, 3, 10, 20))
    yield ErrorInput(SampleInput(x, None, False, None), RuntimeError, match="exactly one")
    yield ErrorInput(SampleInput(x, [3, 3], False, [0.5, 0.5]), RuntimeError, match="exactly one")
    yield ErrorInput(SampleInput(x[0], [3, 3], False, None), RuntimeError)


OPS += [
    OpInfo(f"upsample_{mode}2d_aa", fn, aten_aa_samples, aten_aa_errors, tolerances=ACCUMULATING)
    for mode, fn in (
        ("bilinear", torch.ops.aten._upsample_bilinear2d_aa.vec),
        ("bicubic", torch.ops.aten._upsample_bicubic2d_aa.vec),
    )
]


def aten_aa_sized_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """The default form: an output size and, apart, the scales the kernel is given (``scales_h``,
    ``scales_w``), which change the taps from the sizes' ratio."""
    x = make((2, 3, 10, 20), dtype, device)
    yield SampleInput(x, [3, 3], False, 1.7, 0.9)
    yield SampleInput(x, [3, 3], False)
    yield SampleInput(x, [5, 30], True, 1.7, 0.9)
    yield SampleInput(x.mT, [7, 5], False, None, 2.5)


def aten_aa_sized_errors() -> Iterable[ErrorInput]:
    x = cpu((2, 3, 10, 20))
    yield ErrorInput(SampleInput(x[0], [3, 3], False), RuntimeError, match="input_size equals to 4")
    yield ErrorInput(SampleInput(x, [3], False), RuntimeError, match="output_size equals to 2")
    yield ErrorInput(SampleInput(x, [0, 3], False), RuntimeError, match="greater than 0")


OPS += [
    OpInfo(f"upsample_{mode}2d_aa_sized", fn, aten_aa_sized_samples, aten_aa_sized_errors, tolerances=ACCUMULATING)
    for mode, fn in (
        ("bilinear", torch.ops.aten._upsample_bilinear2d_aa.default),
        ("bicubic", torch.ops.aten._upsample_bicubic2d_aa.default),
    )
]
