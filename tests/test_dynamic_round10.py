"""Shapes that change between calls (issue 26), a tenth sweep: programs whose counts of boxes,
points, nodes and edges, signal lengths, batches and contexts change every call, through
patterns the other sweeps left out (torchvision's box ops, point clouds, message passing,
segment means, band and relative-position attention masks, reflect padding, beam search, CTC,
grid sampling, tensors made from sizes). Every call's outputs, gradients and returned numbers
are checked against eager over at least five sizes, 0 and 1 among them where eager takes them,
and the compiles counted as in ``test_dynamic_round9``.

What the sweep found, each fixed and pinned here: ``torch.bincount(index, minlength=N)`` (a
node degree in message passing) was guarded on ``N``, one compile per node count;
the gradients of ``F.pad`` in reflect and replicate modes at symbolic sizes were the
decomposition's (the slices' gradients added), 1 ulp off eager's kernels, which add each output
element into its source in the output's order as the static compile does;
``F.affine_grid`` to the sizes of an image whose height and width change was guarded on them
(its base grid's ``(steps - 1) / steps`` taken as floats), a compile per image size;
an attribute a jitted function sets on a module it finds in a global or a closure (``band.window
= w``, ``encoder.last_length = T``) was set only while tracing: a compiled call that hit the
cache did not set it, and a symbolic trace left its stand-in for the size in the user's module.

Left as they are (each equal to eager, the count aside): ``x.split(lengths.tolist())`` with a
part of length 0 compiles once more (a size read of 0 is specialised); a size written to a plain
object and read back in the same call (``h.w = w; x * h.w``) compiles once per value (the
object's guard covers the value the call found, which the previous call wrote).
"""

import math

import pytest
import torch
import torch.nn.functional as F

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


# -- reflect and replicate padding at symbolic sizes ------------------------------------------------


