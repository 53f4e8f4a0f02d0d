"""A module's plain tensor attribute (not a parameter or buffer) is read anew each call, and its
``requires_grad`` and leafness change with no module write: by ``m.acc.requires_grad_()`` between
calls, or by the program's own in-place write of a value requiring grad (``self.acc.add_(x)``
makes ``acc`` require grad and stop being a leaf). The next call must not run the entry traced for
the other state: its outputs, gradients and the attribute equal eager's on every call."""

import copy

import pytest
import torch
import torch.nn as nn

import thunder_rs

F64 = torch.float64


class Accumulating(nn.Module):
    """Adds ``x`` into ``acc`` (held at ``self.acc``, ``self.sub.acc`` or ``self.state["acc"]``) in
    place, and returns what ``returns`` takes of it."""

    def __init__(self, returns: str, where: str = "self"):
        super().__init__()
        self.returns, self.where = returns, where
        acc = torch.zeros(2, 4, dtype=F64)
        if where == "sub":
            self.sub = nn.Module()
            self.sub.acc = acc
        elif where == "dict":
            self.state = {"acc": acc}
        else:
            self.acc = acc

    def held(self) -> torch.Tensor:
        return self.sub.acc if self.where == "sub" else self.state["acc"] if self.where == "dict" else self.acc

    def forward(self, x):
        acc = self.held()
        acc.add_(x)
        if self.returns == "view":
            return acc[1]
        if self.returns == "mul":
            return acc * 1
        return acc


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.requires_grad == b.requires_grad and a.is_leaf == b.is_leaf
    assert a.shape == b.shape and a.stride() == b.stride()
    assert torch.allclose(a.detach(), b.detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("where", ["self", "sub", "dict"])
@pytest.mark.parametrize("returns", ["view", "mul", "self"])
def test_own_write_of_a_value_requiring_grad(returns, where):
    """The first call's write makes ``acc`` require grad (not a leaf); later calls' outputs carry
    its history, so every call's ``x`` gets eager's gradient (the first entry's dropped it)."""
    m = Accumulating(returns, where)
    e, j = copy.deepcopy(m), thunder_rs.jit(m)
    xs, ys, outs, expected = [], [], [], []
    for _ in range(3):
        x = torch.randn(2, 4, dtype=F64, requires_grad=True)
        y = x.detach().clone().requires_grad_()
        xs.append(x), ys.append(y)
        outs.append(j(x)), expected.append(e(y))
        _same(outs[-1], expected[-1])
        _same(m.held(), e.held())
    sum(o.sum() for o in outs).backward()
    sum(w.sum() for w in expected).backward()
    for x, y in zip(xs, ys):
        assert x.grad is not None and torch.allclose(x.grad, y.grad, rtol=0, atol=1e-12)


class Scaling(nn.Module):
    def __init__(self):
        super().__init__()
        self.acc = torch.zeros(2, 4, dtype=F64)

    def forward(self, x):
        return self.acc * x


def _pair() -> tuple:
    x = torch.randn(2, 4, dtype=F64, requires_grad=True)
    return x, x.detach().clone().requires_grad_()


def _unfrozen(m: Scaling, values: torch.Tensor) -> None:
    with torch.no_grad():
        m.acc.copy_(values)
    m.acc.requires_grad_()


def test_requires_grad_set_between_calls():
    """``m.acc.requires_grad_()`` after a call: the next call's ``acc`` gets eager's gradient."""
    m = Scaling()
    e, j = copy.deepcopy(m), thunder_rs.jit(m)
    x, y = _pair()
    _same(j(x), e(y))
    values = torch.randn(2, 4, dtype=F64)
    _unfrozen(m, values), _unfrozen(e, values)
    out, want = j(x), e(y)
    _same(out, want)
    out.sum().backward(), want.sum().backward()
    assert m.acc.grad is not None and torch.equal(m.acc.grad, e.acc.grad)
    assert torch.equal(x.grad, y.grad)


def test_requires_grad_cleared_between_calls_and_set_again():
    """Unset again, the output requires no grad, as eager's; set again, the entry traced for it
    serves the call (a guarded hit, no compile) with eager's gradient."""
    m = Scaling()
    values = torch.randn(2, 4, dtype=F64)
    _unfrozen(m, values)
    e, j = copy.deepcopy(m), thunder_rs.jit(m)
    x, y = _pair()
    _same(j(x), e(y))
    m.acc.requires_grad_(False), e.acc.requires_grad_(False)
    _same(j(x), e(y))
    m.acc.requires_grad_(), e.acc.requires_grad_()
    out, want = j(x), e(y)
    _same(out, want)
    out.sum().backward(), want.sum().backward()
    assert m.acc.grad is not None and torch.equal(m.acc.grad, e.acc.grad)
    stats = thunder_rs.compile_stats(j)
    assert (stats.cache_misses, stats.cache_hits) == (2, 1)


def test_detached_between_calls_runs_the_first_entry_again():
    """``m.acc.detach_()`` after the writes made it a non-leaf: the next call is the first call's
    state again, served by its entry (a guarded hit), and every ``x`` gets eager's gradient."""
    m = Accumulating("view")
    e, j = copy.deepcopy(m), thunder_rs.jit(m)
    xs, ys, outs, expected = [], [], [], []
    for call in range(4):
        if call == 2:
            m.acc.detach_(), e.acc.detach_()
        x, y = _pair()
        xs.append(x), ys.append(y)
        outs.append(j(x)), expected.append(e(y))
        _same(outs[-1], expected[-1])
        _same(m.acc, e.acc)
    sum(o.sum() for o in outs).backward()
    sum(w.sum() for w in expected).backward()
    # (eager's detach_ cut the first two calls' outputs off their inputs: their grads stay None)
    assert [x.grad is None for x in xs] == [y.grad is None for y in ys] == [True, True, False, False]
    assert all(torch.equal(x.grad, y.grad) for x, y in zip(xs[2:], ys[2:]))
    stats = thunder_rs.compile_stats(j)
    assert (stats.cache_misses, stats.cache_hits) == (2, 2)
