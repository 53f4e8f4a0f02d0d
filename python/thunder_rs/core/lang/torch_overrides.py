"""What thunder_rs changes in torch while it traces a program: ``torch.compiler.is_compiling()``
answers True, ``torch.vmap`` batches traced tensors (``thunder_rs.core.lang.vmap``), a pointwise
``associative_scan`` is traced rather than compiled by torch, and custom
``torch.autograd.Function``s on traced tensors are inlined (activation checkpointing) or traced
with their own backward.

**is_compiling.** Libraries ask it to choose the path that holds for every input value, as under
``torch.compile`` and as Lightning Thunder's interpreter answers (a lookaside returning True).
The answer is the same in every acquisition, so the branch it selects holds for every call of
the trace: it is a constant of tracing, not Python state that can change between calls, and
needs no guard. ``torch._dynamo.is_compiling`` and ``torch._utils.is_compiling`` read the same
flag; ``torch.compiler.is_exporting()`` stays False. Where only eager's answer runs eager's
kernels, the library function gets it (``EAGER_ANSWERS``): transformers' SDPA attention of a
single grouped-heads query, and its mask code, which reads the padding mask's values and the
position ids to skip building a mask when no token is padded (``_ignore_causal_mask_sdpa``,
``find_packed_sequence_indices``): those reads are data-dependent reads, checked at every call
(``core.lang.values``), so a batch with padding runs the variant that builds the mask.

The flag also sends Mamba's selective scan (transformers) down its ``associative_scan`` path
instead of a Python loop over the sequence. Both compute the same recurrence (in another order of
sums: logits within 1e-7 relative of eager at 256 tokens); the scan is about 2 log2(n) rounds of a
few ops where the loop is n rounds, so its trace stays small: at 256 tokens a first call of 0.3 s
instead of 3.9 s and a training step of 51 ms instead of 334 ms (eager: 411 ms) on the CPU.

**vmap.** functorch's vmap batches below ``__torch_function__``, where proxies cannot go;
transformers 4.x builds every attention mask under ``torch.vmap``, and torch's generic
``associative_scan`` maps its combine function with it. thunder_rs's ``vmap`` batches calls on
proxies itself and runs torch's own for everything else; the level calls Dynamo's graphs hold a
vmap as (``torch._functorch.predispatch``) go to the same interpreter while a graph is traced.
A pointwise ``associative_scan`` runs its higher-order op, which torch would compile, into the
trace (decomposed in ``torch/scan.py``).

**torch.func transforms.** ``torch.func.grad``, ``grad_and_value`` and ``vjp`` of traced values
are traced, their backward emitted into the program by the VJP pass (``core.lang.traced_grads``);
``jacrev``, ``jacfwd``, ``hessian`` and ``jvp``, and a ``torch.vmap`` of one of them, run as one
eager call each (``core.lang.functorch_calls``): functorch wraps tensors below
``__torch_function__``.

**Module._apply.** ``module.to(dtype)`` in a forward (Switch Transformers' router) converts
nothing where the module has that dtype already: the module is returned as it is (eager's walk
would read every parameter's ``.grad``); a conversion that changes them is refused at the line.

**sym_sum.** Dynamo's graphs add sizes with ``torch.sym_sum`` (a KV cache's length plus the new
tokens'), which asks a ``torch.SymInt``'s SymNode; a size being traced has none, and adds as an int.

**len and int in library modules.** Python's ``len`` and ``int`` must return ints, so a size they
return is specialised. In the library modules of ``SIZED_BUILTINS`` (read per module: they only
size what they build with them) these globals, while tracing, return a traced tensor's symbolic
first size (``len``) or its value read as a symbolic int (``int``): torchvision's multi-scale RoI
pooling (``len(rois)``, Faster R-CNN ResNet-50 FPN inference compiled once per image), Mask
R-CNN's mask pasting (``int(box[2] - box[0] + 1)``) and Hugging Face's ``torch_int`` (BEiT's
relative position table, interpolated to ``torch_int`` of the image's patch counts: a compile per
image size). The mask pasting's ``max``/``min`` of a box's integer tensors and ints, which
Python's read as a bool each, give the tensor ``torch.maximum`` and ``torch.minimum`` make (the
box clamped to the image). Their reads of these globals are not guarded
(``observe.TRACING_GLOBALS``); after tracing the modules have no such globals again.

**math.** ``math.sqrt``, ``log``, ``log2``, ``log10``, ``log1p``, ``exp`` and ``expm1`` of a size
or a float of sizes (``scores / math.sqrt(d_k)``, ``math.log(max_len)``) give a symbolic float
(``core.lang.symfloat.MATH_FUNCTIONS``), which the compiled program computes with ``math``'s own
function on each call's sizes: one compile for every size where ``math``'s would need a plain
float (a compile per size). On plain numbers they are ``math``'s own, so code running meanwhile
gets the same answers. A name imported before tracing (``from math import sqrt``) is ``math``'s.

All are process-wide (the flag is torch's own ``torch.compiler._is_compiling_flag``, which
``torch.compile`` and ``torch.export`` set the same way). Acquisitions may run in several threads
at once, so the overrides are held by a count: set while any acquisition runs, restored when the
last one ends. Another thread running eager code meanwhile sees ``is_compiling()`` True, and takes
the value-independent path, which computes the same results.
"""

