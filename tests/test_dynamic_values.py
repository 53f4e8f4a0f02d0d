"""Values read from tensors (data-dependent branches, ``.item()``) in a trace with symbolic sizes
(issue 26): the program so far runs at the call's sizes to answer the read, the trace checks the
value on each call, and a call that reads another value runs the variant for it, which is symbolic
too: a branch on values over a changing length compiles once per branch, not per length. Every
call is checked against eager (outputs, gradients, errors)."""

import pytest
import torch
import torch.nn.functional as F

import thunder_rs
from test_dynamic_images import tiny_wav2vec2
from twin_training import train_like_eager

pytestmark = pytest.mark.usefixtures("one_thread")


def stats(jfn):
    return thunder_rs.compile_stats(jfn)


def dynamic_off(jfn):
    return (jfn._jfn if isinstance(jfn, thunder_rs.ThunderModule) else jfn)._dynamic_off


def branch_on_sum(x):
    return x * 2 if x.sum() > 0 else x - 1


def test_a_branch_on_values_over_lengths_compiles_once_per_branch():
    jf = thunder_rs.jit(branch_on_sum)
    calls = [(4, 1), (6, 1), (8, -1), (5, 1), (7, -1), (9, 1), (3, -1), (4, -1)]
    for n, sign in calls:
        x = torch.rand(n) * sign
        torch.testing.assert_close(jf(x), branch_on_sum(x))
    # static at 4, symbolic at 6, its variant for the other branch at 8 (symbolic too); the
    # static entry of length 4 gets its own variant for the other branch.
    assert stats(jf).cache_misses == 4, stats(jf).miss_reasons
    assert dynamic_off(jf) is None
    reason = stats(jf).miss_reasons[2]
    assert reason.endswith("where the compiled variant has True; compiled with symbolic sizes x.shape[0]")


def guarded_view(x):
    if x.sum() > 0:
        return x.view(2, -1) * 2  # needs an even length: a guard of this branch only
    return x - 1


def test_a_variant_with_guards_of_its_own_serves_only_where_they_hold():
    jf = thunder_rs.jit(guarded_view)
    for n, sign in [(4, 1), (6, 1), (8, -1), (7, -1), (10, 1), (12, -1), (14, 1)]:
        x = torch.rand(n) * sign
        torch.testing.assert_close(jf(x), guarded_view(x))
    assert stats(jf).cache_misses == 3, stats(jf).miss_reasons
    # An odd length taking the view's branch: eager's error, and symbolic compiles go on.
    with pytest.raises(RuntimeError, match=r"shape '\[2, -1\]' is invalid for input of size 9"):
        jf(torch.rand(9))
    assert dynamic_off(jf) is None
    x = torch.rand(16)
    torch.testing.assert_close(jf(x), guarded_view(x))
    assert stats(jf).cache_misses == 3


def scaled_by_item(x, w):
    h = torch.tanh(x @ w)
    return h * h.abs().max().item() + h.mean(0)


def test_an_item_read_over_lengths_trains_like_eager():
    # The value changes every call: one variant per value, up to the limit, then eager calls;
    # gradients as eager's each call.
    jf = thunder_rs.jit(scaled_by_item)
    w = torch.randn(4, 4, requires_grad=True)
    w2 = w.detach().clone().requires_grad_()
    for n in [3, 5, 7, 6]:
        x = torch.randn(n, 4)
        out, expected = jf(x, w), scaled_by_item(x, w2)
        torch.testing.assert_close(out, expected)
        out.sum().backward()
        expected.sum().backward()
        torch.testing.assert_close(w.grad, w2.grad)
    assert dynamic_off(jf) is None


def test_wav2vec2_with_layerdrop_trains_over_audio_lengths_in_one_compile_per_path():
    # Layerdrop draws a random number per layer each call and skips the layer on it (a value read):
    # 2 layers, 4 paths, each one symbolic compile whatever the length (was: a compile per length).
    model = tiny_wav2vec2(layerdrop=0.4)
    lengths = [400, 560, 720, 1001, 480, 640, 800, 900, 1100, 700]
    batches = [dict(input_values=torch.randn(2, n)) for n in lengths]
    jmodel = train_like_eager(model, batches, lambda out: out.last_hidden_state, rtol=1e-4, atol=1e-5)
    assert dynamic_off(jmodel) is None
    assert stats(jmodel).cache_misses <= 1 + 4, stats(jmodel).miss_reasons


class SlidingChunks(torch.nn.Module):
    """Longformer's sliding-window chunks (``_chunk``, ``_sliding_chunks_query_key_matmul``): a
    chunk count computed as a tensor (``torch.div`` of two ints), given where eager reads it as
    an int (sizes, ``arange``, ``narrow``), and ``as_strided`` over a transposed view's memory."""

    def __init__(self, w: int = 2):
        super().__init__()
        self.w, self.proj = w, torch.nn.Linear(4, 8)

    def forward(self, x):  # x: (seq, batch, 4), as Longformer's hidden states
        s, b, _ = x.shape
        chunks = torch.div(s, self.w, rounding_mode="trunc") - 1
        q = self.proj(x).view(s, b, 2, 4).transpose(0, 1).transpose(1, 2).reshape(b * 2, s, 4)  # a view
        q = q.view(b * 2, torch.div(s, 2 * self.w, rounding_mode="trunc"), 2 * self.w, 4)
        size, stride = list(q.size()), list(q.stride())
        size[1], stride[1] = size[1] * 2 - 1, stride[1] // 2  # overlapping chunks
        q = q.as_strided(size=size, stride=stride)
        scores = q.new_zeros((b * 2, chunks + 1, 2 * self.w, 4))[:, :chunks] + q
        scores = scores * torch.arange(chunks, dtype=q.dtype).view(1, chunks, 1, 1)
        return scores.narrow(1, chunks - 1, 1) + scores.view(b * 2, chunks, -1).sum(1).view(b * 2, 1, 2 * self.w, 4)


