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
    """``g`` is ``e``: tensors bit-equal with eager's dtype and strides (NaN where eager's is),
    numbers of the same type and value."""
    es, gs = leaves(e), leaves(g)
    assert len(es) == len(gs)
    for a, b in zip(es, gs):
        assert type(a) is type(b), (a, b)
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape and a.isnan().equal(b.isnan()), (a, b)
            assert torch.equal(a.nan_to_num(), b.nan_to_num()), (a, b)
            assert a.requires_grad == b.requires_grad
            assert strides(a) == strides(b), (a.stride(), b.stride())
        else:
            assert a == b, (a, b)


def copied(a):
    return a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a


def strides(t: torch.Tensor) -> tuple:
    """The strides of ``t``'s dims longer than 1 (a dim of one element has no stride to keep)."""
    return tuple(st for n, st in zip(t.shape, t.stride()) if n > 1) if t.numel() > 1 else ()


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


# -- the patterns of the sweep, each over lengths that change ----------------------------------------

torch.manual_seed(0)
CONV1 = torch.nn.Conv1d(4, 6, 3, padding="same")
CONV2 = torch.nn.Conv2d(3, 5, (3, 4), padding="same", dilation=2)
GRU = torch.nn.GRU(3, 4, batch_first=True, num_layers=2)
LSTM = torch.nn.LSTM(3, 4, batch_first=True, bidirectional=True)
PROJECTIONS = [torch.nn.Linear(8, 8) for _ in range(3)]


def grads(*shapes):
    return [torch.randn(*shape, requires_grad=True) for shape in shapes]


