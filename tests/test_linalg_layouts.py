"""Strides of linear-algebra results, as the program's ``stride()`` sees them in the trace, against
eager's: LAPACK writes matrices column-major (eigenvectors, factors, solutions), while the vectors
a factorization returns beside them (eigenvalues, pivots, Householder scalars, ``info``) stay
contiguous however many batch dims they have; complex inputs are laid out as real ones. Products
with such a result differentiate by the forms eager's mm backward picks for its layout, so the
gradients are compared bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import thunder_rs

LA = torch.linalg


def _strides(result) -> tuple:
    if isinstance(result, torch.Tensor):
        return result.stride()
    return tuple(_strides(r) for r in result)


def _both(fn: Callable, *args):
    """``fn``'s result and the strides its program saw, eager's and the trace's."""

    def program(*a):
        out = fn(*a)
        return out, _strides(out)

    return program(*args), thunder_rs.jit(program)(*args)


def _matrix(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def _positive_definite(*shape, dtype=torch.float64):
    a = _matrix(*shape, dtype=dtype)
    return a @ a.mT.conj() + shape[-1] * torch.eye(shape[-1], dtype=dtype)


def _grads_equal(fn: Callable, inputs: tuple, weight: torch.Tensor):
    """Strides seen and gradients of ``(weight @ fn(*inputs)).abs().sum()``, eager's and the
    trace's, asserted equal (the loss is gauge-invariant: eigenvectors' phases cancel in ``abs``)."""

    def program(*a):
        out = fn(*a)
        product = weight @ out if out.ndim >= 2 else weight[0, : out.shape[-1]] * out
        return product.abs().sum(), out.stride()

    runs = []
    for run in (program, thunder_rs.jit(program)):
        leaves = tuple(t.detach().clone().requires_grad_() for t in inputs)
        loss, strides = run(*leaves)
        runs.append((loss, strides, torch.autograd.grad(loss, leaves)))
    (eager_loss, eager_strides, eager_grads), (loss, strides, grads) = runs
    assert strides == eager_strides
    assert torch.equal(loss, eager_loss)
    for grad, eager in zip(grads, eager_grads, strict=True):
        assert grad.stride() == eager.stride() and torch.equal(grad, eager)
    return eager_strides


@pytest.mark.parametrize("shape", [(4, 4), (2, 4, 4)], ids=["matrix", "batched"])
def test_eig_eigenvectors_are_column_major_and_differentiate_as_eager(shape):
    strides = _grads_equal(lambda a: LA.eig(a).eigenvectors, (_matrix(*shape),), _matrix(3, 4, dtype=torch.complex128))
    assert strides[-2:] == (1, 4)


@pytest.mark.parametrize(
    "shape, ind, dtype, rows",
    [((5, 5), 1, torch.float64, 5), ((2, 3, 6), 2, torch.float64, 2), ((5, 5), 1, torch.complex128, 5)],
    ids=["matrix", "split", "complex"],
)
def test_tensorinv_is_a_view_of_a_column_major_inverse_as_eager(shape, ind, dtype, rows):
    """Eager's composite reshapes ``inv``'s column-major result back: a view, not a contiguous copy."""
    _grads_equal(lambda a: LA.tensorinv(a, ind=ind), (_matrix(*shape, dtype=dtype),), _matrix(3, rows, dtype=dtype))


@pytest.mark.parametrize(
    "a_shape, b_shape, dtype",
    [
        ((5, 3), (5, 2), torch.float64),
        ((3, 5), (3, 2), torch.float32),
        ((2, 5, 3), (2, 5, 2), torch.float64),
        ((2, 5, 3), (2, 5), torch.float64),
        ((5, 3), (5, 2), torch.complex128),
    ],
    ids=["tall", "wide", "batched", "vector", "complex"],
)
def test_lstsq_solution_is_laid_out_as_lapacks_column_major_rhs(a_shape, b_shape, dtype):
    """gelsy solves in place of a column-major ``B`` of ``max(m, n)`` rows: the solution is its
    first ``n`` rows (for a tall ``A``, not dense), a vector's that of a column."""
    a, b = _matrix(*a_shape, dtype=dtype), _matrix(*b_shape, dtype=dtype, seed=1)
    rows = LA.lstsq(a, b).solution.shape[-2]  # (the batch of a batched vector's solutions)
    _grads_equal(lambda a, b: LA.lstsq(a, b).solution, (a, b), _matrix(3, rows, dtype=dtype, seed=2))
    (_, eager_strides), (_, strides) = _both(LA.lstsq, a, b)
    assert strides == eager_strides


def _square(shape, dtype):
    return (_matrix(*shape, dtype=dtype),)


def _definite(shape, dtype):
    return (_positive_definite(*shape, dtype=dtype),)


def _triangular(shape, dtype):
    a = _matrix(*shape, dtype=dtype).triu() + 4 * torch.eye(shape[-1], dtype=dtype)
    return a, _matrix(*shape, dtype=dtype, seed=1)


#: name -> (the call, its inputs of a shape and dtype, the shape)
FACTORIZATIONS: dict[str, tuple[Callable, Callable, tuple]] = {
    "eig": (LA.eig, _square, (3, 2, 4, 4)),
    "eigh": (LA.eigh, _definite, (3, 2, 4, 4)),
    "svd": (LA.svd, _square, (3, 2, 5, 3)),
    "qr": (LA.qr, _square, (2, 5, 3)),
    "geqrf": (torch.geqrf, _square, (3, 2, 3, 5)),
    "lu_factor": (LA.lu_factor, _square, (3, 2, 4, 4)),
    "lu_factor_ex": (LA.lu_factor_ex, _square, (3, 2, 4, 4)),
    "lu": (lambda a: torch.lu(a, get_infos=True), _square, (3, 2, 4, 4)),
    "ldl_factor_ex": (LA.ldl_factor_ex, _definite, (3, 2, 4, 4)),
    "inv_ex": (LA.inv_ex, _square, (3, 2, 4, 4)),
    "cholesky_ex": (LA.cholesky_ex, _definite, (3, 2, 4, 4)),
    "solve_ex": (lambda a: LA.solve_ex(a, a), _square, (3, 2, 4, 4)),
    "triangular_solve": (lambda a, b: torch.triangular_solve(b, a), _triangular, (2, 4, 4)),
    "solve_triangular": (lambda a, b: LA.solve_triangular(a, b, upper=True), _triangular, (2, 4, 4)),
    "cholesky_inverse": (lambda a: torch.cholesky_inverse(LA.cholesky(a)), _definite, (4, 4)),
}


@pytest.mark.filterwarnings("ignore:torch.triangular_solve is deprecated", "ignore:torch.lu is deprecated")
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=["real", "complex"])
@pytest.mark.parametrize("name", list(FACTORIZATIONS))
def test_factorizations_lay_out_matrices_and_vectors_as_eager(name: str, dtype):
    """The matrices column-major, the vectors beside them contiguous (a batched eigenvalue or
    pivot vector was taken for a matrix); complex inputs as real ones (they were left contiguous)."""
    call, make, shape = FACTORIZATIONS[name]
    inputs = make(shape, dtype)
    (eager, eager_strides), (out, strides) = _both(call, *inputs)
    assert strides == eager_strides
    for value, eager_value in zip(torch.utils._pytree.tree_leaves(out), torch.utils._pytree.tree_leaves(eager)):
        assert value.stride() == eager_value.stride() and torch.equal(value, eager_value)


def test_a_complex_pointwise_result_keeps_its_inputs_order_as_a_real_ones_does():
    z = _matrix(4, 4, dtype=torch.complex128)
    (_, eager_strides), (out, strides) = _both(lambda z: z.t().exp(), z)
    assert strides == eager_strides == (1, 4)


@pytest.mark.parametrize("n", [-1, -2, -3])
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=["real", "complex"])
def test_a_negative_matrix_power_multiplies_the_column_major_inverse_as_eager(n: int, dtype):
    """``matrix_power(A, -1)`` is the inverse itself (column-major); higher negative powers
    multiply it, whose gradients eager's mm backward lays out by its layout."""
    a = _matrix(2, 4, 4, dtype=dtype)
    strides = _grads_equal(lambda a: LA.matrix_power(a, n), (a,), _matrix(3, 4, dtype=dtype, seed=1))
    assert strides == LA.matrix_power(a, n).stride()