def test_a_size_computed_as_a_tensor_is_read_where_eager_reads_it():
    # Each raised: ltorch.div wanted a tensor, the sizes ints, as_strided refused the view; and
    # the backward of the narrow at a start read from a value missed that size (a NameError).
    jmodel = train_like_eager(SlidingChunks(), [torch.randn(s, 2, 4) for s in (8, 12, 16, 8)])
    assert dynamic_off(jmodel) is None
    assert stats(jmodel).cache_misses == 2, stats(jmodel).miss_reasons


def slice_at_a_read_start(x):
    start = (torch.tensor(x.shape[1]) // 4 - 1).item()
    return x[:, start : start + 2] * 2


def test_the_gradient_of_a_slice_at_a_read_start_has_the_start_over_lengths():
    # The backward pads by the start, a size read from a value that no saved tensor's shape shows:
    # it was not saved (a NameError in the backward of the symbolic compile).
    jf = thunder_rs.jit(slice_at_a_read_start)
    for n in (8, 12, 16):
        x = torch.randn(2, n, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        jf(x).square().sum().backward()
        slice_at_a_read_start(x2).square().sum().backward()
        torch.testing.assert_close(x.grad, x2.grad)
    assert stats(jf).cache_misses == 2, stats(jf).miss_reasons


class PaddedConv(torch.nn.Module):
    """EnCodec's ``EncodecConv1d``: reflection padding by a buffer (``padding_total``, a 0-dim
    integer tensor) and by the extra length, computed with tensors, that makes the last frame
    whole; constant padding by the same amounts."""

    def __init__(self, kernel: int = 4, stride: int = 3):
        super().__init__()
        self.conv = torch.nn.Conv1d(2, 3, kernel, stride)
        self.kernel, self.stride = kernel, stride
        self.padding_total = torch.nn.Buffer(torch.tensor(kernel - stride), persistent=False)

    def forward(self, x):
        frames = (x.shape[-1] - self.kernel + self.padding_total) / self.stride + 1
        frames = torch.ceil(frames).to(torch.int64) - 1
        extra = frames * self.stride + self.kernel - self.padding_total - x.shape[-1]
        reflected = F.pad(x, (self.padding_total, extra), mode="reflect")
        return self.conv(reflected) + F.pad(x, (extra, self.padding_total)).sum((1, 2), keepdim=True)


def test_padding_by_amounts_given_as_tensors_is_eager_s():
    # F.pad took only ints: "argument 'pad' must be tuple of ints" (EnCodec).
    jmodel = train_like_eager(PaddedConv(), [torch.randn(2, 2, n) for n in (9, 10, 11, 12, 13)])
    assert dynamic_off(jmodel) is None
    # the first length, then symbolic ones; an extra length of 0 (symbolic sizes start at 2) once
    assert stats(jmodel).cache_misses == 3, stats(jmodel).miss_reasons


class SinCalls(torch.overrides.TorchFunctionMode):
    """Counts the calls of ``sin`` made under it (torch's or an entry's): a decode step's work."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += getattr(func, "__name__", None) == "sin"
        return func(*args, **(kwargs or {}))


class KeyCache:
    def __init__(self):
        self.keys = None


WINDOW = 4


def windowed_step(x, mask, cache: KeyCache):
    cache.keys = x if cache.keys is None else torch.cat([cache.keys, x], 1)  # written before the branch
    h = torch.sin(x).sum(1)
    if bool(mask[:, -WINDOW:].all()):  # (transformers' ``fast_all``: the padding left the window)
        return cache.keys.sum(1) + h
    return (cache.keys * mask[:, :, None]).sum(1) + h


def decoded(step, steps: int, calls: SinCalls, lookups=lambda: (0, 0)) -> tuple:
    """A prompt of 5 tokens, the second row's first 4 padding, then ``steps`` - 1 one-token steps:
    the outputs, the cache, and the ``torch.sin`` calls and cache lookups (``lookups()``: hits and
    misses so far) of each step that compiled nothing."""
    cache, outs, work = KeyCache(), [], []
    mask = torch.ones(2, 5)
    mask[1, :4] = 0
    x = torch.arange(40.0).reshape(2, 5, 4)
    for _ in range(steps):
        before, (hits, misses) = calls.count, lookups()
        outs.append(step(x, mask, cache))
        if lookups()[1] == misses:
            work.append((calls.count - before, lookups()[0] - hits))
        x = outs[-1][:, None] * 0.1
        mask = torch.cat([mask, torch.ones(2, 1)], 1)
    return outs, cache, work


def test_a_branch_that_flipped_for_good_runs_its_variant_at_once_on_new_lengths():
    # From the fourth step the window holds no padding: the variant of the other branch serves every
    # later step, each of a new length. The symbolic entry of the first branch was looked up first
    # and ran up to the read on every one, then handed over: sin twice a step, two lookups a call.
    with SinCalls() as calls:
        expected, eager_cache, eager_work = decoded(windowed_step, 14, calls)
    jf = thunder_rs.jit(windowed_step)
    with SinCalls() as calls:
        got, cache, work = decoded(jf, 14, calls, lambda: (stats(jf).cache_hits, stats(jf).cache_misses))
    assert all(torch.equal(g, e) for g, e in zip(got, expected))
    assert torch.equal(cache.keys, eager_cache.keys)  # (the keys written once a step, not again)
    assert stats(jf).cache_misses == 3, stats(jf).miss_reasons
    assert [sins for sins, _ in eager_work] == [1] * 14
    assert work == [(1, 1)] * 11  # (the steps that compiled nothing: as eager, one lookup each)
