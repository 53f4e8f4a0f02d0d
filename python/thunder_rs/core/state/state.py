"""Python objects a traced program reads as state: configs, argument objects, objects reached from
modules and globals.

Each is recorded the first time the program reaches it, with a copy of its attributes then: the
state the call found. Guards hold those values, not ones the program itself wrote earlier in the
call (a flag it sets, reads and restores). A fixed object (a config reached from a module or a
global) is guarded whole, so reads the observer cannot see (``getattr(config, name)``) are
covered too; an argument object, new each call, is guarded on the attributes read.

An object reached from an argument through a list or dict (``cache.layers[0]``, see
``core.reached``) is guarded whole too, through its path in each call's arguments: the observer
follows attribute chains, not loops over containers, so it may miss reads of it. The list or
dict holding it is then compared by type and items, such an object matching any object of its
type (a new call's cache holds new layers, each guarded through its path). A tensor an
argument object holds is read anew on every call (``reached.ArgumentTensor``): its guard is on
its metadata, not on the tensor.

After tracing, the attributes the program set on these objects are found by comparing with the
copies: they are undone (tracing must not leave its stand-ins in user objects) and become writes
that every compiled call repeats (``config.problem_type = ...``, set once in eager too, then read;
``layer.keys = torch.cat(...)`` in a KV cache, with each call's tensor).
"""

import inspect

import torch

from thunder_rs.core.state.containers import StateContainers
from thunder_rs.core.state.guards import (
    MISSING,
    DictGuard,
    Guard,
    InputSource,
    NamesGuard,
    ObjectSource,
    TensorGuard,
    attributes_of,
    read_at,
    short,
)


class IntGuard:
    """An int an argument object holds that the trace takes as a size input (``dynamic.HeldInt``:
    a count a KV cache keeps): any int may be there; the entry's size checks (``SizesGuard``)
    check its value against what the trace relied on."""

    def __init__(self, source: InputSource, name: str, origin: str):
        self.source, self.name, self.origin = source, name, origin

    @property
    def per_call(self) -> bool:
        return self.source.per_call

    def read(self, flat):
        return read_at(self.source, self.name, flat)

    def holds(self, flat) -> bool:
        return type(self.read(flat)) is int

    def describe(self, flat) -> str:
        now = self.read(flat)
        return f"{self.source.describe(self.name)} is no longer an int: {short(now)} (read at {self.origin})"

    def term(self, index: int, scope: dict) -> str:
        return f"type({self.source.code(f'm{index}', scope)}.get({self.name!r}, MISSING)) is int"


class WrittenGuard:
    """An attribute the program set on a state object, possibly after reading it where the
    observer does not follow (torch's ``GradScaler.scale`` makes its ``_scale`` when it is None):
    holds while the attribute holds what it held when traced, by type (None, a tensor, missing),
    so that a call finding it set runs a trace that reads it rather than one that sets it again.
    (Not by identity: a program that stores a new value on each call, ``self.last = out``, hits.)"""

    def __init__(self, source, name: str, expected_type: type):
        self.source, self.name, self.expected_type = source, name, expected_type
        self.origin = "the traced program, which set it"

    @property
    def per_call(self) -> bool:
        return self.source.per_call

    def read(self, flat):
        return read_at(self.source, self.name, flat)

    def holds(self, flat) -> bool:
        return type(self.read(flat)) is self.expected_type

    def describe(self, flat) -> str:
        return (
            f"{self.source.describe(self.name)}, which the program sets, held a {self.expected_type.__name__} when "
            f"traced and now holds {short(self.read(flat))}"
        )

    def term(self, index: int, scope: dict) -> str:
        scope[f"e{index}"] = self.expected_type
        return f"type({self.source.code(f'm{index}', scope)}.get({self.name!r}, MISSING)) is e{index}"


class MethodGuard:
    """A method of the program's class that the program called through an instance
    (``self.act(y)``): holds while the class still gives that function, so rebinding it on the
    class or a base between calls recompiles. One ``getattr`` per call, through the type's
    attribute cache."""

    per_call = True
    source = None

    def __init__(self, cls: type, name: str, origin: str):
        self.cls, self.name, self.origin = cls, name, origin
        # A classmethod reads as a new bound method each time: compare what it binds.
        self.bound = isinstance(inspect.getattr_static(cls, name, None), classmethod)
        self.expected = self._now()

    def _now(self):
        found = getattr(self.cls, self.name, MISSING)
        return getattr(found, "__func__", MISSING) if self.bound else found

    def holds(self, flat) -> bool:
        return self._now() is self.expected

    def describe(self, flat) -> str:
        return f"method {self.name!r} of {self.cls.__qualname__} was rebound (called at {self.origin})"

    def term(self, index: int, scope: dict) -> str:
        scope[f"c{index}"], scope[f"e{index}"] = self.cls, self.expected
        read = f"getattr(c{index}, {self.name!r}, MISSING)"
        return f"getattr({read}, '__func__', MISSING) is e{index}" if self.bound else f"{read} is e{index}"


class StateObject:
    __slots__ = ("obj", "source", "found", "whole")

    def __init__(self, obj, source, whole: bool):
        self.obj, self.source, self.whole = obj, source, whole
        #: the attributes when the program first reached the object
        attributes = attributes_of(obj)
        self.found = None if attributes is None else dict(attributes)


