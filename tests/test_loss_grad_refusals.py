"""Losses whose kernels have no derivative for an argument (``derivatives.yaml``: a loss's class
or element weights, ``soft_margin_loss``'s target): with grad on, eager's forward raises when a
tensor given for it requires grad. thunder_rs raises the same error (type, kernel, argument), where
it used to differentiate its decomposition and return a gradient eager does not define."""

import pytest
import torch
import torch.nn.functional as F

import thunder_rs


def _probabilities(*shape):
    return torch.rand(*shape, dtype=torch.float64).clamp(0.05, 0.95)


def _weights(*shape):
    return torch.rand(*shape, dtype=torch.float64) + 0.1


def _classes(*shape, classes=5):
    return torch.randint(0, classes, shape)


#: name -> (loss, its arguments, the position of the one eager cannot differentiate, eager's
#: kernel, that argument's name).
CASES = {
    "bce_weight": (
        lambda x, t, w: F.binary_cross_entropy(x, t, weight=w),
        lambda: (_probabilities(4, 5), _probabilities(4, 5), _weights(4, 5)),
        2,
        "binary_cross_entropy",
        "weight",
    ),
    "bce_logits_weight": (
        lambda x, t, w: F.binary_cross_entropy_with_logits(x, t, weight=w),
        lambda: (torch.randn(4, 5, dtype=torch.float64), _probabilities(4, 5), _weights(5)),
        2,
        "binary_cross_entropy_with_logits",
        "weight",
    ),
    "bce_logits_pos_weight": (
        lambda x, t, w: F.binary_cross_entropy_with_logits(x, t, pos_weight=w, reduction="sum"),
        lambda: (torch.randn(4, 5, dtype=torch.float64), _probabilities(4, 5), _weights(5)),
        2,
        "binary_cross_entropy_with_logits",
        "pos_weight",
    ),
    "multi_margin_weight": (
        lambda x, t, w: F.multi_margin_loss(x, t, weight=w),
        lambda: (torch.randn(4, 5, dtype=torch.float64), _classes(4), _weights(5)),
        2,
        "multi_margin_loss",
        "weight",
    ),
    "multi_margin_p2_weight": (
        lambda x, t, w: F.multi_margin_loss(x, t, p=2, weight=w, reduction="none"),
        lambda: (torch.randn(4, 5, dtype=torch.float64), _classes(4), _weights(5)),
        2,
        "multi_margin_loss",
        "weight",
    ),
    "soft_margin_target": (
        lambda x, t: F.soft_margin_loss(x, t),
        lambda: (torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64).sign()),
        1,
        "soft_margin_loss",
        "target",
    ),
    "nll_loss_images_weight": (
        lambda x, t, w: F.nll_loss(x, t, weight=w),
        lambda: (torch.randn(2, 5, 3, 3, dtype=torch.float64).log_softmax(1), _classes(2, 3, 3), _weights(5)),
        2,
        "nll_loss2d_forward",
        "weight",
    ),
}


def _with_grad(args, position):
    """``args`` with the input (where it is a float tensor) and the one at ``position`` requiring grad."""
    args = [a.clone() for a in args]
    args[position].requires_grad_()
    if position != 0:
        args[0].requires_grad_()
    return args


@pytest.mark.parametrize("case", CASES)
def test_an_argument_eager_cannot_differentiate_raises_eagers_error(case):
    loss, make, position, kernel, argument = CASES[case]
    args = _with_grad(make(), position)
    expected = f"function '{kernel}' is not differentiable with respect to argument '{argument}'"
    with pytest.raises(RuntimeError, match=expected):
        loss(*args)
    with pytest.raises(RuntimeError, match=expected):
        thunder_rs.jit(loss)(*args)
    # With grad off there is nothing to differentiate: eager computes the loss, and so does the trace.
    with torch.no_grad():
        torch.testing.assert_close(thunder_rs.jit(loss)(*args), loss(*args))


@pytest.mark.parametrize("case", ["bce_weight", "multi_margin_weight"])
def test_a_call_whose_weight_requires_grad_raises_after_one_whose_weight_did_not(case):
    loss, make, position, kernel, argument = CASES[case]
    args = _with_grad(make(), position)
    detached = [a.detach() if i == position else a for i, a in enumerate(args)]
    jloss = thunder_rs.jit(loss)
    (grad,) = torch.autograd.grad(jloss(*detached), args[0])
    (expected,) = torch.autograd.grad(loss(*detached), args[0])
    torch.testing.assert_close(grad, expected)
    with pytest.raises(RuntimeError, match=f"not differentiable with respect to argument '{argument}'"):
        jloss(*args)
