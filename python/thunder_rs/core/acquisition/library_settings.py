"""Settings of Python's libraries a traced program makes: made again by every call, as eager makes them.

``sys.path``'s changes (``traced_path``), ``warnings.simplefilter``, ``filterwarnings`` and
``resetwarnings``, ``torch.set_printoptions``, ``numpy.set_printoptions``, a logger's ``setLevel``,
``logging.disable`` and ``logging.basicConfig`` called by program code while it is traced are made
then (what follows in the program sees them), undone once tracing ends and recorded among its
effects, as ``setters``' process settings are: every compiled call makes them again, in order with
its prints, warnings and logging, so a setting reset between calls is set again as eager sets it.
Tracing made them once before, and a reset stayed reset (``logging.basicConfig(level=...)``: a
program called after the root logger's handlers were removed left it without one, at its old level).

A filter set inside the program's own ``warnings.catch_warnings()`` block is made as eager makes it
and undone with the block, not repeated. Only the program's own calls count: one the standard
library makes for it (``logging.basicConfig`` setting the root's level) is part of that call.
``basicConfig``'s ``stream`` may be ``sys.stdout`` or ``sys.stderr``, each call passing the one
``sys`` holds then; other objects (``handlers=[...]``) are refused naming the line.
"""

import functools
import logging
import sys
import warnings

import torch

from thunder_rs.core.acquisition.logged import in_programs_catch_warnings
from thunder_rs.core.acquisition.setters import program_of, record_setting
from thunder_rs.core.acquisition.traced_path import put_back_traced_path, put_traced_path
from thunder_rs.core.state.cached_reads import register_stand_in
from thunder_rs.core.state.guards import is_simple
from thunder_rs.core.state.hook import own_work


def _plain(value) -> bool:
    """A setting's argument a compiled call can pass again: a number or a string (``is_simple``),
    a class (a warning's category), a logger, or a standard stream (``_Std``)."""
    return is_simple(value) or isinstance(value, (type, logging.Logger, _Std))


def _by_program(frame) -> bool:
    """Whether ``frame``, calling a setting's stand-in, is the program's while it is traced (the
    standard library's calls for it are not: ``logging.basicConfig`` sets the root's level once)."""
    return program_of(frame) is frame


def _stand_in(label: str, real, before, made_here=None):
    """A stand-in for ``real``, a library's function setting something: called by program code
    while it is traced (and not where ``made_here()`` says the setting stays inside the program),
    it takes what undoes the call (``before(*args, **kwargs)``), makes it and records it."""

    @functools.wraps(real)
    def set_again(*args, **kwargs):
        frame = sys._getframe(1)
        if not _by_program(frame) or (made_here is not None and made_here()):
            return real(*args, **kwargs)
        undo = before(*args, **kwargs)
        result = own_work(functools.partial(real, *args, **kwargs))  # (its reads are not the program's)
        record_setting(label, real, args, frame, undo, kwargs, _plain)
        return result

    register_stand_in(real, set_again)  # also where the program bound it (``from warnings import simplefilter``)
    return set_again


# -- warnings' filters -----------------------------------------------------------------------------


def _filters_before(*_args, **_kwargs):
    held, items = warnings.filters, list(warnings.filters)

    def undo():
        held[:] = items
        warnings._filters_mutated()

    return undo


# -- print options ---------------------------------------------------------------------------------


def _torch_options_before(*_args, **_kwargs):
    options = torch._tensor_str.PRINT_OPTS
    saved = dict(vars(options))

    def undo():
        vars(options).clear()
        vars(options).update(saved)

    return undo


def _numpy_options_before(*_args, **_kwargs):
    numpy = sys.modules["numpy"]
    saved = numpy.get_printoptions()
    real = _numpy_setter[0][1]
    return lambda: real(**saved)


#: ``(numpy, its set_printoptions)`` while it is replaced (numpy is read from ``sys.modules``: a
#: program that uses it imported it)
_numpy_setter: list = []
#: ``[numpy's set_printoptions, its stand-in]``, made once
_numpy_stand_in: list = []


