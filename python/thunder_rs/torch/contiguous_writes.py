"""The writes at indices whose out-of-place forms eager computes into a new contiguous tensor,
whatever their input's layout: ATen's structured kernels ``index_add``, ``index_copy``,
``index_reduce``, ``scatter``, ``scatter_add`` and ``scatter_reduce`` allocate their output with
no strides (row-major), copy the input into it and write there.

The reuse pass (``crates/passes/src/reuse.rs``) runs such a write in place on a fresh
intermediate dying at the call, which keeps that intermediate's layout: ``torch.zeros_like(
x.t()).index_add(0, i, y)`` or ``(x.t() * 2).scatter(0, i, v)`` came back transposed where eager's
is row-major. The trace does not know its values' strides, but the program's tensors do
(``core.lang.eager_layouts``): an intermediate that eager lays out in another order is first
copied row-major (the copy eager's kernel makes into its output), and the write runs in place on
that copy. A trace input or a view is never written in place: its write allocates a row-major
result already. The in-place forms (``out.index_add_(...)``) keep ``out``'s layout, as eager's do:
they call the symbols themselves (``.symbol``: ``inplace._in_place``), which the reuse pass runs
in place on ``out``.
"""

import torch

from thunder_rs.core.base.layouts import is_contiguous
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.torch.gathers import index_add, scatter_add
from thunder_rs.torch.index_scatter import index_copy, index_reduce
from thunder_rs.torch.scatter import scatter, scatter_reduce
from thunder_rs.torch.shape import clone

#: The symbols of the writes whose out-of-place results eager lays out row-major.
_ROW_MAJOR_WRITES = (index_add, index_copy, index_reduce, scatter, scatter_add, scatter_reduce)


def _reordered_intermediate(a) -> bool:
    """Whether ``a`` is a tensor the program computed (not a view, not a trace input) that eager
    lays out otherwise than row-major: one the reuse pass could write into in that layout."""
    if type(a) is not TensorProxy or a._view is not None or a._input_vid is not None or a._strides is None:
        return False
    return not is_contiguous(a.shape, a._strides)


def into_row_major(symbol):
    """``symbol``, a write at indices, on a row-major copy of an input laid out otherwise."""

    def write(input, *args, **kwargs):
        if _reordered_intermediate(input):
            input = clone(input, memory_format=torch.contiguous_format)
        return symbol(input, *args, **kwargs)

    write.__wrapped__ = symbol
    write.symbol = symbol
    return write


def _register() -> None:
    for symbol in _ROW_MAJOR_WRITES:
        write = into_row_major(symbol)
        for fn in symbol.torch_fns:
            if TORCH_TO_LTORCH.get(fn) is symbol:
                TORCH_TO_LTORCH[fn] = write


_register()
