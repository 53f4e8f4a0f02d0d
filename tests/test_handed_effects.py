"""Effects outside the program and reads of files that a C caller makes for it (``map``,
``functools.partial``, ``operator.methodcaller``, ``itertools.starmap``), which the profile hook
does not see: eager makes them on every call where tracing made them once, so each is refused
naming the user's line (``core/state/handed_effects.py``); a file descriptor's reads
(``os.read``) the same, however called. A program that holds a file and does not write it runs as
eager, and what tracing put in place is put back. Clocks and the environment read through
thunder_rs's own ``next`` (a ``map`` or ``iter`` it advances), ``time.clock_gettime``, the
process's times and ``os.environb`` are refused or guarded as ``time.time`` and ``os.environ``
are (``acquisition/stdlib_state.py``)."""

import functools
import itertools
import operator
import os
import re
import socket
import time
from os import write as bound_write

import pytest
import torch

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError

LOG = FD = None  # (the file and the descriptor the cases write, set by the fixture)


@pytest.fixture
def held(tmp_path):
    f = open(tmp_path / "held.txt", "w")  # noqa: SIM115 (held by the program)
    fd = os.open(tmp_path / "fd.bin", os.O_WRONLY | os.O_CREAT)
    global LOG, FD
    LOG, FD = f, fd
    yield f
    f.close()
    os.close(fd)
    assert (tmp_path / "held.txt").read_text() == "" and os.path.getsize(tmp_path / "fd.bin") == 0


def _map_write(x):
    list(map(LOG.write, ["a", "b"]))
    return x + 1


def _partial_write(x):
    functools.partial(LOG.write, "a")()
    return x + 1


def _methodcaller_write(x):
    operator.methodcaller("write", "a")(LOG)
    return x + 1


def _getattr_write(x):
    list(map(getattr(LOG, "write"), ["a"]))
    return x + 1


def _map_os_write(x):
    list(map(os.write, [FD], [b"a"]))
    return x + 1


def _starmap_os_write(x):
    list(itertools.starmap(os.write, [(FD, b"a")]))
    return x + 1


def _bound_os_write(x):
    list(map(bound_write, [FD], [b"a"]))  # (``from os import write``)
    return x + 1


_CASES = {
    "map": (_map_write, r"_io.TextIOWrapper.write"),
    "partial": (_partial_write, r"_io.TextIOWrapper.write"),
    "methodcaller": (_methodcaller_write, r"_io.TextIOWrapper.write"),
    "getattr": (_getattr_write, r"_io.TextIOWrapper.write"),
    "map_os_write": (_map_os_write, r"os.write"),
    "starmap_os_write": (_starmap_os_write, r"os.write"),
    "bound_os_write": (_bound_os_write, r"os.write"),
}


@pytest.mark.parametrize("kind", sorted(_CASES))
def test_an_effect_a_c_caller_makes_for_the_program_is_refused_naming_the_line(held, kind):
    fn, what = _CASES[kind]
    line = fn.__code__.co_firstlineno + 1
    jf = thunder_rs.jit(fn)
    for _ in range(2):
        with pytest.raises(
            ThunderNotImplementedError, match=rf"{what}: the program calls it at .*test_handed_effects.py:{line}"
        ):
            jf(torch.ones(3))


def test_one_bound_before_tracing_or_held_by_a_partial_or_passed_in_is_refused(held):
    emit, send = held.write, functools.partial(os.write, FD, b"a")

    def bound(x):
        list(map(emit, ["a"]))
        return x + 1

    def partial_held(x):
        send()
        return x + 1

    def passed_in(x, f):
        list(map(f.write, ["a"]))
        return x + 1

    for fn, what, args in (
        (bound, "_io.TextIOWrapper.write", ()),
        (partial_held, "os.write", ()),
        (passed_in, "_io.TextIOWrapper.write", (held,)),
    ):
        line = fn.__code__.co_firstlineno + 1
        with pytest.raises(
            ThunderNotImplementedError, match=rf"{what}: the program calls it at .*test_handed_effects.py:{line}"
        ):
            thunder_rs.jit(fn)(torch.ones(3), *args)


