"""Eager's refusal of a write whose operand partially overlaps the written tensor.

An in-place pointwise op (``x.add_(x.t())``, ``x[1:].mul_(x[:-1])``, ``x.add_(x[0])``), ``copy_``
(``x.copy_(x.t())``) and a pointwise op's ``out=`` into a view of its own input raise in eager:
TensorIterator (and ``copy_``) call ``assert_no_partial_overlap(output, input)``, which refuses an
operand that shares some of the written memory without being laid out exactly as it is (the
result would depend on the order elements are written in). The trace computes every value before it
writes, so it would return a result where eager raises. ``check_partial_overlap`` raises eager's
error at the program's line, with ATen's rules (``get_overlap_status``): views of one root, both
non-overlapping and dense, whose memory ranges meet but are not the same range with the same
strides. What the trace cannot tell with plain ints (symbolic sizes, an offset no rule gives) is
left alone, as eager's ``TooHard`` is.
"""

from __future__ import annotations

import functools

import torch
from torch.utils._pytree import tree_leaves

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.langctx import user_location
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError
from thunder_rs.torch.storage_offsets import eager_offset
from thunder_rs.torch.strides import strides_of

__all__ = ["check_partial_overlap", "is_pointwise"]

_PARTIAL = (
    "unsupported operation: some elements of the input tensor and the written-to tensor refer to a single "
    "memory location. Please clone() the tensor before performing the operation."
)


@functools.cache
def is_pointwise(name: str) -> bool:
    """Whether an overload of ``aten.<name>`` is tagged pointwise (a TensorIterator kernel)."""
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return False
    return any(torch.Tag.pointwise in getattr(packet, o).tags for o in packet.overloads())


def _dense_range(p: TensorProxy) -> tuple[int, int, tuple] | None:
    """``(begin, end, strides)`` in bytes of ``p``'s memory where it is non-overlapping and dense
    with plain sizes and a known offset; None otherwise (eager's ``TooHard``, or empty)."""
    shape, strides, offset = tuple(p.shape), strides_of(p), eager_offset(p)
    if type(offset) is not int or not all(type(v) is int for v in (*shape, *strides)):
        return None
    numel = 1
    for size in shape:
        numel *= size
    if numel == 0:
        return None
    expected = 1
    for size, stride in sorted(((s, t) for s, t in zip(shape, strides) if s != 1), key=lambda d: d[1]):
        if stride != expected:
            return None
        expected *= size
    item = p.dtype.itemsize
    return offset * item, (offset + numel) * item, tuple(strides)


def _partially_overlap(out: TensorProxy, other: TensorProxy) -> bool:
    root = out if out._view is None else out._view.root
    if other is out or root is not (other if other._view is None else other._view.root):
        return False
    a, b = _dense_range(out), _dense_range(other)
    if a is None or b is None:
        return False
    if a[:2] == b[:2]:
        return a[2] != b[2]
    return a[0] < b[1] and b[0] < a[1]


def _addresses(p: TensorProxy, shape: tuple) -> torch.Tensor | None:
    """The storage index of each element of ``p`` broadcast to ``shape`` (plain ints only)."""
    sizes, strides, offset = tuple(p.shape), strides_of(p), eager_offset(p)
    if type(offset) is not int or not all(type(v) is int for v in (*sizes, *strides, *shape)):
        return None
    span = offset + sum((n - 1) * t for n, t in zip(sizes, strides) if n > 0) + 1
    if span > _MOST or any(n == 0 for n in sizes):
        return None
    return torch.arange(span).as_strided(sizes, strides, offset).expand(shape)


#: The most storage elements the order check below works out (a trace-time cost).
_MOST = 1 << 22


def _order_dependent(out: TensorProxy, other: TensorProxy) -> bool:
    """Whether eager's in-place kernel reads, for some element of ``out``, an element of ``other``
    that an earlier element of ``out`` wrote (``x.add_(x[:, :1])``: eager adds the new ``x[0, 0]``
    to ``x[0, 1]``), where the trace reads every value before writing. Views of one root that
    ATen's check leaves alone (not dense: ``TooHard``); a read of an element written later
    (``x[1].copy_(x[:, 2])``) reads the old value in both."""
    root = out if out._view is None else out._view.root
    if other is out or root is not (other if other._view is None else other._view.root):
        return False
    try:
        shape = torch.broadcast_shapes(tuple(out.shape), tuple(other.shape))
    except (RuntimeError, TypeError):
        return False
    if tuple(shape) != tuple(out.shape):
        return False
    with torch._C.DisableTorchFunction():
        written, read = _addresses(out, shape), _addresses(other, shape)
        if written is None or read is None:
            return False
        # (Elements written before they are read: the kernel goes through memory upwards.)
        return bool((torch.isin(read, written) & (read < written)).any())


def check_partial_overlap(op: str, out, operands, in_place: bool = True) -> None:
    """Eager's error where a tensor among ``operands`` (any nesting) partially overlaps ``out``;
    for an in-place op, a refusal where eager's result would depend on its kernel's order
    (``_order_dependent``; an ``out=`` into a strided view may go through a buffer)."""
    if not isinstance(out, TensorProxy):
        return
    for t in tree_leaves(operands):
        if isinstance(t, TensorProxy) and _partially_overlap(out, t):
            raise ThunderRuntimeError(f"{op}: {_PARTIAL} (at {user_location()})")
        if in_place and isinstance(t, TensorProxy) and _order_dependent(out, t):
            raise ThunderNotImplementedError(
                f"{op}: an operand shares memory with other elements of the written tensor (at {user_location()}); "
                "eager's result depends on the order its kernel writes them in, the trace reads every value "
                "before writing: clone() the operand"
            )
