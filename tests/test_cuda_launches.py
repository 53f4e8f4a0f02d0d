"""Kernel launches of thunder_rs's executed programs against eager's, counted (never timed): on an
H100 every aten op outside an nvFuser region is a launch of 5-10 µs of host time
(``benchmarks/cuda_launches.py`` counts them for whole models on fake CUDA; its table is
``benchmarks/results/cuda_launches_stop64.md``). Each bound here is eager's count in the same test.
"""

import collections
import sys
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import thunder_rs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import cuda_launches  # noqa: E402


class _Ops(TorchDispatchMode):
    """The aten ops dispatched under it, by name."""

    def __init__(self):
        super().__init__()
        self.seen: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _bn_net():
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3), nn.BatchNorm2d(4)
    ).train()


def test_a_backward_makes_no_zeros_for_the_running_statistics_it_writes_back():
    """BatchNorm's running statistics are written back from the compiled forward's outputs, which
    no cotangent flows into: eager's engine made a zeros tensor for each of them (3 per BatchNorm)
    and handed it to the compiled backward, which never read it; eager's backward makes none."""
    model, twin = _bn_net(), _bn_net()
    jmodel = thunder_rs.jit(twin)
    x = torch.randn(2, 3, 10, 10)
    counts = {}
    for name, m in (("eager", model), ("thunder_rs", jmodel)):
        for _ in range(2):  # (the second call's: the first compiles)
            out = m(x.clone().requires_grad_())
            ops = _Ops()
            with ops:
                out.square().sum().backward()
        counts[name] = ops.seen
    assert counts["thunder_rs"]["zeros"] <= counts["eager"]["zeros"] == 0
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad)
    for b, c in zip(model.buffers(), twin.buffers()):
        torch.testing.assert_close(c, b)


def test_on_fake_cuda_a_bn_training_step_launches_no_more_backward_ops_than_eager():
    """The benchmark's count (``cuda_launches``) on the CUDA default path with the stand-in
    nvFuser: the backward's launches (ops outside regions plus regions) at most eager's."""
    with cuda_launches.cuda_default_path() as (cuda_ex, _, _), FakeTensorMode():
        with torch.device("cuda"):
            model = _bn_net()
            x = torch.randn(2, 3, 10, 10)
        jmodel = thunder_rs.jit(model, executors=[cuda_ex, "torch"])
        launches = {}
        for name, fn in (("eager", model), ("thunder_rs", jmodel)):
            for _ in range(2):
                loss = fn(x).square().sum()
                counter = cuda_launches.Counter()
                with cuda_launches.counting(counter):
                    cuda_launches.run_backward(loss)
            launches[name] = counter.counts
        assert cuda_ex.stats["failures"] == 0, cuda_ex.fallbacks
    ours, eager = launches["thunder_rs"], launches["eager"]
    assert ours.fusions > 0
    assert ours.ops["zeros"] == 0, ours.ops
    assert ours.launches + ours.fusions <= eager.launches, (ours.ops, eager.ops)


def _forward_ops(model, jmodel, x, grad: bool) -> dict:
    """The ops outside fusions of the second forward of eager's ``model`` and of ``jmodel``."""
    ops = {}
    for name, fn in (("eager", model), ("thunder_rs", jmodel)):
        for _ in range(2):
            counter = cuda_launches.Counter()
            with cuda_launches.counting(counter), torch.set_grad_enabled(grad):
                fn(x)
        ops[name] = counter.counts.ops
    return ops


def test_on_fake_cuda_a_bn_training_forward_keeps_no_copy_of_the_running_statistics():
    """A training call kept a clone of each running statistic it writes back, for a double
    backward computing the call again: its output and batch statistics do not read them (eager's
    node reads them in eval mode only, and keeps no copy). Eager clones nothing."""
    with cuda_launches.cuda_default_path() as (cuda_ex, _, _), FakeTensorMode():
        with torch.device("cuda"):
            model, twin = _bn_net(), _bn_net()
            x = torch.randn(2, 3, 10, 10, requires_grad=True)
        ops = _forward_ops(model, thunder_rs.jit(twin, executors=[cuda_ex, "torch"]), x, True)
    assert ops["thunder_rs"]["clone"] <= ops["eager"]["clone"] == 0, ops


