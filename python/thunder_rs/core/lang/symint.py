"""``SymInt``: a size that may change between calls, as the traced program sees it.

When a dimension of an input is symbolic (see ``thunder_rs.core.acquisition.dynamic``), the
proxy's ``shape`` holds a ``SymInt`` there instead of an int. Arithmetic on it (``T * 2``,
``T // heads``, ``B * T``) gives another ``SymInt``, computed in Rust in the trace's canonical
form, and reaches prims as a symbolic int, so the compiled program computes the size from its
inputs on every call.

Anything that needs a plain answer is a decision taken on the size's value at compile time (its
*hint*), and what the answer relied on becomes a guard the compiled program checks on each call:
comparisons and ``bool`` record the relation (``T > 1``, ``T == S``); ``int(T)``, ``range(T)``,
indexing with it, hashing it, mixing it with floats specialise it (the program is compiled for
this value only: ``T == hint``). A call where a guard fails misses the cache and compiles again,
so no decision taken on the hint is ever reused where it would not hold.

Not an ``int`` subclass on purpose: C code reads an int subclass's value directly, without any
hook, so a size used that way would be baked into the trace silently. A ``torch.SymInt``
subclass instead, so that torch's argument parser passes it on to the language context as it is
(``x.view(B, T, -1)``, ``torch.arange(T)``, ``torch.Size``) rather than reading it as an int.
Its ``node`` is not torch's SymNode: it answers what torch's argument parser and shape code
ask of one, and a ``torch.SymInt`` method it does not override fails loudly.
"""

import math
import operator
import sys

import numpy
import torch

from thunder_rs import _core
from thunder_rs.core.base.proxies import set_size_wrapper
from thunder_rs.core.base.trees import LEAF_TYPES
from thunder_rs.core.lang import symfloat
from thunder_rs.core.lang import printed_text
from thunder_rs.core.lang.caller_code import only_assert_message, only_printed
from thunder_rs.core.lang.recorder import current
from thunder_rs.errors import ThunderNotImplementedError
from thunder_rs.core.lang.symfloat import SymFloat
from thunder_rs.core.state.observe import check_sizes, thread_state

_SymExpr = _core.SymExpr


def _internal(frame) -> bool:
    return frame.f_globals.get("__name__", "").startswith("thunder_rs.")


def wrap(value):
    """A ``SymInt`` for a symbolic expression, the int itself for a constant one."""
    return SymInt(value) if type(value) is _SymExpr else value


#: The largest size a symbolic expression holds (Rust's ``i64``); past it a size is specialised.
_INT64_MAX = 2**63 - 1


def _specialised(x):
    """``x``, an int or a ``SymInt``, as a plain int (a ``SymInt`` specialised to its value)."""
    return x.__index__() if type(x) is SymInt else x


def _operand(other):
    if type(other) is SymInt:
        return other.expr
    if type(other) is int:
        return other
    return None


class _Node:
    """What torch asks a ``torch.SymInt``'s node: ``torch.broadcast_shapes`` whether a size is a
    nested int; torch's argument parser, for an op that takes a plain int (``hann_window(T)``),
    whether it is an int and then its value, which specialises the size (``guard_int``: failing
    instead turned symbolic compiles off for the whole function). Anything else fails naming it."""

    __slots__ = ("size",)

    def __init__(self, size: "SymInt"):
        self.size = size

    def is_nested_int(self) -> bool:
        return False

    def is_int(self) -> bool:
        return True

    def is_bool(self) -> bool:
        return False

    def is_float(self) -> bool:
        return False

    def maybe_as_int(self) -> None:
        return None  # (no value without a decision)

    def guard_int(self, file, line) -> int:
        return self.size.__index__()

    def __getattr__(self, name):
        raise AttributeError(f"thunder_rs symbolic sizes do not support torch's SymNode.{name} yet")


_NOT_NUMBERS = frozenset({type(None), type(Ellipsis), slice, str})


