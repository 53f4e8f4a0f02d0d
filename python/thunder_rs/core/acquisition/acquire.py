"""Acquisition: run a function (or module) on proxies and record its trace, the guards on the
Python state it read, and the module state it wrote."""

import contextlib
import dataclasses
import functools
import inspect
import sys
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from thunder_rs import _core
from thunder_rs.core.acquisition.argument_containers import TracedContainers, state_held
from thunder_rs.core.acquisition.written_only import unprojected, write_logs
from thunder_rs.core.acquisition.cache import input_names
from thunder_rs.core.acquisition.failed_state import note_attributes_made, note_made_before_error, put_back_refused
from thunder_rs.core.acquisition.failed_state import note_tensors_written
from thunder_rs.core.acquisition.cuda_queue import refuse_escaped_events, refuse_switched_writes, stream_switch_site
from thunder_rs.core.acquisition.effects import (
    attribute_writes,
    item_writes,
    print_effects,
    recording_prints,
    stop_recording_prints,
)
from thunder_rs.core.acquisition.dynamic import ArgInt, HeldInt
from thunder_rs.core.acquisition.dynamic import leaf_paths
from thunder_rs.core.acquisition.escapes import check_no_escape
from thunder_rs.core.state.fsdp import refuse_dtensors
from thunder_rs.core.acquisition.setters import note_settings_made
from thunder_rs.core.base.userframe import program_entry, read_site, store_site
from thunder_rs.core.state.guards import CellSource, ModuleSource
from thunder_rs.core.state.items import DICTS, changes_in_place
from thunder_rs.core.lang.langctx import LanguageMode, refusals_not_swallowed, torch_symbol
from thunder_rs.core.state.mode_writes import ModeWrites
from thunder_rs.core.state.modules import ModuleBinding
from thunder_rs.core.state.captured_modules import CapturedModules, argument_modules
from thunder_rs.core.state.modules import attribute_writes as module_writes, changed_meanwhile, hook_changes
from thunder_rs.core.state.modules import registered_slots
from thunder_rs.core.state.modules import restore_hook_stores
from thunder_rs.core.lang.tensor_hooks import noting_input_hooks
from thunder_rs.core.lang import autocast, inner_leaves
from thunder_rs.core.lang.dual_tensors import refuse_returned_duals
from thunder_rs.core.state.observe import Observer
from thunder_rs.core.acquisition.outputs import as_written, flatten_output, is_plain, is_size
from thunder_rs.core.acquisition.returned_identities import Identities, origins, places
from thunder_rs.core.acquisition.returned_objects import made_objects, program_site
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.base.trees import tree_leaves, tree_map
from thunder_rs.core.state.pydraws import recording_draws
from thunder_rs.core.state.aliases import alias_guards
from thunder_rs.core.state.bystanders import checked_by_the_next_call, kept_apart, track
from thunder_rs.core.state.reached import ArgumentObjects, captured_inputs
from thunder_rs.core.lang.inference import inference_outputs
from thunder_rs.core.lang.recorder import INFERENCE_MADE, Captures, input_proxy, recording
from thunder_rs.core.lang.regrown import regrowing
from thunder_rs.core.lang import saved_outputs, version_tracking
from thunder_rs.core.acquisition.stdlib_state import consuming_iterators
from thunder_rs.core.acquisition.stdlib_state import install as install_stdlib_wrappers
from thunder_rs.core.lang.torch_overrides import noting_checkpoints, tracing_overrides
from thunder_rs.core.lang.snapshots import FirstOutputs
from thunder_rs.core.lang.values import ValueReads, reading
from thunder_rs.core.acquisition.output_views import OutputViews, own_outputs, plan_views
from thunder_rs.core.acquisition.writeback import WriteBacks, eager_versions, plan
from thunder_rs.core.acquisition.traced_inputs import (
    SizeInputs,
    TracedInputs,
    input_leaves,
    int_stand_ins,
    module_stand_ins,
    kept_slots,
    put_back,
    put_stand_ins,
    refuse_uninitialized,
)
from thunder_rs.errors import ThunderError, ThunderNotImplementedError


