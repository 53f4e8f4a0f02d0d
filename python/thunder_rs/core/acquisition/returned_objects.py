"""Which objects a traced program returns that it made, which every compiled call makes anew.

Eager returns a new ``SimpleNamespace``, dataclass or plain class instance (and its own lists,
dicts and sets) from each call, holding that call's values, while an object the program read from
its state (``self.config``, a global) is the same object on every call. Right after the program
returned, an object it made is referenced only from what it returned: ``made_objects`` walks the
returned value (lists, tuples, dicts, sets, instance dicts and slots) counting the references it
finds to each object, and takes for made those whose reference count is no higher, and that only
made objects (or the returned value itself) reference. An object also held elsewhere (state, a
cache, a closure) counts as found, not made, and is returned as it is, as before. The values the
program set on its state count the attribute holding them: one it made there (``self.last =
SimpleNamespace(n=3)``) is made anew by every call's write (``outputs.MadeAgain``).

``rebuild_kind`` says how a made object is made again for each call: a plain class instance (its
layout is ``object``'s or ``SimpleNamespace``'s plus an instance dict and slots) as its base's
``__new__`` and its attributes (its ``__init__`` is not run again: the trace repeats what it did),
a set, ``bytearray``, ``deque``, ``array.array`` or NumPy array as a copy, an immutable value as
itself; for anything else (a lock, a generator, a C extension object) ``refuse_made`` names it.
"""

import array
import collections
import itertools
import struct
import sys
import types
import typing

import torch

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.state.guards import slot_names
from thunder_rs.errors import ThunderNotImplementedError

#: Objects walked at most; past that, nothing counts as made (returned as before).
_BUDGET = 20000
_POINTER = struct.calcsize("P")
#: Containers a shallow copy makes anew exactly (elements shared: hashable or plain values).
COPIED = (set, bytearray, collections.deque, array.array)
#: Values never walked: they hold no object the program made, or are shared as eager shares them.
LEAVES = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    torch.dtype,
    torch.device,
    torch.Size,
    torch.Tensor,
    type,
    types.BuiltinFunctionType,
    types.ModuleType,
)


_SKIPPED = (*LEAVES, TensorProxy)
#: Walked through only where they may be made (``_walk``: a model found in state is not walked through).
_DEFERRED = (torch.nn.Module,)
#: What a program returns as the object it found, or made anew where it made it (``rebuild_kind``).
MADE_AGAIN = (torch.nn.Module, types.FunctionType, types.MethodType)


class MadeObjects:
    """The objects a program returned that it made (kept alive, so their ids stay theirs), and
    where it was defined, for messages."""

    def __init__(self, objects: list, where: str):
        self._objects = objects
        self._ids = frozenset(map(id, objects))
        self.where = where

    def __contains__(self, x) -> bool:
        return id(x) in self._ids


def children(x) -> list:
    """The objects ``x`` references that Python code can see."""
    found: list = []
    if type(x) is types.FunctionType:  # (what eager makes anew with a function: its cells, defaults)
        found.extend(v for v in (x.__closure__, x.__defaults__, x.__kwdefaults__) if v is not None)
    elif type(x) is types.CellType:
        return [x.cell_contents] if is_full(x) else []
    elif type(x) is types.MethodType:  # (a new one per attribute read: ``return self.helper``)
        return [x.__func__, x.__self__]
    if isinstance(x, (list, tuple, set, frozenset, collections.deque)):
        found.extend(x)
    elif isinstance(x, dict):
        for k, v in x.items():
            found.append(k)
            found.append(v)
    state = getattr(x, "__dict__", None)
    if type(state) is dict:
        found.extend(state.values())
    cls: type = type(x)
    for name in slot_names(cls):
        v = getattr(x, name, _UNSET)
        if v is not _UNSET:
            found.append(v)
    return found


_UNSET = object()


