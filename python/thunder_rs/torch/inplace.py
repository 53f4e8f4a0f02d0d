"""In-place torch calls, functionalised: what ``x.add_(y)``, ``x += y``, ``x[i] = v``, ``out=`` and
``inplace=True`` mean while a program is traced.

Each computes its value out of place (the ltorch symbol of the out-of-place op, or an eager
fallback of it) and ``assign``s it: converted to the written tensor's dtype and broadcast to its
shape as eager's in-place op does (refusing what eager refuses, with eager's error type), then
written (``views.write``): the very ``TensorProxy`` the program holds stands for the new value
from then on, and so do the tensors that share its memory. When the written tensor is a trace
input, ``thunder_rs.core.acquisition.writeback`` copies its final value back after each call. No executor
ever receives an in-place call or ``inplace=True``.

The mapping is one rule, applied to every in-place callable torch has (``Tensor.name_``,
``torch.name_``, ``Tensor.__iname__``, functions with an ``inplace`` argument): its out-of-place
form ``name`` when torch has one, else the in-place op itself run on a copy. In-place calls that
change a tensor's shape, storage or autograd flags (``unsqueeze_``, ``resize_``, ``set_``,
``detach_``) are refused with an error naming the call and the user's line, but on a tensor the
program computed that no view shares (``squeeze_``, ``unsqueeze_``, ``detach_``). Indexed assignment
is ``setitem.py``'s, the forwards that write their arguments (batch norm's running statistics,
embedding's ``max_norm``) are ``forward_writes.py``'s: both ``assign`` as these do.
"""

import inspect
import types

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten, tree_unflatten

from thunder_rs import clang, prims
from thunder_rs.core.base import problems
from thunder_rs.core.lang import inner_leaves, traced_grads, version_tracking
from thunder_rs.core.lang.complex_calls import complex_grads, differentiates_complex
from thunder_rs.core.lang.fallback import user_fallback
from thunder_rs.core.lang.eager_layouts import take_layouts
from thunder_rs.core.lang.langctx import (
    MUTATING,
    TORCH_TO_LTORCH,
    set_out_handler,
    torch_function,
    user_location,
)
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.base.userframe import warn_at_user_frame
from thunder_rs.core.lang.rng import is_random
from thunder_rs.core.lang.torch_overrides import in_checkpoint
from thunder_rs.errors import (
    ThunderNotImplementedError,
    ThunderRuntimeError,
    ThunderTypeError,
    check,
)
from thunder_rs.torch import complex_views, narrowed_writes, saved_writes, view_scatters, views
from thunder_rs.torch.out_checks import check_out, in_out_dtype
from thunder_rs.torch.overlaps import check_partial_overlap, is_pointwise
from thunder_rs.torch.activations import DIFFERENTIATED_FROM_RESULT
from thunder_rs.torch.autograd import detach
from thunder_rs.torch.common import is_number
from thunder_rs.torch.creation import filled
from thunder_rs.torch.random import DRAWN_IN_PLACE, IN_PLACE_SAMPLERS
from thunder_rs.torch.scatter import fill
from thunder_rs.torch.shape import clone
from thunder_rs.torch.strides import is_contiguous
from thunder_rs.torch.common import SCALAR_NAMES
from thunder_rs.core.lang.symint import SymInt, hint, identical, same_shape


def _leaf_check(op: str, dst) -> None:
    """Eager's error for an in-place write to a leaf that requires grad, or a view of one, or
    to a view whose autograd history eager refuses (``TensorProxy._history_error``)."""
    root = views.root_of(dst)
    if root._history_error is not None and torch.is_grad_enabled():
        raise ThunderRuntimeError(f"{op}: {root._history_error} (at {user_location()})")
    if root._leaf and torch.is_grad_enabled():
        what = "a leaf Variable" if root is dst else "a view of a leaf Variable"
        if problems.note(problems.INPLACE_LEAF, op, f"{what} that requires grad is written in place"):
            return
        raise ThunderRuntimeError(
            f"{op}: {what} that requires grad is being used in an in-place operation. (at {user_location()})"
        )


