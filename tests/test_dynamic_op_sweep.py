"""Shapes that change between calls across the OpInfo table (issue 26), with
``tests/dynamic_op_sweep.py``: a sample grown along one dim compiles twice (static, then
symbolic) over three sizes, with eager's outputs and gradients at each. The default run takes a
few samples of the families the sweep found specialising and the fixes below; ``--run-slow``
takes every sample of the table.

Then the fixes the sweep led to, each against eager: where a decomposition or meta rule read a
symbolic size as an int (``float(n)``, ``slice.indices``, a meta tensor of concrete sizes), the
size was specialised and each new size compiled again."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import thunder_rs
from dynamic_op_sweep import MUST_SPECIALISE, check_sample, outcomes, sample_of, sweep_dtype
from opinfos import OPINFOS

OPS = {op.id: op for op in OPINFOS}

#: (OpInfo id, sample index): elementwise, reductions, products, views, and one sample of each
#: family a fix below concerns.
QUICK = [
    ("add", 3),
    ("sum", 14),
    ("matmul", 0),
    ("softmax", 7),
    ("cat", 0),
    ("topk", 0),
    ("linalg_qr", 0),
    ("linalg_svdvals", 0),
    ("linalg_lstsq", 1),
    ("slice", 0),
    ("quantile", 1),
    ("multi_margin_loss", 6),
    ("getitem_int_list", 0),
    ("linalg_multi_dot", 1),
]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(("name", "index"), QUICK, ids=[f"{n}#{i}" for n, i in QUICK])
def test_a_grown_sample_compiles_twice_with_eagers_results(name: str, index: int) -> None:
    op = OPS[name]
    dtype = sweep_dtype(op)
    outcome = check_sample(op, dtype, index, sample_of(op, dtype, index))
    assert (outcome.status, outcome.compiles) == ("symbolic", 2), outcome


#: Outcomes of the whole table that are not the sweep's expected two compiles, by cause: a
#: decision on the size that flips between the sample's grown sizes (``min(m, n)`` as a dim
#: passes the other, a clamped slice bound), ops that must specialise (``MUST_SPECIALISE``),
#: mismatches a static compile at the same size has too (gradients at tied values, which the
#: grown samples' repeated values make), and failures of the first, static call (the sample as
#: ``tests/test_ops.py`` runs it): none of them symbolic sizes' doing.
ALLOWED_CAUSES = (
    "a decision flips between the grown sizes",
    "must specialise",
    "a static compile differs too",
    "call 1 ",
)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_every_sample_of_the_table_stays_symbolic() -> None:
    unexpected = [
        o
        for o in outcomes(None, all_samples=True)
        if o.status not in ("symbolic", "skipped") and not any(c in o.cause for c in ALLOWED_CAUSES)
    ]
    assert not unexpected, "\n".join(f"{o.op}#{o.index} {o.status} {o.compiles}: {o.cause}" for o in unexpected)


def test_ops_that_must_specialise_are_in_the_table() -> None:
    assert set(MUST_SPECIALISE) <= set(OPS)


def misses(jfn) -> int:
    return thunder_rs.compile_stats(jfn).cache_misses


def check_sizes(fn, make, sizes, compiles: int = 2) -> None:
    """``fn`` jitted over inputs of each size (``make(n)``, float64 tensors that require grad):
    eager's outputs and gradients at each, in ``compiles`` compiles."""
    jfn = thunder_rs.jit(fn)
    for n in sizes:
        torch.manual_seed(n)
        inputs = make(n)
        leaves = [t.detach().requires_grad_() for t in inputs]
        expected = fn(*leaves)
        ours_leaves = [t.detach().requires_grad_() for t in inputs]
        actual = jfn(*ours_leaves)
        torch.testing.assert_close(actual, expected)
        outs = [t for t in torch.utils._pytree.tree_leaves(expected) if t.requires_grad]
        mine = [t for t in torch.utils._pytree.tree_leaves(actual) if isinstance(t, torch.Tensor) and t.requires_grad]
        cotangents = [torch.randn_like(t) for t in outs]
        torch.testing.assert_close(
            torch.autograd.grad(mine, ours_leaves, cotangents), torch.autograd.grad(outs, leaves, cotangents)
        )
    assert misses(jfn) == compiles, thunder_rs.compile_stats(jfn).miss_reasons


