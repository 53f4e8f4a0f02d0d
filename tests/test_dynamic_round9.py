"""Shapes that change between calls (issue 26), a ninth sweep: programs whose lengths, batches,
image sizes and counts change every call, through ops and patterns the other sweeps left out
(interpolation to sizes of the input, ``padding="same"`` convolutions, padded sequences, RNNs
over lengths, rotary caches sliced ``[:T]``, causal masks and attention, scans, sorts, gathers
and scatters by indices of the length, audio framing, losses with ``ignore_index``, autocast,
writes into a growing buffer, sizes returned as Python numbers). Every call's outputs, gradients
and returned numbers are checked against eager over at least five lengths, 0 and 1 among them
where eager takes them, and the compiles counted: the first shapes, one with the changed sizes
symbolic, and one each for 0 and 1 (specialised, as torch.compile's automatic dynamic shapes
keep them).

What the sweep found, each fixed and pinned here: a float the program returned or stored that it
computed from sizes (``T / 2``, ``T ** -0.5``) failed the symbolic compile, which turned symbolic
sizes off for the function (a compile per length from then on); ``repeat_interleave`` by a tensor
of repeats compiled once per total length where the input requires grad; and a scatter by an
empty index (a sequence of length 0) returned an output that did not require grad where eager's
does.
"""

import pytest
import torch
import torch.nn.functional as F

import thunder_rs

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore:thunder_rs.*recompiled")]

LENGTHS = (5, 7, 9, 1, 0, 12, 3)


def misses(jfn) -> int:
    return thunder_rs.compile_stats(jfn).cache_misses


def leaves(out) -> list:
    return torch.utils._pytree.tree_leaves(out)


def assert_same(e, g) -> None:
    """``g`` is ``e``: tensors bit-equal with eager's dtype and strides, numbers of the same type
    and value."""
    es, gs = leaves(e), leaves(g)
    assert len(es) == len(gs)
    for a, b in zip(es, gs):
        assert type(a) is type(b), (a, b)
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), (a, b)
            assert a.requires_grad == b.requires_grad
            assert a.numel() <= 1 or a.stride() == b.stride()
        else:
            assert a == b, (a, b)


def copied(a):
    return a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a


