"""Indexing ops: ``Tensor.__getitem__``, select, index_select, topk, sort (gather, scatter_add,
index_add: ``gathers``).

``a[key]`` runs in two steps, as torch runs it. Basic indexing (ints, slices, None, Ellipsis) is one
slice and one reshape. Advanced indexing by integer tensors then flattens the indexed dims into
one, combines the indices into a linear index and takes along that dim; the broadcast index shape
goes where the indexed dims were when they are adjacent, and in front otherwise. Index lists and
non-traced tensors are values known while tracing: they are bounds-checked then and become
constants. A traced boolean mask selects as many elements as it has true ones, which only its
values tell: where the jit reads values (``core.values``) it is its ``nonzero`` indices, as in
eager (``key_read_by_values``); elsewhere it is refused. In half precision the gradient of a
lookup by index tensors is eager's ``index_put`` with accumulation (``getitem_grad``).
"""

import math
import operator

import torch

from thunder_rs import clang, prims
from thunder_rs.core.base import dtypes
from thunder_rs.core.lang import values
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH, refuse_data_dependent
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.symint import SymInt, identical
from thunder_rs.errors import (
    ThunderIndexError,
    ThunderNotImplementedError,
    ThunderRuntimeError,
    ThunderTypeError,
    ThunderValueError,
    check,
)
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.torch.common import LOW_PRECISION, is_int, slice_indices
from thunder_rs.torch.symbols import ltorch, torchsymbol
from thunder_rs.torch.shape import reshape_to, slice_in_dim

Tensor = torch.Tensor
__all__ = [
    "getitem",
    "select",
    "slice_tensor",
    "slice_backward",
    "put_slice_gradient",
    "unbind",
    "index_select",
    "topk",
    "sort",
    "argsort",
]

_INDEX_DTYPES = (torch.int64, torch.int32)
_MASK_DTYPES = (torch.bool, torch.uint8)


# -- __getitem__ ----------------------------------------------------------------------------------


def key_read_by_values(key, a=None):
    """``key`` with what eager reads from its tensors' values read (``core.values``): traced slice
    bounds as ints (``x[t0:t1]``, eager's ``__index__``), and each traced boolean mask of one or
    more dims replaced by its ``nonzero`` indices (one index tensor per dim), as eager indexes by
    a mask; ``key`` itself when it has neither, or when values cannot be read. Called before the
    indexing op is recorded, so the reads sit at the top level of the trace. With ``a``, the indexed
    tensor, each mask's shape must be that of the dims it indexes (eager's ``IndexError``: the
    indices alone would take what the mask's extra elements select)."""
    entries = key if _treat_as_tuple(key) else (key,)
    if values.active() is None:
        return key
    if any(map(traced_bounds, entries)):  # ``x[t0:t1]``: eager reads the bounds (``__index__``)
        entries = tuple(slice(*map(_read_bound, (k.start, k.stop, k.step))) if traced_bounds(k) else k for k in entries)
        key = entries if _treat_as_tuple(key) else entries[0]
    if not any(map(_is_mask, entries)):
        return key
    if a is not None:
        check_mask_shapes(entries, a)
    expanded: list = []
    for k in entries:
        if not _is_mask(k):
            expanded.append(k)
            continue
        expanded.extend(torch.nonzero(k, as_tuple=True))  # (non-negative: ``fallback`` marks them)
    return tuple(expanded)


def traced_bounds(k) -> bool:
    """Whether ``k`` is a slice with a traced tensor among its bounds."""
    return type(k) is slice and any(isinstance(b, TensorProxy) for b in (k.start, k.stop, k.step))


def is_basic(entry) -> bool:
    """Whether key entry ``entry`` is basic indexing (an int, a size, a slice, None, Ellipsis): a
    view by shape prims, where tensors and lists gather."""
    return (
        entry is None
        or entry is Ellipsis
        or isinstance(entry, slice)
        or (isinstance(entry, int) and not isinstance(entry, bool))
        or type(entry) is SymInt  # (an index from a size: a view, as an int is)
    )


