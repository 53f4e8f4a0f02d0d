"""``torch.segment_reduce``: ``data`` reduced over consecutive segments of its ``axis``, the
segments given by their lengths or by their offsets (the last dim of either, its leading dims
data's before ``axis``). Each segment starts from ``initial`` (by default the reduction's
identity) and takes its elements in order, as eager's kernel does; an empty segment's mean is
NaN unless ``initial`` is given.

The decomposition gives each position of ``axis`` its segment's number (a running count of the
segment ends at or before it; positions outside every segment a spare one dropped after) and
scatters ``data`` into a buffer filled with the initial value: an add (sum, mean) or eager's
``scatter_reduce`` (prod, amax, amin, whose NaN rule is the segment kernel's), each taking
the elements of a lane in order. The segments' bounds are data, so the checks eager makes on
their values (lengths that are negative or, unless ``unsafe``, do not sum to the axis' size) are
made where they are computed, by a kernel the torch executor runs (``segment_bounds``); bounds
that reach outside ``data``, which eager's kernel reads past its end, are refused there too.
The gradient is eager's backward kernel (``_segment_reduce_backward``), whose ties share only
positive gradients.
"""

import math

import torch
from torch._subclasses.fake_tensor import FakeTensor

from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.errors import ThunderIndexError, ThunderNotImplementedError, ThunderRuntimeError, check
from thunder_rs.torch.common import OpaqueKernel, require_tensor
from thunder_rs.torch.symbols import ltorch, torchsymbol
from thunder_rs import clang

__all__ = ["segment_reduce"]

#: The reductions eager's ``get_reduction_enum`` names, as ``scatter_reduce`` names them.
_REDUCTIONS = {
    "sum": "sum",
    "mean": "sum",
    "prod": "prod",
    "max": "amax",
    "amax": "amax",
    "min": "amin",
    "amin": "amin",
}
_IDENTITIES = {"sum": 0, "prod": 1, "amax": -math.inf, "amin": math.inf}
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_initial(op: str, initial, dtype) -> None:
    """``Scalar::to<scalar_t>``'s overflow check of ``initial``."""
    if initial is None or not math.isfinite(float(initial)):
        return
    names = {torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16", torch.float32: "float"}
    check(
        dtype not in names or abs(float(initial)) <= torch.finfo(dtype).max,
        op,
        lambda: f"value cannot be converted to type {names[dtype]} without overflow (argument initial)",
        ThunderRuntimeError,
    )


def _check(op: str, data, reduce, lengths, indices, offsets, axis) -> int:
    """eager's checks (``segment_reduce_kernel``) in its order; the axis, wrapped."""
    require_tensor(op, data, "data")
    d = clang.canonicalize_dim(data.ndim, axis, op, "axis")
    check(
        reduce in _REDUCTIONS,
        op,
        lambda: f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce} (argument reduce)",
        ThunderRuntimeError,
    )
    check(
        indices is None,
        op,
        "segment_reduce(): indices based reduction is not supported yet. (argument indices)",
        ThunderRuntimeError,
    )
    check(
        lengths is not None or offsets is not None,
        op,
        "segment_reduce(): Either lengths or offsets must be defined.",
        ThunderRuntimeError,
    )
    name, bounds = ("offsets", offsets) if offsets is not None else ("lengths", lengths)
    require_tensor(op, bounds, name)
    check(
        data.dtype in _FLOATS,
        op,
        lambda: f'"_segment_reduce_cpu" not implemented for {data.dtype} (argument data)',
        ThunderNotImplementedError,
    )
    check(
        bounds.dtype in (torch.int32, torch.int64),
        op,
        lambda: f"segment_reduce(): {name} must be int32 or int64, got {bounds.dtype} (argument {name})",
        ThunderNotImplementedError,
    )
    check(data.device == bounds.device, op, f"data and {name} are on different devices", ThunderRuntimeError)
    check(data.ndim >= bounds.ndim, op, f"data has fewer dims than {name} (argument {name})", ThunderRuntimeError)
    check(
        d == bounds.ndim - 1,
        op,
        lambda: f"segment_reduce(): Expected axis to be the last dimension of {name} but got {d}. (argument axis)",
        ThunderRuntimeError,
    )
    # (eager reads the bounds of each leading position at its flat offset, past the end of
    # smaller ones: refused)
    check(
        tuple(bounds.shape[:-1]) == tuple(data.shape[:d]),
        op,
        lambda: (
            f"{name}'s leading sizes {list(bounds.shape[:-1])} are not data's {list(data.shape[:d])} (argument {name})"
        ),
        ThunderNotImplementedError,
    )
    return d


