"""Counts of 0 and 1 at decode sizes (issue 26): Mixtral's sparse MoE block as transformers wrote it
before its experts loop skipped the experts no token chose runs every expert on the tokens
``torch.where`` of its routing mask gives it. Decoding one token per step, each expert gets 0 or
1 tokens (a few at batch 4): a count that changes to 0 or 1 is made symbolic, traced at 2
(size-obliviously, as torch.compile's unbacked sizes), so the whole loop compiles twice rather
than once per routing. Everything against eager: outputs, gradients and the compile counts."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import thunder_rs
from twin_training import misses

pytestmark = pytest.mark.usefixtures("one_thread")


class OldMixtralSparseMoe(nn.Module):
    """transformers' ``MixtralSparseMoeBlock`` of 4.36 to 4.45, its experts ``w1``, ``w2``, ``w3``:
    a loop over every expert, each on the tokens its routing mask gives it (``index_add_``)."""

    def __init__(self, dim: int = 8, experts: int = 8, k: int = 2, ffn: int = 16):
        super().__init__()
        self.k, self.experts = k, experts
        self.gate = nn.Linear(dim, experts, bias=False)
        self.w1 = nn.ModuleList(nn.Linear(dim, ffn, bias=False) for _ in range(experts))
        self.w2 = nn.ModuleList(nn.Linear(ffn, dim, bias=False) for _ in range(experts))
        self.w3 = nn.ModuleList(nn.Linear(dim, ffn, bias=False) for _ in range(experts))

    def forward(self, hidden_states):
        batch, length, dim = hidden_states.shape
        hidden_states = hidden_states.view(-1, dim)
        router_logits = self.gate(hidden_states)
        routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
        routing_weights, selected_experts = torch.topk(routing_weights, self.k, dim=-1)
        routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
        routing_weights = routing_weights.to(hidden_states.dtype)
        final = torch.zeros((batch * length, dim), dtype=hidden_states.dtype, device=hidden_states.device)
        expert_mask = F.one_hot(selected_experts, num_classes=self.experts).permute(2, 1, 0)
        for e in range(self.experts):
            idx, top_x = torch.where(expert_mask[e])
            current = hidden_states[None, top_x].reshape(-1, dim)
            current = self.w2[e](F.silu(self.w1[e](current)) * self.w3[e](current)) * routing_weights[top_x, idx, None]
            final.index_add_(0, top_x, current.to(hidden_states.dtype))
        return final.reshape(batch, length, dim), router_logits


def decode_like_eager(model, batch: int, steps: int = 20) -> tuple:
    """Runs ``steps`` decode steps of one token per sequence through ``model`` jitted and an eager
    copy: outputs, and gradients of the inputs and every parameter, equal. Returns the jitted
    model and the expert counts the steps had."""
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    g = torch.Generator().manual_seed(batch)
    counts: set = set()
    for _ in range(steps):
        x = torch.randn(batch, 1, 8, generator=g, requires_grad=True)
        out, expected = jmodel(x), eager(x)
        torch.testing.assert_close(out, expected)
        wrt = [(x, *model.parameters()), (x, *eager.parameters())]
        grads = [
            torch.autograd.grad(o[0].square().sum() + o[1].sum(), w, allow_unused=True, materialize_grads=True)
            for o, w in zip((out, expected), wrt)
        ]
        for a, e in zip(*grads):
            torch.testing.assert_close(a, e)
        chosen = torch.topk(eager.gate(x.detach().view(-1, 8)), eager.k, dim=-1).indices
        counts.update(torch.bincount(chosen.flatten(), minlength=eager.experts).tolist())
    return jmodel, counts


@pytest.mark.parametrize("batch", [pytest.param(1, marks=pytest.mark.slow), 4])
def test_an_old_mixtral_moe_decodes_in_two_compiles(batch):
    """Before, each routing (which experts got 0 tokens, which 1) compiled a variant: 12 compiles in
    20 steps at batch 1, 16 and calls run eagerly at batch 4."""
    torch.manual_seed(0)
    jmodel, counts = decode_like_eager(OldMixtralSparseMoe(), batch)
    assert {0, 1} <= counts and (batch == 1 or max(counts) >= 2), counts
    stats = thunder_rs.compile_stats(jmodel)
    assert stats.cache_misses == 2 and stats.eager_calls == 0, stats.miss_reasons


def rows_and_strides(x, mask):
    rows = x[None, mask.nonzero().squeeze(1)]
    return rows * 2, rows.stride()


def _mask(n: int) -> torch.Tensor:
    mask = torch.zeros(16, dtype=torch.bool)
    mask[torch.randperm(16, generator=torch.Generator().manual_seed(n))[:n]] = True
    return mask


def test_strides_the_program_reads_are_eagers_at_a_count_of_0():
    """The rows of ``[1, count, 3]`` step over ``3 * count`` elements, eager's ``3`` where the count
    is 0 (a size of 0 counts as 1): a variant traced at a count of 2 or more takes ``3 * count``
    for its own decisions (no tensor with no elements reads them), but the program's ``stride()``
    decides the count nonzero, so a count of 0 compiles for it (1 is served)."""
    x = torch.randn(16, 3, requires_grad=True)
    jfn = thunder_rs.jit(rows_and_strides)
    for n in (4, 6, 0, 1, 5, 0):
        out, expected = jfn(x, _mask(n)), rows_and_strides(x, _mask(n))
        torch.testing.assert_close(out, expected)
    assert misses(jfn) == 3, thunder_rs.compile_stats(jfn).miss_reasons  # 4; every count but 0; 0


def sized_by_a_count_after_a_read(x, mask):
    rows = x[mask]
    total = rows.sum().item()
    return rows.shape[0] * torch.ones(2) + total


def test_the_compiling_call_computes_with_its_own_count():
    """The call that compiles the variant of a count of 1, traced at 2, returns what the program
    computes at 1: its values are evaluated (for ``item()``) with the count it has, not with the
    one traced."""
    x = torch.randn(16, 3)
    jfn = thunder_rs.jit(sized_by_a_count_after_a_read)
    for n in (3, 1, 0, 5):
        torch.testing.assert_close(jfn(x, _mask(n)), sized_by_a_count_after_a_read(x, _mask(n)))
