"""Forward-mode differentiation through dual tensors (``torch.autograd.forward_ad``) in a traced
program: ``with dual_level(): d = make_dual(x, t); y = f(d); p, tangent = unpack_dual(y)``.

The dual level itself is eager's (``enter_dual_level`` runs as it does, raising eager's error for
a nested level). ``make_dual`` records a view of the primal (eager's dual aliases it) and notes
it with its tangent; what the program computes from it is recorded as any other call.
``unpack_dual(y)`` gives a view of ``y`` (eager's primal) and, where ``y`` was computed from a
dual of the level (``Recorder.dual_labels``: through the calls recorded since the level's first
dual, up to what ``detach`` or an earlier ``unpack_dual`` returned, which carry no tangent), its
tangent ``J t`` by reverse mode twice, as ``traced_grads.jvp``: the backward of ``y``'s
computation from a cotangent stand-in ``u`` that requires grad is ``J^T u`` (differentiated
through the values the duals reach, whatever their ``requires_grad``: eager's forward mode
ignores grad mode), and its backward from the tangents is ``J t``, which requires grad as eager's
formulas' results do (the level outside's labels). While a dual lives, composites are recorded
with their decompositions (not their grad rules, not whole kernels), whose backward can be
differentiated again. A level that was exited (the real sentinel dual made with the level's first
dual has lost its tangent) has no duals: ``unpack_dual`` then gives no tangent, as eager's.

Eager's dual holds its tangent tensor as given, so an in-place write to the dual writes that
tensor too (``_write_tangents``: by the next ``make_dual``/``unpack_dual`` or the level's end).

Refused, naming the construct and the line: a tangent whose dtype differs from the primal's
(eager keeps it as given), duals of values ``torch.vmap`` does not batch under it (of batched
ones: eager's error), a tangent whose backward cannot be traced
(an eager fallback's), and the dual API in a program that takes a dual made outside the jitted
call (its tangent does not reach the trace).
"""

from typing import NamedTuple

import torch
from torch._C import DisableTorchFunction
from torch.autograd import forward_ad

from thunder_rs import prims
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.base.userframe import user_location
from thunder_rs.core.lang import vmap_state
from thunder_rs.core.lang.recorder import (
    active_recorder,
    dual_levels,
    grad_mode_cuts,
    lift_captured,
    paused_recording,
    proxies,
    recording_decompositions_from_now,
)
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError


_EXIT_DUAL_LEVEL = forward_ad.exit_dual_level


class _Level:
    """The duals the program made at one dual level, and what ``unpack_dual`` returned there."""

    def __init__(self, rec, level: int, mark: int, first: int, sentinel: torch.Tensor, restore):
        self.rec, self.level, self.mark, self.first = rec, level, mark, first
        self.sentinel, self.restore = sentinel, restore
        self.duals: list[int] = []
        #: the value id of each dual's tangent (as given: a write to the tangent tensor since changes it)
        self.tangents: list[int] = []
        #: id of each dual ``make_dual`` returned -> [it, its value id, its tangent, its primal, that's id]
        self.made: dict[int, list] = {}
        self.cuts: list[int] = []
        #: the user's line of the level's first ``make_dual``
        self.where = ""


class Unpacked(NamedTuple):
    primal: object
    tangent: object


def _level_of(rec, level: int) -> _Level | None:
    """The duals of the level ``level`` the program is in, or None (none made, or the level was
    exited since: its sentinel lost its tangent)."""
    holder = dual_levels.get()
    if holder and holder[1]:
        raise ThunderNotImplementedError(
            f"torch.autograd.forward_ad at {user_location()}: an input of the jitted call is a dual tensor made "
            "outside it, whose tangent does not reach the trace (unpack_dual would give none). Make the dual inside "
            "the jitted function (its tangent an argument), or use torch.func.jvp there"
        )
    state = holder[0] if holder else None
    if state is None:
        return None
    alive = False
    if state.rec is rec and state.level == level:
        with paused_recording(), DisableTorchFunction():
            alive = torch._unpack_dual(state.sentinel, level=level)[1] is not None
    if not alive:
        holder[0] = None
        state.restore()
        return None
    return state


