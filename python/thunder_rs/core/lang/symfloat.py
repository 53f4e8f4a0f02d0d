"""``SymFloat``: a Python float the program computes from sizes that change between calls.

``T ** -0.5``, ``1.0 / T``, ``T / 10``, ``T * 0.5`` of a symbolic size ``T`` (``symint.SymInt``)
give a ``SymFloat``, and arithmetic with ints, floats and sizes keeps it one. It reaches prims
as a symbolic float argument: the float operations the program performed, in its order, which
the compiled program performs again on each call with the sizes of that call. The operations
are never simplified or re-associated, so the value is the one eager computes, bit for bit. A
``SymFloat`` is a Python float scalar to type promotion, as eager's float is (a weak type:
``bf16_tensor * T ** -0.5`` stays bfloat16).

A comparison with a number is a relation over the sizes where it is exactly eager's answer
(``T / 4 > 2`` is ``T > 8``: ``relation``), recorded as a guard as a size's comparison is.
Anything else that needs a plain float (another comparison, ``bool``, ``float()``, ``int()``,
``hash``, text, ``math.*``) specialises the sizes it is made of, each becoming ``== hint`` as
``SymInt.__index__`` makes it, and answers on the value: a call with other sizes misses the
cache and compiles again, so no answer taken on this value is reused where it would not hold.

``ops`` is the form the trace reads (``_core.configure``): an int, a float or a ``_core.SymExpr``
for an operand, ``(op, a, b)`` for an operation (``op`` Python's operator: ``"+"``, ``"**"``),
``("neg", a)`` for a negation, ``("sqrt", a)`` for ``math.sqrt(a)``, ``("log", a)`` for another
function of ``math`` (``exp``, ``expm1``, ``log``, ``log1p``, ``log2``, ``log10``: ``MATH_FUNCTIONS``,
which tracing puts in ``math``; the compiled program calls ``math``'s own on the same double, so
the value is eager's, and each is guarded to stay in its domain). ``hint`` is the value when
traced, computed by the operations themselves on the sizes' values.

A float argument that changes between calls (a learning rate, a loss weight) is a float input
of the trace, ``("arg", value id, hint)`` in ``ops`` (``core.acquisition.float_args``): what the
program computes from it stays symbolic, and the compiled program passes the caller's float to
torch, as eager does. A decision on floats of float inputs and constants alone (a comparison,
``bool``, a divisor or a domain of ``math``) is answered on the value and guarded on its answer
(``float_guards``); anything else that needs its value (``float()``, ``int()``, text, a decision
mixing it with sizes) specialises it, which ``specialised_inputs`` records, and the compile takes
it as a constant then.
"""

import contextvars

import math
import operator
import sys

import numpy
import torch

from thunder_rs import _core
from thunder_rs.core.base.userframe import user_location
from thunder_rs.core.lang import float_guards
from thunder_rs.core.lang.caller_code import only_assert_message
from thunder_rs.core.lang.recorder import current
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError

_SymExpr = _core.SymExpr

#: Python's operator by its symbol, for the operations a ``SymFloat`` keeps.
OPERATORS = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "**": operator.pow,
}


def _internal(frame) -> bool:
    return frame.f_globals.get("__name__", "").startswith("thunder_rs.")


def operand(x):
    """``(ops, hint)`` of a number a ``SymFloat`` computes with (an int, a float, a size or a
    symbolic float); None for anything else."""
    kind = type(x)
    if kind is SymFloat:
        return x.ops, x.hint
    if kind is float:
        return x, x
    if kind is int or kind is bool:
        return int(x), int(x)
    if isinstance(x, torch.SymInt) and type(getattr(x, "expr", None)) is _SymExpr:
        return x.expr, x.expr.hint
    return None


def combine(symbol: str, a, b):
    """``a <symbol> b`` of two operands (``operand``), at least one of them symbolic: a
    ``SymFloat`` where Python's answer is a float; where it is not (a negative size to a
    fractional power is complex), the sizes specialised and the answer Python's."""
    (a_ops, a_hint), (b_ops, b_hint) = a, b
    value = OPERATORS[symbol](a_hint, b_hint)
    if type(value) is not float:
        _specialise(a_ops)
        _specialise(b_ops)
        return value
    if symbol == "/":
        _keep_nonzero(b_ops, b_hint)
    if symbol == "**":
        _real_power(a, b)
        _defined_power(a, b)
    return SymFloat((symbol, a_ops, b_ops), value)


