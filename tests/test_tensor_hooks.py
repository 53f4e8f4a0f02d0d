"""``tensor.register_hook`` inside a jitted program, against eager PyTorch: the hook runs on the
tensor's gradient in every call's backward (it ran once, or was refused), what it returns replaces
the gradient, and registrations that cannot be traced faithfully are refused naming the line."""

import copy

import pytest
import torch
import torch.nn as nn

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError


class Captures(nn.Module):
    """The gradient-capture pattern: a hook registered in forward stores the activation's gradient."""

    def __init__(self, scale=None):
        super().__init__()
        self.lin, self.out, self.scale, self.grads = nn.Linear(4, 8), nn.Linear(8, 2), scale, []

    def forward(self, x):
        h = self.lin(x).tanh()
        h.register_hook(lambda g: self.grads.append(g.clone()))
        if self.scale is not None:
            h.register_hook(lambda g: g * self.scale)  # runs after the capture, as registered
        return self.out(h * h).sum()


def _run(model, inputs):
    grads = []
    for x in inputs:
        model.zero_grad()
        model(x).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    return grads


@pytest.mark.parametrize("scale", [None, 0.5])
def test_a_gradient_capture_hook_runs_in_every_calls_backward(scale):
    torch.manual_seed(0)
    eager = Captures(scale)
    compiled = copy.deepcopy(eager)
    inputs = [torch.randn(3, 4) for _ in range(3)]
    expected = _run(eager, inputs)
    actual = _run(thunder_rs.jit(compiled), inputs)
    torch.testing.assert_close(actual, expected)
    assert len(compiled.grads) == len(eager.grads) == 3
    torch.testing.assert_close(compiled.grads, eager.grads)


def test_a_hook_removed_in_forward_does_not_run():
    seen = []

    def fn(x):
        h = x * 2
        handle = h.register_hook(lambda g: seen.append(g) or g * 10)
        handle.remove()
        return (h * h).sum()

    x = torch.randn(4, requires_grad=True)
    fn(x).backward()
    expected, x.grad = x.grad, None
    jfn = thunder_rs.jit(fn)
    for _ in range(2):
        jfn(x).backward()
        torch.testing.assert_close(x.grad, expected)
        x.grad = None
    assert seen == []


def test_a_hook_on_a_tensor_that_requires_no_grad_raises_as_eager():
    def fn(x):
        h = x * 2
        h.register_hook(lambda g: g)
        return h

    message = "cannot register a hook on a tensor that doesn't require gradient"
    with pytest.raises(RuntimeError, match=message):
        fn(torch.randn(2))
    with pytest.raises(RuntimeError, match=message):
        thunder_rs.jit(fn)(torch.randn(2))


def _used_before(x):
    h = x * 2
    y = h.sin()
    h.register_hook(lambda g: g * 0)
    return (y + h).sum()


def _on_an_input(x):
    x.register_hook(lambda g: g * 0)
    return x.sum()


def _reading_a_traced_tensor(x):
    h, mask = x * 2, x > 0
    h.register_hook(lambda g: g * mask)
    return h.sum()


@pytest.mark.parametrize(
    "fn, match",
    [
        (_used_before, "used the tensor before registering"),
        (_on_an_input, "an input of the jitted call"),
        (_reading_a_traced_tensor, "the hook reads 'mask'"),
    ],
)
def test_hooks_that_cannot_be_traced_faithfully_are_refused(fn, match):
    with pytest.raises(ThunderNotImplementedError, match="test_tensor_hooks.py.*" + match):
        thunder_rs.jit(fn)(torch.randn(4, requires_grad=True))


def test_a_handle_removed_after_the_call_is_refused():
    # Compiled calls share the hook the trace registered: removing it would remove every call's.
    class Kept(nn.Module):
        def forward(self, x):
            h = x * 2
            self.handle = h.register_hook(lambda g: g * 2)
            return h.sum()

    model, x = Kept(), torch.randn(3, requires_grad=True)
    thunder_rs.jit(model)(x).backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 4.0))
    with pytest.raises(ThunderNotImplementedError, match="removed after that call"):
        model.handle.remove()