def _read_bound(b):
    """A slice bound as eager takes it: a tensor's value by ``__index__`` (read from the call's
    values, with a check), an integer tensor of one element's only. Read as ``item()``: this
    indexing is its only user, so a bound that changes between calls is a symbolic size of the
    next compile (``value_sizes``), where ``__index__`` must return a plain int."""
    if not isinstance(b, TensorProxy):
        return b
    if dtypes.is_int(b.dtype) and b.numel() == 1:
        return b.item()
    return operator.index(b)  # (eager's error, or a bool's value)


def _is_mask(k) -> bool:
    return isinstance(k, TensorProxy) and k.dtype in _MASK_DTYPES and k.ndim > 0


def _takes_no_dim(k) -> bool:
    """None, True/False and 0-dim bool tensors index no dim of the tensor."""
    return k is None or type(k) is bool or (isinstance(k, torch.Tensor) and k.dtype is torch.bool and k.ndim == 0)


def check_mask_shapes(entries, a) -> None:
    """Raises eager's ``IndexError`` where a mask's shape differs from the dims of ``a`` it
    indexes (counted, as eager counts them, in ``a`` with a dim of 1 for each None)."""
    consumed = sum(k.ndim if _is_mask(k) else 0 if (k is Ellipsis or _takes_no_dim(k)) else 1 for k in entries)
    view, d, masks = [], 0, []
    for k in entries:
        if k is None:
            view.append(1)
        elif k is Ellipsis or not _takes_no_dim(k):
            n = max(a.ndim - consumed, 0) if k is Ellipsis else k.ndim if _is_mask(k) else 1
            if _is_mask(k):
                masks.append((k, d, len(view)))
            view.extend(a.shape[d : d + n])
            d += n
    view.extend(a.shape[d:])
    for mask, start, at in masks:
        for j, size in enumerate(mask.shape):
            if start + j < a.ndim and size != a.shape[start + j]:
                raise ThunderIndexError(
                    f"The shape of the mask {list(map(int, mask.shape))} at index {j} does not match the shape of the "
                    f"indexed tensor {list(map(int, view))} at index {at + j}"
                )


class _Const:
    """An index whose values are known while tracing: a list, or a tensor that is not traced.

    ``mask_size`` is the size of the boolean mask's dim it came from, which must match the indexed dim.
    """

    def __init__(self, values, shape, mask_size=None):
        self.values, self.shape, self.mask_size = values, shape, mask_size


def _treat_as_tuple(key) -> bool:
    """torch's (and numpy's legacy) rule: a list holding slices, None, ..., tensors or sequences is a tuple."""
    if isinstance(key, tuple):
        return True
    if not isinstance(key, list) or len(key) >= 32:
        return False
    return any(k is None or k is Ellipsis or isinstance(k, (slice, torch.Tensor, list, tuple)) for k in key)


def _nested(op: str, values) -> tuple[tuple[int, ...], list]:
    """(shape, flat values) of a nested list; plain Python, since torch calls here would be traced."""
    if not isinstance(values, (list, tuple)):
        return (), [values]
    parts = [_nested(op, v) for v in values]
    shapes = {shape for shape, _ in parts}
    check(len(shapes) <= 1, op, f"index lists must be rectangular, got {values!r} (argument key)", ThunderIndexError)
    return (len(values), *(shapes.pop() if shapes else ())), [x for _, flat in parts for x in flat]


def _const_of(op: str, values, mask: bool = False):
    """A constant index from nested int lists. A bool list (or ``mask``) is a mask known now: one
    constant index per mask dim, holding the coordinates of its true elements."""
    shape, flat = _nested(op, values)
    if mask or (flat and all(isinstance(v, bool) for v in flat)):
        check(len(shape) > 0, op, "0-dim boolean masks are not supported (argument key)", ThunderNotImplementedError)
        coords = []
        for i in (i for i, v in enumerate(flat) if v):
            coord = []
            for size in reversed(shape):
                i, c = divmod(i, size)
                coord.append(c)
            coords.append(coord[::-1])
        return [_Const([c[j] for c in coords], (len(coords),), size) for j, size in enumerate(shape)]
    check(
        all(isinstance(v, int) for v in flat),
        op,
        "tensors used as indices must be long, int, byte or bool tensors (argument key)",
        ThunderIndexError,
    )
    return _Const([int(v) for v in flat], shape)


