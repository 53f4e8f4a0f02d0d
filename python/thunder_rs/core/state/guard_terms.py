"""The per-call check of an entry's guards, compiled into one function (``compile_check``).

Each guard gives its own term (``Guard.term`` and the like); the check compiled here computes the
same conjunction more cheaply where it can:

- an argument object's path (``flat[2].__dict__['layers'][0].__dict__``) is read once, at the top
  of the check, and its mapping bound to a local, rather than once per guard reading through it;
- identity guards on one fixed dict (a module's globals) are checked in one pass: an
  ``itemgetter`` of their names, compared item by item with ``operator.is_``;
- an attribute's absence is not checked where the object's attribute names are (``unimplied``);
- the attributes of one class (``ClassSource``) are read with one read of its MRO: from the
  class that held each when the check was compiled while the MRO is the same tuple and no class
  before that one has the name (else through the MRO as ``_ClassView`` reads it);
- closure cells' values are compared in one pass (``same_cells``, ``equal_cells``), and so are
  the methods of classes (``MethodGuard``) and the functions' defaults (``DefaultsGuard``);
- a list, set or dict compared by identity (``same_items``) is compared inline;
- which places of the arguments hold one object (``aliases.SameGuard``, ``aliases.DistinctGuard``,
  ``aliases.FixedGuard``) is compared on the objects the paths already bound;
- a contiguous tensor's metadata (``TensorGuard``) is compared field by field rather than built
  into a tuple (``tensor_meta``, ``masked_meta``) and compared whole.

A read that raises (an attribute an argument object no longer has) makes the check False, as in
each guard's own term: every guard is a conjunct, so reading a path before the guards that use it
changes only which read fails first, never the result.
"""

import operator
from _thread import _local as _thread_local
from itertools import chain, repeat

import torch

from thunder_rs.core.state.aliases import DistinctGuard, FixedGuard, SameGuard
from thunder_rs.core.state.guards import (
    MISSING,
    CellSource,
    ClassSource,
    DefaultsGuard,
    FixedSource,
    Guard,
    InputItemsSource,
    InputSource,
    Item,
    NamesGuard,
    attributes_of,
    freeze,
    is_simple,
    items_of,
    module_structure,
)
from thunder_rs.core.state.tensor_guards import NOT_A_LEAF, TensorGuard, _read_masked, _read_meta
from thunder_rs.core.state.items import same_attributes, same_items
from thunder_rs.core.state.state import MethodGuard

#: The least number of identity guards on one fixed dict that are checked in one pass.
GROUPED = 3
#: The most methods or functions' defaults checked as one inline term each rather than in one
#: pass (``all(map(...))`` costs ~0.15 us for one, a term ~0.05).
INLINED = 2


class _Bound:
    """A source whose mapping the check has bound to a local (or reads by ``expr``)."""

    def __init__(self, expr: str):
        self.expr = expr

    def code(self, var, scope) -> str:
        return self.expr


def _with_source(guard, expr: str):
    """``guard`` reading its mapping from ``expr``."""
    copy = object.__new__(type(guard))
    copy.__dict__.update(guard.__dict__)
    copy.source = _Bound(expr)
    return copy


class _Reads:
    """The paths into the call's arguments that the check reads, each bound once to a local."""

    def __init__(self, scope: dict):
        self.scope = scope
        self.lines: list[str] = []
        self.names: dict = {}

    def _bind(self, key, expr: str) -> str:
        name = self.names.get(key)
        if name is None:
            name = self.names[key] = f"_o{len(self.names)}"
            self.lines.append(f"{name} = {expr}")
        return name

    def _key_code(self, key) -> str:
        if type(key) in (str, int):
            return repr(key)
        name = f"_k{len(self.scope)}"
        self.scope[name] = key
        return name

    def object(self, source: InputSource, depth: int) -> str:
        """The local holding the object ``depth`` steps along ``source``'s path."""
        if depth == 0:
            return self._bind((source.position, (), source.slotted), f"flat[{source.position}]")
        step = source.path[depth - 1]
        parent = self.object(source, depth - 1)
        if type(step) is Item:
            expr = f"{parent}[{self._key_code(step.key)}]"
        else:
            expr = f"{self.attributes(source, depth - 1)}[{str(step)!r}]"
        return self._bind((source.position, source.path[:depth], source.slotted), expr)

    def attributes(self, source: InputSource, depth: int) -> str:
        """The local holding the attributes of the object ``depth`` steps along the path."""
        obj = self.object(source, depth)
        expr = f"_attributes({obj})" if source.slotted else f"{obj}.__dict__"
        return self._bind(("attributes", source.position, source.path[:depth], source.slotted), expr)

    def mapping(self, source: InputSource) -> str:
        if type(source) is InputItemsSource:
            obj = self.object(source, len(source.path))
            return self._bind(("items", source.position, source.path), f"_items_of({obj})")
        return self.attributes(source, len(source.path))


