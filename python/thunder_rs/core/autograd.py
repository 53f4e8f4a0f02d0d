"""The runtime of a compiled training call: one ``torch.autograd.Function`` per entry connects
the generated forward and backward to torch's autograd."""

import operator

import torch

from thunder_rs.core.observe import thread_state
from thunder_rs.core.recorder import active_recorder
from thunder_rs.core.userframe import user_location
from thunder_rs.core.writeback import root_id
from thunder_rs.errors import ThunderNotImplementedError

_keep_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", lambda: True)
_FREED = ("Trying to backward through the graph a second time (or directly access saved tensors after they have "
          "already been freed). Specify retain_graph=True if you need to backward through the graph a second time.")
#: The generated backward is not itself differentiated, so a graph of it cannot be made.
_DOUBLE_BACKWARD = ("backward: create_graph=True (a differentiable backward, for double backward) is not supported "
                    "by thunder_rs-compiled calls (argument create_graph)")


_saved_tensors_hooks = torch._C._autograd._top_saved_tensors_default_hooks


def _refuse_hooks_inside_a_trace(enter):
    """``saved_tensors_hooks.__enter__`` that refuses to run inside a traced program: the saved
    tensors of a compiled call are its residuals, packed (or not) as the whole call is."""

    def checked(self):
        # Activation checkpointing's own hooks (torch.utils.checkpoint) only steer recomputation,
        # which a trace has no use for.
        ours = type(self).__module__.startswith("torch.utils.checkpoint")
        if active_recorder() is not None and thread_state.inside == 0 and not ours:
            raise ThunderNotImplementedError(
                f"torch.autograd.graph.{type(self).__name__}: entered at {user_location()} inside a traced program; "
                "thunder_rs applies saved-tensor hooks (save_on_cpu, offloading) to a whole compiled call: enter "
                "them around the call")
        return enter(self)

    checked.__thunder_rs_checked__ = True
    return checked


_HOOKS = torch.autograd.graph.saved_tensors_hooks
if not getattr(_HOOKS.__enter__, "__thunder_rs_checked__", False):
    _HOOKS.__enter__ = _refuse_hooks_inside_a_trace(_HOOKS.__enter__)  # type: ignore[method-assign]


class _Packed:
    """A residual as a ``saved_tensors_hooks`` pack function returned it (any object)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


_version_of = operator.attrgetter("_version")


def _versions(residuals) -> list:
    try:
        return list(map(_version_of, residuals))  # the common case: every residual is a tensor
    except AttributeError:
        return [r._version if isinstance(r, torch.Tensor) else -1 for r in residuals]


def _check_versions(saved, versions) -> None:
    """Raises eager's error when a tensor saved for the backward was written in place after the
    forward (``opt.step()`` before ``loss.backward()``, ``out.add_(1)``): its gradient would be
    computed from the new values."""
    if _versions(saved) == versions:
        return
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
            ctx.unpack = None
            hooks = _saved_tensors_hooks(False)
            if hooks is None:
                ctx.versions = _versions(ctx.residuals)
            else:  # ``saved_tensors_hooks``/``save_on_cpu`` around the call pack what is saved, as eager's
                ctx.versions, ctx.unpack = None, hooks[1]
                ctx.residuals = [_Packed(hooks[0](r)) if isinstance(r, torch.Tensor) else r for r in ctx.residuals]
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
            if ctx.unpack is not None:
                saved = [ctx.unpack(r.value) if isinstance(r, _Packed) else r for r in saved]
            else:
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
