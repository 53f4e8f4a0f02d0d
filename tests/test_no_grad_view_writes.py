"""In-place writes into views taken under ``torch.no_grad()``, compared with eager: eager refuses
a write with grad mode on into such a view (or a view of one) where the view or the value
requires grad ("A view was created in no_grad mode and is being modified inplace with grad mode
enabled ... it is forbidden"), and once the memory of such a view that requires grad was written
(under ``no_grad`` too, or through its base or another view), any op that records a gradient
through it ("... its base or another view of its base has been modified inplace ..."). Writes
it allows (both under ``no_grad``, memory and value requiring no grad, through ``detach()``)
give eager's values and gradients.

What differed: the trace took such a view as any view and ran the write, differentiating it
(a view of a leaf was refused with the leaf's error instead)."""

import pytest
import torch

import thunder_rs


def _no_grad_view(t, take=lambda t: t[:, :2]):
    with torch.no_grad():
        return take(t)


def _written_base_then_used(x):
    y = x * 2
    v = _no_grad_view(y)
    y.add_(1)
    return v * 3


def _written_under_no_grad_then_used(x):
    y = x * 2
    v = _no_grad_view(y)
    with torch.no_grad():
        v.add_(1)
    return v.sum()


def _other_view_written_then_used(x):
    y = x * 2
    v = _no_grad_view(y)
    y[:, 1:3].mul_(2)
    return v + 1


def _both_under_no_grad(x):
    y = x * 2
    with torch.no_grad():
        y[:, :2].add_(1)
    return y


def _through_detach(x):
    y = x * 2
    _no_grad_view(y).detach().add_(1)
    return y * x


def _written_then_only_read_without_grad(x):
    y = x * 2
    v = _no_grad_view(y)
    with torch.no_grad():
        v.add_(1)
    return y * x, (v > 0).sum()


REFUSED = {
    "of a leaf": lambda x: _no_grad_view(x).add_(1),
    "of an intermediate": lambda x: _no_grad_view(x * 2).add_(1),
    "a value requiring grad": lambda x: _no_grad_view(x * 2).mul_(x[:, 2:]),
    "memory requiring no grad, a value requiring grad": lambda x: _no_grad_view(torch.zeros(3, 4)).add_(x[:, :2]),
    "transposed": lambda x: _no_grad_view(x * 2, torch.t).add_(1),
    "viewed whole": lambda x: _no_grad_view(x * 2, lambda t: t.view(12)).zero_(),
    "copy_": lambda x: _no_grad_view(x * 2).copy_(x[:, 1:3]),
    "a view of one, taken with grad": lambda x: _no_grad_view(x * 2)[0].add_(1),
    "indexed assignment into a view of one": lambda x: _no_grad_view(x * 2).__setitem__(0, 5.0),
    "written through its base, then used": _written_base_then_used,
    "written under no_grad, then used": _written_under_no_grad_then_used,
    "written through another view, then used": _other_view_written_then_used,
}

ALLOWED = {
    "both under no_grad": _both_under_no_grad,
    "memory and value requiring no grad": lambda x: _no_grad_view(torch.zeros(3, 4)).add_(1) * x[:, :2],
    "through detach()": _through_detach,
    "written, then read without a gradient": _written_then_only_read_without_grad,
}


def _x():
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_write_eager_refuses_raises_eagers_error(name):
    fn = REFUSED[name]
    with pytest.raises(RuntimeError) as eager:
        fn(_x())
    with pytest.raises(RuntimeError) as jitted:
        thunder_rs.jit(fn)(_x())
    assert "created in no_grad mode and" in str(eager.value)
    essence = str(eager.value).split("created in no_grad mode", 1)[1]
    assert essence in str(jitted.value), (str(jitted.value), str(eager.value))


@pytest.mark.parametrize("name", list(ALLOWED))
def test_a_write_eager_runs_gives_eagers_values_and_gradient(name):
    fn = ALLOWED[name]
    results = []
    for call in (fn, thunder_rs.jit(fn)):
        x = _x()
        outs = call(x)
        outs = outs if isinstance(outs, tuple) else (outs,)
        (grad,) = torch.autograd.grad(outs[0].sum(), x)
        results.append(([o.detach() for o in outs], grad))
    (expected, eager_grad), (got, grad) = results
    assert all(torch.equal(g, e) for g, e in zip(got, expected)) and torch.equal(grad, eager_grad)