def _as_value(op: str, dst, value, copy: bool):
    """``value`` as a tensor of ``dst``'s dtype, device and shape, as eager's in-place op converts it."""
    if not isinstance(value, torch.Tensor):
        check(
            is_number(value),
            op,
            lambda: f"expected a tensor or a number, got {type(value).__name__}",
            ThunderTypeError,
        )
        return filled(tuple(dst.shape), value, dst.device, dst.dtype)  # a size (or float of sizes): per call
    if not copy and not torch.can_cast(value.dtype, dst.dtype):
        have, want = (SCALAR_NAMES.get(d, str(d)) for d in (value.dtype, dst.dtype))
        raise ThunderRuntimeError(
            f"{op}: result type {have} can't be cast to the desired output type {want} (at {user_location()})"
        )
    shape = clang.broadcast_shapes(op, dst.shape, value.shape)
    check(
        shape == tuple(dst.shape),
        op,
        lambda: (
            f"output with shape {list(dst.shape)} doesn't match the broadcast shape {list(shape)} "
            f"(at {user_location()})"
        ),
        ThunderRuntimeError,
    )
    if value.device != dst.device:
        value = prims.device_put(value, dst.device)
    return clang.expand_to(clang.maybe_convert(value, dst.dtype), dst.shape)


def _whole_intermediate(dst) -> bool:
    """Whether ``dst`` is a tensor the program computed, not a view: eager's in-place write keeps
    its layout (channels_last, transposed), which the trace does not know, so the new value must
    take it from ``dst``. A trace input's new value is copied back into the caller's own tensor,
    and a view's is scattered into its root: either keeps its layout. A tensor the program made
    from Python values (``_per_call``) is an input copied per call, the call's own, as computed."""
    return dst._view is None and (dst._input_vid is None or dst._per_call)


def _fills(dst, value, copy: bool) -> bool:
    """Whether writing ``value``, a number or a 0-dim tensor, is ``fill(dst, value)`` (torch's
    ``empty_like(dst).fill_(value)``), which keeps ``dst``'s layout, rather than a new contiguous
    full tensor, which needs nothing of ``dst``: the latter where a factory made ``dst``
    contiguous (``torch.zeros(n).fill_(1)`` stays one kernel)."""
    if not copy or not _whole_intermediate(dst) or dst._made_contiguous:
        return False
    if isinstance(value, torch.Tensor):
        return value.ndim == 0 and value.device == dst.device
    return isinstance(value, (bool, int, float, SymInt))


def _copied(dst, value):
    """The value a copy writes over the whole of an intermediate ``dst``: memory of its own, as
    eager's copy is, and contiguous where eager's ``dst`` is (``_made_contiguous``). Written as it
    is, a view of another tensor would be returned as that view (a write to it changes the other).
    A broadcast value stays expanded (``assign`` marks it a copy to make if it is returned)."""
    if value._view is not None:
        return clone(value, memory_format=torch.contiguous_format if dst._made_contiguous else torch.preserve_format)
    if dst._made_contiguous and value._strides is not None:  # a non-contiguous input
        return clone(value, memory_format=torch.contiguous_format)
    return value


def _made_like(value, dst) -> bool:
    """Whether ``value`` is a tensor a call computed in ``dst``'s layout (its own copy already)."""
    mine, theirs = value._strides, dst._strides
    if value._view is not None or value._input_vid is not None or mine is None or len(mine) != len(theirs):
        return False
    return all(identical(a, b) for a, b in zip(mine, theirs))


def _nowhere(dst):
    """A condition false everywhere, broadcast from a 0-dim tensor: its strides are all zero, so
    in ``where(nowhere, dst, value)`` ``dst`` decides the layout, as eager's in-place write does."""
    return clang.expand_to(prims.full((), False, dst.device, torch.bool), tuple(dst.shape))


def _checkpoint_check(op: str, root) -> None:
    """Refuses a write to state that outlives the call (a parameter, buffer or input) inside an
    activation-checkpointed function while grad is on: eager runs the function again in the
    backward and writes it a second time (BatchNorm's running statistics take two updates)."""
    if root._input_vid is not None and torch.is_grad_enabled() and in_checkpoint():
        raise ThunderNotImplementedError(
            f"torch.utils.checkpoint: {op} at {user_location()} writes a tensor that outlives the call (a parameter, "
            "buffer or input: BatchNorm's running statistics) inside a checkpointed function; eager runs the function "
            "again in the backward and writes it a second time, which the compiled call cannot. Call that layer "
            "outside the checkpoint, or in eval mode"
        )


