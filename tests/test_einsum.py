"""torch.einsum differentiated through its decomposition (what runs when an operand requires grad)
computes what eager's ``at::einsum`` computes, bit for bit: the same operand order in each batched
product (eager swaps them where the output lists the right one's dims first), the same dims summed
inside the product or before it (a dim of size 1 is broadcast, not contracted), the same layout of
the result; and the gradients of those ops are eager's."""

import pytest
import torch

import thunder_rs

pytestmark = pytest.mark.usefixtures("one_thread")

CASES = [
    ("bij,bcj->bci", (3, 16, 16), (3, 8, 16)),  # attention's weighted values: the operands swapped
    ("bci,bcj->bij", (3, 8, 16), (3, 8, 16)),
    ("bhqk,bhkd->bqhd", (2, 3, 5, 6), (2, 3, 6, 4)),
    ("ij,jk->ki", (5, 6), (6, 7)),
    ("abk,kcd->dcba", (2, 3, 7), (7, 4, 5)),
    ("ij,ij->i", (3, 1), (3, 4)),  # j of size 1 on the left: summed on the right, then multiplied
    ("ijk,jk->ik", (3, 4, 5), (4, 1)),
    ("bij,bjk->bik", (1, 3, 4), (2, 4, 5)),
    ("ij,jk,kl->il", (3, 1), (4, 5), (5, 2)),
    ("i,j->ji", (5,), (6,)),  # nothing summed: a broadcast product
    ("ab,cd->cdab", (2, 3), (4, 5)),
    ("zAb,bz->Ab", (2, 3, 4), (4, 2)),
    ("...ij,...jk->...ik", (2, 3, 4), (4, 5)),
    ("iij->j", (2, 2, 3)),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_einsum_and_its_gradients_are_eagers_bit_for_bit(case, dtype):
    equation, *shapes = case
    torch.manual_seed(0)
    operands = [torch.randn(s, dtype=dtype, requires_grad=True) for s in shapes]
    copies = [x.detach().clone().requires_grad_() for x in operands]

    def program(*xs):
        return torch.einsum(equation, *xs)

    expected, out = program(*operands), thunder_rs.jit(program)(*copies)
    grad = torch.randn_like(expected)
    expected.backward(grad)
    out.backward(grad)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert out.stride() == expected.stride()
    for i, (x, y) in enumerate(zip(operands, copies)):
        torch.testing.assert_close(y.grad, x.grad, rtol=0, atol=0, msg=lambda m: f"operand {i}: {m}")
