"""Automatic dynamic shapes: which sizes a compile traces as symbolic, and which compiled entry
serves a call whose sizes it was not compiled for.

As torch.compile does, a function is compiled for the sizes of its first call. When a later call
misses the cache and its key differs from an earlier one only in sizes of contiguous tensor
arguments (same dtypes, devices, ranks, everything else), those dims become symbolic in the next
compile (``jit(dynamic=None)``, the default); ``dynamic=True`` makes every dim of the tensor
arguments symbolic from the first compile, ``dynamic=False`` never. Sizes 0 and 1 stay constant:
programs branch on them (broadcasting, squeezing), so a call with such a size compiles for it.

An entry compiled with symbolic sizes (``SymbolicEntry``) serves a later call whose key differs
from its own only at its symbolic dims, when every guard its trace relied on holds for the call's
sizes; the call's key is then stored for that entry, so the next call with those sizes is an
ordinary cache hit.
"""

import torch

_Size = torch.Size


def _is_tensor_key(k) -> bool:
    return type(k) is tuple and len(k) == 5 and type(k[2]) is _Size


def changed_dims(old_key, new_key) -> list | None:
    """The ``(flat position, dim)`` of the sizes that differ between two cache keys otherwise
    equal, where those tensors are contiguous (a strided tensor's strides change with its sizes);
    None when anything else differs."""
    if type(old_key) is not tuple or len(old_key) != len(new_key) or old_key[0] != new_key[0]:
        return None
    if old_key[2:] != new_key[2:] or len(old_key[1]) != len(new_key[1]):
        return None
    changed: list[tuple[int, int]] = []
    for i, (a, b) in enumerate(zip(old_key[1], new_key[1])):
        if a == b:
            continue
        if not (_is_tensor_key(a) and _is_tensor_key(b)) or a[:2] != b[:2] or a[3] != b[3]:
            return None
        if a[4] is not True or b[4] is not True or len(a[2]) != len(b[2]):
            return None
        changed.extend((i, d) for d, (x, y) in enumerate(zip(a[2], b[2])) if x != y)
    return changed


def wanted_sizes(mode, key, flat, earlier_keys, marked: set) -> tuple:
    """The ``(flat position, dim)`` to trace as symbolic for the call of ``flat`` with ``key``;
    ``marked`` (updated) holds those an earlier compile saw change."""
    if mode is False:
        return ()
    if mode is True:
        dims = {(i, d) for i, x in enumerate(flat) if isinstance(x, torch.Tensor) for d in range(x.dim())}
    else:
        for old in earlier_keys:
            changed = changed_dims(old, key)
            if changed:
                marked.update(changed)
        dims = marked
    contiguous = {i for i, x in enumerate(flat) if isinstance(x, torch.Tensor) and x.is_contiguous()}
    return tuple(sorted((i, d) for i, d in dims if i in contiguous and flat[i].shape[d] >= 2))


def size_readers(sizes, positions) -> list:
    """For each symbolic size ``(flat position, dim)``, ``(index of the tensor among the
    entry's inputs, dim)``: the entry's callable takes the tensors at ``positions`` (all flat
    inputs when None) first."""
    index = {p: k for k, p in enumerate(positions)} if positions is not None else None
    return [(i if index is None else index[i], d) for i, d in sizes]


def with_sizes(fn, readers, captured: tuple = ()):
    """``fn`` given, after the caller's inputs, the ``captured`` tensors and then the symbolic
    sizes read from the inputs, as a trace with size inputs takes them (its last)."""
    reads = ", ".join(f"inputs[{k}].shape[{d}]" for k, d in readers)
    source = f"def call(*inputs):\n    return fn(*inputs, *captured, {reads})\n"
    scope = {"fn": fn, "captured": captured}
    exec(compile(source, "<thunder_rs sizes>", "exec"), scope)
    return scope["call"]


def size_sources(flat, sizes) -> list:
    """For each size input, in order, the ``(flat position, dim)`` it is read from: sizes of
    one value share a size input (see ``acquire._symbolic_sizes``), read from the first."""
    first: dict = {}
    for i, d in sizes:
        first.setdefault(flat[i].shape[d], (i, d))
    return list(first.values())


class SymbolicEntry:
    """An entry compiled with symbolic sizes: its key, its symbolic ``(flat position, dim)``,
    and ``check(flat)``, whether the guards its traces rely on hold for a call's sizes."""

    __slots__ = ("entry", "key", "dims", "check", "guards")

    def __init__(self, entry, key, flat, sizes, names, guards):
        self.entry, self.key, self.dims, self.guards = entry, key, frozenset(sizes), tuple(guards)
        sources = size_sources(flat, sizes)
        name_of = {flat[i].shape[d]: n for n, (i, d) in zip(names, sources)}
        binds = "".join(f"    {n} = flat[{i}].shape[{d}]\n" for n, (i, d) in zip(names, sources))
        # 0 and 1 stay constant (see the module doc): a size is symbolic from 2 up. Sizes that
        # share a size input must be equal.
        conditions = [f"{n} >= 2" for n in names]
        conditions += [
            f"flat[{i}].shape[{d}] == {name_of[flat[i].shape[d]]}" for i, d in sizes if (i, d) not in sources
        ]
        conditions += [f"({g})" for g in guards]
        source = f"def check(flat):\n{binds}    return {' and '.join(conditions) or 'True'}\n"
        scope: dict = {}
        exec(compile(source, "<thunder_rs size guards>", "exec"), scope)
        self.check = scope["check"]

    def serves(self, key, flat) -> bool:
        changed = changed_dims(self.key, key)
        return changed is not None and self.dims.issuperset(changed) and self.check(flat)
