"""Views a program reads from outside its inputs (globals, closures, module attributes) that were
made under ``no_grad`` or ``inference_mode`` of a tensor that requires grad. Once their base is
written in place, eager refuses their autograd history: an op that records a gradient through
one raises, while ops under ``no_grad``, ``detach()`` and ops without a gradient read it, and see
the base's current values. Compiled calls do the same, and raise eager's error naming the line."""

import pytest
import torch
from torch import nn

import thunder_rs

_REFUSED = "was created in (no_grad mode|inference mode) and its base or another view of its base has been modified"


def _refused_view(context=torch.no_grad):
    """A weight and its transpose made under ``context``, the weight written in place since."""
    torch.manual_seed(0)
    w = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)
    with context():
        v = w.t()
    with torch.no_grad():
        w.add_(1)
    return w, v


def _reads_under_no_grad(v):
    def f(x):
        with torch.no_grad():
            s = (x @ v).sum()
        return x * s + x @ v.detach()

    return f


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_a_refused_view_read_under_no_grad_sees_its_base_as_eager(context):
    w, v = _refused_view(context)
    f = lambda x: x @ v  # noqa: E731
    jf = thunder_rs.jit(f)
    x = torch.randn(2, 3, dtype=torch.float64)
    for _ in range(2):
        with torch.no_grad():
            out, expected = jf(x), f(x)
        torch.testing.assert_close(out, expected)
        assert not out.requires_grad
        with torch.no_grad():
            w.mul_(2)  # a later call reads the new values through the view, as eager does
    # under grad mode eager raises as the product records its gradient; so does the compiled call
    with pytest.raises(RuntimeError, match=_REFUSED):
        f(x)
    with pytest.raises(RuntimeError, match=_REFUSED + r".*test_no_grad_views.py:\d+"):
        jf(x)


def test_a_refused_view_read_only_without_gradient_in_a_training_call():
    w, v = _refused_view()
    f = _reads_under_no_grad(v)
    jf = thunder_rs.jit(f)
    for _ in range(2):
        x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
        ex = x.detach().clone().requires_grad_()
        out, expected = jf(x), f(ex)
        torch.testing.assert_close(out, expected)
        out.sum().backward()
        expected.sum().backward()
        torch.testing.assert_close(x.grad, ex.grad)
        assert w.grad is None
        with torch.no_grad():
            w.mul_(2)


def test_writes_to_a_refused_view_under_no_grad_reach_its_base_and_are_refused_under_grad():
    def add_one(v):
        def f(x):
            v.add_(1)
            return x @ v

        return f

    _, v_eager = _refused_view()
    w, v = _refused_view()
    f, jf = add_one(v_eager), thunder_rs.jit(add_one(v))
    x = torch.randn(2, 3, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(jf(x), f(x))
    torch.testing.assert_close(v.detach(), v_eager.detach())
    torch.testing.assert_close(w.detach().t(), v_eager.detach())
    with pytest.raises(RuntimeError, match="A view was created in no_grad mode"):
        f(x)
    with pytest.raises(RuntimeError, match="A view was created in no_grad mode"):
        jf(x)
    # writes through its detached alias are seen by no autograd: eager allows them
    g = lambda x: x @ v.detach().add_(1)  # noqa: E731
    expected = x @ (v.detach() + 1)
    torch.testing.assert_close(thunder_rs.jit(g)(x), expected)
    torch.testing.assert_close(x @ v.detach(), expected)


class _TransposedWeight(nn.Module):
    """A view of its parameter kept as a plain attribute, made under ``no_grad`` in ``__init__``;
    its forward reads it without gradient (a statistic) and through the parameter."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3, dtype=torch.float64)
        with torch.no_grad():
            self.wt = self.lin.weight.t()

    def forward(self, x):
        with torch.no_grad():
            s = (x @ self.wt).abs().mean()
        return self.lin(x) * s


def test_a_module_view_attribute_across_optimizer_steps_as_eager():
    """The optimizer writes the weight in place: from then on eager refuses the view's history,
    which the compiled training call (compiled before the first step) must not ask for."""

    def train(jit: bool):
        torch.manual_seed(0)
        model = _TransposedWeight()
        call = thunder_rs.jit(model) if jit else model
        x = torch.randn(2, 3, dtype=torch.float64)
        outs = []
        for _ in range(3):
            out = call(x)
            out.sum().backward()
            with torch.no_grad():  # an SGD step
                for p in model.parameters():
                    p.sub_(0.1 * p.grad)
                    p.grad = None
            outs.append(out.detach())
        with torch.no_grad():
            outs.append(call(x))
        return outs, model.lin.weight.detach()

    (outs, weight), (expected, expected_weight) = train(True), train(False)
    torch.testing.assert_close(outs, expected)
    torch.testing.assert_close(weight, expected_weight)


def test_data_of_a_captured_tensor_is_read_and_written_as_in_eager():
    """``w.data`` of a tensor the program captured (a detached alias): read, and written in place
    through it, which changes ``w`` as eager's does. It failed while traced (``ltorch.detach`` was
    given the captured tensor's constant, not the tensor)."""
    torch.manual_seed(0)
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    twin = w.detach().clone().requires_grad_()

    def make(weight):
        def step(x):
            weight.data.mul_(0.5)
            return weight.data * x + weight

        return step

    jf, eager = thunder_rs.jit(make(w)), make(twin)
    for _ in range(3):
        x = torch.randn(3, dtype=torch.float64)
        out, expected = jf(x), eager(x)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        torch.testing.assert_close(w, twin, rtol=0, atol=0)
        out.sum().backward()
        expected.sum().backward()
    torch.testing.assert_close(w.grad, twin.grad, rtol=0, atol=0)