def assign(dst, value, op: str, *, copy: bool = False, tracked: bool = True, overwrite: bool = False, versioned=None):
    """Writes ``value`` into ``dst`` as eager's in-place op ``op`` does; returns ``dst``.

    A copy (``copy_``, ``fill_``, indexed assignment) converts any dtype; other in-place ops only
    to a dtype eager may cast their result to. ``tracked=False`` writes a value autograd does not
    see (BatchNorm's running statistics), as a write under ``torch.no_grad()`` does. ``overwrite``:
    the op computes ``value`` from ``dst``'s old value (``views.write``). ``versioned``: whether
    the write bumps eager's version counter (``saved_writes``); by default where it is ``tracked``.
    """
    check(
        isinstance(dst, TensorProxy),
        op,
        lambda: f"expected a tensor to write, got {type(dst).__name__}",
        ThunderTypeError,
    )
    if views.same_memory(dst, value):  # ``y[1:] *= 2`` assigns the updated view to itself
        return dst
    given = value
    fills = _fills(dst, value, copy)
    # A broadcast copy over the whole of an intermediate: eager's elements are apart, the trace's
    # expanded value shares their memory, which only a returned tensor must not (``_apart``
    # copies a ``_copy_of``): ops that read it take it as it is.
    expanded = selected = False
    if fills:
        value = fill(dst, value)
    else:
        # (a size is filled in by broadcasting its 0-dim tensor: ``_as_value``)
        broadcasts = type(value) is SymInt
        broadcasts |= isinstance(value, torch.Tensor) and not same_shape(value.shape, dst.shape)
        value = _as_value(op, dst, value, copy)
        whole = _whole_intermediate(dst)
        if whole and dst._strides is not None and not _made_like(value, dst):
            # Eager writes into dst, laid out in another order (``empty_like(x, memory_format=...)``,
            # an op of a channels_last input): the value is selected into that layout.
            value, selected = prims.where(_nowhere(dst), dst, value), True
        elif copy and whole:
            value, expanded = _copied(dst, value), broadcasts
    if tracked if versioned is None else versioned:
        saved_writes.written(dst, op, value, tracked)
    tracked = tracked and not views.detached(dst)
    if tracked and torch.is_grad_enabled():
        views.refuse_no_grad_view(op, dst, given)
    if tracked:
        _leaf_check(op, dst)
    root = views.root_of(dst)
    traced_grads.refuse_captured_write(op, root)
    _checkpoint_check(op, root)
    with torch._C.DisableTorchFunctionSubclass():
        root_grad, value_grad = root.requires_grad, value.requires_grad
    root_grad = root_grad and root._history_error is None  # (no gradient reaches a history eager refuses)
    complex_grad = root.dtype.is_complex and (root_grad or value_grad) and torch.is_grad_enabled()
    if root is not dst and (complex_grad or (complex_views.taken_eagerly(dst) and not (root_grad or value_grad))):
        complex_views.write(op, dst, given, complex_grad, tracked)  # (eager's write, on a copy)
        dst._copy_of = expanded
        return dst
    if root is not dst and dst.dtype.is_complex and (root_grad or value_grad) and torch.is_grad_enabled():
        raise ThunderNotImplementedError(f"{op}: {_COMPLEX_VIEW_WRITE} (at {user_location()})")
    if tracked and torch.is_grad_enabled():
        rebase(dst)
        if copy and root_grad and dst.numel() == root.numel() and not (fills or selected or overwrite):
            # Overwritten whole, the tensor's history still gets a (zero) gradient, as in eager.
            value, expanded = prims.where(_nowhere(dst), dst, value), False
        # (``slice_overwrite`` without grad too: a write the passes may run in place, ``passes::reinplace``,
        # where a user's ``slice_scatter``, a new tensor, is not)
        views.write(op, dst, value, root_grad or value_grad, overwrite=overwrite)
        if complex_grad:  # (its views taken again by eager's ops: the shape prims' rules are for real values)
            complex_views.refresh(root)
    else:
        if value_grad and not root_grad:
            value = view_scatters.stop_gradient(value)
        views.write(op, dst, value, root_grad, view_scatters.straight_through if root_grad else None)
    dst._copy_of = expanded
    return dst


def rebase(dst) -> None:
    """Before a write autograd sees through the view ``dst``: its root (contiguous, requiring
    grad) becomes ``base_of_write`` of itself, and its live views (``dst`` too) follow, so that
    the whole gradient the write sends back to the root's history, through the written part and
    the rest, is laid out as eager's CopySlices lays it out. Once per value of the root."""
    link = dst._view
    if not torch.is_grad_enabled() or views.detached(dst) or (link is None and dst._view_grad is None):
        return
    # (a trace input that is a view in eager, written whole: its base's CopySlices lays out the gradient)
    root = dst if link is None else link.root
    if root._based_vid == root._vid or root.dtype.is_complex:  # (complex: eager's ops lay it out)
        return
    if root._strides is not None and not is_contiguous(root.shape, root._strides):
        if view_scatters.memory_order(root) is None:
            return
    with torch._C.DisableTorchFunctionSubclass():
        if not root.requires_grad or root._history_error is not None:
            return
    views.rebind(root, view_scatters.base_of_write(root), True)
    root._based_vid = root._vid
    views.refresh(root, True)


