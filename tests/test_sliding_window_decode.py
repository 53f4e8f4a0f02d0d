"""Greedy decoding of 64 tokens through a jitted module (issue 26), with a sliding window longer
than the prompt: each step's tokens and logits are eager's, and it compiles once per regime of
the window, no more.

The first decoding step reads a cache the prompt's call filled with keys of the prompt's length
(and Mistral's and Gemma's sliding layers a count of its tokens, ``cumulative_length``), while its
attention mask grew from that length. Its mask was traced symbolic, the cache's length and count
constant: ``_ignore_causal_mask_sdpa`` compared the mask with ``count + 1`` (``-t0 + 6 >= 0``), and
the second step compiled again with them symbolic. They are symbolic with the mask from the first
step now (``dynamic.held_grown``): the prompt, then one entry for every step while the window is
not full. What is left is transformers' own Python, which branches on the window: the step that
fills it (``kv_length >= local_attention_size``, ``max(count - window + 1, 0)`` taken on its other
side, the keys sliced from 1 on), then the full window (``is_full``, keys fewer than the count),
each compiled once, as eager takes each branch.
"""

import copy

import pytest
import torch

import thunder_rs

transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip("transformers 5's cache layers (Cache.layers)", allow_module_level=True)

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:thunder_rs.*recompiled"),
]
T = transformers
VOCAB = 99
BODY = dict(
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_size=32,
    intermediate_size=64,
    max_position_embeddings=128,
    vocab_size=VOCAB,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
WINDOWED = {
    "mistral": lambda window: T.MistralForCausalLM(T.MistralConfig(sliding_window=window, **BODY)),
    "gemma2": lambda window: T.Gemma2ForCausalLM(T.Gemma2Config(head_dim=8, sliding_window=window, **BODY)),
    "gemma3": lambda window: T.Gemma3ForCausalLM(T.Gemma3TextConfig(head_dim=8, sliding_window=window, **BODY)),
}
TOKENS = 64


def prompt() -> dict:
    """Two prompts of 5 and 3 tokens, padded on the left."""
    ids = torch.randint(3, VOCAB, (2, 5), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[1, :2], mask[1, :2] = 0, 0
    return dict(input_ids=ids, attention_mask=mask)


def generated_as_eager(name: str, window: int) -> thunder_rs.ThunderModule:
    """A greedy generate of ``TOKENS`` tokens, jitted and eager: the same tokens, and logits."""
    torch.manual_seed(0)
    model = WINDOWED[name](window).to(torch.float64).eval()
    eager, jmodel = copy.deepcopy(model), thunder_rs.jit(model)
    options = dict(max_new_tokens=TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
    options.update(return_dict_in_generate=True, output_logits=True)
    expected, got = eager.generate(**prompt(), **options), jmodel.generate(**prompt(), **options)
    assert torch.equal(got.sequences, expected.sequences)
    assert len(got.logits) == len(expected.logits) == TOKENS
    close = dict(rtol=1e-10, atol=1e-10, equal_nan=True)  # (Gemma-2's padded row: NaN as eager's)
    for step, (g, e) in enumerate(zip(got.logits, expected.logits)):
        torch.testing.assert_close(g, e, **close, msg=lambda m, step=step: f"step {step}: {m}")
    assert thunder_rs.compile_stats(jmodel).eager_calls == 0
    return jmodel


def slow_but(fast: str) -> list:
    return [n if n == fast else pytest.param(n, marks=pytest.mark.slow) for n in WINDOWED]


@pytest.mark.parametrize("name", slow_but("mistral"))
def test_a_window_the_decode_does_not_fill_compiles_the_prompt_and_one_step(name):
    # A window of 128 over 5 + 64 tokens: 3 compiles before (the first step's cache constant).
    stats = thunder_rs.compile_stats(generated_as_eager(name, 128))
    assert stats.cache_misses == 2, stats.miss_reasons
    assert "cache.layers[0].keys.shape[2]" in stats.miss_reasons[1]


@pytest.mark.parametrize("name", slow_but("gemma2"))
def test_a_window_the_decode_fills_compiles_once_per_regime(name):
    # A window of 16: not full (from the first step), the step that fills it, then full; 5 before.
    # The fill and the full window are transformers' branches: each compiles as a failed guard of
    # the symbolic entry (a branch eager takes otherwise), not as a new size. Gemma-3 once more:
    # once the padding left the window, its mask reads all true (``fast_all``), eager's other branch.
    stats = thunder_rs.compile_stats(generated_as_eager(name, 16))
    assert stats.cache_misses == (5 if name == "gemma3" else 4), stats.miss_reasons
    assert "cache.layers[0].keys.shape[2]" in stats.miss_reasons[1]
    assert "in get_mask_sizes" in stats.miss_reasons[2]
    assert all("does not serve it" in reason for reason in stats.miss_reasons[2:4])
    # One lookup a forward: a step after Gemma-3's mask turned all true runs the variant of that
    # branch at once, not the entry before it up to the read (its embedding and mask twice a step).
    # (The forward whose read diverged looked up that entry, then compiled.)
    diverged = sum("the value read by" in reason for reason in stats.miss_reasons)
    assert stats.cache_hits + stats.cache_misses == TOKENS + diverged


class Cache:
    """Keys a first call fills with its input's tokens, later calls append to and keep the last
    ``window - 1`` of, as a sliding layer does."""

    def __init__(self, window: int):
        self.keys, self.window = None, window


def cached_step(x, mask, cache: Cache):
    keys = x if cache.keys is None else torch.cat([cache.keys, x], 1)
    if keys.shape[1] >= cache.window:  # the window is full: a branch on the size, compiled per side
        keys = keys[:, -cache.window + 1 :]
    cache.keys = keys
    return keys.sum(1) * mask.sum(1, keepdim=True), keys.shape[1]


def test_a_cache_the_last_call_filled_grows_with_the_mask_and_branches_as_eager():
    # The prompt (5), then steps of one token and a mask one longer each: the cache's length is
    # symbolic from the first step (the second step compiled again before: the first step's cache
    # was constant). At 8 keys the window is full: the other side of the branch compiles, with
    # eager's values, and once more when the keys it keeps are a slice (other strides).
    jf = thunder_rs.jit(cached_step)
    compiled, eager = Cache(8), Cache(8)
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    for n in range(5, 14):
        mask = torch.ones(2, n, dtype=torch.float64)
        (got, got_n), (want, want_n) = jf(x, mask, compiled), cached_step(x.clone(), mask, eager)
        assert torch.equal(got, want) and got_n == want_n
        assert torch.equal(compiled.keys, eager.keys) and compiled.keys.stride() == eager.keys.stride()
        x = torch.randn(2, 1, 3, dtype=torch.float64)
        if n == 7:  # the second step is served by the first's entry
            assert thunder_rs.compile_stats(jf).cache_misses == 2, thunder_rs.compile_stats(jf).miss_reasons
    # then the step that fills the window (7 keys, contiguous), then the full window's (a slice)
    stats = thunder_rs.compile_stats(jf)
    assert stats.cache_misses == 4, stats.miss_reasons
    assert "does not serve it" in stats.miss_reasons[2] and "cached_step" in stats.miss_reasons[2]