import contextlib
import contextvars
import importlib
import math
import sys
import threading
from types import FrameType

import torch
import torch._functorch.predispatch
import torch.compiler
import torch.func
import torch.utils.checkpoint
from torch.autograd.function import Function
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten

from thunder_rs.core.base import dtypes
from thunder_rs.core.lang import (
    autograd_functional,
    custom_function,
    dual_tensors,
    functorch_calls,
    program_builtins,
    symfloat,
    symint,
)
from thunder_rs.core.lang import vmap as thunder_vmap
from thunder_rs.core.lang import replayed_draws
from thunder_rs.core.lang.fallback import draws_again
from thunder_rs.core.lang.langctx import user_location
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.recorder import active_recorder, replaying_draws, start_prim_log, stop_prim_log
from thunder_rs.core.state.observe import TRACING_GLOBALS
from thunder_rs.errors import ThunderNotImplementedError

#: ``Function.apply`` as torch defines it (a Python classmethod before torch 2.15, a C one since).
_function_apply = Function.__dict__["apply"]


#: torch's own Functions whose backward is the gradient of their forward's ops (``setup_context``
#: style, so ``forward`` takes no ctx): traced as those ops. ``ModIndex`` is ``aten.index`` on a
#: tensor, which ``TransformGetItemToIndex`` (Hugging Face masks under vmap) makes of ``t[i]``.
_GRADIENT_OF_FORWARD = {("torch._dynamo._trace_wrapped_higher_order_op", "ModIndex")}
#: The Function module backward hooks wrap a module's inputs and outputs in (where torch keeps it).
_BACKWARD_HOOKS = {
    ("torch.utils.hooks", "BackwardHookFunction"),
    ("torch.nn.modules._functions", "BackwardHookFunction"),
}


class _Checkpointed(threading.local):
    """Per thread: how many activation-checkpointed functions the traced program is inside."""

    depth = 0


_checkpointed = _Checkpointed()


def in_checkpoint() -> bool:
    """Whether the program being traced runs an activation-checkpointed function: eager runs it
    again in the backward, so its writes to state that outlives the call happen twice there."""
    return _checkpointed.depth > 0


#: The functions of torch's non-reentrant checkpoint that enter its hooks (by torch's version).
_CHECKPOINT_GENERATORS = frozenset(
    {"_checkpoint_without_reentrant_generator", "_checkpoint_without_reentrant_generator_impl"}
)


