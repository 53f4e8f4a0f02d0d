"""Automatic dynamic shapes: which sizes a compile traces as symbolic, and which compiled entry
serves a call whose sizes it was not compiled for.

As torch.compile does, a function is compiled for the sizes of its first call. When a later call
misses the cache and its key differs from an earlier one only in sizes of tensor arguments (same
dtypes, devices, ranks, dim orders of dense layouts, everything else) and strides of strided
ones (a slice of a buffer whose length changes: ``x.stride(0)``), those become symbolic in the
next compile (``jit(dynamic=None)``, the default); ``dynamic=True`` makes every dim of the tensor
arguments symbolic from the first compile, ``dynamic=False`` never. Dims marked with torch's own
``torch._dynamo.mark_dynamic`` (or ``maybe_mark_dynamic``) are symbolic from the first compile in
the default mode, dims marked with ``mark_static`` never. Sizes 0 and 1 of inputs stay
constant: programs branch on them (broadcasting, squeezing), so a call with such a size compiles
for it. (Counts the program computes from values may be 0 or 1 in a symbolic variant, where
every decision that would differ there is a guard: ``core.lang.value_sizes``.)

Items of a list argument are alike (``images``, ``targets``: a dict per image): when a dim of
one changed, the same dim of the tensors in the same place of the other items turns symbolic
with it (``siblings``), rather than at the first call where each changes; and items at other
indices do not share a size input when their sizes happen to be equal (``in_other_items``).

An entry compiled with symbolic sizes (``SymbolicEntry``) serves a later call whose key differs
from its own only at its symbolic dims, when every guard its trace relied on holds for the call's
sizes; the call's key is then stored for that entry, so the next call with those sizes is an
ordinary cache hit.

Tensors that argument objects hold (a KV cache's ``cache.layers[i].keys``, see
``core.state.reached``) are not in the key: their metadata is guarded (``TensorGuard``). When a
call fails only such guards of an entry, on sizes alone (and strides, which are compiled for),
those dims (``held_changes``, by the holder's path and the attribute's name) become symbolic in
the next compile too: the program reads a proxy of symbolic sizes there, the guard leaves those
dims out, and the entry checks its size guards on every call (``SizesGuard``), since the key does
not see the sizes change. A strided tensor's strides that changed (a slice of a buffer whose
length changes: a sliding window's keys sliced from the prompt's states) become size inputs the
same way (``HeldStride``); its guard keeps what the trace decided at the traced strides, their
order and which dims step over which (``layouts.SymbolicStrides``), as a flat input's key keeps
its strides (``_decided``).

A cache the last call filled (a prompt's keys, of the prompt's length) that a call reads while
its own sizes turned symbolic from that length (the first decoding step's attention mask, one
token longer) is symbolic with them from that call (``held_grown``): the decode's later steps are
served, rather than compiling again when the cache's length is seen to change.

An int an argument object or a module holds that a call finds changed (a count of tokens a KV
cache keeps, Gemma-2's sliding layers' ``cumulative_length``, a module's ``self.seen_tokens``)
becomes a size input the same way (``HeldInt``): the program reads a ``SymInt`` there, what it
sets there (``count += 1``) is written back with each call's value, and the entry reads it from
that path on every call.
"""

import re
from typing import Any, NamedTuple

import torch

from thunder_rs.core.acquisition.cache import is_tensor_key
from thunder_rs.core.base.layouts import STRIDE, SymbolicStrides, decided_by, is_strided, layout, strides_in
from thunder_rs.core.state.cached_reads import CachedCallsGuard
from thunder_rs.core.state.guards import MISSING, Guard, InputSource, ModuleSource
from thunder_rs.core.state.tensor_guards import TensorGuard


def _is_int_key(k) -> bool:
    return type(k) is tuple and len(k) == 2 and k[0] is int


def changed_dims(old_key, new_key) -> list | None:
    """The ``(flat position, dim)`` of the sizes that differ between two cache keys otherwise
    equal, ``(flat position, (STRIDE, dim))`` of a strided tensor's strides that differ (a slice
    of a buffer whose length changes, ``torch.randn(4, 2 * T)[:, ::2]``; a slice of a fixed
    buffer, ``buf[:, :T]``, keeps them), ``(flat position, None)`` of the int arguments that
    differ; None when anything else differs (a layout that is strided on one side only)."""
    if type(old_key) is not tuple or len(old_key) != len(new_key) or old_key[0] != new_key[0]:
        return None
    if old_key[2:] != new_key[2:] or len(old_key[1]) != len(new_key[1]):
        return None
    changed: list[tuple[int, int | tuple | None]] = []
    for i, (a, b) in enumerate(zip(old_key[1], new_key[1])):
        if a == b:
            continue
        if _is_int_key(a) and _is_int_key(b):
            changed.append((i, None))
            continue
        if not (is_tensor_key(a) and is_tensor_key(b)) or a[:2] != b[:2] or a[3] != b[3] or a[5:] != b[5:]:
            return None
        if len(a[2]) != len(b[2]):
            return None
        changed.extend((i, d) for d, (x, y) in enumerate(zip(a[2], b[2])) if x != y)
        if a[4] != b[4]:
            if not (is_strided(a[4]) and is_strided(b[4])):
                return None
            changed.extend((i, (STRIDE, d)) for d, (x, y) in enumerate(zip(a[4], b[4])) if x != y)
    return changed


