"""C functions that make an effect outside the program or read a file, handed to a C caller:
stand-ins refuse them while a program is traced.

The observer's profile hook reports the builtins the program's bytecode calls
(``core.state.c_effects``), not those a C function calls for it: ``map(f.write, lines)``,
``functools.partial(os.write, 1)(b)``, ``operator.methodcaller("write", s)(f)``,
``itertools.starmap(os.write, ...)``, ``sorted(xs, key=...)``, ``functools.reduce``. Tracing made
those effects once where eager makes them on every call. While some program is traced:

- the module functions of ``c_effects.C_WRITERS`` and ``C_FD_READS`` (``os.write``, ``os.read``,
  ``time.sleep``, ``signal.raise_signal``, ``pickle.dump``) are stand-ins in their module
  (``put_module_stand_ins``), and also where the program bound them before it was traced (``from
  os import write``: ``cached_reads.stand_in_cached``); a socket's sends on ``socket.socket``;
- a file object the program reached from outside (an argument, a global, a closure cell, an
  attribute of its state: ``state.ProgramState.add``) holds stand-ins for its writes and reads in its
  own ``__dict__``, which its class's methods give way to, so that however the program reaches
  ``f.write`` (an attribute, ``getattr``, ``methodcaller``, a ``csv.writer`` made in the program)
  the stand-in is called (``stand_in_held``);
- such a function or method bound before tracing and held as a global, a closure cell or an
  attribute of a state object (``emit = f.write``, ``partial(os.write, 1)``) reads a stand-in
  there (``bound_stand_in``).

A stand-in called by program code (directly, through a C caller, or through the standard library
for it) refuses as the profile hook does, naming the program's line; called by other code, or
outside tracing (a module imported while traced keeps what it bound), it calls the function.
Not seen: a C caller the program reached already holding such a method (a ``csv.writer`` or a
``partial`` kept in a list, or made before tracing and reached only through a container).
"""

import functools
import os
import signal
import sys
import time
import types

from thunder_rs.core.state.c_effects import (
    C_FD_READS,
    C_WRITERS,
    FILE_READS,
    FILES,
    effect,
    refuse_c_effect,
)
from thunder_rs.core.state.cached_reads import register_stand_in
from thunder_rs.core.state.clocks import reads_clock, refuse_c_call
from thunder_rs.core.state.hook import program_frame, thread_state


def program_calling(frame):
    """``(frame, the program's frame)`` while some program is traced and thunder_rs is not at work:
    ``frame`` past thunder_rs's stand-ins calling on for the program (``_PASSING_ON``), and the
    program's frame that runs it (``hook.program_frame``: the standard library's or a C caller's
    frames for it passed, a module body being imported not counted); None if no program's does."""
    if thread_state.observer is None or thread_state.inside:
        return None
    while frame is not None and frame.f_code in _PASSING_ON:
        frame = frame.f_back
    program = program_frame(frame)
    return None if program is None else (frame, program)


def _refuse(frame, function) -> None:
    """Refuses ``function`` called by ``frame`` (or the C caller it runs) where the profile hook
    refuses the program's call of it (``hook._dispatch_c_call``)."""
    found = program_calling(frame)
    if found is not None:
        refuse_c_effect(found[0], function, thread_state.observer)


#: the code of thunder_rs's stand-ins that call on for the program while it is traced
#: (``stdlib_state``'s ``next``, whose iterator may be a ``map`` of ``os.read``): skipped as the
#: program's own frame is looked for
_PASSING_ON: set = set()


def passes_on(function) -> None:
    """``function``, a stand-in of thunder_rs's, calls on for the program (``_PASSING_ON``)."""
    _PASSING_ON.add(function.__code__)


def passing_on(code) -> bool:
    return code in _PASSING_ON


def _refuse_clock(frame, function) -> None:
    """Refuses ``function``, a builtin reading the wall clock (``clocks.C_READERS``), called by the
    program's frame (or a C caller it runs)."""
    found = program_calling(frame)
    if found is not None:
        refuse_c_call(found[1], function)


def _stand_in(function, called=None, made=None, refuse=_refuse):
    """A Python function refusing ``function``'s call by the program while it is traced, calling
    ``called`` (``function`` by default: a ``partial`` of it) otherwise; kept in ``made`` (for one
    tracing: its id is let go with it, ``put_back_held``)."""
    called = called or function

    @functools.wraps(function)
    def stand_in(*args, **kwargs):
        refuse(sys._getframe(1), function)
        return called(*args, **kwargs)

    _stand_ins.add(id(stand_in))
    if made is not None:
        made.append(stand_in)
    return stand_in


#: ids of the stand-ins (``_stand_in``; they live as long as the process, or until put back)
_stand_ins: set = set()


