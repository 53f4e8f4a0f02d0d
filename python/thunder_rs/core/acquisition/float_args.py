"""Automatic dynamic floats: float arguments that change between calls are inputs of the trace.

As torch.compile does with ``specialize_float=False``, a function is compiled for the floats of
its first call; when a later call misses the cache and a float argument (positional, keyword,
or an item of a list, tuple or dict argument) differs from an earlier call's, the next compile
takes it as a float input (``symfloat.float_input``): what the program computes from it stays
symbolic, and the compiled program passes the caller's float to torch, so the kernels see what
eager's see (a wrapped number: a float never promotes a float16 tensor). The key of the calls it
serves holds ``FLOAT`` at that place rather than the value (``widen``), so every value hits.
A float a module or an argument object holds (a module's ``self.temperature``, ``cfg.scale``) that
a call finds changed is a float input of the next compile in the same way (``HeldFloat``, as
``dynamic.HeldInt`` for ints): its guard checks only that a float is there, the entry reads it.

Python arithmetic on it (``1 / s``, ``s ** 0.5``, ``math.sqrt``, ``math.exp``, ``math.log``) stays
symbolic, computed again in doubles on each call. A decision on its value (``if s > 0.5``,
``max(s, 1e-8)``, a divisor nonzero, ``math.sqrt``'s argument nonnegative) is a guard on the
decision's answer (``FloatGuard``, ``lang.float_guards``): a call answering otherwise compiles
again with the float still an input (one entry per answer), or raises as eager does (``1 / s`` at
0.0 raises ZeroDivisionError from the program's line). Where the program needs the value itself
(``float()``, ``int()``, ``round``, text and ``repr``, returning it, a decision mixing it with
symbolic sizes) or its type (``type(s) is float``, which no stand-in's type is: found in the
program's bytecode, ``core.state.type_reads``), tracing notes it (``symfloat.specialised_inputs``)
and the float is compiled as a constant, then and from then on: each value is a key of its own,
and the miss reason says where the program read it. ``jit(dynamic=False)`` keeps every float
constant.
"""

from typing import Any, NamedTuple

import numpy

from thunder_rs.core.acquisition.cache import leaf_key
from thunder_rs.core.acquisition.dynamic import FLOAT as FLOAT_ATTR
from thunder_rs.core.lang import float_guards
from thunder_rs.core.lang.symfloat import specialised_inputs

#: A float argument's place in a key where the trace takes it as an input: any float matches
#: (``(numpy.float64, None)`` for a NumPy double, likewise its float32 and float16: ``core.lang.numpy_scalars``).
FLOAT = (float, None)
#: The types of the float arguments a trace may take as inputs (their keys: ``(type, bits)``).
FLOAT_TYPES = (float, numpy.float64, numpy.float32, numpy.float16)


class ArgFloat(NamedTuple):
    """A float argument the trace takes as an input: flat input ``position``; the entry takes it
    among its last inputs (after the ints read as sizes), the ``input``-th float."""

    position: int
    input: int

    def code(self, j: int, scope: dict) -> str:
        """An expression reading it from a call's flat inputs ``flat``."""
        return f"flat[{self.position}]"


class FloatSpecialised(Exception):
    """A trace with float inputs needed the value of some (``sites``: ``{value id: "file:line"}``)."""

    def __init__(self, sites: dict):
        super().__init__(sites)
        self.sites = sites


def _is_float_key(k) -> bool:
    return type(k) is tuple and len(k) == 2 and k[0] in FLOAT_TYPES


def widen(key, positions):
    """``key`` (a general call's: ``(state, leaves, spec)``) with ``FLOAT`` at ``positions``."""
    if not positions:
        return key
    leaves = list(key[1])
    for i in positions:
        leaves[i] = (leaves[i][0], None)
    return (key[0], tuple(leaves), *key[2:])


def widened(key) -> tuple:
    """The positions where ``key`` holds ``FLOAT``: the floats its entry takes as inputs."""
    if type(key) is not tuple or len(key) < 3:
        return ()
    return tuple(i for i, k in enumerate(key[1]) if k is FLOAT or (_is_float_key(k) and k[1] is None))


def changed_floats(old_key, new_key) -> set:
    """The positions of the float arguments that differ between two keys of calls with the same
    structure (and global state)."""
    if type(old_key) is not tuple or len(old_key) != len(new_key) or len(new_key) < 3:
        return set()
    if old_key[0] != new_key[0] or old_key[2:] != new_key[2:] or len(old_key[1]) != len(new_key[1]):
        return set()
    return {
        i for i, (a, b) in enumerate(zip(old_key[1], new_key[1])) if a != b and _is_float_key(a) and _is_float_key(b)
    }