@pytest.mark.parametrize("how", ["direct", "map", "pread", "lseek"])
def test_a_file_descriptor_read_is_refused_naming_the_line(how):
    r, w = os.pipe()
    os.write(w, b"123456")
    cases = {
        "direct": lambda x: x * int(os.read(r, 1)),
        "map": lambda x: x * int(next(map(os.read, [r], [1]))),
        "pread": lambda x: x * len(os.pread(r, 1, 0)),
        "lseek": lambda x: x * os.lseek(r, 0, os.SEEK_CUR),
    }
    fn = cases[how]
    try:
        jf = thunder_rs.jit(fn)
        for _ in range(2):
            with pytest.raises(
                ThunderNotImplementedError,
                match=r"os\.(read|pread|lseek): the program reads a file descriptor at .*test_handed_effects.py:",
            ):
                jf(torch.ones(3))
        assert os.read(r, 6) == b"123456"  # (refused before it read)
    finally:
        os.close(r)
        os.close(w)


def test_a_held_file_the_program_does_not_write_runs_as_eager_and_is_put_back(held):
    real_write = os.write

    def fn(x, verbose=False):
        if verbose:
            list(map(held.write, ["a"]))
        return x * len(held.mode)

    jf = thunder_rs.jit(fn)
    for _ in range(3):
        torch.testing.assert_close(jf(torch.ones(3)), fn(torch.ones(3)), rtol=0, atol=0)
    assert thunder_rs.compile_stats(jf).miss_reasons == ["first call"]
    assert "write" not in vars(held) and os.write is real_write
    list(map(held.write, []))  # (eager code outside the program is left alone)


def test_a_socket_send_handed_to_map_is_refused_and_sends_nothing():
    a, b = socket.socketpair()

    def fn(x):
        list(map(a.send, [b"x"]))
        return x + 1

    try:
        refused = r"socket.socket.send: the program calls it at .*test_handed_effects.py:"
        with pytest.raises(ThunderNotImplementedError, match=refused):
            thunder_rs.jit(fn)(torch.ones(2))
        b.setblocking(False)
        with pytest.raises(BlockingIOError):
            b.recv(1)
        assert "send" not in vars(socket.socket)  # (put back after tracing)
    finally:
        a.close()
        b.close()


# -- reads through a C caller, and the other clocks ------------------------------------------------


@pytest.mark.parametrize("how", ["iter_perf_counter", "clock_gettime", "clock_gettime_ns", "os_times", "getrusage"])
def test_a_clock_read_through_next_or_the_other_clocks_are_refused_naming_the_line(how):
    # Each was read once while traced: every compiled call computed with that reading.
    resource = pytest.importorskip("resource") if how == "getrusage" else None
    cases = {
        "iter_perf_counter": (lambda x: x * (next(iter(time.perf_counter, None)) % 1), "time.perf_counter"),
        "clock_gettime": (lambda x: x * (time.clock_gettime(time.CLOCK_MONOTONIC) % 1), "time.clock_gettime"),
        "clock_gettime_ns": (lambda x: x * (time.clock_gettime_ns(time.CLOCK_MONOTONIC) % 7), "time.clock_gettime_ns"),
        "os_times": (lambda x: x * (os.times().user % 1), "os.times"),
        "getrusage": (lambda x: x * (resource.getrusage(resource.RUSAGE_SELF).ru_utime % 1), "resource.getrusage"),
    }
    fn, what = cases[how]
    jf = thunder_rs.jit(fn)
    for _ in range(2):
        with pytest.raises(
            ThunderNotImplementedError, match=rf"{what}: the program reads the clock at .*test_handed_effects.py:"
        ):
            jf(torch.ones(2))
    assert os.times is _OS_TIMES and time.perf_counter is _PERF_COUNTER  # put back after tracing


_OS_TIMES, _PERF_COUNTER = os.times, time.perf_counter
_VAR = "THUNDER_RS_TEST_HANDED_SCALE"


@pytest.mark.parametrize(
    "program",
    [
        lambda x: x * float(next(map(os.environ.get, [_VAR]))),
        lambda x: x * float(os.environb[_VAR.encode()]),
    ],
    ids=["map_of_environ_get", "environb"],
)
def test_the_environment_read_through_next_or_as_bytes_is_guarded(monkeypatch, program):
    # Each read was not guarded: a compiled call computed with the first call's value.
    jf, x = thunder_rs.jit(program), torch.ones(2)
    for value in ("2", "3", "3"):
        monkeypatch.setenv(_VAR, value)
        torch.testing.assert_close(jf(x), program(x), rtol=0, atol=0)
    assert thunder_rs.compile_stats(jf).cache_misses == 2
    misses = thunder_rs.compile_stats(jf).miss_reasons
    assert re.search(r"os.environb?\[b?'THUNDER_RS_TEST_HANDED_SCALE'\] changed from b?'2' to b?'3'", misses[1])
