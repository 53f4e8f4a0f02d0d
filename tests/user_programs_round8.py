"""The programs of ``test_user_programs_round8.py``: each takes how to compile (``thunder_rs.jit``,
``torch.compile(backend="thunder_rs")`` or nothing, for eager), runs it over several calls while the
Python state it reads changes between them, and returns what the calls gave and left behind
(outputs, gradients, the program's own state, the random generators' next numbers)."""

import contextvars
import dataclasses
import enum
import functools
import itertools
import logging
import math
import os
import random
import statistics
import threading
import time
import warnings
import weakref

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def grads(module: nn.Module) -> list:
    return [None if p.grad is None else p.grad.clone() for p in module.parameters()]


def _backward_steps(model: nn.Module, run, batches) -> list:
    """``run`` on each batch, a backward of the sum of its first output, the gradients after."""
    seen = []
    for batch in batches:
        out = run(*batch)
        first = out[0] if isinstance(out, tuple) else out
        first.square().sum().backward()
        seen += [out, grads(model)]
        model.zero_grad()
    return seen


# -- random state ---------------------------------------------------------------------------------


def _seeded_noise(x, seed: int):
    with torch.random.fork_rng():  # the caller's generator left as it was
        torch.manual_seed(seed)
        noise = torch.randn_like(x)
    return x + 0.1 * noise


def fork_rng_noise(compile_it) -> list:
    torch.manual_seed(0)
    run = compile_it(_seeded_noise)
    return [run(torch.ones(3), seed) for seed in (1, 2, 1)] + [torch.rand(2)]


class RecomputableDropout(nn.Module):
    """Keeps the generator's state before its dropout, to draw the same mask again later."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.state = None

    def forward(self, x):
        self.state = torch.get_rng_state()
        return F.dropout(self.lin(x), 0.5, self.training)


def saved_rng_state(compile_it) -> list:
    torch.manual_seed(0)
    model = RecomputableDropout()
    run, seen = compile_it(model), []
    for _ in range(3):
        out = run(torch.randn(2, 4))
        out.sum().backward()
        seen += [out, model.state.clone(), grads(model)]
        model.zero_grad()
    torch.set_rng_state(model.state)  # the last call's mask again
    return [*seen, F.dropout(torch.ones(2, 4), 0.5)]


class TorchDropPath(nn.Module):
    """Stochastic depth decided by ``torch.rand(()).item()``: the draw is torch's, the branch Python's."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            if self.training and torch.rand(()).item() < 0.5:
                continue
            x = x + layer(x)
        return x


def torch_drop_path(compile_it) -> list:
    torch.manual_seed(0)
    model = TorchDropPath()
    batches = [(torch.randn(2, 4, requires_grad=True),) for _ in range(4)]  # (every layer may be skipped)
    return _backward_steps(model, compile_it(model), batches) + [torch.rand(2)]


