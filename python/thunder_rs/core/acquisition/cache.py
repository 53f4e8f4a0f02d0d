"""Cache keys over flattened inputs and global state, and miss reasons."""

import inspect
import types
import weakref
from typing import cast

import numpy
import torch
from torch.utils import _pytree as pytree

from thunder_rs.core.acquisition.written_only import Written
from thunder_rs.core.base.layouts import describe
from thunder_rs.core.state.guards import NUMPY_SCALARS, freeze, is_simple
from thunder_rs.core.state.tensor_guards import META_NAMES, NOT_A_LEAF, meta_source
from thunder_rs.core.state.code_reads import interesting
from thunder_rs.core.lang.recorder import refuse_unlike_strided

from thunder_rs.core.lang.autocast import state as autocast_state

_Tensor = torch.Tensor
_Generator = torch.Generator
#: Non-tensor inputs keyed by identity: code and modules.
_BY_IDENTITY = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    type,
    types.ModuleType,
    torch.nn.Module,
)


class _Identity:
    """An object in a cache key by identity. A lookup's key holds it; the key an entry is stored
    under holds it weakly where it can (``stored_key``), so that a compiled entry never keeps a
    program's argument alive (a KV cache and its tensors, one per ``generate``)."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def target(self):
        return self.obj

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        # A dead weak identity equals nothing: its id may be a new object's by now.
        return isinstance(other, _Identity) and (target := self.target()) is not None and other.target() is target

    def __repr__(self):
        target = self.target()
        return f"<{type(target).__name__} object at {hash(self):#x}>" if target is not None else "<a dead object>"


class _WeakIdentity(_Identity):
    """An identity in a stored key: its object held weakly, ``on_death`` called when it dies."""

    __slots__ = ("ref", "hash")

    def __init__(self, obj, on_death):
        self.ref, self.hash = weakref.ref(obj, on_death), id(obj)

    def target(self):
        return self.ref()

    def __hash__(self):
        return self.hash


def stored_key(key, on_death):
    """``key`` as an entry is stored under it: each identity whose object allows a weak reference
    held weakly (``on_death`` called when the object dies). Equal to ``key``, and so found by
    lookups with the keys of later calls."""
    if type(key) is tuple:
        return tuple(stored_key(k, on_death) for k in key)
    if type(key) is _Identity:
        try:
            return _WeakIdentity(key.obj, on_death)
        except TypeError:  # no weak references to it: the key keeps it alive, so its id is never reused
            return key
    return key


def has_dead(key) -> bool:
    """Whether an object ``key`` holds by identity has died: no later call can match it."""
    if type(key) is tuple:
        return any(has_dead(k) for k in key)
    return type(key) is _WeakIdentity and key.ref() is None


#: Protocols through which a program reads an object other than by attribute (``x in s``,
#: ``a[0]``, ``len(a)``, ``f()``): reads the guards do not see.
_OPAQUE_READS = ("__getitem__", "__iter__", "__len__", "__contains__", "__call__", "__array__")
_attribute_types: dict = {}


def _observed(method) -> bool:
    """Whether a call of ``method`` is seen by the observer with the reads its body makes: a
    Python function of the program or another library, not C code and not torch's or the
    standard library's (``collections.abc``'s mixins read through ``__getitem__`` unseen)."""
    return type(method) is types.FunctionType and interesting(method.__code__)


def _read_by_attributes(x) -> bool:
    """Whether the program can read ``x`` only through attributes (a config object, a dataclass,
    a KV cache whose ``__getitem__`` and ``__len__`` are Python methods reading its attributes),
    which the observer guards; decided once per type."""
    t = type(x)
    known = _attribute_types.get(t)
    if known is None:
        opaque = (c.__dict__[m] for c in t.__mro__[:-1] for m in _OPAQUE_READS if m in c.__dict__)
        known = _attribute_types[t] = all(_observed(method) for method in opaque)
    return known and isinstance(getattr(x, "__dict__", None), dict)


def is_runtime_generator(x) -> bool:
    """Whether ``x`` is a ``torch.Generator`` each call draws from as its own argument
    (``generator_inputs``): a CPU or CUDA one, not a default generator (which the program draws
    from also without naming it, and which stays keyed by identity)."""
    if type(x) is not _Generator:
        return False
    device = x.device
    if device.type == "cpu":
        return x is not torch.default_generator
    return device.type == "cuda" and all(x is not d for d in torch.cuda.default_generators)


#: ``leaf_key``'s source, whose tensor case is ``tensor_meta``'s expression inline (calling it
#: would cost each tensor of a key ~30 ns).
_LEAF_KEY = f"""
def leaf_key(x):
    if isinstance(x, _Tensor):
        if x.layout != torch.strided or x.is_nested:
            refuse_unlike_strided(x)
        return {meta_source("x")}
    if type(x) is _Generator and is_runtime_generator(x):
        return (_Generator, x.device)
    if type(x) is Written:
        return (Written, x)
    if is_simple(x):
        return freeze(x)
    if not isinstance(x, _BY_IDENTITY) and _read_by_attributes(x):
        return (type(x),)
    return (type(x), _Identity(x))
