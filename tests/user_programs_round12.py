"""The programs of ``test_user_programs_round12.py`` on modules: attributes written past
``nn.Module.__setattr__``, buffers registered by the forward, properties, descriptors,
``__getattr__`` overrides, ``ModuleList`` walks, parametrizations during training and
``functional_call`` with a changing dict. Each takes how to compile, runs it over several calls
with the state changed between them, and returns what the calls gave and left behind."""

import contextlib
import enum
import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations, parametrize

from user_programs_round8 import _backward_steps, grads


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.scale, self.act = 2.0, "relu"

    def forward(self, x):
        y = self.lin(x) * self.scale
        return F.gelu(y) if self.act == "gelu" else F.relu(y)


def attributes_written_past_setattr(compile_it) -> list:
    """``scale`` and ``act`` set through the instance dict, ``vars()`` and ``object.__setattr__``,
    none of which ``nn.Module.__setattr__`` sees."""
    torch.manual_seed(0)
    model = Scaled()
    run, seen = compile_it(model), []
    changes = (
        lambda: None,
        lambda: model.__dict__.__setitem__("scale", 3.0),
        lambda: vars(model).__setitem__("act", "gelu"),
        lambda: object.__setattr__(model, "scale", 0.5),
        lambda: None,
        lambda: model.__dict__.update(scale=2.0, act="relu"),
    )
    for change in changes:
        change()
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


class Lazy(nn.Module):
    """A running mean registered by the first call (lazy initialisation), a second buffer
    registered non-persistent when the batch first exceeds two."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        if not hasattr(self, "running"):
            self.register_buffer("running", torch.zeros(3))
        self.running.mul_(0.9).add_(x.mean(0), alpha=0.1)
        if x.shape[0] > 2 and "peak" not in self._buffers:
            self.register_buffer("peak", x.detach().abs().amax(0), persistent=False)
        y = self.lin(x - self.running)
        return y if "peak" not in self._buffers else y * self.peak[:2]


def buffer_registered_by_forward(compile_it) -> list:
    torch.manual_seed(0)
    model = Lazy()
    run, seen = compile_it(model), []
    for batch in (2, 2, 4, 4, 2):
        seen += _backward_steps(model, run, [(torch.randn(batch, 3),)])
        seen += [model.running.clone(), sorted(model.state_dict()), sorted(dict(model.named_buffers()))]
    return seen


class WithProperties(nn.Module):
    """A scale read through a property of a parameter and a temperature through a property of a
    plain attribute; a setter writes what the getter reads."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.log_scale = nn.Parameter(torch.zeros(()))
        self._temperature = 1.0

    @property
    def scale(self):
        return self.log_scale.exp()

    @property
    def temperature(self):
        return self._temperature

    @temperature.setter
    def temperature(self, value):
        self._temperature = max(value, 0.1)

    def forward(self, x):
        return torch.softmax(self.lin(x) * self.scale / self.temperature, -1)


def properties_of_a_module(compile_it) -> list:
    torch.manual_seed(0)
    model = WithProperties()
    run, seen = compile_it(model), []
    for t in (1.0, 2.0, 0.01, 2.0):
        model.temperature = t
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


class Clamped:
    """A data descriptor keeping a clamped float per instance, in the instance dict."""

    def __set_name__(self, owner, name):
        self.name = f"_clamped_{name}"

    def __get__(self, obj, owner=None):
        return self if obj is None else obj.__dict__.get(self.name, 1.0)

    def __set__(self, obj, value):
        obj.__dict__[self.name] = min(max(float(value), 0.0), 4.0)


class Described(nn.Module):
    gain = Clamped()

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x) * self.gain


def descriptor_on_a_module(compile_it) -> list:
    """The descriptor writes the instance dict directly: no ``nn.Module.__setattr__``."""
    torch.manual_seed(0)
    model = Described()
    run, seen = compile_it(model), []
    for gain in (None, 2.0, 9.0, 3.0, 3.0):
        if gain is not None:
            model.gain = gain
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 3)
        self.bias_scale = 1.0


class Delegating(nn.Module):
    """Attributes it lacks are its inner module's (as PEFT's and DDP-like wrappers do)."""

    def __init__(self):
        super().__init__()
        self.inner = Inner()

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)

    def forward(self, x):
        return self.proj(x) + self.bias_scale


def getattr_override_delegates(compile_it) -> list:
    torch.manual_seed(0)
    model = Delegating()
    run, seen = compile_it(model), []
    for scale in (1.0, 2.0, 2.0, -1.0):
        model.inner.bias_scale = scale
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