@dataclass
class Acquired:
    trace: "_core.Trace"
    consts: list
    #: positions in the flat inputs of the leaves that are trace inputs (tensors)
    tensor_positions: tuple[int, ...]
    #: how to rebuild the output structure from the flat outputs (``out_spec.unflatten(flat)``),
    #: or None when returned as is
    out_spec: object
    #: what the trace returns: "single" (one leaf), "tuple" or "list" (of leaves)
    out_kind: str
    #: tensors read from outside the inputs: the trace's last inputs, in this order (those that
    #: argument objects hold are read per call: see ``tail``)
    captured: list
    #: the Python values the trace was specialised on
    guards: list = field(default_factory=list)
    #: what every call repeats after running (``print`` calls, module attribute writes); the
    #: tensors they take are the trace's outputs after the program's ``num_outputs`` flat outputs
    effects: list = field(default_factory=list)
    num_outputs: int = 0
    #: modules (the user's) whose methods ran: their hooks are part of what a call does
    modules_called: list = field(default_factory=list)
    #: tensor inputs the program wrote and what the call copies back, or None
    writebacks: WriteBacks | None = None
    #: ``tail(flat)``: the trace's captured inputs for a call, in order, when some are tensors that
    #: argument objects hold (``reached.captured_inputs``); None when ``captured`` are all of them
    tail: object = None
    #: the values the program read from traced tensors (``values.Read``), in order: the trace
    #: checks each and is specialised on them
    reads: list = field(default_factory=list)
    #: where each symbolic size is read, in the order of the trace's size inputs (its last):
    #: ``(flat input position, dim)`` or a ``dynamic.HeldDim``; empty for a trace of constant sizes
    sizes: list = field(default_factory=list)
    #: the other places that hold a size input's value (duck sizing): ``(where, its index)``
    shared_sizes: list = field(default_factory=list)
    #: ``check(env)`` callables the symbolic entry also passes (``observe.check_sizes``)
    size_checks: list = field(default_factory=list)
    #: the ints argument objects hold that are sizes (``dynamic.HeldInt``): ``tail`` reads them last
    ints: tuple = ()
    #: where the program took the decision each guard of the trace records, ``{guard text:
    #: (file, line, function, op)}`` (``langctx.decision_site``), which miss reasons name
    decided: dict = field(default_factory=dict)
    #: the positions of the trace inputs standing for views no op records a gradient through
    #: (``TensorProxy._view_grad``), which a differentiable call passes detached
    detached: tuple = ()
    #: program outputs the call takes as views of others after running (``output_views``), or None
    views: OutputViews | None = None
    #: the outputs of the call traced, where its reads computed them (``snapshots.FirstOutputs``):
    #: its compiled call returns them rather than running the program again; or None
    first: FirstOutputs | None = None
    #: the positions among the program's output leaves of tensors eager returns as inference tensors
    #: it made (under ``torch.inference_mode()`` inside the program): the call makes them so
    inference_outputs: tuple = ()
    #: hooks the forward registered on the user's modules and left, or removed (``modules.hook_changes``):
    #: made once the entry is made
    hook_changes: list = field(default_factory=list)
    #: the stand-ins of the generator arguments (``generator_inputs.StandIns``), or None
    stand_ins: object = None
    #: the ids of the generators the recorded backwards draw from (``recorder.backward_draws``)
    backward_draws: frozenset = frozenset()
    #: the float arguments the trace takes as inputs, its very last (``float_args``): ``(ArgFloat,
    #: value id)`` each, in order; ``tail`` reads them after the ints
    floats: tuple = ()
    #: ``(error, value ids)`` per call whose saved tensors the program wrote in place: the error
    #: eager's backward raises once it reaches those values (``version_tracking``)
    stale_saves: tuple = ()
    #: where the program made leaves (``inner_leaves``), the positions of the trace's outputs that
    #: require grad: those that a call returns requiring none get a backward (``through_inner_leaves``)
    leaf_outputs: tuple = ()
    #: per flat output position, a tensor the program made (``saved_outputs.OutputMade``): the node and
    #: version eager's error names where the caller writes it before the backward
    made_outputs: dict = field(default_factory=dict)
    #: per flat output position, its value id in the trace (None: not a traced value)
    output_vids: tuple = ()
    #: the reentrant activation checkpoints the program ran with grad (``torch_overrides.noting_checkpoints``)
    checkpoints: tuple = ()
    #: the non-reentrant activation checkpoints it ran, ``(first value id, end value id)`` each, whose
    #: calls the backward runs again (``torch_overrides.NonReentrantRegion``)
    recomputed: tuple = ()
    #: the lists and dicts of state the program read, where it changes one or an argument's, that
    #: no call may pass as an argument (``argument_containers.state_held``), or None
    state_aliases: tuple | None = None
    #: the casts torch's autocast cache holds that the trace takes as inputs (``Captures.cast_positions``)
    cached_casts: tuple = ()
    #: ``(flat output position, version)`` of the trace's outputs in memory the program wrote in place,
    #: given eager's version as the call returns them (``writeback.eager_versions``)
    out_versions: tuple = ()


def _reject_generators(fn, out) -> None:
    if inspect.isgenerator(out) or inspect.iscoroutine(out) or inspect.isasyncgen(out):
        raise ThunderNotImplementedError(
            f"thunder_rs.jit: {getattr(fn, '__qualname__', fn)} returns a {type(out).__name__}; its body runs "
            "only as it is iterated, after the call, so it cannot be traced. Jit the function that consumes it"
        )


def _tensor_positions(flat_inputs) -> list:
    """The positions of the flat inputs that are tensors, each tensor at its first: one tensor
    passed at several places is one input of the trace, as it is one tensor in eager (``query is
    key``; a write through one place is seen through the other). ``cache.tensor_aliases`` keys it."""
    first: dict = {}
    return [i for i, x in enumerate(flat_inputs) if isinstance(x, torch.Tensor) and first.setdefault(id(x), i) == i]


_push_hooks = torch._C._autograd._push_saved_tensors_default_hooks
_pop_hooks = torch._C._autograd._pop_saved_tensors_default_hooks


def _unchanged(t):
    return t


