"""``slogdet``'s sign as eager differentiates it: of a real matrix the sign requires grad, yet no
gradient flows through it (``slogdet_backward`` reads the log's cotangent alone), so a loss of the
sign alone leaves ``A.grad`` None and ``torch.autograd.grad`` raises that ``A`` was not used.

What differed: the opaque symbol's backward, given the sign's cotangent, ran torch's derivative,
found no gradient and gave zeros: ``A.grad`` was a zero matrix, and ``autograd.grad`` returned it."""

import pytest
import torch

import thunder_rs

CALLS = {
    "linalg.slogdet": torch.linalg.slogdet,
    "torch.slogdet": torch.slogdet,
    "Tensor.slogdet": torch.Tensor.slogdet,
}

LOSSES = {
    "sign": lambda s, logabsdet: s.sum(),
    "sign twice": lambda s, logabsdet: (s * s).sum() + s.sum(),
    "sign times log": lambda s, logabsdet: (s * logabsdet).sum(),
    "log": lambda s, logabsdet: logabsdet.sum(),
}


def _matrix(dtype=torch.float64, batch=()):
    g = torch.Generator().manual_seed(0)
    return torch.randn(*batch, 3, 3, generator=g, dtype=dtype)


def _program(call, loss):
    def program(A):
        s, logabsdet = call(A)
        return loss(s, logabsdet), s

    return program


@pytest.mark.parametrize(
    "call, loss", [("linalg.slogdet", loss) for loss in LOSSES] + [(call, "sign") for call in list(CALLS)[1:]]
)
def test_the_gradient_of_slogdets_sign_is_eagers(call, loss):
    program = _program(CALLS[call], LOSSES[loss])
    sides = []
    for fn in (program, thunder_rs.jit(program)):
        A = _matrix(batch=(2,)).requires_grad_()
        value, s = fn(A)
        value.backward()
        sides.append((value.detach(), s.requires_grad, A.grad))
    (value, s_rg, grad), (expected, eager_s_rg, eager_grad) = sides[1], sides[0]
    assert torch.equal(value, expected) and s_rg == eager_s_rg
    if eager_grad is None:
        assert grad is None
    else:
        torch.testing.assert_close(grad, eager_grad, rtol=0, atol=0)


def test_autograd_grad_of_the_sign_alone_raises_eagers_error():
    program = _program(torch.linalg.slogdet, LOSSES["sign"])
    errors = []
    for fn in (program, thunder_rs.jit(program)):
        A = _matrix().requires_grad_()
        with pytest.raises(RuntimeError) as e:
            torch.autograd.grad(fn(A)[0], A)
        errors.append(str(e.value))
        assert torch.autograd.grad(fn(A)[0], A, allow_unused=True) == (None,)
    assert errors[1] == errors[0]


def test_the_sign_of_a_complex_matrix_has_eagers_gradient():
    program = _program(torch.linalg.slogdet, lambda s, logabsdet: s.real.sum())
    grads = []
    for fn in (program, thunder_rs.jit(program)):
        A = _matrix(torch.complex128).requires_grad_()
        fn(A)[0].backward()
        grads.append(A.grad)
    torch.testing.assert_close(grads[1], grads[0])


def test_after_a_double_backward_the_sign_still_requires_grad_as_eagers():
    # From its first double backward on, the entry runs the program under autograd: the sign is
    # then torch's own output, which requires grad.
    program = _program(torch.linalg.slogdet, LOSSES["sign times log"])
    jfn = thunder_rs.jit(program)
    A = _matrix().requires_grad_()
    for _ in range(3):
        sides = []
        for fn in (program, jfn):
            value, s = fn(A)
            (g,) = torch.autograd.grad(value + s.sum(), A, create_graph=True)
            (gg,) = torch.autograd.grad(g.sum(), A)
            sides.append((s.requires_grad, gg))
        assert sides[1][0] == sides[0][0]
        torch.testing.assert_close(sides[1][1], sides[0][1])
