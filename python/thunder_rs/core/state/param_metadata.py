"""The dtype, device, requires_grad and sizes of a jitted module's parameters and buffers, as its
cache key holds them, checked on each call in C++ instead of read attribute by attribute.

Reading three attributes of each of 300 parameters costs about 50 us a call and hashing the
tuple they make another 20; a decode step of a small LLM on a GPU has about that much host time
in all. So the key holds one interned ``ParameterMetadata`` per distinct tuple (hashed and
compared by identity), and a call whose slots hold the same tensors as the last call's reuses
that call's when torch's ``TensorGuards`` (Dynamo's C++ tensor check, imported without the
Python ``torch._dynamo`` package) finds their dtype, device, requires_grad, sizes and dispatch
keys unchanged. A trace holds its inputs' sizes (``x * buf.numel()``, a gradient summed to a
bias's shape): a buffer or parameter given a tensor of other sizes (a grown mask, a pruned
layer) recompiles. Any other outcome takes the attribute reads, so the guards only ever cost a false.
"""

from __future__ import annotations

import weakref
from operator import attrgetter, is_
from typing import Any

import torch

#: None in a build of torch without Dynamo (every call then reads the attributes). Typed loosely:
#: torch's stub gives ``dynamic_dims_sizes`` one list, its C++ takes one per tensor.
TensorGuards: Any = getattr(getattr(getattr(torch._C, "_dynamo", None), "guards", None), "TensorGuards", None)

#: What the cache key holds of each parameter and buffer (C-level, no Python frame each).
_METADATA = attrgetter("dtype", "device", "requires_grad", "shape")
_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled
#: The Python types guards are built for (a subclass's sizes and strides may come from Python).
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
#: ``TensorGuards`` could not be built for the tensors: no attempt again while the slots hold them.
_UNGUARDABLE = False


class ParameterMetadata:
    """``(dtype, device, requires_grad, shape)`` of each of a module's tensors, once per distinct tuple
    and module structure (``structures``: the number of the structure the tensors were read in):
    keys holding it hash and compare by identity, at no cost per parameter."""

    __slots__ = ("per_tensor", "structure", "__weakref__")

    def __init__(self, per_tensor: tuple, structure: int = 0):
        self.per_tensor, self.structure = per_tensor, structure

    def __repr__(self) -> str:
        return repr(self.per_tensor)


#: Live ``ParameterMetadata`` by their tuple: equal tuples make one object while any key holds it.
_interned: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def interned(per_tensor: tuple, structure: int = 0) -> ParameterMetadata:
    """The one ``ParameterMetadata`` of ``per_tensor`` read in the module structure ``structure``."""
    found = _interned.get((structure, per_tensor))
    if found is not None:
        return found
    return _interned.setdefault((structure, per_tensor), ParameterMetadata(per_tensor, structure))


class MetadataCheck:
    """A module binding's metadata of the last call, with the tensors it was read from and their
    ``TensorGuards`` (None before the same tensors were seen twice: slots given new tensors on
    every call, as ``functional_call`` does, never pay for building them).

    The tensors are held until the next call: comparing them by identity is what makes the guards
    safe to run, as ``TensorGuards`` reads the strides of a tensor of the type it was built from
    and a nested or MKL-DNN tensor's impl aborts the process there. A tensor's impl kind cannot
    change under ``p.data = other`` (torch refuses incompatible impls), only by a new tensor."""

    __slots__ = ("_last", "memory", "structure")

    def __init__(self, structure: int = 0):
        #: (tensors, guards, metadata) of the last call; no tensors before the first
        self._last: tuple = (None, None, None)
        #: what ``acquisition.module_memory`` read of ``tensors`` (which memory they use), with them
        self.memory: tuple | None = None
        #: the number of the module structure the tensors are read in (``structures``)
        self.structure = structure

    @property
    def tensors(self) -> list | None:
        """The tensors the metadata was last read from: a list that stays while calls find the same
        tensors in the slots (None before the first call)."""
        return self._last[0]

    def __call__(self, tensors: list) -> ParameterMetadata:
        last = self._last
        same = tensors is last[0] or (
            last[0] is not None and len(tensors) == len(last[0]) and all(map(is_, tensors, last[0]))
        )
        guards = last[1]
        # (``_holds`` inline where grad mode needs no toggling: a frame less per call)
        if (
            same
            and guards
            and (guards.check(*tensors) if _grad_enabled() or _mode_free[0] else _holds(guards, tensors))
        ):
            return last[2]
        metadata = interned(_read(tensors), self.structure)
        guards = (_UNGUARDABLE if last[1] is _UNGUARDABLE else _guards(tensors)) if same else None
        self._last = (tensors, guards, metadata)
        return metadata


