"""``torch.autograd.grad`` and ``backward(inputs=...)`` asked for the gradient of an output of a
compiled call from which the call computed another output that the backward reaches
(``loss, h = jfn(x); torch.autograd.grad(loss, h)``, ``loss`` computed from ``h`` inside the call).

Eager's gradient of ``h`` is the one flowing back from ``loss``. The engine takes the gradient of
``h`` from the input buffer of ``h``'s node, the call's one node, without running it: that buffer
holds ``h``'s own cotangent only (None above, and ``torch.autograd.grad(loss + h.sum(), h)`` gave
ones). Such a request is refused with the line that made it: ``torch.autograd.grad`` and
``torch.autograd.backward`` (``Tensor.backward``) are wrapped to check the tensors of ``inputs``
first (a walk of the graph only where one of them is such an output), whose node
``output_hooks.guard_hooks`` gave the outputs each output computes (``generate._InnerOutputs``)."""

import functools

import torch

from thunder_rs.core.base.userframe import user_location
from thunder_rs.errors import ThunderNotImplementedError

_CAPTURED = (
    "{0}: the gradient of output {1} of a thunder_rs-compiled call, from which the call computed its outputs {2} "
    "that this backward reaches, asked for at {3}: eager's gradient includes the one flowing back from them, which "
    "the compiled call (one autograd node) does not compute; return the gradient you need from inside the compiled "
    "function, or compute those outputs outside it"
)


def _asked(inputs) -> dict:
    """``node -> [(j, the outputs computed from j)]`` for the tensors of ``inputs`` that are output
    ``j`` of a compiled call's node from which it computed others."""
    asked: dict = {}
    for t in inputs:
        node = t.grad_fn if isinstance(t, torch.Tensor) else None
        inner = getattr(getattr(node, "_forward_cls", None), "_thunder_rs_inner", None)
        if inner is not None and inner(t.output_nr):
            asked.setdefault(node, []).append((t.output_nr, inner(t.output_nr)))
    return asked


def _edges_into(outputs, nodes: dict) -> set:
    """``(node, output position)`` for each edge from the graph of ``outputs`` into one of ``nodes``."""
    found, seen, held = set(), set(), []
    stack = []
    for o in outputs:
        if isinstance(o, torch.Tensor) and o.grad_fn is not None:
            if o.grad_fn in nodes:
                found.add((o.grad_fn, o.output_nr))
            else:
                stack.append(o.grad_fn)
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        held.append(node)  # (no id reused while walking)
        for nxt, k in node.next_functions:
            if nxt is None:
                continue
            if nxt in nodes:
                found.add((nxt, k))
            else:
                stack.append(nxt)
    return found


def refuse_captured(api: str, outputs, inputs) -> None:
    """Raises where ``api`` asks for the gradients of ``inputs`` from ``outputs``, one of them an
    output of a compiled call from which it computed an output ``outputs`` reach (see the module)."""
    inputs = (
        (inputs,)
        if isinstance(inputs, torch.Tensor)
        else tuple(inputs.values() if isinstance(inputs, dict) else inputs)
    )
    asked = _asked(inputs)
    if not asked:
        return
    outputs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
    reached = _edges_into(outputs, asked)
    for node, pairs in asked.items():
        for j, computed in pairs:
            hit = sorted(k for k in computed if (node, k) in reached)
            if hit:
                raise ThunderNotImplementedError(_CAPTURED.format(api, j, hit, user_location()))


def _checking(api: str, function, at_inputs: int):
    if getattr(function, "__thunder_rs_checked__", False):
        return function

    @functools.wraps(function)
    def checked(*args, **kwargs):
        inputs = kwargs.get("inputs", args[at_inputs] if len(args) > at_inputs else None)
        if inputs is not None:
            refuse_captured(api, kwargs.get("outputs", kwargs.get("tensors", args[0] if args else None)), inputs)
        return function(*args, **kwargs)

    checked.__thunder_rs_checked__ = True  # type: ignore[attr-defined]
    return checked


torch.autograd.grad = _checking("torch.autograd.grad", torch.autograd.grad, 1)
torch.autograd.backward = _checking("torch.autograd.backward", torch.autograd.backward, 5)
#: torch's functions, which the programs' calls name still (``torch.autograd.grad`` hands its own
#: global to ``__torch_function__``: the wrapper; ``langctx._AUTOGRAD_CALLS`` takes both).
ORIGINALS = tuple(getattr(f, "__wrapped__") for f in (torch.autograd.grad, torch.autograd.backward))
