"""Eager's strides for proxies, so that ``reshape``, ``view`` and ``contiguous()`` copy where
eager copies (``views.py``): trace inputs have the strides of their tensors, views follow their
root's, and tensors the program computes have those ``core.lang.eager_layouts`` gives them
(contiguous where no rule tells otherwise).
"""

import torch

from thunder_rs.core.base.layouts import is_contiguous  # noqa: F401 (the torch layer's name for it)
from thunder_rs.core.lang.symint import SymInt, hint, identical


def contiguous_strides(shape) -> tuple[int, ...]:
    """torch's: each stride the product of the later sizes, a size of 0 counting as 1 (the first
    size makes no stride: it is not looked at). A symbolic size traced at 2 or more multiplies as
    it is, as torch.compile's size-oblivious strides (``guard_size_oblivious``): a count, the
    tokens an expert got (``x[None, idx]`` of ``[1, count, d]``), may be 0 in a call the variant
    serves, where eager's strides count it as 1; they differ only for a tensor with no elements,
    whose strides no kernel reads and a layout decision cannot change the values of. The program's
    own reads of them (``stride()``, ``is_contiguous()``) decide the sizes nonzero
    (``views.nonempty``). Traced at 0 or 1, it is compared with 0 (a guard where it is a count)."""
    strides, step = [1] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        strides[d] = step
        if d and _multiplies(shape[d]):
            step *= shape[d]
    return tuple(strides)


def _multiplies(size) -> bool:
    """Whether ``size`` is a factor of the strides of the dims before it (``contiguous_strides``)."""
    if type(size) is int:
        return size > 1
    return hint(size) >= 2 or size != 0


def _is_zero(size) -> bool:
    """Whether ``size`` is 0; a symbolic size traced at 2 or more is not, as in ``_multiplies``
    (computeStride's views of a tensor with no elements: eager's, of the same values)."""
    if type(size) is int:
        return size == 0
    return hint(size) < 2 and size == 0


def nonempty(a) -> None:
    """Decides the symbolic sizes of ``a`` and of its root nonzero (a guard where one is a count):
    the strides the trace works out with them (``contiguous_strides``) are eager's there, as the
    program reads them (``stride()``, ``is_contiguous()``)."""
    root = a if a._view is None else a._view.root
    for size in (*root.shape, *a.shape):
        if type(size) is SymInt:
            bool(size != 0)


def overlaps(shape, strides) -> bool:
    """Whether two elements share memory: an expanded dim (stride 0 over more than one element).
    The stride first: a dim of stride 0 is expanded whatever its size, so a symbolic size is
    compared (a guard) only there."""
    return any(stride == 0 and size > 1 for size, stride in zip(shape, strides))


def viewed_strides(shape, strides, new_shape):
    """The strides of ``reshape(new_shape)`` as a view of a tensor with ``shape`` and ``strides``,
    or None when eager must copy (ATen's ``computeStride``). Of a tensor whose strides are the
    contiguous ones, the contiguous strides of ``new_shape``, which computeStride gives there:
    told with no decision on the sizes (computeStride's ``size != 1`` at each dim would be a guard
    on a count, and a variant traced at a count of 1 would serve 1 alone: Mask R-CNN's masks of
    boxes 1 pixel high, ``[1, 1, h, w]`` taken as ``[h, w]``)."""
    if not shape or any(map(_is_zero, shape)):
        return contiguous_strides(new_shape)
    if all(map(identical, strides, contiguous_strides(shape))):
        return contiguous_strides(new_shape)
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base = strides[-1]
    tensor_numel = view_numel = 1
    for d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[d]
        if d == 0 or _starts_chunk(shape[d - 1], strides[d - 1], tensor_numel * chunk_base):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_strides[view_d] = view_numel * chunk_base
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk_base = strides[d - 1]
                tensor_numel = view_numel = 1
    return tuple(new_strides) if view_d == -1 else None


def _starts_chunk(size, stride, expected) -> bool:
    """computeStride's ``size != 1 and stride != expected``: whether the dim before starts a new
    chunk of memory. Of a symbolic size, the stride is compared first: where it is the expected
    one, no decision is taken on the size (the same answer; a count of 1 keeps the variant)."""
    if type(size) is int:
        return size != 1 and stride != expected
    return stride != expected and size != 1


def strides_of(p) -> tuple[int, ...]:
    """The strides eager's tensor for proxy ``p`` has (views follow their root's)."""
    link = p._view
    if link is not None:
        return link.strides
    return p._strides if p._strides is not None else contiguous_strides(p.shape)


# -- the layouts of eager's view ops that run as fallbacks (``views.opaque``) ----------------------


def _as_strided_layout(shape, strides, size, stride, storage_offset=None):
    return tuple(size), tuple(stride)


def _unfold_layout(shape, strides, dimension, size, step):
    d = dimension % len(shape) if shape else 0
    if not shape:
        return (size,), (1,)
    new_shape = (*shape[:d], (shape[d] - size) // step + 1, *shape[d + 1 :], size)
    return new_shape, (*strides[:d], strides[d] * step, *strides[d + 1 :], strides[d])


def _adjoint_layout(shape, strides):
    return (*shape[:-2], shape[-1], shape[-2]), (*strides[:-2], strides[-1], strides[-2])


def _as_real_layout(shape, strides):
    """``view_as_real``: a dim of the two parts, strides counted in reals (twice as many)."""
    return (*shape, 2), (*(2 * s for s in strides), 1)


def _as_complex_layout(shape, strides):
    return tuple(shape[:-1]), tuple(s // 2 for s in strides[:-1])


def _part_layout(shape, strides):
    """``z.real``/``z.imag``: the complex tensor's shape, strides counted in reals."""
    return tuple(shape), tuple(2 * s for s in strides)


#: The layouts of the fallback and opaque views whose strides are not their input's.
FALLBACK_LAYOUTS = {
    torch.Tensor.as_strided: _as_strided_layout,
    torch.as_strided: _as_strided_layout,
    torch.Tensor.unfold: _unfold_layout,
    torch.Tensor.adjoint: _adjoint_layout,
    torch.adjoint: _adjoint_layout,
    torch.view_as_real: _as_real_layout,
    torch.view_as_complex: _as_complex_layout,
    "real": _part_layout,
    "imag": _part_layout,
    "mH": _adjoint_layout,
    "H": _adjoint_layout,
}