def _class_terms(guards: list, indices: list, scope: dict) -> str:
    """The terms of ``guards`` at ``indices``, all of one class's attributes (``ClassSource``), with
    one read of the class's MRO: while it is the tuple it was, each name is read from the live
    ``__dict__`` of the class that held it when the check was compiled, unless a class before that
    one now has the name; otherwise, through the MRO as ``_ClassView`` reads it."""
    first = indices[0]
    source = guards[first].source
    mro = source.cls.__mro__
    scope[f"c{first}"], scope[f"r{first}"], scope[f"v{first}"] = source.cls, mro, source.fixed()
    for k, klass in enumerate(mro):
        scope[f"p{first}_{k}"] = vars(klass)
    fast, slow = [], []
    for i in indices:
        name = guards[i].name
        found = next((k for k, klass in enumerate(mro) if name in vars(klass)), None)
        if found is None:
            expr = f"v{first}"
        elif found == 0:
            expr = f"p{first}_0"
        else:
            before = " and ".join(f"{name!r} not in p{first}_{k}" for k in range(found))
            expr = f"(p{first}_{found} if {before} else v{first})"
        fast.append(_guard_term(_with_source(guards[i], expr), i, scope))
        slow.append(_guard_term(_with_source(guards[i], f"v{first}"), i, scope))
    return f"(({' and '.join(fast)}) if c{first}.__mro__ is r{first} else ({' and '.join(slow)}))"


def _tensor_term(guard: TensorGuard, read: str, index: int, scope: dict) -> str | None:
    """``guard``'s term for a contiguous tensor, field by field; None for others."""
    expected = guard.expected
    if expected is MISSING or expected[4] is not True:
        return None
    dtype, device, shape, requires_grad, _, inference, kind = expected
    scope[f"t{index}"], scope[f"e{index}"], scope[f"k{index}"] = dtype, device, kind
    sizes = "".join(f" and s[{d}] == {n!r}" for d, n in enumerate(shape) if n is not None)
    leaf = "not v.is_leaf" if requires_grad == NOT_A_LEAF else "v.is_leaf"
    grad = f"v.requires_grad and {leaf}" if requires_grad else "not v.requires_grad"
    return (
        f"(type(v := {read}) is k{index} and v.dtype == t{index} and v.device == e{index}"
        f" and ({grad}) and len(s := v.shape) == {len(shape)}{sizes}"
        f" and v.is_contiguous() and v.is_inference() is {inference!r})"
    )


def _container_term(guard: Guard, index: int, scope: dict) -> str | None:
    """The term of an identity guard of a list, set or dict (``same_items``) inline; None for others."""
    t = type(guard.expected)
    if guard.fresh or guard.items is None or t not in (list, set, dict) or type(guard.name) is not str:
        return None
    scope[f"e{index}"], scope[f"i{index}"] = t, guard.items
    read = f"{guard.source.code(f'm{index}', scope)}.get({guard.name!r}, MISSING)"
    members = "_chain(v.items())" if t is dict else "v"
    return (
        f"(type(v := {read}) is e{index} and {len(guard.items)} == len(v) * {2 if t is dict else 1}"
        f" and all(map(_is, {members}, i{index})))"
    )


def _guard_term(guard, index: int, scope: dict) -> str:
    """``guard``'s term, inline for a contiguous held tensor and a container compared by identity."""
    term = None
    if type(guard) is TensorGuard and type(guard.name) is str:
        read = f"{guard.source.code(f'm{index}', scope)}.get({guard.name!r}, MISSING)"
        term = _tensor_term(guard, read, index, scope)
    elif type(guard) is Guard:
        term = _container_term(guard, index, scope)
    return guard.term(index, scope) if term is None else term


