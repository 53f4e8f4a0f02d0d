"""``torch.func.grad``, ``grad_and_value``, ``vjp`` and ``jvp`` of traced values, traced: the
function's calls and their backward become ops of the program, which thunder_rs compiles as the
rest of it. ``jvp`` is reverse mode twice (thunder_rs has no forward-mode rules): the backward of
``vjp``'s function, linear in its cotangent, from the tangents (``jvp``).

The function runs on stand-ins of the differentiated arguments that require grad (an alias of
each, recorded as a cast to its own dtype), under ``enable_grad`` as torch.func's transform runs
it; the Rust VJP pass then emits the backward of what it recorded, from a cotangent of ones, into
the program (``Recorder.differentiate``, the same rules the compiled call's backward uses). Once
differentiated, the values it recorded require grad as they do at the level outside the transform
(eager's results carry the outer level's gradients, or none), so that the program's own backward
differentiates the transform (a gradient penalty's second order) and ``requires_grad`` is
eager's; where that gradient may go through it, composites are differentiated through their
decompositions (their grad rules' backward kernels have no gradient): where it meets a kernel an
executor runs whole (``native_layer_norm`` in layer_norm's rule), the function is traced again
with the kernels' decompositions. ``vjp``'s forward is traced once, on stand-ins, as the
program's own ops, and each call of its function emits their backward (``Recorder.
differentiate_values``: eager runs the forward once); where it cannot (under another ``torch.vmap``
level) the function is traced again on stand-ins. In-place writes functorch refuses (to captured
tensors, to differentiated arguments) raise its errors.

Under ``torch.vmap`` (per-sample gradients, ``vmap(grad(loss), in_dims=(None, 0, 0))``) the
function runs on the physical tensors of the batching interpreter (``core.lang.vmap``): each
differentiated argument is first expanded over the active levels, so that every example's
gradient is its own, and the backward of the batched ops is the batched backward.
A jacobian (``jacrev``'s ``vmap`` of ``vjp``'s function over a basis of cotangents, ``jacfwd``'s
of ``jvp`` over a basis of tangents) keeps eager's forward: the function is traced once, outside
the levels, and its backward is emitted from unbatched stand-ins of the cotangents, then recorded
again batched over the levels (``_over_levels``, ``passes::batch``), as functorch batches only the
backward; where the backward has no batching rule the function is traced again under the levels.

What the trace cannot differentiate (a function whose backward runs eager fallbacks, or that
thunder_rs cannot trace) runs as one eager call instead (``functorch_calls``), as do the transform's
errors (a non-scalar output): ``UNTRACED`` says so, and what was recorded is dropped.
"""

import contextlib
import contextvars
import types
from typing import NamedTuple

import torch
from torch._C import DisableTorchFunctionSubclass
from torch.utils._pytree import tree_flatten, tree_unflatten

from thunder_rs import prims
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang import closures, vmap_state
from thunder_rs.core.lang.recorder import (
    ELEMENTWISE_KERNEL_IDS,
    active_recorder,
    grad_mode_cuts,
    lift_captured,
    proxies,
    recording_decompositions,
)
from thunder_rs.core.base.userframe import user_location
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError

#: What ``grad`` returns when the call cannot be traced (it then runs as an eager call).
UNTRACED = object()

_SET_REQUIRES_GRAD = torch._C.TensorBase.__dict__["requires_grad"].__set__


class _Scope(NamedTuple):
    """What the function a transform traces may write: values made before ``first`` (a value id)
    are captured, but for the proxies ``writable`` (arguments functorch wraps without
    differentiating them); ``differentiated`` are its differentiated arguments, leaves in eager."""

    first: int
    writable: frozenset
    differentiated: frozenset
    #: the arguments it wrote (their proxies now stand for values of the transform's own)
    written: list


_scope: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_transform_scope", default=None)
#: Whether a write to an argument the transform's function may write is refused before it is
#: made (``WritesArguments``): while a function is traced where an eager call or a trace of it
#: again may follow, which would write the argument once more.
_writes_refused: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_argument_writes_refused", default=False)


