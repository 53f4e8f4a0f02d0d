"""What code that is not the program sets while the program is traced is not the program's write
(``core/state/bystanders.py``): a ``gc.callbacks`` function, a ``weakref.finalize`` callback run by
a collection, a signal handler. Its effect happens once, when it runs, as in eager: not undone
after tracing, not repeated by every compiled call, and what it reads and writes is not guarded.
Each test counts the runs of such code apart and checks that the state it counts in says the same."""

import gc
import os
import signal
import threading
import weakref

import pytest
import torch
from torch import nn

import thunder_rs


def _misses(jf) -> list:
    return thunder_rs.compile_stats(jf).miss_reasons


def _SIGNAL_ARRIVES() -> None:  # noqa: N802 (named as the event it is)
    """A signal arriving while the program is traced, sent by another thread: the program's own
    ``os.kill`` is refused (an effect tracing makes once: ``test_c_effects``), and so is one a
    ``partial`` calls for it (``test_handed_effects``)."""
    sender = threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGUSR1))
    sender.start()
    sender.join()


@pytest.fixture
def no_automatic_collections():
    """Only the program's own ``gc.collect()`` collects: none between the calls changes the state."""
    enabled = gc.isenabled()
    gc.disable()
    yield
    if enabled:
        gc.enable()


class _Collects(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3))
        self.collections = 0
        self.freed = 0

    def forward(self, x):
        gc.collect()  # (stands for a collection that any allocation starts while traced)
        return x * self.w


def test_a_gc_callback_counting_on_the_module_keeps_its_counts(no_automatic_collections):
    model = _Collects()
    jm = thunder_rs.jit(model)
    stops: list = []

    def count(phase, info):
        if phase == "stop":
            model.collections += 1
            stops.append(info)

    gc.callbacks.append(count)
    try:
        for _ in range(3):
            x = torch.randn(3)
            torch.testing.assert_close(jm(x), x * model.w, rtol=0, atol=0)
            assert stops and model.collections == len(stops)  # not undone, not set again
    finally:
        gc.callbacks.remove(count)
    assert _misses(jm) == ["first call"]


class _Settings:
    def __init__(self):
        self.scale = 2.0
        self.collections = 0


SETTINGS = _Settings()


def _scaled_then_collects(x):
    y = x * SETTINGS.scale  # SETTINGS is guarded whole from here
    gc.collect()
    return y


def test_a_gc_callback_counting_on_state_the_program_reads_is_not_its_write(no_automatic_collections):
    stops: list = []

    def count(phase, info):
        if phase == "stop":
            SETTINGS.collections += 1
            stops.append(info)

    SETTINGS.collections = 0
    jf = thunder_rs.jit(_scaled_then_collects)
    gc.callbacks.append(count)
    try:
        for _ in range(3):
            x = torch.randn(3)
            torch.testing.assert_close(jf(x), x * 2.0, rtol=0, atol=0)
            assert stops and SETTINGS.collections == len(stops)
    finally:
        gc.callbacks.remove(count)
    assert _misses(jf) == ["first call"]


class _Node:
    pass


def test_a_finalizer_run_by_a_collection_while_traced_keeps_its_write(no_automatic_collections):
    model = _Collects()
    jm = thunder_rs.jit(model)
    finalized: list = []

    def freed():
        model.freed += 1
        finalized.append(1)

    a, b = _Node(), _Node()
    a.other, b.other = b, a  # freed only by a collection
    weakref.finalize(a, freed)
    del a, b
    x = torch.randn(3)
    torch.testing.assert_close(jm(x), x * model.w, rtol=0, atol=0)
    assert finalized == [1] and model.freed == 1  # the collection the program ran freed it
    torch.testing.assert_close(jm(x), x * model.w, rtol=0, atol=0)
    assert model.freed == 1


class _Ticks:
    def __init__(self):
        self.scale = 3.0
        self.ticks = 0


TICKS = _Ticks()


def _signalled(x):
    y = x * TICKS.scale
    _SIGNAL_ARRIVES()
    return y + 1


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="POSIX signals")
def test_a_signal_handler_run_while_traced_is_not_the_program():
    handled: list = []

    def handler(signum, frame):
        TICKS.ticks += 1  # reads and sets state the program reads
        handled.append(signum)

    TICKS.ticks = 0
    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        jf = thunder_rs.jit(_signalled)
        for _ in range(3):
            x = torch.randn(3)
            torch.testing.assert_close(jf(x), x * 3.0 + 1, rtol=0, atol=0)
            assert handled and TICKS.ticks == len(handled)
        assert signal.getsignal(signal.SIGUSR1) is handler  # put back after tracing
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert _misses(jf) == ["first call"]


def _scaled_by_the_count(x):
    y = x * (SETTINGS.collections + 1)  # read before the collection changes it
    gc.collect()
    return y


def test_a_count_the_program_read_before_a_gc_callback_changed_it_is_read_anew(no_automatic_collections):
    def count(phase, info):
        if phase == "stop":
            SETTINGS.collections += 1

    SETTINGS.collections = 0
    jf = thunder_rs.jit(_scaled_by_the_count)
    gc.callbacks.append(count)
    try:
        for _ in range(3):
            x = torch.randn(3)
            expected = x * (SETTINGS.collections + 1)
            torch.testing.assert_close(jf(x), expected, rtol=0, atol=0)
    finally:
        gc.callbacks.remove(count)


