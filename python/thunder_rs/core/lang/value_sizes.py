"""Sizes computed from values as symbolic sizes of the trace.

A call whose output sizes its data tell (``nonzero``, a boolean mask's indices, ``unique``) is
answered by running it (``core.lang.values``), and the trace is specialised on those sizes, with
a check. When a later call reads other sizes there, the variant compiled for it has them symbolic
(``widened``): the call defines them as sizes of the trace (``Recorder.unbacked_size``,
``call_sized``), its outputs' shapes are made of them, and the check right after it
(``check_sizes``) tests that a call's sizes fit the pattern (constant sizes equal, each symbolic
one at least 2, as input sizes are) and hold what the trace relied on them (``place_guards``:
the trace's guards that read them go there, since they are made only there). Every count of at
least 2 then runs the one variant; a count that fails the check takes, or compiles, another.
"""

import dataclasses
import re
from typing import Any

from torch.utils._pytree import tree_flatten

from thunder_rs import _core
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang import fallback
from thunder_rs.core.lang.reads import Diverged, Read, _shapes
from thunder_rs.core.lang.recorder import current
from thunder_rs.errors import ThunderNotImplementedError


def check_sizes(read: Read, tensors: tuple, sizes: tuple) -> None:
    """The check a trace records where it read symbolic sizes from a call's outputs (``widened``):
    raises ``Diverged`` when the outputs' sizes do not fit the pattern, or fail a guard the trace
    relied on (``sizes``: the trace's size inputs, which guards may compare with)."""
    shapes = _shapes(*tensors)
    if _fits(read.pattern(), shapes) and all(guard(shapes, sizes) for guard in read.guards):
        return
    raise Diverged(read, shapes)


def _fits(pattern: tuple, shapes: tuple) -> bool:
    """Whether ``shapes`` fit ``pattern``: its constant sizes, and at each group's places one size
    of at least 2 (0 and 1 stay constant, as input sizes do)."""
    if len(pattern) != len(shapes):
        return False
    seen: dict = {}
    for want, shape in zip(pattern, shapes):
        if len(want) != len(shape):
            return False
        for w, n in zip(want, shape):
            if type(w) is tuple:
                if n < 2 or seen.setdefault(w, n) != n:
                    return False
            elif w != n:
                return False
    return True


def _applies(groups: tuple, shapes: tuple) -> bool:
    """Whether ``shapes`` have every place of ``groups``, with one size of at least 2 per group."""
    for group in groups:
        sizes = {shapes[i][d] if i < len(shapes) and d < len(shapes[i]) else -1 for i, d in group}
        if len(sizes) != 1 or min(sizes) < 2:
            return False
    return True


CHECK_SIZES = _core.register_symbol("thunder_rs.check_sizes", fallback=True, effect=True)
fallback.FALLBACK_IMPLS[CHECK_SIZES] = check_sizes


def widened(read: Read, value) -> Read | None:
    """``read``, of a call's output sizes, with the sizes that differ in ``value`` (a call's
    shapes) symbolic, each computed by the call (the count of ``nonzero``'s indices): a variant
    that serves every count (of at least 2). Sizes equal in both share a symbol. None where the
    read is of something else, or already symbolic, or a changed size is 0 or 1 now."""
    old: Any = read.value
    if read.reader is not _shapes or read.sizes or type(value) is not tuple or len(old) != len(value):
        return None
    if any(len(a) != len(b) for a, b in zip(old, value)):
        return None
    groups: dict = {}
    for i, (a, b) in enumerate(zip(old, value)):
        for d, (x, y) in enumerate(zip(a, b)):
            if x != y:
                groups.setdefault((x, y), []).append((i, d))
    if not groups or any(new < 2 for _, new in groups):
        return None
    return dataclasses.replace(read, value=value, sizes=tuple(map(tuple, groups.values())), guards=[])


def place_guards(reads, guards) -> list:
    """The guards of ``guards`` (the trace's, as text) an entry checks on its inputs' sizes: the
    others read sizes computed by calls (``widened``), and go to the check of the read that made
    them, and go to the check of the last read that made one, which runs right after it
    (``check_sizes``) and has the sizes made before it. Raises where a guard reads a size input
    made after that read."""
    made = {name: read for read in reads for name in read.names}
    kept = []
    by_read: dict = {}
    for guard in guards:
        names = set(_NAME.findall(guard))
        owners = [made[n] for n in names if n in made]
        if not owners:
            kept.append(guard)
            continue
        read = max(owners, key=lambda r: r.index)
        if not names <= {*read.names, *read.inputs}:
            raise ThunderNotImplementedError(
                f"the sizes {', '.join(sorted(names))} computed at {read.where} and later are compared by `{guard}`, "
                "which no check can test where the sizes are made"
            )
        by_read.setdefault(id(read), (read, []))[1].append(guard)
    for read, texts in by_read.values():
        read.guards.append(_guard_function(read, texts))
    return kept


_NAME = re.compile(r"\bt\d+\b")


def _guard_function(read: Read, texts: list):
    """``guard(shapes, sizes)``: whether ``texts`` hold for a call's output ``shapes`` at ``read``
    and the trace's size inputs ``sizes``."""
    binds = "".join(f"    {n} = shapes[{g[0][0]}][{g[0][1]}]\n" for n, g in zip(read.names, read.sizes))
    binds += "".join(f"    {n} = sizes[{k}]\n" for k, n in enumerate(read.inputs))
    source = f"def guard(shapes, sizes):\n{binds}    return {' and '.join(f'({t})' for t in texts)}\n"
    scope: dict = {}
    exec(compile(source, "<thunder_rs size guards>", "exec"), scope)
    return scope["guard"]


class SymbolicSizes:
    """For a call sized by values whose read is symbolic (``widened``): the sizes it computes,
    made as sizes of the trace that it defines (``sizes``, one per group of ``dims``), its
    outputs' shapes with them (``shape(t)``), and, called with its traced outputs, the record of
    their check (``check_sizes``)."""

    def __init__(self, reads, func, groups: tuple, leaves: list):
        rec = current()
        self.dims = groups
        self.sizes = [rec.unbacked_size(leaves[g[0][0]].shape[g[0][1]]) for g in self.dims]
        at = {place: size for size, group in zip(self.sizes, self.dims) for place in group}
        self._shapes = {id(t): tuple(at.get((i, d), n) for d, n in enumerate(t.shape)) for i, t in enumerate(leaves)}
        self._reads, self._func, self._value = reads, func, _shapes(*leaves)

    @property
    def ids(self) -> list:
        return [s.values()[0] for s in self.sizes]

    def shape(self, t) -> tuple:
        return self._shapes[id(t)]

    def __call__(self, outs) -> None:
        tensors = [x for x in tree_flatten(outs)[0] if isinstance(x, TensorProxy)]
        self._reads._record(_shapes, self._func, self._value, tensors, self)
