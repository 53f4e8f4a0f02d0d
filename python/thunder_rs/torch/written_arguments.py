"""Torch functions that write into some of their tensor arguments though their names do not end
in ``_``: ``torch.fused_moving_avg_obs_fake_quant`` (QAT's fused fake-quantize modules) updates
the observer's running minimum and maximum, the scale and the zero point in place.

Each is functionalised as the in-place calls are (``inplace``): one eager fallback runs the
function on copies of the arguments it writes and returns its result and their new values,
which are then written (``assign``, where autograd does not see, as eager writes them). Run on
the trace's tensors, the fallback's backward, which runs it again, leaves the module's state as
the forward left it. Which arguments a function writes is read from its aten schema
(``Tensor(a!) running_min``)."""

import functools

import torch

from thunder_rs.core.lang.fallback import user_fallback
from thunder_rs.core.lang.langctx import MUTATING, TORCH_TO_LTORCH
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.base.userframe import user_location
from thunder_rs.errors import ThunderNotImplementedError
from thunder_rs.torch.inplace import assign
from thunder_rs.torch.view_scatters import stop_gradient

#: The torch functions, and the aten op whose schema names what they write.
_FUNCTIONS = {
    torch.fused_moving_avg_obs_fake_quant: torch.ops.aten.fused_moving_avg_obs_fake_quant.default,
    torch._fused_moving_avg_obs_fq_helper: torch.ops.aten._fused_moving_avg_obs_fq_helper.default,
}


def written_positions(op) -> dict[str, int]:
    """The arguments ``op`` writes (other than ``out=``): ``{name: position}``."""
    return {
        a.name: i
        for i, a in enumerate(op._schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write and not a.kwarg_only
    }


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
    positions = tuple(written.values())
    functional = _on_copies(fn, positions)
    parameters = [a.name for a in _FUNCTIONS[fn]._schema.arguments]

    @functools.wraps(fn)
    def handler(*args, **kwargs):
        args = (*args, *(kwargs.pop(name) for name in parameters[len(args) :] if name in kwargs))
        _check_sized(fn, args, kwargs, written)
        outs = user_fallback(functional, args, kwargs)
        results, values = outs[: len(outs) - len(positions)], outs[len(outs) - len(positions) :]
        for i, value in zip(positions, values):
            if isinstance(args[i], TensorProxy):
                assign(args[i], stop_gradient(value) if value.requires_grad else value, fn.__name__, tracked=False)
        return results[0] if len(results) == 1 else tuple(results)

    return handler


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


def _register() -> None:
    for fn, op in _FUNCTIONS.items():
        TORCH_TO_LTORCH[fn] = _writing(fn, written_positions(op))
        MUTATING.add(fn)


_register()
