"""A call eager has no derivative for in an argument the program computed (``special.zeta(x * 2,
q)``'s ``x * 2``, ``igamma(a + 1, x)``'s ``a + 1``), against eager: eager's backward raises "the
derivative for 'zeta' is not implemented" only where the engine runs a node towards that argument
(a gradient of ``x`` is asked for, or of a tensor the argument was computed from), and otherwise
computes the others' (``autograd.grad(out, q)``, ``backward(inputs=[q])``).

What differed: the compiled backward computed the gradient of every argument the trace computed,
and raised eager's error also where only ``q``'s was asked for (``fallback._grads``: only the
caller's own tensors were asked whether the engine takes their gradient); a double backward's
(``create_graph=True``) asked for the gradient of every input that requires grad."""

import pytest
import torch

import thunder_rs

PROGRAMS = {
    "zeta(x * 2, q)": lambda x, q: torch.special.zeta(x * 2, q),
    "zeta(x.exp(), q) * q": lambda x, q: torch.special.zeta(x.exp(), q) * q,
    "igamma(a + 1, x)": lambda x, q: torch.igamma(x + 1, q),
    "zeta(q * 2, q)": lambda x, q: torch.special.zeta(q * 2, q) + x,
}

#: how the gradient is asked for
ASKED = {
    "grad of q": lambda out, x, q: torch.autograd.grad(out.sum(), q),
    "grad of x": lambda out, x, q: torch.autograd.grad(out.sum(), x),
    "grad of both": lambda out, x, q: torch.autograd.grad(out.sum(), (x, q)),
    "backward": lambda out, x, q: (out.sum().backward(), x.grad, q.grad)[1:],
    "backward(inputs=[q])": lambda out, x, q: (out.sum().backward(inputs=[q]), x.grad, q.grad)[1:],
    "grad of q, create_graph": lambda out, x, q: torch.autograd.grad(out.sum(), q, create_graph=True),
    "grad of both, create_graph": lambda out, x, q: torch.autograd.grad(out.sum(), (x, q), create_graph=True),
}


def _run(fn, ask):
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(4, generator=g, dtype=torch.float64) + 1.5).requires_grad_()
    q = (torch.rand(4, generator=g, dtype=torch.float64) + 1).requires_grad_()
    out = fn(x, q)
    try:
        return out.detach(), ask(out, x, q)
    except (RuntimeError, NotImplementedError) as e:
        return out.detach(), (type(e), str(e))


@pytest.mark.parametrize("how", list(ASKED))
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_a_gradient_through_a_call_without_a_derivative_raises_or_computes_as_eager(name, how):
    fn, ask = PROGRAMS[name], ASKED[how]
    out, grads = _run(fn, ask)
    jout, jgrads = _run(thunder_rs.jit(fn), ask)
    torch.testing.assert_close(jout, out)
    if isinstance(grads[0], type):
        assert jgrads == grads
    else:
        assert not isinstance(jgrads[0], type), jgrads
        assert len(jgrads) == len(grads)
        for a, b in zip(jgrads, grads):
            assert (a is None) == (b is None)
            if b is not None:
                torch.testing.assert_close(a.detach(), b.detach())
                assert a.requires_grad == b.requires_grad
