"""``torch.Generator`` arguments as inputs of each call, not constants of the trace.

A program that takes a generator (``g = torch.Generator().manual_seed(seed)`` made anew per sample
for reproducible augmentation) is keyed by the generator's kind and device only
(``cache.leaf_key``), so a fresh generator per call runs the entry the first one compiled. Its
trace draws from a generator of the entry's own, the argument's *stand-in*, which the program is
traced with in the argument's place (at the argument's state, so the draws made while tracing are
the argument's). Each call copies its generator's state into the stand-in, runs, and copies the
stand-in's state back, also when the call fails: it draws what eager draws from that generator and
leaves it where eager leaves it. One generator passed at several places is one stand-in (the key
holds which arguments are one object, ``cache.tensor_aliases``).

The default generators (``torch.default_generator``, ``torch.cuda.default_generators``), which the
program also draws from without naming them, stay keyed by identity and are drawn from directly,
as are generators of other devices. An argument generator the program also reaches otherwise (a
module attribute or a global holding it, read as well), stores (``self.last = g``, which every
call repeats with what tracing stored) or draws from in a backward (which autograd runs after the
call), is traced as itself, by identity (a guard: the call's argument must be that object); the
others must not be any generator the trace names itself (a guard), whose draws the stand-in would
not see.

A generator the program holds (``self.gen``, a global) stays keyed by identity: the program may
reach it by other paths than the one read (a ``functools.partial`` holding it), which would draw
from the old object where eager's draws from the new one.
"""

import functools
import threading
import types

import torch

from thunder_rs.core.acquisition.cache import is_runtime_generator
from thunder_rs.core.acquisition.effects import TracedValue
from thunder_rs.core.acquisition.outputs import MadeAgain, RebuiltOutput
from thunder_rs.core.lang.recorder import backward_draws
from thunder_rs.core.lang.rng import check_generators
from thunder_rs.core.lang.tensor_hooks import Hooks, InputHook
from thunder_rs.core.state.modules import cell_contents
from thunder_rs.core.state.aliases import FixedGuard
from thunder_rs.core.state.guards import InputSource


class StandIns:
    """The stand-ins of one compile for the flat inputs ``flat``: per distinct generator argument
    (``cache.is_runtime_generator``) its first flat position and its stand-in; those whose ids are
    in ``kept`` are traced as themselves."""

    def __init__(self, flat: list, kept: frozenset = frozenset()):
        first: dict = {}
        for i, x in enumerate(flat):
            if is_runtime_generator(x):
                first.setdefault(id(x), i)
        #: ``(first position, the argument, its stand-in)``
        self.places = []
        #: ``(first position, the argument)`` of the generators traced as themselves
        self.kept = []
        for i in first.values():
            g = flat[i]
            if id(g) in kept:
                self.kept.append((i, g))
                continue
            stand_in = torch.Generator(device=g.device)
            stand_in.set_state(g.get_state())
            self.places.append((i, g, stand_in))
        self._by_id = {id(g): s for _, g, s in self.places}
        #: held while a call draws through the stand-ins (its first call's callable and the others)
        self._lock = threading.RLock()

    def __bool__(self) -> bool:
        return bool(self.places or self.kept)

    def traced(self, flat: list) -> list:
        """The flat inputs the program is traced with: each generator argument its stand-in."""
        if not self._by_id:
            return flat
        return [self._by_id.get(id(x), x) if is_runtime_generator(x) else x for x in flat]

    def reached_otherwise(self, acquired) -> frozenset:
        """The ids of the generator arguments the trace names as themselves among its constants
        (the program reached them otherwise too: a module attribute holding the one it was passed),
        or whose stand-ins it stores or prints (``self.last = g``: each call stores its own), its
        backward draws from (a custom Function's, from ``ctx.g``; a tensor hook's: autograd runs
        them after the call gave the stand-in's state back), or a function it returns or stores
        holds (a sampler closure)."""
        named = {id(c) for c in acquired.consts if type(c) is torch.Generator}
        stored = {
            id(x) for effect in acquired.effects for leaf in _values_of(effect) for x in (leaf, *_captured(leaf, 4))
        }
        stored |= acquired.backward_draws  # (drawn when autograd runs the backward, after the call)
        # Functions that run with them later: tensor hooks (in the backward), returned closures.
        later = [c for c in acquired.consts if type(c) is Hooks]
        later += [e.hooks for e in acquired.effects if type(e) is InputHook]
        later += acquired.out_spec.shared() if type(acquired.out_spec) is RebuiltOutput else []
        stored.update(id(x) for f in later for x in (f, *_captured(f, 4)))  # (a rebuilt closure's cells: themselves)
        return frozenset(id(g) for _, g, s in self.places if id(g) in named or id(s) in stored)

    def drawn(self, consts: list) -> None:
        """Drops the stand-ins the trace does not name (``consts``): the program never drew from
        those arguments (a generator for a branch not taken), so a call need not copy their states."""
        named = {id(c) for c in consts}
        self.places = [(i, g, s) for i, g, s in self.places if id(s) in named]

    def guard(self, consts: list, names: list):
        """The guard that the kept generators are the call's arguments at their places and the
        others none of the generators the trace names itself, or None where there is nothing
        to check. ``names`` labels the flat inputs."""
        stand_ins = {id(s) for _, _, s in self.places}
        others = tuple(c for c in consts if type(c) is torch.Generator and id(c) not in stand_ins)
        if not self.kept and not others:
            return None
        same = [(InputSource(i, (), names[i]), g) for i, g in self.kept]
        apart = [InputSource(i, (), names[i]) for i, _, _ in self.places] if others else []
        return FixedGuard(same, apart, (*(g for _, g in self.kept), *others))

    def positions(self) -> tuple:
        """The flat positions of the generators each call copies into the stand-ins, in order."""
        return tuple(i for i, _, _ in self.places)

    def drawing(self, fn, at: int):
        """``fn`` (an entry's callable) taking, from the ``at``-th of its inputs on, the call's
        generators (``positions``) before its own inputs: their states are the stand-ins' while it
        runs (one call at a time: the stand-ins are the entry's), and theirs after."""
        stand_ins = tuple(s for _, _, s in self.places)
        if not stand_ins:
            return fn
        end = at + len(stand_ins)
        lock = self._lock

        def call(*inputs):
            generators = inputs[at:end]
            with lock:
                for stand_in, g in zip(stand_ins, generators):
                    stand_in.set_state(g.get_state())
                try:
                    return fn(*inputs[:at], *inputs[end:])
                finally:
                    for stand_in, g in zip(stand_ins, generators):
                        g.set_state(stand_in.get_state())

        return call


