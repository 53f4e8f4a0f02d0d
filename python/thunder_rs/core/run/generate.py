"""What a compile makes of an acquired program: the passes run over its trace, the fusion
executors' regions, and the generated Python source of its forward (and of its backward, through
``DifferentiableProgram``), loaded as functions."""

from __future__ import annotations

import math
import time

import torch

from thunder_rs import _core
from thunder_rs.core.acquisition.dynamic import size_readers, with_sizes
from thunder_rs.core.base.lazy import LazyModule
from thunder_rs.core.base.logs import log_dumps
from thunder_rs.core.base.proxies import make_proxy
from thunder_rs.core.lang.fallback import CALL_EFFECTS, QUEUE_EFFECTS, absent_as_none
from thunder_rs.core.lang.torch_casts import with_cached_casts
from thunder_rs.core.lang.values import abandonable
from thunder_rs.core.run import codes
from thunder_rs.core.run.region_writes import region_writes
from thunder_rs.core.lang.executor_api import (
    FusionExecutor,
    Region,
    default_executors,
    differentiable_executors,
    executor_table,
)
from thunder_rs.core.run.autograd import detaching, grad_function, through_inner_leaves
from thunder_rs.core.run.differentiable import DifferentiableProgram, program_generators
from thunder_rs.core.run.fresh_outputs import viewable_outputs
from thunder_rs.core.run.input_names import trace_input_names
from thunder_rs.core.run.modes import RecordedModes
from thunder_rs.core.run.saving_nodes import SavingNodes
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, ThunderTypeError

#: Write-backs wrap a computation whose program writes its inputs, made by a compile.
_WRITEBACK = LazyModule("thunder_rs.core.acquisition.writeback")
_OUTPUT_VIEWS = LazyModule("thunder_rs.core.acquisition.output_views")


def _checker(executors):
    """The callback the Rust claim pass calls for table entries that have a checker."""

    def check(index, key, args, kwargs):
        return bool(executors[index].registry[key].checker(*args, **kwargs))

    return check


def _load(trace, name: str, filename: str, namespace: dict, regions: dict):
    """Execs the generated source of an execution trace, its fusion regions bound to the
    callables ``regions`` holds by name; returns the source and its function."""
    source, scope = str(trace), {**namespace, **regions}
    exec(codes.program(source, filename), scope)
    return source, scope[name]


def _fused_regions(trace, filename: str, namespace: dict, executors, writes=None) -> dict:
    """Each region of ``trace`` by name: its executor's ``fuse`` of it, called once per region;
    ``writes``: ``Region.writes`` by region name (``region_writes``)."""
    fused = {}
    for code in trace.regions():
        name, symbol_names, scope = code.name, tuple(code.symbol_names), dict(namespace)
        exec(codes.program(code.source, f"{filename} {name}"), scope)
        executor = executors[code.executor]
        # Read only for an executor that translates prims: each call of a decomposition converts.
        decomposed = _decomposed(code) if executor.fuses_decompositions else {}
        if executor.fuses_symbolic:
            decomposed["input_shapes"] = tuple(code.input_shapes)
        if writes and name in writes:
            decomposed["writes"] = writes[name]
        region = Region(
            name, code.key, code.source, scope[name], symbol_names, code.num_inputs, code.num_outputs, **decomposed
        )
        try:
            fused[name] = executor.fuse(region)
        except Exception as e:
            raise ThunderRuntimeError(
                f"{executor.name} executor: fuse failed on region {name} "
                f"({', '.join(symbol_names)}): {type(e).__name__}: {e}"
            ) from e
        if not callable(fused[name]):
            raise ThunderTypeError(
                f"{executor.name} executor: fuse returned {type(fused[name]).__name__} for region "
                f"{name}, expected a callable"
            )
    return fused


def _decomposed(code: "_core.RegionCode") -> dict:
    """The fields of a ``Region`` that carry its decomposition."""
    return {
        "inputs": tuple(code.inputs),
        "calls": tuple(code.calls),
        "outputs": tuple(code.outputs),
        "dtypes": code.dtypes,
    }


def _named_inputs(traces: list, acquired, names, taken: set) -> list:
    """The forward traces showing (the execution trace taking) inputs under the user's names."""
    user, params = names
    inputs = traces[0].num_inputs
    floats = [getattr(at, "position", None) for at, _ in acquired.floats]
    named = trace_input_names(user, acquired.tensor_positions, params, inputs, taken | {"computation"}, floats)
    return [t.with_input_names(named) if t.num_inputs == inputs else t for t in traces]


