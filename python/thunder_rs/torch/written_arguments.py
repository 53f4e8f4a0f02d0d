"""Torch functions that write into some of their tensor arguments though their names do not end
in ``_``: ``torch.fused_moving_avg_obs_fake_quant`` (QAT's fused fake-quantize modules) updates
the observer's running minimum and maximum, the scale and the zero point in place, and
``torch.batch_norm``, ``torch.instance_norm`` and ``torch.native_batch_norm`` (called directly,
not through ``F``) update the running statistics.

``torch.batch_norm`` and ``torch.instance_norm`` are ``F``'s functions with the arguments in
another order, and are handled as those are.

Each is functionalised as the in-place calls are (``inplace``): one eager fallback runs the
function on copies of the arguments it writes and returns its result and their new values,
which are then written (``assign``, where autograd does not see, as eager writes them). Run on
the trace's tensors, the fallback's backward, which runs it again, leaves the module's state as
the forward left it. Which arguments a function writes is read from its aten schema
(``Tensor(a!) running_min``), or for the batch norms, whose schemas do not say it, given."""

import functools

import torch
import torch.nn.functional as F

from thunder_rs.core.lang.fallback import schema_writes, user_fallback
from thunder_rs.core.lang.langctx import MUTATING, TORCH_TO_LTORCH
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.base.userframe import user_location
from thunder_rs.errors import ThunderNotImplementedError
from thunder_rs.torch.inplace import assign
from thunder_rs.torch.view_scatters import stop_gradient

#: The torch functions, and the aten op whose schema names their arguments and what they write.
_FUNCTIONS = {
    torch.fused_moving_avg_obs_fake_quant: torch.ops.aten.fused_moving_avg_obs_fake_quant.default,
    torch._fused_moving_avg_obs_fq_helper: torch.ops.aten._fused_moving_avg_obs_fq_helper.default,
    torch.native_batch_norm: torch.ops.aten.native_batch_norm.default,
    torch._native_batch_norm_legit: torch.ops.aten._native_batch_norm_legit.default,
}
#: What the batch norms write, which their schemas do not say.
_RUNNING_STATISTICS = {"running_mean": 3, "running_var": 4}
#: ``F``'s functions that torch's take the arguments of in another order:
#: ``(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled)``.
_REORDERED = {torch.batch_norm: F.batch_norm, torch.instance_norm: F.instance_norm}


@functools.cache
def _on_copies(fn, positions: tuple[int, ...]):
    """``fn`` run on copies of its arguments at ``positions``: returns its result, then those
    copies as it left them (the same function object each time, so one fallback symbol)."""

    def functional(*args):
        args = tuple(a.clone() if i in positions else a for i, a in enumerate(args))
        out = fn(*args)
        return (*(out if isinstance(out, tuple) else (out,)), *(args[i] for i in positions))

    functional.__name__ = functional.__qualname__ = f"{fn.__name__}_on_copies"
    return functional


def _writing(fn, written: dict[str, int]):
    """The handler of ``fn``: the call on copies, then the new values written into the arguments."""
    parameters = [a.name for a in _FUNCTIONS[fn]._schema.arguments]

    @functools.wraps(fn)
    def handler(*args, **kwargs):
        args = (*args, *(kwargs.pop(name) for name in parameters[len(args) :] if name in kwargs))
        if fn in _FUSED_FAKE_QUANTS:
            _check_sized(fn, args, kwargs, written)
        positions = tuple(i for i in written.values() if i < len(args) and isinstance(args[i], TensorProxy))
        outs = user_fallback(_on_copies(fn, positions), args, kwargs)
        results, values = outs[: len(outs) - len(positions)], outs[len(outs) - len(positions) :]
        for i, value in zip(positions, values):
            assign(args[i], stop_gradient(value) if value.requires_grad else value, fn.__name__, tracked=False)
        return results[0] if len(results) == 1 else tuple(results)

    return handler


_FUSED_FAKE_QUANTS = frozenset({torch.fused_moving_avg_obs_fake_quant, torch._fused_moving_avg_obs_fq_helper})


def _check_sized(fn, args: tuple, kwargs: dict, written: dict[str, int]) -> None:
    """Refuses a per-channel call whose state has not the channels' size yet: eager resizes it
    in place (a per-channel observer's first step sizes its empty running minimum and its
    one-element scale by the channels), and a trace's inputs keep their sizes."""
    per_row = args[11] if len(args) > 11 else kwargs.get("per_row_fake_quant", False)
    if not per_row:
        return
    channels = args[0].shape[args[10]]
    for name, i in written.items():
        if args[i].shape != (channels,):
            raise ThunderNotImplementedError(
                f"torch.{fn.__name__} at {user_location()}: resizes its argument {name} in place (from "
                f"{list(args[i].shape)} to [{channels}]: a per-channel observer's first step), and a traced program "
                "cannot change the size of a module's buffer. Run one training step eagerly before the jitted ones "
                "(the observers' buffers then have their sizes)"
            )


def _reordered(handler):
    """``handler`` of ``F.batch_norm`` or ``F.instance_norm`` taking torch's order of arguments."""

    def reordered(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled=False):
        return handler(input, running_mean, running_var, weight, bias, training, momentum, eps)

    return reordered


def _register() -> None:
    for fn, op in _FUNCTIONS.items():
        TORCH_TO_LTORCH[fn] = _writing(fn, schema_writes(op._schema) or _RUNNING_STATISTICS)
        MUTATING.add(fn)
    for fn, f_fn in _REORDERED.items():
        TORCH_TO_LTORCH[fn] = _reordered(TORCH_TO_LTORCH[f_fn])
        MUTATING.add(fn)


_register()