# -- in-place methods and functions ----------------------------------------------------------------

#: In-place calls that change what a tensor is, not its values: a proxy's shape, storage and
#: autograd identity are fixed.
_REFUSED = {
    **dict.fromkeys(
        (
            "unsqueeze_",
            "squeeze_",
            "t_",
            "transpose_",
            "swapaxes_",
            "swapdims_",
            "as_strided_",
            "resize_",
            "resize_as_",
            "set_",
            "sparse_resize_",
            "sparse_resize_and_clear_",
            "resize_as_sparse_",
        ),
        "changes the tensor's shape or storage in place; use the out-of-place form",
    ),
    **dict.fromkeys(("detach_", "share_memory_"), "changes the tensor's autograd state or sharing in place"),
    **dict.fromkeys(("apply_", "map_", "map2_"), "runs a Python callable on each element, which a trace cannot"),
}
_COMPLEX_VIEW_WRITE = "writing through a complex view of a real tensor that carries a gradient is not supported"
#: Augmented assignment operators and the operators they update with.
_AUGMENTED = {
    "__iadd__": "__add__",
    "__isub__": "__sub__",
    "__imul__": "__mul__",
    "__itruediv__": "__truediv__",
    "__idiv__": "__truediv__",
    "__ifloordiv__": "__floordiv__",
    "__imod__": "__mod__",
    "__ipow__": "__pow__",
    "__iand__": "__and__",
    "__ior__": "__or__",
    "__ixor__": "__xor__",
    "__ilshift__": "__lshift__",
    "__irshift__": "__rshift__",
}
_on_copies: dict = {}


def on_copy(fn):
    """``fn``, an in-place op, run on a copy of its first argument: its functional form, as one
    eager fallback (the same function object each time, so one fallback symbol)."""
    functional = _on_copies.get(fn)
    if functional is None:

        def functional(a, *args, **kwargs):
            return fn(a.clone(), *args, **kwargs)

        functional.__name__ = functional.__qualname__ = f"{fn.__name__}on_copy"
        _on_copies[fn] = functional
    return functional


def _read_to_overwrite(a):
    """The view ``a`` as the in-place op that overwrites it reads it: taken from its root again,
    its slices by ``slice_to_overwrite``, whose gradient joins the write's (``slice_overwrite``)
    as eager's CopySlices joins them."""
    link = a._view if isinstance(a, TensorProxy) else None
    if link is None or not torch.is_grad_enabled() or views.detached(a):
        return a
    if not all(type(step) is views.PrimStep for step in link.steps):
        return a
    with torch._C.DisableTorchFunctionSubclass():
        if not a.requires_grad:
            return a
    read = link.root
    for step in link.steps:
        read = view_scatters.slice_to_overwrite(read, *step.params) if step.name == "slice" else step.forward(read)
    return read


#: In-place divisions of complex64 values: eager's in-place kernel rounds otherwise than its
#: out-of-place one (which the trace's ``div`` computes as) for most lengths (2, 4-7, 10-15, ...),
#: so they are eager's op on a copy, with or without gradients (complex128's agree).
_COMPLEX64_DIVISIONS = frozenset({"div_", "divide_", "true_divide_", "__itruediv__", "__idiv__"})


def _computed_by_eager(name: str, symbol, a, args, kwargs) -> bool:
    """Whether an in-place op is computed by eager's op on a copy: complex values carrying gradients
    (``core.complex_calls``) where its out-of-place ``symbol`` is not marked ``complex_grads`` or
    ``a`` is a view (``z.mul_(w)``, ``z.sin_()`` of a tensor not a view are traced as ``z * w``,
    ``z.sin()`` are), or a complex number
    operand (the trace's numbers are real) into a complex tensor; into a real tensor, eager's op
    raises, as this does."""
    number = next((x for x in (*args, *kwargs.values()) if type(x) is complex), None)
    if number is not None and isinstance(a, TensorProxy) and not a.dtype.is_complex:
        result = torch.result_type(torch.empty((), dtype=a.dtype, device="meta"), number)
        have, want = (SCALAR_NAMES.get(d, str(d)) for d in (result, a.dtype))
        raise ThunderRuntimeError(
            f"{name}: result type {have} can't be cast to the desired output type {want} (at {user_location()})"
        )
    if number is not None or (name in _COMPLEX64_DIVISIONS and getattr(a, "dtype", None) == torch.complex64):
        return True
    if not differentiates_complex((a, *args), kwargs):
        return False
    # (a view's write joins its base's gradient through view scatters, whose rules are real ones)
    return getattr(a, "_view", None) is not None or not complex_grads(symbol, (a, *args), kwargs)