def snapshot_runner(executors):
    """``run(snapshot, consts, inputs)``: a snapshot of a recording (``values``) compiled for the
    executors that run symbols one by one (a fusion executor would compile a region per value
    read), and run."""
    plain = [e for e in executors if not e.fusion]

    def run(snapshot, consts: list, inputs: list):
        table, impls = executor_table(plain)
        traces = _core.compile(snapshot, table, _checker(plain), make_proxy, consts).forward
        source, taken = codes.canonical(str(traces[-1]))
        scope = {"torch": torch, "math": math, **impls, **{f"_c{j}": consts[i] for j, i in enumerate(taken)}}
        exec(codes.code(source, "<thunder_rs snapshot>"), scope)
        return scope["computation"](*inputs)

    return run


def _differentiable_program(acquired, filename: str, grad_positions: list, forward_trace) -> DifferentiableProgram:
    """The entry's program as torch calls under autograd (``core.differentiable``), compiled on
    its first double backward or torch.func transform."""
    trace, consts, wb = acquired.trace, acquired.consts, acquired.writebacks

    def compile_program():
        executors = differentiable_executors()
        table, impls = executor_table(executors)
        traces = _core.compile(trace, table, _checker(executors), make_proxy, consts, differentiable=True).forward
        namespace = {"torch": torch, "math": math, **impls, **{f"_c{i}": c for i, c in enumerate(consts)}}
        return _load(traces[-1], "computation", filename + " differentiable", namespace, {})

    outputs = [i for i in grad_positions if wb is None or i not in wb.non_differentiable]
    generators = program_generators(consts) if trace.has_effects() else None
    tensors = trace.num_inputs - len(acquired.sizes) - len(acquired.floats)  # sizes and floats are last
    return DifferentiableProgram(
        compile_program,
        wb is None and acquired.out_kind == "single",
        outputs,
        [k for k in trace.inputs_read(outputs) if k < tensors],
        forward_trace.inputs_returned([1]),
        wb.targets if wb is not None else (),
        generators,
    )


def _partial_backward(acquired, grad_positions: list, compilation: tuple) -> dict:
    """``grad_function``'s arguments for a backward that reaches only some outputs, with several
    grad outputs: per grad position, the inputs its output reads (gradients a backward cannot
    reach), and the compiler of a backward for a pattern of absent cotangents. ``compilation``:
    the jit's ``(passes, executors, namespace, filename)`` the entry was compiled with."""
    if len(grad_positions) < 2:
        return {}
    passes, executors, namespace, filename = compilation

    def compile_backward(absent: tuple):
        """The backward where the cotangents at ``absent`` are absent, as eager's autograd runs
        it: no gradient flows from them (an op reaching both gets None for them: ``qr``'s backward
        from ``Q`` alone; ``passes::vjp::joint_without``), and the positions of the residuals it
        reads (those it takes come first); None where it cannot be compiled (``compile_backward``)."""
        table, _ = executor_table(executors)
        checker = _checker(executors)
        try:
            compiled = _core.compile_backward(
                acquired.trace,
                table,
                checker,
                make_proxy,
                acquired.consts,
                list(passes),
                list(absent),
                list(acquired.checkpoints),
                list(acquired.recomputed),
            )
        except ThunderNotImplementedError:
            return None
        trace = compiled.backward[-1]
        regions = _fused_regions(trace, filename + " backward", namespace, executors)
        read = frozenset(k for k in trace.inputs_needed() if k < trace.num_inputs - len(grad_positions))
        return _backward(trace, filename, namespace, regions, len(grad_positions)), read

    reads = tuple(frozenset(acquired.trace.inputs_read([i])) for i in grad_positions)
    nodes = SavingNodes(acquired.trace, grad_positions)
    return {"reads": reads, "compile_backward": compile_backward, "nodes": nodes}


def _backward(trace, filename: str, namespace: dict, regions, num_cotangents: int):
    """The generated backward of ``trace`` (its last ``num_cotangents`` inputs are cotangents);
    where it runs opaque symbols' backwards (``.vjp``), giving None for the inputs their ops gave
    none (``fallback.absent_as_none``)."""
    backward = _load(trace, "backward", filename + " backward", namespace, regions)[1]
    if any(name.endswith("vjp") for name in trace.all_symbol_names()):
        return absent_as_none(backward, trace, num_cotangents)
    return backward