class SeededLayerDrop(nn.Module):
    """LayerDrop from a ``random.Random`` the forward seeds with the step: the global generator untouched."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(4))

    def forward(self, x, step: int):
        rng = random.Random(step)
        for layer in self.layers:
            if rng.random() < 0.5:
                continue
            x = x + layer(x)
        return x


def own_random_instance(compile_it) -> list:
    torch.manual_seed(0)
    random.seed(5)
    model = SeededLayerDrop()
    run, x = compile_it(model), torch.randn(2, 4)
    return [run(x, step) for step in (0, 1, 2, 0)] + [random.random()]


def _shuffled(x, epoch: int):
    order = np.random.default_rng(epoch).permutation(x.shape[0])
    return x[torch.from_numpy(order)].cumsum(0)


def numpy_generator_per_epoch(compile_it) -> list:
    np.random.seed(3)
    run, x = compile_it(_shuffled), torch.arange(6.0)
    return [run(x, epoch) for epoch in (0, 1, 2, 1)] + [np.random.rand()]


class SeededDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, seed: int):
        torch.manual_seed(seed)
        return F.dropout(self.lin(x), 0.5, self.training)


def manual_seed_in_forward(compile_it) -> list:
    torch.manual_seed(0)
    model = SeededDropout()
    batches = [(torch.ones(2, 4), seed) for seed in (3, 4, 3)]
    return _backward_steps(model, compile_it(model), batches) + [torch.rand(2)]


# -- the standard library's state -----------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def causal_mask(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()


def _masked_attention(q):
    scores = (q @ q.T).masked_fill(~causal_mask(q.shape[0]), float("-inf"))
    return scores.softmax(-1) @ q


def lru_cached_mask(compile_it, cache_state: bool = True) -> list:
    causal_mask.cache_clear()
    torch.manual_seed(0)
    run = compile_it(_masked_attention)
    seen = [run(torch.randn(n, 4)) for n in (3, 5, 3, 5)]
    info = causal_mask.cache_info()
    return seen + ([info.currsize, info.misses] if cache_state else [])


@functools.cache
def _head_shape(dim: int, heads: int) -> tuple:
    return (heads, dim // heads)


class CachedHeadShape(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = 2

    def forward(self, x):
        return x.unflatten(-1, _head_shape(x.shape[-1], self.heads)).softmax(-1).flatten(-2)


def cached_shape(compile_it) -> list:
    torch.manual_seed(0)
    model = CachedHeadShape()
    run, x, seen = compile_it(model), torch.randn(3, 8), []
    for heads in (2, 4, 2):
        model.heads = heads
        seen.append(run(x))
    return seen


ACTIVATION = functools.partial(F.leaky_relu, negative_slope=0.1)


def _activated(x):
    return ACTIVATION(x) * 2


def partial_keywords(compile_it) -> list:
    global ACTIVATION
    ACTIVATION = functools.partial(F.leaky_relu, negative_slope=0.1)
    run, x = compile_it(_activated), torch.linspace(-2, 2, 5)
    seen = [run(x)]
    ACTIVATION = functools.partial(F.leaky_relu, negative_slope=0.3)
    seen.append(run(x))
    ACTIVATION.keywords["negative_slope"] = 0.5  # (a partial's keywords are a dict)
    return [*seen, run(x)]


_FLAGS = threading.local()


def _gelu_by_flag(x):
    return F.gelu(x, approximate="tanh" if getattr(_FLAGS, "fast_gelu", False) else "none")


def thread_local_flag(compile_it) -> list:
    _FLAGS.__dict__.clear()
    run, x, seen = compile_it(_gelu_by_flag), torch.linspace(-2, 2, 5), []
    for fast in (None, True, False):
        if fast is not None:
            _FLAGS.fast_gelu = fast
        seen.append(run(x))
    return seen


class Feature(enum.Flag):
    BIAS = enum.auto()
    NORM = enum.auto()


@dataclasses.dataclass(frozen=True)
class FrozenConfig:
    eps: float = 1e-5
    features: Feature = Feature.BIAS


CONFIG = FrozenConfig()


def _normed(x, b):
    if Feature.NORM in CONFIG.features:
        x = F.layer_norm(x, x.shape[-1:], eps=CONFIG.eps)
    if Feature.BIAS in CONFIG.features:
        x = x + b
    return x


def frozen_config_replaced(compile_it) -> list:
    global CONFIG
    CONFIG = FrozenConfig()
    torch.manual_seed(0)
    run, x, b = compile_it(_normed), torch.randn(2, 4), torch.randn(4)
    seen = [run(x, b)]
    CONFIG = dataclasses.replace(CONFIG, features=Feature.BIAS | Feature.NORM)
    seen.append(run(x, b))
    CONFIG = dataclasses.replace(CONFIG, eps=0.5)
    seen.append(run(x, b))
    object.__setattr__(CONFIG, "features", Feature.NORM)  # (around the frozen dataclass's check)
    return [*seen, run(x, b)]


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list = []

    def emit(self, record):
        self.messages.append(record.getMessage())


LOG = logging.getLogger("thunder_rs.tests.round8")


def _logs_its_norm(x):
    y = x.relu()
    if LOG.isEnabledFor(logging.DEBUG):
        LOG.debug("norm %.4f", y.norm().item())
    return y


def logging_level(compile_it) -> list:
    records, propagate = _Records(), LOG.propagate
    LOG.addHandler(records)
    LOG.propagate, seen = False, []
    try:
        run = compile_it(_logs_its_norm)
        for level, x in ((logging.INFO, [1.0, -2.0]), (logging.DEBUG, [2.0, 1.0]), (logging.DEBUG, [4.0, 3.0])):
            LOG.setLevel(level)
            seen.append(run(torch.tensor(x)))
        LOG.setLevel(logging.WARNING)
        seen.append(run(torch.tensor([5.0, 0.0])))
    finally:
        LOG.removeHandler(records)
        LOG.propagate = propagate
        LOG.setLevel(logging.NOTSET)
    return [*seen, records.messages]


def _warns_if_large(x):
    peak = x.abs().max()
    if peak > 10:
        warnings.warn(f"large activation {peak.item()}")
    return x.clamp(-10, 10)


def warnings_filters(compile_it) -> list:
    run, seen = compile_it(_warns_if_large), []
    for action, scale in (("always", 1.0), ("always", 20.0), ("ignore", 30.0), ("always", 40.0), ("error", 50.0)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter(action)
            try:
                seen.append(run(torch.tensor([1.0, -2.0]) * scale))
            except UserWarning as e:
                seen.append(f"raised {e}")
        seen.append([str(w.message) for w in caught])
    return seen


class WarnsOnce(nn.Module):
    """Warns of NaN inputs once, remembering that it did in an attribute."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.warned = False

    def forward(self, x):
        if not self.warned and torch.isnan(x).any():
            warnings.warn("NaN in the input; replaced by zeros")
            self.warned = True
        return self.lin(torch.nan_to_num(x))


