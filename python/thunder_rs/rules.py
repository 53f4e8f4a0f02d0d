"""Rewrite rules as data, for users who do not write Rust: a pattern over prims and composite
symbols, and a replacement, registered by name and run by the Rust rewrite driver at the stage
the rule set names, when a jit names it::

    from thunder_rs.rules import Rule, composite, ops, var, register_rules

    x = var("x")
    swish = Rule(
        "swish",  # x * sigmoid(x) -> silu(x)
        pattern=ops.mul(x, ops.call("ltorch.sigmoid", x)),
        replacement=composite("ltorch.silu", x, decomposition=ops.div(x, ops.add(ops.exp(ops.neg(x)), 1.0))),
    )
    register_rules("my_rules", [swish], stage="program")
    jfn = thunder_rs.jit(fn, passes=["my_rules"])

A pattern is a call: ``ops.<prim>(operands..., params...)`` with the prim's parameters after
its operands or by name (``ops.sum(x, dims=(1,))``), or ``ops.call("ltorch.sigmoid", x)`` for a
composite symbol; an operand is a call, a variable (``var("x")``; a variable used twice matches
equal operands), or a literal that must be equal (``1.0`` is a float: it does not match ``1``).
``.bind("name")`` binds a call's output, ``.single_use()`` requires it to have no other use.

A replacement is a variable the pattern bound, a prim call on bound values and literals (every
parameter given), or ``composite(symbol, *args, decomposition=call)``: one call of a registered
composite that executors run whole, its decomposition (prim calls) its meaning. What can never
work is refused at registration with a ``ThunderValueError`` naming the rule set, the rule and the
name; a replacement of another dtype or shape is refused when the rule fires, naming the rule.
The stage's record (``last_traces``) notes how often each rule fired.
"""

from dataclasses import dataclass
from typing import Any

from thunder_rs import _core
from thunder_rs.core.run.front import clear_jits_running
from thunder_rs.errors import ThunderTypeError


@dataclass(frozen=True)
class Var:
    """A variable: matches any operand or parameter, and stands for it in the replacement."""

    name: str

    def _data(self) -> tuple:
        return ("var", self.name)


class _Rest:
    """The remaining operands of a call, whatever they are (last; for prims taking a list)."""

    def _data(self) -> tuple:
        return ("rest",)

    def __repr__(self) -> str:
        return "REST"


REST = _Rest()


@dataclass(frozen=True)
class Call:
    """A call of a prim (or, in a pattern, of a composite symbol) on operands and parameters."""

    callee: str
    args: tuple = ()
    params: tuple = ()
    bound_to: str | None = None
    is_single_use: bool = False

    def bind(self, name: str) -> "Call":
        """This call, its output bound to ``name`` (in a pattern)."""
        return Call(self.callee, self.args, self.params, name, self.is_single_use)

    def single_use(self) -> "Call":
        """This call, matching only an output with no other use (so the rewrite leaves it dead)."""
        return Call(self.callee, self.args, self.params, self.bound_to, True)

    def _data(self) -> tuple:
        args = tuple(_node(a) for a in self.args)
        params = tuple((k, _node(v)) for k, v in self.params)
        return ("call", self.callee, args, params, self.bound_to, self.is_single_use)


@dataclass(frozen=True)
class Composite:
    """A replacement: one call of the registered composite ``symbol`` on ``args``, with the prim
    calls of ``decomposition`` as its meaning."""

    symbol: str
    args: tuple
    decomposition: Call

    def _data(self) -> tuple:
        return ("composite", self.symbol, tuple(_node(a) for a in self.args), _node(self.decomposition))


def var(name: str) -> Var:
    """The variable ``name``."""
    if not isinstance(name, str) or not name:
        raise ThunderTypeError(f"var: a variable's name is a non-empty str, got {name!r} (argument name)")
    return Var(name)


def composite(symbol: str, *args, decomposition: Call) -> Composite:
    """A replacement by one call of the registered composite ``symbol`` (``ltorch.silu``)."""
    return Composite(symbol, args, decomposition)


class _Ops:
    """``ops.<prim>(*operands_then_params, **params)`` builds a call of that prim;
    ``ops.call(name, *args)`` a call of any prim or composite symbol by name."""

    @staticmethod
    def call(callee: str, *args, **params) -> Call:
        return Call(callee, args, tuple(params.items()))

    def __getattr__(self, prim: str):
        if prim.startswith("_"):
            raise AttributeError(prim)
        return lambda *args, **params: Call(prim, args, tuple(params.items()))


ops = _Ops()


@dataclass(frozen=True)
class Rule:
    """A named rewrite rule: ``pattern`` (a call) and its ``replacement``."""

    name: str
    pattern: Call
    replacement: Any


def _node(value) -> tuple:
    """``value`` as the nested tuples the Rust side reads (a literal for anything not a node)."""
    if isinstance(value, (Var, Call, Composite, _Rest)):
        return value._data()
    if isinstance(value, list):
        return ("list", tuple(_node(v) for v in value))
    return ("lit", value)


def register_rules(name: str, rules, stage: str = "program") -> None:
    """Registers ``rules`` as the pass ``name``, run at ``stage`` (``program``: before autodiff;
    ``forward``/``backward``: on the halves after the split) by ``jit(fn, passes=[name])``.
    Registering a name again replaces its rules, and the jits that run them compile again."""
    if not isinstance(name, str) or not name:
        raise ThunderTypeError(f"register_rules: a rule set's name is a non-empty str, got {name!r} (argument name)")
    rules = list(rules)
    for rule in rules:
        if not isinstance(rule, Rule):
            raise ThunderTypeError(f"register_rules: expected thunder_rs.Rule objects, got {rule!r} (argument rules)")
    data = [(r.name, _node(r.pattern), _node(r.replacement)) for r in rules]
    _core.register_rule_set(name, stage, data)
    clear_jits_running(name, f"rule set {name!r} was registered again")
