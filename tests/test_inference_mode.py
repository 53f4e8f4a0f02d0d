"""``torch.inference_mode()`` inside and around a jitted program, against eager PyTorch: the
tensors it returns are inference tensors where eager's are, eager's errors for inference tensors
are raised, and a call under inference mode does not reuse an entry compiled outside it."""

import pytest
import torch
import torch.nn as nn

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError


def _flags(out):
    outs = out if isinstance(out, tuple) else (out,)
    return [(o.is_inference(), o.requires_grad) for o in outs]


def _assert_like_eager(fn, *args, calls=2):
    jfn = thunder_rs.jit(fn)
    for _ in range(calls):
        expected, actual = fn(*args), jfn(*args)
        assert _flags(actual) == _flags(expected)
        torch.testing.assert_close(actual, expected)
    return jfn


def test_tensors_made_inside_inference_mode_are_inference_tensors():
    def fn(x, w):
        with torch.inference_mode():
            y = (x * w).sin()
            v = x.view(-1)  # a view of a normal tensor: normal, as eager's
        return y, y[0], v, x * w

    x, w = torch.randn(3, 4), torch.randn(4, requires_grad=True)
    _assert_like_eager(fn, x, w)


def test_inference_mode_decorator_on_a_submodule_method():
    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 2)

        @torch.inference_mode()
        def forward(self, h):
            return self.lin(h).softmax(-1)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.head = nn.Linear(4, 4), Head()

        def forward(self, x):
            h = self.body(x).relu()
            return h, self.head(h)

    torch.manual_seed(0)
    _assert_like_eager(Model(), torch.randn(3, 4))


def test_inference_mode_false_nested_makes_normal_tensors():
    def fn(x):
        with torch.inference_mode():
            a = x * 2
            with torch.inference_mode(False):
                b = x * 3
        return a, b

    jfn = _assert_like_eager(fn, torch.randn(4, requires_grad=True))
    x = torch.randn(4, requires_grad=True)
    jfn(x)[1].sum().backward()
    torch.testing.assert_close(x.grad, torch.full((4,), 3.0))


def test_saving_an_inference_tensor_for_backward_raises_as_eager():
    def fn(x):
        with torch.inference_mode():
            y = x * 3
        return x * y  # the product saves y for x's gradient

    x = torch.randn(4, requires_grad=True)
    message = "Inference tensors cannot be saved for backward"
    with pytest.raises(RuntimeError, match=message):
        fn(x)
    with pytest.raises(RuntimeError, match=message):
        thunder_rs.jit(fn)(x)

    def added(x):
        with torch.inference_mode():
            y = x * 3
        return x + y  # saves nothing: eager's runs

    _assert_like_eager(added, x)


def test_writing_an_inference_tensor_outside_inference_mode_raises_as_eager():
    def fn(x):
        with torch.inference_mode():
            a = x * 2
        a.add_(1)
        return a

    message = "Inplace update to inference tensor outside InferenceMode"
    x = torch.randn(4)
    with pytest.raises(RuntimeError, match=message):
        fn(x)
    with pytest.raises(RuntimeError, match=message):
        thunder_rs.jit(fn)(x)

    def inside(x):
        with torch.inference_mode():
            a = x * 2
            a.add_(1)
        return a

    _assert_like_eager(inside, x)


def test_is_inference_inside_the_program():
    def fn(x):
        with torch.inference_mode():
            a = x * 2
        return a * 2 if a.is_inference() else a

    _assert_like_eager(fn, torch.randn(4))


def test_a_call_under_inference_mode_does_not_reuse_an_entry_compiled_outside_it():
    def fn(x, w):
        return (x * w).sin(), x[1:]

    x, w = torch.randn(4), torch.randn(4, requires_grad=True)
    jfn = thunder_rs.jit(fn)
    for context in (torch.no_grad, torch.inference_mode, torch.enable_grad, torch.inference_mode, torch.no_grad):
        with context():
            expected, actual = fn(x, w), jfn(x, w)
        assert _flags(actual) == _flags(expected)
        torch.testing.assert_close(actual, expected)
    reasons = thunder_rs.compile_stats(jfn).miss_reasons
    assert len(reasons) == 3 and "inference mode False -> True" in reasons[1]


def test_grad_mode_enabled_inside_inference_mode_is_refused():
    def fn(x):
        with torch.enable_grad():
            return x.sin() * x

    x, jfn = torch.randn(4, requires_grad=True), thunder_rs.jit(fn)
    with torch.no_grad():
        assert jfn(x).requires_grad  # eager's, under no_grad
    with torch.inference_mode():
        assert not fn(x).requires_grad  # inference mode records no gradient whatever grad mode says
        with pytest.raises(ThunderNotImplementedError, match=r"grad mode is enabled inside torch.inference_mode\(\)"):
            jfn(x)


def test_a_normal_tensor_returned_from_a_call_under_inference_mode_is_refused():
    def fn(x):
        with torch.inference_mode(False):
            return x * 3

    x = torch.randn(4)
    with torch.inference_mode():
        assert not fn(x).is_inference()
        with pytest.raises(ThunderNotImplementedError, match=r"inference_mode\(False\)"):
            thunder_rs.jit(fn)(x)
