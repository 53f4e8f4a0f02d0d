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
Refused, naming the line: values of other sizes or dtypes (which swap the tensor's metadata the
rest of the trace reads), a view of a tensor as the value or as the tensor, a tensor written in
place before its ``.data`` is given, and (``writeback.plan``) either written in place after."""

import torch

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.base.userframe import user_location
from thunder_rs.core.lang.langctx import MUTATING, TORCH_TO_LTORCH
from thunder_rs.errors import ThunderNotImplementedError
from thunder_rs.torch import views


def _refuse(why: str, where: str | None = None) -> ThunderNotImplementedError:
    return ThunderNotImplementedError(
        f"Tensor.data = value at {where or user_location()}: {why}, which a traced program cannot make; write the "
        "values in instead (with torch.no_grad(): tensor.copy_(value))"
    )


def _source(tensor, value):
    """The tensor whose memory ``tensor`` is given: ``value``, or the tensor it is ``.data`` or
    ``detach()`` of; refused where it would be a view of another or ``tensor`` is one."""
    if not isinstance(value, TensorProxy):
        raise _refuse(f"the value is a {type(value).__name__}")
    if tensor._view is not None or tensor._piece_of is not None:
        raise _refuse("the tensor is a view of another, which eager gives the memory and its base does not see")
    root = views.root_of(value)
    if root is not value and not all(getattr(step, "detached", False) for step in value._view.steps):
        raise _refuse("the tensor would share its memory with a view of another tensor")
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
    if (tensor.shape, tensor.dtype, tensor.device) != (value.shape, value.dtype, value.device):
        raise _refuse(
            f"the tensor's size, dtype or device would change (from {list(tensor.shape)} {tensor.dtype} "
            f"{tensor.device} to {list(value.shape)} {value.dtype} {value.device})"
        )
    if tensor._input_vid is not None:
        rebound = tensor._rebound
        if tensor._vid != (tensor._input_vid if rebound is None else rebound[2]):
            raise _refuse("the tensor was written in place before, in memory eager then leaves to its old aliases")
    if source is tensor:  # (``p.data = p.detach()``: p keeps its memory)
        return
    _keep_old_memory(tensor)
    tensor.data.copy_(value)
    if tensor._input_vid is not None:
        tensor._rebound = (source, source._vid, tensor._vid, user_location())  # (read by ``writeback.plan``)


_DATA_SETTER = torch._C.TensorBase.data.__set__  # type: ignore[attr-defined]
TORCH_TO_LTORCH[_DATA_SETTER] = set_data
MUTATING.add(_DATA_SETTER)
