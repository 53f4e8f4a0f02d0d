"""Views: which proxies alias which, and writing through a view.

Eager's view ops (slicing and integer indexing, select, narrow, split, chunk, unbind, view and
reshape where the strides allow, permute, transpose, squeeze, unsqueeze, expand, flatten,
unflatten, diagonal, detach) return tensors that share memory with their input: an in-place write
to one is seen through all of them. A proxy has no memory, so a view is a link: the root proxy
it was taken from and the steps that compute it from the root.

Writing a value into a view replays the steps from the root's current value, inverts them from
the view back to the root (a slice becomes a slice scatter, a reshape a reshape back, a permute
the inverse permute), rebinds the root to the result, and recomputes every other live view of
that root (held by weak references, so views the program dropped cost nothing).

A step is the chain of shape prims (reshape, transpose, slice, squeeze, broadcast_in_dim) the
view op recorded, captured while it ran, or an opaque step with its own forward and inverse for
ops that no such chain describes (diagonal, detach). A view op that recorded anything else made
a copy. Strides follow eager's, so that ``reshape`` and ``contiguous()`` copy where eager copies:
trace inputs have the strides of their tensors, other roots are taken to be contiguous.

Programs that take views but never write pay, per view op while tracing, for capturing the
prims it records and one weak reference; strides are worked out only where a decision needs them.
"""

import math
import weakref
from dataclasses import dataclass
from typing import Callable, NamedTuple

import contextlib

import torch

from thunder_rs import prims
from thunder_rs.core.base.dtypes import CODES
from thunder_rs.core.lang.langctx import user_location
from thunder_rs.core.base.proxies import TensorProxy, make_proxy, requires_grad_of
from thunder_rs.core.base.trees import tree_map
from thunder_rs.core.lang.recorder import recording_backward, start_prim_log, stop_prim_log
from thunder_rs.core.lang.symfloat import SymFloat
from thunder_rs.core.lang import version_tracking
from thunder_rs.core.lang.symint import SymInt, hint, identical
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError
from thunder_rs.torch import shape as _shape
from thunder_rs.torch.shape import reshape_to, slice_in_dim
from thunder_rs.torch.strides import is_contiguous, overlaps, strides_of, viewed_strides
from thunder_rs.torch.view_scatters import (
    slice_overwrite,
    slice_scatter,
    straight_through,
    written_through_view,
)

__all__: list[str] = []

_OVERLAP = (
    "unsupported operation: more than one element of the written-to tensor refers to a single memory "
    "location. Please clone() the tensor before performing the operation."
)


# -- steps -----------------------------------------------------------------------------------------


