"""``torch.autograd.functional``'s jvp, vjp, hvp, vhp, jacobian and hessian inside a jitted program
(``core.lang.autograd_functional``: by the traced ``torch.func`` transforms): eager's structure,
values, ``requires_grad`` and the program's gradients through them. (Were refused: their
``torch.autograd.grad`` differentiates inside the program.)"""

import pytest
import torch
import torch.autograd.functional as AF
from torch.utils._pytree import tree_flatten

import thunder_rs

torch.manual_seed(0)
V1, V2 = torch.randn(3), torch.randn(3, 3)


def pair(x, y):
    return (x.sin() * y).sum(0), x.exp() @ y


def scalar(x, y):
    return (x.sin() * y.cos()).sum()


CALLS = {
    "jvp": lambda x, y: AF.jvp(lambda a: (a.sin() * a).sum(0), x, V2),
    "jvp_tuples": lambda x, y: AF.jvp(pair, (x, y), (V2, V2)),
    "jvp_create_graph": lambda x, y: AF.jvp(lambda a: a.sin() * y, x, V2, create_graph=True),
    "vjp_tuples": lambda x, y: AF.vjp(pair, (x, y), (V1, V2)),
    "vjp_without_v": lambda x, y: AF.vjp(lambda a: (a * y).sum(), x),
    "hvp": lambda x, y: AF.hvp(lambda a: scalar(a, y), x, V2),
    "hvp_tuples": lambda x, y: AF.hvp(scalar, (x, y), (V2, V2)),
    "vhp_create_graph": lambda x, y: AF.vhp(scalar, (x, y), (V2, V2), create_graph=True),
    "jacobian": lambda x, y: AF.jacobian(pair, (x, y)),
    "jacobian_vectorized": lambda x, y: AF.jacobian(lambda a: (a.sin() * a).sum(0), x, vectorize=True),
    "jacobian_create_graph": lambda x, y: AF.jacobian(pair, (x, y), create_graph=True),
    "jacobian_forward_mode": lambda x, y: AF.jacobian(pair, (x, y), vectorize=True, strategy="forward-mode"),
    "hessian": lambda x, y: AF.hessian(scalar, (x, y)),
    "hessian_create_graph": lambda x, y: AF.hessian(lambda a: scalar(a, y), x, create_graph=True),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_autograd_functional_inside_the_program_equals_eagers(name):
    """Values bit-equal (the same backward kernels); the program's gradients within tolerance."""
    call = CALLS[name]
    jitted = thunder_rs.jit(call)
    jitted(torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True))  # (then compiled)
    x, y = torch.randn(3, 3), torch.randn(3, 3)
    ours, eagers = [(x.clone().requires_grad_(), y.clone().requires_grad_()) for _ in range(2)]
    actual, expected = jitted(*ours), call(*eagers)
    assert thunder_rs.cache_hits(jitted) == 1
    flat_actual, spec = tree_flatten(actual)
    flat_expected, expected_spec = tree_flatten(expected)
    assert spec == expected_spec
    for a, e in zip(flat_actual, flat_expected):
        assert torch.equal(a, e) and a.requires_grad == e.requires_grad
    if any(e.requires_grad for e in flat_expected):
        grads = [
            torch.autograd.grad(sum(t.pow(2).sum() for t in flat if t.requires_grad), inputs, allow_unused=True)
            for flat, inputs in ((flat_actual, ours), (flat_expected, eagers))
        ]
        torch.testing.assert_close(grads[0], grads[1])


def test_eagers_argument_errors_and_strict_refused_naming_the_line():
    def no_v(x):
        return AF.vjp(lambda a: a * 2, x)

    def wrong_v(x):
        return AF.jvp(lambda a: a * 2, x, torch.ones(4))

    def strict(x):
        return AF.jacobian(lambda a: a * 2, x, strict=True)

    x = torch.randn(3)
    for program, message in ((no_v, "v can only be None"), (wrong_v, "v has invalid size")):
        with pytest.raises(RuntimeError, match=message):
            program(x)
        with pytest.raises(RuntimeError, match=message):
            thunder_rs.jit(program)(x)
    strict(x)  # (eager computes it: its checks ask autograd which outputs depend on which inputs)
    with pytest.raises(NotImplementedError, match=r"torch\.autograd\.grad: .* at .*test_autograd_functional\.py:\d+"):
        thunder_rs.jit(strict)(x)
