"""The Python containers a program changed before its trace failed, next to what eager leaves.

What differed: a program refused after tracing for changing in place state it read (a global
``deque``, ``set``, list subclass or ``bytearray`` appended to, a list in a global tuple) left the
change made, though the refused call was not made (a refusal of thunder_rs's leaves none, as a
refusal midway leaves the lists and dicts it wrote); a program raising its own error after
appending to a global list or counting in a dict (of lasting state, of an argument object, or
passed as an argument) left none of that, where eager, raising there, leaves it made. A change
holding a tensor the trace computed cannot be made: the error then says so
(``core.acquisition.failed_state``).
"""

import collections
import types

import pytest

import torch

import thunder_rs
from thunder_rs.errors import ThunderError

DONE: collections.deque = collections.deque()
SEEN: set = set()
HISTORY: tuple = ([],)
CACHE: dict = {}
CALLS: list = []


class _Log(list):
    pass


LOG = _Log()


@pytest.mark.parametrize(
    "change, state",
    [
        (lambda x: DONE.append(1), DONE),
        (lambda x: SEEN.add("k"), SEEN),
        (lambda x: LOG.append(1), LOG),
        (lambda x: HISTORY[0].append(1), HISTORY[0]),
    ],
    ids=["deque", "set", "list_subclass", "list_in_a_tuple"],
)
def test_a_refused_change_of_state_read_leaves_it_and_the_caches_written_as_before_the_call(change, state):
    # The refused change stayed made (``deque([1])``, ``{'k'}``, ``[1]``), where the call was not made.
    def program(x):
        CALLS.append(len(CALLS))
        CACHE[x.shape[0]] = x * 2
        change(x)
        return x + 1

    try:
        with pytest.raises(ThunderError, match="changed Python state it read"):
            thunder_rs.jit(program)(torch.ones(2))
        assert len(state) == 0 and CACHE == {} and CALLS == []
        # Eager, run after the refusal, makes each change once.
        torch.testing.assert_close(program(torch.ones(2)), torch.full((2,), 2.0), rtol=0, atol=0)
        assert len(state) == 1 and list(CACHE) == [2] and CALLS == [0]
    finally:
        state.clear()
        CACHE.clear()
        CALLS.clear()


def _counts_then_raises(x, box, stats, seen):
    CALLS.append("called")
    CACHE["n"] = CACHE.get("n", 0) + 1
    box.calls.append(1)
    stats["calls"] = stats.get("calls", 0) + 1
    seen.append("x")
    if x.shape[0] > 1:
        raise ValueError("too long")
    return x


def test_the_programs_own_error_leaves_what_it_changed_before_made_as_eager():
    # Tracing undid the changes: CALLS, CACHE, box.calls, stats and seen were left as before the call.
    leaves = {}
    for name, fn in (("jit", thunder_rs.jit(_counts_then_raises)), ("eager", _counts_then_raises)):
        box, stats, seen = types.SimpleNamespace(calls=[]), {}, ["a"]
        try:
            for _ in range(2):
                with pytest.raises(ValueError, match="too long"):
                    fn(torch.ones(2), box, stats, seen)
            leaves[name] = (list(CALLS), dict(CACHE), box.calls, stats, seen)
        finally:
            CALLS.clear()
            CACHE.clear()
    assert leaves["jit"] == leaves["eager"]
    assert leaves["eager"] == (["called"] * 2, {"n": 2}, [1, 1], {"calls": 2}, ["a", "x", "x"])


def _keeps_a_loss_then_raises(x, metrics):
    CALLS.append(1)
    metrics["loss"] = x.sum()
    raise ValueError("after the loss")


def test_a_change_holding_a_traced_tensor_before_the_programs_error_is_named_on_the_error():
    # Left as before the call without a word.
    metrics = {}
    try:
        with pytest.raises(ValueError, match="after the loss") as raised:
            thunder_rs.jit(_keeps_a_loss_then_raises)(torch.ones(2), metrics)
        assert CALLS == [1] and metrics == {}
        assert "the dict metrics before this error with values of the trace" in "".join(raised.value.__notes__)
    finally:
        CALLS.clear()


class _Counting(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.steps, self.history, self.config = 0, [], types.SimpleNamespace(seen=0)

    def forward(self, x):
        self.steps += 1
        self.history.append(self.steps)
        self.config.seen = self.steps
        if x.shape[0] > 1:
            raise ValueError("too long")
        return x


def test_attributes_a_module_set_before_its_own_error_stay_set_with_its_lists_as_eager():
    # The list appended to was, the attributes set were not: steps 0 beside history [1].
    found = {}
    for name in ("jit", "eager"):
        model = _Counting()
        fn = thunder_rs.jit(model) if name == "jit" else model
        for _ in range(2):
            with pytest.raises(ValueError, match="too long"):
                fn(torch.ones(2))
        found[name] = (model.steps, model.history, model.config.seen)
    assert found["jit"] == found["eager"] == (2, [1, 2], 2)