def wanted_sizes(mode, key, flat, spec, earlier_keys, marked: set) -> tuple:
    """The ``(flat position, dim)`` to trace as symbolic for the call of ``flat`` with ``key``
    (``(flat position, None)`` for an int argument, ``ArgInt``); ``marked`` (updated) holds those
    an earlier compile saw change, and the same dims of their siblings in the call's ``spec``
    (``siblings``). ``dynamic=True`` makes every dim of the tensor arguments symbolic from the
    first compile, but an int argument only once it changed: ints are as often dims, counts of
    outputs or flags, which a trace specialises anyway."""
    if mode is False:
        return ()
    tensors = {i: x for i, x in enumerate(flat) if isinstance(x, torch.Tensor)}
    for old in earlier_keys:
        changed = changed_dims(old, key)
        if changed:
            marked.update(changed)
            marked.update(siblings(spec, flat, changed))
    marked.update(_marked_by_torch(tensors, "_dynamo_dynamic_indices", "_dynamo_weak_dynamic_indices"))
    dims = set(marked)
    if mode is True:  # every dim of the tensors; ints only once seen changing (or marked)
        dims.update((i, d) for i, x in tensors.items() for d in range(x.dim()))
    static = _marked_by_torch(tensors, "_dynamo_static_indices")
    ints = [(i, None) for i, d in dims if d is None and i < len(flat) and type(flat[i]) is int and flat[i] >= 2]
    # (a dim marked by a call of higher rank is past this call's: ``x`` of rank 3, then of rank 2)
    sized = [(i, d) for i, d in dims if i in tensors and type(d) is int and d < flat[i].dim() and flat[i].shape[d] >= 2]
    strided = [(i, d) for i, d in dims if type(d) is tuple and i in tensors and _stride_symbolic(flat[i], d[1])]
    return (*sorted(at for at in sized if at not in static), *sorted(strided), *sorted(ints))


def _stride_symbolic(t: torch.Tensor, dim: int) -> bool:
    """Whether the stride of ``t`` at ``dim`` is traced as symbolic: ``t`` is strided (its strides
    are not its sizes', ``layouts.is_strided``) and the stride is 2 and up (0 and 1, broadcast and
    innermost, stay constant as sizes 0 and 1 do)."""
    return dim < t.dim() and t.stride(dim) >= 2 and not t.is_contiguous() and is_strided(layout(t))


def siblings(spec, flat, changed) -> set:
    """The same dims, ``(flat position, dim)``, as those of ``changed`` in the tensors that hold
    the same place in other items of a list of the call (``spec``, torch's pytree): the other
    images' ``targets[k]['boxes'].shape[0]`` when one image's changed. Items of a list are alike
    by convention (a tuple's are not: ``(input, mask)``), so their sizes vary alike: marking them
    together saves a compile per item. Tensors of another rank or dtype are left alone."""
    roles = leaf_roles(spec)
    by_role: dict = {}
    for j, role in enumerate(roles):
        if isinstance(flat[j], torch.Tensor):
            by_role.setdefault(role, []).append(j)
    found: set = set()
    for i, d in changed:
        if d is None:
            continue
        x = flat[i]
        found.update((j, d) for j in by_role[roles[i]] if flat[j].dim() == x.dim() and flat[j].dtype == x.dtype)
    return found - set(changed)


def leaf_roles(spec) -> list:
    """Each leaf's path in ``spec`` (torch's pytree, ``leaf_paths``), the index of a list item as
    ``"*"``: leaves with one role share it (``targets[0]['boxes']`` and ``targets[1]['boxes']``)."""
    return [tuple((kind, "*" if kind is list else step) for kind, step in path) for path in leaf_paths(spec)]


def leaf_paths(spec) -> list:
    """Each leaf's path in ``spec`` (torch's pytree): ``(node type, index or key)`` per step."""
    paths: list = []

    def walk(node, path: tuple) -> None:
        if node.is_leaf():
            paths.append(path)
            return
        context = node.context
        named = type(context) is list and len(context) == node.num_children
        for k, child in enumerate(node.children()):
            walk(child, (*path, (node.type, context[k] if named else k)))

    walk(spec, ())
    return paths