"""


def _leaf_key():
    namespace = {
        **META_NAMES,
        "torch": torch,
        "_Tensor": _Tensor,
        "_Generator": _Generator,
        "_BY_IDENTITY": _BY_IDENTITY,
        "_Identity": _Identity,
        "Written": Written,
        "refuse_unlike_strided": refuse_unlike_strided,
        "is_runtime_generator": is_runtime_generator,
        "is_simple": is_simple,
        "freeze": freeze,
        "_read_by_attributes": _read_by_attributes,
    }
    exec(_LEAF_KEY, namespace)
    return namespace["leaf_key"]


leaf_key = _leaf_key()
leaf_key.__doc__ = """A tensor's metadata (``TENSOR_FIELDS``: ``tensor_guards.tensor_meta``); a generator
    each call draws from by its device (``is_runtime_generator``); a simple value itself (type-exact,
    NaN equal to NaN); an object read only through attributes by its type alone, as the attributes
    the program reads from it are guarded (a fresh config object each call hits the cache when its
    values are the same); a container the program only writes into (``written_only.Written``,
    kept for the process) by itself; any other object (a function, a module, a set, a NumPy array) by identity."""


#: What a tensor's key holds, in order (``tensor_guards.META_EXPRESSION``). Whether it is an inference tensor
#: (made under ``torch.inference_mode()``) decides what eager does with it outside inference mode:
#: an op that saves it for backward raises, as does an in-place write to it
#: (``core.lang.inference``). requires_grad is ``NOT_A_LEAF`` for a tensor that requires grad and
#: is not a leaf (eager's ``is_leaf``, and its refusal of in-place writes to a leaf). The type tells
#: a ``Parameter`` (``isinstance``) and a subclass whose ``__torch_function__`` the compile refuses.
#: (A tensor's Python attributes are not: a program that reads one is guarded on it.)
TENSOR_FIELDS = ("dtype", "device", "shape", "requires_grad", "layout", "inference", "type")

_CPU = torch.device("cpu")


def _default_device() -> torch.device | None:
    """torch's default device where it is not the CPU: factory calls without a device put their
    tensors there. Only a torch function mode sets it (``torch.set_default_device`` pushes one, as
    a ``with torch.device(...)`` block does), so with none active nothing more is read."""
    device = torch.get_default_device()
    return None if device == _CPU else device


#: What ``global_key`` reads, by the names its source (``GLOBAL_STATE``) calls them.
_STATE_READS = {
    "_grad": torch.is_grad_enabled,
    "_default_dtype": torch.get_default_dtype,
    "_any_autocast": torch._C._is_any_autocast_enabled,
    "_autocast": autocast_state,
    "_modes": torch._C._len_torch_function_stack,
    "_inference": torch.is_inference_mode_enabled,
    "_default_device": _default_device,
    "_forward_ad": torch.autograd.forward_ad,
}
_FORWARD_AD, _NO_TORCH_FUNCTION, _unpack = torch.autograd.forward_ad, torch._C.DisableTorchFunction, torch._unpack_dual
#: ``global_key``'s value as an expression, which the unrolled key functions inline (no frame of
#: its own on the hit path).
GLOBAL_STATE = (
    "(_grad(), _default_dtype(), _autocast() if _any_autocast() else None, "
    "_default_device() if _modes() else None, extra, _inference(), aliases, "
    "-1 if _forward_ad._current_level < 0 else _duals(flat))"
)


def _dual(x, level: int) -> bool:
    return isinstance(x, _Tensor) and _unpack(x, level)[1] is not None


def forward_ad_duals(flat) -> tuple:
    """The forward-AD level the caller is in and which of the tensor inputs ``flat`` are duals of
    it (carry a tangent there), read only inside a level (``_unpack_dual``: ~0.7 us a tensor): a
    program traced with a plain input does not carry a dual's tangent, and one traced with a dual
    is refused or carries it (``core.lang.dual_tensors``)."""
    level = _FORWARD_AD._current_level
    with _NO_TORCH_FUNCTION():
        return level, tuple([i for i, x in enumerate(flat) if _dual(x, level)])


def compiled_key(source: str, name: str, **names):
    """The function ``name`` that ``source`` defines, with ``global_key``'s reads (``GLOBAL_STATE``)
    and ``layout`` in its namespace, and ``names``."""
    namespace = {**_STATE_READS, "_duals": forward_ad_duals, **META_NAMES, **names}
    exec(source, namespace)
    return namespace[name]


def tensor_key_source(name: str) -> str:
    """``leaf_key`` of the strided tensor ``name`` as an expression (the unrolled key functions
    inline it: ``tensor_guards.META_EXPRESSION``). A sparse tensor raises RuntimeError in it: their
    callers then take the general path, whose ``leaf_key`` says why it is refused."""
    return meta_source(name)


global_key = compiled_key(
    f"def global_key(extra=None, aliases=None, flat=()):\n  return {GLOBAL_STATE}\n", "global_key"
)
global_key.__doc__ = """Grad mode, default dtype, the CPU and CUDA autocast dtypes (None when autocast is off
    everywhere, read with one call), the default device where a torch function mode may set one,
    ``extra``, inference mode (a call under ``torch.inference_mode()`` makes inference tensors
    where one under ``no_grad`` does not, and records no gradient even where the program enables
    grad mode), ``aliases`` (``tensor_aliases``: which tensor arguments are one tensor), and the
    forward-mode AD level the caller is in (``torch.autograd.forward_ad``: -1 outside one; a program's
    ``make_dual`` is traced at it) with which of the call's inputs ``flat`` are duals of it
    (``forward_ad_duals``)."""


def tensor_aliases(flat) -> tuple | None:
    """Which flat inputs are a tensor (or a generator) passed before, ``((position, first
    position), ...)``; None when the tensors are distinct objects. Eager programs branch on it
    (``query is key`` in ``nn.MultiheadAttention``), and the trace takes one tensor passed twice as
    one input (one generator passed twice as one stand-in, ``generator_inputs``: its draws follow
    one another), so it is part of the key."""
    ids = [id(x) for x in flat if isinstance(x, _Tensor) or type(x) is _Generator]
    if len(set(ids)) == len(ids):
        return None
    first: dict = {}
    repeated = []
    for i, x in enumerate(flat):
        if isinstance(x, _Tensor) or type(x) is _Generator:
            at = first.setdefault(id(x), i)
            if at != i:
                repeated.append((i, at))
    return tuple(repeated)


def repeated_term(names: list, together: str) -> str:
    """A term true when two of the objects ``names`` (``together``: a tuple of them) are one:
    pairwise ``is`` for a few, a set of ids for more (36 ``is`` cost less than a set of 9 ids, ~0.4
    against ~0.9 us)."""
    if len(names) <= 9:
        return " or ".join(f"{a} is {b}" for i, a in enumerate(names) for b in names[i + 1 :])
    return f"len(set(map(id, {together}))) < {len(names)}"


def _unrolled_key(arity: int):
    """The key function of ``fast_key_fn`` for ``arity`` tensor arguments."""
    names = [f"a{i}" for i in range(arity)]
    leaves = "".join(f"{tensor_key_source(n)}, " for n in names)
    unpack = f"{', '.join(names)}, = args" if arity else "pass"
    aliases = f"tensor_aliases(args) if {repeated_term(names, 'args')} else None" if arity > 1 else "None"
    # (The leaves first: a call with a non-tensor argument raises before global state is read.)
    source = f"def key(args, extra):\n  {unpack}\n  leaves = ({leaves})\n  aliases = {aliases}\n"
    source += f"  return ({GLOBAL_STATE.replace('(flat)', '(args)')}, leaves)\n"
    return compiled_key(source, "key", tensor_aliases=tensor_aliases)


class _KeyFunctions(dict):
    def __missing__(self, arity: int):
        fn = self[arity] = _unrolled_key(arity)
        return fn


#: ``fast_key_fn(arity)``: a key function for ``arity`` tensor arguments, unrolled so the hit path
#: runs no loop (nor a frame to find it). It raises AttributeError when an argument is not a
#: tensor; callers then take the general path.
fast_key_fn = _KeyFunctions().__getitem__


def _parameters(fn) -> list[str]:
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def input_names(fn, flat, spec) -> list[str]:
    """The user's name of each flat input: ``x``, ``batch['input_ids']``, ``args[3]`` (slow path);
    positional (``args[i]``) where a pytree node type registered without ``flatten_with_keys_fn``
    cannot name its children."""
    args, kwargs = pytree.tree_unflatten(list(flat), spec)
    params = _parameters(fn)
    names = []
    try:
        paths = pytree.tree_flatten_with_path((args, kwargs))[0]
    except ValueError:
        return [f"args[{i}]" for i in range(len(flat))]
    for path, _ in paths:
        entry = path[1]  # the positional argument's index under args, or the keyword's under kwargs
        if isinstance(entry, pytree.SequenceKey):
            i = entry.idx
            base = params[i] if i < len(params) else f"args[{i}]"
        else:
            base = str(cast(pytree.MappingKey, entry).key)
        value = args[entry.idx] if isinstance(entry, pytree.SequenceKey) else kwargs[base]
        # A dict the program reads at constant keys, keyed as ``(Written, its items read)``: its items.
        projected = type(value) is tuple and bool(value) and type(value[0]) is Written
        names.append(base + pytree.keystr(path[3:] if projected else path[2:]))
    return names


def _show(key) -> str:
    """A leaf key in words."""
    if type(key) is tuple and len(key) == 2 and key[0] is float:
        return "a float input" if key[1] is None else repr(float.fromhex(key[1]))
    if type(key) is tuple and len(key) == 2 and key[0] in NUMPY_SCALARS:  # (its type, its bits)
        return f"a {key[0].__name__} input" if key[1] is None else repr(numpy.frombuffer(key[1], key[0])[0])
    if type(key) is tuple and len(key) == 2 and key[0] is _Generator and type(key[1]) is torch.device:
        return f"a torch.Generator on {key[1]}"
    if type(key) is tuple and len(key) in (1, 2) and isinstance(key[0], type):
        return repr(key[-1]) if len(key) == 2 else f"a {key[0].__name__}"
    return repr(key)


def _tensor_words(key) -> tuple:
    """A tensor's key with its requires_grad, layout (``core.base.layouts``) and type in words."""
    dtype, device, shape, grad, arranged, inference, kind = key
    grad = "True (not a leaf)" if grad == NOT_A_LEAF else grad
    return (dtype, device, shape, grad, describe(arranged), inference, kind.__qualname__)