def padded(x, w, y, z, u):
    """(Each on its own input: see ``test_uses_of_one_input_at_length_1_add_up_in_eagers_order``.)"""
    return (
        F.pad(x, (2, 1), mode="reflect"),
        F.pad(w, (3, 2), mode="replicate"),
        F.pad(y, (1, 2, 2, 1), mode="reflect"),
        F.pad(z, (1, 1, 1, 1), mode="circular"),
        F.pad(u, (0, 2, 3, 0), mode="replicate"),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reflect_and_replicate_padding_at_symbolic_sizes_have_eagers_gradients(dtype):
    """The symbolic compile's gradients of reflect and replicate padding were the slices'
    gradients added (1 ulp off eager's at most lengths); they are eager's kernel's, as at
    static sizes: each output element's gradient added into its source in the output's order."""

    def make(T):
        rows = [torch.randn(2, 3, T + n, dtype=dtype, requires_grad=True) for n in (3, 1)]
        return [*rows, *(torch.randn(1, 2, T + 3, T + 4, dtype=dtype, requires_grad=True) for _ in range(3))]

    jfn = run_lengths(padded, make)
    assert misses(jfn) <= 3, thunder_rs.compile_stats(jfn).miss_reasons


# -- spatial transformers over image sizes that change ----------------------------------------------


def transformed(x, theta):
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return (
        F.grid_sample(x, grid, align_corners=False),
        F.grid_sample(x, grid, mode="nearest", padding_mode="border", align_corners=True),
        grid,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_affine_grid_to_image_sizes_that_change_compiles_once_for_them(dtype):
    """The base grid's ``linspace(-1, 1, W) * (W - 1) / W`` took ``W`` as a float, a guard on
    every height and width: one compile per image size. The scaling is eager's (a tensor times
    and divided by the ints), on sizes that stay symbolic."""

    def make(T):
        return [torch.randn(T, 2, T + 3, T + 4, dtype=dtype, requires_grad=True), grads((T, 2, 3))[0].to(dtype)]

    jfn = run_lengths(transformed, make, (5, 7, 9, 1, 12, 3))
    assert misses(jfn) <= 3, thunder_rs.compile_stats(jfn).miss_reasons


def test_affine_grid_to_sizes_passed_as_ints_compiles_once_for_them():
    def fn(theta, H, W):
        return F.affine_grid(theta, [2, 1, H, W], align_corners=False), F.affine_grid(theta, [2, 3, W, H])

    theta = torch.randn(2, 2, 3, requires_grad=True)
    jfn = run_lengths(fn, lambda T: [theta, T + 2, 2 * T + 1])
    assert misses(jfn) <= 3, thunder_rs.compile_stats(jfn).miss_reasons


# -- sizes set on a module the program finds as state ------------------------------------------------


class Band(torch.nn.Module):
    """A band mask of ``self.window`` diagonals each side, a size the caller sets between calls."""

    def __init__(self):
        super().__init__()
        self.window = 2

    def forward(self, x):
        T = x.shape[1]
        keep = torch.ones(T, T, dtype=torch.bool).triu(-self.window).tril(self.window)
        return x.masked_fill(~keep, 0.0) * self.window


def test_sizes_set_on_a_module_in_a_closure_are_each_calls_as_eagers():
    """``band.window = w`` and ``band.length = T`` on a module held in a closure: eager's
    module holds the call's values after it. A compiled call that hit the cache set nothing, and
    the symbolic trace left ``t1`` (its stand-in for ``w``) in the user's module."""
    modules = {"eager": Band(), "jit": Band()}

    def program(name):
        band = modules[name]

        def fn(x, w):
            band.window = w
            band.length = x.shape[1]
            return band(x), band.length - band.window

        return fn

    eager, jfn = program("eager"), thunder_rs.jit(program("jit"))
    for T in (5, 7, 5, 9, 1, 0, 12, 3):
        for band in modules.values():
            band.window, band.length = 100, -1  # (the caller's values between calls: each call sets its own)
        x = torch.randn(2, T + 2, T + 2, requires_grad=True)
        assert_same(eager(copied(x), T // 2 + 1), jfn(copied(x), T // 2 + 1))
        for name in ("window", "length"):
            assert type(getattr(modules["jit"], name)) is int
            assert getattr(modules["jit"], name) == getattr(modules["eager"], name), name
    assert misses(jfn) <= 4, thunder_rs.compile_stats(jfn).miss_reasons


def test_a_counter_on_a_module_in_a_closure_counts_every_call():
    """``self.calls += 1`` in the forward of a module held in a closure: refused before (the
    trace changed state it read); each call now counts, as eager's does."""
    band = Band()
    band.calls = 0

    def count(module, x):
        module.calls += 1
        return module(x)

    jfn = thunder_rs.jit(lambda x: count(band, x))
    for T in (5, 7, 9):
        jfn(torch.randn(2, T, T))
        assert band.calls == (5, 7, 9).index(T) + 1


GLOBAL_BAND = Band()


def set_globally(x, w):
    GLOBAL_BAND.window = w
    return x * 2


def test_a_size_set_on_a_module_in_a_global_is_set_by_every_call():
    jfn = thunder_rs.jit(set_globally)
    for T in (5, 5, 7, 9, 12):
        GLOBAL_BAND.window = 100
        jfn(torch.randn(2, T), T // 2)
        assert type(GLOBAL_BAND.window) is int and GLOBAL_BAND.window == T // 2
    assert misses(jfn) == 2, thunder_rs.compile_stats(jfn).miss_reasons


# -- the patterns of the sweep, each over counts that change ------------------------------------------

torchvision = pytest.importorskip("torchvision")


def boxes(T):
    corner = torch.rand(T, 2) * 50
    return torch.cat([corner, corner + torch.rand(T, 2) * 20 + 1], 1)


ANCHORS = boxes(3)


def suppressed(b, scores, classes):
    keep = torchvision.ops.nms(b, scores, 0.5)
    kept = torchvision.ops.batched_nms(b, scores, classes, 0.5)
    return keep, b[keep] * 2, scores[kept], keep.shape[0], torchvision.ops.box_iou(b, ANCHORS)


def pooled_rois(x, b):
    ops = torchvision.ops
    return ops.roi_align(x, [b], (3, 3), 0.25, 2, aligned=True), ops.roi_pool(x, [b], (2, 2), 0.25)


def nearest(points):
    distances = torch.cdist(points, points)
    values, index = distances.topk(min(3, points.shape[1]), dim=-1, largest=False)
    near = points.unsqueeze(1).expand(-1, points.shape[1], -1, -1).gather(2, index[..., None].expand(-1, -1, -1, 3))
    return values, index, near.mean(2)


def messages(x, edges, w):
    N = x.shape[0]
    src, dst = edges
    norm = torch.bincount(dst, minlength=N).float().clamp(min=1).pow(-0.5)
    sent = (x @ w)[src] * (norm[src] * norm[dst])[:, None]
    return torch.zeros(N, w.shape[1]).index_add_(0, dst, sent).relu()


def segment_means(x, lengths):
    sums = torch.cat([x.new_zeros(1, x.shape[1]), x.cumsum(0)])
    ends = lengths.cumsum(0)
    parts = torch.split(x, lengths.tolist())
    return (sums[ends] - sums[ends - lengths]) / lengths.clamp(min=1)[:, None], [p.shape[0] for p in parts]


TABLE = torch.nn.Embedding(31, 2)


def relative_and_alibi(x, q):
    T = x.shape[1]
    rel = torch.arange(T)[:, None] - torch.arange(T)[None, :]
    bias = TABLE(rel.clamp(-15, 15) + 15).permute(2, 0, 1)
    slopes = torch.tensor([2 ** (-8 * (h + 1) / q.shape[1]) for h in range(q.shape[1])])
    alibi = slopes[:, None, None] * -rel.abs()
    band = torch.ones(T, T).triu(-2).tril(2).bool()
    return (x @ x.transpose(-1, -2)).unsqueeze(1) + bias, (q @ q.transpose(-1, -2) + alibi).softmax(-1), band.sum()


LATENTS = torch.randn(4, 8, requires_grad=True)


def padded_to_eight(x, context):
    T = x.shape[1]
    pad = math.ceil(T / 8) * 8 - T
    cross = (LATENTS @ context.transpose(-1, -2) / math.sqrt(context.shape[-1])).softmax(-1) @ context
    return F.pad(x, (0, 0, 0, pad)), torch.arange(T + pad) < T, pad, (-T) % 8, cross


def made_from_sizes(x):
    T = x.shape[0]
    return torch.full((T,), T), torch.tensor([T]), torch.as_tensor(T), x.new_zeros(T, 2 * T), x + T, torch.tensor(T / 2)


def beam_step(tokens, scores, beams):
    B = tokens.shape[0] // beams
    logp = TABLE(tokens).mean(1).log_softmax(-1)
    top, index = (scores[:, None] + logp).view(B, -1).topk(beams, dim=-1)
    rows = ((torch.arange(B) * beams)[:, None] + index // 2).view(-1)
    return torch.cat([tokens[rows], (index % 2).view(-1, 1)], 1), top.view(-1)


def spectra(signal):
    window = torch.hann_window(16)
    spectrum = torch.stft(signal, 16, hop_length=4, window=window, return_complex=True)
    return spectrum.abs(), torch.istft(spectrum, 16, hop_length=4, window=window, length=signal.shape[-1])


def ctc(log_probs, targets, input_lengths, target_lengths):
    mean = F.ctc_loss(log_probs, targets, input_lengths, target_lengths, zero_infinity=True)
    return mean, F.ctc_loss(log_probs, targets, input_lengths, target_lengths, reduction="none")


def ctc_inputs(T):
    log_probs = torch.randn(T + 6, 2, 5).log_softmax(2).detach().requires_grad_()
    targets = torch.randint(1, 5, (2, T // 2 + 1))
    return [log_probs, targets, torch.tensor([T + 6, T + 5]), torch.tensor([T // 2 + 1, T // 3 + 1])]


def segments(T):
    lengths = torch.tensor([T // 3, T - T // 3 - T // 4, T // 4])
    return [torch.randn(T, 3, dtype=torch.float64, requires_grad=True), lengths]


def graph(T):
    return [*grads((T + 1, 4)), torch.randint(0, T + 1, (2, 2 * T)), *grads((4, 6))]


def beams(T):
    rows = (T % 3 + 1) * 2
    return [torch.randint(0, 31, (rows, T + 1)), *grads((rows,)), 2]


#: (name, program, its arguments at count T, whether slow)
PATTERNS = [
    ("nms", suppressed, lambda T: [boxes(T).requires_grad_(), *grads((T,)), torch.arange(T) % 3], True),
    ("roi_align", pooled_rois, lambda T: [*grads((1, 4, 16, 16)), boxes(T)], True),
    ("knn", nearest, lambda T: grads((2, T, 3)), False),
    ("message_passing", messages, graph, False),
    ("segment_means", segment_means, segments, True),
    ("relative_alibi_band", relative_and_alibi, lambda T: grads((2, T, 4), (2, 4, T, 3)), False),
    ("pad_to_eight_cross", padded_to_eight, lambda T: grads((2, T, 3), (2, T, 8)), True),
    ("made_from_sizes", made_from_sizes, lambda T: grads((T,)), True),
    ("beam_step", beam_step, beams, True),
    ("ctc", ctc, ctc_inputs, True),
]


@pytest.mark.parametrize(
    "program, make",
    [pytest.param(p, m, id=n, marks=[pytest.mark.slow] if slow else []) for n, p, m, slow in PATTERNS],
)
def test_a_pattern_over_counts_that_change_equals_eager_in_four_compiles(program, make):
    """Outputs, gradients and returned numbers bit-equal to eager's at every count (0 and 1
    among them), in at most four compiles: the first count, the symbolic one, 0 and 1."""
    jfn = run_lengths(program, make, LENGTHS)
    assert misses(jfn) <= 4, thunder_rs.compile_stats(jfn).miss_reasons


@pytest.mark.slow
def test_stft_and_istft_over_signal_lengths_equal_eager_in_two_compiles():
    jfn = run_lengths(spectra, lambda T: grads((2, 4 * T + 20)), (5, 7, 9, 12, 3, 6))
    assert misses(jfn) <= 2, thunder_rs.compile_stats(jfn).miss_reasons


@pytest.mark.slow
def test_message_passing_through_inductor_equals_eager_in_three_compiles():
    """The Inductor executor compiles the symbolic regions once for every node and edge count:
    outputs and gradients equal to eager's within float32 tolerances (its fused sums round
    otherwise)."""
    jfn = thunder_rs.jit(messages, executors=["inductor", "torch"])
    for T in LENGTHS:
        args = graph(T)
        copies = [list(map(copied, args)) for _ in range(2)]
        e, g = messages(*copies[0]), jfn(*copies[1])
        torch.testing.assert_close(g, e)
        for out in (e, g):
            out.sin().sum().backward()
        for a, b in zip(*copies):
            torch.testing.assert_close(b.grad, a.grad)
    assert misses(jfn) <= 3, thunder_rs.compile_stats(jfn).miss_reasons
