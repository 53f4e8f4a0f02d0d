"""Process settings a traced program sets: made again by every call, as eager makes them.

``os.environ[name] = value`` (and ``del``, ``update``, ``pop``: ``os._Environ``'s ``__setitem__``
and ``__delitem__``), ``os.putenv``/``os.unsetenv``, ``os.chdir``, ``os.umask``,
``sys.setrecursionlimit``, ``sys.setswitchinterval`` and ``torch.set_num_threads`` called by
program code while it is traced are made then (what follows in the program sees them), undone
once tracing ends and recorded among its effects (``effects.recorded_effects``): every compiled
call makes them again, the first one too, in order with its prints and logging, so a setting
changed between calls is set again as eager sets it (as the attributes it sets are). Their
arguments must be plain values (a setting computed from a traced tensor is refused, naming the
line). The stand-ins are in place only while some program is traced (``stdlib_state``'s
``consuming_iterators``), and call through for other code. A program that raises its own error
while traced leaves the settings it made before made, as eager does (``note_settings_made``); a
call thunder_rs refuses leaves none.
"""

import functools
import os
import sys

import torch

from thunder_rs.core.acquisition.effects import recorded_effects
from thunder_rs.core.state.guards import is_simple
from thunder_rs.core.state.handed_effects import program_calling
from thunder_rs.errors import ThunderError, ThunderNotImplementedError, note_made_again


class SetterCall:
    """One setting the program made, made again after every call."""

    __slots__ = ("function", "args", "kwargs")

    def __init__(self, function, args: tuple, kwargs: dict | None = None):
        self.function, self.args, self.kwargs = function, args, kwargs or {}

    def effect(self, extras: list):
        return self

    def apply(self, extras, flat) -> None:
        self.function(*self.args, **self.kwargs)


def program_of(frame):
    """The program's frame that made the call ``frame`` runs for, if it is being traced."""
    found = program_calling(frame) if recorded_effects() is not None else None
    return None if found is None else found[1]


#: what undoes each setting made while traced, in order (``put_back_setters`` runs them backwards)
_undo: list = []
#: guards (``guards.StateGuard``) of state the program read after it made a setting while traced:
#: what each expects is read again once the settings are undone (``put_back_setters``)
_settled: list = []


def settle_later(guard) -> None:
    """Where the program read ``guard``'s state after making a setting (``os.environ[k] = v`` then
    ``os.environ[k]``, ``log.setLevel`` then ``log.info``), what it read is the program's own doing:
    the guard expects what the state is once the settings are undone, as the tracing found it (the
    program, given that, makes the same settings and reads the same)."""
    if _undo:
        _settled.append(guard)


def record_setting(label: str, function, args: tuple, frame, undo, kwargs=None, plain=is_simple) -> None:
    """Records the setting ``function(*args, **kwargs)`` the program made (the call ``frame``
    runs for), which ``undo`` undoes once tracing ends: every compiled call makes it again. Its
    arguments must be ``plain`` (a number or a string), else it is refused naming the line."""
    program = program_of(frame)
    if program is None:
        return
    _undo.append(undo)
    if not all(map(plain, (*args, *(kwargs or {}).values()))):
        raise ThunderNotImplementedError(
            f"{label}: the program sets it at {program.f_code.co_filename}:{program.f_lineno} from a value that is not "
            "a plain number or string (a traced tensor), which a compiled call cannot set again with later values. "
            "Set it outside the jitted function"
        )
    recorded = recorded_effects()
    if recorded is not None:
        recorded.append(SetterCall(function, args, kwargs))


def note_settings_made(error: BaseException, effects: list) -> None:
    """Notes on ``error``, raised by the program while traced (not a refusal of thunder_rs's), the
    settings it made before (``effects``: what the trace recorded), which tracing undoes: where
    the error leaves the jit, ``errors.settings_made_again`` makes them again, as eager leaves them
    (``sys.path.insert(0, p)`` before the program's ``raise``). A refusal leaves none: the call
    was not made."""
    made = [e for e in effects if type(e) is SetterCall]
    if made and not isinstance(error, ThunderError) and isinstance(getattr(error, "__dict__", None), dict):
        note_made_again(error, functools.partial(_make_again, made))


