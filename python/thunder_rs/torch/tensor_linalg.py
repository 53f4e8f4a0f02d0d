"""``torch.linalg.tensorinv``, ``tensorsolve`` and ``torch.lu_unpack``.

``tensorinv`` and ``tensorsolve`` are eager's composites: the tensor
reshaped to a square matrix, inverted (solved) by the opaque factorization eager calls
(``linalg.py``'s ``linalg_inv``, ``linalg_solve``), and the result reshaped back, so that values,
gradients and layouts are eager's. They need no grad rule of their own: the decomposition's
gradient is the factorization's own derivative (eager's ``LinalgInvExBackward0``,
``LinalgSolveExBackward0``) through the reshapes, as eager's autograd records it.
"""

import math

import torch

from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.errors import ThunderRuntimeError, ThunderValueError, check
from thunder_rs.torch.common import require_tensor
from thunder_rs.torch.factorizations import singular_values
from thunder_rs.torch.symbols import ltorch, torchsymbol

LA = torch.linalg
__all__ = ["linalg_tensorinv", "linalg_tensorsolve", "lu_unpack", "linalg_cond"]


@torchsymbol(LA.tensorinv)
def linalg_tensorinv(A, ind=2, *, out=None):
    op = "ltorch.linalg_tensorinv"
    require_tensor(op, A, "A")
    check(
        ind > 0,
        op,
        f"Expected a strictly positive integer for 'ind', but got {ind} (argument ind)",
        ThunderRuntimeError,
    )
    end, start = tuple(A.shape[ind:]), tuple(A.shape[:ind])
    rows, columns = math.prod(end), math.prod(start)
    check(
        rows == columns,
        op,
        lambda: (
            "Expected self to satisfy the requirement prod(self.shape[ind:]) == prod(self.shape[:ind]), but got "
            f"{rows} != {columns} (argument A)"
        ),
        ThunderRuntimeError,
    )
    inverse = ltorch.linalg_inv(ltorch.reshape(A, (rows, rows)))
    return ltorch.reshape(inverse, (*end, *start))


@torchsymbol(LA.tensorsolve)
def linalg_tensorsolve(A, B, dims=None, *, out=None):
    op = "ltorch.linalg_tensorsolve"
    require_tensor(op, A, "A")
    require_tensor(op, B, "B")
    ndim = A.ndim
    if dims is not None:
        dims = tuple(dims)
        A = ltorch.movedim(A, dims, tuple(range(ndim - len(dims), ndim)))
    result_shape = tuple(A.shape[B.ndim :])
    rows, count = math.prod(result_shape), math.prod(B.shape)
    check(
        rows == count,
        op,
        lambda: (
            "Expected self to satisfy the requirement prod(self.shape[other.ndim:]) == prod(self.shape[:other.ndim]), "
            f"but got {rows} != {count} (argument A)"
        ),
        ThunderRuntimeError,
    )
    solution = ltorch.linalg_solve(ltorch.reshape(A, (rows, rows)), ltorch.flatten(B))
    return ltorch.reshape(solution, result_shape)


# -- lu_unpack -----------------------------------------------------------------------------------------


def _check_lu_unpack(op: str, LU, pivots) -> None:
    check(
        LU.ndim >= 2,
        op,
        lambda: f"torch.lu_unpack: Expected tensor with 2 or more dimensions. Got size: {list(LU.shape)} instead",
        ThunderRuntimeError,
    )
    check(
        pivots.dtype == torch.int32,
        op,
        "torch.lu_unpack: LU_pivots is expected to be a contiguous tensor of torch.int32 dtype. (argument LU_pivots)",
        ThunderRuntimeError,
    )
    expected = (*LU.shape[:-2], min(LU.shape[-2], LU.shape[-1]))
    check(
        tuple(pivots.shape) == expected,
        op,
        lambda: f"Expected LU_pivots to have shape {list(expected)} but got {list(pivots.shape)} instead.",
        ThunderValueError,
    )


