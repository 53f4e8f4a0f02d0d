"""A differentiable call reads which of its outputs are views only where the compile could not
tell that torch returns new tensors there (``core.run.fresh_outputs``): outputs of elementwise
kernels are not read, those of ops that may return a view of their inner product (tensordot) are,
and so is every output under a torch function mode, which may answer any call with a view."""

import operator

import pytest
import torch
from torch.overrides import TorchFunctionMode

import thunder_rs
from thunder_rs.core.run import autograd
from thunder_rs.core.run.fresh_outputs import returns_new_tensors

_NEW = [torch.mul, torch.sin, operator.mul, torch.Tensor.mul, torch.addmm, torch.ops.aten.mm.default, torch.clone]
#: composites (their views are autograd's), view ops, calls that may return their input, Python
_MAYBE_VIEWS = [torch.tensordot, torch.einsum, torch.matmul, torch.Tensor.t, torch.Tensor.contiguous, torch.Tensor.to]
_MAYBE_VIEWS += [torch.nn.functional.softmax, lambda x: x, None]


@pytest.mark.parametrize("fn", _NEW + _MAYBE_VIEWS)
def test_what_returns_new_tensors(fn):
    assert returns_new_tensors(fn) == (fn in _NEW)


def _elementwise(a, b):
    return (a * b).sin(), a.exp() + b


def _tensordot(a, b):
    return torch.tensordot(a, b, dims=0), a * b


def _counting(monkeypatch) -> list:
    calls = []
    original = autograd._own_views
    monkeypatch.setattr(autograd, "_own_views", lambda *a: calls.append(a) or original(*a))
    return calls


@pytest.mark.parametrize("program", [_elementwise, _tensordot])
def test_only_outputs_that_may_be_views_are_read(program, monkeypatch):
    a = torch.randn(3, 3, requires_grad=True)
    b = torch.randn(3, 3, requires_grad=True)
    jf = thunder_rs.jit(program)
    jf(a, b)
    calls = _counting(monkeypatch)
    for mine, eager in zip(jf(a, b), program(a, b)):
        mine.mul_(3.0)  # as eager's: the caller may write it
        torch.testing.assert_close(mine, eager.mul(3.0), rtol=0, atol=0)
    assert len(calls) == (program is _tensordot)


def test_an_output_an_elementwise_op_writes_into_a_view_torch_made_is_the_callers_to_write_as_eager():
    """``tensordot(a, b, 1) * 2`` runs as ``t.mul_(2)`` on tensordot's output (it dies there), a view of
    tensordot's inner product: the output is that view, whose memory tensordot made."""

    def program(a, b):
        return torch.tensordot(a, b, 1) * 2

    a = torch.randn(3, 3, requires_grad=True)
    b = torch.randn(3, 3, requires_grad=True)
    jf = thunder_rs.jit(program)
    for _ in range(2):
        mine, eager = jf(a, b), program(a, b)
        mine.mul_(3.0)
        eager.mul_(3.0)
        torch.testing.assert_close(mine, eager, rtol=0, atol=0)
        want = torch.autograd.grad(eager.sum(), (a, b))
        torch.testing.assert_close(torch.autograd.grad(mine.sum(), (a, b)), want, rtol=0, atol=0)


class _MulAsView(TorchFunctionMode):
    """Answers ``mul`` with a view of the product it computed."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out.view(out.shape) if getattr(func, "__name__", "") == "mul" else out


def test_under_a_function_mode_a_view_it_answers_is_the_callers_to_write_as_eager():
    def program(a, b):
        return torch.mul(a, b)

    a = torch.randn(3, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    jf = thunder_rs.jit(program)
    jf(a, b)  # (compiled outside the mode: the mode answers the compiled call's mul)
    with _MulAsView():
        mine, eager = jf(a, b), program(a, b)
        assert eager._is_view()
        mine.mul_(2.0)
        eager.mul_(2.0)
    torch.testing.assert_close(mine, eager, rtol=0, atol=0)
    want = torch.autograd.grad(eager.sum(), (a, b))
    got = torch.autograd.grad(mine.sum(), (a, b))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
