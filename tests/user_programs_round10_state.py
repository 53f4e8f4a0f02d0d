"""The programs of ``test_user_programs_round10.py`` reading Python state through the standard
library: each takes how to compile (``thunder_rs.jit``, ``torch.compile(backend="thunder_rs")`` or
nothing, for eager) and returns what its calls gave and left behind."""

import collections
import contextvars
import copy
import dataclasses
import enum
import functools
import inspect
import itertools
import logging
import operator
import random
import warnings
import weakref

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from user_programs_round10 import _backward_steps, _raised, grads


# -- generators of random numbers the program holds -----------------------------------------------


class HeldRandomFlip(nn.Module):
    """An augmentation decided by a ``random.Random`` the module holds, advanced by every call."""

    def __init__(self):
        super().__init__()
        self.rng = random.Random(3)

    def forward(self, x):
        if self.rng.random() < 0.5:  # draws from the held generator
            x = x.flip(-1)
        return x * 2


def held_random_instance(compile_it) -> list:
    model = HeldRandomFlip()
    run, x = compile_it(model), torch.arange(4.0)
    return [run(x) for _ in range(6)] + [model.rng.random()]


def _global_random_jitter(x):
    if random.random() < 0.5:  # draws from random's global generator
        x = x + 1
    return x * 2


def global_random_decision(compile_it) -> list:
    random.seed(1)
    run, x = compile_it(_global_random_jitter), torch.zeros(3)
    return [run(x) for _ in range(6)] + [random.random()]


class HeldNumpyGenerator(nn.Module):
    """Noise scales drawn from a ``numpy.random.Generator`` the module holds."""

    def __init__(self):
        super().__init__()
        self.rng = np.random.default_rng(0)

    def forward(self, x):
        scale = float(self.rng.uniform(0.5, 1.5))  # draws from the held generator
        return x * scale


def held_numpy_generator(compile_it) -> list:
    model = HeldNumpyGenerator()
    run, x = compile_it(model), torch.ones(2)
    return [run(x) for _ in range(4)] + [float(model.rng.random())]


# -- iterators and caches the program holds -------------------------------------------------------


class StepCounted(nn.Module):
    """``next(self.steps)`` of an ``itertools.count()``: a warmup scale by the step."""

    def __init__(self):
        super().__init__()
        self.steps = itertools.count()

    def forward(self, x):
        step = next(self.steps)  # advances the counter
        return x * min(1.0, (step + 1) / 3)


def held_itertools_count(compile_it) -> list:
    model = StepCounted()
    run, x = compile_it(model), torch.ones(2)
    return [run(x) for _ in range(5)] + [next(model.steps)]


class CycledScales(nn.Module):
    def __init__(self):
        super().__init__()
        self.scales = itertools.cycle([1.0, 2.0, 3.0])

    def forward(self, x):
        return x * next(self.scales)  # advances the cycle


def held_itertools_cycle(compile_it) -> list:
    model = CycledScales()
    run, x = compile_it(model), torch.ones(2)
    return [run(x) for _ in range(5)] + [next(model.scales)]


@functools.cache
def _positions(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) / n


def _with_positions(x):
    return x + _positions(x.shape[-1])


def functools_cache_of_a_tensor(compile_it) -> list:
    _positions.cache_clear()
    run, seen = compile_it(_with_positions), []
    for n in (3, 4, 3, 5):
        x = torch.ones(2, n, requires_grad=True)
        out = run(x)
        out.sum().backward()
        seen += [out, x.grad]
    return [*seen, _positions.cache_info().currsize]


class RingBuffer(nn.Module):
    """A ``deque(maxlen=3)`` of the last batch means, the output normalized by their average."""

    def __init__(self):
        super().__init__()
        self.history: collections.deque = collections.deque(maxlen=3)

    def forward(self, x):
        self.history.append(x.detach().mean())
        return x / torch.stack(list(self.history)).mean()


def deque_ring_buffer(compile_it) -> list:
    model = RingBuffer()
    run, seen = compile_it(model), []
    for v in (1.0, 2.0, 3.0, 4.0, 5.0):
        x = torch.full((2,), v, requires_grad=True)
        out = run(x)
        out.sum().backward()
        seen += [out, x.grad, len(model.history)]
    return [*seen, [t.clone() for t in model.history]]


