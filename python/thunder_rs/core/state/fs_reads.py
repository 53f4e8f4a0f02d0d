"""What a traced program reads of the file system besides files' contents: guarded.

``os.path.exists``, ``isfile``, ``getsize``, ``getmtime``, ``pathlib.Path.exists``, ``glob.glob``
and ``os.walk`` read the file system through ``os.stat``, ``os.lstat``, ``os.listdir`` and
``os.scandir``; a program also reads ``os.getcwd()`` and ``os.access``. Tracing read them once, and
a compiled call would reuse what they gave (a checkpoint's existence, a directory's files). While
some program is traced, these are stand-ins in ``os`` (``put_fs_readers``): called by program code
(directly or through the standard library for it) each adds a guard on what it returned, read
again before every call (``os.stat`` on its metadata but the access time, which reading a file
changes; ``os.scandir`` on the names ``os.listdir`` gives), so a change recompiles. Called by
other code, or outside tracing, they call through. (The files the program opens are guarded by
``acquisition.file_reads``.)
"""

import functools
import os
import sys
from typing import Any

from thunder_rs.core.state.guards import StateGuard
from thunder_rs.core.state.handed_effects import program_calling
from thunder_rs.core.state.hook import thread_state

_stat, _lstat, _listdir, _scandir = os.stat, os.lstat, os.listdir, os.scandir
_getcwd, _access = os.getcwd, os.access


def _metadata(result):
    """What a guard compares of an ``os.stat_result``: all but the access time."""
    return (
        result.st_mode,
        result.st_ino,
        result.st_dev,
        result.st_nlink,
        result.st_size,
        result.st_mtime_ns,
        result.st_ctime_ns,
    )


def _reading(read):
    """``read(*args, **kwargs)``, or what it raised (a missing file: ``FileNotFoundError``)."""

    def value(*args, **kwargs):
        try:
            return read(*args, **kwargs)
        except OSError as e:
            return (type(e).__name__, e.errno)

    return value


_READS = {
    "stat": _reading(lambda *a, **k: _metadata(_stat(*a, **k))),
    "lstat": _reading(lambda *a, **k: _metadata(_lstat(*a, **k))),
    "listdir": _reading(lambda *a, **k: tuple(_listdir(*a, **k))),
    "scandir": _reading(lambda *a, **k: tuple(_listdir(*a, **k))),
    "getcwd": _reading(_getcwd),
    "access": _reading(_access),
}
_REAL: dict[str, Any] = {
    "stat": _stat,
    "lstat": _lstat,
    "listdir": _listdir,
    "scandir": _scandir,
    "getcwd": _getcwd,
    "access": _access,
}


def _guard(name: str, args: tuple, kwargs: dict, frame) -> None:
    observer = thread_state.observer
    if observer is None or program_calling(frame) is None:
        return
    shown = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
    read = functools.partial(_READS[name], *args, **kwargs)
    observer.guard_state(StateGuard(f"os.{name}({shown})", read, read()))


def _reader(name: str):
    real = _REAL[name]

    @functools.wraps(real)
    def read(*args, **kwargs):
        _guard(name, args, kwargs, sys._getframe(1))
        return real(*args, **kwargs)

    return read


_STAND_INS = {name: _reader(name) for name in _REAL}


def put_fs_readers() -> None:
    for name, stand_in in _STAND_INS.items():
        setattr(os, name, stand_in)


def put_back_fs_readers() -> None:
    for name, real in _REAL.items():
        setattr(os, name, real)