@contextlib.contextmanager
def _saved_tensors_hooks_unseen():
    """The user's ``saved_tensors_hooks`` (``save_on_cpu``) do not see what tracing saves: the meta
    and fake stand-ins the metadata of fallbacks and opaque ops come from, run under autograd. The
    saved-tensor hooks apply the innermost pair only, so plain ones are pushed over the user's; the
    compiled call's residuals are packed by the user's, as eager's saved tensors are, on every call
    (the first included). Nothing is pushed where no hooks are active or torch disabled them."""
    if _top_hooks(False) is None or not _hooks_enabled():
        yield
        return
    _push_hooks(_unchanged, _unchanged)
    try:
        yield
    finally:
        _pop_hooks()


_top_hooks = torch._C._autograd._top_saved_tensors_default_hooks
_hooks_enabled = torch._C._autograd._saved_tensors_hooks_is_enabled  # type: ignore[attr-defined]


def _trace_program(
    fn, flat_inputs, in_spec, rec, captures, made, binding, whole, reached: ArgumentObjects, reads, size_inputs
):
    """Runs the program on proxies. Returns its output, the observer of what it read, the
    attributes it set on modules and state objects (``(holder, name, value)``, undone), the
    ``print`` calls, draws from Python's and NumPy's generators and items set in containers of
    the arguments (effects to repeat), and the positions of the flat inputs that are tensors.
    ``reached`` are the objects reachable from the arguments; ``reads`` answers reads of values;
    ``size_inputs`` makes the symbolic sizes (``SizeInputs``)."""
    positions = _tensor_positions(flat_inputs)
    # No proxy made under inference mode yet (``inference.check_call``), but an argument object may hold an
    # inference tensor, which a call may take before it is a proxy.
    INFERENCE_MADE[0] = any(held.meta[5] for held in reached.tensors.values())
    prints: list = []
    draws: list = []
    token = recording_prints(prints)
    install_stdlib_wrappers()
    try:
        with (
            refusals_not_swallowed(),
            recording_draws(draws),
            kept_apart(),
            consuming_iterators(flat_inputs),
            recording(rec, captures, made, whole),
            regrowing(),
            CapturedModules(fn if binding is None else None) as captured,
            _saved_tensors_hooks_unseen(),
            reading(reads),
            noting_input_hooks(prints),
            inner_leaves.noting() as leaves,
            autocast.caching_casts(),
        ):
            out, observer, pairs, inputs = _run_on_proxies(
                fn, flat_inputs, in_spec, rec, positions, binding, reached, size_inputs, captures, captured
            )
            hooks = hook_changes(pairs)  # (first: it puts the user's hook stores back)
            observer.refuse_consumed_iterators()
            observer.refuse_unread_global_stores()
            writes = module_writes(pairs) + observer.state.writes() + observer.mode_writes_made
            writes += captured.writes(observer.state)
            stored_writes, inputs.modules = writes, {id(c): o for c, o in pairs}
            inputs.registered = registered_slots(writes, pairs)
            observer.state.interrupted.update(changed_meanwhile(pairs))
            # Tensors the program created from Python values (``torch.tensor(0.)``) and returns or
            # keeps: a copy per call, as eager makes them anew.
            # An argument object's tensor returned or stored as it is (``return box.t``, ``self.last =
            # box.t``) is the call's (``_held``), not the one the trace saw.
            out = _held(_fresh(out, captures), reached, captures)
            out = _apart(out, inputs.args + inputs.params + captures.proxies)
            # What every call writes again or prints holds sizes as that call's (``TracedValue``).
            writes = [
                (holder, name, _fresh(_held(value, reached, captures), captures)) for holder, name, value in writes
            ]
            items = [
                (source, key, _fresh(_held(value, reached, captures), captures))
                for source, key, value in _item_writes(reached, observer) + inputs.argument_writes
            ]
            inputs.places = places(stored_writes, reached.sources(), inputs.made_objects or (), items)
            stored = [w[2] for w in writes] + [i[2] for i in items]
            refuse_escaped_events(out, stored)
            switched = stream_switch_site()
            kept = inputs.args + inputs.params + captures.proxies  # (what the call writes into them)
            refuse_returned_duals(rec, [*tree_leaves((out, stored)), *kept])
            through_leaves = inner_leaves.refuse_unkept(leaves, out, stored)
    except BaseException as e:
        note_settings_made(e, prints)
        raise
    finally:
        stop_recording_prints(token)
    _reject_generators(fn, out)
    facts = (inference_outputs(out), hooks, (through_leaves, switched))
    return out, observer, writes, (prints, draws, items), inputs, facts


def _item_writes(reached: ArgumentObjects, observer: Observer) -> list:
    """The items the program set in lists and dicts of its arguments, then in those of lasting
    state (module attributes, globals: a cache), all undone here, also when one is refused."""
    try:
        items = reached.item_writes()
    except BaseException:
        observer.state.containers.undo()
        raise
    return items + observer.state.containers.writes()