class WritesArguments(Exception):
    """The function traced writes an argument in place, which ``refusing_argument_writes`` refuses."""


@contextlib.contextmanager
def refusing_argument_writes():
    """Raises ``WritesArguments`` at a write to an argument, before it is made."""
    token = _writes_refused.set(True)
    try:
        yield
    finally:
        _writes_refused.reset(token)


@contextlib.contextmanager
def scope(rec, writable=(), differentiated=(), written: list | None = None):
    """Refuses, as functorch does, writes the function traced inside makes to tensors it captured
    (``refuse_captured_write``); notes in ``written`` those to its ``writable`` arguments."""
    ids = lambda tree: frozenset(id(x) for x in tree_flatten(tree)[0] if isinstance(x, TensorProxy))  # noqa: E731
    token = _scope.set(_Scope(rec.num_values, ids(writable), ids(differentiated), [] if written is None else written))
    try:
        yield
    finally:
        _scope.reset(token)


def refuse_captured_write(op: str, root) -> None:
    """Eager's error for an in-place write, inside a transform traced here, to a tensor made
    outside it (``torch.func`` wraps only the function's arguments) or to a differentiated
    argument (a leaf that requires grad); the in-place ops' ``assign`` asks."""
    now = _scope.get()
    vid = getattr(root, "_vid", None)
    made_inside = vid is not None and vid >= now.first and getattr(root, "_input_vid", None) is None if now else True
    if now is None or vid is None or made_inside:
        return
    if id(root) in now.writable:
        if _writes_refused.get():
            raise WritesArguments(op)
        now.written.append(root)
        return
    if id(root) in now.differentiated:
        raise ThunderRuntimeError(
            f"{op}: a leaf Variable that requires grad is being used in an in-place operation. (at {user_location()})"
        )
    raise ThunderRuntimeError(
        f"During a grad (vjp, jvp, grad, etc) transform, the function provided attempted to call in-place operation "
        f"({op}) that would mutate a captured Tensor. This is not supported; please rewrite the function being "
        f"transformed to explicitly accept the mutated Tensor(s) as input. (at {user_location()})"
    )


class _Untraceable(Exception):
    """The call runs eagerly instead."""


def _differentiable(rec, x, sizes: tuple):
    """A stand-in of ``x`` that requires grad: an alias of it (of its physical tensor expanded
    over the active levels, under vmap), returned as the function sees it, and that alias."""
    if not isinstance(x, TensorProxy) or not x.dtype.is_floating_point:
        raise _Untraceable  # (torch.func raises its error: the eager call does)
    phys = vmap_state.full(x, len(sizes))
    alias = prims.convert_element_type(phys, phys.dtype)
    rec.set_requires_grad(alias._vid, True)
    (alias,) = proxies(rec.tensors([alias._vid]))
    alias._leaf = True  # (eager's differentiated argument: a leaf, which in-place writes refuse)
    seen = vmap_state.BATCHED[0](alias, len(sizes)) if sizes else alias
    return seen, alias


def _argnums(argnums, count: int) -> tuple:
    nums = (argnums,) if isinstance(argnums, int) else argnums
    if not isinstance(nums, tuple) or not nums or not all(isinstance(n, int) and -count <= n < count for n in nums):
        raise _Untraceable
    return tuple(n % count for n in nums)


def _as_outside(rec, tree) -> None:
    """The flags of ``tree``'s proxies as the level outside sees them (``differentiate`` changed
    them in the trace)."""
    for x in tree_flatten(tree)[0]:
        for p in (x, x.physical) if vmap_state.levels_of(x) else (x,):
            if isinstance(p, TensorProxy) and p._vid is not None:
                (meta,) = rec.tensors([p._vid])
                with DisableTorchFunctionSubclass():
                    _SET_REQUIRES_GRAD(p, meta.requires_grad)
        if vmap_state.levels_of(x):
            with DisableTorchFunctionSubclass():
                _SET_REQUIRES_GRAD(x, x.physical.requires_grad)


