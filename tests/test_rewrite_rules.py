"""Rewrite rules from Python, as data (issue 27): registered with ``thunder_rs.register_rules``,
run by the Rust rewrite driver at the stage they name, against eager PyTorch."""

import pytest
import torch

import thunder_rs
from thunder_rs.errors import ThunderRuntimeError, ThunderTypeError, ThunderValueError
from thunder_rs.rules import REST, Rule, composite, ops, register_rules, var

X, Y = var("x"), var("y")


def _silu(x):
    """``silu`` as thunder_rs decomposes it: ``x / (exp(-x) + 1)``."""
    return ops.div(x, ops.add(ops.exp(ops.neg(x)), 1.0))


#: x * sigmoid(x) -> silu(x)
SWISH = Rule(
    "swish",
    pattern=ops.mul(X, ops.call("ltorch.sigmoid", X)),
    replacement=composite("ltorch.silu", X, decomposition=_silu(X)),
)


@pytest.fixture(scope="module", autouse=True)
def rule_sets():
    register_rules("test_swish", [SWISH])
    register_rules("test_swish_backward", [SWISH], stage="backward")


class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        h = self.fc1(x)
        return self.fc2(h * torch.sigmoid(h))


def _notes(traces) -> dict:
    return {t.label: t.note for t in traces if t.note}


def test_swish_fires_and_the_mlp_matches_eager_with_gradients():
    torch.manual_seed(0)
    model = _MLP()
    jmodel = thunder_rs.jit(model, passes=["test_swish"])
    x = torch.randn(5, 8, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    out, expected = jmodel(x), model(xe)
    torch.testing.assert_close(out, expected)
    grads = torch.autograd.grad(out.sum(), [x, *model.parameters()])
    expected_grads = torch.autograd.grad(expected.sum(), [xe, *model.parameters()])
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want)
    traces = thunder_rs.last_traces(jmodel)
    assert _notes(traces)["test_swish"] == "fired: swish x1"
    final = str(traces[-1])
    assert "silu" in final and "sigmoid" not in final, final


def test_a_pattern_that_does_not_match_leaves_the_trace_unchanged():
    # sigmoid(x) * x: the operands in the other order are another pattern.
    def fn(x):
        return torch.sigmoid(x) * x

    jfn = thunder_rs.jit(fn, passes=["test_swish"])
    x = torch.randn(3, 4)
    torch.testing.assert_close(jfn(x), fn(x))
    traces = thunder_rs.last_traces(jfn)
    labels = [t.label for t in traces]
    at = labels.index("test_swish")
    assert str(traces[at]) == str(traces[at - 1])
    assert traces[at].note == "fired: nothing"


def test_parameters_match_by_name_and_replacements_read_them():
    # sum(x * 2.0, dims) -> sum(x, dims) * 2.0, for the last dim only
    d = var("d")
    rule = Rule(
        "sum-of-doubled",
        pattern=ops.sum(ops.mul(X, 2.0).single_use(), dims=d),
        replacement=ops.mul(ops.sum(X, d), 2.0),
    )
    only_dim_0 = Rule("sum-dim-0", pattern=ops.sum(ops.mul(X, 2.0), dims=(0,)), replacement=ops.sum(X, (0,)))
    register_rules("test_sum_rules", [only_dim_0, rule])

    def fn(x):
        return (x * 2.0).sum(dim=1)

    jfn = thunder_rs.jit(fn, passes=["test_sum_rules"])
    x = torch.randn(3, 5)
    torch.testing.assert_close(jfn(x), fn(x))
    assert _notes(thunder_rs.last_traces(jfn))["test_sum_rules"] == "fired: sum-of-doubled x1"


@pytest.mark.parametrize(
    "rule, message",
    [
        (Rule("r", ops.exq(X), X), r'rule r names "exq", which is no prim'),
        (Rule("r", ops.exp(X), ops.nge(X)), r'rule r: the replacement calls "nge", which is no prim'),
        (Rule("r", ops.exp(X), ops.neg(Y)), r'rule r: the replacement reads "y", which the pattern'),
        (Rule("r", ops.add(X), X), r"rule r: add takes 2 operands, the pattern gives it 1"),
        (Rule("r", ops.exp(X), ops.add(X)), r"rule r: add takes 2 operands, the replacement gives it 1"),
        (Rule("r", ops.exp(X), ops.sum(X)), r"rule r: the replacement.s sum needs its parameter dims"),
        (Rule("r", ops.sum(X, dim=(1,)), X), r'rule r: sum has no parameter "dim"; its parameters'),
        (Rule("r", ops.call("ltorch.nope", X), X), r'rule r names "ltorch.nope", which is no prim'),
        (Rule("r", X, X), r"rule r: a pattern is a call"),
        (Rule("r", ops.exp(X), ops.mul(X, object())), r"rule r: a literal is a number, a tuple of ints"),
    ],
)
def test_registration_errors_name_the_rule_and_the_name(rule, message):
    with pytest.raises(ThunderValueError, match='rule set "bad": ' + message):
        register_rules("bad", [rule])
    assert "bad" not in thunder_rs.registered_passes()


