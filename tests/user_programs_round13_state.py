"""The programs of ``test_user_programs_round13.py`` reading or changing Python state through the
standard library: ``decimal``'s context, an ``OrderedDict`` used as a least-recently-used cache of
tensors, ``bisect.insort`` into a list, ``heapq.nlargest`` of a ``tolist``, ``itertools.accumulate``
and ``pairwise``, a ``random.Random`` made from a seed inside the call, ``queue.Queue``, a
``StringIO`` written to, ``contextlib.suppress``, a ``threading.Lock``, ``sys.version_info``,
``weakref.WeakValueDictionary``, ``namedtuple._replace``, ``dataclasses.asdict`` and ``fields``.
Each takes how to compile, runs it over several calls with the state changed between them, and
returns what the calls gave and left."""

import bisect
import collections
import contextlib
import dataclasses
import decimal
import heapq
import io
import itertools
import queue
import random
import sys
import threading
import weakref

import torch
from torch import nn

from user_programs_round8 import _backward_steps
from user_programs_round9 import _raised


def _decimal_scaled(x):
    return x * float(decimal.Decimal(1) / decimal.Decimal(3))


def decimal_context_precision(compile_it) -> list:
    """``decimal``'s thread context (its precision) changed between calls."""
    run, seen = compile_it(_decimal_scaled), []
    try:
        for prec in (28, 3, 3, 28, 2):
            decimal.getcontext().prec = prec
            seen.append(run(torch.ones(3, dtype=torch.float64)))
    finally:
        decimal.getcontext().prec = 28
    return seen


class LruFeatures(nn.Module):
    """Features of a few keys kept in an ``OrderedDict``, the oldest evicted."""

    def __init__(self):
        super().__init__()
        self.lin, self.cache = nn.Linear(3, 3), collections.OrderedDict()

    def forward(self, x, key: str):
        if key in self.cache:
            self.cache.move_to_end(key)
            feat = self.cache[key]
        else:
            feat = self.lin(x).detach()
            self.cache[key] = feat
            if len(self.cache) > 2:
                self.cache.popitem(last=False)
        return self.lin(x) + feat


def ordered_dict_lru(compile_it) -> list:
    torch.manual_seed(0)
    model = LruFeatures()
    run, seen = compile_it(model), []
    for key in ("a", "b", "a", "c", "b", "a"):
        seen += _backward_steps(model, run, [(torch.randn(2, 3), key)])
        seen.append(list(model.cache))
    return seen + [dict(model.cache)]


def _insorted(x, seen: list):
    bisect.insort(seen, round(x.sum().item(), 4))
    return x * bisect.bisect_left(seen, 0.0)


def insort_into_a_list(compile_it) -> list:
    """``bisect.insort`` of a tensor's value into an argument list; the position found next."""
    torch.manual_seed(0)
    run, values, seen = compile_it(_insorted), [], []
    for _ in range(4):
        seen.append(run(torch.randn(3), values))
    return seen + [list(values)]


def _top_rows(x):
    rows = heapq.nlargest(2, range(x.shape[0]), key=x.sum(-1).tolist().__getitem__)
    return x[rows] * 2


def heapq_nlargest_of_tolist(compile_it) -> list:
    torch.manual_seed(0)
    run = compile_it(_top_rows)
    return [run(torch.randn(4, 3)) for _ in range(3)]


class AccumulatedDepth(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(3, 3) for _ in range(3))
        self.widths = [1, 2, 0]

    def forward(self, x):
        for (a, b), layer in zip(itertools.pairwise(itertools.accumulate(self.widths, initial=0)), self.layers):
            x = layer(x) * (b - a + 1)
        return x.tanh()


def accumulate_and_pairwise(compile_it) -> list:
    torch.manual_seed(0)
    model = AccumulatedDepth()
    run, seen = compile_it(model), []
    for widths in (None, [0, 0, 3], None, [2, 2, 2]):
        if widths is not None:
            model.widths[:] = widths
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


class SeededPermutation(nn.Module):
    """A ``random.Random`` made inside the call from the module's seed: the same numbers per seed."""

    def __init__(self):
        super().__init__()
        self.lin, self.seed = nn.Linear(4, 4), 0

    def forward(self, x):
        order = random.Random(self.seed).sample(range(4), 4)
        return self.lin(x[:, order])


def random_instance_made_inside(compile_it) -> list:
    torch.manual_seed(0)
    model = SeededPermutation()
    run, seen = compile_it(model), []
    for seed in (0, 1, 1, 7):
        model.seed = seed
        seen += _backward_steps(model, run, [(torch.randn(2, 4),)])
    return seen


