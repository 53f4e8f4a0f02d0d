"""The ops a write through a view records, as ltorch symbols: the scatters that invert slicing
and taking a diagonal (``slice_scatter``, ``select_scatter``, ``diagonal_scatter``, beside
``diagonal`` itself), and ``straight_through``/``stop_gradient`` for writes autograd does not
see. ``views.py`` tracks which proxies alias which and records these on a write.
"""

import torch

from thunder_rs import clang, prims
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.errors import ThunderIndexError, ThunderRuntimeError, check
from thunder_rs.torch.symbols import ltorch, torchsymbol
from thunder_rs.torch.common import slice_indices
from thunder_rs.torch.shape import every_step, reshape_to, slice_in_dim
from thunder_rs.core.base.layouts import is_dense, layout_of
from thunder_rs.core.lang.symint import SymInt, same_shape

__all__ = [
    "slice_scatter",
    "slice_overwrite",
    "slice_to_overwrite",
    "select_scatter",
    "diagonal",
    "diagonal_scatter",
    "straight_through",
    "stop_gradient",
    "written_through_view",
    "base_of_write",
]


# -- scatters: the inverses of slicing -------------------------------------------------------------


def _slice_config(shape, dim: int, start: int, stop: int, step: int, length: int):
    """Pad config placing ``length`` elements at start, start + step, ... of ``dim``."""
    config = [(0, 0, 0)] * len(shape)
    config[dim] = (start, shape[dim] - (start + (length - 1) * step + 1), step - 1)
    return config


@torchsymbol(torch.slice_scatter, torch.Tensor.slice_scatter)
def slice_scatter(input, src, dim=0, start=None, end=None, step=1):
    """``input`` with ``input[..., start:end:step, ...]`` (along ``dim``) replaced by ``src``."""
    op = "ltorch.slice_scatter"
    check(input.ndim > 0, op, "slice() cannot be applied to a 0-dim tensor. (argument input)", ThunderRuntimeError)
    d = clang.canonicalize_dim(input.ndim, dim, op)
    check(step > 0, op, "slice step must be positive (argument step)", ThunderRuntimeError)
    begin, stop, _ = slice_indices(slice(start, end, step), input.shape[d])
    stop = stop if stop >= begin else begin  # (an empty slice decides as a longer one)
    length = (stop - begin + step - 1) // step
    expected = (*input.shape[:d], length, *input.shape[d + 1 :])
    check(
        same_shape(src.shape, expected),
        op,
        lambda: (
            f"expected src to have a size equal to the slice of self. src size = {list(src.shape)}, slice size = "
            f"{list(expected)} (argument src)"
        ),
        ThunderRuntimeError,
    )
    check(
        src.dtype == input.dtype,
        op,
        f"expected src dtype {input.dtype}, got {src.dtype} (argument src)",
        ThunderRuntimeError,
    )
    # Nothing written: a copy, as eager's. With a step of 1 the scatter below writes nothing as
    # well, so symbolic sizes (counts, which may be 0) are not compared.
    if any(type(n) is int and n == 0 for n in (length, *input.shape)) or (step != 1 and length == 0):
        return prims.convert_element_type(input, input.dtype)
    config = _slice_config(input.shape, d, begin, stop, step, length)
    placed = prims.pad(src, clang.maybe_convert(0, src.dtype), config)
    written = prims.pad(prims.full(tuple(src.shape), True, src.device, torch.bool), False, config)
    return prims.where(written, placed, input)


@torchsymbol(torch.select_scatter, torch.Tensor.select_scatter)
def select_scatter(input, src, dim, index):
    """``input`` with ``input.select(dim, index)`` replaced by ``src``."""
    op = "ltorch.select_scatter"
    check(
        input.ndim > 0,
        op,
        "select_scatter() cannot be applied to a 0-dim tensor. (argument input)",
        ThunderRuntimeError,
    )
    d = clang.canonicalize_dim(input.ndim, dim, op)
    size = input.shape[d]
    check(
        -size <= index < size,
        op,
        f"select(): index {index} out of range for tensor of size {list(input.shape)} "
        f"at dimension {d} (argument index)",
        ThunderIndexError,
    )
    expected = (*input.shape[:d], *input.shape[d + 1 :])
    check(
        same_shape(src.shape, expected),
        op,
        lambda: (
            f"expected src to have a size equal to the slice of self. src size = {list(src.shape)}, slice size = "
            f"{list(expected)} (argument src)"
        ),
        ThunderRuntimeError,
    )
    index %= size
    return slice_scatter(input, reshape_to(src, (*input.shape[:d], 1, *input.shape[d + 1 :])), d, index, index + 1)