class FloatArgs:
    """A jitted function's float arguments: those seen to change (``marked``), those its entries
    take as inputs (``wide``: its calls' keys hold ``FLOAT`` there), and those its program needs
    the value of (``constant``: never inputs again); and the floats of modules and argument
    objects (``HeldFloat``) it needs the value of (``constant_held``)."""

    def __init__(self):
        self.marked: set = set()
        self.wide: tuple = ()
        #: ``{flat position: "file:line" or None}``: where the program needed the value
        self.constant: dict = {}
        #: ``{(source key, name): "file:line" or None}`` of held floats the program needed the value of
        self.constant_held: dict = {}
        #: the float inputs of the last compile (``ArgFloat``, ``HeldFloat``), and ``(place, label,
        #: site)`` of those it found it needed the value of (its miss reason says so)
        self.made: tuple = ()
        self.kept: list = []
        #: the decisions on float inputs of the last compile that took some (its miss reasons name them)
        self.guard: FloatGuard | None = None
        self._held_places: tuple = ()

    def key(self, key):
        """A general call's key with ``FLOAT`` where the entries take floats as inputs."""
        leaves = list(key[1])
        n = len(leaves)
        for i in self.wide:  # (leaf keys are tuples: a float's is ``(float, hex)``)
            if i < n and leaves[i][0] in FLOAT_TYPES:
                leaves[i] = FLOAT if leaves[i][0] is float else (leaves[i][0], None)
        return (key[0], tuple(leaves), *key[2:])

    def wanted(self, mode, key, flat, earlier_keys):
        """``key`` widened at the float arguments of the call of ``flat`` to take as inputs: those an
        earlier call had other values for (``earlier_keys``), unless ``mode`` is False, and never
        those the program needed the value of."""
        if mode is not False and len(key) >= 3:
            for old in earlier_keys:
                if old is not None:
                    self.marked.update(changed_floats(old, key))
        floats = [
            i for i in sorted(self.marked) if i < len(flat) and type(flat[i]) in FLOAT_TYPES and i not in self.constant
        ]
        return widen(key, floats) if floats else key

    def held(self, held: dict | None) -> dict | None:
        """``held`` (``dynamic.wanted_held``) without the floats the program needed the value of."""
        if held is None:
            return None
        places = [at for at, dims in held.items() if FLOAT_ATTR in dims]
        self._held_places = tuple(at for at in places if at not in self.constant_held)
        if len(self._held_places) == len(places):
            return held
        return {at: dims - {FLOAT_ATTR} if at in self.constant_held else dims for at, dims in held.items()}

    def generate(self, make, key, flat):
        """``(make(floats), key)`` for the floats ``key`` takes as inputs (``widened``), where the
        compile kept them so; where it needed the value of some (or failed), again with those
        constant and the key holding their values. ``make`` returns ``_generated``'s tuple."""
        floats = widened(key)
        self.kept, self.guard = [], None
        before = (dict(self.constant), dict(self.constant_held), self.wide)
        try:
            return self._generate(make, key, flat, floats)
        except Exception:
            # The program's own error (``1 / s`` at 0.0), raised with the floats constant too:
            # they stay inputs for the calls that follow (none of its values was the cause).
            self.constant, self.constant_held, self.wide = before
            raise

    def _generate(self, make, key, flat, floats):
        while True:
            try:
                made, needed = self._made(make, floats)
            except Exception:
                if not floats and not self._held_places:
                    raise
                made, needed = None, [(i, None, None) for i in (*floats, *self._held_places)]
            if not needed:
                self.wide = tuple(sorted({*self.wide, *floats}))
                self.made = tuple(at for at, _ in made[0].floats)
                return made, key
            self.kept.extend(needed)
            for place, _, site in needed:
                (self.constant if type(place) is int else self.constant_held)[place] = site
            self.wide = tuple(i for i in self.wide if i not in self.constant)
            floats = tuple(i for i in floats if i not in self.constant)
            key = (
                key[0],
                tuple(leaf_key(flat[i]) if i in self.constant else k for i, k in enumerate(key[1])),
                *key[2:],
            )

    def _made(self, make, floats) -> tuple:
        """``make(floats)`` and the float inputs it needed the value of, ``[(place, label, site)]``: a
        flat position or a held float's ``(source key, name)``."""
        with specialised_inputs() as noted:
            made = make(floats)
        places = {vid: at for at, vid in made[0].floats}
        needed = [(_place(places[v]), _label(places[v]), site) for v, site in noted.found.items() if v in places]
        if noted.decisions and not needed:
            self.guard = FloatGuard(noted.decisions, made[0].floats)
            made[0].guards.append(self.guard)
        return made, needed

    def again(self, make, key):
        """``make(floats)`` of the floats ``key`` takes as inputs, traced again (with other sizes
        symbolic); raises ``FloatSpecialised`` where it needed the value of one."""
        with specialised_inputs() as noted:
            made = make(widened(key))
        if noted.found:
            raise FloatSpecialised(noted.found)
        if noted.decisions:
            self.guard = FloatGuard(noted.decisions, made[0].floats)
            made[0].guards.append(self.guard)
        return made

    def labels(self, names: list) -> str:
        """``; compiled with symbolic floats s, cfg['lr'], self.temperature`` for the floats the last
        compile took as inputs, and ``; s kept constant: its value is needed at file:line`` for
        those it found it needed the value of."""
        labels = [names[at.position] if type(at) is ArgFloat else f"{at.source.label}.{at.name}" for at in self.made]
        if self.guard is not None and not self.guard.names:
            self.guard.names = dict(zip((vid for _, vid in self.guard.floats), labels))
        parts = ["compiled with symbolic floats " + ", ".join(labels)] if labels else []
        for place, held_label, site in self.kept:
            name = names[place] if type(place) is int else held_label or f"{place[1]}"
            parts.append(f"{name} kept constant" + (f": its value is needed at {site}" if site else ""))
        return "".join(f"; {p}" for p in parts)


