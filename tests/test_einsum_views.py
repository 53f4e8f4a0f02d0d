"""``torch.einsum`` of one tensor that sums nothing (``"ij->ji"``, ``"ii->i"``) and ``aten.alias``
return views in eager: a write through the result inside the program changes the tensor it views
(and its version), and a write to the tensor shows through the result. The trace computed new
tensors for both (einsum's composite, alias an eager fallback), so such writes were silently lost.
``ravel`` is the other way round: eager copies a tensor that is not contiguous.
"""

from __future__ import annotations

import pytest
import torch

import thunder_rs

_VIEWS = [
    ("ij->ji", (2, 3)),
    ("ji", (2, 3)),
    ("ii->i", (3, 3)),
    ("iij->ji", (2, 2, 3)),
    ("...ij->...ji", (2, 2, 3)),
    ("ijk->kji", (2, 1, 3)),
    ("ij->i", (2, 3)),  # (a sum: a new tensor in both)
]


def _einsum(equation):
    return lambda x: torch.einsum(equation, x)


def _run(program, make, jit: bool):
    x = make()
    out = (thunder_rs.jit(program) if jit else program)(x)
    return out, x, x._version


def _assert_as_eager(program, make):
    (out, x, version), (expected, eager_x, eager_version) = _run(program, make, True), _run(program, make, False)
    for a, e in zip(out, expected, strict=True):
        assert torch.equal(a, e) and a.stride() == e.stride()
    assert torch.equal(x, eager_x) and (version > 0) == (eager_version > 0)  # (written or not)


@pytest.mark.parametrize(("equation", "shape"), _VIEWS)
@pytest.mark.parametrize("write", ["view", "base"])
def test_a_write_inside_the_program_through_a_one_operand_einsum_is_eagers(equation, shape, write):
    take = _einsum(equation)

    def program(x):
        y = take(x)
        (y if write == "view" else x).mul_(2).add_(1)
        return y * 3, x + 0

    _assert_as_eager(program, lambda: torch.arange(float(torch.Size(shape).numel())).reshape(shape))


@pytest.mark.parametrize(("equation", "shape"), _VIEWS)
def test_a_returned_one_operand_einsum_is_a_view_the_caller_writes_through(equation, shape):
    def program(x):
        return torch.einsum(equation, x)

    def write_after(jit: bool):
        x = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
        out = (thunder_rs.jit(program) if jit else program)(x)
        out.add_(10)
        return out, x

    for actual, expected in zip(write_after(True), write_after(False)):
        assert torch.equal(actual, expected) and actual.stride() == expected.stride()


def test_gradients_through_writes_into_einsum_views_and_aliases_are_eagers():
    def program(x):
        h = x * 1
        torch.einsum("ij->ji", h).mul_(2)
        torch.einsum("ii->i", h).add_(3)
        torch.ops.aten.alias(h).mul_(1.5)
        return (h * h).sum()

    x = torch.randn(3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    grads = []
    for fn in (thunder_rs.jit(program), program):
        leaf = x.clone().requires_grad_()
        fn(leaf).backward()
        grads.append(leaf.grad)
    assert torch.equal(*grads)


@pytest.mark.parametrize("alias", [torch.ops.aten.alias, torch.ops.aten.alias.default])
@pytest.mark.parametrize("write", ["view", "base"])
def test_a_write_inside_the_program_through_aten_alias_is_eagers(alias, write):
    def program(x):
        y = alias(x)
        (y if write == "view" else x).mul_(2)
        return (y + 1,)

    _assert_as_eager(program, lambda: torch.arange(6.0).reshape(2, 3))
    assert not thunder_rs.examine(program, torch.ones(2, 3)).fallbacks


@pytest.mark.parametrize("take", ["contiguous", "strided", "transposed"])
@pytest.mark.parametrize("ravel", [torch.ravel, torch.Tensor.ravel])
def test_ravel_copies_where_eager_copies(take, ravel):
    """``ravel`` is eager's ``contiguous().view(-1)``: a copy of a tensor that is not contiguous,
    also of a slice with a step whose dims a reshape would view; the trace viewed it, so a write
    through the result changed the tensor."""

    def program(x):
        y = ravel(x)
        y.add_(1)
        return (y * 2,)

    def make():
        base = torch.arange(100.0).reshape(5, 5, 4)
        return {"contiguous": base, "strided": base[..., ::2], "transposed": base.transpose(0, 1)}[take]

    _assert_as_eager(program, make)
