"""Symbolic sizes through calls thunder_rs runs as eager fallbacks (issue 26): their output sizes
come from torch's fake kernels run over the recording's size values (``core.lang.fallback_sizes``),
so a length stays symbolic through them and what the kernel decided on it is guarded; and the
miss reason of a call a symbolic entry does not serve names the guard it fails.

Found on Hugging Face models: Mixtral's experts (an inverse permutation written with
``inv[perm] = arange(n)``, a fallback) specialised the length, a compile for every padded length
in training; BART compiled once more past its head size (CPU flash attention's check compared the
length with the head size through ``min``).
"""

import pytest
import torch
import torch.nn.functional as F
from custom_ops import fold_pairs, head_rows, pool_long_rows
from twin_training import train_like_eager

import thunder_rs

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")


def misses(jfn) -> int:
    return thunder_rs.compile_stats(jfn).cache_misses


def folded(x):
    return fold_pairs(x * 2).sin()


def test_a_fallback_keeps_a_length_symbolic_in_training():
    jf = thunder_rs.jit(folded)
    for n in [4, 6, 8, 12, 10]:
        x = torch.randn(n, 5, requires_grad=True)
        y = x.detach().clone().requires_grad_()
        out, expected = jf(x), folded(y)
        torch.testing.assert_close(out, expected)
        (out * out).sum().backward()
        (expected * expected).sum().backward()
        torch.testing.assert_close(x.grad, y.grad)
    assert misses(jf) == 2
    trace = str(thunder_rs.last_traces(jf)[-1])
    assert "(t0 // 2), 10]" in trace and "guard (t0 % 2) == 0" in trace  # the fake kernel's check


def test_a_fallback_fails_as_eager_where_its_fake_kernels_check_fails():
    jf = thunder_rs.jit(folded)
    for n in [4, 6]:
        jf(torch.randn(n, 3))
    x = torch.randn(7, 3)
    with pytest.raises(RuntimeError):
        folded(x)
    with pytest.raises(RuntimeError, match="odd number of rows"):
        jf(x)


def test_a_fallback_that_decides_on_a_size_recompiles_the_other_way():
    def fn(x):
        return pool_long_rows(x).cos()

    jf = thunder_rs.jit(fn)
    for n in [4, 6, 8, 12, 16, 10, 6]:
        x = torch.randn(3, n)
        torch.testing.assert_close(jf(x), fn(x))
    assert misses(jf) == 3
    reason = thunder_rs.compile_stats(jf).miss_reasons[-1]
    assert "the entry with symbolic sizes does not serve it: -t0 + 8 >= 0 fails (t0 = x.shape[1] = 12)" in reason


def inverse_permutation(x):
    # As Mixtral's experts restore the tokens' order.
    perm = torch.argsort(x[:, 0])
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.size(0))
    return x[perm][inv] * 2


# A symbolic int passed to a fallback; an index_put (a fallback) writing an arange of the length.
ROW_PROGRAMS = {"int_argument": lambda x: head_rows(x, x.shape[0] // 2) + 1, "index_put": inverse_permutation}


@pytest.mark.parametrize("name", list(ROW_PROGRAMS))
def test_fallbacks_over_a_changing_row_count_stay_symbolic(name):
    fn = ROW_PROGRAMS[name]
    jf = thunder_rs.jit(fn)
    for n in [4, 6, 9, 13]:
        x = torch.randn(n, 3)
        torch.testing.assert_close(jf(x), fn(x))
    assert misses(jf) == 2


def test_cpu_flash_attention_past_its_head_size_needs_no_compile_more():
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    jf = thunder_rs.jit(fn)
    for n in [4, 6, 8, 20, 40]:
        q, k, v = (torch.randn(1, 2, n, 8, requires_grad=True) for _ in range(3))
        out = jf(q, k, v)
        torch.testing.assert_close(out, fn(q, k, v))
        out.sum().backward()
    assert misses(jf) == 2


def _lm_batch(seed: int, length: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 99, (2, length), generator=g)
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, length - 3 :] = 0
    return dict(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))


def test_a_mixture_of_experts_trains_with_padding_lengths_in_two_compiles():
    T = transformers
    config = T.MixtralConfig(
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=32,
        intermediate_size=64,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        vocab_size=99,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = T.MixtralForCausalLM(config).train()
    batches = [_lm_batch(i, length) for i, length in enumerate([8, 11, 14, 9])]
    jmodel = train_like_eager(model, batches, lambda out: out.loss, rtol=1e-4, atol=1e-5)
    assert misses(jmodel) == 2


def test_a_fallback_under_autocast_keeps_eagers_dtypes_with_symbolic_sizes():
    def fn(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fold_pairs(x @ w).float().sin()

    jf, w = thunder_rs.jit(fn), torch.randn(5, 5)
    for n in [4, 6, 8, 10]:
        x = torch.randn(n, 5)
        out, expected = jf(x, w), fn(x, w)
        assert out.dtype == expected.dtype
        torch.testing.assert_close(out, expected)
    assert misses(jf) == 2
