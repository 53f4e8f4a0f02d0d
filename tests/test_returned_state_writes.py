"""State the program writes in place and returns: a module's plain tensor attribute (not a parameter
or buffer), a buffer, a parameter under ``no_grad``, a global tensor. Eager returns the state tensor
itself (``out is module.acc``) or a view of it, holding the values the writes left, on every call;
the compiled call's outputs, their identity, strides, gradients and the state after each call equal
eager's, on the first call and on cache hits, under ``thunder_rs.jit`` and
``torch.compile(backend="thunder_rs")``."""

import copy

import pytest
import torch
import torch.nn as nn
from torch.utils._pytree import tree_leaves

import thunder_rs


class Accumulator(nn.Module):
    """Holds ``acc`` as a plain attribute (``kind="attribute"``), a buffer or a parameter, and
    runs ``body(self, x)`` (a parameter is written under ``no_grad``)."""

    def __init__(self, body, kind: str = "attribute"):
        super().__init__()
        acc = torch.zeros(2, 4, dtype=torch.float64)
        if kind == "buffer":
            self.register_buffer("acc", acc)
        elif kind == "parameter":
            self.acc = nn.Parameter(acc)
        else:
            self.acc = acc
        self.kind, self.body = kind, body

    def forward(self, x):
        if self.kind != "parameter":
            return self.body(self, x)
        with torch.no_grad():
            return self.body(self, x)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def assert_as_eager(actual, expected, state, eager_state) -> None:
    """Equal values, strides and dtypes; each output is the state tensor, a view of its memory, or
    another output exactly where eager's is; the state's values equal eager's."""
    got, want = tree_leaves(actual), tree_leaves(expected)
    assert type(actual) is type(expected) and len(got) == len(want)
    for a, e in zip(got, want):
        assert torch.equal(a, e) and a.dtype == e.dtype and a.stride() == e.stride()
        assert (a is state) == (e is eager_state)
        assert (_storage(a) == _storage(state)) == (_storage(e) == _storage(eager_state))
    assert [[a is b for b in got] for a in got] == [[e is f for f in want] for e in want]
    assert torch.equal(state, eager_state)


def _adds_and_sets(s, x):  # (the reported case)
    s.acc.add_(x)
    s.acc[:, 0] = x.sum(1)
    return s.acc.clone(), s.acc


def _adds(s, x):
    s.acc.add_(x)
    return s.acc


def _adds_augmented(s, x):
    s.acc += x
    return s.acc


def _returns_in_a_dict(s, x):
    s.acc.add_(x)
    return {"acc": s.acc, "twice": x * 2}


def _returns_nested(s, x):
    s.acc.mul_(0.5).add_(x)
    return x + 1, (s.acc,)


def _returns_twice(s, x):
    s.acc.add_(x)
    return s.acc, s.acc


def _writes_through_a_view(s, x):
    s.acc[0].add_(x[0])
    return s.acc


def _writes_through_a_slice(s, x):
    s.acc[:, 1:] += x[:, 1:]
    return s.acc.clone(), s.acc


def _returns_views(s, x):
    s.acc.add_(x)
    return s.acc[0], s.acc.t(), s.acc


BODIES = {
    "add_and_setitem": _adds_and_sets,
    "add_": _adds,
    "augmented": _adds_augmented,
    "in_a_dict": _returns_in_a_dict,
    "nested_in_tuples": _returns_nested,
    "returned_twice": _returns_twice,
    "written_through_a_view": _writes_through_a_view,
    "written_through_a_slice": _writes_through_a_slice,
    "with_views_of_it": _returns_views,
}


def _run_against_eager(module, compiled, calls: int = 3) -> None:
    eager = copy.deepcopy(module)
    for _ in range(calls):
        x = torch.randn(2, 4, dtype=torch.float64)
        assert_as_eager(compiled(x.clone()), eager(x.clone()), module.acc, eager.acc)


@pytest.mark.parametrize("body", BODIES.values(), ids=BODIES.keys())
@pytest.mark.parametrize("kind", ["attribute", "buffer", "parameter"])
def test_jit_returns_the_written_state(kind, body):
    module = Accumulator(body, kind)
    jitted = thunder_rs.jit(module)
    _run_against_eager(module, jitted)
    assert thunder_rs.compile_stats(jitted).cache_hits >= 2


