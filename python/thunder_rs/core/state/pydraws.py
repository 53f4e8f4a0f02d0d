"""Draws from Python's and NumPy's global random generators inside a traced program.

torch's random calls are recorded and draw on every call (``rng.py``). ``random`` and
``numpy.random`` are not torch calls: a traced program that drew from them would, compiled, reuse
the first call's numbers and leave the generators as they were. So while a program is traced, the
module functions of both (``random.uniform``, ``np.random.random``, ...) call wrappers (put in on
the first trace, calling straight through in eager code):

- a draw of one number (``random.random()``, ``random.uniform(0, 1)``, ``np.random.randint(0, 5)``)
  draws nothing then: it returns a ``Drawn`` number, and every compiled call repeats the draw, so
  the generator advances as in eager. The program must not depend on the number: using it raises
  an error naming the line, except a comparison whose result is the same for every number the draw
  can return. That is how Hugging Face's LayerDrop reads when it is off
  (``self.training and random.uniform(0, 1) < self.layerdrop`` with ``layerdrop`` 0, a guarded
  module attribute);
- other draws (arrays, choices, shuffles, samples) raise at once;
- seeding (``random.seed(0)``, ``np.random.seed(0)``) with a plain seed (or none: the system's
  entropy, as eager seeds on every call) is made then, so the draws after it are of the seeded
  generator, undone once tracing ends, and repeated by every call in order with the draws, as
  eager seeds on every call; tracing seeded once before, and a generator reseeded between calls
  stayed so. A seed of another kind is refused naming the line;
- draws these wrappers do not see (a function imported from ``random`` before tracing started;
  ``seed`` is looked up where the program bound it, ``cached_reads.register_stand_in``) are found
  by comparing the generators' states before and after tracing (after the last seed), and refused.
  Reading the state, or setting it back, is allowed.
"""

import contextlib
import contextvars
import functools
import importlib
import random as _random
import sys
import threading

from thunder_rs.core.state.cached_reads import register_stand_in
from thunder_rs.core.state.observe import thread_state
from thunder_rs.core.base.userframe import user_location
from thunder_rs.errors import ThunderNotImplementedError

_draws: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_draws", default=None)

# How the numbers of a scalar draw range, from its arguments: ``(low, high, high_included)``, or
# None where the range is unbounded or not worth knowing (any use of the number raises).


def _unit(*args, **kwargs):
    return (0.0, 1.0, False)


def _closed(a, b):
    return (min(a, b), max(a, b), True)


def _unbounded(*a, **k):
    return None


#: Python's ``random``: name -> the range of the number it draws, from the arguments.
_PYTHON_SCALARS = {
    "random": _unit,
    "uniform": _closed,
    "randint": _closed,
    "getrandbits": lambda k: (0, 2**k - 1, True),
    **{
        name: _unbounded
        for name in (
            "gauss",
            "normalvariate",
            "lognormvariate",
            "expovariate",
            "vonmisesvariate",
            "gammavariate",
            "betavariate",
            "paretovariate",
            "weibullvariate",
            "triangular",
            "randrange",
        )
    },
}


def _numpy_int_range(low, high=None, *rest, **kwargs):
    low, high = (0, low) if high is None else (low, high)
    return (low, high - 1, True)


#: NumPy's legacy global functions: name -> range of the number.
_NUMPY_SCALARS = {
    **{name: _unit for name in ("random", "random_sample", "ranf", "sample", "rand")},
    **{
        name: _unbounded
        for name in (
            "randn",
            "normal",
            "standard_normal",
            "beta",
            "gamma",
            "standard_gamma",
            "exponential",
            "standard_exponential",
            "lognormal",
            "laplace",
            "logistic",
            "gumbel",
            "poisson",
            "binomial",
        )
    },
    "uniform": lambda low=0.0, high=1.0, *a, **k: _closed(low, high),
    "randint": _numpy_int_range,
}


