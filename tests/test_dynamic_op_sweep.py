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

from dynamic_op_sweep import MUST_SPECIALISE, check_sample, sample_of, sweep_dtype
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
]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(("name", "index"), QUICK, ids=[f"{n}#{i}" for n, i in QUICK])
def test_a_grown_sample_compiles_twice_with_eagers_results(name: str, index: int) -> None:
    op = OPS[name]
    dtype = sweep_dtype(op)
    outcome = check_sample(op, dtype, index, sample_of(op, dtype, index))
    assert (outcome.status, outcome.compiles) == ("symbolic", 2), outcome


def test_ops_that_must_specialise_are_in_the_table() -> None:
    assert set(MUST_SPECIALISE) <= set(OPS)
