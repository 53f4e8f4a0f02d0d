"""Lists and dicts of module state and globals that a traced program changes: caches.

timm's LeViT keeps, in eval mode, a tensor computed from a parameter in a dict attribute
(``self.attention_bias_cache[key] = self.attention_biases[:, self.attention_bias_idxs]``) and
reads it back on later calls; a program may do the same with a global dict (``_MASKS[n] = ...``).
Each list or dict (a ``Counter``, ``defaultdict`` or ``OrderedDict`` too: ``items.DICTS``) the
program reads from a module's attributes, a global, a class attribute, a closure cell (a hook's
list, a cache made by a factory function), or an object or item reached from those, is noted
with where it lives and its items when first read.
After tracing, the changes made to it are undone (no stand-in stays in user state) and become
writes that the compiled call performs after running, with that call's tensors
(``effects.ItemWrite`` on a ``ContainerAt``). The container is state the trace read, guarded
with its items: the next call finds the cached item there and compiles once more. That compile
reads the cached tensor where it is on every call (``read_per_call``), guarded on its metadata,
so a cache the user clears and the program fills again is read without compiling again. A dict
used only by a symbolic size as its key (masks by sequence length) is guarded as a dict, each
call checking that its size is no key there (``core.state.keyed``): one compile fills it for
every new size.

Containers reached through the arguments (``core.state.reached``) are not replayed here.
"""

import collections
import sys
import types
import weakref

import torch
from torch.utils import _pytree as pytree

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.base.userframe import read_site, store_site
from thunder_rs.core.state.code_reads import installed, library_module
from thunder_rs.core.state.guards import (
    MISSING,
    CellSource,
    ClassSource,
    DictGuard,
    FixedSource,
    GlobalsSource,
    Guard,
    InputSource,
    ItemSource,
    ModuleSource,
    ObjectSource,
    Source,
    attributes_of,
    is_simple,
    items_of,
)
from thunder_rs.core.state.items import DICTS, changes_in_place
from thunder_rs.core.state.tensor_guards import tensor_meta
from thunder_rs.core.state.keyed import DictAt, KeyUses, container_of
from thunder_rs.core.state.reached import ArgumentTensor, _changed, _items, _restore, same_order
from thunder_rs.errors import ThunderNotImplementedError

#: Sources whose lists and dicts are the program's lasting state: module and object attributes,
#: globals, class attributes, closure cells.
_ROOTS = (ModuleSource, GlobalsSource, ClassSource, CellSource)


class ContainerAt:
    """The list or dict at ``name`` of ``source`` as each call finds it there (a module whose
    cache the user replaced by an empty dict gets the item in the new one, as in eager)."""

    __slots__ = ("source", "name", "label")

    def __init__(self, source, name, label: str):
        self.source, self.name, self.label = source, name, label

    def object(self, flat):
        return self.source.mapping(flat).get(self.name, None)


class HeldItemsSource(Source):
    """The items of the list or dict at ``name`` of ``source``, read by index or key on every
    call (``StateContainers.read_per_call``)."""

    def __init__(self, source: Source, name, label: str):
        self.source, self.name, self.label = source, name, label

    def mapping(self, flat):
        return items_of(self.source.mapping(flat).get(self.name, None))

    @property
    def key(self):
        return ("held items", self.source.key, self.name)

    def code(self, var, scope):
        scope["_items_of"] = items_of
        return f"_items_of({self.source.code(var, scope)}.get({self.name!r}, None))"

    def describe(self, name):
        return f"{self.label}[{name!r}]"


class _Place:
    __slots__ = ("container", "source", "name", "items", "origin", "replayed", "codes")

    def __init__(self, container, source, name, origin: str, replayed: bool):
        self.container, self.source, self.name, self.origin = container, source, name, origin
        #: the items when the program first read it
        self.items = _items(container)
        self.replayed = replayed
        #: the code objects whose reads reached it
        self.codes: set = set()

    def at(self) -> "ContainerAt":
        return ContainerAt(self.source, self.name, self.source.describe(self.name))


def _repeatable(value) -> bool:
    """Values a compiled call can store again: plain values, tensors and sizes (each call's own),
    classes and functions holding no call's values, and tuples, lists and dicts of them (a rotary
    embedding's ``(cos, sin)``)."""
    return all(
        is_simple(x) or isinstance(x, (torch.Tensor, torch.SymInt)) or _static(x) for x in pytree.tree_leaves(value)
    )


def _plain_key(key) -> bool:
    """Keys a compiled call can store under again: plain values and sizes (each call's value),
    classes, and tuples of them."""
    if type(key) is tuple:
        return all(map(_plain_key, key))
    return is_simple(key) or isinstance(key, (torch.SymInt, type))


def _static(value) -> bool:
    """A class, or a function with no closure cells and plain defaults: no value of a call is in
    it, so storing it again is storing what eager stores. A registry's memo holds such under
    classes (``torch.distributions.kl``'s ``_KL_MEMOIZE[type(p), type(q)] = fun``)."""
    if isinstance(value, type) or type(value) is types.BuiltinFunctionType:
        return True
    if type(value) is not types.FunctionType or value.__closure__ is not None:
        return False
    defaults = (*(value.__defaults__ or ()), *(value.__kwdefaults__ or {}).values())
    return all(map(is_simple, defaults))


class StateContainers:
    """The lists and dicts of program state one acquisition read, by id."""

    def __init__(self):
        self._places: dict = {}
        #: the objects reached from module attributes, globals and class attributes, by id: ``(the
        #: object, source, name)`` where it was read
        self._paths: dict = {}
        #: the code whose reads the observer is evaluating; the dicts each code's reads reached
        self.reading = None
        self._dicts_of: dict = {}
        #: ids of the codes among ``_dicts_of`` (kept there): hashing a code object hashes its contents
        self._dicts_of_ids: set = set()
        #: the dicts used with symbolic keys (``keyed``)
        self.key_uses = KeyUses()
        #: the calls of functions cached by functools that missed their cache (``identity.cached_call``)
        self.cached_calls: list = []
        #: the places of the lists and dicts held by those of lasting state (``_note_held``)
        self._held: list = []
        #: ``(holder, guard)`` of the ``items.wrapped`` containers they hold, made when read
        self._held_wrapped: list = []
        #: ``(holder, DictGuard)`` of the objects of the user's classes they hold (a
        #: ``WeakValueDictionary`` too, through weak references), guarded whole (``_note_held``)
        self._held_objects: list = []
        #: the deques of state read, by id: ``(deque, source, name, origin)`` (for ``lasting`` only)
        self._deques: dict = {}

    def note(self, value, source, name, origin: str) -> None:
        """Notes ``value``, read as ``name`` at ``source`` by the function defined at ``origin``."""
        if isinstance(source, InputSource):
            return
        rooted = isinstance(source, _ROOTS) or id(_holder(source)) in self._paths
        if rooted:
            self._paths.setdefault(id(value), (value, source, name))
        if (type(value) is list or type(value) in DICTS) and id(value) not in self._places:
            self._places[id(value)] = _Place(value, source, name, origin, rooted)
            if rooted:
                self._note_held(value, source.describe(name), origin, name)
        if rooted and type(value) in _HOLDING:  # (``for cfg in self.configs``, ``TABLES.get(name).scale``)
            self._guard_held_objects(value, source.describe(name), origin, name)
        if type(value) is collections.deque and rooted:
            self._deques.setdefault(id(value), (value, source, name, origin))
        if type(value) is dict and self.reading is not None and self.reading not in self._places[id(value)].codes:
            self._places[id(value)].codes.add(self.reading)
            self._dicts_of.setdefault(self.reading, []).append(self._places[id(value)])
            self._dicts_of_ids.add(id(self.reading))

    def _note_held(self, container, label: str, origin: str, name=None) -> None:
        """Notes the lists and dicts ``container`` holds, as the items they are: the program may
        reach one by a key it computes (``self.seen[x.shape[1]].append(n)``, a ``defaultdict(list)``),
        which no read chain follows, so its changes were kept by the traced call alone and its
        contents changed between calls were not seen. What the program changes in one is made again
        by every call; each one still where it was is guarded with its items (``relax``). An object
        of the user's classes held there (``TABLES[name].scale``, ``for cfg in CONFIGS``: read by a
        computed key or a loop, which no chain follows) is guarded whole, as its attributes are."""
        source = ItemSource(container, label)
        for key, item in list(container.items() if type(container) in DICTS else enumerate(container)):
            if type(item) is list or type(item) in DICTS:
                if id(item) not in self._places:
                    self.note(item, source, key, origin)
                    self._held.append(self._places[id(item)])
            elif changes_in_place(item):  # (a set, a bytearray, a memoryview, a ChainMap, a parser: guarded whole)
                at = read_site(origin, name)  # (the line reading what holds it: none reads it by its key)
                self._held_wrapped.append((container, Guard(source, key, item, at)))  # (its items now)
            elif _user_object(item):  # (``TABLES[name].scale``, ``for cfg in CONFIGS: x * cfg.gain``)
                at = read_site(origin, name)
                self._held_objects.append(
                    (container, DictGuard(ObjectSource(item, source.describe(key)), attributes_of(item), at))
                )

    def _guard_held_objects(self, holder, label: str, origin: str, name) -> None:
        """Guards whole the objects of the user's classes that a tuple of state (which has no
        ``_Place``) or a ``WeakValueDictionary`` holds (through weak references: the entry keeps
        them no more alive than eager does). The guards' read site (``read_site``, which parses
        the reading function's file) is found only where the holder holds such an object."""
        weak = type(holder) is weakref.WeakValueDictionary
        items, kind = (list(holder.items()), WeakObjectSource) if weak else (enumerate(holder), ObjectSource)
        held = [(k, o) for k, o in items if _user_object(o)]
        if held:
            at = read_site(origin, name)
            self._held_objects += [
                (holder, DictGuard(kind(o, f"{label}[{k!r}]"), attributes_of(o), at)) for k, o in held
            ]

    def settled(self, source) -> bool:
        """Whether noting a value read at ``source`` again would change nothing (but a dict's
        codes): its source is rooted, or can never be."""
        return isinstance(source, (InputSource, *_ROOTS)) or id(_holder(source)) in self._paths

    def returns_wanted(self, code) -> bool:
        """Whether the returns of ``code`` must be seen (``returned``): its reads reached a dict."""
        return id(code) in self._dicts_of_ids

    def key_use(self, frame, size, sized, check_sizes) -> bool:
        """Whether ``size``, hashed as the key of the ``in``, subscript or item store that
        ``frame`` runs, stays symbolic (``keyed``): ``sized()`` gives its value from a call's
        sizes, ``check_sizes`` adds the check that each call's is not a key."""
        container, _ = container_of(frame)
        place = self._places.get(id(container)) if type(container) is dict else None
        if place is None or not place.replayed or not self._lasting(container):
            return False
        return self.key_uses.use(place, frame, size, sized, check_sizes)

    def returned(self, frame) -> None:
        """A frame of the program returns: a dict it used by key must have had a symbolic key."""
        places = self._dicts_of.get(frame.f_code) if id(frame.f_code) in self._dicts_of_ids else None
        if places:
            self.key_uses.returned(frame, places)

    def relax(self, guards: dict) -> None:
        """Guards a dict used only with symbolic keys absent from it as being a dict (``keyed``),
        and the lists and dicts held by those of lasting state with their items (``_note_held``)."""
        for place in self._held:
            if (place.source.key, place.name) not in guards and self._lasting(place.container):
                guards[(place.source.key, place.name)] = Guard(place.source, place.name, place.container, place.origin)
        for holder, guard in self._held_wrapped:
            if (guard.source.key, guard.name) not in guards and self._lasting(holder):
                guards[(guard.source.key, guard.name)] = guard
        for holder, guard in self._held_objects:  # (their attributes when read: a change the program made is refused)
            if ("object", guard.source.key) not in guards and guard.found and self._lasting(holder):
                guards[("object", guard.source.key)] = guard
        for place in self.key_uses.relaxed(guards):
            guard = guards.get((place.source.key, place.name))
            if type(guard) is Guard and guard.expected is place.container:
                guards[(place.source.key, place.name)] = DictAt(place.source, place.name, guard.origin)

    def _lasting(self, obj) -> bool:
        """Whether ``obj`` is still where the program found it, and so are the objects on its
        path: not an object the program made and set on state for the call (transformers'
        output collector, set on a global object and reset after)."""
        while True:
            _, source, name = self._paths[id(obj)]
            if source.mapping(None).get(name, None) is not obj:
                return False
            if isinstance(source, _ROOTS):
                return True
            obj = _holder(source)

    def read_per_call(self, captured: list, stored: list, guards: dict) -> None:
        """Makes each tensor among ``captured`` that a list or dict of lasting state holds (a
        cache the program reads: LeViT's biases) read where it is by every call, as an argument
        object's tensor (``reached.ArgumentTensor``) rather than captured as that tensor: a cache
        the user clears and the program fills again (``train()`` then ``eval()``) then holds
        another tensor, which the entry reads without compiling again. The container's guard in
        ``guards`` lets any tensor be there; ``Observer.guard_argument_tensors`` guards its
        metadata. Where the container is guarded otherwise (whole, with its object), or holds the
        tensor twice, or the program also stores it as it is (``stored``, per captured tensor:
        torchvision's anchors, ``self.cells = [c.to(dtype) for c in self.cells]``), it stays
        captured."""
        found = self._held_tensors()
        held: dict = {}
        for i, t in enumerate(captured):
            at = found.get(id(t)) if isinstance(t, torch.Tensor) and not stored[i] else None
            if at is None:
                continue
            place, key = at
            guard = guards.get((place.source.key, place.name))
            if type(guard) is not Guard or guard.expected is not place.container:
                continue
            source = HeldItemsSource(place.source, place.name, place.source.describe(place.name))
            captured[i] = ArgumentTensor(source, key, place.container, tensor_meta(t), place.origin)
            held.setdefault((place.source.key, place.name), (guard, set()))[1].add(id(t))
            # Read by a constant key (``self.cache["cpu"]``), it was guarded as that tensor.
            item = (ItemSource(place.container, "").key, key)
            if getattr(guards.get(item), "expected", None) is t:
                del guards[item]
        for read, (guard, ids) in held.items():
            guards[read] = Guard(guard.source, guard.name, guard.expected, guard.origin, frozenset(ids))

    def _held_tensors(self) -> dict:
        """``id(tensor) -> (place, key)`` for the tensors one container of lasting state holds
        (none held twice)."""
        found: dict = {}
        for place in self._places.values():
            if not place.replayed or not self._lasting(place.container):
                continue
            pairs = place.items if type(place.container) in DICTS else enumerate(place.items)
            for key, t in pairs:
                if isinstance(t, torch.Tensor) and not isinstance(t, TensorProxy):
                    found[id(t)] = None if id(t) in found else (place, key)
        return {i: at for i, at in found.items() if at is not None}

    def sites(self) -> dict:
        """``id(container) -> (origin, name)`` of each list or dict the program read, for
        ``store_site`` to find where it changed one (errors about what no compiled call can keep)."""
        # A closure variable is read as the cell's ``cell_contents``: its name is the source's label.
        sites = {
            i: (p.origin, p.source.label if type(p.source) is CellSource else p.name) for i, p in self._places.items()
        }
        # A deque (refused, as no call can make its changes again): where the program changed it.
        sites |= {i: (origin, name) for i, (_, _, name, origin) in self._deques.items()}
        # A function cached by functools: the line that called it.
        return sites | {id(cached): (where, "") for cached, where, _ in self.cached_calls}

    def places(self) -> list:
        """The noted containers (``_Place``: the container, its items when first read, where)."""
        return list(self._places.values())

    def lasting(self) -> list:
        """The lists, dicts and deques of lasting state the program read that are still where it
        found them: ``(container, source, name, origin)`` each."""
        places = [(p.container, p.source, p.name, p.origin) for p in self._places.values() if p.replayed]
        return [p for p in places + list(self._deques.values()) if self._lasting(p[0])]

    def undo(self) -> None:
        """Puts back the items every noted container had when first read (a failed trace)."""
        for place in self._places.values():
            if _changed(place.container, place.items):
                _restore(place.container, place.items)

    def writes(self) -> list:
        """The items the program set in containers of lasting state, undone here: ``(ContainerAt,
        key, value)``, ``value`` MISSING for a removed key, ``key`` a full slice for a list's new
        contents. Raises (after undoing all) where a value or key cannot be stored again."""
        writes: list = []
        refused = None
        for place in self._places.values():
            if not place.replayed or not _changed(place.container, place.items):
                continue
            if not self._lasting(place.container):
                continue  # made by the program and set on state for the call
            found = _changes(place)
            _restore(place.container, place.items)
            if type(found) is str:
                refused = refused or _refusal(place, found)
            else:
                writes += found
        if refused is not None:
            raise refused
        return writes


class WeakObjectSource(FixedSource):
    """The instance dict of an object a ``WeakValueDictionary`` of state holds, through a weak
    reference: the entry keeps it no more alive than eager does; gone, it has no attributes (an
    empty mapping, which its ``DictGuard`` finds changed)."""

    def __init__(self, obj, label: str):
        self.ref, self.label = weakref.ref(obj), label

    def mapping(self, flat):
        obj = self.ref()
        return {} if obj is None else attributes_of(obj)

    def code(self, var, scope):
        scope[var] = self
        return f"{var}.mapping(None)"

    @property
    def key(self):
        return ("weak", id(self.ref))


#: Holders whose objects of the user's classes ``_guard_held_objects`` guards.
_HOLDING = (tuple, weakref.WeakValueDictionary)


def _user_object(value) -> bool:
    """Whether ``value`` is an instance of a class of the user's code with an instance dict or slots (not a
    tensor, module, function or class; not of the standard library's or an installed package's)."""
    if issubclass(type(value), (torch.Tensor, torch.nn.Module, type, types.FunctionType, types.ModuleType)):
        return False
    module = sys.modules.get(type(value).__module__)
    if module is None or library_module(module) or installed(getattr(module, "__file__", "") or ""):
        return False
    return attributes_of(value) is not None  # (an instance dict or slots)


def _holder(source):
    if isinstance(source, ObjectSource):
        return source.obj
    return source.container if isinstance(source, ItemSource) else None


def _changes(place: _Place) -> list | str:
    """The writes that make the container what the program left, or what it put there that
    cannot be stored again."""
    container, at = place.container, ContainerAt(place.source, place.name, place.source.describe(place.name))
    if type(container) is list:
        before = {id(x) for x in place.items}
        new = [x for x in container if id(x) not in before]
        bad = next((x for x in new if not _repeatable(x)), MISSING)
        return [(at, slice(None), list(container))] if bad is MISSING else f"an object of type {type(bad).__name__}"
    old = dict(place.items)
    # A size as a key is one the program put there (the call's value), hashed no more here.
    writes = [(at, k, v) for k, v in container.items() if _sized(k) or old.get(k, MISSING) is not v]
    now = {k for k in container if not _sized(k)}
    writes += [(at, k, MISSING) for k in old if k not in now]
    if not any(map(_sized, container)) and not same_order(old, writes, container):
        # Keys moved (``move_to_end``, a key removed then set again): every item again, in order.
        writes = [(at, k, MISSING) for k in old] + [(at, k, v) for k, v in container.items()]
    for _, key, value in writes:
        if not _plain_key(key):
            return f"an item under the key {key!r} (a {type(key).__name__}), which is not a plain value"
        if value is not MISSING and not _repeatable(value):
            return f"an object of type {type(value).__name__} under the key {key!r}"
    return writes


def _sized(key) -> bool:
    return isinstance(key, torch.SymInt) or (type(key) is tuple and any(map(_sized, key)))


def _refusal(place: _Place, what: str) -> ThunderNotImplementedError:
    return ThunderNotImplementedError(
        f"thunder_rs.jit: the traced program at {store_site(place.origin, place.name)} put {what} in "
        f"{place.source.describe(place.name)}, a {type(place.container).__name__} that outlives the call; a "
        "compiled call can store there again only plain values and tensors (thunder_rs took it out again)"
    )
