"""Settings of Python's libraries a traced program makes: made again by every call, as eager makes them.

``sys.path``'s changes (``append``, ``insert``, ``extend``, ``remove``, ``sys.path[:0] = ...``),
``warnings.simplefilter``, ``filterwarnings`` and ``resetwarnings``, ``torch.set_printoptions``,
``numpy.set_printoptions``, a logger's ``setLevel`` and ``logging.disable`` called by program code
while it is traced are made then (what follows in the program sees them), undone once tracing
ends and recorded among its effects, as ``setters``' process settings are: every compiled call
makes them again, in order with its prints, warnings and logging, so a setting reset between calls
is set again as eager sets it. Tracing made them once before, and a reset stayed reset.

A filter set inside the program's own ``warnings.catch_warnings()`` block is made as eager makes it
and undone with the block, not repeated. Only the program's own calls count: one the standard
library makes for it (``logging.basicConfig`` setting the root's level, once) is made as before.

``sys.path`` is a list whose methods no wrapper replaces: while some program is traced it is a list
of a subclass (``_TracedPath``) whose changes by program code are recorded, and whose reads by
program code (``p in sys.path``, iterating it) are guarded on what it held when tracing began
(``setters.settle_later``), so that ``if p not in sys.path: sys.path.insert(0, p)`` inserts once
as in eager (the next call, finding it there, compiles once more and inserts nothing). Its own
list is put back, with what other code changed meanwhile, once no program is traced.
"""

import functools
import logging
import sys
import warnings

import torch

from thunder_rs.core.acquisition.logged import in_programs_catch_warnings
from thunder_rs.core.acquisition.setters import program_of, record_setting
from thunder_rs.core.acquisition.stdlib_frames import guard_read
from thunder_rs.core.state.cached_reads import register_stand_in
from thunder_rs.core.state.guards import is_simple
from thunder_rs.core.state.hook import own_work, thread_state


def _plain(value) -> bool:
    """A setting's argument a compiled call can pass again: a number or a string (``is_simple``),
    a class (a warning's category), a logger, or a slice of ints (``sys.path[:0] = ...``)."""
    if type(value) is slice:
        return all(map(is_simple, (value.start, value.stop, value.step)))
    return is_simple(value) or isinstance(value, (type, logging.Logger))


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


# -- sys.path --------------------------------------------------------------------------------------


class _PathCall:
    """``sys.path.<name>(*args)`` on whatever list ``sys.path`` is when a call makes it again."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args):
        return getattr(sys.path, self.name)(*args)


def _changing(name: str):
    real = getattr(list, name)

    def change(self, *args):
        frame = sys._getframe(1)
        if not _by_program(frame):
            return real(self, *args)
        items = list(list.__iter__(self))
        result = real(self, *args)
        undo = functools.partial(list.__setitem__, self, slice(None), items)
        record_setting(f"sys.path.{name}", _PathCall(name), args, frame, undo, None, _plain)
        return result

    change.__name__ = change.__qualname__ = name
    return change


def _reading(name: str):
    real = getattr(list, name)

    def read(self, *args):
        if thread_state.observer is not None and program_of(sys._getframe(1)) is not None:
            guard_read("sys.path", _path_items, _entries)
        return real(self, *args)

    read.__name__ = read.__qualname__ = name
    return read


def _path_items() -> tuple:
    return tuple(sys.path)


def _entries(items: tuple) -> str:
    return f"{len(items)} entries"


_CHANGES: tuple[str, ...] = (
    "append",
    "extend",
    "insert",
    "remove",
    "pop",
    "clear",
    "sort",
    "reverse",
    "__setitem__",
    "__delitem__",
)
_CHANGES += ("__iadd__", "__imul__")
_READS: tuple[str, ...] = (
    "__contains__",
    "__iter__",
    "__len__",
    "__getitem__",
    "index",
    "count",
    "copy",
    "__reversed__",
    "__eq__",
)
_READS += ("__ne__", "__add__", "__mul__", "__repr__")


class _TracedPath(list):
    """``sys.path`` while some program is traced: its changes and reads by program code are seen."""

    __slots__ = ()


for _name in _CHANGES:
    setattr(_TracedPath, _name, _changing(_name))
for _name in _READS:
    setattr(_TracedPath, _name, _reading(_name))
#: ``sys.path``'s own list while a ``_TracedPath`` stands in for it
_path_list: list = []


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
    if type(sys.path) is list and not _path_list:
        _path_list.append(sys.path)
        sys.path = _TracedPath(sys.path)


def put_back_library_settings() -> None:
    """Puts the libraries' own functions and ``sys.path``'s list back (after ``setters.put_back_setters``
    undid what the programs set while traced)."""
    for holder, name, _stand_in, real in _SETTINGS:
        setattr(holder, name, real)
    while _numpy_setter:
        numpy, real = _numpy_setter.pop()
        numpy.set_printoptions = real
    while _path_list:
        held = _path_list.pop()
        if type(sys.path) is _TracedPath:
            held[:] = list.__iter__(sys.path)
            sys.path = held
