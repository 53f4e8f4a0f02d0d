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
those that read the clock.
"""

import datetime

from thunder_rs.errors import ThunderNotImplementedError


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
