"""Compiled callables: the cache, the per-call path, and compilation on a miss."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import types
import weakref
from itertools import starmap
from operator import getitem
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch.autograd import forward_ad as _forward_ad
from torch.utils._pytree import tree_flatten
from torch.utils.hooks import RemovableHandle

from thunder_rs.core.acquisition.dynamic import SizesGuard, SymbolicEntry, has_held, symbolic_entry, trace_guards
from thunder_rs.core.acquisition.dynamic import IntClasses, held_alike, held_grown, symbolic_labels, wanted_held
from thunder_rs.core.acquisition.dynamic import wanted_sizes
from thunder_rs.core.acquisition.float_args import FloatArgs
from thunder_rs.core.acquisition.written_only import written_arguments
from thunder_rs.core.run.call_paths import call_general, call_plain, no_tail
from thunder_rs.core.acquisition.cache import (
    forward_ad_duals,
    describe_change,
    fast_key_fn,
    has_dead,
    input_names,
    stored_key,
)
from thunder_rs.core.run.front import live_functions
from thunder_rs.core.run.generate import generated, snapshot_runner
from thunder_rs.core.run.deferred_gc import collections_deferred
from thunder_rs.core.state.fsdp import FSDPCall
from thunder_rs.core.state.cached_reads import PROGRAM_CALLS
from thunder_rs.core.state.guards import DICT_STAMPS, Guards
from thunder_rs.core.state.tensor_guards import grad_state_guards
from thunder_rs.core.run.modes import RecordedModes
from thunder_rs.core.lang.inference import making_inference
from thunder_rs.core.state.modules import apply_hook_changes
from thunder_rs.core.base.userframe import callable_name, warn_recompiles
from thunder_rs.core.run.variants import VALUE_VARIANT_LIMIT as VALUE_VARIANT_LIMIT  # (tests read it here)
from thunder_rs.core.run.variants import other_path
from thunder_rs.core.lang.reads import Diverged
from thunder_rs.core.lang.value_sizes import above_values, place_guards
from thunder_rs.core.lang.values import ValueReads, ValueTree
from thunder_rs.core.base.lazy import LazyModule
from thunder_rs.core.base.logs import checked_passes, log_compile, log_dynamic_off
from thunder_rs._core import DictStamps
from thunder_rs.core.state.modules import ModuleBinding, dict_stamp, hooks_version, write_epoch
from thunder_rs.core.state.structures import KnownStructures, of_structure
from thunder_rs.core.lang.recorder import active_recorder
from thunder_rs.core.run.wrapped_module import (
    WRAPPED,
    calling_through,
    named_modules_as_wrapped,
    named_tensors_as_wrapped,
    present_names_as_wrapped,
    present_state_dict_as_wrapped,
    wrapper_class,
)
from thunder_rs.errors import (
    ThunderError,
    ThunderValueError,
    runtime_error,
    settings_made_again,
)
from thunder_rs.core.lang.executor_api import (
    default_executors,
    resolve_executors,
    whole_runners,
)

if TYPE_CHECKING:
    from thunder_rs.core.run.entry import Entry

#: Compilation's modules, loaded at the first compile: ``import thunder_rs`` does not pay for them.
_ACQUIRE = LazyModule("thunder_rs.core.acquisition.acquire")
_ENTRY = LazyModule("thunder_rs.core.run.entry")
_GENERATORS = LazyModule("thunder_rs.core.acquisition.generator_inputs")

MISS_WARNING_THRESHOLD = 8
#: True only while Dynamo traces (it answers the call itself): eager returns False.
_is_dynamo_compiling = torch.compiler.is_dynamo_compiling
#: Entries a jitted callable keeps before evicting the least recently used (``jit(fn, cache=N)``).
DEFAULT_CACHE_SIZE = 128
STRUCTURE_CHANGED = "the module's structure (submodules, parameters, buffers or a forward set on one) changed"


def _NO_STORES() -> int:
    """The stamp of a module tree not bound yet (``ThunderFunction._stores_newest``)."""
    return 0


@dataclass
class CompileStats:
    """What ``thunder_rs.compile_stats(jfn)`` reports."""

    cache_hits: int = 0
    cache_misses: int = 0
    #: Why each recent miss compiled, oldest first: the last ``reasons_kept`` of them, so a
    #: function recompiled without end does not hold every reason (``cache_misses`` counts all).
    miss_reasons: list = field(default_factory=list)
    reasons_kept: int = DEFAULT_CACHE_SIZE
    last_compile_s: float = 0.0
    stage_s: dict = field(default_factory=dict)
    evictions: int = 0
    #: Calls run eagerly because their values took a path none of ``VALUE_VARIANT_LIMIT`` variants has.
    eager_calls: int = 0
    #: Calls run eagerly because they passed a list or dict the program also reads as state
    #: (``argument_containers.StateAliased``).
    aliased_calls: int = 0

    @property
    def calls(self) -> int:
        return self.cache_hits + self.cache_misses


class ThunderFunction:
    """``thunder_rs.jit(fn)``: calls ``fn`` through a cache of compiled traces."""

    def __init__(self, fn, module=None, cache: int = DEFAULT_CACHE_SIZE, passes=(), executors=None, dynamic=None):
        if not isinstance(cache, int) or isinstance(cache, bool) or cache < 1:
            raise ThunderValueError(f"jit: cache must be a positive number of entries, got {cache!r} (argument cache)")
        if dynamic not in (None, True, False):
            raise ThunderValueError(f"jit: dynamic must be None, True or False, got {dynamic!r} (argument dynamic)")
        #: ``jit(dynamic=)``; the sizes seen to change (``core.acquisition.dynamic``); the entries
        #: compiled with symbolic sizes; why symbolic compiles stopped (one failed), or None.
        self._dynamic = dynamic
        self._marked: set[tuple[int, int | None]] = set()
        #: the dims of argument objects' tensors seen to change, ``{(source key, name): dims}``
        self._marked_held: dict = {}
        #: int arguments a symbolic compile failed on (``x.topk(k)``): constants from then on
        self._constant_ints: set = set()
        #: float arguments seen to change, taken as inputs, or kept constant (``float_args``)
        self._floats = FloatArgs()
        #: calls whose output sizes (computed from values) changed: ``{(what, where): groups}``
        self._sized_sites: dict = {}
        self._symbolic: list[SymbolicEntry] = []
        #: the symbolic entries found by the class of a call's int arguments, with no key per value
        self._int_classes = IntClasses()
        self._dynamic_off: str | None = None
        self._passes = checked_passes(passes)
        #: The jit's executors in priority order, or None for the defaults at each compilation.
        self._executors = None if executors is None else resolve_executors(executors)
        self._fn = fn
        self._module = module
        #: the parameters the program only writes into, keyed by their type (``written_only``), or None
        self._written = written_arguments(fn) if module is None else None
        #: key -> the entry last used for it; every entry of a key (guards tell them apart) in
        #: ``_variants``.
        self._cache: dict = {}
        self._variants: dict = {}
        self._cache_size = cache
        self._stats = CompileStats(reasons_kept=max(cache, DEFAULT_CACHE_SIZE))
        self._last_key = None
        self._last_entry: Entry | None = None
        self._binding: ModuleBinding | None = None
        self._structures = KnownStructures()
        self._epoch = -1
        #: the newest change stamp of the module tree's submodule stores, and the stamp before
        #: which they last matched the binding: a store written directly (``model._modules["act"]
        #: = nn.Tanh()``, no write epoch moved) has the next call check the binding
        self._stores_newest, self._stores_stamp = _NO_STORES, 0
        self._cleared_because: str | None = None
        self._lock = threading.RLock()
        #: Set when an object some stored key holds by identity died: the next miss drops its entries.
        self._dead_keys = False
        #: The argument types of the last positional call the fast path's key refused (an int
        #: argument): calls of those types go to the general path at once, without the refusal.
        self._general_structure: tuple | None = None
        self.__wrapped__ = fn
        live_functions.add(self)

    def mark_dynamic(self, places) -> None:
        """Traces the sizes at ``places`` as symbolic from the next compile on, as if a call had seen
        them change (in the default mode, ``dynamic=None``): ``(flat position, dim)`` of a tensor
        argument, ``(flat position, None)`` of an int argument."""
        self._marked.update(places)

    def mark_floats(self, positions) -> None:
        """Takes the float arguments at flat ``positions`` as inputs from the next compile on."""
        self._floats.marked.update(positions)

    def __get__(self, instance, owner=None):
        """As a method (``@jit`` in a class body): bound to ``instance``, which is an input of the
        call, so the attributes the program reads from it are guarded on every call."""
        return self if instance is None else types.MethodType(self, instance)

    # -- the per-call path -----------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        PROGRAM_CALLS[0] += 1  # (the calls of cached functions it makes: ``cached_reads.made_call``)
        if active_recorder() is not None or _is_dynamo_compiling():
            return self._call_general(args, kwargs)
        if kwargs:
            return call_plain(self, args, kwargs)
        general = self._general_structure
        if general is not None and general == (structure := tuple(map(type, args))):
            return call_plain(self, args, kwargs, structure)
        module = self._module
        if module is not None:
            params = self._module_tensors()
            binding = self._binding
            state = (module.training, binding.metadata(params))
            if _forward_ad._current_level >= 0:  # (which of its tensors are duals there: ``forward_ad_duals``)
                state = (*state, forward_ad_duals(params)[1])
        try:
            key = fast_key_fn(len(args))(args, None if module is None else state)
        except (AttributeError, RuntimeError) as e:  # a sparse tensor has no strides: the general path says why
            if type(e) is AttributeError:
                self._general_structure = _general_structure(args)
            return self._call_general(args, kwargs, None if module is None else (params, binding, state))
        entry = self._cache.get(key)
        if entry is None:
            if self._int_classes.tables:  # (a new size of a symbolic entry: ``IntClasses``)
                entry = self._int_classes.find(key, args)
        elif entry.check is not None and not entry.check(args):
            entry = None
        if entry is None:
            entry = self._miss(list(args), tree_flatten((args, {}))[1], key)
            if module is not None:
                params = self._module_tensors()
                if self._binding is not binding:  # (another thread changed the module's structure)
                    return self(*args)
        else:
            entry.last_used = self._stats.cache_hits = self._stats.cache_hits + 1
        try:
            if entry.tail is None:
                out = entry.fn(*args) if module is None else entry.fn(*args, *params)
            else:  # tensors a cache of module state holds (``containers``), read per call
                out = entry.fn(*self._inputs(entry, args))
        except Diverged as d:
            run = lambda e: e.fn(*self._inputs(e, args))  # noqa: E731
            entry, out = self._other_path(
                d, entry, key, args, lambda: tree_flatten((args, {}))[1], run, lambda: self._fn(*args)
            )
            if entry is None:
                return out
        except Exception as e:
            raise runtime_error(e, entry.filename, entry.source) from e
        return out if entry.post is None else entry.post(out, args)

    #: calls with keyword or non-tensor arguments, and calls the fast path leaves (``call_paths``)
    _call_general = call_general
    #: a call abandoned where a value it read differs from its entry's (``variants``)
    _other_path = other_path

    def _inputs(self, entry, flat):
        """What ``entry``'s callable takes for the call of ``flat`` (as ``call_paths`` builds it)."""
        inputs = [flat[i] for i in entry.positions] if entry.positions is not None else list(flat)
        if self._module is not None:
            inputs.extend(self._module_tensors())
        if entry.tail is not None:
            inputs.extend(entry.tail(flat))
        return inputs

    def _module_tensors(self) -> list:
        """The module's parameters and buffers as the trace takes them, read from their slots on
        every call; the binding of slots is checked first when a module was written since. Their
        dtype, device and requires_grad are part of the cache key (``model.half()`` or unfreezing
        a layer recompiles), with the module's train/eval mode (``ModuleBinding.metadata``)."""
        if write_epoch[0] != self._epoch or self._stores_newest() > self._stores_stamp:
            self._check_binding()
        assert self._binding is not None  # _check_binding made it (the epoch starts unset)
        tensors = self._binding.slots.read()
        if tensors is None:  # (a tied slot given another tensor: ``ModuleBinding.untied``)
            self._check_binding()
            tensors = list(starmap(getitem, self._binding.unique))
        return tensors

    def _check_binding(self) -> None:
        """Rebinds the module's slots when its structure changed: calls then find the entries of
        the new structure, none if it is new (``structures``)."""
        with self._lock:
            epoch, stamp = write_epoch[0], dict_stamp()
            if self._binding is None or not self._binding.same_structure():
                binding = ModuleBinding(self._module)
                number, seen, dropped = self._structures.number(binding)
                binding.metadata.structure = number
                if dropped:
                    self._drop_entries(lambda key: any(of_structure(key, n) for n in dropped))
                if self._binding is not None:
                    self._cleared_because = None if seen else STRUCTURE_CHANGED
                self._binding = binding
                if DICT_STAMPS:  # (elsewhere a store written directly is not seen)
                    stores = [m.__dict__["_modules"] for m in self._binding.modules]
                    self._stores_newest = DictStamps(stores).newest
            self._epoch, self._stores_stamp = epoch, stamp

    # -- misses ----------------------------------------------------------------------------------

    def _miss(self, flat, spec, key) -> Entry:
        """Finds an entry of ``key`` whose guards hold, or compiles one (one thread at a time). Where
        the program's own error ends the compile, the settings it made before raising are made
        again, as eager leaves them (``errors.settings_made_again``)."""
        try:
            return self._found_or_compiled(flat, spec, key)
        except BaseException as e:
            settings_made_again(e)
            raise

    def _found_or_compiled(self, flat, spec, key) -> Entry:
        with self._lock:
            for entry in self._variants.get(key, ()):
                if entry.check is None or entry.check(flat):
                    self._cache[key] = entry
                    entry.last_used = self._stats.cache_hits = self._stats.cache_hits + 1
                    return entry
            # The symbolic entry that served a call last first: once a branch on values flipped for
            # good (a mask all true from some step on), the variant of its new side, not the entry
            # it diverged from, which would run up to the read on every new length, then hand over.
            # (Of entries that served last alike, the one compiled last: a variant compiled by the
            # call that diverged.)
            for symbolic in sorted(reversed(self._symbolic), key=_last_served, reverse=True):
                entry = symbolic.entry
                if symbolic.serves(key, flat) and (entry.check is None or entry.check(flat)):
                    # (a call differing only in ints it takes symbolic finds it by their class from now on)
                    if not self._int_classes.add(symbolic, key, self._stored):
                        self._insert(key, entry)
                    entry.last_used = self._stats.cache_hits = self._stats.cache_hits + 1
                    return entry
            failed = self._cache.get(key) or self._int_classes.first(key)
            reason = failed.why_not(flat) if failed is not None else None
            declined = self._why_not_symbolic(key, flat, spec)
            if reason == "unknown" and declined:  # (its symbolic sizes' guards failed: ``declined`` says which)
                reason = None
            mode = self._dynamic if self._dynamic_off is None else False
            sizes = wanted_sizes(mode, key, flat, spec, [self._last_key, *self._variants], self._marked)
            sizes = tuple(at for at in sizes if at not in self._constant_ints)
            # A new key (a mask grown with the cache) compares with the other entries.
            entries = {id(e): e for e in (failed, *(e for es in self._variants.values() for e in es)) if e is not None}
            held = wanted_held(mode, entries.values(), flat, self._marked_held)
            key = self._floats.wanted(self._dynamic, key, flat, [self._last_key, *self._variants])
            static = functools.partial(self._compile, flat, spec, key, reason, declined=declined)
            if sizes or held:
                return self._symbolic_first(static, sizes, held)
            return static()

    def _symbolic_first(self, static, sizes, held, tree=None) -> Entry:
        """A compile with ``sizes`` and ``held`` symbolic, or ``static()`` where it fails: symbolic
        compiles then stop for the function (the program does something they do not support yet),
        unless the static compile fails too (the program's own error, raised as eager raises it).
        Where the failed compile had int arguments symbolic (``x.topk(k)``, ``x.roll(k)``), those ints
        stay constants from now on and the other sizes are tried again symbolic first. ``tree``: the
        value tree a symbolic variant joins (a static one joins its key's)."""
        try:
            return static(sizes=sizes, held=held, tree=tree)
        except Exception as e:
            failure = f"{type(e).__name__}: {e}"
        ints = [at for at in sizes if at[1] is None]
        if ints:
            self._constant_ints.update(ints)
            others = tuple(at for at in sizes if at[1] is not None)
            return self._symbolic_first(static, others, held, tree) if others or held else static()
        entry = static()
        self._dynamic_off = failure
        log_dynamic_off(callable_name(self._fn), failure)
        return entry

    def _compile(self, flat, spec, key, guard_reason=None, forced: tuple = (), prior=None, **options) -> Entry:
        """Compiles an entry for the call of ``flat`` (``_compile_with``), the output sizes of calls
        that were seen to change symbolic (``values.widened``), and those that differ from the
        reads of ``prior`` (the variant whose check failed; else the entry compiled last); where
        that fails, with them constant."""
        with collections_deferred():  # (the structure check allocates too: one collection at the end)
            if self._binding is not None and not self._binding.same_structure():
                # (changed past ``nn.Module.__setattr__``, ``model._modules["act"] = nn.Tanh()``: no epoch
                # moved, a module guard found it)
                self._check_binding()
            sites = self._sized_sites
            prior = self._last_entry if prior is None else prior
            reads = (
                prior.reads if prior is not None and self._dynamic is not False and self._dynamic_off is None else ()
            )
            if not sites and not reads and not any(r.sizes for r in forced):
                return self._compile_with(flat, spec, key, guard_reason, forced, {}, **options)
            try:
                return self._compile_with(flat, spec, key, guard_reason, forced, sites, prior=reads, **options)
            except Exception:  # noqa: BLE001 (a program's own error is raised again below)
                constant = next((i for i, r in enumerate(forced) if r.sizes), len(forced))
                return self._compile_with(flat, spec, key, guard_reason, forced[:constant], {}, **options)

    def _compile_with(self, *args, **kwargs) -> Entry:
        """``_compile_entry``, with the garbage collections it would start run once at its end
        (``deferred_gc``)."""
        with collections_deferred():
            return self._compile_entry(*args, **kwargs)

    def _compile_entry(
        self,
        flat,
        spec,
        key,
        guard_reason,
        forced: tuple,
        sites: dict,
        sizes: tuple = (),
        held: dict | None = None,
        declined: str | None = None,
        tree: ValueTree | None = None,
        prior: tuple = (),
    ) -> Entry:
        """Compiles an entry for the call of ``flat``; ``forced`` are reads of values a divergence
        settled (``values.ValueReads``), ``sites`` the calls whose output sizes are symbolic;
        ``sizes`` the ``(flat position, dim)`` traced as symbolic, ``held`` the dims of argument
        objects' tensors (``dynamic.wanted_held``); ``declined`` why the last symbolic entry did not
        serve the call (for the miss reason); ``tree`` the value tree of the symbolic entry whose
        variant this is; ``prior`` the reads a read whose sizes differ from is symbolic
        (``ValueReads._groups``)."""
        start = time.perf_counter()
        # (hooks registered and module attributes written while tracing: ``entries.make_check``)
        traced_from, epoch_from, stamp_from = hooks_version(), write_epoch[0], dict_stamp()
        made, key = self._floats.generate(
            lambda f: self._generated(flat, spec, forced, sites, sizes, self._floats.held(held), prior, f), key, flat
        )
        again = lambda wider: functools.partial(self._generated, flat, spec, forced, sites, sizes, wider, prior)  # noqa: E731
        made, held = self._held_alike(made, held, key, again)
        acquired, (acquiring, generated_at), reads, names = made[0], made[2], made[3], made[4]
        computation, first, source, filename, traces, backward_traces, stages = generated_at
        all_tensors = len(acquired.tensor_positions) == len(flat)
        positions = None if all_tensors else acquired.tensor_positions
        if acquired.stand_ins is not None:  # the call's generators after its tensors (``generator_inputs``)
            at = len(acquired.tensor_positions)
            computation, first = (acquired.stand_ins.drawing(f, at) if f else f for f in (computation, first))
            positions = (*acquired.tensor_positions, *acquired.stand_ins.positions())
        entries = _ENTRY.load()
        entry = entries.Entry(computation, source, filename, positions, traces, backward_traces)
        if first is not None:
            entries.first_call(entry, first)
        entry.reads = tuple(acquired.reads)
        entry.decisions = tuple(r.key() for r in acquired.reads)
        guards = place_guards(acquired.reads, made[1])
        symbolic = symbolic_entry(entry, stored_key(key, None), acquired, traces, guards)
        if symbolic is not None:
            entry.symbolic, entry.symbolic_args = symbolic, (sizes, held)
        # Sizes read from argument objects' tensors are not in the key, nor the keys of a dict
        # (``state.keyed``): every call checks them.
        per_call = has_held(acquired) or any(getattr(c, "per_call", False) for c in acquired.size_checks)
        sizes_guard = [SizesGuard(symbolic)] if symbolic is not None and per_call else []
        entry.guards = Guards(acquired.guards + sizes_guard + grad_state_guards(acquired.guards))
        entry.hook_modules = self._hook_modules(acquired)
        entry.captured = tuple(acquired.captured)
        # (An entry taking a tensor passed twice once has positions: the hit path picks its inputs
        # through ``_inputs``, which it takes for entries with a tail.)
        entry.tail = acquired.tail if acquired.tail is not None or positions is None else no_tail
        entry.check = entries.make_check(entry, entry.guards, traced_from, epoch_from, stamp_from)
        if _forward_ad._current_level >= 0 and entry.tail is not None and entry.tail is not no_tail:
            entry.check = entries.checking_held_duals(entry, flat)
        apply_hook_changes(acquired.hook_changes)  # after the entry's hooks were read: the next call compiles
        entry.post = entries.make_post(acquired.out_spec, acquired.effects, acquired.num_outputs)
        entry.call_args, entry.state_aliases = _argument_checks(acquired)
        if acquired.inference_outputs:
            entry.post = making_inference(entry.post, acquired.inference_outputs)
        self._record_miss(key, names[0], start, {"acquire": acquiring, **stages}, traces, backward_traces, guard_reason)
        self._stats.miss_reasons[-1] += self._floats.labels(names[0])
        if declined:
            self._stats.miss_reasons[-1] += f"; {declined}"
        if acquired.sizes:
            labels = symbolic_labels(acquired.sizes, names[0])
            shared = f" (and {len(acquired.shared_sizes)} sizes equal to them)" if acquired.shared_sizes else ""
            self._stats.miss_reasons[-1] += f"; compiled with symbolic sizes {labels}{shared}"
        self._insert(key, entry, tree)
        if symbolic is not None:
            self._symbolic.append(symbolic)
        self._sized_sites.update(reads.widened)
        return entry

    def _held_alike(self, made: tuple, held: dict | None, key, again) -> tuple:
        """``(made, held)``, traced again at once (``again(wider held)``'s ``make(floats)``) with
        the dims of argument objects' tensors that are alike symbolic (``held_alike``) and those of
        a cache the last call filled that grow with the call's symbolic sizes (``held_grown``); as
        they are where there are none, or that fails (the trace with them constant stands)."""
        alike = held_alike(made[1], made[0], made[2][1][4], held) if held is not None else None
        if held is not None:
            entries = [e for es in self._variants.values() for e in es]
            for at, dims in held_grown(made[0], held, self._last_key, entries).items():
                alike = {**(alike or {}), at: (alike or {}).get(at, set()) | dims}
        if held is not None and alike:
            wider = {**held, **{at: frozenset(held.get(at, frozenset()) | dims) for at, dims in alike.items()}}
            with contextlib.suppress(Exception):
                made, held = self._floats.again(again(wider), key), wider
                for at, dims in alike.items():
                    self._marked_held.setdefault(at, set()).update(dims)
        return made, held

    def _generated(self, flat, spec, forced, sites, sizes, held, prior, floats=()) -> tuple:
        """The program acquired for the call of ``flat`` (``_compile_with``'s arguments) and
        compiled: ``(acquired, the trace's guards, (seconds acquiring, what ``generated`` returns),
        the value reads, input names)``, ``floats`` the positions of the float arguments taken as
        inputs. Raises where a count traced at 2 fails a guard at its value (``value_sizes.above_values``)."""
        start = time.perf_counter()
        executors = default_executors() if self._executors is None else self._executors
        if _forward_ad._current_level >= 0 and self._dual_inputs(flat):
            executors = [e for e in executors if not e.fusion]
        binding = self._binding if self._module is not None else None
        names: tuple = (input_names(self._fn, flat, spec), ())

        kept: list = []  # (the last acquisition's modes and value reads)

        def acquire(traced: list):  # (``traced``: ``flat`` with the generator arguments' stand-ins)
            kept[:] = RecordedModes(), ValueReads(snapshot_runner(executors), forced, sites, prior)
            try:
                found = _ACQUIRE.load().acquire(
                    self._fn, traced, spec, binding, whole_runners(executors), kept[1], sizes, held, floats
                )
            except ThunderError:
                kept[0].restore()  # a refusal part way leaves the modes as the call found them
                raise
            kept[0].check_restored()
            return found

        acquired = _GENERATORS.load().acquired_with_stand_ins(acquire, flat, names[0])
        modes, reads = kept
        acquiring = time.perf_counter() - start
        name = callable_name(self._fn)
        if self._module is not None and self._binding is not None:
            names = (names[0], self._binding.qualified)
        if _forward_ad._current_level >= 0 and self._dual_held(acquired, flat):
            executors = [e for e in executors if not e.fusion]
        made = generated(acquired, name, modes, self._passes, executors, names)
        traces, backward_traces = made[4], made[5]
        guards = trace_guards(traces, backward_traces)
        above_values(acquired.reads, guards)
        return acquired, guards, (acquiring, made), reads, names

    def _dual_inputs(self, flat) -> bool:
        """Whether a tensor argument or one of the module's is a dual of the caller's forward-AD
        level: its tangent is carried by the per-op executors' torch calls, not a fusion's kernel
        (an Inductor region drops it, or raises torch's error for an ``out=`` kernel)."""
        module_tensors = self._module_tensors() if self._module is not None else []
        return bool(forward_ad_duals(flat)[1] or forward_ad_duals(module_tensors)[1])

    @staticmethod
    def _dual_held(acquired, flat) -> bool:
        """Whether a tensor the trace captured (a global's, one an argument object or a module
        attribute holds, read per call by ``tail``) is a dual of the caller's level (as ``_dual_inputs``)."""
        held = [*acquired.captured, *(acquired.tail(flat) if acquired.tail is not None else ())]
        return bool(forward_ad_duals(held)[1])

    def _why_not_symbolic(self, key, flat, spec) -> str | None:
        """Why the last entry with symbolic sizes does not serve this call, for the miss reason."""
        if not self._symbolic:
            return None
        return self._symbolic[-1].why_not(key, flat, input_names(self._fn, flat, spec))

    def _hook_modules(self, acquired) -> list | None:
        """The modules whose hooks the entry's calls run: those the program called, and all of the
        jitted module's (a hook added to any of them later is traced in on the next call)."""
        modules = list(acquired.modules_called)
        if self._module is not None:
            assert self._binding is not None  # a module is bound on its first call
            modules.extend(self._binding.modules)
        return modules or None

    def _insert(self, key, entry: Entry, tree: ValueTree | None = None) -> None:
        """Stores ``entry`` for ``key``. An entry that reads values joins ``tree``, or its key's value
        tree, or a new one; a symbolic entry's variants share its tree, whatever key they serve."""
        if self._dead_keys:
            self._drop_dead_keys()
        key = self._stored(key)
        entry.last_used = self._stats.cache_hits
        if entry.reads and entry.tree is None:
            trees = (e.tree for e in self._variants.get(key, ()) if e.tree is not None and e.symbolic is None)
            entry.tree = tree or (next(trees, None) if entry.symbolic is None else None) or ValueTree()
            entry.tree.add(entry)
        self._variants.setdefault(key, []).insert(0, entry)
        self._cache[key] = entry
        self._last_entry = entry
        if sum(map(len, self._variants.values())) > self._cache_size:
            self._evict()

    def _stored(self, key):
        """``key`` as stored: its identities held weakly, marking the cache's keys dead when one dies."""
        return stored_key(key, _key_death_marker(self))

    def _drop_dead_keys(self) -> None:
        """Drops the entries of keys whose identity objects died (a KV cache of an earlier
        ``generate``): their guards hold what those objects held."""
        self._dead_keys = False
        self._drop_entries(has_dead)

    def _evict(self) -> None:
        """Drops the least recently used entry."""
        key, victim = min(((k, e) for k, es in self._variants.items() for e in es), key=lambda ke: ke[1].last_used)
        variants = self._variants[key]
        variants.remove(victim)
        if victim.tree is not None and victim.symbolic is None:  # (a symbolic one serves other keys still)
            victim.tree.remove(victim)
        if not variants:
            del self._variants[key]
        if self._cache.get(key) is victim:
            if variants:
                self._cache[key] = variants[0]
            else:
                del self._cache[key]
        self._stats.evictions += 1

    def _drop_entries(self, dropped) -> None:
        """Drops the entries of the keys ``dropped(key)``, symbolic ones included (and the last
        entry compiled, kept for miss reasons, if it is one: it holds what they hold)."""
        self._int_classes.drop(dropped)
        for key in [k for k in self._variants if dropped(k)]:
            if any(entry is self._last_entry for entry in self._variants.pop(key)):
                self._last_entry = None
            self._cache.pop(key, None)
        self._symbolic = [s for s in self._symbolic if not dropped(s.key)]

    def _clear(self, reason: str) -> None:
        self._cache.clear()
        self._int_classes = IntClasses()
        self._variants.clear()
        self._symbolic = []
        self._cleared_because = reason

    def _record_miss(self, key, names: list, start, stages, traces, backward_traces, guard_reason):
        """Counts the miss of ``key`` (the user's names of its flat inputs: ``names``) and why."""
        stats = self._stats
        if guard_reason is not None:
            reason = guard_reason
        elif self._cleared_because is not None:
            reason, self._cleared_because = self._cleared_because, None
        else:
            reason = describe_change(self._last_key[:2] if self._last_key else None, key[:2], names)
        self._last_key = stored_key(key, None)  # for the next miss's reason; it keeps no argument alive
        stats.cache_misses += 1
        stats.miss_reasons.append(reason)
        if len(stats.miss_reasons) > stats.reasons_kept:
            del stats.miss_reasons[0]
        stats.last_compile_s = time.perf_counter() - start
        stats.stage_s = dict(stages)
        # A stage that runs twice in one half (dce before and after the split) counts once, summed.
        for prefix, stage_traces in (("pass", traces), ("backward", backward_traces)):
            for t in stage_traces:
                key = f"{prefix}:{t.label}"
                stats.stage_s[key] = stats.stage_s.get(key, 0.0) + t.seconds
        log_compile(callable_name(self._fn), stats.cache_misses, reason, stats.last_compile_s, stats.stage_s)
        if stats.cache_misses == MISS_WARNING_THRESHOLD:
            warn_recompiles(callable_name(self._fn), stats.cache_misses, reason)


