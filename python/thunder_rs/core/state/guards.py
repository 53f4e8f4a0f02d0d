"""Guards: Python values a trace was specialised on, checked before a cached trace runs.

Tracing runs the user's Python on proxies, so every non-tensor value it reads (a global float, a
closure cell, ``self.p``, ``config.hidden_size``, an attribute of an argument object) is baked into
the trace. Each such read becomes a guard: where the value lives (its *source*), under which name,
and what it was. A cache entry runs only while all its guards hold.

Guards on module attributes are checked only when some module attribute was written since the
entry last validated them (``modules.write_epoch``) or one of the dicts they read was changed
otherwise (``module.__dict__[k] = v``: a newer change stamp, ``entry.module_dicts``), so a module
whose forward reads twenty attributes pays an integer compare and a C read of a few stamps per
call; only the requires_grad and leafness of the tensors
module attributes hold, which change with no write, are checked every call (``GradStateGuard``).
The others are compiled into one generated function.
"""

import enum
import functools
import math
import operator
from _thread import _local as _thread_local
from collections.abc import MutableMapping

import numpy
import torch

from thunder_rs._core import dict_versions_stamped
from thunder_rs.core.state.items import ANY_TENSOR, DICTS, SameType, members, same_held_items, same_items
from thunder_rs.core.state.items import changes_in_place, container_copy, same_attributes

#: Whether each change of a dict stamps it (CPython 3.10-3.12; ``entry.module_dicts``): module
#: guards then wait for a module write or a newer stamp; elsewhere they are checked on every call.
DICT_STAMPS = dict_versions_stamped()

#: Stands for "no such attribute" in guard checks.
MISSING = type("Missing", (), {"__repr__": lambda self: "<missing>"})()

_SIMPLE_TYPES = frozenset(
    {bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size, type(None), type(Ellipsis)}
)
#: NumPy's scalar types: keyed by type and value, as a Python number is.
NUMPY_SCALARS = frozenset(t for t in numpy.sctypeDict.values() if isinstance(t, type) and issubclass(t, numpy.generic))
_IDENTITY_TYPES = (bool, type(None), type(Ellipsis), enum.Enum, torch.dtype)


def is_simple(value) -> bool:
    """Values guarded by equality: numbers, strings, dtypes, devices, enums, and small tuples,
    lists and frozensets of them. Anything else is guarded by identity."""
    t = type(value)
    if t in _SIMPLE_TYPES or t in NUMPY_SCALARS or isinstance(value, enum.Enum):
        return True
    if t in (tuple, list, frozenset):
        return len(value) <= 64 and all(map(is_simple, value))
    return False


def name_code(name, var: str, scope: dict) -> str:
    """``name`` (an attribute's name or an item's key) in generated code: a string or int as
    itself, another key bound in ``scope`` as ``var`` (its repr may be no code: ``(3, torch.float32)``)."""
    if type(name) in (str, int):
        return repr(name)
    scope[var] = name
    return var


def freeze(value):
    """A hashable, type-exact stand-in for a simple value: ``1``, ``1.0`` and ``True`` differ, NaN
    equals NaN and ``-0.0`` differs from ``0.0``."""
    t = type(value)
    if t is float:
        return (float, value.hex())
    if t is complex:
        return (complex, value.real.hex(), value.imag.hex())
    if t in NUMPY_SCALARS:  # (its value's bits: NaN equal to NaN, ``-0.0`` not ``0.0``)
        return (t, value.tobytes())
    if t in (tuple, list, frozenset):
        items = map(freeze, value)
        return (t, frozenset(items) if t is frozenset else tuple(items))
    return (t, value)


class Item(str):
    """A step that reads an item by a constant key (``[key]``), among attribute names: in a read
    chain (``cfg["sub"]``) and in the path of an argument object (``cache.layers[0]``)."""

    key: object

    def __new__(cls, key):
        step = super().__new__(cls, f"[{key!r}]")
        step.key = key
        return step


@functools.cache
def slot_names(cls: type) -> tuple:
    """The slots of ``cls`` and its bases, but ``__dict__`` and ``__weakref__``."""
    return tuple(n for c in cls.__mro__ for n in getattr(c, "__slots__", ()) if n not in ("__dict__", "__weakref__"))