def test_a_factorisation_keeps_its_sizes_symbolic():
    # The opaque linalg symbols took their outputs' metadata from meta tensors of the sizes'
    # values, a guard ``t0 == 5`` each: every size compiled again. Their meta kernels now run on
    # fake tensors of symbolic sizes; ``min(m, n)`` is a decision, which every size above 3 keeps.
    def qr_svd(a):
        q, r = torch.linalg.qr(a)
        return q, r, torch.linalg.svdvals(a), torch.linalg.lu_factor(a)[0]

    check_sizes(qr_svd, lambda n: [torch.randn(n, 3, dtype=torch.float64)], [4, 5, 7, 9])


def test_lstsq_keeps_its_sizes_symbolic():
    # Its meta rule broadcast the batch with ``torch.broadcast_shapes``, which a symbolic size
    # fails (symbolic compiles stopped), and made meta tensors of the sizes' values.
    def solve(a, b):
        return torch.linalg.lstsq(a, b).solution

    def batch(n):
        return [torch.randn(n, 5, 3, dtype=torch.float64), torch.randn(n, 5, 2, dtype=torch.float64)]

    check_sizes(solve, batch, [3, 4, 6])


def test_aten_slice_bounds_are_decisions_not_a_specialised_size():
    # ``slice.indices`` took the size as an int: a guard on its value.
    check_sizes(
        lambda x: torch.ops.aten.slice(x, 0, 1, 5, 2), lambda n: [torch.randn(n, 4, dtype=torch.float64)], [6, 7, 9]
    )


def test_quantile_ranks_scale_by_a_symbolic_length():
    # ``float(n - 1)`` specialised the reduced length.
    q = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    check_sizes(lambda x: torch.quantile(x, q, dim=0), lambda n: [torch.randn(n, 3, dtype=torch.float64)], [4, 5, 7])


def test_multi_margin_loss_divides_by_a_symbolic_class_count():
    # ``float(classes)`` specialised the number of classes.
    target = torch.tensor(1)
    check_sizes(
        lambda x: F.multi_margin_loss(x, target, reduction="none"),
        lambda n: [torch.randn(n, dtype=torch.float64)],
        [4, 5, 7],
    )


def test_a_negative_index_in_a_list_counts_from_a_symbolic_end():
    # ``x[[1, -1]]`` made the index ``-1 % n`` a constant: with n symbolic, ``prims.full`` of a
    # size failed and symbolic compiles stopped for the function.
    check_sizes(lambda x: x[[1, -1, 1]], lambda n: [torch.randn(n, 4, dtype=torch.float64)], [3, 4, 6, 9])


def test_a_product_of_list_items_equal_by_a_guard_stays_symbolic():
    # Lengths of different list items are different size inputs, equal only by the guard the
    # product records. The rewrite rule matmul-transposed-as-linear replaced a backward product
    # (its shape over one of them) by a linear whose shape is over the other: the rewrite check
    # refused the trace, and symbolic compiles stopped for the function.
    jfn = thunder_rs.jit(torch.linalg.multi_dot)
    for n in (3, 4, 6, 9):
        torch.manual_seed(n)
        items = [
            torch.randn(n, dtype=torch.float64),
            torch.randn(n, 5, dtype=torch.float64),
            torch.randn(5, 2, dtype=torch.float64),
        ]
        ours, theirs = [t.clone().requires_grad_() for t in items], [t.clone().requires_grad_() for t in items]
        actual, expected = jfn(ours), torch.linalg.multi_dot(theirs)
        torch.testing.assert_close(actual, expected)
        cotangent = torch.randn_like(expected)
        torch.testing.assert_close(
            torch.autograd.grad(actual, ours, cotangent), torch.autograd.grad(expected, theirs, cotangent)
        )
    assert misses(jfn) == 2, thunder_rs.compile_stats(jfn).miss_reasons