def _on_aliases(rec, func, nums: tuple, args: tuple, kwargs: dict, written: list, decompositions: bool = False):
    """``func`` traced on stand-ins of the arguments at positions ``nums`` that require grad:
    ``(its output, the aliases of each such argument's leaves, each argument's tree spec)``; the
    other arguments it writes in place are noted in ``written``. With ``decompositions``, kernels
    an executor runs whole are recorded with their decompositions (``native_layer_norm`` in a
    grad rule), which a gradient of the program through the backward needs."""
    sizes = vmap_state.levels.get()
    given = list(args)
    aliases: list = []
    specs = []
    with (
        recording_decompositions(decompositions),
        torch.enable_grad(),
    ):  # (torch.func's transforms differentiate under no_grad too)
        for n in nums:
            leaves, spec = tree_flatten(given[n])
            made = [_differentiable(rec, x, sizes) for x in leaves]
            given[n] = tree_unflatten([seen for seen, _ in made], spec)
            aliases.append([alias for _, alias in made])
            specs.append(spec)
        others = [a for i, a in enumerate(given) if i not in nums]
        with scope(rec, writable=others, written=written):
            return func(*given, **kwargs), aliases, specs


def _backward(rec, mark, seeds: list, aliases: list, specs: list, outside) -> list:
    """The gradients of ``aliases`` (per argument) from ``seeds`` (``(output, cotangent)`` as the
    function sees them), recorded after what was traced since ``mark`` (or a ``VjpForward``'s
    calls), each argument's as its tree; ``outside`` (what the function returned) then requires
    grad as the outer level sees it."""
    sizes = vmap_state.levels.get()
    flat = [a for group in aliases for a in group]
    pairs = []
    for out, cotangent in seeds:
        phys, cot = vmap_state.full(out, len(sizes)), vmap_state.full(cotangent, len(sizes))
        if tuple(phys.shape) != tuple(cot.shape):
            raise _Untraceable
        pairs.append((phys._vid, cot._vid))
    wrt, enabled = [a._vid for a in flat], torch.is_grad_enabled()
    if isinstance(mark, VjpForward):
        grads = rec.differentiate_values(mark.first, mark.end, mark.inner, pairs, wrt, enabled)
    else:
        grads = rec.differentiate(mark, pairs, wrt, enabled)
    grads = [torch.zeros_like(a) if g is None else proxies([g])[0] for g, a in zip(grads, flat)]
    if sizes:
        grads = [vmap_state.BATCHED[0](g, len(sizes)) for g in grads]
    _as_outside(rec, outside)
    it = iter(grads)
    return [tree_unflatten([next(it) for _ in group], spec) for group, spec in zip(aliases, specs)]


def _grad(rec, mark: int, func, argnums, has_aux: bool, args: tuple, kwargs: dict, written: list, whole: bool):
    """The traced call of ``grad``: ``(gradients as the arguments' structure, output, aux)``; with
    ``whole`` false, kernels recorded with their decompositions."""
    nums = _argnums(argnums, len(args))
    out, aliases, specs = _on_aliases(rec, func, nums, args, kwargs, written, decompositions=not whole)
    aux = None
    if has_aux:
        if not (isinstance(out, tuple) and len(out) == 2):
            raise _Untraceable
        out, aux = out
    if not isinstance(out, TensorProxy) or out.ndim != 0 or not out.dtype.is_floating_point:
        raise _Untraceable
    seed = torch.ones((), dtype=out.dtype, device=out.device)
    trees = _backward(rec, mark, [(out, seed)], aliases, specs, (out, aux))
    return (trees[0] if isinstance(argnums, int) else tuple(trees)), out, aux


def _needs_decompositions(e: Exception) -> bool:
    """Whether the program's gradient through a traced transform met a kernel recorded whole (its
    backward kernel has no gradient): traced again with the kernels' decompositions, it may not."""
    return torch.is_grad_enabled() and "recorded without its decomposition" in str(e)