class SlotsView(MutableMapping):
    """The attributes of an object whose class has ``__slots__`` (``@dataclass(slots=True)``) as
    the mapping an instance dict would be: the slots that are set."""

    __slots__ = ("obj", "names")

    def __init__(self, obj):
        self.obj, self.names = obj, slot_names(type(obj))

    def __getitem__(self, name):
        if name not in self.names:
            raise KeyError(name)
        try:
            return getattr(self.obj, name)
        except AttributeError:
            raise KeyError(name) from None

    def __iter__(self):
        return (n for n in self.names if hasattr(self.obj, n))

    def __len__(self):
        return sum(1 for _ in self)

    def __setitem__(self, name, value):
        setattr(self.obj, name, value)

    def __delitem__(self, name):
        delattr(self.obj, name)


def attributes_of(obj):
    """``obj``'s attributes as a mapping: its instance dict, or its slots; None when it has neither."""
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict):
        return d
    return SlotsView(obj) if slot_names(type(obj)) else None


class Source:
    """Where a guarded value lives: a mapping read by name (an instance dict, a globals dict), or
    a closure cell."""

    #: False for module attributes, which are checked only after a module attribute was written.
    per_call = True
    label = ""

    def mapping(self, flat):
        """The mapping that holds the value for the call with flat inputs ``flat``."""
        raise NotImplementedError

    def code(self, var: str, scope: dict) -> str:
        """An expression for the mapping in the generated check; binds constants in ``scope``."""
        raise NotImplementedError

    def describe(self, name: str) -> str:
        return f"{self.label}.{name}"

    @property
    def key(self):
        """What identifies the source among an acquisition's guards."""
        raise NotImplementedError


class FixedSource(Source):
    """A mapping that is the same object on every call: ``fixed()`` gives it."""

    def fixed(self):
        raise NotImplementedError

    def mapping(self, flat):
        return self.fixed()

    def code(self, var, scope):
        scope[var] = self.fixed()
        return var


# Sources and guards are plain classes, not dataclasses: nothing compares, hashes or copies them
# by field, and generating the methods of eleven dataclasses cost ``import thunder_rs`` 3-4 ms.


class ObjectSource(FixedSource):
    """The instance dict of an object the entry keeps alive (a config, a global object)."""

    def __init__(self, obj, label: str):
        self.obj, self.label = obj, label

    def fixed(self):
        return attributes_of(self.obj)

    def code(self, var, scope):
        if isinstance(self.obj, _thread_local):
            # Each thread has its own instance dict: read the calling thread's.
            scope[var] = self.obj
            return f"{var}.__dict__"
        return super().code(var, scope)

    @property
    def key(self):
        return id(self.obj)


class ModuleSource(ObjectSource):
    """The instance dict of an ``nn.Module`` of the program."""

    per_call = not DICT_STAMPS


class ModuleDictSource(ModuleSource):
    """The instance dict of an ``nn.Module`` the program reads as a dict (``self.__dict__["scale"]``):
    checked on every call, since a write through it (``model.__dict__["scale"] = 2.0``) bypasses
    ``nn.Module.__setattr__``, which moves the write epoch the other module guards wait for."""

    per_call = True


class ModuleStoreSource(FixedSource):
    """A module's parameter, buffer or submodule store (``store`` names it)."""

    per_call = not DICT_STAMPS

    def __init__(self, obj, store: str, label: str):
        self.obj, self.store, self.label = obj, store, label

    def fixed(self):
        return self.obj.__dict__[self.store]

    @property
    def key(self):
        return (id(self.obj), self.store)


class GlobalsSource(FixedSource):
    """A module's globals."""

    def __init__(self, globals: dict, label: str):
        self.globals, self.label = globals, label

    def fixed(self):
        return self.globals

    @property
    def key(self):
        return id(self.globals)

    def describe(self, name):
        return f"global {name!r} of {self.label}"


