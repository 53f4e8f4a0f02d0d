"""Python objects a traced program reads as state: configs, argument objects, objects reached from
modules and globals.

Each is recorded the first time the program reaches it, with a copy of its attributes then: the
state the call found. Guards hold those values, not ones the program itself wrote earlier in the
call (a flag it sets, reads and restores). A fixed object (a config reached from a module or a
global) is guarded whole, so reads the observer cannot see (``getattr(config, name)``) are
covered too; an argument object, new each call, is guarded on the attributes read.

After tracing, the attributes the program set on these objects are found by comparing with the
copies: they are undone (tracing must not leave its stand-ins in user objects) and become writes
that every compiled call repeats (``config.problem_type = ...``, set once in eager too, then read).
"""

import types

import torch

from thunder_rs.core.guards import MISSING, DictGuard, Guard, InputSource, ObjectSource, attributes_of, is_simple
from thunder_rs.errors import ThunderNotImplementedError


class StateObject:
    __slots__ = ("obj", "source", "found")

    def __init__(self, obj, source):
        self.obj, self.source = obj, source
        #: the attributes when the program first reached the object
        attributes = attributes_of(obj)
        self.found = None if attributes is None else dict(attributes)


class ProgramState:
    """The state objects of one acquisition, and the guards on what was read from them."""

    def __init__(self):
        self._objects: dict = {}

    def __contains__(self, obj) -> bool:
        return id(obj) in self._objects

    def add(self, obj, source) -> None:
        if id(obj) not in self._objects:
            self._objects[id(obj)] = StateObject(obj, source)

    def source_of(self, obj):
        known = self._objects.get(id(obj))
        return known.source if known is not None else None

    def read(self, obj, name: str, origin: str, guards: dict):
        """Guards the read of ``obj.name`` (a state object's attribute) in ``guards``; returns the
        value the call found, or MISSING when it had no such attribute then."""
        known = self._objects[id(obj)]
        found = known.found.get(name, MISSING)
        if isinstance(known.source, ObjectSource):
            guards.setdefault(("object", id(obj)), DictGuard(known.source, known.found, origin))
        else:
            guards.setdefault(("input", id(obj), name), Guard(known.source, name, found, origin))
        return found

    def writes(self) -> list:
        """The attributes the program set or deleted on state objects, undone here: ``(holder, name,
        value)`` with ``holder`` an object or an ``InputSource``, ``value`` MISSING for a deletion."""
        out = []
        for known in self._objects.values():
            if known.found is None:
                continue
            now = attributes_of(known.obj)
            changed = [k for k in now if known.found.get(k, MISSING) is not now[k]]
            removed = [k for k in known.found if k not in now]
            for name in changed + removed:
                out.append((known.obj if not isinstance(known.source, InputSource) else known.source, name,
                            now.get(name, MISSING)))
            for name in changed:
                if name in known.found:
                    now[name] = known.found[name]
                else:
                    del now[name]
            for name in removed:
                now[name] = known.found[name]
        return out


# -- objects reached through containers -------------------------------------------------------------

#: How deep ``reached_objects`` follows attributes and containers from an argument.
_DEPTH = 4


def reached_objects(inputs) -> dict:
    """The Python objects reachable from the program's arguments through attributes, lists, tuples
    and dicts (modules and tensors have their own tracking): id -> (object, a copy of its
    attributes). The observer follows attribute chains only, so an object reached by a subscript
    (``cache.layers[i]``) is compared afterwards instead: see ``check_unrepeated_writes``."""
    found: dict = {}

    def visit(x, depth: int) -> None:
        if depth > _DEPTH or is_simple(x) or isinstance(x, (torch.Tensor, torch.nn.Module, type, types.ModuleType,
                                                             types.FunctionType, types.MethodType)):
            return
        if type(x) in (list, tuple):
            for y in x:
                visit(y, depth + 1)
            return
        if type(x) is dict:
            for y in x.values():
                visit(y, depth + 1)
            return
        attributes = getattr(x, "__dict__", None)
        if isinstance(attributes, dict) and id(x) not in found:
            found[id(x)] = (x, dict(attributes))
            for y in attributes.values():
                visit(y, depth + 1)

    for x in inputs:
        visit(x, 0)
    return found


def check_unrepeated_writes(reached: dict, state: ProgramState) -> None:
    """Refuses (after putting the attributes back) a write the program made to an object it reached
    through a container and that no compiled call would repeat: ``self.layers[i].length += 1`` in a
    Hugging Face cache."""
    for obj, before in reached.values():
        if obj in state:
            continue  # a state object: its writes are repeated by every call
        now = obj.__dict__
        changed = [k for k in set(now) | set(before) if now.get(k, MISSING) is not before.get(k, MISSING)]
        if changed:
            now.clear()
            now.update(before)
            raise ThunderNotImplementedError(
                f"thunder_rs.jit: the traced program set {type(obj).__name__}.{sorted(changed)[0]} on an object it "
                "reached through a list or dict of its arguments (such as a cache's layers); a compiled call would "
                "not set it again. Keep such state in a tensor the program updates in place")
