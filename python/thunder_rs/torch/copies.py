"""The ``*_copy`` ops: each computes what its view op computes, into a new tensor.

``torch.expand_copy(x, size)`` is ``x.expand(size)`` that shares no memory with ``x``: the
symbol runs the view op's decomposition (the plain symbol, not the view-tracking op langctx
maps the view to) and clones its value contiguous, as eager's copies are whatever the layout of
their input.
"""

import torch

from thunder_rs.core.lang.fallback import fallback
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, check
from thunder_rs.torch import arrange, diagonals, indexing, joins, shape, view_scatters
from thunder_rs.torch.symbols import torchsymbol
from thunder_rs.torch.shape import clone

__all__: list[str] = []


def _narrow_copy(a, dim, start, length):
    """``narrow``, with eager's ``narrow_copy`` check of a dim past the last (a RuntimeError there,
    where ``narrow``'s is an IndexError)."""
    check(
        not isinstance(dim, int) or dim < a.ndim,
        "ltorch.narrow_copy",
        "Expected dim < static_cast<int64_t>(self_sizes.size()) to be true, but got false. (argument dim)",
        ThunderRuntimeError,
    )
    return joins.narrow(a, dim, start, length)


#: copy op -> the symbol of the view op it copies.
_VIEWS = {
    "expand_copy": shape.expand,
    "permute_copy": shape.permute,
    "t_copy": shape.t,
    "transpose_copy": shape.transpose,
    "view_copy": shape.view,
    "squeeze_copy": shape.squeeze,
    "unsqueeze_copy": shape.unsqueeze,
    "unbind_copy": indexing.unbind,
    "select_copy": indexing.select,
    "diagonal_copy": view_scatters.diagonal,
    "narrow_copy": _narrow_copy,
    "split_copy": joins.split,
    "split_with_sizes_copy": arrange.split_with_sizes,
    "unfold_copy": diagonals.unfold,
    "as_strided_copy": diagonals.as_strided,
    "alias_copy": lambda a: a,
}

#: copy ops returning a sequence of tensors.
_SEQUENCES = ("unbind_copy", "split_copy", "split_with_sizes_copy")


def _define_copy(name: str, view):
    torch_fns = tuple(f for f in (getattr(torch, name), getattr(torch.Tensor, name, None)) if f is not None)

    @torchsymbol(*torch_fns, name=name, sequence=name in _SEQUENCES)
    def copy_op(input, *args, out=None, **kwargs):
        check(out is None, f"ltorch.{name}", "out= is not supported (argument out)", ThunderNotImplementedError)
        # Eager's copies are new contiguous tensors whatever the input's layout; the view's
        # value, run by the torch executor, may be a view of ``input`` (an unsqueeze is a reshape).
        result = view(input, *args, **kwargs)
        if isinstance(result, tuple):
            return tuple(clone(r, memory_format=torch.contiguous_format) for r in result)
        return clone(result, memory_format=torch.contiguous_format)

    copy_op.__doc__ = f"``torch.{name}``: ``{getattr(view, 'symbol_name', 'alias')}`` into a new tensor."
    return copy_op


COPIES = {name: _define_copy(name, view) for name, view in _VIEWS.items()}
globals().update(COPIES)
__all__ += list(COPIES)


def _as_strided_copy(input, size, stride, storage_offset=None, *, out=None):
    """Reads known positions only where ``as_strided`` does (``diagonals.reads_own_memory``);
    otherwise an eager fallback of an input tensor, whose memory it reads."""
    if out is not None or diagonals.reads_own_memory(input, size, stride, storage_offset):
        return COPIES["as_strided_copy"](input, size, stride, storage_offset, out=out)
    check(
        input._view is None and getattr(input, "_input_vid", None) is not None,
        "ltorch.as_strided_copy",
        lambda: (
            "as_strided_copy of a view, or of a non-contiguous tensor computed in the program, reads memory whose "
            "layout thunder_rs does not reproduce; clone() it first (argument input)"
        ),
        ThunderNotImplementedError,
    )
    return fallback(torch.as_strided_copy, (input, size, stride, storage_offset), {})


TORCH_TO_LTORCH[torch.as_strided_copy] = _as_strided_copy