class ProgramState:
    """The state objects of one acquisition, and the guards on what was read from them.
    ``argument_tensors`` (``reached.ArgumentObjects.tensors``) are the tensors argument objects
    hold that each call reads anew, by id."""

    def __init__(self, argument_tensors: dict | None = None):
        self._objects: dict = {}
        self._argument_tensors = argument_tensors or {}
        #: ``(id of the holder's attributes, name)`` of the ints the trace takes as size inputs
        #: (``acquire._int_stand_ins``): any int may be there
        self.symbolic_ints: set = set()
        #: the lists and dicts of lasting state read, whose changes every call repeats
        self.containers = StateContainers()
        #: the attributes the program set or deleted, with what they held before (``writes``)
        self.written: list = []

    def __contains__(self, obj) -> bool:
        return id(obj) in self._objects

    def add(self, obj, source, whole: bool = False) -> None:
        """Adds a state object; ``whole``: an argument object guarded on all its attributes."""
        if id(obj) not in self._objects:
            self._objects[id(obj)] = StateObject(obj, source, whole)

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
        elif known.whole:
            self._guard_whole(known, origin, guards)
        else:
            guards.setdefault(("input", id(obj), name), self._input_guard(known, name, found, origin))
            self._guard_held_items(found, origin, guards)
        return found

    def read_whole(self, obj, origin: str, guards: dict) -> None:
        """Guards all of a state object's attributes: the program read them through library code
        the observer does not follow (``vars(cfg)``, ``dataclasses.astuple(cfg)``)."""
        known = self._objects[id(obj)]
        if known.found is None:
            return
        if isinstance(known.source, ObjectSource):
            guards.setdefault(("object", id(obj)), DictGuard(known.source, known.found, origin))
        else:
            self._guard_whole(known, origin, guards)

    def guard_whole_objects(self, guards: dict) -> None:
        """Guards every argument object reached through a container, whether or not the observer
        saw the program read it."""
        for known in self._objects.values():
            if known.whole:
                self._guard_whole(known, f"{known.source.label}, reached from the arguments", guards)

    def _guard_whole(self, known: StateObject, origin: str, guards: dict) -> None:
        if ("names", id(known.obj)) in guards:
            return
        assert known.found is not None  # whole objects are those with an instance dict
        guards[("names", id(known.obj))] = NamesGuard(known.source, frozenset(known.found), origin)
        for name, value in known.found.items():
            guards.setdefault(("input", id(known.obj), name), self._input_guard(known, name, value, origin))
            self._guard_held_items(value, origin, guards)

    def _input_guard(self, known: StateObject, name: str, value, origin: str):
        source = known.source
        if self.symbolic_ints and (id(attributes_of(known.obj)), name) in self.symbolic_ints:
            return IntGuard(source, name, origin)
        held = self._argument_tensors.get(id(value)) if isinstance(value, torch.Tensor) else None
        if held is not None:
            return TensorGuard(source, name, held.meta, origin, held.symbolic)
        return Guard(source, name, value, origin, self._held_items(value), self._reached_items(value))

    def _held_items(self, value) -> frozenset:
        """The ids of the tensors among the items of ``value`` (a list or dict) that are read per
        call (``reached.ArgumentTensor``)."""
        if type(value) not in (list, dict) or not self._argument_tensors:
            return frozenset()
        # A tensor of symbolic sizes has a proxy in its place while the program runs.
        held = {
            *self._argument_tensors,
            *(id(a.stand_in) for a in self._argument_tensors.values() if a.stand_in is not None),
        }
        return frozenset(id(x) for x in (value.values() if type(value) is dict else value) if id(x) in held)

    def _reached_items(self, value) -> frozenset:
        """The ids of the objects among the items of ``value`` (a list or dict) that are guarded
        whole through their path in each call's arguments (``core.reached``)."""
        if type(value) not in (list, dict):
            return frozenset()
        items = value.values() if type(value) is dict else value
        return frozenset(id(x) for x in items if (known := self._objects.get(id(x))) is not None and known.whole)

    def guard_written(self, guards: dict) -> None:
        """Guards the type of what each attribute the program set held before (``WrittenGuard``),
        where no read of it is guarded."""
        for source, name, before in self.written:
            if not any(
                getattr(g, "source", None) is source and getattr(g, "name", None) == name for g in guards.values()
            ):
                guards.setdefault(("written", id(source), name), WrittenGuard(source, name, type(before)))

    def guard_held(self, held, origin: str, guards: dict) -> None:
        """Guards the metadata of an argument object's tensor read per call (``held``)."""
        guards.setdefault(
            ("held", id(held.holder), held.name), TensorGuard(held.source, held.name, held.meta, origin, held.symbolic)
        )

    def _guard_held_items(self, value, origin: str, guards: dict) -> None:
        """Guards the tensors a list or dict holds that are read per call: its guard lets any
        tensor take their place."""
        if self._held_items(value):
            for held in self._argument_tensors.values():
                if held.holder is value:
                    self.guard_held(held, origin, guards)

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
                self.written.append((known.source, name, known.found.get(name, MISSING)))
                out.append(
                    (
                        known.obj if not isinstance(known.source, InputSource) else known.source,
                        name,
                        now.get(name, MISSING),
                    )
                )
            for name in changed:
                if name in known.found:
                    now[name] = known.found[name]
                else:
                    del now[name]
            for name in removed:
                now[name] = known.found[name]
        return out
