"""Tracing stand-ins that outlive their trace: a proxy stored in user state is an error.

A program that stores a tensor it computed somewhere that outlives the call and that no compiled
call stores to again (a hook's closure, a set, an object it reached in a way the observer does
not follow) would, compiled, keep the stand-in of the first trace there and never update it. (A
list or dict of module state or a global is a cache every call fills: ``core.state.containers``.)
After tracing, every proxy the
acquisition made must be referenced only from thunder_rs's own list of them (and from other
proxies, such as a view's base); a count above that means it escaped, and the error says where.
"""

import collections
import functools
import gc
import sys
import types
import weakref
from collections.abc import Sequence

import torch

from thunder_rs.core.base.proxies import SymbolicSize, TensorProxy
from thunder_rs.core.base.userframe import store_site, user_location
from thunder_rs.core.state.identity import cache_fill_error
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError


def _refcounts(proxies: list) -> list[int]:
    return [sys.getrefcount(p) for p in proxies]


def _baseline() -> int:
    """References a proxy has when only one list holds it (depends on the torch version)."""
    return _refcounts([TensorProxy(0, (1,), torch.float32, torch.device("cpu"), False)])[0]


_BASELINE = _baseline()


def _count_proxies(value, held: dict, depth: int) -> None:
    """Counts in ``held`` the proxies ``value`` references: directly, in lists and tuples, and in
    the attributes of small bookkeeping objects (a view's link to its root)."""
    if isinstance(value, TensorProxy):
        held[id(value)] = held.get(id(value), 0) + 1
    elif depth == 0 or isinstance(value, (str, bytes, int, float, weakref.ref, torch.dtype, torch.device)):
        return
    elif type(value) in (tuple, list):
        for item in value:
            if type(item) not in _LEAVES:
                _count_proxies(item, held, depth - 1)
    else:
        for name in getattr(type(value), "__slots__", ()):
            if type(item := getattr(value, name, None)) not in _LEAVES:
                _count_proxies(item, held, depth - 1)
        if isinstance(getattr(value, "__dict__", None), dict) and not isinstance(value, type):
            for item in value.__dict__.values():
                if type(item) not in _LEAVES:
                    _count_proxies(item, held, depth - 1)


#: Values ``_count_proxies`` finds nothing in, not called for (most of a view link's slots, the
#: weak references to a root's views).
_LEAVES = frozenset({int, float, bool, str, bytes, type(None), weakref.ref, torch.dtype, torch.device})
#: Attribute values of a proxy that never hold another proxy (its id, shape, dtype, device; a weak
#: reference to its source).
_PLAIN = frozenset(
    {int, float, bool, str, type(None), torch.Size, SymbolicSize, tuple, torch.dtype, torch.device, weakref.ref}
)


def _held_by_proxies(proxies: list) -> dict:
    """``id(proxy) -> count`` of references from other proxies' bookkeeping (a view's root)."""
    held: dict = {}
    plain = _PLAIN
    for value in [v for p in proxies for v in p.__dict__.values() if type(v) not in plain]:
        _count_proxies(value, held, 4)
    return held


def _suspects(proxies: list, held: dict) -> list[int]:
    """Positions (not the proxies: a list of them would add a reference) of proxies with more
    references than their bookkeeping explains."""
    return [i for i, n in enumerate(_refcounts(proxies)) if n > _BASELINE + held.get(id(proxies[i]), 0)]


def _held_by_clones(placed: Sequence, held: dict) -> None:
    """Counts in ``held`` the references of the module clones' parameter and buffer slots
    (``placed``: ``(clone's store, name)``): what they hold is the input thunder_rs put there or
    what the program stored into the slot, which the call writes back as module state. The
    caller keeps the stores alive; a clone also outlives the trace where a call recorded it as an
    argument (a custom Function's forward that runs the layers it is given: Reformer's)."""
    for store, name in placed:
        value = store.get(name)
        if isinstance(value, TensorProxy):
            held[id(value)] = held.get(id(value), 0) + 1


def escaped(proxies: list, placed: Sequence = ()) -> list:
    """The proxies of ``proxies`` that something outside the trace still references."""
    held = _held_by_proxies(proxies)
    _held_by_clones(placed, held)
    if _suspects(proxies, held):
        gc.collect()  # cycles of garbage (the module clones, a frame and its locals) are not escapes
    return [proxies[i] for i in _suspects(proxies, held)]