def _make_again(made: list) -> None:
    for call in made:
        call.apply(None, None)


def _setter(label: str, real, before):
    """A stand-in for ``real``; ``before(*args)`` is what undoes its call, taken before it."""

    def set_again(*args):
        frame = sys._getframe(1)
        # (``os.environ[k] = v`` calls ``putenv``: recorded as itself)
        if frame.f_code in _ENVIRON_WRITES or program_of(frame) is None:
            return real(*args)
        undo = before(*args)
        result = real(*args)
        record_setting(label, real, args, frame, undo)
        return result

    set_again.__name__ = set_again.__qualname__ = getattr(real, "__name__", label)
    set_again.__doc__ = real.__doc__
    return set_again


_setitem, _delitem = os._Environ.__setitem__, os._Environ.__delitem__
_ENVIRON_WRITES = frozenset({_setitem.__code__, _delitem.__code__})


def _set_environ(name, value) -> None:
    os.environ[name] = value


def _del_environ(name) -> None:
    del os.environ[name]


def _environ_undo(key):
    """What puts ``os.environ[key]`` back as it is now."""
    value = os.environ.get(key)
    return lambda: os.environ.__setitem__(key, value) if value is not None else os.environ.pop(key, None)


def _environ_setitem(self, key, value):
    frame = sys._getframe(1)
    undo = _environ_undo(key) if self is os.environ and program_of(frame) is not None else None
    _setitem(self, key, value)
    if undo is not None:
        record_setting("os.environ", _set_environ, (key, value), frame, undo)


def _environ_delitem(self, key):
    frame = sys._getframe(1)
    undo = _environ_undo(key) if self is os.environ and program_of(frame) is not None else None
    _delitem(self, key)
    if undo is not None:
        record_setting("os.environ", _del_environ, (key,), frame, undo)


def _putenv_undo(key, *_):
    value = os.environ.get(key)
    return lambda: _putenv(key, value) if value is not None else _unsetenv(key)


def _restoring(read, write):
    """``before`` for a setting read by ``read()`` and set by ``write(value)``."""

    def before(*_):
        value = read()
        return lambda: write(value)

    return before


_putenv, _unsetenv, _umask = os.putenv, os.unsetenv, os.umask


def _umask_before(mask):
    old = _umask(mask)  # (read by setting it: put back at once)
    _umask(old)
    return lambda: _umask(old)


#: ``(holder, name, real, before)`` of the settings replaced while a program is traced
_SETTINGS = [
    (os, "chdir", os.chdir, _restoring(os.getcwd, os.chdir)),
    (os, "umask", os.umask, _umask_before),
    (os, "putenv", os.putenv, _putenv_undo),
    (os, "unsetenv", os.unsetenv, _putenv_undo),
    (sys, "setrecursionlimit", sys.setrecursionlimit, _restoring(sys.getrecursionlimit, sys.setrecursionlimit)),
    (sys, "setswitchinterval", sys.setswitchinterval, _restoring(sys.getswitchinterval, sys.setswitchinterval)),
    (torch, "set_num_threads", torch.set_num_threads, _restoring(torch.get_num_threads, torch.set_num_threads)),
]
_STAND_INS = [
    _setter(f"{'os' if holder is os else holder.__name__}.{name}", real, before)
    for holder, name, real, before in _SETTINGS
]


def put_setters() -> None:
    for (holder, name, _, _), stand_in in zip(_SETTINGS, _STAND_INS):
        setattr(holder, name, stand_in)
    os._Environ.__setitem__ = _environ_setitem  # type: ignore[method-assign]
    os._Environ.__delitem__ = _environ_delitem  # type: ignore[method-assign]


def put_back_setters() -> None:
    """Puts the settings' own functions back, then undoes what the programs set while traced (every
    call, the first one too, sets it again after running)."""
    for holder, name, real, _ in _SETTINGS:
        setattr(holder, name, real)
    os._Environ.__setitem__ = _setitem  # type: ignore[method-assign]
    os._Environ.__delitem__ = _delitem  # type: ignore[method-assign]
    while _undo:
        _undo.pop()()
    while _settled:
        guard = _settled.pop()
        guard.expected = guard.read()