def in_other_items(a: tuple, b: tuple) -> bool:
    """Whether the leaves at paths ``a`` and ``b`` (``leaf_paths``) are in items of lists at other
    indices: ``targets[0]`` and ``targets[1]``, or ``feats[1]`` and ``masks[2]`` of lists the
    program zips (``feats[1]`` and ``masks[1]`` are not)."""
    items_a = tuple(step for kind, step in a if kind is list)
    items_b = tuple(step for kind, step in b if kind is list)
    return bool(items_a) and bool(items_b) and items_a != items_b


def _marked_by_torch(tensors: dict, *marks: str) -> set:
    """The ``(flat position, dim)`` marked on the tensors by torch's own calls for torch.compile:
    ``torch._dynamo.mark_dynamic`` and ``maybe_mark_dynamic`` (symbolic from the first compile),
    ``mark_static`` (never symbolic)."""
    return {(i, d) for i, x in tensors.items() for mark in marks for d in getattr(x, mark, ()) if d < x.dim()}


class HeldDim(NamedTuple):
    """Where a symbolic size is read from a tensor an argument object holds: dim ``dim`` of the
    tensor at ``source``'s attribute ``name`` (``guards.InputSource``; an index or key of
    ``guards.InputItemsSource``), which is the trace's input number ``input``."""

    source: Any
    name: str | int
    dim: int
    input: int


class HeldStride(NamedTuple):
    """Where a symbolic stride is read from a strided tensor an argument object holds: dim
    ``dim``'s stride of the tensor at ``source``'s attribute ``name``, the trace's input number
    ``input`` (as ``HeldDim``). A sliding window's keys sliced from the prompt's states step over
    the prompt's length."""

    source: Any
    name: str | int
    dim: int
    input: int


class HeldInt(NamedTuple):
    """Where a symbolic size is read from an int an argument object holds: its attribute ``name``
    at ``source`` (``guards.InputSource``); the entry takes it among its last inputs, the
    ``input``-th of the ints after the tensors (``tail``). A count of tokens a KV cache keeps (Gemma-2's sliding layers'
    ``cumulative_length``), which each step sets one higher."""

    source: Any
    name: str
    input: int

    def code(self, j: int, scope: dict) -> str:
        """An expression reading it from a call's flat inputs ``flat``; binds what it uses in ``scope``."""
        return f"{self.source.code(f'n{j}', scope)}[{self.name!r}]"


class ArgInt(NamedTuple):
    """Where a symbolic size is read from an int argument of the call (a length passed as an int,
    the ``SymInt`` inputs of torch.compile's dynamic graphs): flat input ``position``; the entry
    takes it among its last inputs as a ``HeldInt``, the ``input``-th of the ints after the
    tensors."""

    position: int
    input: int

    def code(self, j: int, scope: dict) -> str:
        """An expression reading it from a call's flat inputs ``flat``."""
        return f"flat[{self.position}]"


#: Marks, among ``held_changes``' dims, an int attribute (``HeldInt``) rather than a tensor's dim.
INT = "int"
#: Marks, among ``held_changes``' dims, a float attribute (``float_args.HeldFloat``).
FLOAT = "float"


def _float_changed(guard, flat) -> bool:
    """Whether ``guard`` (failing) read a float of an argument object or a module (a module's
    ``self.temperature``) that is another float now: a float input of the next compile
    (``float_args.HeldFloat``)."""
    if type(guard) is not Guard or type(guard.expected) is not float:
        return False
    if not isinstance(guard.source, InputSource) and type(guard.source) is not ModuleSource:
        return False
    return type(guard.read(flat)) is float


def _held_int(guard) -> bool:
    """Whether ``guard`` reads an int (not a bool) an argument object or a module holds."""
    if type(guard) is not Guard or type(guard.expected) is not int:
        return False
    return isinstance(guard.source, InputSource) or type(guard.source) is ModuleSource


def _int_changed(guard, flat) -> bool:
    """Whether ``guard`` (failing) read an int of an argument object or a module (a count of the
    tokens seen) that is another int now, from 2 up (0 and 1 stay constant, as sizes do; a count
    going from 1 to 2 is marked then, as an int argument is)."""
    if type(guard) is not Guard or type(guard.expected) is not int:
        return False
    if not isinstance(guard.source, InputSource) and type(guard.source) is not ModuleSource:
        return False
    now = guard.read(flat)
    return type(now) is int and now >= 2


