"""The Inductor executor (``jit(fn, executors=["inductor"])``): each fusion region becomes one FX
graph of its torch calls, compiled by TorchInductor without Dynamo, on the CPU or CUDA.

It claims the keys whose torch-executor implementations are pure torch calls Inductor compiles to
eager's values (elementwise, reductions, shape and view ops, matmuls, norms, the fused kernels
that are plain aten calls), with the torch executor's implementation names, so that a region's
source calls the same functions either way. It leaves to the torch executor what must stay
eager: random ops (eager's RNG stream), ops that check tensor values (``binary_cross_entropy``'s
input range, integer division by zero), ops that write their inputs, and opaque linear algebra.

A region compiles on its first call, when its inputs' strides are known, once per input layout;
compiled regions are shared process-wide by region key and layout. A later process loads them
from thunder_rs's artifact cache (``inductor_cache``: no FX tracing, no Inductor cache key),
and Inductor's own on-disk caches make the compile of a region missing there a cache load.
``stats()`` reports Inductor's one-time start-up apart from the per-region compile times, and the
``thunder_rs.inductor`` logger (``THUNDER_RS_LOG=inductor``) tells each as it happens. A compile
still running after ``SLOW_COMPILE_S`` is told once per process as a WARNING on that logger, which
Python shows without configuration: a first call that compiles for a minute must not look hung.

On a GPU, Inductor compiles Triton kernels in its pool of compile workers only once the pool is
ready, and each kernel (every autotuning configuration of a reduction) in the calling process,
one after the other, until then. ``torch.compile`` starts the pool when its backend is created;
``standalone_compile`` does not, so the start-up here starts it and waits for it (bounded).

Half precision: eager rounds each op's result to its bfloat16 or float16 dtype; Inductor by
default keeps a fused chain's intermediates in float32 (it elides the downcast and upcast between
ops) and lets Triton contract a multiply and an add into one FMA, so its results differ from
eager's in many elements (38% of a bf16 GPT block's outputs, on the CPU with torch 2.15; on the
H200 the inductor rows' largest difference from eager, 0.0057, was twice nvFuser's, whose regions
round each op). Every region compiles under ``PRECISION_POLICY`` (``emulate_precision_casts``: the
round trips kept, no FMA contraction; 2% of that block's outputs differ), whatever the process's
Inductor settings, as nvFuser's regions cast each result to its dtype; and a Python number
operand of a half add, sub, mul or div is read as eager's kernel for that op, side and device
reads it, in float32 or rounded to the half dtype (``inductor_half``).

Floats a region takes (a trace's float inputs, ``core.acquisition.float_args``) are inputs of its
graph, read as numbers, one compile for every value; the region's Python arithmetic on them is
computed before the graph runs, and a half-precision region meeting one runs eagerly
(``inductor_floats``).
"""

import contextlib
import functools
import logging
import os
import threading
import time
import warnings
from dataclasses import dataclass, field, replace

import torch

from thunder_rs import prims
from thunder_rs.core.lang.executor_api import FusionExecutor, Region, register_named_executor
from thunder_rs.core.run.front import process_caches
from thunder_rs.core.base.logs import inductor_logger
from thunder_rs.errors import ThunderNotImplementedError
from thunder_rs.executors import inductor_cache
from thunder_rs.executors.inductor_claims import SWITCH_READERS, claimed_implementations
from thunder_rs.executors.inductor_half import numbers_read_as_eager
from thunder_rs.executors.inductor_symbolic import compile_symbolic, has_floats, is_symbolic
from thunder_rs.executors.torch_ex import torch_ex


@dataclass
class InductorStats:
    """What ``stats()`` reports, for this process."""

    #: seconds of Inductor's one-time start-up per device type (its imports and its first
    #: compile, of a one-op graph), kept out of ``compile_s``
    startup_s: dict = field(default_factory=dict)
    #: seconds each region compile took (tracing its FX graph and Inductor's compile, or loading
    #: it from thunder_rs's artifact cache), in order
    compile_s: list = field(default_factory=list)
    #: region calls whose (region key, input layout) was compiled before in this process
    hits: int = 0
    #: compiles: (region key, input layout) pairs new to this process
    misses: int = 0
    #: compiles Inductor answered from its on-disk caches (made in this or an earlier process)
    disk_hits: int = 0
    #: compiles answered by loading thunder_rs's artifact cache (``inductor_cache``)
    artifact_hits: int = 0
    #: compiled regions stored in thunder_rs's artifact cache
    artifact_saves: int = 0
    #: artifact cache entries found unusable (stale, damaged, unloadable): compiled instead; the
    #: last reason is in ``artifact_problem``
    artifact_errors: int = 0
    artifact_problem: str | None = None
    #: regions Inductor could not compile, which run as their eager torch calls
    failures: int = 0
    #: input layouts of regions with symbolic sizes served by a compile for other sizes (whose
    #: guards hold for them): no compile, not in ``misses``
    symbolic_reuses: int = 0

    @property
    def disk_misses(self) -> int:
        return self.misses - self.artifact_hits - self.disk_hits - self.failures


