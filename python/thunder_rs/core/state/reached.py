"""The Python objects a program can reach from its arguments: state each compiled call finds anew.

An argument such as a Hugging Face ``DynamicCache`` holds its state in objects reached through
lists (``cache.layers[i]``), whose tensors grow every decoding step (``layer.keys =
torch.cat([layer.keys, k], -2)``). Before a program is traced, every object reachable from its
non-tensor arguments through attributes, lists, tuples and dicts is found with its path
(``past_key_values.layers[0]``) and becomes program state (``core.state``): what the program reads from it
is guarded through that path, what it sets on it is set again by every call, on that call's
object (tensors the trace computes among the values are outputs of the trace).

A tensor such an object holds as an attribute, or as an item of a list or dict (``cache.keys[i]``),
is not captured by identity: every call passes the tensor found at its path then as a trace input
(``captured_inputs``), and the entry is guarded on its metadata. A tensor held in several places
(``cache.keys = [t, t]``) is read where it was found first, the others guarded to hold that tensor
(``aliases.SameGuard``), as an object held in several places is; one in a tuple is captured as
other tensors read from outside the inputs are.

Items the program sets in a list or dict reached this way (``cache.is_updated[i] = True``) are
set again by every call, when they are plain values or tensors (a ``Counter``, ``defaultdict`` or
``OrderedDict`` is such a dict). Changes no compiled call would repeat are refused after tracing
(and undone): objects the program made put into such a container (a cache making its layers in the
call), and writes to objects reached under a key that is no path (a dict keyed by a tuple), and
changes to the other containers reached from the arguments (a set, a ``bytearray``, an
``array.array``, a subclass of list or dict: ``seen.add(k)``), which no compiled call would make
again. The items of a list or dict that no read the observer sees guards (an argument itself, one
held in another list or dict: ``[]`` runs no Python code), or that the program changed, are
guarded as found (``ItemsGuard``).
"""

import array
import collections
import itertools
import types
import weakref
from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree

from thunder_rs.core.state.guards import MISSING, InputItemsSource, InputSource, Item, Source, is_simple
from thunder_rs.core.state.items import ANY_TENSOR, DICTS, SameType, same_held_items
from thunder_rs.core.state.tensor_guards import tensor_meta
from thunder_rs.core.base.userframe import user_location
from thunder_rs.errors import ThunderNotImplementedError

#: How deep objects are followed from an argument, in attribute and item steps.
_DEPTH = 4
#: Values never followed: tensors (handled apart), modules (bound as modules), code and types.
_NOT_FOLLOWED = (
    torch.Tensor,
    torch.nn.Module,
    type,
    types.ModuleType,
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
    # Weak containers: read whole, by the guard on where the program found them (``items.members``).
    weakref.WeakKeyDictionary,
    weakref.WeakValueDictionary,
    weakref.WeakSet,
)
#: Followed by item: the standard library's dicts too (a ``Counter`` of calls, a ``defaultdict``:
#: ``items.DICTS``), whose item writes every call makes again as a dict's.
_CONTAINERS = (list, tuple, *DICTS)
#: Containers changed in place whose changes no compiled call makes again (those of the exact
#: ``_CONTAINERS`` are set again by every call): refused (``refuse_changed_in_place``).
_IN_PLACE = (list, dict, set, collections.deque, bytearray, array.array)


@dataclass(eq=False)
class ArgumentTensor:
    """A tensor an argument object holds as ``holder.name`` (or a list or dict as ``holder[name]``),
    at ``source`` in each call's arguments:
    a trace input that every call reads there. ``origin`` is the user's line that first used it."""

    #: an ``InputSource``, or a ``containers.HeldItemsSource`` for a cache of module state
    source: Source
    name: str | int
    holder: object
    #: its ``guards.tensor_meta`` when found (before the program runs, outside torch function modes)
    meta: tuple
    origin: str = ""
    #: its dims whose sizes the trace takes as size inputs (``core.acquisition.dynamic``): the
    #: guard on its metadata leaves them out
    symbolic: frozenset = frozenset()
    #: the proxy put in its place while the program is traced (``traced_inputs.put_stand_ins``), or None
    stand_in: object = None

    def used(self) -> "ArgumentTensor":
        """Marks the tensor as taken by the trace, noting the line that took it."""
        self.origin = self.origin or user_location()
        return self


