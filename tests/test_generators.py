"""Random draws from ``torch.Generator`` objects: against eager PyTorch.

Every test compares outputs, gradients and the generators' states after the calls with eager's,
bit for bit.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_same(actual, expected) -> None:
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


X = torch.linspace(-2.0, 2.0, 12)


class _HeldGenerator(nn.Module):
    def __init__(self):
        super().__init__()
        self.gen = gen(0)

    def forward(self, x):
        return x + self.gen.initial_seed()


def test_reading_a_generators_state_inside_the_program_is_refused():
    """A compiled call would return the seed read while tracing: after ``gen.manual_seed(5)``, eager
    reads 5 where the compiled call read 0."""
    with pytest.raises(ThunderNotImplementedError, match=r"initial_seed.*test_generators.py"):
        thunder_rs.jit(_HeldGenerator())(X)
    with pytest.raises(ThunderNotImplementedError, match="get_state"):
        thunder_rs.jit(lambda x, g: x + g.get_state()[:12])(X, gen(0))


def test_a_random_op_given_its_generator_positionally_differentiates_through_its_draws():
    """``torch.rrelu(x, lower, upper, True, g)``: its backward draws again from ``g``'s state (it
    drew from the default generator's), so the slopes and the gradient are eager's."""

    def fn(x, g):
        return (torch.rrelu(x, 0.1, 0.3, True, g) * 2).sum()

    jfn = thunder_rs.jit(fn)
    for i in range(3):
        grads = []
        for run in (fn, jfn):
            x = X.clone().requires_grad_()
            run(x, gen(i)).backward()
            grads.append(x.grad)
        assert_same(grads[1], grads[0])