_stats = InductorStats()
#: (region key, input layout) -> the compiled region, shared by every region with that key
_compiled: dict = {}
#: region key -> the ``inductor_symbolic.SymbolicArtifact``s compiled for it, newest last
_symbolic: dict = {}
_lock = threading.RLock()


def stats() -> InductorStats:
    """A copy of this process's Inductor statistics."""
    with _lock:
        return replace(_stats, startup_s=dict(_stats.startup_s), compile_s=list(_stats.compile_s))


def clear_compiled() -> None:
    """Forgets the compiled regions of this process (Inductor's on-disk caches are kept): the next
    call of every region compiles again."""
    with _lock:
        _compiled.clear()
        _symbolic.clear()


process_caches.append(clear_compiled)


# -- input layouts ---------------------------------------------------------------------------------

_Tensor = torch.Tensor


def _number_key(value):
    # ``float.hex`` tells -0.0 from 0.0 and matches NaN to itself, which ``==`` does not; the
    # type tells 1 from 1.0 and True, which a compiled graph holds as different constants.
    if type(value) is float:
        return value.hex()
    return type(value), value


def layout(args, floats: bool = False) -> tuple:
    """What a compiled region is specialised on beyond its key (which holds its inputs' dtypes,
    devices and shapes): each tensor input's strides and lazy negation or conjugation bit, and
    each other input's value; with ``floats`` (the region's graph takes its floats as inputs:
    ``inductor_floats``), a float's type alone. Checked on every call, so it reads no more."""
    return tuple(
        [
            (a.stride(), a.is_neg() or a.is_conj())
            if isinstance(a, _Tensor)
            else float
            if floats and type(a) is float
            else _number_key(a)
            for a in args
        ]
    )


def _lazy_bits(args) -> bool:
    return any(isinstance(a, _Tensor) and (a.is_neg() or a.is_conj()) for a in args)


def _resolved(args) -> list:
    """``args`` with lazily negated or conjugated tensors (``x.conj().imag``, ``x.conj()``)
    materialised: Inductor's kernels read their storage and would miss the bit."""
    return [a.resolve_neg().resolve_conj() if isinstance(a, _Tensor) else a for a in args]


# -- compiling -------------------------------------------------------------------------------------


def _inductor():
    """Imports Inductor, which takes seconds: only a process that compiles a region pays it."""
    import torch._inductor  # noqa: PLC0415 (deferred on purpose: see the docstring)
    from torch.fx.experimental.proxy_tensor import make_fx  # noqa: PLC0415

    compile_graph = getattr(torch._inductor, "standalone_compile", None)
    if compile_graph is None:
        raise ThunderNotImplementedError(
            f"the Inductor executor needs torch._inductor.standalone_compile (torch >= 2.8); torch {torch.__version__} "
            "has none (argument executors)"
        )
    return make_fx, lambda graph, *args, **kwargs: compile_graph(numbers_read_as_eager(graph), *args, **kwargs)


#: The Inductor settings (``torch._inductor.config``) every region compiles under, whatever the
#: process's: eager's rounding of each half-precision result (see the module doc). Part of the
#: artifact cache's key, as the settings it is compiled under are.
PRECISION_POLICY = {"emulate_precision_casts": True}


def _precision_policy():
    from torch._inductor import config  # noqa: PLC0415 (with Inductor: only a compile pays it)

    return config.patch(PRECISION_POLICY)