def _whole_backward(trace, filename: str, namespace: dict, regions, num_cotangents: int):
    """``_backward`` of the whole backward; with several cotangents, compiled at its first call: a
    backward that reaches some outputs only (``loss.backward()`` of a model returning the loss and
    its logits) runs the one compiled for its pattern (``_partial_backward``) instead, and never
    this one (compiling a GPT-2's source: 4 ms of each compile)."""
    if num_cotangents < 2:
        return _backward(trace, filename, namespace, regions, num_cotangents)
    loaded: list = []  # (the compiled backward, once)

    def backward(*args):
        if not loaded:
            loaded.append(_backward(trace, filename, namespace, regions, num_cotangents))
        return loaded[0](*args)

    return backward


def _unread_cotangents(trace, grad_positions: list) -> frozenset:
    """The grad positions whose cotangents the backward ``trace`` never reads (its last inputs are
    the cotangents): a written-back value's, which the engine need not materialize as zeros."""
    needed, first = frozenset(trace.inputs_needed()), trace.num_inputs - len(grad_positions)
    return frozenset(p for j, p in enumerate(grad_positions) if first + j not in needed)


def _unread(acquired) -> tuple:
    """The positions of the tensor inputs the call never reads (a model's layers its forward
    skipped: experts no token chose), which ``grad_function`` passes to torch's autograd as None:
    an input requiring grad costs its backward about 2 us even when it gets no gradient (150
    layers of which 3 ran: 1.1 ms a step). Written inputs are kept (their writes go to them)."""
    trace, wb = acquired.trace, acquired.writebacks
    tensors = trace.num_inputs - len(acquired.sizes) - len(acquired.floats)  # sizes and floats are last
    needed = set(trace.inputs_needed()) | set(wb.targets if wb is not None else ())
    return tuple(k for k in range(tensors) if k not in needed)


def _stale(acquired, grad_positions: list) -> tuple:
    """Per call whose saved tensors the program wrote in place (``version_tracking``): eager's error
    and the flat outputs through which a backward reaches the call's node. A node whose saved
    tensor was written through ``.data``, which eager's backward reads, is refused here."""
    stale = []
    for error, vids in acquired.stale_saves:
        reached = acquired.trace.outputs_reaching(list(vids), list(grad_positions))
        if reached:
            if error.at_compile:
                raise error.error()
            stale.append((error, frozenset(reached)))
    return tuple(stale)


def _made(acquired, grad_positions: list) -> dict:
    """``acquired.made_outputs`` (``saved_outputs.OutputMade`` by output position) that a backward
    may reach the node of, each given ``reach``: the differentiable flat outputs whose backward
    runs that node (``Trace.outputs_reaching`` from the values of its call): a backward from ``Q``
    of ``qr`` unpacks the ``R`` it saved, as from ``R`` itself (``run.autograd._check_made``); and
    ``reader_reach``, those of the nodes of the calls that read it (``OutputMade.named``)."""
    wb, trace = acquired.writebacks, acquired.trace
    positions = [i for i in grad_positions if wb is None or i not in wb.non_differentiable]
    made = {}
    for j, output in acquired.made_outputs.items():
        output.reach = frozenset(trace.outputs_reaching(list(output.vids), positions))
        output.reader_reach = tuple(frozenset(trace.outputs_reaching(list(v), positions)) for _, v in output.readers)
        if output.reach:
            made[j] = output
    return made


class _InnerOutputs:
    """``j -> `` the differentiable flat outputs other than ``j`` whose backward reaches output ``j``
    inside the program (``loss`` of a call returning ``loss, logits``, for ``logits``): eager's hooks
    on ``j`` and its retained ``.grad`` see the gradient from them, which the call's one node does
    not compute (``output_hooks.refuse_inner``). ``watched``: the outputs for which it may be any
    (read by a call of the program along gradients), found in one walk of the trace at the compile;
    it is asked at a backward only for one of those with the caller's hooks or a retained
    ``.grad``, once each (a walk of the trace per output)."""

    def __init__(self, trace, vids: tuple, positions: list, watched: tuple):
        self.trace, self.vids, self.positions, self.watched = trace, vids, positions, watched
        self.known: dict[int, frozenset] = {}

    def __call__(self, j: int) -> frozenset:
        if j not in self.known:  # (an output returned twice is one tensor, as eager's: not computed from itself)
            reach = self.trace.outputs_reaching([self.vids[j]], self.positions)
            self.known[j] = frozenset(k for k in reach if self.vids[k] != self.vids[j])
        return self.known[j]


