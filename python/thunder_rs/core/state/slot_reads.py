"""The tensors a jitted module's parameter and buffer slots hold, read on every call.

A module of 100 parameters is read in ~1.7 us (``list(starmap(getitem, unique))``) and its
tensors compared by identity with the last call's in another ~1.1 us (``MetadataCheck``). Once
two calls in a row found the same tensors, a function generated for them checks each slot by
identity (``d0['weight'] is t0 and ...``, the slots tied to another included) and the call reuses
the last call's list: ~14 ns a slot, no list built. Any slot holding another tensor (or none)
takes the read, as slots given new tensors on every call (``functional_call``) always do.

The tensors' metadata is not checked here: ``p.data = t``, ``requires_grad_`` or ``resize_``
keep the tensor in its slot (``param_metadata.MetadataCheck`` checks them on every call).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import starmap
from operator import getitem, is_


class SlotReads:
    """The tensors of ``unique`` (``(store, name)`` per distinct tensor) and of the ``tied`` slots
    (``(store, name, index)``: the slot holds ``unique[index]``'s tensor), as the last call found
    them, with the function that tells whether the slots still hold them."""

    __slots__ = ("_last", "tied", "unique")

    def __init__(self, unique: tuple, tied: tuple):
        self.unique, self.tied = unique, tied
        #: (the last call's tensors, the generated identity check of them or None)
        self._last: tuple[list | None, Callable[[], bool] | None] = (None, None)

    def read(self) -> list | None:
        """The unique slots' tensors (a list the caller must not change: the next call may return
        it again), or None where a tied slot holds another tensor than its unique one:
        ``functional_call(model, {"emb.weight": w}, tie_weights=False)`` puts ``w`` into one slot
        of a tied pair by writing its store, which moves no ``write_epoch``, and the trace, reading
        the tied tensor once, would run the other slot's layer on ``w`` too."""
        tensors, same = self._last
        if same is not None:
            try:
                if same():
                    return tensors
            except KeyError:  # (a slot emptied by writing its store: the read says so)
                pass
        now = list(starmap(getitem, self.unique))
        if any(d.get(n) is not now[i] for d, n, i in self.tied):
            self._last = (None, None)
            return None
        if tensors is not None and len(tensors) == len(now) and all(map(is_, now, tensors)):
            self._last = (now, _identity_check(self.unique, self.tied, now))
        else:
            self._last = (now, None)
        return now


def _identity_check(unique: tuple, tied: tuple, tensors: list) -> Callable[[], bool]:
    """A function telling whether each slot of ``unique`` and ``tied`` holds its tensor of
    ``tensors``, each one compared inline (the stores, names and tensors are its defaults)."""
    slots = [(d, n, i) for i, (d, n) in enumerate(unique)] + list(tied)
    if not slots:
        return lambda: True
    defaults = {}
    terms = []
    for j, (d, n, i) in enumerate(slots):
        defaults[f"d{j}"], defaults[f"n{j}"], defaults[f"t{j}"] = d, n, tensors[i]
        terms.append(f"d{j}[n{j}] is t{j}")
    parameters = ", ".join(f"{name}={name}" for name in defaults)
    namespace = dict(defaults)
    exec(f"def same({parameters}):\n    return {' and '.join(terms)}\n", namespace)  # noqa: S102
    return namespace["same"]
