"""Code that runs while a program is traced but is not the program: what the garbage collector runs
(``gc.callbacks``, ``__del__``, ``weakref.finalize``; ``core/state/collector.py``) is neither
guarded nor recorded, and reads of the wall clock and of the system's entropy (``datetime``,
``os.urandom`` and what draws on it: ``uuid.uuid4``, ``secrets``, ``random.SystemRandom``) made by
the program are refused naming its line, as ``time.time()`` is (``core/acquisition/stdlib_state.py``)."""

import gc
import weakref

import pytest
import torch

import thunder_rs

_seen: list = []


def _misses(jf) -> list:
    return thunder_rs.compile_stats(jf).miss_reasons


def _note_phase(phase, info):
    _seen.append(phase)


class _Noted:
    def __del__(self):
        _seen.append("del")


def _garbage_with_a_finalizer():
    """Cyclic garbage, freed only by a collection: a ``__del__`` and a ``weakref.finalize``."""
    a, b = _Noted(), _Noted()
    a.other, b.other = b, a
    weakref.finalize(b, _seen.append, "finalize")


def _collects(x):
    gc.collect()  # (stands for a collection started by any allocation while traced)
    return x * 2


@pytest.fixture
def collector_callback():
    gc.callbacks.append(_note_phase)
    yield
    gc.callbacks.remove(_note_phase)


def test_a_gc_callback_run_while_traced_is_not_the_programs(collector_callback):
    jf = thunder_rs.jit(_collects)
    x = torch.randn(4)
    for _ in range(3):
        assert torch.equal(jf(x), _collects(x))
    assert _misses(jf) == ["first call"]
    assert "start" in _seen and "stop" in _seen


def test_finalizers_and_del_run_by_the_collector_while_traced_are_not_the_programs():
    jf = thunder_rs.jit(_collects)
    x = torch.randn(4)
    for _ in range(3):
        _garbage_with_a_finalizer()
        assert torch.equal(jf(x), _collects(x))
    assert _misses(jf) == ["first call"]
    assert "del" in _seen and "finalize" in _seen