@pytest.mark.parametrize("name", ["add_and_setitem", "in_a_dict", "written_through_a_view", "with_views_of_it"])
def test_jit_under_no_grad_around_the_call(name):
    module = Accumulator(BODIES[name])
    jitted = thunder_rs.jit(module)
    with torch.no_grad():
        _run_against_eager(module, jitted)


@pytest.mark.parametrize("name", ["add_and_setitem", "in_a_dict", "returned_twice", "written_through_a_view"])
def test_torch_compile_returns_the_written_state(name):
    torch._dynamo.reset()
    module = Accumulator(BODIES[name])
    _run_against_eager(module, torch.compile(module, backend="thunder_rs"))


def _doubled_and_state(s, x):
    s.acc.add_(x)
    return s.acc * 2, s.acc


def _doubled_and_state_through_a_view(s, x):
    s.acc[0].add_(x[0])
    return s.acc * 2, s.acc


@pytest.mark.parametrize("body", [_doubled_and_state, _doubled_and_state_through_a_view], ids=["whole", "view"])
def test_state_written_with_values_that_require_grad(body):
    """The state takes history from ``x`` as in eager (over the calls: the second call's state
    depends on the first call's ``x``), and the gradients through the returned state equal eager's."""
    module = Accumulator(body)
    eager, jitted = copy.deepcopy(module), thunder_rs.jit(module)
    xs = [torch.randn(2, 4, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    ys = [x.detach().clone().requires_grad_() for x in xs]
    for x, y in zip(xs, ys):
        out, expected = jitted(x), eager(y)
        assert_as_eager(out, expected, module.acc, eager.acc)
        assert out[1].requires_grad and out[1].grad_fn is not None
    (out[0].sum() + out[1].pow(2).sum()).backward()
    (expected[0].sum() + expected[1].pow(2).sum()).backward()
    for x, y in zip(xs, ys):
        torch.testing.assert_close(x.grad, y.grad, rtol=0, atol=1e-12)


def test_state_made_on_the_first_call_and_remade_for_other_sizes():
    """The reported program: the attribute is made on the first call and for each new batch size,
    then written in place and returned."""

    class Running(nn.Module):
        def __init__(self):
            super().__init__()
            self.acc = None

        def forward(self, x):
            if self.acc is None or self.acc.shape[0] != x.shape[0]:
                self.acc = torch.zeros(x.shape[0], 4, dtype=x.dtype)
            self.acc.add_(x)
            self.acc[:, 0] = x.sum(1)
            return self.acc.clone(), self.acc

    module = Running()
    eager, jitted = copy.deepcopy(module), thunder_rs.jit(module)
    for batch in (2, 2, 3, 3, 3, 2, 2):
        x = torch.randn(batch, 4, dtype=torch.float64)
        assert_as_eager(jitted(x.clone()), eager(x.clone()), module.acc, eager.acc)


def test_state_rebound_between_calls_is_the_new_tensor():
    module = Accumulator(_adds)
    eager, jitted = copy.deepcopy(module), thunder_rs.jit(module)
    for call in range(4):
        if call == 2:
            module.acc, eager.acc = torch.ones(2, 4, dtype=torch.float64), torch.ones(2, 4, dtype=torch.float64)
        x = torch.randn(2, 4, dtype=torch.float64)
        assert_as_eager(jitted(x.clone()), eager(x.clone()), module.acc, eager.acc)


class Holder(nn.Module):
    """State in other places a module keeps it: ``init(self)`` makes it, ``body(self, x)`` runs."""

    def __init__(self, init, body):
        super().__init__()
        init(self)
        self.body = body

    def forward(self, x):
        return self.body(self, x)


def _state(module: nn.Module) -> list:
    """Every tensor ``module`` holds: in its attributes (lists and dicts of them too) and submodules'."""
    found = [t for v in vars(module).values() for t in tree_leaves(v) if isinstance(t, torch.Tensor)]
    return found + [t for child in module.children() for t in _state(child)]


def _zeros() -> torch.Tensor:
    return torch.zeros(2, 4, dtype=torch.float64)


def _in_a_dict(s):
    s.cache = {"k": _zeros()}


def _in_a_list(s):
    s.history = [_zeros()]


def _in_a_submodule(s):
    s.inner = nn.Module()
    s.inner.acc = _zeros()


def _two(s):
    s.a, s.b = _zeros(), torch.ones(2, 4, dtype=torch.float64)


def _with_a_view(s):
    s.base = _zeros()
    s.row = s.base[0]


def _acc(s):
    s.acc = _zeros()


HELD = {
    "out_argument": (_acc, lambda s, x: (torch.add(x, 1, out=s.acc), s.acc)[1]),
    "copy_": (_acc, lambda s, x: (s.acc.copy_(x), s.acc)[1]),
    "zero_then_add_": (_acc, lambda s, x: (s.acc.zero_().add_(x.exp()), s.acc)[1]),
    "dict_item": (_in_a_dict, lambda s, x: (s.cache["k"].add_(x), s.cache["k"])[1]),
    "list_item_and_row": (_in_a_list, lambda s, x: (s.history[0].add_(x), (s.history[0], s.history[0][1]))[1]),
    "submodule_attribute": (_in_a_submodule, lambda s, x: (s.inner.acc.add_(x), s.inner.acc)[1]),
    "two_attributes": (_two, lambda s, x: (s.a.add_(x), s.b.mul_(x), (s.b, s.a, s.a + s.b))[2]),
    "attribute_viewing_another": (_with_a_view, lambda s, x: (s.row.add_(x[0]), (s.base, s.row))[1]),
    "read_as_a_value": (_acc, lambda s, x: (s.acc.add_(x), (s.acc, 1.0 if s.acc.sum().item() > 0 else -1.0))[1]),
}


@pytest.mark.parametrize("init, body", HELD.values(), ids=HELD.keys())
def test_state_held_elsewhere_written_and_returned(init, body):
    module = Holder(init, body)
    eager, jitted = copy.deepcopy(module), thunder_rs.jit(module)
    for _ in range(4):
        x = torch.randn(2, 4, dtype=torch.float64)
        out, expected = jitted(x.clone()), eager(x.clone())
        state, eager_state = _state(module), _state(eager)
        got, want = tree_leaves(out), tree_leaves(expected)
        assert len(got) == len(want)
        assert [a for a in got if type(a) is float] == [e for e in want if type(e) is float]
        for a, e in ((a, e) for a, e in zip(got, want) if isinstance(e, torch.Tensor)):
            assert torch.equal(a, e) and a.stride() == e.stride()
            assert [a is t for t in state] == [e is t for t in eager_state]
        assert all(torch.equal(a, e) for a, e in zip(state, eager_state))


class Cache(nn.Module):
    """A key cache kept as a plain attribute or a buffer, written at a position that grows by each
    call's length; it returns the filled part (a view of the cache, sliced to a symbolic size after
    the first lengths) and the cache."""

    def __init__(self, kind: str):
        super().__init__()
        keys = torch.zeros(1, 16, 4)
        if kind == "buffer":
            self.register_buffer("keys", keys)
        else:
            self.keys = keys
        self.pos = 0

    def forward(self, x):
        length = x.shape[1]
        self.keys[:, self.pos : self.pos + length] = x
        self.pos += length
        return self.keys[:, : self.pos], self.keys


@pytest.mark.parametrize("grad", [False, True], ids=["values", "requiring_grad"])
@pytest.mark.parametrize("kind", ["attribute", "buffer"])
def test_cache_written_at_a_growing_position_and_returned(kind, grad):
    module = Cache(kind)
    eager, jitted = copy.deepcopy(module), thunder_rs.jit(module)
    for length in (3, 1, 1, 2, 1):
        x = torch.randn(1, length, 4, requires_grad=grad)
        (part, whole), expected = jitted(x), eager(x.detach().clone().requires_grad_(grad))
        assert_as_eager((part, whole), expected, module.keys, eager.keys)
        assert part._base is module.keys and part.requires_grad == expected[0].requires_grad


TOTAL = torch.zeros(2, 4, dtype=torch.float64)


def _add_to_total(x):
    TOTAL.add_(x)
    TOTAL[1] *= 2
    return TOTAL.clone(), TOTAL, TOTAL[1]


@pytest.mark.parametrize("compiler", ["jit", "torch.compile"])
def test_global_tensor_written_and_returned(compiler):
    global TOTAL
    torch._dynamo.reset()
    TOTAL = torch.zeros(2, 4, dtype=torch.float64)
    fn = thunder_rs.jit(_add_to_total) if compiler == "jit" else torch.compile(_add_to_total, backend="thunder_rs")
    state, eager_state = TOTAL, torch.zeros(2, 4, dtype=torch.float64)
    for _ in range(3):
        x = torch.randn(2, 4, dtype=torch.float64)
        out = fn(x.clone())
        TOTAL = eager_state
        try:
            expected = _add_to_total(x.clone())
        finally:
            TOTAL = state
        assert_as_eager(out, expected, state, eager_state)
