"""Reads of values while tracing run the program so far in segments (``core/lang/snapshots.py``):
each call of the program runs once while tracing, whatever the number of reads, and random draws,
generator state, in-place writes to inputs and the results stay those of eager."""

import copy

import pytest
import torch
import torch.nn.functional as F

import thunder_rs
from thunder_rs.core.lang import snapshots, values

RUNS = {"n": 0}


@torch.library.custom_op("thunder_rs_tests::counted_double", mutates_args=())
def counted_double(x: torch.Tensor) -> torch.Tensor:
    RUNS["n"] += 1
    return x * 2


@counted_double.register_fake
def _(x):
    return torch.empty_like(x)


def branches_per_step(x, steps: int = 6):
    for _ in range(steps):
        x = counted_double(x)
        x = x - 1 if x.sum() > 0 else x + 1  # a read: the program so far runs
    return x


def doubled_after_reads(x):
    return counted_double(counted_double(branches_per_step(x, 2)))


def runs_while_compiling(fn, *args) -> int:
    """How many more times than eager the first call of ``fn`` jitted runs ``counted_double``."""
    RUNS["n"] = 0
    expected = fn(*args)
    eager_runs = RUNS["n"]
    RUNS["n"] = 0
    torch.testing.assert_close(thunder_rs.jit(fn)(*args), expected)
    return RUNS["n"] - eager_runs


@pytest.mark.parametrize("fn", [branches_per_step, doubled_after_reads])
def test_a_first_call_runs_each_call_once_as_eager_whatever_the_number_of_reads(fn):
    """Each call runs once while tracing, and the first call returns what the reads computed
    (the calls after the last read run then too): it ran the whole program again, compiled."""
    x = torch.tensor([0.5, -2.0, 3.0])
    assert runs_while_compiling(fn, x) == 0  # from the start at each read: 1 + 2 + ... + 6 more


def test_past_the_memory_budget_each_read_runs_the_program_from_its_start(monkeypatch):
    monkeypatch.setattr(snapshots, "_budget", lambda device: 0)
    x = torch.tensor([0.5, -2.0, 3.0])
    assert runs_while_compiling(branches_per_step, x) == 21  # 1 + 2 + ... + 6, then the compiled call


def test_the_tensors_computed_while_tracing_are_not_kept_past_it(monkeypatch):
    made = []

    class Kept(snapshots.Snapshots):
        def __init__(self, run):
            super().__init__(run)
            made.append(self)

    monkeypatch.setattr(values, "Snapshots", Kept)
    thunder_rs.jit(branches_per_step)(torch.tensor([0.5, -2.0, 3.0]))
    assert len(made) == 1 and made[0]._known == {}


def draws_between_reads(x):
    a = torch.randn_like(x)
    n = int((x + a > 0).sum())
    b = torch.rand(n + 2)
    picked = (b > 0.5).nonzero()
    c = F.dropout(x * b[:1], 0.5, training=True)
    if (c != 0).sum() > 1:
        c = c + torch.randn(1)
    return a, b, picked, c, torch.rand(2)


def seeds_between_reads(x):
    a = torch.rand_like(x)
    if (a > 0.5).any():
        a = a + 1
    torch.manual_seed(7)
    b = torch.rand(3)
    if b.sum() > 1.5:
        b = -b
    return a, b, torch.rand(2)


def draws_on(fn, device: str):
    def on_device(x):
        with torch.device(device):
            return fn(x)

    return on_device


@pytest.mark.parametrize("fn", [draws_between_reads, seeds_between_reads])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_random_draws_and_generator_state_are_eagers_across_reads(fn, device):
    fn = draws_on(fn, device)
    jfn = thunder_rs.jit(fn)
    for seed in (0, 1, 2, 3):
        x = torch.randn(8, device=device)
        torch.manual_seed(seed)
        expected, after = fn(x), torch.rand(4, device=device)
        torch.manual_seed(seed)
        actual = jfn(x)
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(torch.rand(4, device=device), after)  # the generator is where eager leaves it
        if seed == 0:  # the values read while tracing were those of the compiled call: no other variant
            assert thunder_rs.cache_misses(jfn) == 1


def mutates_input_between_reads(x, out):
    out.add_(x)
    if out.sum() > 0:
        out.mul_(2)
    n = int((out > 1).sum())
    out[:n] += 1
    return (out > 0).nonzero()


def test_inputs_written_in_place_between_reads_are_written_once():
    for data in ([1.0, 2.0, -3.0, 0.5], [-1.0, -2.0, 3.0, 0.25]):
        x = torch.tensor(data)
        out, jout = torch.ones(4), torch.ones(4)
        expected = mutates_input_between_reads(x, out)
        actual = thunder_rs.jit(mutates_input_between_reads)(x, jout)
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(jout, out)


def reads_an_input_and_intermediates(x, mask):
    kept = x[mask]  # the input's own values: no call runs before
    if kept.numel() > 2:
        kept = kept * 2
    return kept.sum() + x[x > kept.mean()].sum()


def test_reads_of_inputs_and_of_intermediates_mix():
    jfn = thunder_rs.jit(reads_an_input_and_intermediates)
    for n in (3, 1, 5):
        x, mask = torch.randn(6), torch.arange(6) < n
        torch.testing.assert_close(jfn(x, mask), reads_an_input_and_intermediates(x, mask))


@pytest.mark.slow
def test_mask_rcnn_inference_matches_eager():
    """torchvision's Mask R-CNN reads values at every slice bound, per-class nms and unique: its
    first call ran the ResNet-50 again at each read, and did not end in 150 s (160 px, 2 cores);
    in segments it takes ~8 s."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.detection.maskrcnn_resnet50_fpn(
        weights=None, weights_backbone=None, num_classes=5, min_size=160, max_size=160, box_score_thresh=0.0
    ).eval()
    images = [torch.rand(3, 160, 160)]
    with torch.no_grad():
        expected, actual = model(images), thunder_rs.jit(model)(images)
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)


def test_a_read_of_inputs_without_data_is_refused_naming_it():
    def reads(x):
        return x * 2 if x.sum() > 0 else x

    with pytest.raises(thunder_rs.errors.ThunderRuntimeError, match="on inputs without data"):
        thunder_rs.jit(reads)(torch.ones(3, device="meta"))


class NormThenRoute(torch.nn.Module):
    """Running statistics written in place, a random draw, then reads that route rows."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(4)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

    def forward(self, x):
        h = F.dropout(self.norm(x), 0.2, training=self.training)
        route = h.sum(-1).abs().mul(10).long() % 3
        out = torch.zeros_like(h)
        for i, expert in enumerate(self.experts):
            rows = torch.where(route == i)[0]
            if rows.numel():
                out.index_add_(0, rows, expert(h[rows]))
        return out


def test_module_state_written_in_place_before_reads_is_written_once():
    torch.manual_seed(0)
    model = NormThenRoute()
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    for step in range(4):
        x = torch.randn(12, 4)
        torch.manual_seed(step)
        out = jmodel(x)
        torch.manual_seed(step)
        expected = eager(x)
        torch.testing.assert_close(out, expected)
        out.sum().backward()
        expected.sum().backward()
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
        torch.testing.assert_close(model.norm.running_mean, eager.norm.running_mean)
        torch.testing.assert_close(model.norm.num_batches_tracked, eager.norm.num_batches_tracked)