def _one_tensor(aliases, names) -> str:
    """``tensor_aliases`` in words (``key is query``); ``names`` labels flat inputs."""
    if aliases is None:
        return "none"
    label = lambda i: names[i] if i < len(names) else f"input {i}"  # noqa: E731
    return "(" + ", ".join(f"{label(i)} is {label(j)}" for i, j in aliases) + ")"


def _duals_in_words(state, names) -> str:
    if state == -1:
        return "none"
    label = lambda i: names[i] if i < len(names) else f"input {i}"  # noqa: E731
    return f"level {state[0]} with duals ({', '.join(map(label, state[1]))})"


def _state_change(old, new, names=()) -> str:
    """Which part of ``global_key`` changed: grad mode, default dtype, autocast, default device, or
    (for a module) its training mode or its parameters' dtype, device, requires_grad and sizes."""
    labels = ("grad mode", "default dtype", "autocast", "default device")
    changes = [f"{label} {a} -> {b}" for label, a, b in zip(labels, old, new) if a != b]
    if old[5] != new[5]:
        changes.append(f"inference mode {old[5]} -> {new[5]}")
    if old[6] != new[6]:
        before, after = _one_tensor(old[6], names), _one_tensor(new[6], names)
        changes.append(f"tensor arguments that are one tensor {before} -> {after}")
    if old[7:] != new[7:]:
        before, after = _duals_in_words(old[7], names), _duals_in_words(new[7], names)
        changes.append(f"forward AD level and dual inputs {before} -> {after}")
    old_extra, new_extra = old[4], new[4]
    if old_extra != new_extra:
        if type(old_extra) is tuple and type(new_extra) is tuple and 2 <= len(old_extra) and 2 <= len(new_extra):
            old_duals, new_duals = old_extra[2:] or ((),), new_extra[2:] or ((),)
            if old_duals != new_duals:
                changes.append(f"the module's tensors that are forward-AD duals {old_duals[0]} -> {new_duals[0]}")
            if old_extra[0] != new_extra[0]:
                changes.append(f"module training {old_extra[0]} -> {new_extra[0]}")
            if getattr(old_extra[1], "structure", None) != getattr(new_extra[1], "structure", None):
                changes.append(
                    "the module's structure changed back to one it had (whose entries did not serve the call)"
                )
            old_params, new_params = _per_tensor(old_extra[1]), _per_tensor(new_extra[1])
            moved = [i for i, (a, b) in enumerate(zip(old_params, new_params)) if a != b]
            if moved or len(old_params) != len(new_params):
                first = moved[0] if moved else None
                detail = (
                    (
                        f" (the first: parameter {first}, (dtype, device, requires_grad, sizes) "
                        f"{old_params[first]} -> {new_params[first]})"
                    )
                    if first is not None
                    else ""
                )
                changes.append(f"{len(moved)} of the module's parameters and buffers changed{detail}")
        else:
            changes.append(f"{old_extra} -> {new_extra}")
    return "global state changed: " + "; ".join(changes)


