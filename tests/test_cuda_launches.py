"""Kernel launches of thunder_rs's executed programs against eager's, counted (never timed): on an
H100 every aten op outside an nvFuser region is a launch of 5-10 µs of host time
(``benchmarks/cuda_launches.py`` counts them for whole models on fake CUDA; its table is
``benchmarks/results/cuda_launches_stop63.md``). Each bound here is eager's count in the same test.
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


@pytest.mark.slow
def test_the_benchmark_counts_a_model():
    """``benchmarks/cuda_launches.py`` runs on a model of the table (the others: slow to build)."""
    result = cuda_launches.measure("gpt", False)
    assert result["thunder_rs"]["forward"].fusions > 0
    assert result["eager"]["optimizer"].launches == result["thunder_rs"]["optimizer"].launches