def _keep_nonzero(ops, hint) -> None:
    """Keeps a divisor of sizes nonzero on every call the trace serves, as it is at the hint
    (``1.0 / (T - 5)``: Python raises ``ZeroDivisionError`` at ``T = 5``, so that call is traced
    again and raises it from the program's own line): ``ops != 0`` as a guard on the sizes (none
    where their bounds prove it: ``1 / T``, ``T / (T - 1)``), or structurally (``_nonzero``),
    else the sizes specialised. A constant nonzero at the hint is nonzero on every call."""
    if type(ops) is _SymExpr:
        current().decide("ne", ops, 0)
    elif type(ops) is tuple and not _nonzero(ops) and not relation("ne", SymFloat(ops, hint), 0):
        _specialise(ops)


def _nonzero(ops) -> bool:
    """Whether ``ops`` is nonzero wherever its sizes hold as guarded, structurally: a size
    expression (guarded ``!= 0``), a moderate constant, the square root of a positive float
    (``_positive``), products and quotients of such, negated; a difference ``a - b`` where ``a !=
    b`` is a relation of the sizes (``1 - 1 / T``: ``T != 1``), a sum ``a + b`` where ``a != -b``
    is (a double difference is 0 exactly where its operands are equal)."""
    if type(ops) is _SymExpr:
        return current().decide("ne", ops, 0)
    if type(ops) in (int, float):
        return 2.0**-100 <= abs(ops) <= 2.0**100
    if ops[0] == "neg":
        return _nonzero(ops[1])
    if ops[0] == "sqrt":
        return _positive(ops[1])
    if ops[0] in ("+", "-"):
        a, b = ops[1], ops[2] if ops[0] == "-" else _negated(ops[2])
        if type(a) in (int, float):
            a, b = b, a
        return bool(relation("ne", SymFloat(a, 0.0), b if type(b) in (int, float) else SymFloat(b, 0.0)))
    return ops[0] in ("*", "/") and _nonzero(ops[1]) and _nonzero(ops[2])


def _negated(ops):
    return -ops if type(ops) in (int, float) else ("neg", ops)


def _defined_power(base, exponent) -> None:
    """Keeps ``base ** exponent`` defined on every call it serves: 0 to a negative power raises
    ``ZeroDivisionError`` in Python (``(T - 5) ** -1`` at ``T = 5``). Where the exponent may be
    negative, a symbolic base is kept nonzero (``_keep_nonzero``), and a zero constant base
    specialises the exponent."""
    (b_ops, b_hint), (e_ops, _) = base, exponent
    if _nonnegative(e_ops):
        return
    if type(b_ops) in (int, float):
        if b_ops == 0:
            _specialise(e_ops)
        return
    _keep_nonzero(b_ops, b_hint)


def _real_power(base, exponent) -> None:
    """Keeps ``base ** exponent`` a float on every call it serves, as it is at the hints: a negative
    base to a fractional power is complex in Python (``(T - 10) ** 0.5`` at ``T = 5``), which the
    compiled program would pass on where eager computes in complex. Where the exponent is not a
    whole constant, a symbolic base keeps its sign (``base >= 0``: a guard, or its sizes
    specialised), and a negative constant base specialises a symbolic exponent."""
    (b_ops, b_hint), (e_ops, _) = base, exponent
    if type(e_ops) is int or (type(e_ops) is float and e_ops.is_integer()) or _nonnegative(b_ops):
        return
    if type(b_ops) is _SymExpr:
        current().decide("ge", b_ops, 0)
    elif type(b_ops) is tuple:
        SymFloat(b_ops, b_hint) >= 0  # noqa: B015 (the decision is the guard, or specialises)
    elif b_hint < 0:
        _specialise(e_ops)


def _nonnegative(ops) -> bool:
    """Whether ``ops`` is at least 0 for all sizes (sizes are): no decision needed. Sums, products,
    quotients and powers of such, square roots and exponentials; not differences (``T / 3 - 1``)."""
    if type(ops) is _SymExpr:
        bound = ops.lower_bound(0)
        return bound is not None and bound >= 0
    if type(ops) in (int, float):
        return ops >= 0
    if ops[0] in ("sqrt", "exp"):
        return True
    if ops[0] == "**":
        return _nonnegative(ops[1])
    return ops[0] in ("+", "*", "/") and _nonnegative(ops[1]) and _nonnegative(ops[2])


