"""Flattening a keyword call's arguments on the per-call path.

``torch.utils._pytree`` is pure Python (several µs per keyword call); ``torch.utils._cxx_pytree``
is optree under torch's namespace, which sees every node type registered through torch's
``register_pytree_node`` (Hugging Face ``ModelOutput`` included) and keeps dict insertion order.
Its spec is only the cache key; compiling still takes torch's own ``TreeSpec``, and a type known to
torch's pytree but not to optree (leaves differing) switches this process back to torch's pytree.

optree takes about 20 ms to import, a fifth of what ``import thunder_rs`` may cost (issue 25), and
only keyword calls use it: the first one loads it (torch queues the node types registered before
then and hands them to optree as it loads), and from then on ``_flatten`` holds optree's flatten
itself, so a call costs what it did with optree imported up front.
"""

import weakref

from torch.utils import _pytree as pytree

from thunder_rs.core.base.lazy import LazyModule

#: None where torch found no usable optree (missing, or older than torch needs): torch's pytree only.
_CXX_PYTREE = LazyModule("torch.utils._cxx_pytree") if pytree._cxx_pytree_exists else None


def _first_flatten(tree):
    """Loads optree and flattens with it from then on (with torch's pytree if it fails to load)."""
    try:
        flatten = _CXX_PYTREE.load().tree_flatten
    except ImportError:
        flatten = pytree.tree_flatten
    if _flatten[0] is _first_flatten:  # another thread may have switched to torch's pytree meanwhile
        _flatten[0] = flatten
    return _flatten[0](tree)


#: The flatten keyword calls take: optree's once loaded, torch's pytree after a fallback.
_flatten = [_first_flatten if _CXX_PYTREE is not None else pytree.tree_flatten]


class SpecKey:
    """A call's spec as its cache key holds it: one object per distinct spec (``key_of``), hashed
    and compared by identity. An optree spec hashes its whole tree on each hash (~0.2 us a lookup,
    as tuples do not keep their hash); the key functions of ``call_keys`` hold theirs."""

    __slots__ = ("spec", "__weakref__")

    def __init__(self, spec):
        self.spec = spec

    def __repr__(self) -> str:
        return repr(self.spec)


#: Live ``SpecKey`` by their spec: equal specs make one object while a key or key function holds it.
_spec_keys: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def key_of(spec) -> SpecKey:
    """The one ``SpecKey`` of ``spec``."""
    found = _spec_keys.get(spec)
    return found if found is not None else _spec_keys.setdefault(spec, SpecKey(spec))


def flatten_call(args, kwargs):
    """The call's leaves and a hashable spec that keys the cache (``SpecKey``)."""
    flat, spec = _flatten[0]((args, kwargs))
    return flat, key_of(spec)


def compile_spec(args, kwargs, flat):
    """torch's ``TreeSpec`` of the call, for tracing. Returns ``None`` when torch's pytree sees
    other leaves than ``flat`` (a node type optree does not know); later calls then flatten with
    torch's pytree, and the caller must flatten this call again."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    if len(leaves) != len(flat) or any(a is not b for a, b in zip(leaves, flat)):
        _flatten[0] = pytree.tree_flatten
        return None
    return spec
