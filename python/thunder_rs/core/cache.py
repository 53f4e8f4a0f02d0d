"""Cache keys over flattened inputs and global state, and miss reasons."""

import torch

from thunder_rs.core.autocast import state as autocast_state

_Tensor = torch.Tensor


def leaf_key(x):
    if isinstance(x, _Tensor):
        return (x.dtype, x.device, x.shape, x.requires_grad, x.is_contiguous())
    try:
        hash(x)
    except TypeError:
        return (type(x), id(x))
    return (type(x), x)


def global_key(extra=None, _grad=torch.is_grad_enabled, _default_dtype=torch.get_default_dtype,
               _any_autocast=torch._C._is_any_autocast_enabled, _autocast=autocast_state):
    """Grad mode, default dtype, the CPU and CUDA autocast dtypes (None when autocast is off
    everywhere, read with one call) and ``extra``."""
    return (_grad(), _default_dtype(), _autocast() if _any_autocast() else None, extra)


_fast_keys: dict = {}


def fast_key_fn(arity: int):
    """A key function for ``arity`` tensor arguments, unrolled so the hit path runs no loop.

    It raises AttributeError when an argument is not a tensor; callers then take the general path.
    """
    fn = _fast_keys.get(arity)
    if fn is None:
        names = [f"a{i}" for i in range(arity)]
        leaves = "".join(f"({n}.dtype, {n}.device, {n}.shape, {n}.requires_grad, {n}.is_contiguous()), " for n in names)
        unpack = f"{', '.join(names)}, = args" if arity else "pass"
        source = f"def key(args, extra):\n  {unpack}\n  return (global_key(extra), ({leaves}))\n"
        namespace = {"global_key": global_key}
        exec(source, namespace)
        fn = _fast_keys[arity] = namespace["key"]
    return fn


def describe_change(old, new, names) -> str:
    """Says which input changed how between two keys (``names`` labels flat inputs)."""
    if old is None:
        return "first call"
    (old_state, old_leaves), (new_state, new_leaves) = old, new
    if old_state != new_state:
        return f"global state changed from {old_state} to {new_state}"
    if len(old_leaves) != len(new_leaves):
        return f"number of inputs changed from {len(old_leaves)} to {len(new_leaves)}"
    fields = ("dtype", "device", "shape", "requires_grad", "contiguity")
    for i, (a, b) in enumerate(zip(old_leaves, new_leaves)):
        if a == b:
            continue
        label = names[i] if i < len(names) else f"input {i}"
        if len(a) == 5 and len(b) == 5:
            changes = [f"{f} {x} -> {y}" for f, x, y in zip(fields, a, b) if x != y]
            return f"{label}: " + ", ".join(changes)
        return f"{label}: {a[-1]!r} -> {b[-1]!r}"
    return "unknown"
