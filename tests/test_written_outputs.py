"""Outputs of a compiled call the caller writes in place before a backward (``saved_outputs``,
``run.autograd._check_made``): eager's backward raises where it runs a node that saved the written
output (``qr`` saves both ``Q`` and ``R``: a backward from ``Q`` alone raises once ``R`` was
written), and computes where no node it runs saved it. Each case runs eagerly and compiled: the
errors' texts are compared, or the gradients."""

import pytest
import torch

import thunder_rs

LEADING = "one of the variables needed for gradient computation has been modified by an inplace operation"


def _spd():
    """A symmetric positive-definite matrix with distinct eigenvalues (eigh, cholesky, svd)."""
    torch.manual_seed(0)
    a = torch.randn(4, 4, dtype=torch.float64)
    return (a @ a.T + 4 * torch.eye(4, dtype=torch.float64)).requires_grad_()


#: name: (the program, the number of its outputs); each returns its outputs as a tuple
OPS = {
    "exp": (lambda x: (x.exp(),), 1),
    "tanh": (lambda x: (x.tanh(),), 1),
    "sigmoid": (lambda x: (x.sigmoid(),), 1),
    "softmax": (lambda x: (x.softmax(-1),), 1),
    "log_softmax": (lambda x: (x.log_softmax(-1),), 1),
    "relu": (lambda x: (torch.relu(x - 0.5),), 1),
    "sqrt": (lambda x: (x.abs().sqrt(),), 1),
    "inverse": (lambda x: (torch.linalg.inv(x),), 1),
    "cholesky": (lambda x: (torch.linalg.cholesky(x),), 1),
    "det": (lambda x: (torch.linalg.det(x),), 1),
    "qr": (lambda x: tuple(torch.linalg.qr(x)), 2),
    "eigh": (lambda x: tuple(torch.linalg.eigh(x)), 2),
    "svd": (lambda x: tuple(torch.linalg.svd(x, full_matrices=False)), 3),
    "slogdet": (lambda x: tuple(torch.linalg.slogdet(x))[1:], 1),
    "sin": (lambda x: (x.sin(),), 1),  # (saves its input: a written output leaves eager's gradient)
    "scaled": (lambda x: (x * 2,), 1),  # (saves nothing)
    "exp and sin": (lambda x: (x.exp(), (x * 3).sin()), 2),
    "tanh and cos": (lambda x: (x.tanh(), x.cos()), 2),
    "sort values": (lambda x: (torch.sort(x, -1)[0],), 1),
    # (views returned: the caller's write into one writes the memory a node saved)
    "qr, a view of R": (lambda x: (lambda q, r: (q, r[1:]))(*torch.linalg.qr(x)), 2),
    "a row of exp, its sum": (lambda x: (lambda y: (y[0], y.sum()))(x.exp()), 2),
    "exp transposed": (lambda x: (x.exp().t(),), 1),
    # (V @ diag(L) @ V.T saves a view of V: eager names its node made again, AsStrided)
    "eigh, a product": (lambda x: (lambda v, w: (v, w, w @ torch.diag(v) @ w.T))(*torch.linalg.eigh(x)), 3),
}

CASES = [(op, w, lo) for op, (_, n) in OPS.items() for w in range(n) for lo in range(n)]
#: one quick case each of a multi-output node (another output written), a partial backward, a view
#: returned, and a view a later call saved
QUICK = {("qr", 1, 0), ("tanh and cos", 0, 1), ("qr, a view of R", 1, 0), ("eigh, a product", 1, 2)}


def _outcome(fn, written: int, loss: int):
    """``("error", its text)`` of the backward from output ``loss`` after output ``written`` was
    doubled in place, or ``("grad", x.grad)``."""
    x = _spd()
    outs = fn(x)
    outs[written].mul_(2)
    try:
        outs[loss].sum().backward()
    except RuntimeError as e:
        return "error", str(e)
    return "grad", x.grad