class PredictionCounter(nn.Module):
    """Counts predicted classes in a ``Counter`` keyed by ``int(argmax)``."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.counts: collections.Counter = collections.Counter()

    def forward(self, x):
        logits = self.lin(x)
        self.counts[int(logits.argmax())] += 1
        return logits


def counter_of_predictions(compile_it) -> list:
    torch.manual_seed(0)
    model = PredictionCounter()
    with torch.no_grad():
        model.lin.weight.copy_(torch.eye(3))
        model.lin.bias.zero_()
    run = compile_it(model)
    seen = [run(torch.eye(3)[i % 3]) for i in (0, 1, 0, 2)]
    return [*seen, dict(model.counts)]


class ShapeLog(nn.Module):
    """A ``defaultdict(list)`` of the batch sizes seen, keyed by the sequence length."""

    def __init__(self):
        super().__init__()
        self.seen: collections.defaultdict = collections.defaultdict(list)

    def forward(self, x):
        self.seen[x.shape[1]].append(x.shape[0])
        return x.sum(1)


def defaultdict_of_shapes(compile_it) -> list:
    model = ShapeLog()
    run = compile_it(model)
    seen = [run(torch.ones(b, n)) for b, n in ((2, 3), (4, 3), (2, 5), (3, 3))]
    return [*seen, dict(model.seen)]


# -- configs --------------------------------------------------------------------------------------

_SCALE: contextvars.ContextVar = contextvars.ContextVar("scale", default=1.0)


def _inner_scaled(x):
    return x * _SCALE.get()


def _scoped_context_var(x, scale: float):
    token = _SCALE.set(scale)
    try:
        return _inner_scaled(x) + 1
    finally:
        _SCALE.reset(token)


def context_var_set_inside(compile_it) -> list:
    run, x = compile_it(_scoped_context_var), torch.ones(2)
    return [[run(x, s), _SCALE.get()] for s in (2.0, 3.0, 2.0)]


class Mode(enum.Enum):
    TRAIN = "train"
    EVAL = "eval"
    CALIBRATE = "calibrate"


class ModeSwitched(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.mode = Mode.TRAIN

    def forward(self, x, mode: str):
        self.mode = Mode(mode)
        y = self.lin(x)
        if self.mode is Mode.TRAIN:
            return F.dropout(y, 0.0, True) * 2
        if self.mode == Mode.CALIBRATE:
            return y.detach()
        return y


def enum_mode_switch(compile_it) -> list:
    torch.manual_seed(0)
    model = ModeSwitched()
    x = torch.randn(2, 3)
    batches = [(x, m) for m in ("train", "eval", "train", "eval")]
    seen = _backward_steps(model, compile_it(model), batches)
    return [*seen, model.mode]


@dataclasses.dataclass(frozen=True)
class NormConfig:
    eps: float = 1e-5
    affine: bool = True


class ReplacedConfig(nn.Module):
    def __init__(self):
        super().__init__()
        self.config = NormConfig()
        self.weight = nn.Parameter(torch.ones(3))

    def forward(self, x):
        y = F.layer_norm(x, (3,), eps=self.config.eps)
        return y * self.weight if self.config.affine else y


def dataclass_replaced_between_calls(compile_it) -> list:
    model = ReplacedConfig()
    run, x, seen = compile_it(model), torch.tensor([[1.0, 2.0, 4.0]], requires_grad=True), []
    for change in ({}, {"eps": 1.0}, {"affine": False}, {"eps": 1e-5, "affine": True}):
        model.config = dataclasses.replace(model.config, **change)
        out = run(x)
        out.sum().backward()
        seen += [out, grads(model), x.grad]
        model.zero_grad()
        x.grad = None
    return seen


_MODULE_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class WeakCached(nn.Module):
    """A projection cached per module in a module-level ``WeakKeyDictionary``."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.eye(3))

    def forward(self, x):
        if self not in _MODULE_CACHE:  # keyed by the module
            _MODULE_CACHE[self] = 2.0
        return x @ self.w * _MODULE_CACHE[self]


def weak_key_dictionary_cache(compile_it) -> list:
    model = WeakCached()
    run, seen = compile_it(model), []
    for v in (1.0, 2.0):
        seen.append(run(torch.full((1, 3), v)))
    _MODULE_CACHE[model] = 5.0
    return [*seen, run(torch.ones(1, 3))]


