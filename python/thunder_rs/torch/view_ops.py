"""Which torch calls make views (``views.py``'s links): eager's view ops wrapped to link their
outputs to their input, the copying ops and conversions that must copy where eager copies, the
properties that alias (``T``, ``mT``, ``real``, ``data``), and the eager view ops run as fallbacks,
through whose outputs a write is refused. Registered at import, after ``views``.
"""

import operator

import torch

from thunder_rs import prims
from thunder_rs.core.lang import dual_tensors
from thunder_rs.core.lang.devices import indexed
from thunder_rs.core.lang.fallback import fallback, qualified_name, user_fallback
from thunder_rs.core.lang.langctx import PROXY_CALLS, PROPERTY_TO_LTORCH, TORCH_TO_LTORCH, user_location
from thunder_rs.core.base.proxies import TensorProxy, numel_of
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, check
from thunder_rs.torch import indexing as _indexing, joins as _joins, shape as _shape
from thunder_rs.torch.strides import FALLBACK_LAYOUTS, is_contiguous, nonempty, strides_of, viewed_strides
from thunder_rs.torch.view_scatters import (
    _diagonal_layout,
    diagonal,
    diagonal_scatter,
    stop_gradient,
    straight_through,
)
from thunder_rs.torch.views import (
    _same_layout,
    copy_of,
    opaque,
    tracked,
    tracked_each,
)

__all__: list[str] = []

# -- which torch calls make views ------------------------------------------------------------------

#: View ops whose outputs are chains of shape prims from their input.
_PRIM_VIEWS = (
    "reshape",
    "view",
    "view_as",
    "reshape_as",
    "flatten",
    "ravel",
    "unflatten",
    "permute",
    "transpose",
    "swapaxes",
    "t",
    "movedim",
    "expand",
    "expand_as",
    "broadcast_to",
    "unsqueeze",
    "squeeze",
    "split",
    "chunk",
    "tensor_split",
    "narrow",
    "select",
    "slice_tensor",
    "unbind",
    "getitem",
    "alias",
)
#: Of these, the ops eager returns the input itself from when they have nothing to do (the others
#: return a new view of it, ``x.view(x.shape)``).
_RETURN_SELF = frozenset({"flatten"})
#: View ops of each of several tensors (``tracked_each``); ``atleast_3d`` is ``arrange``'s.
_EACH_VIEWS = ("atleast_1d", "atleast_2d")
#: Copying ops that return their input when they have nothing to do (eager still copies).
_COPIES = ("flip", "roll")
#: Eager view ops thunder_rs runs as fallbacks: a write through their output is refused.
_FALLBACK_VIEWS = (
    torch.Tensor.as_strided,
    torch.as_strided,
    torch.Tensor.unfold,
    torch.Tensor.split_with_sizes,
    torch.split_with_sizes,
    torch.hsplit,
    torch.vsplit,
    torch.dsplit,
    torch.Tensor.hsplit,
    torch.Tensor.vsplit,
    torch.Tensor.dsplit,
    torch.Tensor.adjoint,
    torch.adjoint,
    torch.Tensor.indices,
    torch.Tensor.values,
    torch.alias_copy,
)


class _Rewrap:
    """``rewrap(symbol, wrapper)``: every key of ``table`` that maps to ``symbol`` maps to
    ``wrapper`` instead. The keys are indexed by value once (a scan of the whole table per
    rewrap was 4 ms of ``import thunder_rs``, issue 25); an indexed key is rewrapped only if it
    still maps to ``symbol``, so entries set directly in between are left as they are."""

    def __init__(self, table: dict):
        self.table = table
        self.keys: dict[int, list] = {}
        for key, value in table.items():
            self.keys.setdefault(id(value), []).append(key)

    def __call__(self, symbol, wrapper) -> None:
        keys = [key for key in self.keys.pop(id(symbol), ()) if self.table.get(key) is symbol]
        for key in keys:
            self.table[key] = wrapper
        self.keys.setdefault(id(wrapper), []).extend(keys)


