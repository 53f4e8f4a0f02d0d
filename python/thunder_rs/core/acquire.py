"""Acquisition: run a function (or module) on proxies and record its trace."""

import contextlib
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from thunder_rs import _core
from thunder_rs.core.langctx import LanguageMode
from thunder_rs.core.recorder import Captures, input_proxy, recording
from thunder_rs.core.writeback import WriteBacks, plan


@dataclass
class Acquired:
    trace: "_core.Trace"
    consts: list
    #: positions in the flat inputs of the leaves that are trace inputs (tensors)
    tensor_positions: tuple[int, ...]
    #: how to rebuild the output structure from the flat outputs, or None when returned as is
    out_spec: object
    #: what the trace returns: "single" (one leaf), "tuple" or "list" (of leaves)
    out_kind: str
    #: tensors read from outside the inputs: the trace's last inputs, in this order
    captured: list
    #: inputs the program wrote and what the call copies back, or None
    writebacks: WriteBacks | None = None


def _is_plain(out) -> bool:
    """Outputs the generated code can return directly: a leaf, or a flat tuple/list of leaves."""
    leaf = lambda x: isinstance(x, (torch.Tensor, bool, int, float)) or x is None  # noqa: E731
    return leaf(out) or (type(out) in (tuple, list) and all(leaf(x) for x in out))


@contextlib.contextmanager
def _swapped(slots, proxies):
    """Temporarily replaces module parameters and buffers by their proxies."""
    saved = [d[n] for d, n, _ in slots]
    try:
        for d, n, i in slots:
            d[n] = proxies[i]
        yield
    finally:
        for (d, n, _), v in zip(slots, saved):
            d[n] = v


def acquire(fn, flat_inputs: list, in_spec, param_slots=(), num_params: int = 0) -> Acquired:
    """Traces ``fn(*args, **kwargs)`` rebuilt from ``flat_inputs``. Module parameters and
    buffers (``param_slots``: (store, name, unique index)) become trace inputs after the flat
    inputs, one per unique tensor; captured tensors come last."""
    rec = _core.Recorder()
    grad_enabled = torch.is_grad_enabled()
    positions = tuple(i for i, x in enumerate(flat_inputs) if isinstance(x, torch.Tensor))
    leaves = list(flat_inputs)
    for i in positions:
        leaves[i] = input_proxy(rec, flat_inputs[i], grad_enabled)
    unique = {}
    for d, n, i in param_slots:
        unique.setdefault(i, d[n])
    params = [input_proxy(rec, unique[i], grad_enabled) for i in range(num_params)]
    args, kwargs = tree_unflatten(leaves, in_spec)
    captures = Captures(rec, grad_enabled)
    with recording(rec, captures), _swapped(param_slots, params), LanguageMode():
        out = fn(*args, **kwargs)
        slot_values = [(d, n, params[i], d[n]) for d, n, i in param_slots]
    out_spec = None
    if not _is_plain(out):
        flat_out, out_spec = tree_flatten(out)
        out = tuple(flat_out)
    out_kind = "tuple" if type(out) is tuple else "list" if type(out) is list else "single"
    inputs = [leaves[i] for i in positions] + params + captures.proxies
    separate = (*range(len(positions)), *range(len(inputs) - len(captures.proxies), len(inputs)))
    writebacks, outputs = plan(inputs, slot_values, out, out_kind, separate)
    trace = rec.finish(outputs)
    return Acquired(trace, list(rec.consts()), positions, out_spec, out_kind, captures.tensors, writebacks)
