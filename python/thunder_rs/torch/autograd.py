"""Autograd state of tensors: ``detach`` (and ``.data``), ``requires_grad_`` and the
``requires_grad`` setter.

Whether a value requires grad is part of its metadata in the trace, so these act on the
recording: ``detach`` records a fresh value with grad mode off, ``requires_grad_`` changes the
flag of a value the program made (later ops follow it, as in eager). Changing the flag of a
trace input would change the caller's tensor, which is refused.
"""

import torch

from thunder_rs import prims
from thunder_rs.core.lang import dual_tensors, inner_leaves
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH, user_location
from thunder_rs.core.lang.recorder import current
from thunder_rs.errors import ThunderError
from thunder_rs.torch.symbols import torchsymbol

__all__ = ["detach", "requires_grad_"]


@torchsymbol(torch.Tensor.detach, torch.detach, properties=("data",))
def detach(a):
    """``a`` cut from autograd: a fresh value recorded with grad mode off, so it requires no grad
    and the VJP pass stops there."""
    with torch.no_grad():
        out = prims.convert_element_type(a, a.dtype)
    dual_tensors.cut(out, a)
    return out


def requires_grad_(a, requires_grad=True):
    """``a.requires_grad_(flag)``. Not a symbol: it records no call but changes the flag of a
    recorded value, and returns ``a`` itself (a composite returning its input would dissolve)."""
    flag = bool(requires_grad)
    if flag == a.requires_grad:
        return a
    if a._input_vid is not None:
        # The caller's tensor (also after an in-place op rebound the proxy): Rust refuses it.
        target = a._input_vid
    elif flag:
        # A computed value becomes a leaf, as in eager: the flag goes on a fresh copy the proxy
        # now stands for, so that no gradient flows back past it into what computed it
        # (``x.detach().requires_grad_()`` must not reach ``x``).
        target = a._vid = prims.convert_element_type(a, a.dtype)._vid
        inner_leaves.note(a, "Tensor.requires_grad_")
    elif inner_leaves.forget(a):
        # A leaf the program made stops requiring grad, as eager's may: the proxy stands for a
        # copy recorded without grad (the value itself is no input whose flag Rust would change).
        with torch.no_grad():
            target = a._vid = prims.convert_element_type(a, a.dtype)._vid
    else:
        target = a._vid
    try:
        current().set_requires_grad(target, flag)
    except ThunderError as e:
        message = e.args[0].removeprefix("requires_grad_: ")
        e.args = (f"ltorch.requires_grad_: {message} (at {user_location()})", *e.args[1:])
        raise
    with torch._C.DisableTorchFunctionSubclass():
        torch.Tensor.requires_grad_(a, flag)
    return a


def with_zero_gradient(out, *inputs):
    """``out``, computed from ``inputs`` without a differentiable path (a count of nonzeros, an
    identity), given the zero gradient eager's differentiable ops give: ``out`` is selected over
    a sum of the inputs that require grad, which receives zeros (a flag alone would leave the
    inputs' gradients undefined, where eager's are zeros)."""
    if out.requires_grad:
        return out
    return also_zero_gradient(out, *inputs)


def also_zero_gradient(out, *inputs):
    """``out`` with zero gradients for ``inputs`` it was not computed from (as
    ``with_zero_gradient``, whether or not ``out`` requires grad from other inputs): eager's
    empty gradient of a legacy empty operand ``cat`` skips."""
    wanting = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    if not (torch.is_grad_enabled() and wanting) or not (out.dtype.is_floating_point or out.dtype.is_complex):
        return out
    total = None
    for x in wanting:
        part = prims.sum(prims.convert_element_type(x, out.dtype), tuple(range(x.ndim)))
        total = part if total is None else prims.add(total, part)
    shape = tuple(out.shape)
    everywhere = prims.full(shape, True, out.device, torch.bool)
    return prims.where(everywhere, out, prims.broadcast_in_dim(total, shape, ()))


def _set_requires_grad(a, requires_grad):
    """``a.requires_grad = flag``."""
    requires_grad_(a, requires_grad)


TORCH_TO_LTORCH[torch.Tensor.requires_grad_] = requires_grad_
# Assigning a tensor property calls its descriptor's ``__set__`` through ``__torch_function__``.
# (On the class, ``requires_grad`` is that descriptor; the stubs type the instance attribute.)
TORCH_TO_LTORCH[torch._C.TensorBase.requires_grad.__set__] = _set_requires_grad  # type: ignore[attr-defined]
