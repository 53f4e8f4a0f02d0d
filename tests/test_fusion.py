"""Fusion executors end to end: regions formed by the Rust partitioner, handed to ``fuse`` once
each, called once per call, and computing what eager computes (outputs and gradients).

The fusion executor here is test-only: it takes the torch executor's implementations (all but
matrix products, which then cut regions) and its ``fuse`` returns ``region.function`` wrapped
in a counter.
"""

import copy
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

import thunder_rs
from thunder_rs.errors import ThunderRuntimeError, ThunderValueError
from thunder_rs.executors import FusionExecutor, get_default_executors, known_executor_names
from thunder_rs.executors.torch_ex import torch_ex

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gpt import GPT, Block, GPTConfig, random_tokens  # noqa: E402

_PRODUCTS = ("matmul", "linear", "mm", "bmm", "baddbmm", "scaled_dot_product")


class CountingFuser(FusionExecutor):
    """Fuses everything the torch executor runs except matrix products; counts ``fuse`` calls
    and region calls by region name."""

    def __init__(self, name: str = "counting", fail: bool = False):
        super().__init__(name)
        keys = [k for k, impl in torch_ex.registry.items() if not any(p in impl.name for p in _PRODUCTS)]
        self.take_from(torch_ex, keys)
        self.fail = fail
        self.fused: list = []
        self.calls: Counter = Counter()

    def fuse(self, region):
        if self.fail:
            raise RuntimeError("cannot fuse this")
        self.fused.append(region)
        function = region.function

        def run(*inputs):
            self.calls[region.name] += 1
            out = function(*inputs)
            assert isinstance(out, tuple) and len(out) == region.num_outputs
            return out

        return run


def _region_names(trace) -> list[str]:
    return [region.name for region in trace.regions()]


def _chain(x, y):
    a = torch.sin(x) * y + 1.0
    b = torch.tanh(a) - torch.exp(-a)
    return (b * b).sum(dim=-1), torch.sigmoid(b)


def _check_grads(fn, jfn, *inputs):
    """Outputs and the gradients of every input that requires grad equal eager's."""
    eager_inputs = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    out, ref = jfn(*inputs), fn(*eager_inputs)
    torch.testing.assert_close(out, ref)
    outs, refs = (out, ref) if isinstance(out, tuple) else ((out,), (ref,))
    cots = [torch.randn_like(r) for r in refs]
    torch.autograd.backward(outs, cots)
    torch.autograd.backward(refs, cots)
    for t, e in zip(inputs, eager_inputs):
        if t.requires_grad:
            torch.testing.assert_close(t.grad, e.grad)


def test_an_elementwise_chain_is_one_region_each_way_called_once_per_call():
    fuser = CountingFuser()
    jfn = thunder_rs.jit(_chain, executors=[fuser])
    x, y = torch.randn(3, 8, requires_grad=True), torch.randn(3, 8, requires_grad=True)
    _check_grads(_chain, jfn, x, y)
    forward, backward = thunder_rs.last_traces(jfn)[-1], thunder_rs.last_backward_traces(jfn)[-1]
    assert forward.symbol_names() == ["counting_fusion0"]
    assert _region_names(backward) == ["counting_fusion0"]
    (region,) = forward.regions()
    assert region.executor == 0 and region.num_inputs == 2 and region.source.startswith("def counting_fusion0(")
    assert "ltorch.sin" in region.symbol_names and "ltorch.sigmoid" in region.symbol_names
    assert region == thunder_rs.last_traces(jfn)[-1].regions()[0] and region != backward.regions()[0]
    assert repr(region).startswith("RegionCode(name='counting_fusion0', executor=0, symbol_names=[")
    assert "# counting_fusion0: " in str(forward) and "#   t" not in str(forward)
    assert [r.name for r in fuser.fused] == ["counting_fusion0", "counting_fusion0"]  # forward, backward
    assert fuser.calls["counting_fusion0"] == 2
    jfn(x, y)  # a cache hit runs the fused callables without fusing again
    assert thunder_rs.cache_misses(jfn) == 1 and fuser.calls["counting_fusion0"] == 3  # forward only
    assert len(fuser.fused) == 2


