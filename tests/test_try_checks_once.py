"""A call that raises only on some values (a factorisation of a matrix that is not positive
definite, an index past the end), made inside the program's ``try`` block, runs once per compiled
call where its outputs need no gradient: the check of whether it raises (``ValueReads.raised``)
is the call itself, whose outputs the program goes on with, as eager's one call. Before, every
compiled call ran it twice (the check, then the op). Where it raises, the variant that runs the
``except`` clause runs as before; where its outputs need a gradient, the op is recorded after the
check (its grad rule needs it).

The runs are counted by a ``TorchDispatchMode`` around each call, eager's and the compiled
program's alike."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import thunder_rs

pytestmark = pytest.mark.usefixtures("one_thread")


class _Counted(TorchDispatchMode):
    """How many times each aten op whose name holds ``part`` ran."""

    def __init__(self, part: str):
        super().__init__()
        self.part, self.runs = part, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.runs += str(func).startswith(f"aten.{self.part}.")
        return func(*args, **(kwargs or {}))


def _counted(fn, part: str, *args):
    with _Counted(part) as counter:
        out = fn(*args)
    return out, counter.runs


def _assert_equal(got, expected) -> None:

    got_leaves = torch.utils._pytree.tree_leaves(got)
    expected_leaves = torch.utils._pytree.tree_leaves(expected)
    assert len(got_leaves) == len(expected_leaves)
    for a, b in zip(got_leaves, expected_leaves):
        if isinstance(b, torch.Tensor):
            assert a.dtype == b.dtype and torch.equal(a, b)
        else:
            assert a == b


def _factored(a, b):
    try:
        low, route = torch.linalg.cholesky(a), 0
    except torch.linalg.LinAlgError:
        low, route = torch.eye(a.shape[-1], dtype=a.dtype), 1
    return torch.cholesky_solve(b, low), route


def _spd(sign: float):
    m = torch.arange(9, dtype=torch.float64).reshape(3, 3) / 9
    return sign * (m @ m.T + 3 * torch.eye(3, dtype=torch.float64))


@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad", "grad"])
def test_a_factorisation_in_a_try_block_runs_once_per_call_as_eager(requires_grad):
    run, b = thunder_rs.jit(_factored), torch.ones(3, 1, dtype=torch.float64)
    for sign in (1.0, -1.0, 1.0, 1.0, -1.0, -1.0, 1.0):
        a = _spd(sign).requires_grad_(requires_grad)
        got, runs = _counted(run, "linalg_cholesky_ex", a, b)
        expected, eager_runs = _counted(_factored, "linalg_cholesky_ex", a, b)
        _assert_equal(got, expected)
        if requires_grad and not got[1]:
            (ga,) = torch.autograd.grad(got[0].sum(), a, allow_unused=True, materialize_grads=True)
            (ea,) = torch.autograd.grad(expected[0].sum(), a, allow_unused=True, materialize_grads=True)
            assert torch.equal(ga, ea)
    # the last calls take the path of the one before: no divergence, the steady count
    a = _spd(1.0).requires_grad_(requires_grad)
    run(a, b)
    assert _counted(run, "linalg_cholesky_ex", a, b)[1] == (
        2 if requires_grad else 1
    )  # (with grad: check, then the op)
    assert _counted(_factored, "linalg_cholesky_ex", a, b)[1] == 1
    a = _spd(-1.0)
    run(a, b)
    assert _counted(run, "linalg_cholesky_ex", a, b)[1] == _counted(_factored, "linalg_cholesky_ex", a, b)[1] == 1


def _looked_up(ids, table):
    try:
        out = F.embedding(ids, table)
    except IndexError:
        out = table[-1:].expand(ids.shape[0], -1)
    try:
        hot = F.one_hot(ids, 4)
    except RuntimeError:
        hot = torch.zeros(ids.shape[0], 4, dtype=torch.int64)
    try:
        taken = torch.take(table, ids) + torch.index_select(table, 0, ids).sum(1)
    except (IndexError, RuntimeError):
        taken = torch.zeros(ids.shape, dtype=table.dtype)
    return out, hot, taken


def test_lookups_in_try_blocks_run_once_per_call_as_eager():
    run, table = thunder_rs.jit(_looked_up), torch.randn(4, 3)
    for ids in ([0, 3], [1, 9], [2, 2], [2, 1], [7, 0], [7, 1], [3, 3]):
        ids = torch.tensor(ids)
        _assert_equal(run(ids, table), _looked_up(ids, table))
    ids = torch.tensor([1, 2])
    run(ids, table)  # (the call before took the except clauses: this one diverges once)
    for part in ("embedding", "one_hot", "take", "index_select"):
        assert _counted(run, part, ids, table)[1] == _counted(_looked_up, part, ids, table)[1], part


def _inverted(a, b):
    try:
        inv = torch.linalg.inv(a)
        sol = torch.linalg.solve(a, b)
        lu = torch.linalg.lu_factor(a)
    except torch.linalg.LinAlgError:
        return torch.zeros_like(a), b, None
    return inv, sol, lu


def test_an_inverse_a_solve_and_a_factorisation_returning_a_named_tuple_run_once():
    run, b = thunder_rs.jit(_inverted), torch.ones(3, 2, dtype=torch.float64)
    singular = torch.ones(3, 3, dtype=torch.float64)
    for a in (_spd(1.0), singular, _spd(-1.0), _spd(-1.0), singular, singular):
        got, expected = run(a, b), _inverted(a, b)
        _assert_equal(got, expected)
        assert type(got[2]) is type(expected[2])
    run(_spd(2.0), b)  # (the call before took the except clause: this one diverges once)
    for part in ("linalg_inv_ex", "linalg_solve_ex", "linalg_lu_factor_ex"):
        assert _counted(run, part, _spd(2.0), b)[1] == _counted(_inverted, part, _spd(2.0), b)[1], part


def _renormed(ids, table):
    try:  # (max_norm renormalises the table's rows in place: the op stays recorded after its check)
        return F.embedding(ids, table, max_norm=1.0)
    except IndexError:
        return table[:1]


def test_an_embedding_that_writes_its_table_in_a_try_block_is_eagers():
    tables = [torch.arange(12.0).reshape(4, 3) for _ in range(2)]
    run = thunder_rs.jit(_renormed)
    for ids in ([0, 1], [5, 1], [2, 3]):
        ids = torch.tensor(ids)
        assert torch.equal(run(ids, tables[0]), _renormed(ids, tables[1]))
        assert torch.equal(tables[0], tables[1])


def _counts(x):
    try:
        counts = torch.bincount(x)
    except RuntimeError:  # (a negative value)
        counts = torch.zeros(1, dtype=torch.int64)
    return counts * 2


@pytest.mark.filterwarnings("ignore:thunder_rs.*recompiled")
def test_sizes_that_change_stay_symbolic_as_where_the_op_is_recorded_after_its_check():
    # (on tensors of symbolic sizes the op is recorded after its check; a bincount's output size
    # read where it is its own check is at the site of one recorded after it: one variant serves
    # every count, as before)
    run = thunder_rs.jit(_factored)
    for n in (3, 4, 5, 6, 5):
        for sign in (1.0, -1.0):
            a, b = sign * torch.eye(n, dtype=torch.float64), torch.ones(n, 1, dtype=torch.float64)
            _assert_equal(run(a, b), _factored(a, b))
    assert thunder_rs.cache_misses(run) == 4
    run = thunder_rs.jit(_counts)
    for x in ([1, 2, 2], [0, 5, 1], [-1, 2], [3, 3], [1, 7, 2, 2]):
        assert torch.equal(run(torch.tensor(x)), _counts(torch.tensor(x)))
    assert thunder_rs.cache_misses(run) == 4