@functools.cache
def _decompositions() -> dict:
    """Inductor's decomposition table, which its compile applies to every graph. The region is
    traced through it, so that each view the trace records (``reshape`` inside ``matmul``, say)
    was decided on the strides Inductor computes: traced through aten's own ops, a view can be
    decided on strides that Inductor's decomposition of an earlier op does not give (``cat`` of
    one tensor and an empty one is contiguous in aten, a copy of the tensor in Inductor), and
    the compile then fails."""
    from torch._inductor.decomposition import select_decomp_table  # noqa: PLC0415 (with Inductor)

    return select_decomp_table()


def _disk_hits() -> int:
    """Inductor's count of graphs it loaded from its on-disk caches in this process."""
    counters = torch._dynamo.utils.counters
    return counters["aot_autograd"]["autograd_cache_hit"] + counters["inductor"]["fxgraph_cache_hit"]


def _on_tensors(function, args):
    """``function`` as a function of the tensors among ``args``, the other inputs fixed: the
    compiled graph holds them as constants (the layout keys their values)."""
    positions = [i for i, a in enumerate(args) if isinstance(a, _Tensor)]
    full = list(args)

    def on_tensors(*tensors):
        for i, t in zip(positions, tensors):
            full[i] = t
        return tuple(function(*full))

    return on_tensors, positions


def compile_artifact(function, args, region_key: str | None = None):
    """``function`` (tuple-returning torch calls) traced to one FX graph on ``args`` and compiled
    by Inductor: the compiled artifact, called with the tensors among ``args`` at ``positions``,
    and ``positions``. With the region's key, the artifact is loaded from thunder_rs's artifact
    cache when it holds it, and stored there when compiled."""
    make_fx, compile_graph = _inductor()
    with _precision_policy():
        return _compiled_artifact(make_fx, compile_graph, function, args, region_key)


def _compiled_artifact(make_fx, compile_graph, function, args, region_key):
    on_tensors, positions = _on_tensors(function, args)
    entry = _artifact_entry(function, args, region_key)
    if entry is not None:
        loaded, problem = inductor_cache.load(entry)
        if loaded is not None:
            _stats.artifact_hits += 1
            return loaded, positions
        if problem is not None:
            _stats.artifact_errors += 1
            _stats.artifact_problem = problem
    tensors = [args[i] for i in positions]
    # The execution traces run with grad mode and autocast off; the graph is traced so too.
    with torch.no_grad(), torch.autocast("cpu", enabled=False), torch.autocast("cuda", enabled=False):
        graph = make_fx(on_tensors, decomposition_table=_decompositions(), tracing_mode="fake")(*tensors)
        compiled = compile_graph(graph, tensors, dynamic_shapes="from_example_inputs", options={})
    if entry is not None and inductor_cache.save(entry, compiled) is None:
        _stats.artifact_saves += 1
    return compiled, positions


def _artifact_entry(function, args, region_key):
    if region_key is None or not _artifacts_available():
        return None
    return inductor_cache.entry(region_key, layout(args), function)


@functools.cache
def _artifacts_available() -> bool:
    return inductor_cache.available()


def _compile_function(function, args, region_key: str | None = None):
    """``run(args) -> tuple``: ``function`` compiled by Inductor for the layout of ``args``
    (through thunder_rs's artifact cache when the region's key is given)."""
    if _lazy_bits(args):
        run = _compile_function(function, _resolved(args), region_key)
        return lambda args: run(_resolved(args))
    compiled, positions = compile_artifact(function, args, region_key)
    if len(positions) == len(args):
        return lambda args: tuple(compiled(*args))
    return lambda args: tuple(compiled(*[args[i] for i in positions]))


def _with_resolved(run):
    return lambda args: run(_resolved(args))


def _artifact_key(region) -> str:
    """The region's key for its compiled artifacts: with ``torch.backends.mkldnn.enabled`` where
    its graph depends on it (``SWITCH_READERS``)."""
    if not any(name in SWITCH_READERS for name in region.symbol_names):
        return region.key
    return f"{region.key}|mkldnn={torch._C._get_mkldnn_enabled()}"


def _symbolic_run(region, args):
    """``run(args) -> tuple``: the region compiled with its symbolic sizes (``inductor_symbolic``),
    for the sizes its guards hold for."""
    if _lazy_bits(args):
        return _with_resolved(_symbolic_run(region, _resolved(args)))
    make_fx, compile_graph = _inductor()
    with _precision_policy():
        artifact = compile_symbolic(
            region.function, args, region.input_shapes, make_fx, compile_graph, _decompositions()
        )
    _symbolic.setdefault(_artifact_key(region), []).append(artifact)
    return artifact.run


