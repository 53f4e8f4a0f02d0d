"""The programs of ``test_user_programs_round11.py`` reading Python state through the standard
library: each takes how to compile, runs it over several calls with the state changed between them,
and returns what the calls gave and left behind."""

import bisect
import collections
import configparser
import dataclasses
import functools
import heapq
import json
import math
import re
import types

import torch
import torch.nn.functional as F
from torch import nn

from user_programs_round8 import _backward_steps
from user_programs_round9 import _raised


@dataclasses.dataclass
class HeadConfig:
    scales: list = dataclasses.field(default_factory=lambda: [1.0, 2.0])
    extra: dict = dataclasses.field(default_factory=dict)
    name: str = "head"


class ConfiguredHead(nn.Module):
    def __init__(self, config: HeadConfig):
        super().__init__()
        self.config = config
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        y = self.lin(x)
        for s in self.config.scales:
            y = y * s
        return y + self.config.extra.get("shift", 0.0)


def default_factory_config(compile_it) -> list:
    torch.manual_seed(0)
    config = HeadConfig()
    model = ConfiguredHead(config)
    run, seen = compile_it(model), []
    for change in (None, ("append", 3.0), ("shift", 0.5), ("set", 0.5), None, ("replace", [2.0])):
        if change and change[0] == "append":
            config.scales.append(change[1])
        elif change and change[0] == "shift":
            config.extra["shift"] = change[1]
        elif change and change[0] == "set":
            config.scales[0] = change[1]
        elif change:
            config.scales = change[1]
        seen += _backward_steps(model, run, [(torch.ones(2, 3),)])
    return seen