class Stack(nn.Module):
    def __init__(self, n=4):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(3, 3) for _ in range(n))
        self.norms = nn.ModuleList(nn.LayerNorm(3) for _ in range(n))
        self.depth, self.backwards = 2, False

    def forward(self, x):
        layers = self.layers[: self.depth]
        pairs = zip(reversed(layers), reversed(self.norms[: self.depth])) if self.backwards else zip(layers, self.norms)
        for layer, norm in pairs:
            x = x + layer(norm(x))
        return x


def module_list_slices(compile_it) -> list:
    torch.manual_seed(0)
    model = Stack()
    run, seen = compile_it(model), []
    for depth, backwards in ((2, False), (3, False), (3, True), (4, True), (2, False)):
        model.depth, model.backwards = depth, backwards
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


def _trained(model, run, steps: int, batch) -> list:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for _ in range(steps):
        out = run(batch)
        out.square().mean().backward()
        seen += [out, grads(model)]
        optimizer.step()
        optimizer.zero_grad()
    return seen


def weight_norm_training(compile_it) -> list:
    torch.manual_seed(0)
    model = nn.Sequential(parametrizations.weight_norm(nn.Linear(3, 4)), nn.Tanh(), nn.Linear(4, 2))
    run = compile_it(model)
    seen = _trained(model, run, 3, torch.randn(5, 3))
    return seen + [model[0].weight.detach().clone()]


def orthogonal_training(compile_it) -> list:
    torch.manual_seed(0)
    model = nn.Sequential(parametrizations.orthogonal(nn.Linear(3, 3)), nn.Linear(3, 1))
    run = compile_it(model)
    seen = _trained(model, run, 3, torch.randn(4, 3))
    return seen + [model[0].weight.detach().clone()]


def spectral_norm_training(compile_it) -> list:
    """The power iteration's vectors are buffers written in place by every training call."""
    torch.manual_seed(0)
    layer = parametrizations.spectral_norm(nn.Linear(3, 4))
    model = nn.Sequential(layer, nn.ReLU(), nn.Linear(4, 1))
    run = compile_it(model)
    seen = _trained(model, run, 3, torch.randn(4, 3))
    model.eval()
    seen += [run(torch.ones(2, 3))]
    parametrization = layer.parametrizations.weight[0]
    return seen + [parametrization._u.clone(), parametrization._v.clone()]


class Symmetric(nn.Module):
    def forward(self, w):
        return w.triu() + w.triu(1).transpose(0, 1)


def parametrization_removed_between_calls(compile_it) -> list:
    torch.manual_seed(0)
    layer = nn.Linear(3, 3)
    parametrize.register_parametrization(layer, "weight", Symmetric())
    run, seen = compile_it(layer), []
    seen += _backward_steps(layer, run, [(torch.randn(2, 3),)])
    parametrize.remove_parametrizations(layer, "weight", leave_parametrized=True)
    seen += _backward_steps(layer, run, [(torch.randn(2, 3),)])
    return seen


def functional_call_with_changing_params(compile_it) -> list:
    """A dict of some parameters (then others, then new tensors) handed to ``functional_call``
    inside the program."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))

    def program(x, params):
        return torch.func.functional_call(model, params, (x,))

    run, seen = compile_it(program), []
    base = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}
    dicts = [
        {"0.weight": base["0.weight"]},
        {"0.weight": base["0.weight"], "2.bias": base["2.bias"]},
        {k: v * 2 for k, v in base.items()},
        {"0.weight": base["0.weight"]},
    ]
    for params in dicts:
        out = run(torch.randn(2, 3), params)
        out.sum().backward()
        seen += [out, [None if v.grad is None else v.grad.clone() for v in base.values()], grads(model)]
        for v in (*base.values(), *model.parameters()):
            v.grad = None
    return seen


class SwappedActivation(nn.Module):
    """An activation held as a ``functools.partial``, replaced by another between calls."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.act = functools.partial(F.gelu, approximate="none")

    def forward(self, x):
        return self.act(self.lin(x))


def partial_attribute_replaced(compile_it) -> list:
    torch.manual_seed(0)
    model = SwappedActivation()
    run, seen = compile_it(model), []
    acts = (None, functools.partial(F.gelu, approximate="tanh"), functools.partial(F.leaky_relu, negative_slope=0.2))
    for act in acts:
        if act is not None:
            model.act = act
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


