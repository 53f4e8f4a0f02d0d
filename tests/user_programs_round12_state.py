"""The programs of ``test_user_programs_round12.py`` reading Python state through the standard
library and NumPy: dataclass configs, ``functools`` caches and dispatch, enums, context
variables, thread-locals, Python's and NumPy's random generators, the environment, warnings,
logging, generators, ``try``/``except`` and ``assert``. Each takes how to compile, runs it over
several calls with the state changed between them, and returns what the calls gave and left."""

import contextvars
import dataclasses
import enum
import functools
import logging
import os
import random
import threading
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from user_programs_round8 import _backward_steps
from user_programs_round9 import _raised


@dataclasses.dataclass
class AttentionConfig:
    heads: int = 1
    dropout: float = 0.0


@dataclasses.dataclass
class BlockConfig:
    attention: AttentionConfig = dataclasses.field(default_factory=AttentionConfig)
    scale: float = 1.0
    norm: str = "layer"

    def __post_init__(self):
        self.inverse = 1.0 / self.scale


class ConfiguredBlock(nn.Module):
    def __init__(self, config: BlockConfig):
        super().__init__()
        self.config, self.lin = config, nn.Linear(4, 4)

    def forward(self, x):
        cfg = self.config
        y = self.lin(x).unflatten(-1, (cfg.attention.heads, -1)).softmax(-1).flatten(-2)
        y = F.layer_norm(y, (4,)) if cfg.norm == "layer" else F.normalize(y, dim=-1)
        return y * cfg.scale * cfg.inverse + cfg.attention.dropout


def nested_dataclass_config(compile_it) -> list:
    """A nested config changed field by field, replaced by ``dataclasses.replace`` (which runs
    ``__post_init__`` again), and one whose derived field is left stale."""
    torch.manual_seed(0)
    config = BlockConfig()
    model = ConfiguredBlock(config)
    run, seen = compile_it(model), []
    changes = (
        lambda: None,
        lambda: setattr(config.attention, "heads", 2),
        lambda: setattr(config, "norm", "l2"),
        lambda: setattr(config, "scale", 2.0),  # (``inverse`` stays 1.0)
        lambda: setattr(model, "config", dataclasses.replace(model.config, scale=4.0)),
        lambda: setattr(model.config, "attention", AttentionConfig(heads=4, dropout=0.5)),
    )
    for change in changes:
        change()
        seen += _backward_steps(model, run, [(torch.randn(2, 4),)])
    return seen


@functools.lru_cache(maxsize=2)
def _position_scale(length: int) -> float:
    _position_scale.computed.append(length)  # type: ignore[attr-defined]
    return 1.0 / (1 + length)


_position_scale.computed = []  # type: ignore[attr-defined]


def _scaled_by_length(x):
    return x * _position_scale(x.shape[-1])


def lru_cached_float_helper(compile_it) -> list:
    """A cache of two entries evicted and cleared between calls; which lengths it computed (its
    own state) must be as eager's calls left it."""
    _position_scale.cache_clear()
    _position_scale.computed.clear()
    run, seen = compile_it(_scaled_by_length), []
    for length, clear in ((2, False), (3, False), (2, False), (4, False), (3, True), (3, False)):
        if clear:
            _position_scale.cache_clear()
        seen.append(run(torch.ones(2, length)))
    return seen + [list(_position_scale.computed), _position_scale.cache_info().currsize]


@functools.singledispatch
def _apply_option(option, x):
    return x


@_apply_option.register
def _(option: float, x):
    return x * option


@_apply_option.register
def _(option: str, x):
    return getattr(torch, option)(x)