def test_fuse_is_a_stage_after_claim_only_with_a_fusion_executor(monkeypatch, capsys):
    x, y = torch.randn(3, 8, requires_grad=True), torch.randn(3, 8)
    monkeypatch.setenv("THUNDER_RS_DUMP", "fuse")
    jfn = thunder_rs.jit(_chain, executors=[CountingFuser()])
    jfn(x, y)
    assert [t.label for t in thunder_rs.last_traces(jfn)][-3:] == ["claim", "fuse", "lifetimes"]
    assert [t.label for t in thunder_rs.last_backward_traces(jfn)][-3:] == ["claim", "fuse", "lifetimes"]
    stages = thunder_rs.compile_stats(jfn).stage_s
    assert "pass:fuse" in stages and "backward:fuse" in stages and "fuse" in stages
    dumped = capsys.readouterr().err
    assert "after fuse" in dumped and "counting_fusion0(t0, t1)" in dumped
    plain = thunder_rs.jit(_chain)
    plain(x, y)
    assert "fuse" not in [t.label for t in thunder_rs.last_traces(plain)]


def test_matrix_products_cut_regions_and_lone_or_shape_only_groups_are_dropped():
    fuser = CountingFuser()

    def fn(x, w):
        h = torch.relu(x * 2.0 + 1.0)  # a region: mul, add, relu
        z = h @ w  # not fusible
        z = torch.sin(z)  # a lone op: dropped
        z = z @ w
        return z.reshape(-1).reshape(4, 4).t()  # shape ops only: dropped

    jfn = thunder_rs.jit(fn, executors=[fuser])
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    torch.testing.assert_close(jfn(x, w), fn(x, w))
    trace = thunder_rs.last_traces(jfn)[-1]
    names = trace.symbol_names()
    assert names[0] == "counting_fusion0" and _region_names(trace) == ["counting_fusion0"]
    assert "ltorch.sin" in names and "ltorch.t" in names and names.count("ltorch.matmul") == 2
    assert list(fuser.calls.items()) == [("counting_fusion0", 1)]


def test_gpt_block_outputs_and_gradients_match_eager():
    torch.manual_seed(0)
    block = Block(GPTConfig(block_size=16, n_embd=32, n_head=2))
    fuser = CountingFuser()
    jb = thunder_rs.jit(block, executors=[fuser])
    x = torch.randn(2, 16, 32, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    out, ref = jb(x), block(xe)
    torch.testing.assert_close(out, ref)
    cot = torch.randn_like(ref)
    grads = torch.autograd.grad(out, [x, *block.parameters()], cot)
    refs = torch.autograd.grad(ref, [xe, *block.parameters()], cot)
    for g, r in zip(grads, refs):
        torch.testing.assert_close(g, r)
    forward, backward = thunder_rs.last_traces(jb)[-1], thunder_rs.last_backward_traces(jb)[-1]
    regions = _region_names(forward) + _region_names(backward)
    assert len(_region_names(forward)) >= 1 and len(_region_names(backward)) >= 2
    # Every region ran exactly once in this call (forward names and backward names overlap).
    assert sum(fuser.calls.values()) == len(regions)


def test_gpt_with_dropout_trains_as_eager_with_the_same_draws():
    config = GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.1)
    model = GPT(config, seed=0).train()
    eager = copy.deepcopy(model)
    fuser = CountingFuser()
    sides = [
        (thunder_rs.jit(model, executors=[fuser]), torch.optim.AdamW(model.parameters(), lr=1e-3)),
        (eager, torch.optim.AdamW(eager.parameters(), lr=1e-3)),
    ]
    for step in range(3):
        idx, targets = random_tokens(config, 2, 16, seed=step), random_tokens(config, 2, 16, seed=100 + step)
        losses = []
        for fn, opt in sides:
            opt.zero_grad(set_to_none=True)
            torch.manual_seed(step)
            _, loss = fn(idx, targets)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[0], losses[1])
    for (name, p), e in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p, e, msg=name)
    # Each region that runs, once per step: ``loss.backward()`` runs the backward compiled for the
    # loss alone (the logits get no cotangent), whose regions replace the whole backward's.
    assert fuser.fused and all(n % 3 == 0 for n in fuser.calls.values())
    assert sum(fuser.calls.values()) <= 3 * len(fuser.fused)


