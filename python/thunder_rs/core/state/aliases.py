"""Which places of a call's arguments hold one object: what an entry that reads and sets argument
objects through their paths relies on.

Argument objects are found before the program runs (``reached.ArgumentObjects``), each at the first
path that reaches it; the program's reads and writes of an object are guarded and repeated
through that path, whichever place it used. One object found at two places (a KV cache's list
holding one layer at two indices, ``cache.layers = [layer, layer]``; one object passed as two
arguments; one tensor, ``cache.keys = [t, t]``, read per call at the first) must be one object in
each call (``SameGuard``): otherwise what the program read through the second place, guarded
through the first, could be anything there. Objects distinct
when traced must stay distinct (``DistinctGuard``) where the program set attributes or items of
one of them: in eager a write through one place is then seen through the other, which the trace,
reading each through its own path, does not do. Only objects of a written one's type can be it, so
only those are compared: a program that only reads from them hits whichever the sharing. Lists
and dicts of module attributes and globals need neither: their guards compare their items by
identity; an argument object that was, or was not, one the program read from there is compared
with those (``FixedGuard``).
"""

import types

import torch

from thunder_rs.core.state.guards import InputSource, ObjectSource

#: Values whose instance dict is no state of the program's (functions, classes, modules of code).
_NOT_STATE = (type, types.ModuleType, types.FunctionType, types.MethodType, torch.Tensor)


class DistinctGuard:
    """Argument objects distinct when traced, which must be in each call: the trace reads and sets
    each through its own path, where eager would see one object's writes through the other
    (``cache.self_attention_cache is cache.cross_attention_cache``; ``cache.layers[0] is
    cache.layers[1]`` when the program sets ``layer.keys``). One set of ids per call."""

    per_call = True
    source = None

    def __init__(self, sources: list):
        self.sources = sources
        self.origin = ", ".join(s.label for s in sources)

    def holds(self, flat) -> bool:
        try:
            return len({id(s.object(flat)) for s in self.sources}) == len(self.sources)
        except (KeyError, AttributeError, IndexError, TypeError):
            return False

    def describe(self, flat) -> str:
        return f"some of {self.origin}, distinct objects when traced, are now one object"

    def term(self, index: int, scope: dict) -> str:
        return self.objects_term([s.object_code(scope) for s in self.sources])

    def objects_term(self, objects: list) -> str:
        """The term over the expressions ``objects`` of the objects at ``sources``."""
        return f"len({{{', '.join(f'id({o})' for o in objects)}}}) == {len(objects)}"


class SameGuard:
    """Places of the arguments that held one object when traced, as ``(first place, another)``
    pairs, which must in each call: the trace reads it through the first."""

    per_call = True
    source = None

    def __init__(self, pairs: list):
        self.pairs = pairs
        self.sources = [s for pair in pairs for s in pair]
        self.origin = ", ".join(f"{a.label} is {b.label}" for a, b in pairs)

    def holds(self, flat) -> bool:
        try:
            return all(a.object(flat) is b.object(flat) for a, b in self.pairs)
        except (KeyError, AttributeError, IndexError, TypeError):
            return False

    def describe(self, flat) -> str:
        for a, b in self.pairs:
            try:
                if a.object(flat) is b.object(flat):
                    continue
            except (KeyError, AttributeError, IndexError, TypeError):
                pass
            return f"{a.label} and {b.label}, one object when traced, are now distinct objects"
        return f"the places {self.origin} when traced no longer hold one object"

    def term(self, index: int, scope: dict) -> str:
        return self.objects_term([s.object_code(scope) for s in self.sources])

    def objects_term(self, objects: list) -> str:
        return " and ".join(f"{a} is {b}" for a, b in zip(objects[::2], objects[1::2]))


