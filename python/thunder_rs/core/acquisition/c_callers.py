"""Effects a traced program hands to a C caller (``functools.partial(f.write, s)()``,
``list(map(f.write, xs))``, ``operator.methodcaller("write", s)(f)``, ``sorted(xs, key=f.write)``):
refused, naming the line, as a direct call is (``core.state.c_effects``).

The observer's hook sees the builtins the program's code calls, not those a C function calls for
it, so a file object's ``write`` or ``os.kill`` handed to one would run on the first call only,
silently. While some program is traced, ``functools.partial``, ``map``, ``filter``,
``itertools.starmap``, ``sorted``, ``min``, ``max`` and ``operator.methodcaller`` are stand-ins
(``put_callers``, ``put_back_callers``) that refuse a builtin making an effect outside the program
(``c_effects.effect``) when the program makes the caller, and otherwise make what the real one
makes: the same objects, and ``isinstance``, ``issubclass`` and subclassing (``class
P(functools.partial)``) answer for the real type. A caller bound before tracing (``from functools
import partial`` at import) is the real one, and another C caller (``list.sort(key=f.write)``,
``threading.Thread(target=f.write)``) is not followed.
"""

import builtins
import functools
import itertools
import operator
import sys
from typing import Any

from thunder_rs.core.state.c_effects import WRITER_NAMES, effect, program_caller, site
from thunder_rs.core.state.hook import importing_frame, thread_state
from thunder_rs.errors import ThunderNotImplementedError


def _refuse(function, caller: str, frame) -> None:
    """Refuses ``function`` handed to ``caller`` by the code of ``frame`` (the stand-in's caller),
    if it makes an effect outside the program and that code is the program's."""
    observer: Any = thread_state.observer
    if observer is None or thread_state.inside or type(function) is not type(len):
        return
    made = effect(function, observer)
    if made is None:
        return
    program = program_caller(frame)
    if program is None or importing_frame(program, observer.entry):
        return
    raise ThunderNotImplementedError(
        f"{made}: the program hands it to {caller} at {site(frame)}, which calls it for the program (an effect "
        "outside the program: a write to a file, a stream, a socket or the system); tracing made it once, and a "
        "compiled call would not make it again where eager makes it on every call. Make it outside the jitted function"
    )


class _StandIn:
    """Stands in for the type ``real``: a call runs ``checked(frame, *args, **kwargs)`` first and
    makes a ``real``; ``isinstance``, ``issubclass``, subclassing and attributes answer for it."""

    __slots__ = ("real", "_checked")

    def __init__(self, real, checked):
        self.real, self._checked = real, checked

    def __call__(self, *args, **kwargs):
        self._checked(sys._getframe(1), *args, **kwargs)
        return self.real(*args, **kwargs)

    def __instancecheck__(self, obj) -> bool:
        return isinstance(obj, self.real)

    def __subclasscheck__(self, sub) -> bool:
        return issubclass(sub, self.real)

    def __mro_entries__(self, bases) -> tuple:
        return (self.real,)

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def __repr__(self) -> str:
        return repr(self.real)


def _first(name: str):
    def check(frame, function=None, /, *args, **kwargs) -> None:
        _refuse(function, name, frame)

    return check


def _keyed(name: str, real):
    def call(*args, **kwargs):
        _refuse(kwargs.get("key"), name, sys._getframe(1))
        return real(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = real.__doc__
    return call


class _CheckedMethodCaller:
    """``operator.methodcaller(name, ...)`` for a name of an effect (``"write"``): refuses the
    call that would make one."""

    __slots__ = ("_caller", "_name")

    def __init__(self, caller, name: str):
        self._caller, self._name = caller, name

    def __call__(self, obj):
        _refuse(getattr(obj, self._name, None), "operator.methodcaller", sys._getframe(1))
        return self._caller(obj)

    def __repr__(self) -> str:
        return repr(self._caller)

    def __reduce__(self):
        return self._caller.__reduce__()


class _MethodCallerStandIn(_StandIn):
    """``operator.methodcaller``: one for a name of an effect (``"write"``) checks its calls."""

    __slots__ = ()

    def __call__(self, name, /, *args, **kwargs):
        made = self.real(name, *args, **kwargs)
        return _CheckedMethodCaller(made, name) if name in WRITER_NAMES else made


_REAL: list = [
    (functools, "partial", functools.partial),
    (builtins, "map", builtins.map),
    (builtins, "filter", builtins.filter),
    (itertools, "starmap", itertools.starmap),
    (builtins, "sorted", builtins.sorted),
    (builtins, "min", builtins.min),
    (builtins, "max", builtins.max),
    (operator, "methodcaller", operator.methodcaller),
]
_STAND_INS = {
    "partial": _StandIn(functools.partial, _first("functools.partial")),
    "map": _StandIn(builtins.map, _first("map")),
    "filter": _StandIn(builtins.filter, _first("filter")),
    "starmap": _StandIn(itertools.starmap, _first("itertools.starmap")),
    "sorted": _keyed("sorted", builtins.sorted),
    "min": _keyed("min", builtins.min),
    "max": _keyed("max", builtins.max),
    "methodcaller": _MethodCallerStandIn(operator.methodcaller, None),
}


def put_callers() -> None:
    """Puts the stand-ins in (while some program is traced)."""
    for holder, name, _ in _REAL:
        setattr(holder, name, _STAND_INS[name])


def put_back_callers() -> None:
    for holder, name, real in _REAL:
        setattr(holder, name, real)