def _bounds_meta(bounds, is_offsets, unsafe, size, lanes):
    shape = (*bounds.shape[:-1], bounds.shape[-1] + (0 if is_offsets else 1))
    return [(shape, torch.int64, False, None)]


#: ``(lengths or offsets, is_offsets, unsafe, size of the axis, lanes)`` -> each segment's start
#: and then the last one's end along the last dim (int64), after eager's checks of their values.
segment_bounds = OpaqueKernel("segment_bounds", _bounds_meta)


def _aten_segment_bounds(bounds, is_offsets, unsafe, size, lanes):
    """The checks eager's ``segment_reduce_kernel`` makes (lengths, unless ``unsafe``) and its
    kernel makes of each segment it reduces (``lanes`` elements each); the bounds it would read
    outside ``data`` at are refused."""
    bounds = bounds.long()
    # (fake and meta tensors, which a program traced for its metadata runs on, hold no values)
    checked = not (bounds.is_meta or isinstance(bounds, FakeTensor))
    if not is_offsets:
        if not unsafe and checked:
            torch._check(bool(bounds.min().item() >= 0), lambda: "lengths contains negative value!")
            torch._check(
                bool(torch.all(bounds.sum(-1) == size).item()),
                lambda: (
                    "segment_reduce(): Expected all rows of lengths along axis to sum to "
                    "data.size(lengths.dim()-1) when !unsafe."
                ),
            )
        bounds = torch.cat([torch.zeros_like(bounds[..., :1]), bounds.cumsum(-1)], -1)
    if not checked:
        return bounds
    if lanes and bounds.shape[-1] > 1:
        torch._check(bool((bounds.diff(dim=-1) >= 0).all().item()), lambda: "Expected segment_length >= 0")
    if bounds.numel() and not bool(((bounds >= 0) & (bounds <= size)).all().item()):
        raise ThunderIndexError(
            f"ltorch.segment_reduce: segment bounds outside data's {size} positions along its axis, which eager "
            "reads past data's end (argument lengths or offsets)"
        )
    return bounds


