"""The variants of an entry compiled for the values a program reads (``values.ValueTree``): which
may serve a call that diverged, the reads a variant forces, and the path a call that diverged
takes (``other_path``: a variant found or compiled, or, past the limit, eager)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from thunder_rs.core.base.userframe import callable_name, warn_at_user_frame
from thunder_rs.core.lang.reads import Diverged, Read, decision
from thunder_rs.core.lang.value_sizes import other_side, widened
from thunder_rs.core.lang.values import ValueTree
from thunder_rs.errors import ThunderRuntimeError, runtime_error, settings_made_again

if TYPE_CHECKING:
    from thunder_rs.core.run.entry import Entry

#: How many variants one call may hand over to after its values diverged (``other_path``).
MAX_DIVERGENCES = 16
#: How many variants one cache key compiles for the values its calls read; past it a call whose
#: values no variant has runs eagerly (torch.compile's recompile limit does the same): a value that
#: differs on every call (``x.max().item()`` used as a number) would otherwise compile every call.
VALUE_VARIANT_LIMIT = 16


def at_site(earlier: Read, read: Read, wide: Read) -> Read:
    """``earlier``, a read a variant forces, symbolic at the places of ``wide`` where it was made
    at the site of ``read`` (``widened``); else as it is."""
    if (earlier.what, earlier.where) != (read.what, read.where):
        return earlier
    return widened(earlier, earlier.value, wide.sizes) or earlier


def lookups(entry: Entry, steps: list, diverged: Diverged, tried: set):
    """The variants of ``entry``'s value tree that may serve a call that diverged from it: by the
    prefix of its reads and each of ``steps`` at the read that diverged, then any whose reads take
    what the call read (``ValueTree.agreeing``)."""
    tree, index = entry.tree, diverged.read.index
    if tree is None:
        return
    for step in steps:
        yield tree.get(entry.decisions[:index] + (step,))
    yield tree.agreeing(entry, index, diverged.value, tried)


def serves(entry, key, flat) -> bool:
    """Whether ``entry`` may run the call of ``key`` and ``flat``: its guards hold and, compiled with
    symbolic sizes, its sizes' guards."""
    symbolic = entry.symbolic
    return (entry.check is None or entry.check(flat)) and (symbolic is None or symbolic.serves(key, flat))


def other_path(jfn, diverged: Diverged, entry: Entry, key, flat, spec, run, eager):
    """After ``entry``'s call was abandoned at a check (a value it read differs from the one it
    was specialised on), runs the variant for the values read (``run(variant)``); returns the
    variant and its outputs, or None and ``eager()``'s outputs where the key has as many
    variants as it may compile. ``spec()`` is the call's spec, for a variant still to compile. A
    variant that diverges in its turn hands over likewise, a bounded number of times (the
    values are the call's own, so the second variant's checks hold unless its Python state
    changed or numerics differ between variants)."""
    tried = {id(entry)}
    for _ in range(MAX_DIVERGENCES):
        found = _variant_after(jfn, diverged, entry, key, flat, spec, tried)
        if found is None:
            return None, _run_eagerly(jfn, diverged, eager)
        entry = found
        tried.add(id(entry))
        if found.symbolic is not None:
            # (the calls of the key's class, found by it, try this variant first from now on, as
            # ``_found_or_compiled`` tries the entry served last first)
            with jfn._lock:
                jfn._int_classes.add(found.symbolic, key, jfn._stored, first=True)
        try:
            return entry, run(entry)
        except Diverged as again:
            diverged = again
        except Exception as e:
            raise runtime_error(e, entry.filename, entry.source) from e
    raise ThunderRuntimeError(
        f"thunder_rs.jit: {callable_name(jfn._fn)}: the values the program reads differ from one compiled variant to "
        f"the next within one call ({diverged}); the variants compute them differently"
    )


