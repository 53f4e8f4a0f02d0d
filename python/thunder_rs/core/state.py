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

from thunder_rs.core.guards import MISSING, DictGuard, Guard, InputSource, ObjectSource


class StateObject:
    __slots__ = ("obj", "source", "found")

    def __init__(self, obj, source):
        self.obj, self.source = obj, source
        #: the attributes when the program first reached the object
        self.found = dict(obj.__dict__) if isinstance(getattr(obj, "__dict__", None), dict) else None


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
            now = known.obj.__dict__
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

