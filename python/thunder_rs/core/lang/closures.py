"""Traced values a Python function holds in its closure, and the function rebuilt over each call's.

An eager call recorded in the trace (``functorch_calls``: ``torch.func.jacrev(lambda x: f(x, w))``
with ``w`` an argument of the jitted program) runs the user's function on every call; its closure
holds the proxies tracing gave it, and the sizes and float arguments the trace takes as inputs
(``SymInt``, ``SymFloat``), alone or in containers. The trace takes them as inputs of the call, and each call runs a
copy of the function whose cells hold that call's tensors in their place (a new function object
per call: the traced one is never written, so calls on several threads do not meet). Functions in
the closure (a helper the lambda calls) are searched and rebuilt the same way.
"""

import types

from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from thunder_rs.core.base.proxies import SymbolicSize, TensorProxy
from thunder_rs.core.lang.symfloat import SymFloat
from thunder_rs.core.lang.symint import SymInt


def is_traced(x) -> bool:
    """A value that stands for each call's own: a proxy, a symbolic size or float (a float
    argument the trace takes as an input)."""
    return isinstance(x, (TensorProxy, SymInt, SymFloat))


def plain(tree):
    """``tree`` with its symbolic shapes as tuples, so that their sizes are leaves."""
    return tree_map(lambda x: tuple(x) if type(x) is SymbolicSize else x, tree)


def _cells(fn):
    """``(cell, value)`` of ``fn``'s filled closure cells."""
    for cell in fn.__closure__ or ():
        try:
            yield cell, cell.cell_contents
        except ValueError:  # (a cell not filled yet)
            continue


def traced_values(fn) -> list:
    """The proxies in ``fn``'s closure and in those of the functions it holds, each once."""
    found: dict = {}
    pending, seen = [fn], set()
    while pending:
        f = pending.pop()
        if not isinstance(f, types.FunctionType) or id(f) in seen:
            continue
        seen.add(id(f))
        for _, value in _cells(f):
            if isinstance(value, types.FunctionType):
                pending.append(value)
                continue
            for leaf in tree_flatten(plain(value))[0]:
                if is_traced(leaf):
                    found.setdefault(id(leaf), leaf)
    return list(found.values())


class Slot:
    """Where a traced value was in a closure: the ``index``-th of the call's captured tensors."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def with_slots(fn, traced: list):
    """``fn`` rebuilt with a ``Slot`` where each of ``traced`` (``traced_values(fn)``) was: what the
    trace keeps, holding no proxy after tracing."""
    slots = {id(p): Slot(i) for i, p in enumerate(traced)}
    return _rebound(fn, lambda v: _replaced(v, lambda x: slots[id(x)] if is_traced(x) else x), {})


def filled(fn, values: tuple):
    """``fn`` (``with_slots``) rebuilt with the call's ``values`` in its slots."""
    return _rebound(fn, lambda v: _replaced(v, lambda x: values[x.index] if isinstance(x, Slot) else x), {})


def _replaced(value, leaf):
    """``value`` with ``leaf(x)`` for each leaf ``x`` of it (a container rebuilt where one changes)."""
    leaves, spec = tree_flatten(plain(value))
    new = [leaf(x) for x in leaves]
    if all(a is b for a, b in zip(new, leaves)):
        return value
    return tree_unflatten(new, spec)


def _rebound(fn, replace, memo: dict):
    """``fn`` with each value ``v`` of its closure (and its functions') that is not a function
    replaced by ``replace(v)``; ``fn`` itself where nothing changes."""
    if not isinstance(fn, types.FunctionType) or not fn.__closure__:
        return fn
    if id(fn) in memo:
        return memo[id(fn)]
    memo[id(fn)] = fn  # (a function that refers to itself keeps the original reference)
    cells, changed = [], False
    for cell in fn.__closure__:
        try:
            value = cell.cell_contents
        except ValueError:
            cells.append(cell)
            continue
        new = _rebound(value, replace, memo) if isinstance(value, types.FunctionType) else replace(value)
        changed |= new is not value
        cells.append(cell if new is value else types.CellType(new))
    if changed:
        copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, tuple(cells))
        copy.__kwdefaults__, copy.__qualname__ = fn.__kwdefaults__, fn.__qualname__
        copy.__dict__.update(fn.__dict__)
        memo[id(fn)] = copy
    return memo[id(fn)]
