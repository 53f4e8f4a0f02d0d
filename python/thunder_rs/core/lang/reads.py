"""A read of a traced tensor's value (``core.lang.values``): what the program read, where, and
the check a compiled call makes of it (``check_value``), which raises ``Diverged`` when the value
differs from the one the variant was specialised on."""

import dataclasses
import functools
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten

from thunder_rs import _core
from thunder_rs.core.lang import fallback

_T = torch.Tensor
#: The reads of a tensor's value that are answered: each check reads the value by the same call.
READERS = frozenset({_T.__bool__, _T.item, _T.tolist, _T.__int__, _T.__float__, _T.__index__, _T.__complex__})


class Diverged(Exception):
    """Raised by a compiled call's check: the value read at ``read`` is ``value``, not the one
    the trace was specialised on."""

    def __init__(self, read: "Read", value):
        super().__init__(read, value)
        self.read, self.value = read, value

    def __str__(self) -> str:  # (made only when shown: a divergence is part of a call's run)
        return self.read.describe(self.value)


@dataclasses.dataclass(frozen=True, eq=False)
class Read:
    """One data-dependent read of a traced program: the ``index``-th it made, what it called, at
    which line of the user's code, and the value it got."""

    index: int
    what: str
    where: str
    value: object
    #: ``reader(*tensors)``: the value, read as the program read it
    reader: Callable[..., Any] = dataclasses.field(repr=False, default=_T.__bool__)
    #: For the output sizes of a call sized by values read as symbolic sizes (``widened``): the
    #: ``(output, dim)`` of each such size, in groups that hold one size
    sizes: tuple = ()
    #: the names of those sizes in the trace (one per group), and of its size inputs then
    names: tuple = ()
    inputs: tuple = ()
    #: ``guard(shapes, sizes)`` of the guards of the trace on those sizes (``place_guards``)
    guards: list = dataclasses.field(default_factory=list, repr=False)
    #: Of symbolic sizes, which variant of the pattern: one per outcome of the guards the trace
    #: placed here (``value_sizes.other_side``), 0 for the first
    side: int = 0

    def answered(self, value) -> "Read":
        """This read answered with ``value``, its sizes constant."""
        return dataclasses.replace(self, value=value, sizes=(), names=(), inputs=(), guards=[], side=0)

    def key(self):
        """The read as a step of the variants' ``ValueTree``: its value, or for symbolic sizes
        their pattern (``pattern``) and side."""
        return self.side_key(self.side) if self.sizes else decision(self.value)

    def side_key(self, side: int):
        """The key of the variant of this read's symbolic pattern on guard side ``side``."""
        return ("sized", self.pattern, side) if side else ("sized", self.pattern)

    @functools.cached_property
    def pattern(self) -> tuple:
        """The shapes read, each symbolic size as ``(group,)``; of ints read, their flat list so."""
        groups = {at: (g,) for g, group in enumerate(self.sizes) for at in group}
        if self.reader is not _shapes:
            return tuple(groups.get(k, n) for k, n in enumerate(int_leaves(self.value) or ()))
        shapes: Any = self.value
        return tuple(tuple(groups.get((i, d), n) for d, n in enumerate(shape)) for i, shape in enumerate(shapes))

    def constant_differs(self, value) -> bool:
        """Whether ``value`` (shapes) has the ranks of this read's pattern of symbolic sizes and
        differs from it at a size the pattern has constant."""
        pattern = self.pattern
        if self.reader is not _shapes or type(value) is not tuple or len(value) != len(pattern):
            return False
        if any(len(want) != len(shape) for want, shape in zip(pattern, value)):
            return False
        return any(type(w) is not tuple and w != n for want, shape in zip(pattern, value) for w, n in zip(want, shape))

    def describe(self, value) -> str:
        if self.sizes and self.constant_differs(value):
            return (
                f"the sizes read by {self.what} at {self.where} were {_shown(value)}, where the compiled variant's "
                f"pattern has a size constant that differs (traced at {_shown(self.value)})"
            )
        if self.sizes:
            return (
                f"the sizes read by {self.what} at {self.where} were {_shown(value)}, which the compiled variant's "
                f"symbolic sizes (traced at {_shown(self.value)}) do not serve: a size of 0 or 1, or a guard they "
                "relied on fails"
            )
        return (
            f"the value read by {self.what} at {self.where} was {_shown(value)} where the compiled variant "
            f"has {_shown(self.value)}"
        )


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def decision(value):
    """``value`` as a key of the variants: equal exactly when the values are the same (floats by
    their bits, so NaN equals NaN and -0.0 differs from 0.0), lists as tuples."""
    kind = type(value)
    if kind is bool or kind is int or kind is torch.Size:
        return value
    if kind is float:
        return ("f", value.hex())
    if kind is complex:
        return ("c", value.real.hex(), value.imag.hex())
    if kind in (list, tuple):
        return tuple(map(decision, value))
    return value


def check_value(read: Read, *tensors) -> None:
    """The check a trace records where it read a value: raises ``Diverged`` when the value now
    differs from the one the trace was specialised on."""
    value = read.reader(*tensors)
    if value is read.value or (type(value) is type(read.value) and decision(value) == decision(read.value)):
        return
    raise Diverged(read, value)


CHECK = _core.register_symbol("thunder_rs.check_value", fallback=True, effect=True)
fallback.FALLBACK_IMPLS[CHECK] = check_value


def _shapes(*tensors) -> tuple:
    return tuple(t.shape for t in tensors)


def int_leaves(value) -> list | None:
    """The ints of a value read (an int, or lists and tuples of them), in order; None where it
    holds anything else (a bool, a float)."""
    leaves = tree_flatten(value)[0]
    return leaves if all(type(x) is int for x in leaves) else None