def run_lengths(fn, make, lengths=LENGTHS, grad=True):
    """Calls ``fn`` jitted and eager on ``make(T)`` for each length; outputs and gradients (of the
    sum of the float outputs' sines) equal. Returns the jitted function."""
    jfn = thunder_rs.jit(fn)
    for T in lengths:
        args = make(T)
        copies = [[copied(a) for a in args] for _ in range(2)]
        e, g = fn(*copies[0]), jfn(*copies[1])
        assert_same(e, g)
        if grad:
            for out, inputs in ((e, copies[0]), (g, copies[1])):
                floats = [t for t in leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
                torch.stack([t.sin().sum() for t in floats]).sum().backward()
            for a, b in zip(*copies):
                if isinstance(a, torch.Tensor) and a.requires_grad:
                    assert_same(a.grad, b.grad)
    return jfn


# -- a float of sizes returned or stored -------------------------------------------------------------


def test_a_returned_float_of_sizes_is_each_calls_and_keeps_the_sizes_symbolic():
    """``T / 2`` returned was taken by value after tracing ended, outside the recording: the
    symbolic compile failed and symbolic sizes were turned off for the function, one compile per
    length after. It is computed per call from the call's sizes, with Python's own operations."""
    import math

    def fn(x):
        T = x.shape[1]
        return x * 2, T / 2, T**-0.5, math.sqrt(T) + 1.5, {"ratio": -(T / 3)}

    jfn = run_lengths(fn, lambda T: [torch.randn(2, T, requires_grad=True)], (5, 7, 9, 12, 3, 6))
    assert misses(jfn) == 2 and jfn._dynamic_off is None


def test_a_float_of_sizes_stored_on_a_module_is_each_calls():
    class Ratio(torch.nn.Module):
        def forward(self, x):
            self.ratio = x.shape[1] / 4
            return x.relu()

    eager, jmodel = Ratio(), thunder_rs.jit(Ratio())
    for T in (5, 7, 9, 12, 3):
        x = torch.randn(2, T)
        assert_same(eager(x), jmodel(x))
        assert type(jmodel.ratio) is float and jmodel.ratio == eager.ratio
    assert misses(jmodel) == 2


# -- repeat_interleave by tensor repeats under grad ---------------------------------------------------


def test_repeat_interleave_by_tensor_repeats_under_grad_keeps_its_length_symbolic():
    """The output's length is the repeats' sum: a fallback sized by values, which has no backward,
    so under grad each total length compiled again. Computed as eager computes it (the input
    indexed by the repeats' own ``repeat_interleave``), one compile serves every total."""

    def fn(x, r, s):
        return x.repeat_interleave(r, dim=0) * 2, x.repeat_interleave(s, dim=-1), x.repeat_interleave(r.sum())

    def make(T):
        return [torch.randn(T, 3, requires_grad=True), torch.arange(T) % 3, torch.tensor([T % 2 + 1])]

    jfn = run_lengths(fn, make, (5, 7, 9, 12, 3, 6, 1, 0))
    assert misses(jfn) <= 4, thunder_rs.compile_stats(jfn).miss_reasons


def test_repeat_interleave_refuses_what_eager_refuses_under_grad():
    x = torch.randn(2, 4, requires_grad=True)
    for repeats in (torch.arange(5), torch.ones(2, 4, dtype=torch.long), -torch.ones(4, dtype=torch.long)):
        with pytest.raises(RuntimeError):
            x.repeat_interleave(repeats, 1)
        with pytest.raises(RuntimeError):
            thunder_rs.jit(lambda x, r: x.repeat_interleave(r, 1))(x, repeats)


# -- a scatter by an empty index ----------------------------------------------------------------------


def scatters(a, src, index):
    return (
        a.scatter_add(1, index, src),
        a.scatter(1, index, src),
        a.scatter_reduce(1, index, src, "sum"),
        a.scatter_reduce(1, index, src, "amax", include_self=False),
    )


@pytest.mark.parametrize("a_grad", [False, True])
def test_a_scatter_by_an_empty_index_follows_src_as_eager(a_grad):
    """A length of 0 scatters nothing: eager's output still requires grad where ``src`` does (its
    gradient zero), and is a new row-major tensor."""

    def make(T):
        a = torch.randn(3, 2).t().requires_grad_(a_grad)
        return [a, torch.randn(2, T, requires_grad=True), (torch.arange(T) % 3).expand(2, T)]

    run_lengths(scatters, make, (0, 4, 0, 5))


def test_the_miss_reason_of_a_failed_size_guard_names_the_sizes_not_unknown():
    """A call whose key the symbolic entry was stored under, failing one of its size guards
    (``max(1, T // 2)`` taken the other way), was reported as ``unknown; ...``."""

    def fn(x):
        return x.kthvalue(max(1, x.shape[-1] // 2), -1)[0]

    jfn = run_lengths(fn, lambda T: [torch.randn(3, T)], (5, 7, 9, 12, 3), grad=False)
    reasons = thunder_rs.compile_stats(jfn).miss_reasons
    assert len(reasons) == 3 and not any("unknown" in r for r in reasons), reasons
    assert reasons[2].startswith("x: shape torch.Size([3, 7]) -> torch.Size([3, 3]); the entry with symbolic sizes")


def test_a_rounded_up_quotient_of_sizes_that_divide_stays_symbolic():
    """``(n + d - 1) // d`` with a symbolic ``d`` dividing ``n`` (an adaptive pool of ``H * W``
    positions to ``W``: its longest window) was decided on the hints, guarded ``q * d <= n + d - 1
    < (q + 1) * d``: a compile per height. It is ``n / d`` for every ``d >= 1``."""

    def fn(x):
        H, W = x.shape[-2:]
        return F.adaptive_avg_pool1d(x.flatten(2), W), (H * W + W - 1) // W

    jfn = run_lengths(fn, lambda T: [torch.randn(2, 3, T + 2, T + 4, requires_grad=True)], (5, 7, 9, 12, 3, 6))
    assert misses(jfn) == 2, thunder_rs.compile_stats(jfn).miss_reasons
