"""``tensor.register_hook(fn)`` on a tensor the traced program computed: ``fn`` runs on that
tensor's gradient in every call's backward, as eager's does.

The registration is recorded as an identity call whose backward runs the hooks on the cotangent
(and passes on what one returns in its place), and the proxy is rebound to its output: every later
use of the tensor reads it, so its gradient arrives summed there, as eager's hook sees it. Uses
recorded before the registration would bypass it, so such a registration is refused, as is one on
a trace input or a view (their gradients are not the trace's to hook). A function the program
makes while traced (``lambda g: self.grads.append(g)``) closes over the module clones tracing
runs; the hook keeps the user's modules in their place. A hook that reads a tensor the program
computed is refused: compiled, it would see that of the first call.
"""

import types
from collections import OrderedDict

import torch
from torch.utils.hooks import RemovableHandle

from thunder_rs import _core
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.base.userframe import user_location
from thunder_rs.core.lang.fallback import FALLBACK_IMPLS
from thunder_rs.core.lang.recorder import active_recorder, current, output_meta, proxies
from thunder_rs.core.state.modules import cell_contents, with_originals
from thunder_rs.core.state.observe import thread_state
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError

_NAME = "torch.Tensor.register_hook"


class Hooks:
    """The hooks registered on one traced tensor, in order: what the backward runs on its gradient."""

    def __init__(self):
        self.hooks: dict = OrderedDict()

    def __call__(self, grad):
        for hook in tuple(self.hooks.values()):
            result = hook(grad)
            if result is not None:
                grad = result
        return grad


class TracedHandle(RemovableHandle):
    """The handle ``register_hook`` returns while traced: removing it before the call's end removes
    the hook from every compiled call, as eager's forward removes its own each call; removing it
    later would remove it from the calls to come, where eager's removes one call's hook alone."""

    def __init__(self, hooks: Hooks, recorder):
        super().__init__(hooks.hooks)
        self._recorder = recorder  # (not on ``hooks``, which the trace keeps: the recording keeps the trace's)

    def remove(self) -> None:
        if active_recorder() is not self._recorder:
            raise ThunderNotImplementedError(
                "thunder_rs.jit: a tensor hook's handle from a traced call is removed after that call: compiled "
                "calls share the hook the trace registered, so this would remove it from all of them. Remove it "
                "inside the jitted call, or register the hook on the jitted call's output"
            )
        super().remove()


def _identity(x, hooks):
    return x


def _vjp(args, cotangents, wanted):
    x, hooks = args
    grad = cotangents[0]
    return torch.zeros_like(x) if grad is None else hooks(grad)


_SYMBOL: list[int] = []


def _symbol() -> int:
    if not _SYMBOL:
        sid = _core.register_symbol(_NAME, fallback=True)
        FALLBACK_IMPLS[sid] = _identity
        FALLBACK_IMPLS[_core.register_symbol(f"{_NAME}.vjp", fallback=True)] = _vjp
        _SYMBOL.append(sid)
    return _SYMBOL[0]


def _refuse(why: str):
    return ThunderNotImplementedError(
        f"{_NAME} at {user_location()}: {why}; register the hook on the jitted call's inputs or outputs outside it"
    )


def _untraced(hook):
    """``hook`` keeping the user's modules in place of the clones tracing runs; refused where it
    reads a traced tensor."""
    fn = getattr(hook, "__func__", hook)
    if isinstance(fn, types.FunctionType) and fn.__closure__:
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
            if isinstance(cell_contents(cell), TensorProxy):
                raise _refuse(
                    f"the hook reads {name!r}, a tensor the program computed (compiled, it would read the first call's)"
                )
    observer = thread_state.observer
    return hook if observer is None else with_originals(hook, observer._originals)


def register_hook(t: TensorProxy, hook):
    """``t.register_hook(hook)`` on a traced tensor."""
    with torch._C.DisableTorchFunctionSubclass():
        requires_grad = t.requires_grad
    if not requires_grad:
        raise ThunderRuntimeError("cannot register a hook on a tensor that doesn't require gradient")
    if t._input_vid is not None:
        raise _refuse("a hook on an input of the jitted call (or a parameter, a buffer, a captured tensor)")
    if t._view is not None:
        raise _refuse("a hook on a view")
    rec = current()
    hooks = t._hooks
    if hooks is None or hooks[0] != t._vid:
        if rec.is_read(t._vid):
            raise _refuse("the program used the tensor before registering the hook, whose gradient would bypass it")
        hooks = (None, Hooks())
        meta = output_meta(t.shape, t.dtype, t.device, True)
        out = proxies(rec.call(_symbol(), (t, hooks[1]), None, [meta]))[0]
        t._vid = out._vid
        t._hooks = hooks = (t._vid, hooks[1])
    handle = TracedHandle(hooks[1], rec)
    hooks[1].hooks[handle.id] = _untraced(hook)
    return handle
