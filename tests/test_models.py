"""End-to-end: real torch.nn models under thunder_rs.jit match eager PyTorch."""

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import thunder_rs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gpt import GPT, Block, GPTConfig, random_tokens  # noqa: E402


def test_mlp_matches_eager_across_batch_sizes():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.SiLU(), nn.LayerNorm(32), nn.Linear(32, 4))
    jm = thunder_rs.jit(mlp)
    for batch in (1, 7, 0):
        x = torch.randn(batch, 16)
        torch.testing.assert_close(jm(x), mlp(x))
    assert thunder_rs.cache_misses(jm) == 3


@pytest.mark.parametrize("explicit_attention", [False, True], ids=["sdpa", "masked_softmax"])
def test_gpt_block_matches_eager(explicit_attention):
    torch.manual_seed(0)
    block = Block(GPTConfig(block_size=32, n_embd=64, n_head=4, explicit_attention=explicit_attention)).eval()
    jb = thunder_rs.jit(block)
    x = torch.randn(4, 32, 64)
    with torch.no_grad():
        torch.testing.assert_close(jb(x), block(x))


def test_gpt_logits_and_loss_match_eager_with_no_fallbacks():
    config = GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=64)
    model = GPT(config, seed=0).eval()
    idx = random_tokens(config, batch=2, seq=16)
    targets = random_tokens(config, batch=2, seq=16, seed=1)
    jm = thunder_rs.jit(model)
    logits, loss = jm(idx, targets)
    ref_logits, ref_loss = model(idx, targets)
    torch.testing.assert_close(logits, ref_logits)
    torch.testing.assert_close(loss, ref_loss)
    assert thunder_rs.examine(model, idx, targets).fallbacks == {}


def test_gpt_gradients_flow_through_the_generated_code():
    config = GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=32)
    model = GPT(config, seed=0)
    idx = random_tokens(config, batch=2, seq=8)
    targets = random_tokens(config, batch=2, seq=8, seed=1)
    _, loss = thunder_rs.jit(model)(idx, targets)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model(idx, targets)[1].backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, msg=name)
