"""What reading one piece of program state does while a program is traced
(:class:`AttributeReads`, the base of ``observe.Observer``): one step of an attribute chain
(``self.config``, ``.hidden_size``, ``cfg["sub"]``) read as the program read it, the guard it
makes on the object's source, and the value to follow; the functions such reads reach, whose
defaults and closure cells are state too. ``observe.py`` says which reads a call makes and when.
"""

import contextvars
import functools
import inspect
import sys
import types
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.state.cached_reads import CachedCalls, original
from thunder_rs.core.state.cached_reads import stand_in_cached, stand_in_cached_method
from thunder_rs.core.state.callables import CODE_TYPES, guard_partial, program_method
from thunder_rs.core.state.handed_effects import bound_stand_in, is_handed_stand_in
from thunder_rs.core.state.code_reads import (
    ALL_ATTRIBUTES,
    ALL_NESTED,
    CALLED,
    interesting,
    library_module,
    returned_chain,
)
from thunder_rs.core.base.userframe import read_site
from thunder_rs.core.state.generator_states import is_random_generator, note_generator
from thunder_rs.core.state.guards import (
    MISSING,
    CellSource,
    ClassSource,
    DefaultsGuard,
    GlobalsSource,
    Guard,
    InputSource,
    ItemSource,
    ModuleDictSource,
    ModuleSource,
    ModuleStoreSource,
    NamesGuard,
    ObjectSource,
    StateGuard,
    attributes_of,
    is_simple,
)
from thunder_rs.core.state.guards import Item as _Item
from thunder_rs.core.state.items import MUTABLE, has_item
from thunder_rs.core.state.iterators import iterator_position
from thunder_rs.core.state.state import MethodGuard, ProgramState, of_the_stdlib
from thunder_rs.core.state.torch_flags import library_read

if TYPE_CHECKING:
    from thunder_rs.core.state.mode_writes import ModeWrites
from thunder_rs.errors import ThunderNotImplementedError

#: Attributes of a bare ``nn.Module`` (parameter/buffer/submodule stores, hooks, ``training`` is
#: not among them): the module's structure and hooks have guards of their own.
_MODULE_INTERNALS = frozenset(vars(torch.nn.Module())) - {"training"}
#: Where a module keeps its submodules, parameters and buffers (read through ``__getattr__``).
_MODULE_STORES = ("_modules", "_parameters", "_buffers")
_MODULE_GETATTR = torch.nn.Module.__getattr__
#: Methods that change a generator's state: inside a traced program they would run only once.
_GENERATOR_WRITES = frozenset({"manual_seed", "set_state", "seed", "graphsafe_set_state", "set_offset"})
#: Methods that read a generator's state: a compiled call would return what they read while tracing.
_GENERATOR_READS = frozenset({"initial_seed", "get_state", "get_offset", "graphsafe_get_state", "clone_state"})
_MODULE_OR_CODE = (torch.nn.Module, *CODE_TYPES)
#: Containers whose items a chain follows by constant key: exactly these types, whose reads by
#: key have no code of their own.
_CONTAINERS = (dict, list, tuple)
_MODULE_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)
#: ``isinstance(x, torch.Generator)`` without the Python ``__instancecheck__`` of torch's custom-class
#: metaclass (torch 2.15's), which the observer paid on every attribute read: the same answer for
#: anything a program holds (that hook only adds the fake script objects of ``torch.compile``'s tracing).
_is_generator = functools.partial(type.__instancecheck__, torch.Generator)
#: Generators and coroutines: what they give back at a return event is what they yield.
_RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def is_a(state: ProgramState, obj, classes, check=None) -> bool:
    """``isinstance(obj, classes)``, or ``check(obj)`` (``_is_generator``: past a metaclass's hook),
    for classes whose metaclass's ``__subclasscheck__`` is ``type``'s. Where ``obj``'s type reads
    attributes in Python (a transformers config's ``__getattribute__``), each check that fails on
    the type ran it for ``__class__``: read once per state object instead (``ProgramState.class_of``)."""
    t = type(obj)
    if type(t.__getattribute__) is types.FunctionType:
        if issubclass(t, classes):
            return True
        cls = state.class_of(obj)
        if cls is not None:
            return cls is not t and issubclass(cls, classes)
    return isinstance(obj, classes) if check is None else check(obj)