class _ScaledByItsCount(_Collects):
    def forward(self, x):
        y = x * (self.collections + 1)  # read before the collection changes it
        gc.collect()
        return y


def test_a_module_count_the_program_read_before_a_gc_callback_changed_it_is_read_anew(no_automatic_collections):
    # It was refused as a change the program made ("M.collections changed from 0 to 1").
    model = _ScaledByItsCount()
    jm = thunder_rs.jit(model)

    def count(phase, info):
        if phase == "stop":
            model.collections += 1

    gc.callbacks.append(count)
    try:
        for _ in range(3):
            x = torch.randn(3)
            expected = x * (model.collections + 1)
            torch.testing.assert_close(jm(x), expected, rtol=0, atol=0)
    finally:
        gc.callbacks.remove(count)


class _Aliases:
    def __init__(self):
        self.names = {"hidden": "hidden_size"}


ALIASES = _Aliases()


class _AliasedConfig:
    """A config whose Python ``__getattribute__`` reads a global object (transformers'
    ``PretrainedConfig`` reads its ``attribute_map`` and, in a mixin, a module's logger)."""

    def __init__(self):
        self.hidden_size, self.width = 3.0, 5.0
        self.handled = 0

    def __getattribute__(self, name):
        return super().__getattribute__(ALIASES.names.get(name, name))


CONFIG = _AliasedConfig()


def _signalled_before_reading_the_config(x):
    _SIGNAL_ARRIVES()  # (before the program reads CONFIG)
    return x * CONFIG.hidden


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="POSIX signals")
def test_a_signal_handler_run_before_a_config_with_a_python_getattribute_is_read():
    # The copy of the program's state taken before the handler ran read CONFIG's ``__dict__``
    # through its ``__getattribute__``, observed as the program's: it added ALIASES while the
    # state objects were iterated ("dictionary changed size during iteration").
    handled: list = []

    def handler(signum, frame):
        CONFIG.handled += 1  # (through its ``__getattribute__``, as a handler reading a config)
        handled.append(signum)

    CONFIG.handled = 0
    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        x = torch.randn(3)
        expected = _signalled_before_reading_the_config(x)
        assert CONFIG.handled == len(handled) == 1
        jf = thunder_rs.jit(_signalled_before_reading_the_config)
        for _ in range(3):
            torch.testing.assert_close(jf(x), expected, rtol=0, atol=0)
            assert CONFIG.handled == len(handled)  # set once per run of the handler, as in eager
        ALIASES.names["hidden"] = "width"  # what the program read through ALIASES is guarded
        torch.testing.assert_close(jf(x), x * 5.0, rtol=0, atol=0)
        assert CONFIG.handled == len(handled)
        assert signal.getsignal(signal.SIGUSR1) is handler
    finally:
        signal.signal(signal.SIGUSR1, previous)
        ALIASES.names["hidden"] = "hidden_size"


class _Style:
    def __init__(self):
        self.tag = "a"


STYLE = _Style()


class _Log(list):
    """A list whose Python ``__copy__`` reads a global object (the program never copies it)."""

    def __copy__(self):
        return _Log(x for x in self if STYLE.tag)


def _collects_or_signalled(x):
    y = x * SETTINGS.scale  # SETTINGS is guarded whole from here
    if SETTINGS.signalled:
        _SIGNAL_ARRIVES()
    else:
        gc.collect()
    return y


@pytest.mark.parametrize("bystander", ["gc callback", "signal handler"])
def test_what_a_bystander_sets_is_kept_without_observing_its_copy(bystander, no_automatic_collections):
    # What the program found is kept with a copy of the bystander's list (``bystanders.fold``): its
    # ``__copy__``, run after the thread was marked inside no more, was observed as the program's and
    # STYLE.tag guarded; each change of it recompiled.
    if bystander == "signal handler" and not hasattr(signal, "SIGUSR1"):
        pytest.skip("POSIX signals")
    runs: list = []

    def logs(*args):
        if bystander == "signal handler" or args[0] == "stop":
            runs.append(1)
            SETTINGS.log = _Log([len(runs)])

    SETTINGS.signalled = bystander == "signal handler"
    if SETTINGS.signalled:
        previous = signal.signal(signal.SIGUSR1, logs)
    else:
        gc.callbacks.append(logs)
    try:
        jf = thunder_rs.jit(_collects_or_signalled)
        for tag in "bcd":
            x = torch.randn(3)
            torch.testing.assert_close(jf(x), x * 2.0, rtol=0, atol=0)
            assert SETTINGS.log == [len(runs)] and type(SETTINGS.log) is _Log
            STYLE.tag = tag
    finally:
        if SETTINGS.signalled:
            signal.signal(signal.SIGUSR1, previous)
        else:
            gc.callbacks.remove(logs)
        for name in ("log", "signalled"):
            vars(SETTINGS).pop(name, None)
        STYLE.tag = "a"
    assert _misses(jf) == ["first call"]
