"""Which containers of a program's return value keep their identity on every compiled call.

Eager returns the objects themselves: a list returned twice (``return lst, lst``) is one list in
both places, a list the program found in its state (``return self.history``, a global, an
argument's ``box.items``) is that list, and one it stored on its state (``self.last = [...]``,
then ``return self.last``) is the one the call stored there. torch's pytree, which flattens the
output, makes a new container in each place on every call instead, and so does tracing itself
(``tree_map`` over the output makes new containers). ``origins`` pairs each container of the
traced output with the program's own at its place; ``Identities`` says which of those are
templated apart (``outputs._Templater``): found in state (returned as they are), found from the
arguments or stored by the call (found again after each call's effects: ``At``), or reached
twice (built once per call).
"""

import collections
import types

import torch
from torch.utils import _pytree as pytree

from thunder_rs.core.acquisition.returned_objects import LEAVES, children
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.symfloat import SymFloat
from thunder_rs.core.lang.symint import SymInt
from thunder_rs.core.state.guards import InputSource, Item, attributes_of

#: Objects walked at most in what a program stored (``stored_places``).
_BUDGET = 5000
#: Not walked through there: values, tensors, modules (a model stored is found as itself), bound methods.
_NOT_WALKED = (*LEAVES, torch.nn.Module, types.MethodType)

#: Containers whose identity the templater keeps: it rebuilds exactly these (and named tuples).
_KEPT = (list, tuple, dict, collections.OrderedDict, collections.defaultdict)


def _is_kept_type(x) -> bool:
    cls = type(x)
    return cls in _KEPT or (isinstance(x, tuple) and hasattr(cls, "_fields") and not hasattr(x, "__dict__"))


def origins(out, original) -> dict:
    """The id of each container of ``out`` (the traced output) -> the container of ``original``
    (what the program returned) at its place, where both are the same kind of pytree node."""
    found: dict = {}
    stack = [(out, original)]
    while stack:
        x, o = stack.pop()
        if type(x) is not type(o) or not _is_kept_type(x):
            continue
        found[id(x)] = o
        node = pytree.SUPPORTED_NODES[pytree._get_node_type(x)]
        children, _ = node.flatten_fn(x)
        theirs, _ = node.flatten_fn(o)
        if len(children) == len(theirs):
            stack.extend(zip(children, theirs))
    return found


class At:
    """An object a call finds after its effects ran: at ``path`` (``(attribute?, name or key)``
    steps) from ``holder``, an object or an ``InputSource`` into the call's flat inputs."""

    __slots__ = ("holder", "path")

    def __init__(self, holder, path: tuple):
        self.holder, self.path = holder, path

    def find(self, inputs):
        x = self.holder.object(inputs) if isinstance(self.holder, InputSource) else self.holder
        for attribute, key in self.path:
            x = attributes_of(x)[key] if attribute else x[key]
        return x


def places(writes: list, sources: dict, made, items: list) -> dict:
    """id -> ``(object or None, At)`` for what the program made and stored on its state
    (``stored_places``: each call stores its own) and for the objects, lists and dicts reached
    from the arguments (``ArgumentObjects.sources``: the call's own), the latter first, but those
    whose path the program changed (``items``: its item writes, ``(source, key, value)``)."""
    found = {k: place for k, place in stored_places(writes).items() if place[0] in made}
    steps = [(holder, name) for holder, name, _ in writes if isinstance(holder, InputSource)]
    steps += [(s, None if type(k) is slice else Item(k)) for s, k, _ in items if isinstance(s, InputSource)]
    # (one moved is neither: torch's pytree copies it, as before)
    found.update((k, (None, None if _moved(source, steps) else At(source, ()))) for k, source in sources.items())
    return found