# -- logging ---------------------------------------------------------------------------------------

_set_level = logging.Logger.setLevel
_disable = logging.disable


def _level_before(logger, *_args, **_kwargs):
    level = logger.level
    return lambda: _set_level(logger, level)


def _disable_before(*_args, **_kwargs):
    level = logging.root.manager.disable
    return lambda: _disable(level)


class _Std:
    """``sys.stdout`` or ``sys.stderr``, read when a call configures logging again."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def stream(self):
        return getattr(sys, self.name)


def _standard_streams(kwargs: dict) -> dict:
    """``kwargs`` with a stream that is ``sys.stdout`` or ``sys.stderr`` named as one (``_Std``)."""
    stream = kwargs.get("stream")
    for name in ("stdout", "stderr"):
        if stream is not None and stream is getattr(sys, name):
            return {**kwargs, "stream": _Std(name)}
    return kwargs


_basic_config = logging.basicConfig


def _configure(**kwargs):
    """``logging.basicConfig(**kwargs)``, a ``_Std`` stream read from ``sys``."""
    if isinstance(kwargs.get("stream"), _Std):
        kwargs["stream"] = kwargs["stream"].stream()
    return _basic_config(**kwargs)


def _root_before(**_kwargs):
    root = logging.root
    handlers, level = list(root.handlers), root.level

    def undo():
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        _set_level(root, level)

    return undo


@functools.wraps(_basic_config)
def _basic_config_stand_in(**kwargs):
    frame = sys._getframe(1)
    if not _by_program(frame):
        return _basic_config(**kwargs)
    undo = _root_before()
    kwargs = _standard_streams(kwargs)
    result = own_work(functools.partial(_configure, **kwargs))
    record_setting("logging.basicConfig", _configure, (), frame, undo, kwargs, _plain)
    return result


register_stand_in(_basic_config, _basic_config_stand_in)

#: ``(holder, name, stand-in, real)`` of the functions replaced while a program is traced
_SETTINGS = [
    (holder, name, _stand_in(label, getattr(holder, name), before, made_here), getattr(holder, name))
    for holder, name, label, before, made_here in (
        (warnings, "simplefilter", "warnings.simplefilter", _filters_before, in_programs_catch_warnings),
        (warnings, "filterwarnings", "warnings.filterwarnings", _filters_before, in_programs_catch_warnings),
        (warnings, "resetwarnings", "warnings.resetwarnings", _filters_before, in_programs_catch_warnings),
        (torch, "set_printoptions", "torch.set_printoptions", _torch_options_before, None),
        (logging.Logger, "setLevel", "logging.Logger.setLevel", _level_before, None),
        (logging, "disable", "logging.disable", _disable_before, None),
    )
]
_SETTINGS.append((logging, "basicConfig", _basic_config_stand_in, _basic_config))


# -- putting them in -------------------------------------------------------------------------------


def put_library_settings() -> None:
    """Puts the stand-ins in (while some program is traced: ``stdlib_readers.put_readers``)."""
    for holder, name, stand_in, _real in _SETTINGS:
        setattr(holder, name, stand_in)
    numpy = sys.modules.get("numpy")
    real = getattr(numpy, "set_printoptions", None)
    if real is not None and not _numpy_setter:
        _numpy_setter.append((numpy, real))
        if not _numpy_stand_in or _numpy_stand_in[0] is not real:  # (made once: a stand-in's id stays registered)
            _numpy_stand_in[:] = [real, _stand_in("numpy.set_printoptions", real, _numpy_options_before)]
        numpy.set_printoptions = _numpy_stand_in[1]  # type: ignore[union-attr]
    put_traced_path()


def put_back_library_settings() -> None:
    """Puts the libraries' own functions and ``sys.path``'s list back (after ``setters.put_back_setters``
    undid what the programs set while traced)."""
    for holder, name, _stand_in, real in _SETTINGS:
        setattr(holder, name, real)
    while _numpy_setter:
        numpy, real = _numpy_setter.pop()
        numpy.set_printoptions = real
    put_back_traced_path()
