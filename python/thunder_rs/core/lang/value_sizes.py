"""Sizes computed from values as symbolic sizes of the trace.

A call whose output sizes its data tell (``nonzero``, a boolean mask's indices, ``unique``) is
answered by running it (``core.lang.values``), and the trace is specialised on those sizes, with
a check. When a later call reads other sizes there, the variant compiled for it has them symbolic
(``widened``): the call defines them as sizes of the trace (``Recorder.unbacked_size``,
``call_sized``), its outputs' shapes are made of them, and the check right after it
(``check_sizes``) tests that a call's sizes fit the pattern (constant sizes equal, each symbolic
one at least 0) and hold what the trace relied on them (``place_guards``: the trace's guards
that read them go there, since they are made only there). Such sizes are *counts* in the trace
(``Recorder.unbacked_size``, Rust's ``Facts::count``): where sizes of inputs are at least 2, so
that ``T != 1`` needs no guard, a count may be 0 or 1, and every decision about it that those
values would change is a guard. A variant is traced at counts of at least 2, and every count
its guards hold for runs it: an expert that two tokens chose and one that one token chose run
one variant, unless the trace broadcast over the count. A count that is 0 or 1 in the call
that compiles is traced at 2 (``SymbolicSizes``), size-obliviously, as torch.compile's unbacked
sizes: the decisions a count of 0 or 1 would take otherwise without changing what the program
computes (broadcasting, strides of a tensor with no elements) are taken as for 2, and those it
would change are guards, which the compile checks at the call's own counts (``above_values``;
the snapshots answering its reads run with them). A decode loop, each expert's count 0 or 1 at
every step, compiles once for every routing. A count that fails the check takes, or compiles,
another: of constant sizes for a count of 0 or 1, else with the sizes symbolic again, traced at
that count, so on the other side of the guard that failed (``other_side``; ``Read.side`` tells
such variants apart in the value tree).
"""

import dataclasses
import re
from typing import Any

from torch.utils._pytree import tree_flatten, tree_unflatten

from thunder_rs import _core
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang import fallback
from thunder_rs.core.lang.reads import Diverged, Read, _shapes, int_leaves
from thunder_rs.core.lang.symint import wrap
from thunder_rs.core.lang.recorder import current
from thunder_rs.errors import ThunderNotImplementedError


def check_sizes(read: Read, tensors: tuple, sizes: tuple) -> None:
    """The check a trace records where it read symbolic sizes from a call's outputs (``widened``):
    raises ``Diverged`` when the outputs' sizes do not fit the pattern, or fail a guard the trace
    relied on (``sizes``: the trace's size inputs, which guards may compare with)."""
    shapes = _shapes(*tensors)
    if _fits(read.pattern, shapes) and all(guard(shapes, sizes) for guard in read.guards):
        return
    raise Diverged(read, shapes)


def _fits(pattern: tuple, shapes: tuple, least: int = 0) -> bool:
    """Whether ``shapes`` fit ``pattern``: its constant sizes, and at each group's places one size
    of at least ``least`` (a count: 0; one a variant may be traced at: 2)."""
    if len(pattern) != len(shapes) or any(len(want) != len(shape) for want, shape in zip(pattern, shapes)):
        return False
    return _fits_flat([w for want in pattern for w in want], [n for shape in shapes for n in shape], least)


def _fits_flat(pattern, values, least: int = 0) -> bool:
    seen: dict = {}
    for w, n in zip(pattern, values):
        if type(w) is tuple:
            if n < least or seen.setdefault(w, n) != n:
                return False
        elif w != n:
            return False
    return True


