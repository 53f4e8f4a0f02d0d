"""Compiled callables: the cache, the per-call path, and compilation on a miss."""

import time
import warnings
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from thunder_rs import _core
from thunder_rs.core.acquire import acquire
from thunder_rs.core.autograd import grad_function
from thunder_rs.core.proxies import make_proxy
from thunder_rs.core.cache import describe_change, fast_key_fn, global_key, leaf_key
from thunder_rs.core.writeback import with_writebacks
from thunder_rs.errors import runtime_error
from thunder_rs.executors.extend import default_executors, executor_table
from thunder_rs.executors.torch_ex import sync_fallbacks

_Tensor = torch.Tensor
MISS_WARNING_THRESHOLD = 8


@dataclass
class CompileStats:
    """What ``thunder_rs.compile_stats(jfn)`` reports."""

    cache_hits: int = 0
    cache_misses: int = 0
    miss_reasons: list = field(default_factory=list)
    last_compile_s: float = 0.0
    stage_s: dict = field(default_factory=dict)

    @property
    def calls(self) -> int:
        return self.cache_hits + self.cache_misses


@dataclass
class Entry:
    fn: object
    #: the generated source and the file name it was compiled under, to label runtime errors
    source: str
    filename: str
    #: when not None, positions of the flat inputs passed to ``fn``
    positions: tuple | None
    out_spec: object
    traces: list
    #: the backward's traces, empty for a forward-only entry
    backward_traces: list = field(default_factory=list)


def _checker(executors):
    """The callback the Rust claim pass calls for table entries that have a checker."""

    def check(index, key, args, kwargs):
        return bool(executors[index].implmap[key][1](*args, **kwargs))

    return check


def _load(trace, name: str, filename: str, namespace: dict):
    """Execs the generated source of an execution trace; returns it and its function."""
    source, scope = str(trace), dict(namespace)
    exec(compile(source, filename, "exec"), scope)
    return source, scope[name]


def _with_captured(fn, captured: tuple):
    """``fn`` given the captured tensors after the caller's inputs, as the trace takes them."""
    return lambda *inputs: fn(*inputs, *captured)