def interpolated(x):
    H, W = x.shape[-2:]
    sized = F.interpolate(x, size=(H // 2 + 1, W * 3 // 2), mode="bilinear", align_corners=True)
    return sized, F.interpolate(x, scale_factor=0.5, mode="bicubic"), F.interpolate(x, scale_factor=2.0)


def folded(x):
    patches = F.unfold(x, kernel_size=2, stride=2)
    return patches, F.fold(patches * 2, output_size=x.shape[-2:], kernel_size=2, stride=2)


def padded_sequences(a, b, c):
    rnn = torch.nn.utils.rnn
    return rnn.pad_sequence([a, b, c], batch_first=True), rnn.pad_sequence([a, b, c], padding_value=-1.0)


def rotary(x):
    T = x.shape[1]
    inv = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
    emb = torch.outer(torch.arange(64).float(), inv).repeat(1, 2)
    x1, x2 = x.chunk(2, -1)
    return x * emb.cos()[:T] + torch.cat([-x2, x1], -1) * emb.sin()[:T]


def causal_attention(q, k, v):
    T = q.shape[-2]
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    scores = (q @ k.transpose(-1, -2)).masked_fill(future, float("-inf")).softmax(-1)
    additive = torch.zeros(T, T).masked_fill(future, -1e9)
    return (
        scores @ v,
        F.scaled_dot_product_attention(q, k, v, is_causal=True),
        F.scaled_dot_product_attention(q, k, v, attn_mask=~future),
        F.scaled_dot_product_attention(q, k, v, attn_mask=additive),
    )


def scans(a, b, c, d, e, f):
    """(Each on its own input: see ``test_uses_of_one_input_at_length_1_add_up_in_eagers_order``.)"""
    return a.cumsum(1), b.cumprod(1), c.flip(1), d.roll(d.shape[1] // 2, 1), torch.logcumsumexp(e, 1), f.cummax(1)[0]


def sorted_(x):
    values, order = x.sort(1)
    return values, order, x.argsort(1, descending=True), x.sort(dim=1, stable=True)[1]


def indexed(x):
    T = x.shape[1]
    reversed_ = torch.arange(T).flip(0).expand(x.shape[0], T)
    halves = torch.zeros(x.shape[0], T // 2 + 1).scatter_add(1, reversed_ // 2, x)
    return x.gather(1, reversed_), halves, torch.zeros(T).index_add(0, torch.arange(T) % 3, x[0])


def framed(audio):
    frames = audio.unfold(-1, 8, 4)
    return (frames * torch.hann_window(8)).abs().mean(-1), frames.shape[-2]


def losses(logits, targets):
    flat = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    summed = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=-100, reduction="sum")
    return flat, summed, F.nll_loss(logits.log_softmax(-1).flatten(0, 1), targets.flatten(), ignore_index=-100)


def half_ignored(T):
    targets = torch.randint(0, 5, (2, T))
    targets[:, T // 2 :] = -100
    return [*grads((2, T, 5)), targets]


def buffer_written(buffer, y):
    T = y.shape[1]
    buffer = buffer.clone()
    buffer[:, :T] = y * 2
    buffer[:, T : T + 2] += 1
    buffer.narrow(1, 0, T).mul_(3)
    return buffer, buffer[:, -T:].sum(), T * 2, T // 3, T % 3, -T, divmod(T, 4), buffer.shape[1] - T


def selected(x):
    kept = x[x > 0]
    k = max(x.shape[1] // 4, 1)
    return kept.cumsum(0), kept.shape[0], x.nonzero()[:, 0].float().mean(), x.topk(k, dim=1)


def autocast_attention(x, y):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, k, v = (p(t) for p, t in zip(PROJECTIONS, (x, y, y)))
        T = x.shape[1]
        keep = torch.ones(T, T, dtype=torch.bool).tril()
        targets = torch.arange(x.shape[0] * T) % 8
        return (
            F.scaled_dot_product_attention(q, k, v, is_causal=True),
            F.scaled_dot_product_attention(q, k, v, attn_mask=keep),
            F.cross_entropy(q.flatten(0, 1), targets),
        )


def recurrent_without_grad(x):
    with torch.no_grad():
        out, (h, _) = LSTM(x)
    return out, h, GRU(x)[0] * 2


#: (name, program, its arguments at length T, whether slow)
PATTERNS = [
    ("interpolate", interpolated, lambda T: grads((2, 3, T + 2, T + 3)), False),
    ("unfold_fold", folded, lambda T: grads((2, 3, 2 * T + 2, 2 * T + 4)), False),
    ("conv_same", lambda x, y: (CONV1(x), CONV2(y)), lambda T: grads((2, 4, T + 1), (2, 3, T + 1, T + 2)), False),
    ("pad_sequence", padded_sequences, lambda T: grads((T, 3), (T + 2, 3), (2 * T + 1, 3)), False),
    ("gru", lambda x: GRU(x)[0], lambda T: grads((2, T + 1, 3)), True),
    ("rotary", rotary, lambda T: grads((2, T, 8)), False),
    ("causal_attention", causal_attention, lambda T: grads(*[(2, 2, T + 1, 4)] * 3), False),
    ("einsum", lambda a, b: torch.einsum("bij,bjk->bik", a, b), lambda T: grads((2, T, T + 1), (2, T + 1, 3)), False),
    ("scans", scans, lambda T: grads(*[(2, T, 3)] * 6), False),
    ("sorts", sorted_, lambda T: grads((3, T)), False),
    ("gather_scatter", indexed, lambda T: grads((2, T)), False),
    ("audio_frames", framed, lambda T: grads((2, 4 * T + 8)), False),
    ("ignore_index", losses, half_ignored, False),
    ("growing_buffer", buffer_written, lambda T: grads((2, 16, 3), (2, T, 3)), False),
    ("boolean_index", selected, lambda T: grads((2, T + 1)), True),
    ("autocast", autocast_attention, lambda T: grads((2, T + 1, 8), (2, T + 1, 8)), True),
    ("no_grad", recurrent_without_grad, lambda T: [torch.randn(2, T + 1, 3)], True),
]


@pytest.mark.parametrize(
    "program, make",
    [pytest.param(p, m, id=n, marks=[pytest.mark.slow] if slow else []) for n, p, m, slow in PATTERNS],
)
def test_a_pattern_over_lengths_that_change_equals_eager_in_four_compiles(program, make):
    """Outputs, gradients and returned numbers bit-equal to eager's at every length (0 and 1
    among them), in at most four compiles: the first length, the symbolic one, 0 and 1."""
    jfn = run_lengths(program, make)
    assert misses(jfn) <= 4, thunder_rs.compile_stats(jfn).miss_reasons


def test_uses_of_one_input_at_length_1_add_up_in_eagers_order():
    """At length 1 a flip or a roll keeps every element in place: the trace returned the input,
    and the copy its output needs came at the trace's end, so its gradient reached the input first
    in the backward, where eager's engine adds it in at the op's place: the six uses' gradients
    added in another order, 1 ulp off for some inputs. The copy is made at the op's place
    (``test_dynamic_round11`` pins more orders)."""

    def fn(x):
        return (
            x.cumsum(1),
            x.cumprod(1),
            x.flip(1),
            x.roll(x.shape[1] // 2, 1),
            torch.logcumsumexp(x, 1),
            x.cummax(1)[0],
        )

    torch.manual_seed(0)
    jfn = thunder_rs.jit(fn)
    for _ in range(8):
        x = torch.randn(2, 1, 3, requires_grad=True)
        y = copied(x)
        for out in (fn(x), jfn(y)):
            torch.stack([t.sin().sum() for t in out]).sum().backward()
        assert torch.equal(x.grad, y.grad)


@pytest.mark.slow
def test_the_patterns_through_inductor_equal_eager_in_four_compiles():
    """The Inductor executor compiles the symbolic regions once for every length: outputs and
    gradients equal to eager's within float32 tolerances (Inductor's kernels round otherwise than
    eager's: fused sums, its own ``cos``), returned numbers exactly."""
    for program, make in (
        (rotary, lambda T: grads((2, T, 8))),
        (buffer_written, lambda T: grads((2, 16, 3), (2, T, 3))),
    ):
        jfn = thunder_rs.jit(program, executors=["inductor", "torch"])
        for T in (5, 7, 9, 1, 0, 12, 3):
            args = make(T)
            copies = [list(map(copied, args)) for _ in range(2)]
            e, g = program(*copies[0]), jfn(*copies[1])
            torch.testing.assert_close(g, e)
            for out in (e, g):
                torch.stack([t.sin().sum() for t in leaves(out) if isinstance(t, torch.Tensor)]).sum().backward()
            torch.testing.assert_close([a.grad for a in copies[1]], [a.grad for a in copies[0]])
        assert misses(jfn) <= 4, thunder_rs.compile_stats(jfn).miss_reasons
