"""``thunder_rs.examine`` reports every construct it meets that thunder_rs cannot compile as it
is, instead of raising on the first."""

import pytest
import thunder_rs
import torch
from custom_ops import running_sum
from thunder_rs.core.base import problems as P

RUNNING_SUM = "torch._ops.thunder_rs_tests.running_sum.default"


def _line(fn, offset: int) -> str:
    return f"{__file__}:{fn.__code__.co_firstlineno + offset}"


def test_fallbacks_data_dependent_branch_and_leaf_write_together():
    w = torch.zeros(3, requires_grad=True)

    def f(x):
        y = running_sum(x) * 2
        if y.sum() > 0:
            y = y + 1
        w.add_(1)
        return running_sum(y).sin()

    report = thunder_rs.examine(f, torch.randn(3))
    assert report.completed
    assert report.fallbacks == {RUNNING_SUM: 2}
    assert report.rows() == [
        (P.FALLBACK, RUNNING_SUM, 2, f"{_line(f, 1)}, {_line(f, 5)}"),
        (P.DATA_DEPENDENT, "torch.Tensor.__bool__", 1, _line(f, 2)),
        (P.INPLACE_LEAF, "add_", 1, _line(f, 4)),
    ]
    assert report.supported["ltorch.sin"] == 1 and report.supported["ltorch.mul"] == 1
    text = str(report)
    assert "2 eager fallbacks, 2 problems" in text
    for kind, what, n, _ in report.rows():
        assert kind in text and what in text
    # The same program under jit reads the branch's value, and stops at the write to the leaf.
    with pytest.raises(RuntimeError, match="add_: a leaf Variable"):
        thunder_rs.jit(f)(torch.randn(3))


def test_the_error_that_stops_tracing_is_a_row_after_the_problems_before_it():
    def f(x):
        n = int(x.sum())  # a stand-in lets examine go on
        y = running_sum(x)[:n]
        return y.nonzero()  # no stand-in: tracing stops here

    report = thunder_rs.examine(f, torch.ones(3))
    assert not report.completed and report.supported == {}
    kinds = [(kind, what, where) for kind, what, _, where in report.rows()]
    assert kinds == [
        (P.DATA_DEPENDENT, "torch.Tensor.__int__", _line(f, 1)),
        (P.FALLBACK, RUNNING_SUM, _line(f, 2)),
        (P.STOPPED, "ThunderRuntimeError", _line(f, 3)),
    ]
    assert "tracing stopped" in str(report) and "nonzero" in str(report)


def test_a_module_with_a_clean_forward_has_no_problems():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    report = thunder_rs.examine(model, torch.randn(2, 4))
    assert report.completed and report.problems == [] and report.fallbacks == {}
    assert report.supported.get("ltorch.linear") == 1
    assert "0 eager fallbacks, 0 problems" in str(report)


def test_examine_leaves_jit_as_before():
    def f(x):
        return x if x.sum() > 0 else -x

    thunder_rs.examine(f, torch.randn(3))
    assert not P.collecting()
    x = torch.randn(3)
    torch.testing.assert_close(thunder_rs.jit(f)(x), f(x))  # jit reads the value examine gave a stand-in for


def test_a_symbol_refusing_its_arguments_is_a_row_and_tracing_goes_on():
    def f(x):
        e = x[False]  # thunder_rs refuses; examine records it as an eager fallback
        return e.sum() + running_sum(x).sum()

    report = thunder_rs.examine(f, torch.randn(3))
    assert report.completed
    rows = report.rows()
    assert [(k, n, at) for k, _, n, at in rows] == [
        (P.UNSUPPORTED, 1, _line(f, 1)),
        (P.FALLBACK, 1, _line(f, 1)),
        (P.FALLBACK, 1, _line(f, 2)),
    ]
    assert rows[0][1] == rows[1][1] == "torch.Tensor.__getitem__"
    assert "indexing with False" in str(report)