def held_changes(guards, flat) -> dict | None:
    """The dims of argument objects' tensors whose sizes alone make ``guards`` (an entry's
    ``Guards``) fail for the call of ``flat``: ``{(source key, name): dims}``; None when another
    guard fails, or a tensor changed more than sizes and strides (dtype, rank...). A strided
    tensor's strides that changed are marked ``(STRIDE, dim)``, size inputs of the next compile
    (``HeldStride``): a sliding window's keys are a slice of the prompt's states, then of each
    step's, so the first step's step over the prompt's length. A tensor dense in another order,
    or contiguous on one side only, adds no strides (its layout is compiled for) but its sizes
    that changed: a convolution's state kept transposed (RecurrentGemma's) has the batch's."""
    changed: dict = {}
    for guard in (*guards.per_call, *guards.modules):
        # (sizes only: what changed is below; cached calls are made by the entry that serves only)
        if type(guard) in (SizesGuard, CachedCallsGuard) or guard.holds(flat):
            continue
        if _int_changed(guard, flat):
            changed.setdefault((guard.source.key, guard.name), set()).add(INT)
            continue
        if _float_changed(guard, flat):
            changed.setdefault((guard.source.key, guard.name), set()).add(FLOAT)
            continue
        if type(guard) is not TensorGuard:
            return None
        now = guard.found(flat)
        if now is MISSING or guard.expected is MISSING:
            return None
        (dtype, device, shape, grad, layout, *rest), old = now, guard.expected
        if (dtype, device, grad, *rest) != (*old[:2], old[3], *old[5:]) or len(shape) != len(old[2]):
            return None
        dims: set = {d for d, (a, b) in enumerate(zip(old[2], shape)) if a is not None and a != b}
        strides = old[4].strides if type(old[4]) is SymbolicStrides else old[4]
        if (layout is not True or strides is not True) and is_strided(layout) and is_strided(strides):
            dims.update((STRIDE, d) for d, (a, b) in enumerate(zip(strides, layout)) if a is not None and a != b)
        changed.setdefault((guard.source.key, guard.name), set()).update(dims)
    return changed or None


def wanted_held(mode, entries, flat, marked: dict) -> dict:
    """The dims of argument objects' tensors to trace as symbolic, ``{(source key, name): dims}``;
    ``marked`` (updated) holds those an earlier call changed: a call of ``flat`` that fails only
    the guards of one of ``entries`` (the function's) on such sizes marks them. Every entry is
    asked, not only the one compiled last: a generate with another batch size makes a new cache,
    whose first step is compared with the decode steps of the last generate, not with its own
    prompt's entry (a cache of no tensors yet)."""
    if mode is False:
        return {}
    for entry in entries:
        changes = held_changes(entry.guards, flat) if entry.guards is not None else None
        for at, dims in (changes or {}).items():
            marked.setdefault(at, set()).update(dims)
    return {at: frozenset(dims) for at, dims in marked.items() if dims}


#: A guard that specialised a size input to a constant: ``t1 - 8 == 0``.
_SPECIALISED = re.compile(r"(t\d+) - (\d+) == 0")


def held_alike(guards, acquired, traces, held: dict) -> dict:
    """The dims of argument objects' tensors, constant in ``acquired`` (compiled into ``traces``
    with ``held`` symbolic), whose size a symbolic size of the call's arguments was specialised to by one of
    ``guards`` (the trace's, as text): ``{(source key, name): dims}``. A cross-attention's keys
    that the cache holds have the encoder's length, which the attention mask's meets (``t1 - 8 ==
    0``): traced symbolic with it, a prompt of another length is served, rather than compiling
    again once the cache's keys are seen to change (PLBart's and Blenderbot's beam search, whose
    greedy search stopped at its first token, compiled each step again at a second prompt
    length). Their sizes are guarded equal to it where the trace relied on that."""
    names = {f"t{v}": at for v, at in zip(traces[-1].size_inputs(), acquired.sizes)}
    constants = set()
    for guard in guards:
        found = _SPECIALISED.fullmatch(guard)
        if found is None:
            continue
        at = names.get(found.group(1))
        if type(at) is tuple and type(at[1]) is int:  # (a flat input's dim)
            constants.add(int(found.group(2)))
    alike: dict = {}
    for guard in acquired.guards if constants else ():
        if type(guard) is not TensorGuard or guard.expected is MISSING:
            continue
        at = (guard.source.key, guard.name)
        dims = {d for d, n in enumerate(guard.expected[2]) if n in constants and d not in held.get(at, ())}
        if dims:
            alike[at] = dims
    return alike


