"""Shapes that change between calls (issue 26), a tenth sweep: programs whose counts of boxes,
points, nodes and edges, signal lengths, batches and contexts change every call, through
patterns the other sweeps left out (torchvision's box ops, point clouds, message passing,
segment means, band and relative-position attention masks, reflect padding, beam search, CTC,
grid sampling, tensors made from sizes). Every call's outputs, gradients and returned numbers
are checked against eager over at least five sizes, 0 and 1 among them where eager takes them,
and the compiles counted as in ``test_dynamic_round9``.

What the sweep found, each fixed and pinned here: ``torch.bincount(index, minlength=N)`` (a
node degree in message passing) was guarded on ``N``, one compile per node count;
"""

import pytest
import torch

import thunder_rs
from test_dynamic_round9 import assert_same, copied, grads, misses, run_lengths

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore:thunder_rs.*recompiled")]

LENGTHS = (5, 7, 9, 1, 0, 12, 3)


# -- bincount with a minlength of a size -------------------------------------------------------------


def degrees(x, index, weights):
    N = x.shape[0]
    counts = torch.bincount(index, minlength=N)
    return counts, torch.bincount(index, weights, minlength=N), x / counts.clamp(min=1), torch.bincount(index)


def test_bincount_with_a_minlength_of_a_size_compiles_once_for_every_size():
    """A call sized by values ran on its arguments with ``minlength=N`` specialised, a guard
    ``N == n``: a compile per node count. ``N`` is taken at its value unguarded (the outputs'
    sizes are checked on each call, or symbolic)."""

    def make(T):
        index = torch.randint(0, T + 1, (2 * T,))
        return [torch.randn(T + 1, dtype=torch.float64, requires_grad=True), index, torch.randn(2 * T).double()]

    jfn = run_lengths(degrees, make, (5, 7, 9, 1, 0, 12, 3, 6))
    assert misses(jfn) <= 3, thunder_rs.compile_stats(jfn).miss_reasons


def test_bincount_past_the_minlength_raises_eagers_error_after_the_symbolic_compile():
    """An index at ``N`` or beyond makes the counts longer than ``N``: the trace's check of their
    size fails, and the call raises eager's broadcasting error."""
    jfn = thunder_rs.jit(degrees)
    for T in (5, 7, 9):
        args = [torch.randn(T + 1).double(), torch.randint(0, T + 1, (2 * T,)), torch.randn(2 * T).double()]
        assert_same(degrees(*args), jfn(*args))
    args = [torch.randn(7).double(), torch.tensor([0, 8, 2]), torch.randn(3).double()]
    with pytest.raises(RuntimeError, match="must match the size of tensor b"):
        degrees(*args)
    with pytest.raises(RuntimeError, match="must match the size of tensor b"):
        jfn(*args)
