"""Gradients of view ops laid out as eager's under cotangents that are not row-major (channels_last,
transposed): each view's backward formula decides the layout. ``SliceBackward0`` (``narrow``,
``aten.slice``, ``tensor_split``) writes into new row-major zeros, also for a slice that is all of
its input; ``SplitBackward0`` and ``UnbindBackward0`` cat and stack the pieces' cotangents, which
keeps a layout they share; the others (permute, expand, diagonal, unfold) as their formulas lay out.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import thunder_rs


def channels_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` laid out channels_last (a 4-d tensor), else with its last two dims swapped in memory."""
    if t.ndim == 4:
        return t.to(memory_format=torch.channels_last)
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def transposed(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(0, 1).contiguous().transpose(0, 1)


CASES = {
    "narrow of all": (lambda x: x.narrow(1, 0, 6) * 2, (2, 6, 5, 4)),
    "aten.slice of all": (lambda x: torch.ops.aten.slice(x, 1, 0, 6) * 2, (2, 6, 5, 4)),
    "getitem of all": (lambda x: x[:, 0:6] * 2, (2, 6, 5, 4)),
    "unbind": (lambda x: tuple(p * 2 for p in x.unbind(0)), (3, 2, 6, 5, 4)),
    "unbind, some pieces": (lambda x: tuple(p * 2 for p in x.unbind(0)[::2]), (3, 2, 6, 5, 4)),
    "unbind of dim 1": (lambda x: tuple(p * 2 for p in x.unbind(1)), (2, 3, 6, 5, 4)),
    "unbind of one": (lambda x: x.unbind(0)[0] * 2, (1, 6, 5, 4)),
    "rows": (lambda x: tuple(row * 2 for row in x), (3, 2, 6, 5, 4)),
    "split": (lambda x: tuple(p * 2 for p in x.split(2, 1)), (2, 6, 5, 4)),
    "split, some pieces": (lambda x: tuple(p * 2 for p in x.split(2, 1)[1:]), (2, 6, 5, 4)),
    "split of all": (lambda x: x.split(6, 1)[0] * 2, (2, 6, 5, 4)),
    "chunk": (lambda x: tuple(p * 2 for p in x.chunk(3, 2)), (2, 6, 6, 4)),
    "split with sizes": (lambda x: tuple(p * 2 for p in x.split([1, 5], 1)), (2, 6, 5, 4)),
    "tensor_split": (lambda x: tuple(p * 2 for p in x.tensor_split(3, 1)), (2, 6, 5, 4)),
    "tensor_split of all": (lambda x: x.tensor_split(1, 1)[0] * 2, (2, 6, 5, 4)),
    "diagonal": (lambda x: x.diagonal(0, 1, 2).unsqueeze(-1) * 2, (2, 5, 5, 4)),
    "expand": (lambda x: x.expand(2, 6, 5, 4) * 2, (1, 6, 1, 4)),
    "permute": (lambda x: x.permute(0, 2, 3, 1) * 2, (2, 6, 5, 4)),
    "unfold": (lambda x: x.unfold(3, 2, 1).sum(-1) * 2, (2, 6, 5, 4)),
    "select_scatter": (lambda x: torch.select_scatter(x, x[:, 0] * 2, 1, 1) * 2, (2, 6, 5, 4)),
    "slice_scatter": (lambda x: torch.slice_scatter(x, x[:, 1:3] * 2, 1, 0, 2) * 2, (2, 6, 5, 4)),
}


def _input_gradient(program, shape, layout):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1)).requires_grad_()
    outs = program(x)
    outs = outs if isinstance(outs, tuple) else (outs,)
    cotangents = [layout(torch.randn(o.shape, generator=torch.Generator().manual_seed(i))) for i, o in enumerate(outs)]
    (grad,) = torch.autograd.grad(outs, x, cotangents)
    return grad


@pytest.mark.parametrize("layout", [channels_last, transposed], ids=["channels_last", "transposed"])
@pytest.mark.parametrize("name", CASES)
def test_view_gradients_have_eagers_layout(name, layout):
    program, shape = CASES[name]
    eager = _input_gradient(program, shape, layout)
    jitted = _input_gradient(thunder_rs.jit(program), shape, layout)
    assert jitted.stride() == eager.stride()
    assert torch.equal(jitted, eager)


def test_a_write_through_a_narrow_of_all_reaches_its_base_and_gradient():
    def program(x):
        y = x * 2
        y.narrow(1, 0, y.size(1)).mul_(3)
        return y

    x = torch.randn(2, 6, 5, 4).requires_grad_()
    cotangent = channels_last(torch.randn(2, 6, 5, 4))
    sides = []
    for fn in (program, thunder_rs.jit(program)):
        out = fn(x)
        sides.append((out, *torch.autograd.grad(out, x, cotangent)))
    assert sides[1][1].stride() == sides[0][1].stride()
    assert all(torch.equal(j, e) for j, e in zip(sides[1], sides[0]))


class Attention(nn.Module):
    """timm's ``Attention``: one projection to q, k and v, split by ``unbind(0)``."""

    def __init__(self, dim: int = 16, heads: int = 2):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q @ k.transpose(-2, -1) * (c // self.heads) ** -0.5).softmax(-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


def test_timm_style_attention_splitting_qkv_by_unbind_trains_as_eager():
    torch.manual_seed(0)
    eager = Attention()
    jitted = copy.deepcopy(eager)
    fns = (eager, thunder_rs.jit(jitted))
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, jitted)]
    for step in range(2):
        x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(step))
        grads = []
        for fn, optimizer in zip(fns, optimizers):
            xi = x.clone().requires_grad_()
            optimizer.zero_grad()
            fn(xi).square().sum().backward()
            optimizer.step()
            grads.append(xi.grad)
        assert grads[1].stride() == grads[0].stride()
        assert torch.equal(grads[1], grads[0])
        for (name, p), q in zip(eager.named_parameters(), jitted.parameters()):
            assert torch.equal(q.grad, p.grad), name
            assert torch.equal(q, p), name