def _defaults_term(guard: DefaultsGuard, index: int, scope: dict) -> str:
    """The functions' ``__defaults__`` compared in one pass where none has keyword-only defaults."""
    if any(kwdefaults for _, _, kwdefaults, _ in guard.entries):
        return guard.term(index, scope)
    functions = tuple(fn for fn, *_ in guard.entries)
    expected = tuple(defaults for _, defaults, *_ in guard.entries)
    if len(functions) <= INLINED:
        scope.update({f"f{index}_{k}": fn for k, fn in enumerate(functions)})
        scope.update({f"e{index}_{k}": e for k, e in enumerate(expected)})
        return " and ".join(f"f{index}_{k}.__defaults__ is e{index}_{k}" for k in range(len(functions)))
    scope[f"f{index}"], scope[f"e{index}"] = functions, expected
    return f"all(map(_is, map(_defaults, f{index}), e{index}))"


def _method_terms(guards: list, indices: list, scope: dict) -> str:
    """Methods of classes (``MethodGuard``, not classmethods) looked up in one pass."""
    first = indices[0]
    if len(indices) <= INLINED:
        terms = []
        for k, i in enumerate(indices):
            scope[f"c{first}_{k}"], scope[f"n{first}_{k}"] = guards[i].cls, guards[i].name
            scope[f"e{first}_{k}"] = guards[i].expected
            terms.append(f"getattr(c{first}_{k}, n{first}_{k}, MISSING) is e{first}_{k}")
        return " and ".join(terms)
    scope[f"c{first}"] = tuple(guards[i].cls for i in indices)
    scope[f"n{first}"] = tuple(guards[i].name for i in indices)
    scope[f"e{first}"] = tuple(guards[i].expected for i in indices)
    return f"all(map(_is, map(getattr, c{first}, n{first}, _missing), e{first}))"


def _groupable(guard) -> bool:
    """An identity guard of a fixed dict's value (not its absence)."""
    return (
        type(guard) is Guard
        and isinstance(guard.source, FixedSource)
        and not isinstance(getattr(guard.source, "obj", None), _thread_local)
        and guard.by_identity
        and guard.items is None
        and guard.expected is not MISSING
        and type(guard.source.fixed()) is dict
    )


def _class_attribute(guard) -> bool:
    return type(guard) is Guard and type(guard.source) is ClassSource and type(guard.name) is str


def _cell(guard) -> bool:
    """A guard of a closure cell's value (not its absence) by identity, or by type and equality."""
    return (
        type(guard) is Guard
        and type(guard.source) is CellSource
        and guard.expected is not MISSING
        and ((guard.by_identity and guard.items is None) or type(guard.expected) in (str, int, bytes))
    )


_contents = operator.attrgetter("cell_contents")


def same_cells(cells: tuple, expected: tuple) -> bool:
    """Whether ``cells`` hold the very objects ``expected``."""
    try:
        return all(map(operator.is_, map(_contents, cells), expected))
    except ValueError:  # an empty cell
        return False


def equal_cells(cells: tuple, types: tuple, expected: tuple) -> bool:
    """Whether ``cells`` hold values of exactly ``types`` (str, int, bytes) equal to ``expected``."""
    try:
        now = tuple(map(_contents, cells))
    except ValueError:  # an empty cell
        return False
    return tuple(map(type, now)) == types and now == expected


def _cell_terms(guards: list, indices: list, scope: dict) -> str:
    first = indices[0]
    same = [i for i in indices if guards[i].by_identity]
    equal = [i for i in indices if not guards[i].by_identity]
    terms = []
    if same:
        scope[f"q{first}"] = tuple(guards[i].source.cell for i in same)
        scope[f"x{first}"] = tuple(guards[i].expected for i in same)
        terms.append(f"_same_cells(q{first}, x{first})")
    if equal:
        scope[f"w{first}"] = tuple(guards[i].source.cell for i in equal)
        scope[f"y{first}"] = tuple(type(guards[i].expected) for i in equal)
        scope[f"z{first}"] = tuple(guards[i].expected for i in equal)
        terms.append(f"_equal_cells(w{first}, y{first}, z{first})")
    return " and ".join(terms)


