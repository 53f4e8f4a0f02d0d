"""The tensors a jitted module's parameter and buffer slots hold, read on every call.

A module of 100 parameters is read in ~1.7 us (``list(starmap(getitem, unique))``) and its
tensors compared by identity with the last call's in another ~1.1 us (``MetadataCheck``). Once
two calls in a row found the same tensors, a function generated for them checks each slot by
identity (one C call, ``_core.SlotIdentity``, the slots tied to another included) and the call
reuses the last call's list: ~6 ns a slot, no list built. Any slot holding another tensor (or none)
takes the read, as slots given new tensors on every call (``functional_call``) always do; a
binding generates at most ``MAX_CHECKS`` of them.

The tensors' metadata is not checked here: ``p.data = t``, ``requires_grad_`` or ``resize_``
keep the tensor in its slot (``param_metadata.MetadataCheck`` checks them on every call).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import starmap
from operator import getitem, is_

from thunder_rs._core import SlotIdentity


#: How many identity checks one binding generates at most (~1 ms each at 100 slots, once calls
#: repeat): slots whose tensors keep changing (``functional_call`` between plain calls) then
#: always take the read.
MAX_CHECKS = 8


class SlotReads:
    """The tensors of ``unique`` (``(store, name)`` per distinct tensor) and of the ``tied`` slots
    (``(store, name, index)``: the slot holds ``unique[index]``'s tensor) as the last call read
    them, with the generated check that the slots still hold them (and the tensors it checks)."""

    __slots__ = ("_check", "_last", "_made", "tied", "unique")

    def __init__(self, unique: tuple, tied: tuple):
        self.unique, self.tied = unique, tied
        #: the tensors of the last read (None before it, or after a tied slot was untied)
        self._last: list | None = None
        #: (the generated identity check, the tensors it checks), None while there is none: dropped
        #: when it fails, so that it holds no tensor the slots no longer do
        self._check: tuple[Callable[[], bool], list] | None = None
        self._made = 0

    def read(self) -> list | None:
        """The unique slots' tensors (a list the caller must not change: the next call may return
        it again), or None where a tied slot holds another tensor than its unique one:
        ``functional_call(model, {"emb.weight": w}, tie_weights=False)`` puts ``w`` into one slot
        of a tied pair by writing its store, which moves no ``write_epoch``, and the trace, reading
        the tied tensor once, would run the other slot's layer on ``w`` too."""
        check = self._check
        if check is not None:
            try:
                if check[0]():
                    return check[1]
            except KeyError:  # (a slot emptied by writing its store: the read says so)
                pass
            self._check = None
        now = list(starmap(getitem, self.unique))
        if any(d.get(n) is not now[i] for d, n, i in self.tied):
            self._last = None
            return None
        last, self._last = self._last, now
        if last is not None and self._made < MAX_CHECKS and len(last) == len(now) and all(map(is_, now, last)):
            self._made += 1
            self._check = (_identity_check(self.unique, self.tied, now), now)
        return now


def _identity_check(unique: tuple, tied: tuple, tensors: list) -> Callable[[], bool]:
    """A function telling whether each slot of ``unique`` and ``tied`` holds its tensor of
    ``tensors``: one C call (``_core.SlotIdentity.holds``, ~6 ns a slot) where the stores are dicts and
    the names strings, else each one compared inline (the stores, names and tensors are its
    defaults)."""
    slots = [(d, n, i) for i, (d, n) in enumerate(unique)] + list(tied)
    if not slots:
        return lambda: True
    if all(type(d) is dict and type(n) is str for d, n, _ in slots):  # (no ``__getitem__`` of their own)
        return SlotIdentity([(d, n, tensors[i]) for d, n, i in slots]).holds
    defaults = {}
    terms = []
    for j, (d, n, i) in enumerate(slots):
        defaults[f"d{j}"], defaults[f"n{j}"], defaults[f"t{j}"] = d, n, tensors[i]
        terms.append(f"d{j}[n{j}] is t{j}")
    parameters = ", ".join(f"{name}={name}" for name in defaults)
    namespace = dict(defaults)
    exec(f"def same({parameters}):\n    return {' and '.join(terms)}\n", namespace)  # noqa: S102
    return namespace["same"]