def _symbolic_reused(region, args):
    """The ``run`` of an artifact compiled with the region's symbolic sizes whose guards hold for
    ``args``, or None."""
    resolved = _resolved(args) if _lazy_bits(args) else None
    for artifact in reversed(_symbolic.get(_artifact_key(region), ())):
        if artifact.serves(args if resolved is None else resolved):
            return artifact.run if resolved is None else _with_resolved(artifact.run)
    return None


#: Device types whose kernels Inductor compiles with Triton, in its pool of compile workers.
TRITON_DEVICE_TYPES = ("cuda", "xpu")
#: Seconds the start-up waits at most for the compile workers (they start in a few seconds; a
#: pool that cannot start fails its first job sooner).
WORKERS_TIMEOUT_S = 90.0


#: Seconds a start-up or region compile runs before it is told as a warning (once per process).
SLOW_COMPILE_S = 10.0
_slow_told = threading.Event()


def _tell_slow(what: str) -> None:
    _slow_told.set()
    inductor_logger.warning(
        "%s has been compiling for over %.0f s (a first Inductor compile in a process can take a minute on a GPU; "
        "later processes load it from the caches). Silence with logging.getLogger(%r).setLevel(logging.ERROR); "
        "THUNDER_RS_LOG=inductor tells every compile",
        what,
        SLOW_COMPILE_S,
        inductor_logger.name,
    )


