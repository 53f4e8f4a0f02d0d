"""What a trace specialises on of a tensor it takes as an input, and the guard of one an argument
object holds (``cache.layers[0].keys``), whose metadata every call checks as the cache key checks
an argument's (``acquisition.cache.TENSOR_FIELDS``)."""

import torch

from thunder_rs.core.base.layouts import describe, is_strided, layout, symbolic_strides
from thunder_rs.core.state.guards import MISSING, Source, name_code


#: The requires_grad of a tensor's metadata where it requires grad and is not a leaf (the output
#: of an op that recorded a gradient): eager answers ``is_leaf`` and refuses in-place writes by it.
NOT_A_LEAF = "not a leaf"


#: What a trace specialises on of a tensor it takes as an input, as an expression of the tensor
#: ``#``: dtype, device, shape, requires_grad (``NOT_A_LEAF`` for one that is not a leaf), the
#: layout (``core.base.layouts``), whether it is an inference tensor (eager raises for one an op
#: saves for backward or writes in place), and its type (a ``Parameter``, a subclass). The one
#: source of ``tensor_meta``, of the cache key's tensor leaves (``acquisition.cache.leaf_key``)
#: and of the key functions that inline it (``cache.tensor_key_source``): an expression, so that
#: each runs it in its own frame (a call of ``tensor_meta`` costs a key ~30 ns a tensor).
META_EXPRESSION = (
    "(#.dtype, #.device, #.shape, #.requires_grad and (#.is_leaf or NOT_A_LEAF), #.is_contiguous() or layout(#), "
    "#.is_inference(), type(#))"
)
#: What ``META_EXPRESSION`` reads besides the tensor.
META_NAMES = {"NOT_A_LEAF": NOT_A_LEAF, "layout": layout}


def meta_source(name: str) -> str:
    """``tensor_meta`` of the tensor named ``name`` as an expression (``META_EXPRESSION``)."""
    return META_EXPRESSION.replace("#", name)


def _tensor_meta():
    namespace = dict(META_NAMES)
    exec(f"def tensor_meta(t) -> tuple:\n    return {meta_source('t')}\n", namespace)
    return namespace["tensor_meta"]


tensor_meta = _tensor_meta()
tensor_meta.__doc__ = """What a trace specialises on of a tensor it takes as an input, as the cache key
    holds it for arguments (``META_EXPRESSION``)."""


def _tensor_text(meta) -> str:
    if meta is MISSING:
        return "no tensor"
    dtype, device, shape, requires_grad, arranged, inference, kind = meta
    sizes = ", ".join("s" if n is None else str(n) for n in shape)
    what = "inference tensor" if inference else "tensor"
    what += "" if kind is torch.Tensor else f" ({kind.__qualname__})"
    text = f"a {str(dtype).removeprefix('torch.')} {what} of shape [{sizes}] on {device}"
    text += ", requiring grad" if requires_grad else ""
    text += " (not a leaf)" if requires_grad == NOT_A_LEAF else ""
    return text + ("" if arranged is True else f", {describe(arranged)}")


def _read_meta(value):
    return tensor_meta(value) if isinstance(value, torch.Tensor) else MISSING


def masked_meta(meta, dims: frozenset):
    """``meta`` (``tensor_meta``) with the sizes at ``dims`` left out (None), and a strided
    tensor's strides at its ``(STRIDE, d)`` (a slice of a buffer whose length changes): what a
    guard checks of a tensor whose sizes there are symbolic (read per call into the trace's size
    inputs)."""
    if meta is MISSING or not dims:
        return meta
    dtype, device, shape, requires_grad, arranged, inference, kind = meta
    if is_strided(arranged):  # (what the trace decided at its strides: ``layouts.SymbolicStrides``)
        arranged = symbolic_strides(shape, arranged, dims)
    sizes = tuple(None if d in dims else n for d, n in enumerate(shape))
    return (dtype, device, sizes, requires_grad, arranged, inference, kind)


def _read_masked(value, dims: frozenset):
    return masked_meta(_read_meta(value), dims)


class TensorGuard:
    """A tensor that an argument object holds (``cache.layers[0].keys``): every call passes the
    tensor found there then to the trace as an input (``Acquired.tail``), so the trace is
    specialised on its metadata, not on the tensor. Its sizes at ``symbolic`` dims are left to the
    trace's size inputs (a KV cache's length), so the guard checks everything else."""

    def __init__(self, source: Source, name: str, expected: tuple, origin: str, symbolic: frozenset = frozenset()):
        self.source, self.name, self.origin, self.symbolic = source, name, origin, symbolic
        self.expected = masked_meta(expected, symbolic)

    @property
    def per_call(self) -> bool:
        return self.source.per_call

    def found(self, flat):
        """The metadata of the tensor the call's arguments hold there, all of it."""
        try:
            return _read_meta(self.source.mapping(flat).get(self.name, MISSING))
        except (KeyError, AttributeError, IndexError, TypeError):
            return MISSING

    def holds(self, flat) -> bool:
        return masked_meta(self.found(flat), self.symbolic) == self.expected

    def describe(self, flat) -> str:
        now = masked_meta(self.found(flat), self.symbolic)
        return (
            f"{self.source.describe(self.name)} changed from {_tensor_text(self.expected)} to "
            f"{_tensor_text(now)} (read at {self.origin})"
        )

    def term(self, index: int, scope: dict) -> str:
        scope[f"e{index}"] = self.expected
        read = f"{self.source.code(f'm{index}', scope)}.get({name_code(self.name, f'key{index}', scope)}, MISSING)"
        if not self.symbolic:
            return f"_read_meta({read}) == e{index}"
        scope[f"d{index}"] = self.symbolic
        return f"_read_masked({read}, d{index}) == e{index}"


class GradStateGuard:
    """The requires_grad and leafness of the tensor a module attribute holds (``TensorGuard``, checked
    only after a module write), checked on every call: both change with no write, by
    ``m.acc.requires_grad_()`` or by the program's own in-place write of a value requiring grad
    (``self.acc.add_(x)``), and an entry traced for the other state would drop the gradient."""

    per_call = True

    def __init__(self, guard: TensorGuard):
        self.guard, self.source, self.name = guard, guard.source, guard.name
        self.expected = guard.expected[3]

    def holds(self, flat) -> bool:
        found = self.guard.found(flat)
        return found is not MISSING and found[3] == self.expected

    def describe(self, flat) -> str:
        return self.guard.describe(flat)

    def term(self, index: int, scope: dict) -> str:
        read = f"{self.source.code(f'm{index}', scope)}.get({name_code(self.name, f'key{index}', scope)}, MISSING)"
        if self.expected == NOT_A_LEAF:
            return f"((v := {read}).requires_grad and not v.is_leaf)"
        return f"((v := {read}).requires_grad and v.is_leaf)" if self.expected else f"not {read}.requires_grad"


def grad_state_guards(guards: list) -> list:
    """A ``GradStateGuard`` for each ``TensorGuard`` among ``guards`` checked only after module writes."""
    return [GradStateGuard(g) for g in guards if type(g) is TensorGuard and not (g.per_call or g.expected is MISSING)]
