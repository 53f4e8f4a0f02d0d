"""Clocks the program bound before it was traced (``from time import perf_counter``): replaced by
refusing readers while tracing, as ``time``'s own are.

While some program is traced, ``time``'s clocks are readers that refuse when program code calls
them (``stdlib_state``, which registers each here): a compiled call would reuse tracing's reading.
A clock bound before tracing, as a global, a closure cell or an attribute of a global object, is
not looked up in ``time``: the observer finds it among the reads of the function being entered,
before its body runs (``observe.Observer._keep``), and ``refuse_bound_clock`` puts the reader at
that name until no program is traced (``put_back_bound_clocks``); the object's attributes do not
count it as a write of the program's (``is_clock_reader``). A program that holds the name but
takes no branch that calls it runs as before. A clock held as a module's attribute is not replaced.

The wall clock ``datetime`` reads (``datetime.datetime.now()``, ``utcnow()``, ``today()``,
``datetime.date.today()``, however the program reached the type, or a subclass's) is a C method
of a C type, which no wrapper can replace: the observer's profile hook reports the program's calls
of builtins bound to ``C_READERS``' owners or their subclasses, and ``refuse_c_call`` refuses
those that read the clock.
"""

import datetime

from thunder_rs.core.state.guards import CellSource, GlobalsSource, ObjectSource
from thunder_rs.errors import ThunderNotImplementedError

#: id of a clock -> its refusing reader (``register_clock``)
_readers: dict = {}
#: ids of the readers
_reader_ids: set = set()
#: ``(holder, name, clock)`` where a reader stands in for a bound clock while programs are traced:
#: ``holder`` a mapping, or a closure cell with ``name`` None
_bound: list = []


def register_clock(clock, reader) -> None:
    """``reader`` stands in for ``clock`` wherever the program bound it, while it is traced."""
    _readers[id(clock)] = reader
    _reader_ids.add(id(reader))


def register_stand_in(reader) -> None:
    """``reader`` stands in for a function while programs are traced (not a write of the program's
    where it is put: ``handed_effects``)."""
    _reader_ids.add(id(reader))


def unregister_stand_in(reader) -> None:
    _reader_ids.discard(id(reader))


def is_clock_reader(value) -> bool:
    """Whether ``value`` is a reader standing in for a clock (not a write of the program's)."""
    return id(value) in _reader_ids


def refuse_bound_clock(source, name, value, reader=None) -> None:
    """If ``value``, read as ``name`` at ``source`` (a globals dict, a state object's dict, a closure
    cell), is a registered clock, puts its reader there until tracing ends; ``reader``: the one to
    put for another function (``handed_effects.bound_stand_in``)."""
    reader = reader or _readers.get(id(value))
    if reader is None:
        return
    if isinstance(source, CellSource):
        source.cell.cell_contents = reader
        _bound.append((source.cell, None, value, reader))
        return
    if type(source) not in (GlobalsSource, ObjectSource):
        return  # (a module's attributes are read from its clone while traced)
    mapping = source.fixed()
    if isinstance(mapping, dict) and mapping.get(name) is value:
        mapping[name] = reader
        _bound.append((mapping, name, value, reader))


def put_back_bound_clocks() -> None:
    """Puts back the clocks ``refuse_bound_clock`` replaced (once no program is traced)."""
    while _bound:
        holder, name, clock, reader = _bound.pop()
        if name is None:
            if holder.cell_contents is reader:
                holder.cell_contents = clock
        elif holder.get(name) is reader:
            holder[name] = clock


#: owner (a type) -> the names of its builtins that read the wall clock, whose calls by the program
#: the profile hook reports (``CallObserver.watch_c_calls``)
C_READERS: dict = {
    datetime.datetime: frozenset({"now", "utcnow", "today"}),
    datetime.date: frozenset({"today"}),
}


def refuse_c_call(frame, function) -> None:
    """Refuses ``function``, a builtin bound to one of ``C_READERS``' owners, called by the
    program's ``frame``, if it reads the clock."""
    owner, name = function.__self__, function.__name__
    if not isinstance(owner, type):  # (a file object's ``write``: ``c_effects``)
        return
    if any(name in C_READERS[base] for base in getattr(owner, "__mro__", (owner,)) if base in C_READERS):
        raise ThunderNotImplementedError(
            f"{owner.__module__}.{owner.__qualname__}.{name}: the program reads the wall clock at "
            f"{frame.f_code.co_filename}:{frame.f_lineno}; tracing reads it once, and a compiled call would reuse "
            "that reading. Read it outside the jitted function and pass it in"
        )