#: ``math``'s own functions, as imported (tracing puts ``MATH_FUNCTIONS`` in their place).
_LIBM = {name: getattr(math, name) for name in ("sqrt", "exp", "expm1", "log", "log1p", "log2", "log10")}
#: Where each function is defined on sizes' floats, and finite: ``(relation, bound)`` of its
#: argument (``math.log(0)`` and ``math.sqrt(-1)`` raise, ``math.exp(710.0)`` overflows).
_DOMAINS = {
    "sqrt": ("ge", 0),
    "exp": ("le", 709),
    "expm1": ("le", 709),
    "log": ("gt", 0),
    "log1p": ("gt", -1),
    "log2": ("gt", 0),
    "log10": ("gt", 0),
}


def _positive(ops) -> bool:
    """Whether ``ops`` is positive wherever its sizes hold as guarded, structurally (``T / 4``,
    ``math.sqrt(T)``, a product or sum of such): False where that takes a relation. Constants
    of moderate size only, so that no product or quotient of them underflows to 0."""
    if type(ops) is _SymExpr:
        bound = ops.lower_bound(0)
        return (bound is not None and bound > 0) or current().decide("gt", ops, 0)
    if type(ops) in (int, float):
        return 2.0**-100 <= ops <= 2.0**100
    if ops[0] == "sqrt":
        return _positive(ops[1])
    return ops[0] in ("+", "*", "/") and _positive(ops[1]) and _positive(ops[2])


def _in_domain(name: str, ops, hint: float) -> bool | None:
    """Whether ``math.<name>`` of the float ``ops`` is defined and finite, decided for every call
    as it is at the hint (a guard on the sizes, or a structural fact); None where that needs the
    value itself (the caller specialises)."""
    op, bound = _DOMAINS[name]
    if op == "ge" and _nonnegative(ops) or op == "gt" and bound == 0 and _positive(ops):
        return True
    if type(ops) is _SymExpr:
        return current().decide(op, ops, bound)
    return relation(op, SymFloat(ops, hint), bound)


def _function(name: str, x):
    """``math.<name>(x)``: a ``SymFloat`` where ``x`` is symbolic (a size or a float of sizes)
    and its domain holds for every call that reuses the trace (``_in_domain``); else ``math``'s
    own answer, the sizes specialised (its error where eager raises one)."""
    libm = _LIBM[name]
    o = operand(x)
    if o is None or type(o[0]) in (int, float):
        return libm(x)
    ops, hint = o
    if _in_domain(name, ops, hint):
        return SymFloat(("sqrt" if name == "sqrt" else name, ops), libm(hint))
    _specialise(ops)
    return libm(hint)


def sqrt(x):
    """``math.sqrt(x)`` of an int, a float, a size or a symbolic float: symbolic where ``x`` is
    (``math.sqrt`` itself reads a plain float, which specialises the sizes), guarded ``x >= 0``."""
    return _function("sqrt", x)


def log(x, *base):
    """``math.log(x)``, and ``math.log(x, base)`` as CPython computes it: ``log(x) / log(base)``
    (two logarithms and a division, not ``log2`` or ``log10``); a ``base`` of sizes is guarded
    ``!= 1`` (else a division by zero)."""
    if not base:
        return _function("log", x)
    if len(base) > 1:
        return _LIBM["log"](x, *base)  # (Python's error)
    (b,) = base
    num, den = _function("log", x), _function("log", b)
    if type(den) is SymFloat and den.ops[0] == "log" and not _differs_from_one(den.ops[1], operand(b)[1]):
        den = den.value()
    if type(den) is SymFloat:  # its argument is guarded != 1: no zero divisor
        n_ops, n_hint = operand(num)
        return SymFloat(("/", n_ops, den.ops), n_hint / den.hint)
    return num / den


def _differs_from_one(ops, hint) -> bool:
    """``ops != 1`` as a guard, where that is a relation of the sizes."""
    if type(ops) is _SymExpr:
        return current().decide("ne", ops, 1)
    return bool(relation("ne", SymFloat(ops, hint), 1))


def _named(name: str):
    def call(x):
        return _function(name, x)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``math.{name}(x)``, symbolic where ``x`` is (``_function``)."
    return call