def _general_structure(args) -> tuple | None:
    """The types of ``args`` where one is no tensor, so that the fast path's key refuses every
    call of them (a tensor's refusal, a sparse one's, depends on the tensor), else None."""
    structure = tuple(map(type, args))
    return None if all(issubclass(t, torch.Tensor) for t in structure) else structure


def _argument_checks(acquired) -> tuple:
    """``(Entry.call_args, Entry.state_aliases)`` of an entry made from ``acquired``: whether its
    ``post`` changes containers of the call's arguments, and the lists and dicts of state no call
    may pass as an argument (``argument_containers.refuse_aliased``)."""
    changes = any(getattr(e, "changes_arguments", False) for e in acquired.effects)
    return getattr(acquired.out_spec, "takes_call", False) or changes, acquired.state_aliases


def _last_served(symbolic: SymbolicEntry) -> int:
    """When ``symbolic``'s entry last served a call (its ``last_used``: the hit count then)."""
    return symbolic.entry.last_used


_WRAPPER_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def _key_death_marker(jfn):
    """The weak-reference callback of a stored key's identities: marks ``jfn``'s cache as holding
    dead keys (dropped on its next miss, under its lock: the callback may run at any moment)."""
    ref = weakref.ref(jfn)

    def dead(_):
        owner = ref()
        if owner is not None:
            owner._dead_keys = True

    return dead


