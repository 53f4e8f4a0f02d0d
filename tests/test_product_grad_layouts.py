"""Gradients of ``torch.tensordot`` and ``torch.einsum`` compared with eager's: values, and strides,
the strides of dims of size 1 too (``torch.autograd.grad`` hands them on as the backward made them).

What differed: ``tensordot`` to one element of operands that, permuted, are not both contiguous
(``tensordot(a, b, ([1, 0], [1, 0]))`` of matrices) is eager's sum of their elementwise product
(each operand permuted and squeezed), not a dot product: the gradients were laid out as the dot
product's (row-major where eager's follow the permuted operands), and the forward rounded as a
dot product does."""

import pytest
import torch

import thunder_rs

#: (shapes of a and b, dims): eager takes a dot product, a sum of a product, or a matrix product
TENSORDOTS = [
    (((1, 4), (4, 1)), 1),
    (((2, 2, 1), (2, 1, 2)), ([0, 1], [2, 0])),
    (((2, 2, 1), (2, 2, 1)), ([0, 1], [0, 1])),
    (((2, 2), (2, 2)), ([1, 0], [1, 0])),
    (((2, 2), (2, 2)), ([1, 0], [0, 1])),
    (((3, 2), (2, 3)), ([0, 1], [1, 0])),
    (((2, 3), (3, 2)), ([0, 1], [1, 0])),
    (((1, 2, 2), (2, 2)), ([1, 2], [0, 1])),
    (((2, 1, 3), (3, 1)), ([2, 1], [0, 1])),
    (((2, 3), (3, 4)), ([1], [0])),
    (((3, 2), (3, 4)), ([0], [0])),
    (((2, 3, 4), (4, 3)), ([1, 2], [1, 0])),
]


def _compare(fn, *shapes, dtype=torch.float64, take=lambda t: t):
    """``fn``'s outputs and gradients, eager's and compiled, compared value and stride."""
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(s, dtype=dtype, generator=gen).requires_grad_() for s in shapes]
    sides = []
    for call in (fn, thunder_rs.jit(fn)):
        out = call(*(take(t) for t in inputs))
        cot = torch.randn(out.shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
        grads = torch.autograd.grad(out, inputs, cot)
        sides.append((out, grads))
    (expected, eager_grads), (got, grads) = sides
    assert torch.equal(got, expected) and got.stride() == expected.stride()
    for g, e in zip(grads, eager_grads):
        assert torch.equal(g, e)
        assert g.stride() == e.stride(), ([t.stride() for t in grads], [t.stride() for t in eager_grads])


#: (equation, operand shapes)
EINSUMS = [
    ("aij,ajk->aik", (1, 2, 3), (1, 3, 4)),
    ("ij,kj->ik", (2, 3), (1, 3)),
    ("aij,jk->aik", (1, 3, 4), (4, 4)),
    ("ijk,ik->j", (1, 2, 3), (1, 3)),
    ("...ik, ...j -> ij", (1, 2, 3), (3,)),
    ("bij,bjk->bik", (2, 3, 4), (2, 4, 5)),
    ("ki,kj->ij", (1, 2), (1, 3)),
    ("ij,jk", (2, 1), (1, 3)),
    ("i,j->ij", (3,), (1,)),
    ("ij,jk,kl->il", (2, 3), (3, 1), (1, 4)),
    ("bn,anm,bm->ba", (2, 3), (4, 3, 5), (2, 5)),
    ("iij->j", (3, 3, 2)),
    ("ij->", (2, 3)),
    ("bij,bkj->bki", (1, 2, 3), (1, 4, 3)),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", EINSUMS, ids=[c[0] for c in EINSUMS])
def test_einsum_gradients_are_eagers(case, dtype):
    equation, *shapes = case
    _compare(lambda *ops: torch.einsum(equation, *ops), *shapes, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shapes, dims", TENSORDOTS, ids=[f"{s}-{d}" for s, d in TENSORDOTS])
def test_tensordot_gradients_are_eagers(shapes, dims, dtype):
    _compare(lambda a, b: torch.tensordot(a, b, dims=dims), *shapes, dtype=dtype)


def test_tensordot_of_a_strided_operand_to_one_element_is_eagers():
    """A slice with a stride of 2 is not contiguous though it flattens: eager's product and sum."""
    _compare(lambda a, b: torch.tensordot(a[:, ::2], b, dims=([0, 1], [0, 1])), (2, 4), (2, 2))
