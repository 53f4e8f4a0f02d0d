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
    jmodel = thunder_rs.jit(compiled)
    actual = _run(jmodel, inputs)
    torch.testing.assert_close(actual, expected)
    assert thunder_rs.cache_misses(jmodel) == 1  # the registration in forward is traced into one entry
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


def _reading_a_traced_tensor(x):
    h, mask = x * 2, x > 0
    h.register_hook(lambda g: g * mask)
    return h.sum()


@pytest.mark.parametrize(
    "fn, match",
    [
        (_used_before, "used the tensor before registering"),
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


def _hooked_input(seen):
    def fn(x, w):
        y = (x * w).sum()  # a use before the registration: a leaf's hook sees its whole gradient
        x.register_hook(lambda g: seen.append(g.clone()) or g * 10)
        return y + (x * x).sum()

    return fn


def test_a_hook_on_an_input_replaces_its_gradient_and_piles_up_as_eager():
    w = torch.randn(4)
    results = []
    for compiled in (False, True):
        seen: list = []
        fn = _hooked_input(seen)
        call = thunder_rs.jit(fn) if compiled else fn
        grads = []
        for x in (torch.randn(4, generator=torch.Generator().manual_seed(i)).requires_grad_() for i in range(2)):
            for _ in range(2):  # the same tensor again: eager's second call adds a second hook
                call(x, w).backward()
                grads.append(x.grad.clone())
        results.append((grads, seen))
    torch.testing.assert_close(results[1], results[0])


def test_a_hook_on_a_non_leaf_input_sees_the_gradient_of_all_its_uses():
    def fn(h):
        h.register_hook(lambda g: g * 3)
        return h.sin().sum()

    grads = []
    for call in (fn, thunder_rs.jit(fn)):
        a = torch.randn(4, generator=torch.Generator().manual_seed(0)).requires_grad_()
        h = a * 2
        (call(h) + h.sum()).backward()  # the caller's own use of h passes through the hook too
        grads.append(a.grad)
    torch.testing.assert_close(grads[1], grads[0])


class ScalesItsGradients(nn.Module):
    """A layer that registers a hook on its weight in every forward: eager's pile up."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x):
        self.lin.weight.register_hook(lambda g: g * 0.5)
        return self.lin(x).sum()


def test_a_hook_a_forward_registers_on_a_parameter_runs_as_eager():
    torch.manual_seed(0)
    eager = ScalesItsGradients()
    compiled = copy.deepcopy(eager)
    jmodel = thunder_rs.jit(compiled)
    for i in range(3):
        x = torch.randn(3, 4) * (i + 1)
        eager(x).backward()
        jmodel(x).backward()
        torch.testing.assert_close(compiled.lin.weight.grad, eager.lin.weight.grad)
        torch.testing.assert_close(compiled.lin.bias.grad, eager.lin.bias.grad)
    assert thunder_rs.cache_misses(jmodel) == 1


def test_a_hook_on_an_input_removed_in_the_call_does_not_run():
    def fn(x):
        handle = x.register_hook(lambda g: g * 0)
        handle.remove()
        return (x * x).sum()

    x = torch.randn(4, requires_grad=True)
    thunder_rs.jit(fn)(x).backward()
    torch.testing.assert_close(x.grad, 2 * x.detach())
    assert not x._backward_hooks


def test_a_hook_on_a_captured_tensor_runs_as_eager_and_one_an_argument_object_holds_is_refused():
    weight = torch.randn(3, requires_grad=True)

    def fn(x):
        weight.register_hook(lambda g: g * 5)
        return (weight * x).sum()

    x = torch.randn(3)
    fn(x).backward()
    expected, weight.grad = weight.grad, None
    weight._backward_hooks.clear()
    thunder_rs.jit(fn)(x).backward()
    torch.testing.assert_close(weight.grad, expected)

    class Box:
        def __init__(self, t):
            self.t = t

    def held(box):
        box.t.register_hook(lambda g: g * 2)
        return box.t.sum()

    with pytest.raises(ThunderNotImplementedError, match="a tensor an argument object holds"):
        thunder_rs.jit(held)(Box(torch.randn(3, requires_grad=True)))