def _per_tensor(metadata) -> tuple:
    """The tuple a module's ``ParameterMetadata`` (``core.state.param_metadata``) stands for."""
    return getattr(metadata, "per_tensor", metadata)


def is_tensor_key(k) -> bool:
    """Whether ``k`` is a tensor's key (``leaf_key``)."""
    return type(k) is tuple and len(k) == len(TENSOR_FIELDS) and type(k[2]) is torch.Size


def describe_change(old, new, names) -> str:
    """Says which input changed how between two keys (``names`` labels flat inputs)."""
    if old is None:
        return "first call"
    (old_state, old_leaves), (new_state, new_leaves) = old, new
    if old_state != new_state:
        return _state_change(old_state, new_state, names)
    if len(old_leaves) != len(new_leaves):
        return f"number of inputs changed from {len(old_leaves)} to {len(new_leaves)}"
    for i, (a, b) in enumerate(zip(old_leaves, new_leaves)):
        if a == b:
            continue
        label = names[i] if i < len(names) else f"input {i}"
        if is_tensor_key(a) and is_tensor_key(b):
            a, b = _tensor_words(a), _tensor_words(b)
            changes = [f"{f} {x} -> {y}" for f, x, y in zip(TENSOR_FIELDS, a, b) if x != y]
            return f"{label}: " + ", ".join(changes)
        return f"{label}: {_show(a)} -> {_show(b)}"
    # (Equal state and leaves: the keys differ in how the arguments nest.)
    return "the arguments' structure changed (a list for a tuple, a dict's keys or their order, a node type)"
