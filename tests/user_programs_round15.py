"""The programs of ``test_user_programs_round15.py`` that read Python state through the standard
library, changed between calls: an ``lru_cache`` answering a stale value until ``cache_clear``, a
``cache`` of tensors built on first use, a ``cached_property`` deleted to be recomputed, nested
``functools.partial``s, ``itertools.groupby`` and ``islice`` over lists the model holds, a
``deque`` rotated, ``Counter.most_common``, an ``OrderedDict`` popped from the front, a ``ChainMap``
whose first map is changed, ``dataclasses.replace`` and ``fields`` of a frozen config, an
``enum.Flag`` of options, a ``ContextVar`` set in a copied context, a ``threading.local`` read from
another thread, ``operator.attrgetter``/``itemgetter`` paths, ``bisect`` over a milestone list,
``heapq`` of priorities, ``statistics.fmean`` of a history, ``os.environ`` membership,
``weakref.WeakKeyDictionary`` of scales, ``copy.copy`` of a submodule, ``sys.flags`` and
``warnings`` filters. Each takes how to compile, runs it over several calls with the state changed
between them, and returns what the calls gave and left."""

import bisect
import collections
import contextvars
import copy
import dataclasses
import enum
import functools
import heapq
import itertools
import math
import operator
import os
import statistics
import sys
import threading
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from user_programs_round8 import _backward_steps

# -- functools ------------------------------------------------------------------------------------

_BASE = {"scale": 2.0}


@functools.lru_cache(maxsize=8)
def _cached_scale(n: int) -> float:
    return _BASE["scale"] / n


def _scaled_by_cache(x):
    return x * _cached_scale(x.shape[-1])


def lru_cache_stale_until_cleared(compile_it) -> list:
    """The cache answers the old value after ``_BASE`` changed, as eager's does, until cleared."""
    _cached_scale.cache_clear()
    run, seen = compile_it(_scaled_by_cache), []
    try:
        for step in range(5):
            if step == 1:
                _BASE["scale"] = 3.0  # (the cache still answers 2.0 / n)
            if step == 3:
                _cached_scale.cache_clear()  # (now 3.0 / n)
            seen.append(run(torch.ones(2, 4)))
    finally:
        _BASE["scale"] = 2.0
        _cached_scale.cache_clear()
    return seen


_SCALE_BY_KIND = {"a": 1.0, "b": 0.5}


@functools.cache
def _kind_scale(kind: str) -> float:
    return _SCALE_BY_KIND[kind]


