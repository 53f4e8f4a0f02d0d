"""The variants of an entry compiled for the values a program reads (``values.ValueTree``): which
may serve a call that diverged, and the reads a variant forces."""

from __future__ import annotations

from typing import TYPE_CHECKING

from thunder_rs.core.lang.reads import Diverged, Read
from thunder_rs.core.lang.value_sizes import widened

if TYPE_CHECKING:
    from thunder_rs.core.run.entry import Entry


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