def test_non_contiguous_and_broadcast_region_inputs():
    fuser = CountingFuser()

    def fn(x, y, s):
        return torch.exp(x * y) + s * torch.cos(x)

    jfn = thunder_rs.jit(fn, executors=[fuser])
    x = torch.randn(6, 5).t().requires_grad_()  # non-contiguous
    y = torch.randn(1, 6).expand(5, 6)  # broadcast, stride 0
    s = torch.randn(6, requires_grad=True)
    assert not x.is_contiguous()
    _check_grads(fn, jfn, x, y, s)
    assert _region_names(thunder_rs.last_traces(jfn)[-1]) == ["counting_fusion0"]


def test_random_draws_stay_outside_regions_and_match_eager():
    def fn(x):
        a = torch.sin(x) * 2.0
        r = torch.rand_like(x)  # between members of one region
        b = torch.exp(a) * r
        n = torch.randn_like(x)
        return torch.tanh(b) + n * a

    fuser = CountingFuser()
    jfn = thunder_rs.jit(fn, executors=[fuser])
    x = torch.randn(8)
    torch.manual_seed(7)
    out = jfn(x)
    torch.manual_seed(7)
    torch.testing.assert_close(out, fn(x))
    torch.manual_seed(8)
    out = jfn(x)
    torch.manual_seed(8)
    torch.testing.assert_close(out, fn(x))
    trace = thunder_rs.last_traces(jfn)[-1]
    for region in trace.regions():
        assert not any("rand" in s or "uniform" in s for s in region.symbol_names)
    assert trace.regions()


def test_identical_regions_have_equal_keys_and_distinct_names():
    fuser = CountingFuser()

    def layer(x, w):
        return torch.tanh(x * 0.5 + 1.0) @ w

    def fn(x, w):
        return layer(layer(x, w), w)

    jfn = thunder_rs.jit(fn, executors=[fuser])
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    torch.testing.assert_close(jfn(x, w), fn(x, w))
    regions = thunder_rs.last_traces(jfn)[-1].regions()
    assert [r.name for r in regions] == ["counting_fusion0", "counting_fusion1"]
    assert regions[0].key == regions[1].key and regions[0].source != regions[1].source
    other = thunder_rs.jit(fn, executors=[CountingFuser()])
    other(torch.randn(4, 5), torch.randn(5, 5))
    assert thunder_rs.last_traces(other)[-1].regions()[0].key != regions[0].key  # other shapes


def test_a_failing_fuse_leaves_the_cache_as_it_was():
    fuser = CountingFuser(fail=True)
    jfn = thunder_rs.jit(_chain, executors=[fuser])
    x, y = torch.randn(3, 8), torch.randn(3, 8)
    with pytest.raises(ThunderRuntimeError, match=r"counting executor: fuse failed on region counting_fusion0"):
        jfn(x, y)
    assert jfn._cache == {} and thunder_rs.cache_misses(jfn) == 0
    fuser.fail = False
    torch.testing.assert_close(jfn(x, y), _chain(x, y))
    assert fuser.calls["counting_fusion0"] == 1


def test_executors_by_name_and_defaults():
    assert get_default_executors()[-1] is torch_ex
    assert "torch" in known_executor_names()
    with pytest.raises(ThunderValueError, match=r"unknown executor 'nope'; known executors: .*torch"):
        thunder_rs.jit(_chain, executors=["nope"])
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    jfn = thunder_rs.jit(_chain, executors=["torch"])
    torch.testing.assert_close(jfn(x, y), _chain(x, y))
    assert thunder_rs.last_traces(jfn)[-1].regions() == []
    # The executors are the jit's: another jit's defaults are untouched.
    fused = thunder_rs.jit(_chain, executors=[CountingFuser()])
    fused(x, y)
    plain = thunder_rs.jit(_chain)
    plain(x, y)
    assert thunder_rs.last_traces(plain)[-1].regions() == []
