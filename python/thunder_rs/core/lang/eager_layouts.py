"""Eager's strides for the tensors a traced call computes.

The trace decides from strides where eager copies and where it views (``reshape``, ``view``,
``contiguous()``), and answers the program's ``stride()`` and ``is_contiguous()``. Trace inputs
carry their tensors' strides and views follow their roots'. A tensor a call computes was taken to
be contiguous, which eager's is not where the call's inputs are laid out in another order
(``x_channels_last.relu()``, ``x.t() * 2``: eager's outputs keep their inputs' order) or the call
asks for a layout (``x.clone(memory_format=torch.channels_last)``). Taking those for contiguous
let ``x.t().exp().view(-1)`` run where eager raises, and made ``y.reshape(-1)`` of such a ``y`` a
view, so that a write through it changed ``y``, where eager's reshape copies.

For such calls (``laid_out``), eager's own meta kernel, run on meta tensors with the inputs'
strides, tells the outputs' strides (``take_layouts``): a dense order holds for symbolic sizes as
it does for a trace input (``core.base.layouts``). Calls whose inputs are all contiguous, or
ordered as contiguous tensors are (slices, broadcasts), cost one look at their arguments.
Symbolic sizes are at their hints there: an order decided from strides holds for every size a
variant serves (sizes of 2 or more), as it does for the inputs' own.
"""

import torch

from thunder_rs.core.base.layouts import is_dense, layout, strides_in
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.symint import hint

#: Formats that lay out a computed tensor in another order than its dims'.
_ORDERS = (torch.channels_last, torch.channels_last_3d)


def eager_strides(p) -> tuple | None:
    """The strides eager's tensor for proxy ``p`` has, or None where it is contiguous (a tensor a
    call computed is, unless ``take_layouts`` said otherwise)."""
    link = p._view
    return p._strides if link is None else link.strides


def _reordered(p) -> bool:
    """Whether ``p``'s elements may lie in another order than its dims': a tensor with strides of
    its own, or a view whose root has them or that transposes (slices, broadcasts and reshapes of a
    contiguous root keep the order, and their strides are not worked out here)."""
    link = p._view
    if link is None:
        return p._strides is not None and not _in_order(p._shape, p._strides)
    if link.root._strides is None and all(getattr(s, "name", None) != "transpose" for s in link.steps):
        return False
    return not _in_order(p._shape, link.strides)


def _in_order(shape, strides) -> bool:
    """Whether strides fall from the outer dims to the inner ones (at the sizes' hints): eager's
    outputs of such inputs are contiguous."""
    last = None
    for size, stride in zip(shape, strides):
        if hint(size) > 1:
            stride = hint(stride)
            if last is not None and stride > last:
                return False
            last = stride
    return True


def laid_out(args: tuple, kwargs: dict) -> bool:
    """Whether a call's outputs may be laid out otherwise than contiguously in eager: it asks for
    a format, or takes a tensor in another order (``_reordered``)."""
    if kwargs and kwargs.get("memory_format") in _ORDERS:
        return True
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, TensorProxy):
            if (a._strides is not None or a._view is not None) and _reordered(a):
                return True
        elif type(a) in (list, tuple):
            if any(isinstance(x, TensorProxy) and _reordered(x) for x in a):
                return True
    return False


def meta_of(p) -> torch.Tensor:
    """A meta tensor with ``p``'s dtype, sizes (their hints) and eager strides."""
    shape = [hint(s) for s in p._shape]
    strides = eager_strides(p)
    if strides is None:
        return torch.empty(shape, dtype=p._dtype, device="meta")
    return torch.empty_strided(shape, [hint(s) for s in strides], dtype=p._dtype, device="meta")


def aliases_to(p, memory_format) -> bool:
    """Whether eager's ``p.to(memory_format=...)`` returns ``p`` itself (its strides already
    suggest that format), rather than a copy laid out in it."""
    m = meta_of(p)
    with torch._C.DisableTorchFunction():
        return m.to(memory_format=memory_format) is m


def _meta_arg(a):
    if isinstance(a, TensorProxy):
        return meta_of(a)
    if type(a) in (list, tuple):
        return type(a)(_meta_arg(x) for x in a)
    if isinstance(a, torch.SymInt):
        return hint(a)
    if isinstance(a, torch.Tensor):
        raise _NotMeta
    return a


class _NotMeta(Exception):
    """A call whose arguments have no meta counterpart (a real tensor)."""


def _run_meta(func, args: tuple, kwargs: dict):
    """``func`` on meta counterparts of its arguments, or None where it cannot run there (no
    meta kernel, sizes its data tells, arguments that are not meta)."""
    try:
        margs = [_meta_arg(a) for a in args]
        mkwargs = {k: _meta_arg(v) for k, v in kwargs.items()} if kwargs else {}
        with torch._C.DisableTorchFunction():
            return func(*margs, **mkwargs), margs
    except Exception:  # noqa: BLE001 (what meta cannot tell stays contiguous, as before)
        return None, None


def take_layouts(func, args: tuple, kwargs: dict, out) -> None:
    """Gives the tensors ``out`` that the call ``func(*args, **kwargs)`` computed eager's strides
    where they are not contiguous (see the module doc)."""
    mout, margs = _run_meta(func, args, kwargs)
    if mout is None:
        return
    if isinstance(out, TensorProxy):
        pairs = [(out, mout)]
    elif type(out) in (list, tuple) and type(mout) in (list, tuple) and len(out) == len(mout):
        pairs = list(zip(out, mout))
    else:
        return
    taken = {id(a) for a in args if isinstance(a, TensorProxy)}
    for o, m in pairs:
        if isinstance(o, TensorProxy) and isinstance(m, torch.Tensor) and _computed(o, taken):
            if m._base is None and not any(m is a for a in margs) and not m.is_contiguous():
                _take(o, m)


def _computed(o, taken: set) -> bool:
    """Whether ``o`` is a tensor the call computed: not one it took, a view, or a trace input."""
    return (
        id(o) not in taken
        and o._view is None
        and o._input_vid is None
        and o._strides is None
        and not o._made_contiguous
    )


def _take(o, m: torch.Tensor) -> None:
    lay = layout(m)
    if is_dense(lay):
        o._strides = strides_in(o._shape, lay)
    elif not o._symbolic:
        o._strides = tuple(m.stride())