class FixedGuard:
    """Argument objects that were, when traced, objects the program also read from its lasting
    state (a module attribute, a global: ``self.layer`` passed as ``layer`` too), which must be
    those objects in each call (``same``: ``(place, object)``), and argument objects of a type the
    program set attributes or items of, which were not, and must not be (``apart``: places, none
    of ``fixed``): the trace reads the one through its argument path and the other where the state
    holds it. The entry keeps ``fixed`` alive, so their ids stay theirs."""

    per_call = True
    source = None

    def __init__(self, same: list, apart: list, fixed: tuple):
        self.same, self.apart, self.fixed = same, apart, fixed
        self.ids = frozenset(map(id, fixed))
        self.sources = [s for s, _ in same] + apart
        self.origin = ", ".join(s.label for s in self.sources)

    def holds(self, flat) -> bool:
        try:
            objects = [s.object(flat) for s in self.sources]
        except (KeyError, AttributeError, IndexError, TypeError):
            return False
        n = len(self.same)
        same = all(a is b for a, (_, b) in zip(objects[:n], self.same))
        return same and not any(id(o) in self.ids for o in objects[n:])

    def describe(self, flat) -> str:
        return (
            f"which of {self.origin} are objects of the program's state (module attributes, globals) changed since "
            "traced"
        )

    def term(self, index: int, scope: dict) -> str:
        return self.objects_term([s.object_code(scope) for s in self.sources], index, scope)

    def objects_term(self, objects: list, index: int, scope: dict) -> str:
        n = len(self.same)
        terms = []
        for k, (code, (_, obj)) in enumerate(zip(objects[:n], self.same)):
            scope[f"x{index}_{k}"] = obj
            terms.append(f"{code} is x{index}_{k}")
        if n < len(objects):
            scope[f"f{index}"] = self.ids
            terms.append(f"f{index}.isdisjoint(({', '.join(f'id({o})' for o in objects[n:])},))")
        return " and ".join(terms)


def _fixed_objects(guards: list) -> dict:
    """id -> the objects the program read from lasting state that hold state of their own: those
    guarded whole, and those a guard on a module attribute or a global holds by identity."""
    found: dict = {}
    for g in guards:
        source = getattr(g, "source", None)
        if source is None or isinstance(source, InputSource):
            continue
        if isinstance(source, ObjectSource) and not isinstance(source.obj, torch.nn.Module):
            found[id(source.obj)] = source.obj
        expected = getattr(g, "expected", None)
        if getattr(g, "by_identity", False) and _stateful(expected):
            found[id(expected)] = expected
    return found


def _stateful(value) -> bool:
    return type(value) in (list, dict) or (
        isinstance(getattr(value, "__dict__", None), dict) and not isinstance(value, _NOT_STATE)
    )


def _distinct_already(sources: list, guards: list) -> bool:
    """Whether a ``DistinctGuard`` among ``guards`` (the one of objects guarded through their paths,
    ``ProgramState.guard_distinct``) covers every place of ``sources``: distinct there, distinct here."""
    covered = {getattr(s, "key", None) for g in guards if type(g) is DistinctGuard for s in g.sources}
    keys = {getattr(s, "key", None) for s in sources}
    return None not in keys and keys <= covered


def alias_guards(reached, written: set, guards: list) -> list:
    """The guards on which places of the arguments hold one object, for ``reached``
    (``reached.ArgumentObjects``) after a trace that set attributes of the state objects whose ids
    are ``written`` (``ProgramState.written_ids``) and items of ``reached.written``, with ``guards``
    the entry's others (which hold the objects it read from lasting state)."""
    made: list = []
    if reached.aliases:
        made.append(SameGuard(reached.aliases))
    places = [(x, source) for x, source, _ in reached.objects]
    places += [(x, source) for x, _, source in reached.containers]
    kinds = {type(x) for x, _ in places if id(x) in written or id(x) in reached.written}
    sources = [source for x, source in places if type(x) in kinds]
    if len(sources) > 1 and not _distinct_already(sources, guards):
        made.append(DistinctGuard(sources))
    fixed = _fixed_objects(guards) if places else {}
    same = [(source, x) for x, source in places if id(x) in fixed]
    kept = {id(x) for _, x in same}
    others = tuple(o for i, o in fixed.items() if type(o) in kinds and i not in kept)
    apart = [source for x, source in places if type(x) in kinds and id(x) not in kept] if others else []
    if same or apart:
        made.append(FixedGuard(same, apart, (*(x for _, x in same), *others)))
    return made
