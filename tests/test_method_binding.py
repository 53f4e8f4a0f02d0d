"""Tensor methods whose receiver is not the function's first argument bind as torch binds them."""

import pytest
import torch

import thunder_rs


@pytest.mark.parametrize(
    "call",
    [
        lambda c, x, y: x.where(c, y),
        lambda c, x, y: x.where(condition=c, other=y),
        lambda c, x, y: x.where(c, 2.5),
        lambda c, x, y: torch.where(c, x, y),
        lambda c, x, y: y.where(c, x) * x.where(~c, y),
    ],
)
def test_where_method_binds_receiver_as_values(call):
    x, y = torch.randn(4, 3), torch.randn(3)
    c = torch.randn(4, 3) > 0
    torch.testing.assert_close(thunder_rs.jit(call)(c, x, y), call(c, x, y))


def test_where_method_gradients():
    x, y = torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True)
    c = torch.randn(4, 3) > 0

    def f(c, x, y):
        return (x.where(c, y) * 2).sum()

    f(c, x, y).backward()
    expected = (x.grad, y.grad)
    x.grad = y.grad = None
    thunder_rs.jit(f)(c, x, y).backward()
    torch.testing.assert_close((x.grad, y.grad), expected)


def test_where_method_under_vmap():
    def f(c, x, y):
        return torch.vmap(lambda c, x: x.where(c, y))(c, x)

    x, y = torch.randn(4, 3), torch.randn(3)
    c = torch.randn(4, 3) > 0
    torch.testing.assert_close(thunder_rs.jit(f)(c, x, y), f(c, x, y))
