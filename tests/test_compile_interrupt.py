"""Ctrl-C during a compile: a ``KeyboardInterrupt`` landing in thunder_rs's garbage-collection
callbacks (``core/state/collector.py``), which CPython would report as unraisable and drop, stops
the compile as it stops eager code, and leaves the cache and the observer as they were."""

import gc
import signal

import pytest
import torch

import thunder_rs
from thunder_rs.core.state import collector
from thunder_rs.core.state.observe import thread_state

SCALE = 2.0


@pytest.mark.parametrize("where", ["fold", "snapshot"])
def test_an_interrupt_in_a_collection_callback_stops_the_compile_and_keeps_the_cache(monkeypatch, where):
    global SCALE
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's KeyboardInterrupt here")
    interrupts = []
    real = getattr(collector, where)

    def interrupted(*args):
        if interrupts:  # (one interrupt, where the program collects)
            interrupts.pop()
            signal.raise_signal(signal.SIGINT)
        return real(*args)

    def fn(x):
        gc.collect()
        return x * SCALE

    monkeypatch.setattr(collector, where, interrupted)
    jf = thunder_rs.jit(fn)
    torch.testing.assert_close(jf(torch.ones(3)), fn(torch.ones(3)), rtol=0, atol=0)
    interrupts.append(True)
    with pytest.raises(KeyboardInterrupt):
        jf(torch.ones(4))  # a new compile, interrupted
    assert not interrupts and thread_state.inside == 0
    hits = thunder_rs.cache_hits(jf)
    torch.testing.assert_close(jf(torch.ones(3)), fn(torch.ones(3)), rtol=0, atol=0)
    assert thunder_rs.cache_hits(jf) == hits + 1  # the entry made before is kept
    for scale in (2.0, 3.0):  # compiles again, and guards what it reads
        SCALE = scale
        torch.testing.assert_close(jf(torch.ones(4)), fn(torch.ones(4)), rtol=0, atol=0)
    SCALE = 2.0