# -- the stand-in number ---------------------------------------------------------------------------


def _use_error(number, use: str):
    return ThunderNotImplementedError(
        f"{number._site}: the number it drew at {number._where} is used ({use}) at {user_location()} while the "
        "program is traced. A compiled call draws it again but cannot rerun Python that depends on its value; "
        "draw with torch (torch.rand, torch.randint), which thunder_rs records, or keep the number out of the "
        "jitted program"
    )


def _refuse(use: str):
    def method(self, *args, **kwargs):
        raise _use_error(self, use)

    return method


def _decided(span, op: str, other):
    """The comparison ``x <op> other`` when it is the same for every ``x`` in ``span``, else None."""
    if span is None or type(other) not in (int, float) or other != other:
        return None
    low, high, high_in = span
    below = high < other or (high == other and not high_in)  # every x < other
    at_most = high <= other  # every x <= other
    above = low > other  # every x > other
    at_least = low >= other  # every x >= other
    table = {
        "lt": (below, at_least),
        "le": (at_most, above),
        "gt": (above, at_most),
        "ge": (at_least, below),
        "eq": (False, below or above),
        "ne": (below or above, False),
    }
    always, never = table[op]
    return True if always else False if never else None


def _compare(op: str):
    def method(self, other):
        result = _decided(self._span, op, other)
        if result is None:
            raise _use_error(self, f"compared with {other!r}")
        return result

    return method


_USES = {
    "__bool__": "as a truth value",
    "__hash__": "as a key",
    "__index__": "as an index",
    "__int__": "as an int",
    "__float__": "as a float",
    "__complex__": "as a complex",
    "__str__": "as text",
    "__repr__": "as text",
    "__format__": "as text",
    "__round__": "rounded",
    "__trunc__": "truncated",
    "__floor__": "floored",
    "__ceil__": "rounded up",
    "__neg__": "in arithmetic",
    "__pos__": "in arithmetic",
    "__abs__": "in arithmetic",
    "__invert__": "in arithmetic",
    "__getnewargs__": "copied",
    "__reduce__": "copied",
    "__reduce_ex__": "copied",
    "as_integer_ratio": "as a ratio",
    "is_integer": "as a number",
    "hex": "as text",
    "conjugate": "as a number",
    "bit_length": "as a number",
    "to_bytes": "as bytes",
}
_ARITHMETIC = (
    "add",
    "sub",
    "mul",
    "truediv",
    "floordiv",
    "mod",
    "divmod",
    "pow",
    "lshift",
    "rshift",
    "and",
    "or",
    "xor",
)


def _stand_in(base: type) -> type:
    namespace = {
        "__module__": __name__,
        "__doc__": f"A {base.__name__} a traced program drew: only its range is known.",
    }
    for name, use in _USES.items():
        if hasattr(base, name):
            namespace[name] = _refuse(use)
    for op in _ARITHMETIC:
        for name in (f"__{op}__", f"__r{op}__"):
            if hasattr(base, name):
                namespace[name] = _refuse("in arithmetic")
    for op in ("lt", "le", "gt", "ge", "eq", "ne"):
        namespace[f"__{op}__"] = _compare(op)
    return type(f"Drawn{base.__name__.capitalize()}", (base,), namespace)


_STAND_INS = {float: _stand_in(float), int: _stand_in(int)}


def _drawn(kind: type, span, site: str, where: str):
    number = _STAND_INS[kind](span[0] if span is not None else 0)
    number._span, number._site, number._where = span, site, where
    return number


# -- the generators --------------------------------------------------------------------------------


#: Functions of the modules that use the global generator without being its bound methods
#: (NumPy's ``ranf`` and ``sample`` are module functions).
_MODULE_FUNCTIONS = frozenset({"ranf", "sample"})
#: Functions that read or set the generator's state, which stay unwrapped: tools that run inside
#: a trace save and restore it (Dynamo tracing into a jitted call), and a program that changes
#: it for good is found by the states' comparison after tracing.
_STATE_FUNCTIONS = frozenset({"getstate", "setstate", "seed", "get_state", "set_state"})