@torchsymbol(torch.segment_reduce)
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    op = "ltorch.segment_reduce"
    d = _check(op, data, reduce, lengths, indices, offsets, axis)
    _check_initial(op, initial, data.dtype)
    is_offsets = offsets is not None
    given = offsets if is_offsets else lengths
    size = data.shape[d]
    outer, inner = math.prod(data.shape[:d]), math.prod(data.shape[d + 1 :])
    bounds = ltorch.reshape(segment_bounds(given, is_offsets, unsafe, size, outer * inner)[0], (outer, -1))
    count = bounds.shape[1] - 1
    # each position's segment: the segment ends at or before it (ends past the axis, none)
    ends = ltorch.clamp(ltorch.narrow(bounds, 1, 1, count), max=size)
    marks = ltorch.scatter_add(
        ltorch.zeros(outer, size + 1, dtype=torch.int64, device=data.device), 1, ends, ltorch.ones_like(ends)
    )
    segment = ltorch.narrow(ltorch.cumsum(marks, 1), 1, 0, size)
    position = ltorch.arange(size, device=data.device)
    inside = ltorch.logical_and(
        ltorch.ge(position, ltorch.narrow(bounds, 1, 0, 1)), ltorch.lt(position, ltorch.narrow(bounds, 1, count, 1))
    )
    segment = ltorch.where(inside, segment, count)  # (outside every segment: the spare one)
    index = ltorch.expand(ltorch.unsqueeze(segment, -1), (outer, size, inner))
    values = ltorch.reshape(data, (outer, size, inner))
    how = _REDUCTIONS[reduce]
    start = _IDENTITIES[how] if initial is None else initial
    buffer = ltorch.full((outer, count + 1, inner), start, dtype=data.dtype, device=data.device)
    if how == "sum":
        out = ltorch.scatter_add(buffer, 1, index, values)
    else:
        out = ltorch.scatter_reduce(buffer, 1, index, values, how, include_self=True)
    out = ltorch.narrow(out, 1, 0, count)
    if values.numel() == 0:  # (nothing scattered: the output still follows data, as eager's does)
        nothing = ltorch.zeros((), dtype=torch.bool, device=data.device)
        out = ltorch.where(nothing, ltorch.sum(values, 1, keepdim=True), out)
    if reduce == "mean":
        length = ltorch.unsqueeze(
            ltorch.sub(ltorch.narrow(bounds, 1, 1, count), ltorch.narrow(bounds, 1, 0, count)), -1
        )
        out = ltorch.where(ltorch.gt(length, 0), ltorch.true_divide(out, ltorch.to(length, data.dtype)), out)
        if initial is None:
            out = ltorch.where(ltorch.eq(length, 0), math.nan, out)
    return ltorch.reshape(out, (*data.shape[:d], count, *data.shape[d + 1 :]))


def _backward_meta(grad, output, data, reduce, lengths, offsets, axis, initial):
    return [(tuple(data.shape), data.dtype, False, None)]


#: ``(grad, output, data, reduce, lengths, offsets, axis, initial)`` -> data's gradient: eager's
#: ``_segment_reduce_backward``.
segment_reduce_backward = OpaqueKernel("segment_reduce_backward", _backward_meta)


def _aten_segment_reduce_backward(grad, output, data, reduce, lengths, offsets, axis, initial):
    return torch.ops.aten._segment_reduce_backward(
        grad, output, data, reduce, lengths=lengths, offsets=offsets, axis=axis, initial=initial
    )


@register_grad(ltorch.segment_reduce)
def segment_reduce_grad(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    out = ltorch.segment_reduce(
        data, reduce, lengths=lengths, indices=indices, offsets=offsets, axis=axis, unsafe=unsafe, initial=initial
    )
    if data.requires_grad:
        d = clang.canonicalize_dim(data.ndim, axis, "ltorch.segment_reduce", "axis")
        put_grad(data, segment_reduce_backward(get_grad(out), out, data, reduce, lengths, offsets, d, initial)[0])
    return out


def _eager_segment_reduce(
    data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None
):
    """eager's op, where it reads only inside ``data``: offsets, and lengths taken as they are
    (``unsafe``), are checked first (eager's kernel would read past data's end)."""
    if (offsets is not None or unsafe) and indices is None and data.ndim:
        d = axis % data.ndim
        given = lengths if offsets is None else offsets
        if given is not None and given.ndim == d + 1 and not given.dtype.is_floating_point:
            lanes = math.prod(n for k, n in enumerate(data.shape) if k != d)
            _aten_segment_bounds(given, offsets is not None, unsafe, data.shape[d], lanes)
    return torch.segment_reduce(
        data, reduce, lengths=lengths, indices=indices, offsets=offsets, axis=axis, unsafe=unsafe, initial=initial
    )


#: The aten calls the torch executor runs for the symbol and its kernels.
TORCH_IMPLS = {
    segment_reduce: _eager_segment_reduce,
    segment_bounds: _aten_segment_bounds,
    segment_reduce_backward: _aten_segment_reduce_backward,
}
