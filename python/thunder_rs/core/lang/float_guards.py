"""Decisions on float inputs (``symfloat.float_input``), kept as guards on their values.

Where a program decides something on a float computed from float inputs alone (``if s > 0.5``,
``max(s, 1e-8)``, the divisor of ``1 / s`` being nonzero, ``math.sqrt(s)``'s argument being
nonnegative), tracing answers on the value and records the decision: ``(op, a, b, answer,
site)``, ``a`` and ``b`` in ``symfloat``'s ``ops`` form. The compiled entry checks each on every
call (``float_args.FloatGuard``): the expressions evaluated in Python doubles with the call's
floats, by the same operations in the same order as the program's (``evaluate``), so a call on
which eager decides otherwise misses the cache and compiles (or raises, as eager does, where the
program divides by zero).
"""

import contextvars
import math
import operator

#: Python's operator by its symbol (as ``symfloat.OPERATORS``).
_OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "**": operator.pow}
#: ``math``'s own functions by the name ``ops`` gives them.
_MATH = {name: getattr(math, name) for name in ("sqrt", "exp", "expm1", "log", "log1p", "log2", "log10")}
#: The decisions recorded while the compile that ``symfloat.specialised_inputs`` opened traces.
DECISIONS: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_float_decisions", default=None)


def of_inputs(ops) -> bool | None:
    """True where ``ops`` reads float inputs and constants only, some input among them; False
    where constants only; None where it reads anything else (a size)."""
    if type(ops) in (int, float, bool):
        return False
    if type(ops) is not tuple:
        return None
    if ops[0] == "arg":
        return True
    found = False
    for part in ops[1:]:
        inner = of_inputs(part)
        if inner is None:
            return None
        found = found or inner
    return found


def evaluate(ops, values: dict | None):
    """The float ``ops`` computes with the float inputs ``values`` (``{value id: float}``; the hints
    where None): Python's operations on doubles, in the program's order."""
    if type(ops) is not tuple:
        return ops
    kind = ops[0]
    if kind == "arg":
        return ops[2] if values is None else values[ops[1]]
    if kind == "neg":
        return -evaluate(ops[1], values)
    if len(ops) == 2:
        return _MATH[kind](evaluate(ops[1], values))
    return _OPERATORS[kind](evaluate(ops[1], values), evaluate(ops[2], values))


def decide(op: str, a, b, site) -> bool | None:
    """``a <op> b`` on the float inputs' values when traced, recorded as a decision the entry
    guards (``site()`` where the program took it); None where either reads anything but float
    inputs and constants, neither reads one, or no compile records decisions."""
    noted = DECISIONS.get()
    if noted is None:
        return None
    kinds = (of_inputs(a), of_inputs(b))
    if None in kinds or not any(kinds):
        return None
    try:
        answer = getattr(operator, op)(evaluate(a, None), evaluate(b, None))
    except (ArithmeticError, ValueError, TypeError):
        return None
    if type(answer) is not bool:
        return None
    noted.append((op, a, b, answer, site()))
    return answer


def holds(decisions, values: dict) -> bool:
    """Whether every decision answers as recorded with the float inputs ``values``; False where an
    expression raises (the call compiles again, and the program raises as eager does)."""
    try:
        return all(
            getattr(operator, op)(evaluate(a, values), evaluate(b, values)) is answer
            for op, a, b, answer, _ in decisions
        )
    except (ArithmeticError, ValueError, TypeError, KeyError):
        return False


def text(ops, names: dict) -> str:
    """``ops`` as Python, float inputs by ``names`` (``{value id: label}``)."""
    if type(ops) is not tuple:
        return repr(ops)
    if ops[0] == "arg":
        return names.get(ops[1], f"t{ops[1]}")
    if ops[0] == "neg":
        return f"-{text(ops[1], names)}"
    if len(ops) == 2:
        return f"math.{ops[0]}({text(ops[1], names)})"
    return f"({text(ops[1], names)} {ops[0]} {text(ops[2], names)})"


SYMBOLS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