class Dispatched(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.option = nn.Linear(3, 3), None

    def forward(self, x):
        return _apply_option(self.option, self.lin(x))


def singledispatch_on_an_option(compile_it) -> list:
    torch.manual_seed(0)
    model = Dispatched()
    run, seen = compile_it(model), []
    for option in (None, 2.0, "tanh", "sigmoid", 2.0):
        model.option = option
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


class Norm(enum.Enum):
    LAYER = "layer"
    RMS = "rms"


class Features(enum.Flag):
    NONE = 0
    BIAS = enum.auto()
    GATE = enum.auto()


class EnumSteered(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.gate = nn.Linear(3, 3), nn.Linear(3, 3)
        self.norm, self.features, self.kind = Norm.LAYER, Features.NONE, "layer"

    def forward(self, x):
        y = self.lin(x)
        if Norm(self.kind) is Norm.RMS or self.norm is Norm.RMS:
            y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)
        else:
            y = F.layer_norm(y, (3,))
        if Features.GATE in self.features:
            y = y * torch.sigmoid(self.gate(x))
        if self.features & Features.BIAS:
            y = y + 1.0
        return y


def enum_and_flag_members(compile_it) -> list:
    torch.manual_seed(0)
    model = EnumSteered()
    run, seen = compile_it(model), []
    changes = (
        {},
        {"norm": Norm.RMS},
        {"features": Features.GATE | Features.BIAS},
        {"norm": Norm.LAYER, "kind": "rms"},
        {"features": Features.BIAS, "kind": "layer"},
    )
    for change in changes:
        for k, v in change.items():
            setattr(model, k, v)
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


_PRECISION: contextvars.ContextVar = contextvars.ContextVar("precision", default="fp32")


def _by_precision(x):
    return x.to(torch.bfloat16).float() if _PRECISION.get() == "bf16" else x * 1.0


def context_var_set_and_reset(compile_it) -> list:
    """Set, reset by its token, and set inside a copied context (``Context.run``)."""
    run, seen = compile_it(_by_precision), []
    x = torch.linspace(0, 1, 7) + 1 / 3
    seen.append(run(x))
    token = _PRECISION.set("bf16")
    seen.append(run(x))
    _PRECISION.reset(token)
    seen.append(run(x))
    context = contextvars.copy_context()
    seen.append(context.run(lambda: (_PRECISION.set("bf16"), run(x))[1]))
    seen.append(run(x))
    return seen


_LOCAL = threading.local()


def _by_thread(x):
    return x * getattr(_LOCAL, "scale", 1.0)


def thread_local_per_thread(compile_it) -> list:
    """The calling thread's value; another thread's setting it changes nothing here."""
    run, seen = compile_it(_by_thread), []
    seen.append(run(torch.ones(2)))
    _LOCAL.scale = 3.0
    seen.append(run(torch.ones(2)))
    other: list = []

    def elsewhere():
        _LOCAL.scale = 5.0
        other.append(run(torch.ones(2)))

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    seen += [run(torch.ones(2)), *other]
    del _LOCAL.scale
    return seen + [run(torch.ones(2))]


class RandomlyScaled(nn.Module):
    """Layers scaled by draws of a NumPy generator the module holds."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(3, 3) for _ in range(3))
        self.rng = np.random.default_rng(0)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x) * float(self.rng.uniform(0.5, 1.5))
        return x


def numpy_generator_draws(compile_it) -> list:
    torch.manual_seed(0)
    model = RandomlyScaled()
    run = compile_it(model)
    seen = [_raised(run, torch.ones(2, 3)) for _ in range(3)]
    return seen + [model.rng.random()]


class RandomlySkipped(nn.Module):
    """Layer drop by Python's ``random`` and a NumPy generator the module holds."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(3, 3) for _ in range(3))
        self.rng = np.random.default_rng(0)

    def forward(self, x):
        for layer in self.layers:
            if random.random() < 0.5:
                continue
            x = layer(x) * float(self.rng.uniform(0.5, 1.5))
        return x


def python_and_numpy_random_draws(compile_it) -> list:
    torch.manual_seed(0)
    random.seed(3)
    model = RandomlySkipped()
    run = compile_it(model)
    seen = [_raised(run, torch.ones(2, 3)) for _ in range(4)]
    return seen + [random.random(), model.rng.random()]


def _by_environment(x):
    mode = os.environ.get("THUNDER_RS_ROUND12_MODE", "plain")
    scale = float(os.environ.get("THUNDER_RS_ROUND12_SCALE", "1"))
    return (torch.tanh(x) if mode == "tanh" else x) * scale


def environment_read_each_call(compile_it) -> list:
    run, seen = compile_it(_by_environment), []
    try:
        for mode, scale in ((None, None), ("tanh", None), ("tanh", "2.5"), (None, "2.5"), (None, None)):
            for name, value in (("MODE", mode), ("SCALE", scale)):
                if value is None:
                    os.environ.pop(f"THUNDER_RS_ROUND12_{name}", None)
                else:
                    os.environ[f"THUNDER_RS_ROUND12_{name}"] = value
            seen.append(run(torch.linspace(-1, 1, 3)))
    finally:
        for name in ("MODE", "SCALE"):
            os.environ.pop(f"THUNDER_RS_ROUND12_{name}", None)
    return seen


def _warns_on_large(x, limit: float):
    if x.shape[0] > limit:
        warnings.warn(f"batch of {x.shape[0]} over {limit}", UserWarning)
    return x * 2


def warnings_per_call(compile_it) -> list:
    """Warned on every call under ``always``, once per place under ``default``."""
    run, seen = compile_it(_warns_on_large), []
    for action in ("always", "default"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter(action)
            for n in (1, 3, 3, 4):
                seen.append(run(torch.ones(n), 2.0))
        seen.append([(w.category, str(w.message)) for w in caught])
    return seen


_LOG = logging.getLogger("thunder_rs.tests.round12")


class _Collected(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _logged(x, step: int):
    y = torch.relu(x).sum()
    _LOG.debug("step %d: %s", step, x.shape)
    _LOG.info("sum %.4f", y.item())
    return y * 2


def logging_with_lazy_formatting(compile_it) -> list:
    """The messages of each call at each level, as eager's calls logged them."""
    handler = _Collected()
    _LOG.addHandler(handler)
    try:
        run, seen = compile_it(_logged), []
        for level, step, x in (
            (logging.INFO, 0, [1.0, -2.0]),
            (logging.DEBUG, 1, [3.0, 0.5]),
            (logging.WARNING, 2, [1.0]),
        ):
            _LOG.setLevel(level)
            seen.append(run(torch.tensor(x), step))
    finally:
        _LOG.removeHandler(handler)
        _LOG.setLevel(logging.NOTSET)
    return seen + [handler.messages]


class Chunked(nn.Module):
    """A generator of chunks and one of the layers that apply, consumed by ``sum`` and ``zip``."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))
        self.active = (0, 2)

    def _applied(self):
        for i, layer in enumerate(self.layers):
            if i in self.active:
                yield layer

    def forward(self, x):
        chunks = (c * (i + 1) for i, c in enumerate(x.split(2, -1)))
        return sum(layer(c) for layer, c in zip(self._applied(), chunks))


def generators_inside(compile_it) -> list:
    torch.manual_seed(0)
    model = Chunked()
    run, seen = compile_it(model), []
    for active, width in (((0, 2), 4), ((1,), 4), ((0, 1, 2), 6), ((0, 1, 2), 4)):
        model.active = active
        seen += _backward_steps(model, run, [(torch.randn(2, width),)])
    return seen


def _either_layout(x, w):
    try:
        return x @ w
    except RuntimeError:
        return x @ w.transpose(0, 1)


def try_except_around_a_shape_error(compile_it) -> list:
    run, seen = compile_it(_either_layout), []
    for n, k in ((2, 3), (3, 2), (2, 3), (3, 3)):
        w = torch.arange(n * k, dtype=torch.float32).reshape(n, k).requires_grad_()
        out = run(torch.ones(2, 3), w)
        out.sum().backward()
        seen += [out, w.grad]
    return seen


def _checked(x, limit: float):
    assert x.shape[-1] > 1, "a single feature"
    assert (x.abs() < limit).all(), f"values over {limit}"
    return x / limit


def asserts_on_tensor_values(compile_it) -> list:
    run = compile_it(_checked)
    calls = ((torch.ones(3), 2.0), (torch.full((3,), 3.0), 2.0), (torch.ones(1), 2.0), (torch.ones(3), 4.0))
    return [_raised(run, x, limit) for x, limit in calls]


class _Kept(logging.Handler):
    """Keeps the records, formatted only when read (as a memory handler or a test's caplog)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list = []

    def emit(self, record):
        self.records.append(record)


def _logs_then_writes(x):
    y = x * 2
    _LOG.info("y=%s", y)  # (a tensor, formatted when the record is read)
    y.add_(1)
    return y


def logged_tensor_formatted_late(compile_it) -> list:
    """A tensor logged, then written in place: its record, formatted after the calls, shows it
    written, as eager's does."""
    handler = _Kept()
    _LOG.addHandler(handler)
    _LOG.setLevel(logging.INFO)
    try:
        run = compile_it(_logs_then_writes)
        seen = [run(torch.full((2,), v)) for v in (1.0, 2.0, 3.0)]
    finally:
        _LOG.removeHandler(handler)
        _LOG.setLevel(logging.NOTSET)
    return seen + [[r.getMessage() for r in handler.records]]


_GLOBAL_GAIN = [1.0]


class GlobalProperty(nn.Module):
    """A property reading a global list's item and one reading a class attribute."""

    base = 1.0

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    @property
    def gain(self):
        return _GLOBAL_GAIN[0] * type(self).base

    def forward(self, x):
        return self.lin(x) * self.gain


def property_reading_globals(compile_it) -> list:
    torch.manual_seed(0)
    model = GlobalProperty()
    run, seen = compile_it(model), []
    try:
        for gain, base in ((1.0, 1.0), (2.0, 1.0), (2.0, 3.0), (2.0, 3.0)):
            _GLOBAL_GAIN[0], GlobalProperty.base = gain, base
            seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    finally:
        _GLOBAL_GAIN[0], GlobalProperty.base = 1.0, 1.0
    return seen


@dataclasses.dataclass(slots=True)
class SlottedOptions:
    scale: float = 1.0
    clip: float | None = None


class Slotted(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.options = nn.Linear(3, 3), SlottedOptions()

    def forward(self, x):
        y = self.lin(x) * self.options.scale
        return y if self.options.clip is None else y.clamp(-self.options.clip, self.options.clip)


def slotted_dataclass_options(compile_it) -> list:
    torch.manual_seed(0)
    model = Slotted()
    run, seen = compile_it(model), []
    for scale, clip in ((1.0, None), (2.0, None), (2.0, 0.1), (2.0, 0.1), (0.5, None)):
        model.options.scale, model.options.clip = scale, clip
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


def applied_through_the_dict(compile_it) -> list:
    """``model.apply`` setting a flag on every submodule through its instance dict."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5), nn.Linear(3, 3))
    model.eval()
    run, seen = compile_it(model), []
    for p in (0.5, 0.0, 0.0):
        model.apply(lambda m: m.__dict__.__setitem__("training", p > 0) if isinstance(m, nn.Dropout) else None)
        torch.manual_seed(1)
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen
