"""Modules under ``thunder_rs.jit``: their parameters and buffers as trace inputs, tracing without
touching the user's module, and what a traced forward writes to module state.

Tracing runs a *clone* of the module tree: each module is copied shallowly (same class, a copy of
its instance dict) with its own parameter, buffer and submodule stores, which hold the proxies.
The user's modules are never changed while tracing, so other threads (tracing or running eagerly)
see them as they are, and what the forward writes to module state is found by comparing each
clone with its original afterwards.

``write_epoch`` counts writes to module attributes and structure (``nn.Module.__setattr__``,
``__delattr__``, ``register_buffer``, ``register_parameter``, ``add_module``): guards on module
attributes are re-checked only when it moved.
"""

import contextlib
import functools
import itertools
import operator
import threading
import types
import weakref
from typing import NamedTuple

import torch
import torch.nn.utils.stateless as stateless
from torch.nn.modules import module as _nn_module
from torch.utils.hooks import RemovableHandle

from thunder_rs._core import DictStamps
from thunder_rs.core.base.userframe import user_location
from thunder_rs.core.state.cached_reads import holds_stand_in, original as stood_in_for
from thunder_rs.core.state.fsdp import without_fsdp_hooks
from thunder_rs.core.state.guards import MISSING
from thunder_rs.core.state.items import same_entries
from thunder_rs.core.state.param_metadata import MetadataCheck
from thunder_rs.core.state.slot_reads import SlotReads
from thunder_rs.errors import ThunderNotImplementedError

_Module = torch.nn.Module

#: Incremented by every module attribute or structure write, in any thread.
write_epoch = [0]


def dict_stamp() -> int:
    """The stamp the next change of any dict gets, less one: a dict changed after this call holds
    a newer one (``entry.module_dicts``)."""
    probe: dict = {}
    probe[0] = 0
    return DictStamps([probe]).newest()


#: thread id -> the ``mode_writes.ModeWrites`` of the program traced there: notes the writes of
#: ``training`` to modules (``teacher.eval()`` on a module held in a closure)
mode_writers: dict = {}


_is_dynamo_compiling = torch.compiler.is_dynamo_compiling


#: module (a clone being traced) -> ``file:line`` of the first call in the program that registered
#: or removed one of its parameters, buffers or submodules, for the refusal (``_check_structure``)
structure_sites: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _note_structure(module) -> None:
    if mode_writers.get(threading.get_ident()) is not None and module not in structure_sites:
        structure_sites[module] = user_location()  # (while a program is traced in this thread)


def _counting(method):
    noted = method.__name__ == "__setattr__"
    structure = method.__name__ in ("__delattr__", "register_buffer", "register_parameter", "add_module")

    @functools.wraps(method)
    def counted(self, *args, **kwargs):
        # Under Dynamo the write is not counted while tracing: reading the count would make
        # Dynamo guard on its value, so that every later write recompiled the frame (Hugging Face
        # models write module attributes in forward). The compiled frame replays the write
        # through this method, which counts it then.
        if not _is_dynamo_compiling():
            write_epoch[0] += 1
            if mode_writers and noted and args and args[0] == "training":
                writer = mode_writers.get(threading.get_ident())
                if writer is not None:
                    writer.note(self)
            elif mode_writers and structure:
                _note_structure(self)
        return method(self, *args, **kwargs)

    # One code object per wrapper: Dynamo tells ``nn.Module.__setattr__`` (which it traces) from
    # the module methods it refuses by code object, so a code shared with ``register_buffer``'s
    # wrapper would make every module attribute write in a compiled forward a graph break.
    counted.__code__ = counted.__code__.replace(co_name=f"counted_{method.__name__}")
    counted._thunder_rs_counted = True
    return counted


def _count_module_writes() -> None:
    """Makes module writes move ``write_epoch`` (once per process; eager code pays one increment)."""
    for name in ("__setattr__", "__delattr__", "register_buffer", "register_parameter", "add_module"):
        method = getattr(_Module, name)
        if not getattr(method, "_thunder_rs_counted", False):
            setattr(_Module, name, _counting(method))


def _count_reparametrizations() -> None:
    """Makes ``functional_call`` move ``write_epoch`` as it puts its dict's tensors into the
    module's stores and as it puts the module's back: it writes the stores directly (no
    ``__setattr__``), and can tie slots (one tensor for two names) or untie them
    (``tie_weights=False``), which changes what the trace takes as inputs."""
    original = stateless._reparametrize_module
    if getattr(original, "_thunder_rs_counted", False):
        return

    @functools.wraps(original)
    @contextlib.contextmanager
    def counted(*args, **kwargs):
        try:
            with original(*args, **kwargs):
                if not _is_dynamo_compiling():
                    write_epoch[0] += 1
                yield
        finally:
            if not _is_dynamo_compiling():
                write_epoch[0] += 1

    counted._thunder_rs_counted = True  # type: ignore[attr-defined]
    stateless._reparametrize_module = counted


_count_module_writes()
_count_reparametrizations()

#: Hook stores of a module whose contents change what a call does.
_HOOK_STORES = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)
_GLOBAL_HOOK_STORES = tuple(
    getattr(_nn_module, f"_global{name}")
    for name in (
        "_forward_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
        "_forward_pre_hooks",
        "_backward_hooks",
        "_backward_pre_hooks",
    )
)


def _hook_stores(modules) -> list:
    return [getattr(m, s) for m in modules for s in _HOOK_STORES if hasattr(m, s)] + list(_GLOBAL_HOOK_STORES)


def hook_snapshot(modules) -> tuple:
    """Which hooks calls of ``modules`` run (with the global ones): compared when any hook was
    registered since the entry last checked."""
    return tuple((id(d), tuple(d)) for d in _hook_stores(modules) if d)


def hook_stores_in_use(modules) -> tuple:
    """``(store, size)`` of the hook stores of ``modules`` that hold hooks now: removing a hook
    shrinks one of them."""
    return tuple((d, len(d)) for d in _hook_stores(modules) if d)


def registered_since(modules, version: int) -> bool:
    """Whether the hook stores of ``modules`` (or the global ones) hold a hook registered since
    ``hooks_version()`` was ``version`` (a store's keys are its handles' ids, which count up): one
    a traced program registered and left on a module the jit does not bind (a global module a
    jitted function calls), which eager's next call runs, as it registers one more."""
    return any(key >= version for d in _hook_stores(modules) for key in d)


def hooks_version() -> int:
    """Moves whenever a hook is registered anywhere (each registration makes a ``RemovableHandle``)."""
    return RemovableHandle.next_id


class ModuleBinding:
    """The parameter and buffer slots of a module tree, bound once per structure.

    ``unique`` lists ``(store, name)`` per distinct tensor (tied weights share one trace input),
    read on every call; ``names`` gives each one's qualified name for traces and messages;
    ``metadata(tensors)`` what the cache key holds of those tensors.
    """

    def __init__(self, root: _Module):
        self.root = root
        self.modules = list(root.modules())
        self.names = {id(m): n for n, m in root.named_modules(remove_duplicate=False)}
        unique: list[tuple[dict, str]] = []
        index_of: dict[int, int] = {}
        qualified: list[str] = []
        tied: list[tuple[dict, str, int]] = []
        for mod in self.modules:
            prefix = self.names[id(mod)]
            for store in (mod._parameters, mod._buffers):
                for name, value in store.items():
                    if value is None:
                        continue
                    if id(value) in index_of:
                        tied.append((store, name, index_of[id(value)]))
                        continue
                    index_of[id(value)] = len(unique)
                    unique.append((store, name))
                    qualified.append(f"{prefix}.{name}" if prefix else name)
        self.unique = tuple(unique)
        #: ``(store, name, index)`` of the slots holding the tensor of ``unique[index]`` (tied weights)
        self.tied = tuple(tied)
        self.qualified = tuple(qualified)
        self._index_of = index_of
        self.structure = self._structure()
        self.metadata = MetadataCheck()
        #: what a call finds in the slots (``read()``), checked by identity once calls repeat
        self.slots = SlotReads(self.unique, self.tied)

    def tensors(self) -> list:
        return [d[n] for d, n in self.unique]

    def _structure(self):
        """The modules, their slots, forwards set on instances, and which slots share one tensor
        (tied weights): a slot given another tensor is read on the next call, but a change of
        tying changes the trace inputs."""
        first: dict = {}
        tying = tuple(
            first.setdefault(id(v), len(first))
            for m in self.modules
            for store in (m._parameters, m._buffers)
            for v in store.values()
            if v is not None
        )
        # A forward set on an instance (``module.forward = patched``, as Accelerate's hooks do)
        # changes what a call runs.
        return tying, tuple(
            (
                id(m),
                tuple(m._parameters),
                tuple(m._buffers),
                tuple((n, id(v)) for n, v in m._modules.items()),
                id(m.__dict__.get("forward")),
            )
            for m in self.modules
        )

    def same_structure(self) -> bool:
        """Whether the tree still has these modules, parameters and buffers (slow path)."""
        return list(self.root.modules()) == self.modules and self._structure() == self.structure

    def clone(self, proxies: list):
        """A copy of the tree whose parameter and buffer slots hold ``proxies`` (by unique index).

        Returns the root's clone and ``(clone, original)`` for every module.
        """
        # By the tensors the slots hold now: one given another tensor (a reloaded or swapped
        # parameter, ``module.double()``) keeps its slot's index, as the tying is unchanged. The
        # stores are read once: another thread may set a parameter meanwhile.
        stores: dict[int, dict] = {id(d): d.copy() for m in self.modules for d in (m._parameters, m._buffers)}
        index_of = {id(stores[id(d)].get(n)): i for i, (d, n) in enumerate(self.unique)}
        clones = {}
        for mod in self.modules:
            attributes, params, buffers = dict(mod.__dict__), stores[id(mod._parameters)], stores[id(mod._buffers)]
            copy = _Module.__new__(type(mod))
            copy.__dict__.update(attributes)
            copy.__dict__["_parameters"] = _rebound(params, proxies, index_of)
            copy.__dict__["_buffers"] = _rebound(buffers, proxies, index_of)
            _found[copy] = _Found(attributes, tuple(params), tuple(buffers), tuple(attributes["_modules"].items()))
            _note_hook_stores(copy)
            _hide_fsdp_hooks(copy)
            clones[id(mod)] = copy
        for clone in clones.values():
            subs = clone.__dict__["_modules"]
            clone.__dict__["_modules"] = type(subs)(
                (n, clones[id(s)] if s is not None else None) for n, s in _found[clone].submodules
            )
        return clones[id(self.root)], [(clones[id(m)], m) for m in self.modules]


class _Found(NamedTuple):
    """A module as its clone was made: its instance dict (a shallow copy), the names in its
    parameter and buffer stores, and its submodules. What the traced forward wrote is what its
    clone holds that differs from these, not from the module as it is after tracing, which another
    thread may have written meanwhile (``model.temperature = t`` while a call compiles): that
    thread's write, which eager makes once, not the program's."""

    attributes: dict
    parameters: tuple
    buffers: tuple
    submodules: tuple


_STORES = ("_parameters", "_buffers", "_modules")
#: The modules the clones of the traces in progress were made from, as they were then (``_Found``).
_found: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def found_attributes(clone, original) -> dict:
    """The attributes ``original`` had when ``clone`` was made from it: what tracing compares the
    clone's with, and where code that is not the program changed them meanwhile, what it takes as
    found (``bystanders.fold``)."""
    found = _found.get(clone)
    return original.__dict__ if found is None else found.attributes


#: The clone's forward hook stores that leave FSDP's hooks out: those run eagerly (``core.fsdp``).
_HIDDEN_HOOKS = "_thunder_rs_hidden_hooks"
_FORWARD_HOOK_STORES = ("_forward_pre_hooks", "_forward_hooks")


def _hide_fsdp_hooks(clone) -> None:
    hidden = []
    for name in _FORWARD_HOOK_STORES:
        store = clone.__dict__.get(name)
        if store:
            kept = without_fsdp_hooks(store)
            if kept is not store:
                clone.__dict__[name] = kept
                hidden.append(name)
    if hidden:
        clone.__dict__[_HIDDEN_HOOKS] = (_HIDDEN_HOOKS, *hidden)


#: The contents of the hook stores of each clone tracing runs, as its trace began (``_note_hook_stores``),
#: kept beside the clone rather than in it, where the program could see them (``vars(self)``).
_hook_snapshots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _note_hook_stores(clone) -> None:
    """Notes the contents of the hook stores ``clone`` shares with its module. A hook the forward
    registers or removes while traced is traced into the call as eager runs it, and its handle is
    one of the user's module (removing it later, in a later call's forward or outside, removes the
    module's hook, as eager's does); ``hook_changes`` then puts the stores back as they were until
    the entry is made (``restore_hook_stores`` where tracing failed). Meanwhile the module holds
    what the traced forward registered: a forward that registers hooks, traced in one thread while
    another thread runs or traces the same module, would share them with it."""
    d = clone.__dict__
    _hook_snapshots[clone] = {name: list(d[name].items()) for name in _HOOK_STORES if d.get(name) is not None}


