"""Writes to repeated indices (scatter, index_put without accumulate, index_copy, put): where the
written values are equal, eager's result is determined, and thunder_rs's must be it, with and
without gradients; every written element gets the gradient of the position it was written to."""

import pytest
import torch

import thunder_rs

D = torch.float64
INDEX = torch.tensor([1, 1, 2])

WRITES = {
    "scatter_value": lambda x: x.scatter(0, INDEX, 0.5),
    "scatter_src": lambda x: x.scatter(0, INDEX, torch.full((3,), 0.5, dtype=D) * x[:3]),
    "index_put": lambda x: x.index_put((INDEX,), torch.tensor(0.5, dtype=D) * x[0]),
    "index_copy": lambda x: x.index_copy(0, INDEX, torch.full((3,), 0.5, dtype=D) * x[3]),
    "put": lambda x: x.put(INDEX, torch.full((3,), 0.5, dtype=D)),
    "rows": lambda x: x.view(2, 2).index_put((torch.tensor([0, 0]),), x[2:].expand(2, 2) * 2),
}


@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("name", WRITES)
def test_equal_values_written_to_repeated_indices_are_eagers(name, requires_grad):
    write = WRITES[name]
    x = torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=D, requires_grad=requires_grad)
    expected, got = write(x), thunder_rs.jit(write)(x)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    if requires_grad:
        cotangent = torch.arange(1.0, 1.0 + got.numel(), dtype=D).view_as(got)
        torch.testing.assert_close(torch.autograd.grad(got, x, cotangent), torch.autograd.grad(expected, x, cotangent))


def test_a_repetition_penalty_with_repeated_tokens_is_eagers():
    # Hugging Face's RepetitionPenaltyLogitsProcessor, on logits that require grad.
    def penalize(scores, ids):
        picked = torch.gather(scores, 1, ids)
        return scores.scatter(1, ids, torch.where(picked < 0, picked * 1.2, picked / 1.2))

    scores = torch.tensor([[1.0, -2.0, 3.0, 4.0]], dtype=D, requires_grad=True)
    ids = torch.tensor([[1, 1, 2, 2]])
    expected, got = penalize(scores, ids), thunder_rs.jit(penalize)(scores, ids)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), scores), torch.autograd.grad(expected.sum(), scores))