def _apart(out, inputs: list):
    """``out`` with a copy made for each returned tensor that eager returns as new memory but the
    trace computed nothing for: a value an input or an earlier output already holds, in a proxy
    that is neither that tensor nor a view of it (``x.t().contiguous()``, ``torch.empty_like(x)
    .copy_(x)``, ``F.pad(x, (0, 0))``). Writing to it must not change the input."""
    leaves, spec = tree_flatten(out, is_leaf=is_size)
    holders = {p._vid: p for p in inputs}
    # An input returned is the caller's tensor (``writeback.plan``), also when a write made it
    # hold another input's value (``x.copy_(y); return x``).
    own = {id(p) for p in inputs}
    changed = False
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, TensorProxy) or id(leaf) in own:
            continue
        holder = holders.setdefault(leaf._vid, leaf)
        if leaf._copy_of:  # ``contiguous()`` of a view, which must come back contiguous
            leaves[i] = torch_symbol(torch.clone)(leaf, memory_format=torch.contiguous_format)
        elif holder is not leaf and leaf._view is None:
            leaves[i] = torch_symbol(torch.clone)(leaf)
        else:
            continue
        holders[leaves[i]._vid] = leaves[i]
        changed = True
    return tree_unflatten(leaves, spec) if changed else out


def _held(value, reached: ArgumentObjects, captures: Captures):
    """``value`` with the argument objects' tensors read per call as their proxies: a list that
    keeps such a tensor, set again by every call, holds that call's tensor."""

    def proxy(leaf):
        return captures.proxy(leaf) if isinstance(leaf, torch.Tensor) and id(leaf) in reached.tensors else leaf

    return tree_map(proxy, value, is_leaf=is_size)


def _fresh(value, captures: Captures):
    return tree_map(lambda leaf: captures.proxy(leaf) if captures.is_created(leaf) else leaf, value, is_leaf=is_size)


@program_entry
def _run_on_proxies(fn, flat_inputs, in_spec, rec, positions, binding, reached, size_inputs, captures, captured):
    """Runs the program on proxies (while recording); returns its output, the observer of its reads, the
    ``(clone, original)`` modules it ran and its ``TracedInputs``. (``captured``: ``CapturedModules``.)"""
    program, leaves = fn, input_leaves(rec, flat_inputs, positions, size_inputs)
    pairs, params, slots = [], [], []
    if binding is not None:
        refuse_dtensors(binding.qualified, binding.tensors())
        refuse_uninitialized(binding.qualified, binding.tensors())
        params = [input_proxy(rec, t) for t in binding.tensors()]
        for t, p in zip(binding.tensors(), params):
            captures.alias(t, p)
        clone, pairs = binding.clone(params)
        # The module's own call (hooks, forward): calling the clone would go through the
        # ``_compiled_call_impl`` it copied from the user's module (``compile_module``, or a jitted
        # module's ``generate``), which leads back to the jit.
        fn = clone._call_impl
        slots = [
            (o.__dict__[s], n, c.__dict__[s], v)
            for c, o in pairs
            for s in ("_parameters", "_buffers")
            for n, v in c.__dict__[s].items()
        ]
    inputs = TracedInputs(positions, [leaves[i] for i in positions], params, slots)
    logs = write_logs(flat_inputs, leaves)  # (containers the program only writes into)
    args, kwargs = tree_unflatten(leaves, in_spec)
    program_args, program_kwargs, projected = unprojected(args, kwargs, flat_inputs)
    containers = TracedContainers(program_args, program_kwargs, _argument_names(program)[1], logs, projected)
    observer = Observer(flat_inputs, {id(c): o for c, o in pairs}, (fn,), reached)
    observer.captured_found = captured.found
    track(observer, pairs)  # what collections and signal handlers change there is not the program's
    # After the observer noted the argument objects' attributes: what the call found.
    placed = put_stand_ins(reached, captures, size_inputs, len(positions) + len(params))
    held_attributes = module_stand_ins(captures, size_inputs, pairs, len(positions) + len(params))
    observer.module_stand_ins({id(at.stand_in): at for _, at, _ in held_attributes})
    placed += held_attributes
    run_on_themselves = [(m, m) for m in (*captured.modules, *argument_modules(flat_inputs))]
    ints = int_stand_ins(reached, size_inputs, pairs + run_on_themselves)
    observer.state.symbolic_ints = {(id(attributes), p.name): type(v) for attributes, p, v in ints}
    observer.sizes_symbolic = bool(size_inputs.flat or size_inputs.held or size_inputs.float_positions or ints)
    observer.guard_module_ints([(p.source, p.name, type(v)) for _, p, v in ints if type(p.source) is ModuleSource])
    placed += ints
    observer.mode_writes = modes = ModeWrites({id(c) for c, _ in pairs})
    try:
        with observer, modes, tracing_overrides(), LanguageMode():
            observer.observe_statically(fn, [c for c, _ in pairs])
            box = [fn(*program_args, **program_kwargs)]  # (held by nothing else: ``made_objects`` counts references)
        observer.mode_writes_made = modes.undo()  # (the last mode set: written again by every call)
        stored = _stored_values(pairs) + observer.state.stored_values()
        inputs.made_objects = made_objects(box, program_site(_argument_names(program)[0]), stored)
        out = inputs.returned = box.pop()
        refuse = functools.partial(_refuse_argument_write, program)
        # (The writes into write-only lists first: each at the list the call had there.)
        inputs.argument_writes = containers.logged(refuse) + containers.changes(refuse)
        out, inputs.argument_copies = containers.returned(out), containers.copies()
        with containers.as_before():  # (their changes made again by every call)
            _check_arguments_unchanged(program, args, kwargs, leaves, in_spec)
        reached.refuse_changed_in_place()
    except BaseException as e:
        note_made_before_error(e, observer.state.containers.places(), reached, containers)
        modes.undo()
        put_back(placed, failed=True)
        restore_hook_stores(pairs)
        # A failed trace leaves the state as it found it: no stand-in in a cache it filled.
        note_attributes_made(e, observer.state.writes(), pairs, flat_inputs)
        note_tensors_written(e, inputs, binding, _argument_names(program)[1], in_spec, captures)
        observer.state.containers.undo()
        reached.undo()
        raise
    put_back(placed)
    return out, observer, pairs, inputs


