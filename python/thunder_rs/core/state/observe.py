"""Which Python state a traced program reads: the guards of a trace.

While a program is traced, a C-level profile hook (``_core.CallObserver``) reports each call of a
function outside thunder_rs, torch's internals and the standard library. For each such function,
the reads it can make are found once from its bytecode (``code_reads.py``): globals, closure
cells, and attribute chains on its arguments (``self.config.hidden_size``, ``cfg.scale``). At the
call they are evaluated against the frame's arguments, globals and cells, and each value becomes
a :class:`~thunder_rs.core.state.guards.Guard`. Chains on other locals (``config = self.config`` then
``config.x``) are evaluated when the function returns, for objects already known as program state.

Only *program state* is guarded: modules, the program's non-tensor inputs, globals, closure cells,
and objects reached from them by attribute reads. Objects the program creates while it runs are
rebuilt on every call and need no guard.

The default arguments of the functions it runs (the jitted function, functions passed in or read
as globals and cells, the methods whose code runs) are guarded as one ``DefaultsGuard``; chains on
library modules are matched against torch's global flags (``torch_flags.py``). What one read does
(the step, its guard, the value followed) is ``attribute_reads.py``'s, this class's base.
"""

import functools
import inspect
import sys
import types

import torch
from torch.utils import _pytree as pytree

from thunder_rs.core.state.guards import (
    MISSING,
    CellSource,
    DefaultsGuard,
    Guard,
    InputSource,
    ModuleSource,
    ObjectSource,
    StateGuard,
    StructureGuard,
    attributes_of,
    is_simple,
)
from thunder_rs.core.state.tensor_guards import TensorGuard, tensor_meta
from thunder_rs.core.base.proxies import TENSOR_ATTRIBUTE_READS, TensorProxy
from thunder_rs.core.base.userframe import user_location
from thunder_rs.core.state.callables import (
    bound_objects,
    guard_partial,
    partial_origin,
)
from thunder_rs.core.state.attribute_reads import AttributeReads, is_a
from thunder_rs.core.state.hook import own_work, thread_hook, thread_state, warn_profiler_once
from thunder_rs.core.state.items import same_entries
from thunder_rs.core.state.iterators import iterator_position
from thunder_rs.core.state.generator_states import note_generator, refuse_drawn_generators
from thunder_rs.core.state.cached_reads import CachedCalls, cached_guards
from thunder_rs.core.state.clocks import refuse_handed_clocks
from thunder_rs.core.state.code_reads import code_reads, library_module, stored_by_calls, storing_methods
from thunder_rs.core.state.identity import cached_call, refuse_identity_uses
from thunder_rs.core.state.reached import ArgumentTensor
from thunder_rs.core.state.state import IntGuard, ProgramState, stands_in
from thunder_rs.core.state.type_reads import read_types
from thunder_rs.core.state.torch_flags import (
    entered as _entered,
    is_parametrized,
    library_read,
    parametrizations_cached,
)
from thunder_rs.errors import ThunderNotImplementedError


#: A module's forward hook stores: the hooks a call of it runs.
_FORWARD_HOOK_STORES = ("_forward_pre_hooks", "_forward_hooks")
#: The devices whose autocast the cache key holds (``core.lang.autocast.AutocastState``).
_DEVICES = ("cpu", "cuda")


def _not_a_write(name: str, value, was) -> bool:
    """A global's change from ``was`` to ``value`` that is no write of the program's to refuse: a
    dunder (``__warningregistry__``), a module (an import), thunder_rs's stand-in put while traced
    or taken away (``torch_overrides.SIZED_BUILTINS``), a stored tensor (``escapes`` names it)."""
    return (
        (name.startswith("__") and name.endswith("__"))
        or isinstance(value, types.ModuleType)
        or any(stands_in(v) or id(v) in TRACING_GLOBALS for v in (value, was))
        or any(isinstance(leaf, TensorProxy) for leaf in pytree.tree_leaves(value))
    )


