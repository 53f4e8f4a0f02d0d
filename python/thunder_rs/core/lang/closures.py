"""Traced values a Python function holds in its closure, and the function rebuilt over real ones.

An eager call recorded in the trace (``functorch_calls``: ``torch.func.jacrev(lambda x: f(x, w))``
with ``w`` an argument of the jitted program) runs the user's function on every call; its closure
holds the proxies tracing gave it. The trace takes them as inputs of the call, and each call runs a
copy of the function whose cells hold that call's tensors in their place (a new function object
per call: the traced one is never written, so calls on several threads do not meet). Functions in
the closure (a helper the lambda calls) are searched and rebuilt the same way.
"""

import types

from thunder_rs.core.base.proxies import TensorProxy


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
            if isinstance(value, TensorProxy):
                found.setdefault(id(value), value)
            elif isinstance(value, types.FunctionType):
                pending.append(value)
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
    return _rebound(fn, lambda v: slots.get(id(v), v) if isinstance(v, TensorProxy) else v, {})


def filled(fn, tensors: tuple):
    """``fn`` (``with_slots``) rebuilt with the call's ``tensors`` in its slots."""
    return _rebound(fn, lambda v: tensors[v.index] if isinstance(v, Slot) else v, {})


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