class CachedProperty(nn.Module):
    """A ``functools.cached_property`` computed on first access (stored into the instance dict
    directly), dropped with ``del`` between calls."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.base = 2.0

    @functools.cached_property
    def factor(self):
        return self.base * 1.5

    def forward(self, x):
        return self.lin(x) * self.factor


def cached_property_of_a_module(compile_it) -> list:
    torch.manual_seed(0)
    model = CachedProperty()
    run, seen = compile_it(model), []
    for change in (None, "base", "drop", None, "set"):
        if change == "base":
            model.base = 4.0  # (the cached factor stays 3.0)
        elif change == "drop":
            del model.factor
        elif change == "set":
            model.__dict__["factor"] = 7.0
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


class Stage(enum.IntEnum):
    EARLY = 0
    MID = 1
    LATE = 2


class Staged(nn.Module):
    """An ``IntEnum`` member indexes a ``ModuleList`` and a tensor."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(3, 3) for _ in Stage)
        self.stage = Stage.EARLY

    def forward(self, x):
        return self.blocks[self.stage](x) * torch.arange(1.0, 4.0)[self.stage]


def int_enum_indexes(compile_it) -> list:
    torch.manual_seed(0)
    model = Staged()
    run, seen = compile_it(model), []
    for stage in (Stage.EARLY, Stage.LATE, Stage.MID, Stage.MID):
        model.stage = stage
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


class Tempered(nn.Module):
    """A context manager of the module's sets its temperature for a block and puts it back."""

    def __init__(self):
        super().__init__()
        self.lin, self.temperature = nn.Linear(3, 3), 1.0

    @contextlib.contextmanager
    def tempered(self, t):
        before, self.temperature = self.temperature, t
        try:
            yield
        finally:
            self.temperature = before

    def forward(self, x, sharpen: bool):
        y = self.lin(x)
        if sharpen:
            with self.tempered(self.temperature / 2):
                return torch.softmax(y / self.temperature, -1)
        return torch.softmax(y / self.temperature, -1)


def context_manager_sets_and_restores(compile_it) -> list:
    torch.manual_seed(0)
    model = Tempered()
    run, seen = compile_it(model), []
    for t, sharpen in ((1.0, False), (1.0, True), (2.0, True), (2.0, False)):
        model.temperature = t
        seen += _backward_steps(model, run, [(torch.randn(2, 3), sharpen)])
        seen.append(model.temperature)
    return seen


class Heads(nn.Module):
    """Heads in a ``ModuleDict`` applied in its order, popped and put back between calls."""

    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"a": nn.Linear(3, 3), "b": nn.Linear(3, 3), "c": nn.Linear(3, 3)})

    def forward(self, x):
        for name, head in self.heads.items():
            x = head(x) if name != "b" else torch.tanh(head(x))
        return x


def module_dict_reordered(compile_it) -> list:
    torch.manual_seed(0)
    model = Heads()
    run, seen = compile_it(model), []
    for change in (None, "a", "c", None):
        if change is not None:
            model.heads[change] = model.heads.pop(change)  # (moved last)
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen + [list(model.heads)]


class Computed(nn.Module):
    """``__getattr__`` answering ``scale_<n>`` names by computing them."""

    def __init__(self):
        super().__init__()
        self.lin, self.which = nn.Linear(3, 3), "scale_2"

    def __getattr__(self, name):
        if name.startswith("scale_"):
            return float(name[len("scale_") :])
        return super().__getattr__(name)

    def forward(self, x):
        return self.lin(x) * getattr(self, self.which)


def getattr_computes_names(compile_it) -> list:
    torch.manual_seed(0)
    model = Computed()
    run, seen = compile_it(model), []
    for which, set_it in (("scale_2", None), ("scale_3", None), ("scale_3", 0.5), ("scale_2", None)):
        model.which = which
        if set_it is not None:
            setattr(model, which, set_it)  # (an instance attribute: __getattr__ is not asked)
        seen += _backward_steps(model, run, [(torch.randn(2, 3),)])
    return seen


def functional_call_updates_given_buffers(compile_it) -> list:
    """BatchNorm's running statistics given in the dict, updated in place by training calls."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))

    def program(x, state):
        return torch.func.functional_call(model, state, (x,))

    run, seen = compile_it(program), []
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for training in (True, True, False, True):
        model.train(training)
        out = run(torch.randn(4, 3), state)
        seen += [out, {k: v.clone() for k, v in state.items()}, {k: v.clone() for k, v in model.state_dict().items()}]
    return seen


class Memo(nn.Module):
    """Scales looked up in a dict of state by key, computed and stored on a KeyError."""

    def __init__(self):
        super().__init__()
        self.lin, self.memo = nn.Linear(3, 3), {}

    def forward(self, x, key: str):
        try:
            scale = self.memo[key]
        except KeyError:
            scale = self.memo[key] = float(len(key))
        return self.lin(x) * scale


def try_except_key_error_memo(compile_it) -> list:
    torch.manual_seed(0)
    model = Memo()
    run, seen = compile_it(model), []
    for key in ("ab", "abc", "ab", "abcd"):
        if key == "abcd":
            model.memo["ab"] = 10.0
        seen += _backward_steps(model, run, [(torch.randn(2, 3), key)])
        seen.append(dict(model.memo))
    return seen