def _inner_outputs(acquired, grad_positions: list) -> _InnerOutputs | None:
    """The ``_InnerOutputs`` of a call with several grad outputs, where any may have some."""
    if len(grad_positions) < 2:
        return None
    vids = acquired.output_vids
    held = {j: vids[j] for j in grad_positions if j < len(vids) and vids[j] is not None}
    read = acquired.trace.values_read_along_gradients(list(held.values()))
    watched = tuple(j for j, r in zip(held, read) if r)
    return _InnerOutputs(acquired.trace, vids, list(grad_positions), watched) if watched else None


def _with_captured(fn, captured: tuple):
    """``fn`` given the captured tensors after the caller's inputs, as the trace takes them."""
    return lambda *inputs: fn(*inputs, *captured)


def _made_by_the_call(acquired) -> set:
    """The effects of ``acquired``'s trace that only a compiled call makes (``fallback.CALL_EFFECTS``)."""
    trace = acquired.trace
    return CALL_EFFECTS.intersection(trace.all_symbol_names()) if trace.has_effects() else set()


def _executors_for(acquired, executors: list, made: set) -> list:
    """The executors of ``acquired``'s trace: ``executors`` but the fusion executors it cannot use
    (``made``: the effects only a call makes)."""
    if acquired.sizes:
        # A fusion executor that compiles a region for the sizes of its first call (a definition
        # or kernels per shape, seconds each) is left out: a trace with symbolic sizes runs
        # without it, one compile for every size, rather than a fusion compile per size.
        executors = [e for e in executors if not isinstance(e, FusionExecutor) or e.fuses_symbolic]
    if acquired.floats:  # (likewise a fusion executor that compiles a region per float value)
        executors = [e for e in executors if not isinstance(e, FusionExecutor) or e.fuses_float_inputs]
    if made & QUEUE_EFFECTS:
        # (a wait or mark on the device queue falls between the kernels eager's does: launched one by one)
        executors = [e for e in executors if not isinstance(e, FusionExecutor)]
    return executors


def _compiled(acquired, table, executors, passes: tuple):
    """``_core.compile`` of ``acquired`` with the checkpoints it ran (reentrant, and the
    non-reentrant ones whose calls the backward runs again)."""
    checker, consts = _checker(executors), acquired.consts
    reentrant, recomputed = list(acquired.checkpoints), list(acquired.recomputed)
    return _core.compile(
        acquired.trace, table, checker, make_proxy, consts, list(passes), checkpoints=reentrant, recomputed=recomputed
    )