class Namespaced(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.opts = types.SimpleNamespace(scale=2.0, act="relu")

    def forward(self, x):
        y = self.lin(x) * self.opts.scale
        if getattr(self.opts, "bias", None) is not None:
            y = y + self.opts.bias
        return F.gelu(y) if self.opts.act == "gelu" else F.relu(y)


def simple_namespace_options(compile_it) -> list:
    torch.manual_seed(0)
    model = Namespaced()
    run, seen = compile_it(model), []
    for change in ({}, {"scale": 3.0}, {"act": "gelu"}, {"bias": 1.0}, {"bias": None}, {}):
        for k, v in change.items():
            setattr(model.opts, k, v)
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


_ACT = functools.partial(F.leaky_relu, negative_slope=0.1)


def _partial_activated(x):
    return _ACT(x) * 2


def partial_keywords_mutated(compile_it) -> list:
    """The partial's own ``keywords`` dict changed in place between calls."""
    run, seen = compile_it(_partial_activated), []
    for slope in (0.1, 0.3, 0.3, 0.05):
        _ACT.keywords["negative_slope"] = slope
        x = torch.tensor([-1.0, 2.0], requires_grad=True)
        out = run(x)
        out.sum().backward()
        seen += [out, x.grad]
    _ACT.keywords["negative_slope"] = 0.1
    return seen


class ChainMapped(nn.Module):
    def __init__(self):
        super().__init__()
        self.defaults = {"scale": 1.0, "shift": 0.0}
        self.overrides: dict = {}
        self.settings = collections.ChainMap(self.overrides, self.defaults)

    def forward(self, x):
        return x * self.settings["scale"] + self.settings["shift"]


def chain_map_settings(compile_it) -> list:
    model = ChainMapped()
    run, seen = compile_it(model), []
    for change in (None, ("overrides", "scale", 3.0), ("defaults", "shift", 1.0), ("overrides", "shift", 2.0)):
        if change:
            getattr(model, change[0])[change[1]] = change[2]
        seen.append(run(torch.ones(2)))
    model.settings = model.settings.new_child({"scale": 5.0})
    seen.append(run(torch.ones(2)))
    del model.overrides["shift"]
    seen.append(run(torch.ones(2)))
    return seen


class KeepsWorst(nn.Module):
    """A heap of the largest losses seen (``heapq`` on ``.item()`` floats); the loss is weighted up
    when it is among them."""

    def __init__(self, k=2):
        super().__init__()
        self.lin, self.k, self.heap = nn.Linear(3, 1), k, []

    def forward(self, x, y):
        loss = F.mse_loss(self.lin(x).squeeze(-1), y)
        value = loss.item()
        if len(self.heap) < self.k:
            heapq.heappush(self.heap, value)
            weight = 2.0
        elif value > self.heap[0]:
            heapq.heapreplace(self.heap, value)
            weight = 2.0
        else:
            weight = 1.0
        return loss * weight


def heap_of_item_losses(compile_it) -> list:
    torch.manual_seed(0)
    model = KeepsWorst()
    x = torch.randn(4, 3)
    batches = [(x, torch.full((4,), float(s))) for s in (1.0, 3.0, 0.0, 5.0, 0.5)]
    return _backward_steps(model, compile_it(model), batches) + [sorted(model.heap)]


class MilestoneScaled(nn.Module):
    """``bisect`` over a schedule of milestones with a step counter advanced per call."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.milestones, self.gammas, self.step = [2, 4], [1.0, 0.5, 0.25], 0

    def forward(self, x):
        scale = self.gammas[bisect.bisect_right(self.milestones, self.step)]
        self.step += 1
        return self.lin(x) * scale


def bisect_schedule(compile_it) -> list:
    torch.manual_seed(0)
    model = MilestoneScaled()
    seen = _backward_steps(model, compile_it(model), [(torch.ones(1, 3),)] * 6)
    return [*seen, model.step]


class CosineWarm(nn.Module):
    """A cosine schedule from a step counter: ``math.cos(math.pi * step / total)``."""

    def __init__(self, total=4):
        super().__init__()
        self.lin, self.total, self.step = nn.Linear(3, 3), total, 0

    def forward(self, x):
        factor = 0.5 * (1 + math.cos(math.pi * min(self.step, self.total) / self.total))
        self.step += 1
        return self.lin(x) * factor


def cosine_schedule(compile_it) -> list:
    torch.manual_seed(0)
    model = CosineWarm()
    seen = _backward_steps(model, compile_it(model), [(torch.ones(1, 3),)] * 6)
    return [*seen, model.step]


class JsonConfigured(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.config = '{"scale": 2.0, "layers": ["lin"]}'

    def forward(self, x):
        cfg = json.loads(self.config)
        for name in cfg["layers"]:
            x = getattr(self, name)(x)
        return x * cfg["scale"]


def json_config_string(compile_it) -> list:
    torch.manual_seed(0)
    model = JsonConfigured()
    run, seen = compile_it(model), []
    configs = (None, '{"scale": 3.0, "layers": ["lin"]}', '{"scale": 1.0, "layers": ["lin", "lin"]}', None)
    for config in configs:
        if config:
            model.config = config
        seen += _backward_steps(model, run, [(torch.ones(1, 3),)])
    return seen


class ByPattern(nn.Module):
    """``re`` on module names chooses which layers run; the pattern is changed between calls."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleDict({"attn_0": nn.Linear(3, 3), "mlp_0": nn.Linear(3, 3), "attn_1": nn.Linear(3, 3)})
        self.pattern = r"^attn_"

    def forward(self, x):
        for name, block in self.blocks.items():
            if re.search(self.pattern, name):
                x = torch.tanh(block(x))
        return x


def regex_chosen_layers(compile_it) -> list:
    torch.manual_seed(0)
    model = ByPattern()
    run, seen = compile_it(model), []
    for pattern in (r"^attn_", r"_0$", r"^mlp", r"^attn_"):
        model.pattern = pattern
        seen += _backward_steps(model, run, [(torch.ones(1, 3),)])
    return seen


class FormattedKeys(nn.Module):
    """A dict of per-size scales keyed by ``"{}x{}".format(*x.shape)``, filled as sizes come."""

    def __init__(self):
        super().__init__()
        self.scales: dict = {}

    def forward(self, x):
        key = "{}x{}".format(*x.shape)
        if key not in self.scales:
            self.scales[key] = float(len(self.scales) + 1)
        return x * self.scales[key]


def format_keyed_sizes(compile_it) -> list:
    model = FormattedKeys()
    run, seen = compile_it(model), []
    for shape in ((2, 3), (3, 3), (2, 3), (4, 2), (3, 3)):
        seen.append(run(torch.ones(shape)))
    return [*seen, dict(model.scales)]


def _raises_from_config(x, config: str):
    cfg = json.loads(config)
    return x * cfg["scale"]


def errors_from_stdlib(compile_it) -> list:
    run = compile_it(_raises_from_config)
    configs = ('{"scale": 2.0}', '{"scale": 2.0', '{"other": 1}', '{"scale": 3.0}')
    return [_raised(run, torch.ones(2), c) for c in configs]


class ParsedConfig(nn.Module):
    """Options read from a ``configparser`` parser (``getfloat``, ``getboolean``), changed between calls."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.parser = configparser.ConfigParser()
        self.parser.read_string("[head]\nscale = 2.0\nresidual = no\n")

    def forward(self, x):
        y = self.lin(x) * self.parser.getfloat("head", "scale")
        return y + x if self.parser.getboolean("head", "residual") else y


def config_parser_options(compile_it) -> list:
    torch.manual_seed(0)
    model = ParsedConfig()
    run, seen = compile_it(model), []
    for change in (None, ("scale", "3.0"), ("residual", "yes"), None, ("scale", "0.5")):
        if change:
            model.parser.set("head", *change)
        seen += _backward_steps(model, run, [(torch.ones(1, 3),)])
    return seen


_TABLE = {"gain": 2.0}
_VIEW = types.MappingProxyType(_TABLE)
_USER = collections.UserDict({"shift": 1.0})


def _read_only_views(x):
    return x * _VIEW["gain"] + _USER["shift"]


def mapping_proxy_and_user_dict(compile_it) -> list:
    run, seen = compile_it(_read_only_views), []
    for gain, shift in ((2.0, 1.0), (3.0, 1.0), (3.0, -1.0), (3.0, -1.0)):
        _TABLE["gain"], _USER["shift"] = gain, shift
        seen.append(run(torch.ones(2)))
    _TABLE["gain"], _USER["shift"] = 2.0, 1.0
    return seen