def _set_again(held, g: dict) -> bool:
    """Whether an attribute the program sets of ``held``, a global of its module ``g``, is state
    eager sets on every call: a module, or a class that module defines."""
    if isinstance(held, type):
        home = sys.modules.get(getattr(held, "__module__", ""), None)
        return home is not None and home.__dict__ is g
    return isinstance(held, types.ModuleType)


class Observer(AttributeReads):
    """Collects the guards of one acquisition (a context manager around running the program).

    ``inputs`` are the program's flat inputs: its non-tensor, non-simple leaves are program state
    read through :class:`InputSource`. ``originals`` maps ``id`` of each module clone being traced
    to the user's module, so reads of a clone become guards on the original. ``functions`` are
    functions whose closure cells may be read (the traced function; more are found as globals are
    read). ``reached`` (``reached.ArgumentObjects``) are the objects reachable from the inputs.
    """

    #: whether the acquisition traces some sizes or floats as symbolic (set by it): the program's
    #: calls are told to ``PROGRAM_CALLS`` then
    sizes_symbolic = False

    def __init__(self, inputs: list, originals: dict, functions=(), reached=None):
        self._guards: dict = {}
        #: the train/eval modes the program sets on modules not cloned (``mode_writes``), and the writes
        #: of the last it set, for every call to repeat
        self.mode_writes, self.mode_writes_made = None, list[tuple]()
        #: id of a proxy put in a module's attribute -> the ``ArgumentTensor`` it stands for
        self._module_stand_ins: dict = {}
        #: id -> (iterator, its name, where read, its position): the iterators the program reached
        self._iterators: dict = {}
        #: id -> ``GeneratorState`` of the random generators the program reached (``generator_states``)
        self._generators: dict = {}
        self._originals = originals
        self._owned = {id(m) for m in originals.values()}
        #: objects known to be program state (configs, argument objects), with their attributes
        #: when first reached
        self.state = ProgramState(reached.tensors if reached is not None else None)
        names = reached.names if reached is not None else [f"input {i}" for i in range(len(inputs))]
        #: the user's names of the flat inputs, for guards' miss reasons
        self.input_names = names
        self._inputs, self._names = inputs, names
        for i, x in enumerate(inputs):
            if hasattr(type(x), "__next__") and not isinstance(x, (torch.Tensor, types.GeneratorType)):
                self._iterators[id(x)] = (x, names[i], "the call", iterator_position(x))
            note_generator(self._generators, x, f"argument {names[i]!r}", "the call")
            if not isinstance(x, torch.Tensor) and not is_simple(x) and attributes_of(x) is not None:
                self.state.add(x, InputSource(i, (), names[i], not isinstance(attributes_of(x), dict)))
        for obj, source, under_container in reached.objects if reached is not None else ():
            self.state.add(obj, source, whole=under_container)
        #: ``(generator, its name)`` of the generators passed in, and where the program first resumed each, by id
        self._input_generators = [(x, names[i]) for i, x in enumerate(inputs) if type(x) is types.GeneratorType]
        self._resumed_at: dict[int, str] = {}
        #: ids of the non-tensor inputs (an iterator passed in is not the program's to consume)
        self._input_ids = {id(x) for x in inputs if not isinstance(x, torch.Tensor) and not is_simple(x)}
        self._functions: dict = {}
        #: id -> (function, its defaults when first seen): their defaults are guarded as one
        self._defaults: dict = {}
        for fn in functions:
            self._add_function(fn)
            for obj in bound_objects(fn):
                self.state.add(obj, ObjectSource(obj, type(obj).__name__))
        # Functions passed in (``jf(x, fn)``): their closure cells and defaults are read as the
        # jitted function's are.
        for x in inputs:
            if isinstance(x, (types.FunctionType, types.MethodType, functools.partial)):
                self._add_function(x)
        for p in (*functions, *inputs):
            if type(p) is functools.partial:
                guard_partial(self._guards, p, "the partial", partial_origin(p))
        #: ``check(env)`` callables a symbolic entry must also pass to serve a call's sizes
        #: (``check_sizes``)
        self.size_checks: list = []
        self._outer = None
        self._hooked = False
        #: the frame that started observing: the program's frames are below it
        self.entry = None
        #: id -> the (original) modules whose methods the program called, for their hooks
        self.modules_called: dict = {}
        #: ids of modules whose ``__init__`` ran while tracing: made by the program
        self._made: set = set()
        #: id(module or clone) -> the source of its attributes
        self._module_sources: dict = {}
        #: ``(type of source, source key, name, guard)`` -> ``(value, the code that read it when a
        #: dict, what _keep answered)`` of the reads kept (``_keep``)
        self._kept: dict = {}
        self._methods: dict = {}  # (the methods read: ``_class_attribute``)
        self._objects_read: dict = {}  # (what each object read from is: ``_instance_read``)
        #: the code of functions cached by functools read as state, with the cached function
        self._cached: dict = {}
        #: id -> ``(globals dict, a copy)`` of the modules whose code the program ran, taken before
        #: it ran, and ``(id of a globals dict, name)`` -> ``(code, offset)`` of the globals its code
        #: sets (``refuse_unread_global_stores``)
        self._module_globals: dict = {}
        self._global_stores: dict = {}
        #: ``(id of a module, attribute)`` -> ``(module, attribute, its value before, code, offset)``
        #: of the attributes the program's code sets of modules its globals hold (``settings.FLAG = 1``)
        #: and of the classes its module defines (``Config.scale = 2``)
        self._attribute_stores: dict = {}
        self._cached_results = CachedCalls(self._cached)  # what their calls returned (``cached_reads``)
        self._results: dict = {}  # (the chains awaiting what a getter or method returns: ``take_result``)
        self._tensors_read_whole: set = set()  # (guard keys: ``_module_read_whole``)

    def __enter__(self):
        #: per device, whether autocast was on when the call began and the dtype it defaults to
        self._autocast_at_entry = {d: (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in _DEVICES}
        self._autocast_cache_at_entry = torch.is_autocast_cache_enabled()
        self._parametrizations_cached_at_entry = parametrizations_cached()
        self._outer = thread_state.observer
        self.entry = sys._getframe(1)
        thread_state.observer = self
        if self._outer is None and sys.getprofile() is None:
            thread_hook().start()
            self._hooked = True
        return self

    def __exit__(self, *exc):
        self.entry = None
        thread_state.observer = self._outer
        for cached, _, refused in self.state.containers.cached_calls:
            if refused:
                cached.cache_clear()
        if self._hooked:
            thread_hook().stop()

    def observe_statically(self, fn, modules) -> None:
        """Reads of ``fn`` and of the modules' ``forward`` found without running them, for when
        another profiler (cProfile, a debugger) holds this thread's profile hook: functions they
        call are not seen."""
        if self._hooked:
            return
        warn_profiler_once()
        own_work(self._observe_statically, fn, modules)

    def _observe_statically(self, fn, modules) -> None:
        fn = getattr(fn, "__func__", fn)
        code = getattr(fn, "__code__", None)
        if code is not None:
            self._on_code(code, getattr(fn, "__globals__", {}), {}, 0)
            if code.co_freevars and fn.__closure__:
                self._read_cells_of(fn, code, code_reads(code), code_reads(code).line)
        for module in modules:
            forward = getattr(type(module).forward, "__code__", None)
            if forward is not None and forward.co_argcount:
                self._on_code(forward, type(module).forward.__globals__, {forward.co_varnames[0]: module}, 0)

    def observe_reads(self, method, receiver) -> None:
        """Guards what ``method`` (a function of ``receiver``'s class) reads through ``receiver`` and
        its globals, as if the program had run it: for a library method thunder_rs stands in for
        while tracing (``torch/transformer_fast_paths.py``), whose own reads no call reports."""
        code = method.__code__
        own_work(self._on_code, code, method.__globals__, {code.co_varnames[0]: receiver}, 0)

    def tensor_attribute(self, at, name: str):
        """The Python attribute ``name`` (``x.scale``) of the tensor that is flat input ``at`` (a
        position) or that every call takes (``at``, a weak reference: a parameter, a captured
        tensor), guarded as an argument object's are: the next call's may have another, or none."""
        source: InputSource | ObjectSource
        if type(at) is int:
            tensor, source = self._inputs[at], InputSource(at, (), self._names[at])
        else:
            tensor = at()
            source = ObjectSource(tensor, f"tensor{list(tensor.shape)}")
        value = tensor.__dict__.get(name, MISSING)
        if value is MISSING:
            self._guards.setdefault((source.key, name), Guard(source, name, MISSING, user_location()))
            raise AttributeError(f"'Tensor' object has no attribute {name!r}")
        self._keep(source, name, value, user_location())
        return value

    def add_guard(self, key, guard) -> None:
        """Adds ``guard`` on what the call passed that its key leaves out (``offsets.OffsetGuard``),
        one per ``key``."""
        self._guards.setdefault(key, guard)

    def autocast_entered(self, device_type: str) -> None:
        """The program cast a call under an autocast it entered itself: ``torch.autocast(device)``
        without a dtype takes ``torch.get_autocast_dtype(device)``, which the cache key holds only
        while autocast is on, so a ``torch.set_autocast_dtype`` between calls must recompile."""
        enabled, dtype = self._autocast_at_entry[device_type]
        if not enabled:
            read = functools.partial(torch.get_autocast_dtype, device_type)
            self.guard_state(StateGuard(f"torch.get_autocast_dtype({device_type!r})", read, dtype))

    def autocast_cache_read(self) -> None:
        """The program cast a leaf that torch's autocast cache would hold: whether the cache is on
        decides the trace (``autocast._cached_cast``), and a region the program enters inherits the
        caller's ``torch.is_autocast_cache_enabled()`` (``torch.autocast(cache_enabled=None)``), so
        a call with the cache switched must recompile."""
        read = torch.is_autocast_cache_enabled
        self.guard_state(StateGuard("torch.is_autocast_cache_enabled()", read, self._autocast_cache_at_entry))

    def refuse_unread_global_stores(self) -> None:
        """Refuses a program that set (or deleted) a global of a module whose code it ran, which it
        does not read (``global n; n = 1``; ``globals()["n"] = 1``, ``sys.modules[__name__].n = 1``):
        tracing set it once, where eager sets it on every call. (One it reads is guarded: its guard
        refuses the change after tracing, naming the read; a tensor stored is ``escapes``'s, a module
        bound by an import is made once in eager too.)"""
        for g, before in self._module_globals.values():
            if same_entries(g, before):  # (most often: nothing set, and the loop below finds nothing)
                continue
            for name in g.keys() | before.keys():
                now, was = g.get(name, MISSING), before.get(name, MISSING)
                if now is was or (id(g), name) in self._guards or _not_a_write(name, now, was):
                    continue
                where = "(through globals(), the module object or setattr)"
                if (id(g), name) in self._global_stores:
                    code, offset = self._global_stores[id(g), name]
                    line = next((p[0] for i, p in enumerate(code.co_positions()) if 2 * i == offset), None)
                    where = f"at {code.co_filename}:{line or code.co_firstlineno}"
                raise ThunderNotImplementedError(
                    f"thunder_rs.jit: the traced program sets global {name!r} of {g.get('__name__', '?')} {where}; "
                    "tracing set it once, and a compiled call would not set it again where eager sets it on every "
                    "call. Keep such state in a module attribute or a buffer, or return it"
                )
        for module, attr, was, code, offset in self._attribute_stores.values():
            now = module.__dict__.get(attr, MISSING)
            if now is was or (id(module.__dict__), attr) in self._guards or _not_a_write(attr, now, was):
                continue
            if module is sys and attr == "path":  # (made again by every call: ``traced_path``)
                continue
            line = next((p[0] for i, p in enumerate(code.co_positions()) if 2 * i == offset), None)
            owner = module.__qualname__ if isinstance(module, type) else module.__name__
            raise ThunderNotImplementedError(
                f"thunder_rs.jit: the traced program sets {owner}.{attr} at "
                f"{code.co_filename}:{line or code.co_firstlineno}; tracing set it once, and a compiled call would not "
                "set it again where eager sets it on every call. Set it outside the jitted function, or keep such "
                "state in a module attribute or a buffer"
            )

    def refuse_consumed_iterators(self) -> None:
        """Refuses a program that advanced an iterator it did not create (``for i in
        zip(COUNTER, ...)`` over a global ``itertools.count``): tracing took its items once, and a
        compiled call would neither take the next ones nor see them (``next(it)`` is refused as it
        is called, ``stdlib_state._next``)."""
        for it, name, origin, position in self._iterators.values():
            if iterator_position(it) != position:
                raise ThunderNotImplementedError(
                    f"thunder_rs.jit: the program consumed the {type(it).__name__} {name!r} read at {origin}, which "
                    "it did not create (a for loop, zip or list() over it); tracing took its items once, and a "
                    "compiled call would neither take the next ones nor see them. Take the items outside the jitted "
                    "function and pass them in"
                )
        for gen, name in self._input_generators:
            if (site := self._resumed_at.get(id(gen))) is not None:
                raise ThunderNotImplementedError(
                    f"thunder_rs.jit: the program consumed the generator {name!r} it was given, at {site} (a for loop, "
                    "list() or next() over it); tracing took its items once, and a compiled call would neither take "
                    "them again nor see them. Pass the items (a list or a tensor) instead"
                )
        refuse_drawn_generators(self._generators.values())

    def guard_of(self, obj):
        """The guard holding the fixed state object ``obj`` whole, if any (``bystanders``)."""
        return self._guards.get(("object", id(obj)))

    def guards(self) -> list:
        """The guards: values read, and the structure of modules called that the program does not
        own (the jitted module's own structure is guarded by its binding). None of them is on a
        module the program made while traced."""
        self.state.guard_whole_objects(self._guards)
        self.state.guard_distinct(self._guards)
        self.state.guard_written(self._guards)
        self.state.containers.relax(self._guards)
        self.state.relax_stored_first(self._guards)
        structure = [
            StructureGuard(m, type(m).__name__)
            for i, m in self.modules_called.items()
            if i not in self._owned and not self._traced_module(m)
        ]
        kept = [
            g
            for g in self._guards.values()
            if not (isinstance(getattr(g.source, "obj", None), torch.nn.Module) and self._traced_module(g.source.obj))
        ]
        defaults = [DefaultsGuard(list(self._defaults.values()))] if self._defaults else []
        cached = self._parametrizations_cached_at_entry
        if any(map(is_parametrized, self.modules_called.values())):
            kept.append(StateGuard("torch.nn.utils.parametrize.cached()", parametrizations_cached, cached, _entered))
        return kept + structure + defaults + cached_guards(self._cached_results)  # (last: see cached_guards)

    def read_cached_per_call(self, captured: list, stored: list) -> None:
        """Tensors of ``captured`` held in lists and dicts of lasting state are read per call
        (``containers.StateContainers.read_per_call``)."""
        self.state.containers.read_per_call(captured, stored, self._guards)
        self._read_attributes_per_call(captured, stored)
        self.state.read_tensors_per_call(captured, stored, self._guards)

    def module_stand_ins(self, stand_ins: dict) -> None:
        """Notes the proxies put in modules' attributes for their tensors of symbolic sizes
        (``traced_inputs.module_stand_ins``), by id: their reads are guarded on the metadata of
        the tensor they stand for, its symbolic dims left out."""
        self._module_stand_ins = stand_ins

    def _read_attributes_per_call(self, captured: list, stored: list) -> None:
        """Makes each tensor among ``captured`` that a module attribute holds (not a parameter or
        buffer: HF's dynamic RoPE sets ``self.max_seq_len_cached = torch.max(position_ids) + 1``)
        read there by every call, guarded on its metadata rather than on the tensor: a program
        that sets the attribute on each call finds another tensor there each time, and compiled
        once per call. Tensors requiring grad, and those the program also stores as they are
        (``stored``), stay captured."""
        attributes = {
            id(g.expected): key
            for key, g in self._guards.items()
            if type(g) is Guard and type(g.source) is ModuleSource and isinstance(g.expected, torch.Tensor)
        }
        for i, t in enumerate(captured):
            key = attributes.get(id(t)) if isinstance(t, torch.Tensor) and not stored[i] else None
            if key is None or t.requires_grad or isinstance(t, TensorProxy):
                continue
            guard = self._guards[key]
            meta = tensor_meta(t)
            captured[i] = ArgumentTensor(guard.source, guard.name, guard.source.obj, meta, guard.origin)
            self._guards[key] = TensorGuard(guard.source, guard.name, meta, guard.origin)
        for key in self._tensors_read_whole:
            # A tensor read with all of its module's attributes and not captured (``self.last``, set
            # by every call, next to a read by a computed name): its metadata is what was read.
            g = self._guards.get(key)
            if type(g) is Guard and isinstance(g.expected, torch.Tensor) and not isinstance(g.expected, TensorProxy):
                self._guards[key] = TensorGuard(g.source, g.name, tensor_meta(g.expected), g.origin)
        for key, g in list(self._guards.items()) if self._module_stand_ins else ():
            held = self._module_stand_ins.get(id(g.expected)) if type(g) is Guard else None
            if held is not None and type(g.source) is ModuleSource:
                self._guards[key] = TensorGuard(g.source, g.name, held.meta, g.origin, held.symbolic)

    def guard_module_ints(self, places: list) -> None:
        """Guards the module ints the trace takes as size inputs (``(ModuleSource, name, int)``: a
        count of the tokens seen) as ints: the entry's size checks check their values; and the
        floats it takes as inputs (``(..., float)``: ``float_args.HeldFloat``) as floats."""
        for source, name, kind in places:
            self._guards[(source.key, name)] = IntGuard(source, name, source.describe(name), kind)

    def guard_argument_tensors(self, captured: list) -> None:
        """Guards the metadata of the tensors of argument objects that the trace takes as inputs
        (``reached.ArgumentTensor`` among ``captured``), read or not in a way the observer saw."""
        for c in captured:
            if isinstance(c, torch.Tensor) or isinstance(c.holder, torch.nn.Module):  # (a module's: guarded)
                continue
            if type(c.holder) in (list, dict):  # an item of a list or dict
                self.state.guard_held(c, c.origin, self._guards)
            else:
                self.state.read(c.holder, c.name, c.origin, self._guards)

    def reached_from_outside(self, obj) -> bool:
        """Whether the program reached ``obj`` from outside (an argument, a global, a closure cell,
        an attribute of its state) rather than making it while it ran."""
        return (
            id(obj) in self._input_ids
            or obj in self.state
            or any(getattr(g, "expected", None) is obj for g in self._guards.values())
        )

    def held_as(self, obj) -> str:
        """Where the program found ``obj``, which it reached from outside: ``Net.scales``, ``global 'it'
        of __main__``, ``closure variable 'it'``, ``argument 'it'``; empty where not known."""
        found = [g for g in self._guards.values() if getattr(g, "expected", None) is obj and hasattr(g, "source")]
        if found:
            return found[0].source.describe(found[0].name)
        known = self._iterators.get(id(obj))
        return repr(known[1]) if known is not None and known[0] is obj else ""

    def _add_hooks(self, module) -> None:
        """The forward of ``module`` and its forward hooks run in the call: their closure cells
        (a module class defined in a function) and, for a hook object (``steer.alpha``), its
        attributes are the program's state like a traced function's."""
        self._add_function(getattr(type(module), "forward", None))
        for store in _FORWARD_HOOK_STORES:
            for hook in getattr(module, store, {}).values():
                hook = getattr(hook, "__func__", hook)
                if isinstance(hook, types.FunctionType):
                    self._add_function(hook)
                elif isinstance(getattr(hook, "__dict__", None), dict) and not isinstance(hook, torch.nn.Module):
                    self.state.add(hook, ObjectSource(hook, type(hook).__name__))

    # -- profile events --------------------------------------------------------------------------

    def _on_call(self, frame) -> bool:
        """Evaluates the reads of the frame's code; True when its return must be seen too (a dict
        its reads reached, ``StateContainers.returned``)."""
        code = frame.f_code
        # (``in`` hashes the code object, all of its contents, even where nothing is cached)
        if self._cached and code in self._cached:
            cached_call(self._cached[code], frame, self.state.containers.cached_calls, self._cached_results.misses)
        refuse_handed_clocks(frame)
        if self.sizes_symbolic:  # (``int`` and ``float`` of sizes: ``PROGRAM_CALLS``)
            for note in PROGRAM_CALLS:
                note(code, frame.f_globals)
        if self._input_generators and code.co_flags & inspect.CO_GENERATOR:
            self._note_resumed(frame)
        self._on_code(code, frame.f_globals, frame, 1)
        if types := code_reads(code).types:
            read_types(types, frame.f_locals, frame.f_globals, code.co_filename)
        return self.state.containers.returns_wanted(code) or (code in self._results if self._results else False)

    def _note_resumed(self, frame) -> None:
        """Notes where the program first resumed a generator it was given (``for s in scales``)."""
        back = frame.f_back
        for gen, _ in self._input_generators:
            if gen.gi_frame is frame and back is not None and id(gen) not in self._resumed_at:
                self._resumed_at[id(gen)] = f"{back.f_code.co_filename}:{back.f_lineno}"

    def _on_code(self, code, g, frame, live: int) -> None:
        """Evaluates the reads of ``code`` against its globals and, when ``live``, the frame's
        locals (else ``frame`` is a dict of the locals known)."""
        reads = code_reads(code)
        origin, self.state.containers.reading = reads.line, code
        if id(g) not in self._module_globals:  # (before the program's code of that module runs)
            self._module_globals[id(g)] = (g, dict(g))
        for name, offset in reads.stores:
            if (id(g), name) not in self._global_stores:
                self._global_stores[id(g), name] = (code, offset)
        for (name, attr), offset in reads.attribute_stores:
            held = g.get(name, MISSING)
            if _set_again(held, g) and (id(held), attr) not in self._attribute_stores:
                self._attribute_stores[id(held), attr] = (held, attr, held.__dict__.get(attr, MISSING), code, offset)
        for name, attrs in reads.globals:
            value = g.get(name, MISSING)
            if value is MISSING or id(value) in TRACING_GLOBALS:
                continue
            if isinstance(value, types.ModuleType) and library_module(value):
                library_read(self, value, attrs)  # torch's flags (torch.backends.cudnn.deterministic)
                continue  # torch, math, F: their attributes are library code, not program state
            value = self._keep(self._globals_source(g), name, value, origin)
            if value is not MISSING and attrs:
                self._follow(value, attrs, origin)
        if reads.args or reads.cells or reads.receiver:
            local = frame.f_locals if live else frame
            receiver = local.get(reads.receiver) if reads.receiver else None
            if receiver is not None and live:
                self._add_method_defaults(receiver, code)
            if (module := is_a(self.state, receiver, torch.nn.Module)) and live and code.co_name == "__init__":
                self._made.add(id(receiver))
            if module:
                original = self._originals.get(id(receiver))
                if original is not None and live:
                    refuse_identity_uses(code, reads.receiver, receiver, g)
                if original is not None or not self._traced_module(receiver):
                    original = original or receiver
                    if id(original) not in self.modules_called:
                        self._add_hooks(original)
                    self.modules_called[id(original)] = original
            storing = None  # (the methods of the receiver's class that store its attributes: once per call)
            for name, attrs in reads.args:
                value = local.get(name, MISSING)
                if value is not MISSING and self._is_state(value):
                    if name == reads.receiver and live and attrs and storing is None:
                        storing = storing_methods(code, reads, type(value))
                    if not (
                        name == reads.receiver
                        and live
                        and attrs
                        and stored_by_calls(code, reads, attrs, value, storing)
                    ):
                        self._follow(value, attrs, origin)
                    elif value in self.state:  # (a global object's: its whole guard lets it be)
                        self.state.stored_first.add((id(value), attrs[0]))
            if reads.cells and live:
                self._read_cells(code, local, reads, origin)

    def _add_method_defaults(self, receiver, code) -> None:
        """The defaults of the method of ``receiver``'s class whose code runs (``forward(self, x,
        scale=2.0)``)."""
        fn = getattr(type(receiver), code.co_name, None)
        fn = getattr(fn, "__func__", fn)
        if getattr(fn, "__code__", None) is code:
            self._add_defaults(fn)

    def _on_return(self, frame, value) -> None:
        if self._results:
            self.take_result(frame, value)
        reads = code_reads(frame.f_code)
        self.state.containers.reading = frame.f_code
        self.state.containers.returned(frame)
        if reads.locals:
            self.late = True
            try:
                self._follow_state(frame.f_locals, reads.locals, reads.line)
            finally:
                self.late = False
        if reads.types:
            read_types(reads.types, frame.f_locals, frame.f_globals, frame.f_code.co_filename)

    def _follow_state(self, local, chains, origin) -> None:
        """Follows each ``(name, attrs)`` of ``chains`` from the value of ``local[name]`` that is state."""
        for name, attrs in chains:
            value = local.get(name, MISSING)
            if value is not MISSING and self._is_state(value):
                self._follow(value, attrs, origin)

    def _read_cells(self, code, local, reads, origin) -> None:
        fn = self._function_for(code, local)
        if fn is None:  # made while traced (a hook a forward registers): its cells hold the program's state
            self._follow_state(local, reads.cells, origin)
        else:
            self._read_cells_of(fn, code, reads, origin)

    def _read_cells_of(self, fn, code, reads, origin) -> None:
        cells = dict(zip(code.co_freevars, fn.__closure__))
        for name, attrs in reads.cells:
            cell = cells.get(name)
            value = _cell_value(cell) if cell is not None else MISSING
            if value is not MISSING:
                value = self._keep(CellSource(cell, name), "cell_contents", value, origin)
                if value is not MISSING and attrs:
                    self._follow(value, attrs, origin)

    def _function_for(self, code, local):
        """The function whose call made this frame: among the known functions of ``code``, the
        one whose cells hold what the frame sees."""
        for fn in self._functions.get(code, ()):
            if all(_cell_value(c) is local.get(n, MISSING) for n, c in zip(code.co_freevars, fn.__closure__)):
                return fn
        return None


def _cell_value(cell):
    try:
        return cell.cell_contents
    except ValueError:
        return MISSING


#: ids of what tracing puts in library modules' globals (``torch_overrides.SIZED_BUILTINS``): constants of
#: tracing, absent otherwise, so not program state to guard
TRACING_GLOBALS: set = set()
#: What is told of each call of the program's code while it is traced, ``(code, globals)``, before
#: its first instruction runs (``core.lang.program_builtins``).
PROGRAM_CALLS: list = []


def check_sizes(check) -> None:
    """While a program is traced: ``check(env)``, given the values of the trace's size inputs by
    name (``{"t0": 17}``), must hold for its symbolic entry to serve a call of those sizes
    (``dynamic.SymbolicEntry``): a decision on the sizes' hints that no guard expresses (which
    fused attention kernel torch runs for them)."""
    observer = thread_state.observer
    if observer is not None:
        observer.size_checks.append(check)


def read_module_whole(module, origin: str) -> None:
    """While a program is traced: guards every attribute of ``module`` and of its submodules,
    which library code runs (``functional_call``), whose reads the observer does not follow."""
    observer = thread_state.observer
    if observer is not None and not thread_state.inside:
        own_work(observer.read_nested, module, origin)


def _tensor_attribute(at, name: str):
    """``TensorProxy``'s read of a tensor's attribute, through the observer tracing it."""
    observer = thread_state.observer
    if observer is None:
        raise AttributeError(f"'Tensor' object has no attribute {name!r}")
    return own_work(observer.tensor_attribute, at, name)  # (the attributes it reads: not the program's reads)


TENSOR_ATTRIBUTE_READS[0] = _tensor_attribute