def generated(acquired, name: str, modes: RecordedModes, passes: tuple = (), executors=None, names=None):
    """Runs the passes over an acquired trace and execs the result: the entry's callable, its
    source and traces, and the time each stage took. ``modes`` are the grad and autocast modes
    the program was traced under, which the call runs in; ``passes`` the jit's own registered
    passes; ``executors`` the jit's executors (the defaults when None); ``names`` ``(the user's
    name of each flat input, the module's qualified parameter names)`` name the traces' inputs."""
    start = time.perf_counter()
    made = _made_by_the_call(acquired)
    executors = _executors_for(acquired, default_executors() if executors is None else executors, made)
    table, impls = executor_table(executors)
    compiled = _compiled(acquired, table, executors, passes)
    traces, backward_traces, grad_positions = compiled.forward, compiled.backward, compiled.grad_outputs
    log_dumps(name, traces, backward_traces)
    passes_at = time.perf_counter()
    namespace = {"torch": torch, "math": math, **impls}
    namespace.update((f"_c{i}", c) for i, c in enumerate(acquired.consts))
    if names is not None:
        traces = _named_inputs(traces, acquired, names, {*namespace, *(r.name for r in traces[-1].regions())})
    filename = f"<thunder_rs {name}>"
    fuse_at = time.perf_counter()
    # (the write-backs skip the copies of what the regions may write: ``_called``'s)
    writes, acquired.writebacks = region_writes(traces[-1], acquired.writebacks, bool(backward_traces), executors)
    regions = _fused_regions(traces[-1], filename, namespace, executors, writes)
    if backward_traces:
        backward_regions = _fused_regions(backward_traces[-1], filename + " backward", namespace, executors)
    fuse_s = time.perf_counter() - fuse_at
    source, computation = _load(traces[-1], "computation", filename, namespace, regions)
    wb = acquired.writebacks
    if acquired.out_versions:  # (outputs in memory the program wrote: eager's versions, before residuals keep theirs)
        single = acquired.out_kind == "single" and wb is None
        computation = _WRITEBACK.load().with_versions(computation, acquired.out_versions, single, bool(backward_traces))
    if backward_traces:
        backward = _whole_backward(backward_traces[-1], filename, namespace, backward_regions, len(grad_positions))
        program = _differentiable_program(acquired, filename, grad_positions, traces[-1])
        partial = _partial_backward(acquired, grad_positions, (passes, executors, namespace, filename))
        partial["unread"] = _unread(acquired)
        partial["stale"], partial["made"] = _stale(acquired, grad_positions), _made(acquired, grad_positions)
        partial["inner"], partial["ranks"] = _inner_outputs(acquired, grad_positions), acquired.output_vids
        partial["viewable"] = viewable_outputs(traces[-1], impls)
        partial["landing"] = bool(acquired.checkpoints)
        partial["unread_cotangents"] = _unread_cotangents(backward_traces[-1], grad_positions)
        if wb is None:
            computation = grad_function(
                computation,
                backward,
                grad_positions,
                acquired.out_kind == "single",
                acquired.out_kind == "list",
                program=program,
                **partial,
            )
        else:
            counts = dict(wb.versions)
            nondiff, written = wb.non_differentiable, tuple((k, j, counts.get(k, 1)) for k, j, _ in wb.copies)
            computation = grad_function(
                computation, backward, grad_positions, False, False, nondiff, written, program=program, **partial
            )
        computation = detaching(computation, acquired.detached)
    if acquired.leaf_outputs:  # (no input requires grad: a backward above reaches none)
        single = acquired.out_kind == "single" and wb is None
        computation = through_inner_leaves(computation, acquired.leaf_outputs, single)
    # The call traced returns the outputs its reads computed, where they are the program's own:
    # no gradient to record, no pass of the jit's that the reads' snapshots did not run. (Taken
    # off ``acquired``, which closures keep: its tensors live until that call only.)
    # (no first outputs where the call makes effects tracing's runs did not: ``CALL_EFFECTS``)
    first = acquired.first if not (backward_traces or passes or acquired.leaf_outputs or made) else None
    first = None if acquired.out_versions else first  # (its tensors' versions are the reads' runs')
    acquired.first = None
    if first is not None:
        first = _called(first.wrap(computation), acquired, modes, False)
    computation = _called(computation, acquired, modes, bool(backward_traces or acquired.leaf_outputs))
    end = time.perf_counter()
    stages = {"passes": passes_at - start, "codegen": end - passes_at - fuse_s, "fuse": fuse_s}
    return computation, first, source, filename, traces, backward_traces, stages


def _called(computation, acquired, modes: RecordedModes, differentiable: bool):
    """The entry's callable around ``computation`` (its trace's function, or its autograd
    function when ``differentiable``): the recorded modes, write-backs, output views, sizes and
    captured inputs; checked values abandon the call (``values.abandonable``)."""
    if acquired.reads:
        computation = abandonable(computation, acquired.consts)
    computation = modes.call(computation, differentiable, acquired.trace)
    if acquired.writebacks is not None:
        computation = _WRITEBACK.load().with_writebacks(computation, acquired.writebacks)
    if acquired.views is not None:
        computation = _OUTPUT_VIEWS.load().with_views(computation, acquired.views)
    if acquired.cached_casts:  # (read as the call begins, under the caller's modes)
        computation = with_cached_casts(computation, acquired.cached_casts)
    captured = tuple(acquired.captured) if acquired.tail is None else ()
    if acquired.sizes:
        readers = size_readers(acquired.sizes, acquired.tensor_positions)
        return with_sizes(computation, readers, captured, len(acquired.ints), len(acquired.floats))
    return _with_captured(computation, captured) if captured else computation