class CellSource(FixedSource):
    """A closure cell, seen as a mapping with the one name ``cell_contents``."""

    def __init__(self, cell, label: str):
        self.cell, self.label = cell, label

    def fixed(self):
        return _CellView(self.cell)

    @property
    def key(self):
        return id(self.cell)

    def describe(self, name):
        return f"closure variable {self.label!r}"


class ClassSource(FixedSource):
    """What an instance of ``cls`` without its own attribute finds on its class, through the MRO
    (``class Config: scale = 2.0``): a class-level constant, which a program reading
    ``config.scale`` depends on as much as on an instance attribute."""

    def __init__(self, cls: type):
        self.cls = cls

    def fixed(self):
        return _ClassView(self.cls)

    @property
    def key(self):
        return ("class", id(self.cls))

    def describe(self, name):
        return f"class attribute {name!r} of {self.cls.__qualname__}"


class ItemSource(FixedSource):
    """The items of a dict, list or tuple the entry keeps alive (``self.cfg`` in
    ``self.cfg["sub"]["scale"]``), read by key or index; checked on every call, since a
    container changes in place without any write counter seeing it."""

    def __init__(self, container, label: str):
        self.container, self.label = container, label

    def fixed(self):
        return self.container if isinstance(self.container, dict) else _SequenceView(self.container)

    @property
    def key(self):
        return ("items", id(self.container))

    def describe(self, name):
        return f"{self.label}[{name!r}]"


class _SequenceView:
    """A list or tuple as a mapping from index to item."""

    __slots__ = ("items",)

    def __init__(self, items):
        self.items = items

    def get(self, index, default=None):
        try:
            return self.items[index]
        except IndexError:
            return default

    def __getitem__(self, index):
        return self.items[index]

    def __setitem__(self, index, value):
        self.items[index] = value


def items_of(container):
    """A dict (a ``Counter``, a ``defaultdict``: read with ``get``, which makes no item), or a list
    or tuple as a mapping from index to item."""
    return container if type(container) in DICTS else _SequenceView(container)


class _ClassView:
    """A class's attributes as a mapping, looked up through its MRO as attribute reads do (a
    subclass or a base rebinding the name changes what the instance reads)."""

    __slots__ = ("cls",)

    def __init__(self, cls):
        self.cls = cls

    def get(self, name, default):
        for klass in self.cls.__mro__:
            value = vars(klass).get(name, MISSING)
            if value is not MISSING:
                return value
        return default


class _CellView:
    __slots__ = ("cell",)

    def __init__(self, cell):
        self.cell = cell

    def get(self, name, default):
        try:
            return self.cell.cell_contents
        except ValueError:
            return default


class InputSource(Source):
    """The instance dict of the ``position``-th flat input, or of an object reached from it
    through ``path``: attribute names, and ``Item`` steps into lists and dicts (``cache.layers[0]``)."""

    def __init__(self, position: int, path: tuple, label: str, slotted: bool = False):
        self.position, self.path, self.label = position, path, label
        #: an object on the path has ``__slots__`` (read through ``attributes_of``), not an instance dict
        self.slotted = slotted

    def object(self, flat):
        obj = flat[self.position]
        for step in self.path:
            obj = obj[step.key] if type(step) is Item else attributes_of(obj)[step]
        return obj

    def mapping(self, flat):
        return attributes_of(self.object(flat))

    @property
    def key(self):
        return ("input", self.position, self.path)

    def code(self, var, scope):
        return self._read().format(self.object_code(scope))

    def _read(self) -> str:
        # A plain ``.__dict__`` read where no object on the path has slots: this runs every call.
        return "_attributes({})" if self.slotted else "{}.__dict__"

    def object_code(self, scope) -> str:
        """An expression for the object at the path (``flat`` the call's flat inputs)."""
        scope.setdefault("_attributes", attributes_of)
        expr = f"flat[{self.position}]"
        for step in self.path:
            expr = f"{expr}[{step.key!r}]" if type(step) is Item else f"{self._read().format(expr)}[{str(step)!r}]"
        return expr


