"""Small differences from eager found one at a time, each checked against eager PyTorch."""

import pytest
import torch

import thunder_rs


@pytest.mark.parametrize("some", [True, False])
def test_svd_values_only_of_an_input_that_requires_grad_are_computed_with_the_vectors_as_eager(some):
    """Eager's torch.svd(compute_uv=False) takes its values from linalg.svdvals, which computes the
    singular vectors too where the input requires grad (LAPACK's values then differ in their last
    bits); the compiled forward ran the values-only kernel, so the values and gradients differed."""
    gen = torch.Generator().manual_seed(0)

    def fn(a):
        return torch.svd(a, some=some, compute_uv=False)

    for _ in range(3):
        a = torch.randn(2, 5, 4, generator=gen, requires_grad=True)
        expected, actual = fn(a), thunder_rs.jit(fn)(a)
        for e, c in zip(expected, actual):
            assert torch.equal(e, c) and e.stride() == c.stride() and e.requires_grad == c.requires_grad
        cotangent = torch.randn(expected[1].shape, generator=gen)
        (e,), (g,) = (torch.autograd.grad(out[1], a, cotangent) for out in (expected, actual))
        assert torch.equal(e, g)
        with torch.no_grad():  # (without grad: the values alone, as eager's)
            assert all(torch.equal(e, c) for e, c in zip(fn(a), thunder_rs.jit(fn)(a)))
