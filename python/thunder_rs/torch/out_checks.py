"""Eager's checks of an ``out=`` argument, made before a traced ``out=`` call computes its value.

The trace computes ``func(*args)`` out of place and writes it into ``out`` with the casts an
in-place copy allows (``inplace.write_out``). Eager's ``out=`` kernels are stricter in places:
reductions and ``gather`` take only their result's dtype (``torch.amax(x, 0, out=double)`` of a
float ``x`` raises), ``torch.complex``, ``torch.multinomial`` and ``torch.softmax`` too, ``torch.cat`` refuses an
``out`` that shares memory with an input, ``torch.aminmax`` one ``min`` that is its ``max``. Each
raises here what eager raises, rather than a result eager never gives. And some reductions and
scans compute in ``out``'s dtype (``torch.sum(x, 0, out=double)`` of a float ``x`` sums in
double, as ``dtype=torch.float64`` would): ``in_out_dtype`` passes it as their ``dtype``, and
casts ``std``/``var``'s input, and sums ``logsumexp``'s exponentials, in it.
"""

from __future__ import annotations

import functools
import re
import warnings

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.langctx import user_location
from thunder_rs.core.lang.symint import SymInt, hint
from thunder_rs.errors import ThunderRuntimeError, ThunderValueError, thunder_error_like
from thunder_rs.torch.common import SCALAR_NAMES

__all__ = ["check_out", "in_out_dtype"]

#: What the structured ``out=`` kernels' meta functions raise for an ``out`` of the wrong dtype
#: (``Expected out tensor to have dtype float, but got double instead``, ``Expected the dtype for
#: input and out to match, ...``): only such errors of the meta run are eager's; the rest are left
#: to the trace.
_OUT_ERROR = re.compile(r"\bout\b.*\bdtype\b|\bdtype\b.*\bout\b", re.IGNORECASE)

_OVERLAP = (
    "unsupported operation: some elements of the input tensor and the written-to tensor refer to a single "
    "memory location. Please clone() the tensor before performing the operation."
)


def _meta(x):
    """A meta tensor of the tensor ``x``'s dtype and sizes (their hints); ``x`` itself otherwise."""
    if not isinstance(x, torch.Tensor):
        return hint(x) if isinstance(x, SymInt) else x
    return torch.empty(tuple(hint(s) for s in x.shape), dtype=x.dtype, device="meta")


def _meta_out_error(func, args, kwargs) -> None:
    """Eager's dtype check of ``out``: the call run on meta tensors, its ``out`` error raised."""
    flat, spec = tree_flatten((args, kwargs))
    try:
        meta_args, meta_kwargs = tree_unflatten([_meta(x) for x in flat], spec)
        with torch._C.DisableTorchFunction(), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            func(*meta_args, **meta_kwargs)
    except (RuntimeError, ValueError, TypeError) as e:
        if isinstance(e, NotImplementedError) or not _OUT_ERROR.search(str(e)):
            return  # (no meta kernel, or not an ``out`` check: the trace's own errors are raised)
        name = getattr(func, "__name__", "op")
        raise thunder_error_like(e, f"{name}: {e} (argument out, at {user_location()})") from None
    except Exception:  # noqa: BLE001 (the call's own errors are the trace's to raise)
        return


def _root(t: TensorProxy) -> TensorProxy:
    return t._view.root if t._view is not None else t


def _shares_memory(a: TensorProxy, b: TensorProxy) -> bool:
    """Whether ``a`` and ``b`` surely share memory: the same tensor, or one a non-empty view of the
    other (two views of one tensor may not overlap: left to the trace)."""
    if a is b:
        return True
    if 0 in a.shape or 0 in b.shape:
        return False
    return _root(a) is b or _root(b) is a


def _cat_overlap(func, args, kwargs, targets) -> None:
    tensors = args[0] if args else kwargs.get("tensors", ())
    for t in tensors if isinstance(tensors, (tuple, list)) else ():
        if isinstance(t, TensorProxy) and any(_shares_memory(t, o) for o in targets if isinstance(o, TensorProxy)):
            raise ThunderRuntimeError(f"{func.__name__}: {_OVERLAP} (argument out, at {user_location()})")


def _aminmax_overlap(func, args, kwargs, targets) -> None:
    if len(targets) == 2 and all(isinstance(t, TensorProxy) for t in targets) and _shares_memory(*targets):
        raise ThunderValueError(
            f"aminmax(): the `min` and `max` out= tensors must not overlap. (argument out, at {user_location()})"
        )


def _exact_dtype(want, targets, func, message) -> None:
    for t in targets:
        if isinstance(t, TensorProxy) and t.dtype != want:
            raise ThunderRuntimeError(f"{func.__name__}: {message(want, t.dtype)} (at {user_location()})")