def _put(store, items) -> None:
    store.clear()
    store.update(items)


def restore_hook_stores(pairs: list) -> list:
    """Puts the hook stores of the ``(clone, original)`` pairs back as they were when tracing
    began; returns ``(name, clone, store, the (key, hook) pairs tracing left there)`` for each it
    changed."""
    changed = []
    for clone, original in pairs:
        for name, before in _hook_snapshots.pop(clone, {}).items():
            store = original.__dict__.get(name)
            if store is not None and list(store) != [key for key, _ in before]:
                changed.append((name, clone, store, list(store.items())))
                _put(store, before)
    return changed


def _rebound(store: dict, proxies: list, index_of: dict) -> dict:
    return type(store)((n, proxies[index_of[id(v)]] if v is not None else None) for n, v in store.items())


def attribute_writes(pairs: list) -> list:
    """What the forward changed on module instance dicts, from ``(clone, original)`` pairs:
    ``(original, name, value)`` with MISSING for removed attributes. Changes to the submodule,
    parameter and buffer stores (which entries they hold) are refused."""
    writes = []
    originals = {id(c): o for c, o in pairs}
    for clone, original in pairs:
        now, before = clone.__dict__, found_attributes(clone, original)
        hidden = now.get(_HIDDEN_HOOKS, ())
        names, same_names = _changed_names(now, before)
        for name in names:
            if name in ("_parameters", "_buffers", "_modules") or name in hidden:
                continue
            if name in _HOOK_STORES:
                continue
            value = stood_in_for(now[name])  # (a cached function's reader, put there while traced: not a write)
            if before.get(name, MISSING) is not value:
                writes.append((original, name, _original_of(value, originals)))
        if not same_names:
            writes.extend((original, name, MISSING) for name in before if name not in now)
        registered = _registered_buffers(clone, original)
        writes += registered
        _check_structure(clone, original, originals, {name for _, name, _ in registered})
    return writes


class BufferRegistrar:
    """Stands for a module in the write of a buffer its forward registered (lazy initialisation,
    ``self.register_buffer("running", torch.zeros(3))``): setting the name registers the value
    as eager's call left it, persistent or not as the forward registered it."""

    __slots__ = ("module", "persistent")
    module: torch.nn.Module
    persistent: bool

    def __init__(self, module, persistent: bool):
        object.__setattr__(self, "module", module)
        object.__setattr__(self, "persistent", persistent)

    def __setattr__(self, name, value) -> None:
        self.module.register_buffer(name, value, persistent=self.persistent)


def registered_slots(writes: list, pairs: list) -> list:
    """``(clone's buffer store, name)`` of the buffers among ``writes`` the forward registered:
    thunder_rs's own references to what the call registers, not an escape."""
    clones = {id(o): c for c, o in pairs}
    return [
        (clones[id(holder.module)].__dict__["_buffers"], name)
        for holder, name, _ in writes
        if type(holder) is BufferRegistrar and id(holder.module) in clones
    ]


def _registered_buffers(clone, original) -> list:
    """``(BufferRegistrar, name, value)`` for each buffer the traced forward registered on
    ``clone`` under a name its module has no buffer of, with a tensor."""
    found = _found.get(clone)
    names = set(original._buffers) if found is None else set(found.buffers)
    nonpersistent = clone.__dict__.get("_non_persistent_buffers_set", ())
    return [
        (BufferRegistrar(original, name not in nonpersistent), name, value)
        for name, value in clone.__dict__["_buffers"].items()
        if name not in names and isinstance(value, torch.Tensor)
    ]


def _changed_names(now: dict, before: dict) -> tuple:
    """The names of ``now`` whose values may differ from ``before``'s (all of them, unless both
    hold the same names in the same order and no reader stands in among ``now``'s values: then
    those whose values are not the very same, found in C), and whether the names are the same."""
    if list(now) != list(before) or holds_stand_in(now.values()):
        return now, False
    return list(itertools.compress(now, map(operator.is_not, now.values(), before.values()))), True


