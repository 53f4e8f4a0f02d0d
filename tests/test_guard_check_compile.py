"""An entry's per-call guards are compiled into their check when the entry is first checked, not
when it is compiled: entries that serve no later call (a decode's prompt and first token, compiled
on the way to a symbolic entry) never pay for it. The check compiled late is the check compiled
early: state changed between the compile and the first check is still seen."""

import torch

import thunder_rs
from thunder_rs.core.run import entry as entry_module

SCALE = 2.0


def _scaled(x):
    return x * SCALE


def _counting(monkeypatch) -> list:
    compiled: list = []
    real = entry_module.compile_check

    def counted(guards):
        compiled.append(len(guards))
        return real(guards)

    monkeypatch.setattr(entry_module, "compile_check", counted)
    return compiled


def test_an_entry_no_later_call_takes_compiles_no_guard_check(monkeypatch):
    compiled = _counting(monkeypatch)
    jf = thunder_rs.jit(_scaled, dynamic=False)
    for n in (2, 3):
        x = torch.randn(n)
        torch.testing.assert_close(jf(x), _scaled(x))
    assert thunder_rs.compile_stats(jf).cache_misses == 2
    assert compiled == []
    x = torch.randn(3)
    torch.testing.assert_close(jf(x), _scaled(x))
    torch.testing.assert_close(jf(x), _scaled(x))
    assert len(compiled) == 1 and compiled[0] > 0  # compiled once, at the first hit
    assert thunder_rs.compile_stats(jf).cache_hits == 2


def test_state_changed_before_the_first_check_is_seen(monkeypatch):
    jf, x = thunder_rs.jit(_scaled), torch.randn(3)
    torch.testing.assert_close(jf(x), _scaled(x))
    monkeypatch.setitem(globals(), "SCALE", 5.0)
    torch.testing.assert_close(jf(x), _scaled(x))
    assert thunder_rs.compile_stats(jf).cache_misses == 2
    assert "global 'SCALE'" in thunder_rs.compile_stats(jf).miss_reasons[-1]


def _shifted(x, *, shift=0.0):
    return x + shift


def test_keyword_defaults_changed_in_place_before_the_first_check_are_seen():
    saved = dict(_shifted.__kwdefaults__)
    jf, x = thunder_rs.jit(lambda t: _shifted(t) * 2), torch.randn(3)
    try:
        torch.testing.assert_close(jf(x), _shifted(x) * 2)
        _shifted.__kwdefaults__["shift"] = 1.0  # the same dict: the check compiled now must not take it
        torch.testing.assert_close(jf(x), _shifted(x) * 2)
    finally:
        _shifted.__kwdefaults__ = saved
    assert thunder_rs.compile_stats(jf).cache_misses == 2