class _Generator:
    """A global generator: the module whose functions draw from it, its functions (the originals,
    taken once), the scalar draws among them, and how to draw without advancing it."""

    def __init__(self, name: str, module, instance, scalars: dict, fork, state, states: tuple):
        self.name, self.module, self.instance, self.scalars = name, module, instance, scalars
        self.functions = {
            n: f
            for n, f in vars(module).items()
            if n not in _STATE_FUNCTIONS and (getattr(f, "__self__", None) is instance or n in _MODULE_FUNCTIONS)
        }
        #: ``seed``, the module's (the original, taken once)
        self.seed = vars(module)["seed"]
        #: ``state()`` compares states; ``states``: ``(get, set)`` of the generator's own state
        self._fork, self.state, self.states = fork, state, states
        self.installed = False

    def peek(self, name: str, args, kwargs):
        """What ``name(*args, **kwargs)`` would return now, drawn from a copy of the generator."""
        fork = self._fork(self.instance)
        # NumPy's module functions ``ranf`` and ``sample`` are ``random_sample`` by other names.
        method = getattr(fork, name, None) or fork.random_sample
        return method(*args, **kwargs)


def _python_fork(instance):
    copy = _random.Random()
    copy.setstate(instance.getstate())
    return copy


_PYTHON = _Generator(
    "Python's global random generator (random)",
    _random,
    _random._inst,
    _PYTHON_SCALARS,
    _python_fork,
    _random._inst.getstate,
    (_random._inst.getstate, _random._inst.setstate),
)
_numpy: list = []


def _numpy_generator():
    """NumPy's legacy global generator, once the program's process imported NumPy (read from
    ``sys.modules``: importing NumPy here would cost every process that has none). NumPy 2 imports
    ``numpy.random`` on the first use of ``np.random``: a program making it while traced drew
    unseen, and every compiled call reused its number. So it is imported here (about 25 ms, once)."""
    if not _numpy and "numpy" in sys.modules:
        nr = importlib.import_module("numpy.random")

        def fork(instance):
            copy = nr.RandomState()
            copy.set_state(instance.get_state())
            return copy

        def state():
            name, key, *rest = nr.mtrand._rand.get_state()
            return (name, key.tobytes(), *rest)

        _numpy.append(
            _Generator(
                "NumPy's global random generator (numpy.random)",
                nr,
                nr.mtrand._rand,
                _NUMPY_SCALARS,
                fork,
                state,
                (nr.mtrand._rand.get_state, nr.mtrand._rand.set_state),
            )
        )
    return _numpy[0] if _numpy else None


def _generators() -> list:
    numpy = _numpy_generator()
    return [_PYTHON] if numpy is None else [_PYTHON, numpy]


# -- while a program is traced ---------------------------------------------------------------------


class DrawCall:
    """A draw of one number the program made, repeated by every call (the number is unused)."""

    __slots__ = ("function", "args", "kwargs")

    def __init__(self, function, args, kwargs):
        self.function, self.args, self.kwargs = function, args, kwargs

    def apply(self, extras, flat) -> None:
        self.function(*self.args, **self.kwargs)


def _plain(value) -> bool:
    if type(value) in (tuple, list):
        return all(map(_plain, value))
    return value is None or type(value) in (int, float, bool, str)


def _draw_error(site: str, generator: _Generator, where: str, why: str):
    return ThunderNotImplementedError(
        f"{site}: the program uses {generator.name} at {where} while it is traced ({why}); a compiled call "
        "would not repeat what it does. Draw with torch (torch.rand, torch.randint, torch.randperm), which "
        "thunder_rs draws on every call"
    )


def _span(range_of, args, kwargs):
    try:
        return range_of(*args, **kwargs)
    except (TypeError, ValueError):
        return None