#: What tracing puts in ``math`` (``core.lang.torch_overrides``): each calls ``math``'s own on
#: plain numbers, so other code running meanwhile gets the same answers.
MATH_FUNCTIONS = {"sqrt": sqrt, "log": log, **{n: _named(n) for n in ("exp", "expm1", "log1p", "log2", "log10")}}


def _specialise(ops) -> None:
    """Specialises every size ``ops`` reads to its hint (``== hint`` guards), and notes every float
    input it reads as specialised (``specialised_inputs``)."""
    if type(ops) is _SymExpr:
        current().specialise(ops)
    elif type(ops) is tuple and ops[0] == ARG:
        noted = _SPECIALISED.get()
        if noted is None:  # (a decision on a float input outside a compile would go unseen)
            raise ThunderRuntimeError(f"thunder_rs: the value of float input t{ops[1]} was needed outside a compile")
        noted.setdefault(ops[1], user_location())
    elif type(ops) is tuple:
        for part in ops[1:]:
            _specialise(part)


def type_read(ops, site: str, exact: bool) -> None:
    """``type()`` of the float ``ops`` read at ``site`` (``core.state.type_reads``), whose answer
    in eager is ``float``, not a ``SymFloat``: the float inputs it reads are noted as specialised
    there (the compile takes them as constants, plain floats); sizes it reads, where the read is
    surely of it (``exact``), fail the compile (it takes the sizes constant)."""
    args, sizes = _leaves(ops)
    if sizes and exact:
        raise ThunderNotImplementedError(
            f"thunder_rs.jit: type() of a float computed from symbolic sizes at {site} is float in eager, which "
            "the trace's stand-in for it cannot be: compiled with the sizes constant"
        )
    noted = _SPECIALISED.get()
    if noted is not None:
        for vid in args:
            noted.setdefault(vid, site)


def _leaves(ops) -> tuple:
    """``(value ids of the float inputs, whether sizes)`` that ``ops`` reads."""
    if type(ops) is _SymExpr:
        return [], True
    if type(ops) is not tuple:
        return [], False
    if ops[0] == ARG:
        return [ops[1]], False
    args: list = []
    sizes = False
    for part in ops[1:]:
        more, sized = _leaves(part)
        args, sizes = args + more, sizes or sized
    return args, sizes


#: The operation naming a float input in ``ops``: ``("arg", value id, hint)``.
ARG = "arg"
#: ``{value id: where the program first needed its value}`` of the float inputs specialised
#: while the acquisition that ``specialised_inputs`` opened traces.
_SPECIALISED: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_specialised_floats", default=None)


def float_input(vid: int, hint: float) -> "SymFloat":
    """The symbolic float of the trace's float input ``vid`` (``Recorder.float_input``), at ``hint``
    (a NumPy float's answers as one: ``SymFloat.numpy``)."""
    if type(hint) is float:
        return SymFloat((ARG, vid, hint), hint)
    made = SymFloat((ARG, vid, float(hint)), float(hint))
    made.numpy = type(hint)
    return made


class specialised_inputs:
    """A context in which the float inputs whose value the program needs are noted: ``found``,
    ``{value id: "file:line"}``."""

    def __enter__(self):
        self.found: dict = {}
        self.decisions: list = []  # (``float_guards.decide``)
        self._token = _SPECIALISED.set(self.found)
        self._decisions = float_guards.DECISIONS.set(self.decisions)
        return self

    def __exit__(self, *exc):
        float_guards.DECISIONS.reset(self._decisions)
        _SPECIALISED.reset(self._token)


#: Bounds that keep a comparison of rounded rationals exact (``relation``): constants' numerators
#: and denominators, and each side's cross product.
_SMALL, _CROSS = 2**20, 2**50


def _ratio(c):
    """``(num, den)`` of an int or a finite float whose parts are small; None otherwise."""
    if type(c) is bool:
        c = int(c)
    if type(c) is int:
        num, den = c, 1
    elif type(c) is float and math.isfinite(c):
        num, den = c.as_integer_ratio()
    else:
        return None
    return (num, den) if abs(num) <= _SMALL and den <= _SMALL else None


