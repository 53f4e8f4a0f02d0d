"""The gradients a fallback's backward computes (``fallback._vjp_of``) as eager's backward does:
only of the inputs the backward running takes a gradient of, so that a call eager has no
derivative for in one input (``special.zeta``'s ``x``, ``igamma``'s ``a``) raises eager's error only
where that input's gradient is asked for, also where that input is a value the compiled call
computed (``zeta(x * 2, q)``: ``autograd.grad(out, q)`` gives ``q``'s, as eager's engine runs no
node towards ``x``)."""

import threading

import torch
from torch.autograd.graph import get_gradient_edge


class _Deferred(threading.local):
    """Per thread, in a compiled backward ``fallback.absent_as_none`` runs: the errors of the
    derivatives of values the call computed, as ``(fallback backward's call index, input index,
    error)``; None outside one."""

    errors: list | None = None


_deferred = _Deferred()


def start() -> list | None:
    """Starts noting deferred errors for a compiled backward; returns what ``finish`` restores."""
    outer, _deferred.errors = _deferred.errors, []
    return outer


def finish(outer: list | None) -> list:
    """The errors noted since ``start``, which gave ``outer``."""
    errors, _deferred.errors = _deferred.errors, outer
    return errors or []


def raise_where_reached(errors: list, calls: list, trace) -> None:
    """Raises the first of ``errors`` whose gradient, in the compiled backward ``trace`` (whose
    fallback backwards' outputs are ``calls``), reaches an input of the call's autograd node whose
    edge the engine executes (``_core.Trace.absent_outputs`` from that value alone, with no present
    cotangent: the outputs computed from it)."""
    node = torch._C._current_autograd_node()
    for call, k, error in errors:
        if call >= len(calls) or k >= len(calls[call]):
            raise error
        if any(executes(node, p) for p in trace.absent_outputs([calls[call][k]], 0, [])):
            raise error


def executes(node, position: int) -> bool:
    """Whether the engine running takes the gradient of ``node``'s input ``position``; True where
    torch does not say (a leaf under ``torch.autograd.grad``)."""
    edges = () if node is None else node.next_functions
    if position >= len(edges):
        return True
    target = edges[position][0]
    if target is None:
        return False
    try:
        return torch._C._will_engine_execute_node(target)
    except RuntimeError:
        return True


def _defer(grad, asked: list, found: list, call: int | None) -> bool:
    """The gradients of ``asked`` one by one into ``found``; those whose derivative raises get none,
    their errors noted for ``raise_where_reached``. Whether any raised."""
    failed = []
    for k in asked:
        try:
            grad([k])
        except (NotImplementedError, RuntimeError) as error:
            failed.append((k, error))
    for k, raised in failed:
        found[k] = None
        _deferred.errors.append((call, k, raised))  # type: ignore[union-attr]  # (``grads`` checked it)
    return bool(failed)


def taken(w: torch.Tensor) -> bool | None:
    """Whether the backward running takes a gradient of ``w``: not where ``w`` is a tensor of the
    caller's (an input of the call's node running) whose gradient edge, the node's own, the engine
    does not execute (``torch.autograd.grad`` of other inputs); None where torch does not say (a
    leaf under ``torch.autograd.grad``). (An input written since has another edge: taken.)"""
    node = torch._C._current_autograd_node()
    if not w.requires_grad or node is None:
        return True
    try:
        edge = get_gradient_edge(w)
    except (RuntimeError, AssertionError):  # (a view the backward took of a leaf: no edge of its own)
        return True
    if not any(n is edge.node and k == edge.output_nr for n, k in node.next_functions):
        return True
    try:
        return torch._C._will_engine_execute_node(edge.node)
    except RuntimeError:
        return None


def grads(outs: list, wanted: list, copies: dict, call: int | None = None) -> list:
    """The gradients of ``outs`` (``(output, cotangent)`` pairs) for the leaves ``copies`` holds of
    ``wanted`` (None: not asked), as eager's backward computes them: only of the inputs the backward
    takes a gradient of (``taken``), so that an op with no derivative in one (``zeta``'s ``x``)
    raises eager's error only where that one is asked for. Where torch does not say, an input
    whose derivative raises gets zeros and the error where the engine hands them on
    (``raising_where_taken``). An input that is no tensor of the caller's (``zeta(x * 2, q)``'s ``x
    * 2``) whose derivative raises, in a compiled backward (the ``call``-th backward of a fallback
    in it), gets none, and the error is raised after that backward where it reaches an input the
    engine takes a gradient of (``raise_where_reached``)."""
    taken_now = [taken(w) for w in wanted]
    asked = [k for k, t in enumerate(taken_now) if t is not False]
    unsure = [k for k in asked if taken_now[k] is None]
    found: list = [None] * len(wanted)

    def grad(ks: list) -> None:
        tensors, cotangents = [o for o, _ in outs], [c for _, c in outs]
        inputs = [copies[id(wanted[k])] for k in ks]
        for k, g in zip(ks, torch.autograd.grad(tensors, inputs, cotangents, allow_unused=True, retain_graph=True)):
            found[k] = g

    if not outs or not asked:
        return found
    try:
        grad(asked)
    except (NotImplementedError, RuntimeError):  # (eager's: "derivative for aten::bernoulli ...")
        deferring = call is not None and _deferred.errors is not None
        if not unsure:
            if not deferring or not _defer(grad, asked, found, call):
                raise
            return found
        sure = [k for k in asked if taken_now[k]]
        if sure and deferring:
            _defer(grad, sure, found, call)
        elif sure:
            grad(sure)
        for k in unsure:
            try:
                grad([k])
            except (NotImplementedError, RuntimeError) as its:
                found[k] = raising_where_taken(wanted[k], its)
    return found


def raising_where_taken(w: torch.Tensor, error: Exception) -> torch.Tensor:
    """Zeros for the gradient of ``w`` (a tensor of the caller's), with a hook on it that raises
    ``error`` where the engine hands the gradient on (captures it for ``torch.autograd.grad``), and
    is removed at the end of the backward otherwise."""

    def hook(grad):
        handle.remove()
        raise type(error)(*error.args)

    handle = w.register_hook(hook)
    try:
        torch.autograd.Variable._execution_engine.queue_callback(handle.remove)
    except RuntimeError:  # (no backward of the engine's running: eager's error now)
        handle.remove()
        raise error from None
    return torch.zeros_like(w)
