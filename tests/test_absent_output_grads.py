"""Gradients of a compiled call whose backward reaches only some outputs of a multi-output op
(``Q`` of ``qr`` without ``R``, the eigenvalues of ``eigh`` without the eigenvectors): eager's node
gets an undefined gradient for the others, and its backward formula leaves their terms out
(``eigh``'s is ``V diag(gL) V^H``, not the whole formula with ``gV`` zeros, which rounds
otherwise). The compiled backward for that pattern is the VJP pass's without the absent
cotangents' flow (``vjp::joint_without``): the op's backward gets None for them, as eager's.
Gradients and double backwards are compared with eager's bit for bit."""

import pytest
import torch

import thunder_rs


def _spd():
    """A symmetric positive-definite matrix with distinct eigenvalues (eigh, svd, cholesky)."""
    torch.manual_seed(0)
    a = torch.randn(4, 4, dtype=torch.float64)
    return (a @ a.T + 4 * torch.eye(4, dtype=torch.float64)).requires_grad_()


#: name: a program returning the op's outputs (those that carry a gradient, and its integer ones),
#: with another output of its own where the op has one differentiable output (values, indices)
OPS = {
    "qr": lambda x: tuple(torch.linalg.qr(x)),
    "qr, wide": lambda x: tuple(torch.linalg.qr(x[:3])),
    "eigh": lambda x: tuple(torch.linalg.eigh(x)),
    "svd": lambda x: tuple(torch.linalg.svd(x, full_matrices=False)),
    "svd, full": lambda x: tuple(torch.linalg.svd(x[:3])),
    "torch.svd": lambda x: tuple(torch.svd(x)),
    "lu": lambda x: tuple(torch.linalg.lu(x))[1:],
    "slogdet": lambda x: (*torch.linalg.slogdet(x)[1:], x.exp()),
    "topk": lambda x: (*torch.topk(x, 2, -1), x.exp()),
    "sort": lambda x: (*torch.sort(x, -1), x.exp()),
    "max": lambda x: (*torch.max(x, -1), x.exp()),
    "min": lambda x: (*torch.min(x, -1), x * 3),
    "qr and tanh": lambda x: (*torch.linalg.qr(x), x.tanh()),
}

CASES = [(op, k) for op, fn in OPS.items() for k, o in enumerate(fn(_spd())) if o.is_floating_point()]
#: the eigenvalues of eigh and U of svd alone: eager's formula without the others' terms rounds
#: otherwise (their gradients were an ulp off, computed with zeros for the others)
QUICK = {("eigh", 0), ("svd", 0)}


def _gradients(fn, used: int, create_graph: bool):
    """The gradient of a loss of output ``used`` alone and, with ``create_graph``, whether it
    requires grad and that of its squared sum where it does (a double backward). (The loss is
    linear in the output: a double backward through a compiled call from a loss that reads its
    output again adds the two paths' gradients in another order than eager, an ulp off, whatever
    the outputs used.)"""
    x = _spd()
    out = fn(x)[used]
    weights = torch.arange(1.0, out.numel() + 1, dtype=out.dtype).reshape(out.shape)
    (g,) = torch.autograd.grad((out * weights).sum(), x, create_graph=create_graph)
    if not create_graph:
        return (g,)
    if not g.requires_grad:  # (the op's gradient is linear in the cotangent: topk's values)
        return g, False
    (gg,) = torch.autograd.grad((g * g).sum(), x)
    return g.detach(), gg


@pytest.mark.parametrize("create_graph", [False, True])
@pytest.mark.parametrize("op, used", [c if c in QUICK else pytest.param(*c, marks=pytest.mark.slow) for c in CASES])
def test_a_backward_from_one_output_of_a_multi_output_op_is_eagers(op, used, create_graph):
    """A loss of one output of the op alone: the gradient (and the double backward's) bit for bit
    eager's, whose node gets no gradient for the op's other outputs."""
    fn = OPS[op]
    eager = _gradients(fn, used, create_graph)
    compiled = _gradients(thunder_rs.jit(fn), used, create_graph)
    for c, e in zip(compiled, eager):
        assert c is e if type(e) is bool else torch.equal(c, e), (c, e)


def test_a_backward_from_one_output_of_a_call_returning_the_others_through_an_add_is_eagers():
    """The eigenvalues both returned and added to the eigenvectors' product: a loss of the sum
    alone reaches eigh through both, a loss of the eigenvalues through one (eager's node then gets
    no gradient for the eigenvectors)."""

    def fn(x):
        values, vectors = torch.linalg.eigh(x)
        return values, vectors, values + (vectors * vectors).sum(0)

    for used in range(3):
        eager = _gradients(fn, used, False)
        compiled = _gradients(thunder_rs.jit(fn), used, False)
        assert torch.equal(compiled[0], eager[0]), used


#: programs of ops with a grad rule of several outputs (``std_mean``, ``native_group_norm``), one
#: of them unused by the loss or, inside the program, by anything
RULES = {
    "std_mean": lambda x: tuple(torch.std_mean(x, -1)),
    "std_mean, the std used inside": lambda x: (torch.std_mean(x, -1)[0] * 2, x.exp()),
    "var_mean": lambda x: tuple(torch.var_mean(x, -1)),
    "native_group_norm": lambda x: tuple(torch.native_group_norm(x.reshape(1, 3, 3), None, None, 1, 3, 3, 1, 1e-5)),
}


@pytest.mark.parametrize("op, used", [(op, k) for op, fn in RULES.items() for k in range(len(fn(_spd()[:3, :3])))])
def test_a_grad_rule_whose_backward_reaches_some_outputs_adds_no_zeros_for_the_others(op, used):
    """A rule's backward given no cotangent for some outputs leaves their terms out, as eager's
    formula does for undefined gradients: ``std_mean``'s from the std alone is the std's term,
    -0 where the input is its row's mean and the cotangent negative (with the mean's term of
    zeros added, +0)."""
    fn = RULES[op]
    grads = []
    for f in (fn, thunder_rs.jit(fn)):
        x = torch.tensor([[1.0, 2.0, 3.0], [0.0, 5.0, 10.0], [4.0, 4.0, 4.0]], dtype=torch.float64)
        x.requires_grad_()
        out = f(x)[used]
        weights = -torch.arange(1.0, out.numel() + 1, dtype=out.dtype).reshape(out.shape)
        grads.append(torch.autograd.grad((out * weights).sum(), x)[0])
    assert torch.equal(grads[1], grads[0]) and torch.equal(grads[1].signbit(), grads[0].signbit()), grads
