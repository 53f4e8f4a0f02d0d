"""Programs as users write them, round 5, each next to eager over several calls.

What differed: a ``collections.Counter`` passed as an argument (no pytree flattens it) was read
once: a count changed between calls kept the first call's (``x * c["scale"]``: 2 where eager
gave 3), and one the program counted in was refused. So was an ``OrderedDict`` (or ``Counter``)
that an argument object holds; a ``Counter``, ``defaultdict`` or ``OrderedDict`` it held and the
program set items of was refused. They are now read and written as a dict reached from the
arguments is, and a list or dict held in another (``stats["seen"].append(1)``), whose items no
read the observer sees guards, is guarded on its items: the compiled calls kept the items the
first call appended (``reached.ArgumentObjects.item_guards``). A refusal of state the program
changed after reading it ("changed Python state it read") named the function's ``def`` line, where
the read was found in its code, rather than the line that read it (``userframe.read_site``). A
program that raised its own error after ``sys.path.insert(0, p)`` or ``os.environ[k] = v`` left
neither made, where eager leaves both (tracing undid them: ``setters.note_settings_made``). A
random generator held as a default argument (``def f(x, rng=np.random.default_rng(0))``) drew
once, while traced: every compiled call reused that number; it is refused naming the line that
draws, as one in a global or closure is (``generator_states``). A ``WeakKeyDictionary``,
``WeakValueDictionary`` or ``WeakSet`` (a cache keyed by a module) was guarded by identity, so
entries added between calls were not seen; their contents are guarded through the weak references
they hold (``items.members``), and a program writing one is refused naming the line. A list or
dict argument the program changes (``metrics["aux"] = loss``, a ``defaultdict(list)`` of stats
appended to) was refused, since naming the argument and the line; it is now changed as eager
changes it (``test_argument_container_writes``). ``numpy.random.seed(k)``
in a program was always refused ("global 'seed' of numpy.random changed"): the guard on it expected
NumPy's function back, where thunder_rs's wrapper stays (``pydraws._install``). Of the dicts an
argument object holds, keys the program moved (``move_to_end``) kept their old order, and the list a
``defaultdict(list)`` made for a new key (``stats["loss"].append(t)``) was refused as an object no
call would put there again (``reached._changes``). A module looking itself up in a dict by a
method (``CACHE.get(self, 1)``) got the traced copy's answer on every compiled call; it is refused
naming the line, as ``self in CACHE`` is (``identity``)."""

import collections
import copy
import inspect
import os
import random
import sys
import time
import types
import weakref

import numpy
import pytest

import torch

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError


def _counts(x, c):
    c["calls"] += 1
    return x * c["scale"] + c["calls"]


def _check_against_eager(program, make, change) -> tuple:
    """Calls ``program`` jitted and eagerly on equal state three times, ``change`` between calls."""
    jf, state, eager = thunder_rs.jit(program), make(), make()
    for i in range(3):
        x = torch.randn(2)
        torch.testing.assert_close(jf(x, state), program(x, eager), rtol=0, atol=0)
        change(state, i)
        change(eager, i)
    return jf, state, eager


def test_a_counter_argument_is_read_and_counted_in_as_eager():
    def make():
        return collections.Counter(scale=2)

    def change(c, i):
        c["scale"] = 3 + i

    _, state, eager = _check_against_eager(_counts, make, change)
    assert state == eager and state["calls"] == 3


@pytest.mark.parametrize(
    "make",
    [collections.Counter, lambda **kw: collections.defaultdict(int, kw), collections.OrderedDict],
    ids=["Counter", "defaultdict", "OrderedDict"],
)
def test_a_dict_subclass_an_argument_object_holds_is_read_and_counted_in_as_eager(make):
    def program(x, box):
        return _counts(x, box.counts)

    def change(box, i):
        box.counts["scale"] = 3 + i

    _, state, eager = _check_against_eager(
        program, lambda: types.SimpleNamespace(counts=make(scale=2, calls=0)), change
    )
    assert type(state.counts) is type(eager.counts) and dict(state.counts) == dict(eager.counts)


@pytest.mark.parametrize(
    "stats, key",
    [({"seen": []}, "seen"), ([[]], 0), (([],), 0)],
    ids=["list_in_a_dict", "list_in_a_list", "list_in_a_tuple"],
)
def test_a_list_held_in_a_container_of_an_argument_object_grows_on_every_call_as_eager(stats, key):
    # In a dict: the compiled calls kept the first call's list. In a list or a tuple (``[[]]``,
    # compared by value): refused as "changed Python state it read".
    def program(x, box):
        box.stats[key].append(1)
        return x * len(box.stats[key])

    def make():
        return types.SimpleNamespace(stats=copy.deepcopy(stats))

    _, state, eager = _check_against_eager(program, make, lambda box, i: None)
    assert state.stats == eager.stats and len(eager.stats[key]) == 3