def _diagonal_layout(shape, offset: int, dim1: int, dim2: int, op: str):
    """(permutation moving dim1, dim2 last, their sizes, the diagonal's length and first flat position)."""
    ndim = len(shape)
    d1 = clang.canonicalize_dim(ndim, dim1, op, "dim1")
    d2 = clang.canonicalize_dim(ndim, dim2, op, "dim2")
    check(d1 != d2, op, f"diagonal dimensions cannot be identical {dim1}, {dim2} (argument dim2)", ThunderRuntimeError)
    rows, cols = shape[d1], shape[d2]
    length = max(min(rows, cols - offset) if offset >= 0 else min(rows + offset, cols), 0)
    first = offset if offset >= 0 else -offset * cols
    perm = (*[d for d in range(ndim) if d not in (d1, d2)], d1, d2)
    return perm, rows, cols, length, first


@torchsymbol(torch.diagonal, torch.Tensor.diagonal)
def diagonal(input, offset=0, dim1=0, dim2=1):
    op = "ltorch.diagonal"
    perm, rows, cols, length, first = _diagonal_layout(tuple(input.shape), offset, dim1, dim2, op)
    moved = prims.transpose(input, perm) if perm != tuple(range(input.ndim)) else input
    batch = tuple(moved.shape[:-2])
    flat = reshape_to(moved, (*batch, rows * cols))
    if length == 0:  # an empty view of the input, as eager's (it requires grad as the input does)
        return slice_in_dim(flat, len(batch), 0, 0, 1)
    return every_step(flat, len(batch), first, length, cols + 1)


def linalg_diagonal(A, *, offset=0, dim1=-2, dim2=-1):
    """``torch.linalg.diagonal``: ``diagonal`` with the last two dims as the default, the same view
    (``TORCH_TO_LTORCH[torch.diagonal]``, which ``views`` makes one eager can write through)."""
    return TORCH_TO_LTORCH[torch.diagonal](A, offset, dim1, dim2)


TORCH_TO_LTORCH[torch.linalg.diagonal] = linalg_diagonal


@register_grad(diagonal)
def diagonal_grad(input, offset=0, dim1=0, dim2=1):
    """Eager's ``diagonal_backward``: the cotangent on the diagonal of new zeros, contiguous.
    Differentiating the view placed it in the dims moved last and moved them back, a transposed
    gradient where ``dim1`` comes after ``dim2``. ``diag_embed`` places it in the input's dims,
    square of the diagonal's length and offset, which padding (or cropping) brings to the input's
    sizes."""
    out = diagonal(input, offset, dim1, dim2)
    g = get_grad(out)
    embedded = ltorch.diag_embed(g, offset, dim1, dim2)
    ndim = input.ndim
    amounts = [0] * (2 * ndim)
    for d in {clang.canonicalize_dim(ndim, d, "ltorch.diagonal") for d in (dim1, dim2)}:
        amounts[2 * (ndim - 1 - d) + 1] = input.shape[d] - embedded.shape[d]
    put_grad(input, ltorch.pad(embedded, amounts), complex_values=True)  # (placed among zeros)
    return out


@torchsymbol(torch.diagonal_scatter, torch.Tensor.diagonal_scatter)
def diagonal_scatter(input, src, offset=0, dim1=0, dim2=1):
    """``input`` with ``input.diagonal(offset, dim1, dim2)`` replaced by ``src``."""
    op = "ltorch.diagonal_scatter"
    perm, rows, cols, length, first = _diagonal_layout(tuple(input.shape), offset, dim1, dim2, op)
    batch = tuple(input.shape[d] for d in perm[:-2])
    check(
        same_shape(src.shape, (*batch, length)),
        op,
        lambda: (
            f"expected src to have a size equal to the diagonal of self. src size = {list(src.shape)}, diagonal size = "
            f"{[*batch, length]} (argument src)"
        ),
        ThunderRuntimeError,
    )
    if length == 0:
        return prims.convert_element_type(input, input.dtype)  # a copy, as eager's
    src = clang.maybe_convert(src, input.dtype)
    if type(cols) is SymInt:  # (a pad's dilation, the scatter's step, is a number)
        return _on_diagonal(input, src, offset, *perm[-2:])
    moved = prims.transpose(input, perm) if perm != tuple(range(input.ndim)) else input
    flat = reshape_to(moved, (*batch, rows * cols))
    step = cols + 1
    out = slice_scatter(flat, src, len(batch), first, first + (length - 1) * step + 1, step)
    out = reshape_to(out, moved.shape)
    inverse = tuple(sorted(range(input.ndim), key=lambda i: perm[i]))
    return prims.transpose(out, inverse) if perm != tuple(range(input.ndim)) else out