def _entry(op: str, k):
    """One key entry as an int, slice, None, Ellipsis, an index proxy or a ``_Const``."""
    if k is None or k is Ellipsis or isinstance(k, slice):
        return k
    if k is True:
        return None
    if isinstance(k, bool):
        raise ThunderNotImplementedError(
            f"{op}: indexing with False gives an empty tensor; it is not supported (argument key)"
        )
    if is_int(k):
        return k
    if isinstance(k, TensorProxy):
        if k.dtype in _MASK_DTYPES:
            raise ThunderNotImplementedError(
                f"{op}: indexing with a boolean mask is data-dependent (its result's shape depends on the mask's "
                "values); use torch.where or masked_fill instead (argument key)"
            )
        check(
            k.dtype in _INDEX_DTYPES,
            op,
            "tensors used as indices must be long, int, byte or bool tensors (argument key)",
            ThunderIndexError,
        )
        return k
    if isinstance(k, torch.Tensor):
        return _const_of(op, k.tolist(), mask=k.dtype in _MASK_DTYPES)
    if isinstance(k, (list, tuple)):
        return _const_of(op, list(k))
    raise ThunderIndexError(
        f"{op}: only integers, slices (`:`), ellipsis (`...`), None and long or byte Variables are valid indices "
        f"(got {type(k).__name__}) (argument key)"
    )


#: A full slice standing for a dim an Ellipsis covers (told apart by identity).
_ELLIPSIS_DIM = slice(None)


def _entries(op: str, a, key) -> list:
    """The key as entries, its Ellipses expanded to full slices."""
    entries = []
    for k in key if _treat_as_tuple(key) else (key,):
        e = _entry(op, k)
        entries.extend(e if isinstance(e, list) else [e])
    used = sum(1 for e in entries if e is not None and e is not Ellipsis)
    if a.ndim == 0 and used:
        first = next(e for e in entries if e is not None and e is not Ellipsis)
        check(
            not is_int(first),
            op,
            lambda: (
                "invalid index of a 0-dim tensor. Use `tensor.item()` in Python or `tensor.item<T>()` in C++ to "
                "convert a 0-dim tensor to a number (argument key)"
            ),
            ThunderIndexError,
        )
        check(
            not isinstance(first, slice),
            op,
            "slice() cannot be applied to a 0-dim tensor. (argument key)",
            ThunderIndexError,
        )
    check(used <= a.ndim, op, f"too many indices for tensor of dimension {a.ndim} (argument key)", ThunderIndexError)
    # Like torch, every Ellipsis skips the dims no other entry uses, so a second one runs past the end.
    expanded = []
    for e in entries if Ellipsis in entries else [*entries, Ellipsis]:
        expanded.extend([_ELLIPSIS_DIM] * (a.ndim - used) if e is Ellipsis else [e])
    return expanded


def _bound(op: str, part):
    """A slice bound as an int; a tensor that is not traced (a captured constant) gives its value."""
    if isinstance(part, torch.Tensor) and not isinstance(part, TensorProxy) and part.ndim == 0:
        return int(part)
    check(
        part is None or is_int(part),
        op,
        lambda: f"slice bounds must be ints or None while tracing, got {part!r} (argument key)",
        ThunderNotImplementedError,
    )
    return part


def _slice_bounds(op: str, s: slice, size: int) -> tuple[int, int, int]:
    s = slice(*(_bound(op, part) for part in (s.start, s.stop, s.step)))
    check(s.step != 0, op, "slice step cannot be zero (argument key)", ThunderValueError)
    check(s.step is None or s.step > 0, op, "step must be greater than zero (argument key)", ThunderValueError)
    start, stop, step = slice_indices(s, size)
    step = int(step)  # (a slice prim's step is a number: one from a symbolic size is specialised)
    # ``stop`` is at least 0, so from 0 no decision (which a count of 0 would guard); else one
    # that an empty slice (``stop == start``) takes the same way as a longer one.
    if type(start) is int and start == 0:
        return start, stop, step
    return start, stop if stop >= start else start, step