class ArgumentObjects:
    """The objects reachable from the flat inputs, found before the program runs.

    ``objects``: ``(object, source, under a container)``; ``tensors``: id -> ``ArgumentTensor``
    for tensors held as an attribute in one place; ``containers``: the lists and dicts on the way,
    with a copy of their items and their source; ``unsourced``: objects under keys that are no
    path, with a copy of their attributes.
    """

    def __init__(self, flat_inputs: list, names: list):
        #: the user's name of each flat input (``past_key_values``, ``cache``), for guards and errors
        self.names = names
        self.objects: list = []
        self.tensors: dict = {}
        self.containers: list = []
        self.unsourced: list = []
        #: id -> ``(container, its contents, source)`` of the ``_IN_PLACE`` containers found
        self.in_place: dict = {}
        self._seen: set = set()
        #: id -> where each object, list and dict (and tuple of objects) was first found
        self._first: dict = {}
        #: ``(first source, another)``: the other places found to hold one of them (``aliases.SameGuard``)
        self.aliases: list = []
        #: ids of the lists and dicts whose items the program set (``item_writes``)
        self.written: set = set()
        #: ids of the lists and dicts whose items no read the observer sees guards: an argument
        #: itself (a ``Counter``, which no pytree flattens) and those held in another list or dict
        #: (read by ``[]``, which runs no Python code): ``item_guards``
        self.unseen: set = set()
        for i, x in enumerate(flat_inputs):
            if not isinstance(x, torch.Tensor):
                self._visit(x, i, (), names[i], 0, False)

    def _visit(self, x, position: int, path: tuple, label: str, depth: int, under: bool) -> None:
        if isinstance(x, _NOT_FOLLOWED):
            return
        if id(x) in self._seen:
            first = self._first.get(id(x))
            if first is not None:
                self.aliases.append((first, InputSource(position, path, label)))
            return
        if depth > _DEPTH:
            return
        if isinstance(x, _IN_PLACE) and type(x) not in _CONTAINERS and id(x) not in self.in_place:
            self.in_place[id(x)] = (x, _contents(x), InputSource(position, path, label))
        if type(x) in _CONTAINERS:
            self._seen.add(id(x))
            if type(x) is not tuple or not is_simple(x):
                self._first[id(x)] = InputSource(position, path, label)
            if type(x) is not tuple:
                self.containers.append((x, _items(x), InputSource(position, path, label)))
                if under or not path:
                    self.unseen.add(id(x))
            if not is_simple(x) or any(type(y) is list for y in x):  # (``[[]]`` is simple: a list in it changes)
                items = InputItemsSource(position, path, label)
                for key, y in x.items() if type(x) in DICTS else enumerate(x):
                    step = Item(key) if type(key) in (int, str) else None
                    if step is None:
                        self._unsourced(y)
                    elif isinstance(y, torch.Tensor) and type(x) is not tuple:
                        self._tensor(y, items, key, x)
                    else:
                        self._visit(y, position, (*path, step), f"{label}{step}", depth + 1, True)
            return
        attributes = getattr(x, "__dict__", None)
        if is_simple(x) or not isinstance(attributes, dict):
            return
        self._seen.add(id(x))
        source = self._first[id(x)] = InputSource(position, path, label)
        self.objects.append((x, source, under))
        for name, y in attributes.items():
            if isinstance(y, torch.Tensor):
                self._tensor(y, source, name, x)
            else:
                self._visit(y, position, (*path, name), f"{label}.{name}", depth + 1, under)

    def sources(self) -> dict:
        """id -> where each object, list and dict reached from the arguments was found first."""
        return self._first

    def _tensor(self, t, source: InputSource, name: str | int, holder) -> None:
        first = self.tensors.get(id(t))
        if first is not None:  # held twice (``cache.keys = [t, t]``): read where first found, one tensor in both
            self.aliases.append((_place(first.source, first.name), _place(source, name)))
            return
        self.tensors[id(t)] = ArgumentTensor(source, name, holder, tensor_meta(t))

    def _unsourced(self, x) -> None:
        attributes = getattr(x, "__dict__", None)
        if id(x) not in self._seen and isinstance(attributes, dict) and not isinstance(x, _NOT_FOLLOWED):
            self._seen.add(id(x))
            self.unsourced.append((x, dict(attributes)))

    def item_writes(self) -> list:
        """The items the program set in lists and dicts reached from the arguments, undone here:
        ``(container's source, key, value)``, with ``value`` MISSING for a removed key and ``key``
        a full slice for a list's new contents. Every call sets them again; values must be plain
        values or tensors (``cache.is_updated[i] = True``). Other changes are refused (after all
        are undone): new objects in a container (a cache's layers made in the call), and writes to
        objects reached under keys that are no path."""
        writes, refused = [], None
        for container, before, source in self.containers:
            if not _changed(container, before):
                continue
            self.written.add(id(container))
            found = _changes(container, before, source)
            _restore(container, before)
            if found is None:
                refused = refused or _container_error(container, source)
            writes += found or []
        for obj, before in self.unsourced:
            now = obj.__dict__
            changed = [k for k in set(now) | set(before) if now.get(k, MISSING) is not before.get(k, MISSING)]
            if changed:
                now.clear()
                now.update(before)
                refused = refused or ThunderNotImplementedError(
                    f"thunder_rs.jit: the traced program set {type(obj).__name__}.{sorted(changed)[0]} on an object it "
                    "reached through a dict of its arguments under a key that is not a string or an integer; a "
                    "compiled call would not set it again"
                )
        if refused is not None:
            raise refused
        return writes

    def item_guards(self) -> list:
        """Guards on the items of the lists and dicts reached from the arguments that no guarded read
        covers (``unseen``), and of those the program changed (``written``: a list it appended to
        grows again from what the next call finds), as found before the program ran (their
        items are back as they were: ``item_writes`` put them back)."""
        return [
            ItemsGuard(source, type(x), self._members(x), f"{source.label}, reached from the arguments")
            for x, _, source in self.containers
            if id(x) in self.unseen or id(x) in self.written
        ]

    def _members(self, container) -> tuple:
        """What an ``ItemsGuard`` compares of ``container`` (``items.members``): a tensor matches any
        tensor (read per call), an object guarded whole through its path or a list or dict with
        an ``ItemsGuard`` of its own any of its type."""
        own = {id(x) for x, _, whole in self.objects if whole} | self.unseen | self.written
        flat = itertools.chain.from_iterable(container.items()) if type(container) in DICTS else container
        return tuple(
            ANY_TENSOR if isinstance(x, torch.Tensor) else SameType(type(x)) if id(x) in own else x for x in flat
        )

    def refuse_changed_in_place(self) -> None:
        """Refuses a program that changed a container reached from its arguments that no compiled
        call would change again (``_IN_PLACE``: ``seen.add(k)`` on a set it was given), after
        putting its contents back."""
        for container, before, source in self.in_place.values():
            if _contents(container) != before:
                _put_contents(container, before)
                what = f"{type(container).__name__} {source.label}"
                raise ThunderNotImplementedError(
                    f"thunder_rs.jit: the traced program changed the {what} in place, which it reached through its "
                    "arguments (added, removed or set an item); a compiled call would not change it again. Return what "
                    "it adds instead, or keep it in a list or dict"
                )

    def undo(self) -> None:
        """Puts back the items of the lists and dicts reached from the arguments, and the
        attributes of objects reached under keys that are no path, as they were before a trace
        that failed: none keeps a stand-in (a cache's state the program made in it)."""
        for container, before, _ in self.in_place.values():
            if _contents(container) != before:
                _put_contents(container, before)
        for container, before, _ in self.containers:
            if _changed(container, before):
                _restore(container, before)
        for obj, before in self.unsourced:
            obj.__dict__.clear()
            obj.__dict__.update(before)


