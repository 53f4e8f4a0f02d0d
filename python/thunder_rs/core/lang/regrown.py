"""Tensors given memory of other sizes or another dtype by ``tensor.data = value`` while traced
(``p.data = p.data.half()``, ``buf.data = torch.zeros(n)``), whose gradient a trace cannot route.

Eager's ``tensor`` keeps its identity and its autograd leaf, now of ``value``'s sizes and dtype;
an op after the assignment that records a gradient through it fills its ``.grad`` of the new
sizes and dtype. The compiled call gives the caller's tensor the new memory after running
(``writeback``), so its autograd node's input is the tensor as it was, of the old sizes and
dtype: such an op is refused, naming the line of both (found by running the call on meta
tensors, as ``inference.check_call`` does). Ops without a gradient through it (under
``no_grad``, ``.data``, comparisons, a tensor that requires none) run as eager's.
"""

import contextlib
import contextvars

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.base.userframe import user_location
from thunder_rs.core.lang.symint import SymInt, hint
from thunder_rs.errors import ThunderNotImplementedError

#: Whether the program being traced gave such a tensor other memory (``check_call`` is then on).
REGROWN = [False]
#: The caller's tensors the program being traced holds itself (captured, or reached through an
#: argument object) given stand-in memory of the new sizes and dtype, with their own ``.data`` and
#: their proxies
_stood_in: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_regrown", default=None)


@contextlib.contextmanager
def regrowing():
    """While a program is traced: the caller's tensors given stand-in memory (``stand_in``) get
    their own back after, also where tracing fails."""
    outer, REGROWN[0] = REGROWN[0], False
    stood_in: list = []
    token = _stood_in.set(stood_in)
    try:
        yield
    finally:
        _stood_in.reset(token)
        REGROWN[0] = outer  # (a program traced inside another's tracing: the outer one's again)
        with torch._C.DisableTorchFunction():
            for real, data, _ in reversed(stood_in):
                real.data = data


def stand_in(real: torch.Tensor, like, proxy: TensorProxy) -> bool:
    """Gives ``real``, a caller's tensor the traced program holds itself, empty memory of the
    sizes and dtype of ``like`` until tracing ends, so that the program reads eager's sizes and
    dtype of it after ``real.data = value`` (its values the trace reads from ``proxy``). False
    outside ``regrowing``."""
    stood_in = _stood_in.get()
    if stood_in is None:
        return False
    with torch._C.DisableTorchFunction():
        stood_in.append((real, real.data, proxy))
        real.data = torch.empty(tuple(hint(s) for s in like.shape), dtype=like.dtype, device=like.device)
    return True


def _meta(x, regrown: bool):
    """A meta tensor for ``x`` that requires grad only where ``x`` is a tensor given other memory."""
    t = torch.empty(tuple(hint(s) for s in x.shape), dtype=x.dtype, device="meta")
    return t.requires_grad_(True) if regrown and (t.dtype.is_floating_point or t.dtype.is_complex) else t


def _requires_grad(x: TensorProxy) -> bool:
    with torch._C.DisableTorchFunctionSubclass():
        return x.requires_grad


def _regrown(x) -> str | None:
    """The line of the assignment that gave ``x`` other memory, where it requires grad: a proxy, or
    the caller's tensor the program holds for one (``stand_in``)."""
    if isinstance(x, TensorProxy):
        return x._regrown if x._regrown is not None and _requires_grad(x) else None
    if isinstance(x, torch.Tensor):
        stood_in = _stood_in.get()
        return next((p._regrown for real, _, p in stood_in or () if real is x and p._regrown is not None), None)
    return None


def check_call(func, args, kwargs) -> None:
    """Refuses a torch call with grad mode on through which eager records a gradient into a
    tensor given other memory by ``tensor.data = value`` (``TensorProxy._regrown``)."""
    if not torch.is_grad_enabled():
        return
    flat, spec = tree_flatten((args, kwargs))
    marks = [_regrown(x) for x in flat]
    if not any(marks):
        return
    meta = [
        _meta(x, bool(m)) if isinstance(x, torch.Tensor) else hint(x) if isinstance(x, SymInt) else x
        for x, m in zip(flat, marks)
    ]
    meta_args, meta_kwargs = tree_unflatten(meta, spec)
    try:
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*meta_args, **meta_kwargs)
    except Exception:  # noqa: BLE001 (the call's own errors are the trace's to raise)
        return
    if any(isinstance(o, torch.Tensor) and o.requires_grad for o in tree_flatten(out)[0]):
        where = next(m for m in marks if m)
        name = getattr(func, "__name__", str(func))
        raise ThunderNotImplementedError(
            f"{name} at {user_location()}: records a gradient into a tensor that Tensor.data = value at {where} gave "
            "other sizes or another dtype, which a compiled call cannot route to it (its autograd input is the tensor "
            "as it was before the call). Give the tensor its new memory outside the jitted function (before the "
            "call), or use it under torch.no_grad() in the call"
        )
