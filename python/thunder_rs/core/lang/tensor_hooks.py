"""``tensor.register_hook(fn)`` in a traced program: ``fn`` runs on that tensor's gradient in
every call's backward, as eager's does.

On a trace input (an argument, a parameter or buffer, a captured tensor) the hook is registered
on the call's own tensor, after the call (``InputHook``, an effect every call repeats), as
eager's program registers it on the caller's: torch then runs it on the tensor's whole gradient,
before it reaches ``.grad`` or the tensor's other uses, and several calls' registrations on one
tensor pile up as eager's do.

On a tensor the program computed:

The registration is recorded as an identity call whose backward runs the hooks on the cotangent
(and passes on what one returns in its place), and the proxy is rebound to its output: every later
use of the tensor reads it, so its gradient arrives summed there, as eager's hook sees it. Uses
recorded before the registration would bypass it, so such a registration is refused, as is one on
a view (its gradient is not the trace's to hook). A function the program
makes while traced (``lambda g: self.grads.append(g)``) closes over the module clones tracing
runs; the hook keeps the user's modules in their place. A hook that reads a tensor the program
computed is refused: compiled, it would see that of the first call.
"""

import contextlib
import contextvars
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
                "inside the jitted call, or register the hook outside it (on its input or output)"
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


class InputHook:
    """A hook the program registered on a trace input (``source``: the input's position among a
    call's flat inputs, or a weak reference to the tensor every call takes): every call registers
    it on that call's tensor, unless the program removed it (``hooks`` then holds none)."""

    __slots__ = ("source", "hooks")

    def __init__(self, source, hooks: Hooks):
        self.source, self.hooks = source, hooks

    def effect(self, extras: list) -> "InputHook":
        return self

    def apply(self, extras, flat) -> None:
        t = flat[self.source] if type(self.source) is int else self.source()
        for hook in self.hooks.hooks.values():
            t.register_hook(hook)


#: The list the hooks on trace inputs are noted in (``InputHook``s, among the acquisition's other
#: effects) while a program is traced.
_input_hooks: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_input_hooks", default=None)


@contextlib.contextmanager
def noting_input_hooks(effects: list):
    """Appends an ``InputHook`` to ``effects`` for each hook the program registers on a trace input."""
    token = _input_hooks.set(effects)
    try:
        yield
    finally:
        _input_hooks.reset(token)


def _on_input(t: TensorProxy, hook, rec):
    """``t.register_hook(hook)`` on a trace input: noted for every call to register on its tensor."""
    noted = _input_hooks.get()
    if t._source is None or noted is None:
        raise _refuse(
            "a hook on a tensor an argument object holds, or one the program made from Python values (calls do "
            "not take the same tensor)"
        )
    if t._vid != t._input_vid:
        raise _refuse("a hook on an input the program wrote in place")
    hooks = Hooks()
    handle = TracedHandle(hooks, rec)
    hooks.hooks[handle.id] = _untraced(hook)
    noted.append(InputHook(t._source, hooks))
    return handle


def register_hook(t: TensorProxy, hook):
    """``t.register_hook(hook)`` on a traced tensor."""
    with torch._C.DisableTorchFunctionSubclass():
        requires_grad = t.requires_grad
    if not requires_grad:
        raise ThunderRuntimeError("cannot register a hook on a tensor that doesn't require gradient")
    if t._input_vid is not None and t._view is None:
        return _on_input(t, hook, current())
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