def test_registration_refuses_what_is_not_a_rule_or_a_stage():
    with pytest.raises(ThunderTypeError, match="expected thunder_rs.Rule objects"):
        register_rules("bad", [(ops.exp(X), X)])
    with pytest.raises(ThunderValueError, match=r'stage is one of program, forward, backward, got "later"'):
        register_rules("bad", [SWISH], stage="later")


def test_a_replacement_of_another_dtype_is_caught_naming_the_rule():
    widen = Rule("widen", pattern=ops.exp(X), replacement=ops.convert_element_type(X, torch.float64))
    register_rules("test_widen", [widen])
    jfn = thunder_rs.jit(lambda x: torch.exp(x) + 1, passes=["test_widen"])
    with pytest.raises(ThunderRuntimeError, match=r"rule widen replaced t\d+ \(.*f32.*\) by t\d+ \(.*f64"):
        jfn(torch.randn(3))


def test_rules_on_the_backward_stage():
    # The backward of x * sigmoid(x) has no sigmoid call: a backward rule set runs, and fires there only
    # where its pattern is; the results are eager's.
    times_two = Rule("add-self", pattern=ops.add(X, X), replacement=ops.mul(X, 2.0))
    register_rules("test_backward_add_self", [times_two], stage="backward")

    def fn(x):
        return x * x

    jfn = thunder_rs.jit(fn, passes=["test_backward_add_self"])
    x = torch.randn(4, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    out, expected = jfn(x), fn(xe)
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x.grad, xe.grad)
    assert "test_backward_add_self" not in _notes(thunder_rs.last_traces(jfn))
    assert _notes(thunder_rs.last_backward_traces(jfn))["test_backward_add_self"] == "fired: add-self x1"


def test_a_list_of_operands_in_a_pattern_and_a_replacement():
    # cat([-x, -y], 0) -> -cat([x, y], 0); a value replaced by itself is no rewrite
    hoist = Rule("hoist-neg", pattern=ops.cat([ops.neg(X), ops.neg(Y)], 0), replacement=ops.neg(ops.cat([X, Y], 0)))
    itself = Rule("itself", pattern=ops.cat([X, REST], 0).bind("c"), replacement=var("c"))
    register_rules("test_cat", [itself, hoist])

    def fn(a, b):
        return torch.cat([-a, -b]) + 1

    jfn = thunder_rs.jit(fn, passes=["test_cat"])
    a, b = torch.randn(2, 3), torch.randn(1, 3)
    torch.testing.assert_close(jfn(a, b), fn(a, b))
    assert _notes(thunder_rs.last_traces(jfn))["test_cat"] == "fired: hoist-neg x1"


def test_jits_with_and_without_rules_do_not_share_cache_entries():
    def fn(x):
        return x * torch.sigmoid(x)

    plain, rewritten = thunder_rs.jit(fn), thunder_rs.jit(fn, passes=["test_swish"])
    x = torch.randn(2, 3)
    torch.testing.assert_close(plain(x), fn(x))
    torch.testing.assert_close(rewritten(x), fn(x))
    assert "silu" not in str(thunder_rs.last_traces(plain)[-1])
    assert "silu" in str(thunder_rs.last_traces(rewritten)[-1])
    assert thunder_rs.cache_misses(plain) == 1 and thunder_rs.cache_misses(rewritten) == 1


def test_registering_a_name_again_recompiles_the_jits_that_run_it():
    def fn(x):
        return torch.exp(x) + torch.exp(x)

    register_rules("test_again", [Rule("add-self", pattern=ops.add(X, X), replacement=ops.mul(X, 2.0))])
    jfn = thunder_rs.jit(fn, passes=["test_again"])
    x = torch.randn(3)
    torch.testing.assert_close(jfn(x), fn(x))
    assert _notes(thunder_rs.last_traces(jfn))["test_again"] == "fired: add-self x1"
    register_rules("test_again", [])
    torch.testing.assert_close(jfn(x), fn(x))
    assert thunder_rs.cache_misses(jfn) == 2
    assert _notes(thunder_rs.last_traces(jfn))["test_again"] == "fired: nothing"


def test_a_rule_set_is_a_stage_timed_and_dumped_with_what_fired(monkeypatch, capsys):
    monkeypatch.setenv("THUNDER_RS_DUMP", "test_swish")

    def fn(x):
        return x * torch.sigmoid(x)

    jfn = thunder_rs.jit(fn, passes=["test_swish"])
    jfn(torch.randn(3))
    err = capsys.readouterr().err
    assert "after test_swish" in err and "fired: swish x1" in err and "ltorch.silu" in err, err
    assert "pass:test_swish" in thunder_rs.compile_stats(jfn).stage_s
