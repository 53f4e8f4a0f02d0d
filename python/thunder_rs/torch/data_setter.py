"""``tensor.data = value`` inside a traced program (MoCo's momentum encoder:
``param_k.data = param_k.data * m + param_q.data * (1 - m)``).

Eager makes ``tensor`` hold ``value``'s memory, out of autograd's sight: ``tensor`` keeps its
identity (a parameter stays the optimizer's, its gradient still reaches it) and reads the new
values from then on, while its old memory (``old = p.detach()`` taken before) keeps the old
values, and later writes to ``value`` show in ``tensor``. In the trace, the values are written in
through ``tensor.data`` (a write autograd does not see); where ``tensor`` is a trace input (a
parameter, a buffer, an argument), the call then gives the caller's tensor the memory of the
value it computed, or of the input ``value`` is (``k.weight.data = q.weight.data`` ties the two),
by ``.data =`` as eager does (``writeback.plan``), not by a copy into its old memory. (Run as an
eager fallback, the setter would apply while tracing and again in every call's value check.)
A value of other sizes or another dtype (``p.data = p.data.half()``, a pruned weight) makes the
tensor's proxy stand for it from there on, sizes, dtype and layout, as eager's tensor does
(``_regrow``); the call rebinds the caller's tensor alike, and the next call, keyed on the new
metadata, recompiles. Refused, naming the line: such a value for a tensor the program captured
(which it holds itself and reads the old metadata of), another device, a gradient recorded into
the tensor after (``core.lang.regrown``), a view of a tensor as the value or as the tensor, a
tensor written in place before its ``.data`` is given, and (``writeback.plan``) either written in
place after."""

import torch

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.base.userframe import user_location
from thunder_rs.core.lang.langctx import MUTATING, TORCH_TO_LTORCH
from thunder_rs.core.lang.recorder import active_captures
from thunder_rs.core.lang.regrown import REGROWN, stand_in
from thunder_rs.errors import ThunderNotImplementedError
from thunder_rs.torch import views


def _refuse(why: str, where: str | None = None, assign: bool = True) -> ThunderNotImplementedError:
    instead = (
        ", which a traced program cannot make; write the values in instead (with torch.no_grad(): tensor.copy_(value))"
        if assign
        else ""
    )
    return ThunderNotImplementedError(f"Tensor.data = value at {where or user_location()}: {why}{instead}")


def _source(tensor, value):
    """The tensor whose memory ``tensor`` is given: ``value``, or the tensor it is ``.data`` or
    ``detach()`` of; refused where it would be a view of another or ``tensor`` is one."""
    if not isinstance(value, TensorProxy):
        raise _refuse(f"the value is a {type(value).__name__}")
    if tensor._view is not None or tensor._piece_of is not None:
        raise _refuse("the tensor is a view of another, which eager gives the memory and its base does not see")
    root = views.root_of(value)
    if root is not value and not all(getattr(step, "detached", False) for step in value._view.steps):
        raise _refuse(
            "the tensor would share its memory with a view of another tensor (its base's memory, which the "
            "trace does not give it); give it a copy instead (tensor.data = value.clone())",
            assign=False,
        )
    if tensor._input_vid is None and root._input_vid is not None:
        raise _refuse("the tensor would share its memory with the value, one the program did not compute itself")
    rebound = root._rebound
    if rebound is not None and root._vid == rebound[2]:  # (given another's memory before: that one)
        return rebound[0]
    return root


def _keep_old_memory(tensor) -> None:
    """Cuts ``tensor``'s live views from it: they keep its old values, as eager's keep its old
    memory, and a write to them is refused (``TensorProxy._old_memory``)."""
    if tensor._pieces is not None:
        raise _refuse("the tensor's memory is shared with pieces of unsafe_split")
    where = user_location()
    for ref in tensor._views or ():
        view = ref()
        if view is not None:
            view._view, view._old_memory = None, where
    tensor._views = None


def set_data(tensor, value) -> None:
    """``tensor.data = value``: ``value`` written into ``tensor`` where autograd does not see; a
    trace input is noted as given the memory of the value (``TensorProxy._rebound``)."""
    source = _source(tensor, value)
    if tensor.device != value.device:
        raise _refuse(
            f"the tensor's device would change (from {tensor.device} to {value.device}); move it outside the "
            "jitted function (module.to(device))"
        )
    if tensor._input_vid is not None:
        rebound = tensor._rebound
        if tensor._vid != (tensor._input_vid if rebound is None else rebound[2]):
            raise _refuse("the tensor was written in place before, in memory eager then leaves to its old aliases")
    if (tensor.shape, tensor.dtype) != (value.shape, value.dtype):
        _hold_captured(tensor, value)
        _regrow(tensor, value, source)
        return
    if source is tensor:  # (``p.data = p.detach()``: p keeps its memory)
        return
    _keep_old_memory(tensor)
    tensor.data.copy_(value)
    if tensor._input_vid is not None:
        tensor._rebound = (source, source._vid, tensor._vid, user_location())  # (read by ``writeback.plan``)


def _hold_captured(tensor, value) -> None:
    """Where the program holds the caller's tensor for ``tensor`` itself (one it captured, or found
    in an argument object), gives that tensor stand-in memory of ``value``'s sizes and dtype while
    traced (``regrown.stand_in``): the program reads them after the assignment as eager's does."""
    captures = active_captures()
    if captures is None:
        return
    at = next((k for k, p in enumerate(captures.proxies) if p is tensor), None)
    if at is None:
        return
    real = captures.tensors[at]
    if not isinstance(real, torch.Tensor):  # (an argument object's: ``reached.ArgumentTensor``)
        if real.stand_in is tensor:  # (the program holds the proxy)
            return
        holder, name = real.holder, real.name
        real = holder[name] if isinstance(holder, (list, dict)) else getattr(holder, name, None)
    if not (isinstance(real, torch.Tensor) and captures.proxy(real) is tensor and stand_in(real, value, tensor)):
        raise _refuse(
            f"the tensor's sizes or dtype would change (from {list(tensor.shape)} {tensor.dtype} to "
            f"{list(value.shape)} {value.dtype}) on a tensor the jitted function holds where thunder_rs cannot "
            "follow it; pass the tensor as an argument or jit the module that holds it (thunder_rs.jit(model)), "
            "or assign it outside the jitted function",
            assign=False,
        )


def _regrow(tensor, value, source) -> None:
    """``tensor.data = value`` of other sizes or another dtype: from here on ``tensor`` stands for
    ``value`` (its sizes, dtype and layout), keeping its identity and requires_grad as eager's
    does; a gradient recorded into it after is refused (``core.lang.regrown``)."""
    _keep_old_memory(tensor)
    root = views.root_of(value)
    with torch._C.DisableTorchFunctionSubclass():
        _DATA_SETTER(tensor, value)  # (torch's own metadata of the proxy: sizes, dtype, strides)
        requires_grad = tensor.requires_grad
    attrs = tensor.__dict__
    attrs["_vid"], attrs["_shape"], attrs["_dtype"] = value._vid, value._shape, value._dtype
    attrs["_symbolic"], attrs["_strides"], attrs["_offset"] = value._symbolic, root._strides, root._offset
    where = user_location()
    if requires_grad:
        tensor._regrown = where
        REGROWN[0] = True
    if tensor._input_vid is not None:
        tensor._rebound = (source, source._vid, tensor._vid, where)  # (read by ``writeback.plan``)


_DATA_SETTER = torch._C.TensorBase.data.__set__  # type: ignore[attr-defined]
TORCH_TO_LTORCH[_DATA_SETTER] = set_data
MUTATING.add(_DATA_SETTER)