class ItemsGuard:
    """The items of a list or dict at ``source`` in each call's arguments (``ArgumentObjects.unseen``):
    holds while it has its type and the members it had (``items.same_held_items``)."""

    per_call = True
    #: (read through ``place``: the guard compares the object there, not its attributes)
    source = None

    def __init__(self, place: InputSource, expected_type: type, members: tuple, origin: str):
        self.place, self.expected_type, self.members, self.origin = place, expected_type, members, origin

    def holds(self, flat) -> bool:
        try:
            now = self.place.object(flat)
        except (KeyError, AttributeError, IndexError, TypeError):
            return False
        return type(now) is self.expected_type and same_held_items(now, self.members)

    def describe(self, flat) -> str:
        return f"the items of {self.place.label} changed (read at {self.origin})"

    def term(self, index: int, scope: dict) -> str:
        scope[f"e{index}"], scope[f"i{index}"], scope[f"f{index}"] = self.expected_type, self.members, same_held_items
        return f"(type(v := {self.place.object_code(scope)}) is e{index} and f{index}(v, i{index}))"


def _place(source: InputSource, name: str | int) -> InputSource:
    """The place of what ``source`` (an object's attributes, or a list's or dict's items) holds as ``name``."""
    if type(source) is InputItemsSource:
        return InputSource(source.position, (*source.path, Item(name)), f"{source.label}[{name!r}]")
    return InputSource(source.position, (*source.path, name), f"{source.label}.{name}")


