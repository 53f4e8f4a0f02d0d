"""Python side effects of a function a transform runs as one eager call (``functorch_calls``).

Such a call runs the user's function more often than eager does: once more while compiling (on
fake tensors, for its output's shapes) and again in the backward (``fallback._vjp_of`` runs the
call again under autograd). A function that only computes gives the same values either way; one
that writes Python state outside itself (a counter it increments, a list it appends to, a global
it sets, ``print``) would write it more often than eager: refused, naming what it writes.

The functions are read from their bytecode: the transformed function, the functions its closure
holds, those it calls by global name, and the functions defined inside them. Code of torch and
thunder_rs is not read (only searched for the user's functions it holds, as ``jacrev``'s wrapper
holds the function it differentiates). A write is one to state the call does not make itself: a
global or nonlocal name assigned, or an item, attribute or mutating method (``append``, ``update``)
of a list, dict, set or user object that a global or closure variable holds.
"""

import builtins
import collections
import dis
import functools
import types

#: Methods that change the list, dict, set or deque they are called on.
_MUTATORS = frozenset(
    "append extend insert pop popleft appendleft add update setdefault clear remove discard sort reverse".split()
)
_LOADS = frozenset(("LOAD_GLOBAL", "LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_NAME"))
_STORES = frozenset(("STORE_SUBSCR", "DELETE_SUBSCR", "STORE_ATTR", "DELETE_ATTR"))
_LIBRARIES = ("torch", "thunder_rs", "functorch")


def _library(fn) -> bool:
    return (getattr(fn, "__module__", None) or "").partition(".")[0] in _LIBRARIES


def _state(value) -> bool:
    """A value whose writes last beyond the call: a mutable container or an instance of a user's
    class (not a tensor, module, function or class: their writes are traced or not Python state)."""
    if isinstance(value, (list, dict, set, bytearray, collections.deque)):
        return True
    kind = type(value)
    if isinstance(value, (types.ModuleType, types.FunctionType, types.MethodType, type, functools.partial)):
        return False
    return kind.__module__ not in ("builtins", *_LIBRARIES) and not kind.__module__.startswith(_LIBRARIES)


class _Reader:
    """The values a code object's free and global names hold."""

    def __init__(self, fn: types.FunctionType):
        self.globals = fn.__globals__
        cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
        self.free = {}
        for name, cell in cells.items():
            try:
                self.free[name] = cell.cell_contents
            except ValueError:
                continue

    def value(self, ins):
        """The value ``ins`` loads, when it loads a global or closure variable; else a marker."""
        if ins.opname in ("LOAD_DEREF", "LOAD_CLASSDEREF"):
            return self.free.get(ins.argval, _MISSING)
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            name = ins.argval
            return self.globals.get(name, getattr(builtins, name, _MISSING))
        return _MISSING


_MISSING = object()


def _write(code: types.CodeType, reader: _Reader, outer: bool) -> str | None:
    """What ``code`` writes outside itself, in words (None where nothing); ``outer`` for a
    function's own code (a nested function's nonlocals are its enclosing call's own)."""
    instructions = list(dis.get_instructions(code))
    for i, ins in enumerate(instructions):
        if ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
            return f"assigns the global {ins.argval}"
        if outer and ins.opname in ("STORE_DEREF", "DELETE_DEREF") and ins.argval in code.co_freevars:
            return f"assigns the nonlocal {ins.argval}"
        if ins.opname in _LOADS:
            value = reader.value(ins)
            if value is builtins.print:
                return "calls print"
            after = instructions[i + 1] if i + 1 < len(instructions) else None
            if after is not None and after.opname in ("LOAD_METHOD", "LOAD_ATTR") and after.argval in _MUTATORS:
                if _state(value):
                    return f"calls {ins.argval}.{after.argval}"
        if ins.opname in _STORES:
            target = _target(instructions, i)
            if target is not None and _state(reader.value(target)):
                return f"writes into {target.argval}"
    return None


def _target(instructions: list, i: int):
    """The instruction loading the container or object that ``instructions[i]`` (an item or
    attribute write) writes into, where the statement is one of the plain forms: ``c[k] = v``
    (``v``, ``c``, ``k``, then the store), ``o.a = v`` (``v``, ``o``), or an augmented one (``c[k]
    += v``: the target loaded first in the statement, rotated into place by ``SWAP``)."""
    before = instructions[i - 1] if i else None
    if before is None:
        return None
    if before.opname == "SWAP":
        start = i
        while start > 0 and instructions[start].starts_line is None:
            start -= 1
        return next((x for x in instructions[start:i] if x.opname.startswith("LOAD_")), None)
    if instructions[i].opname.endswith("_ATTR"):
        return before
    simple = before.opname in ("LOAD_CONST", "LOAD_FAST", *_LOADS)
    return instructions[i - 2] if simple and i >= 2 else None


def _codes(code: types.CodeType):
    """``code`` and the code of the functions defined in it."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _unwrapped(fn):
    fn = getattr(fn, "__func__", fn)  # (a bound method)
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "func", fn) if type(fn).__name__ == "Transformed" else fn


def side_effect(fn) -> str | None:
    """What ``fn`` (and the functions it reaches) writes outside itself, in words: ``"<name> at
    <file>:<line> <what>"``; None where it only computes."""
    pending, seen = [fn], set[int]()
    while pending and len(seen) < 200:
        f = _unwrapped(pending.pop())
        if not isinstance(f, types.FunctionType) or id(f) in seen:
            continue
        seen.add(id(f))
        reader = _Reader(f)
        pending.extend(v for v in reader.free.values() if callable(v))
        if _library(f):
            continue
        for code in _codes(f.__code__):
            what = _write(code, reader, code is f.__code__)
            if what is not None:
                return f"{f.__qualname__} at {code.co_filename}:{code.co_firstlineno} {what}"
            names = (i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL")
            pending.extend(v for v in map(f.__globals__.get, names) if isinstance(v, types.FunctionType))
    return None