@pytest.mark.parametrize("grad", [True, False], ids=["training", "no_grad"])
def test_on_fake_cuda_a_bn_training_forward_launches_no_more_than_eager(grad):
    """The running statistics and batch counts a training forward writes back were copied one
    ``copy_`` each (3 launches per BatchNorm, where eager's kernel updates the statistics in place
    and adds to the count once); they are copied by one ``_foreach_copy_`` per dtype, the version
    counters left at eager's."""
    with cuda_launches.cuda_default_path() as (cuda_ex, _, _), FakeTensorMode():
        with torch.device("cuda"):
            model, twin = _bn_net(), _bn_net()
            x = torch.randn(2, 3, 10, 10, requires_grad=grad)
        launches, fusions = {}, {}
        for name, fn in (("eager", model), ("thunder_rs", thunder_rs.jit(twin, executors=[cuda_ex, "torch"]))):
            for _ in range(2):
                counter = cuda_launches.Counter()
                with cuda_launches.counting(counter), torch.set_grad_enabled(grad):
                    fn(x)
            launches[name], fusions[name] = counter.counts.ops, counter.counts.fusions
        versions = [[b._version for b in m.buffers()] for m in (model, twin)]
    assert sum(launches["thunder_rs"].values()) + fusions["thunder_rs"] <= sum(launches["eager"].values()), launches
    assert versions[1] == versions[0]


class _Attention(torch.nn.Module):
    """GPT's attention: heads split off a fused projection, attended, merged back."""

    def __init__(self, heads: int, head_size: int, dtype):
        super().__init__()
        self.heads, self.channels = heads, heads * head_size
        self.qkv = torch.nn.Linear(self.channels, 3 * self.channels, dtype=dtype)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(C, 2))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).contiguous().view(B, T, C), y.stride()


def _flash_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Eager's composite choosing flash attention: the head size padded to a multiple of 8, the
    output cut back."""
    pad = -q.shape[-1] % 8
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    padded = [torch.nn.functional.pad(t, (0, pad)) for t in (q, k, v)]
    out = torch.ops.aten._scaled_dot_product_flash_attention(*padded, dropout_p, is_causal, scale=scale)[0]
    return out[..., : q.shape[-1]]


@pytest.mark.parametrize(
    "dtype, head_size, flash", [(torch.float32, 8, False), (torch.bfloat16, 8, False), (torch.bfloat16, 12, True)]
)
def test_on_fake_cuda_inference_attention_has_the_fused_kernels_strides(monkeypatch, dtype, head_size, flash):
    """Under no_grad the attention is recorded whole: its output took the math path's row-major
    strides where the fused kernel torch runs on CUDA returns its own (the memory-efficient one's
    ``[B, L, H, D]``-major, flash's and cuDNN's the query's order; flash's of a head size padded),
    so the program's ``y.stride()`` was not eager's and ``y.transpose(1, 2).contiguous()`` copied
    where eager's copies nothing."""
    from thunder_rs.torch import fused_attention as fa

    with cuda_launches.cuda_default_path() as (cuda_ex, _, _), FakeTensorMode():
        if flash:
            monkeypatch.setattr(fa, "fused_sdp_choice", lambda *args: fa.FLASH)
            monkeypatch.setattr(cuda_launches, "_fused_eager_sdpa", _flash_sdpa)
        with torch.device("cuda"):
            torch.manual_seed(0)
            model = _Attention(2, head_size, dtype)
            x = torch.randn(2, 8, 2 * head_size, dtype=dtype)
        jmodel = thunder_rs.jit(model, executors=[cuda_ex, "torch"])
        seen = {}
        for name, fn in (("eager", model), ("thunder_rs", jmodel)):
            for _ in range(2):
                counter = cuda_launches.Counter()
                with cuda_launches.counting(counter), torch.no_grad():
                    seen[name] = fn(x)[1], counter.counts.copies
    (eager_strides, eager_copies), (strides, copies) = seen["eager"], seen["thunder_rs"]
    assert strides == eager_strides
    assert sum(copies.values()) <= sum(eager_copies.values()), (copies, eager_copies)


@pytest.mark.slow
def test_the_benchmark_counts_a_model():
    """``benchmarks/cuda_launches.py`` runs on a model of the table (the others: slow to build)."""
    result = cuda_launches.measure("gpt", False)
    assert result["thunder_rs"]["forward"].fusions > 0
    assert result["eager"]["optimizer"].launches == result["thunder_rs"]["optimizer"].launches