@contextlib.contextmanager
def _told_if_slow(what: str):
    """Warns, while the compile inside is still running, once it has run ``SLOW_COMPILE_S``: a
    WARNING record on the ``thunder_rs.inductor`` logger, shown on stderr by Python's last-resort
    handler when nothing is configured (as torch's own warnings are), and silenced by that
    logger's level. Once per process: later compiles are the same kind of wait."""
    if _slow_told.is_set():
        yield
        return
    timer = threading.Timer(SLOW_COMPILE_S, _tell_slow, (what,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()  # a warning already being written is out before the compile returns


def _start_compile_workers(device_type: str):
    """Starts Inductor's pool of compile workers where its kernels are Triton's (unless
    ``TORCH_WARM_POOL=0`` says not to, as for ``torch.compile``); returns a function that waits
    until the pool is ready and says how that went, or None where no pool is started."""
    if device_type not in TRITON_DEVICE_TYPES or os.environ.get("TORCH_WARM_POOL", "1") != "1":
        return None
    try:
        from torch._inductor.async_compile import AsyncCompile, get_compile_threads  # noqa: PLC0415 (with Inductor)

        threads = get_compile_threads()
        if threads <= 1:
            return None
        AsyncCompile.warm_pool()
    except Exception as e:  # noqa: BLE001 (without the pool, Inductor compiles in this process: slower, same code)
        note = f"not started ({type(e).__name__}: {e}): kernels compile in this process"
        return lambda: note

    def wait() -> str:
        try:
            AsyncCompile.wait_pool_ready(timeout=WORKERS_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 (as above)
            return f"not ready ({type(e).__name__}: {e}): kernels compile in this process"
        return f"{threads} ready"

    return wait


def _start(device_type: str) -> None:
    """Inductor's one-time start-up for ``device_type``: its imports, its compile workers (on a
    GPU) and a first compile (of a one-op graph), which loads its compiler, kernel templates and
    code caches; and the parts of the artifact cache's keys that a process computes once."""
    if device_type in _stats.startup_s:
        return
    inductor_logger.info("starting Inductor for %s (imports, compile workers, a first kernel)", device_type)
    start = time.perf_counter()
    with _told_if_slow(f"thunder_rs: Inductor's start-up for {device_type} (imports, compile workers, a first kernel)"):
        workers = _start_compile_workers(device_type)
        device = torch.device(device_type)
        _compile_function(lambda x: (x + 1,), [torch.zeros(8, device=device)])
        if _artifacts_available():
            inductor_cache.start()
        workers_note = workers() if workers is not None else "none (kernels compile in this process)"
    _stats.startup_s[device_type] = time.perf_counter() - start
    inductor_logger.info(
        "Inductor started for %s in %.2f s; compile workers: %s",
        device_type,
        _stats.startup_s[device_type],
        workers_note,
    )


def _device_types(args) -> list[str]:
    return sorted({a.device.type for a in args if isinstance(a, _Tensor)})


def _compiled_or_eager(region, args):
    """``run(args) -> tuple``: the region compiled by Inductor for the layout of ``args``, or its
    eager function when Inductor cannot compile it (with a warning)."""
    try:
        for device_type in _device_types(args) or ["cpu"]:
            _start(device_type)
        start, disk_hits, artifact_hits = time.perf_counter(), _disk_hits(), _stats.artifact_hits
        devices = "/".join(_device_types(args)) or "no tensors"
        with _told_if_slow(
            f"thunder_rs: the Inductor region {region.name} ({len(region.symbol_names)} symbols, {devices})"
        ):
            if is_symbolic(region.input_shapes) or has_floats(args, region.input_shapes):
                run = _symbolic_run(region, args)
            else:
                run = _compile_function(region.function, args, _artifact_key(region))
    except Exception as e:  # noqa: BLE001 (any Inductor failure leaves the eager calls, which are exact)
        warnings.warn(
            f"thunder_rs inductor executor: {region.name} ({len(region.symbol_names)} symbols) runs "
            f"eagerly: Inductor could not compile it: {type(e).__name__}: {e}",
            stacklevel=4,
        )
        _stats.failures += 1
        function = region.function
        return lambda args: function(*args)
    seconds = time.perf_counter() - start
    _stats.compile_s.append(seconds)
    from_disk = _stats.artifact_hits == artifact_hits and _disk_hits() > disk_hits
    _stats.disk_hits += from_disk
    if inductor_logger.isEnabledFor(logging.INFO):
        how = (
            "loaded from thunder_rs's artifact cache"
            if _stats.artifact_hits > artifact_hits
            else "loaded from Inductor's disk cache"
            if from_disk
            else "compiled by Inductor"
        )
        inductor_logger.info(
            "%s (%d symbols, %s): %s in %.2f s (region %d of this process)",
            region.name,
            len(region.symbol_names),
            devices,
            how,
            seconds,
            len(_stats.compile_s),
        )
    return run


def _compile_region(region, args, key):
    """The region's ``run`` for the layout of ``args`` (``key``), compiled once per process."""
    with _lock:
        run = _compiled.get(key)
        if run is not None:
            _stats.hits += 1
            return run
        if is_symbolic(region.input_shapes) or has_floats(args, region.input_shapes):
            run = _symbolic_reused(region, args)
            if run is not None:
                _stats.symbolic_reuses += 1
                _compiled[key] = run
                return run
        run = _compiled[key] = _compiled_or_eager(region, args)
        _stats.misses += 1
        return run


class CompiledRegion:
    """The callable ``fuse`` returns: the region's outputs, computed by the Inductor kernel
    compiled for its inputs' layout (compiled on the first call with each layout)."""

    __slots__ = ("region", "_last", "_floats", "_reads_switch")

    def __init__(self, region):
        self.region = region
        #: whether its graph depends on ``torch.backends.mkldnn.enabled`` (``gelu_as_eager``):
        #: then the switch is part of its layout, read on every call
        self._reads_switch = any(name in SWITCH_READERS for name in region.symbol_names)
        #: whether its floats are inputs of its graph (``inductor_floats``), known on its first call
        self._floats: bool | None = None
        #: (layout, run) of the last call, one object so that threads never pair a layout with
        #: another layout's kernel
        self._last = (None, None)

    def __call__(self, *args):
        if self._floats is None:
            self._floats = has_floats(args, self.region.input_shapes)
        key = layout(args, self._floats)
        if self._reads_switch:
            key = (key, torch._C._get_mkldnn_enabled())
        last_layout, run = self._last
        if key != last_layout:
            run = _compile_region(self.region, args, (self.region.key, key))
            self._last = (key, run)
        return run(args)


# -- the executor ----------------------------------------------------------------------------------


class InductorExecutor(FusionExecutor):
    """Claims the torch executor's pure, Inductor-compilable keys (``inductor_claims``); ``fuse``
    makes a region's callable."""

    fuses_symbolic = True
    fuses_float_inputs = True

    def __init__(self, name: str = "inductor"):
        super().__init__(name)
        # The torch executor's implementations (region code calls them) with Inductor's checkers.
        self.registry.register(*claimed_implementations(torch_ex.registry.snapshot(), prims.TABLE))

    def fuse(self, region: Region) -> CompiledRegion:
        return CompiledRegion(region)


inductor_ex = register_named_executor(InductorExecutor())