def _rational(ops):
    """``(N, D)``, ints or size expressions, where the float ``ops`` computes is ``N / D``
    rounded once (correctly, to the nearest double): a size or a constant, a size times, divided
    by, plus or minus a constant, a constant divided by a size, negated or not. The size's
    conversion to float is exact under ``relation``'s guards (``|size| < 2**51``), so Python's
    one float operation is the one rounding. None for any other float (two roundings, a power)."""
    if type(ops) is _SymExpr:
        return ops, 1
    if type(ops) is not tuple:
        return _ratio(ops)
    if ops[0] == ARG:  # (a float input: no rational of sizes)
        return None
    if ops[0] == "neg":
        inner = _rational(ops[1])
        return None if inner is None else (-inner[0], inner[1])
    if len(ops) == 2:  # a function of math (sqrt, log): no rational
        return None
    symbol, a, b = map(_of_size, ops)
    if symbol == "/" and type(b) is _SymExpr:  # a constant over a size: D is the size's multiple
        c = _ratio(a)
        return None if c is None else (c[0], b * c[1])
    if symbol in ("*", "+") and type(a) is not _SymExpr:
        a, b = b, a
    c = _ratio(b)
    if type(a) is not _SymExpr or c is None:
        return None
    num, den = c
    if symbol == "*":
        return (a * num, den) if num != 0 else None
    if symbol == "/":
        if num == 0:
            return None
        return (a * den, num) if num > 0 else (-(a * den), -num)
    if symbol in ("+", "-"):
        return a * den + (num if symbol == "+" else -num), den
    return None


def _of_size(ops):
    """The size ``T`` of ``float(T)`` (``T * 1.0``, exact where ``_rational`` takes it), else ``ops``:
    ``float(T) / 3`` is ``T / 3``, one rounding."""
    if type(ops) is tuple and len(ops) == 3 and ops[0] == "*" and type(ops[1]) is _SymExpr:
        return ops[1] if type(ops[2]) is float and ops[2] == 1.0 else ops
    return ops


def exact(ops):
    """``(N, k)`` where every float operation of ``ops`` is exact in double, so that its value is
    ``N / 2**k`` (``N`` an int or a size expression): sizes and dyadic constants (0.5, 1.5),
    added, subtracted, negated, times a dyadic constant, divided by a power of two. Each
    intermediate ``N`` of sizes is guarded ``|N| <= 2**53``, which makes it a double, and every
    ``k`` is at most 64, so nothing is subnormal: ``(T / 2 - 0.0) / 0.5`` (``arange``'s length) is
    ``(T, 0)``. None for any other float (a rounding: ``T / 3``)."""
    if type(ops) is _SymExpr or type(ops) is int:
        return ops, 0
    if type(ops) is float:
        if not math.isfinite(ops):
            return None
        p, q = ops.as_integer_ratio()
        return (p, q.bit_length() - 1) if q <= 2**64 and abs(p) <= 2**53 else None
    if ops[0] == "neg":
        inner = exact(ops[1])
        return None if inner is None else (-inner[0], inner[1])
    if ops[0] not in ("+", "-", "*", "/"):
        return None
    a, b = exact(ops[1]), exact(ops[2])
    if a is None or b is None:
        return None
    (na, ka), (nb, kb) = a, b
    if ops[0] in ("+", "-"):
        k = max(ka, kb)
        na, nb = na * 2 ** (k - ka), nb * 2 ** (k - kb)
        out = (na + nb if ops[0] == "+" else na - nb), k
    elif ops[0] == "*" and (type(na) is int or type(nb) is int):
        out = na * nb, ka + kb
    elif ops[0] == "/" and type(nb) is int and nb > 0 and nb & (nb - 1) == 0:  # by 2**j / 2**kb
        j = nb.bit_length() - 1
        k = ka + j - kb
        out = (na, k) if k >= 0 else (na * 2**-k, 0)
    else:
        return None
    n, k = out
    if k > 64 or not _double(n):
        return None
    return out


def _double(n) -> bool:
    """``|n| <= 2**53`` of an int, or of a size expression as guards: ``n`` is a double."""
    if type(n) is int:
        return -(2**53) <= n <= 2**53
    decide = current().decide
    return decide("le", n, 2**53) and decide("ge", n, -(2**53))


def _bounded(n, low=-_CROSS) -> bool:
    """``low < n < 2**50`` of an int, or of a size expression as guards."""
    if type(n) is int:
        return low < n < _CROSS
    decide = current().decide
    return decide("lt", n, _CROSS) and decide("gt", n, low)