def _contiguous_or_copy(symbol):
    """``contiguous()``: the tensor itself when it is contiguous in eager, else a copy."""

    def contiguous(a, memory_format=torch.contiguous_format):
        out = symbol(a, memory_format)
        if out is a and isinstance(a, TensorProxy) and not _in_format(a, memory_format):
            # A copy the executors make, so that the ops reading it run on eager's layout and
            # hand on eager's (``x.t().contiguous() * 2`` is row-major).
            return _shape.clone(a, memory_format=memory_format)
        return out

    return contiguous


def _ravel(view_op):
    """``ravel``: eager's ``contiguous().view(-1)``, so a copy of a tensor that is not contiguous,
    even one whose dims a reshape would merge into a view (a slice with a step)."""

    def ravel(a):
        if isinstance(a, TensorProxy) and numel_of(a) > 1 and not _in_format(a, torch.contiguous_format):
            a = _shape.clone(a, memory_format=torch.contiguous_format)
        return view_op(a)

    ravel.__wrapped__ = view_op
    return ravel


#: The formats that order a tensor's elements otherwise than its dims.
_ORDERS = (torch.channels_last, torch.channels_last_3d)


def _in_format(a, memory_format) -> bool:
    strides = strides_of(a)
    if memory_format in (torch.channels_last, torch.channels_last_3d) and a.ndim != (
        4 if memory_format == torch.channels_last else 5
    ):
        return False  # eager's answer for a tensor of another rank
    if memory_format == torch.channels_last and a.ndim == 4:
        n, c, h, w = a.shape
        return is_contiguous((n, h, w, c), (strides[0], strides[2], strides[3], strides[1]))
    if memory_format == torch.channels_last_3d and a.ndim == 5:
        n, c, d, h, w = a.shape
        return is_contiguous((n, d, h, w, c), (strides[0], strides[2], strides[3], strides[4], strides[1]))
    return is_contiguous(a.shape, strides)


def _eager_stride(a, dim=None):
    nonempty(a)
    strides = strides_of(a)
    return strides if dim is None else strides[dim + a.ndim if dim < 0 else dim]


def _eager_is_contiguous(a, memory_format=torch.contiguous_format) -> bool:
    nonempty(a)
    return _in_format(a, memory_format)


PROXY_CALLS[torch.Tensor.stride] = _eager_stride
PROXY_CALLS[torch.Tensor.is_contiguous] = _eager_is_contiguous


def _conversion(fn):
    """``torch.as_tensor``/``asarray`` of a traced tensor: the tensor itself (eager's alias), or
    converted when a dtype, device or copy asks for a new tensor."""

    def convert(data, dtype=None, device=None, copy=None, requires_grad=False):
        if requires_grad:
            return fallback(fn, (data,), {"dtype": dtype, "device": device, "copy": copy, "requires_grad": True})
        out = data
        if dtype is not None and dtype != data.dtype:
            out = prims.convert_element_type(out, dtype)
        if device is not None and indexed(torch.device(device)) != data.device:
            out = prims.device_put(out, indexed(torch.device(device)))
        return copy_of(out) if copy and out is data else out

    return convert


for _fn in (torch.as_tensor, torch.asarray):
    PROXY_CALLS[_fn] = _conversion(_fn)


def _storage_offset(a):
    raise ThunderNotImplementedError(
        f"Tensor.storage_offset: read at {user_location()} on a traced tensor; a compiled call does not "
        "specialise on where a tensor starts in its storage, so the value could be another call's"
    )


PROXY_CALLS[torch.Tensor.storage_offset] = _storage_offset


def _fresh(symbol):
    def copying_op(a, *args, **kwargs):
        out = symbol(a, *args, **kwargs)
        return copy_of(a) if out is a and isinstance(a, TensorProxy) else out

    return copying_op