def unwritten(name: str, cause: Exception) -> ThunderNotImplementedError:
    return ThunderNotImplementedError(
        f"{name} at {user_location()}: the function writes its arguments in place and then cannot be traced "
        f"({type(cause).__name__}: {cause}); thunder_rs runs such a transform as one eager call only where it "
        "has traced no write. Write the arguments outside the transformed function"
    )


def grad(func, argnums, has_aux: bool, with_value: bool, args: tuple, kwargs: dict):
    """``torch.func.grad`` (or ``grad_and_value``) of ``func`` on traced ``args``, traced; or
    ``UNTRACED``, nothing recorded, where it cannot be."""
    rec = active_recorder()
    args, kwargs = lift_captured(args, kwargs)
    mark, written = rec.mark(), list[TensorProxy]()
    for whole in (True, False):
        try:
            grads, out, aux = _grad(rec, mark, func, argnums, has_aux, args, kwargs, written, whole)
        except Exception as e:  # (the eager call raises eager's error, or computes what tracing cannot)
            if written:  # (the arguments' proxies stand for what it wrote: the eager call would write again)
                raise unwritten("torch.func.grad", e) from e
            rec.rewind(mark)
            if not (whole and _needs_decompositions(e)):
                return UNTRACED
            continue
        if with_value:
            return (grads, (out, aux)) if has_aux else (grads, out)
        return (grads, aux) if has_aux else grads
    return UNTRACED


class VjpForward(NamedTuple):
    """A ``vjp``'s forward traced once on stand-ins of its primals (``vjp_forward``): the values
    it made (ids ``first`` to before ``end``, requiring grad as ``inner`` says inside the
    transform), the stand-ins per primal and their tree specs, where it was recorded."""

    first: int
    end: int
    inner: list
    aliases: list
    specs: list
    outputs: list
    levels: tuple
    recorder: object
    #: whether the function wrote its arguments (that are not differentiated) in place
    wrote: bool


def vjp_forward(func, primals: tuple, argnums, has_aux: bool):
    """``vjp``'s forward, ``func`` traced once on stand-ins of the primals that require grad, as
    the program's own ops that its function differentiates (``vjp_backward``): ``(its output,
    a VjpForward)``; or None, nothing recorded, where it cannot be."""
    rec = active_recorder()
    mark, written = rec.mark(), list[TensorProxy]()
    try:
        return _vjp_forward(rec, func, primals, argnums, has_aux, written)
    except Exception as e:  # (traced as the program's own ops instead)
        if written:
            raise unwritten("torch.func.vjp", e) from e
        rec.rewind(mark)
        return None


def _vjp_forward(rec, func, primals: tuple, argnums, has_aux: bool, written: list, decompositions: bool = False):
    mark, first = rec.mark(), rec.num_values
    nums = tuple(range(len(primals))) if argnums is None else _argnums(argnums, len(primals))
    out, aliases, specs = _on_aliases(rec, func, nums, primals, {}, written, decompositions)
    if has_aux and not (isinstance(out, tuple) and len(out) == 2):
        raise _Untraceable  # (traced again, raising eager's error)
    end, outputs = rec.num_values, tree_flatten(out[0] if has_aux else out)[0]
    if not all(isinstance(t, TensorProxy) for t in outputs):
        raise _Untraceable
    inner = rec.grad_labels(first, end)
    rec.differentiate(mark, [], [], torch.is_grad_enabled())  # (its values as the level outside sees them)
    _as_outside(rec, out)
    return out, VjpForward(first, end, inner, aliases, specs, outputs, vmap_state.levels.get(), rec, bool(written))


