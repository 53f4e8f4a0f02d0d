"""torch's pytree walks (``tree_map``, ``tree_leaves``) without its tree specs, for the calls a
compile makes per traced op.

``torch.utils._pytree.tree_map`` flattens into a ``TreeSpec`` (a dataclass built per node, each
type looked up through its namedtuple test) and unflattens it again: some 250 Python lines for a
view op's ``((x, (2, 12)), {})``. These walk the same nodes in the same order by torch's registry
(``SUPPORTED_NODES``, read per call: a type registered later is opened too): tuples, lists and
dicts directly, every other node by its own ``flatten_fn``/``unflatten_fn`` (a ``torch.Size``
comes back a tuple, as torch's does), and call ``fn`` on the leaves in torch's order. Types known
to be leaves (``LEAF_TYPES``, unless registered as nodes) skip the namedtuple test.
"""

import torch
from torch.utils._pytree import SUPPORTED_NODES, _get_node_type

from thunder_rs.core.base.proxies import SymbolicSize, TensorProxy

#: Types that are leaves unless one is registered as a pytree node: the arguments of most ops.
#: The language's symbolic sizes add their types (``symint``, ``symfloat``).
LEAF_TYPES: set = {int, float, bool, complex, str, bytes, type(None), slice, type(Ellipsis), TensorProxy}
LEAF_TYPES.update((SymbolicSize, torch.Tensor, torch.dtype, torch.device, torch.memory_format, torch.layout))


def _node(tree):
    """The registry's node of ``tree``, None for a leaf."""
    t = type(tree)
    if t in LEAF_TYPES and t not in SUPPORTED_NODES:
        return None
    return SUPPORTED_NODES.get(_get_node_type(tree))


def tree_map(fn, tree, is_leaf=None):
    """``torch.utils._pytree.tree_map(fn, tree, is_leaf=is_leaf)``: ``tree`` with each leaf ``fn``
    of it, each container made anew by its node's unflatten."""
    if is_leaf is not None:
        return _map_checked(fn, tree, is_leaf)
    t = type(tree)
    if t is tuple or t is list:
        # (a child known to be a leaf without a call: most are ints and proxies)
        kids = [fn(c) if type(c) in LEAF_TYPES and type(c) not in SUPPORTED_NODES else tree_map(fn, c) for c in tree]
        return tuple(kids) if t is tuple else kids
    if t is dict:
        return {k: tree_map(fn, v) for k, v in tree.items()}
    node = _node(tree)
    if node is None:
        return fn(tree)
    children, context = node.flatten_fn(tree)
    return node.unflatten_fn([tree_map(fn, c) for c in children], context)


def _map_checked(fn, tree, is_leaf):
    """``tree_map`` with ``is_leaf`` asked of each node first, as torch's asks it."""
    if is_leaf(tree):
        return fn(tree)
    t = type(tree)
    if t is tuple:
        return tuple([_map_checked(fn, v, is_leaf) for v in tree])
    if t is list:
        return [_map_checked(fn, v, is_leaf) for v in tree]
    if t is dict:
        return {k: _map_checked(fn, v, is_leaf) for k, v in tree.items()}
    node = _node(tree)
    if node is None:
        return fn(tree)
    children, context = node.flatten_fn(tree)
    return node.unflatten_fn([_map_checked(fn, c, is_leaf) for c in children], context)


def tree_leaves(tree, is_leaf=None) -> list:
    """``torch.utils._pytree.tree_leaves(tree, is_leaf=is_leaf)``: the leaves in torch's order."""
    leaves: list = []
    _gather(tree, is_leaf, leaves)
    return leaves


def _gather(tree, is_leaf, leaves: list) -> None:
    if is_leaf is not None and is_leaf(tree):
        leaves.append(tree)
        return
    t = type(tree)
    if t is tuple or t is list:
        children = tree
    elif t is dict:
        children = tree.values()
    else:
        node = _node(tree)
        if node is None:
            leaves.append(tree)
            return
        children = node.flatten_fn(tree)[0]
    for c in children:
        if type(c) in LEAF_TYPES and is_leaf is None and type(c) not in SUPPORTED_NODES:
            leaves.append(c)  # (most children: no call)
        else:
            _gather(c, is_leaf, leaves)