def _variant_after(jfn, diverged: Diverged, entry: Entry, key, flat, spec, tried: set) -> Entry | None:
    """The variant of ``key`` whose reads agree with ``entry``'s up to the one that diverged
    and read there what the call read: from the value tree, or compiled with those reads'
    values given (the program makes them again, on the same values); None where the tree
    holds ``VALUE_VARIANT_LIMIT`` variants already. ``tried``: the ids of the variants the
    call ran already, each of which diverged."""
    read = diverged.read
    prefix = entry.decisions[: read.index]
    with jfn._lock:
        wide, steps = None, [decision(diverged.value)]
        if jfn._dynamic_off is None and jfn._dynamic is not False:
            wide, sized = _symbolic_answer(jfn, read, diverged.value, entry.tree, prefix)
            steps.extend(sized)
        for found in lookups(entry, steps, diverged, tried):
            if found is not None and id(found) not in tried and serves(found, key, flat):
                found.last_used = jfn._stats.cache_hits = jfn._stats.cache_hits + 1
                if key in jfn._cache:
                    jfn._cache[key] = found
                return found
        if entry.tree is not None and len(entry.tree) >= VALUE_VARIANT_LIMIT:
            return None
        if wide is not None:  # (where it fails to compile, ``_compile`` compiles it for the values read)
            jfn._sized_sites[(read.what, read.where)] = wide.sizes
            # The site's earlier reads are symbolic too (the experts before the one whose count
            # changed): the next call whose count changes there is served.
            earlier = tuple(at_site(r, read, wide) for r in entry.reads[: read.index])
            return _variant_compile(jfn, entry, (*earlier, wide), key, flat, spec, diverged)
        forced = (*entry.reads[: read.index], read.answered(diverged.value))
        return _variant_compile(jfn, entry, forced, key, flat, spec, diverged)


def _symbolic_answer(jfn, read: Read, value, tree: ValueTree | None, prefix: tuple) -> tuple:
    """The read a variant for ``value`` at ``read`` makes with symbolic sizes, or None, and the
    value tree's keys of the variants that may serve it. ``read`` constant: its sizes that
    changed, symbolic (``widened``; a variant then serves every count). ``read`` symbolic, its
    value failed a guard the trace relied on there: each variant of its pattern on another side
    of its guards, and a new side (``other_side``), as torch.compile recompiles a graph whose
    guard on a symbolic size failed with the size still symbolic."""
    if not read.sizes:
        wide = widened(read, value, jfn._sized_sites.get((read.what, read.where), ()))
        return wide, [wide.key()] if wide is not None else []
    if read.constant_differs(value):
        # (a size the pattern has constant changed, a packed sequence's longest length with its
        # total: symbolic too, with the read's symbolic ones, as a constant read's sizes widen)
        known = (*read.sizes, *jfn._sized_sites.get((read.what, read.where), ()))
        wide = widened(read.answered(read.value), value, known)
        return wide, [wide.key()] if wide is not None else []
    keys = [read.side_key(side) for side in range(VALUE_VARIANT_LIMIT)]
    taken = [tree is not None and tree.get(prefix + (k,)) is not None for k in keys]
    free = taken.index(False) if False in taken else None
    wide = other_side(read, value, free) if free is not None else None
    return wide, [k for k, t in zip(keys, taken) if t] if wide is not None else []


def _variant_compile(jfn, entry: Entry, forced: tuple, key, flat, spec, diverged: Diverged) -> Entry:
    """Compiles the variant of ``entry`` for the reads ``forced`` (the call's)."""
    static = functools.partial(jfn._compile, flat, spec(), key, str(diverged), forced, entry)
    try:
        if entry.symbolic is not None and jfn._dynamic_off is None:
            # A variant of a symbolic entry is symbolic too: it serves the sizes the entry does.
            sizes, held = entry.symbolic_args
            return jfn._symbolic_first(static, sizes, held, entry.tree)
        return static()
    except BaseException as e:
        settings_made_again(e)  # (the program's own error: as ``JitFunction._miss``)
        raise


def _run_eagerly(jfn, diverged: Diverged, eager):
    """A call whose values no variant has, once its key has all the variants it may compile:
    the program runs as eager code (nothing of the abandoned call was visible). Warns once."""
    jfn._stats.eager_calls += 1
    if jfn._stats.eager_calls == 1:
        warn_at_user_frame(
            f"thunder_rs: {callable_name(jfn._fn)} compiled {VALUE_VARIANT_LIMIT} variants for the values it reads and "
            f"now runs calls with other values eagerly ({diverged}). A value that changes on every call is better "
            "kept as a tensor (x / x.max() rather than x / x.max().item())"
        )
    return eager()