def vjp_backward(func, primals: tuple, argnums, has_aux: bool, out_spec, cotangents, forward=None, wrote=False):
    """What ``vjp``'s function returns for traced ``cotangents`` (``functorch_calls._vjp_in_trace``):
    the backward of its ``forward`` (``vjp_forward``) from the cotangents, emitted after what
    the program has recorded since (batched over the ``torch.vmap`` levels now active where it was
    traced outside them: ``_over_levels``); where there is none (or its backward cannot be
    batched, or it was traced under other levels), ``func`` traced again on stand-ins of the
    primals, its backward from the cotangents; or ``UNTRACED``, nothing recorded. A function that draws random
    numbers is not traced twice (the draws would differ), nor one that ``wrote`` its arguments
    (the writes would be made again)."""
    rec = active_recorder()
    levels = vmap_state.levels.get()
    if forward is not None and forward.recorder is rec and forward.levels in (levels, ()):
        flat_cot, cot_spec = tree_flatten(cotangents)
        seeds = list(zip(forward.outputs, flat_cot))
        try:
            if cot_spec != out_spec:
                raise _Untraceable
            if forward.levels == levels:
                trees = _backward(rec, forward, seeds, forward.aliases, forward.specs, ())
            else:  # (jacrev's vmap of the vjp function: the forward once, its backward batched, as functorch)
                trees = _over_levels(
                    rec,
                    seeds,
                    forward.aliases,
                    forward.specs,
                    lambda pairs, wrt, enabled: rec.differentiate_values(
                        forward.first, forward.end, forward.inner, pairs, wrt, enabled
                    ),
                )
            return _as_argnums(trees, argnums)
        except Exception:  # (traced again below; what the forward's backward recorded is unused)
            pass
    if wrote:
        return UNTRACED
    mark = rec.mark()
    for whole in (True, False):
        try:
            return _as_argnums(
                _traced_again(rec, mark, func, primals, argnums, has_aux, out_spec, cotangents, whole), argnums
            )
        except Exception as e:  # (what cannot be traced runs eagerly, or raises naming the transform)
            rec.rewind(mark)
            if not (whole and _needs_decompositions(e)):
                return UNTRACED
    return UNTRACED


def _traced_again(rec, mark: int, func, primals: tuple, argnums, has_aux: bool, out_spec, cotangents, whole: bool):
    """``vjp``'s function as ``func`` traced again on stand-ins of the primals, then its backward
    from ``cotangents``: the gradients per primal differentiated."""
    written = list[TensorProxy]()
    nums = tuple(range(len(primals))) if argnums is None else _argnums(argnums, len(primals))
    with refusing_argument_writes():  # (vjp wrote them once, as eager does; its function must not write them again)
        out, aliases, specs = _on_aliases(rec, func, nums, primals, {}, written, decompositions=not whole)
    if has_aux:
        out = out[0]
    flat_out, spec = tree_flatten(out)
    flat_cot, cot_spec = tree_flatten(cotangents)
    if spec != out_spec or cot_spec != spec or rec.effects_since(mark):
        raise _Untraceable
    return _backward(rec, mark, list(zip(flat_out, flat_cot)), aliases, specs, out)


def _over_levels(rec, seeds: list, aliases: list, specs: list, emit) -> list:
    """The gradients of ``aliases`` (unbatched: traced outside the active ``torch.vmap`` levels)
    from ``seeds``, ``(output, cotangent)`` with the outputs unbatched and the cotangents batched
    over the levels, as functorch computes a jacobian: the backward ``emit((output, stand-in)
    pairs, alias ids, grad mode)`` records from unbatched stand-ins of the cotangents, recorded
    again batched over the levels (``Recorder.batch_since``), so that what does not depend on the
    cotangents (the forward's values, ``cos(x @ w)`` in ``sin``'s backward) is computed once."""
    sizes = vmap_state.levels.get()
    flat = [a for group in aliases for a in group]
    pairs, given = [], []
    for out, cotangent in seeds:
        if vmap_state.levels_of(out) or tuple(cotangent.shape) != tuple(out.shape) or cotangent.dtype != out.dtype:
            raise _Untraceable
        stand_in = prims.full(tuple(out.shape), 0.0, out.device, out.dtype)
        pairs.append((out._vid, stand_in._vid))
        given.append((stand_in._vid, vmap_state.full(cotangent, len(sizes))._vid))
    first, enabled = rec.num_values, torch.is_grad_enabled()
    grads = emit(pairs, [a._vid for a in flat], enabled)
    batched = dict(rec.batch_since(first, given, list(sizes), enabled, list(ELEMENTWISE_KERNEL_IDS)))
    if any(g is not None and g.vid not in batched for g in grads):
        raise _Untraceable  # (a gradient that does not depend on the cotangents: none is linear in them)
    made = [None if g is None else vmap_state.BATCHED[0](proxies([batched[g.vid]])[0], len(sizes)) for g in grads]
    made = [torch.zeros_like(a) if g is None else g for g, a in zip(made, flat)]
    it = iter(made)
    return [tree_unflatten([next(it) for _ in group], spec) for group, spec in zip(aliases, specs)]


