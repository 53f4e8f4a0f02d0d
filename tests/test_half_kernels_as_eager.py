"""Ops whose decomposition, in bfloat16 or float16, rounded otherwise than eager's kernel (which
rounds each step of its own formula in that dtype, or computes in float32 and rounds once): run
through the torch executor on their decomposition and through the nvFuser stand-in, on the CPU,
their values are eager's (``DIFFERS_FROM_EAGER`` in ``test_nvfuser_opinfos.py`` no longer lists
them).

- ``F.grid_sample`` nearest and bilinear: eager's kernel rounds the source coordinates at each step
  of ``grid_sampler_compute_source_index``; the decomposition's rounding picked other pixels (up to
  14 off in bfloat16). In those dtypes the decomposition leaves the call to eager's kernel.
"""

import itertools
import warnings

import pytest
import torch
import torch.nn.functional as F

import thunder_rs

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the named executor warns that the real nvfuser_direct is absent
    from thunder_rs.executors.torch_ex import decomposing

HALVES = [torch.bfloat16, torch.float16]


def _decomposed(fn):
    jfn = thunder_rs.jit(fn, executors=[])

    def run(*args):
        with decomposing():
            return jfn(*args)

    return run


def _grid_inputs(dtype):
    generator = torch.Generator().manual_seed(5)
    x = (torch.randn((2, 3, 9, 11), generator=generator) * 8).to(dtype)
    grid = (torch.rand((2, 8, 9, 2), generator=generator) * 2.6 - 1.3).to(dtype)
    return x, grid


@pytest.mark.parametrize(
    ("mode", "padding", "align_corners"),
    list(itertools.product(["nearest", "bilinear"], ["zeros", "border", "reflection"], [False, True])),
)
@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_grid_sample_in_half_precision_is_eagers(mode, padding, align_corners, dtype, fake_ex):
    x, grid = _grid_inputs(dtype)

    def fn(x, grid):
        return F.grid_sample(x, grid, mode, padding, align_corners) * 1

    expected = fn(x, grid)
    for compiled in (_decomposed(fn), thunder_rs.jit(fn, executors=[fake_ex])):
        actual = compiled(x, grid)
        assert actual.dtype == expected.dtype
        assert torch.equal(actual, expected)
