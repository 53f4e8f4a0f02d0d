"""Objects a program makes and returns outside torch's flattenable containers (a SimpleNamespace, a
plain class instance, an unregistered dataclass, an ``argparse.Namespace``, a set) are new on every
compiled call and hold that call's values, as eager's are; objects it found in its state are the
same object on every call, as in eager; what cannot be made anew is refused naming the program."""

import argparse
import collections
import dataclasses
import threading
import types

import numpy as np
import pytest
import torch

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError


class Plain:
    def __init__(self, t, n):
        self.t, self.n, self.info = t, n, {"seen": [n]}


class CustomNew:
    made = 0

    def __new__(cls, *args):
        return super().__new__(cls)

    def __init__(self, t):
        self.t = t


class Slotted:
    __slots__ = ("t", "n", "unset")

    def __init__(self, t, n):
        self.t, self.n = t, n


@dataclasses.dataclass
class Box:
    t: torch.Tensor
    n: int
    tags: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenBox:
    t: torch.Tensor
    n: int


def _same(a, b, path="out"):
    """``a`` (eager's) and ``b`` (the compiled call's) are alike: types, tensors (bit-equal), values."""
    assert type(a) is type(b), (path, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b) and a.stride() == b.stride(), path
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b), path
    elif isinstance(a, (list, tuple, set, bytearray, collections.deque)) and not isinstance(a, (set, bytearray)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            _same(a[k], b[k], f"{path}[{k!r}]")
    elif hasattr(a, "__dict__") or hasattr(type(a), "__slots__"):
        names = [*getattr(a, "__dict__", {})] + [n for n in getattr(type(a), "__slots__", ()) if hasattr(a, n)]
        assert names == [*getattr(b, "__dict__", {})] + [n for n in getattr(type(b), "__slots__", ()) if hasattr(b, n)]
        for n in names:
            _same(getattr(a, n), getattr(b, n), f"{path}.{n}")
    elif type(a) is not object:
        assert a == b, path


def _mutate(obj) -> None:
    """What a caller may do to a returned object between calls."""
    for name in ("n", "extra"):
        try:
            object.__setattr__(obj, name, 99)
        except (AttributeError, TypeError):
            pass
    for held in (getattr(obj, "info", None), getattr(obj, "tags", None), obj):
        if isinstance(held, dict):
            held["added"] = 1
        elif isinstance(held, (list, set)):
            held.append(5) if isinstance(held, list) else held.add(5)
        elif isinstance(held, (bytearray, np.ndarray)):
            held[0] = 7


def _two_calls(fn, pick=lambda out: out[1]):
    """Two calls on different inputs, the caller changing what the first returned in between."""
    x1, x2 = torch.linspace(-1, 1, 3), torch.linspace(2, 5, 3)
    first = fn(x1)
    _mutate(pick(first))
    second = fn(x2)
    return first, second


MADE = {
    "SimpleNamespace": lambda x: types.SimpleNamespace(t=x * 2, n=3, info={"seen": [1]}),
    "plain class": lambda x: Plain(x * 2, 3),
    "custom __new__": lambda x: CustomNew(x + 1),
    "slots": lambda x: Slotted(x * 2, 3),
    "dataclass": lambda x: Box(x * 2, 3, ["a"]),
    "frozen slots dataclass": lambda x: FrozenBox(x * 2, 3),
    "argparse.Namespace": lambda x: argparse.Namespace(t=x.sin(), n=3),
    "nested": lambda x: types.SimpleNamespace(inner=types.SimpleNamespace(t=x * 2, n=[1]), n=3),
    "no tensors": lambda x: types.SimpleNamespace(n=3, info={"seen": [[1]]}),
    "plain, no tensors": lambda x: Plain(None, 3),
    "defaultdict": lambda x: types.SimpleNamespace(d=collections.defaultdict(list, t=x * 2)),
    "set": lambda x: {1, 2},
    "bytearray": lambda x: bytearray(b"ab"),
    "numpy array": lambda x: np.zeros(3),
    "object()": lambda x: object(),
}


@pytest.mark.parametrize("name", list(MADE))
def test_a_made_object_is_new_each_call_with_that_calls_values(name):
    make = MADE[name]

    def program(x):
        return x + 1, make(x)

    eager = _two_calls(program)
    compiled = _two_calls(thunder_rs.jit(program))
    _same(eager[1], compiled[1])  # (the first call's mutation did not reach the second's)
    assert (compiled[0][1] is compiled[1][1]) == (eager[0][1] is eager[1][1]) is False
    inner = getattr(compiled[1][1], "inner", None)
    if inner is not None:
        assert inner is not compiled[0][1].inner and inner.n is not compiled[0][1].inner.n


def test_a_made_object_returned_alone_or_twice_keeps_eager_s_sharing():
    def program(x):
        ns = types.SimpleNamespace(t=x * 2, n=[1])
        return ns if x.shape[0] == 3 else None

    jf = thunder_rs.jit(program)
    first, second = _two_calls(jf, pick=lambda out: out)
    assert first is not second and first.n is not second.n
    _same(_two_calls(program, pick=lambda out: out)[1], second)

    def twice(x):
        ns = types.SimpleNamespace(n=[1])
        return x * 2, ns, [ns, types.SimpleNamespace(n=ns.n)]

    jf = thunder_rs.jit(twice)
    first, second = jf(torch.ones(3)), jf(torch.ones(3))
    assert second[1] is second[2][0] and second[1].n is second[2][1].n and second[1] is not first[1]


class _WithState(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cfg = types.SimpleNamespace(n=1, sub=types.SimpleNamespace(k=2))
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x), self.cfg, types.SimpleNamespace(sub=self.cfg.sub, own=[1])


_GLOBAL = types.SimpleNamespace(v=1)


def test_objects_found_in_state_stay_the_same_object():
    m = _WithState()
    jm = thunder_rs.jit(m)
    x = torch.randn(2, 3)
    first, second = jm(x), jm(x)
    assert first[1] is second[1] is m.cfg and second[2].sub is m.cfg.sub
    assert first[2] is not second[2] and first[2].own is not second[2].own
    _same(m(x), second)

    default = types.SimpleNamespace(q=1)

    def program(x, d=default):
        return x + 1, _GLOBAL, d

    out = thunder_rs.jit(program)(x)
    assert out[1] is _GLOBAL and out[2] is default


@pytest.mark.parametrize("make", [threading.Lock, lambda: torch.Generator().manual_seed(0)], ids=["lock", "generator"])
def test_a_made_object_that_cannot_be_made_anew_is_refused_naming_the_program(make):
    def returns_unrebuildable(x):
        return x * 2, types.SimpleNamespace(held=make())

    with pytest.raises(ThunderNotImplementedError, match=r"returns_unrebuildable \(.*test_returned_objects.py:\d+\)"):
        thunder_rs.jit(returns_unrebuildable)(torch.ones(3))


class _Pair(tuple):
    __slots__ = ()


def test_a_made_tuple_subclass_holding_traced_tensors_is_refused():
    def returns_pair(x):
        return x * 2, types.SimpleNamespace(pair=_Pair((x * 3, 1)))

    with pytest.raises(ThunderNotImplementedError, match=r"returns_pair .*_Pair it made"):
        thunder_rs.jit(returns_pair)(torch.ones(3))


class _Tables(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = [1, 2]
        self.names = {"a": 1}

    def forward(self, x):
        return types.SimpleNamespace(t=x * 2, table=self.table, names=self.names, own={"b": [2]})


def test_a_made_object_holding_state_lists_holds_those_lists_themselves():
    m = _Tables()
    jm = thunder_rs.jit(m)
    first, second = jm(torch.ones(2)), jm(torch.full((2,), 3.0))
    assert second.table is m.table and second.names is m.names
    assert second.own is not first.own and second.own["b"] is not first.own["b"]
    _same(m(torch.full((2,), 3.0)), second)


def test_a_module_returning_what_it_cannot_make_anew_is_refused_naming_its_forward():
    class MakesLock(torch.nn.Module):
        def forward(self, x):
            return x * 2, threading.Lock()

    with pytest.raises(ThunderNotImplementedError, match=r"MakesLock.forward \(.*test_returned_objects.py:\d+\)"):
        thunder_rs.jit(MakesLock())(torch.ones(2))


class _NamedWithAttributes(collections.namedtuple("_Fields", "t n")):
    pass


def test_a_named_tuple_with_attributes_of_its_own_is_refused():
    def returns_named(x):
        out = _NamedWithAttributes(x * 2, 1)
        out.extra = [5]
        return out

    assert returns_named(torch.ones(2)).extra == [5]  # (eager keeps it)
    with pytest.raises(ThunderNotImplementedError, match=r"returns_named .*_NamedWithAttributes .*\(extra\)"):
        thunder_rs.jit(returns_named)(torch.ones(2))