def _module_slots(holder: dict) -> bool:
    """Whether ``holder`` is a module's buffers or parameters (where eager's ``self.count += 1`` sets
    the tensor it read; a plain attribute may be set to a held tensor read elsewhere, which later
    calls would have to set again: that stays refused)."""
    return any(
        type(d) is dict and "_modules" in d and (d.get("_buffers") is holder or d.get("_parameters") is holder)
        for d in gc.get_referrers(holder)
    )


def _put_back_held(suspects: list, held: dict) -> None:
    """A stand-in for a tensor the program holds (``held``: id of the stand-in -> the tensor),
    stored into a module's buffers or parameters (``self.count += 1`` on a buffer of a module the
    program calls: the augmented assignment sets the slot again, to the same tensor in eager), is
    that tensor: it goes back there, and the trace writes the tensor in place, as eager does."""
    for proxy in suspects:
        tensor = held.get(id(proxy))
        if tensor is None:
            continue
        for holder in gc.get_referrers(proxy):
            if type(holder) is dict and _module_slots(holder):
                for key in [k for k, v in holder.items() if v is proxy]:
                    holder[key] = tensor


def check_no_escape(
    proxies: list, producer, sites: dict | None = None, placed: Sequence = (), held: dict | None = None
) -> None:
    """Raises when a proxy escaped; ``producer(proxy)`` names the op that made it, ``sites``
    (``containers.StateContainers.sites``) where the program changed the lists and dicts it read,
    ``placed`` the module clones' slots (``_held_by_clones``), ``held`` the tensors the program
    holds by the ids of their stand-ins (``_put_back_held``)."""
    suspects = escaped(proxies, placed)
    if suspects and held:
        _put_back_held(suspects, held)
        del suspects  # (its references would be counted)
        suspects = escaped(proxies, placed)
    if not suspects:
        return
    proxy = suspects[0]
    del suspects  # its own reference would be found as the holder
    where, holder = describe_holder(proxy, proxies)
    site = (sites or {}).get(id(holder))
    cached = holder if type(holder) is functools._lru_cache_wrapper else None
    parametrizations = _is_parametrization_cache(holder)
    del holder
    at = f" at {store_site(*site)}" if site is not None else ""
    remaining = escaped(proxies, placed)
    for p in remaining:
        _remove_from_user_state(p, (proxies, remaining))
    if cached is not None:
        raise cache_fill_error(cached, site[0] if site is not None else "an unknown line")
    if parametrizations:
        raise ThunderNotImplementedError(
            f"torch.nn.utils.parametrize.cached() around the jitted call at {user_location()}: inside it eager "
            "computes each parametrized tensor once and reads it from the cache at every later use, in later calls "
            "in the block too (after an optimizer step as well), which a compiled call does not. Enter cached() "
            "inside the jitted program (each call then computes a parametrized tensor once), or call the model "
            "eagerly inside the block"
        )
    raise ThunderRuntimeError(
        f"thunder_rs.jit: the traced program{at} stored a tensor it computed ({producer(proxy)}) in "
        f"{where}, which outlives the call (thunder_rs removed it from there again). Compiled, it "
        "would keep the value of the first call there. Return the tensor instead, register such hooks on the "
        "jitted module (they then run eagerly around the compiled call), or use "
        "torch.compile(backend=...) for programs with such side effects"
    )


def _is_parametrization_cache(holder) -> bool:
    """Whether ``holder`` is the cache of ``torch.nn.utils.parametrize.cached()``."""
    parametrize = sys.modules.get("torch.nn.utils.parametrize")
    return parametrize is not None and holder is parametrize._cache


def _remove_from_user_state(obj, ours: tuple) -> None:
    """Takes the stand-in ``obj`` out of the lists, dicts (entries, attributes, globals), sets and
    closure cells that hold it, so that the refused call leaves no stand-in behind: a hook that
    keeps a tensor in a closure's dict would otherwise return the stand-in from its later eager
    calls. ``ours`` are thunder_rs's own lists of stand-ins."""
    skip = {*map(id, ours), id(sys._getframe())}
    for holder in gc.get_referrers(obj):
        if id(holder) in skip or isinstance(holder, (types.FrameType, TensorProxy)):
            continue
        cached = _cache_of(holder)
        if cached is not None:  # its items cannot be taken out one by one
            cached.cache_clear()
            continue
        # Loops, not comprehensions: a comprehension's closure cell holding ``obj`` is a referrer.
        if isinstance(holder, list):
            for i in reversed(range(len(holder))):
                if holder[i] is obj:
                    del holder[i]
        elif isinstance(holder, dict):
            while (key := _key_of(holder, obj)) is not None:
                del holder[key]
        elif isinstance(holder, set):
            holder.discard(obj)
        elif type(holder).__name__ == "cell" and holder.cell_contents is obj:
            del holder.cell_contents


