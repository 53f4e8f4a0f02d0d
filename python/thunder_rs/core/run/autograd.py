"""The runtime of a compiled training call: one ``torch.autograd.Function`` per entry connects
the generated forward and backward to torch's autograd. A backward that must itself be
differentiated (``create_graph=True``) and torch.func transforms, which the function cannot
serve, go to the entry's program as torch calls (``core.differentiable``)."""

import functools
import operator
import weakref
from collections.abc import Callable


import torch

from thunder_rs.core.run.differentiable import transforms_active, version_counters
from thunder_rs.core.run.output_hooks import guard_hooks, refuse_inner
from thunder_rs.core.run.saving_nodes import SavingNodes, present
from thunder_rs.core.state.observe import thread_state
from thunder_rs.core.lang import queue_values, torch_overrides
from thunder_rs.core.lang.saved_errors import inputs_at_call, residual_error, state_at_call
from thunder_rs.core.lang.recorder import active_recorder
from thunder_rs.core.base.lazy import LazyModule
from thunder_rs.core.base.userframe import user_location
from thunder_rs.errors import ThunderNotImplementedError

#: Write-backs, which only a program that writes its inputs in place has: acquiring it loaded them.
_WRITEBACK = LazyModule("thunder_rs.core.acquisition.writeback")

_keep_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", lambda: True)
_FREED = (  # (torch's text)
    "Trying to backward through the graph a second time (or directly access saved tensors after they have already "
    "been freed). Saved intermediate values of the graph are freed when you call .backward() or autograd.grad(). "
    "Specify retain_graph=True if you need to backward through the graph a second time or if you need to access "
    "saved tensors after calling backward."
)


_saved_tensors_hooks = torch._C._autograd._top_saved_tensors_default_hooks

_eval_frame = torch._C._dynamo.eval_frame
#: Dynamo's frame callback stays set while the eager parts of a compiled region run, and the
#: autograd engine calls a Function's backward inside them (``loss.backward()`` after a graph
#: break): Dynamo compiled a compiled call's backward frames, the generated backward among them,
#: whose code object the compiles of one source share, so that a later compile's backward ran
#: the rewrite Dynamo made of an earlier one's, naming a ``__compiled_fn`` its globals lack
#: (NameError), and steps spent their time in Dynamo. Those frames run as they are, with every
#: frame they call (as Dynamo runs a backend's compiled graph).
_AS_THEY_ARE = _eval_frame._FrameExecStrategy(_eval_frame._FrameAction.SKIP, _eval_frame._FrameAction.SKIP)


def unseen_by_dynamo(function) -> staticmethod:
    """``function`` as a static method (a Function's backward) whose frames, and those they call,
    Dynamo leaves to run as they are."""
    _eval_frame.set_code_exec_strategy(function.__code__, _AS_THEY_ARE)
    return staticmethod(function)


#: How many torch function modes are active (a mode may answer any torch call with a view).
_function_modes = torch._C._len_torch_function_stack


def _refuse_hooks_inside_a_trace(enter):
    """``saved_tensors_hooks.__enter__`` that refuses to run inside a traced program: the saved
    tensors of a compiled call are its residuals, packed (or not) as the whole call is."""

    def checked(self):
        # Activation checkpointing's own hooks (torch.utils.checkpoint) only steer recomputation,
        # which a trace has no use for.
        ours = type(self).__module__.startswith("torch.utils.checkpoint")
        if active_recorder() is not None and thread_state.inside == 0 and not ours:
            raise ThunderNotImplementedError(
                f"torch.autograd.graph.{type(self).__name__}: entered at {user_location()} inside a traced program; "
                "thunder_rs applies saved-tensor hooks (save_on_cpu, offloading) to a whole compiled call: enter "
                "them around the call"
            )
        return enter(self)

    checked.__thunder_rs_checked__ = True
    return checked


def _enter_checkpoints(enter):
    """``saved_tensors_hooks.__enter__`` that tells ``in_checkpoint`` when non-reentrant activation
    checkpointing's hooks are entered while tracing (its function runs inside them)."""

    def entered(self):
        result = enter(self)
        if active_recorder() is not None and type(self).__module__.startswith("torch.utils.checkpoint"):
            self._thunder_rs_region = torch_overrides.checkpointed(torch_overrides.preserves_rng_state())
            self._thunder_rs_region.__enter__()
            self._thunder_rs_recomputed = torch_overrides.NonReentrantRegion()
        return result

    return entered


def _exit_checkpoints(exit_):
    def exited(self, *exc):
        region = self.__dict__.pop("_thunder_rs_region", None)
        recomputed = self.__dict__.pop("_thunder_rs_recomputed", None)
        if recomputed is not None and not (exc and exc[0]):
            recomputed.close()
        if region is not None:
            region.__exit__(None, None, None)
        return exit_(self, *exc)

    return exited