def _dict_terms(guards: list, indices: list, scope: dict) -> str:
    first = indices[0]
    scope[f"g{first}"] = guards[first].source.fixed()
    scope[f"n{first}"] = operator.itemgetter(*(guards[i].name for i in indices))
    scope[f"x{first}"] = tuple(guards[i].expected for i in indices)
    return f"all(map(_is, n{first}(g{first}), x{first}))"


def _grouped(guards: list, scope: dict) -> tuple[dict, set]:
    """Terms checking several guards together (see the module doc), at the first one's index; the
    indices they cover."""
    groups: dict = {}
    for i, g in enumerate(guards):
        if _groupable(g):
            groups.setdefault(("dict", g.source.key), []).append(i)
        elif _class_attribute(g):
            groups.setdefault(("class", id(g.source.cls)), []).append(i)
        elif _cell(g):
            groups.setdefault(("cells",), []).append(i)
        elif type(g) is MethodGuard and not g.bound:
            groups.setdefault(("methods",), []).append(i)
    terms, covered = {}, set()
    for (kind, *_), indices in groups.items():
        if kind == "dict" and len(indices) < GROUPED:
            continue
        make = {"dict": _dict_terms, "class": _class_terms, "cells": _cell_terms, "methods": _method_terms}[kind]
        terms[indices[0]] = make(guards, indices, scope)
        covered.update(indices)
    return terms, covered


def _term(guard, index: int, scope: dict, reads: _Reads) -> str:
    if type(guard) in (DistinctGuard, SameGuard):  # (objects at paths, read once with the others)
        return guard.objects_term([reads.object(s, len(s.path)) for s in guard.sources])
    if type(guard) is FixedGuard:
        return guard.objects_term([reads.object(s, len(s.path)) for s in guard.sources], index, scope)
    source = getattr(guard, "source", None)
    if isinstance(source, InputSource):
        guard = _with_source(guard, reads.mapping(source))
    if type(guard) is DefaultsGuard:
        return _defaults_term(guard, index, scope)
    return _guard_term(guard, index, scope)


def unimplied(guards: list) -> list:
    """``guards`` without those others imply: an attribute's absence from an object whose attribute
    names a ``NamesGuard`` checks whole, without that name (``cache.__dict__.keys() == names``
    holds only where ``cache.__dict__.get('offload', MISSING) is MISSING`` does)."""
    names = {(type(g.source), g.source.key): g.names for g in guards if type(g) is NamesGuard}
    if not names:
        return guards
    return [
        g
        for g in guards
        if not (
            type(g) is Guard
            and g.expected is MISSING
            and g.name not in names.get((type(g.source), g.source.key), (g.name,))
        )
    ]


def compile_check(guards: list):
    """One function ``check(flat) -> bool`` over ``guards``, or None when there are none."""
    guards = unimplied(guards)
    if not guards:
        return None
    scope = {
        "MISSING": MISSING,
        "_freeze": freeze,
        "_simple": is_simple,
        "_structure": module_structure,
        "_same_attributes": same_attributes,
        "_same_items": same_items,
        "_attributes": attributes_of,
        "_items_of": items_of,
        "_read_meta": _read_meta,
        "_read_masked": _read_masked,
        "_Tensor": torch.Tensor,
        "_is": operator.is_,
        "_same_cells": same_cells,
        "_equal_cells": equal_cells,
        "_chain": chain.from_iterable,
        "_defaults": operator.attrgetter("__defaults__"),
        "_missing": repeat(MISSING),
    }
    reads = _Reads(scope)
    grouped, covered = _grouped(guards, scope)
    terms = [
        grouped[i] if i in grouped else _term(g, i, scope, reads)
        for i, g in enumerate(guards)
        if i in grouped or i not in covered
    ]
    body = "\n        and ".join(terms)
    hoisted = "".join(f"    {line}\n" for line in reads.lines)
    source = (
        f"def check(flat):\n  try:\n{hoisted}    return ({body})\n"
        "  except (KeyError, AttributeError, IndexError, TypeError):\n    return False\n"
    )
    exec(compile(source, "<thunder_rs guards>", "exec"), scope)
    return scope["check"]
