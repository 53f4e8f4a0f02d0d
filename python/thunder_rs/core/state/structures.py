"""The structures a jitted module has had, each with a number its cache keys hold, so that a
module changed back to a structure it had (a LoRA wrapper put on a layer and taken off, a
submodule swapped and swapped back) finds the entries compiled for it, as torch.compile keeps its
earlier entries, instead of compiling again.

A structure is ``ModuleBinding.structure``: the modules of the tree (by identity), the names in
their parameter and buffer stores, their submodules, a forward set on an instance, and which slots
share one tensor. Its number is in the interned ``ParameterMetadata`` of every key of a call made
with it (``MetadataCheck.structure``): two structures never share an entry, and the per-call key
costs nothing more. An entry's own guards (module attributes, hooks, values) decide as ever
whether it serves a call, so returning to a structure runs no entry whose guards fail.

The bindings of the structures kept hold their modules alive (the entries compiled for them hold
those modules already), so the ids a structure holds are never another object's; at most
``STRUCTURES_KEPT`` are kept, the least recently bound one dropped with its entries. That is the
cost: a module taken out of the tree for good (a classifier head replaced) stays alive, with its
parameters, until four other structures have been bound since it was left, where eager
frees it at once.
"""

from __future__ import annotations

import itertools

#: How many structures of one jitted module keep their entries.
STRUCTURES_KEPT = 4

#: Structure numbers, unique in the process (an interned ``ParameterMetadata`` is shared by keys
#: of every jitted module).
_numbers = itertools.count(1)


class KnownStructures:
    """A jitted module's structures, most recently bound last: ``{structure: (number, binding,
    forwards)}``; ``forwards`` the forwards set on its modules' instances, held so that their ids in
    the structure stay theirs."""

    __slots__ = ("_known",)

    def __init__(self):
        self._known: dict = {}

    def number(self, binding) -> tuple[int, bool, int | None]:
        """``(number, seen, dropped)``: the number of ``binding``'s structure, whether it was bound
        before (its entries then serve again), and the number of a structure dropped to make room
        (its entries are to be dropped), or None."""
        forwards = tuple(m.__dict__.get("forward") for m in binding.modules)
        found = self._known.pop(binding.structure, None)
        if found is not None and all(map(_same, found[2], forwards)):
            self._known[binding.structure] = (found[0], binding, forwards)
            return found[0], True, None
        number = next(_numbers)
        self._known[binding.structure] = (number, binding, forwards)
        dropped = None
        if len(self._known) > STRUCTURES_KEPT:
            oldest = next(iter(self._known))
            dropped = self._known.pop(oldest)[0]
        return number, False, dropped

    def numbers(self) -> set:
        """The numbers of the structures kept."""
        return {number for number, _, _ in self._known.values()}


def _same(a, b) -> bool:
    return a is b


def of_structure(key, number: int) -> bool:
    """Whether the cache key ``key`` (or a class key: ``dynamic.class_key``) is of a call made with
    the module structure ``number``: its global state's module state holds that structure's
    metadata (``cache.GLOBAL_STATE``: the module state is its fifth item)."""
    try:
        return key[0][4][1].structure == number
    except (TypeError, IndexError, AttributeError):
        return False