def test_tensors_appended_to_a_defaultdict_of_lists_an_argument_object_holds_are_kept_as_eager():
    # Refused: the list the defaultdict made for a new key was "an object" no call would put there again.
    def program(x, box):
        box.stats["loss"].append(x.sum().detach())
        return x * len(box.stats["loss"])

    jf = thunder_rs.jit(program)
    state, eager = (types.SimpleNamespace(stats=collections.defaultdict(list)) for _ in range(2))
    for i in range(3):
        x = torch.arange(3.0) + i
        torch.testing.assert_close(jf(x, state), program(x, eager), rtol=0, atol=0)
    assert state.stats.keys() == eager.stats.keys() and len(state.stats["loss"]) == 3
    torch.testing.assert_close(state.stats["loss"], eager.stats["loss"], rtol=0, atol=0)


def test_keys_moved_in_an_ordered_dict_an_argument_object_holds_keep_eagers_order():
    # The compiled calls set the items alone, keeping the dict's old order (a most-recently-used order).
    def program(x, box):
        box.order[f"k{len(box.order)}"] = 1
        box.order.move_to_end(next(iter(box.order)))
        return x * len(box.order)

    _, state, eager = _check_against_eager(
        program, lambda: types.SimpleNamespace(order=collections.OrderedDict()), lambda box, i: None
    )
    assert list(state.order) == list(eager.order) == ["k0", "k2", "k1"]


SEEN: set = set()