def _stored_values(pairs: list) -> list:
    """The values the forward set on its modules (in their clones' instance dicts), for ``made_objects``;
    none where it changed what they hold (refused after tracing)."""
    try:
        return [value for _, _, value in module_writes(pairs)]
    except ThunderNotImplementedError:
        return []


def _check_arguments_unchanged(program, args, kwargs, leaves: list, in_spec) -> None:
    """Refuses a program that changed a list or dict it was given (``metrics["aux"] = loss``,
    ``cache.append(k)``): tracing ran it on copies of the caller's containers, and no compiled
    call would change them again. The error names the argument and the line that changed it."""
    now = tree_leaves((args, kwargs))  # (not the spec: torch's pytree rebuilds a torch.Size as a tuple)
    if len(now) != len(leaves) or any(a is not b for a, b in zip(now, leaves)):
        raise ThunderNotImplementedError(
            f"thunder_rs.jit: the traced program changed a list or dict it was given as an argument"
            f"{_changed_argument(program, args, kwargs, leaves, in_spec)} (set, added or removed an item: "
            "metrics['aux'] = loss, cache.append(k)); a compiled call would not change it again. Return the values "
            "instead"
        )


def _argument_names(program) -> tuple:
    """The code of ``program`` (a module's ``forward``), or None, and its positional parameters' names."""
    target = program.forward if isinstance(program, torch.nn.Module) else program
    code = getattr(getattr(target, "__func__", target), "__code__", None)
    names = list(code.co_varnames[int(hasattr(target, "__self__")) : code.co_argcount]) if code is not None else []
    return code, names


def _refuse_argument_write(program, container, path: tuple, why: str) -> None:
    """Refuses a change of ``container``, at ``path`` of the arguments, that no compiled call can
    make again (``argument_containers``): ``why``, naming the argument and the line."""
    code, names = _argument_names(program)
    name = path[1] if path[0] == 1 else names[path[1]] if path[1] < len(names) else None
    where = ""
    if name is not None:
        steps = "".join(f"[{step!r}]" for step in path[2:])
        site = f" at {store_site(f'{code.co_filename}:{code.co_firstlineno}', name, held=True)}" if code else ""
        where = f", the {type(container).__name__} {name}{steps}{site}"
    raise ThunderNotImplementedError(
        f"thunder_rs.jit: the traced program changed a list or dict it was given as an argument{where}: {why}; "
        "a compiled call cannot make that change again. Store plain values or tensors there, or return the values "
        "instead"
    )


def _changed_argument(program, args, kwargs, leaves: list, in_spec) -> str:
    """``, the <type> <name> at <file:line>`` for the first argument of ``program`` whose leaves
    changed (``leaves``, flattened by ``in_spec``: the call's), the line found in its code."""
    target = program.forward if isinstance(program, torch.nn.Module) else program
    code = getattr(getattr(target, "__func__", target), "__code__", None)
    arg_specs, kwarg_spec = in_spec.children()
    names = list(code.co_varnames[int(hasattr(target, "__self__")) : code.co_argcount]) if code is not None else []
    places = [(names[i] if i < len(names) else None, a, s) for i, (a, s) in enumerate(zip(args, arg_specs.children()))]
    places += [(k, kwargs.get(k), s) for k, s in zip(kwarg_spec.context, kwarg_spec.children())]
    start = 0
    for name, value, spec in places:
        found, before = tree_leaves(value), leaves[start : start + spec.num_leaves]
        start += spec.num_leaves
        if len(found) != len(before) or any(a is not b for a, b in zip(found, before)):
            if name is None or code is None:
                return ""
            site = store_site(f"{code.co_filename}:{code.co_firstlineno}", name, held=True)
            return f", the {type(value).__name__} {name} at {site}"
    return ""


def _reading_line(guard) -> str:
    """Where the program read what ``guard`` guards: a read found in a function's code (its
    ``origin`` the function's first line) is named at its own line."""
    source, name = getattr(guard, "source", None), getattr(guard, "name", None)
    return read_site(guard.origin, source.label if type(source) is CellSource else name)