def _captured(obj, depth: int) -> list:
    """What a function that runs after the call (a tensor hook, ``tensor_hooks.Hooks``; a returned
    or stored closure) runs with, ``depth`` references deep: closure cells and defaults, the
    arguments of a ``functools.partial``, the receiver of a method, the items of lists and dicts
    and the attributes of a callable object (a module's: its own state, guarded apart)."""
    if depth == 0:
        return []
    if type(obj) is Hooks:
        parts = list(obj.hooks.values())
    elif isinstance(obj, types.MethodType):
        parts = [obj.__func__, obj.__self__]
    elif isinstance(obj, types.FunctionType):
        parts = [cell_contents(c) for c in obj.__closure__ or ()]
        parts += [*(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values()]
    elif isinstance(obj, functools.partial):
        parts = [obj.func, *obj.args, *obj.keywords.values()]
    elif isinstance(obj, (list, tuple)):
        parts = list(obj)
    elif isinstance(obj, dict):
        parts = list(obj.values())
    elif (
        callable(obj) and not isinstance(obj, (type, torch.nn.Module)) and type(getattr(obj, "__dict__", None)) is dict
    ):
        parts = list(vars(obj).values())
    else:
        return []
    return parts + [x for p in parts for x in _captured(p, depth - 1)]


def _values_of(effect) -> list:
    """The leaves of the values an effect (``effects``: an attribute or item write, a print)
    stores or prints on each call."""
    values = [v for field in ("value", "key", "arguments") if type(v := getattr(effect, field, None)) is TracedValue]
    made = [o for v in values for _, o in v.outputs if type(o) is MadeAgain]  # (made anew per call)
    return [leaf for v in values for leaf in v.leaves] + [x for o in made for x in o.shared()]


def acquired_with_stand_ins(acquire, flat: list, names: list):
    """``acquire(traced flat inputs)``'s result for the call of ``flat``, its generator arguments
    traced as their stand-ins (those it reaches otherwise too: as themselves, traced again), with
    the guard of ``StandIns.guard`` added and the ``StandIns`` as ``acquired.stand_ins`` (None
    where the call takes no generator). ``names`` labels the flat inputs. Refuses a generator the
    program creates (``rng``)."""
    stand_ins = StandIns(flat)
    acquired = _acquired(acquire, stand_ins, flat)
    if stand_ins:
        # (each round keeps more generators as themselves, so it ends)
        while shared := stand_ins.reached_otherwise(acquired):
            stand_ins = StandIns(flat, shared | {id(g) for _, g in stand_ins.kept})
            acquired = _acquired(acquire, stand_ins, flat)
        stand_ins.drawn(acquired.consts)
        guard = stand_ins.guard(acquired.consts, names)
        if guard is not None:
            acquired.guards.append(guard)
        acquired.stand_ins = stand_ins
    check_generators(acquired.consts, frozenset(id(s) for _, _, s in stand_ins.places))
    return acquired


def _acquired(acquire, stand_ins: StandIns, flat: list):
    """``acquire``'s result for ``flat`` traced with ``stand_ins``, with the generators its
    backward draws from (``recorder.backward_draws``) as ``acquired.backward_draws``."""
    drawn = backward_draws()
    drawn.clear()
    acquired = acquire(stand_ins.traced(flat))
    acquired.backward_draws = frozenset(drawn)
    drawn.clear()
    return acquired
