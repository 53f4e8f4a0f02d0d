"""``torch.nonzero_static``: the indices of the first ``size`` nonzero elements in row-major order,
as a contiguous ``(size, ndim)`` int64 table, its rows past the count filled with ``fill_value``.
Its size is the argument's, so it is traced: a running count of the nonzero mask gives each
nonzero element its row (the others, and those past ``size``, a spare row dropped after), and
each row's flat position is split into coordinates by the input's sizes.
"""

import math

import torch

from thunder_rs import prims
from thunder_rs.errors import ThunderRuntimeError, ThunderTypeError, check
from thunder_rs.torch.common import require_tensor
from thunder_rs.torch.shape import reshape_to, slice_in_dim
from thunder_rs.torch.symbols import ltorch, torchsymbol

__all__ = ["nonzero_static"]


@torchsymbol(torch.nonzero_static, torch.Tensor.nonzero_static)
def nonzero_static(input, *, size, fill_value=-1):
    op = "ltorch.nonzero_static"
    require_tensor(op, input, "input")
    for value, name in ((size, "size"), (fill_value, "fill_value")):
        check(
            isinstance(value, int) and not isinstance(value, bool),
            op,
            lambda: f"nonzero_static(): argument '{name}' must be int, not {type(value).__name__} (argument {name})",
            ThunderTypeError,
        )
    check(size >= 0, op, "nonzero_static: 'size' must be an non-negative integer (argument size)", ThunderRuntimeError)
    device, shape = input.device, tuple(input.shape)
    if input.ndim == 0 or size == 0:
        return ltorch.zeros((size, input.ndim), dtype=torch.int64, device=device)
    total = math.prod(shape)
    if total == 0:
        return ltorch.full((size, input.ndim), fill_value, dtype=torch.int64, device=device)
    mask = reshape_to(ltorch.ne(input, 0), (total,))
    rank = prims.sub(ltorch.cumsum(mask, 0), 1)  # each nonzero element's row
    row = ltorch.where(ltorch.logical_and(mask, ltorch.lt(rank, size)), rank, size)  # (others: the spare row)
    positions = prims.iota(total, 0, 1, device, torch.int64)
    flat = ltorch.scatter(prims.full((size + 1,), 0, device, torch.int64), 0, row, positions)
    flat = slice_in_dim(flat, 0, 0, size)
    filled = ltorch.lt(prims.iota(size, 0, 1, device, torch.int64), ltorch.sum(mask))
    columns = [
        ltorch.where(filled, prims.remainder(prims.div(flat, math.prod(shape[k + 1 :])), shape[k]), fill_value)
        for k in range(input.ndim)
    ]
    return ltorch.stack(columns, 1)