def warns_once(compile_it) -> list:
    torch.manual_seed(0)
    model = WarnsOnce()
    run, seen = compile_it(model), []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for bad in (False, True, True, False):
            x = torch.randn(2, 3)
            if bad:
                x[0, 1] = float("nan")
            seen += [run(x), model.warned]
    return [*seen, [str(w.message) for w in caught if "NaN" in str(w.message)]]


_TEMPERATURE = "THUNDER_RS_ROUND8_TEMPERATURE"


def _tempered(x):
    return (x / float(os.environ.get(_TEMPERATURE, "1"))).softmax(-1)


def environment_knob(compile_it) -> list:
    os.environ.pop(_TEMPERATURE, None)
    torch.manual_seed(0)
    run, x, seen = compile_it(_tempered), torch.randn(4), []
    try:
        for value in (None, "2", "0.5"):
            if value is not None:
                os.environ[_TEMPERATURE] = value
            seen.append(run(x))
    finally:
        os.environ.pop(_TEMPERATURE, None)
    return [*seen, run(x)]


def _standardized(x):
    means = [v.item() for v in x.mean(1).unbind()]
    mu, spread = statistics.fmean(means), statistics.pstdev(means)
    return (x - mu) / math.sqrt(max(spread, 1e-3)), mu


def python_statistics_of_items(compile_it) -> list:
    torch.manual_seed(0)
    run = compile_it(_standardized)
    return [run(torch.randn(3, 4) * k) for k in (1.0, 2.0, 0.5)]


def _padded_windows(x, window: int):
    pad = math.ceil(x.shape[0] / window) * window - x.shape[0]
    x = F.pad(x, (0, 0, 0, pad))
    return x.view(-1, window, x.shape[-1]).mean(1), pad


def math_on_sizes(compile_it) -> list:
    torch.manual_seed(0)
    run = compile_it(_padded_windows)
    return [run(torch.randn(n, 3), 4) for n in (5, 8, 11, 13, 3)]


MODE: contextvars.ContextVar = contextvars.ContextVar("MODE", default="train")


def _by_mode(x):
    return x * 0.5 if MODE.get() == "eval" else x + 1


def copied_context(compile_it) -> list:
    run, x = compile_it(_by_mode), torch.ones(2)
    context = contextvars.copy_context()
    context.run(MODE.set, "eval")  # set in the copy alone
    return [run(x), context.run(run, x), run(x), context.run(run, x)]


class Parent:
    temperature = 1.0


class Child(nn.Module):
    """A child holding its parent through a ``weakref.ref`` (no cycle), reading its temperature."""

    def __init__(self, parent):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self._parent = weakref.ref(parent)

    def forward(self, x):
        return self.lin(x) / self._parent().temperature


def weakref_to_a_parent(compile_it) -> list:
    torch.manual_seed(0)
    parent, other = Parent(), Parent()
    model = Child(parent)
    run, x = compile_it(model), torch.randn(2, 4)
    seen = [run(x)]
    parent.temperature = 2.0
    seen.append(run(x))
    other.temperature = 4.0
    model._parent = weakref.ref(other)
    return [*seen, run(x)]