class ThunderFunction:
    """``thunder_rs.jit(fn)``: calls ``fn`` through a cache of compiled traces."""

    def __init__(self, fn, module=None):
        self._fn = fn
        self._module = module
        self._cache: dict = {}
        self._stats = CompileStats()
        self._last_key = None
        self._last_entry: Entry | None = None
        self._param_slots: tuple = ()
        self._unique_slots: tuple = ()
        self.__wrapped__ = fn

    def __call__(self, *args, **kwargs):
        if kwargs:
            return self._call_general(args, kwargs)
        module = self._module
        try:
            key = fast_key_fn(len(args))(args, None if module is None else self._module_state())
        except AttributeError:
            return self._call_general(args, kwargs)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._compile(list(args), tree_flatten((args, {}))[1], key)
        else:
            self._stats.cache_hits += 1
        try:
            if module is None:
                out = entry.fn(*args)
            else:
                out = entry.fn(*args, *[d[n] for d, n in self._unique_slots])
        except Exception as e:
            raise runtime_error(e, entry.filename, entry.source) from e
        return out if entry.out_spec is None else tree_unflatten(list(out), entry.out_spec)

    def _call_general(self, args, kwargs):
        flat, spec = tree_flatten((args, kwargs))
        key = (global_key(None if self._module is None else self._module_state()), tuple(map(leaf_key, flat)), spec)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._compile(flat, spec, key)
        else:
            self._stats.cache_hits += 1
        inputs = [flat[i] for i in entry.positions] if entry.positions is not None else flat
        if self._module is not None:
            inputs.extend(d[n] for d, n in self._unique_slots)
        try:
            out = entry.fn(*inputs)
        except Exception as e:
            raise runtime_error(e, entry.filename, entry.source) from e
        return out if entry.out_spec is None else tree_unflatten(list(out), entry.out_spec)

    def _module_state(self):
        """The module's part of the cache key: train/eval mode, and each parameter's and buffer's
        dtype, device and requires_grad (``model.half()`` or unfreezing a layer recompiles)."""
        if not self._unique_slots:
            self._bind_module()
        return (self._module.training, tuple([(t.dtype, t.device, t.requires_grad) for t in [d[n] for d, n in self._unique_slots]]))

    def _bind_module(self):
        """Parameter and buffer slots of the module, tied ones sharing one trace input."""
        slots, unique, index_of = [], [], {}
        for mod in self._module.modules():
            for store in (mod._parameters, mod._buffers):
                for name, value in store.items():
                    if value is None:
                        continue
                    if id(value) not in index_of:
                        index_of[id(value)] = len(unique)
                        unique.append((store, name))
                    slots.append((store, name, index_of[id(value)]))
        self._param_slots = tuple(slots)
        self._unique_slots = tuple(unique)

    def _compile(self, flat, spec, key) -> Entry:
        start = time.perf_counter()
        fn = self._fn
        if self._module is not None:
            self._bind_module()
        acquired = acquire(fn, flat, spec, self._param_slots, len(self._unique_slots))
        acquired_at = time.perf_counter()
        sync_fallbacks()
        executors = default_executors()
        table, impls = executor_table(executors)
        traces, backward_traces, grad_positions = _core.compile(acquired.trace, table, _checker(executors), make_proxy, acquired.consts)
        passes_at = time.perf_counter()
        namespace = {"torch": torch, **impls}
        namespace.update((f"_c{i}", c) for i, c in enumerate(acquired.consts))
        filename = f"<thunder_rs {getattr(fn, '__qualname__', 'fn')}>"
        source, computation = _load(traces[-1], "computation", filename, namespace)
        wb = acquired.writebacks
        if backward_traces:
            _, backward = _load(backward_traces[-1], "backward", filename + " backward", namespace)
            if wb is None:
                computation = grad_function(computation, backward, grad_positions, acquired.out_kind == "single", acquired.out_kind == "list")
            else:
                computation = grad_function(computation, backward, grad_positions, False, False, wb.non_differentiable, wb.targets)
        if wb is not None:
            computation = with_writebacks(computation, wb)
        if acquired.captured:
            computation = _with_captured(computation, tuple(acquired.captured))
        end = time.perf_counter()
        all_tensors = len(acquired.tensor_positions) == len(flat)
        positions = None if all_tensors else acquired.tensor_positions
        entry = Entry(computation, source, filename, positions, acquired.out_spec, traces, backward_traces)
        self._record_miss(key, start, {"acquire": acquired_at - start, "passes": passes_at - acquired_at, "codegen": end - passes_at}, traces, backward_traces)
        self._cache[key] = entry
        self._last_entry = entry
        return entry

    def _record_miss(self, key, start, stages, traces, backward_traces):
        stats = self._stats
        reason = describe_change(self._last_key[:2] if self._last_key else None, key[:2], [])
        self._last_key = key
        stats.cache_misses += 1
        stats.miss_reasons.append(reason)
        stats.last_compile_s = time.perf_counter() - start
        stats.stage_s = {**stages, **{f"pass:{t.label}": t.seconds for t in traces}}
        stats.stage_s.update((f"backward:{t.label}", t.seconds) for t in backward_traces)
        if stats.cache_misses == MISS_WARNING_THRESHOLD:
            warnings.warn(f"thunder_rs: {getattr(self._fn, '__qualname__', self._fn)} recompiled "
                          f"{stats.cache_misses} times; last change: {reason}", stacklevel=3)


class ThunderModule(torch.nn.Module):
    """``thunder_rs.jit(module)``: a module whose calls go through a ``ThunderFunction``."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self._model = module
        self._jfn = ThunderFunction(module, module=module)

    def forward(self, *args, **kwargs):
        return self._jfn._call_general(args, kwargs)

    def __call__(self, *args, **kwargs):
        return self._jfn(*args, **kwargs)
