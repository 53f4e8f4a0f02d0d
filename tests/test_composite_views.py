"""An op whose decomposition returns a view of a tensor only it computes (eager's ``tensordot``
is ``mm(...).reshape(...)``): the trace has no name for that tensor, so the output is the op's
own, with eager's strides, values and gradients (returning the inner tensor for the view to be
taken again of it raised ``NameError`` on the first call)."""

import pytest
import torch

import thunder_rs


def _tensordot0(a, b):
    return torch.tensordot(a, b, dims=0)


def _tensordot1(a, b):
    return torch.tensordot(a, b.reshape(4, 5, 2), dims=1)


def _inner_permuted(a, b):  # (a view of the inner product laid out in another order than its dims)
    return torch.inner(a, b.reshape(4, 5, 2).permute(2, 1, 0))


@pytest.mark.parametrize("program", [_tensordot0, _tensordot1, _inner_permuted])
@pytest.mark.parametrize("grad", [True, False])
def test_a_view_of_a_tensor_inside_an_op_is_returned_as_eager_returns_it(program, grad):
    torch.manual_seed(0)
    a = torch.randn(3, 4, dtype=torch.float64, requires_grad=grad)
    b = torch.randn(5, 8, dtype=torch.float64, requires_grad=grad)
    jprogram = thunder_rs.jit(program)
    for _ in range(2):  # the first call traces, the second runs the cached program
        expected, actual = program(a, b), jprogram(a, b)
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
        assert actual.stride() == expected.stride()
        assert actual.requires_grad == expected.requires_grad
        if grad:
            cotangent = torch.randn_like(expected)
            want = torch.autograd.grad(expected, (a, b), cotangent)
            got = torch.autograd.grad(actual, (a, b), cotangent)
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def _einsum(a, b):
    return torch.einsum("ij,jkl->lik", a, b.reshape(4, 5, 2))


@pytest.mark.parametrize("program", [_tensordot0, _einsum, _inner_permuted])
def test_the_caller_writes_in_place_into_a_view_an_op_made_as_into_eager_s(program):
    # (eager's output is a view of the op's inner product, which autograd lets the caller write;
    # the compiled call's was a view its autograd.Function made, which torch refuses to write)
    a = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    jprogram = thunder_rs.jit(program)
    for _ in range(2):
        expected, actual = program(a, b), jprogram(a, b)
        expected.mul_(3.0)
        actual.mul_(3.0)
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
        assert actual.stride() == expected.stride()
        cotangent = torch.randn_like(expected)
        want = torch.autograd.grad(expected, (a, b), cotangent)
        got = torch.autograd.grad(actual, (a, b), cotangent)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