def _complex_dtype(func, args, kwargs, targets) -> None:
    real = args[0] if args else kwargs.get("real")
    if isinstance(real, TensorProxy) and real.dtype.is_floating_point:
        want = torch.complex(torch.empty((), dtype=real.dtype), torch.empty((), dtype=real.dtype)).dtype
        _exact_dtype(
            want,
            targets,
            func,
            lambda w, h: (
                f"Expected object of scalar type {_scalar(w)} but got scalar type {_scalar(h)} for argument 'out'"
            ),
        )


def _multinomial_dtype(func, args, kwargs, targets) -> None:
    _exact_dtype(torch.int64, targets, func, lambda w, h: f"multinomial expects Long tensor out, got: {_scalar(h)}")


def _softmax_dtype(func, args, kwargs, targets) -> None:
    """``torch.softmax``'s ``out`` takes its result's dtype: ``dtype``'s, else the input's."""
    x = args[0] if args else kwargs.get("input")
    want = kwargs.get("dtype") or (args[2] if len(args) > 2 else None) or getattr(x, "dtype", None)
    if isinstance(want, torch.dtype):
        _exact_dtype(
            want,
            targets,
            func,
            lambda w, h: f"Expected out tensor to have dtype {_type_meta(w)}, but got {_type_meta(h)} instead",
        )


def _scalar(dtype: torch.dtype) -> str:
    return SCALAR_NAMES.get(dtype, str(dtype))


def _type_meta(dtype: torch.dtype) -> str:
    """The name eager's messages give a dtype by its C++ type (``float``, ``c10::Half``)."""
    names = {torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half"}
    return names.get(dtype) or f"c10::{_scalar(dtype)}"


#: torch function -> its ``out=`` check that no meta function makes: ``(func, args, kwargs, targets)``
_CHECKS = {
    torch.cat: _cat_overlap,
    torch.concat: _cat_overlap,
    torch.concatenate: _cat_overlap,
    torch.aminmax: _aminmax_overlap,
    torch.complex: _complex_dtype,
    torch.multinomial: _multinomial_dtype,
    torch.softmax: _softmax_dtype,
    torch.log_softmax: _softmax_dtype,
}


def check_out(func, args, kwargs) -> None:
    """Raises eager's error for ``func(*args, **kwargs)`` (``kwargs`` holding ``out``) where eager's
    ``out=`` kernel refuses ``out`` (its dtype, or memory it shares), before the trace computes it."""
    out = kwargs["out"]
    targets = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    check = _CHECKS.get(func)
    if check is not None:
        check(func, args, kwargs, targets)
    _meta_out_error(func, args, kwargs)


#: Ops whose ``out=`` kernel takes ``out``'s dtype for the ``dtype`` argument not given
#: (``at::native::infer_dtype_from_optional``): the value is computed in it, not cast to it.
_COMPUTED_IN_OUT_DTYPE = frozenset({torch.sum, torch.nansum, torch.mean, torch.prod, torch.cumsum, torch.cumprod})


def in_out_dtype(func, args: tuple, kwargs: dict, out) -> tuple:
    """``(func, args, kwargs)`` (``kwargs`` without ``out``) of ``func(..., out=out)`` as eager's
    kernel computes it: with ``dtype=out.dtype`` for the reductions and scans that compute in it;
    ``std``/``var`` of an input cast to ``out``'s floating dtype (their reduction iterator reads the
    input in the result's dtype); ``logsumexp`` summing in ``out``'s dtype (``logsumexp_out``)."""
    if not isinstance(out, TensorProxy):
        return func, args, kwargs
    if func in _COMPUTED_IN_OUT_DTYPE and kwargs.get("dtype") is None:
        return func, args, {**kwargs, "dtype": out.dtype}
    x = args[0] if args else kwargs.get("input")
    if not isinstance(x, TensorProxy) or not x.dtype.is_floating_point or x.dtype == out.dtype:
        return func, args, kwargs
    if func in (torch.std, torch.var) and out.dtype.is_floating_point:
        return func, (x.to(out.dtype), *args[1:]), kwargs
    if func is torch.logsumexp and out.dtype.is_floating_point:
        return functools.partial(_logsumexp_in, dtype=out.dtype), args, kwargs
    return func, args, kwargs


def _logsumexp_in(input, dim, keepdim=False, *, dtype: torch.dtype):
    """``logsumexp_out_impl``: the maximum (0 where infinite) of the input's dtype, the shifted
    exponentials summed in ``dtype`` (the ``out``'s), then its log plus the maximum."""
    peak = torch.amax(input, dim, keepdim=True)
    peak = torch.where(peak.abs() == float("inf"), torch.zeros_like(peak), peak)
    total = torch.sum(torch.exp(input - peak), dim, keepdim=keepdim, dtype=dtype)
    dims = [dim] if isinstance(dim, int) else list(dim)
    return torch.log(total) + (peak if keepdim else peak.squeeze(dims))