def preserves_rng_state() -> frozenset:
    """The generators (device names) whose states the non-reentrant checkpoint whose hooks are
    being entered keeps for its recompute (locals of torch's generator that enters them): the CPU
    one, and with a device initialised those of the devices of the tensors passed; none without
    ``preserve_rng_state``."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and frame.f_code.co_name not in _CHECKPOINT_GENERATORS:
        frame = frame.f_back
    if frame is None:
        return frozenset({"cpu"})
    local = frame.f_locals
    if not local.get("preserve_rng_state", True):
        return frozenset()
    devices = local.get("fwd_devices", ()) if local.get("had_device_in_fwd") else ()
    return frozenset({"cpu", *(f"{local.get('device_type', 'cuda')}:{d}" for d in devices)})


@contextlib.contextmanager
def checkpointed(preserve_rng_state: bool | frozenset = True):
    """While the program runs an activation-checkpointed function (``in_checkpoint``); without
    ``preserve_rng_state`` its random draws are refused (``fallback.draws_again``); with the
    generators it keeps, its dropouts are drawn again in the backward (``replayed_draws``)."""
    _checkpointed.depth += 1
    draws_again.depth += not preserve_rng_state
    draws_again.regions += 1
    kept = preserve_rng_state if isinstance(preserve_rng_state, frozenset) else frozenset()
    replayed_draws.entered(kept)
    try:
        yield
    finally:
        _checkpointed.depth -= 1
        draws_again.depth -= not preserve_rng_state
        draws_again.regions -= 1
        replayed_draws.exited()


def _apply(cls, *args, **kwargs):
    """``torch.autograd.Function.apply`` while tracing: torch runs a custom Function's forward below
    ``__torch_function__`` with grad mode off and would attach its own backward to proxies.
    Reentrant activation checkpointing (``CheckpointFunction``) only recomputes its function in
    the backward, so in a trace it is the call of that function (without grad where no input
    requires grad, as eager's outputs then have none); any other Function is traced
    with its own backward as its grad rule (``thunder_rs.core.lang.custom_function``)."""
    # (a tensor the program holds, such as a parameter it reads through a closure, is traced too:
    # run eagerly, its gradient would not reach the parameter)
    if active_recorder() is None or not any(isinstance(x, torch.Tensor) for x in tree_leaves((args, kwargs))):
        return _function_apply.__get__(None, cls)(*args, **kwargs)
    if cls is torch.utils.checkpoint.CheckpointFunction:
        run_function, preserve_rng_state, *inputs = args
        # Eager's Function runs it without grad, and its outputs carry a gradient (computed again in
        # the backward) only when an input requires grad: else the parameters inside get none.
        requiring = any(isinstance(a, torch.Tensor) and a.requires_grad for a in inputs)
        if torch.is_grad_enabled() and requiring:
            return _differentiated_checkpoint(run_function, preserve_rng_state, inputs)
        with checkpointed(preserve_rng_state), torch.no_grad():
            return run_function(*inputs)
    if (cls.__module__, cls.__qualname__) in _GRADIENT_OF_FORWARD:
        return cls.forward(*args, **kwargs)
    if (cls.__module__, cls.__qualname__) in _BACKWARD_HOOKS:
        raise ThunderNotImplementedError(
            f"register_full_backward_hook: a module called at {user_location()} has backward hooks (its own, or global "
            "ones: register_module_full_backward_hook), which hook the autograd nodes of its inputs and outputs; "
            "inside the jitted program these have none. Register backward hooks on the jitted module itself, or "
            "compute what the hook does in the program"
        )
    return custom_function.apply(cls, args, kwargs)


def _differentiated_checkpoint(run_function, preserve_rng_state: bool, inputs: list):
    """A reentrant checkpoint whose outputs require grad: its function traced with grad, as eager's
    backward runs it again. Where eager's forward, which runs it without grad, chooses other
    kernels (SDPA's flash where a mask that requires grad takes the math path), the function is
    traced a second time without grad: the outputs have those values, and the gradient of the
    first (``_ForwardValues``)."""
    with checkpointed(preserve_rng_state):
        kernels, draws = draws_again.grad_kernels, draws_again.draws
        log: list[tuple] = []
        start_prim_log(log)
        try:
            recomputed = _reentrant_region(run_function, inputs)
        finally:
            stop_prim_log()
        if draws_again.grad_kernels == kernels:
            return recomputed
        uniform = [(args, outs[0]) for name, args, outs in log if name == "uniform"]
        if draws_again.draws - draws != len(uniform):
            raise ThunderNotImplementedError(
                f"torch.utils.checkpoint (use_reentrant=True) at {user_location()}: the checkpointed function draws "
                "random numbers other than by torch.rand or dropout and chooses other kernels without grad (eager's "
                "forward) than with it (its backward's recompute: SDPA's math path for a mask that requires grad); "
                "draw outside the checkpointed function, or use use_reentrant=False"
            )
        # (eager's backward draws again what its forward drew: the generator's state restored)
        with torch.no_grad(), replaying_draws(uniform):
            forward = run_function(*inputs)
    values, spec = tree_flatten(forward)
    gradients = tree_leaves(recomputed)
    if len(gradients) != len(values):
        raise ThunderNotImplementedError(
            f"torch.utils.checkpoint (use_reentrant=True) at {user_location()}: the checkpointed function returns "
            "other outputs without grad than with it"
        )
    pairs = zip(values, gradients)
    flat = [custom_function.apply(_ForwardValues, (v, g), {}) if _differentiable(g) else v for v, g in pairs]
    return tree_unflatten(flat, spec)


def _differentiable(x) -> bool:
    return isinstance(x, TensorProxy) and x.requires_grad


class _ForwardValues(Function):
    """A reentrant checkpoint's output as eager's forward computed it (without grad), whose
    gradient goes to the output its backward's recompute (with grad) computed."""

    @staticmethod
    def forward(ctx, forward, recomputed):
        return forward.view_as(forward)

    @staticmethod
    def backward(ctx, grad):
        return None, grad


#: Per acquisition: its recorder and the reentrant checkpoints traced into it (``noting_checkpoints``).
_reentrant: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_reentrant", default=None)


class _Noted(list):
    """The reentrant checkpoints noted, and in ``recomputed`` the non-reentrant ones
    (``non_reentrant_region``)."""

    def __init__(self) -> None:
        super().__init__()
        self.recomputed: list[tuple[int, int]] = []


@contextlib.contextmanager
def noting_checkpoints(rec):
    """While ``rec`` records a program: the list of the reentrant activation checkpoints it runs
    with grad, ``(first value id, end value id, ids of the tensors passed, the user's line)`` each, whose gradients
    the VJP pass sums apart as eager's backward of each does (``passes::reentrant``); its
    ``recomputed``: the non-reentrant ones, ``(first value id, end value id)`` each, whose calls
    the backward runs again instead of saving what they define (``passes::split``)."""
    noted = _Noted()
    token = _reentrant.set((rec, noted))
    try:
        yield noted
    finally:
        _reentrant.reset(token)


class NonReentrantRegion:
    """A non-reentrant checkpoint's function running (torch's hooks entered, ``autograd``): the
    values recorded meanwhile at the top level of the acquisition's recorder are noted, as eager's
    backward computes them again from the checkpoint's inputs instead of keeping what its nodes
    saved (a nested checkpoint's lie inside its outer one's)."""

    def __init__(self) -> None:
        noting = _reentrant.get()
        top = noting is not None and active_recorder() is noting[0] and not noting[0].depth
        self.noting: tuple | None = noting if top else None
        self.start: int = noting[0].num_values if top else 0

    def close(self) -> None:
        if self.noting is not None:
            rec, noted = self.noting
            noted.recomputed.append((self.start, rec.num_values))


def _reentrant_region(run_function, inputs: list):
    """``run_function(*inputs)``, noted as a reentrant checkpoint where it is recorded at the top
    level of the acquisition's recorder (the values it defines are those numbered meanwhile)."""
    noting = _reentrant.get()
    if noting is None or active_recorder() is not noting[0] or noting[0].depth:
        return run_function(*inputs)
    rec, noted = noting
    start = rec.num_values
    out = run_function(*inputs)
    noted.append((start, rec.num_values, [a._vid for a in inputs if isinstance(a, TensorProxy)], user_location()))
    return out


_module_apply = torch.nn.Module._apply


def _module_apply_in_trace(self, fn, recurse=True):
    """``Module._apply`` (``module.to``, ``.float()``, ``.cuda()``) while tracing, on a module
    whose parameters or buffers are traced: a conversion that leaves every one of them as it is
    (``self.classifier.to(self.dtype)`` in Switch Transformers' router, called in every forward)
    returns the module, as eager's leaves it; eager's walk would read each parameter's ``.grad``,
    which a trace cannot. One that would change them changes state that outlives the call, and
    is refused at the user's line."""
    if active_recorder() is None:
        return _module_apply(self, fn, recurse)
    modules = self.modules() if recurse else (self,)
    tensors = [t for m in modules for t in (*m._parameters.values(), *m._buffers.values()) if t is not None]
    if not any(isinstance(t, TensorProxy) for t in tensors):
        return _module_apply(self, fn, recurse)
    if all(fn(t) is t for t in tensors):
        return self
    raise ThunderNotImplementedError(
        f"{type(self).__name__}.to (Module._apply) at {user_location()}: the program converts a module's parameters "
        "or buffers (dtype, device or memory format) while it is traced, which changes them for the calls after; "
        "convert the module before calling the jitted one"
    )


#: The module (``torch._higher_order_ops.associative_scan`` names the function, not the module).
associative_scan_module = importlib.import_module("torch._higher_order_ops.associative_scan")
_compile_and_run = associative_scan_module._maybe_compile_and_run_fn


def _scan_in_trace(fn, *args):
    """How ``associative_scan(..., combine_mode="pointwise")`` runs its higher-order op: torch
    compiles it to get a fused kernel, which on proxies cannot work; while tracing thunder_rs is
    that compiler, so the op runs as under Dynamo, into the trace (``torch/scan.py``)."""
    if active_recorder() is None or not any(isinstance(x, TensorProxy) for x in tree_leaves(args)):
        return _compile_and_run(fn, *args)
    return fn(*args)


#: The module whose ``_hop_compile_and_call`` runs ``torch.cond`` (and other higher-order ops) eagerly.
hop_utils_module = importlib.import_module("torch._higher_order_ops.utils")
_hop_compile_and_call = hop_utils_module._hop_compile_and_call


def _hop_in_trace(fn, args, kwargs=None):
    """How eager runs ``torch.cond(pred, true_fn, false_fn, operands)`` of a tensor predicate:
    torch compiles the op with Dynamo, which cannot trace proxies (it failed inside thunder_rs's
    observer). Eager's result is the branch the predicate picks, which is what the trace runs without
    grad: the predicate a data-dependent read checked on every call, as ``if pred:`` is. Under grad
    mode it is refused naming the line (eager's backward gives the untaken branch's parameters zero
    gradients), and so are other higher-order ops (``while_loop``, ``invoke_subgraph``)."""
    if active_recorder() is None or not any(isinstance(x, TensorProxy) for x in tree_leaves((args, kwargs))):
        return _hop_compile_and_call(fn, args, kwargs)
    if fn.__name__ == "_cond_op_wrapper" and not torch.is_grad_enabled():
        pred, true_fn, false_fn, operands = args
        return (true_fn if bool(pred) else false_fn)(*operands)
    if fn.__name__ == "_cond_op_wrapper":
        raise ThunderNotImplementedError(
            f"torch.cond at {user_location()} under grad mode: eager's backward gives the tensors the branch not "
            "taken reads (its parameters) zero gradients, which a trace of the branch taken cannot give; call it "
            "under torch.no_grad(), or write the branch as Python control flow (if pred: ...)"
        )
    name = fn.__name__.strip("_").removesuffix("_op_wrapper").removesuffix("_op")
    raise ThunderNotImplementedError(
        f"torch higher-order op {name} at {user_location()}: thunder_rs does not trace it (eager compiles it with "
        "Dynamo); write it as Python control flow in the jitted function, or use torch.compile"
    )


#: Library functions (module, function) that get the eager answer to ``is_compiling()``, whose two
#: branches both trace but only eager's runs eager's kernels:
#: - transformers' SDPA attention packs a single query's grouped heads (``pack_gqa``) outside
#:   compilation and repeats the keys' heads under it (a GQA model's decoding logits with a
#:   padding mask differed in float32's last bits);
#: - transformers' mask builders read the padding mask (``fast_all``, ``.all()``) and the position
#:   ids (packed sequences) to leave causality to SDPA's ``is_causal`` and an unpadded batch's
#:   attention unmasked, unless told they are traced. Their reads are data-dependent reads with a
#:   check per call (``core.lang.values``): a batch with padding runs the variant that builds
#:   the mask, one without it eager's unmasked (flash) kernels, whose gradients the general mask's
#:   did not give (Llama's, an ulp apart).
EAGER_ANSWERS = frozenset(
    {
        ("transformers.integrations.sdpa_attention", "sdpa_attention_forward"),
        ("transformers.masking_utils", "_ignore_causal_mask_sdpa"),
        ("transformers.masking_utils", "_ignore_bidirectional_mask_sdpa"),
        ("transformers.masking_utils", "find_packed_sequence_indices"),
    }
)
#: The helpers through which those functions ask (``is_tracing`` asks ``is_torchdynamo_compiling``):
#: the question is their caller's.
_ASKING_HELPERS = frozenset(
    {("transformers.utils.import_utils", "is_torchdynamo_compiling"), ("transformers.utils.import_utils", "is_tracing")}
)


_torch_is_compiling = torch.compiler.is_compiling


def _is_compiling() -> bool:
    """``torch.compiler.is_compiling()`` while tracing: True, but to ``EAGER_ANSWERS``' functions
    (asking directly, or through the helpers of ``_ASKING_HELPERS``). Outside every acquisition,
    torch's own answer: a module first imported while a program was traced (``torch._dynamo``,
    whose ``mark_static`` asks) binds this function by ``from torch.compiler import is_compiling``
    for good."""
    if not _active:
        return _torch_is_compiling()
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and (frame.f_globals.get("__name__"), frame.f_code.co_name) in _ASKING_HELPERS:
        frame = frame.f_back
    return frame is None or (frame.f_globals.get("__name__"), frame.f_code.co_name) not in EAGER_ANSWERS


#: What tracing sets: (module, attribute) -> value. These are constants of tracing, the same in
#: every acquisition: guards on Python state read while tracing must not record reads of them
#: (outside tracing they hold torch's values, so a guard on them would never pass).
OVERRIDES: dict[tuple[object, str], object] = {
    (torch.compiler, "_is_compiling_flag"): True,
    (torch.compiler, "is_compiling"): _is_compiling,
    (torch, "vmap"): thunder_vmap.vmap,
    (torch.func, "vmap"): thunder_vmap.vmap,
    # A vmap imported before tracing (``from torch.func import vmap``) still reaches this.
    (torch._functorch.apis, "vmap_impl"): thunder_vmap.vmap_entry,
    (Function, "apply"): classmethod(_apply),
    (torch.nn.Module, "_apply"): _module_apply_in_trace,
    # Dynamo's graphs hold a ``torch.vmap`` as these level calls (``thunder_rs.core.lang.vmap``).
    **{(torch._functorch.predispatch, name): fn for name, fn in thunder_vmap.PREDISPATCH.items()},
    (associative_scan_module, "_maybe_compile_and_run_fn"): _scan_in_trace,
    # torch.cond of a traced predicate: the branch it picks (eager compiles the op with Dynamo)
    (hop_utils_module, "_hop_compile_and_call"): _hop_in_trace,
    # torch.func.grad/jacrev/... of traced values run eagerly, as one call (``core.lang.functorch_calls``)
    **functorch_calls.OVERRIDES,
    # torch.autograd.functional's jvp/vjp/hvp/vhp/jacobian/hessian by the traced torch.func transforms
    **autograd_functional.OVERRIDES,
    # an in-place write to a dual writes its tangent tensor too, by the level's end (``core.lang.dual_tensors``)
    (torch.autograd.forward_ad, "exit_dual_level"): dual_tensors.exit_dual_level,
    (torch, "sym_sum"): symint.sym_sum,
    # ``math.sqrt(d_k)``, ``math.log(max_len)`` of a size: a float computed on each call
    **{(math, name): fn for name, fn in symfloat.MATH_FUNCTIONS.items()},
}


def _sized_len(obj):
    """``len`` in the library modules of ``SIZED_BUILTINS`` while tracing: a traced tensor's first
    size as it is, symbolic where it is. Python's ``len`` must return an int, which specialises the
    size (torchvision's multi-scale RoI pooling sizes its output by ``len(rois)``, the count of
    boxes ``nms`` kept: a compile per image); the size goes where the module takes it, and what
    decides on it records a guard (``core.lang.symint``)."""
    if isinstance(obj, TensorProxy) and obj.ndim > 0 and active_recorder() is not None:
        return obj.shape[0]
    return len(obj)


def _sized_int(x=0, *base):
    """``int`` in the library modules of ``SIZED_BUILTINS`` while tracing: of a traced integer or
    floating tensor, its value truncated toward zero as ``int`` does, read as ``item()`` reads an
    int, so a symbolic size once it changed between calls (``values``); of a symbolic size,
    itself. Python's ``int`` must return an int: Mask R-CNN's mask pasting sizes each box's mask by
    ``int(box[2] - box[0] + 1)``, a compile per image. A value the cast would not keep (NaN, inf,
    beyond 2**62) takes eager's own ``int`` (its error, or the exact int), checked per call."""
    if not base and active_recorder() is not None:
        if isinstance(x, TensorProxy) and (x.dtype.is_floating_point or dtypes.is_int(x.dtype)):
            if x.ndim > 0 and x.numel() != 1:
                return x.__int__()  # (eager's error)
            if x.dtype.is_floating_point:
                if not bool(torch.isfinite(x) & (x.abs() < 2.0**62)):
                    return x.__int__()
                x = x.to(torch.int64)
            return x.item()
        if isinstance(x, symint.SymInt):
            return x
    return int(x, *base)


def _integer_scalar(x) -> bool:
    """A traced 0-dim integer tensor (not bool), or a Python int or size."""
    if isinstance(x, TensorProxy):
        return x.ndim == 0 and dtypes.is_int(x.dtype) and x.dtype is not torch.bool
    return type(x) in (int, symint.SymInt)


def _tensor_extreme(builtin, pick):
    """``max``/``min`` in the library modules of ``SIZED_BUILTINS`` while tracing: of two integers
    one of which is a traced 0-dim integer tensor (of another dtype than a second one: none), the
    extreme as a tensor (``pick``: ``torch.maximum``/``torch.minimum``) where Python's reads the
    comparison as a bool. Mask R-CNN's mask pasting clamps each box to the image with
    ``max(box[0], 0)``: a read per box, whose pattern of outcomes differed per image. Equal values
    either way; ints have no NaN to propagate or not. Other arguments take the builtin."""

    def extreme(*args, **kwargs):
        if len(args) == 2 and not kwargs and active_recorder() is not None and all(map(_integer_scalar, args)):
            tensors = [a for a in args if isinstance(a, TensorProxy)]
            if tensors and len({t.dtype for t in tensors}) == 1:
                a, b = (x if isinstance(x, TensorProxy) else torch.tensor(x, dtype=tensors[0].dtype) for x in args)
                return pick(a, b)
        return builtin(*args, **kwargs)

    extreme.__name__ = extreme.__qualname__ = f"_sized_{builtin.__name__}"
    return extreme


_sized_max = _tensor_extreme(max, torch.maximum)
_sized_min = _tensor_extreme(min, torch.minimum)

#: Library modules whose ``len``/``int`` of a traced tensor only size what they build and whose
#: ``max``/``min`` of tensors give bounds (read through their source, per module): while
#: tracing, these globals of theirs are the above.
SIZED_BUILTINS: dict[str, dict[str, object]] = {
    "torchvision.ops.poolers": {"len": _sized_len},
    "torchvision.models.detection.roi_heads": {"int": _sized_int, "max": _sized_max, "min": _sized_min},
    # Hugging Face's ``torch_int``, int() of a size: BEiT's relative position table, interpolated to
    # ``(torch_int(2 * window_size[0] - 1), ...)`` of the image's patches
    "transformers.utils.generic": {"int": _sized_int},
}
TRACING_GLOBALS.update(map(id, (_sized_len, _sized_int, _sized_max, _sized_min)))
_ABSENT = object()

_lock = threading.Lock()
_active = 0
_saved: dict = {}


def _install() -> dict:
    overrides = dict(OVERRIDES)
    for module_name, names in SIZED_BUILTINS.items():
        if module_name in sys.modules:
            overrides.update({(sys.modules[module_name], name): fn for name, fn in names.items()})
    # The raw entries: ``getattr`` of a classmethod returns a bound method, not what to restore.
    saved = {(owner, name): owner.__dict__.get(name, _ABSENT) for owner, name in overrides}
    for (owner, name), value in overrides.items():
        setattr(owner, name, value)
    return saved


def _restore(saved: dict) -> None:
    for (module, name), value in saved.items():
        if value is _ABSENT:
            delattr(module, name)
        else:
            setattr(module, name, value)


@contextlib.contextmanager
def tracing_overrides():
    """Holds the overrides for the duration of an acquisition."""
    global _active, _saved
    with _lock:
        if _active == 0:
            _saved = _install()
        _active += 1
    try:
        with thunder_vmap.level_scope():
            yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                _restore(_saved)
                program_builtins.take_away()