def _unreplayed(changed, holder=None) -> str:
    """Why a change of ``changed`` (an attribute of ``holder``) cannot be made again, and what to do instead."""
    if changes_in_place(changed) and type(changed) is not list and type(changed) not in DICTS:
        return (
            f"A compiled call makes the program's changes again in lists and dicts (a Counter, defaultdict or "
            f"OrderedDict too), not in a {type(changed).__name__}: keep such state in a list or dict, or change it "
            "outside the jitted function"
        )
    if isinstance(holder, torch.nn.Module) and not changes_in_place(changed):  # (one only a helper captured)
        return (
            f"A compiled call repeats the attribute writes of the module it jits, not of a {type(holder).__name__} "
            "the function captured or reached: jit the module itself (thunder_rs.jit(model)) or pass the module as an "
            "argument, return the value instead, or set the attribute outside the jitted function"
        )
    return (
        "Writes to Python objects other than the jitted module's attributes cannot be replayed; keep such state in "
        "a module attribute or a buffer"
    )


def _check_guards_still_hold(guards, flat_inputs, interrupted: set) -> list:
    """A program that changed Python state it read while being traced other than by setting
    attributes (``calls.append(1)``, ``global n; n += 1``) would, compiled, not change it again:
    refuse it. (Attribute writes were undone after tracing and are repeated by every call; those
    code other than the program made, ``interrupted``, leave the guard to fail on the next call:
    ``guards`` with those checked on every call.)"""
    kept = []
    for guard in guards:
        if not guard.holds(flat_inputs):
            rechecked = checked_by_the_next_call(guard, interrupted)
            if rechecked is None:
                guard.origin = _reading_line(guard)
                refused = ThunderNotImplementedError(
                    f"thunder_rs.jit: the traced program changed Python state it read: {guard.describe(flat_inputs)}. "
                    + _unreplayed(
                        getattr(guard, "expected", None), getattr(getattr(guard, "source", None), "obj", None)
                    )
                )
                put_back_refused(guards, flat_inputs)
                raise refused
            guard = rechecked
        kept.append(guard)
    return kept


def _finish(rec, out, writes, repeated, flat_inputs, inputs: TracedInputs, captured: list, kept: dict, reads, made):
    """Ends the recording with the program's outputs, then the tensors it printed or set as
    attributes, then the tensor inputs it wrote (``writeback``). Returns the trace, how to rebuild
    the outputs, the effects to repeat after each call (prints in order, draws in order, then
    attribute writes, then item writes), the write-backs, the output views and the outputs of the
    call traced where its reads computed them (``ValueReads.first_outputs``). ``repeated`` is
    ``(prints, draws, items)``; ``kept`` the captured tensors by the id of their proxies. With
    ``through_leaves`` (``inner_leaves``), also the positions of the outputs that require grad. ``made``:
    ``(through_leaves, where the program entered a stream, saved_outputs.outputs_made's answer,
    SavedVersions.writes)``; the third by output position."""
    through_leaves, switched, outputs_made, writes_of = made
    try:
        with recording(rec):  # (a float of sizes read as a value specialises them: ``SizesFloat.of``)
            writebacks, views, outputs, out_spec, out_kind, effects, num_outputs = _planned(
                rec, out, writes, repeated, flat_inputs, inputs, captured, kept, writes_of
            )
        refuse_switched_writes(switched, writebacks)
        first = None if reads is None else reads.first_outputs(rec, outputs)
    finally:
        if reads is not None:
            reads.snapshots.forget()
    leaf_outputs = inner_leaves.grad_outputs(outputs) if through_leaves else ()
    vids = [getattr(o, "_vid", None) for o in (outputs if type(outputs) in (tuple, list) else (outputs,))]
    made_outputs = {k: outputs_made[v] for k, v in enumerate(vids) if v in outputs_made}
    own = {j for _, j in views.own} if views is not None else ()  # (the roots' versions are theirs)
    versions = eager_versions(outputs if type(outputs) in (tuple, list) else (outputs,), writes_of, own)
    finished = rec.finish(outputs)
    planned = (writebacks, views, first, leaf_outputs, made_outputs, versions, tuple(vids))
    return finished, out_spec, out_kind, effects, num_outputs, planned


def _planned(rec, out, writes, repeated, flat_inputs, inputs: TracedInputs, captured: list, kept: dict, writes_of):
    """``_finish``'s plan: the write-backs and output views, and the recording's outputs."""
    extras: list = []
    prints, draws, items = repeated
    effects = print_effects(prints, extras) + draws
    made, copies = inputs.made_objects, inputs.argument_copies
    stored = Identities({}, {}, made, copies, inputs.modules)  # (what made objects stored hold: as found)
    effects += attribute_writes(writes, extras, kept, stored) + item_writes(items, extras, kept)
    out_spec, num_outputs = None, 0
    known = made is not None  # (else every container is rebuilt, as torch's pytree rebuilds them)
    ids = (origins(out, inputs.returned), inputs.places) if known else ({}, {})
    identities = Identities(*ids, made, copies, inputs.modules)
    if effects or not is_plain(out) or identities.special(out):
        out, out_spec = flatten_output(out, flat_inputs, made, copies, identities)
        num_outputs = len(out)
    traced = inputs.args + inputs.params + captured
    sizes = tuple(f"t{size.values()[0]}" for size in rec.size_inputs())
    views, out, own = plan_views(out, _kind(out), traced, sizes, rec.is_read)
    if extras:
        out = (*out, *extras)
    views, out = own_outputs(views, out, own)
    out_kind = _kind(out)
    n_args, n_traced = len(inputs.args), len(traced)
    separate = (*range(n_args), *range(n_traced - len(captured), n_traced))
    module = (n_args, n_args + len(inputs.params))
    writebacks, outputs = plan(traced, inputs.slot_values(), out, out_kind, separate, sizes, module, writes_of)
    return writebacks, views, outputs, out_spec, out_kind, effects, num_outputs


