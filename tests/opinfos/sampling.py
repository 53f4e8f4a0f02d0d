"""Which samples of an op the default test run takes: a fixed rule, so that a default run checks every
op in every dtype on its first sample and on every kind of edge case its samples hold, in a fraction
of the whole table's time (``--run-slow`` runs every sample).

A sample's kinds are read off its arguments: a 0-dim tensor, an empty one, a non-contiguous one,
tensors of different shapes (broadcasting) or dtypes (promotion), a Python number operand, non-finite
values, and the option values it passes (a string, bool or None keyword, a string positional).
The rule keeps the first sample, then each sample that brings a kind no kept sample had. In a dtype
other than the op's first, only the kinds whose result depends on the dtype count (type promotion
and non-finite values): layouts and options go through the same code in every dtype. The gradient
test's float64 samples count every kind. Over the table this keeps about 40% of the samples
(8,700 of 21,100 sample tests).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from .core import OpInfo, SampleInput

#: The kinds whose handling depends on the dtype: promotion against a partner dtype, a Python
#: number or a 0-dim tensor, and the special values only floating dtypes hold.
DTYPE_KINDS = frozenset({"mixed dtypes", "number", "0-dim", "non-finite"})


def sample_of(op: OpInfo, dtype: torch.dtype, index: int) -> SampleInput:
    """The ``index``-th CPU sample of ``op`` (the samples drawn from seed 0, as the sweeps draw them)."""
    torch.manual_seed(0)
    for i, sample in enumerate(op.sample_inputs(dtype, "cpu")):
        if i == index:
            return sample
    raise IndexError(index)


def sample_indices(op: OpInfo, dtype: torch.dtype, full: bool, *, every_kind: bool) -> Sequence[int]:
    """The CPU samples of ``op`` in ``dtype`` a sweep takes: all with ``full`` (``--run-slow``),
    else the default run's ``representative`` ones."""
    kinds = kinds_of_samples(op, dtype)
    return range(len(kinds)) if full else representative(kinds, every_kind=every_kind)


def kinds_of_samples(op: OpInfo, dtype: torch.dtype) -> tuple[frozenset[str], ...]:
    """Each CPU sample's ``sample_kinds``, made once per process for an op and dtype: collecting
    the sweeps of several test modules makes the samples only once."""
    key = (op.id, dtype)
    if key not in _KINDS:
        _KINDS[key] = tuple(sample_kinds(s) for s in op.sample_inputs(dtype, "cpu"))
    return _KINDS[key]


_KINDS: dict[tuple[str, torch.dtype], tuple[frozenset[str], ...]] = {}


def representative(kinds: Sequence[frozenset[str]], *, every_kind: bool) -> tuple[int, ...]:
    """The indices of the samples the default run takes, from each sample's ``sample_kinds``;
    ``every_kind`` where they are of the op's first tested dtype (or of the gradient test's float64),
    else only ``DTYPE_KINDS`` count."""
    seen: set[str] = set()
    kept = []
    for index, found in enumerate(kinds):
        found = found if every_kind else found & DTYPE_KINDS
        if index == 0 or not found <= seen:
            kept.append(index)
            seen |= found
    return tuple(kept)


def sample_kinds(sample: SampleInput) -> frozenset[str]:
    """The edge cases and option values ``sample`` holds (see the module doc)."""
    tensors = _tensors([sample.args, list(sample.kwargs.values())])
    found = {kind for t in tensors for kind in _tensor_kinds(t)}
    if len({t.dtype for t in tensors}) > 1:
        found.add("mixed dtypes")
        # A half-precision operand with a wider one: eager's CPU kernels take a 0-d wider operand at
        # its own value, and which side it is on matters (``ltorch.cpu_scalar_times``, ``cpu_times_scalar``).
        half = [i for i, t in enumerate(tensors) if t.dtype in (torch.bfloat16, torch.float16)]
        if half and len(half) < len(tensors):
            found.add(f"half precision operand {half[0]}")
    if len({t.shape for t in tensors}) > 1:
        found.add("broadcast")
    # Integers are left out: a positional int is most often a dim, not an operand.
    if any(isinstance(a, (bool, float, complex)) for a in sample.args):
        found.add("number")
    found |= {f"arg{i}={a}" for i, a in enumerate(sample.args) if isinstance(a, str)}
    found |= {f"{k}={v}" for k, v in sample.kwargs.items() if v is None or isinstance(v, (str, bool))}
    found |= {f"{k}=tensor" for k, v in sample.kwargs.items() if isinstance(v, torch.Tensor)}  # (an optional operand)
    return frozenset(found)


def _tensor_kinds(t: torch.Tensor) -> Iterable[str]:
    if t.dim() == 0:
        yield "0-dim"
    if t.numel() == 0:
        yield "empty"
    if not t.is_contiguous():
        yield "non-contiguous"
    if t.is_floating_point() and not bool(t.isfinite().all()):
        yield "non-finite"


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []
