"""Guards on where a call's tensor starts in its storage (``Tensor.storage_offset()``).

The cache key holds a tensor's dtype, device, shape and layout, not its storage offset: a slice
of a buffer hits the entry traced for another slice of it. Where a trace took a decision that
depends on it (which attention kernel torch runs: the memory-efficient kernel refuses q, k and v
that start off a 16-byte boundary), the entry carries an ``OffsetGuard``: the input's tensor (or a
view of it) must start on such a boundary, or off it, as the traced one did. Only such entries
carry one.
"""

import torch

from thunder_rs.core.state.guards import read_at
from thunder_rs.core.state.hook import thread_state


def _reader(proxy):
    """How a call's tensor for the trace input ``proxy`` is found in its flat inputs: at its
    position, the tensor every call takes (a parameter, a captured tensor), or where an argument
    object holds it; None where there is no such place."""
    source, held = proxy._source, proxy._held
    if type(source) is int:
        return lambda flat: flat[source]
    if source is not None:
        return lambda flat: source()
    if held is not None:
        return lambda flat: read_at(held.source, held.name, flat)
    return None


def _label(proxy) -> str:
    source, held = proxy._source, proxy._held
    if type(source) is int:
        names = getattr(thread_state.observer, "input_names", None)
        return names[source] if names and source < len(names) else f"input {source}"
    if held is not None:
        return held.source.describe(held.name)
    return "a parameter or captured tensor"


class OffsetGuard:
    """Where a trace input's tensor starts in its storage, as a decision saw it: with ``shift`` (an
    int) whether ``offset + shift`` falls on a boundary of ``modulus`` elements (a view ``shift``
    elements into it started there or not), else ``offset`` modulo ``modulus`` (a view at a
    symbolic distance: the entry's size checks ask again at each distance). Holds while a call's
    tensor gives what the traced one gave. ``why``: the decision, for miss reasons."""

    per_call = True
    source = None

    def __init__(self, read, label: str, modulus: int, traced: int, why: str, shift: int | None = None):
        self.read, self.label, self.modulus, self.traced, self.why = read, label, modulus, traced, why
        self.shift = shift
        self.expected = self._seen(traced)

    def _seen(self, offset: int):
        if self.shift is None:
            return offset % self.modulus
        return (offset + self.shift) % self.modulus == 0

    def _offset(self, flat):
        t = self.read(flat)
        return t.storage_offset() if isinstance(t, torch.Tensor) else None

    def holds(self, flat) -> bool:
        offset = self._offset(flat)
        return offset is not None and self._seen(offset) == self.expected

    def describe(self, flat) -> str:
        return (
            f"the storage offset of {self.label} changed from {self.traced} to {self._offset(flat)} "
            f"(modulo {self.modulus} elements: {self.why})"
        )

    def term(self, index: int, scope: dict) -> str:
        scope[f"o{index}"] = self.holds
        return f"o{index}(flat)"


def can_guard(proxy) -> bool:
    """Whether the offset of the trace input ``proxy``'s tensor can be guarded per call."""
    return _reader(proxy) is not None


def guard_offset(proxy, modulus: int, why: str, shift: int | None) -> None:
    """While a program is traced: the entry serves only calls whose tensor for the trace input
    ``proxy``, viewed ``shift`` elements further (None: a symbolic distance), starts on a boundary
    of ``modulus`` elements where the traced one did, and off one where it did not (``can_guard``)."""
    observer, read = thread_state.observer, _reader(proxy)
    if observer is None or read is None:
        return
    key = ("storage offset", proxy._input_vid, modulus, shift)
    observer.add_guard(key, OffsetGuard(read, _label(proxy), modulus, proxy._offset, why, shift))