def _kind(out) -> str:
    return "tuple" if type(out) is tuple else "list" if type(out) is list else "single"


def _observed_guards(observer, captures: Captures, reached: ArgumentObjects, stored_values: list) -> list:
    """The guards of what the traced program read (``observer``), with the captured tensors read
    per call and the aliasing of argument objects. A captured tensor the program also stores
    (``stored_values``) is stored as itself (``kept``): captured, not read per call; so is one it
    returns as it is, the trace's constant (eager returns what the state holds then)."""
    stored = {id(leaf) for leaf in tree_leaves(stored_values)}
    kept_as_is = [id(p) in stored or id(t) in stored for p, t in zip(captures.proxies, captures.tensors)]
    observer.read_cached_per_call(captures.tensors, kept_as_is)
    observer.guard_argument_tensors(captures.tensors)
    guards = observer.guards()
    return guards + alias_guards(reached, observer.state.written_ids, guards) + reached.item_guards()


def _kept_tensors(captures: Captures, inputs) -> dict:
    """A captured tensor the program stores as it is (``self.cells = [c.to(dtype) for c in
    self.cells]``) is stored by every call as that same object, as eager stores it. So is a parameter
    or buffer of the module (nn.LSTM's ``_flat_weights``, rebuilt from its parameters on a call that
    finds them changed): storing a copy would change it on every call."""
    kept = {id(p): t for p, t in zip(captures.proxies, captures.tensors) if isinstance(t, torch.Tensor)}
    kept.update(kept_slots(inputs.slots))
    return kept


def _observed_facts(observer, inputs, items: list, reached: ArgumentObjects) -> tuple:
    """The modules called, size checks, container sites and interruption the observer saw while tracing,
    and the lists and dicts of state it read, or argument objects hold, that no call may pass as an
    argument (``state_held``: ``inputs`` the trace's, ``items`` the item writes it made)."""
    state = observer.state
    aliases = state_held(state.containers.lasting(), inputs, items, reached.containers)
    return (
        list(observer.modules_called.values()),
        observer.size_checks,
        state.containers.sites(),
        state.interrupted,
        aliases,
    )


def _placed(stale_saves, traced: tuple, captures: Captures) -> tuple:
    """Tells each stale save the trace input whose version eager's error counts from; returns the
    positions of the trace inputs no gradient is recorded through (``TensorProxy._view_grad``)
    and of the autocast casts taken as inputs (``Captures.cast_positions``)."""
    for stale, _ in stale_saves:
        stale.place({p._input_vid: k for k, p in enumerate(traced)})
    return tuple(k for k, p in enumerate(traced) if p._view_grad is False), captures.cast_positions(traced)


def acquire(
    fn,
    flat_inputs: list,
    in_spec,
    binding: ModuleBinding | None = None,
    whole: dict | None = None,
    reads: ValueReads | None = None,
    sizes: tuple = (),
    held: dict | None = None,
    floats: tuple = (),
) -> Acquired:
    """Traces ``fn(*args, **kwargs)`` rebuilt from ``flat_inputs``. For a module, ``binding``'s parameters
    and buffers become trace inputs after the flat inputs, one per distinct tensor; captured tensors come
    last. ``whole`` (``extend.whole_runners``) lets kernels the jit's executors run whole be recorded
    without their decompositions. ``reads`` answers the reads of traced tensors' values (without it they
    are refused). ``sizes`` are the ``(flat position, dim)`` of the tensor inputs' sizes to trace as
    symbolic, ``held`` the dims of argument objects' tensors (``{(source key, name): dims}``; ``dynamic``);
    ``floats`` the positions of the float arguments to take as inputs (``float_args``)."""
    rec = _core.Recorder()
    made: list = []
    reached = ArgumentObjects(flat_inputs, input_names(fn, flat_inputs, in_spec))
    captures = Captures(rec, reached.tensors)
    size_inputs = SizeInputs(rec, sizes, held, leaf_paths(in_spec) if sizes else None, floats)
    out, observer, writes, repeated, inputs, (inference, hooks, traced), (stale_saves, checkpoints) = _traced(
        fn, flat_inputs, in_spec, rec, captures, made, binding, whole, reached, reads, size_inputs
    )
    guards = _observed_guards(observer, captures, reached, [out, *(w[2] for w in (*writes, *repeated[2]))])
    modules_called, size_checks, sites, interrupted, aliases = _observed_facts(observer, inputs, repeated[2], reached)
    del observer
    kept, out = _kept_tensors(captures, inputs), as_written(out, captures.written())  # (a written capture: its value)
    trace, out_spec, out_kind, effects, num_outputs, planned = _finish(
        rec, out, writes, repeated, flat_inputs, inputs, captures.proxies, kept, reads, traced
    )
    writebacks, views, first, leaf_outputs, made_outputs, versions, output_vids = planned
    if writebacks is not None and binding is not None:  # (module_memory reads the tensors it holds)
        writebacks = dataclasses.replace(writebacks, memory=binding.metadata)
    positions, traced, placed = inputs.positions, (*inputs.args, *inputs.params, *captures.proxies), inputs.placed()
    detached, cached_casts = _placed(stale_saves, traced, captures)
    del out, writes, repeated, inputs, traced
    captured, stand_ins = _released(captures)
    _check_no_escape(made, trace, sites, (placed, stand_ins))  # first: a stored tensor is the more precise reason
    guards = _check_guards_still_hold(guards, flat_inputs, interrupted)
    ints = _int_sources(size_inputs)
    return Acquired(
        trace,
        list(rec.consts()),
        positions,
        out_spec,
        out_kind,
        [t for t in captured if isinstance(t, torch.Tensor)],
        guards,
        effects,
        num_outputs,
        modules_called,
        writebacks,
        captured_inputs(captured, (*ints, *(at for at, _ in size_inputs.floats))),
        [] if reads is None else reads.reads,
        size_inputs.sources,
        size_inputs.shared,
        size_checks,
        ints,
        dict(rec.guard_sites()),
        detached,
        views,
        first,
        inference,
        hooks,
        floats=tuple(size_inputs.floats),
        stale_saves=stale_saves,
        leaf_outputs=leaf_outputs,
        made_outputs=made_outputs,
        output_vids=output_vids,
        checkpoints=tuple(checkpoints),
        recomputed=tuple(checkpoints.recomputed),
        state_aliases=aliases,
        cached_casts=cached_casts,
        out_versions=versions,
    )