class HeldFloat(NamedTuple):
    """A float a module or an argument object holds that the trace takes as an input (a module's
    ``self.temperature``): its attribute ``name`` at ``source`` (``guards.InputSource`` or
    ``ModuleSource``), the ``input``-th float input; the entry reads it there on every call."""

    source: Any
    name: str
    input: int

    def code(self, j: int, scope: dict) -> str:
        """An expression reading it from a call's flat inputs ``flat``; binds what it uses in ``scope``."""
        return f"{self.source.code(f'f{j}', scope)}[{self.name!r}]"


def _place(at) -> int | tuple:
    return at.position if type(at) is ArgFloat else (at.source.key, at.name)


def _label(at) -> str | None:
    return f"{at.source.label}.{at.name}" if type(at) is HeldFloat else None


class FloatGuard:
    """The decisions a trace took on its float inputs' values (``float_guards``: ``s > 0.5`` was
    True, ``s != 0`` for ``1 / s``), checked on every call with the call's floats."""

    per_call = True
    source = None

    def __init__(self, decisions: list, floats):
        self.decisions = tuple(decisions)
        self.floats = tuple(floats)  # ``(ArgFloat or HeldFloat, value id)``
        scope: dict = {}
        # (a ``numpy.float64`` read as the float it is: its comparisons answer ``numpy.bool_``)
        reads = ", ".join(f"{vid}: float({at.code(j, scope)})" for j, (at, vid) in enumerate(self.floats))
        exec(compile(f"def read(flat):\n    return {{{reads}}}\n", "<thunder_rs float guards>", "exec"), scope)
        self._read = scope["read"]
        #: ``{value id: the user's name}`` (``FloatArgs.labels``)
        self.names: dict = {}

    def holds(self, flat) -> bool:
        try:
            values = self._read(flat)
        except (KeyError, AttributeError, IndexError, TypeError):
            return False
        return float_guards.holds(self.decisions, values)

    def describe(self, flat) -> str:
        names = self.names
        for decision in self.decisions:
            if not self.holds_one(decision, flat):
                op, a, b, answer, site = decision
                shown = f"{float_guards.text(a, names)} {float_guards.SYMBOLS[op]} {float_guards.text(b, names)}"
                return f"{shown} was {answer} when traced (decided at {site}), not now"
        return "a decision on a float input differs"

    def holds_one(self, decision, flat) -> bool:
        try:
            return float_guards.holds((decision,), self._read(flat))
        except (KeyError, AttributeError, IndexError, TypeError):
            return False

    def term(self, index: int, scope: dict) -> str:
        scope[f"fg{index}"] = self.holds
        return f"fg{index}(flat)"
