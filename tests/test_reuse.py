"""Buffer reuse (``passes::reuse``): generated code writes an elementwise call's result into its
receiver when that is a fresh intermediate dying at the call. Everything a program can observe
must stay eager's: outputs (values, dtypes, shapes, strides), inputs, values it returned or
viewed, gradients, random draws."""

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import thunder_rs
from test_inplace import DTYPES, assert_same, check_against_eager, execution_source
from test_inplace_modules import assert_in_place_only_on_dying_intermediates


def in_place_calls(source: str) -> list[str]:
    return re.findall(r"\.(\w+_)\(", source.replace("__", ""))


def chain(a, b):
    return torch.exp(torch.sin((a + b) * a) - b).tanh()


def grows(a, b):
    """A fresh intermediate of ``a``'s shape and dtype meets ``b``: broadcasting or promotion
    makes the result bigger or wider than the receiver, which then must not be written."""
    return ((a * 1.5).exp() * b + 1).sin()


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_elementwise_chain_reuses_its_intermediates_and_leaves_its_inputs_alone(dtype):
    a, b = torch.randn(4, 5, dtype=dtype), torch.randn(4, 5, dtype=dtype)
    jfn = check_against_eager(chain, a, b, calls=3)
    source = execution_source(jfn)
    # The first call allocates (its operands are the inputs); each later one writes into it.
    assert in_place_calls(source) == ["mul_", "sin_", "sub_", "exp_", "tanh_"], source
    assert_in_place_only_on_dying_intermediates(source)
    out = jfn(a, b)
    assert out.stride() == chain(a, b).stride()


@pytest.mark.parametrize(
    "make",
    [
        lambda: (torch.randn(5, 4).t(), torch.randn(4, 5)),  # non-contiguous receiver source
        lambda: (torch.randn(4, 5), torch.randn(5)),  # broadcast second operand
        lambda: (torch.randn(1, 5), torch.randn(4, 1)),  # both broadcast: the first call grows
        lambda: (torch.randn(()), torch.randn(())),  # 0-d
        lambda: (torch.randn(0, 5), torch.randn(0, 5)),  # empty
        lambda: (torch.randn(4, 5), torch.randn(4, 5, dtype=torch.float64)),  # promotion to float64
        lambda: (torch.randn(4, 5), torch.tensor(2.0, dtype=torch.float64)),  # 0-d tensors do not promote
    ],
    ids=["noncontiguous", "broadcast", "outer", "zero_dim", "empty", "promotion", "zero_dim_f64"],
)
@pytest.mark.parametrize("fn", [chain, grows], ids=["chain", "grows"])
def test_layouts_broadcasts_and_promotion_match_eager(make, fn):
    a, b = make()
    jfn = check_against_eager(fn, a, b)
    out, expected = jfn(a, b), fn(a, b)
    assert out.stride() == expected.stride() and out.dtype == expected.dtype


def test_integer_and_boolean_chains_keep_their_dtypes():
    def fn(i, j):
        k = (i * j + 3) // 2  # int64 throughout: reused
        q = k / 4  # true division makes floats: allocates
        m = (k > 2) & (j < 5)  # bools
        return q.sqrt().neg(), m.logical_not(), (k - 1).abs()

    i, j = torch.arange(12).reshape(3, 4), torch.arange(12, 0, -1).reshape(3, 4)
    check_against_eager(fn, i, j)


def test_values_returned_viewed_or_read_later_are_not_overwritten():
    def fn(x):
        a = x.exp()
        v = a.view(-1)  # a is viewed: never reused
        b = a.sin()
        c = b.cos()  # b is returned: never reused
        d = (c * 2).tanh()
        e = d.neg()
        f = d.sigmoid()  # d read after e: e's call must not reuse it
        return v, b, e + f

    check_against_eager(fn, torch.randn(3, 4))


def test_user_in_place_ops_and_aliases_keep_eager_meaning():
    def fn(x, y):
        a = x.exp()
        a.mul_(2)  # the program's own in-place op on a local
        b = a + 1
        c = b.t()  # a view of b, then b's last use
        d = b.sin()
        return c * 3, d, a

    check_against_eager(fn, torch.randn(4, 4), torch.randn(4, 4))


def test_random_draws_are_eagers():
    def fn(x):
        p = torch.sigmoid(x * 2)
        draws = torch.bernoulli(p)  # Tensor.bernoulli_ means something else: never picked
        return draws * 3 + F.dropout(p.exp(), 0.5)

    x = torch.randn(6, 6)
    jfn = thunder_rs.jit(fn)
    for seed in (0, 1):
        torch.manual_seed(seed)
        expected = fn(x)
        torch.manual_seed(seed)
        assert_same(jfn(x), expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_through_reused_forward_and_backward_equal_eager(dtype):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8)).to(dtype)

    def fn(x, w):
        h = model(x) * w
        return ((h.sin() + 1) * h.exp()).tanh().sum()

    x = torch.randn(5, 8, dtype=dtype, requires_grad=True)
    w = torch.randn(8, dtype=dtype, requires_grad=True)
    jfn = thunder_rs.jit(fn)
    for _ in range(2):
        grads = torch.autograd.grad(jfn(x, w), [x, w, *model.parameters()])
        expected = torch.autograd.grad(fn(x, w), [x, w, *model.parameters()])
        for g, e in zip(grads, expected):
            torch.testing.assert_close(g, e)
    backward = str(thunder_rs.last_backward_traces(jfn)[-1])
    assert in_place_calls(backward), backward
    assert_in_place_only_on_dying_intermediates(execution_source(jfn) + backward)


def test_grad_mode_on_without_differentiable_outputs_runs_without_autograd_errors():
    """The program path may run with grad on while intermediates require grad (nothing returned
    does): those intermediates are never written in place, so autograd has nothing to refuse."""
    w = torch.randn(4, requires_grad=True)

    def fn(x):
        return ((x * w).exp().sin() > 0.5).sum(), (x + 1).exp().cos()

    check_against_eager(fn, torch.randn(3, 4))


def test_a_module_with_buffers_and_residual_adds_trains_as_eager():
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.fc = nn.BatchNorm1d(6), nn.Linear(6, 6)

        def forward(self, x):
            return x + F.gelu(self.fc(self.norm(x))) * 0.5

    model, eager = Block(), Block()
    eager.load_state_dict(model.state_dict())
    jmodel = thunder_rs.jit(model)
    for _ in range(3):
        x = torch.randn(8, 6)
        out, expected = jmodel(x), eager(x)
        assert_same(out, expected)
        out.square().sum().backward()
        expected.square().sum().backward()
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
    torch.testing.assert_close(model.norm.running_mean, eager.norm.running_mean)
    torch.testing.assert_close(model.norm.running_var, eager.norm.running_var)
