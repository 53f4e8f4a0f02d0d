"""What a compiled call returns has eager's identities: a container returned in two places is one
object, a list or dict the program found in its state (or reached from an argument) is that very
object, and one it made and stored on its state (``self.last = ...; return self.last``) is the
one that call stored, new on every call."""

import types

import pytest
import torch

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError


def _containers(out, path="out", found=None) -> list:
    """``(path, object)`` for each list, tuple, dict and SimpleNamespace in ``out``, depth first."""
    found = [] if found is None else found
    if isinstance(out, (list, tuple, dict, types.SimpleNamespace)):
        found.append((path, out))
        items = vars(out).items() if isinstance(out, types.SimpleNamespace) else None
        items = items or (out.items() if isinstance(out, dict) else enumerate(out))
        for k, v in list(items):
            _containers(v, f"{path}[{k!r}]", found)
    return found


def _same_values(a, b) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b) and a.stride() == b.stride()
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same_values(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same_values(a[k], b[k])
    elif isinstance(a, types.SimpleNamespace):
        _same_values(vars(a), vars(b))
    else:
        assert a == b


def _sharing(first, second) -> tuple:
    """Which containers of ``first`` are the same object (``is``) as which of ``second``."""
    a, b = _containers(first), _containers(second)
    return tuple((p, q) for p, x in a for q, y in b if x is y and p < q or first is not second and x is y)


def _mutate(out) -> None:
    """What a caller may do to what a call returned: append to its lists, add to its dicts."""
    for _, c in _containers(out):
        if isinstance(c, list):
            c.append(-1)
        elif isinstance(c, dict):
            c["added"] = -1


def _check_like_eager(program, make_state=lambda: None, args=lambda x, s: (x,)) -> None:
    """Two calls each of ``program`` (given what ``make_state`` makes) eager and compiled, the
    caller changing the first call's output in between: the same values, the same sharing inside
    each output and between the two calls' outputs, and the same state after."""
    seen = []
    for run in (lambda p: p, thunder_rs.jit):
        state = make_state()
        fn = run(program if state is None else program(state))
        x1, x2 = torch.linspace(-1, 1, 3), torch.linspace(2, 5, 3)
        first = fn(*args(x1, state))
        inside = _sharing(first, first)
        _mutate(first)
        second = fn(*args(x2, state))
        seen.append((first, second, inside, _sharing(second, second), _sharing(first, second), state))
    eager, compiled = seen
    _same_values(eager[0], compiled[0])
    _same_values(eager[1], compiled[1])
    assert eager[2:5] == compiled[2:5]
    if eager[5] is not None:
        _same_values(eager[5].state(), compiled[5].state())


def twice_list(x):
    lst = [x * 2, 1]
    return lst, lst


def twice_plain(x):
    lst = [1, 2]
    return x + 1, lst, lst


def twice_in_dict(x):
    lst = [x * 2]
    return {"a": lst, "b": lst}


def twice_nested(x):
    held = {"k": [x.sin()], "n": (1, [2])}
    return held, [held["k"], (held, held["n"])]


@pytest.mark.parametrize("program", [twice_list, twice_plain, twice_in_dict, twice_nested], ids=lambda p: p.__name__)
def test_a_container_returned_twice_is_one_object(program):
    _check_like_eager(program)


class _History(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.history, self.table, self.pair = [], {}, (1, 2)

    def forward(self, x):
        self.history.append(len(self.history))
        self.table["last"] = x * 2
        return x + 1, self.history, {"t": self.table, "p": self.pair}

    def state(self):
        return self.history, self.table


def test_a_state_list_or_dict_returned_is_that_object_after_every_call():
    _check_like_eager(lambda m: m, _History)
    m = _History()
    jm = thunder_rs.jit(m)
    for x in (torch.ones(2), torch.zeros(2)):
        out = jm(x)
        assert out[1] is m.history and out[2]["t"] is m.table and out[2]["p"] is m.pair
        assert m.history == list(range(len(m.history))) and torch.equal(m.table["last"], x * 2)


_LOG: list = []


def returns_global(x):
    _LOG.append(1)
    return _LOG


def test_a_global_list_returned_is_that_list():
    jf = thunder_rs.jit(returns_global)
    for x in (torch.ones(2), torch.zeros(2)):
        assert jf(x) is _LOG
    assert _LOG == [1, 1]


def reads_box(x, box):
    return x + 1, box.items, box.table


def test_an_argument_s_list_returned_is_that_call_s_list():
    jf = thunder_rs.jit(reads_box)
    for _ in range(2):
        box = types.SimpleNamespace(items=[1, 2], table={"a": 1})
        out = jf(torch.ones(2), box)
        assert out[1] is box.items and out[2] is box.table


class _Last(torch.nn.Module):
    def __init__(self, make):
        super().__init__()
        self.make = make

    def forward(self, x):
        self.last = self.make(x)
        return x * 2, self.last

    def state(self):
        return self.last


MADE_AND_STORED = {
    "namespace": lambda x: types.SimpleNamespace(n=3, log=[1]),
    "list": lambda x: [x * 2, 1],
    "namespace with a tensor": lambda x: types.SimpleNamespace(t=x * 2, log=[1]),
}


@pytest.mark.parametrize("name", list(MADE_AND_STORED))
def test_an_object_made_and_stored_is_the_stored_one_and_new_each_call(name):
    make = MADE_AND_STORED[name]
    _check_like_eager(lambda m: m, lambda: _Last(make))
    m = _Last(make)
    jm = thunder_rs.jit(m)
    first = jm(torch.ones(2))
    assert m.last is first[1]
    second = jm(torch.zeros(2))
    assert m.last is second[1] and second[1] is not first[1]


class _Parts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x), torch.nn.Sequential(self.lin, torch.nn.Identity()), self.lin, self.helper

    def helper(self, y):
        return self.lin(y) * 2


def test_modules_and_methods_are_new_each_call_holding_the_user_s_modules():
    m = _Parts()
    jm = thunder_rs.jit(m)
    x = torch.randn(2, 3)
    eager = (m(x), m(x))
    first, second = jm(x), jm(x)
    for a, b in ((eager[0], eager[1]), (first, second)):
        assert a[1] is not b[1] and a[1][1] is not b[1][1] and a[3] is not b[3]
    for out in (first, second):
        assert out[1][0] is m.lin and out[2] is m.lin and out[3].__self__ is m and out[3].__func__ is _Parts.helper
        assert torch.equal(out[1](x), eager[0][1](x)) and torch.equal(out[3](x), m.helper(x))


_SCALE = 3


def closures(x):
    n = x.shape[0]
    count = [0]

    def step():
        count[0] += n
        return count[0]

    def total():
        return count[0]

    def fact(k):
        return 1 if k <= 1 else k * fact(k - 1)

    def scaled(y, by=n, *, tags=[1]):  # noqa: B006  (eager makes the list anew with every call)
        return y * by * _SCALE

    return x + 1, (lambda y: y * _SCALE), step, total, fact, scaled


def _closures_state(out) -> tuple:
    _, times, step, total, fact, scaled = out
    step()
    tags, held = scaled.__kwdefaults__["tags"], fact.__closure__[0].cell_contents
    return times(2), step(), total(), fact(5), scaled(2), tags, held


def test_a_closure_the_program_makes_is_new_each_call_with_that_call_s_cells():
    seen = []
    for fn in (closures, thunder_rs.jit(closures)):
        first = fn(torch.ones(4))
        second = fn(torch.ones(4))
        state = _closures_state(first), _closures_state(second)
        assert state[0][-1] is first[4] and state[1][-1] is second[4]  # (a function holding itself)
        assert first[2].__closure__[0] is first[3].__closure__[0]  # (one cell in two closures)
        sharing = [a is b for a, b in zip(first[1:], second[1:])] + [state[0][5] is state[1][5]]
        seen.append((state[0][:5], state[1][:5], sharing))
    assert seen[0] == seen[1] and not any(seen[0][2])


def test_a_module_the_program_makes_holding_tensors_is_refused_naming_the_program():
    def makes_buffered(x):
        held = torch.nn.Module()
        held.register_buffer("b", x * 2)
        return x + 1, held

    where = r"makes_buffered \(.*test_returned_identities.py:\d+\).*tensors b"
    with pytest.raises(ThunderNotImplementedError, match=where):
        thunder_rs.jit(makes_buffered)(torch.ones(2))


def replaces_items(x, box):
    old = box.items
    box.items = [9]
    return x + 1, old, box.items


def test_an_argument_s_list_the_program_replaced_is_not_found_again_through_its_path():
    jf = thunder_rs.jit(replaces_items)
    seen = []
    for _ in range(2):
        box = types.SimpleNamespace(items=[1, 2])
        out = jf(torch.ones(2), box)
        assert out[1] == [1, 2] and out[2] is box.items and box.items == [9]
        seen.append(out[1])
    assert seen[0] is not seen[1]


class _StoresHolder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def forward(self, x):
        self.last = types.SimpleNamespace(lin=self.lin, step=self.step)
        return self.lin(x), self.last

    def step(self):
        return self.lin.weight.sum()


def test_an_object_stored_holding_modules_and_methods_holds_the_user_s():
    m = _StoresHolder()
    jm = thunder_rs.jit(m)
    seen = []
    for _ in range(2):
        out = jm(torch.ones(2))
        assert out[1] is m.last and m.last.lin is m.lin and m.last.step.__self__ is m
        assert torch.equal(m.last.step(), m.step())
        seen.append(out[1])
    assert seen[0] is not seen[1] and seen[0].step is not seen[1].step


class _StoresClosures(torch.nn.Module):
    def __init__(self, share: bool):
        super().__init__()
        self.share = share

    def forward(self, x):
        held = types.SimpleNamespace(k=[1])
        self.callback = lambda: held
        return x * 2, (lambda: held) if self.share else self.callback


def test_a_closure_made_and_stored_is_the_stored_one_and_new_each_call():
    m = _StoresClosures(share=False)
    jm = thunder_rs.jit(m)
    first = jm(torch.ones(2))
    assert first[1] is m.callback
    second = jm(torch.ones(2))
    assert second[1] is m.callback and second[1] is not first[1] and second[1]() is not first[1]()


def test_a_closure_variable_shared_with_a_stored_closure_is_refused_naming_the_program():
    m = _StoresClosures(share=True)
    assert m(torch.ones(2))[1]() is m.callback()  # (eager: one variable in both)
    with pytest.raises(ThunderNotImplementedError, match=r"_StoresClosures.forward \(.*\).*also stored"):
        thunder_rs.jit(m)(torch.ones(2))


def test_a_compile_leaves_no_garbage_holding_its_proxies(monkeypatch):
    # Tracing's own reference cycles (torch's pytree flatten keeps its ``is_leaf`` in one) must not
    # hold the traced output: the escape check then takes the proxies for escaped and collects the
    # garbage on every compile (some 0.2 s with transformers loaded: a GPT-2 decode compiled 6x slower).
    import thunder_rs.core.acquisition.escapes as escapes  # noqa: PLC0415

    collected = []
    monkeypatch.setattr(escapes, "gc", types.SimpleNamespace(collect=lambda: collected.append(1)))

    def fn(x):
        h = x.sin()
        return {"logits": h * 2, "hidden": [h, h + 1], "n": x.shape[0]}

    jfn = thunder_rs.jit(fn)
    x = torch.randn(3, 4)
    out = jfn(x)
    _same_values(out["logits"], fn(x)["logits"])
    assert collected == []