class ClassTempered(nn.Module):
    """Settings kept as class attributes, read through ``type(self)`` and ``self.__class__``."""

    temperature = 1.0
    centered = False

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x) / type(self).temperature
        if self.__class__.centered:
            y = y - y.mean(-1, keepdim=True)
        return y.softmax(-1)


def class_attributes_through_the_type(compile_it) -> list:
    torch.manual_seed(0)
    ClassTempered.temperature, ClassTempered.centered = 1.0, False
    model = ClassTempered()
    run, x, seen = compile_it(model), torch.randn(2, 4), []
    for temperature, centered in ((1.0, False), (2.0, False), (2.0, True), (1.0, False)):
        ClassTempered.temperature, ClassTempered.centered = temperature, centered
        seen.append(run(x))
    return seen


# -- data-dependent branches and Python loops over data -------------------------------------------


def _checked(x):
    assert torch.isfinite(x).all(), "non-finite input"
    return x * 2


def assert_finite(compile_it) -> list:
    """(Under ``torch.compile`` Dynamo makes the ``assert`` a ``torch._assert``: a ``RuntimeError``.)"""
    run, seen = compile_it(_checked), []
    for x in (torch.ones(2), torch.tensor([1.0, float("nan")]), torch.ones(2) * 3):
        try:
            seen.append(run(x))
        except (AssertionError, RuntimeError) as e:
            seen.append("non-finite input" in str(e))
    return seen


class SkipsNonFinite(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 1)
        self.skipped = 0

    def forward(self, x, y):
        loss = F.mse_loss(self.lin(x).squeeze(-1), y)
        if torch.isnan(loss):
            self.skipped += 1
            return None
        return loss


def skips_a_nan_loss(compile_it) -> list:
    torch.manual_seed(0)
    model = SkipsNonFinite()
    run, seen = compile_it(model), []
    for bad in (False, True, False, True):
        y = torch.randn(4)
        if bad:
            y[1] = float("nan")
        loss = run(torch.randn(4, 3), y)
        if loss is not None:
            loss.backward()
        seen += [loss, grads(model)]
    return [*seen, model.skipped]


def _sinkhorn(cost, tol: float):
    p, iters, err = (-cost).exp(), 0, float("inf")
    while err > tol:
        p = p / p.sum(1, keepdim=True)
        p = p / p.sum(0, keepdim=True)
        err = (p.sum(1) - 1).abs().max()
        iters += 1
    return p, iters


def sinkhorn_until_converged(compile_it) -> list:
    torch.manual_seed(0)
    run, seen = compile_it(_sinkhorn), []
    for tol in (1e-2, 1e-5, 1e-2):
        cost = torch.rand(4, 4, requires_grad=True)
        p, iters = run(cost, tol)
        (p * torch.arange(16.0).view(4, 4)).sum().backward()
        seen += [p, iters, cost.grad]
    return seen


def _newton_sqrt(a, tol: float):
    x, steps = a.clone(), 0
    while True:
        after = 0.5 * (x + a / x)
        delta = (after - x).abs().max().item()
        x, steps = after, steps + 1
        if delta < tol or steps >= 50:
            return x, steps


def newton_on_items(compile_it) -> list:
    run, seen = compile_it(_newton_sqrt), []
    for scale, tol in ((2.0, 1e-3), (100.0, 1e-6), (2.0, 1e-3)):
        a = (torch.arange(1.0, 5.0) * scale).requires_grad_()
        x, steps = run(a, tol)
        x.sum().backward()
        seen += [x, steps, a.grad]
    return seen


class MaskedLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 3)

    def forward(self, x, target, mask):
        logits = self.head(x)
        loss = logits.square().mean() * 0.01
        if mask.any():
            loss = loss + F.cross_entropy(logits[mask], target[mask])
        return loss


def loss_if_any_masked(compile_it) -> list:
    torch.manual_seed(0)
    model, target = MaskedLoss(), torch.tensor([0, 1, 2, 1])
    keeps = ([1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 0])
    batches = [(torch.randn(4, 4), target, torch.tensor(k, dtype=torch.bool)) for k in keeps]
    return _backward_steps(model, compile_it(model), batches)