class Getters(nn.Module):
    """``operator.attrgetter`` on a dotted name and ``itemgetter`` on a dict, both by attributes."""

    def __init__(self):
        super().__init__()
        self.block = nn.Linear(2, 2)
        self.block.gain = 2.0
        self.path = "block.gain"
        self.keys = ("a",)

    def forward(self, inputs: dict):
        gain = operator.attrgetter(self.path)(self)
        picked = operator.itemgetter(*self.keys)(inputs)
        picked = picked if isinstance(picked, tuple) else (picked,)
        return sum(self.block(t) * gain for t in picked)


def attrgetter_itemgetter(compile_it) -> list:
    torch.manual_seed(0)
    model = Getters()
    run, inputs, seen = compile_it(model), {"a": torch.ones(1, 2), "b": torch.full((1, 2), 3.0)}, []
    for change in (None, ("keys", ("a", "b")), ("gain", 5.0), ("keys", ("b",))):
        if change:
            setattr(model.block if change[0] == "gain" else model, *change)
        seen.append(run(inputs))
    return seen


class DeepCopiedTeacher(nn.Module):
    """Deep-copies a submodule inside its forward (a detached teacher for the batch)."""

    def __init__(self):
        super().__init__()
        self.student = nn.Linear(3, 3)

    def forward(self, x):
        teacher = copy.deepcopy(self.student)  # copies the parameters
        with torch.no_grad():
            target = teacher(x)
        return F.mse_loss(self.student(x * 0.5), target)


def deepcopy_inside(compile_it) -> list:
    torch.manual_seed(0)
    model = DeepCopiedTeacher()
    run, seen = compile_it(model), []
    for v in (1.0, 2.0):
        loss = run(torch.full((2, 3), v))
        loss.backward()
        seen += [loss, grads(model)]
        with torch.no_grad():
            model.student.weight.add_(0.1)
        model.zero_grad()
    return seen


def _plain(x):
    return x.relu()


def _masked(x, mask=None):
    return x.relu() if mask is None else x.relu() * mask


class SignatureDispatch(nn.Module):
    """Passes a mask only to an activation whose signature takes one (``inspect.signature``)."""

    def __init__(self):
        super().__init__()
        self.act = _plain

    def forward(self, x, mask):
        if "mask" in inspect.signature(self.act).parameters:
            return self.act(x, mask=mask)
        return self.act(x)


def inspect_signature_dispatch(compile_it) -> list:
    model = SignatureDispatch()
    run, x, mask = compile_it(model), torch.tensor([1.0, -1.0, 2.0]), torch.tensor([1.0, 0.0, 0.5])
    seen = [run(x, mask)]
    model.act = _masked
    seen.append(run(x, mask))
    model.act = _plain
    return [*seen, run(x, mask)]


_LOG = logging.getLogger("thunder_rs.tests.round10")


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _logs_when_clipped(x, limit: float):
    peak = x.abs().max().item()
    if peak > limit:
        _LOG.warning("clipped a peak of %.2f to %.2f", peak, limit)
    return x.clamp(-limit, limit)


def logging_a_data_dependent_value(compile_it) -> list:
    records, propagate = _Records(), _LOG.propagate
    _LOG.addHandler(records)
    _LOG.propagate, seen = False, []
    try:
        run = compile_it(_logs_when_clipped)
        for scale in (1.0, 5.0, 7.0, 0.5):
            seen.append(run(torch.tensor([1.0, -2.0]) * scale, 4.0))
    finally:
        _LOG.removeHandler(records)
        _LOG.propagate = propagate
    return [*seen, records.messages]


def _warns_on_nan(x):
    if torch.isnan(x).any():
        warnings.warn("NaN in the batch, zeroed")  # warns once per location under "default"
        x = torch.nan_to_num(x)
    return x * 2


def warn_once_per_location(compile_it) -> list:
    run, seen = compile_it(_warns_on_nan), []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for bad in (False, True, True, False, True):
            x = torch.ones(2)
            if bad:
                x[0] = float("nan")
            seen.append(run(x))
    return [*seen, [str(w.message) for w in caught if "NaN" in str(w.message)]]


def _errors_on_bad_mode(x, mode: str):
    return x * {"double": 2, "half": 0.5}[Mode(mode).value if mode in ("train", "eval") else mode]


def raised_errors(compile_it) -> list:
    run, x = compile_it(_errors_on_bad_mode), torch.ones(2)
    return [_raised(run, x, m) for m in ("double", "bogus", "half", "train")]