def _items(container) -> tuple:
    return tuple(container.items()) if type(container) in DICTS else tuple(container)


def _changed(container, before: tuple) -> bool:
    """Whether ``container`` holds other items than ``before`` (its ``_items`` then), by identity."""
    now = _items(container)
    if len(now) != len(before):
        return True
    if type(container) in DICTS:
        return any(a[0] is not b[0] or a[1] is not b[1] for a, b in zip(now, before))
    return any(a is not b for a, b in zip(now, before))


class _Contents(tuple):
    """What an ``_IN_PLACE`` container holds, compared by identity (a set's in any order)."""

    __slots__ = ()

    def __eq__(self, other):
        if type(other) is not _Contents or len(self) != len(other) or self[0] != other[0]:
            return False
        if self[0] == "set":
            return {id(v) for v in self[1:]} == {id(v) for v in other[1:]}
        return all(a is b for a, b in zip(self[1:], other[1:]))

    def __ne__(self, other):
        return not self == other

    __hash__ = None  # type: ignore[assignment]


def _contents(container) -> _Contents:
    """The contents of an ``_IN_PLACE`` container: a dict's keys and values (in turn), a buffer's bytes
    (one object), other containers' items."""
    if isinstance(container, (bytearray, array.array)):
        return _Contents(("buffer", bytes(container), getattr(container, "typecode", None)))
    if isinstance(container, dict):
        return _Contents(("dict", *itertools.chain.from_iterable(dict.items(container))))
    return _Contents(("set" if isinstance(container, set) else "items", *container))


def _put_contents(container, before: _Contents) -> None:
    """Puts ``before`` (``_contents``) back in ``container`` (through its base type's methods: a
    ``Counter``'s ``update`` counts)."""
    items = before[1:]
    if isinstance(container, bytearray):
        container[:] = items[0]
    elif isinstance(container, array.array):
        del container[:]
        container.frombytes(items[0])
    elif isinstance(container, dict):
        dict.clear(container)
        dict.update(container, zip(items[::2], items[1::2]))
    elif isinstance(container, set):
        set.clear(container)
        set.update(container, items)
    elif isinstance(container, collections.deque):
        collections.deque.clear(container)
        collections.deque.extend(container, items)
    else:
        list.__setitem__(container, slice(None), items)