_HOOKS = torch.autograd.graph.saved_tensors_hooks
if not getattr(_HOOKS.__enter__, "__thunder_rs_checked__", False):
    _HOOKS.__enter__ = _refuse_hooks_inside_a_trace(_enter_checkpoints(_HOOKS.__enter__))  # type: ignore[method-assign]
    _HOOKS.__exit__ = _exit_checkpoints(_HOOKS.__exit__)  # type: ignore[method-assign]


class _Packed:
    """A residual as a ``saved_tensors_hooks`` pack function returned it (any object)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _check_versions(saved, versions, inputs, ctx=None, made=None, read=None, grads=()) -> None:
    """Raises eager's error when a tensor saved for the backward was written in place after the
    forward (``opt.step()`` before ``loss.backward()``, ``out.add_(1)``): its gradient would be
    computed from the new values. ``made``: per output position of ``ctx``'s call, the node and
    version eager's error names for an output the program made (``acquire.Acquired.made_outputs``;
    found from the tensor's ``grad_fn``, named as ``OutputMade.named`` says for ``grads``). ``read``:
    the positions of the residuals the backward reads, where it reaches some outputs only (None:
    all); eager checks none of a node it does not run. Where none that saved such an output runs,
    though the compiled backward reads it (one computing the others' gradients from zeros), it is
    refused: eager's computes."""
    if version_counters(saved) == versions:
        return
    for i, (r, then) in enumerate(zip(saved, versions)):
        if then >= 0 and (read is None or i in read) and r._version != then:
            at = _output_position(r, ctx) if made else None
            output = made.get(at) if made else None
            if output is not None and grads and not output.reached(_present(grads)):
                raise ThunderNotImplementedError(_UNREACHED.format(list(r.shape), at))
            named = None if output is None else output.named(r, ctx, _present(grads))
            raise residual_error(r, then, inputs, output, named)


_UNREACHED = (
    "backward: output {1} of a thunder_rs-compiled call (a tensor of shape {0}), written in place after the call, "
    "is read by the call's backward from the outputs it reaches (computing the others' gradients as zeros), though "
    "no node eager's backward runs saved it; the compiled backward would compute from the written values. Clone "
    "the output before writing it, or write it after the backward"
)


def _output_position(r, ctx) -> int | None:
    """The position among ``ctx``'s call's flat outputs of ``r``, one of them (its ``grad_fn``, or
    the first edge of the nodes of the caller's in-place writes since); None for another tensor."""
    try:
        node, at = r.grad_fn, r.output_nr
    except RuntimeError:  # (a view the forward took, under no_grad, of an output written since: its base's)
        if r._base is None:
            return None
        node, at = r._base.grad_fn, r._base.output_nr
    for _ in range(64):
        if node is None or node is ctx:
            return None if node is None else at
        edges = node.next_functions
        if not edges:
            return None
        node, at = edges[0]
    return None


def _present(grads: tuple):
    """``position -> whether its cotangent in grads is present``."""
    return lambda i: i < len(grads) and grads[i] is not None


def _unshared(residuals, inputs, overwritten) -> list:
    """``residuals`` with those that share memory with an ``overwritten`` input cloned, so that
    the backward reads the values the forward saw."""
    root_id = _WRITEBACK.load().root_id
    bases = {root_id(inputs[k]) for k in overwritten}
    return [r.clone() if isinstance(r, torch.Tensor) and root_id(r) in bases else r for r in residuals]


def _as_written_inputs(ctx, inputs, flat, written) -> None:
    """Keeps, in place of a residual that is the final value of an input the call writes back
    (``written``: ``(input index, output index, eager's count of its writes)``), that input, at the
    version its write-back gives it (one ``copy_`` after the call, the version then set to eager's
    count: ``WriteBacks.versions``). Eager's backward saves the tensor itself,
    so writing it again before the backward (a second call's write, an optimizer step) raises
    there. A value laid out unlike its input stays as it is (the backward was made for its layout)."""
    value_of = {id(flat[j]): (k, n) for k, j, n in written}
    for i, r in enumerate(ctx.residuals):
        k, n = value_of.get(id(r), (None, 1))
        if k is not None and r.stride() == inputs[k].stride():
            ctx.residuals[i] = inputs[k]
            ctx.versions[i] = inputs[k]._version + n


def _keep_residuals(ctx, residuals, hooks, inputs, flat, written, stale_inputs=(), made=None, watched=()) -> None:
    """Keeps the residuals on ``ctx`` in a list the backward empties, with their versions; under
    ``saved_tensors_hooks``/``save_on_cpu`` (``hooks``), packed as eager's saved tensors are.
    With inputs the call writes (``written``), as ``_unshared`` and ``_as_written_inputs`` keep them;
    the inputs at ``stale_inputs`` as they were at the call (``saved_errors.state_at_call``: the
    forward writes none of them, the call's write-backs come after it); the outputs at ``made`` by weak
    reference, with their versions (``_check_made``), and those at ``watched`` (``output_hooks.refuse_inner``)."""
    if stale_inputs:
        ctx.at_call = state_at_call(inputs, stale_inputs)
    if made:  # (the outputs the program made, and their versions: see ``_check_made``)
        ctx.made_refs = [(j, weakref.ref(flat[j]), flat[j]._version) for j in made]
    if watched:
        ctx.watched = [(j, weakref.ref(flat[j])) for j in watched]
    ctx.residuals = _unshared(residuals, inputs, [k for k, *_ in written]) if written else list(residuals)
    if hooks is None:
        ctx.versions, ctx.unpack = version_counters(ctx.residuals), None
        if written:
            _as_written_inputs(ctx, inputs, flat, written)
    else:
        ctx.versions, ctx.unpack = None, hooks[1]
        ctx.held = _inputs_among(ctx.residuals, inputs)  # (packed, they are told apart no more)
        ctx.residuals = [_Packed(hooks[0](r)) if isinstance(r, torch.Tensor) else r for r in ctx.residuals]


def _inputs_among(residuals: list, inputs) -> frozenset:
    """The positions of the residuals that are inputs of the call (``_free_read`` frees none)."""
    ids = {id(t) for t in inputs}
    return frozenset(i for i, r in enumerate(residuals) if id(r) in ids)


def _check_made(ctx, made: dict, grads: tuple) -> None:
    """Raises eager's error where the caller wrote an output the program made (``made``), which the
    node eager's autograd gave it saved, before a backward that reaches that node (the cotangent of
    an output of ``reach`` is not None): ``out = jfn(x); out.mul_(2); out.sum().backward()`` of an
    ``exp``; ``Q, R = jfn(x); R.mul_(2); Q.sum().backward()`` of a ``qr``. ``ctx.made_refs``:
    ``(position, weak reference, version at the forward)`` of those outputs (a dropped one can be
    written no more)."""
    for j, ref, then in ctx.made_refs:
        out = ref()
        if out is not None and out._version != then and _reached_any(grads, made[j].reach) and made[j].saved():
            raise residual_error(out, then, None, made[j], made[j].named(out, ctx, _present(grads)))


def _reached_any(grads: tuple, positions: frozenset) -> bool:
    return any(grads[i] is not None for i in positions)


def _unpacked(ctx, saved: list, made: dict | None = None, read: frozenset | None = None, grads: tuple = ()) -> list:
    """The residuals a backward reads: unpacked by the saved-tensor hooks the call ran under, else
    checked against their versions (``made``, ``read``, ``grads``: see ``_check_versions``); freed from
    ``ctx`` unless the graph is retained."""
    if ctx.unpack is not None:
        saved = [ctx.unpack(r.value) if isinstance(r, _Packed) else r for r in saved]
    else:
        _check_versions(saved, ctx.versions, ctx.inputs, ctx, made, read, grads)
    if _keep_graph():
        return list(saved)
    if read is not None:  # (a backward reaching some outputs only)
        _free_read(ctx, saved, read)
    else:
        ctx.residuals = ctx.inputs = None
    return saved


def _free_read(ctx, saved: list, read: frozenset) -> None:
    """Frees the residuals a backward reaching some outputs only read, as eager's backward frees
    the nodes it ran only: the others stay for a backward from the outputs it did not reach (a GAN's
    ``d_loss.backward()`` then ``g_loss.backward()`` through the fakes one compiled call returned
    with ``d_loss``), which may not read a freed one (``_unfreed_read``). The call's inputs are
    never freed: the caller holds them, and each eager node that saved one keeps its own."""
    held = getattr(ctx, "held", None)  # (under saved-tensor hooks)
    read = read - (_inputs_among(saved, ctx.inputs or ()) if held is None else held)
    freed = getattr(ctx, "freed", frozenset()) | read
    if freed and len(freed) >= len(saved):  # (a call saving no residual frees none)
        ctx.residuals = ctx.inputs = None
        return
    ctx.freed = freed
    ctx.residuals = [None if i in read else r for i, r in enumerate(saved)]  # (the backward empties ``saved``)


def _unfreed_read(ctx, pattern: tuple | None, nodes: SavingNodes | None = None, n: int = 0) -> frozenset | None:
    """The positions of the residuals a backward reads (``_Unreached``'s ``pattern``; None: all),
    raising eager's error where it reads one an earlier backward freed (``_free_read``), or runs a
    node of ``nodes`` one ran (``saving_nodes``: of ``n`` grad outputs, those it reached, kept)."""
    read = None if pattern is None else pattern[3]
    freed = getattr(ctx, "freed", None)
    if freed and (read is None or not freed.isdisjoint(read)):
        raise RuntimeError(_FREED)
    if nodes is not None:
        ran = getattr(ctx, "ran", None)  # (the patterns of the backwards that freed the graph)
        if ran is not None and nodes.shared(present(ran, n), present((pattern,), n)):
            raise RuntimeError(_FREED)
        if not _keep_graph():
            ctx.ran = (pattern,) if ran is None else (*ran, pattern)
    return read


def _own_views(flat: tuple, inputs: tuple, viewable: tuple | None = None) -> tuple:
    """``flat`` with each output that an executor returned as a view of a tensor only the call
    made (torch's ``tensordot``, ``einsum``: a view of their inner product) detached: the
    caller's tensor, as eager's, may be written in place, where torch refuses to write a view a
    custom Function made. The detached tensor shares the memory and version counter (a write is
    seen by the saved-tensor checks). Views of inputs and of other outputs are kept. Only the
    outputs at ``viewable`` may be views (``fresh_outputs``; None: any, as under a torch
    function mode, which may answer any call with a view)."""
    may = flat if viewable is None else [flat[i] for i in viewable]
    if not any(isinstance(o, torch.Tensor) and o._is_view() for o in may):
        return flat
    held = {id(t) for t in inputs if isinstance(t, torch.Tensor)}
    held.update(id(t._base) for t in inputs if isinstance(t, torch.Tensor) and t._is_view())
    held.update(id(o) for o in flat)
    return tuple(
        o.detach() if isinstance(o, torch.Tensor) and o._is_view() and id(o._base) not in held else o for o in flat
    )


def _run_forward(ctx, inputs, forward, program, single, viewable, keeping):
    """The flat outputs of ``forward(*inputs)`` inside ``CompiledFunction.forward``, its residuals kept on ``ctx``
    (``keeping``: ``_keep_residuals``' written, stale inputs and made)."""
    hooks = _saved_tensors_hooks(False)
    if hooks is None:
        program.keep(ctx, inputs)  # before the forward draws from the generators
    else:
        ctx.inputs = None  # see _differentiated
    outer = queue_values.start()
    try:
        outputs, residuals = forward(*inputs)
    finally:
        ctx.queue_values = queue_values.take(outer)  # (the streams it switched to, for its backward; or None)
    flat = (outputs,) if single else tuple(outputs)
    may = None if _function_modes() else viewable  # (a mode may answer any call with a view)
    if may != ():  # (none of them may be a view: nothing to read)
        flat = _own_views(flat, inputs, may)
    _keep_residuals(ctx, residuals, hooks, inputs, flat, *keeping)
    return flat


def grad_function(
    forward,
    backward,
    grad_positions: list[int],
    single: bool,
    as_list: bool,
    non_differentiable: frozenset = frozenset(),
    written: tuple[tuple[int, int, int], ...] = (),
    *,
    program,
    reads: tuple = (),
    compile_backward=None,
    unread: tuple = (),
    stale: tuple = (),
    viewable: tuple | None = None,
    made: dict | None = None,
    landing: bool = False,
    inner: Callable[[int], frozenset] | None = None,
    ranks: tuple = (),
    nodes: SavingNodes | None = None,
    unread_cotangents: frozenset = frozenset(),
):
    """A callable with the generated forward's signature whose outputs carry a grad_fn.

    ``forward(*inputs)`` returns ``(outputs, residuals)``; ``backward(saved, *cotangents)`` takes the residuals in a
    list, which it empties as it unpacks them, so each residual is freed after its last use unless the graph is
    retained. ``grad_positions`` are the positions of the flat outputs that receive cotangents; the other tensor
    outputs, and ``non_differentiable`` ones (values written back without autograd), are marked non-differentiable
    and get zeros (None at ``unread_cotangents``: cotangents the backward never reads). ``written``: the inputs the
    call writes, their values, eager's counts of their writes (``_keep_residuals``). ``program``: what
    ``create_graph=True`` and torch.func run instead (a ``DifferentiableProgram``, autograd differentiating it).
    ``reads`` (with several ``grad_positions``): per grad position, the inputs its output reads. A backward that
    reaches some outputs only (``loss.backward()`` of a call returning the loss and other tensors) gives no
    gradient, as eager's ``None``, to the inputs only the others read (with zeros, AdamW's weight decay and moments
    moved a parameter no loss used). ``stale``: ``(error, flat output positions)`` per autograd node eager would
    have made whose saved tensors the program wrote in place (``version_tracking``): a backward that reaches one of
    those outputs raises the error, as eager's does, unless the call ran under saved-tensor hooks. ``viewable``: the
    outputs an executor may return as views (``_own_views``; None: any). ``made``: per output position, the node and
    version eager's error names for an output the program made that the caller writes (``_check_versions``).
    ``landing``: (``_land_in_turn``). ``inner``, ``ranks``: ``output_hooks``; ``nodes``: ``saving_nodes``."""
    differentiable = frozenset(grad_positions) - non_differentiable
    outputs, made = made, _reachable(made, differentiable)  # (all named in errors; some checked)
    partial, unreached = len(differentiable) > 1 and bool(reads), _Unreached(reads, compile_backward)
    cotangents_of = _cotangent_picker(grad_positions)
    outputs_at = _Outputs(grad_positions, differentiable, unread_cotangents)
    stale_inputs, watched = inputs_at_call(stale), getattr(inner, "watched", ())  # (see ``_keep_residuals``)

    class CompiledFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            flat = _run_forward(ctx, inputs, forward, program, single, viewable, (written, stale_inputs, made, watched))
            if landing:
                ctx.landing = inputs
            outputs_at.mark(ctx, flat)
            if partial:  # the cotangents of outputs a backward does not reach come as None
                ctx.set_materialize_grads(False)
                ctx.shapes = outputs_at.shapes(flat)
            return flat

        @unseen_by_dynamo
        def backward(ctx, *grads):
            with queue_values.running(ctx.queue_values):  # (its call's streams, on whichever thread)
                saved = _residuals_checked(ctx, stale, made, grads, inner, landing)
                cotangents = cotangents_of(grads)
                # (absent cotangents: the residuals the backward for their pattern reads are checked)
                pattern = unreached.of(cotangents) if partial else None
                read = _unfreed_read(ctx, pattern, nodes, len(grad_positions))
                if pattern is None and cotangents[0] is None:  # (``_Outputs.mark``: nothing reached it)
                    return (None,) * len(ctx.needs_input_grad)
                if _is_grad_enabled():  # create_graph=True: a backward autograd records
                    return _differentiated(ctx, program, grads, outputs, pattern)
                saved = _unpacked(ctx, saved, outputs, read, grads)
                if pattern is not None:
                    found = _reached(backward, saved, cotangents, pattern, ctx.shapes, outputs_at)
                else:
                    found = backward(saved, *cotangents)
                return _land_in_turn(ctx.landing, found) if landing else found

    apply = _applied(CompiledFunction, unread, differentiable, ranks, inner)
    return _entry_call(apply, program, single, as_list, bool(written), stale)


def _applied(function, unread: tuple, differentiable: frozenset, ranks: tuple, inner):
    """``function.apply``, given None for the ``unread`` inputs (``_without``); with several
    ``differentiable`` outputs, whose hooks run on gradients only, in the order of ``ranks``
    (``output_hooks.guard_hooks``), and whose gradients are asked for as ``captured_outputs`` says."""
    apply = _without(function.apply, unread) if unread else function.apply
    if len(differentiable) > 1:
        guard_hooks(function, ranks, inner)
    return apply


#: Eager's error for a backward through a reentrant checkpoint that does not accumulate into
#: ``.grad`` (``torch.autograd.grad``, ``backward(inputs=...)``), whose own backward would.
_REENTRANT_UNDER_GRAD = (
    "When use_reentrant=True, torch.utils.checkpoint is incompatible with .grad() or passing an `inputs` parameter "
    "to .backward(). To resolve this error, you can either set use_reentrant=False, or call .backward() without "
    "passing the `inputs` argument."
)


def _land_in_turn(inputs: tuple, grads: tuple) -> tuple:
    """``grads`` as autograd takes them: an input given a tuple of gradients (a program with
    reentrant checkpoints, ``passes::reentrant``) gets all but its last added to its ``.grad`` in
    turn, each by its AccumulateGrad (a backward of its own, as eager's checkpoint runs one per
    region: its hooks run, and a ``.grad`` from an earlier backward gets them one by one), and
    the last returned. The k-th gradients of all such inputs are added by one backward (the
    engine's: ``torch.autograd.backward`` cost 20 times as much inside a backward, 5 ms a step of
    three checkpointed blocks); a leaf without ``.grad`` or hooks gets their sum, as autograd's
    steps would leave it."""
    out = list(grads)
    turns: list[tuple[list, list]] = []
    for k, g in enumerate(grads):
        if isinstance(g, tuple) and _adds_alone(inputs[k]):  # (autograd's steps: the first stored, then +=)
            out[k] = functools.reduce(operator.add, g)
        elif isinstance(g, tuple):
            *early, out[k] = g
            turns.extend(([], []) for _ in range(len(early) - len(turns)))
            for (tensors, pieces), piece in zip(turns, early):
                tensors.append(inputs[k])
                pieces.append(piece)
    for tensors, pieces in turns:
        _run_backward(tuple(tensors), tuple(pieces), False, False, (), allow_unreachable=True, accumulate_grad=True)
    return tuple(out)


#: The autograd engine's backward (``torch.autograd.backward`` checks and wraps its arguments first).
_run_backward = torch.autograd.Variable._execution_engine.run_backward


def _adds_alone(t: torch.Tensor) -> bool:
    """Whether adding gradients to the ``.grad`` of ``t`` one by one gives their sum and runs
    nothing else: a leaf without a ``.grad`` yet and without hooks."""
    return t.grad_fn is None and t.grad is None and not t._backward_hooks and not t._post_accumulate_grad_hooks


def _reachable(made: dict | None, differentiable: frozenset) -> dict:
    """The outputs of ``made`` (``_check_made``) whose node may save them (``may_save``) and a
    backward from a differentiable output reaches (``reach``), told by its cotangent: with several
    differentiable outputs, cotangents are not materialised (``grad_function``'s ``partial``)."""
    if not made:
        return {}
    return {j: m for j, m in made.items() if m.may_save and m.reach & differentiable}


def _residuals_checked(ctx, stale: tuple, made: dict, grads: tuple, inner, landing: bool) -> list:
    """The residuals of a backward (a freed graph raises eager's error), after the errors of the
    outputs the caller wrote (``_check_made``) and of the nodes the program wrote (``_raise_stale``),
    which eager does not raise under saved-tensor hooks; of a reentrant checkpoint's backward not
    into ``.grad`` (``landing``), and of hooks on an output others were computed from (``inner``:
    ``output_hooks.refuse_inner``)."""
    if landing and not torch.autograd._is_checkpoint_valid():
        raise RuntimeError(_REENTRANT_UNDER_GRAD)
    if inner is not None:
        refuse_inner(ctx, inner, grads)
    saved = ctx.residuals
    if saved is None:
        raise RuntimeError(_FREED)
    if ctx.unpack is None:
        if made:
            _check_made(ctx, made, grads)
        if stale:
            _raise_stale(stale, grads, getattr(ctx, "at_call", None))
    return saved


def _raise_stale(stale: tuple, grads: tuple, at_call: dict | None) -> None:
    """Raises the error of a node whose saved tensors the program wrote (``saved_errors.StaleSave``),
    where the backward reaches one of the outputs computed from it (a cotangent that is not None:
    with several differentiable outputs, cotangents are not materialised); ``at_call``: the
    versions of the inputs at the call (``state_at_call``)."""
    for error, positions in stale:
        if any(grads[i] is not None for i in positions):
            raise error.error(at_call)


class _RaisingBackward(torch.autograd.Function):
    """A copy of an output whose backward raises ``error``: eager's backward reaches, through it,
    a node whose saved tensors the program wrote (``stale``), under a torch.func transform."""

    generate_vmap_rule = True

    @staticmethod
    def forward(t, error):
        return t.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.error = inputs[1]

    @staticmethod
    def backward(ctx, grad):
        raise type(ctx.error)(*ctx.error.args)


def _raising_backward(flat: tuple, stale: tuple, at_call: dict) -> tuple:
    """``flat`` with the outputs ``stale`` names (their first error each) raising in a backward."""
    errors: dict = {}
    for error, positions in stale:
        for i in positions:
            errors.setdefault(i, error.error(at_call))
    return tuple(_RaisingBackward.apply(o, errors[i]) if i in errors else o for i, o in enumerate(flat))


def detaching(call, positions: tuple):
    """``call`` given the inputs at ``positions`` detached: views the trace records no gradient
    through (``TensorProxy._view_grad``), whose history torch's autograd would ask for as it links
    the call's inputs, raising eager's error where eager refuses that history (a view made under
    ``no_grad`` whose base was written in place since), though the program only reads them. A
    detached view shares their memory and version counter, so reads and writes reach them."""
    if not positions:
        return call

    def detached(*inputs):
        given = list(inputs)
        for k in positions:
            given[k] = given[k].detach()
        return call(*given)

    return detached


def _without(apply, unread: tuple):
    """``apply`` given None at the positions ``unread`` (inputs the call never reads: a
    ``grad_function`` argument), so that torch's autograd keeps no edge to them: eager gives them
    no gradient either."""

    def call(*inputs):
        given = list(inputs)
        for k in unread:
            given[k] = None
        return apply(*given)

    return call


_is_grad_enabled = torch.is_grad_enabled
#: ``g is None``, at C speed over a list of cotangents (``in`` and ``count`` compare tensors with ==).
_is_none = functools.partial(operator.is_, None)
_shape_of = operator.attrgetter("shape")


def _cotangent_picker(grad_positions: list):
    """``grads -> the cotangents of the grad positions``: torch's grads themselves where the grad
    outputs are the first outputs (the common case), else picked."""
    n = len(grad_positions)
    if list(grad_positions) == list(range(n)):
        return lambda grads: grads if len(grads) == n else grads[:n]
    if n == 1:
        get = operator.itemgetter(grad_positions[0])
        return lambda grads: (get(grads),)
    return operator.itemgetter(*grad_positions)


class _Outputs:
    """What the forward needs of its flat outputs besides their values: the tensors to mark
    non-differentiable, and the shapes of its grad outputs, whose absent cotangents become zeros
    of them. Which outputs are tensors, and each grad output's dtype and device, are the trace's:
    learnt from the first call, the work is not redone per call. (Shapes are read per call: an
    output with data-dependent sizes changes them.)"""

    def __init__(self, grad_positions: list, differentiable: frozenset, unread: frozenset = frozenset()):
        self.grad_positions, self.differentiable = tuple(grad_positions), differentiable
        self.constant_positions: tuple | None = None
        #: Whether the backward reads the cotangent of an output that carries no gradient (``unread``:
        #: the grad positions whose cotangents it never reads); else the engine need not make zeros.
        self.constants_read, self._read = True, frozenset(grad_positions) - unread
        self._grad_outputs: Callable[[tuple], tuple] = (
            operator.itemgetter(*grad_positions) if len(grad_positions) > 1 else lambda flat: (flat[grad_positions[0]],)
        )
        #: ``(dtype, device)`` of each grad output
        self.kinds: tuple = ()

    def mark(self, ctx, flat: tuple) -> None:
        """Marks the tensor outputs that carry no gradient non-differentiable; written-back values
        get torch's zeros where the backward reads their cotangents, else none (a launch each where
        eager launches nothing). One grad output's cotangent is None where no gradient reached it:
        the backward gives none on, as eager's nodes (zeros made a ``.grad`` AdamW then moved)."""
        if self.constant_positions is None:
            self.constant_positions = tuple(
                i for i, o in enumerate(flat) if i not in self.differentiable and isinstance(o, torch.Tensor)
            )
            self.kinds = tuple((flat[i].dtype, flat[i].device) for i in self.grad_positions)
            self.constants_read = not self._read.isdisjoint(self.constant_positions)
        if self.constant_positions:
            ctx.mark_non_differentiable(*[flat[i] for i in self.constant_positions])
            ctx._materialize_non_diff_grads = self.constants_read
        if len(self.grad_positions) == 1 and not self.constants_read:
            ctx.set_materialize_grads(False)

    def shapes(self, flat: tuple) -> list:
        """The grad outputs' shapes (with several grad outputs)."""
        return list(map(_shape_of, self._grad_outputs(flat)))


class _Unreached(dict):
    """Per pattern of absent cotangents (``g is None`` per grad position): the indices of the
    absent ones, the inputs no reached output reads, from ``reads`` (per grad position, the
    inputs its output reads), and the backward ``compile_backward`` compiled for the pattern, in
    which no gradient flows from them (an op reaching both gets None for them, as eager's node:
    ``qr``'s from ``Q`` alone; None where it could not be compiled: they are passed as zeros), and
    the positions of the residuals that backward reads (None: all). The pattern is
    compiled for the first time it comes, though a script backpropagating once pays for a second
    backward compile: the whole backward given zeros computes what eager never computes (``g / x``
    of a ``log`` output, NaN where ``x`` is 0, added to the gradients) and adds zeros eager never
    adds (laying a gradient out as they are, which changes the order of a later sum: an ulp off)."""

    def __init__(self, reads: tuple, compile_backward):
        super().__init__()
        self.reads, self.compile_backward = reads, compile_backward

    def __missing__(self, absent: tuple) -> tuple:
        reached = frozenset().union(*(self.reads[k] for k, none in enumerate(absent) if not none))
        everything = frozenset().union(*self.reads)
        zeros = tuple(k for k, none in enumerate(absent) if none)
        unread = tuple(sorted(everything - reached))
        compiled = self.compile_backward(zeros) if self.compile_backward is not None and zeros else None
        self[absent] = out = (zeros, unread, *(compiled or (None, None)))
        return out

    def of(self, cotangents: tuple) -> tuple | None:
        """The entry of the pattern of absent ``cotangents``; None where none is absent."""
        absent = tuple(map(_is_none, cotangents))
        return self[absent] if True in absent else None


def _reached(backward, saved, cotangents, pattern: tuple, shapes: list, outputs: _Outputs) -> tuple:
    """The gradients of a backward that reached the outputs whose cotangents are not None
    (``pattern``: ``_Unreached``'s entry for the others): theirs are zeros, and inputs that only they
    read get None. A backward compiled for the pattern takes no zeros: it adds none."""
    zeros, unread, compiled, _ = pattern
    if compiled is not None:
        grads = compiled(saved, *cotangents)
    else:
        filled = list(cotangents)
        for k in zeros:
            dtype, device = outputs.kinds[k]
            filled[k] = torch.zeros(shapes[k], dtype=dtype, device=device)
        grads = backward(saved, *filled)
    if not unread:
        return grads
    grads = list(grads)
    for i in unread:
        grads[i] = None
    return tuple(grads)


_HOOKED = (
    "backward: create_graph=True through a thunder_rs-compiled call made under saved_tensors_hooks (save_on_cpu, "
    "activation checkpointing) is not supported: a differentiable backward computes the call again from its "
    "inputs, which the call does not keep past such hooks; make the call outside them"
)


def _differentiated(ctx, program, grads, made: dict | None = None, pattern: tuple | None = None) -> tuple:
    """The backward of a call under ``create_graph=True``: the gradients of the program computed
    again as torch calls, which autograd records (``core.differentiable``); ``pattern``: the
    ``_Unreached`` entry of its absent cotangents (the residuals and inputs it checks)."""
    if ctx.inputs is None:
        raise ThunderNotImplementedError(_HOOKED)
    read, unread = (None, ()) if pattern is None else (pattern[3], pattern[1])
    _check_versions(ctx.residuals, ctx.versions, ctx.inputs, ctx, made, read, grads)
    grads = program.gradients(ctx, grads, unread)
    if not _keep_graph():
        ctx.residuals = ctx.inputs = None
    program.recording = program.may_record
    return grads


_WRITES_UNDER_TRANSFORM = (
    "torch.func: a thunder_rs-compiled call that writes its inputs in place (BatchNorm's running statistics, a "
    "buffer the program updates) ran under a torch.func transform, which cannot write transformed values into them "
    "(eager refuses writes to the tensors a transformed function captures); put the module in eval mode, or stop "
    "tracking running statistics (torch.func.replace_all_batch_norm_modules_)"
)


_WRITES_UNDER_FORWARD_AD = (
    "torch.autograd.forward_ad: a thunder_rs-compiled call that records a gradient and writes its inputs in place "
    "(BatchNorm's running statistics, a buffer the program updates) was given a dual tensor, whose tangent its "
    "compiled autograd function does not carry; call it with no input requiring grad, or outside the jitted function"
)


def _refused_transform(e: RuntimeError) -> str | None:
    """Where torch refused the autograd function for a transform that the program as torch calls
    carries: a torch.func transform (it has no ``setup_context``), or a dual tensor input of
    forward-mode AD (it has no ``jvp``; the torch calls carry the tangent as eager's do). Then the
    refusal of such a call that writes its inputs; else None."""
    text = str(e)
    if "setup_context" in text and transforms_active():
        return _WRITES_UNDER_TRANSFORM
    if "implement the jvp function" in text and torch.autograd.forward_ad._current_level >= 0:
        return _WRITES_UNDER_FORWARD_AD
    return None


def _entry_call(apply, program, single: bool, as_list: bool, writes: bool, stale: tuple = ()):
    """``apply`` adapted to the forward's output form. The program as torch calls under autograd
    (``program.flat``) instead: once a double backward went through the entry (``recording``),
    and under a torch.func transform or for a dual input, which the autograd function does not
    support (torch refuses it before its forward runs, at no cost to other calls) and which
    differentiates the torch calls. ``writes``: the call writes its inputs after it runs, which
    is refused there. ``stale`` (``grad_function``): the outputs whose backward raises eager's
    error there too."""

    def call(*inputs):
        if program.recording:
            return program.flat(*inputs)
        try:
            return apply(*inputs)
        except RuntimeError as e:
            refused = _refused_transform(e)
            if refused is None:
                raise
        if writes:
            raise ThunderNotImplementedError(refused)
        if not stale:
            return program.flat(*inputs)
        at_call = state_at_call(inputs, inputs_at_call(stale))
        return _raising_backward(program.flat(*inputs), stale, at_call)

    if single:
        return lambda *inputs: call(*inputs)[0]
    if as_list:
        return lambda *inputs: list(call(*inputs))
    return call


class _ThroughInnerLeaves(torch.autograd.Function):
    """Outputs that require grad through leaves the program made (``inner_leaves``) alone: their
    backward reaches those leaves only, which no caller holds, so it gives no gradient."""

    @staticmethod
    def forward(ctx, stand_in, *outputs):
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        return (None,) * (len(grads) + 1)


def through_inner_leaves(call, positions: tuple, single: bool):
    """``call`` whose flat outputs at ``positions`` (those the trace says require grad) require
    grad as eager's do where the program made a leaf they are computed from
    (``Acquired.leaf_outputs``): one that comes back requiring none (no input it reads requires
    grad) gets a backward, as eager's ``backward()`` on it fills that leaf's ``.grad`` only, which
    the program does not return."""

    def called(*inputs):
        outputs = call(*inputs)
        flat = [outputs] if single else list(outputs)
        lacking = [i for i in positions if not flat[i].requires_grad]
        if not lacking:
            return outputs
        stand_in = torch.empty(0, requires_grad=True)  # (a new leaf per call, as eager's)
        for i, o in zip(lacking, _ThroughInnerLeaves.apply(stand_in, *(flat[i] for i in lacking))):
            flat[i] = o
        return flat[0] if single else type(outputs)(flat)

    return called
