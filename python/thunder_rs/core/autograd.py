"""The runtime of a compiled training call: one ``torch.autograd.Function`` per entry connects
the generated forward and backward to torch's autograd."""

import torch

from thunder_rs.core.writeback import root_id
from thunder_rs.errors import ThunderNotImplementedError

_keep_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", lambda: True)
_FREED = ("Trying to backward through the graph a second time (or directly access saved tensors after they have "
          "already been freed). Specify retain_graph=True if you need to backward through the graph a second time.")
#: The generated backward is not itself differentiated, so a graph of it cannot be made.
_DOUBLE_BACKWARD = ("backward: create_graph=True (a differentiable backward, for double backward) is not supported "
                    "by thunder_rs-compiled calls (argument create_graph)")


def _versions(residuals) -> list:
    return [r._version if isinstance(r, torch.Tensor) else -1 for r in residuals]


def _check_versions(saved, versions) -> None:
    """Raises eager's error when a tensor saved for the backward was written in place after the
    forward (``opt.step()`` before ``loss.backward()``, ``out.add_(1)``): its gradient would be
    computed from the new values."""
    for r, then in zip(saved, versions):
        if then >= 0 and r._version != then:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace operation: "
                f"[{r.type()} {list(r.shape)}] is at version {r._version}; expected version {then} instead (a tensor "
                "a thunder_rs-compiled call saved for its backward). Hint: change the in-place operation to an "
                "out-of-place one, or run it after the backward")


def _unshared(residuals, inputs, overwritten) -> list:
    """``residuals`` with those that share memory with an ``overwritten`` input cloned, so that
    the backward reads the values the forward saw."""
    bases = {root_id(inputs[k]) for k in overwritten}
    return [r.clone() if isinstance(r, torch.Tensor) and root_id(r) in bases else r for r in residuals]


def grad_function(forward, backward, grad_positions: list[int], single: bool, as_list: bool,
                  non_differentiable: frozenset = frozenset(), overwritten: tuple[int, ...] = ()):
    """A callable with the generated forward's signature whose outputs carry a grad_fn.

    ``forward(*inputs)`` returns ``(outputs, residuals)``; ``backward(saved, *cotangents)`` takes
    the residuals in a list, which it empties as it unpacks them, so each residual is freed after
    its last use unless the graph is retained. ``grad_positions`` are the positions of the flat
    outputs that receive cotangents; the other tensor outputs, and ``non_differentiable`` ones
    (values written back without autograd), are marked non-differentiable and get zeros.
    ``overwritten`` inputs are written after the call: residuals sharing their memory are cloned.
    """
    differentiable = frozenset(grad_positions) - non_differentiable

    class CompiledFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            outputs, residuals = forward(*inputs)
            flat = (outputs,) if single else tuple(outputs)
            ctx.residuals = _unshared(residuals, inputs, overwritten) if overwritten else list(residuals)
            ctx.versions = _versions(ctx.residuals)
            constant = [o for i, o in enumerate(flat) if i not in differentiable and isinstance(o, torch.Tensor)]
            if constant:
                ctx.mark_non_differentiable(*constant)
            return flat

        @staticmethod
        def backward(ctx, *grads):
            if torch.is_grad_enabled():
                raise ThunderNotImplementedError(_DOUBLE_BACKWARD)
            saved = ctx.residuals
            if saved is None:
                raise RuntimeError(_FREED)
            _check_versions(saved, ctx.versions)
            if _keep_graph():
                saved = list(saved)
            else:
                ctx.residuals = None
            return backward(saved, *[grads[i] for i in grad_positions])

    apply = CompiledFunction.apply
    if single:
        return lambda *inputs: apply(*inputs)[0]
    if as_list:
        return lambda *inputs: list(apply(*inputs))
    return apply