class _Tags(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.seen: set = set()

    def forward(self, x):
        y = x + 1
        self.seen.add(len(self.seen))  # reads self.seen
        return y


def _tags_globally(x):
    y = x + 1
    SEEN.add(len(SEEN))  # reads SEEN
    return y


def _tags_in_a_closure():
    seen: set = set()

    def program(x):
        y = x + 1
        seen.add(len(seen))  # reads seen
        return y

    return program


def _line_of(fn, marker: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if marker in line)


@pytest.mark.parametrize(
    "program, code",
    [(_Tags(), _Tags.forward), (_tags_globally, _tags_globally), (_tags_in_a_closure(), _tags_in_a_closure)],
    ids=["module_attribute", "global", "closure"],
)
def test_a_refusal_of_changed_state_names_the_line_that_read_it(program, code):
    # Named the function's first line (its def), which reads nothing.
    line = _line_of(code, "# reads")
    with pytest.raises(ThunderNotImplementedError, match=rf"changed Python state it read: .*round5\.py:{line}\)"):
        thunder_rs.jit(program)(torch.ones(2))
    SEEN.clear()


_ENTRY = "/nonexistent/thunder_rs_round5"


def _extends_the_path_then_raises(x, limit=3):
    sys.path.insert(0, _ENTRY)
    os.environ["THUNDER_RS_ROUND5"] = str(x.shape[0])
    if x.shape[0] >= limit:
        raise ValueError("too long")
    return x + 1


def _settings() -> tuple:
    return sys.path.count(_ENTRY), sys.path[0], os.environ.get("THUNDER_RS_ROUND5")


@pytest.mark.parametrize("keyword", [False, True], ids=["positional", "keyword"])
def test_settings_a_program_made_before_its_own_error_stay_made_as_eager(keyword):
    # Tracing undid them: eager's sys.path kept the entry the program inserted before raising.
    path, seen = list(sys.path), {}
    try:
        for name, fn in (
            ("eager", _extends_the_path_then_raises),
            ("jit", thunder_rs.jit(_extends_the_path_then_raises)),
        ):
            sys.path[:] = path
            os.environ.pop("THUNDER_RS_ROUND5", None)
            seen[name] = []
            for n in (2, 4, 5):  # (the second call compiles with symbolic sizes first, then static)
                try:
                    fn(torch.ones(n), limit=3) if keyword else fn(torch.ones(n))
                    seen[name].append(("returned", *_settings()))
                except ValueError as e:
                    seen[name].append((str(e), *_settings()))
        assert seen["jit"] == seen["eager"]
        assert seen["eager"][-1] == ("too long", 3, _ENTRY, "5")
    finally:
        sys.path[:] = path
        os.environ.pop("THUNDER_RS_ROUND5", None)


def _extends_the_path_then_is_refused(x):
    sys.path.insert(0, _ENTRY)
    return x * time.perf_counter()  # (a clock read while traced: refused)


def test_settings_of_a_call_thunder_rs_refuses_are_undone():
    # A refusal is thunder_rs's, not the program's: the call was not made, and leaves no setting.
    path = list(sys.path)
    try:
        with pytest.raises(ThunderNotImplementedError):
            thunder_rs.jit(_extends_the_path_then_is_refused)(torch.ones(2))
        assert sys.path == path
    finally:
        sys.path[:] = path


def _draws_from_a_default_generator(kind: str):
    make = {
        "numpy_generator": lambda: numpy.random.default_rng(0),
        "numpy_random_state": lambda: numpy.random.RandomState(0),
        "random_Random": lambda: random.Random(0),
    }[kind]

    def program(x, rng=make()):
        return x * float(rng.random())  # draws

    return program


@pytest.mark.parametrize("kind", ["numpy_generator", "numpy_random_state", "random_Random"])
def test_a_generator_held_as_a_default_argument_is_refused_naming_the_line(kind):
    # Tracing drew once and every compiled call reused that number (eager draws anew each call).
    program, rng = _draws_from_a_default_generator(kind), _draws_from_a_default_generator(kind).__defaults__[0]
    first = float(rng.random())  # (what a generator seeded as the program's draws first)
    rng = program.__defaults__[0]
    line = _line_of(_draws_from_a_default_generator, "# draws")
    with pytest.raises(ThunderNotImplementedError, match=rf"default argument 'rng' of .* read at .*round5\.py:{line},"):
        thunder_rs.jit(program)(torch.ones(2))
    assert float(rng.random()) == first  # (set back as it was)


class _Owner:
    pass


OWNER = _Owner()
SCALES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
MEMBERS: weakref.WeakSet = weakref.WeakSet()


def _reads_weak_containers(x):
    return x * SCALES.get(OWNER, 1) + len(MEMBERS)


class _Memo(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.memo: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self.kept = _Owner()

    def forward(self, x):
        return x * (2 if self.memo.get("kept") is not None else 1)


def test_weak_containers_changed_between_calls_are_read_as_eager():
    # Guarded by identity: every call computed with what the first call found in them.
    jf, memo = thunder_rs.jit(_reads_weak_containers), _Memo()
    jmemo = thunder_rs.jit(memo)
    try:
        for i in range(3):
            x = torch.randn(2)
            torch.testing.assert_close(jf(x), _reads_weak_containers(x), rtol=0, atol=0)
            torch.testing.assert_close(jmemo(x), memo(x), rtol=0, atol=0)
            SCALES[OWNER] = i + 2
            MEMBERS.add(OWNER) if i == 0 else MEMBERS.discard(OWNER)
            memo.memo["kept"] = memo.kept
    finally:
        SCALES.clear()
        MEMBERS.clear()


def test_a_weak_dict_an_argument_object_holds_is_read_as_eager():
    # Followed as an object of the arguments (its attributes), its contents were not guarded.
    def program(x, box):
        return x * box.scales.get(box, 1)

    def change(box, i):
        box.scales[box] = i + 2

    def make():
        box = _Owner()  # (a SimpleNamespace takes no weak reference)
        box.scales = weakref.WeakKeyDictionary()
        return box

    _check_against_eager(program, make, change)


def _counts_in_a_weak_dict(x):
    SCALES[OWNER] = SCALES.get(OWNER, 0) + 1  # writes
    return x * SCALES[OWNER]


def test_a_weak_dict_the_program_writes_is_refused_naming_the_line():
    line = _line_of(_counts_in_a_weak_dict, "# writes")
    try:
        with pytest.raises(ThunderNotImplementedError, match=rf"contents of global 'SCALES'.*round5\.py:{line}\)"):
            thunder_rs.jit(_counts_in_a_weak_dict)(torch.ones(2))
    finally:
        SCALES.clear()


def _seeds_numpy(x, seed):
    numpy.random.seed(seed)  # (looked up on numpy.random on each call)
    return x * 2


def test_numpy_seeded_inside_a_program_by_module_lookup_is_seeded_by_every_call_as_eager():
    # Refused: the guard on numpy.random.seed expected NumPy's own function back, where thunder_rs's
    # wrapper stays ("global 'seed' of numpy.random changed from <cython_function_or_method ...>").
    seen = {}
    for name, fn in (("eager", _seeds_numpy), ("jit", thunder_rs.jit(_seeds_numpy))):
        seen[name] = []
        for seed in (1, 2, 1):
            torch.testing.assert_close(fn(torch.ones(2), seed), torch.full((2,), 2.0), rtol=0, atol=0)
            seen[name].append(numpy.random.random())
    assert seen["jit"] == seen["eager"]


SCALES_BY_MODULE: dict = {}


class _ScaledByItself(torch.nn.Module):
    def forward(self, x):
        return x * SCALES_BY_MODULE.get(self, 1)  # looks itself up


def test_a_module_looking_itself_up_in_a_dict_by_a_method_is_refused_naming_the_line():
    # The traced copy of the module looked itself up: 1 on every compiled call, eager 2 then 3.
    line = _line_of(_ScaledByItself, "# looks itself up")
    with pytest.raises(ThunderNotImplementedError, match=rf"SCALES_BY_MODULE.get\(self, ...\).*round5\.py:{line} "):
        thunder_rs.jit(_ScaledByItself())(torch.ones(2))
