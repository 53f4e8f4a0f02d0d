"""Losses of operands of different dtypes have eager's dtype, which ATen's in-place steps decide:
``binary_cross_entropy_with_logits`` computes ``(1 - target).mul_(input).sub_(log_sigmoid)``, so its
loss has the target's dtype (float32 for a float64 input and a float32 target). The trace told
float64, and nvFuser's regions (which run the decomposition) computed it."""

import itertools

import pytest
import torch
import torch.nn.functional as F

import thunder_rs

DTYPES = (torch.float32, torch.float64, torch.bfloat16)


def _bce(weighted: bool, pos_weighted: bool, weight_dtype):
    weight = torch.linspace(0.5, 1.5, 4, dtype=weight_dtype)

    def program(x, t):
        loss = F.binary_cross_entropy_with_logits(
            x, t, weight=weight if weighted else None, pos_weight=weight * 2 if pos_weighted else None
        )
        return loss, str(loss.dtype)

    return program


@pytest.mark.parametrize("executor", ["torch", "nvfuser"])
@pytest.mark.parametrize(
    "input_dtype, target_dtype", [(a, b) for a, b in itertools.product(DTYPES, DTYPES[:2]) if a != b]
)
@pytest.mark.parametrize("weights", ["none", "weight", "pos_weight"])
def test_bce_with_logits_of_mixed_dtypes_is_eagers(input_dtype, target_dtype, weights, executor, fake_ex):
    program = _bce(weights == "weight", weights == "pos_weight", torch.float64)
    x = torch.randn(3, 4, dtype=input_dtype, requires_grad=True)
    t = (torch.rand(3, 4) > 0.5).to(target_dtype)
    jfn = thunder_rs.jit(program, executors=[] if executor == "torch" else [fake_ex])
    (loss, told), (expected, expected_told) = jfn(x, t), program(x, t)
    assert (loss.dtype, told) == (expected.dtype, expected_told)
    tol = {"atol": 1e-2, "rtol": 1e-2} if torch.bfloat16 in (input_dtype, target_dtype) else {}
    torch.testing.assert_close(loss, expected, **tol)
    (grad,), (expected_grad,) = torch.autograd.grad(loss, x), torch.autograd.grad(expected, x)
    assert grad.dtype == expected_grad.dtype
    torch.testing.assert_close(grad, expected_grad, **tol)


#: name -> loss of an input and a target of other dtypes: eager's dtype is the common one, or the
#: input's where ATen writes into a tensor like the input (huber: ``empty_like(input)``; soft margin:
#: ``neg_out(output, input).mul_(target)``).
LOSSES = {
    "mse_loss": lambda x, t: F.mse_loss(x, t),
    "l1_loss": lambda x, t: F.l1_loss(x, t),
    "smooth_l1_loss": lambda x, t: F.smooth_l1_loss(x, t),
    "huber_loss": lambda x, t: F.huber_loss(x, t),
    "huber_loss (none)": lambda x, t: F.huber_loss(x, t, reduction="none"),
    "soft_margin_loss": lambda x, t: F.soft_margin_loss(x, t.sign()),
    "cosine_embedding_loss": lambda x, t: F.cosine_embedding_loss(x, t, torch.ones(3)),
    "kl_div": lambda x, t: F.kl_div(x, t.abs(), reduction="batchmean"),
    "cross_entropy of probabilities": lambda x, t: F.cross_entropy(x, t.softmax(1)),
    "triplet_margin_loss": lambda x, t: F.triplet_margin_loss(x, t, t * 2),
}


@pytest.mark.parametrize("input_dtype, target_dtype", [(a, b) for a, b in itertools.permutations(DTYPES, 2)])
@pytest.mark.parametrize("name", list(LOSSES))
def test_losses_of_two_dtypes_are_eagers(name, input_dtype, target_dtype):
    loss_fn = LOSSES[name]

    def program(x, t):
        loss = loss_fn(x, t)
        return loss, str(loss.dtype)

    x = torch.randn(3, 4, dtype=input_dtype, requires_grad=True)
    t = torch.randn(3, 4, dtype=target_dtype)
    (loss, told), (expected, expected_told) = thunder_rs.jit(program)(x, t), program(x, t)
    assert (loss.dtype, told) == (expected.dtype, expected_told)
    tol = {"atol": 2e-2, "rtol": 2e-2} if torch.bfloat16 in (input_dtype, target_dtype) else {}
    torch.testing.assert_close(loss, expected, **tol)
    if name.startswith("huber"):
        return  # (eager's huber_loss_backward refuses two dtypes: "Found dtype Double but expected Float")
    (grad,), (expected_grad,) = torch.autograd.grad(loss.sum(), x), torch.autograd.grad(expected.sum(), x)
    assert grad.dtype == expected_grad.dtype
    torch.testing.assert_close(grad, expected_grad, **tol)