class PrimStep(NamedTuple):
    """One shape prim of a view op (its parameters after the tensor, as the op passed them).
    ``group``, on the last prim of an op that returns several views (``split``, ``unbind``):
    ``(torch op, args, kwargs, output index, how many prims the op recorded)``, the op that takes
    the view again of a real tensor, as eager's multi-output view (refused writes in place).
    ``call``, on the last prim of an op that returns one view: ``(torch op, args, kwargs, how
    many prims the op recorded)``, the op that takes it again, so that the view's autograd node
    is eager's (``x[:]`` a SliceBackward0, ``x.t()`` a TBackward0, not the prims' nodes)."""

    name: str
    params: tuple
    group: tuple | None = None
    call: tuple | None = None

    @property
    def is_prim(self) -> bool:
        """True: the torch executor's implementation of the prim takes the same view of a real
        tensor (``core.writeback`` returns views of written inputs so)."""
        return True

    @property
    def replayable(self) -> bool:
        return True  # (by the prim's torch implementation, or its ``group``'s op)

    def forward(self, parent):
        return getattr(prims, self.name)(parent, *self.params)

    def inverse(self, parent, new, overwrite: bool = False):
        """The value ``parent`` takes when its view through this prim becomes ``new`` (computed from
        the view's old value by an in-place op: ``overwrite``, see ``slice_overwrite``)."""
        if self.name == "transpose":
            perm = self.params[0]
            return prims.transpose(new, tuple(sorted(range(len(perm)), key=lambda i: perm[i])))
        if self.name == "slice":
            start, stop, step = self.params
            return _slice_back(parent, new, start, stop, step, overwrite)
        return reshape_to(new, parent.shape)  # reshape, squeeze, unsqueezing broadcast_in_dim

    def layout(self, shape, strides):
        """(shape, strides) of this prim's output as a view of an input with ``shape`` and
        ``strides``; None when eager's op makes a copy."""
        if self.name == "reshape":
            new_shape = tuple(self.params[0])
            new_strides = viewed_strides(tuple(shape), tuple(strides), new_shape)
            return None if new_strides is None else (new_shape, new_strides)
        if self.name == "transpose":
            perm = self.params[0]
            return tuple(shape[p] for p in perm), tuple(strides[p] for p in perm)
        if self.name == "slice":
            start, stop, step = self.params
            sizes = tuple(max(-(-(e - s) // k), 0) for s, e, k in zip(start, stop, step))
            return sizes, tuple(st * k for st, k in zip(strides, step))
        if self.name == "squeeze":
            dims = set(self.params[0])
            keep = [d for d in range(len(shape)) if d not in dims]
            return tuple(shape[d] for d in keep), tuple(strides[d] for d in keep)
        new_shape, dims = tuple(self.params[0]), tuple(self.params[1])  # broadcast_in_dim
        new_strides = [0] * len(new_shape)
        for i, d in enumerate(dims):
            new_strides[d] = strides[i] if shape[i] == new_shape[d] else 0
        for d in range(len(new_shape) - 1, -1, -1):  # a new dim of size 1: ATen's ``unsqueeze``
            if d not in dims and new_shape[d] == 1:
                new_strides[d] = new_shape[d + 1] * new_strides[d + 1] if d + 1 < len(new_shape) else 1
        return new_shape, tuple(new_strides)

    @property
    def expands(self) -> bool:
        """Whether elements of the view share memory because this prim broadcasts."""
        return (
            self.name == "broadcast_in_dim"
            and math.prod(self.params[0]) > 0
            and any(size > 1 for d, size in enumerate(self.params[0]) if d not in self.params[1])
        )


def _slice_back(parent, new, start, stop, step, overwrite=False):
    """``parent`` with its slice ``[start:stop:step]`` (one bound per dim) replaced by ``new``: a
    slice scatter along each dim the slice narrows, innermost first. (Bounds compared as data: a
    symbolic bound that may be the whole dim's scatters, with no guard.)"""
    dims = [
        d for d in range(parent.ndim) if not all(map(identical, (start[d], stop[d], step[d]), (0, parent.shape[d], 1)))
    ]
    if not dims:
        return new
    d, rest = dims[0], dims[1:]
    if rest:
        outer = slice_in_dim(parent, d, start[d], stop[d], step[d])
        narrowed = (
            (*start[:d], 0, *start[d + 1 :]),
            (*stop[:d], outer.shape[d], *stop[d + 1 :]),
            (*step[:d], 1, *step[d + 1 :]),
        )
        new = _slice_back(outer, new, *narrowed, overwrite)
    return (slice_overwrite if overwrite else slice_scatter)(parent, new, d, start[d], stop[d], step[d])


@dataclass(frozen=True, eq=False)
class OpaqueStep:
    """A view step no chain of shape prims describes: how to take the view, how to write it
    back (None: writing through this view is refused with ``refusal``), and its strides.
    ``detached``: the view hides writes through it from autograd (``.detach()``, ``.data``)."""

    take: Callable
    put: Callable | None
    strides: Callable
    refusal: str = ""
    detached: bool = False
    #: eager's op taking the view of a real tensor (``torch.diagonal(t, 1)``), for the views a
    #: training call returns (``core.acquisition.output_views``); None where there is none
    eager: Callable | None = None
    #: ``eager``'s arguments after the tensor, where the view op's ints became symbolic sizes: its
    #: ``(args, kwargs)``, computed at each call's sizes (``writeback.view_taker``); else ()
    eager_params: tuple = ()
    expands = False
    is_prim = False

    @property
    def replayable(self) -> bool:
        return self.eager is not None

    def forward(self, parent):
        return self.take(parent)

    def inverse(self, parent, new, overwrite: bool = False):
        if self.put is None:
            raise ThunderNotImplementedError(f"{self.refusal} (at {user_location()})")
        return self.put(parent, new)

    def layout(self, shape, strides):
        return self.strides(shape, strides)


class ViewLink:
    """What makes a proxy a view: the root it aliases and the steps from the root to it. Its
    eager strides are worked out when asked for (a write through it, ``contiguous()``, a reshape
    of it): most views are never asked."""

    __slots__ = ("root", "steps", "_strides", "no_grad", "rebased", "written_at", "root_grad")

    def __init__(
        self, root: TensorProxy, steps: tuple, strides: tuple | None = None, no_grad: int = 0, rebased: int = 0
    ):
        self.root, self.steps, self._strides = root, steps, strides
        #: eager's creation meta NO_GRAD_MODE: ``MADE_WITHOUT_GRAD`` (the view was taken under
        #: ``no_grad``), ``OF_ONE_MADE_WITHOUT_GRAD`` (taken with grad of such a view), else 0
        self.no_grad = no_grad
        #: how many of ``steps`` (the first) took a view whose memory was written since (its
        #: version counter bumped: ``note_version_bump``): eager's autograd makes that view's node
        #: again as an ``AsStridedBackward0`` of the base, which a returned view is taken by
        #: (``core.acquisition.output_views``)
        self.rebased = rebased
        #: the user's line of the last such write
        self.written_at: str | None = None
        #: whether the root required grad when the first view of the chain was taken (eager's
        #: refusal of one of several views written since says so: ``writeback.refuse_rebased``)
        self.root_grad = True

    @property
    def strides(self) -> tuple:
        if self._strides is None:
            layout = (tuple(self.root.shape), strides_of(self.root))
            for step in self.steps:
                layout = step.layout(*layout)
            self._strides = layout[1]
        return self._strides

    def folds_away(self, view) -> bool:
        """Whether ``view`` (this link's) is its root's shape and strides through shape prims alone
        (``x.view(x.shape)``, ``x.t().t()``): the trace's passes fold the steps, computing the root
        itself. Decided with no guard: sizes compared as data, strides worked out at the hints."""
        shape = tuple(self.root.shape)
        if not all(step.is_prim for step in self.steps) or len(view.shape) != len(shape):
            return False
        if not all(identical(a, b) for a, b in zip(view.shape, shape)):
            return False
        strides = _hinted(strides_of(self.root))
        layout = (_hinted(shape), strides)
        for step in self.steps:
            taken = step._replace(params=_hinted(step.params)).layout(*layout)
            if taken is None:
                return False
            layout = taken
        return layout[1] == strides


def _hinted(params):
    """``params`` (sizes, and tuples and lists of them) at the hints of their symbolic sizes."""
    if type(params) in (tuple, list):
        return type(params)(_hinted(p) for p in params)
    return hint(params)


#: ``ViewLink.no_grad``: the view was taken under ``no_grad``, or of such a view
MADE_WITHOUT_GRAD, OF_ONE_MADE_WITHOUT_GRAD = 1, 2
#: Eager's error for a write with grad mode on into a view taken under ``no_grad`` (or of one)
#: where the view or the value requires grad (``handle_view_on_rebase``)
_NO_GRAD_VIEW = (
    "{} in no_grad mode and {} modified inplace with grad mode enabled. Given that this use case is ambiguous and "
    "error-prone, it is forbidden. You can clarify your code by moving both the view and the inplace either both "
    "inside the no_grad block (if you don't want the inplace to be tracked) or both outside (if you want the "
    "inplace to be tracked)."
)
_MADE = {
    MADE_WITHOUT_GRAD: "A view was created",
    OF_ONE_MADE_WITHOUT_GRAD: "The tensor is a view of a view which was created",
}


def refuse_no_grad_view(op: str, dst, value) -> None:
    """Raises eager's error for a write autograd sees (grad mode on) into ``dst``, a view taken
    under ``no_grad`` or of such a view, where the view (its base) or ``value`` requires grad."""
    link = dst._view
    if link is None or not link.no_grad:
        return
    with torch._C.DisableTorchFunctionSubclass():
        grad = link.root.requires_grad or (isinstance(value, torch.Tensor) and value.requires_grad)
    if grad:
        why = _NO_GRAD_VIEW.format(_MADE[link.no_grad], "is being")
        raise ThunderRuntimeError(f"{op}: {why} (at {user_location()})")


def _refuse_history(view) -> None:
    """Makes eager's error for a view taken under ``no_grad`` (or of one) whose memory was written:
    raised where a gradient flows through it (``recorder.note_gradient_into``), as eager's is where
    an op in grad mode asks the view for its history."""
    if view._view.no_grad and view._history_error is None:
        view._view_grad = False
        view._history_error = _NO_GRAD_VIEW.format(
            _MADE[view._view.no_grad], "its base or another view of its base has been"
        )


_VIEW_PRIMS = frozenset({"reshape", "transpose", "slice", "squeeze", "broadcast_in_dim"})


def _may_copy(parent, steps) -> bool:
    """Whether eager's op may copy rather than view: a reshape of anything but a contiguous root
    (one op's own reshapes of a contiguous root only add or drop size-one dims)."""
    for step in steps:
        if type(step) is PrimStep and step.name == "reshape":
            return parent._view is not None or parent._strides is not None or len(steps) > 1
    return False


def attach(parent, view, steps) -> bool:
    """Links ``view`` to ``parent``'s root through ``steps`` (from ``parent``), unless eager's
    op makes a copy at one of them (then False)."""
    strides = None
    if _may_copy(parent, steps):
        layout = (tuple(parent.shape), strides_of(parent))
        for step in steps:
            layout = step.layout(*layout)
            if layout is None:
                return False
        strides = layout[1]
    link = parent._view
    root = parent if link is None else link.root
    no_grad = 0
    if not any(getattr(step, "detached", False) for step in steps):  # (``detach()``: no view to autograd)
        inherited = OF_ONE_MADE_WITHOUT_GRAD if link is not None and link.no_grad else 0
        no_grad = inherited if torch.is_grad_enabled() else MADE_WITHOUT_GRAD
    rebased = 0 if link is None else link.rebased  # (a view of a view written since: ``ViewLink.rebased``)
    view._view = ViewLink(root, steps if link is None else link.steps + steps, strides, no_grad, rebased)
    view._view.written_at = None if link is None else link.written_at
    view._view.root_grad = requires_grad_of(root) if link is None else link.root_grad
    if root._views is None:
        root._views = []
    root._views.append(weakref.ref(view))
    return True


def _chain(parent, view, log):
    """The shape prims (from the captured ``log``) leading from ``parent`` to ``view``, or None
    when ``view`` was not computed from ``parent`` by shape prims alone."""
    steps, target = [], view
    while target is not parent:
        for name, args, outs in reversed(log):  # a view op records a few prims
            if outs[0] is target:
                break
        else:
            return None
        if name not in _VIEW_PRIMS or type(args[0]) is not TensorProxy:
            return None
        steps.append(PrimStep(name, args[1:]))
        target = args[0]
    return tuple(reversed(steps))


def _torch_op(symbol):
    """The first of ``symbol``'s torch functions that is torch's (not a thunder_rs wrapper)."""
    for fn in getattr(symbol, "torch_fns", ()):
        if not (getattr(fn, "__module__", None) or "").startswith("thunder_rs"):
            return fn
    return None


def _same_call(op):
    """The replay of a view op that calls ``op`` with the arguments it was given."""
    return None if op is None else lambda args, kwargs: (op, args, kwargs)


def _same(leaf):
    """A leaf as it is (``tree_map(_same, v)``: ``v`` with its containers copied)."""
    return leaf


def tracked(symbol, returns_self: bool = False, replay=None):
    """The view op ``symbol``, linking each output it computed from its input by shape prims.
    An output that is the input itself (``x.view(x.shape)``, ``x[:]``) is eager's new view of it
    (an alias: its own tensor, whose ``_base`` is the input), unless eager's op ``returns_self``
    when it has nothing to do (``flatten(1, 1)``, ``atleast_2d`` of a matrix). ``replay(args,
    kwargs)``: ``(torch op, args, kwargs)`` taking a single view again of a real tensor
    (``PrimStep.call``); by default the symbol's torch function with the arguments given."""
    replay = replay or _same_call(_torch_op(symbol))

    def view_op(a, *args, **kwargs):
        if type(a) is not TensorProxy:
            return symbol(a, *args, **kwargs)
        log = []
        start_prim_log(log)
        try:
            out = symbol(a, *args, **kwargs)
            if not returns_self and not recording_backward():  # (a rule's backward returns no view)
                out = _new_views(a, out)
        finally:
            stop_prim_log()
        several = type(out) is not TensorProxy
        group = (symbol.torch_fns[0], args, kwargs) if several and not _symbolic((args, kwargs), SymInt) else None
        call = None if several or replay is None else replay(args, kwargs)
        # (the arguments as they are now: a list the program changes later is not the one replayed)
        # (an int that became a symbolic size is replayed at the call's value: ``x[n]`` a SelectBackward0)
        call = None if call is None or _symbolic(call[1:], SymInt) else (call[0], *tree_map(_same, call[1:]))
        copied = _link(((a, o) for o in ((out,) if not several else out)), log, group, call)
        if copied and not several:
            # Eager's reshape copies (``_unsafe_view`` of a contiguous clone): the trace copies
            # too, so that no later view folds the reshapes around the copy away (``x.t()
            # .reshape(6).reshape(3, 2)`` is a new contiguous tensor, not ``x.t()``).
            return symbol(_shape.clone(a, memory_format=torch.contiguous_format), *args, **kwargs)
        return out

    view_op.__wrapped__ = symbol  # type: ignore[attr-defined]  # (the symbol it wraps, as functools does)
    return view_op


def _new_views(a, out):
    """``out`` with the input ``a`` itself, where the op returned it, an alias of ``a`` instead."""
    if out is a:
        return prims.reshape(a, tuple(a.shape))
    if type(out) in (tuple, list) and any(o is a for o in out):
        return type(out)(prims.reshape(a, tuple(a.shape)) if o is a else o for o in out)
    return out


def _link(pairs, log: list, group: tuple | None = None, call: tuple | None = None) -> bool:
    """Links each output of ``pairs`` (input, output) to its input by the shape prims in ``log``;
    whether eager's op copied any of them. ``group``: ``(torch op, args, kwargs)`` of an op
    returning several views, marked on the last prim of each (``PrimStep.group``); ``call``, that
    of an op returning one (``PrimStep.call``)."""
    copied = False
    for i, (a, o) in enumerate(pairs):
        if type(a) is TensorProxy and type(o) is TensorProxy and o is not a:
            steps = _chain(a, o, log)
            if steps is not None:
                if group is not None and steps:
                    steps = (*steps[:-1], steps[-1]._replace(group=(*group, i, len(steps))))
                elif call is not None and steps:
                    steps = (*steps[:-1], steps[-1]._replace(call=(*call, len(steps))))
                copied |= not attach(a, o, steps)
    return copied


def tracked_each(symbol):
    """The view op ``symbol`` of each of several tensors (``atleast_3d(a, b)``, or of a list of
    them): each output linked to its own input, as ``tracked`` links one. (One call, which the
    executors run whole.)"""
    one = tracked(symbol, returns_self=True)  # (``atleast_1d`` of a vector is the vector)

    def view_op(*tensors):
        given = tensors[0] if len(tensors) == 1 and type(tensors[0]) in (list, tuple) else tensors
        if len(given) == 1 and given is tensors:
            return one(tensors[0])
        log: list = []
        start_prim_log(log)
        try:
            out = symbol(*tensors)
        finally:
            stop_prim_log()
        _link(zip(given, out), log)
        return out

    view_op.__wrapped__ = symbol
    return view_op


def _same_layout(shape, strides, *args, **kwargs):
    return shape, strides


def opaque(take, put, strides=_same_layout, refusal: str = "", detached: bool = False, eager=None):
    """A view op ``take(a, *args, **kwargs)`` whose outputs are linked by opaque steps:
    ``put(a, new, *args, **kwargs)`` writes one back (only ops with a single output have it),
    ``strides(shape, strides, *args, **kwargs)`` gives its layout, ``eager(t, *args, **kwargs)``
    (the torch op) takes it of a real tensor."""

    def view_op(a, *args, **kwargs):
        out = take(a, *args, **kwargs)
        if not isinstance(a, TensorProxy):
            return out
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for i, o in enumerate(outs):
            if not isinstance(o, TensorProxy) or o is a:
                continue
            if isinstance(out, (tuple, list)):
                forward, back = (lambda p, i=i: take(p, *args, **kwargs)[i]), None
            else:
                forward = lambda p: take(p, *args, **kwargs)  # noqa: E731
                back = None if put is None else lambda p, new: put(p, new, *args, **kwargs)  # noqa: E731
            single = back is not None or (strides is not _same_layout and not isinstance(out, (tuple, list)))
            layout = (lambda shape, st: strides(shape, st, *args, **kwargs)) if single else _same_layout
            index = i if isinstance(out, (tuple, list)) else None
            replay, params = _eager_replay(eager, args, kwargs, index)
            attach(a, o, (OpaqueStep(forward, back, layout, refusal, detached, replay, params),))
        return out

    return view_op


def _eager_replay(eager, args, kwargs, index: int | None) -> tuple:
    """``(OpaqueStep.eager, OpaqueStep.eager_params)``: the torch op ``eager`` taking the view
    again of a real tensor (its output ``index`` of several), with the arguments given, or with
    their ints that became symbolic sizes as params computed at the call's sizes (``x.diagonal(n)``
    a DiagonalBackward0); ``(None, ())`` where there is no op, or an argument is another traced
    value."""
    if eager is None or _symbolic((args, kwargs), SymInt):
        return None, ()
    if index is None:
        again = lambda t, a, k: eager(t, *a, **k)  # noqa: E731
    else:
        again = lambda t, a, k: eager(t, *a, **k)[index]  # noqa: E731
    if _symbolic((args, kwargs)):
        return again, (args, kwargs)
    return (lambda t: again(t, args, kwargs)), ()


def _symbolic(value, allowed: type | tuple = ()) -> bool:
    """Whether ``value`` (or a tuple, list or dict of them) holds what a call computes: a
    symbolic size, or a traced tensor (a view op's arguments, which its eager replay would keep);
    instances of ``allowed`` aside."""
    if isinstance(value, (tuple, list)):  # (a shape: ``x.shape[:-1] + (n,)``)
        return any(_symbolic(v, allowed) for v in value)
    if isinstance(value, dict):
        return any(_symbolic(v, allowed) for v in value.values())
    if isinstance(value, slice):  # (an index: ``x[n // 2 :]``)
        return any(_symbolic(v, allowed) for v in (value.start, value.stop, value.step))
    return isinstance(value, (SymInt, SymFloat, TensorProxy)) and not isinstance(value, allowed)


def copy_of(a) -> TensorProxy:
    """A proxy for the same value that aliases nothing: what eager's op returns when it copies
    (``contiguous()`` of a non-contiguous tensor) though the trace computes nothing."""
    with torch._C.DisableTorchFunctionSubclass():
        requires_grad = a.requires_grad
    copy = make_proxy(a._vid, tuple(a.shape), CODES[a.dtype], str(a.device), requires_grad)
    copy._copy_of = True  # returned, it needs a real copy: its value may be a view of another
    return copy


# -- writing ---------------------------------------------------------------------------------------


def rebind(p, value, requires_grad: bool) -> None:
    p._vid = value._vid
    p._copy_of = False  # a value of its own now (``copy_of``'s proxy written in place)
    requires_grad = requires_grad and (p.dtype.is_floating_point or p.dtype.is_complex)
    with torch._C.DisableTorchFunctionSubclass():
        if p.requires_grad != requires_grad:
            p.requires_grad_(requires_grad)


def refresh(root, requires_grad: bool, written=None, value=None) -> None:
    """Recomputes the live views of ``root`` from its new value (``written`` becomes ``value``),
    and the tensors sharing its memory apart from autograd (``unsafe_pieces``)."""
    _refresh_views(root, requires_grad, written, value)
    if root._pieces is not None or root._piece_of is not None:
        _follow(root)


def _refresh_views(root, requires_grad: bool, written=None, value=None) -> None:
    if not root._views:
        return
    alive = []
    for ref in root._views:
        view = ref()
        if view is None:
            continue
        alive.append(ref)
        # The written view stays the value written where eager's is laid out as it (a
        # contiguous view); else it is the view of the new root, with eager's strides.
        new = value if view is written and _contiguous_view(view) else None
        if new is None:
            # (under ``no_grad`` too, a view that carries a gradient keeps it, as eager's keeps its node;
            # one taken under ``no_grad`` of memory requiring grad requires grad in eager: ``_refuse_history``)
            with torch._C.DisableTorchFunctionSubclass():
                carries = requires_grad and (view.requires_grad or bool(view._view.no_grad))
            with torch.enable_grad() if carries else contextlib.nullcontext():
                new = root
                for step in view._view.steps:
                    new = step.forward(new)
        rebind(view, new, requires_grad and not detached(view))
        if requires_grad and not detached(view):
            _refuse_history(view)
    root._views[:] = alive


def _contiguous_view(view) -> bool:
    """Whether a view's strides are a contiguous tensor's (at constant sizes and strides)."""
    shape, strides = tuple(view.shape), view._view.strides
    if not all(type(n) is int for n in (*shape, *strides)):
        return False
    return is_contiguous(shape, strides)


def _unseen(through, new, old):
    """``through(new, old)`` recorded with grad mode on: it routes the gradient of a write
    autograd does not see (under ``no_grad`` too) to the tensor's history."""
    with torch.enable_grad():
        return through(new, old)


def write(op: str, dst, value, requires_grad: bool, through=None, overwrite: bool = False) -> None:
    """Makes ``dst`` stand for ``value`` (of its shape and dtype), and every tensor that shares
    its memory follow: its root and the root's other live views.

    ``through(new_root, old_root)``, when given, wraps the root's new value (a write autograd does
    not see); ``requires_grad`` is the root's after the write.
    """
    link = dst._view
    root = dst if link is None else link.root
    if root._old_memory is not None:
        raise ThunderNotImplementedError(
            f"{op} at {user_location()}: writes memory a tensor was given up by Tensor.data = value at "
            f"{root._old_memory}, which a traced program no longer holds; clone() the view before the assignment"
        )
    if root._strides is not None and overlaps(root.shape, root._strides):
        # An expanded input: the trace's value of it has an element for each index, which the
        # copy back after the call cannot write into shared memory as eager's op wrote it.
        raise ThunderRuntimeError(f"{op}: {_OVERLAP} (at {user_location()})")
    if link is None:
        rebind(dst, value if through is None else _unseen(through, value, dst), requires_grad)
        refresh(dst, requires_grad)
        return
    if overlaps(dst.shape, link.strides):
        raise ThunderRuntimeError(f"{op}: {_OVERLAP} (at {user_location()})")
    if any(step.expands for step in link.steps):
        raise ThunderNotImplementedError(
            f"{op}: writing through a view of an expanded tensor is not supported; clone() it first "
            f"(at {user_location()})"
        )
    root = link.root
    if through is None:
        with torch._C.DisableTorchFunctionSubclass():
            value_grad = value.requires_grad
        value = written_through_view(value) if value_grad else value
    parents = [root]
    for step in link.steps[:-1]:
        parents.append(step.forward(parents[-1]))
    new = value
    for step, parent in zip(reversed(link.steps), reversed(parents)):
        new = step.inverse(parent, new, overwrite)
    if through is not None:
        new = _unseen(through, new, root)
    rebind(root, new, requires_grad)
    refresh(root, requires_grad, dst if through is None else None, value)


def note_version_bump(dst, value=None) -> None:
    """A write (of ``value``) that bumps eager's version counter of ``dst``'s memory: each live view
    of it was taken before the write (``ViewLink.rebased``), as eager's autograd sees at the view's
    next use; one that may require grad after it notes the write's line (a refusal of the view
    returned names it: ``writeback.refuse_rebased``)."""
    line, grad = None, isinstance(value, TensorProxy) and requires_grad_of(value)
    for ref in root_of(dst)._views or ():
        view = ref()
        if view is None:
            continue
        view._view.rebased = len(view._view.steps)
        if grad or view._view.no_grad or requires_grad_of(view):
            line = line or user_location()
            view._view.written_at = line


def same_memory(a, b) -> bool:
    """Whether ``b`` is ``a``, or a view of the same elements of the same root."""
    if a is b:
        return True
    if not isinstance(b, TensorProxy) or a._view is None or b._view is None:
        return False
    return a._view.root is b._view.root and a._view.steps == b._view.steps


def detached(p) -> bool:
    """Whether ``p`` is a view through ``.detach()`` or ``.data``: writes through it are
    invisible to autograd (no leaf error, no gradient through the written values)."""
    link = p._view
    return link is not None and any(getattr(step, "detached", False) for step in link.steps)


def root_of(p):
    link = p._view
    return p if link is None else link.root


# -- pieces that share memory apart from autograd --------------------------------------------------

#: the roots whose pieces and bases are taking a write now (a write they pass on does not come back)
_following: set = set()


class PieceOf:
    """What makes a proxy a piece of ``unsafe_split``: the tensor split and the piece's place in it
    (``base[start:stop]`` along ``dim``), and the call taking it (``(pick, args, kwargs)``: the
    piece's values as they were split). (Slotted, as ``ViewLink``: no state a call's outputs reach.)"""

    __slots__ = ("base", "dim", "start", "stop", "call", "vids")

    def __init__(self, base: TensorProxy, dim: int, start, stop, call: tuple, vids: tuple):
        self.base, self.dim, self.start, self.stop, self.call, self.vids = base, dim, start, stop, call, vids

    def link(self, piece) -> ViewLink | None:
        """How a returned piece is taken again of the caller's tensor (``core.acquisition``'s
        ``replayable_view``), by eager's op: where neither it nor the tensor split was written
        since (its values and history are the op's), as a view link whose last step replays it."""
        base, link = self.base, self.base._view
        if (piece._vid, base._vid) != self.vids or (link is not None and not all(s.replayable for s in link.steps)):
            return None
        shape = tuple(base.shape)
        starts, stops = [0] * len(shape), list(shape)
        starts[self.dim], stops[self.dim] = self.start, self.stop
        step = PrimStep("slice", (tuple(starts), tuple(stops), (1,) * len(shape)), call=(*self.call, 1))
        return ViewLink(base if link is None else link.root, (*(link.steps if link else ()), step))


def unsafe_pieces(symbol):
    """``unsafe_split``/``unsafe_chunk``: pieces that share memory with the input, which eager's
    autograd does not take as views (no ``_base``, a version counter of their own): each piece is a
    root of its own, written in place as any tensor, and a write into either side reaches the
    other's values where autograd does not see it (``_follow``)."""

    def split_op(a, *args, **kwargs):
        out = symbol(a, *args, **kwargs)
        if type(a) is not TensorProxy:
            return out
        dim = (args[1] if len(args) > 1 else kwargs.get("dim", 0)) % max(a.ndim, 1)
        op = symbol.torch_fns[0]
        pieces, start = [], 0
        for i, o in enumerate(out):
            o = prims.reshape(a, tuple(a.shape)) if o is a else o  # (one piece: a tensor of its own)
            stop = start + o.shape[dim]
            pick = lambda t, *args, i=i, **kwargs: op(t, *args, **kwargs)[i]  # noqa: E731
            o._piece_of = PieceOf(a, dim, start, stop, (pick, args, kwargs), (o._vid, a._vid))
            root = root_of(a)
            root._pieces = [*(root._pieces or ()), weakref.ref(o)]
            pieces.append(o)
            start = stop
        return type(out)(pieces)

    split_op.__wrapped__ = symbol
    return split_op


def _follow(root) -> None:
    """After a write to ``root``: its live pieces take their values of it, and where ``root`` is a
    piece, its base takes the piece's; as writes autograd does not see (eager's backward reads the
    new values where it saved the old: ``version_tracking``, uncounted)."""
    if id(root) in _following:
        return
    _following.add(id(root))
    try:
        for ref in root._pieces or ():
            piece = ref()
            if piece is not None and id(piece) not in _following:
                of = piece._piece_of
                _unseen_write(piece, slice_in_dim(of.base, of.dim, of.start, of.stop, 1))
        of = root._piece_of
        if of is not None and id(root_of(of.base)) not in _following:
            _unseen_write(of.base, slice_scatter(of.base, root, of.dim, of.start, of.stop, 1))
    finally:
        _following.discard(id(root))


def _unseen_write(dst, value) -> None:
    with torch._C.DisableTorchFunctionSubclass():
        requires_grad = root_of(dst).requires_grad
    version_tracking.written(dst, "unsafe_split", counted=False)
    write("unsafe_split", dst, value, requires_grad, straight_through)