def _jit_again(module, cache: int, passes: tuple, executors, dynamic=None):
    return ThunderModule(module, cache=cache, passes=passes, executors=executors, dynamic=dynamic)


#: Attributes of the wrapper itself; every other attribute set on it goes to the wrapped module.
_WRAPPER_OWN = frozenset({WRAPPED, "_jfn", "_hooks_seen", "_fsdp"})


class ThunderModule(torch.nn.Module):
    """``thunder_rs.jit(module)``: a module whose calls go through a ``ThunderFunction``.

    Hooks registered on this wrapper run eagerly around the compiled call, as ``nn.Module``
    runs them; hooks on the wrapped module and its submodules are traced into the call.
    Attributes it does not have come from the wrapped module (``jm.config``, ``jm.generate``; its
    methods call the module through this wrapper), and its state dict has the wrapped module's keys.
    """

    def __new__(cls, module: torch.nn.Module, *args, **kwargs):
        # (a container's protocol, answered by the module: ``len(jm)``, ``jm[0]``, ``for m in jm``)
        return super().__new__(wrapper_class(cls, type(module)) if cls is ThunderModule else cls)

    def __init__(
        self, module: torch.nn.Module, cache: int = DEFAULT_CACHE_SIZE, passes=(), executors=None, dynamic=None
    ):
        super().__init__()
        self._model = module
        self._jfn = ThunderFunction(
            module, module=module, cache=cache, passes=passes, executors=executors, dynamic=dynamic
        )
        #: ``(hooks_version() when the wrapper's hooks were last looked at, whether it had any)``:
        #: one attribute, so that a thread never pairs one call's version with another's answer
        self._hooks_seen = (-1, False)
        #: how a module with fully_shard (FSDP2) modules is called, or None
        self._fsdp = FSDPCall.of(module)
        present_state_dict_as_wrapped(self)
        present_names_as_wrapped(self)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            modules = self.__dict__.get("_modules")
            if modules is None or WRAPPED not in modules or name == WRAPPED:
                raise
            return calling_through(self, getattr(modules[WRAPPED], name))

    # Names as eager gives them, without ``_model.`` (``wrapped_module``).
    def named_modules(self, memo=None, prefix: str = "", remove_duplicate: bool = True):
        return named_modules_as_wrapped(self, memo, prefix, remove_duplicate)

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return named_tensors_as_wrapped(self, "named_parameters", prefix, recurse, remove_duplicate)

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return named_tensors_as_wrapped(self, "named_buffers", prefix, recurse, remove_duplicate)

    def __reduce_ex__(self, protocol):
        # A copy or a pickle (``copy.deepcopy(jmodel)``, ``AveragedModel(jmodel)``) is a fresh jit
        # of a copy of the wrapped module: compiled entries belong to the process and the module.
        jfn = self._jfn
        return (_jit_again, (self._model, jfn._cache_size, jfn._passes, jfn._executors, jfn._dynamic))

    def _wrapped_for(self, name: str):
        """The wrapped module when ``name`` is its attribute, None when it is the wrapper's own
        (nn.Module's state included, which its ``__init__`` put in the instance dict)."""
        wrapped = self.__dict__.get("_modules", {}).get(WRAPPED)
        own = name in _WRAPPER_OWN or name in self.__dict__ or hasattr(type(self), name)
        return None if own else wrapped

    def __setattr__(self, name: str, value) -> None:
        # ``jmodel.scale = 5`` or ``jmodel.lin = nn.Linear(...)`` change the wrapped module, as
        # torch.compile's wrapper does: the next call reads them (guards and bindings are on it).
        wrapped = self._wrapped_for(name)
        if wrapped is None:
            super().__setattr__(name, value)
        else:
            setattr(wrapped, name, value)

    def __delattr__(self, name: str) -> None:
        wrapped = self._wrapped_for(name)
        if wrapped is None:
            super().__delattr__(name)
        else:
            delattr(wrapped, name)

    def forward(self, *args, **kwargs):
        if self._fsdp is not None:
            return self._fsdp(self._jfn, args, kwargs)
        return self._jfn._call_general(args, kwargs)

    def __call__(self, *args, **kwargs):
        seen, has_hooks = self._hooks_seen
        if seen != (version := RemovableHandle.next_id):  # (``hooks_version()``, without its frame)
            # (The version read first: a hook another thread registers meanwhile moves it again.)
            has_hooks = self._fsdp is not None or any(getattr(self, s) for s in _WRAPPER_HOOKS)
            self._hooks_seen = (version, has_hooks)
        if has_hooks:
            return super().__call__(*args, **kwargs)
        return self._jfn(*args, **kwargs)