def is_full(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _walk(box: list, held: collections.Counter):
    """Every object reachable from ``box`` (not ``LEAVES``), each once, with the references
    found to it and the positions of the objects referencing it; None past ``_BUDGET``. What a
    module holds is walked only once it may be made (``_DEFERRED``)."""
    objects: list = []
    index: dict = {id(box): -1}
    inner: list = []
    parents: list = []
    stack: list = [(-1, box)]
    deferred: list = []
    while stack:
        at, x = stack.pop()
        for child in children(x):
            if isinstance(child, _SKIPPED):
                continue
            k = index.get(id(child))
            if k is None:
                if len(objects) >= _BUDGET:
                    return None
                k = index[id(child)] = len(objects)
                objects.append(child)
                inner.append(0)
                parents.append([])
                deferred.append(k) if isinstance(child, _DEFERRED) else stack.append((k, child))
            if k >= 0:
                inner[k] += 1
                parents[k].append(at)
        if not stack and deferred:
            x = child = None  # (counted: no reference of the walk's own but ``objects``)
            counts = _counts(objects)
            ready = [counts[k] - _OWN == inner[k] + held[id(objects[k])] for k in deferred]
            stack = [(k, objects[k]) for k, r in zip(deferred, ready) if r]
            deferred = [k for k, r in zip(deferred, ready) if not r]
    return objects, inner, parents


def _counts(objects: list) -> list:
    return [sys.getrefcount(o) for o in objects]


#: References ``_counts`` finds to an object only its list holds.
_OWN = _counts([object()])[0]


def made_objects(box: list, where: str, stored: list) -> MadeObjects | None:
    """The objects in ``box[0]`` (the program's return value, held only by ``box``) that the
    program made; None where there are too many objects to tell. ``stored``: the values the
    program set on its state, each held by the attribute it is in (and by ``stored``, which is
    emptied): those it made and what they hold count too (``self.last = SimpleNamespace(n=3)``)."""
    held = collections.Counter(map(id, stored))
    box.extend(stored)
    stored.clear()
    try:
        walked = _walk(box, held)
        if walked is None and len(box) > 1:  # (too much stored to tell: what it returned alone)
            del box[1:]
            held.clear()
            walked = _walk(box, held)
        if walked is None:
            return None
        objects, inner, parents = walked
        counts = _counts(objects)
    finally:
        del box[1:]
    _refuse_named_tuple_attributes(objects, where)
    made = [c - _OWN == n + held[id(o)] for o, c, n in zip(objects, counts, inner)]
    changed = True
    while changed:  # (made only if every object referencing it was made)
        changed = False
        for k, ps in enumerate(parents):
            if made[k] and not all(p < 0 or made[p] for p in ps):
                made[k], changed = False, True
    return MadeObjects([o for o, m in zip(objects, made) if m], where)


def _refuse_named_tuple_attributes(objects: list, where: str) -> None:
    """Named tuples are rebuilt from their fields (torch's pytree): one with attributes of its own
    (a subclass's instance dict) would come back without them."""
    for x in objects:
        if isinstance(x, tuple) and hasattr(type(x), "_fields") and getattr(x, "__dict__", None):
            raise ThunderNotImplementedError(
                f"jit: {where} returns a {type(x).__qualname__} (a named tuple) with attributes of its own "
                f"({', '.join(map(str, x.__dict__))}); thunder_rs rebuilds named tuples from their fields and would "
                "return it without them. Return those values as fields or apart"
            )


def rebuild_kind(x) -> str | None:
    """How a made ``x`` is made again per call: "object" (its base's ``__new__``, attributes),
    "copy" (``copy.copy``), "shared" (an immutable value) or None (it cannot be)."""
    cls = type(x)
    if cls in (types.FunctionType, types.CellType, types.MethodType):
        return cls.__name__
    if _plain_layout(cls):
        return "object"
    if cls in COPIED or _is_numpy_array(x):
        return "copy"
    if isinstance(x, (frozenset, range, slice)) or cls.__hash__ not in (None, object.__hash__):
        return "shared" if getattr(x, "__dict__", None) is None else None
    return None


def _plain_layout(cls: type) -> bool:
    """Whether an instance of ``cls`` holds nothing but its base's (``object``'s or
    ``SimpleNamespace``'s) fields, an instance dict, a weak reference list and slots: the sizes
    ``object.__getstate__`` checks before it copies such an object (a lock, a generator, a list or
    exception subclass hold more)."""
    base = types.SimpleNamespace if issubclass(cls, types.SimpleNamespace) else object
    size = base.__basicsize__ + _POINTER * len(slot_names(cls))
    size += _POINTER * (cls.__dictoffset__ > 0 and base.__dictoffset__ == 0)
    size += _POINTER * (cls.__weakrefoffset__ > 0 and base.__weakrefoffset__ == 0)
    return cls.__itemsize__ == 0 and cls.__basicsize__ <= size


def _is_numpy_array(x) -> bool:
    cls = type(x)
    return cls.__module__ == "numpy" and cls.__name__ == "ndarray" and x.dtype.kind != "O"


def base_new(cls: type):
    """A new instance of the plain class ``cls``, made by its base's ``__new__`` (``object``'s or
    ``SimpleNamespace``'s: a class's own ``__new__``, run by eager's call, is not run again)."""
    if issubclass(cls, types.SimpleNamespace):
        return types.SimpleNamespace.__new__(cls)
    return object.__new__(cls)


def refuse_made(x, made: MadeObjects) -> typing.NoReturn:
    name = f"{type(x).__module__}.{type(x).__qualname__}"
    raise ThunderNotImplementedError(
        f"jit: {made.where} returns a {name} it made (as it is, or inside what it returns); eager returns a new one "
        "from each call, and thunder_rs cannot make this kind of object anew for each compiled call. Return its "
        "tensors and values (a tuple, a dict, a dataclass or SimpleNamespace) and build the object outside the "
        "jitted function"
    )


def refuse_module_tensors(m: torch.nn.Module, made: MadeObjects) -> None:
    """Refuses a module the program made that holds tensors (its parameters, buffers, tensor
    attributes): eager makes new ones with every call (initialised anew), a compiled call cannot."""
    held = [n for n, _ in itertools.chain(m.named_parameters(recurse=False), m.named_buffers(recurse=False))]
    held += [n for n, v in vars(m).items() if isinstance(v, torch.Tensor) and not isinstance(v, TensorProxy)]
    if held:
        raise ThunderNotImplementedError(
            f"jit: {made.where} returns a {type(m).__qualname__} module it made, holding the tensors "
            f"{', '.join(held)}; eager makes new ones with every call (a new module initialises new parameters), "
            "which thunder_rs cannot repeat. Make the module once outside the jitted function (in __init__) and "
            "return that"
        )


def program_site(code) -> str:
    """``qualname (file:line)`` of the program's code (a module's ``forward``), for messages."""
    if code is None:
        return "the program"
    return f"{getattr(code, 'co_qualname', code.co_name)} ({code.co_filename}:{code.co_firstlineno})"
