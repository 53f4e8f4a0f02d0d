"""Clocks the program reads: ``time``'s, and the wall clock of ``datetime``'s C methods.

While some program is traced, ``time``'s clocks are readers that refuse when program code calls
them (``acquisition.stdlib_state``, which registers each with ``cached_reads.register_stand_in``):
a compiled call would reuse tracing's reading. A clock bound before tracing, as a global, a closure
cell or an attribute of an object or a module, is not looked up in ``time``: the observer finds it
among the reads of the function being entered, before its body runs (``observe.Observer._keep``),
and ``cached_reads.stand_in_cached`` puts the reader at that name until no program is traced. A
program that holds the name but takes no branch that calls it runs as before.

The wall clock ``datetime`` reads (``datetime.datetime.now()``, ``utcnow()``, ``today()``,
``datetime.date.today()``, however the program reached the type, or a subclass's) is a C method
of a C type, which no wrapper can replace: the observer's profile hook reports the program's calls
of builtins bound to ``C_READERS``' owners or their subclasses, and ``refuse_c_call`` refuses
those that read the clock. Handed to a C caller (``functools.partial``, ``map``), whose calls no
hook reports, such a method is refused where the program takes it as a value
(``refuse_handed_clocks``, when its frame is entered), and where the program bound it before
tracing (``now = datetime.datetime.now``, a ``partial`` of it: a global, a closure cell, an
attribute) a stand-in refusing its call is put (``handed_effects.bound_stand_in``).
"""

import builtins
import datetime
import sys
import types

from thunder_rs.core.state.identity import instructions
from thunder_rs.errors import ThunderNotImplementedError


#: owner (a type) -> the names of its builtins that read the wall clock, whose calls by the program
#: the profile hook reports (``CallObserver.watch_c_calls``)
C_READERS: dict = {
    datetime.datetime: frozenset({"now", "utcnow", "today"}),
    datetime.date: frozenset({"today"}),
}


def reads_clock(function) -> bool:
    """Whether ``function``, a builtin, is one of ``C_READERS``' (of an owner or a subclass's)."""
    owner, name = getattr(function, "__self__", None), getattr(function, "__name__", None)
    return isinstance(owner, type) and any(name in C_READERS[base] for base in owner.__mro__ if base in C_READERS)


def refuse_c_call(frame, function) -> None:
    """Refuses ``function``, a builtin bound to one of ``C_READERS``' owners, called by the
    program's ``frame``, if it reads the clock."""
    if not reads_clock(function):  # (a file object's ``write``: ``c_effects``)
        return
    owner, name = function.__self__, function.__name__
    raise ThunderNotImplementedError(
        f"{owner.__module__}.{owner.__qualname__}.{name}: the program reads the wall clock at "
        f"{frame.f_code.co_filename}:{frame.f_lineno}; tracing reads it once, and a compiled call would reuse "
        "that reading. Read it outside the jitted function and pass it in"
    )


# -- handed on -------------------------------------------------------------------------------------

_READER_NAMES = frozenset().union(*C_READERS.values())
_ROOTS = {"LOAD_GLOBAL": "global", "LOAD_NAME": "global", "LOAD_DEREF": "cell", "LOAD_CLASSDEREF": "cell"}
#: id of a code naming a reader -> ``(code, its chains ending in a reader's name taken as a value)``:
#: ``(root kind, root name, attributes, line)``
_handed: dict = {}


def _value_load(ins) -> bool:
    """An attribute load that takes the value (not one a call follows: ``LOAD_METHOD``, or 3.12's
    ``LOAD_ATTR`` with its method bit)."""
    return ins.opname == "LOAD_ATTR" and not (sys.version_info >= (3, 12) and ins.arg & 1)


def _handed_chains(code) -> list:
    if _READER_NAMES.isdisjoint(code.co_names):  # (most codes: no walk, nothing kept)
        return []
    known = _handed.get(id(code))
    if known is not None and known[0] is code:
        return known[1]
    found, walked = [], instructions(code)
    for i, ins in enumerate(walked):
        if not (_value_load(ins) and ins.argval in _READER_NAMES):
            continue
        attrs, j = [ins.argval], i - 1
        while j >= 0 and _value_load(walked[j]):
            attrs.append(walked[j].argval)
            j -= 1
        # (3.11 calls ``date.today()`` as ``LOAD_GLOBAL`` pushing a NULL, then ``LOAD_ATTR``)
        called = len(attrs) == 1 and j >= 0 and walked[j].opname == "LOAD_GLOBAL" and walked[j].arg & 1
        if j >= 0 and walked[j].opname in _ROOTS and not called:
            line = ins.positions[0] if ins.positions else code.co_firstlineno
            found.append((_ROOTS[walked[j].opname], walked[j].argval, tuple(reversed(attrs)), line))
    _handed[id(code)] = (code, found)
    return found


def refuse_handed_clocks(frame) -> None:
    """Refuses the program's ``frame`` if its code takes a builtin that reads the wall clock as a
    value (``functools.partial(datetime.datetime.now, tz)``, ``map(datetime.now, zones)``): a C
    caller calls it for the program, where the profile hook does not see the call. Found from the
    code when the frame is entered, through the modules its chain reads (the line named is where it
    is taken, whether or not the program gets there this time)."""
    for kind, name, attrs, line in _handed_chains(frame.f_code):
        if kind == "global":
            value = frame.f_globals.get(name, getattr(builtins, name, None))
        else:
            value = frame.f_locals.get(name)
        for attr in attrs[:-1]:
            value = vars(value).get(attr) if isinstance(value, types.ModuleType) else None
        if isinstance(value, type) and reads_clock(getattr(value, attrs[-1], None)):
            raise ThunderNotImplementedError(
                f"{value.__module__}.{value.__qualname__}.{attrs[-1]}: the program hands it on at "
                f"{frame.f_code.co_filename}:{line} (functools.partial, map, a callback), and where it is called "
                "it reads the wall clock; tracing reads it once, and a compiled call would reuse that reading. Read "
                "it outside the jitted function and pass it in"
            )
