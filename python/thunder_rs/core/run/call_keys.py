"""Cache keys of calls by their structure: keyword arguments, numbers, None, tuples and dicts.

A call the positional fast path (``cache.fast_key_fn``) does not take is keyed as the general path
keys it, ``(global_key(extra, tensor_aliases(flat)), tuple(map(leaf_key, flat)), spec)``, without
flattening it: a function made per call structure (the types of the positional arguments, the
keywords in order and the types of their values) unpacks the arguments as the flatten of its
first call found them, checks the types and lengths of what nests (a tuple of tensors, a dict's
keys), keys a tensor as the fast path does and every other leaf with ``leaf_key``, and returns
the key with the spec of that first call, and the leaves in the flatten's order. A call that nests
otherwise is handed to the function made before for its structure, or one is made for it (a few
per structure), or it gets None: the general path keys it.

Only tuples, lists and dicts are opened; a structure with another node type (a namedtuple, an
OrderedDict, a Hugging Face ``ModelOutput``), or one that the flatten of its first call sees
otherwise, stays on the general path. Which types are leaves is decided by the flatten
(``callflat``), once per structure: the functions are dropped when keyword calls switch flatten
or torch's pytree registers a node type.
"""

import torch
from torch.utils import _pytree as pytree

from thunder_rs.core.acquisition.cache import (
    GLOBAL_STATE,
    compiled_key,
    leaf_key,
    repeated_term,
    tensor_aliases,
    tensor_key_source,
)
from thunder_rs.core.acquisition.written_only import Written
from thunder_rs.core.run import callflat

#: Containers a key function opens (exact types: a subclass may be a namedtuple, a node of its own).
_OPENED = (tuple, list, dict)
#: Tensors keyed inline as the fast path keys them; a subclass's leaves are keyed by ``leaf_key``.
_INLINE_TENSORS = (torch.Tensor, torch.nn.Parameter)
#: ``leaf_key`` of a leaf of these exact types (``guards.freeze``) as an expression of it, inlined
#: (a call of ``leaf_key`` costs a key ~0.2 us a leaf): the structure and the unpacking check
#: each leaf's type.
_INLINE_LEAVES = {
    int: "(int, {})",
    bool: "(bool, {})",
    str: "(str, {})",
    type(None): "(NoneType, {})",
    float: "(float, {}.hex())",
    Written: "(Written, {})",
}
#: The most tensor and generator leaves whose aliases a key function finds by ``is`` inline
#: (``_aliases_source``: a pair each); past them, ``tensor_aliases`` where two are one object.
INLINED_ALIASES = 9
#: Structures kept before all are dropped (a program calling with ever new argument types).
MAX_STRUCTURES = 256
#: Key functions one structure may have for what its calls nest (a list of 2 tensors, then of 3):
#: past them, its calls that nest otherwise are keyed by the general path.
MAX_NESTINGS = 4

#: structure -> its key function made last (which hands a call nesting otherwise to the one before)
_functions: dict = {}
#: structure -> how many key functions it has
_made: dict = {}
#: The flatten and the number of torch's pytree node types the functions in ``_functions`` follow.
_made_for: list = [None, -1]


def call_key(args, kwargs, extra, structure=None):
    """``(key, flat)`` of the call, as ``ThunderFunction._call_general`` keys and flattens it, or
    None where the general path must (a structure not opened here, a sparse tensor). ``extra``:
    what ``global_key`` holds besides global state (a module's); ``structure``: ``structure_of``
    the call, where the caller has it."""
    if _made_for[0] is not callflat._flatten[0] or _made_for[1] != len(pytree.SUPPORTED_NODES):
        _forget()
    if structure is None:
        structure = structure_of(args, kwargs)
    fn = _functions.get(structure) or _another(structure, args, kwargs)
    try:
        keyed = fn(args, kwargs, extra)
        if keyed is None and _made.get(structure, MAX_NESTINGS) < MAX_NESTINGS:
            keyed = _another(structure, args, kwargs)(args, kwargs, extra)
    except RuntimeError:  # a sparse tensor has no strides: the general path's ``leaf_key`` says why
        return None
    return keyed or None  # (False: a nesting the general path keys)


def structure_of(args, kwargs) -> tuple:
    """What a call's key function is made for: the types of its positional arguments, its
    keywords in order and the types of their values (of a call without keywords, the types of
    its arguments)."""
    return (*map(type, args), *kwargs, *map(type, kwargs.values())) if kwargs else tuple(map(type, args))


def _forget() -> None:
    """Drops every key function (keyword calls switched flatten, or a pytree node type was
    registered: a type kept as a leaf may be a node now)."""
    _functions.clear()
    _made.clear()
    _made_for[:] = callflat._flatten[0], len(pytree.SUPPORTED_NODES)


def _another(structure: tuple, args, kwargs):
    """A key function for the call of ``structure`` and what it nests, in front of its others."""
    if len(_functions) >= MAX_STRUCTURES:
        _forget()
    fn = _functions[structure] = key_function(args, kwargs, _functions.get(structure, _general))
    _made[structure] = _made.get(structure, 0) + 1
    return fn


def _general(args, kwargs, extra) -> None:
    """The last key function of every structure: None for a call nesting as none before it."""
    return None


