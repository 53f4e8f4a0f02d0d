"""Meta rules of linalg calls recorded whole (``factorizations.opaque``) that torch has no meta kernel for, or
whose sizes must stay symbolic: what eager returns, described by shape, dtype and differentiability."""

import torch

from thunder_rs import clang
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, check


class _Meta:
    """An output a meta rule here describes: its shape (symbolic where the inputs' sizes are: a
    meta tensor would take each size at its value), dtype and whether autograd differentiates it."""

    __slots__ = ("shape", "dtype", "requires_grad")

    def __init__(self, shape, dtype, requires_grad: bool = False):
        self.shape, self.dtype, self.requires_grad = tuple(shape), dtype, requires_grad


meta = _Meta


def lstsq_meta(A, B, rcond=None, *, driver=None):
    """linalg.lstsq (torch has no meta kernel): the solution, and what the driver computes, as
    eager returns it. gelsy (CPU's default) gives the rank of each matrix of A; gels (CUDA's
    only) the residuals when A has more rows than columns. gelsd and gelss give residuals only
    for full-rank inputs, which a meta rule cannot know: they are refused."""
    op = "ltorch.linalg_lstsq"
    driver = driver or ("gelsy" if A.device.type == "cpu" else "gels")
    check(
        driver in ("gelsy", "gels"),
        op,
        f"driver {driver!r} is not supported, only 'gelsy' and 'gels' (argument driver)",
        ThunderNotImplementedError,
    )
    check(A.ndim >= 2, op, f"input must have at least 2 dimensions, got {A.ndim} (argument A)", ThunderRuntimeError)
    check(
        A.dtype == B.dtype,
        op,
        f"expected A and B to have the same dtype, got {A.dtype} and {B.dtype} (argument B)",
        ThunderRuntimeError,
    )
    check(
        0 <= A.ndim - B.ndim <= 1,
        op,
        "input.dim() must be greater or equal to other.dim() and (input.dim() - other.dim()) <= 1 (argument B)",
        ThunderRuntimeError,
    )
    vector = B.ndim == A.ndim - 1
    b_shape = (*B.shape, 1) if vector else tuple(B.shape)
    check(
        len(b_shape) >= 2 and A.shape[-2] == b_shape[-2],
        op,
        f"A {list(A.shape)} and B {list(B.shape)} have different numbers of rows (argument B)",
        ThunderRuntimeError,
    )
    batch = clang.broadcast_shapes(op, A.shape[:-2], b_shape[:-2])
    solution = (*batch, A.shape[-1]) if vector else (*batch, A.shape[-1], b_shape[-1])
    differentiable = A.requires_grad or B.requires_grad
    if driver == "gelsy":
        residuals, rank = (0,), A.shape[:-2]
    else:
        residuals, rank = ((*batch, b_shape[-1]) if A.shape[-2] > A.shape[-1] else (0,)), (0,)
    return torch.return_types.linalg_lstsq(
        (
            meta(solution, A.dtype, differentiable),
            meta(residuals, A.dtype, differentiable),
            meta(rank, torch.int64),
            meta((0,), A.dtype),
        )
    )


def geqrf_meta(input):
    """geqrf: the packed factorization (the input's shape) and the Householder scalars."""
    check(
        input.ndim >= 2,
        "ltorch.geqrf",
        f"input must have at least 2 dimensions, got {input.ndim} (argument input)",
        ThunderRuntimeError,
    )
    m, n = input.shape[-2:]
    return torch.return_types.geqrf((meta(input.shape, input.dtype), meta((*input.shape[:-2], min(m, n)), input.dtype)))
