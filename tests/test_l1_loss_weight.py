"""``F.l1_loss(input, target, weight=w)``: torch's ``__torch_function__`` call of ``l1_loss`` leaves
the weight out (it passes it among the tensors it dispatches on, not among the arguments), so the
trace computed the unweighted loss: a silently different value and no gradient for the weight.
The weight is read from the running call's frame; values and gradients are eager's."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.functional import l1_loss

import thunder_rs

CAPTURED = torch.rand(4, 5, dtype=torch.float64) + 0.1


@pytest.mark.parametrize(
    "loss",
    [
        lambda x, t, w: F.l1_loss(x, t, weight=w),
        lambda x, t, w: F.l1_loss(x, t, reduction="sum", weight=w),
        lambda x, t, w: l1_loss(x, t, None, None, "none", w),  # positional, through a name imported early
        lambda x, t, w: F.l1_loss(x, t, weight=CAPTURED) * w.sum(),  # a weight the program captures
        lambda x, t, w: F.l1_loss(x, t),
    ],
    ids=["keyword", "sum", "positional", "captured", "unweighted"],
)
def test_weighted_l1_loss_values_and_gradients_are_eagers(loss):
    x, t = torch.randn(4, 5, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    w = torch.rand(4, 5, dtype=torch.float64) + 0.1
    jloss = thunder_rs.jit(loss)
    torch.testing.assert_close(jloss(x, t, w), loss(x, t, w))
    leaves = [x.clone().requires_grad_(), t, w.clone().requires_grad_()]
    out, expected = jloss(*leaves), loss(*leaves)
    torch.testing.assert_close(out, expected)
    cotangent = torch.randn_like(expected)
    grads = torch.autograd.grad(out, (leaves[0], leaves[2]), cotangent, allow_unused=True, materialize_grads=True)
    expected_grads = torch.autograd.grad(
        expected, (leaves[0], leaves[2]), cotangent, allow_unused=True, materialize_grads=True
    )
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e)