def _permutation(pivots, m: int, k: int, device):
    """The rows' permutation (eager's ``unpack_pivots``): the identity, with row ``i`` swapped with
    row ``pivots[i] - 1`` for each ``i < k`` in turn. (Pivots out of range make the gathers raise.)"""
    batch = tuple(pivots.shape[:-1])
    iota = ltorch.arange(m, device=device)
    perm = ltorch.expand(iota, (*batch, m))
    targets = ltorch.sub(ltorch.to(pivots, torch.int64), 1)
    for i in range(k):
        j = ltorch.narrow(targets, -1, i, 1)  # (*batch, 1)
        at_i, at_j = ltorch.narrow(perm, -1, i, 1), ltorch.gather(perm, -1, j)
        perm = ltorch.where(ltorch.eq(iota, i), at_j, ltorch.where(ltorch.eq(iota, j), at_i, perm))
    return perm


@torchsymbol(torch.lu_unpack)
def lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True, *, out=None):
    """``(P, L, U)`` as eager's kernel writes them, each a new contiguous tensor: ``P[..., perm[j],
    j] = 1``; ``L`` the strictly lower part of ``LU``'s first ``k`` columns with a unit diagonal,
    ``U`` the upper part of its first ``k`` rows (``k = min(m, n)``); empty where not unpacked."""
    op = "ltorch.lu_unpack"
    require_tensor(op, LU_data, "LU_data")
    require_tensor(op, LU_pivots, "LU_pivots")
    _check_lu_unpack(op, LU_data, LU_pivots)
    m, n = LU_data.shape[-2:]
    k = min(m, n)
    device, dtype = LU_data.device, LU_data.dtype
    P = ltorch.empty((0,), dtype=dtype, device=device)
    # (L and U not unpacked are empty outputs of eager's differentiated kernel: they require grad.)
    L = U = ltorch.clone(ltorch.narrow(ltorch.flatten(LU_data), 0, 0, 0))
    if unpack_pivots:
        perm = _permutation(LU_pivots, m, k, device)
        rows = ltorch.unsqueeze(ltorch.arange(m, device=device), -1)
        P = ltorch.to(ltorch.eq(ltorch.unsqueeze(perm, -2), rows), dtype)
    if unpack_data:
        lower = ltorch.narrow(LU_data, -1, 0, k)
        row, col = ltorch.unsqueeze(ltorch.arange(m, device=device), -1), ltorch.arange(k, device=device)
        unit = ltorch.where(ltorch.eq(row, col), 1, 0)
        L = ltorch.where(ltorch.gt(row, col), lower, ltorch.to(unit, dtype))
        upper = ltorch.narrow(LU_data, -2, 0, k)
        row, col = ltorch.unsqueeze(ltorch.arange(k, device=device), -1), ltorch.arange(n, device=device)
        U = ltorch.where(ltorch.le(row, col), upper, ltorch.zeros((), dtype=dtype, device=device))
    return torch.return_types.lu_unpack((P, L, U))


# -- linalg.cond ---------------------------------------------------------------------------------------


def _check_cond_ord(op: str, ord) -> None:
    if isinstance(ord, str):
        ok = ord in ("fro", "nuc")
    else:
        ok = isinstance(ord, (int, float)) and abs(ord) in (1.0, 2.0, math.inf)
    check(ok, op, lambda: f"linalg.cond got an invalid norm type: {ord} (argument p)", ThunderValueError)


def _check_square(op: str, A, ord) -> None:
    check(
        A.shape[-1] == A.shape[-2],
        op,
        lambda: (
            f"linalg.cond(ord={ord}): A must be batches of square matrices, but they are {A.shape[-2]} by "
            f"{A.shape[-1]} matrices (argument A)"
        ),
        ThunderRuntimeError,
    )


