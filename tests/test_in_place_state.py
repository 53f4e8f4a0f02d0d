"""Containers other than lists and dicts that a program reads or changes in place: a global
``bytearray`` or ``array.array`` changed between calls recompiles, as a global list does, and one
the program appends to is refused (``core/state/items.py``); a set, a buffer or a subclass of
list or dict reached from the arguments that the program changes is refused, naming it, and put
back (``core/state/reached.py``): tracing changed it once where eager changes it on every call. (A
``Counter`` is counted as eager: ``test_user_programs_round5``.)"""

import array
import collections
import types

import pytest
import torch

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError

BUFFER = bytearray(b"\x02")
DOUBLES = array.array("d", [2.0])


def _by_buffer(x):
    return x * BUFFER[-1] + len(BUFFER)


def _by_doubles(x):
    return x * DOUBLES[-1] + len(DOUBLES)


@pytest.mark.parametrize("program, grow", [(_by_buffer, BUFFER), (_by_doubles, DOUBLES)], ids=["bytearray", "array"])
def test_a_global_buffer_changed_between_calls_recompiles_as_eager(program, grow):
    # Guarded by identity: every call computed with the first call's contents.
    jf, x = thunder_rs.jit(program), torch.ones(2)
    for i in range(3):
        torch.testing.assert_close(jf(x), program(x), rtol=0, atol=0)
        grow.append(3 + i)
    assert thunder_rs.compile_stats(jf).miss_reasons[1].startswith("the contents of global")
    del grow[1:]


def test_a_global_buffer_the_program_appends_to_is_refused():
    def fn(x):
        BUFFER.append(1)
        return x * len(BUFFER)

    refused = r"changed Python state it read: the contents of global 'BUFFER'"
    with pytest.raises(ThunderNotImplementedError, match=refused):
        thunder_rs.jit(fn)(torch.ones(2))
    del BUFFER[1:]


_CHANGES = {
    "set": (set, lambda s: s.add(len(s)), "the set s"),
    "set_by_map": (set, lambda s: list(map(s.add, [len(s)])), "the set s"),
    "bytearray": (bytearray, lambda s: s.append(1), "the bytearray s"),
    "array": (lambda: array.array("d"), lambda s: s.append(1.0), "the array s"),
    "list_subclass": (type("Steps", (list,), {}), lambda s: s.append(1), "the Steps s"),
    "set_in_a_tuple": (lambda: (set(),), lambda s: s[0].add(1), r"the set s\[0\]"),
    "set_of_an_object": (lambda: types.SimpleNamespace(seen=set()), lambda s: s.seen.add(1), r"the set s.seen"),
}


@pytest.mark.parametrize("kind", sorted(_CHANGES))
def test_a_container_reached_from_the_arguments_changed_in_place_is_refused_and_put_back(kind):
    make, change, what = _CHANGES[kind]

    def fn(x, s):
        change(s)
        return x + 1

    state = make()
    before = repr(state)
    jf = thunder_rs.jit(fn)
    for _ in range(2):
        with pytest.raises(ThunderNotImplementedError, match=rf"changed {what} in place, which it reached through"):
            jf(torch.ones(2), state)
    assert repr(state) == before


def test_a_set_and_a_counter_read_from_the_arguments_run_as_eager():
    def fn(x, seen, counts):
        return x * len(seen) + counts["a"]

    jf, seen, counts = thunder_rs.jit(fn), {1, 2}, collections.Counter("aa")
    for _ in range(3):
        torch.testing.assert_close(jf(torch.ones(2), seen, counts), fn(torch.ones(2), seen, counts), rtol=0, atol=0)
    assert thunder_rs.compile_stats(jf).cache_misses == 1