def _in_place(fn, name: str, outplace):
    """``fn`` (in place): ``outplace`` when thunder_rs maps it (same arguments), else ``fn`` on a copy."""
    symbol = IN_PLACE_SAMPLERS.get(fn) or TORCH_TO_LTORCH.get(outplace)
    symbol = getattr(symbol, "symbol", None) or symbol  # (an ``inplace=`` function's: its ltorch symbol)
    facts = {"inplace": True} if symbol in DIFFERENTIATED_FROM_RESULT else {}

    def in_place(a, *args, **kwargs):
        if is_pointwise(name):  # (asked at the first call: a lookup in torch.ops at import is slow)
            check_partial_overlap(name, a, (args, kwargs))
        if isinstance(a, TensorProxy):
            rebase(a)  # (the op reads the view of the root its gradient is laid out through)
        if symbol is not None and not _computed_by_eager(name, symbol, a, args, kwargs):
            args, kwargs = narrowed_writes.operands(name, a, args, kwargs)
            value = symbol(_read_to_overwrite(a), *args, **kwargs, **facts)
            if isinstance(a, TensorProxy) and a._strides is not None:
                _lay_out_written(a, value, outplace, args, kwargs)
        else:  # (``_computed_by_eager``)
            value = user_fallback(on_copy(fn), (a, *args), kwargs, effect=is_random(fn))
        # (eager's CopySlices puts the op's own gradient of the view's old value in its base's)
        return assign(a, value, name, overwrite=symbol is not None)

    return in_place


#: Writes at indices whose out-of-place form the reuse pass (``crates/passes/src/reuse.rs``) runs
#: in place on a receiver that dies there, as a write into a tensor does: in the receiver's layout.
_REUSED = frozenset({"index_add", "scatter_add", "scatter"})


def _lay_out_written(dst, value, outplace, args: tuple, kwargs: dict) -> None:
    """Gives ``value``, what an in-place op writes into ``dst`` (laid out in another order), the
    layout its out-of-place form has (``eager_layouts``), so that ``assign`` selects it into
    ``dst``'s only where they differ; a write the reuse pass runs in place has ``dst``'s."""
    if getattr(outplace, "__name__", None) in _REUSED and isinstance(value, TensorProxy):
        if value._view is None and value._input_vid is None and value._strides is None:
            value._strides = dst._strides
        return
    take_layouts(outplace, (dst, *args), kwargs, value)


#: In-place dims changes a tensor the program computed may take as its out-of-place view: eager's
#: keeps the elements and their order (a contiguous tensor stays so).
_REDIMENSIONED = {"unsqueeze_": torch.Tensor.unsqueeze, "squeeze_": torch.Tensor.squeeze}


def _redimensioned(name: str, reason: str):
    """``unsqueeze_``/``squeeze_``: on a tensor the program computed, not a view and with no live
    view, laid out as computed, the proxy stands for its out-of-place view from now on (BigBird's
    band mask, ``band_mask.unsqueeze_(1)``); on any other (an input, whose caller's tensor a
    trace cannot reshape; a view, or one with views, whose aliases eager leaves as they are) the
    call is refused with ``reason``."""
    refused, outplace = _refuse(name, reason), _REDIMENSIONED[name]

    def redimensioned(a, *args, **kwargs):
        alone = isinstance(a, TensorProxy) and not any(ref() is not None for ref in a._views or ())
        if not (alone and a._view is None and a._input_vid is None and a._strides is None):
            return refused(a, *args, **kwargs)
        out = outplace(a, *args, **kwargs)
        a._vid, a._shape, a._symbolic, a._views = out._vid, out._shape, out._symbolic, None
        return a

    return redimensioned


