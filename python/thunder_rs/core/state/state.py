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
type (a new call's cache holds new layers, each guarded through its path). So is an argument
object another holds as an attribute (an ``EncoderDecoderCache``'s ``self_attention_cache``,
which ``generate`` makes anew each call): reading it guards its type (``PathObjectGuard``), and
such objects must be distinct in each call as they were when traced (``DistinctGuard``). A tensor an
argument object holds is read anew on every call (``reached.ArgumentTensor``): its guard is on
its metadata, not on the tensor.

After tracing, the attributes the program set on these objects are found by comparing with the
copies: they are undone (tracing must not leave its stand-ins in user objects) and become writes
that every compiled call repeats (``config.problem_type = ...``, set once in eager too, then read;
``layer.keys = torch.cat(...)`` in a KV cache, with each call's tensor).
"""

import inspect
import os
import sys

import torch

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.state.aliases import DistinctGuard
from thunder_rs.core.state.cached_reads import is_stand_in, original
from thunder_rs.core.state.handed_effects import is_handed_stand_in, stand_in_held
from thunder_rs.core.state.code_reads import in_stdlib
from thunder_rs.core.state.containers import StateContainers
from thunder_rs.core.state.guards import (
    MISSING,
    DictGuard,
    Guard,
    InputSource,
    NamesGuard,
    ObjectSource,
    attributes_of,
    is_simple,
    read_at,
    short,
)
from thunder_rs.core.state.tensor_guards import TensorGuard, tensor_meta
from thunder_rs.core.state.items import same_attributes
from thunder_rs.core.state.reached import ArgumentTensor


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


class PathObjectGuard(WrittenGuard):
    """An argument object that another holds as an attribute and that is state of its own,
    guarded through its path (``cache.self_attention_cache`` of an ``EncoderDecoderCache``, see
    ``core.reached``): what the program reads of it is guarded there, so any object of its type
    may be there. (Not by identity: ``generate`` makes a new cache on each call.)"""

    def __init__(self, source: InputSource, name: str, expected_type: type, origin: str):
        super().__init__(source, name, expected_type)
        self.origin = origin

    def describe(self, flat) -> str:
        return (
            f"{self.source.describe(self.name)} changed from a {self.expected_type.__name__} to "
            f"{short(self.read(flat))} (read at {self.origin})"
        )


class IntGuard(WrittenGuard):
    """An int an argument object holds that the trace takes as a size input (``dynamic.HeldInt``:
    a count a KV cache keeps): any int may be there; the entry's size checks (``SizesGuard``)
    check its value against what the trace relied on. Of ``kind`` float, a float the trace takes
    as an input (``float_args.HeldFloat``): any float may be there."""

    def __init__(self, source: InputSource, name: str, origin: str, kind: type = int):
        super().__init__(source, name, kind)
        self.origin = origin

    def describe(self, flat) -> str:
        now, kind = self.read(flat), "an int" if self.expected_type is int else "a float"
        return f"{self.source.describe(self.name)} is no longer {kind}: {short(now)} (read at {self.origin})"


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
        self.expected = original(self._now())  # (a cached staticmethod's stand-in while traced: ``cached_reads``)

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


class HeldDictGuard(DictGuard):
    """A fixed state object guarded whole (``DictGuard``) whose tensor attributes at ``held`` every
    call reads anew (``ProgramState.read_tensors_per_call``): any tensor may be there, its
    metadata checked by a ``TensorGuard``. Attributes at ``free`` the program stores before any
    read of them (``ProgramState.stored_first``) may hold anything, or be absent."""

    def __init__(self, guard: DictGuard, held: frozenset, free: frozenset = frozenset()):
        self.source, self.origin, self.per_call, self.held = guard.source, guard.origin, guard.per_call, held
        self.found = {k: v for k, v in guard.found.items() if k not in held and k not in free}
        self.names, self.free = (guard.found.keys() | held) - free, free

    def holds(self, flat) -> bool:
        return same_held_attributes(self.source.mapping(flat), self.found, self.names, self.held, self.free)

    def describe(self, flat) -> str:
        now = self.source.mapping(flat)
        if now.keys() - self.free != self.names or not all(isinstance(now[k], torch.Tensor) for k in self.held):
            return f"{self.source.label} gained or lost attributes, or a tensor one (read at {self.origin})"
        return super().describe(flat)

    def term(self, index: int, scope: dict) -> str:
        scope[f"e{index}"] = (self.found, self.names, self.held, self.free)
        scope[f"f{index}"] = same_held_attributes
        return f"f{index}({self.source.code(f'm{index}', scope)}, *e{index})"


def same_held_attributes(now, found: dict, names, held: frozenset, free: frozenset) -> bool:
    """Whether an object's attributes ``now`` are ``names`` (besides ``free``), tensors at ``held``
    and the others as ``found``."""
    return (
        (now.keys() - free if free else now.keys()) == names
        and all(isinstance(now[k], torch.Tensor) for k in held)
        and same_attributes({k: now[k] for k in found}, found)
    )


#: ``ProgramState.names_read``'s name for an object read whole
ALL_READ = object()


def of_the_stdlib(obj) -> bool:
    """Whether ``obj`` is an instance of a class of the standard library's Python code."""
    t = type(obj)  # (not ``isinstance``: it reads ``__class__``, which a config's ``__getattribute__`` answers)
    if obj is None or issubclass(t, type):
        return False
    path = getattr(sys.modules.get(t.__module__), "__file__", None)
    return path is not None and in_stdlib(os.path.abspath(path))


def stands_in(value) -> bool:
    """Whether ``value`` stands in for a function while traced (a clock, a cached function, a file
    object's write: ``cached_reads``, ``handed_effects``), not a write of the program's."""
    return is_stand_in(value) or is_handed_stand_in(value)


class StateObject:
    __slots__ = ("obj", "source", "found", "whole", "cls")

    def __init__(self, obj, source, whole: bool):
        self.obj, self.source, self.whole = obj, source, whole
        #: ``(type(obj), obj.__class__)`` once read (``ProgramState.class_of``)
        self.cls: tuple | None = None
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
        #: ``{(id of the holder's attributes, name): int or float}`` of the ints the trace takes as
        #: size inputs and the floats it takes as inputs (``traced_inputs.int_stand_ins``): any may be there
        self.symbolic_ints: dict = {}
        #: the lists and dicts of lasting state read, whose changes every call repeats
        self.containers = StateContainers()
        #: ``(id(obj), name)`` of the attributes read through ``read`` (``ALL_READ``: ``read_whole``),
        #: and of those a method stored before every read of them (``code_reads.stored_by_calls``)
        self.names_read: set = set()
        self.stored_first: set = set()
        #: the attributes the program set or deleted, with what they held before (``writes``)
        self.written: list = []
        #: id -> source of the argument objects guarded through their path, not by identity
        #: (``PathObjectGuard``)
        self.by_path: dict = {}
        #: ids of the state objects the program set or deleted attributes of (``writes``)
        self.written_ids: set = set()
        #: ``(id(obj), name)`` of the attributes code other than the program set (``bystanders``)
        self.interrupted: set = set()

    def __contains__(self, obj) -> bool:
        return id(obj) in self._objects

    def add(self, obj, source, whole: bool = False) -> None:
        """Adds a state object; ``whole``: an argument object guarded on all its attributes."""
        if id(obj) not in self._objects:
            self._objects[id(obj)] = StateObject(obj, source, whole)
            stand_in_held(obj)  # a file object's writes and reads, however the program calls them

    def found_attributes(self) -> list:
        """``(object, its instance dict, its attributes when the program found it)`` of each state
        object with an instance dict (``bystanders``: what code other than the program changes in it
        is taken as found)."""
        return [
            (k.obj, now, k.found)
            for k in self._objects.values()
            if k.found is not None and isinstance(now := attributes_of(k.obj), dict)
        ]

    def was_read(self, obj, name: str) -> bool:
        """Whether the observer saw the program read ``obj.name`` (or all of ``obj``)."""
        return (id(obj), name) in self.names_read or (id(obj), ALL_READ) in self.names_read

    def class_of(self, obj):
        """``obj.__class__``, which ``isinstance`` reads where ``obj``'s type is not the class asked
        about, for a state object: read once per type the object has (a transformers config's
        ``__getattribute__`` is Python code, which ran for each such ``isinstance`` of the
        observer's; the type where that read finds no class); None for an object that is not state."""
        known = self._objects.get(id(obj))
        if known is None:
            return None
        t = type(obj)
        if known.cls is None or known.cls[0] is not t:
            try:
                found = obj.__class__
            except AttributeError:  # (as ``isinstance`` takes it: the type only)
                found = t
            known.cls = (t, found if isinstance(found, type) else t)
        return known.cls[1]

    def source_of(self, obj):
        known = self._objects.get(id(obj))
        return known.source if known is not None else None

    def read(self, obj, name: str, origin: str, guards: dict):
        """Guards the read of ``obj.name`` (a state object's attribute) in ``guards``; returns the
        value the call found, or MISSING when it had no such attribute then."""
        known = self._objects[id(obj)]
        found = known.found.get(name, MISSING)
        self.names_read.add((id(obj), name))
        # Each guard is made at the first read of its key only (a ``DictGuard`` copies all of the
        # object's attributes: a config read many times over made one per read).
        if isinstance(known.source, ObjectSource):
            if ("object", id(obj)) not in guards:
                guards[("object", id(obj))] = DictGuard(known.source, known.found, origin)
        elif known.whole:
            self._guard_whole(known, origin, guards)
        else:
            if ("input", id(obj), name) not in guards:
                guards[("input", id(obj), name)] = self._input_guard(known, name, found, origin)
            self._guard_held_items(found, origin, guards)
        return found

    def read_whole(self, obj, origin: str, guards: dict) -> None:
        """Guards all of a state object's attributes: the program read them through library code
        the observer does not follow (``vars(cfg)``, ``dataclasses.astuple(cfg)``)."""
        known = self._objects[id(obj)]
        self.names_read.add((id(obj), ALL_READ))
        if known.found is None:
            return
        if isinstance(known.source, ObjectSource):
            if ("object", id(obj)) not in guards:
                guards[("object", id(obj))] = DictGuard(known.source, known.found, origin)
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
            if ("input", id(known.obj), name) not in guards:
                guards[("input", id(known.obj), name)] = self._input_guard(known, name, value, origin)
            self._guard_held_items(value, origin, guards)

    def _input_guard(self, known: StateObject, name: str, value, origin: str):
        source = known.source
        kind = self.symbolic_ints.get((id(attributes_of(known.obj)), name)) if self.symbolic_ints else None
        if kind is not None:
            return IntGuard(source, name, origin, kind)
        held = self._argument_tensors.get(id(value)) if isinstance(value, torch.Tensor) else None
        if held is not None:
            return TensorGuard(source, name, held.meta, origin, held.symbolic)
        if self._on_own_path(source, name, value):
            self.by_path[id(value)] = self._objects[id(value)].source
            return PathObjectGuard(source, name, type(value), origin)
        return Guard(source, name, value, origin, self._held_items(value), self._reached_items(value))

    def _on_own_path(self, source, name: str, value) -> bool:
        """Whether ``value``, read as ``name`` at ``source`` (an argument object's), is state of its
        own whose source is that very path: what the program reads of it is guarded there."""
        known = self._objects.get(id(value))
        return (
            known is not None
            and type(source) is InputSource
            and type(known.source) is InputSource
            and known.source.key == ("input", source.position, (*source.path, name))
        )

    def guard_distinct(self, guards: dict) -> None:
        """Guards that the objects guarded through their paths (``PathObjectGuard``) are distinct."""
        if len(self.by_path) > 1:
            guards[("distinct",)] = DistinctGuard(list(self.by_path.values()))

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
        where no read of it is guarded. An attribute of an object of the standard library's
        classes, which its own methods set (``threading.Semaphore.acquire``: ``self._value -= 1``,
        a read the observer does not follow), is guarded by its value: a compiled call sets the
        value the traced call computed from it, which only that value gives again."""
        for source, name, before in self.written:
            if not any(
                getattr(g, "source", None) is source and getattr(g, "name", None) == name for g in guards.values()
            ):
                if before is not MISSING and is_simple(before) and of_the_stdlib(getattr(source, "obj", None)):
                    why = f"{type(source.obj).__qualname__}'s own code, which the program called and which set it"
                    guards.setdefault(("written", id(source), name), Guard(source, name, before, why))
                else:
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

    def relax_stored_first(self, guards: dict) -> None:
        """Lets a global object's attributes that the program stores, through a method, before any
        read of them (``self.reset()`` setting ``self.items = []``, then ``self.items``) hold
        anything in its whole guard: every call stores them again, and guarding the last call's
        value compiled on every call. Not where the object was read whole (``vars(obj)``)."""
        free: dict = {}
        for key, name in self.stored_first:
            if (key, name) not in self.names_read and (key, ALL_READ) not in self.names_read:
                free.setdefault(key, set()).add(name)
        for key, names in free.items():
            guard = guards.get(("object", key))
            if type(guard) is DictGuard:
                guards[("object", key)] = HeldDictGuard(guard, frozenset(), frozenset(names))
            elif type(guard) is HeldDictGuard:
                guards[("object", key)] = HeldDictGuard(guard, guard.held, guard.free | frozenset(names))

    def read_tensors_per_call(self, captured: list, stored: list, guards: dict) -> None:
        """Makes each tensor among ``captured`` that a global object guarded whole holds (``STATE.last``,
        which the program reads and sets to a new tensor on each call) read there by every call, guarded on
        its metadata rather than on the tensor: it compiled once per call. Tensors requiring grad, and those
        the program also stores as they are (``stored``), stay captured (``Observer._read_attributes_per_call``
        does this for modules)."""
        found = {
            id(v): (key, g, name)
            for key, g in guards.items()
            if type(g) is DictGuard
            for name, v in g.found.items()
            if isinstance(v, torch.Tensor)
        }
        held: dict = {}
        for i, t in enumerate(captured):
            at = found.get(id(t)) if isinstance(t, torch.Tensor) and not stored[i] else None
            if at is None or t.requires_grad or isinstance(t, TensorProxy):
                continue
            key, guard, name = at
            source, meta = guard.source, tensor_meta(t)
            if not isinstance(source, ObjectSource):  # (the dict of a fixed object: a global's)
                continue
            captured[i] = ArgumentTensor(source, name, source.obj, meta, guard.origin)
            guards[("held", id(source.obj), name)] = TensorGuard(source, name, meta, guard.origin)
            held.setdefault(key, (guard, set()))[1].add(name)
        for key, (guard, names) in held.items():
            guards[key] = HeldDictGuard(guard, frozenset(names))

    def stored_values(self) -> list:
        """The values the program set on state objects, one per attribute holding one (still there:
        ``writes`` undoes them), for ``returned_objects.made_objects``."""
        values = []
        for known in self._objects.values():
            if known.found is not None:
                now = attributes_of(known.obj)
                values += [now[k] for k in now if known.found.get(k, MISSING) is not now[k] and not stands_in(now[k])]
        return values

    def writes(self) -> list:
        """The attributes the program set or deleted on state objects, undone here: ``(holder, name,
        value)`` with ``holder`` an object or an ``InputSource``, ``value`` MISSING for a deletion."""
        out = []
        for known in self._objects.values():
            if known.found is None:
                continue
            now = attributes_of(known.obj)
            changed = [k for k in now if known.found.get(k, MISSING) is not now[k] and not stands_in(now[k])]
            removed = [k for k in known.found if k not in now]
            if changed or removed:
                self.written_ids.add(id(known.obj))
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
