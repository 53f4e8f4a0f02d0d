"""The observer finds what an object it reads from is once per trace (``AttributeReads._instance_read``).

Most reads of a traced program repeat one made before: a config attribute read by every layer, a
module's attribute by each call of its method. What the observer found about the object (not a
generator, type or module; a ``torch.nn.Module`` or not; its instance dict and where its guards
apply) is kept for objects whose type reads attributes in C, while the object keeps its type and
instance dict. The tests check that it is found once, and that every program compiles with the same
guards, and computes what eager computes, as when it is found again at each read.
"""

import copy

import pytest
import torch
from torch import nn

import thunder_rs
from thunder_rs.core.state import attribute_reads, observe


class Config:
    def __init__(self, scale=2.0, shift=0.5):
        self.scale, self.shift = scale, shift

    def bias(self):
        return self.shift


class Halved(Config):
    def bias(self):
        return self.shift / 2


def _helper(cfg, x):
    return x * cfg.scale + cfg.bias()


class Repeating(nn.Module):
    """Reads its config through ``_helper`` ``n`` times."""

    def __init__(self, cfg, n: int):
        super().__init__()
        self.cfg, self.n = cfg, n
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x)
        for _ in range(self.n):
            y = _helper(self.cfg, y)
        return y


class Rescaling(Repeating):
    """Sets ``cfg.scale`` between two reads of it, and back."""

    def forward(self, x):
        y = _helper(self.cfg, self.linear(x))
        scale = self.cfg.scale
        self.cfg.scale = scale + 1.0
        try:
            return _helper(self.cfg, y) * self.cfg.scale
        finally:
            self.cfg.scale = scale


class Reclassing(Repeating):
    """Changes its config's class between two reads of it, and back."""

    def forward(self, x):
        y = _helper(self.cfg, self.linear(x))
        self.cfg.__class__ = Halved
        try:
            return _helper(self.cfg, y) + self.cfg.bias()
        finally:
            self.cfg.__class__ = Config


class Redicting(Repeating):
    """Gives its config another instance dict between two reads of it, and back."""

    def forward(self, x):
        y = _helper(self.cfg, self.linear(x))
        found = self.cfg.__dict__
        self.cfg.__dict__ = {"scale": 3.0, "shift": -1.0}
        try:
            return _helper(self.cfg, y)
        finally:
            self.cfg.__dict__ = found


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.proj = nn.Linear(4, 4)
        self.gain = 1.5

    def forward(self, x):
        return self.proj(x) * self.gain * self.cfg.scale + self.cfg.shift


class Stack(nn.Module):
    """Layers sharing a config; the second layer's gain changes between the layers' calls, and back."""

    def __init__(self, cfg):
        super().__init__()
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(3))

    def forward(self, x):
        gain = self.layers[1].gain
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i == 0:
                self.layers[1].gain = gain + 1.0
        self.layers[1].gain = gain
        return x


def _is_a_calls(n: int, monkeypatch) -> int:
    calls = []
    is_a = attribute_reads.is_a

    def counted(*args):
        calls.append(1)
        return is_a(*args)

    torch.manual_seed(0)
    eager = Repeating(Config(scale=1.5), n)
    jm, x = thunder_rs.jit(copy.deepcopy(eager)), torch.randn(2, 4)
    with monkeypatch.context() as m:
        m.setattr(attribute_reads, "is_a", counted)
        torch.testing.assert_close(jm(x), eager(x))
    return len(calls)


def test_an_object_read_again_is_found_once_per_trace(monkeypatch):
    # (each read of ``cfg.scale`` asked three times what ``cfg`` is: 16 more reads of the config
    # asked 90 more times)
    assert _is_a_calls(16, monkeypatch) == _is_a_calls(1, monkeypatch)


class _Forgetful(dict):
    """A ``_objects_read`` that keeps nothing: the observer finds what each object is at each read."""

    def __setitem__(self, key, value):
        pass


def _guards_of(eager, model, calls, monkeypatch, forget: bool) -> list:
    """The guards of each compile of ``model`` (a copy of ``eager``, which the calls leave as they
    found it) called with ``calls``, described, with the outputs checked against eager's."""
    found = []
    guards, init = observe.Observer.guards, observe.Observer.__init__

    def recorded(self):
        out = guards(self)
        found.append(sorted(map(_described, out)))
        return out

    def forgetful(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._objects_read = _Forgetful()

    jm = thunder_rs.jit(model)
    with monkeypatch.context() as m:
        m.setattr(observe.Observer, "guards", recorded)
        if forget:
            m.setattr(observe.Observer, "__init__", forgetful)
        for args in calls:
            with torch.no_grad():
                torch.testing.assert_close(jm(*args), eager(*args))
    return found


def _described(guard) -> tuple:
    """What a guard checks, comparable between two compiles of the same module: its kind, its
    source, name and origin, and what it expects (by identity for objects, by value otherwise)."""
    source = getattr(guard, "source", None)
    expected = getattr(guard, "expected", None)
    by_value = type(expected) in (int, float, str, bool, type(None), tuple)
    return (
        type(guard).__name__,
        repr(getattr(source, "key", None)),
        str(getattr(guard, "name", getattr(guard, "label", ""))),
        str(getattr(guard, "origin", "")),
        repr(expected) if by_value else id(expected),
    )


def _tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=32, vocab_size=50)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


class _Logits(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = _tiny_gpt2()

    def forward(self, ids):
        return self.model(input_ids=ids).logits


_X = torch.randn(2, 4)
_PROGRAMS = {
    "repeating": (lambda: Repeating(Config(), 4), [(_X,)]),
    "rescaling": (lambda: Rescaling(Config(), 1), [(_X,), (_X,)]),
    "reclassing": (lambda: Reclassing(Config(), 1), [(_X,), (_X,)]),
    "redicting": (lambda: Redicting(Config(), 1), [(_X,), (_X,)]),
    "stack": (lambda: Stack(Config()), [(_X,), (_X,)]),
    "gpt2": (_Logits, [(torch.arange(6).reshape(1, 6),), (torch.arange(8).reshape(2, 4),)]),
}


@pytest.mark.parametrize("program", sorted(_PROGRAMS))
def test_the_guards_are_those_found_at_each_read(program, monkeypatch):
    make, calls = _PROGRAMS[program]
    torch.manual_seed(0)
    eager = make()
    model = copy.deepcopy(eager)
    again = _guards_of(eager, model, calls, monkeypatch, forget=True)
    once = _guards_of(eager, model, calls, monkeypatch, forget=False)
    assert once and once == again