def _moved(source: InputSource, steps: list) -> bool:
    """Whether a write at one of ``steps`` (``(holder, name or Item, or None for any item)``) changed
    what is found at ``source``: the call would find another object there after its effects."""
    for holder, step in steps:
        n = len(holder.path)
        if holder.position == source.position and len(source.path) > n and source.path[:n] == holder.path:
            if step is None or source.path[n] == step:
                return True
    return False


def stored_places(writes: list) -> dict:
    """id -> ``(object, At)`` for the containers and objects the program stored on its state,
    from its attribute writes ``(holder, name, value)``, each at its first place (the object kept
    alive, so its id stays its own)."""
    places: dict = {}
    for holder, name, value in writes:
        stack: list[tuple] = [(value, ((True, name),))]
        while stack and len(places) < _BUDGET:
            x, path = stack.pop()
            if id(x) in places or isinstance(x, _NOT_WALKED):
                continue
            if type(x) in (types.FunctionType, types.CellType) or path is None:
                # What a stored function holds (its cells, their contents) has no place to find it
                # again: a call makes it anew there and would make it anew for the output too.
                cell = type(x) is types.CellType
                places[id(x)] = (x, None if cell or path is None else At(holder, path))
                stack.extend((c, None) for c in children(x))
                continue
            if not (_is_kept_type(x) or type(getattr(x, "__dict__", None)) is dict):
                continue
            places[id(x)] = (x, At(holder, path))
            if isinstance(x, dict):
                stack.extend((v, (*path, (False, k))) for k, v in x.items())
            elif isinstance(x, (list, tuple)):
                stack.extend((v, (*path, (False, k))) for k, v in enumerate(x))
            else:
                stack.extend((v, (*path, (True, k))) for k, v in vars(x).items())
    return places


class Identities:
    """What ``outputs._Templater`` keeps of the program's own containers: ``origins`` (traced
    container -> the program's), ``places`` (id -> ``At`` for what is stored or reached from the
    arguments), and which are found in state (not ``made``) or reached twice."""

    def __init__(self, origins: dict, places: dict, made, arguments: dict, modules: dict):
        self.origins, self.places, self.made_objects, self._arguments = origins, places, made, arguments
        #: the user's module of each clone the program ran on, by the clone's id
        self.modules = modules
        counts = collections.Counter(map(id, origins.values()))
        self.twice = {k for k, n in counts.items() if n > 1}

    def special(self, x) -> bool:
        """Whether the traced container ``x`` is templated apart (torch's pytree would lose its identity)."""
        o = self.origins.get(id(x))
        return o is not None and (id(o) in self.twice or self.kept(o) is not None)

    def unplaced(self, o) -> bool:
        """Whether the program's ``o`` is one it also stored inside a function (a closure variable):
        each call would make it twice, once there, once in the output."""
        place = self.places.get(id(o))
        return place is not None and place[0] is o and place[1] is None

    def made(self, x) -> bool:
        """Whether the program made ``x`` (``returned_objects.made_objects``)."""
        return self.made_objects is not None and x in self.made_objects

    def kept(self, o):
        """What stands for the program's container ``o`` on every call: an ``At`` (stored, or an
        argument's), ``o`` itself (found in its state), or None (made, or not known)."""
        place = self.places.get(id(o))
        if place is not None:
            return place[1]
        made = self.made_objects
        found = made is not None and o not in made and id(o) not in self._arguments and _is_kept_type(o)
        return o if found and not _made_while_tracing(o) else None


def _made_while_tracing(o) -> bool:
    """Whether ``o`` holds a traced value that shows it was made while tracing, whatever its
    reference count says: a tuple (a proxy keeps its ``stride()`` tuple; one found in state cannot
    change), or a list of per-call numbers (``counts = t.tolist()`` then ``x.split(counts)``: the
    recording holds the list among the op's arguments), which no list in state holds."""
    if isinstance(o, tuple):
        return any(isinstance(c, (TensorProxy, SymInt, SymFloat)) for c in o)
    return type(o) is list and any(type(c) in (SymInt, SymFloat) for c in o)
