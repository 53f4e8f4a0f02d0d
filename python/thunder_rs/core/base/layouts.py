"""A tensor's layout as cache keys and traces see it.

A contiguous tensor's layout is ``True``. A tensor dense in another order of its dims (a
``channels_last`` image batch, a transpose of a contiguous tensor) is ``("dense", order)``, its
dims from the outermost to the innermost: its strides follow from its sizes, so a call with other
sizes in the same order differs from an earlier one in sizes only, and those dims can become
symbolic (``acquisition.dynamic``). Any other tensor (a slice of a larger buffer, a broadcast, a
size-1 dim with a stride of its own) is its strides. Either way a key of shape and layout tells
the exact strides.
"""

import functools
from typing import NamedTuple

_DENSE = "dense"


def layout(t) -> tuple:
    """The layout of ``t``, a tensor that is not contiguous (see the module doc)."""
    return layout_of(t.shape, t.stride())


def layout_of(shape, strides) -> tuple:
    """``layout`` of a tensor of ``shape`` and ``strides`` (ints)."""
    order = sorted(range(len(strides)), key=strides.__getitem__, reverse=True)
    step = 1
    for d in reversed(order):
        if strides[d] != step:
            return strides
        step *= shape[d]
    return (_DENSE, tuple(order))


def is_dense(layout_key) -> bool:
    return type(layout_key) is tuple and len(layout_key) == 2 and layout_key[0] == _DENSE


def is_strided(layout_key) -> bool:
    """Whether a tensor of ``layout_key`` is neither contiguous nor dense in another order: its
    strides are its own (a slice of a longer buffer), not its sizes'."""
    return type(layout_key) is tuple and not is_dense(layout_key)


#: Marks a stride among the dims of a tensor whose sizes are symbolic: ``(STRIDE, dim)``.
STRIDE = "stride"


class SymbolicStrides(NamedTuple):
    """The layout a guard checks of a strided tensor whose sizes or strides are symbolic:
    ``strides``, None where symbolic, and what a trace decided at the traced ones
    (``decided_by``), which every size it serves must keep."""

    strides: tuple
    decided: tuple


@functools.lru_cache(maxsize=4096)  # (every call's guard asks: a decode's steps repeat theirs)
def symbolic_strides(shape, strides, dims) -> SymbolicStrides:
    """``SymbolicStrides`` of a tensor of ``shape`` and ``strides`` (ints) whose strides at
    ``(STRIDE, d)`` among ``dims`` are symbolic."""
    masked = tuple(None if (STRIDE, d) in dims else n for d, n in enumerate(strides))
    return SymbolicStrides(masked, decided_by(shape, strides))


def steps_over(shape, strides) -> frozenset:
    """The pairs of dims ``(i, j)`` where dim ``i`` steps over all of dim ``j`` (``stride[i] ==
    size[j] * stride[j]``): what decides whether a view may merge dims, whether ``reshape`` views
    or copies, and whether the tensor is contiguous in some order."""
    n = len(shape)
    return frozenset((i, j) for i in range(n) for j in range(n) if i != j and strides[i] == shape[j] * strides[j])


def decided_by(shape, strides) -> tuple:
    """What a trace decides at a tensor's ``shape`` and ``strides`` (ints) that its sizes alone do
    not tell: ``steps_over``, the rank of each dim's stride (ties equal: the order elementwise
    results and ``contiguous`` follow) and whether its elements may overlap (``may_overlap``)."""
    distinct = sorted(set(strides))
    ranks = tuple(distinct.index(n) for n in strides)
    return steps_over(shape, strides), ranks, may_overlap(shape, strides)


def may_overlap(shape, strides) -> bool:
    """Whether two elements of a tensor of ``shape`` and ``strides`` may share memory: unless each
    dim's stride, from the smallest, reaches past all the elements of the dims with smaller
    strides (an empty tensor never overlaps; dims of size 1 take no part)."""
    if 0 in shape:
        return False
    extent = 0
    for stride, size in sorted((st, n) for n, st in zip(shape, strides) if n != 1):
        if stride <= extent:
            return True
        extent += (size - 1) * stride
    return False


def strides_in(shape, layout_key) -> tuple | None:
    """The strides a layout tells at ``shape`` (ints, or the symbolic sizes of a trace input);
    None for a contiguous tensor."""
    if layout_key is True:
        return None
    if not is_dense(layout_key):
        return tuple(layout_key)
    strides: list = [0] * len(shape)
    step = 1
    for d in reversed(layout_key[1]):
        strides[d] = step
        step = step * shape[d]
    return tuple(strides)


def describe(layout_key) -> str:
    if layout_key is True:
        return "contiguous"
    if is_dense(layout_key):
        return f"dense in dim order {layout_key[1]}"
    if type(layout_key) is SymbolicStrides:
        return f"strides ({', '.join('s' if n is None else str(n) for n in layout_key.strides)})"
    return f"strides {layout_key}"


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