class _Source:
    """The body of a key function being written: its lines, the constants it names, and its
    leaves in order (each an expression and the object of the call it was written for)."""

    def __init__(self):
        self.lines: list[str] = []
        self.constants: dict = {}
        self.leaves: list[tuple[str, object]] = []
        self.count = 0

    def local(self) -> str:
        self.count += 1
        return f"v{self.count - 1}"

    def constant(self, value) -> str:
        name = f"c{len(self.constants)}"
        self.constants[name] = value
        return name

    def unpack(self, values: list, container: str, conditions: list) -> None:
        """Unpacks ``container`` (``values`` in the call) into new locals, after ``conditions``,
        and goes on into each value, checking its type."""
        if conditions:
            self.lines.append(f"if {' or '.join(conditions)}: return other(args, kwargs, extra)")
        names = [self.local() for _ in values]
        if names:
            self.lines.append(f"{', '.join(names)}, = {container}")
        checks = [f"type({n}) is not {self.constant(type(v))}" for n, v in zip(names, values)]
        if checks:
            self.lines.append(f"if {' or '.join(checks)}: return other(args, kwargs, extra)")
        for name, value in zip(names, values):
            self.visit(value, name)

    def visit(self, value, name: str) -> None:
        """Writes the opening of ``value`` (the local ``name``, its type checked) or keeps it a leaf."""
        kind = type(value)
        if kind is dict:
            keys = self.constant(tuple(value))
            self.unpack(list(value.values()), f"{name}.values()", [f"tuple({name}) != {keys}"])
        elif kind in _OPENED:
            self.unpack(list(value), name, [f"len({name}) != {len(value)}"])
        else:
            self.leaves.append((name, value))


def key_function(args, kwargs, other=_general):
    """The key function of the call's structure and nesting (``call_key``), which hands a call
    nesting otherwise to ``other``. Where the flatten finds other leaves (a namedtuple, an
    OrderedDict: node types not opened here), it returns False for calls nesting so."""
    source = _Source()
    names = [source.local() for _ in (*args, *kwargs)]
    if args:
        source.lines.append(f"{', '.join(names[: len(args)])}, = args")
    if kwargs:
        source.lines.append(f"{', '.join(names[len(args) :])}, = kwargs.values()")
    for name, value in zip(names, (*args, *kwargs.values())):
        source.visit(value, name)
    flat, spec = callflat.flatten_call(args, kwargs)
    keyed = _same_leaves(source, flat, args, kwargs)
    namespace = {
        "leaf_key": leaf_key,
        "tensor_aliases": tensor_aliases,
        "spec": spec,
        "other": other,
        "NoneType": type(None),
        "Written": Written,
    }
    return compiled_key(_written(source, keyed), "key", **namespace, **source.constants)


def _same_leaves(source: _Source, flat: list, args, kwargs) -> bool:
    """Whether the flatten finds the leaves ``source`` does, in its order: the call's objects (the
    types kept as leaves are leaves), and distinct stand-ins in their place (the order is not
    that of a dict's sorted keys, which equal leaves would hide)."""
    leaves = [value for _, value in source.leaves]
    if len(flat) != len(leaves) or any(a is not b for a, b in zip(flat, leaves)):
        return False
    marked = [object() for _ in leaves]
    stand_ins = iter(marked)
    probe = _replaced((args, kwargs), lambda: next(stand_ins))
    found, _ = callflat.flatten_call(*probe)
    return len(found) == len(marked) and all(a is b for a, b in zip(found, marked))


def _replaced(value, stand_in):
    """``value`` with each leaf (as ``_Source.visit`` finds them, in its order) ``stand_in()``."""
    kind = type(value)
    if kind is dict:
        return {k: _replaced(v, stand_in) for k, v in value.items()}
    if kind in _OPENED:
        return kind(_replaced(v, stand_in) for v in value)
    return stand_in()


def _aliases_source(identities: list) -> str:
    """``tensor_aliases(flat)`` where two of the tensor and generator leaves (``(flat position,
    local)`` in order, their types checked) are one object, as an expression: for each, the first
    earlier leaf that is the same object, by ``is`` (~15 ns a pair, where ``tensor_aliases`` takes
    ~1 us at five leaves)."""
    pairs = []
    for k, (position, name) in enumerate(identities[1:], start=1):
        found = " else ".join(f"({position}, {at}) if {name} is {other}" for at, other in identities[:k])
        pairs.append(f"({found} else None)")
    return f"tuple(filter(None, ({', '.join(pairs)},)))"


def _written(source: _Source, keyed: bool) -> str:
    """The key function's source: the unpacking and checks, then the aliases, the key and the
    leaves (``keyed``), or False."""
    if not keyed:
        return "def key(args, kwargs, extra):\n" + "".join(f"  {line}\n" for line in (*source.lines, "return False"))
    keys, identities = [], []
    for position, (name, value) in enumerate(source.leaves):
        kind = type(value)
        if kind in _INLINE_TENSORS:
            keys.append(tensor_key_source(name))
        else:
            keys.append(_INLINE_LEAVES.get(kind, "leaf_key({})").format(name))
        if isinstance(value, torch.Tensor) or kind is torch.Generator:
            identities.append((position, name))
    flat = f"[{', '.join(name for name, _ in source.leaves)}]"
    if len(identities) > 1:
        names = [name for _, name in identities]
        together = "(" + "".join(f"{name}, " for name in names) + ")"
        found = _aliases_source(identities) if len(identities) <= INLINED_ALIASES else "tensor_aliases(flat)"
        aliases = f"{found} if {repeated_term(names, together)} else None"
    else:
        aliases = "None"
    body = [
        *source.lines,
        f"flat = {flat}",
        f"aliases = {aliases}",
        f"return ({GLOBAL_STATE}, ({''.join(k + ', ' for k in keys)}), spec), flat",
    ]
    return "def key(args, kwargs, extra):\n" + "".join(f"  {line}\n" for line in body)