def _as_argnums(trees: list, argnums):
    if argnums is None:
        return tuple(trees)
    return trees[0] if isinstance(argnums, int) else tuple(trees)


def jvp(func, primals: tuple, tangents, argnums, has_aux: bool):
    """``torch.func.jvp`` (``_jvp_with_argnums``, which ``jacfwd`` calls under ``torch.vmap``) of
    ``func`` on traced ``primals`` in the direction of ``tangents``, traced by reverse mode twice
    (thunder_rs has no forward-mode rules): the function is traced once on stand-ins of the
    primals (``vjp``'s forward, its values the program's own), its backward from a cotangent
    stand-in ``u`` that requires grad is ``J^T u``, linear in ``u``, and the backward of that
    from the tangents is ``J t``. Returns ``(output, tangents out)`` as the function's output
    (and ``aux``); or ``UNTRACED``, nothing recorded, where it cannot be (an output that is not
    floating-point, a backward that runs eager fallbacks, grad mode turned off inside it)."""
    rec = active_recorder()
    mark, written = rec.mark(), list[TensorProxy]()
    for whole in (True, False):
        try:
            return _jvp(rec, func, primals, tangents, argnums, has_aux, written, whole)
        except Exception as e:  # (the eager call computes it, or raises eager's error)
            if written:
                raise unwritten("torch.func.jvp", e) from e
            rec.rewind(mark)
            if not (whole and _needs_decompositions(e)):
                return UNTRACED
    return UNTRACED


def _jvp(rec, func, primals: tuple, tangents, argnums, has_aux: bool, written: list, whole: bool):
    nums = tuple(range(len(primals))) if argnums is None else _argnums(argnums, len(primals))
    if len(set(nums)) != len(nums):
        raise _Untraceable  # (the eager call raises eager's error)
    diff = tuple(primals[n] for n in nums)  # (as torch's ``_slice_argnums``: a tuple for one argnum too)
    flat_tangents, spec = tree_flatten(tangents)
    flat_primals, primal_spec = tree_flatten(diff)
    if spec != primal_spec or not all(_as_tangent(p, t) for p, t in zip(flat_primals, flat_tangents)):
        raise _Untraceable  # (the eager call raises eager's error)
    if vmap_state.levels.get() and not _reads_batched(func, primals):
        mark = rec.mark()
        try:  # (jacfwd's vmap of jvp over a basis of tangents: functorch computes the forward once)
            return _jvp_unbatched(rec, func, primals, flat_tangents, argnums, has_aux, written, whole)
        except Exception:
            if written:
                raise
            rec.rewind(mark)  # (traced batched below)
    out, aux, out_spec, mark, cotangents, flat_pulled = _transposed(
        rec, func, primals, argnums, has_aux, written, whole
    )
    (tangents_out,) = _backward(
        rec, mark, list(zip(flat_pulled, flat_tangents)), [[a for _, a in cotangents]], [out_spec], (out, aux)
    )
    return (out, tangents_out, aux) if has_aux else (out, tangents_out)


def _reads_batched(func, primals: tuple) -> bool:
    """Whether ``func`` on ``primals`` may read values the active ``torch.vmap`` levels batch: a
    batched primal, or one in the closures of the functions it holds (another callable, which
    may hold one elsewhere, counts as reading them)."""
    if not isinstance(func, types.FunctionType):
        return True
    return any(vmap_state.levels_of(x) for x in (*tree_flatten(primals)[0], *closures.traced_values(func)))