def _traced(fn, flat_inputs, in_spec, rec, captures, made, binding, whole, reached, reads, size_inputs) -> tuple:
    """``_trace_program``'s answer, its ``traced`` given ``saved_outputs.outputs_made``'s answer and
    ``SavedVersions.writes`` (``_finish``'s ``made``), and ``(the stale saves, the checkpoints)``."""
    try:
        with version_tracking.tracking() as saves, noting_checkpoints(rec) as checkpoints:
            out, observer, writes, repeated, inputs, (inference, hooks, traced) = _trace_program(
                fn, flat_inputs, in_spec, rec, captures, made, binding, whole, reached, reads, size_inputs
            )
        stale_saves, outputs_made = saved_outputs.released(saves, out)  # (its proxies would be found stored)
    except ThunderError as e:
        _hint_compiler_disable(e)
        raise
    traced = (*traced, outputs_made, saves.writes)
    return out, observer, writes, repeated, inputs, (inference, hooks, traced), (stale_saves, checkpoints)


def _released(captures: Captures) -> tuple:
    """``(captures.release(), the captured tensors by the id of their proxies)``."""
    stand_ins = {id(p): t for p, t in zip(captures.proxies, captures.tensors) if isinstance(t, torch.Tensor)}
    return captures.release(), stand_ins


def _int_sources(size_inputs: SizeInputs) -> tuple:
    """The sources of the int arguments among the sizes traced as inputs, by input position."""
    at_sizes = (*size_inputs.sources, *(at for at, _ in size_inputs.shared))
    return tuple(sorted((at for at in at_sizes if type(at) in (HeldInt, ArgInt)), key=lambda at: at.input))


def _disabled_code():
    """The code of the wrapper ``torch.compiler.disable`` puts around every function it disables;
    None while Dynamo is not imported (``disable`` imports it, so no function is disabled yet, and
    importing it here would cost every ``import thunder_rs`` seconds)."""
    if "torch._dynamo" not in sys.modules:
        return None
    return _wrapper_code()


@functools.cache
def _wrapper_code():
    return getattr(torch.compiler.disable(lambda: None), "__code__", None)


def _hint_compiler_disable(error: ThunderError) -> None:
    """An error raised inside a ``torch.compiler.disable``d function says how to keep it eager:
    ``thunder_rs.jit`` traces whole programs, Dynamo (``backend="thunder_rs"``) breaks around it."""
    disabled = _disabled_code()
    if disabled is None:
        return
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code is not disabled:
        tb = tb.tb_next
    if tb is not None and error.args and isinstance(error.args[0], str):
        error.args = (
            f"{error.args[0]}. The error is inside a torch.compiler.disable'd function, which "
            "thunder_rs.jit traces like any other; to run it eagerly, compile with "
            'torch.compile(fn, backend="thunder_rs"), which keeps it out of the compiled graphs',
            *error.args[1:],
        )


def _check_no_escape(made: list, trace, sites: dict, slots: tuple) -> None:
    def producer(proxy) -> str:
        name = trace.producer(proxy._vid)
        shape = "x".join(map(str, proxy.shape)) or "scalar"
        return (
            f"the {shape} {str(proxy.dtype).removeprefix('torch.')} result of {name}"
            if name
            else f"input t{proxy._vid}"
        )

    placed, held = slots
    check_no_escape(made, producer, sites, placed, held)