def _on_diagonal(a, src, offset: int, d1: int, d2: int):
    """``a`` with ``src`` (..., length) on the ``offset`` diagonal of its dims ``d1`` and ``d2``,
    made in ``a``'s dim order (so its layout is ``a``'s): ``src`` padded to the size of the dim
    it is indexed by (``d1``, ``d2`` below the main diagonal), spread along the others, selected
    where the index along ``d2`` less that along ``d1`` is ``offset``."""
    shape = tuple(a.shape)
    dim = d1 if offset >= 0 else d2
    zero = clang.maybe_convert(0, a.dtype)
    batch = src.ndim - 1
    src = prims.pad(src, zero, (*((0, 0, 0),) * batch, (0, shape[dim] - src.shape[-1], 0)))
    others = [d for d in range(a.ndim) if d not in (d1, d2)]
    targets = (*others, dim)  # src's dims where they go, in increasing order after a transpose
    order = sorted(range(src.ndim), key=targets.__getitem__)
    ordered = src if order == list(range(src.ndim)) else prims.transpose(src, tuple(order))
    spread = prims.broadcast_in_dim(ordered, shape, tuple(sorted(targets)))
    row = prims.broadcast_in_dim(prims.iota(shape[d1], 0, 1, a.device, torch.int64), shape, (d1,))
    col = prims.broadcast_in_dim(prims.iota(shape[d2], -offset, 1, a.device, torch.int64), shape, (d2,))
    return prims.where(prims.eq(row, col), spread, a)


@register_grad(slice_scatter)
def slice_scatter_grad(input, src, dim=0, start=None, end=None, step=1):
    """Eager's: the cotangent with zeros in the slice (in its layout) and the slice of the
    cotangent, a view of it."""
    out = slice_scatter(input, src, dim, start, end, step)
    g = get_grad(out)
    if input.requires_grad:
        put_grad(input, slice_scatter(g, ltorch.zeros_like(src), dim, start, end, step), complex_values=True)
    if src.requires_grad:
        d = clang.canonicalize_dim(g.ndim, dim, "ltorch.slice_scatter")
        put_grad(src, g[(slice(None),) * d + (slice(start, end, step),)], complex_values=True)
    return out


def _overwritten(input, src, dim=0, start=None, end=None, step=1):
    return torch.slice_scatter(input, src, dim, start, end, step)


@torchsymbol(_overwritten, name="slice_overwrite")
def slice_overwrite(input, src, dim=0, start=None, end=None, step=1):
    """``slice_scatter`` that writes back an in-place op through a view whose new value the op
    computes from the old (``v.mul_(s)``): eager's CopySlices puts the op's gradient of the old
    slice in the base's gradient there, not added to zeros, so the rest of the gradient has -0.0
    there (adding it changes nothing, so a -0.0 gradient of the op stays -0.0)."""
    return slice_scatter(input, src, dim, start, end, step)


@register_grad(slice_overwrite)
def _slice_overwrite_grad(input, src, dim=0, start=None, end=None, step=1):
    out = slice_overwrite(input, src, dim, start, end, step)
    g = get_grad(out)
    if input.requires_grad:
        put_grad(input, slice_scatter(g, ltorch.full_like(src, -0.0), dim, start, end, step))
    if src.requires_grad:
        d = clang.canonicalize_dim(g.ndim, dim, "ltorch.slice_scatter")
        put_grad(src, g[(slice(None),) * d + (slice(start, end, step),)], complex_values=True)
    return out


def _sliced(a, start, stop, step):
    return a[tuple(slice(*bounds) for bounds in zip(start, stop, step))]


@torchsymbol(_sliced, name="slice_to_overwrite")
def slice_to_overwrite(a, start, stop, step):
    """``prims.slice`` of ``a`` that an in-place op reads and writes back (``slice_overwrite``):
    eager's CopySlices applies the op's backward to the slice of the base's gradient, so the
    gradient of this read is -0.0 outside the slice, where the write's gradient is all there is."""
    return prims.slice(a, start, stop, step)


@register_grad(slice_to_overwrite)
def _slice_to_overwrite_grad(a, start, stop, step):
    out = slice_to_overwrite(a, start, stop, step)
    g = get_grad(out)
    config = [(lo, n - (lo + (m - 1) * k + 1), k - 1) for lo, k, n, m in zip(start, step, a.shape, g.shape)]
    if any(type(m) is int and m == 0 for m in g.shape):
        put_grad(a, prims.full(tuple(a.shape), -0.0, a.device, a.dtype))
    else:
        put_grad(a, prims.pad(g, -0.0, config))
    return out