def _refused_view(fn, call):
    refusal = (
        f"{qualified_name(fn)}: writing through its output, a view, is not supported; "
        "clone() it first, or write to the tensor it views"
    )
    eager = None if fn in (torch.Tensor.as_strided, torch.as_strided) else fn  # (strides: the root's layout)
    return opaque(call, None, FALLBACK_LAYOUTS.get(fn, _same_layout), refusal=refusal, eager=eager)


def _diagonal_strides(shape, strides, offset=0, dim1=0, dim2=1):
    perm, _, _, length, _ = _diagonal_layout(shape, offset, dim1, dim2, "ltorch.diagonal")
    *keep, d1, d2 = perm
    return (*[shape[d] for d in keep], length), (*[strides[d] for d in keep], strides[d1] + strides[d2])


def _detach_with(take):
    """``detach()``/``.data``: a view through which writes change values autograd does not see
    change; the view itself does not require grad."""

    def detached(a):
        out = take(a)
        with torch._C.DisableTorchFunctionSubclass():
            out.requires_grad_(False)
        dual_tensors.cut(out, a)
        return out

    def written(a, new):  # (no gradient reaches a history eager refuses: ``TensorProxy._history_error``)
        return new if a._history_error is not None else straight_through(new, a)

    return opaque(detached, written, detached=True)


def _eager_property(name: str):
    """The tensor property ``name`` as eager computes it: a view a write through is refused
    (``z.real``/``z.imag`` of a complex tensor)."""
    getter = vars(torch._C.TensorBase)[name].__get__
    view = opaque(
        lambda a: user_fallback(getter, (a,), {}),
        None,
        FALLBACK_LAYOUTS[name],
        refusal=f"Tensor.{name}: writing through it, a view of a complex tensor, is not supported; "
        "write the whole tensor (torch.complex(re, im))",
        eager=getter,
    )
    view.takes_complex = True  # (eager's op either way: a view of the complex tensor)
    return view


def _of_real(name: str, alias, min_ndim: int, exact: bool = False):
    """The tensor property ``name``: ``alias`` of a real tensor with at least (``exact``: just)
    ``min_ndim`` dims; otherwise eager's own answer (complex values, its errors)."""
    getter = vars(torch._C.TensorBase)[name].__get__
    of_complex = _eager_property(name)

    def prop(a):
        fits = a.ndim == min_ndim if exact else a.ndim >= min_ndim
        if a.dtype.is_complex:
            return of_complex(a)
        if not fits:
            return user_fallback(getter, (a,), {})
        return alias(a)

    prop.takes_complex = True  # type: ignore[attr-defined]  # (a complex tensor's computed as eager's)
    return prop


def _bool_key_copies(view_op):
    """``x[True]`` (a bool among the key's entries) is advanced indexing in eager, so a copy,
    though the trace computes it as an unsqueeze."""

    def getitem(a, key):
        key = _indexing.key_read_by_values(key, a)
        out = view_op(a, key)
        entries = key if type(key) is tuple else (key,)
        if any(k is True for k in entries) and isinstance(out, TensorProxy):
            return copy_of(out)
        return out

    getitem.__wrapped__ = view_op
    return getitem


def _checked_view(view_op):
    """``Tensor.view``: eager's error where the tensor's layout cannot be viewed with the new
    shape (a transposed or sliced input); the trace would reshape it, copying."""

    def view(a, *args, **kwargs):
        out = view_op(a, *args, **kwargs)
        if isinstance(a, TensorProxy) and isinstance(out, TensorProxy) and numel_of(a) > 0:
            check(
                viewed_strides(tuple(a.shape), strides_of(a), tuple(out.shape)) is not None,
                "ltorch.view",
                "view size is not compatible with input tensor's size and stride (at least one dimension spans across "
                "two contiguous subspaces). Use .reshape(...) instead.",
                ThunderRuntimeError,
            )
        return out

    view.__wrapped__ = view_op
    return view


def _shaped_as(op):
    """The replay of ``x.expand_as(other)`` and the like: ``op`` (``Tensor.expand``) given the
    other tensor's shape, which eager's op passes it (its node is that op's: ExpandBackward0)."""

    def replay(args, kwargs):
        other = args[0] if args else kwargs["other"]
        return op, (tuple(other.shape),), {}

    return replay