def _detached_in_place(reason: str):
    """``detach_``: on a tensor the program computed, not a view and with no live view, not read by
    a call since, the proxy stands for its ``detach()`` from now on, as eager's tensor then requires
    no grad (an activation cut from the graph by a stop-gradient); on any other (an input, whose
    caller's tensor a trace cannot detach; a view or one with views, which eager detaches otherwise
    or refuses; one a call may have saved) the call is refused."""
    refused = _refuse("detach_", reason)

    def detached(a):
        alone = isinstance(a, TensorProxy) and not any(ref() is not None for ref in a._views or ())
        if not (alone and a._view is None and a._input_vid is None and a._strides is None):
            return refused(a)
        if a.requires_grad and version_tracking.read_since_made(a):
            raise ThunderNotImplementedError(
                f"detach_: of a tensor the program's calls read since it was made (at {user_location()}): eager's "
                "backward of a call that saved it rejects it; detach it before its use, or use detach()"
            )
        if a.requires_grad:
            a._vid = detach(a)._vid
            inner_leaves.forget(a)
            with torch._C.DisableTorchFunctionSubclass():
                torch.Tensor.requires_grad_(a, False)
        return a

    return detached


def _refuse(name: str, reason: str):
    def refused(*args, **kwargs):
        raise ThunderNotImplementedError(f"{name}: {reason} (at {user_location()})")

    return refused


def copy_(a, src, non_blocking=False):
    check_partial_overlap("copy_", a, src)
    return assign(a, src, "copy_", copy=True)


def fill_(a, value):
    if isinstance(value, torch.Tensor):
        check(
            value.ndim == 0,
            "fill_",
            lambda: (
                f"fill_ only supports 0-dimension value tensor but got tensor with {value.ndim} dimensions. "
                f"(at {user_location()})"
            ),
            ThunderRuntimeError,
        )
    return assign(a, value, "fill_", copy=True)


def zero_(a):
    return assign(a, 0, "zero_", copy=True)


def fill_diagonal_(a, fill_value, wrap=False):
    """``fill_`` of the diagonal view of all of ``a``'s dims (its diagonal of the first two, of
    that and the third...): the view's step, a symbolic size where ``a``'s is, stays symbolic. A
    tall matrix's diagonal that ``wrap``s below itself (where eager's positions follow memory
    strides) is eager's on a copy."""
    op = "fill_diagonal_"
    check(a.ndim >= 2, op, f"dimensions must larger than 1 (at {user_location()})", ThunderRuntimeError)
    check(
        all(size == a.shape[0] for size in a.shape[2:]),
        op,
        f"all dimensions of input must be of equal length (at {user_location()})",
        ThunderRuntimeError,
    )
    if wrap and a.ndim == 2 and a.shape[0] > a.shape[1] + 1:
        return assign(a, user_fallback(on_copy(torch.Tensor.fill_diagonal_), (a, fill_value, wrap), {}), op)
    view = a
    while view.ndim > 1:
        view = TORCH_TO_LTORCH[torch.Tensor.diagonal](view, 0, 0, 1)
    fill_(view, fill_value)
    return a


_SPECIAL = {"copy_": copy_, "fill_": fill_, "zero_": zero_, "fill_diagonal_": fill_diagonal_}


#: In-place torch functions whose out-of-place form is an aten op only.
_OUT_OF_PLACE_OPS = {"embedding_renorm_": torch.ops.aten.embedding_renorm.default}


def _outplace_of(namespace, name: str):
    """The out-of-place form of ``namespace.name``: ``F``'s for nn functions when thunder_rs maps it."""
    if namespace is torch and name in _OUT_OF_PLACE_OPS:
        return _OUT_OF_PLACE_OPS[name]
    base = _AUGMENTED.get(name) or name[:-1]
    if namespace is torch._C._nn and getattr(F, base, None) in TORCH_TO_LTORCH:
        return getattr(F, base)
    return getattr(namespace, base, None)


def _register_in_place() -> None:
    for namespace in (torch.Tensor, torch, torch._C._nn, F):
        names = [n for n in dir(namespace) if n.endswith("_") and not n.endswith("__") and not n.startswith("_")]
        if namespace is torch.Tensor:
            names += [n for n in _AUGMENTED if hasattr(torch.Tensor, n)]
        for name in names:
            fn = getattr(namespace, name)
            if not callable(fn) or fn in TORCH_TO_LTORCH:
                continue
            if name in _REDIMENSIONED and namespace is torch.Tensor:
                handler = _redimensioned(name, _REFUSED[name])
            elif name == "detach_" and namespace is torch.Tensor:
                handler = _detached_in_place(_REFUSED[name])
            elif name in _REFUSED:
                handler = _refuse(name, _REFUSED[name])
            elif name in _SPECIAL:
                handler = _SPECIAL[name]
            else:
                handler = _in_place(fn, name, _outplace_of(namespace, name))
            TORCH_TO_LTORCH[fn] = handler
            MUTATING.add(fn)


