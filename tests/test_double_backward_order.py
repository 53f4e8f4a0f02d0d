"""A double backward (``create_graph=True``) of a loss that reads a compiled call's output twice,
``y = jf(x); (y * y).sum()``, against eager's.

Eager sums the two gradients that reach a value both the loss's path and the gradient's own graph
read before differentiating through it: for ``y = x.exp() * 1.3`` the second gradient of ``x`` is
``(A + B) * e`` (``e = exp(x)``; ``A`` from the first gradient's ``grad * result``, ``B`` from
``y``). The first double backward through a compiled call computes the gradient from the program
computed again (``core.differentiable``), whose ``e`` is another node than the one the call's output
``y`` hangs from: the two meet only at ``x``, as ``A * e + B * e``, within a rounding of eager's
but not bit-equal (no order of the sum makes a product distribute exactly). From then on the entry
runs the program under autograd (one graph, as eager's), and every later double backward is
eager's bit for bit."""

import pytest
import torch
import torch.nn as nn

import thunder_rs

PROGRAMS = {
    "exp": lambda: lambda x: x.exp() * 1.3,
    "mlp": lambda: nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8)),
}


def _second_gradients(fn, seed: int):
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(seed), requires_grad=True)
    y = fn(x)
    (g,) = torch.autograd.grad((y * y).sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad((g * torch.linspace(0.5, 2, 64).view(8, 8)).sum(), x)
    return g.detach(), gg


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_double_backwards_of_a_loss_reading_the_output_twice_are_eagers(name):
    torch.manual_seed(0)
    program = PROGRAMS[name]()
    jfn = thunder_rs.jit(program)
    for call in range(3):
        (g, gg), (eager_g, eager_gg) = _second_gradients(jfn, call), _second_gradients(program, call)
        assert torch.equal(g, eager_g)
        if call == 0:  # (the program computed again: within a rounding, see the module doc)
            torch.testing.assert_close(gg, eager_gg)
        else:
            assert torch.equal(gg, eager_gg)


@pytest.mark.xfail(
    strict=True,
    reason="the first double backward sums A * e + B * e where eager sums (A + B) * e: the loss's path (A, through "
    "the cotangent 2 * y) reaches x through the compiled call's own backward (its autograd.Function node, which "
    "y hangs from, made before the recomputation), the gradient's path (B) through the program computed again, "
    "whose e is another node: the two meet only at x. One node for both needs the call's forward recorded under "
    "autograd, which the entry does from its first double backward on",
)
def test_the_first_double_backward_through_a_call_is_eagers_bit_for_bit():
    program = PROGRAMS["exp"]()
    assert torch.equal(_second_gradients(thunder_rs.jit(program), 0)[1], _second_gradients(program, 0)[1])