def _refuse(what: str):
    return ThunderNotImplementedError(f"torch.autograd.forward_ad.{what} at {user_location()}")


def _check_as_eager(tensor: TensorProxy, tangent: TensorProxy, level: int) -> None:
    """Eager's errors for ``make_dual`` (sizes, devices), from its call on meta stand-ins (sizes at
    their hints where symbolic)."""
    hint = lambda sizes: tuple(getattr(getattr(s, "expr", None), "hint", s) for s in sizes)  # noqa: E731
    with paused_recording(), DisableTorchFunction():
        meta = torch.empty_strided(hint(tensor.shape), hint(tensor.stride()), dtype=tensor.dtype, device="meta")
        torch._make_dual(meta, torch.empty(hint(tangent.shape), dtype=tangent.dtype, device="meta"), level=level)
    if tensor.device != tangent.device:
        raise ThunderRuntimeError(
            f"make_dual: the tangent is on {tangent.device} and the primal on {tensor.device} (at {user_location()})"
        )


def make_dual(tensor, tangent, *, level: int = 0):
    """``torch._make_dual`` of traced tensors: a view of ``tensor`` noted as a dual of ``level``."""
    rec = active_recorder()
    (tensor, tangent), _ = lift_captured((tensor, tangent), {})
    if vmap_state.levels_of(tensor) or vmap_state.levels_of(tangent):
        raise ThunderRuntimeError(
            "Batching rule not implemented for aten::_make_dual; the fallback path doesn't work on out= or view ops. "
            f"(at {user_location()})"
        )
    if vmap_state.levels.get():
        raise _refuse("make_dual: a dual tensor under torch.vmap is not traced; use torch.func.jacfwd or jvp there")
    if not (isinstance(tensor, TensorProxy) and isinstance(tangent, TensorProxy)):
        raise _refuse("make_dual: the primal and the tangent must be tensors")
    _check_as_eager(tensor, tangent, level)
    if tangent.dtype != tensor.dtype:
        raise _refuse(
            f"make_dual: a tangent of dtype {tangent.dtype} for a primal of dtype {tensor.dtype} is not traced "
            "(eager keeps the tangent's dtype through the formulas); convert the tangent to the primal's dtype"
        )
    state = _level_of(rec, level)
    if state is not None:
        _write_tangents(rec, state)
    if state is None:
        with paused_recording(), DisableTorchFunction():
            sentinel = torch._make_dual(torch.zeros(()), torch.zeros(()), level=level)
        state = _Level(rec, level, rec.mark(), rec.num_values, sentinel, recording_decompositions_from_now())
        state.where = user_location()
        dual_levels.get()[0] = state
    elif tensor._vid is not None and dict(rec.dual_labels(state.mark, state.first, state.duals, state.cuts)).get(
        tensor._vid
    ):
        raise ThunderRuntimeError(
            "Making a dual Tensor based on a Tensor that already has a forward gradient at the same level "
            f"{level} is not supported. (at {user_location()})"
        )
    dual = _view_of(tensor)
    state.duals.append(dual._vid)
    state.tangents.append(tangent._vid)
    state.made[id(dual)] = [dual, dual._vid, tangent, tensor, tensor._vid]
    return dual


def unpack_dual(tensor, *, level: int = 0):
    """``torch._unpack_dual`` of a traced tensor: ``(a view of it, its tangent at ``level`` or None)``."""
    rec = active_recorder()
    if not isinstance(tensor, TensorProxy) or vmap_state.levels_of(tensor):
        with DisableTorchFunction():
            return torch._unpack_dual(tensor, level=level)  # (eager's error for what is not a tensor)
    state = _level_of(rec, level)
    if state is not None:
        _write_tangents(rec, state)
    primal = _view_of(tensor)
    if state is None:
        return Unpacked(primal, None)
    made = state.made.get(id(tensor))
    if made is not None and made[0] is tensor and made[1] == tensor._vid:
        tangent = made[2]  # (eager's tangent as it was given)
    else:
        tangent = _traced_tangent(rec, state, tensor, "unpack_dual")
    state.cuts.append(primal._vid)
    if tangent is not None:
        state.cuts.append(tangent._vid)
    return Unpacked(primal, tangent)