# -- inplace=True ----------------------------------------------------------------------------------


def _inplace_argument(fn, index: int):
    """``fn`` (which takes ``inplace`` at position ``index``, its last) computed out of place and,
    when ``inplace``, written into its input."""
    symbol = TORCH_TO_LTORCH.get(fn)
    name = f"{fn.__name__}(inplace=True)"
    drawn_in_place = DRAWN_IN_PLACE.get(fn)

    def call(*args, **kwargs):
        if len(args) > index:
            inplace, args = args[index], args[:index]
        else:
            kwargs = dict(kwargs)
            inplace = kwargs.pop("inplace", False)
        if inplace and symbol in DIFFERENTIATED_FROM_RESULT:
            kwargs = {**kwargs, "inplace": True}
        value = drawn_in_place(*args, **kwargs) if inplace and drawn_in_place is not None else None
        if value is None and symbol is not None:
            value = symbol(*args, **kwargs)
        elif value is None:
            value = user_fallback(fn, args, kwargs, effect=is_random(fn))
        if not inplace:
            return value
        dst = args[0] if args else kwargs["input"]
        if isinstance(dst, TensorProxy) and dst._strides is not None:
            take_layouts(fn, args, kwargs, value)  # (``assign`` keeps dst's layout)
        return assign(dst, value, name)

    call.symbol = symbol  # type: ignore[attr-defined]
    return call


def _may_take_inplace(fn) -> bool:
    """False where ``inspect.signature(fn)`` could not show an ``inplace`` parameter, told without
    building it: a plain function without that local name (nor ``__wrapped__`` or ``__signature__``
    to change what its signature shows), a builtin without a text signature, or no callable at
    all. Building every name's signature in ``F`` was a tenth of ``import thunder_rs`` (issue 25)."""
    if not callable(fn):
        return False
    code = getattr(fn, "__code__", None)
    if code is not None:
        return "inplace" in code.co_varnames or hasattr(fn, "__wrapped__") or hasattr(fn, "__signature__")
    if isinstance(fn, types.BuiltinFunctionType):
        return getattr(fn, "__text_signature__", None) is not None
    return True


def _register_inplace_arguments() -> None:
    for name in dir(F):
        fn = getattr(F, name)
        if not _may_take_inplace(fn):
            continue
        try:
            parameters = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            continue
        if "inplace" in parameters and parameters[-1] == "inplace":
            TORCH_TO_LTORCH[fn] = _inplace_argument(fn, parameters.index("inplace"))


# -- out= ------------------------------------------------------------------------------------------


#: The text eager's autograd raises for an op with ``out=`` one of whose arguments requires grad.
_OUT_REQUIRES_GRAD = "functions with out=... arguments don't support automatic differentiation"


def _out_probe(x):
    """A meta tensor standing for the proxy ``x`` (at its sizes' hints), requiring grad as it does."""
    if not isinstance(x, TensorProxy):
        return hint(x) if isinstance(x, SymInt) else x
    with torch._C.DisableTorchFunctionSubclass():
        requires_grad = x.requires_grad and (x.dtype.is_floating_point or x.dtype.is_complex)
    shape = tuple(hint(s) for s in x.shape)
    return torch.empty(shape, dtype=x.dtype, device="meta", requires_grad=requires_grad)


