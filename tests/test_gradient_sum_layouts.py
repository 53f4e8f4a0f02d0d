"""Sums of gradients laid out as eager's: autograd adds a value's second gradient into the first
one it received, in place, where it holds the last reference (``InputBuffer::accumulate``), so the
sum keeps that gradient's strides. A channels_last ``[N, C, 1, 1]`` gradient (a CNN whose feature
map has shrunk to 1x1) is also contiguous, and an out-of-place sum of it is laid out contiguous;
batch norm's backward then ran its contiguous kernel on a channels_last input, other roundings:
gradients up to 0.3% off eager's in single elements (efficientnet_b0 on 32x32 images).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import thunder_rs

C = 8


class Residual(nn.Module):
    """A 1x1 convolution and batch norm, added to the block's input (in place or not)."""

    def __init__(self, inplace: bool):
        super().__init__()
        self.conv, self.bn, self.inplace = nn.Conv2d(C, C, 1, bias=False), nn.BatchNorm2d(C), inplace

    def forward(self, x):
        r = self.bn(self.conv(x))
        if self.inplace:
            r += x
            return r
        return r + x


class Inverted(nn.Module):
    """A mobilenet block: expand, depthwise, project, each with batch norm, hardswish between."""

    def __init__(self, inplace: bool):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(C, 2 * C, 1, bias=False),
            nn.BatchNorm2d(2 * C),
            nn.Hardswish(inplace=inplace),
            nn.Conv2d(2 * C, 2 * C, 3, padding=1, groups=2 * C, bias=False),
            nn.BatchNorm2d(2 * C),
            nn.Hardswish(inplace=inplace),
            nn.Conv2d(2 * C, C, 1, bias=False),
            nn.BatchNorm2d(C),
        )
        self.inplace = inplace

    def forward(self, x):
        r = self.layers(x)
        if self.inplace:
            r += x
            return r
        return r + x


def _train_like_eager(model: nn.Module, make_input, steps: int):
    """Trains ``model`` channels_last, compiled and eager, with SGD; asserts equal outputs and
    gradients at each step."""
    model = model.to(memory_format=torch.channels_last)
    eager = copy.deepcopy(model)
    compiled = thunder_rs.jit(model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, eager)]
    for step in range(steps):
        x, y = make_input()
        outs = [f(x) for f in (compiled, eager)]
        for out in outs:
            F.cross_entropy(out.flatten(1), y).backward()
        assert torch.equal(outs[0], outs[1]), step
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            assert torch.equal(p.grad, q.grad), (step, name, (p.grad - q.grad).abs().max())
        for opt in opts:
            opt.step()
            opt.zero_grad()


@pytest.mark.parametrize("inplace", [False, True], ids=["out_of_place", "in_place"])
def test_a_residual_sum_of_1x1_channels_last_gradients_matches_eager(inplace: bool):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(C, C, 1, bias=False), nn.BatchNorm2d(C), Residual(inplace), nn.Conv2d(C, 10, 1))

    def make_input():
        return torch.randn(8, C, 1, 1), torch.randint(0, 10, (8,))

    _train_like_eager(model, make_input, steps=2)


@pytest.mark.parametrize("inplace", [False, True], ids=["out_of_place", "in_place"])
def test_a_mobilenet_style_cnn_pooled_to_1x1_trains_as_eager(inplace: bool):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, C, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(C),
        nn.Hardswish(inplace=inplace),
        nn.AdaptiveAvgPool2d(1),
        Inverted(inplace),
        Inverted(inplace),
        nn.Conv2d(C, 10, 1),
    )

    def make_input():
        return torch.randn(8, 3, 8, 8).to(memory_format=torch.channels_last), torch.randint(0, 10, (8,))

    _train_like_eager(model, make_input, steps=3)


class PartialShortcut(nn.Module):
    """ReXNet's block end: the shortcut added to the first channels of a wider projection."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(C, C + 4, 1, bias=False), nn.BatchNorm2d(C + 4)

    def forward(self, x):
        y = self.bn(self.conv(x))
        return torch.cat([y[:, :C] + x, y[:, C:]], dim=1)


def test_a_rexnet_style_partial_shortcut_trains_as_eager():
    """The gradient of each slice ``y[:, :C]``, ``y[:, C:]`` is eager's ``slice_backward``'s, a new
    row-major tensor, and so is their sum: the slice prim's VJP padded the channels_last
    cotangent, which stayed channels_last, and batch norm's backward then ran its channels_last
    kernel (timm's rexnet_100 on 32x32 images, channels_last: 139 of 227 gradients off eager)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, C, 1, bias=False), nn.BatchNorm2d(C), PartialShortcut(), nn.Conv2d(C + 4, 10, 1))

    def make_input():
        images = torch.randn(4, 3, 2, 2).to(memory_format=torch.channels_last)
        return images, torch.randint(0, 10, (4,))

    _train_like_eager(model, make_input, steps=2)


@pytest.mark.parametrize(
    "program",
    [
        lambda x: x[:, 2:] * 2,
        lambda x: x[1:, :, 1:4] * 2,
        lambda x: x.narrow(1, 2, 3) * 2,
        lambda x: torch.ops.aten.slice(x, 1, 1, 4) * 2,
        lambda x: x.select(2, -1)[:, :, None] * 2,
    ],
    ids=["channels", "batch and rows", "narrow", "aten.slice", "select"],
)
def test_the_gradient_of_slices_is_row_major_as_eagers(program):
    """Eager's ``SliceBackward0`` (``SelectBackward0``) writes the cotangent into new row-major
    zeros, whatever its layout (one per dim sliced); the slice prim's VJP padded a channels_last
    cotangent, which stayed channels_last."""
    x = torch.randn(2, 6, 5, 4).to(memory_format=torch.channels_last).requires_grad_()
    sides = []
    for fn in (program, thunder_rs.jit(program)):
        out = fn(x)
        cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
        (grad,) = torch.autograd.grad(out, x, cotangent.to(memory_format=torch.channels_last))
        sides.append(grad)
    assert sides[1].stride() == sides[0].stride()
    assert torch.equal(sides[1], sides[0])