def _applies(groups: tuple, shapes: tuple) -> bool:
    """Whether ``shapes`` (or ints read, flat) have every place of ``groups`` (``(output, dim)``
    pairs; flat positions for ints), with one size per group, at least 0: a read at a site whose
    sizes are symbolic is a count there at 0 and 1 too (a slice's start: its decisions at 0 are
    guards that larger starts mostly keep). An output size (a count of ``nonzero``'s indices) at 0
    or 1 is traced at 2 (``SymbolicSizes``), where broadcasting the rows decides nothing on it: a
    variant traced at 1 served 1 alone (Faster R-CNN's sampler, one positive anchor; an expert one
    token chose at decode), and the calls of a decode loop, each expert's count 0 or 1, compiled
    one for each routing. An int read at 1 is traced symbolic: a bound or size that slicing and
    factories take as any other (Mask R-CNN pastes boxes 1 pixel wide, and crops them at 1 pixel
    from the border); taken constant there, each image whose boxes put a 1 at another read
    compiled a variant of its own."""
    ints = type(groups[0][0]) is int if groups else False
    for group in groups:
        if ints:
            sizes = {shapes[k] if k < len(shapes) else -1 for k in group}
        else:
            sizes = {shapes[i][d] if i < len(shapes) and d < len(shapes[i]) else -1 for i, d in group}
        if len(sizes) != 1 or min(sizes) < 0:
            return False
    return True


def check_ints(read: Read, tensors: tuple, sizes: tuple):
    """The check a trace records where it read ints that are symbolic sizes (``widened``): raises
    ``Diverged`` where the ints read now do not fit the pattern or fail a guard; else returns the
    sizes (one, or a tuple), which the trace defines here."""
    value = read.reader(*tensors)
    leaves = int_leaves(value)
    pattern = read.pattern
    if leaves is not None and len(leaves) == len(pattern) and _fits_flat(pattern, leaves):
        if all(guard(leaves, sizes) for guard in read.guards):
            made = [leaves[group[0]] for group in read.sizes]
            return made[0] if len(made) == 1 else tuple(made)
    raise Diverged(read, value)


CHECK_INTS = _core.register_symbol("thunder_rs.check_ints", fallback=True, effect=True)
fallback.FALLBACK_IMPLS[CHECK_INTS] = check_ints


CHECK_SIZES = _core.register_symbol("thunder_rs.check_sizes", fallback=True, effect=True)
fallback.FALLBACK_IMPLS[CHECK_SIZES] = check_sizes


def widened(read: Read, value, known: tuple = ()) -> Read | None:
    """``read``, of a call's output sizes, with the sizes that differ in ``value`` (a call's
    shapes) symbolic, each computed by the call (the count of ``nonzero``'s indices): a variant
    that serves every count its guards hold for. So are those at the places of ``known`` (the groups
    of the site's earlier widening). Sizes that took the same values share a symbol. None where
    the read is of something else, or already symbolic. A size that is 0 or 1 now is symbolic
    too, traced at 2 (``SymbolicSizes``)."""
    old: Any = read.value
    if read.sizes:
        return None
    if read.reader is not _shapes:
        return _widened_ints(read, value)
    if type(value) is not tuple or len(old) != len(value) or any(len(a) != len(b) for a, b in zip(old, value)):
        return None
    changes = [((i, d), x, y) for i, (a, b) in enumerate(zip(old, value)) for d, (x, y) in enumerate(zip(a, b))]
    return _with_groups(read, value, changes, known)


def _with_groups(read: Read, value, changes: list, known: tuple) -> Read | None:
    """``read`` answered with ``value``, symbolic at the places of ``changes`` (``(place, old,
    new)`` each) that changed, and at those of ``known`` (``_applies``)."""
    places = {place for group in known for place in group}
    groups: dict = {}
    for place, x, y in changes:
        if x != y or place in places:
            groups.setdefault((x, y), []).append(place)
    if not groups:
        return None
    return dataclasses.replace(read, value=value, sizes=tuple(map(tuple, groups.values())), guards=[])


def other_side(read: Read, value, side: int) -> Read | None:
    """``read``, of symbolic sizes, answered with ``value``, which fits its pattern but failed a
    guard the trace relied on (``x[m].shape[0] > 6``, ``min(count, 128)``): the same symbolic
    sizes, for a variant traced at ``value``, which takes the guard's other outcome, numbered
    ``side``. None where ``value`` does not fit the pattern with counts of at least 2 (a count of 0
    or 1 that failed a guard: constant)."""
    if not read.sizes:
        return None
    if read.reader is _shapes:
        fits = type(value) is tuple and _fits(read.pattern, value, 2)
    else:
        leaves = int_leaves(value)
        fits = leaves is not None and len(leaves) == len(read.pattern) and _fits_flat(read.pattern, leaves, 2)
    if not fits:
        return None
    return dataclasses.replace(read, value=value, names=(), inputs=(), guards=[], side=side)