def _refuse_out_under_autograd(func, args, kwargs) -> None:
    """Eager's error for ``func(..., out=...)`` with grad mode on and an argument (``out`` too)
    that requires grad, where eager's autograd raises it: which ops do is torch's (a comparison's
    or ``argmax``'s results have no gradient, ``torch.softmax`` writes ``out`` by a differentiable
    copy), so the call runs on meta tensors alike and its error, if it is that one, is raised."""
    if not torch.is_grad_enabled():
        return
    flat, spec = tree_flatten((args, kwargs))
    with torch._C.DisableTorchFunctionSubclass():
        if not any(isinstance(x, TensorProxy) and x.requires_grad for x in flat):
            return
    try:
        meta_args, meta_kwargs = tree_unflatten([_out_probe(x) for x in flat], spec)
        with torch._C.DisableTorchFunction():
            func(*meta_args, **meta_kwargs)
    except RuntimeError as e:
        if _OUT_REQUIRES_GRAD in str(e):
            raise ThunderRuntimeError(f"{e} (at {user_location()})") from None
        return
    except Exception:  # noqa: BLE001 (the call's own errors are the trace's to raise)
        return
    written = [t for t in tree_flatten(meta_kwargs["out"])[0] if isinstance(t, torch.Tensor)]
    # ``torch.softmax(x, 0, out=y)``: eager writes ``y`` through a node whose backward raises.
    check(
        not any(type(t.grad_fn).__name__ == "NotImplemented" for t in written),
        getattr(func, "__name__", "op"),
        lambda: (
            f"out= at {user_location()} with grad mode on and an argument that requires grad: eager writes out "
            "through an autograd node that has no derivative (its backward raises 'derivative ... is not "
            "implemented'), which thunder_rs does not trace; call it without out=, or under torch.no_grad()"
        ),
        ThunderNotImplementedError,
    )


def _resizable(target, value) -> bool:
    """Whether eager's resize of ``target`` to ``value``'s shape can be traced: a tensor the program
    made (not the caller's), not a view and with no live view, laid out as made, requiring no grad,
    of sizes known when compiling (eager's warning names them)."""
    alone = not any(ref() is not None for ref in target._views or ())
    if not (alone and target._view is None and target._input_vid is None and target._strides is None):
        return False
    with torch._C.DisableTorchFunctionSubclass():
        if target.requires_grad:
            return False
    return not (target._symbolic or value._symbolic)


def _resize_out(target, value) -> None:
    """Eager's ``resize_output``: ``target`` stands for a tensor of ``value``'s shape from now on (its
    old values gone), with eager's warning where it had elements."""
    if 0 not in target.shape:  # (made when traced, at the user's line: once, as the default filter shows it)
        warn_at_user_frame(
            f"An output with one or more elements was resized since it had shape {list(target.shape)}, which does "
            f"not match the required output shape {list(value.shape)}. This behavior is deprecated, and in a future "
            "PyTorch release outputs will not be resized unless they have zero elements. You can explicitly reuse an "
            "out tensor t by resizing it, inplace, to zero elements with t.resize_(0)."
        )
    fresh = filled(tuple(value.shape), 0, target.device, target.dtype)
    target._vid, target._shape, target._symbolic, target._views = fresh._vid, fresh._shape, fresh._symbolic, None


def write_out(func, args, kwargs):
    """``func(*args, out=out)``: the result computed out of place and written into ``out``; eager's
    error where its ``out=`` kernel refuses ``out`` (``out_checks``) or where grad mode is on and an
    argument requires grad (``_refuse_out_under_autograd``)."""
    name = getattr(func, "__name__", "op")
    _refuse_out_under_autograd(func, args, kwargs)  # (eager's autograd checks before its kernel does)
    check_out(func, args, kwargs)
    kwargs = dict(kwargs)
    out = kwargs.pop("out")
    if is_pointwise(getattr(func, "__name__", "")):
        for target in out if isinstance(out, (tuple, list)) else (out,):
            check_partial_overlap(name, target, (args, kwargs), in_place=False)
    value = torch_function(*in_out_dtype(func, args, kwargs, out))
    targets = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    values = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    check(
        len(targets) == len(values),
        name,
        f"expected {len(values)} tensors for out=, got {len(targets)} (argument out)",
        ThunderTypeError,
    )
    for target, v in zip(targets, values):
        check(
            isinstance(target, TensorProxy),
            name,
            f"expected a tensor for out=, got {type(target).__name__} (argument out)",
            ThunderTypeError,
        )
        if not same_shape(target.shape, v.shape) and _resizable(target, v):
            _resize_out(target, v)
        check(
            same_shape(target.shape, v.shape),
            name,
            lambda: (
                f"out= has shape {list(target.shape)} but the result has shape {list(v.shape)}; eager would resize it, "
                "which a traced tensor cannot but one the program made, not a view nor viewed, that requires no "
                "grad (argument out)"
            ),
            ThunderNotImplementedError,
        )
        assign(target, v, f"{name}(out=)")
    if not isinstance(out, (tuple, list)):
        return out
    return type(value)(targets) if hasattr(type(value), "n_fields") else tuple(targets)


# -- registration ----------------------------------------------------------------------------------


def _register() -> None:
    _register_inplace_arguments()
    _register_in_place()
    set_out_handler(write_out)


_register()
