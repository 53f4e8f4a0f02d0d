"""Views of complex tensors that carry gradients, and writes through them.

A complex call that carries a gradient is eager's op, run as a fallback (``core.lang.complex_calls``),
so a view op of such a tensor (``z[:, :4]``, ``z.select(1, 0)``, ``z.t()``) returns a tensor of its
own to the trace. Eager's result shares the tensor's memory: a write through it changes the tensor,
and a write to the tensor changes it. Unlinked, the trace saw neither (a Fourier layer's
``out_ft[:, :, :modes] *= w`` left ``out_ft`` as it was, silently). Here such a view is linked to the
tensor it views (``link``) by a step that eager's op takes again, and a write through a view of a
complex tensor with a gradient (``write``) computes the tensor's new value by eager's ops too: a
copy of the tensor whose view takes the written value, a fallback whose backward is torch's
(``CopySlices``), as the write's in eager. The tensor's live views are then taken again of its new
value (``refresh``), by eager's ops as well: the shape prims' gradient rules are for real values.
"""

import contextlib

import torch

from thunder_rs.core.base.lazy import LazyModule
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.base.userframe import user_location
from thunder_rs.core.lang.complex_calls import VIEW_LINKS
from thunder_rs.core.lang.fallback import fallback, qualified_name
from thunder_rs.core.lang.symint import SymInt
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError
from thunder_rs.torch import views
from thunder_rs.torch.strides import overlaps, strides_of

#: eager's calls taking a view again (``eager_calls``): loaded by the first write a compile records
_WRITEBACK = LazyModule("thunder_rs.core.acquisition.writeback")
_UNSEEN = "writing through this view of a complex tensor is not supported"
_SIZED = "writing through its output, a view of a complex tensor taken with sizes the call computes, is not supported"
_MULTIPLE = (
    "is one of the views a call returning several views gave (split, unbind, chunk), which eager does not "
    "let a program write in place"
)


def _hinted(x):
    """``x`` with the values its symbolic sizes have in this call, read without a guard."""
    if type(x) is SymInt:
        return x.hint
    if type(x) in (tuple, list):
        return type(x)(map(_hinted, x))
    if type(x) is slice:
        return slice(_hinted(x.start), _hinted(x.stop), _hinted(x.step))
    return x


def _meta_of(shape, strides, dtype) -> torch.Tensor:
    return torch.empty_strided(_hinted(tuple(shape)), _hinted(tuple(strides)), dtype=dtype, device="meta")


def _eager_view(func, a, rest, kwargs):
    """``func`` run on a meta tensor of ``a``'s sizes and strides: its output(s), and the meta
    input, or None where that cannot run (an argument the call computes)."""
    if any(isinstance(x, TensorProxy) for x in (*rest, *kwargs.values())):
        return None
    meta = _meta_of(a.shape, strides_of(a), a.dtype).requires_grad_(_requires_grad(a))
    try:
        return func(meta, *_hinted(rest), **_hinted_kwargs(kwargs)), meta
    except Exception:  # (eager's own error has been raised by the fallback already)
        return None


def _requires_grad(p) -> bool:
    with torch._C.DisableTorchFunctionSubclass():
        return p.requires_grad


def _hinted_kwargs(kwargs: dict) -> dict:
    return {k: _hinted(v) for k, v in kwargs.items()}


def link(func, args, kwargs, out) -> None:
    """Links each output of ``func(*args, **kwargs)`` (eager's call, recorded as a fallback) that
    eager makes a view of ``args[0]`` to it, as the view ops of real tensors are linked."""
    a = args[0] if args else None
    if type(a) is not TensorProxy:
        return
    rest = args[1:]
    ran = _eager_view(func, a, rest, kwargs)
    if ran is None:
        return
    eager_out, meta = ran
    several = isinstance(eager_out, (tuple, list))
    outs, eager_outs = (out, eager_out) if several else ((out,), (eager_out,))
    sized = views._symbolic((rest, kwargs))
    refusal = f"{qualified_name(func)}: the view {_MULTIPLE}" if several else f"{qualified_name(func)}: {_SIZED}"
    for i, (o, e) in enumerate(zip(outs, eager_outs)):
        if type(o) is not TensorProxy or o is a or not isinstance(e, torch.Tensor) or not _shares(e, meta):
            continue
        take, again = _takers(func, rest, kwargs, i if several else None)
        layout = lambda shape, strides, i=i: _layout(func, rest, kwargs, i, shape, strides)  # noqa: E731
        put = None if several else _refused_put
        # (``z.detach()``: a view autograd does not see writes through, which requires no grad)
        detached = meta.requires_grad and torch.is_grad_enabled() and not e.requires_grad
        if detached:
            with torch._C.DisableTorchFunctionSubclass():
                o.requires_grad_(False)
        step = views.OpaqueStep(take, put, layout, refusal, detached, eager=None if sized else again)
        views.attach(a, o, (step,))


def _shares(t: torch.Tensor, meta: torch.Tensor) -> bool:
    """Whether ``t`` shares ``meta``'s memory: a view, or ``detach()``'s alias (no view to autograd)."""
    return t.untyped_storage()._cdata == meta.untyped_storage()._cdata


def _takers(func, rest, kwargs, i):
    """The view (output ``i`` of several, or the one when None) taken of a proxy, and of a real tensor."""
    if i is None:
        return (lambda p: fallback(func, (p, *rest), kwargs)), (lambda t: func(t, *rest, **kwargs))
    return (lambda p: fallback(func, (p, *rest), kwargs)[i]), (lambda t: func(t, *rest, **kwargs)[i])


def _refused_put(parent, new):
    """(A write with a gradient goes through ``write`` below; one without, under ``no_grad``, here.)"""
    raise ThunderNotImplementedError(f"{_UNSEEN} without a gradient (at {user_location()})")


def _layout(func, rest, kwargs, i, shape, strides):
    out = func(_meta_of(shape, strides, torch.complex64), *_hinted(rest), **_hinted_kwargs(kwargs))
    out = out[i] if isinstance(out, (tuple, list)) else out
    return tuple(out.shape), tuple(out.stride())


def _take_through(root, calls):
    for call, params in calls:
        root = call(root, *params)
    return root


def _write_through(root, value, calls):
    """``root`` after its view ``calls`` take is written with ``value``: eager's write, on a copy."""
    new = root.clone()
    _take_through(new, calls).copy_(value)
    return new


def _calls(op: str, steps) -> tuple:
    """Eager's calls taking the view ``steps`` take, for ``op``'s write through it; refuses a step
    eager cannot take again, or does not let a program write through."""
    for step in steps:
        if type(step) is views.OpaqueStep and step.eager is None:
            raise ThunderNotImplementedError(f"{op}: {step.refusal or _UNSEEN} (at {user_location()})")
        if type(step) is views.PrimStep and step.group is not None:
            raise ThunderNotImplementedError(f"{op}: the tensor written {_MULTIPLE} (at {user_location()})")
    return tuple(_WRITEBACK.load().eager_calls(steps))


def taken_eagerly(dst) -> bool:
    """Whether ``dst`` is a view through a step eager's op took, which no step of the trace writes
    back: ``link``'s (``z.conj()``), ``z.real``, ``torch.view_as_real(z)``."""
    link_ = dst._view
    return link_ is not None and any(_eager_only(step) for step in link_.steps)


def _eager_only(step) -> bool:
    return type(step) is views.OpaqueStep and step.eager is not None and step.put in (None, _refused_put)


def write(op: str, dst, value, requires_grad: bool, tracked: bool = True) -> None:
    """Makes ``dst``, a view of a complex tensor, stand for ``value`` where the write carries a
    gradient (``requires_grad``) or goes through a view eager's op took: its root takes eager's
    write on a copy (broadcasting ``value`` as eager's does), and the root's live views follow.
    (Refused through a detached view: autograd would not see the write, which a copy cannot be.)"""
    if requires_grad and not tracked:
        raise ThunderNotImplementedError(
            f"{op}: writing in place through a detached view of a complex tensor that carries a gradient is not "
            f"supported (at {user_location()}); compute the new tensor instead (torch.where, torch.cat)"
        )
    link_ = dst._view
    root = link_.root
    if (root._strides is not None and overlaps(root.shape, root._strides)) or overlaps(dst.shape, link_.strides):
        raise ThunderRuntimeError(f"{op}: {views._OVERLAP} (at {user_location()})")
    if any(step.expands for step in link_.steps):
        raise ThunderNotImplementedError(
            f"{op}: writing through a view of an expanded tensor is not supported; clone() it first "
            f"(at {user_location()})"
        )
    new = fallback(_write_through, (root, value, _calls(op, link_.steps)), {})
    views.rebind(root, new, requires_grad)
    if requires_grad:
        refresh(root)
    else:
        views.refresh(root, False)


def refresh(root) -> None:
    """Takes each live view of ``root`` (complex, requiring grad) again of its value, by eager's
    calls where they can be (a fallback), else by the steps' own."""
    for ref in root._views or ():
        view = ref()
        if view is None:
            continue
        steps, detached = view._view.steps, views.detached(view)
        with torch.no_grad() if detached else contextlib.nullcontext():
            if all(step.replayable for step in steps):
                new = fallback(_take_through, (root, tuple(_WRITEBACK.load().eager_calls(steps))), {})
            else:
                new = root
                for step in steps:
                    new = step.forward(new)
        views.rebind(view, new, not detached)


VIEW_LINKS.append(link)