def cut(detached: TensorProxy, source) -> None:
    """``detach()``'s result carries no tangent, as eager's: what the program computes from it is
    no dual's (``detach`` records a copy with grad mode off, which a dual's tangent crosses)."""
    holder = dual_levels.get()
    vid = getattr(detached, "_vid", None)
    if holder and holder[0] is not None and vid is not None and vid != getattr(source, "_vid", None):
        holder[0].cuts.append(vid)


def _traced_tangent(rec, state: _Level, tensor: TensorProxy, what: str):
    labels = rec.dual_labels(state.mark, state.first, state.duals, state.cuts)
    if not dict(labels).get(tensor._vid):
        return None
    mark = rec.mark()
    try:
        return _tangent(rec, state, tensor, labels)
    except Exception as e:
        rec.rewind(mark)
        raise _refuse(
            f"{what}: thunder_rs computes a dual's tangent as the backward of its backward, which it cannot trace "
            f"here ({type(e).__name__}: {e}); compute it outside the jitted function"
        ) from None


def _write_tangents(rec, state: _Level) -> None:
    """Eager's dual holds its tangent tensor as given (of the primal's strides), and an in-place
    write to the dual writes that tensor too: the tangents of the duals written since are copied
    into theirs, once the program makes or unpacks a dual again or leaves the level. The primal
    the dual views, written through it, carries no tangent (as eager's)."""
    for entry in state.made.values():
        dual, vid, tangent, base, base_vid = entry
        if dual._vid == vid:
            continue
        entry[1] = dual._vid
        if base._vid != base_vid:
            entry[4] = base._vid
            state.cuts.append(base._vid)
        new = _traced_tangent(rec, state, dual, "make_dual")
        if new is not None and tangent.stride() == dual.stride():
            tangent.copy_(new)
            state.cuts += [new._vid, tangent._vid]


def refuse_returned_duals(rec, outputs: list) -> None:
    """Refuses a program that returns (or writes into an input or state) a value computed from a
    dual of a level still live at its end, the caller's (its ``make_dual`` at the caller's level):
    eager's carries the tangent out, which the compiled call's outputs do not."""
    holder = dual_levels.get()
    state = _level_of(rec, holder[0].level) if holder and holder[0] is not None else None
    if state is None:
        return
    labels = dict(rec.dual_labels(state.mark, state.first, state.duals, state.cuts))
    if any(isinstance(o, TensorProxy) and labels.get(o._vid) for o in outputs):
        raise ThunderNotImplementedError(
            f"torch.autograd.forward_ad.make_dual at {state.where}: the program returns a tensor computed from a dual "
            f"of the caller's forward-AD level {state.level} (it enters no dual_level of its own), whose tangent the "
            "compiled call's output does not carry; return unpack_dual's primal and tangent instead, or enter the "
            "level inside the jitted function"
        )


def exit_dual_level(*, level=None):
    """``torch.autograd.forward_ad.exit_dual_level`` while a program is traced: the tangents of
    duals written in place are written first (``_write_tangents``)."""
    rec = active_recorder()
    state = None if rec is None else _level_of(rec, forward_ad._current_level if level is None else level)
    if state is not None:
        _write_tangents(rec, state)
    return _EXIT_DUAL_LEVEL(level=level)


def _cdist_kernel(args: tuple, kwargs: dict) -> str:
    """Which kernel eager's ``cdist`` runs: the matmul one for p=2 where it is asked, or where a side
    has more than 25 rows and the default mode is on."""
    x1, x2 = args[0], args[1] if len(args) > 1 else kwargs.get("x2")
    p = args[2] if len(args) > 2 else kwargs.get("p", 2.0)
    mode = args[3] if len(args) > 3 else kwargs.get("compute_mode")
    rows = max(getattr(x, "shape", (0, 0))[-2] if getattr(x, "ndim", 0) >= 2 else 0 for x in (x1, x2))
    by_default = mode in (None, "use_mm_for_euclid_dist_if_necessary") and rows > 25
    euclid = p == 2 and (mode == "use_mm_for_euclid_dist" or by_default)
    return "_euclidean_dist" if euclid else "_cdist_forward"


