"""Opaque linear algebra: factorizations, solvers, inverses and determinants, run whole by torch.

Inputs are well conditioned (diagonally dominant, or symmetric positive definite where the op
needs it), so that eager's and thunder_rs's float64 gradients agree; samples cover batches, an
empty batch, a transposed layout and the ops' keyword variants.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch

from .core import ACCUMULATING, ErrorInput, OpInfo, SampleInput, cpu, make

LA = torch.linalg


def general(shape, dtype, device, *, transposed=False):
    """A diagonally dominant (so invertible, well-conditioned) batch of square matrices."""
    n = shape[-1]
    a = make(shape, dtype, device, low=-1, high=1) + n * torch.eye(n, dtype=dtype, device=device)
    return a.mT.contiguous().mT if transposed else a


def spd(shape, dtype, device):
    """A batch of symmetric positive definite matrices."""
    a = make(shape, dtype, device, low=-1, high=1)
    return a @ a.mT + shape[-1] * torch.eye(shape[-1], dtype=dtype, device=device)


def rect(shape, dtype, device):
    return make(shape, dtype, device, low=-1, high=1)


def upper(shape, dtype, device):
    return general(shape, dtype, device).triu()


def square_samples(make_matrix: Callable = general, **kwargs) -> Callable:
    """One square matrix, a batch, an empty batch and a transposed layout."""

    def generate(dtype, device) -> Iterable[SampleInput]:
        yield SampleInput(make_matrix((3, 3), dtype, device), **kwargs)
        yield SampleInput(make_matrix((2, 4, 4), dtype, device), **kwargs)
        yield SampleInput(make_matrix((0, 3, 3), dtype, device), **kwargs)
        yield SampleInput(make_matrix((3, 3), dtype, device).mT, **kwargs)

    return generate


def rect_samples(**kwargs) -> Callable:
    def generate(dtype, device) -> Iterable[SampleInput]:
        for shape in ((4, 3), (3, 4), (2, 3, 3), (0, 2, 3)):
            yield SampleInput(rect(shape, dtype, device), **kwargs)
        yield SampleInput(rect((4, 3), dtype, device).mT, **kwargs)

    return generate


def solve_samples(dtype, device) -> Iterable[SampleInput]:
    yield SampleInput(general((3, 3), dtype, device), rect((3, 2), dtype, device))
    yield SampleInput(general((2, 3, 3), dtype, device), rect((3,), dtype, device))
    yield SampleInput(general((2, 3, 3), dtype, device), rect((1, 3, 4), dtype, device))
    yield SampleInput(general((3, 3), dtype, device), rect((2, 3), dtype, device), left=False)
    yield SampleInput(general((3, 3), dtype, device, transposed=True), rect((3, 0), dtype, device))


def lstsq_samples(dtype, device) -> Iterable[SampleInput]:
    yield SampleInput(rect((5, 3), dtype, device), rect((5, 2), dtype, device))
    yield SampleInput(rect((2, 4, 3), dtype, device), rect((2, 4), dtype, device))
    yield SampleInput(rect((1, 4, 3), dtype, device), rect((2, 4, 1), dtype, device))
    yield SampleInput(rect((3, 4), dtype, device).mT, rect((4, 2), dtype, device), driver="gelsy")
    yield SampleInput(rect((1, 5, 3), dtype, device), rect((2, 5, 2), dtype, device), driver="gels")
    yield SampleInput(rect((5, 3), dtype, device), rect((5,), dtype, device), driver="gels")
    yield SampleInput(rect((3, 5), dtype, device), rect((3, 2), dtype, device), driver="gels")


def triangular_samples(dtype, device) -> Iterable[SampleInput]:
    yield SampleInput(upper((3, 3), dtype, device), rect((3, 2), dtype, device), upper=True)
    yield SampleInput(upper((3, 3), dtype, device).mT, rect((2, 3, 2), dtype, device), upper=False)
    yield SampleInput(upper((3, 3), dtype, device), rect((2, 3), dtype, device), upper=True, left=False)
    yield SampleInput(upper((3, 3), dtype, device), rect((3, 2), dtype, device), upper=True, unitriangular=True)


def triangular_solve_samples(dtype, device) -> Iterable[SampleInput]:
    yield SampleInput(rect((3, 2), dtype, device), upper((3, 3), dtype, device))
    yield SampleInput(rect((2, 3, 2), dtype, device), upper((3, 3), dtype, device).mT, upper=False, transpose=True)


def cholesky_solve_samples(dtype, device) -> Iterable[SampleInput]:
    factor = LA.cholesky(spd((3, 3), dtype, device))
    yield SampleInput(rect((3, 2), dtype, device), factor)
    yield SampleInput(rect((2, 3, 1), dtype, device), factor.mT, upper=True)


def cholesky_inverse_samples(dtype, device) -> Iterable[SampleInput]:
    factor = LA.cholesky(spd((3, 3), dtype, device))
    yield SampleInput(factor)
    yield SampleInput(factor.mT, upper=True)
    yield SampleInput(LA.cholesky(spd((2, 4, 4), dtype, device)))


def householder_samples(dtype, device) -> Iterable[SampleInput]:
    for shape in ((4, 3), (2, 3, 3)):
        a, tau = torch.geqrf(rect(shape, dtype, device))
        yield SampleInput(a, tau)


def ormqr_samples(dtype, device) -> Iterable[SampleInput]:
    a, tau = torch.geqrf(rect((4, 3), dtype, device))
    yield SampleInput(a, tau, rect((4, 2), dtype, device))
    yield SampleInput(a, tau, rect((2, 4), dtype, device), left=False, transpose=True)


def lu_solve_samples(dtype, device) -> Iterable[SampleInput]:
    lu, pivots = LA.lu_factor(general((2, 3, 3), dtype, device))
    yield SampleInput(lu, pivots, rect((2, 3, 2), dtype, device))
    yield SampleInput(lu, pivots, rect((2, 2, 3), dtype, device), left=False)
    yield SampleInput(lu, pivots, rect((2, 3, 1), dtype, device), adjoint=True)


def torch_lu_solve_samples(dtype, device) -> Iterable[SampleInput]:
    lu, pivots = LA.lu_factor(general((2, 3, 3), dtype, device))
    yield SampleInput(rect((2, 3, 2), dtype, device), lu, pivots)


def ldl_solve_samples(dtype, device) -> Iterable[SampleInput]:
    ld, pivots = LA.ldl_factor(spd((3, 3), dtype, device))
    yield SampleInput(ld, pivots, rect((3, 2), dtype, device))


def int_and_vector_errors(integer_error: type[Exception] = NotImplementedError) -> Callable[[], Iterable[ErrorInput]]:
    """An integer matrix and a vector: every op here takes floating matrices."""

    def errors() -> Iterable[ErrorInput]:
        yield ErrorInput(SampleInput(cpu((3, 3), torch.int64)), integer_error)
        yield ErrorInput(SampleInput(cpu((3,))), RuntimeError)

    return errors


def square_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4))), RuntimeError)
    yield from int_and_vector_errors()()


def square_errors_any() -> Iterable[ErrorInput]:
    """As ``square_errors``, for ops that reject an integer matrix with a RuntimeError."""
    yield ErrorInput(SampleInput(cpu((3, 4))), RuntimeError)
    yield from int_and_vector_errors(RuntimeError)()


def polar_samples(dtype, device) -> Iterable[SampleInput]:
    """Square, tall, batched and transposed matrices (polar takes at least as many rows as columns)."""
    for shape in ((3, 3), (5, 3), (2, 4, 4), (0, 3, 2)):
        yield SampleInput(general(shape, dtype, device) if shape[-1] == shape[-2] else rect(shape, dtype, device))
    yield SampleInput(general((4, 4), dtype, device).mT)


def polar_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4))), RuntimeError)
    yield from int_and_vector_errors()()


def solve_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((3, 2))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 3)), cpu((4, 2))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 3)), cpu((3, 2), torch.float64)), RuntimeError)


def lstsq_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((5, 3)), cpu((4, 2))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((5, 3)), cpu((5, 2), torch.float64)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((5,)), cpu((5,))), RuntimeError)


def tensorinv_samples(dtype, device) -> Iterable[SampleInput]:
    """Invertible matrices viewed as tensors of other shapes (split at ``ind``), one transposed."""
    yield SampleInput(general((6, 6), dtype, device).reshape(6, 2, 3), ind=1)
    yield SampleInput(general((6, 6), dtype, device).reshape(2, 3, 2, 3))
    yield SampleInput(general((6, 6), dtype, device, transposed=True).reshape(6, 2, 3), ind=1)


def tensorsolve_samples(dtype, device) -> Iterable[SampleInput]:
    """Systems whose matrix is an invertible one reshaped, with its dims moved for ``dims``."""
    yield SampleInput(general((6, 6), dtype, device).reshape(2, 3, 6), make((2, 3), dtype, device))
    yield SampleInput(general((4, 4), dtype, device).mT, make((4,), dtype, device))
    moved = general((6, 6), dtype, device).reshape(3, 2, 2, 3)
    yield SampleInput(torch.movedim(moved, (2, 3), (0, 2)), make((3, 2), dtype, device), dims=(0, 2))


def lu_unpack_samples(dtype, device) -> Iterable[SampleInput]:
    """Factorizations of square, wide, tall and batched matrices (their pivots swap rows)."""
    for shape in ((4, 4), (3, 5), (2, 5, 3), (0, 3, 3)):
        LU, pivots = LA.lu_factor(rect(shape, dtype, device))
        yield SampleInput(LU, pivots)
    LU, pivots = LA.lu_factor(general((4, 4), dtype, device))
    yield SampleInput(LU, pivots, unpack_pivots=False)
    yield SampleInput(LU, pivots, unpack_data=False)


def lu_unpack_errors() -> Iterable[ErrorInput]:
    LU, pivots = LA.lu_factor(cpu((3, 3)))
    yield ErrorInput(SampleInput(LU, pivots.long()), RuntimeError)
    yield ErrorInput(SampleInput(LU, pivots[:2]), ValueError)
    yield ErrorInput(SampleInput(LU, pivots + 5), RuntimeError)  # out of range, read from the data


def cond_samples(dtype, device) -> Iterable[SampleInput]:
    """Every norm order, on square, batched, transposed and (for 2-norms) rectangular matrices."""
    for p in (None, 2, -2, "nuc"):
        yield SampleInput(general((2, 4, 4), dtype, device), p)
    yield SampleInput(rect((3, 5), dtype, device), -2)
    yield SampleInput(general((0, 3, 3), dtype, device), 1)


def cond_inverse_samples(dtype, device) -> Iterable[SampleInput]:
    """The orders through the inverse (eager cannot differentiate them: no gradient is asked)."""
    for p in (1, -1, math.inf, -math.inf, "fro"):
        yield SampleInput(general((3, 3), dtype, device, transposed=True), p)


def cond_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 1), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 3)), 3), ValueError)
    yield ErrorInput(SampleInput(cpu((3, 3)), "abc"), ValueError)


def tensor_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((2, 3, 5)), ind=2), RuntimeError)
    yield ErrorInput(SampleInput(cpu((6, 2, 3)), ind=0), RuntimeError)


def opaque(name, fn, samples, errors=int_and_vector_errors(), **options) -> OpInfo:
    return OpInfo(name, fn, samples, errors, tolerances=ACCUMULATING, **options)


OPS = [
    opaque("linalg_solve", LA.solve, solve_samples, solve_errors),
    opaque("linalg_solve_ex", LA.solve_ex, solve_samples, solve_errors),
    opaque("linalg_lstsq", LA.lstsq, lstsq_samples, lstsq_errors),
    opaque("linalg_svd", LA.svd, rect_samples(full_matrices=False)),
    opaque("linalg_svd", LA.svd, square_samples(), variant="full"),
    opaque("linalg_svdvals", LA.svdvals, rect_samples()),
    opaque("svd", torch.svd, rect_samples()),
    opaque("svd", torch.svd, rect_samples(compute_uv=False), variant="values"),
    opaque("linalg_qr", LA.qr, rect_samples()),
    opaque("linalg_qr", LA.qr, rect_samples(mode="r"), variant="r"),
    opaque("linalg_qr", LA.qr, square_samples(mode="complete"), variant="complete"),
    opaque("geqrf", torch.geqrf, rect_samples()),
    opaque("ormqr", torch.ormqr, ormqr_samples, lambda: ()),
    opaque("linalg_householder_product", LA.householder_product, householder_samples, lambda: ()),
    opaque("orgqr", torch.orgqr, householder_samples, lambda: ()),
    opaque("linalg_eigh", LA.eigh, square_samples(spd), square_errors),
    opaque("linalg_eigh", LA.eigh, square_samples(spd, UPLO="U"), variant="upper"),
    opaque("linalg_eigvalsh", LA.eigvalsh, square_samples(spd), square_errors),
    opaque("linalg_cholesky", LA.cholesky, square_samples(spd), square_errors),
    opaque("linalg_cholesky", LA.cholesky, square_samples(spd, upper=True), variant="upper"),
    opaque("linalg_cholesky_ex", LA.cholesky_ex, square_samples(spd), square_errors),
    opaque("cholesky_solve", torch.cholesky_solve, cholesky_solve_samples, lambda: ()),
    opaque("cholesky_inverse", torch.cholesky_inverse, cholesky_inverse_samples, int_and_vector_errors()),
    opaque("linalg_pinv", LA.pinv, rect_samples(), int_and_vector_errors(RuntimeError)),
    opaque("linalg_pinv", LA.pinv, square_samples(spd, hermitian=True), lambda: (), variant="hermitian"),
    opaque("linalg_pinv", LA.pinv, rect_samples(rtol=0.1), lambda: (), variant="rtol"),
    opaque("pinverse", torch.pinverse, rect_samples(), int_and_vector_errors(RuntimeError)),
    opaque("linalg_matrix_rank", LA.matrix_rank, rect_samples(), int_and_vector_errors(RuntimeError)),
    opaque("linalg_matrix_rank", LA.matrix_rank, square_samples(spd, hermitian=True), lambda: (), variant="hermitian"),
    opaque("linalg_det", LA.det, square_samples(), square_errors),
    opaque("det", torch.det, square_samples(), square_errors),
    opaque("linalg_slogdet", LA.slogdet, square_samples(), square_errors),
    opaque("slogdet", torch.slogdet, square_samples(), square_errors),
    opaque("logdet", torch.logdet, square_samples(spd), square_errors),
    opaque("linalg_inv", LA.inv, square_samples(), square_errors),
    opaque("inverse", torch.inverse, square_samples(), square_errors),
    opaque("linalg_inv_ex", LA.inv_ex, square_samples(), square_errors),
    opaque("linalg_solve_triangular", LA.solve_triangular, triangular_samples, lambda: ()),
    opaque("triangular_solve", torch.triangular_solve, triangular_solve_samples, lambda: ()),
    opaque("linalg_lu_factor", LA.lu_factor, square_samples(), int_and_vector_errors()),
    opaque("linalg_lu_factor_ex", LA.lu_factor_ex, square_samples(), int_and_vector_errors()),
    opaque("linalg_lu", LA.lu, rect_samples(), int_and_vector_errors()),
    opaque("linalg_lu", LA.lu, rect_samples(pivot=True), variant="pivot"),
    opaque("lu", torch.lu, square_samples()),
    opaque("linalg_lu_solve", LA.lu_solve, lu_solve_samples, lambda: ()),
    opaque("lu_solve", torch.lu_solve, torch_lu_solve_samples, lambda: ()),
    opaque("linalg_ldl_factor", LA.ldl_factor, square_samples(spd), square_errors),
    opaque("linalg_ldl_factor_ex", LA.ldl_factor_ex, square_samples(spd), square_errors),
    opaque("linalg_ldl_solve", LA.ldl_solve, ldl_solve_samples, lambda: ()),
    opaque("linalg_matrix_exp", LA.matrix_exp, square_samples(), square_errors),
    opaque("matrix_exp", torch.matrix_exp, square_samples(), square_errors),
    opaque("linalg_matrix_sqrth", LA.matrix_sqrth, square_samples(spd), square_errors),
    opaque("linalg_polar", LA.polar, polar_samples, polar_errors),
    opaque("linalg_eig", LA.eig, square_samples(), square_errors_any),
    opaque("linalg_eigvals", LA.eigvals, square_samples(), square_errors_any),
    opaque("linalg_tensorinv", LA.tensorinv, tensorinv_samples, tensor_errors),
    opaque("linalg_tensorsolve", LA.tensorsolve, tensorsolve_samples, lambda: ()),
    opaque("lu_unpack", torch.lu_unpack, lu_unpack_samples, lu_unpack_errors),
    opaque("linalg_cond", LA.cond, cond_samples, cond_errors),
    opaque("linalg_cond", LA.cond, cond_inverse_samples, variant="inverse", supports_grad=False),
]