def held_grown(acquired, held: dict, old_key, entries) -> dict:
    """The dims of argument objects' tensors, constant in ``acquired``, that hold the size a
    symbolic dim of the call's arguments had in the call before (``old_key``), for tensors no
    entry of ``entries`` read yet: ``{(source key, name): dims}``. The prompt's call fills a KV
    cache with keys of the prompt's length; the first decoding step, whose attention mask grew
    from that length (symbolic), reads them: they grow as the mask does, so they are traced
    symbolic with it, and the next steps are served rather than compiling again when the
    cache's keys are seen to change. Their sizes are guarded where the trace relied on them. An
    int such an object holds (``INT``) likewise, where it changed since an entry read it: the
    count of tokens a sliding layer saw (0 at the prompt), not its window, which no call changes."""
    if type(old_key) is not tuple or len(old_key) < 2 or type(old_key[1]) is not tuple:
        return {}
    olds = set()
    for at in acquired.sizes:
        if type(at) is tuple and type(at[1]) is int and at[0] < len(old_key[1]):
            before = old_key[1][at[0]]
            if is_tensor_key(before) and at[1] < len(before[2]) and before[2][at[1]] >= 2:
                olds.add(before[2][at[1]])
    read = [g for e in entries if e.guards is not None for g in e.guards.per_call]
    seen = {(g.source.key, g.name) for g in read if type(g) is TensorGuard}
    counts = {(g.source.key, g.name): g.expected for g in read if _held_int(g)}
    grown: dict = {}
    for guard in acquired.guards if olds else ():
        at = (guard.source.key, guard.name) if _held_int(guard) else None
        # (an int that changed since an entry read it: the count of tokens the cache saw, not its window)
        if at in counts and counts[at] != guard.expected and guard.expected in olds and INT not in held.get(at, ()):
            grown[at] = {INT}
        if type(guard) is not TensorGuard or guard.expected is MISSING:
            continue
        at = (guard.source.key, guard.name)
        dims = {d for d, n in enumerate(guard.expected[2]) if n in olds and d not in held.get(at, ())}
        if dims and at not in seen:
            grown[at] = dims
    return grown


def has_held(acquired) -> bool:
    """Whether some size input of ``acquired`` is read from an argument object (a tensor's dim or an int)."""
    held = (HeldDim, HeldStride, HeldInt)
    return any(type(at) in held for at in (*acquired.sizes, *(at for at, _ in acquired.shared_sizes)))


def size_readers(sizes, positions) -> list:
    """For each size input, ``(index of the tensor among the entry's inputs, dim)``: a flat
    input's ``(flat position, dim)`` maps to its place among the entry's inputs, which take the
    tensors at ``positions`` (all flat inputs when None) first; a ``HeldDim`` names its input."""
    index = {p: k for k, p in enumerate(positions)} if positions is not None else None
    return [
        (at.input, at.dim)
        if type(at) is HeldDim
        else (at.input, (STRIDE, at.dim))
        if type(at) is HeldStride
        else (at.input, None)
        if type(at) in (HeldInt, ArgInt)
        else (at[0] if index is None else index[at[0]], at[1])
        for at in sizes
    ]


def with_sizes(fn, readers, captured: tuple = (), ints: int = 0, floats: int = 0):
    """``fn`` given, after the caller's inputs, the ``captured`` tensors and then the symbolic
    sizes read from the inputs, as a trace with size inputs takes them (its last but floats).
    The last ``floats`` inputs are float arguments (``float_args.ArgFloat``), passed last; the
    ``ints`` before them are ints argument objects hold (``HeldInt``), sizes themselves."""
    shapes: set = set()

    def read(k: int, d) -> str:
        if d is None:
            return f"inputs[{k - ints - floats}]"
        if type(d) is tuple:
            return f"inputs[{k}].stride({d[1]})"
        if k in shapes:
            return f"s{k}[{d}]"
        shapes.add(k)  # each tensor's shape read once per call: the reads are on the hit path
        return f"(s{k} := inputs[{k}].shape)[{d}]"

    reads = ", ".join(read(k, d) for k, d in readers)
    passed = f"inputs[:-{ints + floats}]" if ints + floats else "inputs"
    last = f", *inputs[-{floats}:]" if floats else ""
    source = f"def call(*inputs):\n    return fn(*{passed}, {'*captured, ' if captured else ''}{reads}{last})\n"
    scope = {"fn": fn, "captured": captured}
    exec(compile(source, "<thunder_rs sizes>", "exec"), scope)
    return scope["call"]


def symbolic_labels(sizes, names: list) -> str:
    """The symbolic sizes of a compile as the user names them (``x.shape[1]``,
    ``cache.layers[0].keys.shape[2]``), for its miss reason; ``names`` labels flat inputs."""
    labels = [
        f"{at.source.label}.{at.name}"
        if type(at) is HeldInt
        else f"{at.source.label}.{at.name}.stride({at.dim})"
        if type(at) is HeldStride and isinstance(at.name, str)
        else f"{at.source.label}[{at.name!r}].stride({at.dim})"
        if type(at) is HeldStride
        else f"{at.source.label}.{at.name}.shape[{at.dim}]"
        if type(at) is HeldDim and isinstance(at.name, str)
        else f"{at.source.label}[{at.name!r}].shape[{at.dim}]"
        if type(at) is HeldDim
        else names[at.position]
        if type(at) is ArgInt
        else names[at[0]]
        if at[1] is None
        else f"{names[at[0]]}.stride({at[1][1]})"
        if type(at[1]) is tuple
        else f"{names[at[0]]}.shape[{at[1]}]"
        for at in sizes
    ]
    return ", ".join(labels)


