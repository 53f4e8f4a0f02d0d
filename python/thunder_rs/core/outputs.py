"""The structure of a program's outputs, rebuilt on every call.

Outputs are flattened with torch's pytree (tuples, lists, dicts, namedtuples, registered nodes
such as Hugging Face's ``ModelOutput``). Dataclass instances, which torch's pytree treats as
leaves, are taken apart too: each call returns a new instance holding that call's tensors, never
the object the trace was recorded with.
"""

import copy
import dataclasses

import torch
from torch.utils import _pytree as pytree


class _Fields:
    """A dataclass instance taken apart: its field values, and the instance as a template."""

    __slots__ = ("template", "names", "values")

    def __init__(self, template, names, values):
        self.template, self.names, self.values = template, names, values


pytree.register_pytree_node(
    _Fields,
    lambda f: (list(f.values), (f.template, f.names)),
    lambda values, context: _Fields(context[0], context[1], list(values)),
)


def _is_dataclass_instance(x) -> bool:
    return dataclasses.is_dataclass(x) and not isinstance(x, type)


def _taken_apart(x):
    """``x`` with dataclass instances replaced by ``_Fields`` (None when there are none)."""
    found = []

    def take(node):
        if _is_dataclass_instance(node):
            found.append(True)
            names = tuple(f.name for f in dataclasses.fields(node))
            values = [take(getattr(node, n)) for n in names]
            template = copy.copy(node)  # without the traced values, which each call sets anew
            for name in names:
                object.__setattr__(template, name, None)
            return _Fields(template, names, values)
        return node

    out = pytree.tree_map(take, x, is_leaf=_is_dataclass_instance)
    return out if found else None


def _rebuilt(x):
    def rebuild(node):
        if isinstance(node, _Fields):
            obj = copy.copy(node.template)
            for name, value in zip(node.names, node.values):
                object.__setattr__(obj, name, _rebuilt(value))
            return obj
        return node

    return pytree.tree_map(rebuild, x, is_leaf=lambda n: isinstance(n, _Fields))


class OutputStructure:
    """How to rebuild a program's output from the trace's flat outputs."""

    __slots__ = ("spec", "dataclasses")

    def __init__(self, spec, has_dataclasses: bool):
        self.spec, self.dataclasses = spec, has_dataclasses

    def rebuild(self, flat):
        out = pytree.tree_unflatten(list(flat), self.spec)
        return _rebuilt(out) if self.dataclasses else out


def flatten_output(out):
    """``(leaves, OutputStructure)`` for a program's output."""
    apart = _taken_apart(out)
    leaves, spec = pytree.tree_flatten(out if apart is None else apart)
    return leaves, OutputStructure(spec, apart is not None)


def is_plain(out) -> bool:
    """Outputs the generated code can return as they are: a leaf, or a flat tuple/list of leaves."""
    leaf = lambda x: isinstance(x, (torch.Tensor, bool, int, float)) or x is None  # noqa: E731
    return leaf(out) or (type(out) in (tuple, list) and all(leaf(x) for x in out))