class CachedKinds(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.kind = nn.Linear(4, 4), "a"

    def forward(self, x):
        return self.lin(x) * _kind_scale(self.kind)


def functools_cache_keyed_by_an_attribute(compile_it) -> list:
    """``functools.cache`` keyed by a module attribute that changes between calls."""
    _kind_scale.cache_clear()
    torch.manual_seed(0)
    model = CachedKinds()
    run, seen = compile_it(model), []
    for kind in ("a", "b", "a", "b"):
        model.kind = kind
        seen += _backward_steps(model, run, [(torch.randn(2, 4),)])
    _kind_scale.cache_clear()
    return seen


class TemperedHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.temperature = nn.Linear(4, 3), 2.0

    @functools.cached_property
    def inv_temperature(self) -> float:
        return 1.0 / self.temperature

    def forward(self, x):
        return (self.lin(x) * self.inv_temperature).softmax(-1)


def cached_property_deleted_to_recompute(compile_it) -> list:
    """Eager keeps the cached value after ``temperature`` changed, until ``del`` recomputes it."""
    torch.manual_seed(0)
    model = TemperedHead()
    run, seen = compile_it(model), []
    for step in range(5):
        if step == 1:
            model.temperature = 4.0  # (still 1 / 2 cached)
        if step == 3:
            del model.inv_temperature  # (1 / 4 on the next read)
        seen += _backward_steps(model, run, [(torch.randn(2, 4),)])
    return seen


ACTIVATION = functools.partial(functools.partial(F.leaky_relu, negative_slope=0.1), inplace=False)


def _nested_partial(x):
    return ACTIVATION(x) + 1


def nested_partials_replaced(compile_it) -> list:
    global ACTIVATION
    run, seen = compile_it(_nested_partial), []
    try:
        for step in range(4):
            if step == 2:
                ACTIVATION = functools.partial(ACTIVATION, negative_slope=0.3)
            seen.append(run(torch.linspace(-2, 2, 5)))
    finally:
        ACTIVATION = functools.partial(functools.partial(F.leaky_relu, negative_slope=0.1), inplace=False)
    return seen


# -- itertools and collections --------------------------------------------------------------------


class GroupedLayers(nn.Module):
    """Consecutive layers of one kind share a residual: ``itertools.groupby`` over ``kinds``."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(3, 3) for _ in range(4))
        self.kinds = ["mlp", "mlp", "norm", "mlp"]

    def forward(self, x):
        layers = iter(self.layers)
        for kind, group in itertools.groupby(self.kinds):
            h = x
            for _ in group:
                h = next(layers)(h)
                h = torch.tanh(h) if kind == "mlp" else F.normalize(h, dim=-1)
            x = x + h
        return x


def groupby_over_a_kinds_list(compile_it) -> list:
    torch.manual_seed(0)
    model = GroupedLayers()
    run, seen = compile_it(model), []
    for kinds in (["mlp", "mlp", "norm", "mlp"], ["mlp", "norm", "norm", "mlp"], ["norm"] * 4):
        model.kinds[:] = kinds  # (the same list, changed in place)
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


class SlicedStages(nn.Module):
    def __init__(self):
        super().__init__()
        self.stages = nn.ModuleList(nn.Linear(3, 3) for _ in range(4))
        self.depth = 2

    def forward(self, x):
        for stage in itertools.islice(self.stages, self.depth):
            x = F.gelu(stage(x))
        return x


def islice_to_a_depth(compile_it) -> list:
    torch.manual_seed(0)
    model = SlicedStages()
    run, seen = compile_it(model), []
    for depth in (2, 4, 1, 2):
        model.depth = depth
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


class RotatedScales(nn.Module):
    def __init__(self):
        super().__init__()
        self.scales = collections.deque([1.0, 0.5, 0.25], maxlen=3)

    def forward(self, x):
        return x * self.scales[0] + x.flip(-1) * self.scales[-1]


def deque_rotated_between_calls(compile_it) -> list:
    """A ``deque``'s first and last items, rotated and appended to (past ``maxlen``) between calls."""
    model = RotatedScales()
    run, seen = compile_it(model), []
    for step in range(5):
        if step in (1, 2):
            model.scales.rotate(1)
        if step == 3:
            model.scales.append(4.0)  # (drops the first)
        seen.append(run(torch.arange(3.0)))
    return seen + [list(model.scales)]


_VOTES: collections.Counter = collections.Counter({"relu": 2, "tanh": 1})


def _voted(x):
    name, _ = _VOTES.most_common(1)[0]
    return getattr(torch, name)(x)


def counter_most_common(compile_it) -> list:
    run, seen = compile_it(_voted), []
    try:
        for step in range(4):
            if step == 1:
                _VOTES.update(["tanh", "tanh"])  # (tanh leads)
            if step == 3:
                _VOTES["relu"] += 5
            seen.append(run(torch.linspace(-2, 2, 5)))
    finally:
        _VOTES.clear()
        _VOTES.update({"relu": 2, "tanh": 1})
    return seen


class AdapterQueue(nn.Module):
    """Adapters applied in an ``OrderedDict``'s order; the oldest popped between calls."""

    def __init__(self):
        super().__init__()
        self.bank = nn.ModuleDict({k: nn.Linear(3, 3) for k in "abcd"})
        self.active = collections.OrderedDict((k, 1.0) for k in "abc")

    def forward(self, x):
        for name, weight in self.active.items():
            x = x + weight * self.bank[name](x)
        return x


def ordered_dict_popped_from_the_front(compile_it) -> list:
    torch.manual_seed(0)
    model = AdapterQueue()
    run, seen = compile_it(model), []
    for step in range(4):
        if step == 1:
            model.active.popitem(last=False)
            model.active["d"] = 0.5
        if step == 3:
            model.active["b"] = 2.0
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


_DEFAULTS = {"scale": 1.0, "shift": 0.0}
_SETTINGS = collections.ChainMap({}, _DEFAULTS)


def _chained(x):
    return x * _SETTINGS["scale"] + _SETTINGS["shift"]


def chain_map_first_map_changed(compile_it) -> list:
    run, seen = compile_it(_chained), []
    try:
        for step in range(5):
            if step == 1:
                _SETTINGS.maps[0]["scale"] = 3.0
            if step == 2:
                _SETTINGS.maps[0] = {"shift": 1.0}  # (a new first map: the default scale again)
            if step == 4:
                _DEFAULTS["scale"] = 0.5
            seen.append(run(torch.ones(3)))
    finally:
        _SETTINGS.maps[0] = {}
        _DEFAULTS.update(scale=1.0, shift=0.0)
    return seen


# -- dataclasses and enums ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Mix:
    residual: float = 1.0
    branch: float = 0.5
    name: str = "mix"


class FieldMixer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.cfg = nn.Linear(3, 3), Mix()

    def forward(self, x):
        weights = [getattr(self.cfg, f.name) for f in dataclasses.fields(self.cfg) if f.type is float]
        return weights[0] * x + weights[1] * self.lin(x)


def frozen_config_replaced(compile_it) -> list:
    torch.manual_seed(0)
    model = FieldMixer()
    run, seen = compile_it(model), []
    for change in ({}, {"branch": 2.0}, {"residual": 0.0}, {"name": "other"}):
        model.cfg = dataclasses.replace(model.cfg, **change)
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


class Opt(enum.Flag):
    NONE = 0
    NORM = enum.auto()
    CLAMP = enum.auto()
    SCALE = enum.auto()


class FlaggedBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.opts = nn.Linear(3, 3), Opt.NORM

    def forward(self, x):
        h = self.lin(x)
        if Opt.NORM in self.opts:
            h = F.layer_norm(h, (3,))
        if Opt.CLAMP in self.opts:
            h = h.clamp(-0.5, 0.5)
        if self.opts & Opt.SCALE:
            h = h * 2
        return h


def enum_flags_combined(compile_it) -> list:
    torch.manual_seed(0)
    model = FlaggedBlock()
    run, seen = compile_it(model), []
    for opts in (Opt.NORM, Opt.NORM | Opt.CLAMP, Opt.SCALE, Opt.NONE, Opt.NORM | Opt.CLAMP):
        model.opts = opts
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


# -- contextvars, threads -------------------------------------------------------------------------

_GAIN: contextvars.ContextVar = contextvars.ContextVar("round15_gain", default=1.0)


def _gained(x):
    return x * _GAIN.get()


def contextvar_in_copied_contexts(compile_it) -> list:
    """Calls made inside ``Context.run`` of contexts where the variable is set otherwise."""
    run, seen = compile_it(_gained), []
    for gain in (None, 2.0, None, 3.0):
        ctx = contextvars.copy_context()
        if gain is not None:
            ctx.run(_GAIN.set, gain)
        seen.append(ctx.run(run, torch.ones(2)))
    return seen + [_GAIN.get()]


_LOCAL = threading.local()


def _by_thread(x):
    return x * getattr(_LOCAL, "scale", 1.0)


def thread_local_read_from_other_threads(compile_it) -> list:
    """The same compiled function called on the main thread, where ``scale`` is set, and on
    worker threads, where it is not (or set otherwise)."""
    run, seen = compile_it(_by_thread), []
    _LOCAL.scale = 2.0
    try:

        def work(scale):
            if scale is not None:
                _LOCAL.scale = scale
            seen.append(run(torch.ones(2)))

        for scale in ("main", None, 5.0, "main"):
            if scale == "main":
                seen.append(run(torch.ones(2)))
            else:
                worker = threading.Thread(target=work, args=(scale,))
                worker.start()
                worker.join()
    finally:
        del _LOCAL.scale
    return seen


# -- operator, bisect, heapq, statistics ----------------------------------------------------------


class Paths(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Linear(3, 3)
        self.block.gain = 1.0
        self.keep = (0, 1)
        self.path = "block.gain"

    def forward(self, x):
        outs = (x, self.block(x), x * 2, torch.tanh(x))
        kept = operator.itemgetter(*self.keep)(outs)
        return sum(kept) * operator.attrgetter(self.path)(self)


def operator_getters_over_changing_paths(compile_it) -> list:
    torch.manual_seed(0)
    model = Paths()
    run, seen = compile_it(model), []
    for step in range(4):
        if step == 1:
            model.keep = (1, 3, 2)
        if step == 2:
            model.block.gain = 0.5
        if step == 3:
            model.path, model.block.bias.gain = "block.bias.gain", 3.0
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


class MilestoneDecay(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.milestones, self.step = nn.Linear(3, 3), [2, 4], 0

    def forward(self, x):
        return self.lin(x) * 0.5 ** bisect.bisect_right(self.milestones, self.step)


def bisect_over_milestones(compile_it) -> list:
    torch.manual_seed(0)
    model = MilestoneDecay()
    run, seen = compile_it(model), []
    for step in range(6):
        model.step = step
        if step == 4:
            model.milestones.insert(0, 1)  # (the list changed in place)
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


_PRIORITIES: list = [(2.0, "b"), (5.0, "a")]


def _least_first(x):
    weight, name = _PRIORITIES[0]
    return x * weight if name == "b" else x - weight


def heap_pushed_between_calls(compile_it) -> list:
    heapq.heapify(_PRIORITIES)
    run, seen = compile_it(_least_first), []
    try:
        for step in range(4):
            if step == 1:
                heapq.heappush(_PRIORITIES, (1.0, "a"))  # (a new smallest)
            if step == 3:
                heapq.heappop(_PRIORITIES)
                heapq.heappop(_PRIORITIES)
            seen.append(run(torch.ones(2)))
    finally:
        _PRIORITIES[:] = [(2.0, "b"), (5.0, "a")]
    return seen


class HistoryNorm(nn.Module):
    """Divides by the mean of the norms seen so far (appended outside the call)."""

    def __init__(self):
        super().__init__()
        self.history = [1.0]

    def forward(self, x):
        return x / statistics.fmean(self.history)


def statistics_of_an_appended_history(compile_it) -> list:
    model = HistoryNorm()
    run, seen = compile_it(model), []
    for _ in range(4):
        out = run(torch.full((2,), 4.0))
        model.history.append(float(out.sum()))  # (the list grows: its mean changes)
        seen.append(out)
    return seen


# -- environment, weak references, copies, interpreter flags --------------------------------------

_FLAG = "THUNDER_RS_ROUND15_FAST_GELU"


def _gelu_by_environment(x):
    return F.gelu(x, approximate="tanh" if _FLAG in os.environ else "none")


def environment_membership(compile_it) -> list:
    os.environ.pop(_FLAG, None)
    run, seen = compile_it(_gelu_by_environment), []
    try:
        for step in range(4):
            if step == 1:
                os.environ[_FLAG] = ""  # (present, though empty)
            if step == 3:
                del os.environ[_FLAG]
            seen.append(run(torch.linspace(-2, 2, 5)))
    finally:
        os.environ.pop(_FLAG, None)
    return seen


class WeaklyScaled(nn.Module):
    """Scales looked up in a ``WeakKeyDictionary`` keyed by the submodules."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)
        self.scales: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary({self.a: 1.0})

    def forward(self, x):
        return self.a(x) * self.scales.get(self.a, 0.0) + self.b(x) * self.scales.get(self.b, 0.0)


def weak_key_dictionary_of_scales(compile_it) -> list:
    torch.manual_seed(0)
    model = WeaklyScaled()
    run, seen = compile_it(model), []
    for step in range(4):
        if step == 1:
            model.scales[model.b] = 0.5
        if step == 2:
            model.scales[model.a] = 2.0
        if step == 3:
            del model.scales[model.a]
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


class CopiedHead(nn.Module):
    """``copy.copy`` of a submodule made in the forward: the copy shares the parameters."""

    def __init__(self):
        super().__init__()
        self.head, self.drop_bias = nn.Linear(3, 3), False

    def forward(self, x):
        head = copy.copy(self.head)
        if self.drop_bias:
            head.bias = None  # (the copy's own attribute: the model's head keeps its bias)
        return head(x)


def shallow_copy_of_a_submodule(compile_it) -> list:
    torch.manual_seed(0)
    model = CopiedHead()
    run, seen = compile_it(model), []
    for drop in (False, True, False):
        model.drop_bias = drop
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen + [model.head.bias is not None]


def _checked_by_flags(x):
    if not sys.flags.optimize and x.dim() != 2:
        raise ValueError("expected a matrix")
    try:
        warnings.warn("the unscaled path is deprecated", DeprecationWarning)
        scale = 1.0
    except DeprecationWarning:  # (the caller's filters made it an error)
        scale = 2.0
    return x * scale + int(sys.flags.dev_mode)


def sys_flags_and_warning_filters(compile_it) -> list:
    """``sys.flags`` read, and a warning that the caller's filters make an error on some calls,
    caught by the program."""
    run, seen = compile_it(_checked_by_flags), []
    for action in ("ignore", "error", "ignore", "error"):
        with warnings.catch_warnings():
            warnings.simplefilter(action, DeprecationWarning)
            seen.append(run(torch.ones(2, 2)))
    try:
        run(torch.ones(2))
    except ValueError as e:
        seen.append(str(e))
    return seen


class ProductWidth(nn.Module):
    """A flatten width computed by ``functools.reduce(operator.mul, ...)`` and ``math.prod`` of a
    shape list the model holds, changed with the input between calls."""

    def __init__(self):
        super().__init__()
        self.shape = [2, 3]

    def forward(self, x):
        width = functools.reduce(operator.mul, self.shape, 1)
        return x.reshape(x.shape[0], width) * math.prod(self.shape[1:])


def reduce_and_prod_of_a_shape_list(compile_it) -> list:
    model = ProductWidth()
    run, seen = compile_it(model), []
    for shape in ([2, 3], [3, 2], [6, 1], [2, 3]):
        model.shape[:] = shape
        seen.append(run(torch.arange(12.0).reshape(2, *shape)))
    return seen