class SymInt(torch.SymInt):
    """An int size whose value is read from the inputs on each call (see the module doc)."""

    @property
    def node(self):  # not torch's SymNode: what torch asks of one, answered
        return _Node(self)

    def __init__(self, expr: "_core.SymExpr"):
        self.expr = expr

    # ``isinstance(T, int)`` is True in eager, where a size is an int: the program sees ``int``
    # as the class (``isinstance`` asks ``__class__`` where the type is no subclass), thunder_rs
    # its own. ``type(T)`` and C code's checks are the type's.
    @property  # type: ignore[misc]
    def __class__(self):
        return SymInt if _internal(sys._getframe(1)) else int

    @property
    def hint(self) -> int:
        """The value when the program was traced."""
        return self.expr.hint

    # Arithmetic stays symbolic with ints and other sizes, and with floats (a ``SymFloat``);
    # with a tensor it is the tensor's reflected op (as an int's is: ``NotImplemented``), which
    # takes the size as it is; with anything else the size is specialised first.
    # (Through ``operator``, so that an int meeting another number takes Python's whole protocol,
    # reflected methods included, as it does in eager.)
    def _arith(self, other, op, reflected=False):
        o = _operand(other)
        if o is None:
            if isinstance(other, torch.Tensor):
                return NotImplemented
            if _is_float(other):
                return _float_arith(self, other, _SYMBOLS[op], reflected)
            value = self.__index__()
            return op(other, value) if reflected else op(value, other)
        try:
            return wrap(op(o, self.expr) if reflected else op(self.expr, o))
        except OverflowError:  # (past int64, which no symbolic size holds: the values, as eager's ints)
            value, o = self.__index__(), _specialised(other)
            return op(o, value) if reflected else op(value, o)

    def __add__(self, other):
        return self._arith(other, operator.add)

    def __radd__(self, other):
        return self._arith(other, operator.add, reflected=True)

    def __sub__(self, other):
        return self._arith(other, operator.sub)

    def __rsub__(self, other):
        return self._arith(other, operator.sub, reflected=True)

    def __mul__(self, other):
        return self._arith(other, operator.mul)

    def __rmul__(self, other):
        return self._arith(other, operator.mul, reflected=True)

    def __floordiv__(self, other):
        if isinstance(other, torch.Tensor):
            return NotImplemented
        if type(other) is int and 0 < other <= _INT64_MAX:
            return wrap(self.expr // other)
        if type(other) is SymInt:
            exact = self.expr.exact_div(other.expr)
            if exact is not None and _nonzero(other.expr):
                return wrap(exact)
            # A rounded-up quotient ``(n + d - 1) // d`` of an ``n`` that ``d`` divides is ``n / d``
            # where ``d >= 1`` (the remainder ``d - 1`` is below ``d``): symbolic, not decided on hints.
            exact = (self.expr - other.expr + 1).exact_div(other.expr)
            if exact is not None and other.hint >= 1 and current().decide("ge", other.expr, 1):
                return wrap(exact)
            if other.hint > 0:
                return _quotient(self.expr, other.expr)
        return self.__index__() // other

    def __rfloordiv__(self, other):
        if type(other) is int and self.hint > 0:
            return _quotient(other, self.expr)
        return other // self.__index__()

    def __mod__(self, other):
        if isinstance(other, torch.Tensor):
            return NotImplemented
        if type(other) is int and 0 < other <= _INT64_MAX:
            return wrap(self.expr % other)
        if type(other) is SymInt and self.expr.exact_div(other.expr) is not None and _nonzero(other.expr):
            return 0
        if type(other) is SymInt and other.hint > 0:
            return self - _quotient(self.expr, other.expr) * other
        return self.__index__() % other

    def __rmod__(self, other):
        if type(other) is int and self.hint > 0:
            return other - _quotient(other, self.expr) * self
        return other % self.__index__()

    def __divmod__(self, other):
        return self // other, self % other

    def __rdivmod__(self, other):
        return divmod(other, self.__index__())

    # True division gives a float: a ``SymFloat`` computing it as Python does.
    def __truediv__(self, other):
        if isinstance(other, torch.Tensor):
            return NotImplemented
        if _is_number(other):
            return _float_arith(self, other, "/")
        return self.__index__() / other

    def __rtruediv__(self, other):
        if _is_number(other):
            return _float_arith(self, other, "/", reflected=True)
        return other / self.__index__()

    def __neg__(self):
        return self._arith(-1, operator.mul)

    def __pos__(self):
        return self

    # Decisions: answered on the hint, the relation recorded as a guard; against a tensor, the
    # tensor's reflected comparison; against anything else (a float) the size is specialised
    # and compared as an int would be.
    def _decide(self, op, other):
        o = _operand(other)
        if o is None:
            if isinstance(other, torch.Tensor):
                return NotImplemented
            return getattr(operator, op)(self.__index__(), other)
        try:
            return current().decide(op, self.expr, o)
        except OverflowError:  # (their difference is past int64: decided on the values, as eager's ints)
            return getattr(operator, op)(self.__index__(), _specialised(other))

    # Against what is no number (``None``, ``...``, a slice: ``Ellipsis in key``) an int answers
    # NotImplemented, so Python compares identities: nothing decided on the size.
    def __eq__(self, other):
        return NotImplemented if type(other) in _NOT_NUMBERS else self._decide("eq", other)

    def __ne__(self, other):
        return NotImplemented if type(other) in _NOT_NUMBERS else self._decide("ne", other)

    def __lt__(self, other):
        return self._decide("lt", other)

    def __le__(self, other):
        return self._decide("le", other)

    def __gt__(self, other):
        return self._decide("gt", other)

    def __ge__(self, other):
        return self._decide("ge", other)

    def __bool__(self):
        return current().decide("ne", self.expr, 0)

    # A plain int: the program is specialised to the hint.
    def __index__(self):
        return current().specialise(self.expr)

    __int__ = __index__

    def _thunder_type_read(self, site: str, exact: bool) -> None:
        """``type()`` of the size read at ``site`` (``core.state.type_reads``): ``int`` in eager,
        which this stand-in cannot be; where the read is surely of it, the compile fails (and
        takes the sizes constant)."""
        if exact:
            raise ThunderNotImplementedError(
                f"thunder_rs.jit: type() of the symbolic size {self.expr} at {site} is int in eager, which the "
                "trace's stand-in for it cannot be: compiled with the sizes constant"
            )

    def __float__(self):
        return float(self.__index__())

    # numpy takes an object of its own kind as a 0-dim array (then reads it with ``int``): a size
    # in a list numpy converts (``np.cumsum(counts.tolist())``) is an int there, not an object.
    def __array__(self, dtype=None, copy=None):
        return numpy.asarray(self.__index__(), dtype=dtype)

    # The key of a dict of lasting state that holds no item under it may stay symbolic
    # (``core.state.keyed``); any other hash is of the int.
    def __hash__(self):
        frame = sys._getframe(1)
        if not _internal(frame) and _symbolic_key(self, frame):
            return hash(self.expr.hint)
        return hash(self.__index__())

    def __abs__(self):
        return self if self >= 0 else -self

    # A small natural power stays a symbolic int; a float or negative int power is a float (a
    # ``SymFloat``); a tensor power is the tensor's (``T ** x``, reflected); any other power, and
    # what torch.SymInt would answer through its SymNode (bit operations, ``torch.sym_sqrt``...),
    # is an int's: the size specialised.
    def __pow__(self, other, modulo=None):
        if isinstance(other, torch.Tensor):
            return NotImplemented
        if type(other) is int and 0 <= other <= 8 and modulo is None:
            out = 1
            for _ in range(other):
                out = out * self
            return out
        if modulo is None and (_is_float(other) or (type(other) is int and other < 0)):
            return _float_arith(self, other, "**")
        return pow(self.__index__(), other, modulo)

    def __rpow__(self, other):
        if _is_float(other):
            return _float_arith(self, other, "**", reflected=True)
        return other ** self.__index__()

    # ``round``, ``math.trunc``, ``floor`` and ``ceil`` of an int are the int.
    def __round__(self, ndigits=None):
        return self if ndigits is None or ndigits >= 0 else round(self.__index__(), ndigits)

    def __trunc__(self):
        return self

    __floor__ = __ceil__ = __trunc__

    def __sym_max__(self, other):
        return self if self >= other else other

    def __sym_min__(self, other):
        return self if self <= other else other

    # Text the program makes from a size (``f"{T} tokens"``, ``repr(T)``, ``str([T])``) holds its
    # value: specialised. Text thunder_rs makes (the messages of its checks, formatted whether they
    # fail or not) shows the expression and specialises nothing; the message of a ``torch._assert``,
    # read only when it fails as traced, shows the value and specialises nothing (``caller_code``);
    # text only printed or logged is made again by each call (``printed_text``).
    def __repr__(self):
        frame = sys._getframe(1)
        if _internal(frame):
            return f"SymInt({self.expr}, hint={self.expr.hint})"
        return _printed(self, frame, repr) or repr(self.expr.hint if only_assert_message(frame) else self.__index__())

    def __str__(self):
        frame = sys._getframe(1)
        if _internal(frame):
            return str(self.expr)
        return _printed(self, frame, "") or str(self.expr.hint if only_assert_message(frame) else self.__index__())

    def __format__(self, spec):
        frame = sys._getframe(1)
        if _internal(frame):
            return str(self.expr)
        text = _printed(self, frame, spec)
        return text or format(self.expr.hint if only_assert_message(frame) else self.__index__(), spec)


def _printed(size: "SymInt", frame, spec) -> str | None:
    """A placeholder for the text of ``size`` made with ``spec`` (``repr`` for ``repr``) where the
    program only prints or logs it (``printed_text``); None elsewhere."""
    render = printed_text.renderer(None if spec is repr else spec)
    if render is None or not printed_text.recording() or not only_printed(frame):
        return None
    return printed_text.placeholder(size, render)


_SYMBOLS = {operator.add: "+", operator.sub: "-", operator.mul: "*"}


def _is_float(x) -> bool:
    return type(x) is float or type(x) is SymFloat


def _is_number(x) -> bool:
    return type(x) in (int, bool, float, SymInt, SymFloat)


def _float_arith(size, other, symbol, reflected=False):
    """``size <symbol> other`` (reflected: ``other <symbol> size``) as a float: a ``SymFloat``."""
    mine, theirs = symfloat.operand(size), symfloat.operand(other)
    return symfloat.combine(symbol, theirs, mine) if reflected else symfloat.combine(symbol, mine, theirs)


def _dyadic(ops):
    """``(size, p, k)`` where ``ops`` (a SymFloat's) is ``size * c`` or ``size / 2**k`` of a dyadic
    ``c = p / 2**k`` (0.5, 1.5, 0.25): Python's float result is then exactly ``size * p / 2**k``
    while ``|size * p| <= 2**53``. None for any other float."""
    if type(ops) is not tuple or len(ops) != 3:
        return None
    op, a, b = ops
    if op == "*" and type(a) is float:
        a, b = b, a
    if type(a) is not _SymExpr:
        return None
    if op == "*" and type(b) is float and math.isfinite(b) and b > 0:
        p, q = b.as_integer_ratio()
    elif op == "/" and type(b) is int and b > 0 and b & (b - 1) == 0:
        p, q = 1, b
    else:
        return None
    return (a, p, q.bit_length() - 1) if q <= 2**64 else None


def _integer_form(ops):
    """``(N, D)``, ``D`` a positive int, where the float ``ops`` computes is the rational ``N / D``
    correctly rounded (``symfloat._rational``) or exactly (``symfloat.exact``), and ``|N| < 2**50``
    (guarded): the double is then within ``2**-53 * |N| / D < 1 / (8 * D)`` of ``N / D``, closer
    than to any multiple of ``1 / (2 * D)`` that ``N / D`` is not, so ``floor``, ``ceil`` and
    ``round`` of the double are those of ``N / D``, which integers give (a multiple of ``1 / (2 *
    D)`` is a double itself, as the rational then is). None for any other float."""
    form = symfloat._rational_or_exact(ops)
    if form is None or type(form[1]) is not int or not 0 < form[1] < 2**50:
        return None
    n, d = form
    decide = current().decide
    if type(n) is _SymExpr and not (decide("lt", n, 2**50) and decide("gt", n, -(2**50))):
        return None
    return form if type(n) is _SymExpr or abs(n) < 2**50 else None


def _float_to_int(rounding, ceil=False):
    """``math.floor``/``trunc``/``ceil`` of a SymFloat that is ``N / D`` rounded once or exact
    (``_integer_form``: ``T / 3``, ``T * 0.75``): the symbolic int ``N // D`` (rounded up for
    ``ceil``, towards zero for ``trunc`` with the guard ``N >= 0``); of any other, the value's,
    the sizes specialised. (``int()`` must return a plain int: ``_int``.)"""

    def method(self):
        form = _integer_form(self.ops)
        if form is not None:
            n, d = form
            if ceil:
                return wrap(-((-n) // d))
            if rounding is math.floor or current().decide("ge", n, 0):
                return wrap(n // d)
        return rounding(self.value())

    return method


def _int(self) -> int:
    """``int(x)`` of a SymFloat that is ``N / D`` (``_integer_form``): ``int`` must return a plain
    int, so the int it is at the hint, ``m``, with the range of ``N`` that gives it guarded
    (``m * D <= N < (m + 1) * D`` for ``N >= 0``): the sizes stay symbolic, and a size giving
    another int compiles again (``int(T * 0.5)``: a compile per value of ``T // 2``, not per
    size). Any other float, the value's, the sizes specialised."""
    form = _integer_form(self.ops)
    if form is None:
        return int(self.value())
    n, d = form
    m, decide = int(self.hint), current().decide
    low, high = (m * d, (m + 1) * d) if decide("ge", n, 0) else ((m - 1) * d + 1, m * d + 1)
    if not (decide("ge", n, low) and decide("lt", n, high)):
        raise AssertionError("int() of the float was taken at its hint")  # the guards hold for it
    return m


def int_of(x: SymFloat):
    """``int(x)`` where the program's ``int`` may give a symbolic int (``program_builtins``): of a
    float that is ``N / D`` (``_integer_form``) with ``N >= 0`` (guarded), ``N // D``; else the
    plain int ``_int`` takes (its range guarded, or the value's)."""
    form = _integer_form(x.ops)
    if form is not None and current().decide("ge", form[0], 0):
        return wrap(form[0] // form[1])
    return _int(x)


def _round(self, ndigits=None):
    """``round(x)`` of a SymFloat that is ``N / D`` (``_integer_form``): the nearest int, ties to
    even as Python's, a symbolic int: ``(2N + D) // 2D``, or where ``N / D`` is a tie (guarded
    either way: ``(2N + D) % 2D == 0``) the even one, ``2 * ((N + D) // 2D)``. ``round(T * 0.5)``
    is ``(T + 1) // 2`` for even T and ``2 * ((T + 2) // 4)`` for odd T: two compiles. Any other
    float, or ``ndigits`` given (a float), the value's, the sizes specialised."""
    form = _integer_form(self.ops) if ndigits is None else None
    if form is None:
        return round(self.value()) if ndigits is None else round(self.value(), ndigits)
    n, d = form
    if current().decide("eq", (2 * n + d) % (2 * d), 0):
        return wrap(2 * ((n + d) // (2 * d)))
    return wrap((2 * n + d) // (2 * d))


def floor_of_product(size, factor):
    """``floor(float(size) * factor)`` of a size (an int or a ``SymInt``) and a SymFloat that is
    a size times a dyadic (``T / 4``, ``T * 1.5``): the double product is exactly ``size * T * p /
    2**k`` while that is at most ``2**53``, so the floor is the symbolic int ``(size * T * p) //
    2**k`` (guards: the product is in ``[0, 2**53]``). None for any other factor."""
    exact = _dyadic(factor.ops)
    if exact is None:
        return None
    expr, p, k = exact
    product = expr * p * (size.expr if type(size) is SymInt else size)
    decide = current().decide
    if not (decide("ge", product, 0) and decide("le", product, 2**53)):
        return None
    return wrap(product // 2**k)


def is_positive(factor) -> bool:
    """``factor > 0`` of a number, or of a SymFloat that is a size times a dyadic as a guard on
    the size (any other SymFloat is specialised)."""
    exact = _dyadic(factor.ops) if type(factor) is SymFloat else None
    if exact is None:
        return factor > 0
    expr, p, _ = exact
    return current().decide("gt", expr * p, 0)


for _name, _rounding in (("__trunc__", math.trunc), ("__floor__", math.floor)):
    setattr(SymFloat, _name, _float_to_int(_rounding))
setattr(SymFloat, "__ceil__", _float_to_int(math.ceil, ceil=True))
setattr(SymFloat, "__round__", _round)
setattr(SymFloat, "__int__", _int)


def _nonzero(divisor) -> bool:
    """``divisor != 0`` of a size expression, as a guard (none where its bounds prove it): an
    exact quotient (``(2 * T - 10) // (T - 5)`` is 2) holds only where Python's ``//`` does not
    raise ``ZeroDivisionError``, so a call with a zero divisor is traced again and raises it."""
    return current().decide("ne", divisor, 0)


def _quotient(n, d) -> int:
    """``n // d`` by a symbolic divisor ``d`` (positive when traced), which the trace's sizes
    cannot express: the quotient q is decided on the hints, and what it relies on, ``q * d <= n <
    (q + 1) * d``, recorded as guards (which imply ``d > 0``), so the sizes stay symbolic: a
    pool's window count ``(T - T // 2) // (T // 2)`` is 1 for every even T."""
    q = _hint_of(n) // _hint_of(d)
    decide = current().decide
    if not (decide("le", d * q, n) and decide("lt", n, d * (q + 1))):
        raise AssertionError("the quotient was decided on the hints")  # the guards hold for them
    return q


def _hint_of(v) -> int:
    return v if type(v) is int else v.hint


def _specialising(name: str):
    def method(self, *args):
        return getattr(self.__index__(), name)(*args)

    method.__name__ = name
    return method


for _name in ("and", "rand", "or", "ror", "xor", "rxor", "lshift", "rlshift", "rshift", "rrshift"):
    setattr(SymInt, f"__{_name}__", _specialising(f"__{_name}__"))
for _name in ("as_integer_ratio", "bit_length", "conjugate"):
    setattr(SymInt, _name, _specialising(_name))
setattr(SymInt, "__sym_sqrt__", symfloat.sqrt)
for _name in ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh"):
    setattr(SymInt, f"__sym_{_name}__", lambda self, _f=getattr(math, _name): _f(self.__index__()))


def _sym_float(self: SymInt) -> SymFloat:
    """``torch.sym_float`` (and so ``torch.sym_sqrt``) of a size: ``T * 1.0``, Python's float of
    the int, computed on each call (``float(T)`` must return a float: it specialises)."""
    return SymFloat(("*", self.expr, 1.0), float(self.expr.hint))


SymInt.__sym_float__ = _sym_float  # type: ignore[method-assign,assignment]


def _size_texts(sizes, frame) -> list:
    """The texts of a shape's ``sizes`` for the code of ``frame`` (``SymbolicSize.__repr__``), as
    ``SymInt.__str__`` makes each: the value (specialised) for the program's text, the hint for a
    ``torch._assert`` message, the expression for thunder_rs's."""
    if _internal(frame):
        return [str(s.expr) if type(s) is SymInt else str(s) for s in sizes]
    if printed_text.recording() and only_printed(frame):
        return [(type(s) is SymInt and printed_text.placeholder(s, repr)) or str(s) for s in sizes]
    hint = only_assert_message(frame)
    return [str((s.expr.hint if hint else s.__index__()) if type(s) is SymInt else s) for s in sizes]


set_size_wrapper(wrap, _size_texts)


def sym_sum(*args):
    """``torch.sym_sum`` while tracing (Dynamo's graphs sum sizes with it): the sum, symbolic where
    a size is. torch's own asks a ``torch.SymInt``'s SymNode, which a ``SymInt`` has not."""
    items = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
    return sum(items)


def _symbolic_key(size: SymInt, frame) -> bool:
    observer = thread_state.observer
    if observer is None or thread_state.inside:
        return False
    return observer.state.containers.key_use(frame, size, lambda: at_sizes(size), check_sizes)


def hint(size) -> int:
    """The value of a size when traced, without a guard: for heuristics only (an estimate of
    work, a choice that is correct for every value), never for what the program computes."""
    return size.expr.hint if type(size) is SymInt else size


def is_symbolic(shape) -> bool:
    """Whether some size of ``shape`` is symbolic."""
    return any(type(s) is SymInt for s in shape)


def same_shape(a, b) -> bool:
    """Whether two shapes are equal, their lengths compared first: a tuple comparison compares
    items before lengths, so ``(32,) == (2*T, 32)`` would decide ``32 == 2*T`` and guard ``T != 16``,
    a relation no program relies on. Sizes of shapes of one length are compared until one differs."""
    return len(a) == len(b) and all(x == y for x, y in zip(a, b))


def identical(a, b) -> bool:
    """Whether two sizes are one expression, as data: no decision on their values is taken (a
    constant and a symbolic size differ whatever the hint). For choices that change only how the
    trace computes a value (skipping a slice of a whole dim), not what the program sees."""
    if type(a) is SymInt:
        return a.expr.same(b.expr if type(b) is SymInt else b)
    if type(b) is SymInt:
        return b.expr.same(a)
    return a == b


def at_sizes(params):
    """``params`` (a number, a symbolic size, or tuples, lists, dicts and slices of them) as a function of
    ``env``, the size values by name (``{"t0": 17}``): each symbolic size computed from them, its
    expression compiled once (no recording's value is kept); the rest as it is."""
    if type(params) is SymInt:
        code = compile(str(params.expr), "<thunder_rs size>", "eval")
        return lambda env: eval(code, {"__builtins__": {}}, env)  # noqa: S307 (sizes' own expressions)
    if isinstance(params, (tuple, list)):  # (``torch.Size`` too: ``x.reshape(x.shape[:2])``)
        parts = [at_sizes(p) for p in params]
        kind = type(params)
        if hasattr(params, "_fields"):  # (a named tuple: its fields as arguments)
            return lambda env: kind(*(part(env) for part in parts))
        return lambda env: kind([part(env) for part in parts])
    if type(params) is dict:  # (a view op's keyword arguments)
        keyed = {k: at_sizes(v) for k, v in params.items()}
        return lambda env: {k: part(env) for k, part in keyed.items()}
    if type(params) is slice:  # (an index: ``x[n:]``)
        bounds = at_sizes((params.start, params.stop, params.step))
        return lambda env: slice(*bounds(env))
    return lambda env: params


LEAF_TYPES.update((SymInt, SymFloat))  # (pytree leaves, which ``trees``' walks take without the namedtuple test)
