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

A structure is kept only while every module it holds is still in the module's tree (with the
forward it had set on its instance, if any): binding a structure drops, with their entries, those
whose modules are not all in the new tree. So the structure a LoRA wrapper was put on is kept while
the wrapper is on (its modules are all in the tree still) and found when the wrapper is taken off,
but the wrapper's own structure is dropped when the wrapper is taken off, and compiles again if it
is put back. That is the price of freeing what eager frees: a module taken out of the tree (a
classifier head replaced, a LoRA wrapper dropped, a forward set on an instance and removed) is held
by no kept structure and no entry once the next call has bound the new structure, as before
structures were kept, where keeping the wrapper's entries would keep it alive with its parameters
(the entries hold their modules strongly: guards, hooked modules, closures of their checks). The
modules a kept structure holds are all in the tree, alive as in eager, so its ids are never another
object's; it holds no tensor (not its binding, whose last call's tensors would keep a deleted buffer
alive). At most ``STRUCTURES_KEPT`` are kept, the least recently bound one dropped with its
entries.
"""

from __future__ import annotations

import itertools

#: How many structures of one jitted module keep their entries.
STRUCTURES_KEPT = 4

#: Structure numbers, unique in the process (an interned ``ParameterMetadata`` is shared by keys
#: of every jitted module).
_numbers = itertools.count(1)


class KnownStructures:
    """A jitted module's structures, most recently bound last: ``{structure: (number, modules,
    forwards)}``; ``modules`` the structure's modules and ``forwards`` the forwards set on their
    instances, held so that their ids in the structure stay theirs (all of them are in the tree:
    ``number``)."""

    __slots__ = ("_known",)

    def __init__(self):
        self._known: dict = {}

    def number(self, binding) -> tuple[int, bool, list]:
        """``(number, seen, dropped)``: the number of ``binding``'s structure, whether it was bound
        before (its entries then serve again), and the numbers of the structures dropped (their
        entries are to be dropped): those with a module that is not in ``binding``'s tree, or whose
        forward set on an instance is no longer set, and the least recently bound past
        ``STRUCTURES_KEPT``."""
        modules = tuple(binding.modules)
        forwards = tuple(m.__dict__.get("forward") for m in modules)
        found = self._known.pop(binding.structure, None)
        seen = found is not None and all(map(_same, found[2], forwards))
        number = found[0] if seen else next(_numbers)
        present = {id(m): f for m, f in zip(modules, forwards)}
        dropped = [n for n, held, set_then in self._known.values() if not _in_tree(held, set_then, present)]
        self._known = {s: kept for s, kept in self._known.items() if kept[0] not in dropped}
        self._known[binding.structure] = (number, modules, forwards)
        while len(self._known) > STRUCTURES_KEPT:
            dropped.append(self._known.pop(next(iter(self._known)))[0])
        if found is not None and not seen:
            dropped.append(found[0])
        return number, seen, dropped

    def numbers(self) -> set:
        """The numbers of the structures kept."""
        return {number for number, _, _ in self._known.values()}


def _in_tree(modules: tuple, forwards: tuple, present: dict) -> bool:
    """Whether every one of ``modules`` is in the tree whose modules' forwards (by id) are
    ``present``, with the forward it had (``modules`` are held: an id in ``present`` is theirs)."""
    return all(id(m) in present and present[id(m)] is f for m, f in zip(modules, forwards))


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