def _jvp_unbatched(rec, func, primals: tuple, flat_tangents: list, argnums, has_aux: bool, written: list, whole):
    """``_jvp`` of unbatched ``primals`` under ``torch.vmap`` levels that batch the tangents (a
    ``jacfwd``): the function and its backward ``J^T u`` traced once, outside the levels, and the
    backward of that from the tangents batched over them (``_over_levels``)."""
    token = vmap_state.levels.set(())
    try:
        out, aux, out_spec, mark, cotangents, flat_pulled = _transposed(
            rec, func, primals, argnums, has_aux, written, whole
        )
    finally:
        vmap_state.levels.reset(token)
    if rec.effects_since(mark) or any(vmap_state.levels_of(x) for x in tree_flatten((out, aux))[0]):
        raise _Untraceable  # (a draw, or a batched value the function reads: traced under the levels)
    emit = lambda pairs, wrt, enabled: rec.differentiate(mark, pairs, wrt, enabled)  # noqa: E731
    seeds = list(zip(flat_pulled, flat_tangents))
    (tangents_out,) = _over_levels(rec, seeds, [[a for _, a in cotangents]], [out_spec], emit)
    _as_outside(rec, (out, aux))
    return (out, tangents_out, aux) if has_aux else (out, tangents_out)


def _transposed(rec, func, primals: tuple, argnums, has_aux: bool, written: list, whole: bool):
    """``func`` traced once on stand-ins of the primals and its backward ``J^T u`` from cotangent
    stand-ins ``u`` that require grad: ``(output, aux, its tree spec, the mark before the
    backward, the stand-ins, J^T u flat)``."""
    cuts = list[str]()
    token = grad_mode_cuts.set(cuts)
    try:
        out, forward = _vjp_forward(rec, func, primals, argnums, has_aux, written, decompositions=not whole)
    finally:
        grad_mode_cuts.reset(token)
    if cuts:  # (grad mode off inside it: eager's forward mode carries the tangents on, reverse mode not)
        raise _Untraceable
    out, aux = out if has_aux else (out, None)
    flat_out, out_spec = tree_flatten(out)
    sizes = vmap_state.levels.get()
    with torch.enable_grad():  # (the backward is differentiated again: it must carry u's gradient)
        mark = rec.mark()
        cotangents = [_differentiable(rec, o.new_zeros(o.shape), sizes) for o in flat_out]  # (unbatched)
        seeds = list(zip(flat_out, [u for u, _ in cotangents]))
        pulled = _backward(rec, forward, seeds, forward.aliases, forward.specs, ())
    flat_pulled = [g for tree in pulled for g in tree_flatten(tree)[0]]
    return out, aux, out_spec, mark, cotangents, flat_pulled


def _as_tangent(primal, tangent) -> bool:
    """Whether ``tangent`` is a traced tangent of ``primal``'s size and dtype, as ``make_dual`` takes."""
    return (
        isinstance(primal, TensorProxy)
        and isinstance(tangent, TensorProxy)
        and tuple(tangent.shape) == tuple(primal.shape)
        and tangent.dtype == primal.dtype
    )


def linearize(func, primals: tuple):
    """``torch.func.linearize``'s jvp of ``func`` at traced ``primals``, traced by reverse mode
    twice as ``jvp``: the function traced once on stand-ins of the primals, detached (eager's jvp
    graph holds them as constants, so no gradient reaches them through it), and its backward from
    cotangent stand-ins ``u``; a ``VjpForward`` of that backward, ``J^T u``, whose own backward
    from the tangents (``linearized_tangents``) is ``J t``. Or ``UNTRACED``, nothing recorded
    (under ``torch.vmap``, an output that is not floating-point, a backward that runs eager
    fallbacks, random draws, grad mode turned off inside it). A function that writes its arguments
    is refused: eager's linearize runs it twice, writing them twice."""
    rec = active_recorder()
    if vmap_state.levels.get():
        return UNTRACED
    mark = rec.mark()
    for whole in (True, False):
        try:
            with refusing_argument_writes():
                return _linearize(rec, func, primals, whole)
        except _Refused:
            rec.rewind(mark)
            raise
        except (WritesArguments, ThunderRuntimeError) as e:
            rec.rewind(mark)
            if isinstance(e, ThunderRuntimeError) and "in-place" not in str(e):
                return UNTRACED  # (the eager call raises eager's error)
            raise ThunderNotImplementedError(
                f"torch.func.linearize at {user_location()}: its function writes a tensor in place ({e}); eager's "
                "linearize runs the function twice (its output, then its jvp graph), writing twice, which "
                "thunder_rs does not reproduce. Write the tensors outside the linearized function"
            ) from None
        except Exception as e:  # (the eager call computes it, or raises eager's error)
            rec.rewind(mark)
            if not (whole and _needs_decompositions(e)):
                return UNTRACED
    return UNTRACED


