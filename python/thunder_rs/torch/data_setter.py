"""``tensor.data = value`` inside a traced program (MoCo's momentum encoder:
``param_k.data = param_k.data * m + param_q.data * (1 - m)``).

Eager makes ``tensor`` hold ``value``'s memory, out of autograd's sight: ``tensor`` keeps its
identity (a parameter stays the optimizer's, its gradient still reaches it) and reads the new
values from then on. For a value the program computed, of ``tensor``'s shape, dtype and device,
that is what writing it in through ``tensor.data`` does (``tensor.data.copy_(value)``: a write
autograd does not see, copied back after the call where ``tensor`` is a parameter or buffer).
(Run as an eager fallback, the setter would apply while tracing and again in every call's
value check.) Values whose memory the two tensors would then share (an input, a view of one:
``k.weight.data = q.weight.data`` ties the two) and values of other sizes or dtypes (which swap
the tensor's metadata) are refused, naming the line."""

import torch

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.base.userframe import user_location
from thunder_rs.core.lang.langctx import MUTATING, TORCH_TO_LTORCH
from thunder_rs.errors import ThunderNotImplementedError
from thunder_rs.torch import views


def _refuse(why: str) -> ThunderNotImplementedError:
    return ThunderNotImplementedError(
        f"Tensor.data = value at {user_location()}: {why}, which a traced program cannot make; write the values "
        "in instead (with torch.no_grad(): tensor.copy_(value))"
    )


def set_data(tensor, value) -> None:
    """``tensor.data = value``: ``value`` written into ``tensor`` where autograd does not see."""
    if not isinstance(value, TensorProxy) or value._input_vid is not None or views.root_of(value) is not value:
        raise _refuse("the tensor would share its memory with the value, one the program did not compute itself")
    if (tensor.shape, tensor.dtype, tensor.device) != (value.shape, value.dtype, value.device):
        raise _refuse(
            f"the tensor's size, dtype or device would change (from {list(tensor.shape)} {tensor.dtype} "
            f"{tensor.device} to {list(value.shape)} {value.dtype} {value.device})"
        )
    tensor.data.copy_(value)


_DATA_SETTER = torch._C.TensorBase.data.__set__  # type: ignore[attr-defined]
TORCH_TO_LTORCH[_DATA_SETTER] = set_data
MUTATING.add(_DATA_SETTER)
