"""Generation and training with shapes that change between calls (issue 26), Hugging Face families
not covered by ``test_kv_cache`` and ``test_dynamic_families``: ``generate`` through a jitted
decoder or encoder-decoder (eager's tokens, three compiles: the prompt, the first step, then the
cache's length symbolic), generates of other batch sizes and prompt lengths, and SGD training
over padded lengths. Tiny configs built in code (nothing downloaded).

What made them compile more: a sliding window's keys (Mistral, Gemma-2) are a slice of the
prompt's states, then of each step's, so their strides change at the second step, the step
their token count (``cumulative_length``) first changes; that strided tensor hid the changed
count, which turned symbolic one step later. And a generate of another batch size makes a new
cache whose first step was compared only with the entry compiled last, its own prompt's (a cache
of no tensors yet), so the cache's batch stayed constant while the input's turned symbolic:
``torch.cat`` of the two guarded them equal, and BLOOM, which reshapes its ALiBi bias by both,
compiled at every step of every generate of another batch.
"""

import pytest
import torch

import thunder_rs

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:thunder_rs.*recompiled"),
]


def misses(jfn) -> int:
    return thunder_rs.compile_stats(jfn).cache_misses


# -- the mechanisms, in small ----------------------------------------------------------------------


class Window:
    """A sliding window over keys, as transformers' ``DynamicSlidingWindowLayer``: the last
    ``size - 1`` keys, sliced from the keys it attended to, and the count of tokens it saw."""

    def __init__(self, prompt: torch.Tensor, size: int = 4):
        self.size, self.seen, self.keys = size, prompt.shape[1], prompt[:, -size + 1 :]


def window_step(x, cache: Window):
    keys = torch.cat([cache.keys, x], 1)
    cache.keys = keys[:, -cache.size + 1 :]
    cache.seen += x.shape[1]
    return keys.softmax(1).sum(1) * cache.seen


def test_a_count_changing_with_the_strides_of_a_window_turns_symbolic_at_once():
    # The window's keys are a slice of the prompt's (strides of 5 tokens), then of each step's
    # (of 4): the second step fails their guard on strides and the count's on its value. The
    # count turned symbolic only at the third step when the strides hid it.
    base = torch.randn(2, 5, 3, dtype=torch.float64)
    jf = thunder_rs.jit(window_step)
    compiled, eager = Window(base), Window(base.clone())
    for step in range(6):
        x = torch.randn(2, 1, 3, dtype=torch.float64)
        torch.testing.assert_close(jf(x, compiled), window_step(x, eager))
        assert compiled.seen == eager.seen and compiled.keys.stride() == eager.keys.stride()
        torch.testing.assert_close(compiled.keys, eager.keys)
    stats = thunder_rs.compile_stats(jf)
    assert stats.cache_misses == 2, stats.miss_reasons
    assert stats.miss_reasons[1].endswith("compiled with symbolic sizes cache.seen"), stats.miss_reasons[1]


class Layer:
    """A cache layer made empty, filled by the prompt, grown by each step (transformers'
    ``DynamicLayer``)."""

    keys = None


def cached_step(x, layer: Layer):
    layer.keys = x if layer.keys is None else torch.cat([layer.keys, x], 1)
    return (layer.keys.softmax(1) * x[:, -1:]).sum(1)


def decode(call, prompt: torch.Tensor, steps: int = 4):
    layer = Layer()
    outs = [call(prompt, layer)]
    for i in range(steps):
        outs.append(call(prompt[:, -1:] * (i + 2), layer))
    return outs, layer


def test_a_new_cache_of_another_batch_is_compared_with_the_steps_of_the_last():
    # Each decode makes a new layer; its first step was compared with the entry compiled last,
    # the prompt's (no keys yet), so the layer's batch stayed constant, guarded equal to the
    # input's through torch.cat: a compile more for every batch.
    jf = thunder_rs.jit(cached_step)
    for batch, length in [(2, 5), (3, 5), (4, 7), (2, 6), (5, 5)]:
        prompt = torch.randn(batch, length, 3, generator=torch.Generator().manual_seed(batch))
        (outs, layer), (want, want_layer) = decode(jf, prompt), decode(cached_step, prompt)
        torch.testing.assert_close(outs, want)
        torch.testing.assert_close(layer.keys, want_layer.keys)
    # The first decode: its prompt, its first step, its second with the length symbolic; the
    # second: its prompt and first step with the batch symbolic too; the others reuse them.
    assert misses(jf) == 5, thunder_rs.compile_stats(jf).miss_reasons