#: The reads whose ints may be symbolic sizes.
_INT_READERS = frozenset({"torch.Tensor.item", "torch.Tensor.tolist"})


def _widened_ints(read: Read, value) -> Read | None:
    """``widened`` for ints read (``t.item()``, ``t.tolist()``), by their flat positions: all of
    them (the values of a tensor change together; a count that stayed the same from one call to
    the next is no more constant than the others), 0 and 1 included, as ``_applies`` takes them:
    an int at 0 is traced symbolic too, its decisions at 0 guards (JetMoe's per-expert counts
    split its tokens; each place of an expert no token chose, a constant 0, compiled a variant
    of its own)."""
    if read.what not in _INT_READERS:  # (``int(t)`` and ``operator.index`` must return ints)
        return None
    old, new = int_leaves(read.value), int_leaves(value)
    if old is None or new is None or tree_flatten(read.value)[1] != tree_flatten(value)[1]:
        return None
    changes = [(k, x, y) for k, (x, y) in enumerate(zip(old, new))]
    return _with_groups(read, value, changes, (tuple(range(len(new))),))


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


def above_values(reads, guards) -> None:
    """Raises where a guard of ``guards`` (the trace's, as text) fails at the values of the counts
    traced at 2 where they were 0 or 1 (``SymbolicSizes``): the variant does not serve the call it
    was compiled for, and the compile takes the reads constant instead (``jit._compile``). A guard
    that compares such a count with sizes of the inputs is taken to fail."""
    values: dict = {}
    for read in reads:
        if read.sizes and read.reader is _shapes:
            values.update((name, read.value[g[0][0]][g[0][1]]) for name, g in zip(read.names, read.sizes))
    above = {name for name, n in values.items() if n < 2}
    for guard in guards if above else ():
        names = set(_NAME.findall(guard))
        if names & above and not (names <= values.keys() and eval(guard, {}, {n: values[n] for n in names})):
            raise ThunderNotImplementedError(
                f"the counts {', '.join(sorted(names & above))} traced at 2 fail `{guard}` at their values"
            )


def _guard_function(read: Read, texts: list):
    """``guard(shapes, sizes)``: whether ``texts`` hold for a call's output ``shapes`` at ``read``
    and the trace's size inputs ``sizes``."""
    at = lambda place: f"[{place}]" if type(place) is int else f"[{place[0]}][{place[1]}]"  # noqa: E731
    binds = "".join(f"    {n} = shapes{at(g[0])}\n" for n, g in zip(read.names, read.sizes))
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
        # A count of 0 or 1 is traced at 2: decisions on it are taken as for the counts of 2 and
        # more, size-obliviously (torch.compile's ``guard_size_oblivious``), and those that would
        # differ at its value are guards, which the compile checks there (``above_values``).
        values = [leaves[g[0][0]].shape[g[0][1]] for g in self.dims]
        self.sizes = [rec.unbacked_size(max(n, 2)) for n in values]
        reads.snapshots.actual.update((s.values()[0], n) for s, n in zip(self.sizes, values) if n < 2)
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

    def record(self, read: Read, tensors: list, inputs: list) -> None:
        """Records the check of ``read`` (the sizes are the call's outputs)."""
        current().call(CHECK_SIZES, (read, tuple(tensors), tuple(inputs)), None, [])


class SymbolicInts:
    """For ints read whose read is symbolic (``widened``): the value the program gets, those
    ints made sizes of the trace (``sizes``, one per group of ``dims``), which the read's check
    defines (``record``, ``check_ints``)."""

    def __init__(self, groups: tuple, value):
        leaves, spec = tree_flatten(value)
        rec = current()
        self.dims = groups
        self.sizes = [rec.unbacked_size(leaves[group[0]]) for group in groups]
        at = {k: wrap(size) for size, group in zip(self.sizes, groups) for k in group}
        self.value = tree_unflatten([at.get(k, x) for k, x in enumerate(leaves)], spec)

    def record(self, read: Read, tensors: list, inputs: list) -> None:
        ids = [s.values()[0] for s in self.sizes]
        current().call_sized(CHECK_INTS, (read, tuple(tensors), tuple(inputs)), None, [], ids)