def _rational_or_exact(ops):
    """``_rational``'s form, else an exact one's ``N / 2**k`` (``exact``: no rounding at all)."""
    rational = _rational(ops)
    if rational is not None or type(ops) is not tuple:
        return rational
    dyadic = exact(ops)
    return None if dyadic is None else (dyadic[0], 2 ** dyadic[1])


def relation(op: str, a, b):
    """``a <op> b`` (``op`` an ``operator`` name) of two numbers, one a SymFloat, as the guarded
    relation ``N1 * D2 <op> N2 * D1`` over the sizes where both are single roundings of
    rationals ``N1 / D1`` and ``N2 / D2`` (``_rational``): ``T / 4 > 2`` is ``T > 8``, ``1 / T <=
    1.0`` is ``1 <= T``; a float whose operations are all exact is its value ``N / 2**k`` (``T *
    0.75 + 0.5`` is ``(3 * T + 2) / 4``). None where either is neither (``T ** 0.5``, ``0.1``, ``T
    / 3 + 0.5``) or the guards ``0 < D1, D2 < 2**50`` and ``|N1 * D2|, |N2 * D1| < 2**50`` fail.

    Exact in floating point: rounding to nearest is monotone, so ``r1 < r2`` gives ``f1 <= f2``
    for the doubles ``f1, f2`` of the rationals ``r1, r2``, and ``r1 == r2`` gives ``f1 == f2``.
    ``f1 == f2`` with ``r1 < r2`` cannot happen: ``r2 - r1 >= 1 / (D1 * D2)`` (an integer over
    ``D1 * D2``), while each double is within ``2**-53 * |r|`` of its rational (no rational here
    is subnormal or overflows: ``2**-70 <= |r| < 2**50`` or ``r == 0``), so ``|r2 - r1| <=
    2**-53 * (|r1| + |r2|) < 2**-53 * 2**51 / (D1 * D2)``, a quarter of the gap. So the doubles
    compare as the rationals do, which compare as the integers ``N1 * D2`` and ``N2 * D1``; and
    ``-0.0`` equals ``0.0`` as the integer 0 does. The guards are checked on each call, as a
    size's are (``SymInt._decide``). Against an infinity or NaN, the answer is any finite
    value's, with the guard ``D1 > 0`` alone."""
    o = operand(b)
    if o is None:
        return None
    on_inputs = float_guards.decide(op, operand(a)[0], o[0], user_location)
    if on_inputs is not None:  # (float inputs: a guard on their values)
        return on_inputs
    left, right = _rational_or_exact(operand(a)[0]), _rational_or_exact(o[0])
    if left is not None and type(b) is float and not math.isfinite(b) and _bounded(left[1], 0):
        # a rational of sizes with a positive denominator is finite: any finite value answers
        return getattr(operator, op)(0.0, b)
    if left is None or right is None:
        return None
    (n1, d1), (n2, d2) = left, right
    if not (_bounded(d1, 0) and _bounded(d2, 0)):
        return None
    lhs, rhs = n1 * d2, n2 * d1
    if not (_bounded(lhs) and _bounded(rhs)):
        return None
    return current().decide(op, lhs, rhs)


def text(ops) -> str:
    """``ops`` as Python, as the trace prints it: each operation in parentheses."""
    if type(ops) is tuple:
        if ops[0] == ARG:
            return f"t{ops[1]}"
        if ops[0] == "neg":
            return f"(-{text(ops[1])})"
        if ops[0] == "sqrt":
            return f"torch.sym_sqrt({text(ops[1])})"
        if ops[0] in _DOMAINS:
            return f"math.{ops[0]}({text(ops[1])})"
        return f"({text(ops[1])} {ops[0]} {text(ops[2])})"
    plain = str(ops)
    return plain if plain.isidentifier() or (type(ops) is not _SymExpr and ops >= 0) else f"({plain})"


class _Node:
    """In place of torch's SymNode, which a SymFloat has not: what torch's code asks of one
    fails naming it."""

    __slots__ = ()

    def __getattr__(self, name):
        raise AttributeError(f"thunder_rs symbolic floats do not support torch's SymNode.{name} yet")


_NODE = _Node()