def changed_meanwhile(pairs: list) -> set:
    """``(id(module), name)`` of the attributes of the user's modules that changed while their
    clones were traced (``(clone, original)`` pairs): the program writes its clones, so another
    thread or code interrupting the program set them. A guard on one that fails after tracing is
    left to fail on the next call (``bystanders.checked_by_the_next_call``), which compiles again."""
    changed: set[tuple[int, str]] = set()
    for clone, original in pairs:
        found = _found.get(clone)
        if found is not None and not same_entries(now := original.__dict__, found.attributes):
            changed.update(
                (id(original), n)
                for n in now.keys() | found.attributes.keys()
                if n not in _STORES and now.get(n, MISSING) is not found.attributes.get(n, MISSING)
            )
    return changed


def hook_changes(pairs: list) -> list:
    """The hooks the traced forward registered on modules and left there, or removed, from
    ``(clone, original)`` pairs: ``(original's store, its (key, hook) pairs after the call)``,
    the stores put back as they were (``restore_hook_stores``). ``apply_hook_changes`` makes them
    once the entry is made, as eager's forward made them in this call: the entry then finds the
    modules' hooks changed and compiles again, as a forward that registers on every call (its
    hooks pile up) or once (Hugging Face's output capture, behind a flag it sets) registers them
    in eager."""
    originals = {id(c): o for c, o in pairs}
    changes = []
    for name, clone, store, after in restore_hook_stores(pairs):
        if name not in clone.__dict__.get(_HIDDEN_HOOKS, ()):  # (FSDP's hooks, left out of the clone's stores)
            changes.append((store, [(key, with_originals(hook, originals)) for key, hook in after]))
    return changes


def apply_hook_changes(changes: list) -> None:
    for store, after in changes:
        _put(store, after)
    if changes:
        RemovableHandle.next_id += 1  # moves ``hooks_version``: entries compare their modules' hooks


def with_originals(fn, originals: dict):
    """``fn`` with the module clones its closure cells (or, for a method, its ``self``) hold
    replaced by the user's modules (``originals``: ``id(clone) -> module``): a function the
    forward made while traced, kept past the call (a hook), must not keep the clones' proxies."""
    if isinstance(fn, types.MethodType):
        receiver = originals.get(id(fn.__self__), fn.__self__)
        return fn if receiver is fn.__self__ else types.MethodType(with_originals(fn.__func__, originals), receiver)
    if not isinstance(fn, types.FunctionType) or not fn.__closure__:
        return fn
    values = [cell_contents(c) for c in fn.__closure__]
    if not any(id(v) in originals for v in values):
        return fn
    cells = tuple(types.CellType() if v is MISSING else types.CellType(originals.get(id(v), v)) for v in values)
    return types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, cells)


def cell_contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # a variable not assigned yet
        return MISSING


def _original_of(value, originals):
    """``value`` with the clones it stands for replaced by the user's modules: a clone, or a method
    bound to one (``module.forward = original_forward`` after patching it, as Hugging Face does)."""
    if isinstance(value, _Module):
        return originals.get(id(value), value)
    if isinstance(value, types.MethodType) and id(value.__self__) in originals:
        return types.MethodType(value.__func__, originals[id(value.__self__)])
    return value


def _check_structure(clone, original, originals, registered: set) -> None:
    """Refuses a change of ``clone``'s parameters, buffers or submodules but the buffers its
    forward ``registered``, which every call registers after it (``BufferRegistrar``)."""
    found = _found.get(clone)
    stores = (tuple(original._parameters), tuple(original._buffers)) if found is None else found[1:3]
    for store, what, names in zip(("_parameters", "_buffers"), ("parameters", "buffers"), stores):
        added = (set(clone.__dict__[store]) ^ set(names)) - (registered if store == "_buffers" else set())
        if added:
            raise ThunderNotImplementedError(
                f"thunder_rs.jit: {type(original).__name__}.forward registers or removes {what} "
                f"({sorted(added)[0]!r}){_at(clone)}; a traced forward cannot change the module structure. Create "
                "them in __init__, or run one eager call first (lazy initialisation)"
            )
    subs = clone.__dict__["_modules"]
    before = list(original._modules.items()) if found is None else list(found.submodules)
    if [(n, originals.get(id(s), s)) for n, s in subs.items()] != before:
        raise ThunderNotImplementedError(
            f"thunder_rs.jit: {type(original).__name__}.forward adds, removes or replaces submodules{_at(clone)}; "
            "a traced forward cannot change the module structure"
        )


def _at(clone) -> str:
    """`` at file:line`` of the program's call that changed ``clone``'s structure, where it was seen."""
    site = structure_sites.get(clone)
    return "" if site is None else f" at {site}"