@pytest.mark.parametrize(
    "op, written, loss",
    [c if c in QUICK else pytest.param(*c, marks=pytest.mark.slow) for c in CASES],
)
def test_a_written_output_raises_where_eagers_backward_runs_a_node_that_saved_it(op, written, loss):
    """Where eager's backward runs a node that saved the output the caller wrote, the compiled
    call's raises eager's text (a backward from ``Q`` of ``qr`` after ``R`` was written, from the
    eigenvectors of ``eigh`` after the eigenvalues were, returned a gradient computed from the
    values the forward saw); elsewhere both give eager's gradients."""
    fn = OPS[op][0]
    eager, compiled = _outcome(fn, written, loss), _outcome(thunder_rs.jit(fn), written, loss)
    assert eager[0] == compiled[0], (eager, compiled)
    if eager[0] == "error":
        assert LEADING in eager[1]
        assert compiled[1].startswith(eager[1].partition(" instead.")[0]), (eager[1], compiled[1])
    else:
        torch.testing.assert_close(compiled[1], eager[1])


def _outputs_of_two_branches(x, w):
    return x.tanh(), w.cos()  # (tanh saves its output, cos its input)


@pytest.mark.parametrize("write", ["output", "input"])
@pytest.mark.parametrize("create_graph", [False, True])
def test_a_backward_from_one_output_computes_after_what_only_the_others_node_saved_was_written(write, create_graph):
    """A backward from the second output only, after the caller wrote the first output (which
    ``tanh`` saved) or the input ``x`` (which the compiled forward kept for ``tanh``'s gradient):
    eager's backward runs no node that saved it and computes; the compiled one raised, checking
    every tensor its forward kept."""
    grads = []
    for fn in (_outputs_of_two_branches, thunder_rs.jit(_outputs_of_two_branches)):
        torch.manual_seed(0)
        a, w = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
        x = a * 1
        first, second = fn(x, w)
        (first if write == "output" else x).mul_(2)
        second.sum().backward(create_graph=create_graph)
        grads.append((a.grad, w.grad.detach()))
    assert grads[1][0] is None and grads[0][0] is None
    torch.testing.assert_close(grads[1][1], grads[0][1])


def _exp_and_its_sine(x):
    y = x.exp()
    return y, y.sin()  # (sin saves y as its input)


def _scaled_and_its_sine(x):
    y = x * 2  # (its node saves nothing)
    return y, y.sin()


def _plus_one_and_its_square(x):
    y = x + 1
    return y, y * y


def _qr_and_a_product(x):
    q, r = torch.linalg.qr(x)
    return r, q @ r  # (mm saves r, output 1 of qr)


def _no_grad_double(t):
    with torch.no_grad():
        t.mul_(2)


@pytest.mark.parametrize("fn", [_exp_and_its_sine, _scaled_and_its_sine, _plus_one_and_its_square, _qr_and_a_product])
@pytest.mark.parametrize("write", [lambda t: t.mul_(2), lambda t: t.add_(1), _no_grad_double])
def test_an_output_a_later_call_saved_is_named_by_its_node_at_the_backward_as_eager(fn, write):
    """The first output, which a later call of the program saved as its input, written by the
    caller before a backward from the second: eager's error names the tensor's node then (the
    caller's ``mul_``: 'output 0 of Mul'; ``add_``: Add; one under no_grad: the node that made it),
    with its output number at the save (1 for ``R`` of ``qr``); the compiled call's named the node
    that made it (Exp, LinalgQr) or none."""
    texts = []
    for f in (fn, thunder_rs.jit(fn)):
        first, second = f(_spd())
        write(first)
        with pytest.raises(RuntimeError, match=LEADING) as caught:
            second.sum().backward()
        texts.append(str(caught.value).partition(" instead.")[0])
    assert texts[1] == texts[0]


def _qr_and_tanh(x):
    q, r = torch.linalg.qr(x)
    return q, r, x.tanh()


def test_a_backward_from_q_alone_after_an_output_no_node_it_runs_saved_was_written_is_eagers():
    """The tanh output written, then a backward from ``Q`` alone: eager's backward runs no node
    that saved it (``qr``'s gets no gradient for ``R``) and computes. The compiled backward for
    that pattern gives ``qr``'s backward None for ``R`` and reads no tanh output; it was refused,
    the backward for the pattern computing every gradient from zeros (reading the written output)."""
    grads = []
    for fn in (_qr_and_tanh, thunder_rs.jit(_qr_and_tanh)):
        x = _spd()
        q, _, t = fn(x)
        t.mul_(2)
        q.sum().backward()
        grads.append(x.grad)
    assert torch.equal(grads[1], grads[0])
