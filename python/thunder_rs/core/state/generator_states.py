"""Random generators the program reaches but did not create: a ``random.Random`` or a NumPy
``Generator``, ``RandomState`` or bit generator held in a global, a closure cell, an attribute
(``self.rng``) or passed in.

Their draws are method calls (``rng.random()``, ``rng.integers(0, 5)``), not the module functions
``pydraws`` wraps for the global generators, and NumPy's are C methods of types no wrapper can
change: tracing drew once, and every compiled call reused those numbers while eager's draws go on.
What a draw leaves is seen instead: the observer notes each generator's state where the program
first reads it (``note_generator``), and after tracing ``refuse_drawn_generators`` refuses a
program that advanced one, naming the generator and where it was read, and sets the generator back
to the state it had, as if the refused call had not run.
"""

import random
import sys

from thunder_rs.core.base.userframe import read_site
from thunder_rs.errors import ThunderNotImplementedError


def _frozen(value):
    """``value`` (a generator's state: tuples, dicts, ints, NumPy arrays) as a comparable value."""
    if isinstance(value, dict):
        return tuple((k, _frozen(v)) for k, v in value.items())
    if isinstance(value, (tuple, list)):
        return tuple(_frozen(v) for v in value)
    tobytes = getattr(value, "tobytes", None)
    return (type(value).__name__, tobytes()) if tobytes is not None else value


class GeneratorState:
    """A generator's state when the program first read it, and how to read and set it again."""

    __slots__ = ("generator", "name", "origin", "_get", "_set", "_saved", "_frozen", "attr")

    def __init__(self, generator, name: str, origin: str, get, put, attr=None):
        # ``name``: how the program reached it (``closure variable 'rng'``, ``argument 'rng'``)
        self.generator, self.name, self.origin, self._get, self._set = generator, name, origin, get, put
        #: the attribute or global it was read as, to name the line that read it (``read_site``)
        self.attr = attr
        self._saved = get()
        self._frozen = _frozen(self._saved)

    def advanced(self) -> bool:
        return _frozen(self._get()) != self._frozen

    def restore(self) -> None:
        self._set(self._saved)


def _accessors(value):
    """``(get, set)`` of ``value``'s state if it is a random generator whose state can be read."""
    if isinstance(value, random.Random):
        # (``random.SystemRandom`` has no state: it reads the system's entropy, refused where read)
        return (value.getstate, value.setstate) if type(value).getstate is random.Random.getstate else None
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is None:
        return None
    if isinstance(value, numpy_random.Generator):
        value = value.bit_generator
    if isinstance(value, numpy_random.BitGenerator):
        return (lambda: value.state, lambda state: setattr(value, "state", state))
    if isinstance(value, numpy_random.RandomState):
        return (value.get_state, value.set_state)
    return None


def is_random_generator(value) -> bool:
    """Whether ``value`` is a random generator whose draws ``note_generator`` would see."""
    return _accessors(value) is not None


def note_generator(states: dict, value, name: str, origin: str, attr=None) -> None:
    """Notes in ``states`` (id -> ``GeneratorState``) the state of ``value``, read as ``name`` at
    ``origin`` (by ``attr`` there, if given), if it is a random generator not noted yet."""
    if id(value) not in states and (accessors := _accessors(value)) is not None:
        get, put = accessors
        states[id(value)] = GeneratorState(value, name, origin, get, put, attr)


def refuse_drawn_generators(states) -> None:
    """Refuses a program that drew from a generator of ``states`` (``GeneratorState``) while
    traced; every such generator is set back first."""
    drawn = [s for s in states if s.advanced()]
    for state in drawn:
        state.restore()
    if drawn:
        first = drawn[0]
        kind = f"{type(first.generator).__module__}.{type(first.generator).__qualname__}"
        # (the line of the function defined at ``origin`` that reads it: ``self.rng.random()``)
        at = first.origin if first.attr is None else read_site(first.origin, first.attr)
        raise ThunderNotImplementedError(
            f"thunder_rs.jit: the program draws from the {kind} {first.name} read at {at}, which it did "
            "not create; tracing drew its numbers once, and a compiled call would reuse them where eager draws new "
            "ones (thunder_rs set it back as it was). Draw with torch (torch.rand, torch.randint, torch.randperm, "
            "with a torch.Generator), which thunder_rs draws on every call, or draw outside the jitted function and "
            "pass the numbers in"
        )