def _unique_kernel(args: tuple, kwargs: dict) -> str:
    return "unique_dim" if kwargs.get("dim") is not None else "_unique2"


#: The calls whose kernels eager has no forward-mode formula for, by name: the kernel its error
#: names (for the call's arguments; None where the kernel eager runs for them has one). The
#: torch language adds those whose kernel depends on the device (attention's fused kernels).
NO_FORWARD_AD: dict = {
    "cdist": _cdist_kernel,
    "pdist": lambda args, kwargs: "_pdist_forward",
    "embedding_bag": lambda args, kwargs: "_embedding_bag",
    "ctc_loss": lambda args, kwargs: "_ctc_loss",
    "multi_margin_loss": lambda args, kwargs: "multi_margin_loss",
    "multilabel_margin_loss": lambda args, kwargs: "multilabel_margin_loss_forward",
    "unique": _unique_kernel,
    "_unique_impl": _unique_kernel,
    "_return_output": _unique_kernel,
    "_return_inverse": _unique_kernel,
    "_return_counts": _unique_kernel,
    "_return_inverse_and_counts": _unique_kernel,
    "unique_consecutive": lambda args, kwargs: "unique_consecutive",
    "_consecutive_return_output": lambda args, kwargs: "unique_consecutive",
    "_consecutive_return_inverse": lambda args, kwargs: "unique_consecutive",
    "_consecutive_return_counts": lambda args, kwargs: "unique_consecutive",
    "_consecutive_return_inverse_and_counts": lambda args, kwargs: "unique_consecutive",
}


def check_forward_ad(func, args: tuple, kwargs: dict) -> None:
    """Eager's error for a call whose kernel has no forward-mode formula on a dual of the live
    level. Inside a traced ``torch.func.jvp`` (reverse mode standing for forward mode), such a call
    on what requires grad is noted in ``grad_mode_cuts``: the jvp then runs as eager's call, which
    raises it (was a tangent where eager has none)."""
    kernel = NO_FORWARD_AD.get(getattr(func, "__name__", None))
    if kernel is None:
        return
    flat = [a for a in (*args, *kwargs.values()) for a in (a if isinstance(a, (list, tuple)) else (a,))]
    tensors = [a for a in flat if isinstance(a, TensorProxy) and a._vid is not None]
    holder = dual_levels.get()
    state = holder[0] if holder else None
    if state is None:
        cuts = grad_mode_cuts.get()
        if cuts is not None and any(t.requires_grad for t in tensors) and kernel(args, kwargs) is not None:
            cuts.append(func.__name__)
        return
    if not tensors:
        return
    labels = dict(state.rec.dual_labels(state.mark, state.first, state.duals, state.cuts))
    if any(labels.get(t._vid) for t in tensors) and (name := kernel(args, kwargs)) is not None:
        raise ThunderNotImplementedError(
            f"Trying to use forward AD with {name} that does not support it because it has not been "
            f"implemented yet. (at {user_location()}; as eager raises)"
        )


def _view_of(t: TensorProxy):
    """A view of all of ``t`` that is a value of its own (``view_as`` gives ``t``'s value)."""
    return t.unsqueeze(0).squeeze(0)


def _tangent(rec, state: _Level, y: TensorProxy, labels: list):
    """``J t`` of ``y``'s computation from the level's duals, by reverse mode twice."""
    end = rec.num_values
    outer = dict(rec.grad_labels(state.first, end))  # (the backward reads them as the program's gradient does)
    labels = [(v, dual or outer.get(v, False)) for v, dual in labels]
    with torch.enable_grad():  # (the backward is differentiated again: it must carry u's gradient)
        mark = rec.mark()
        zeros = y.new_zeros(y.shape)
        u = prims.convert_element_type(zeros, zeros.dtype)
        rec.set_requires_grad(u._vid, True)
        pulled = rec.differentiate_values(state.first, end, labels, [(y._vid, u._vid)], state.duals, True)
    pairs = [(g.vid, t) for g, t in zip(pulled, state.tangents) if g is not None]
    if not pairs:
        return None
    (tangent,) = rec.differentiate(mark, pairs, [u._vid], torch.is_grad_enabled())
    if tangent is None:
        return torch.zeros_like(y)
    return proxies([tangent])[0]
