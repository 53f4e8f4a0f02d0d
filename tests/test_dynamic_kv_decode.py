"""A hand-written KV-cache decode (issue 26): a preallocated cache written at the position of each
token (``k_cache[:, :, pos] = k``) and read up to it (``k_cache[:, :, : pos + 1]``), the position an
argument of the call or a count the module keeps (``self.pos += 1``). 64 greedy tokens in three
compiles (positions 0 and 1 stay constant, as sizes do; the position is symbolic from 2), with
eager's tokens, logits and caches."""

import copy
import math

import pytest
import torch
import torch.nn as nn

import thunder_rs
from twin_training import misses

pytestmark = pytest.mark.usefixtures("one_thread")


class CachedAttention(nn.Module):
    """One attention layer over a preallocated KV cache, a token per call."""

    def __init__(self, dim: int = 32, heads: int = 4, length: int = 64, vocab: int = 50):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.embed = nn.Embedding(vocab, dim)
        self.qkv, self.out, self.head = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), nn.Linear(dim, vocab)
        self.register_buffer("k_cache", torch.zeros(1, heads, length, self.head_dim))
        self.register_buffer("v_cache", torch.zeros(1, heads, length, self.head_dim))
        self.pos = 0

    def step(self, token, pos):
        x = self.embed(token)
        q, k, v = (t.view(1, 1, self.heads, self.head_dim).transpose(1, 2) for t in self.qkv(x).split(x.shape[-1], -1))
        self.k_cache[:, :, pos] = k[:, :, 0]
        self.v_cache[:, :, pos] = v[:, :, 0]
        keys, values = self.k_cache[:, :, : pos + 1], self.v_cache[:, :, : pos + 1]
        attention = torch.softmax(q @ keys.transpose(-1, -2) / math.sqrt(self.head_dim), -1) @ values
        return self.head(self.out(attention.transpose(1, 2).reshape(1, 1, -1)))[:, -1]

    def forward(self, token, pos=None):
        if pos is not None:
            return self.step(token, pos)
        logits = self.step(token, self.pos)
        self.pos += 1
        return logits


@pytest.mark.parametrize("where", ["argument", "module count"])
def test_a_kv_cache_written_at_each_position_decodes_64_tokens_in_three_compiles(where):
    # The module's count compiled four times: a count going from 1 to 2 was not yet marked (only
    # from 2 up), so 2 was compiled constant and the count symbolic from 3.
    torch.manual_seed(0)
    model = CachedAttention().eval()
    eager, jmodel = copy.deepcopy(model), thunder_rs.jit(model)
    tokens = [torch.tensor([[1]])] * 2
    with torch.no_grad():
        for pos in range(64):
            args = (pos,) if where == "argument" else ()
            got, expected = jmodel(tokens[0], *args), eager(tokens[1], *args)
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
            tokens = [got.argmax(-1, keepdim=True), expected.argmax(-1, keepdim=True)]
            assert torch.equal(tokens[0], tokens[1])
    torch.testing.assert_close(model.k_cache, eager.k_cache, rtol=0, atol=0)
    torch.testing.assert_close(model.v_cache, eager.v_cache, rtol=0, atol=0)
    assert model.pos == eager.pos
    assert misses(jmodel) == 3, thunder_rs.compile_stats(jmodel).miss_reasons