def _repeatable(value) -> bool:
    """Values a compiled call can set again: plain values and tensors (each call's own)."""
    return is_simple(value) or isinstance(value, torch.Tensor)


def _made_again(value) -> bool:
    """New values a compiled call can set in a dict again: ``_repeatable`` ones, and lists, tuples
    and dicts of them (``stats["loss"].append(t)`` in a ``defaultdict(list)``), made anew by each call."""
    return all(map(_repeatable, pytree.tree_leaves(value)))


def _changes(container, before: tuple, source: InputSource) -> list | None:
    """The writes that make ``container`` (reached at ``source``) what the program left; None
    when one puts a value no call can set again. Keys it moved (``move_to_end``, a key popped
    and set again) are set again in order, all of them."""
    if type(container) is list:
        return [(source, slice(None), list(container))] if all(map(_repeatable, container)) else None
    old = dict(before)
    writes = [(source, k, v) for k, v in container.items() if old.get(k, MISSING) is not v]
    writes += [(source, k, MISSING) for k in old if k not in container]
    if not same_order(old, writes, container):
        writes = [(source, k, MISSING) for k in old] + [(source, k, v) for k, v in container.items()]
    # (a value it held before, set again in order, must be the same object: a plain value or a tensor)
    kept = all(v is MISSING or (_repeatable(v) if old.get(k, MISSING) is v else _made_again(v)) for _, k, v in writes)
    return writes if kept else None


def same_order(old: dict, writes: list, container) -> bool:
    """Whether making ``writes`` in a dict holding ``old`` leaves its keys in ``container``'s order."""
    made = dict(old)
    for _, key, value in writes:
        if value is MISSING:
            made.pop(key, None)
        else:
            made[key] = value
    return list(made) == list(container)


def _container_error(container, source: InputSource) -> ThunderNotImplementedError:
    return ThunderNotImplementedError(
        f"thunder_rs.jit: the traced program changed the {type(container).__name__} {source.label}, which it reached "
        "through its arguments, leaving objects in it (not plain values or tensors) that a compiled call would not "
        f"put there again (the call at {user_location()}). Make such objects before the call (a cache's layers: "
        "DynamicCache(config=model.config))"
    )


def _restore(container, before: tuple) -> None:
    if type(container) in DICTS:
        container.clear()
        for key, value in before:  # (``Counter.update`` adds counts)
            container[key] = value
    else:
        container[:] = before


def captured_inputs(captured: list, ints: tuple = ()):
    """``inputs(flat)``: the trace's captured inputs for a call with flat inputs ``flat``, fixed
    tensors and each ``ArgumentTensor`` read at its path, in the trace's order, then the ``ints``
    (``dynamic.HeldInt``, ``dynamic.ArgInt``) read at theirs; None when all are fixed tensors (``jit`` then appends
    them itself)."""
    if all(isinstance(c, torch.Tensor) for c in captured) and not ints:
        return None
    scope: dict = {}
    parts = []
    for i, c in enumerate(captured):
        if isinstance(c, torch.Tensor):
            scope[f"c{i}"] = c
            parts.append(f"c{i}")
        else:  # the key as an object: its repr may not be code (``(3, torch.float32)``)
            scope[f"k{i}"] = c.name
            parts.append(f"{c.source.code(f'm{i}', scope)}[k{i}]")
    parts += [at.code(j, scope) for j, at in enumerate(ints)]
    source = f"def inputs(flat):\n  return ({', '.join(parts)},)\n"
    exec(compile(source, "<thunder_rs argument tensors>", "exec"), scope)
    return scope["inputs"]
