"""``torch.combinations``: eager's ``self[indices]`` with the ``(count, r)`` table of index
combinations in lexicographic order. The table is built in the trace from iotas: the positions of
an ``r``-dim grid ``n ** r`` where the indices increase (or do not decrease, with replacement), in
grid order, found by a running count of that mask; its size is known while tracing.
"""

import math

import torch

from thunder_rs import prims
from thunder_rs.errors import ThunderRuntimeError, check
from thunder_rs.torch.shape import reshape_to, slice_in_dim
from thunder_rs.torch.symbols import ltorch, torchsymbol

__all__ = ["combinations"]


def _combination_table(n: int, r: int, with_replacement: bool, device):
    """The ``(count, r)`` int64 table of the combinations of ``range(n)``, lexicographic."""
    count = _count(n, r, with_replacement)
    grid = (n,) * r
    coords = [prims.broadcast_in_dim(prims.iota(n, 0, 1, device, torch.int64), grid, (k,)) for k in range(r)]
    ordered = prims.le if with_replacement else prims.lt
    mask = None
    for a, b in zip(coords, coords[1:]):
        pair = ordered(a, b)
        mask = pair if mask is None else prims.bitwise_and(mask, pair)
    total = math.prod(grid)
    if mask is None:  # r == 1: every index
        mask = prims.full((total,), True, device, torch.bool)
    flat_mask = reshape_to(mask, (total,))
    rank = prims.sub(ltorch.cumsum(flat_mask, 0), 1)  # each kept position's row in the table
    spare = ltorch.sum(flat_mask)  # (the count, as a tensor: a symbolic count is no fill value)
    row = ltorch.where(flat_mask, rank, spare)  # (others: a spare row)
    positions = prims.iota(total, 0, 1, device, torch.int64)
    rows = ltorch.scatter(prims.full((count + 1,), 0, device, torch.int64), 0, row, positions)
    rows = slice_in_dim(rows, 0, 0, count)
    columns = [prims.remainder(prims.div(rows, math.prod(grid[k + 1 :])), n) for k in range(r)]
    return ltorch.stack(columns, 1)


def _count(n, r: int, with_replacement: bool):
    """``comb(n + r - 1, r)`` or ``comb(n, r)`` as a product over ``r!`` (exact), so that a
    symbolic ``n`` gives a size expression rather than a guard on its value."""
    top = math.prod(n + k if with_replacement else n - k for k in range(r))
    return top // math.factorial(r) if r > 1 else top


@torchsymbol(torch.combinations)
def combinations(input, r=2, with_replacement=False):
    op = "ltorch.combinations"
    check(
        input.ndim == 1,
        op,
        lambda: f"Expect a 1D vector, but got shape {list(input.shape)} (argument input)",
        ThunderRuntimeError,
    )
    check(r >= 0, op, f"Expect a non-negative number, but got {r} (argument r)", ThunderRuntimeError)
    if r == 0:
        return ltorch.empty((0,), dtype=input.dtype, device=input.device)
    n = input.shape[0]
    if n == 0:
        return ltorch.getitem(input, reshape_to(prims.full((0,), 0, input.device, torch.int64), (0, r)))
    return ltorch.getitem(input, _combination_table(n, r, with_replacement, input.device))