def size_read(at, scope: dict) -> str:
    """An expression for the size at ``at`` (``(flat position, dim)`` or ``HeldDim``) in a call's
    flat inputs ``flat``; binds what it uses in ``scope``."""
    if type(at) in (HeldDim, HeldStride, HeldInt):
        # (a module's source binds its instance dict in ``scope`` under the name given)
        held = f"{at.source.code(f'_held{len(scope)}', scope)}[{at.name!r}]"
        if type(at) is HeldInt:
            return held
        return f"{held}.shape[{at.dim}]" if type(at) is HeldDim else f"{held}.stride({at.dim})"
    if type(at) is ArgInt:
        return f"flat[{at.position}]"
    if type(at[1]) is tuple:  # (a flat input's stride)
        return f"flat[{at[0]}].stride({at[1][1]})"
    return f"flat[{at[0]}].shape[{at[1]}]"


#: What reading a size from an argument object raises where the tensor is not there (None, or
#: the attribute or item missing).
_ABSENT_READS = (KeyError, AttributeError, IndexError, TypeError)


class SymbolicEntry:
    """An entry compiled with symbolic sizes: its key, its symbolic ``(flat position, dim)``,
    and ``check(flat)``, whether the guards its traces rely on hold for a call's sizes.
    ``sources`` are where each size input is read (``Acquired.sizes``), ``shared`` the other
    places that must hold the same size (``(where, index of the size input)``), ``names`` the
    size inputs' names in ``guards``; ``decided`` where the program took the decision each guard
    records (``Acquired.decided``)."""

    __slots__ = ("entry", "key", "dims", "check", "guards", "_sources", "_explained", "_decided")

    def __init__(self, entry, key, sources, shared, names, guards, checks=(), decided=None):
        self.entry, self.key, self.guards, self._sources = entry, key, tuple(guards), tuple(sources)
        self._decided = decided or {}
        self.dims = frozenset(
            (at.position, None) if type(at) is ArgInt else at
            for at in (*sources, *(at for at, _ in shared))
            if type(at) not in (HeldDim, HeldStride, HeldInt)
        )
        scope: dict = {}
        binds = "".join(f"    {n} = {size_read(at, scope)}\n" for n, at in zip(names, sources))
        # 0 and 1 stay constant (see the module doc): a size is symbolic from 2 up. Sizes that
        # share a size input must be equal.
        conditions = [f"{n} >= 2" for n in names]
        conditions += [f"{size_read(at, scope)} == {names[j]}" for at, j in shared]
        conditions += [f"({g})" for g in guards]
        # Decisions no guard expresses (``observe.check_sizes``), asked with the sizes by name.
        env = "{" + ", ".join(f"{n!r}: {n}" for n in names) + "}"
        for i, check in enumerate(checks):
            scope[f"_size_check{i}"] = check
            conditions.append(f"_size_check{i}({env})")
        source = f"def check(flat):\n{binds}    return {' and '.join(conditions) or 'True'}\n"
        exec(compile(source, "<thunder_rs size guards>", "exec"), scope)
        self.check = scope["check"]
        # For miss reasons only: the first condition a call fails (its index), and the sizes it read.
        tests = "".join(f"    if not ({c}):\n        return {i}, {env}\n" for i, c in enumerate(conditions))
        shown = [f"{n} >= 2" for n in names] + [(at, names[j]) for at, j in shared] + list(guards)
        shown += [getattr(check, "shown", "a decision taken at the traced sizes") for check in checks]
        self._explained = (f"def explain(flat):\n{binds}{tests}    return None, None\n", scope, shown)

    def serves(self, key, flat) -> bool:
        changed = changed_dims(self.key, key)
        return (
            changed is not None
            and self.dims.issuperset(changed)
            and all(_decided(self.key[1][i]) == _decided(key[1][i]) for i in {i for i, d in changed if d is not None})
            and self.holds(flat)
        )

    def holds(self, flat) -> bool:
        """Whether a call of ``flat`` passes ``check``; False where a size it reads from an argument
        object is not there (a cache layer's keys are None again, or not yet set: a new cache whose
        call's flat inputs have the sizes of a step's)."""
        try:
            return self.check(flat)
        except _ABSENT_READS:
            return False

    def why_not(self, key, flat, names: list) -> str | None:
        """Why the entry does not serve a call of ``key`` and ``flat`` (``serves`` is False), for
        its miss reason; ``names`` labels the flat inputs. None when the key differs in more than
        sizes."""
        changed = changed_dims(self.key, key)
        if changed is None:
            return None
        constant = [at for at in changed if at not in self.dims]
        if constant:
            return f"the entry with symbolic sizes holds {symbolic_labels(constant, names)} constant"
        strided = sorted({i for i, d in changed if d is not None and _decided(self.key[1][i]) != _decided(key[1][i])})
        if strided:
            inputs = ", ".join(names[i] for i in strided)
            return f"{inputs}: its strides order, step over or overlap its dims differently"
        try:
            failed, sizes = self.first_failed(flat)
        except _ABSENT_READS:
            return "the entry with symbolic sizes reads a size of a tensor that an argument object no longer holds"
        if failed is None:
            return None
        if type(failed) is tuple:  # a size that shares a size input: equal to it
            failed = f"{symbolic_labels([failed[0]], names)} == {failed[1]}"
        labels = (symbolic_labels([at], names) for at in self._sources)
        values = ", ".join(f"{n} = {label} = {v}" for (n, v), label in zip(sizes.items(), labels))
        site = self.decided_at(failed)
        return f"the entry with symbolic sizes does not serve it: {failed} fails ({values}){site}"

    def first_failed(self, flat) -> tuple:
        """The first condition of ``check`` that a call of ``flat`` fails, as shown (a guard's text),
        and the sizes it read (``{name: value}``); ``(None, None)`` when it fails none."""
        source, scope, shown = self._explained
        if "explain" not in scope:  # compiled at the first miss that asks
            exec(compile(source, "<thunder_rs size guards>", "exec"), scope)
        index, sizes = scope["explain"](flat)
        if index is None:
            return None, None
        return (shown[index] if index < len(shown) else "a decision taken at the traced sizes"), sizes

    def decided_at(self, guard) -> str:
        """``, decided at ...`` naming where the program took the decision ``guard`` records."""
        return decided_at(self._decided.get(guard)) if type(guard) is str else ""