def _basic_index(op: str, a, entries):
    """Applies ints, slices and None; returns the result and its (dim, index) advanced entries."""
    starts, stops, steps, shape, advanced = _basic_bounds(op, a, entries)
    # (Compared as data: a symbolic stop that may equal its dim's size slices, with no guard.)
    if not all(map(identical, (*starts, *stops, *steps), (*[0] * a.ndim, *a.shape, *[1] * a.ndim))):
        a = prims.slice(a, starts, stops, steps)
    return reshape_to(a, shape), advanced


def _basic_bounds(op: str, a, entries):
    """The slice of ``a`` that the ints and slices of ``entries`` take (start, stop and step per
    dim), the shape of the result and its (result dim, dim, index) advanced entries."""
    starts, stops, steps, shape, advanced = [], [], [], [], []
    dim = 0
    for e in entries:
        if e is None:
            shape.append(1)
            continue
        if dim >= a.ndim:
            check(
                e is _ELLIPSIS_DIM,
                op,
                lambda: (
                    f"Dimension out of range (expected to be in range of [{-a.ndim}, {a.ndim - 1}], but got {dim}) "
                    "(argument key)"
                ),
                ThunderIndexError,
            )
            dim += 1
            continue
        size = a.shape[dim]
        if is_int(e):
            check(
                -size <= e < size,
                op,
                f"index {e} is out of bounds for dimension {dim} with size {size} (argument key)",
                ThunderIndexError,
            )
            start = e if e >= 0 else e + size  # e % size, which a symbolic size keeps symbolic
            stop, step = start + 1, 1
        elif isinstance(e, slice):
            start, stop, step = _slice_bounds(op, e, size)
            shape.append((stop - start + step - 1) // step)
        else:
            start, stop, step = 0, size, 1
            advanced.append((len(shape), dim, e))
            shape.append(size)
        starts.append(start)
        stops.append(stop)
        steps.append(step)
        dim += 1
    return starts, stops, steps, shape, advanced


def _index_tensor(op: str, index, dim: int, size: int, device):
    """``index`` as an int64 proxy with non-negative values."""
    if isinstance(index, _Const):
        check(
            index.mask_size in (None, size),
            op,
            lambda: (
                f"The shape of the mask [{index.mask_size}] at index {dim} does not match the shape of the indexed "
                f"tensor at index {dim} (size {size}) (argument key)"
            ),
            ThunderIndexError,
        )
        for v in index.values:
            check(
                -size <= v < size,
                op,
                f"index {v} is out of bounds for dimension {dim} with size {size} (argument key)",
                ThunderIndexError,
            )
        if type(size) is not SymInt or all(v >= 0 for v in index.values):
            return _constant([v % size if type(size) is not SymInt else v for v in index.values], index.shape, device)
        # A negative index counts from a symbolic end: added to the size each call.
        raw = _constant(list(index.values), index.shape, device)
        return prims.where(prims.lt(raw, 0), prims.add(raw, size), raw)
    index = clang.maybe_convert(index, torch.int64)
    if getattr(index, "_nonnegative", False):  # ``nonzero``'s indices (``fallback`` marks them)
        return index
    return prims.where(prims.lt(index, 0), prims.add(index, size), index)


def _constant(values, shape, device):
    """An int64 tensor of known ``values``: an iota when they step evenly, else one full per value."""
    steps = {b - a for a, b in zip(values, values[1:])}
    if not values:
        flat = prims.full((0,), 0, device, torch.int64)
    elif len(values) == 1 or (len(steps) == 1 and 0 not in steps):
        flat = prims.iota(len(values), values[0], steps.pop() if steps else 1, device, torch.int64)
    else:
        flat = prims.cat([prims.full((1,), v, device, torch.int64) for v in values], 0)
    return reshape_to(flat, shape)


def _advanced_index(op: str, a, advanced):
    """Takes along the dims of ``a`` that integer tensors index (``advanced``: (dim in a, dim in source, index))."""
    dims = [d for d, _, _ in advanced]
    indices = [_index_tensor(op, idx, src, a.shape[d], a.device) for d, src, idx in advanced]
    try:
        shape = clang.broadcast_shapes(op, *(i.shape for i in indices))
    except ThunderRuntimeError:
        shapes = ", ".join(str(list(i.shape)) for i in indices)
        raise ThunderIndexError(
            f"{op}: shape mismatch: indexing tensors could not be broadcast together with shapes {shapes} "
            "(argument key)"
        ) from None
    if dims != list(range(dims[0], dims[0] + len(dims))):
        return _take_apart(op, a, dims, indices, shape)
    linear = indices[-1]
    stride = a.shape[dims[-1]]
    for d, index in zip(reversed(dims[:-1]), reversed(indices[:-1])):
        linear = clang.elementwise(prims.add, op, clang.elementwise(prims.mul, op, index, stride), linear)
        stride *= a.shape[d]
    linear = reshape_to(clang.expand_to(linear, shape), (math.prod(shape),))
    at = dims[0]
    before, after = tuple(a.shape[:at]), tuple(a.shape[dims[-1] + 1 :])
    flat = reshape_to(a, (*before, stride, *after))
    return reshape_to(prims.take(flat, linear, at), (*before, *shape, *after))


def _take_apart(op: str, a, dims: list, indices: list, shape: tuple):
    """Indexed dims apart (``a[i, :, j]``): the index shape goes in front of the other dims. Each
    element is taken from ``a`` flattened whole by its linear index, so that the gradient is
    eager's ``index_put`` into new zeros of ``a``'s shape, contiguous (taking along the indexed
    dims transposed to the front gave it their transposed layout)."""
    rest = [d for d in range(a.ndim) if d not in dims]
    out_shape = (*shape, *(a.shape[d] for d in rest))
    strides, stride = [0] * a.ndim, 1
    for d in reversed(range(a.ndim)):
        strides[d], stride = stride, stride * a.shape[d]

    def scaled(t, d):
        return t if identical(strides[d], 1) else clang.elementwise(prims.mul, op, t, strides[d])

    linear = None
    for d, index in zip(dims, indices):
        linear = scaled(index, d) if linear is None else clang.elementwise(prims.add, op, linear, scaled(index, d))
    linear = prims.broadcast_in_dim(clang.expand_to(linear, shape), out_shape, tuple(range(len(shape))))
    for i, d in enumerate(rest):
        # (an iota's step is a number: a symbolic stride multiplies it, as the indices')
        offsets = scaled(prims.iota(a.shape[d], 0, 1, a.device, torch.int64), d)
        linear = prims.add(linear, prims.broadcast_in_dim(offsets, out_shape, (len(shape) + i,)))
    flat = reshape_to(a, (stride,))
    return reshape_to(prims.take(flat, reshape_to(linear, (math.prod(out_shape),)), 0), out_shape)


@torchsymbol(Tensor.__getitem__, name="getitem")
def getitem(a, key):
    op = "ltorch.getitem"
    out, advanced = _basic_index(op, a, _entries(op, a, key))
    return _advanced_index(op, out, advanced) if advanced else out


def _plain_advanced(a, key) -> list | None:
    """The advanced entries of ``key`` as (dim, index) when every other entry takes a whole dim
    (``:``, ``...``) and the indexed dims are adjacent: the result is then ``a`` indexed in
    place. None otherwise (the take's gradient, as before)."""
    parts = key if isinstance(key, tuple) else (key,)
    if not any(isinstance(k, torch.Tensor) for k in parts):
        return None
    if not all(isinstance(k, torch.Tensor) or k is Ellipsis or k == slice(None) for k in parts):
        return None
    if any(isinstance(k, torch.Tensor) and k.dtype not in (torch.int64, torch.int32) for k in parts):
        return None
    base, advanced = _basic_index("ltorch.getitem", a, _entries("ltorch.getitem", a, key))
    dims = [d for _, d, _ in advanced]
    if base is not a or dims != list(range(dims[0], dims[0] + len(dims))):
        return None
    return [(d, index) for _, d, index in advanced]


@torchsymbol(torch.ops.aten.slice_backward.default, name="slice_backward")
def slice_backward(grad_output, input_sizes, dim, start, end, step):
    """A slice's gradient (eager's ``SliceBackward0``): a new row-major tensor of ``input_sizes``,
    ``grad_output`` at ``start:end:step`` of ``dim`` (in-range bounds) and zeros elsewhere."""
    n = grad_output.shape[dim]
    config = [(0, 0, 0)] * len(input_sizes)
    covered = (n - 1) * step + 1 if n else 0
    config[dim] = (start, input_sizes[dim] - start - covered, step - 1 if n else 0)
    return prims.pad(grad_output, clang.maybe_convert(0, grad_output.dtype), tuple(config))


def put_slice_gradient(a, out, d: int, start, stop, step: int = 1):
    """Puts eager's gradient of ``out``, ``a``'s slice ``start:stop:step`` of ``d`` (``SliceBackward0``;
    ``SelectBackward0`` of an int's slice of one): a new row-major tensor, also where the slice is
    all of ``a`` (``narrow(d, 0, size)``, whose cotangent kept its layout through ``a`` itself).
    Returns the rule's output: ``out``, or an alias of ``a`` where ``out`` is ``a`` (as ``views``
    makes one; a rule's output is a new value). The decomposition's VJP stays where the sizes or
    bounds are symbolic."""
    if not a.requires_grad or a.dtype.is_complex or not all(type(n) is int for n in (*a.shape, start, stop)):
        return out
    if out is a:
        out = prims.reshape(a, tuple(a.shape))
    shape = list(a.shape)
    shape[d] = (max(stop, start) - start + step - 1) // step
    put_grad(a, slice_backward(reshape_to(get_grad(out), tuple(shape)), tuple(a.shape), d, start, stop, step))
    return out


def _slices(a, key) -> list | None:
    """The dims that basic indexing ``a[key]`` slices, as (dim, start, stop, step), an int as a
    slice of one; None where the key has other entries than ints, slices, None and Ellipsis, the
    sizes or bounds are symbolic, or nothing is sliced."""
    op = "ltorch.getitem"
    parts = key if _treat_as_tuple(key) else (key,)
    if not all(k is None or k is Ellipsis or isinstance(k, slice) or type(k) is int for k in parts):
        return None
    starts, stops, steps, _, _ = _basic_bounds(op, a, _entries(op, a, key))
    if not all(type(n) is int for n in (*a.shape, *starts, *stops)):
        return None
    bounds = enumerate(zip(starts, stops, steps))
    return [(d, lo, hi, st) for d, (lo, hi, st) in bounds if (lo, hi, st) != (0, a.shape[d], 1)] or None


def _slices_gradient(a, slices: list, g):
    """Eager's gradient of ``a``'s ints and slices: ``SliceBackward0`` (``SelectBackward0`` for an
    int) of each dim sliced, the last one first, each a new row-major tensor. The slice prim's
    VJP pads the cotangent, which keeps a channels_last cotangent's layout (ReXNet's
    ``x[:, :c] + shortcut``: batch norm's backward then read it on its channels_last kernel)."""
    shape = list(a.shape)
    for d, lo, hi, st in slices:
        shape[d] = (hi - lo + st - 1) // st
    g = reshape_to(g, tuple(shape))
    for d, lo, hi, st in reversed(slices):
        shape[d] = a.shape[d]
        g = slice_backward(g, tuple(shape), d, lo, hi, st)
    return g


@register_grad(getitem)
def getitem_grad(a, key):
    """Eager's gradients of indexing: of ints and slices (``_slices_gradient``) and, in half
    precision, of advanced indexing (``_index_put_gradient``); the decomposition's VJP for the rest."""
    out = ltorch.getitem(a, key)
    if not a.requires_grad or a.dtype.is_complex:  # (complex: the decomposition's VJP)
        return out
    advanced = _plain_advanced(a, key) if a.dtype in LOW_PRECISION else None
    if advanced is not None:
        put_grad(a, _index_put_gradient(a, advanced, get_grad(out)))
    elif (slices := _slices(a, key)) is not None:
        put_grad(a, _slices_gradient(a, slices, get_grad(out)))
    return out


def _index_put_gradient(a, advanced: list, g):
    """Eager's gradient of advanced indexing in half precision: ``index_put_(zeros, indices, g,
    accumulate=True)``, whose CPU kernel adds the values that meet at one element one after
    another in the tensor's dtype, rounding each sum; the take prim's VJP, ``index_add``, sums in
    float32 and rounds once (equal in float32 and float64, where both add in one order in one
    dtype; LeViT's and Swin2SR's attention biases in bfloat16 were not). The dims before the
    indexed ones are indexed by an arange, so that the kernel visits the cotangent in eager's order."""
    indices = [_index_tensor("ltorch.getitem", index, d, a.shape[d], a.device) for d, index in advanced]
    before = advanced[0][0]
    index_rank = max(index.ndim for index in indices)
    # the dims before the indexed ones, each by an arange along its own dim of the broadcast index
    leading = [
        ltorch.reshape(
            ltorch.arange(a.shape[d], device=a.device),
            (*(1 for _ in range(d)), a.shape[d], *(1 for _ in range(before - d - 1 + index_rank))),
        )
        for d in range(before)
    ]
    zeros = ltorch.zeros(tuple(a.shape), dtype=a.dtype, device=a.device)
    return ltorch.index_put(zeros, (*leading, *indices), g, accumulate=True)


def _masked_select(input, mask, *, out=None):
    """``torch.masked_select``: the elements of ``input`` (broadcast with ``mask``) where ``mask``
    holds, in order: ``input[mask]``, differentiable and sized by the mask's values, which the jit
    reads (``core.values``: a symbolic count once it changes). Called before any symbol opens,
    since what the mask's ``nonzero`` records is read at the top level of the trace."""
    op = "ltorch.masked_select"
    check(out is None, op, "out= is not supported (argument out)", ThunderNotImplementedError)
    check(
        isinstance(mask, torch.Tensor) and mask.dtype is torch.bool,
        op,
        "masked_select: expected BoolTensor for mask",
        ThunderRuntimeError,
    )
    check(isinstance(input, torch.Tensor), op, "expected a tensor (argument input)", ThunderTypeError)
    if values.active() is None:
        refuse_data_dependent(torch.nonzero)
    shape = clang.broadcast_shapes(op, input.shape, mask.shape) or (1,)
    return input.expand(shape)[mask.expand(shape)]


TORCH_TO_LTORCH[torch.masked_select] = _masked_select
TORCH_TO_LTORCH[Tensor.masked_select] = _masked_select


# -- select and index_select ----------------------------------------------------------------------


@torchsymbol(torch.select, Tensor.select)
def select(a, dim, index):
    op = "ltorch.select"
    check(a.ndim > 0, op, "select() cannot be applied to a 0-dim tensor. (argument a)", ThunderIndexError)
    d = clang.canonicalize_dim(a.ndim, dim, op)
    size = a.shape[d]
    check(
        -size <= index < size,
        op,
        lambda: (
            f"select(): index {index} out of range for tensor of size {list(a.shape)} at dimension {d} (argument index)"
        ),
        ThunderIndexError,
    )
    start = index if index >= 0 else index + size  # index % size, which a symbolic size keeps symbolic
    return prims.squeeze(slice_in_dim(a, d, start, start + 1), (d,))


@torchsymbol(torch.ops.aten.slice.Tensor, torch.ops.aten.slice, name="slice")
def slice_tensor(a, dim=0, start=None, end=None, step=1):
    """``aten.slice``: ``a[..., start:end:step]`` along ``dim``, bounds clamped as Python's (what
    torch's generic ``associative_scan`` slices its operands with)."""
    op = "ltorch.slice"
    check(a.ndim > 0, op, "slice() cannot be applied to a 0-dim tensor. (argument a)", ThunderIndexError)
    d = clang.canonicalize_dim(a.ndim, dim, op)
    check(step > 0, op, "slice step must be positive (argument step)", ThunderRuntimeError)
    begin, stop, _ = slice_indices(slice(start, end, step), a.shape[d])  # (a symbolic size's bounds decided)
    return slice_in_dim(a, d, begin, max(begin, stop), step)


@register_grad(select)
def select_grad(a, dim, index):
    out = select(a, dim, index)
    d = clang.canonicalize_dim(a.ndim, dim, "ltorch.select")
    start = index + a.shape[d] if index < 0 else index
    return put_slice_gradient(a, out, d, start, start + 1)


@register_grad(slice_tensor)
def slice_grad(a, dim=0, start=None, end=None, step=1):
    out = slice_tensor(a, dim, start, end, step)
    d = clang.canonicalize_dim(a.ndim, dim, "ltorch.slice")
    begin, stop, _ = slice_indices(slice(start, end, step), a.shape[d])
    return put_slice_gradient(a, out, d, begin, stop, step)


@torchsymbol(torch.unbind, Tensor.unbind, sequence=True)
def unbind(a, dim=0):
    op = "ltorch.unbind"
    check(a.ndim > 0, op, "Dimension specified as 0 but tensor has no dimensions (argument a)", ThunderIndexError)
    d = clang.canonicalize_dim(a.ndim, dim, op)
    return tuple(prims.squeeze(slice_in_dim(a, d, i, i + 1), (d,)) for i in range(a.shape[d]))


@register_grad(unbind)
def unbind_grad(a, dim=0):
    """Eager's ``UnbindBackward0``: the pieces' cotangents stacked (row-major zeros for a piece
    that got none), one ``stack`` where the slices' VJPs padded each piece and summed them (which
    lost a channels_last cotangent's layout, kept by eager's stack)."""
    pieces = unbind(a, dim)
    if pieces and not a.dtype.is_complex:  # (none of a dim of size 0; complex: the slices' VJPs)
        put_grad(a, ltorch.stack([get_grad(p) for p in pieces], clang.canonicalize_dim(a.ndim, dim, "ltorch.unbind")))
    return pieces


def _check_index(op: str, index, like, dtypes=_INDEX_DTYPES, what="int32 or int64"):
    """A checked index tensor; one that is not traced (a captured tensor) becomes a constant."""
    check(
        isinstance(index, torch.Tensor),
        op,
        f"expected a tensor for index, got {type(index).__name__} (argument index)",
        ThunderTypeError,
    )
    check(
        index.dtype in dtypes,
        op,
        f"Expected dtype {what} for index, got {index.dtype} (argument index)",
        ThunderRuntimeError,
    )
    if isinstance(index, TensorProxy):
        return index
    return _constant(index.flatten().tolist(), tuple(index.shape), like.device)


@torchsymbol(torch.index_select, Tensor.index_select)
def index_select(a, dim, index, *, out=None):
    op = "ltorch.index_select"
    check(out is None, op, "out= is not supported (argument out)", ThunderNotImplementedError)
    d = clang.canonicalize_dim(a.ndim, dim, op)
    index = _check_index(op, index, a)
    check(index.ndim <= 1, op, "index_select(): Index is supposed to be a vector (argument index)", ThunderIndexError)
    return prims.take(a, index, d)


# -- topk and sort --------------------------------------------------------------------------------


@torchsymbol(torch.topk, Tensor.topk)
def topk(a, k, dim=None, largest=True, sorted=True, *, out=None):
    op = "ltorch.topk"
    check(out is None, op, "out= is not supported (argument out)", ThunderNotImplementedError)
    check(a.dtype != torch.bool, op, "topk does not support bool dtypes (argument a)", ThunderNotImplementedError)
    d = clang.canonicalize_dim(a.ndim, -1 if dim is None else dim, op)
    size = a.shape[d] if a.ndim else 1
    check(is_int(k) and 0 <= k <= size, op, "selected index k out of range (argument k)", ThunderRuntimeError)
    return torch.return_types.topk(prims.topk(a, k, d, bool(largest), bool(sorted)))


@torchsymbol(torch.sort, Tensor.sort)
def sort(a, dim=-1, descending=False, *, stable=False, out=None):
    op = "ltorch.sort"
    check(out is None, op, "out= is not supported (argument out)", ThunderNotImplementedError)
    d = clang.canonicalize_dim(a.ndim, dim, op)
    return torch.return_types.sort(prims.sort(a, d, bool(descending), bool(stable)))


@torchsymbol(torch.argsort, Tensor.argsort)
def argsort(a, dim=-1, descending=False, *, stable=False):
    d = clang.canonicalize_dim(a.ndim, dim, "ltorch.argsort")
    return prims.sort(a, d, bool(descending), bool(stable))[1]