@torchsymbol(LA.cond)
def linalg_cond(A, p=None, *, out=None):
    """Eager's composite: for 2-norms (the default) the ratio of the extreme singular values
    (``linalg_svdvals``); for ``"nuc"`` the singular values' sum times their reciprocals' sum; else
    the norm of ``A`` times that of its inverse (infinite where ``linalg_inv_ex`` finds it
    singular), NaN products of zero and infinity read as infinity; zeros for empty matrices. (The
    last raises in eager's backward: with grad wanted it is refused up front.)"""
    op = "ltorch.linalg_cond"
    require_tensor(op, A, "A")
    check(
        A.ndim >= 2,
        op,
        "linalg.cond: The input tensor must have at least 2 dimensions. (argument A)",
        ThunderRuntimeError,
    )
    ord = 2 if p is None else p
    if isinstance(ord, str):
        _check_square(op, A, ord)
    _check_cond_ord(op, ord)
    if A.numel() == 0:
        real = A.dtype.to_real() if A.dtype.is_complex else A.dtype
        return ltorch.zeros(tuple(A.shape[:-2]), dtype=real, device=A.device)
    if not isinstance(ord, str) and abs(ord) == 2.0:
        s = singular_values(A)
        s_max, s_min = ltorch.narrow(s, -1, 0, 1), ltorch.narrow(s, -1, -1, 1)
        return ltorch.squeeze(s_min / s_max if ord == -2.0 else s_max / s_min, -1)
    if ord == "nuc":
        s = singular_values(A)
        return ltorch.sum(s, -1) * ltorch.sum(ltorch.reciprocal(s), -1)
    if not isinstance(ord, str):
        _check_square(op, A, ord)
    check(
        not (torch.is_grad_enabled() and A.requires_grad),
        op,
        lambda: (
            f"eager cannot differentiate linalg.cond with ord={ord}: its kernel fills in place the inverse that "
            "linalg_inv_ex saved for its backward, which then raises; detach A or use ord=2 (argument A)"
        ),
        ThunderRuntimeError,
    )
    inverse, info = ltorch.linalg_inv_ex(A)
    inverse = ltorch.masked_fill(inverse, ltorch.unsqueeze(ltorch.unsqueeze(info, -1), -1) > 0, math.inf)
    product = ltorch.linalg_matrix_norm(A, ord) * ltorch.linalg_matrix_norm(inverse, ord)
    return ltorch.nan_to_num(product, math.inf, math.inf, -math.inf)


def svd_as_eager(input, some=True, compute_uv=True, *, out=None):
    """``torch.svd`` as eager computes it: with ``compute_uv=False`` eager takes the singular values
    from ``linalg.svdvals``, which computes them with the vectors where ``input`` requires grad (and
    LAPACK's values then differ in their last bits), so they are ``singular_values``'s; U and V are
    still the zeros of the opaque call."""
    kwargs = {} if out is None else {"out": out}
    differentiated = torch.is_grad_enabled() and input.requires_grad
    if compute_uv and out is None and differentiated:
        # eager's ``linalg_svd`` and ``V = Vh.mH``, a view: its node saves Vh, laid out as LAPACK
        # wrote it, which the backward reads (of the opaque torch.svd, V: another layout, and for
        # a wide input another shape)
        U, S, Vh = ltorch.linalg_svd(input, full_matrices=not some)
        return torch.return_types.svd((U, S, Vh.mH))
    if compute_uv or out is not None or not differentiated:
        return ltorch.svd(input, some, compute_uv, **kwargs)
    U, _, V = ltorch.svd(input, some, compute_uv)
    return U, singular_values(input), V


#: (a complex input's backward is eager's formula: ``factorization_backwards.COMPLEX``)
svd_as_eager.complex_grads = True  # type: ignore[attr-defined]
TORCH_TO_LTORCH[torch.svd] = TORCH_TO_LTORCH[torch.Tensor.svd] = svd_as_eager