class InputItemsSource(InputSource):
    """The items of a list or dict reached from the ``position``-th flat input through ``path``,
    read by index or key (``cache.keys[0]``)."""

    def mapping(self, flat):
        return items_of(self.object(flat))

    @property
    def key(self):
        return ("input items", self.position, self.path)

    def code(self, var, scope):
        scope["_items_of"] = items_of
        return f"_items_of({self.object_code(scope)})"

    def describe(self, name):
        return f"{self.label}[{name!r}]"


def read_at(source, name: str, flat):
    """The value ``name`` at ``source`` in a call's flat inputs, MISSING where there is none."""
    try:
        return source.mapping(flat).get(name, MISSING)
    except (KeyError, AttributeError, IndexError):
        return MISSING


class Guard:
    """A value the program read by ``name`` from ``source``: holds while it is still ``expected``
    (equal for simple values, the same object for others)."""

    def __init__(
        self,
        source: Source,
        name: str,
        expected,
        origin: str,
        held: frozenset = frozenset(),
        reached: frozenset = frozenset(),
    ):
        self.source, self.name, self.expected = source, name, expected
        #: ``file:line`` of the code that read the value, for miss reasons.
        self.origin = origin
        self.by_identity = not is_simple(self.expected) or isinstance(self.expected, _IDENTITY_TYPES)
        # A list read then appended to must still compare with what was read.
        self.frozen = None if self.by_identity else freeze(self.expected)
        # A list, dict or set changes in place, which no write counter sees: checked on every
        # call; one of objects compares its items by identity with a copy of them.
        self.mutable = changes_in_place(self.expected)
        self.items = members(self.expected) if self.mutable and self.by_identity else None
        # Tensors a list or dict of an argument object holds are read per call (``held``, by id):
        # any tensor may take their place, whose metadata a ``TensorGuard`` checks.
        self.same_items = same_items
        # Objects such a container holds that are guarded whole through their own path in each
        # call's arguments (``reached``, by id: ``cache.layers[0]``) may be other objects of
        # their type. The container is then compared by type and items, not identity: a new
        # call's argument (``generate``'s new KV cache) holds new lists.
        items = self.items
        self.fresh = bool(held or reached) and items is not None
        if self.fresh and items is not None:
            self.items = tuple(
                ANY_TENSOR if id(x) in held else SameType(type(x)) if id(x) in reached else x for x in items
            )
            self.same_items = same_held_items

    @property
    def per_call(self) -> bool:
        return self.source.per_call or self.mutable

    def read(self, flat):
        return read_at(self.source, self.name, flat)

    def holds(self, flat) -> bool:
        value = self.read(flat)
        if self.fresh:
            return type(value) is type(self.expected) and self.same_items(value, self.items or ())
        if self.by_identity:
            if self.items is None:
                return value is self.expected
            # Another list holding the same objects is the same state to the program (a module's
            # forward that stores a new list of its tensors on each call, as torchvision's anchors).
            return type(value) is type(self.expected) and self.same_items(value, self.items)
        return is_simple(value) and freeze(value) == self.frozen

    def describe(self, flat) -> str:
        now = self.read(flat)
        if self.items is not None and type(now) is type(self.expected):
            return f"the contents of {self.source.describe(self.name)} changed (read at {self.origin})"
        expected = _thawed(self.frozen) if self.frozen is not None else self.expected
        return (
            f"{self.source.describe(self.name)} changed from {short(expected)} to {short(now)} (read at {self.origin})"
        )

    def term(self, index: int, scope: dict) -> str:
        """A Python expression that is True while the guard holds."""
        read = f"{self.source.code(f'm{index}', scope)}.get({name_code(self.name, f'key{index}', scope)}, MISSING)"
        expected = self.expected
        if self.fresh:
            scope[f"e{index}"], scope[f"i{index}"], scope[f"f{index}"] = type(expected), self.items, self.same_items
            return f"(type(v := {read}) is e{index} and f{index}(v, i{index}))"
        if self.by_identity:
            scope[f"e{index}"] = expected
            if self.items is None:
                return f"{read} is e{index}"
            scope[f"e{index}"], scope[f"i{index}"], scope[f"f{index}"] = type(expected), self.items, self.same_items
            return f"(type(v := {read}) is e{index} and f{index}(v, i{index}))"
        t = type(expected)
        if t in (int, str, bytes) or (
            t is float and isinstance(expected, float) and math.isfinite(expected) and expected != 0.0
        ):
            return f"(type(v := {read}) is {t.__name__} and v == {expected!r})"
        scope[f"e{index}"] = self.frozen
        return f"(_simple(v := {read}) and _freeze(v) == e{index})"