def _default_generator(fn, key, value, origin: str) -> tuple:
    """``(value, how the program reaches it, where)`` for ``fn``'s default at ``key`` (an index into
    its ``__defaults__`` or a keyword's name; ``fn`` defined at ``origin``), as ``note_generator``
    takes them: a random generator held there (``def f(x, rng=np.random.default_rng(0))``) draws
    on from call to call. Where is the line that uses it, for a generator only (it parses the file)."""
    code = fn.__code__
    name = key if isinstance(key, str) else code.co_varnames[code.co_argcount - len(fn.__defaults__) + key]
    where = read_site(origin, name) if is_random_generator(value) else origin
    return value, f"default argument {name!r} of {fn.__qualname__}", where


class AttributeReads:
    """Reads of program state and the guards they make, for ``observe.Observer``: the state it
    holds is set up by the observer (``Observer.__init__``)."""

    _guards: dict
    #: id -> (iterator, its name, where read, its position)
    _iterators: dict
    #: id -> ``GeneratorState`` of the random generators reached
    _generators: dict
    #: id of each module clone being traced -> the user's module
    _originals: dict
    state: ProgramState
    #: the ``training`` writes of the program to modules not cloned (``mode_writes``)
    mode_writes: "ModeWrites | None"
    #: code -> the functions of that code whose closure cells may be read
    _functions: dict
    #: id -> (function, its defaults when first seen)
    _defaults: dict
    _made: set
    _module_sources: dict
    _kept: dict
    #: ``(id(obj), name)`` -> ``(type, what the class gives)`` of the methods read (``_class_attribute``)
    _methods: dict
    #: id -> ``(object, its type, instance dict, whether a module, source)`` of the objects whose
    #: attributes were read (``_instance_read``)
    _objects_read: dict
    _cached_results: CachedCalls
    #: id -> the instance dict, as the call found it, of each module the program captured and runs
    #: on itself (``captured_modules``; set by acquisition)
    captured_found: Mapping = types.MappingProxyType({})
    #: whether the reads being followed are those of a frame's locals, seen at its return
    late = False
    #: guard keys of the tensors ``_module_read_whole`` read first, guarded on their metadata where
    #: the trace did not capture them (``Observer._read_attributes_per_call``)
    _tensors_read_whole: set
    #: code of a getter or method -> id of the object it is called on -> ``(object, {(chain,
    #: where)})``: the chains awaiting what it returns (``_await_result``)
    _results: dict

    def guard_state(self, guard) -> None:
        """Adds a guard on global state (``guards.StateGuard``), unless one of its label was added
        first: the first read of the acquisition is what the state was when the call began."""
        self._guards.setdefault(("state", guard.label), guard)

    def _add_function(self, fn) -> None:
        fn = getattr(fn, "__func__", fn)
        if isinstance(fn, functools.partial):
            fn = fn.func
        self._add_defaults(fn)
        code = getattr(fn, "__code__", None)
        if code is not None and code.co_freevars and getattr(fn, "__closure__", None):
            known = self._functions.setdefault(code, [])
            if fn in known:
                return
            known.append(fn)
        # A decorator's wrapper (``@torch.no_grad()``, ``functools.wraps``) calls the user's function
        # from its closure, in library code the observer does not follow: its cells are read too.
        wrapped = getattr(fn, "__wrapped__", None)
        if isinstance(wrapped, types.FunctionType) and getattr(wrapped, "__wrapped__", None) is not fn:
            self._add_function(wrapped)

    def _add_defaults(self, fn) -> None:
        """Watches the default arguments of ``fn``: setting ``fn.__defaults__`` or
        ``__kwdefaults__`` between calls changes what the program computes."""
        if (
            isinstance(fn, types.FunctionType)
            and (fn.__defaults__ or fn.__kwdefaults__)
            and id(fn) not in self._defaults
        ):
            self._defaults[id(fn)] = DefaultsGuard.entry(fn)
            self._guard_mutable_defaults(fn)

    def _guard_mutable_defaults(self, fn) -> None:
        """A list, dict or set among ``fn``'s defaults (``def f(x, scales=[1.0])``) changes in
        place, which ``DefaultsGuard``'s identity test does not see: guarded by its contents, so
        it recompiles when changed between calls and is refused when the program changes it."""
        origin = f"{fn.__code__.co_filename}:{fn.__code__.co_firstlineno}"
        for holder, name in ((fn.__defaults__, "__defaults__"), (fn.__kwdefaults__, "__kwdefaults__")):
            source = ItemSource(holder, f"{fn.__qualname__}.{name}")
            items: list[tuple[Any, Any]] = list(holder.items() if isinstance(holder, dict) else enumerate(holder or ()))
            for key, value in items:  # an index or a keyword's name, as ItemSource reads it
                note_generator(self._generators, *_default_generator(fn, key, value, origin))
                if hasattr(type(value), "__next__") and not isinstance(value, torch.Tensor):
                    found = (value, source.describe(key), origin, iterator_position(value))
                    self._iterators.setdefault(id(value), found)
                if isinstance(value, MUTABLE) and (source.key, key) not in self._guards:
                    self._guards[(source.key, key)] = Guard(source, key, value, origin)

    def _traced_module(self, module) -> bool:
        """Whether ``module`` was made while tracing (``self.layers[:n]`` builds a new
        ``ModuleList`` of the clones): the program's own temporary, which no guard may keep."""
        if id(module) in self._originals:
            return False
        if id(module) in self._made:
            return True
        d = module.__dict__
        return any(
            isinstance(v, TensorProxy) for store in ("_parameters", "_buffers") for v in d.get(store, {}).values()
        ) or any(id(m) in self._originals for m in d.get("_modules", {}).values())

    def _attr_source(self, obj, module: bool):
        """Where a guard on an attribute of ``obj`` (a ``torch.nn.Module`` when ``module``) applies,
        or None when ``obj`` is not state."""
        if module:
            source = self._module_sources.get(id(obj))
            if source is None:
                original = self._originals.get(id(obj))
                if original is None and self._traced_module(obj):
                    return None
                original = original or obj
                source = self._module_sources[id(obj)] = ModuleSource(original, type(original).__name__)
            return source
        return self.state.source_of(obj)

    def _step(self, obj, attr: str, origin: str):
        """Reads ``obj.attr`` as the program did and guards it; returns the value to follow, or
        MISSING where the chain stops (not state, not a plain attribute, or a leaf value)."""
        if type(attr) is _Item:
            return self._item_step(obj, attr.key, origin)
        if attr is ALL_NESTED:
            self._read_nested(obj, origin, set())
            return MISSING
        if attr is ALL_ATTRIBUTES or attr == "__dict__":
            if obj in self.state and not is_a(self.state, obj, (torch.nn.Module, type, types.ModuleType)):
                self.state.read_whole(obj, origin, self._guards)
            elif is_a(self.state, obj, torch.nn.Module):
                self._module_read_whole(obj, origin, as_dict=attr == "__dict__")
            return MISSING
        known = self._objects_read.get(id(obj))
        if (
            known is not None
            and attr != "__class__"  # (``type(self).base`` after ``self.gain``: its class's, below)
            and known[0] is obj
            and type(obj) is known[1]
            and getattr(obj, "__dict__", None) is known[2]
        ):
            return self._instance_read(obj, known[2], known[3], known[4], attr, origin)
        if is_a(self.state, obj, torch.Generator, _is_generator):
            if attr in _GENERATOR_WRITES:
                raise ThunderNotImplementedError(
                    f"torch.Generator.{attr}: the traced program at {origin} changes the state of a generator it "
                    "does not create; that would run once, while tracing. Seed it outside the jitted call, or use "
                    "torch.manual_seed inside (which every call repeats)"
                )
            if attr in _GENERATOR_READS:
                raise ThunderNotImplementedError(
                    f"torch.Generator.{attr}: the traced program at {origin} reads the state of a generator; a "
                    "compiled call would see what it read while tracing, not the generator's state when it runs. Read "
                    "it outside the jitted call and pass the value in"
                )
            return MISSING
        if is_a(self.state, obj, (type, types.ModuleType)):
            return self._module_global(obj, attr, origin)
        if attr == "__class__":  # (``self.__class__.calls``, ``type(self).scale``: its class's attributes)
            return type(obj)
        if attr == CALLED:
            return self._referent(obj)
        mapping = attributes_of(obj)
        if mapping is None:
            return MISSING
        module = is_a(self.state, obj, torch.nn.Module)
        if module and (attr in _MODULE_INTERNALS or any(attr in mapping.get(store, ()) for store in _MODULE_STORES)):
            return self._instance_read(obj, mapping, module, None, attr, origin)
        source = self._attr_source(obj, module)
        if source is None:
            return MISSING
        if type(mapping) is dict and type(type(obj).__getattribute__) is not types.FunctionType:
            self._objects_read[id(obj)] = (obj, type(obj), mapping, module, source)
        if not module and attr not in mapping and type(obj).__module__ != "logging" and of_the_stdlib(obj):
            self._stdlib_object_read(mapping, source, origin)
        return self._instance_read(obj, mapping, module, source, attr, origin)

    def _stdlib_object_read(self, mapping, source, origin: str) -> None:
        """Guards the plain values among the attributes of an object of the standard library's
        classes whose method the program calls (``self.slots.acquire()``: a ``Semaphore`` reads and
        sets its ``_value``, an ``Event`` its ``_flag``, in code the observer does not follow). Not a
        logger's: its levels are guarded as such (``acquisition.effects``), its calls made per call."""
        for name, value in list(mapping.items()):
            if is_simple(value) and (source.key, name) not in self._guards:
                self._guards[(source.key, name)] = Guard(source, name, value, origin)

    def read_nested(self, obj, origin: str) -> None:
        """Reads ``obj`` whole, and what it holds (``_read_nested``): library code runs it, whose
        reads are not observed (``functional_call``'s module, its forward called from there)."""
        self._step(obj, ALL_NESTED, origin)

    def _module_read_whole(self, module, origin: str, as_dict: bool = False) -> None:
        """Reads every attribute of ``module`` (not its stores or hooks): the program reads one by
        a computed name (``getattr(self.inner, name)`` in a wrapper's ``__getattr__``) or all of
        them (``vars(module)``), so setting any between calls changes what it computes. Read
        ``as_dict`` (``self.__dict__[name]``), they are guarded on every call (``ModuleDictSource``)."""
        mapping = attributes_of(module)
        source = self._attr_source(module, True)
        if type(mapping) is not dict or source is None:
            return
        if as_dict:
            source = ModuleDictSource(source.obj, source.label)
        # A name it did not find must still be absent (a descriptor's ``obj.__dict__.get(name, 1.0)``):
        # the names the module had when the call began.
        names = ("names", source.key)
        if names not in self._guards or as_dict:
            self._guards[names] = NamesGuard(source, frozenset(source.fixed()), origin)
        for attr in [a for a in mapping if a not in _MODULE_INTERNALS]:
            first = (source.key, attr) not in self._guards
            if as_dict and not first and type(self._guards[(source.key, attr)]) is Guard:
                self._guards[(source.key, attr)].source = source
            self._instance_read(module, mapping, True, source, attr, origin)
            if first and isinstance(mapping[attr], torch.Tensor):
                self._tensors_read_whole.add((source.key, attr))

    def _read_nested(self, obj, origin: str, seen: set) -> None:
        """Reads ``obj`` whole and, attribute by attribute, what it holds (a module's submodules,
        a config's sub-config), each read whole in turn: the program reads by a path the observer
        does not follow (``operator.attrgetter("block.gain")(self)``, ``self.get_submodule(path)``),
        which kept the first call's ``self.block.gain`` where only ``self`` was read whole."""
        if id(obj) in seen or len(seen) > 10_000:
            return
        seen.add(id(obj))
        self._step(obj, ALL_ATTRIBUTES, origin)
        mapping = attributes_of(obj)
        if type(mapping) is not dict:
            return
        names = [a for a in mapping if a not in _MODULE_INTERNALS and a not in _MODULE_STORES]
        if isinstance(obj, torch.nn.Module):
            names += list(mapping.get("_modules", {}))
        for name in names:
            value = self._step(obj, name, origin)
            if value is not MISSING and not isinstance(value, (type, types.ModuleType, *CODE_TYPES)):
                self._read_nested(value, origin, seen)

    def _referent(self, ref):
        """What the ``weakref.ref`` ``ref`` refers to now (``self.parent_ref().scale``), its
        attributes read as state's (the ref itself is guarded by identity where it was read);
        MISSING for any other call, or a dead reference."""
        if type(ref) is not weakref.ref:
            return MISSING
        value = ref()
        if value is None or is_simple(value) or isinstance(value, (torch.Tensor, types.ModuleType)):
            return MISSING
        if value not in self.state and not isinstance(value, (torch.nn.Module, type)):
            self.state.add(value, ObjectSource(value, f"{type(value).__name__} (a weakref's referent)"))
        return value

    def _instance_read(self, obj, mapping, module: bool, source, attr: str, origin: str):
        """``obj.attr`` for an object with instance attributes (``mapping``) whose guards apply at
        ``source`` (a ``torch.nn.Module`` when ``module``), once ``_step`` found what ``obj`` is.

        What it found depends on the object's type alone, but for its instance dict and source,
        which do not change while it keeps them: for an object whose type reads attributes in C,
        it is found once per acquisition (``_objects_read``; most reads repeat one made before:
        a config attribute read by every layer, the next layer's call of the same method)."""
        if module:
            if attr in _MODULE_INTERNALS:
                return MISSING
            if any(attr in mapping.get(store, ()) for store in _MODULE_STORES):
                return self._module_store_read(obj, mapping, attr, origin)
        value = mapping.get(attr, MISSING)
        if value is MISSING:
            return self._class_attribute(obj, source, attr, origin)
        if is_handed_stand_in(value):  # (a file object's method while traced: ``handed_effects``)
            return MISSING
        if module:
            value = self._found_value(obj, source, attr, original(value))
            if value is MISSING:
                return MISSING
            if attr == "training" and self.mode_writes is not None and self.mode_writes.set_by_program(obj):
                return MISSING  # (``teacher.eval()`` earlier in this call, on a module not cloned: ``mode_writes``)
            return self._keep(source, attr, value, origin, holder=mapping)
        self.state.read(obj, attr, origin, self._guards)
        return self._keep(source, attr, value, origin, guard=False)

    def _found_value(self, obj, source, attr: str, value):
        """What the call found as module ``obj``'s ``attr`` (now ``value``; in a clone, a stand-in put
        there taken for what it stands for), to guard; MISSING where the program set it earlier in
        this call (a write replayed after each call), or made it.

        A module read through a local (``blk = self.blocks[i]``, ``m = mods[key]``) is seen at the
        frame's return (``late``), after the program's writes (``blk.count += 1``): where it changed
        since the call began, its read may have come first, so a plain value is guarded as found."""
        found = source.obj.__dict__ if source.obj is not obj else self.captured_found.get(id(obj))
        if found is None or found.get(attr, MISSING) is value:
            return value
        before = found.get(attr, MISSING)
        return before if (self.late or source.obj is obj) and is_simple(before) else MISSING

    def _item_step(self, obj, key, origin: str):
        """``obj[key]`` for a dict, list or tuple kept as state (reached from a module, a global or
        a closure, not from an argument: ``self.cfg["sub"]``, ``SCALES[0]``), guarded like an
        attribute; for a module container (``self.blocks[0]``), its submodule, whose attributes
        are guarded as a module's."""
        if isinstance(obj, _MODULE_CONTAINERS):
            try:
                value = obj[key]
            except (IndexError, KeyError, TypeError):
                return MISSING
            return value if isinstance(value, torch.nn.Module) else MISSING
        parent = self.state.source_of(obj) if type(obj) in _CONTAINERS else None
        if not isinstance(parent, ObjectSource):
            # An object a list or dict of the arguments holds (``cache.layers[0]``) is state of
            # its own, found with its path before the program ran.
            value = obj[key] if type(obj) in _CONTAINERS and has_item(obj, key) else MISSING
            return value if value is not MISSING and value in self.state else MISSING
        source = ItemSource(obj, parent.label)
        value = source.fixed().get(key, MISSING)
        return MISSING if value is MISSING else self._keep(source, key, value, origin)

    def _class_attribute(self, obj, source, attr: str, origin: str):
        """``obj.attr`` where ``obj`` has no attribute of its own by that name: guards that it
        still has none and what its class holds (``class Config: scale = 2.0``; setting
        ``config.scale`` or ``Config.scale`` later changes what the program reads). Methods,
        properties and other descriptors give MISSING: their own code is observed.

        A method read again (``logger.warning_once`` in a config's ``__getattribute__``, a read
        per attribute) is done once per object, type and name: while its class still gives the
        same object (looked up as ``fixed`` does, running no descriptor's code), what its first
        read did holds for it (``_methods``)."""
        t = type(obj)
        known = self._methods.get((id(obj), attr))
        if known is not None and known[0] is t and ClassSource(t).fixed().get(attr, MISSING) is known[1]:
            return MISSING
        value = ClassSource(t).fixed().get(attr, MISSING)
        if value is MISSING and getattr(type(obj), "__getattr__", _MODULE_GETATTR) is _MODULE_GETATTR:
            # Absent: ``getattr(self, "scale", 1.0)`` or ``hasattr(config, "w")`` read the absence,
            # which setting the attribute later changes.
            self._guard_absent(obj, source, attr, origin)
        if type(value) is property and (chain := returned_chain(value.fget)) is not None:
            return self._through_property(obj, chain, origin)
        if isinstance(value, functools.cached_property):
            # Its ``__get__`` (library code, not observed) reads the instance dict, where a value
            # put there later (its first computation, ``obj.__dict__[name] = v``) is found instead.
            self._guard_absent(obj, source, value.attrname or attr, origin)
        if value is MISSING or hasattr(type(value), "__get__"):
            if program_method(value) or isinstance(value, (staticmethod, classmethod)):
                # ``self.act(y)``: a method set on the instance (``m.act = ...``) or rebound on the
                # class between calls is other code (``act = staticmethod(torch.relu)`` too).
                self._guard_absent(obj, source, attr, origin)
                if ("method", id(type(obj)), attr) not in self._guards:  # (made once: it reads the class statically)
                    self._guards[("method", id(type(obj)), attr)] = MethodGuard(type(obj), attr, origin)
                self._add_function(getattr(value, "__func__", value))
            stand_in_cached_method(type(obj), attr, self._cached_results)  # (a cached method too)
            if value is not MISSING:  # (what the class gives now: a cached method's stand-in)
                self._methods[(id(obj), attr)] = (t, ClassSource(t).fixed().get(attr, MISSING))
            return MISSING
        if isinstance(obj, torch.nn.Module):
            if (source.key, attr) not in self._guards:
                self._guards[(source.key, attr)] = Guard(source, attr, MISSING, origin)
        else:
            self.state.read(obj, attr, origin, self._guards)
        return self._keep(ClassSource(type(obj)), attr, value, origin)

    def _through_property(self, obj, chain: tuple, origin: str):
        """``obj.holder`` for a property whose getter is ``return self._holder``: what ``obj._holder``
        reaches, followed on (``self.holder.scale``: the getter's code guards ``_holder``, the read
        after its call is guarded here)."""
        for attr in chain:
            obj = self._step(obj, attr, origin)
            if obj is MISSING:
                break
        return obj

    def _guard_absent(self, obj, source, attr: str, origin: str) -> None:
        if isinstance(obj, torch.nn.Module):
            if (source.key, attr) not in self._guards:
                self._guards[(source.key, attr)] = Guard(source, attr, MISSING, origin)
        else:
            self.state.read(obj, attr, origin, self._guards)

    def _module_store_read(self, module, mapping, attr, origin):
        """``module.attr`` for a submodule, parameter or buffer: followed (a submodule) and, for a
        module the program does not own (a global model a function calls), guarded by identity.
        The jitted module's own stores are guarded by its binding."""
        for store in _MODULE_STORES:
            value = mapping.get(store, {}).get(attr, MISSING)
            if value is MISSING:
                continue
            if (
                id(module) not in self._originals
                and not isinstance(value, TensorProxy)
                and not self._traced_module(module)
            ):
                key = ((id(module), store), attr)  # ModuleStoreSource.key, as ``_keep`` keys guards
                if key not in self._guards:
                    self._guards[key] = Guard(
                        ModuleStoreSource(module, store, type(module).__name__), attr, value, origin
                    )
            return value if isinstance(value, torch.nn.Module) else MISSING
        return MISSING

    def _module_global(self, module, attr, origin):
        """``settings.SCALE`` for a user module ``settings``: a global of that module; ``Config.scale``
        for a user class: what its class attributes hold (a method or property: its own code)."""
        if isinstance(module, type):
            return self._class_read(module, attr, origin)
        if library_module(module):
            return MISSING
        value = module.__dict__.get(attr, MISSING)
        if value is MISSING:
            return MISSING
        return self._keep(self._globals_source(module.__dict__), attr, value, origin)

    def _class_read(self, cls: type, attr: str, origin: str):
        home = sys.modules.get(getattr(cls, "__module__", ""), None)
        if home is None or library_module(home):
            return MISSING
        value = ClassSource(cls).fixed().get(attr, MISSING)
        if value is MISSING or hasattr(type(value), "__get__"):
            stand_in_cached_method(cls, attr, self._cached_results)  # (``Config.table(n)``)
            return MISSING
        return self._keep(ClassSource(cls), attr, value, origin)

    def _globals_source(self, g: dict):
        source = self._module_sources.get(id(g))
        if source is None:
            source = self._module_sources[id(g)] = GlobalsSource(g, g.get("__name__", "?"))
        return source

    def _keep(self, source, name: str, value, origin: str, guard: bool = True, holder=None):
        """Guards ``value``, read as ``name`` at ``source`` (unless the source guards it another
        way); returns it if reads may go on from it.

        Most reads repeat one made before in the acquisition (a config attribute read by every
        layer, a module's attribute by each call of it): what the first made (guards, the first
        source, iterator positions) holds for them, so a read of the same object at the same
        place answers as the first did (``_kept``; a dict only for the code that first read it,
        whose returns ``containers`` watches)."""
        kept = (type(source), source.key, name, guard)
        known = self._kept.get(kept)
        if known is not None and known[0] is value and (known[1] is None or known[1] is self.state.containers.reading):
            return known[2]
        out = self._keep_first(source, name, value, origin, guard, holder)
        if self.state.containers.settled(source):
            self._kept[kept] = (value, self.state.containers.reading if type(value) is dict else None, out)
        return out

    def _keep_first(self, source, name: str, value, origin: str, guard: bool, holder=None):
        value = original(value)  # (a cached function's stand-in read again)
        if isinstance(value, TensorProxy):
            return MISSING
        if hasattr(type(value), "__next__") and id(value) not in self._iterators:
            self._iterators[id(value)] = (value, name, origin, iterator_position(value))
        note_generator(self._generators, value, source.describe(name), origin, name)
        if type(value) is contextvars.ContextVar:
            # ``SCALE.get()`` reads the current context's value, which no attribute holds.
            read = functools.partial(value.get, MISSING)
            self.guard_state(StateGuard(f"the value of contextvars.ContextVar {value.name!r}", read, read()))
        if isinstance(value, types.FunctionType):
            self._add_function(value)
            if value not in self.state and interesting(value.__code__):
                # What a function of the program holds as attributes (``wrapper.calls += 1`` in a
                # counting decorator, ``step.scale``) is state, read and set like a config's.
                self.state.add(value, ObjectSource(value, f"function {value.__qualname__}"))
        elif type(value) is functools.partial:  # (``self.act = partial(F.leaky_relu, negative_slope=0.1)``)
            guard_partial(self._guards, value, source.describe(name), origin)
        if callable(value):
            library_read(self, value, ())  # from torch import are_deterministic_algorithms_enabled
            # (``from time import perf_counter``; ``emit = f.write``, ``partial(os.write, 1)``)
            handed = functools.partial(bound_stand_in, value, self)
            stand_in_cached(source, name, value, self._cached_results, holder, origin, handed)
        if guard and not isinstance(value, types.ModuleType):
            # Functions and classes too, by identity: rebinding ``ACT = torch.tanh`` or redefining a
            # helper between calls changes what the program does.
            key = (source.key, name)
            if key not in self._guards:
                self._guards[key] = Guard(source, name, value, origin)
        state_object = not is_a(self.state, value, _MODULE_OR_CODE)
        if state_object:
            self.state.containers.note(value, source, name, origin)  # a cache the program may fill
        if is_simple(value) or isinstance(value, (torch.Tensor, torch.SymInt)):  # a size stands for an int
            return MISSING
        if state_object and value not in self.state:  # (the first source found stays its source)
            self.state.add(value, _child_source(source, name, value))
        return value

    def _follow(self, value, attrs: tuple, origin: str) -> None:
        for k, attr in enumerate(attrs):
            holder, value = value, self._step(value, attr, origin)
            if value is MISSING:
                if k + 1 < len(attrs) and type(attr) is str:
                    self._await_result(holder, attr, attrs[k + 1 :], origin)
                return

    def _await_result(self, holder, attr: str, rest: tuple, origin: str) -> None:
        """Where the chain stopped at a property of state (``self.holder.scale``, its getter
        ``return self._a if self.use_a else self._b``) or at a method's call (``self.get_cfg().x``):
        the rest of the chain is followed from what the getter or method returns, once it returns
        (``take_result``), so the object it returns and what is read of it are guarded as state
        read through attributes (the getter's own reads are guarded as it runs)."""
        if not self._is_state(holder) or attr in (attributes_of(holder) or ()):
            return
        found = ClassSource(type(holder)).fixed().get(attr, MISSING)
        if type(found) is property:
            fn = found.fget
        elif rest[0] == CALLED and isinstance(found, types.FunctionType):
            fn, rest = found, rest[1:]
        else:
            return
        code = getattr(fn, "__code__", None)
        if not rest or code is None or code.co_flags & _RESUMABLE or code.co_argcount < 1:
            return
        waiting = self._results.setdefault(code, {}).setdefault(id(holder), (holder, set()))
        waiting[1].add((rest, origin))

    def take_result(self, frame, value) -> None:
        """Follows the chains awaiting what the frame (of a getter or method ``_await_result``
        noted) returned, ``value``, when it was called on the object they read it of."""
        waiting = self._results.get(frame.f_code)
        receiver = frame.f_locals.get(frame.f_code.co_varnames[0], MISSING) if waiting else MISSING
        holder, chains = waiting.get(id(receiver), (None, ())) if waiting else (None, ())
        if holder is not receiver or is_simple(value) or isinstance(value, torch.Tensor):
            return
        if not self._is_state(value):  # (an item read by a key computed: ``self._cfgs[self.mode]``)
            self.state.add(value, ObjectSource(value, f"what {frame.f_code.co_name}() returned"))
        for rest, origin in sorted(chains, key=repr):
            self._follow(value, rest, origin)

    def _is_state(self, value) -> bool:
        # A class: ``cls.factor`` in a classmethod (``_class_read`` leaves library classes alone).
        # (State first: ``isinstance`` of a config that overrides ``__getattribute__`` runs it for
        # ``__class__``, once per class checked.)
        return (
            value in self.state or isinstance(value, (torch.nn.Module, types.ModuleType, type)) or _is_generator(value)
        )


def _child_source(source, name: str, value):
    """The source of the attributes of ``value``, read as ``name`` at ``source``."""
    if isinstance(source, ItemSource):
        label = f"{source.label}[{name!r}]"
    elif type(name) is _Item:
        label = f"{source.label}{name}"
    else:
        label = f"{source.label}.{name}" if not isinstance(source, (GlobalsSource, CellSource)) else name
    if isinstance(source, InputSource):
        slotted = source.slotted or not isinstance(attributes_of(value), dict)
        return InputSource(source.position, (*source.path, name), label, slotted)
    return ObjectSource(value, label)
