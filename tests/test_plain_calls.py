"""Calls with non-tensor arguments on the hit path (``call_paths.call_plain``): a positional call
with an int, a float, a bool, None or a list of tensors, and a keyword call, of a function without
a module, key, find and run an entry in one frame, serving the entries, checks, miss reasons and
last-served order that ``call_general`` serves, with eager's values."""

import itertools

import pytest
import torch

import thunder_rs
from thunder_rs.core.run import call_keys, call_paths
from thunder_rs.core.run import jit as jit_module
from thunder_rs.core.run.call_keys import structure_of


def _times(a, n):
    return a * n + 1


def _scaled(a, lr):
    return a * lr


def _gated(a, flag):
    return a * 2 if flag else a - 1


def _masked(a, mask):
    return a * 2 if mask is None else a * mask


def _summed(a, items):
    return a + items[0] * items[1]


def _flagged(a, *, flag):
    return a * 2 if flag else a - 1


_A, _B = torch.randn(4, 4), torch.randn(4, 4)
_CASES = [
    (_times, (_A, 3), {}),
    (_scaled, (_A, 0.5), {}),
    (_gated, (_A, True), {}),
    (_masked, (_A, None), {}),
    (_summed, (_A, [_A, _B]), {}),
    (_flagged, (_A,), {"flag": True}),
]


@pytest.mark.parametrize(("fn", "args", "kwargs"), _CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_a_hit_with_a_non_tensor_argument_runs_in_one_frame(monkeypatch, fn, args, kwargs):
    # (the process's key functions dropped: earlier tests' calls of the same argument types may have
    # spent the structure's ``MAX_NESTINGS``, past which its other nestings take the general path)
    call_keys._forget()
    jfn = thunder_rs.jit(fn)
    assert torch.equal(jfn(*args, **kwargs), fn(*args, **kwargs))
    frames = []
    for name in ("_found", "_run", "call_general"):
        real = getattr(call_paths, name)
        monkeypatch.setattr(call_paths, name, lambda *a, real=real, name=name: frames.append(name) or real(*a))
    monkeypatch.setattr(jit_module.ThunderFunction, "_call_general", call_paths.call_general)
    for _ in range(3):
        assert torch.equal(jfn(*args, **kwargs), fn(*args, **kwargs))
    assert frames == [] and thunder_rs.compile_stats(jfn).cache_hits == 3


def _old_routing(jfn, args, kwargs, structure=None):
    """How ``ThunderFunction.__call__`` handed these calls over before ``call_plain``."""
    return call_paths.call_general(jfn, args, kwargs, None, structure or structure_of(args, kwargs))


def _served(fn, calls, cache=128):
    """Each call's output and the jitted function's stats after it (hits, misses, miss reasons)."""
    jfn, seen = thunder_rs.jit(fn, cache=cache), []
    for args, kwargs in calls:
        out = jfn(*args, **kwargs)
        torch.testing.assert_close(out, fn(*args, **kwargs), rtol=0, atol=0, equal_nan=True)
        stats = thunder_rs.compile_stats(jfn)
        seen.append((out, stats.cache_hits, stats.cache_misses, list(stats.miss_reasons), stats.evictions))
    return seen


def _sequences():
    x, y = torch.randn(3), torch.randn(3)
    steps = [(x, n) for n in (3, 4, 5, 3, 1, 0, -2, 7, 4, 9)]  # symbolic from the second; 0 and 1 their own
    return {
        "int": (_times, [(c, {}) for c in steps]),
        "float": (_scaled, [((x, lr), {}) for lr in (0.5, 0.5, 0.25, 0.125, 0.5, float("nan"), float("nan"), -0.0)]),
        "bool": (_gated, [((x, f), {}) for f in (True, False, True, True, False, 1, 0)]),
        "None": (_masked, [((x, m), {}) for m in (None, y, None, y, 2, None)]),
        "list": (_summed, [((x, items), {}) for items in ([x, y], [y, y], [x, y], [x, x], [x, y, x])]),
        "keyword": (_flagged, [((x,), {"flag": f}) for f in (True, False, True, 2, 2.5, False)]),
    }


@pytest.mark.filterwarnings("ignore:thunder_rs. .* recompiled")
@pytest.mark.parametrize("name", list(_sequences()))
def test_calls_are_served_as_the_general_path_served_them(monkeypatch, name):
    """The same entries serve the same calls (hits, misses and why, as eager computes), changing
    a float, flipping a bool flag, an int made symbolic found by its class, None and a tensor in
    turn, lists of tensors passed again; with a cache of 2 entries, the same evictions."""
    fn, calls = _sequences()[name]
    for cache in (128, 2):
        now = _served(fn, calls, cache)
        with monkeypatch.context() as m:
            m.setattr(jit_module, "call_plain", _old_routing)
            before = _served(fn, calls, cache)
        assert [s[1:] for s in now] == [s[1:] for s in before]
        for a, b in zip(now, before):
            torch.testing.assert_close(a[0], b[0], rtol=0, atol=0, equal_nan=True)


def _picked(a, n):
    return a * n if n % 2 else a - n


def test_the_last_served_symbolic_entry_serves_an_int_of_its_class(monkeypatch):
    """Ints changing every call through two symbolic entries (a value read, ``n % 2``): each call
    is served by the entry it was before, in the same last-served order."""
    x = torch.randn(3)
    calls = [((x, n), {}) for n in itertools.chain(range(2, 12), range(11, 1, -1))]
    now = _served(_picked, calls)
    monkeypatch.setattr(jit_module, "call_plain", _old_routing)
    assert [s[1:] for s in now] == [s[1:] for s in _served(_picked, calls)]
