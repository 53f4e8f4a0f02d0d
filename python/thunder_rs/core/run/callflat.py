"""Flattening a keyword call's arguments on the per-call path.

``torch.utils._pytree`` is pure Python (several µs per keyword call); ``torch.utils._cxx_pytree``
is optree under torch's namespace, which sees every node type registered through torch's
``register_pytree_node`` (Hugging Face ``ModelOutput`` included) and keeps dict insertion order.
Its spec is only the cache key; compiling still takes torch's own ``TreeSpec``, and a type known to
torch's pytree but not to optree (leaves differing) switches this process back to torch's pytree.
"""

from torch.utils import _pytree as pytree

try:
    from torch.utils import _cxx_pytree as cxx_pytree
except ImportError:  # optree missing: torch's pure-Python pytree only
    cxx_pytree = None  # type: ignore[assignment]  # None marks "no optree"

_fast = [cxx_pytree is not None]


def flatten_call(args, kwargs):
    """The call's leaves and a hashable spec that keys the cache."""
    if _fast[0]:
        return cxx_pytree.tree_flatten((args, kwargs))
    return pytree.tree_flatten((args, kwargs))


def compile_spec(args, kwargs, flat):
    """torch's ``TreeSpec`` of the call, for tracing. Returns ``None`` when torch's pytree sees
    other leaves than ``flat`` (a node type optree does not know); later calls then flatten with
    torch's pytree, and the caller must flatten this call again."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    if len(leaves) != len(flat) or any(a is not b for a, b in zip(leaves, flat)):
        _fast[0] = False
        return None
    return spec
