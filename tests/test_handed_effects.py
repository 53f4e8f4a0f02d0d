"""Effects outside the program and reads of files that a C caller makes for it (``map``,
``functools.partial``, ``operator.methodcaller``, ``itertools.starmap``), which the profile hook
does not see: eager makes them on every call where tracing made them once, so each is refused
naming the user's line (``core/state/handed_effects.py``); a file descriptor's reads
(``os.read``) the same, however called. A program that holds a file and does not write it runs as
eager, and what tracing put in place is put back."""

import functools
import itertools
import operator
import os
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