class SymFloat(torch.SymFloat):
    """A float computed from sizes on each call (see the module doc)."""

    # Plain attributes where torch.SymFloat has properties reading its SymNode, which a
    # SymFloat has not: the value when traced, and a node that names what torch asked of it.
    hint: float = 0.0
    node = _NODE  # type: ignore[assignment]
    #: The NumPy type of a NumPy float input, or of one computed from it with numbers (see below).
    numpy: "type | bool" = False

    def __init__(self, ops, hint: float):
        self.ops = ops
        self.hint = hint

    # ``isinstance(s, float)`` is True in eager: the program sees ``float`` as the class,
    # thunder_rs its own (as ``SymInt`` does).
    @property  # type: ignore[misc]
    def __class__(self):
        if _internal(sys._getframe(1)):
            return SymFloat
        return self.numpy or float

    def value(self) -> float:
        """The float itself: the sizes it reads specialised to their hints."""
        _specialise(self.ops)
        return self.numpy(self.hint) if isinstance(self.numpy, type) else self.hint

    # A float input the caller passed as a ``numpy.float64`` (``core.lang.numpy_scalars``): NumPy's
    # double arithmetic is Python's, bit for bit, where it is finite, so its operations with numbers
    # stay symbolic (``numpy``: their results are ``numpy.float64`` too), and torch reads the
    # caller's scalar as the float it is. Where Python would raise (``1 / s`` at 0.0 is ``inf`` with
    # a ``RuntimeWarning`` in NumPy, a power that overflows ``inf``, a negative base to a fractional
    # power ``nan``) the operation is NumPy's own on the value, specialised. The program sees
    # ``numpy.float64`` as its class, and its value where it needs a NumPy scalar's (``s.item()``,
    # ``s.dtype``, ``repr(s)``, ``s // 2``). An ``np.float32`` or ``np.float16`` rounds its arithmetic
    # and compares numbers at its own precision: its operations and decisions are on the value (the
    # input specialised); torch reads it as the float it is (``x * s`` stays symbolic).
    def __getattr__(self, name):
        if not self.numpy or name.startswith("_") or _internal(sys._getframe(1)) or not hasattr(self.numpy, name):
            raise AttributeError(name)
        return getattr(self.value(), name)

    def _thunder_type_read(self, site: str, exact: bool) -> None:
        type_read(self.ops, site, exact)

    # Arithmetic with numbers stays symbolic; a tensor takes it from its reflected operator
    # (``T ** -0.5 * x`` is ``x * T ** -0.5``); with anything else the value is specialised.
    def _arith(self, other, symbol, reflected=False):
        o = operand(other)
        kind = self.numpy or (type(other) is SymFloat and other.numpy)
        if (
            o is None
            or _narrow(self, other)
            or (kind and not _finite_in_numpy(symbol, (o[1], self.hint) if reflected else (self.hint, o[1])))
        ):
            if isinstance(other, torch.Tensor):
                return NotImplemented
            op = OPERATORS[symbol]
            return op(other, self.value()) if reflected else op(self.value(), other)
        mine = (self.ops, self.hint)
        made = combine(symbol, o, mine) if reflected else combine(symbol, mine, o)
        if kind and type(made) is SymFloat:
            made.numpy = numpy.float64
        return made

    def __add__(self, other):
        return self._arith(other, "+")

    def __radd__(self, other):
        return self._arith(other, "+", reflected=True)

    def __sub__(self, other):
        return self._arith(other, "-")

    def __rsub__(self, other):
        return self._arith(other, "-", reflected=True)

    def __mul__(self, other):
        return self._arith(other, "*")

    def __rmul__(self, other):
        return self._arith(other, "*", reflected=True)

    def __truediv__(self, other):
        return self._arith(other, "/")

    def __rtruediv__(self, other):
        return self._arith(other, "/", reflected=True)

    def __pow__(self, other, modulo=None):
        if modulo is not None:
            return pow(self.value(), other, modulo)
        return self._arith(other, "**")

    def __rpow__(self, other):
        return self._arith(other, "**", reflected=True)

    def __neg__(self):
        made = SymFloat(("neg", self.ops), -self.hint)
        made.numpy = self.numpy
        return made

    def __pos__(self):
        return self

    # Decisions: a relation over the sizes where one is exactly eager's answer (``relation``),
    # else answered on the value, the sizes specialised. Conversions: on the value.
    def _decide(self, op, other):
        answer = None if _narrow(self, other) else relation(op, self, other)
        return getattr(operator, op)(self.value(), other) if answer is None else answer

    def __eq__(self, other):
        return self._decide("eq", other)

    def __ne__(self, other):
        return self._decide("ne", other)

    def __lt__(self, other):
        return self._decide("lt", other)

    def __le__(self, other):
        return self._decide("le", other)

    def __gt__(self, other):
        return self._decide("gt", other)

    def __ge__(self, other):
        return self._decide("ge", other)

    def __bool__(self):
        answer = float_guards.decide("ne", self.ops, 0, user_location)
        return bool(self.value()) if answer is None else answer

    def __float__(self):
        return float(self.value())

    def __int__(self):
        return int(self.value())

    def __hash__(self):
        return hash(self.value())

    def __array__(self, dtype=None, copy=None):
        return numpy.asarray(self.value(), dtype=dtype)

    # Text the program makes holds the value (specialised; ``repr`` too: ``f"{s!r}"``, ``str([s])``);
    # thunder_rs's own shows the expression; a ``torch._assert`` message, read only when it fails,
    # the value (as SymInt's).
    def __repr__(self):
        frame = sys._getframe(1)
        if _internal(frame):
            return f"SymFloat({text(self.ops)}, hint={self.hint!r})"
        return repr(self.hint if only_assert_message(frame) else self.value())

    def __str__(self):
        frame = sys._getframe(1)
        if _internal(frame):
            return text(self.ops)
        return str(self.hint if only_assert_message(frame) else self.value())

    def __format__(self, spec):
        frame = sys._getframe(1)
        if _internal(frame):
            return text(self.ops)
        return format(self.hint if only_assert_message(frame) else self.value(), spec)


