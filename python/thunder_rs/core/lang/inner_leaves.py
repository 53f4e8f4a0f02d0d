"""Leaves the program creates: tensors made to require grad inside it (``x.detach().requires_grad_()``,
``torch.zeros(3, requires_grad=True)``, ``nn.Parameter(t)`` in a forward).

In eager such a tensor is a new leaf of autograd on every call: what the program computes from it
requires grad, and a backward accumulates its gradient into its ``.grad``. The compiled call
differentiates with respect to its inputs only, so it keeps eager's behaviour where the leaf's
gradient is invisible: the leaf stays inside the program and some input requires grad (Hugging
Face's ``enable_input_require_grads`` under a LoRA, an input-gradient map computed from a detached
copy), where the outputs carry the call's backward and the inputs get eager's gradients. Where the
leaf leaves the program (returned, or stored on an object) the trace is refused, naming the construct
and the line that made it: the caller would hold a tensor that is no leaf, or requires no grad, and
whose ``.grad`` a backward never fills.
Where no input the outputs read requires grad, the outputs computed from the leaf require grad as
eager's do: the call gives them a backward that reaches no tensor the caller holds, as the leaf is
not among them (``core.run.autograd.through_inner_leaves``).
"""

import contextlib
import contextvars
from collections.abc import Iterator

from torch.utils._pytree import tree_leaves

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.base.userframe import user_location
from thunder_rs.errors import ThunderNotImplementedError

#: Per acquisition: ``{id(proxy): (proxy, construct, user's line)}`` of the leaves the program
#: created. By proxy, not value: an in-place op under ``no_grad`` rebinds the proxy to a new value,
#: where eager's tensor stays that leaf.
_leaves: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_inner_leaves", default=None)


@contextlib.contextmanager
def noting() -> Iterator[dict]:
    """Notes the leaves the program traced inside creates."""
    leaves: dict = {}
    token = _leaves.set(leaves)
    try:
        yield leaves
    finally:
        _leaves.reset(token)


def note(t: TensorProxy, construct: str) -> None:
    """``t`` is a leaf the program made with ``construct`` (at the user's line)."""
    t._leaf = True  # (``is_leaf`` and ``grad_fn`` answer as eager's for a leaf)
    leaves = _leaves.get()
    if leaves is not None:
        leaves[id(t)] = (t, construct, user_location())


def forget(t: TensorProxy) -> bool:
    """``t`` is no leaf the program made (any more): it requires grad as the output of an autograd
    node (a custom Function's), or stopped requiring grad. Returns whether it was one."""
    t._leaf = False
    leaves = _leaves.get()
    return leaves is not None and leaves.pop(id(t), None) is not None


def refuse_unkept(leaves: dict, out, stored: list) -> bool:
    """Raises where the program's leaves (``noting``) would not behave as eager's: one of them is
    returned (``out``) or stored (``stored``: the values the program sets on objects). Returns
    whether the program made any: the call then gives a backward of its own to the outputs that
    require grad through them alone (``through_inner_leaves``)."""
    for where, values in (("returns", out), ("stores", stored)):
        for t in tree_leaves(values):
            made = leaves.get(id(t))
            if made is not None and made[0] is t:
                _, construct, line = made
                raise ThunderNotImplementedError(
                    f"{construct}: the program {where} a tensor it made a leaf that requires grad (at {line}); in "
                    "eager a backward fills its .grad, which a compiled call, differentiating with respect to its "
                    "inputs, does not. Create the tensor outside and pass it in, or return a tensor computed from it"
                )
    return bool(leaves)


def grad_outputs(outputs) -> tuple:
    """The positions of the trace's flat ``outputs`` (one, or a tuple or list) that require grad."""
    flat = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    return tuple(i for i, t in enumerate(flat) if isinstance(t, TensorProxy) and t.requires_grad)