#: View ops given a tensor for its shape, taken again by the op they call with that shape.
_AS_REPLAYS = {
    "expand_as": _shaped_as(torch.Tensor.expand),
    "view_as": _shaped_as(torch.Tensor.view),
    "reshape_as": _shaped_as(torch.Tensor.reshape),
}


def _symbol(name: str):
    return getattr(_shape, name, None) or getattr(_joins, name, None) or getattr(_indexing, name)


#: The tensor properties Dynamo writes as aten calls, by property.
_ATEN_PROPERTIES = {
    "T": torch.ops.aten.numpy_T,
    "mT": torch.ops.aten.mT,
    "H": torch.ops.aten.matrix_H,
    "mH": torch.ops.aten.mH,
}


def _register() -> None:
    rewrap = _Rewrap(TORCH_TO_LTORCH)
    for name in _PRIM_VIEWS:
        rewrap(_symbol(name), tracked(_symbol(name), returns_self=name in _RETURN_SELF, replay=_AS_REPLAYS.get(name)))
    for name in _EACH_VIEWS:
        rewrap(_symbol(name), tracked_each(_symbol(name)))
    TORCH_TO_LTORCH[torch.Tensor.view] = _checked_view(TORCH_TO_LTORCH[torch.Tensor.view])
    rewrap(
        TORCH_TO_LTORCH[torch.Tensor.__getitem__],
        _bool_key_copies(TORCH_TO_LTORCH[torch.Tensor.__getitem__]),
    )
    for name in ("T", "mT"):  # (taken again by the property: ``mT``'s node is a TransposeBackward0)
        replay = lambda args, kwargs, get=operator.attrgetter(name): (get, args, kwargs)  # noqa: E731
        PROPERTY_TO_LTORCH[name] = tracked(PROPERTY_TO_LTORCH[name], replay=replay)
    # Of a real tensor, eager's ``real`` is the tensor itself and ``mH``/``H`` are ``mT``/``T``:
    # aliases, which writes go through.
    PROPERTY_TO_LTORCH["real"] = _of_real("real", lambda a: a, 0)
    PROPERTY_TO_LTORCH["imag"] = _eager_property("imag")
    PROPERTY_TO_LTORCH["mH"] = _of_real("mH", PROPERTY_TO_LTORCH["mT"], 2)
    PROPERTY_TO_LTORCH["H"] = _of_real("H", PROPERTY_TO_LTORCH["T"], 2, exact=True)
    # Dynamo's graphs read these properties as aten calls (``torch.ops.aten.numpy_T(t)`` for
    # ``t.T``): the same symbols, not an opaque eager call whose vjp's matmul layout is not eager's.
    for name, packet in _ATEN_PROPERTIES.items():
        TORCH_TO_LTORCH[packet] = TORCH_TO_LTORCH[packet.default] = PROPERTY_TO_LTORCH[name]
    rewrap(_shape.contiguous, _contiguous_or_copy(_shape.contiguous))
    rewrap(TORCH_TO_LTORCH[torch.ravel], _ravel(TORCH_TO_LTORCH[torch.ravel]))
    for name in _COPIES:
        rewrap(_symbol(name), _fresh(_symbol(name)))
    rewrap(diagonal, opaque(diagonal, diagonal_scatter, _diagonal_strides, eager=torch.diagonal))
    take = TORCH_TO_LTORCH.get(torch.Tensor.detach, stop_gradient)
    detach = _detach_with(take)
    for detach_fn in (torch.Tensor.detach, torch.detach):
        TORCH_TO_LTORCH[detach_fn] = detach
    PROPERTY_TO_LTORCH["data"] = detach
    for fn in _FALLBACK_VIEWS:
        if fn not in TORCH_TO_LTORCH:
            TORCH_TO_LTORCH[fn] = _refused_view(fn, lambda a, *args, fn=fn, **kwargs: fallback(fn, (a, *args), kwargs))


_register()