def _narrow(a: SymFloat, b) -> bool:
    """Whether ``a`` or ``b`` is an ``np.float32`` or ``np.float16`` input (or made of one)."""
    return a.numpy not in (False, numpy.float64) or (type(b) is SymFloat and b.numpy not in (False, numpy.float64))


def _finite_in_numpy(symbol: str, operands: tuple) -> bool:
    """Whether NumPy's ``a <symbol> b`` of a ``numpy.float64`` is a finite double without a warning,
    where Python's float operation gives the same."""
    try:
        with numpy.errstate(all="raise"):
            return type(OPERATORS[symbol](numpy.float64(operands[0]), operands[1])) is numpy.float64
    except (FloatingPointError, ZeroDivisionError, OverflowError):
        return False


def _specialising(name: str, function=None):
    """A method answering as ``float`` (or ``function`` of the float) does, on the value."""

    def method(self, *args):
        value = self.value()
        return function(value, *args) if function is not None else getattr(value, name)(*args)

    method.__name__ = name
    return method


# What a float answers that a SymFloat does not keep symbolic: the value's answer. Whatever else
# torch.SymFloat defines (through its SymNode, which a SymFloat has not) answers so too.
_KEPT = {n for n in vars(SymFloat) if n.startswith("__")} | {"__init__", "__class__", "__doc__", "__module__"}
for _name in ("__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__divmod__", "__rdivmod__", "__abs__"):
    setattr(SymFloat, _name, _specialising(_name))
for _name in ("__round__", "__trunc__", "__floor__", "__ceil__", "is_integer", "as_integer_ratio", "hex", "conjugate"):
    setattr(SymFloat, _name, _specialising(_name))
setattr(SymFloat, "__sym_sqrt__", sqrt)  # torch.sym_sqrt
setattr(SymFloat, "__sym_log2__", MATH_FUNCTIONS["log2"])
for _name in ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh"):
    setattr(SymFloat, f"__sym_{_name}__", _specialising(f"__sym_{_name}__", getattr(math, _name)))
setattr(SymFloat, "__sym_float__", lambda self: self)
setattr(SymFloat, "__sym_max__", lambda self, other: self if self >= other else other)
setattr(SymFloat, "__sym_min__", lambda self, other: self if self <= other else other)
for _name in set(vars(torch.SymFloat)) - set(vars(SymFloat)) - _KEPT:
    if _name.startswith("__") and callable(getattr(torch.SymFloat, _name)):
        setattr(SymFloat, _name, _specialising(_name, lambda value, *args, _n=_name: getattr(value, _n)(*args)))