def _read(tensors: list) -> tuple:
    """Each tensor's metadata."""
    try:
        return tuple(map(_METADATA, tensors))
    except RuntimeError:
        return tuple(map(_read_one, tensors))


def _read_one(t) -> tuple:
    """A tensor's metadata; sizes None for a tensor that has none to give (a nested tensor, a lazy
    module's uninitialised parameter, which the acquisition then refuses)."""
    try:
        return _METADATA(t)
    except RuntimeError:
        return t.dtype, t.device, t.requires_grad, None


#: Whether this torch's ``TensorGuards`` read requires_grad whatever the grad mode (2.15 does):
#: then no call toggles grad mode to check them (~0.3 us). None until the first guards are built.
_mode_free: list[bool | None] = [None]


def _holds(guards, tensors: list) -> bool:
    """Whether ``guards`` still hold for ``tensors``. Checked with grad mode on, as they were built,
    where this torch's need it: with it off the ``TensorGuards`` of torch 2.9 take every
    requires_grad as False (a layer unfrozen under ``no_grad`` would hit the frozen entry)."""
    if _grad_enabled() or _mode_free[0]:
        return guards.check(*tensors)
    _set_grad_enabled(True)
    try:
        return guards.check(*tensors)
    finally:
        _set_grad_enabled(False)


def _guards(tensors: list):
    """``TensorGuards`` of ``tensors``' dtype, device, requires_grad, sizes and dispatch keys (their
    strides left free: ``p.data`` made contiguous keeps the key), or ``_UNGUARDABLE`` where a
    tensor is of another type or layout, or this torch's ``TensorGuards`` takes other arguments."""
    if TensorGuards is None or not all(map(_plain, tensors)):
        return _UNGUARDABLE
    sizes = [list(t.shape) for t in tensors]
    free = [[None] * t.dim() for t in tensors]
    enabled = _grad_enabled()
    _set_grad_enabled(True)
    try:
        if _mode_free[0] is None:
            _mode_free[0] = _reads_requires_grad_without_grad_mode()
        guards = TensorGuards(*tensors, dynamic_dims_sizes=sizes, dynamic_dims_strides=free)
        return guards if guards.check(*tensors) is True else _UNGUARDABLE
    except Exception:  # noqa: BLE001 (another torch's signature: the attribute reads serve)
        return _UNGUARDABLE
    finally:
        _set_grad_enabled(enabled)


def _plain(t) -> bool:
    return type(t) in _PLAIN_TYPES and t.layout is torch.strided and not t.is_nested


def _reads_requires_grad_without_grad_mode() -> bool:
    """Whether ``TensorGuards`` built (with grad mode on) for a tensor not requiring grad fail
    under ``no_grad`` for one that does: torch 2.9's take requires_grad as False there and hold."""
    plain = torch.zeros(1)
    guards = TensorGuards(plain, dynamic_dims_sizes=[[1]], dynamic_dims_strides=[[None]])
    _set_grad_enabled(False)
    try:
        return guards.check(plain) is True and guards.check(torch.zeros(1, requires_grad=True)) is False
    finally:
        _set_grad_enabled(True)