class DictGuard:
    """A fixed state object guarded whole: all its attributes as the program found them (lists,
    dicts and sets compared by content). Covers reads the observer cannot see, such as
    ``getattr(config, name)`` with a computed name; costs one dict comparison per call."""

    def __init__(self, source: Source, found: dict, origin: str):
        self.source, self.origin = source, origin
        self.per_call = source.per_call
        self.found = {k: container_copy(v) for k, v in found.items()}

    def holds(self, flat) -> bool:
        return same_attributes(self.source.mapping(flat), self.found)

    def describe(self, flat) -> str:
        now = self.source.mapping(flat)
        for name in (*self.found, *now):
            before, after = self.found.get(name, MISSING), now.get(name, MISSING)
            if before is not after and not same_attributes({0: before}, {0: after}):
                return (
                    f"{self.source.describe(name)} changed from {short(before)} to {short(after)} "
                    f"(read at {self.origin})"
                )
        return f"{self.source.label} changed (read at {self.origin})"

    def term(self, index: int, scope: dict) -> str:
        scope[f"e{index}"] = self.found
        return f"_same_attributes({self.source.code(f'm{index}', scope)}, e{index})"


class NamesGuard:
    """The attribute names of an argument object guarded whole: an attribute the program did not
    find (``hasattr(layer, "cumulative_length")``) must still be absent."""

    def __init__(self, source: Source, names: frozenset, origin: str):
        self.source, self.names, self.origin = source, names, origin

    @property
    def per_call(self) -> bool:
        return self.source.per_call

    def holds(self, flat) -> bool:
        try:
            return self.source.mapping(flat).keys() == self.names
        except (KeyError, AttributeError, IndexError, TypeError):
            return False

    def describe(self, flat) -> str:
        now = set(self.source.mapping(flat))
        changed = sorted(now ^ self.names)
        return f"{self.source.label} gained or lost attributes ({', '.join(changed)}) (read at {self.origin})"

    def term(self, index: int, scope: dict) -> str:
        scope[f"e{index}"] = self.names
        return f"{self.source.code(f'm{index}', scope)}.keys() == e{index}"


def module_structure(module) -> tuple:
    """The identities of a module's submodules, parameters and buffers, by name."""
    d = module.__dict__
    return tuple(tuple((n, id(v)) for n, v in d[s].items()) for s in ("_modules", "_parameters", "_buffers"))


class StructureGuard:
    """A module the program called but does not own (a global model a function calls): its
    submodules, parameters and buffers must be the same objects. Checked after module writes."""

    per_call = not DICT_STAMPS

    def __init__(self, module, origin: str):
        self.module, self.expected, self.origin = module, module_structure(module), origin

    def holds(self, flat) -> bool:
        return module_structure(self.module) == self.expected

    def describe(self, flat) -> str:
        return (
            f"the submodules, parameters or buffers of a {type(self.module).__name__} changed (called at {self.origin})"
        )

    def term(self, index: int, scope: dict) -> str:
        scope[f"m{index}"], scope[f"e{index}"] = self.module, self.expected
        return f"_structure(m{index}) == e{index}"


class StateGuard:
    """Global state that no input carries and the cache key leaves out (the switches of
    ``torch.backends.cuda``'s attention kernels), read through ``read``: holds while ``read()``
    gives what it gave when the program was traced. Only entries whose trace depends on it
    carry one, so other programs pay nothing on their per-call path."""

    per_call = True
    source = None

    def __init__(self, label: str, read, expected, show=repr):
        self.label, self.read, self.expected, self.show = label, read, expected, show

    def holds(self, flat) -> bool:
        return self.read() == self.expected

    def describe(self, flat) -> str:
        return f"{self.label} changed from {self.show(self.expected)} to {self.show(self.read())}"

    def term(self, index: int, scope: dict) -> str:
        scope[f"r{index}"], scope[f"e{index}"] = self.read, self.expected
        return f"r{index}() == e{index}"


