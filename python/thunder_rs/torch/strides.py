"""Eager's strides for proxies, so that ``reshape``, ``view`` and ``contiguous()`` copy where
eager copies (``views.py``): trace inputs have the strides of their tensors, views follow their
root's, and other tensors are taken to be contiguous.
"""

import math


def contiguous_strides(shape) -> tuple[int, ...]:
    strides, step = [1] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        strides[d] = step
        if shape[d] > 1:
            step *= shape[d]
    return tuple(strides)


def is_contiguous(shape, strides) -> bool:
    """torch's rule: sizes of one (and empty tensors) place no constraint on strides."""
    if 0 in shape:
        return True
    expected = 1
    for size, stride in zip(reversed(tuple(shape)), reversed(tuple(strides))):
        if size != 1:
            if stride != expected:
                return False
            expected *= size
    return True


def overlaps(shape, strides) -> bool:
    """Whether two elements share memory: an expanded dim (stride 0 over more than one element).
    The stride first: a dim that is not expanded decides nothing on its size (``t - 1 > 1``)."""
    return any(stride == 0 and size > 1 for size, stride in zip(shape, strides))


def viewed_strides(shape, strides, new_shape):
    """The strides of ``reshape(new_shape)`` as a view of a tensor with ``shape`` and ``strides``,
    or None when eager must copy (ATen's ``computeStride``)."""
    if math.prod(shape) == 0 or not shape:
        return contiguous_strides(new_shape)
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base = strides[-1]
    tensor_numel = view_numel = 1
    for d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[d]
        if d == 0 or (shape[d - 1] != 1 and strides[d - 1] != tensor_numel * chunk_base):
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


def strides_of(p) -> tuple[int, ...]:
    """The strides eager's tensor for proxy ``p`` has (views follow their root's)."""
    link = p._view
    if link is not None:
        return link.strides
    return p._strides if p._strides is not None else contiguous_strides(p.shape)