def decided_at(site) -> str:
    """``, decided at file:line in function (torch.op)`` for a guard's ``langctx.decision_site``,
    the op when a decomposition took the decision on the program's behalf; empty when unknown."""
    if site is None:
        return ""
    path, line, function, op = site
    return f", decided at {path}:{line} in {function}" + (f" ({op})" if op else "")


def _decided(tensor_key) -> tuple | None:
    """What a trace of a tensor that is not contiguous decided at the strides of its ``key``
    (``layouts.decided_by``), which every call an entry serves with other sizes or strides must
    keep; None for a contiguous tensor."""
    shape, strides = tensor_key[2], strides_in(tensor_key[2], tensor_key[4])
    return None if strides is None else decided_by(shape, strides)


def trace_guards(traces, backward_traces) -> list:
    """The guards of a compile's last forward and backward traces, as text, sorted."""
    return sorted({*traces[-1].guards(), *(backward_traces[-1].guards() if backward_traces else ())})


def symbolic_entry(entry, key, acquired, traces, guards) -> SymbolicEntry | None:
    """The ``SymbolicEntry`` of ``entry``, compiled for ``key`` from ``acquired`` into ``traces``,
    which checks ``guards`` on its size inputs; None when its sizes are all constant."""
    if not acquired.sizes:
        return None
    names = [f"t{v}" for v in traces[-1].size_inputs()]
    return SymbolicEntry(
        entry, key, acquired.sizes, acquired.shared_sizes, names, guards, acquired.size_checks, acquired.decided
    )


class SizesGuard:
    """The size guards of an entry whose sizes are read from argument objects' tensors
    (``SymbolicEntry.check``), among its guards: the cache key does not see those sizes change,
    so every call checks them."""

    per_call = True
    source = None

    def __init__(self, symbolic: SymbolicEntry):
        self.symbolic = symbolic

    def holds(self, flat) -> bool:
        return self.symbolic.holds(flat)

    def describe(self, flat) -> str:
        guards = ", ".join(self.symbolic.guards)
        try:
            failed, sizes = self.symbolic.first_failed(flat)
            site = self.symbolic.decided_at(failed)
        except _ABSENT_READS:
            failed, sizes, site = None, None, ""
        if type(failed) is str and failed not in self.symbolic.guards and sizes:  # a check (``keyed``)
            return f"{failed} fails ({', '.join(f'{n} = {v}' for n, v in sizes.items())})"
        return f"the sizes read from argument objects fail a guard of the trace ({guards}){site}"

    def term(self, index: int, scope: dict) -> str:
        scope[f"s{index}"] = self.symbolic.check
        return f"s{index}(flat)"


#: The class of an int argument's value, or a tensor argument's size, from 2 up in the keys of
#: ``IntClasses`` (0, 1 and negative values keep their own: a symbolic entry is specialised there,
#: its check fails them).
SYMBOLIC_INT = (int, "symbolic")


#: (classed, number of leaves) -> their ``class_key`` as a function made for them (it runs on
#: every hit of a new value: a loop rebuilding the leaves takes ~3 times as long)
_classers: dict = {}


