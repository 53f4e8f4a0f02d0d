"""Whether a tensor a compiled call writes in place shares memory with one of the module's
parameters and buffers, told per call without reading each of them.

A call whose program writes an argument in place (a KV cache, ``k_cache[:, pos] = k``) refuses an
argument that shares memory with a module tensor (``writeback``): the trace took them as separate
tensors. Reading a tensor's storage costs ~110 ns, 11 us a call at 100 parameters. Torch tells
nothing when a tensor's storage changes under it (``p.data = t``, ``p.set_(...)``,
``swap_tensors``, ``module.to()``, a storage resized), so the module's storages cannot be read once
and trusted; but the written tensor can vouch for itself (``_vouches``) that none shares its memory:

- no other tensor holds its storage: the storage's use count is its own tensor's and the probe's.
  A view of it, its ``.data`` or ``detach()``, a tensor ``set_`` to it or given it by ``p.data =``
  each hold the storage, so a parameter given the argument's memory in any of these ways is seen;
- nothing in C++ holds the tensor itself (a DLPack export, whose importer reads its memory; a
  variable saved for a backward);
- its storage is resizable: memory torch allocated for it, not memory lent by another owner
  (``from_numpy``, DLPack, a memory-mapped file); ``.numpy()`` makes it not resizable for good, as
  an array of it can lend it on;
- it is none of the module's tensors (a buffer passed as the argument: one tensor, one storage
  reference);
- no module tensor that uses lent memory starts where it does (the storages of those, read once).

The identities and lent storages are read once per set of module tensors: those that
``param_metadata.MetadataCheck`` holds when the same tensors served a second call, checked by
identity on each call (~3 ns a tensor, one C call: ``_core.same_objects``). Where the tensor
cannot vouch, each module tensor's storage is read, as every call did before. Not seen, as torch
does not see it either: a tensor made from the argument's raw address (``__cuda_array_interface__``,
a C++ ``from_blob``) that a parameter is given in place after the module's tensors were read.
"""

from operator import is_

import torch

from thunder_rs._core import same_objects

_storage_use_count = torch._C._storage_Use_Count


def root_id(t: torch.Tensor) -> int:
    """The memory ``t`` uses: its storage's address, so that views, ``detach()`` and ``.data`` of a
    tensor share it (a tensor with no memory is only itself)."""
    return t.untyped_storage().data_ptr() or id(t)


def _vouches(t: torch.Tensor, ids: frozenset) -> bool:
    """Whether no tensor but ``t`` uses ``t``'s memory, other than one using lent memory (the
    module's are checked by their roots); ``ids``: the module tensors' ids."""
    if id(t) in ids:
        return False
    storage = t.untyped_storage()  # (the probe: one more holder of the storage while it lives)
    return storage.resizable() and _storage_use_count(storage._cdata) == 2 and t._use_count() == 1


def _lent_roots(tensors: list) -> frozenset:
    """The roots of the module tensors whose storage uses memory torch did not allocate for it."""
    return frozenset(root_id(t) for t in tensors if not t.untyped_storage().resizable())


def _facts(check, inputs: tuple, start: int, stop: int):
    """``(ids, lent roots)`` of the module tensors ``inputs[start:stop]``, or None where they are
    not the tensors ``check`` (the binding's ``MetadataCheck``) holds, or held there for the first
    call (slots given new tensors on every call, as ``functional_call`` gives them, are never read
    twice)."""
    tensors = check.tensors
    if tensors is None or len(tensors) != stop - start or not _same(inputs, start, tensors):
        return None
    memo = check.memory
    if memo is None or memo[0] is not tensors:
        check.memory = (tensors, None)
        return None
    if memo[1] is None:
        memo = check.memory = (tensors, (frozenset(map(id, tensors)), _lent_roots(tensors)))
    return memo[1]


def _same(inputs: tuple, start: int, tensors: list) -> bool:
    """Whether ``inputs[start:]`` begin with the objects of ``tensors``: one C call for a call's
    inputs (a tuple) and the tensors a ``MetadataCheck`` holds (a list), ~3 ns a tensor."""
    if type(inputs) is tuple and type(tensors) is list:
        return same_objects(inputs, start, tensors)
    return all(map(is_, tensors, inputs[start : start + len(tensors)]))


def module_sharing(check, start: int, stop: int, written: tuple, others: tuple):
    """``shares(inputs, bases)``: whether a module tensor among ``others`` (trace input indices in
    ``start:stop``, the module's) shares memory with a ``written`` input (``bases``: their roots)."""

    def shares(inputs: tuple, bases: set) -> bool:
        facts = _facts(check, inputs, start, stop)
        if facts is not None and facts[1].isdisjoint(bases) and all(_vouches(inputs[k], facts[0]) for k in written):
            return False
        return any(root_id(inputs[k]) in bases for k in others)

    return shares
