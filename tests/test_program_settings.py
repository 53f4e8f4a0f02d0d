"""Settings of the process a program makes (``os.environ[name] = value``, ``os.chdir``,
``os.umask``, ``sys.setrecursionlimit``, ``torch.set_num_threads``) are made again by every
compiled call, as eager makes them (``core/acquisition/setters.py``): tracing made them once, and a
setting changed between calls stayed changed. A global the program sets without reading it is
refused, naming the line, and one set through ``globals()`` or the module object, naming it
(``core/state/observe.py``)."""

import os
import sys
import types

import pytest
import torch

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError

_VAR = "THUNDER_RS_TEST_SETTING"


def _sets_the_environment(x):
    os.environ[_VAR] = "on"
    return x + 1


def _deletes_from_the_environment(x):
    del os.environ[_VAR]
    return x + 1


def _changes_directory(x):
    os.chdir(_DIRECTORY[0])
    return x + 1


def _sets_the_umask(x):
    os.umask(0o27)
    return x + 1


def _sets_the_recursion_limit(x):
    sys.setrecursionlimit(4321)
    return x + 1


def _sets_the_threads(x):
    torch.set_num_threads(1)
    return x + 1


_DIRECTORY: list = []


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_CASES = {
    "environ": (_sets_the_environment, lambda: os.environ.pop(_VAR, None), lambda: os.environ.get(_VAR)),
    "environ_del": (_deletes_from_the_environment, lambda: os.environ.update({_VAR: "x"}), lambda: _VAR in os.environ),
    "chdir": (_changes_directory, lambda: os.chdir(os.path.dirname(_DIRECTORY[0])), os.getcwd),
    "umask": (_sets_the_umask, lambda: os.umask(0o22), _umask),
    "recursion_limit": (_sets_the_recursion_limit, lambda: sys.setrecursionlimit(3000), sys.getrecursionlimit),
    "threads": (_sets_the_threads, lambda: torch.set_num_threads(2), torch.get_num_threads),
}


@pytest.mark.parametrize("kind", sorted(_CASES))
def test_a_setting_the_program_makes_is_made_by_every_call_as_eager(kind, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    limit, threads, mask = sys.getrecursionlimit(), torch.get_num_threads(), _umask()
    _DIRECTORY[:] = [str(tmp_path / "inner")]
    os.mkdir(_DIRECTORY[0])
    program, change, read = _CASES[kind]
    try:
        seen = {}
        for name, fn in (("eager", program), ("jit", thunder_rs.jit(program))):
            seen[name] = []
            for _ in range(3):
                change()  # (between calls: eager's next call sets it again)
                torch.testing.assert_close(fn(torch.ones(2)), torch.ones(2) + 1, rtol=0, atol=0)
                seen[name].append(read())
        assert seen["jit"] == seen["eager"]
    finally:
        sys.setrecursionlimit(limit)
        torch.set_num_threads(threads)
        os.umask(mask)
        os.environ.pop(_VAR, None)


def test_the_settings_are_put_back_after_tracing():
    limit = sys.getrecursionlimit()
    thunder_rs.jit(_sets_the_recursion_limit)(torch.ones(2))
    sys.setrecursionlimit(limit)
    setters = (sys.setrecursionlimit, os.chdir, os.umask, os.putenv, torch.set_num_threads)
    assert all(type(f) is types.BuiltinFunctionType for f in setters)
    assert os._Environ.__setitem__.__module__ == os._Environ.__delitem__.__module__ == "os"


COUNT = 0


def _sets_an_unread_global(x):
    global COUNT
    COUNT = 5
    return x + 1


def test_a_global_the_program_sets_without_reading_it_is_refused_naming_the_line():
    # Set once, while traced: a count reset between calls stayed reset.
    line = _sets_an_unread_global.__code__.co_firstlineno + 2
    with pytest.raises(
        ThunderNotImplementedError, match=rf"sets global 'COUNT' of {__name__} at .*test_program_settings.py:{line}"
    ):
        thunder_rs.jit(_sets_an_unread_global)(torch.ones(2))


def _counts_through_globals(x):
    globals()["COUNT"] += 1
    return x + 1


def _counts_through_the_module(x):
    sys.modules[__name__].COUNT += 1
    return x + 1


@pytest.mark.parametrize("program", [_counts_through_globals, _counts_through_the_module], ids=["globals", "module"])
def test_a_global_set_through_globals_or_the_module_object_is_refused(program):
    # Counted once, while traced: eager counts on every call.
    with pytest.raises(
        ThunderNotImplementedError, match=rf"sets global 'COUNT' of {__name__} \(through globals\(\), the module object"
    ):
        thunder_rs.jit(program)(torch.ones(2))