class SegmentPool(nn.Module):
    """Mean-pools packed sequences split at their lengths (``lengths.tolist()``)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, packed, lengths):
        return torch.stack([seg.mean(0) for seg in torch.split(self.proj(packed), lengths.tolist())])


def split_by_tolist(compile_it) -> list:
    torch.manual_seed(0)
    model = SegmentPool()
    batches = [(torch.randn(sum(n), 4), torch.tensor(n)) for n in ([2, 3], [1, 1, 3], [4, 1])]
    return _backward_steps(model, compile_it(model), batches)


class SortedMoE(nn.Module):
    """Tokens sorted by expert and split by their counts (``bincount(...).tolist()``, returned too),
    an expert given none skipped."""

    def __init__(self, experts=3, dim=4):
        super().__init__()
        self.gate = nn.Linear(dim, experts)
        self.experts = nn.ModuleList(nn.Linear(dim, dim) for _ in range(experts))

    def forward(self, x):
        weight, chosen = self.gate(x).softmax(-1).max(-1)
        order = chosen.argsort(stable=True)
        counts = torch.bincount(chosen, minlength=len(self.experts)).tolist()
        outs = [expert(rows) for expert, rows in zip(self.experts, x[order].split(counts)) if rows.shape[0]]
        out = torch.empty_like(x).index_copy(0, order, torch.cat(outs))
        return out * weight[:, None], counts


def sorted_mixture_of_experts(compile_it) -> list:
    torch.manual_seed(0)
    model = SortedMoE()
    return _backward_steps(model, compile_it(model), [(torch.randn(5, 4),) for _ in range(4)])


class Skippable(nn.Module):
    """Its forward walks a generator of the blocks not in ``skip``."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(4))
        self.skip: set = set()

    def active(self):
        for i, block in enumerate(self.blocks):
            if i not in self.skip:
                yield block

    def forward(self, x):
        for block in self.active():
            x = torch.tanh(block(x))
        return x


def generator_of_blocks(compile_it) -> list:
    torch.manual_seed(0)
    model = Skippable()
    run, x, seen = compile_it(model), torch.randn(2, 4), []
    for skip in (set(), {1}, {0, 1, 3}, set()):
        model.skip.clear()
        model.skip.update(skip)
        seen.append(run(x))
    return seen


class Truncated(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(4))
        self.depth = 4

    def forward(self, x):
        for block in itertools.islice(self.blocks, self.depth):
            x = x + block(x)
        return x


def islice_to_a_depth(compile_it) -> list:
    torch.manual_seed(0)
    model = Truncated()
    run, x, seen = compile_it(model), torch.randn(2, 4), []
    for depth in (4, 2, 0, 3):
        model.depth = depth
        seen.append(run(x))
    return seen


# -- refused by thunder_rs.jit: what a compiled call cannot read again ----------------------------


def _random_flip(x):
    if np.random.rand() < 0.5:  # flips
        x = x.flip(-1)
    return x * 2


def numpy_random_flip(compile_it) -> list:
    np.random.seed(0)
    run, x = compile_it(_random_flip), torch.arange(4.0)
    return [run(x) for _ in range(5)] + [np.random.rand()]


class Timed(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.timings: list = []

    def forward(self, x):
        start = time.perf_counter()  # times
        y = self.lin(x)
        self.timings.append(time.perf_counter() - start)
        return y


def perf_counter_timings(compile_it) -> list:
    torch.manual_seed(0)
    model = Timed()
    run = compile_it(model)
    seen = [run(torch.randn(2, 4)) for _ in range(3)]
    return [*seen, len(model.timings), all(t >= 0 for t in model.timings)]


SCHEDULE = iter(())


def _scheduled(x):
    return x * next(SCHEDULE, 1.0)  # takes the next scale


def global_iterator(compile_it) -> list:
    global SCHEDULE
    SCHEDULE = iter([0.5, 2.0, 3.0])
    run = compile_it(_scheduled)
    return [run(torch.ones(2)) for _ in range(4)]


class Counted(nn.Module):
    calls = 0

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        type(self).calls += 1  # counts
        return self.lin(x)


def class_attribute_counter(compile_it) -> list:
    torch.manual_seed(0)
    Counted.calls = 0
    run = compile_it(Counted())
    return [run(torch.ones(2)) for _ in range(3)] + [Counted.calls]


def _scaled_by(x, scales):
    for s in scales:  # walks the generator
        x = x * s
    return x


def generator_argument(compile_it) -> list:
    run = compile_it(_scaled_by)
    return [run(torch.ones(2), (s for s in scales)) for scales in ([2.0], [2.0, 3.0], [0.5, 0.5, 4.0])]
