"""Which places of a call's arguments hold one object: what an entry that reads and sets argument
objects through their paths relies on.

Argument objects are found before the program runs (``reached.ArgumentObjects``), each at the first
path that reaches it; the program's reads and writes of an object are guarded and repeated
through that path, whichever place it used. One object found at two places (a KV cache's list
holding one layer at two indices, ``cache.layers = [layer, layer]``; one object passed as two
arguments) must be one object in each call (``SameGuard``): otherwise what the program read
through the second place, guarded through the first, could be anything there. Objects distinct
when traced must stay distinct (``DistinctGuard``) where the program set attributes or items of
one of them: in eager a write through one place is then seen through the other, which the trace,
reading each through its own path, does not do. Only objects of a written one's type can be it, so
only those are compared: a program that only reads from them hits whichever the sharing. Lists
and dicts of module attributes and globals need neither: their guards compare their items by
identity.
"""


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


def alias_guards(reached, written: set) -> list:
    """The guards on which places of the arguments hold one object, for ``reached``
    (``reached.ArgumentObjects``) after a trace that set attributes of the state objects whose ids
    are ``written`` (``ProgramState.written_ids``) and items of ``reached.written``."""
    guards: list = []
    if reached.aliases:
        guards.append(SameGuard(reached.aliases))
    places = [(x, source) for x, source, _ in reached.objects]
    places += [(x, source) for x, _, source in reached.containers]
    kinds = {type(x) for x, _ in places if id(x) in written or id(x) in reached.written}
    sources = [source for x, source in places if type(x) in kinds]
    if len(sources) > 1:
        guards.append(DistinctGuard(sources))
    return guards
