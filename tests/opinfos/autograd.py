"""Autograd state: detach (and `.data`), requires_grad_, and writes autograd does not see (under
`torch.no_grad()`, through `.data`), whose values change while their gradients pass as if unwritten.

The gradient test runs these with their floating inputs requiring grad, which is where they differ
from plain copies: which outputs require grad, and where gradients stop or go straight through.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .core import ALL, NUMERIC, ErrorInput, OpInfo, SampleInput, Strided, Transposed, cpu, tensor
from .elementwise import unary_samples


def _detached_product(a):
    """Only the second factor carries a gradient."""
    return a.detach() * a


def _data_product(a):
    return a.data * a


def _fresh_leaf_product(a):
    """A tensor made inside the program becomes a leaf that requires grad; the product's gradient
    reaches `a` only through the second factor."""
    return torch.ones_like(a).requires_grad_() * a


def _requires_grad_again(a):
    """A detached copy made a leaf that requires grad again (as Hugging Face does to embeddings)
    and used: the product's gradient reaches `a` only through the second factor. (Returning the
    leaf itself is refused: tests/test_inner_leaves.py.)"""
    out = (a * 2).detach()
    if out.is_floating_point():
        out.requires_grad_()
    return out * a


def requires_grad_errors() -> Iterable[ErrorInput]:
    # Only floating tensors can require grad.
    yield ErrorInput(SampleInput(cpu((3,), torch.int64)), RuntimeError)


def _copy_under_no_grad(a, b):
    """`b` copied into a tensor that does not require grad, where autograd does not see it: the
    result's values come from `b` but no gradient reaches `b`."""
    out = torch.zeros_like(a)
    with torch.no_grad():
        out.copy_(b)
    return out + a


def _scaled_under_no_grad(a):
    """Values scaled where autograd does not see it: the gradient of `b` passes to `a` unscaled."""
    b = a * 2
    with torch.no_grad():
        b.mul_(3)
    return b * a


def _scaled_through_data(a):
    b = a * 2
    b.data.mul_(3)
    return b * a


def pair_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Pairs where the second broadcasts to the first: equal, broadcasting, 0-dim, empty, non-contiguous."""
    for lhs, rhs in (((3, 4), (3, 4)), ((3, 4), (4,)), ((), ()), ((0, 3), (3,)), (Transposed((3, 4)), Strided((3, 4)))):
        yield SampleInput(tensor(lhs, dtype, device), tensor(rhs, dtype, device))


def _scaled_through_a_view(a):
    """A write through a view of a tensor that requires grad (eager's CopySlices): the root's
    gradient is a fresh tensor, the written part's gradient passes through the in-place op."""
    b = a * 1
    b.unsqueeze(0).mul_(-2)
    return b


def _scaled_through_a_slice(a):
    """The same through a slice (eager's CopySlices of a slice: written in place in the root's gradient)."""
    b = a * 1
    (b[..., :1] if b.ndim else b).mul_(-2)
    return b


OPS = [
    OpInfo("detach", torch.Tensor.detach, unary_samples, dtypes=ALL),
    OpInfo("detach", _detached_product, unary_samples, dtypes=NUMERIC, variant="product"),
    OpInfo("detach", _data_product, unary_samples, dtypes=NUMERIC, variant="data"),
    OpInfo("requires_grad_", _fresh_leaf_product, unary_samples, requires_grad_errors),
    # `x.detach().requires_grad_()` is a fresh leaf: no gradient reaches `x`.
    OpInfo("requires_grad_", _requires_grad_again, unary_samples, dtypes=ALL, variant="detached"),
    OpInfo("copy_", _copy_under_no_grad, pair_samples, dtypes=NUMERIC, variant="no_grad"),
    OpInfo("mul_", _scaled_under_no_grad, unary_samples, dtypes=NUMERIC, variant="no_grad"),
    OpInfo("mul_", _scaled_through_data, unary_samples, dtypes=NUMERIC, variant="data"),
    OpInfo("mul_", _scaled_through_a_view, unary_samples, dtypes=NUMERIC, variant="view"),
    OpInfo("mul_", _scaled_through_a_slice, unary_samples, dtypes=NUMERIC, variant="slice"),
]