class _Refused(ThunderNotImplementedError):
    """What a traced linearize cannot reproduce, nor an eager call of it."""


def _linearize(rec, func, primals: tuple, whole: bool) -> VjpForward:
    mark = rec.mark()
    detached = tuple(tree_unflatten([_detached(x) for x in tree_flatten(p)[0]], tree_flatten(p)[1]) for p in primals)
    cuts = list[str]()
    token = grad_mode_cuts.set(cuts)
    try:
        out, forward = _vjp_forward(rec, func, detached, None, False, [], decompositions=not whole)
    finally:
        grad_mode_cuts.reset(token)
    if rec.effects_since(mark):
        raise _Refused(
            f"torch.func.linearize at {user_location()}: its function draws random numbers (or acts on other state "
            "outside it); eager's linearize runs it twice and its jvp graph draws on each call, which thunder_rs "
            "does not reproduce. Draw outside the linearized function and pass the values in"
        )
    if cuts:  # (grad mode off inside it: eager's forward mode carries the tangents on, reverse mode not)
        raise _Untraceable
    flat_out, out_spec = tree_flatten(out)
    if not all(o.dtype.is_floating_point for o in flat_out):
        raise _Untraceable
    with torch.enable_grad():  # (the backward is differentiated again: it must carry u's gradient)
        mark, first = rec.mark(), rec.num_values
        cotangents = [_differentiable(rec, o.new_zeros(o.shape), ()) for o in flat_out]
        seeds = list(zip(flat_out, [u for u, _ in cotangents]))
        pulled = _backward(rec, forward, seeds, forward.aliases, forward.specs, ())
        end = rec.num_values
        inner = rec.grad_labels(first, end)
        rec.differentiate(mark, [], [], torch.is_grad_enabled())  # (its values as the level outside sees them)
    flat_pulled = [g for tree in pulled for g in tree_flatten(tree)[0]]
    aliases = [[alias for _, alias in cotangents]]
    return VjpForward(first, end, inner, aliases, [out_spec], flat_pulled, (), rec, False)


def _detached(x):
    return x.detach() if isinstance(x, TensorProxy) else x


def linearized_tangents(transposed: VjpForward, flat_tangents: list) -> list:
    """What the jvp function of a traced ``linearize`` returns for ``flat_tangents`` (checked as
    eager checks them): ``J t``, the backward of ``J^T u`` from them, emitted after all recorded
    since, each output's tangent flat (zeros where an output does not depend on the primals)."""
    rec = active_recorder()
    if rec is not transposed.recorder or vmap_state.levels.get():
        raise ThunderNotImplementedError(
            f"torch.func.linearize's jvp function at {user_location()}: called outside the jitted call (or under a "
            "torch.vmap) that made it; thunder_rs traces it only where it was made"
        )
    seeds = list(zip(transposed.outputs, flat_tangents))
    try:
        (tree,) = _backward(rec, transposed, seeds, transposed.aliases, transposed.specs, ())
    except _Untraceable:
        raise ThunderNotImplementedError(
            f"torch.func.linearize's jvp function at {user_location()}: its tangents do not match the primals"
        ) from None
    return tree_flatten(tree)[0]