def _wrap(generator: _Generator, name: str, original):
    site = f"{generator.module.__name__}.{name}"
    range_of = generator.scalars.get(name)

    @functools.wraps(original)
    def draw(*args, **kwargs):
        recorded = _draws.get()
        if recorded is None or thread_state.inside:
            return original(*args, **kwargs)
        where = user_location()
        if range_of is None:
            raise _draw_error(site, generator, where, "only draws of one number can be repeated")
        if not (_plain(args) and _plain(list(kwargs.values()))):
            raise _draw_error(site, generator, where, "its arguments are not plain numbers")
        result = generator.peek(name, args, kwargs)
        if type(result) not in _STAND_INS:
            raise _draw_error(site, generator, where, f"it returns a {type(result).__name__}, not one number")
        recorded.append(DrawCall(original, args, kwargs))
        return _drawn(type(result), _span(range_of, args, kwargs), site, where)

    return draw


def _seeding(generator: _Generator, original):
    """``seed`` of ``generator``'s module while a program is traced: seeds it (the draws after it
    peek at the seeded generator), records the seeding among the draws, to be made by every call,
    and notes the state it made (``recording_draws`` undoes it)."""
    site = f"{generator.module.__name__}.seed"

    @functools.wraps(original)
    def seed(*args, **kwargs):
        recorded = _draws.get()
        if recorded is None or thread_state.inside:
            return original(*args, **kwargs)
        if not (_plain(args) and _plain(list(kwargs.values()))):
            raise _draw_error(site, generator, user_location(), "its seed is not a plain number or string")
        result = original(*args, **kwargs)
        recorded.append(DrawCall(original, args, kwargs))
        _seeded.get({})[generator.name] = generator.state()
        return result

    return seed


#: per tracing: the name of each generator the program seeded -> its state after the last seeding
_seeded: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_seeded")
_install_lock = threading.Lock()


def _install(generators) -> None:
    """Puts the wrappers into the generators' modules, once (they stay: the guards of traced
    programs that read ``np.random.random`` hold the wrapper; outside tracing it calls through)."""
    with _install_lock:
        for generator in generators:
            if not generator.installed:
                generator.installed = True
                for name, original in generator.functions.items():
                    setattr(generator.module, name, _wrap(generator, name, original))
                generator.module.seed = _seeding(generator, generator.seed)
                # Also where the program bound it before (``from random import seed``), while traced:
                # another wrapper, as the stand-in of the original there, which the guards on that
                # place expect back. (The module's stays, and is what the guards on it expect.)
                register_stand_in(generator.seed, _seeding(generator, generator.seed))


@contextlib.contextmanager
def recording_draws(draws: list):
    """While the ``with`` body traces a program, its draws from the global generators are recorded
    into ``draws`` (``DrawCall``) or refused, and its seedings made and recorded there, undone
    after; a generator that advanced anyway (since its last seeding) is refused after."""
    generators = _generators()
    before = [(g.state(), g.states[0]()) for g in generators]
    seeded: dict = {}
    token, seeds = _draws.set(draws), _seeded.set(seeded)
    _install(generators)
    try:
        yield
    finally:
        _draws.reset(token)
        _seeded.reset(seeds)
        after = [g.state() for g in generators]
        for generator, (_, raw) in zip(generators, before):
            if generator.name in seeded:
                generator.states[1](raw)  # (every call seeds it again, the first one too)
    for generator, (state, _), now in zip(generators, before, after):
        if now != seeded.get(generator.name, state):
            raise ThunderNotImplementedError(
                f"thunder_rs.jit: the program changed the state of {generator.name} while it was traced (drawing "
                f"or seeding through a function imported from {generator.module.__name__} before tracing, or a draw "
                "in another thread); a compiled call would not do it again. Seed outside the jitted function, "
                "and draw with torch (torch.rand, torch.randint, torch.randperm), which thunder_rs draws on every "
                "call"
            )