def _defaults_of(fn) -> tuple:
    """``fn``'s default values, positional then keyword (names and values), as one tuple."""
    kw = fn.__kwdefaults__
    return (*(fn.__defaults__ or ()), *(x for item in kw.items() for x in item)) if kw else (fn.__defaults__ or ())


class DefaultsGuard:
    """The default arguments of the functions the program ran (``def f(x, scale=2.0)``; setting
    ``f.__defaults__`` or an item of ``f.__kwdefaults__`` changes what a call computes): each
    value must be the same object. One guard for all of a trace's functions; its check is, per
    function, an identity test of its ``__defaults__`` tuple (which cannot change in place) and,
    only where it has keyword-only defaults, of their dict and values."""

    per_call = True
    source = None

    def __init__(self, entries: list):
        #: ``(function, its __defaults__, its __kwdefaults__, _defaults_of(function))`` when traced
        self.entries = entries

    @staticmethod
    def entry(fn) -> tuple:
        return (fn, fn.__defaults__, fn.__kwdefaults__, _defaults_of(fn))

    def _changed(self):
        for fn, _, _, found in self.entries:
            now = _defaults_of(fn)
            if len(now) != len(found) or not all(map(operator.is_, now, found)):
                return fn, found
        return None, ()

    def holds(self, flat) -> bool:
        return self._changed()[0] is None

    def describe(self, flat) -> str:
        fn, found = self._changed()
        return (
            f"the default arguments of {getattr(fn, '__qualname__', fn)} changed from {short(found)} "
            f"to {short(_defaults_of(fn))}"
        )

    def term(self, index: int, scope: dict) -> str:
        terms = []
        for j, (fn, defaults, kwdefaults, found) in enumerate(self.entries):
            name = f"d{index}_{j}"
            scope[f"{name}f"], scope[f"{name}d"] = fn, defaults
            terms.append(f"{name}f.__defaults__ is {name}d")
            if kwdefaults:
                # The dict changes in place (``f.__kwdefaults__["shift"] = 1.0``): each value too,
                # as traced (``found``), not as the dict holds them when the check is compiled.
                kw = found[len(defaults or ()) :]
                scope[f"{name}k"] = kwdefaults
                terms.append(f"{name}f.__kwdefaults__ is {name}k and len({name}k) == {len(kw) // 2}")
                for i, (key, value) in enumerate(zip(kw[::2], kw[1::2])):
                    scope[f"{name}v{i}"] = value
                    terms.append(f"{name}k.get({key!r}, MISSING) is {name}v{i}")
        return "(" + " and ".join(terms) + ")"


def _thawed(frozen):
    """The value a ``freeze`` result stands for (for messages)."""
    t, rest = frozen[0], frozen[1:]
    if t is float:
        return float.fromhex(rest[0])
    if t is complex:
        return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
    if t in (tuple, list, frozenset):
        return t(map(_thawed, rest[0]))
    return rest[0]


def short(value) -> str:
    text = repr(value) if is_simple(value) or value is MISSING else f"<{type(value).__name__} object at {id(value):#x}>"
    return text if len(text) <= 60 else text[:57] + "..."


class Guards:
    """The guards of one cache entry: those of ``per_call`` are checked on every call, those of
    ``modules`` only after a module attribute was written (``entry.make_check``, which compiles
    each list into one function when it is first checked)."""

    def __init__(self, guards: list[Guard]):
        self.per_call = [g for g in guards if g.per_call]
        self.modules = [g for g in guards if not g.per_call]

    def __len__(self):
        return len(self.per_call) + len(self.modules)

    def first_failure(self, flat) -> str | None:
        """Why the guards do not hold for ``flat``, or None when they do."""
        for guard in (*self.per_call, *self.modules):
            if not guard.holds(flat):
                return guard.describe(flat)
        return None


NO_GUARDS = Guards([])
