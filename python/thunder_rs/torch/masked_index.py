"""``_unsafe_masked_index`` and ``_unsafe_masked_index_put_accumulate``: the gathers and
scatter-adds of upsampling's and ``F.grid_sample``'s decompositions (Inductor's), whose indices may
be out of range where the mask is false. They decompose as eager's kernels compute them: the
indices clamped into range, then an index (filled where the mask is false) or an accumulating
``index_put`` of the values zeroed where the mask is false.
"""

import torch

from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.errors import ThunderTypeError, ThunderRuntimeError, check
from thunder_rs.torch.common import SCALAR_NAMES, sum_to
from thunder_rs.torch.symbols import ltorch, torchsymbol

__all__ = ["unsafe_masked_index", "unsafe_masked_index_put_accumulate"]


def _clamped(op: str, x, indices) -> tuple:
    """Each index tensor clamped to ``[-size, size - 1]`` of the dim it indexes, checked as
    eager checks them (int64 or int32 tensors)."""
    check(
        isinstance(indices, (list, tuple)),
        op,
        f"expected a list of index tensors, got {type(indices).__name__} (argument indices)",
        ThunderTypeError,
    )
    for i, index in enumerate(indices):
        check(
            isinstance(index, torch.Tensor),
            op,
            f"expected Tensor as element {i} in argument 2, but got {type(index).__name__} (argument indices)",
            ThunderTypeError,
        )
        check(
            index.dtype in (torch.int64, torch.int32),
            op,
            f"_unsafe_masked_index found unexpected index type {SCALAR_NAMES[index.dtype]} (argument indices)",
            ThunderRuntimeError,
        )
    return tuple(ltorch.clamp(index, -size, size - 1) for index, size in zip(indices, x.shape)) + tuple(
        indices[x.ndim :]  # (too many: indexing reports them)
    )


@torchsymbol(torch._unsafe_masked_index, name="unsafe_masked_index")
def unsafe_masked_index(input, mask, indices, fill):
    """``where(mask, input[indices], fill)``, ``input`` read only at in-range positions."""
    op = "ltorch.unsafe_masked_index"
    clamped = _clamped(op, input, indices)
    if input.numel() == 0:
        # Every element the fill: indexed from ``input`` grown to size 1 (filled) in its empty
        # indexed dims, a tensor that, as eager's, requires grad where ``input`` does.
        grown = [1 if i < len(indices) and size == 0 else 0 for i, size in enumerate(input.shape)]
        pad = [n for g in reversed(grown) for n in (0, g)]
        return ltorch.getitem(ltorch.constant_pad_nd(input, pad, fill), clamped)
    return ltorch.masked_fill(ltorch.getitem(input, clamped), ltorch.logical_not(mask), fill)


@torchsymbol(torch._unsafe_masked_index_put_accumulate, name="unsafe_masked_index_put_accumulate")
def unsafe_masked_index_put_accumulate(input, mask, indices, values):
    """``input`` with ``values`` added at ``indices`` where ``mask`` is true (where it is false
    the index may be out of range and nothing is added)."""
    op = "ltorch.unsafe_masked_index_put_accumulate"
    if input.numel() == 0:
        return ltorch.clone(input)
    clamped = _clamped(op, input, indices)
    return ltorch.index_put(input, clamped, ltorch.masked_fill(values, ltorch.logical_not(mask), 0), True)


# Eager's gradients (derivatives.yaml): each op's the other's, so that an empty input's values
# get the zeros eager gives them.


@register_grad(unsafe_masked_index)
def unsafe_masked_index_rule(input, mask, indices, fill):
    out = unsafe_masked_index(input, mask, indices, fill)
    if input.requires_grad:
        zeros = ltorch.zeros(tuple(input.shape), dtype=input.dtype, device=input.device)
        put_grad(input, unsafe_masked_index_put_accumulate(zeros, mask, indices, get_grad(out)))
    return out


@register_grad(unsafe_masked_index_put_accumulate)
def unsafe_masked_index_put_accumulate_rule(input, mask, indices, values):
    out = unsafe_masked_index_put_accumulate(input, mask, indices, values)
    g = get_grad(out)
    if input.requires_grad:
        put_grad(input, g)
    if values.requires_grad:
        put_grad(values, sum_to(unsafe_masked_index(g, mask, indices, 0), tuple(values.shape)))
    return out