class QueuedLosses(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.sink = nn.Linear(3, 3), queue.Queue()

    def forward(self, x):
        y = self.lin(x)
        self.sink.put(y.shape[0])
        return y


def queue_put_inside(compile_it) -> list:
    torch.manual_seed(0)
    model = QueuedLosses()
    run, seen = compile_it(model), []
    for n in (2, 3, 2):
        seen += _backward_steps(model, run, [(torch.randn(n, 3),)])
    return seen + [[model.sink.get_nowait() for _ in range(model.sink.qsize())]]


def _reported(x, out: io.StringIO):
    y = x.relu()
    out.write(f"{tuple(y.shape)} {y.dtype}\n")
    return y


def string_io_written(compile_it) -> list:
    torch.manual_seed(0)
    buffer, run = io.StringIO(), compile_it(_reported)
    seen = [run(torch.randn(n, 2), buffer) for n in (1, 2, 2)]
    return seen + [buffer.getvalue()]


def _suppressed(x, w):
    y = x
    with contextlib.suppress(RuntimeError):
        y = x @ w
    return y * 2


def suppressed_shape_error(compile_it) -> list:
    torch.manual_seed(0)
    run, w = compile_it(_suppressed), torch.randn(3, 3)
    return [run(torch.randn(2, n), w) for n in (3, 4, 3, 4)]


class Locked(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.lock, self.calls = nn.Linear(2, 2), threading.Lock(), 0

    def forward(self, x):
        with self.lock:
            self.calls += 1
        return self.lin(x) * (2.0 if sys.version_info >= (3, 8) else 1.0)


def lock_and_version_info(compile_it) -> list:
    torch.manual_seed(0)
    model = Locked()
    run, seen = compile_it(model), []
    seen += _backward_steps(model, run, [(torch.randn(2, 2),) for _ in range(3)])
    return seen + [model.calls, model.lock.locked()]


class _Table:
    def __init__(self, value: float):
        self.value = value


_TABLES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _weak_valued(x, name: str):
    table = _TABLES.get(name)
    return x * (table.value if table is not None else -1.0)


def weak_value_dictionary(compile_it) -> list:
    """Values of a ``WeakValueDictionary`` that die between calls."""
    run, seen = compile_it(_weak_valued), []
    held = _TABLES["a"] = _Table(2.0)
    seen += [run(torch.ones(2), "a"), run(torch.ones(2), "b")]
    held.value = 3.0
    seen.append(run(torch.ones(2), "a"))
    del held
    seen.append(run(torch.ones(2), "a"))
    return seen


Options = collections.namedtuple("Options", "scale shift")


class NamedOptions(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.options = nn.Linear(2, 2), Options(1.0, 0.0)

    def forward(self, x):
        options = self.options._replace(shift=self.options.shift + 1)
        return self.lin(x) * options.scale + options.shift


def namedtuple_replace(compile_it) -> list:
    torch.manual_seed(0)
    model = NamedOptions()
    run, seen = compile_it(model), []
    for options in (None, Options(2.0, 0.5), None, Options(2.0, 0.5)):
        if options is not None:
            model.options = options
        seen += _backward_steps(model, run, [(torch.randn(2, 2),)])
    return seen


@dataclasses.dataclass
class MixConfig:
    gate: float = 1.0
    bias: float = 0.0
    extra: dict = dataclasses.field(default_factory=dict)


def _mixed(x, config: MixConfig):
    total = sum(v for v in dataclasses.asdict(config).values() if isinstance(v, float))
    names = [f.name for f in dataclasses.fields(config) if f.name in config.extra]
    return x * total + len(names)


def asdict_and_fields(compile_it) -> list:
    config, run, seen = MixConfig(), compile_it(_mixed), []
    for change in (lambda: None, lambda: setattr(config, "bias", 2.0), lambda: config.extra.update(gate=1)):
        change()
        seen.append(run(torch.ones(2), config))
    return seen + [_raised(run, torch.ones(2), dataclasses.replace(config, gate=3.0))]


class Throttled(nn.Module):
    """A ``threading.Semaphore`` acquired by each call (its count is the standard library's
    ``self._value -= 1``), released between calls; an ``Event`` set or cleared by the data."""

    def __init__(self):
        super().__init__()
        self.lin, self.slots, self.positive = nn.Linear(2, 2), threading.Semaphore(3), threading.Event()

    def forward(self, x):
        if not self.slots.acquire(blocking=False):
            return self.lin(x) * 0
        y = self.lin(x)
        if (y > 0).all():
            self.positive.set()
        else:
            self.positive.clear()
        return y


def semaphore_and_event(compile_it) -> list:
    torch.manual_seed(0)
    model = Throttled()
    run, seen = compile_it(model), []
    for release in (False, False, True, False, False, False, True):
        if release:
            model.slots.release()
        seen += _backward_steps(model, run, [(torch.randn(2, 2),)])
        seen += [model.slots._value, model.positive.is_set()]
    return seen