@register_grad(select_scatter)
def select_scatter_grad(input, src, dim, index):
    """Eager's: the cotangent with zeros at the index (in its layout) and the cotangent's
    selection there, a view of it."""
    out = select_scatter(input, src, dim, index)
    g = get_grad(out)
    if input.requires_grad:
        put_grad(input, select_scatter(g, ltorch.zeros_like(src), dim, index))
    if src.requires_grad:
        put_grad(src, ltorch.select(g, dim, index))
    return out


@register_grad(diagonal_scatter)
def diagonal_scatter_grad(input, src, offset=0, dim1=0, dim2=1):
    """Eager's: the cotangent with zeros on the diagonal (its layout) and the diagonal of the
    cotangent, a view of it."""
    out = diagonal_scatter(input, src, offset, dim1, dim2)
    g = get_grad(out)
    if input.requires_grad:
        put_grad(input, diagonal_scatter(g, ltorch.zeros_like(src), offset, dim1, dim2), complex_values=True)
    if src.requires_grad:
        put_grad(src, diagonal(g, offset, dim1, dim2), complex_values=True)
    return out


# -- writes autograd does not see ------------------------------------------------------------------


def _value_of(value, like):
    return value


def _detached(a):
    return a.detach()


@torchsymbol(_value_of, name="straight_through")
def straight_through(value, like):
    """``value``, whose gradient goes to ``like`` as it is: a tensor written in place where
    autograd does not see it (under ``torch.no_grad()``, through ``.data`` or ``.detach()``).
    ``value`` itself may not require grad (computed under ``no_grad``): the decomposition reads
    ``like`` too (an exact select of ``value``), so the result requires grad as ``like`` does."""
    keep = prims.broadcast_in_dim(prims.full((), True, value.device, torch.bool), tuple(value.shape), ())
    return prims.where(keep, value, like)


@torchsymbol(_detached, name="stop_gradient")
def stop_gradient(a):
    """``a``, through which no gradient flows."""
    return prims.convert_element_type(a, a.dtype)


def _written(a):
    return a


@torchsymbol(_written, name="written_through_view")
def written_through_view(a):
    """``a``, the value an in-place op writes into a view (``v /= s``, ``v`` a view): eager's
    autograd sends the base's gradient through CopySlices, which hands the op's backward a
    contiguous copy of the view's part (``grad_slice.clone(at::MemoryFormat::Contiguous)``),
    whatever the layout of the gradient reaching the base."""
    return prims.convert_element_type(a, a.dtype)


@torchsymbol(_written, name="base_of_write")
def base_of_write(a):
    """``a``, a contiguous tensor about to be written in place through a view of it: eager's
    CopySlices gives the base's history its gradient as a new tensor laid out as the base
    (``grad.new_empty_strided(base.sizes(), base.strides())``), whatever the layout of the
    gradient reaching the written tensor."""
    return prims.convert_element_type(a, a.dtype)


@register_grad(base_of_write)
def _base_of_write_grad(a):
    out = base_of_write(a)
    g, order = get_grad(out), memory_order(a)
    if order is None:
        put_grad(a, ltorch.clone(g, memory_format=torch.contiguous_format))
    else:  # a trace input dense in another order (a transposed one): its gradient laid out as it is
        inverse = tuple(order.index(d) for d in range(len(order)))
        laid = ltorch.clone(prims.transpose(g, order), memory_format=torch.contiguous_format)
        put_grad(a, prims.transpose(laid, inverse))
    return out


def memory_order(a) -> tuple | None:
    """The dims of ``a``, a tensor with strides of its own (ints) dense in another order, from the
    outermost in memory to the innermost; None where it has none, or they are not so."""
    strides = a._strides if a._view is None else None
    if strides is None or not all(type(n) is int for n in (*strides, *a.shape)):
        return None
    lay = layout_of(tuple(a.shape), tuple(strides))
    return lay[1] if is_dense(lay) else None


@register_grad(written_through_view)
def _written_through_view_grad(a):
    out = written_through_view(a)
    put_grad(a, ltorch.clone(get_grad(out), memory_format=torch.contiguous_format))
    return out


@register_grad(straight_through)
def _straight_through_grad(value, like):
    out = straight_through(value, like)
    g = get_grad(out)
    if like.requires_grad:
        put_grad(like, g)
    return out


@register_grad(stop_gradient)
def _stop_gradient_grad(a):
    out = stop_gradient(a)
    get_grad(out)
    return out