def describe_holder(obj, ignore: list) -> tuple:
    """Where ``obj`` is referenced from, in words, and the container there (None when unknown;
    slow, error path only)."""
    skip = {id(ignore), id(sys._getframe())}
    for holder in gc.get_referrers(obj):
        if id(holder) in skip or isinstance(holder, types.FrameType) or holder is ignore:
            continue
        if isinstance(holder, TensorProxy):
            continue
        cached = _cache_of(holder)
        if cached is not None:
            return f"the cache of {cached.__qualname__} (functools.lru_cache)", cached
        where = _describe_container(holder, obj)
        if where:
            return where, holder
    return "Python state outside the trace", None


def _cache_of(holder):
    """The function cached by functools whose cache ``holder`` is (the function itself, or the dict
    of ``functools.cache``), else None."""
    if type(holder) is functools._lru_cache_wrapper:
        return holder
    if type(holder) is dict:
        return next((r for r in gc.get_referrers(holder) if type(r) is functools._lru_cache_wrapper), None)
    return None


def _describe_container(holder, obj) -> str | None:
    if isinstance(holder, collections.deque):
        return f"a collections.deque{_owner(holder)}"
    if isinstance(holder, list):
        owner = _owner(holder)
        return f"a list{owner}"
    if isinstance(holder, dict):
        if "__name__" in holder and "__builtins__" in holder:
            name = _key_of(holder, obj) or "?"
            return f"global variable {name!r} of module {holder['__name__']}"
        key = _key_of(holder, obj)
        module = _module_of(holder)
        if module is not None and key is not None:
            return _module_attribute(module, key)
        owner = _owner(holder)
        return f"entry {key!r} of a dict{owner}" if key is not None else f"a dict{owner}"
    if isinstance(holder, (tuple, set)):
        return f"a {type(holder).__name__}{_owner(holder)}"
    if type(holder).__name__ == "cell":
        return f"a closure variable{_owner(holder)}"
    return None


def _module_of(attributes: dict):
    """The module whose instance dict ``attributes`` is, else None."""
    return next(
        (m for m in gc.get_referrers(attributes) if isinstance(m, torch.nn.Module) and m.__dict__ is attributes), None
    )


def _module_attribute(module, name: str) -> str:
    """A module's attribute the program set: that of a module it reached (a bound ``model.forward``
    jitted, a module in a global) rather than the jitted module's, whose writes every call repeats."""
    kind = type(module).__name__
    return (
        f"attribute {name!r} of a {kind} the program reached but was not given as the jitted module (jit the "
        f"module itself, thunder_rs.jit(model) or thunder_rs.compile_module(model), rather than its forward: "
        f"what it sets on its modules every compiled call sets again)"
    )


def _owner(container, depth: int = 0) -> str:
    """`` (global 'feats' of module m)`` or `` (attribute 'x' of Foo)`` for a container."""
    if depth > 2:
        return ""
    for ref in gc.get_referrers(container):
        if isinstance(ref, dict):
            name = _key_of(ref, container)
            if name is None:
                continue
            if "__name__" in ref and "__builtins__" in ref:
                return f" (global {name!r} of module {ref['__name__']})"
            for obj in gc.get_referrers(ref):
                if getattr(obj, "__dict__", None) is ref:
                    return f" (attribute {name!r} of a {type(obj).__name__})"
        if isinstance(ref, tuple):
            for fn in gc.get_referrers(ref):
                if isinstance(fn, types.FunctionType) and fn.__closure__ is ref:
                    code = fn.__code__
                    return f" (captured by {fn.__qualname__} at {code.co_filename}:{code.co_firstlineno})"
        if type(ref).__name__ == "cell":
            owner = _owner(ref, depth + 1)
            if owner:
                return owner
    return ""


def _key_of(mapping: dict, value):
    """The first key of ``mapping`` whose value is ``value``, else None. A loop, not a generator
    expression: a generator's closure cell holding ``value`` would be among its referrers."""
    for key, v in mapping.items():
        if v is value:
            return key
    return None
