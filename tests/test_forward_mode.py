"""Forward-mode differentiation inside a jitted program: ``torch.func.linearize``'s output and its
jvp function, traced by reverse mode twice (``core.lang.traced_grads.linearize``), or run as one
eager call where the function's backward cannot be traced; values, ``requires_grad`` and the
program's gradients through them against eager's."""

import re

import pytest
import torch
from torch.func import linearize  # (bound before tracing, as a program's module imports it)
from torch.utils._pytree import tree_flatten

import thunder_rs

torch.manual_seed(0)


def close(actual, expected):
    """(forward mode traced as reverse mode twice: other kernels than eager's dual numbers)"""
    torch.testing.assert_close(actual, expected)


def fallbacks(program, *args) -> dict:
    return thunder_rs.examine(program, *args).fallbacks


def _det(x):  # (det's backward is an eager fallback: its linearize runs as one eager call)
    return torch.linalg.det(torch.outer(x, x) + torch.eye(3))


LINEARIZED = {
    "twice": lambda x, t: (lambda out, jvp_fn: (out, jvp_fn(t), jvp_fn(t.cos())))(
        *linearize(lambda x: x.sin() * x.sum(), x)
    ),
    "torch.func": lambda x, t: torch.func.linearize(lambda x: (x.exp(), x.tanh().sum()), x)[1](t),
    "two_primals": lambda x, t: linearize(lambda a, b: (a * b).cumsum(0), x, t.sin())[1](t, x),
    "dict": lambda x, t: linearize(lambda p: {"y": p["a"] @ p["a"].T}, {"a": x.view(1, 3)})[1]({"a": t.view(1, 3)}),
    "constant": lambda x, t: linearize(lambda x: t.sin(), x)[1](t),
    "under_no_grad": lambda x, t: _under_no_grad(x, t),
    "det": lambda x, t: (lambda out, jvp_fn: (out, jvp_fn(t)))(*linearize(_det, x)),
}


def _under_no_grad(x, t):
    with torch.no_grad():
        out, jvp_fn = linearize(torch.sin, x)
    return out, jvp_fn(t)  # (called with grad on: eager's graph carries t's gradient)


@pytest.mark.parametrize("program", LINEARIZED.values(), ids=LINEARIZED.keys())
def test_linearize_equals_eagers_values_requires_grad_and_gradients(program):
    """Was refused; eager's jvp function holds the primals as constants, so the program's gradient
    reaches them only through the output, and the tangents through the jvp."""
    x, t = torch.randn(3), torch.randn(3)
    ours = [v.clone().requires_grad_() for v in (x, t)]
    eagers = [v.clone().requires_grad_() for v in (x, t)]
    actual, expected = thunder_rs.jit(program)(*ours), program(*eagers)
    close(actual, expected)
    flat_actual, flat_expected = tree_flatten(actual)[0], tree_flatten(expected)[0]
    assert [v.requires_grad for v in flat_actual] == [v.requires_grad for v in flat_expected]
    if any(v.requires_grad for v in flat_expected):
        sum(v.pow(2).sum() for v in flat_actual if v.requires_grad).backward()
        sum(v.pow(2).sum() for v in flat_expected if v.requires_grad).backward()
        close([v.grad for v in ours], [v.grad for v in eagers])


def test_linearize_is_traced_and_an_untraceable_backward_runs_as_one_eager_call():
    x, t = torch.randn(3), torch.randn(3)
    assert fallbacks(LINEARIZED["twice"], x, t) == {}
    assert fallbacks(LINEARIZED["det"], x, t) == {"torch.func.linearize": 1}


def test_linearize_of_a_function_writing_or_drawing_is_refused_naming_the_transform_and_line():
    def writes(x):
        out, jvp_fn = linearize(lambda y: y.mul_(2), x.clone())
        return jvp_fn(torch.ones_like(x))

    def draws(x):
        out, jvp_fn = linearize(lambda y: torch.nn.functional.dropout(y, 0.5), x)
        return jvp_fn(torch.ones_like(x))

    x = torch.randn(3)
    for program, what in ((writes, "writes a tensor in place"), (draws, "draws random numbers")):
        program(x)  # (eager runs them: its linearize evaluates the function twice)
        refused = rf"torch\.func\.linearize at .*test_forward_mode\.py:\d+: .*{what}"
        with pytest.raises(NotImplementedError, match=refused):
            thunder_rs.jit(program)(x)


def test_linearizes_tangent_checks_raise_eagers_errors():
    def program(x):
        return linearize(torch.sin, x)[1](torch.ones(4))

    x = torch.randn(3)
    with pytest.raises(RuntimeError, match="tangent:0 with shape") as expected:
        program(x)
    with pytest.raises(RuntimeError, match=re.escape(str(expected.value))):
        thunder_rs.jit(program)(x)


def test_a_vmap_of_linearizes_jvp_function_equals_eagers():
    """Each example's tangent as eager's (was refused)."""

    def program(x, tangents):
        out, jvp_fn = linearize(lambda x: x.sin() * x.sum(), x)
        return out, torch.vmap(jvp_fn)(tangents)

    x, tangents = torch.randn(3), torch.randn(4, 3)
    ours, eagers = [(x.clone().requires_grad_(), tangents.clone().requires_grad_()) for _ in range(2)]
    actual, expected = thunder_rs.jit(program)(*ours), program(*eagers)
    close(actual, expected)
    sum(v.pow(2).sum() for v in actual).backward()
    sum(v.pow(2).sum() for v in expected).backward()
    close([v.grad for v in ours], [v.grad for v in eagers])


def test_linearize_of_values_a_vmap_batched_raises_eagers_error():
    def program(xs, t):
        return torch.vmap(lambda x: linearize(torch.sin, x)[1](t))(xs)

    xs, t = torch.randn(4, 3), torch.randn(3)
    with pytest.raises(RuntimeError, match="Batching rule not implemented for aten::_make_dual"):
        program(xs, t)
    with pytest.raises(RuntimeError, match=r"aten::_make_dual.*test_forward_mode\.py:\d+"):
        thunder_rs.jit(program)(xs, t)
