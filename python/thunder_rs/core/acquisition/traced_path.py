"""``sys.path`` while a program is traced: its changes by program code made again by every call.

``sys.path`` is a list whose methods no wrapper replaces: while some program is traced it is a list
of a subclass (``_TracedPath``) whose changes by program code are recorded (``setters.record_setting``),
and whose reads by program code (``p in sys.path``, iterating it) are guarded on what it held when
tracing began (``setters.settle_later``), so that ``if p not in sys.path: sys.path.insert(0, p)``
inserts once as in eager (the next call, finding it there, compiles once more and inserts nothing).
Its own list is put back, with what other code changed meanwhile, once no program is traced.

The program may also give ``sys`` a new list (``sys.path = sys.path + [p]``, ``sys.path = [p] +
sys.path``): ``sys``'s class is then a ``ModuleType`` subclass that sees the assignment
(``_SysModule``). Where the new list holds what ``sys.path`` held around some entries, every call
puts the same entries around what ``sys.path`` holds then (eager's ``sys.path`` grows by one entry a
call); otherwise it assigns the same entries (what the program read of ``sys.path`` is guarded). The
sum ``sys.path + [p]`` stored straight into ``sys.path`` reads nothing the call depends on, and
guards nothing (``_summed_into_sys_path``): a call is not compiled again for the entry it added.
Tracing made the assignment once and the next call, not compiled again, made none.
"""

import dis
import functools
import sys
import types

from thunder_rs.core.acquisition.setters import program_of, record_setting
from thunder_rs.core.acquisition.stdlib_frames import guard_read
from thunder_rs.core.state.guards import is_simple
from thunder_rs.core.state.hook import thread_state
from thunder_rs.errors import ThunderNotImplementedError


def _by_program(frame) -> bool:
    return program_of(frame) is frame


def _plain(value) -> bool:
    """An argument a compiled call can pass again: a number or a string, a slice of ints
    (``sys.path[:0] = ...``), or a tuple of entries (``sys.path = ...``)."""
    if type(value) is slice:
        return all(map(is_simple, (value.start, value.stop, value.step)))
    if type(value) is tuple:
        return all(map(is_simple, value))
    return is_simple(value)


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
        frame = sys._getframe(1)
        if thread_state.observer is not None and program_of(frame) is not None:
            if not (name == "__add__" and self is sys.path and _summed_into_sys_path(frame)):
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
#: ``(sys.path's own list, sys's own class)`` while a ``_TracedPath`` stands in for the list
_path_list: list = []


# -- sys.path = ... --------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _instructions(code) -> tuple[list, dict]:
    instructions = list(dis.get_instructions(code))
    return instructions, {ins.offset: k for k, ins in enumerate(instructions)}


def _summed_into_sys_path(frame) -> bool:
    """Whether the ``+`` ``frame`` runs stores its sum straight into ``sys.path`` (the next
    instructions load ``sys`` and store its ``path``)."""
    instructions, index = _instructions(frame.f_code)
    k = index.get(frame.f_lasti)
    if k is None or k + 2 >= len(instructions) or instructions[k].opname != "BINARY_OP":
        return False
    load, store = instructions[k + 1], instructions[k + 2]
    if store.opname != "STORE_ATTR" or store.argval != "path":
        return False
    if load.opname in ("LOAD_FAST", "LOAD_DEREF"):
        return frame.f_locals.get(load.argval) is sys
    if load.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
        return frame.f_globals.get(load.argval, frame.f_builtins.get(load.argval)) is sys
    return False


def _assign_path(before: tuple, after: tuple, items: tuple | None) -> None:
    """``sys.path = [*before, *sys.path, *after]``, or ``list(items)`` where ``items`` is given."""
    sys.path = [*before, *sys.path, *after] if items is None else list(items)


def _around(items: list, held: list) -> tuple | None:
    """``(before, after)`` where ``items`` is ``before + held + after`` (``held`` not empty)."""
    n = len(held)
    for i in range(len(items) - n + 1 if n else 0):
        if items[i : i + n] == held:
            return tuple(items[:i]), tuple(items[i + n :])
    return None


def _assigned_by_program(value, frame) -> None:
    """The program assigns ``sys.path = value`` at ``frame``: recorded, made again by every call."""
    program = program_of(frame)
    if not isinstance(value, list):
        raise ThunderNotImplementedError(
            f"sys.path = ...: the program gives sys.path a {type(value).__name__}, not a list, at "
            f"{program.f_code.co_filename}:{program.f_lineno}, which a compiled call does not make again. "
            "Give it a list, or set it outside the jitted function"
        )
    held = sys.path
    items, current = list(list.__iter__(value)), list(list.__iter__(held))
    around = _around(items, current)
    args = (*around, None) if around is not None else ((), (), tuple(items))
    undo = functools.partial(types.ModuleType.__setattr__, sys, "path", held)
    record_setting("sys.path = ...", _assign_path, args, frame, undo, None, _plain)
    types.ModuleType.__setattr__(sys, "path", _TracedPath(items))


class _SysModule(types.ModuleType):
    """``sys``'s class while some program is traced: sees the program give ``sys.path`` a new list."""

    def __setattr__(self, name: str, value) -> None:
        if name == "path" and value is not sys.path:
            frame = sys._getframe(1)
            if _by_program(frame):
                return _assigned_by_program(value, frame)
        types.ModuleType.__setattr__(self, name, value)


def put_traced_path() -> None:
    if type(sys.path) is list and not _path_list:
        _path_list.append((sys.path, type(sys)))
        sys.path = _TracedPath(sys.path)
        sys.__class__ = _SysModule


def put_back_traced_path() -> None:
    """Puts ``sys``'s class and ``sys.path``'s list back (after ``setters.put_back_setters`` undid
    what the programs set while traced)."""
    while _path_list:
        held, own_class = _path_list.pop()
        sys.__class__ = own_class
        if type(sys.path) is _TracedPath:
            held[:] = list.__iter__(sys.path)
            sys.path = held
