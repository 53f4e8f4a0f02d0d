"""Shapes that change between calls (issue 26), a thirteenth sweep: sizes given as 0-d tensors
that change between calls (ViLT's patch counts), products of sizes past int64, the Inductor
executor over symbolic regions, and the patterns the other sweeps left out. Every call's outputs
and gradients are checked against eager, and the compiles counted as in ``test_dynamic_round9``.

What the sweep found, each fixed and pinned here: ``F.interpolate``'s ``size`` given as 0-d
tensors (ViLT's ``visual_embed`` resizes each image's position table to ``(h, w)`` patches summed
from a pixel mask, then pads it by ``4 - w`` and ``4 - h``) was read in the decomposition, where
no check is recorded, by ``__index__``: the trace kept the first call's output size unchecked
(``out.shape`` returned it where eager's changed), and the call after one with other counts had
the pads' reads symbolic against the constant sizes, so ``torch.cat`` of the images raised. The
sizes are read by ``item()`` before the symbol is recorded, checked, and symbolic once they change.
A product of sizes past int64 (``n * n * n`` at ``n = 2**22``) wrapped its hint in Rust, and a
decision on it took the other branch than eager's; past int64 a size is now specialised and the
arithmetic is Python's ints (``Dim::checked_mul``).

Checked and equal to eager, nothing to fix (compiles, thunder_rs / torch.compile(dynamic=None)):
batch and sequence changing together through attention with a padding mask, under ``jit`` (4 / 4),
``torch.compile(backend="thunder_rs", dynamic=True)`` (3 graphs, as Dynamo's own with the eager
backend) and ``dynamic=None`` (4 / 4), values, gradients and strides; ``jit(dynamic=True)`` and
``torch._dynamo.mark_dynamic`` with 0 and 1 among the sizes; a CNN with adaptive pooling over the
number of images and their heights and widths together, bit for bit (3 / 3); the Inductor executor
over a Transformer encoder layer at seven (batch, length) pairs: 2 thunder_rs compiles, each region
one Inductor artifact for all sizes (8 compiles, 20 symbolic reuses), values, gradients and strides
as eager's; a backward whose cotangent has another shape than the output refuses as eager does
(eager's autograd takes no other shape, ``retain_graph`` or not).
"""

import pytest
import torch
import torch.nn.functional as F

import thunder_rs
from test_dynamic_round9 import assert_same, misses

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore:thunder_rs.*recompiled")]


# -- sizes given as 0-d tensors ------------------------------------------------------------------------


def patch_positions(positions, mask):
    """ViLT's ``visual_embed``: each image's position table resized to its count of patches the
    pixel mask keeps, padded back to the full grid, the images concatenated."""
    rows, cols = mask.sum(1)[:, 0], mask.sum(2)[:, 0]
    resized = [F.interpolate(positions, size=(h, w), mode="bilinear", align_corners=True) for h, w in zip(rows, cols)]
    return torch.cat([F.pad(r, (0, 4 - w, 0, 4 - h)) for r, h, w in zip(resized, rows, cols)])


#: (rows, cols) the second image's mask keeps: the first shapes, then other counts, 1 among them
COUNTS = ((3, 2), (3, 2), (2, 4), (3, 3), (4, 2), (2, 2), (1, 3), (4, 1), (2, 3))


def test_patch_counts_that_change_between_calls_compile_once_for_all():
    """The counts are symbolic from the second compile on (``value_sizes``), each padded size
    ``w + (4 - w)`` 4 as eager's: the first counts, the symbolic ones, and a 1 in each dim."""
    g = torch.Generator().manual_seed(0)
    positions = torch.randn(1, 3, 4, 4, generator=g)
    jfn = thunder_rs.jit(patch_positions)
    for rows, cols in COUNTS:
        mask = torch.ones(2, 4, 4, dtype=torch.long)
        mask[1, rows:], mask[1, :, cols:] = 0, 0
        cotangent = torch.randn(2, 3, 4, 4, generator=g)
        seen = []
        for fn in (patch_positions, jfn):
            leaf = positions.clone().requires_grad_()
            out = fn(leaf, mask)
            seen.append((out, torch.autograd.grad(out, leaf, cotangent)))
        assert_same(*seen)
    assert misses(jfn) <= 4, thunder_rs.compile_stats(jfn).miss_reasons


def _sized_by_a_count(p, m):
    out = F.interpolate(p, size=(m.sum(), 4), mode="bilinear", align_corners=True)
    return out * 2, out.shape[2]


def test_an_interpolation_sized_by_a_tensor_returns_each_calls_size():
    """``size=(m.sum(), 4)`` was read in ``F.interpolate``'s decomposition, unchecked: the calls
    after the first compile's returned its size (2 where eager's is 5)."""
    p = torch.randn(1, 2, 4, 4)
    jfn = thunder_rs.jit(_sized_by_a_count)
    for n in (3, 3, 2, 5, 6, 4):
        m = torch.ones(n, dtype=torch.long)
        assert_same(_sized_by_a_count(p, m), jfn(p, m))
    assert misses(jfn) <= 3, thunder_rs.compile_stats(jfn).miss_reasons


# -- products of sizes past int64 -------------------------------------------------------------------


def _branch_on_a_cube(x):
    n = x.shape[0]
    cube = n * n * n
    return (x[:1] * 2 if cube > 2**62 else x[:1] * 3), cube, -cube // 3


def test_a_product_of_sizes_past_int64_is_eagers_int():
    """``n * n * n`` at ``n = 2**22`` is ``2**66``: the symbolic size's hint wrapped in Rust's
    ``i64`` (to 0), so ``cube > 2**62`` took the other branch than eager's. Past int64 the size is
    specialised, and the arithmetic is Python's ints (a compile per such size); below it stays
    symbolic."""
    jfn = thunder_rs.jit(_branch_on_a_cube)
    for n in (3, 2**22, 2**21, 5, 7):
        x = torch.ones(1).expand(n)  # (no memory of its size)
        assert_same(_branch_on_a_cube(x), jfn(x))
    assert misses(jfn) <= 4, thunder_rs.compile_stats(jfn).miss_reasons
