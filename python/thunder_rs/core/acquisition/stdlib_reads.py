"""Python state a traced program reads through the standard library: guarded by name, so a changed
value compiles again and the miss reason names it (``stdlib_state`` tells the whole story).

``os.environ`` and ``os.environb`` (``[...]``, ``get``, ``in``, ``os.getenv``: all go through
``os._Environ.__getitem__``), the names set in ``os.environ`` when the program iterates it or takes
its length, ``sys.argv`` when it parses it with ``argparse``, and the level of a logger
(``isEnabledFor``, ``getEffectiveLevel``), read by program code while it is traced.
"""

import argparse
import functools
import logging
import os
import sys

from thunder_rs.core.acquisition.stdlib_frames import guard_read, program_frame_of, tracing
from thunder_rs.core.state.guards import MISSING

# -- os.environ ------------------------------------------------------------------------------------

_environ_getitem = os._Environ.__getitem__


def _environ_value(key, environ=os.environ):
    try:
        return _environ_getitem(environ, key)
    except KeyError:
        return MISSING


def _environ_name(mapping) -> str | None:
    """``os.environ``, or ``os.environb`` (the same names, as bytes), as ``mapping`` is; else None."""
    return "os.environ" if mapping is os.environ else "os.environb" if mapping is _ENVIRONB else None


_ENVIRONB = getattr(os, "environb", None)


def _unset(value) -> str:
    return "unset" if value is MISSING else repr(value)


def _getitem(self, key):
    name = _environ_name(self)
    if name is not None and tracing() and program_frame_of(sys._getframe(1)) is not None:
        guard_read(f"{name}[{key!r}]", functools.partial(_environ_value, key, self), _unset)
    return _environ_getitem(self, key)


_environ_iter = os._Environ.__iter__
_environ_len = os._Environ.__len__


def _environ_names() -> frozenset:
    return frozenset(os.environ._data)  # type: ignore[attr-defined]


def _guard_names(self) -> None:
    if _environ_name(self) is not None and tracing() and program_frame_of(sys._getframe(2)) is not None:
        guard_read("the names set in os.environ", _environ_names, lambda names: f"{len(names)} names")


def _iter(self):
    _guard_names(self)
    return _environ_iter(self)


def _len(self):
    _guard_names(self)
    return _environ_len(self)


# -- sys.argv --------------------------------------------------------------------------------------

_parse_known_args = argparse.ArgumentParser.parse_known_args


def _parse_known(self, args=None, namespace=None):
    """``parse_args()`` and ``parse_known_args()`` without ``args`` parse ``sys.argv``: guarded as
    a program's own read of it is (``torch_flags``)."""
    if args is None and tracing() and program_frame_of(sys._getframe(1)) is not None:
        guard_read("sys.argv", _argv)
    return _parse_known_args(self, args, namespace)


def _argv() -> tuple:
    return tuple(sys.argv)


# -- logger levels ---------------------------------------------------------------------------------

_is_enabled_for = logging.Logger.isEnabledFor
_effective_level = logging.Logger.getEffectiveLevel


def _level_of(logger) -> tuple:
    """What decides which records ``logger`` makes: ``logging.disable``'s level and its own."""
    return (logger.manager.disable, _effective_level(logger))


def _show_level(value: tuple) -> str:
    disabled, level = value
    text = logging.getLevelName(level)
    return f"{text} (logging.disable({logging.getLevelName(disabled)}))" if disabled else text


def _guard_level(logger) -> None:
    if tracing() and program_frame_of(sys._getframe(2)) is not None:
        guard_read(f"the level of logger {logger.name!r}", functools.partial(_level_of, logger), _show_level)


def _isEnabledFor(self, level):  # noqa: N802 (logging's name)
    _guard_level(self)
    return _is_enabled_for(self, level)


def _getEffectiveLevel(self):  # noqa: N802 (logging's name)
    _guard_level(self)
    return _effective_level(self)


def install_reads() -> None:
    """Puts the readers in (once: ``stdlib_state.install``; they call straight through outside tracing)."""
    os._Environ.__getitem__ = _getitem  # type: ignore[method-assign]
    os._Environ.__iter__ = _iter  # type: ignore[method-assign]
    os._Environ.__len__ = _len  # type: ignore[method-assign]
    argparse.ArgumentParser.parse_known_args = _parse_known  # type: ignore[method-assign]
    logging.Logger.isEnabledFor = _isEnabledFor  # type: ignore[method-assign]
    logging.Logger.getEffectiveLevel = _getEffectiveLevel  # type: ignore[method-assign]