def is_handed_stand_in(value) -> bool:
    """Whether ``value`` is a stand-in (put in a file object's ``__dict__``: not the program's state)."""
    return id(value) in _stand_ins


#: ``(module, name, function)``: the module functions ``put_module_stand_ins`` replaces
_MODULE_FUNCTIONS = [
    (module, name, getattr(module, name))
    for module, owner in ((os, os.write.__module__), (time, "time"), (signal, signal.alarm.__module__))
    for name in sorted(C_WRITERS.get(sys.modules[owner], frozenset()) | C_FD_READS.get(sys.modules[owner], frozenset()))
    if getattr(module, name, None) is getattr(sys.modules[owner], name, 0)
]
_pickle = sys.modules.get("_pickle")
if _pickle is not None:
    import pickle

    _MODULE_FUNCTIONS += [(pickle, name, getattr(pickle, name)) for name in sorted(C_WRITERS[_pickle])]
_MODULE_STAND_INS = {(id(module), name): _stand_in(function) for module, name, function in _MODULE_FUNCTIONS}
for _module, _name, _function in _MODULE_FUNCTIONS:
    register_stand_in(_function, _MODULE_STAND_INS[id(_module), _name])  # where the program bound it


#: whether some program is traced (the stand-ins are in: ``put_module_stand_ins``)
_active: list = []


def _method_stand_in(method):
    """A stand-in for ``method``, a C method of ``_socket.socket`` (``send``), on its Python
    subclass ``socket.socket``, whose instances have no ``__dict__`` to hold one."""

    @functools.wraps(method)
    def stand_in(self, *args, **kwargs):
        _refuse(sys._getframe(1), method.__get__(self))
        return method(self, *args, **kwargs)

    return stand_in


#: ``(class, name, method)`` put on ``socket.socket`` while traced (``put_module_stand_ins``)
_socket_methods: list = []


def put_module_stand_ins() -> None:
    _active[:] = [True]
    for module, name, _function in _MODULE_FUNCTIONS:
        setattr(module, name, _MODULE_STAND_INS[id(module), name])
    socket = sys.modules.get("socket")
    kind = getattr(socket, "socket", None)
    if kind is not None and not _socket_methods:
        for name in sorted(C_WRITERS.get(kind.__mro__[1], ())):
            method = getattr(kind.__mro__[1], name, None)
            if method is not None and name not in vars(kind):
                _socket_methods.append((kind, name, method))
                setattr(kind, name, _method_stand_in(method))


def put_back_module_stand_ins() -> None:
    _active.clear()
    for module, name, function in _MODULE_FUNCTIONS:
        setattr(module, name, function)
    while _socket_methods:
        kind, name, _method = _socket_methods.pop()
        delattr(kind, name)


#: ``(file object, name, stand-in)`` put in its ``__dict__`` (``stand_in_held``)
_held: list = []


def stand_in_held(obj) -> None:
    """Puts stand-ins for the writes and reads of ``obj``, if it is a file object, in its own
    ``__dict__`` until tracing ends (``put_back_held``)."""
    if not _active or not isinstance(obj, FILES):
        return
    attributes = getattr(obj, "__dict__", None)
    if type(attributes) is not dict:
        return
    kind = type(obj)
    names = set(FILE_READS)
    for base in kind.__mro__:
        names |= C_WRITERS.get(base, frozenset())
    for name in sorted(names):
        if name in attributes or not hasattr(kind, name):
            continue
        stand_in = _stand_in(getattr(obj, name), made=_made)
        attributes[name] = stand_in
        _held.append((obj, name, stand_in))


#: the stand-ins made for one tracing (``stand_in_held``, ``bound_stand_in``), alive until it ends
_made: list = []


def put_back_held() -> None:
    """Takes the stand-ins out of the file objects, and lets go of those made while traced (the
    bound ones are put back by ``cached_reads.put_back_cached``)."""
    while _held:
        obj, name, stand_in = _held.pop()
        if obj.__dict__.get(name) is stand_in:
            del obj.__dict__[name]
    while _made:
        stand_in = _made.pop()
        _stand_ins.discard(id(stand_in))


def bound_stand_in(value, observer):
    """A stand-in for ``value`` if it is a builtin that makes an effect outside the program (a
    file object's ``write``, bound before tracing) or reads the wall clock (``datetime.datetime.now``),
    or a ``functools.partial`` of one; else None."""
    function = value.func if type(value) is functools.partial else value
    if type(function) is not types.BuiltinMethodType:
        return None
    if reads_clock(function):  # (``datetime.datetime.now``: ``clocks``)
        return _stand_in(function, value, _made, _refuse_clock)
    owner = function.__self__
    reads = function.__name__ in FILE_READS and isinstance(owner, FILES) and observer.reached_from_outside(owner)
    if not reads and effect(function, observer) is None:
        return None
    return _stand_in(function, value, _made)