def class_key(classed: tuple, leaves: int):
    """A function of a call's key of ``leaves`` flat leaves: the key with the int leaves at the flat
    positions ``(at, None)`` of ``classed``, and dims ``dims`` of the contiguous tensors of rank
    ``rank`` at ``(at, (rank, dims))``, replaced by ``SYMBOLIC_INT``; None where one is not an int
    from 2 up, or a tensor's is not a size from 2 up (no symbolic entry taking it serves the call)."""
    found = _classers.get((classed, leaves))
    if found is not None:
        return found
    if any(at >= leaves for at, _ in classed):  # (a key of other leaves: no call of it has them)
        return _no_class
    lines, names = [], {}
    for at, spec in classed:
        a = names[at] = f"a{at}"
        lines.append(f"{a} = leaves[{at}]")
        if spec is None:
            lines.append(f"if type({a}) is not tuple or len({a}) != 2 or {a}[0] is not int or {a}[1] < 2: return None")
            names[at] = "S"
            continue
        rank, dims = spec
        small = "".join(f" or s[{d}] < 2" for d in dims)
        shape = ", ".join("S" if d in dims else f"s[{d}]" for d in range(rank))
        lines.append(f"if type({a}) is not tuple or len({a}) < 5 or {a}[4] is not True: return None")
        lines.append(f"s = {a}[2]")
        lines.append(f"if type(s) is not Size or len(s) != {rank}{small}: return None")
        lines.append(f"{a} = ({a}[0], {a}[1], ({shape},), *{a}[3:])")
    rebuilt = ", ".join(names.get(at, f"leaves[{at}]") for at in range(leaves))
    body = "".join(f"    {line}\n" for line in lines)
    source = (
        f"def classed(key):\n    leaves = key[1]\n    if len(leaves) != {leaves}: return None\n"
        f"{body}    return (key[0], ({rebuilt},), *key[2:])\n"
    )
    scope = {"S": SYMBOLIC_INT, "Size": torch.Size}
    exec(compile(source, "<thunder_rs int classes>", "exec"), scope)
    _classers[classed, leaves] = scope["classed"]
    return scope["classed"]


def _classed(symbolic, leaves: tuple) -> tuple:
    """What ``class_key`` replaces for ``symbolic``'s calls of the key with ``leaves``: its int
    arguments, and the dims of its contiguous tensors (the sizes of a strided one stay in the key)."""
    dims: dict = {}
    for at, d in symbolic.dims:
        if d is None:
            dims[at] = None
        elif type(d) is int and at < len(leaves) and is_tensor_key(leaves[at]) and leaves[at][4] is True:
            dims.setdefault(at, set()).add(d)
    return tuple(sorted((at, d if d is None else (len(leaves[at][2]), tuple(sorted(d)))) for at, d in dims.items()))


def _no_class(key) -> None:
    return None


class IntClasses:
    """Symbolic entries found by the class of a call's key (``class_key`` of the int arguments
    each takes symbolic): a call differing from an entry's key only in those ints (a step counter,
    a decode position) finds it by one lookup and the entry's checks (``SymbolicEntry.holds``, its
    guards), with no key of its own stored (one per value would fill the cache, evicting the
    entries of other shapes). ``tables``: ``((class_key of some positions, {class key: (entries,)}),
    ...)``, replaced whole on change (read without the lock)."""

    __slots__ = ("tables",)

    def __init__(self):
        self.tables: tuple = ()

    def add(self, symbolic: SymbolicEntry, key, stored, first: bool = False) -> bool:
        """Adds ``symbolic`` for the calls of ``key``'s class (``stored(class key)`` as stored),
        where ``key`` differs from its own only in symbolic sizes, ``first`` of them: tried before
        the others; whether it did."""
        changed = changed_dims(symbolic.key, key)
        if changed is None or not (changed or first) or any(type(d) is tuple for _, d in changed):
            return False
        classed = _classed(symbolic, key[1])
        if not classed:
            return False
        classer = class_key(classed, len(key[1]))
        classed = classer(key)  # (the call's key, as its class)
        if classed is None:
            return False
        tables = dict(self.tables)
        table = dict(tables.get(classer, {}))
        found = table.get(classed, ())
        if first:
            table[stored(classed)] = (symbolic, *(f for f in found if f is not symbolic))
        elif symbolic not in found:
            table[stored(classed)] = (*found, symbolic)
        tables[classer] = table
        self.tables = tuple(tables.items())
        return True

    def find(self, key, flat):
        """The entry of the first symbolic entry of ``key``'s class whose checks ``flat`` passes, or None."""
        for classer, table in self.tables:
            classed = classer(key)
            if classed is None:
                continue
            for symbolic in table.get(classed, ()):
                entry = symbolic.entry
                if symbolic.holds(flat) and (entry.check is None or entry.check(flat)):
                    return entry
        return None

    def first(self, key):
        """The entry of the first symbolic entry of ``key``'s class, whatever its checks (the entry
        whose failed guard a miss of ``key`` names), or None."""
        for classer, table in self.tables:
            classed = classer(key)
            found = table.get(classed, ()) if classed is not None else ()
            if found:
                return found[0].entry
        return None

    def drop(self, dead) -> None:
        """Drops the classes whose key ``dead(key)``."""
        self.tables = tuple((at, {k: v for k, v in table.items() if not dead(k)}) for at, table in self.tables)
