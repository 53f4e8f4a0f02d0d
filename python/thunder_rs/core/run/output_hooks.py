"""Tensor hooks on the outputs of a compiled call with several differentiable outputs.

Eager gives each output its own autograd node: a backward that does not reach an output never runs
its node, so the hooks the caller registers on it (``out.register_hook``) are not called. The
compiled call is one node for all its outputs: autograd runs it when any of them is reached and
calls the hooks of every output, with None for the gradient of one it did not reach (a hook
written for eager, ``lambda g: g * 2``, raised a TypeError). ``guard_hooks`` gives each such output
a hook dictionary whose one hook calls the caller's hooks only with a gradient, as eager's node
would. Hooks of torch's own (``register_multi_grad_hook``'s, which count a call per output of a
node that runs) are called with None still."""

import weakref
from collections import OrderedDict

import torch

from thunder_rs.errors import ThunderNotImplementedError

_Tensor = torch.Tensor


def _hook_name(hook) -> str:
    return getattr(hook, "__name__", "<unknown>")


def _checked(original: torch.Tensor, result, hook) -> None:
    """Raises the error torch's engine raises for a hook that returned an unfit gradient
    (``check_single_result`` in ``python_hook.cpp``)."""
    if not isinstance(result, _Tensor):
        raise RuntimeError(f"expected Variable or None (got {type(result).__name__})")
    if result.dtype != original.dtype or result.layout != original.layout or result.device != original.device:
        raise RuntimeError(
            f"hook '{_hook_name(hook)}' has changed the type of value (was {original.type()} got {result.type()})"
        )
    if result.shape != original.shape:
        raise RuntimeError(f"hook '{_hook_name(hook)}' has changed the size of value")


def _of_torch(hook) -> bool:
    return getattr(hook, "__module__", None) in _TORCH_HOOK_MODULES


#: The modules of torch's hooks that expect a call per output of a node that runs, None included.
_TORCH_HOOK_MODULES = frozenset({"torch.autograd.graph"})


def _calling_with_gradients(hooks: OrderedDict):
    def hook(grad):
        for user_hook in tuple(hooks.values()):
            if grad is None and not _of_torch(user_hook):
                continue
            result = user_hook(grad)
            if result is not None:
                if grad is None:
                    raise RuntimeError("can't replace a None gradient with a non-None value")
                _checked(grad, result, user_hook)
                grad = result
        return grad

    return hook


def refuse_inner(ctx, inner, grads: tuple) -> None:
    """Raises where the caller's hooks ran, or ``retain_grad()`` keeps the gradient, of an output
    that a reached output was computed from inside the program (``inner``: ``j ->`` those outputs,
    ``generate._inner_outputs``; asked only of the outputs it watches, which the forward keeps by
    weak reference: ``autograd._keep_residuals``): eager's hooks and ``.grad`` see the gradient
    flowing back from them, the call's one node gives them the output's own cotangent only (or
    none)."""
    hooked = getattr(ctx, "hooked", None)
    for j, ref in getattr(ctx, "watched", ()):
        hooks = hooked.get(j) if hooked else None
        user = [h for h in hooks.values() if not _of_torch(h)] if hooks else None
        out = ref()
        if not user and (out is None or not out.retains_grad or out.grad_fn is not ctx):
            continue  # (no hook, no retained .grad of the call's node: a view of an input's is another's)
        reached = sorted(k for k in inner(j) if grads[k] is not None)
        if reached and user:
            code = getattr(user[0], "__code__", None)
            at = "" if code is None else f" (registered hook at {code.co_filename}:{code.co_firstlineno})"
            raise ThunderNotImplementedError(_INNER.format(j, reached, at))
        if reached:
            raise ThunderNotImplementedError(_RETAINED.format(j, reached))


_INNER = (
    "Tensor.register_hook: a hook on output {0} of a thunder_rs-compiled call{2}, from which the call computed "
    "its outputs {1} that this backward reaches: eager's hook sees the gradient flowing back from them, which the "
    "compiled call (one autograd node) does not compute; register the hook inside the compiled function"
)

_RETAINED = (
    "Tensor.retain_grad: output {0} of a thunder_rs-compiled call keeps its .grad, and the call computed from it "
    "its outputs {1} that this backward reaches: eager's .grad holds the gradient flowing back from them, which the "
    "compiled call (one autograd node) does not compute; return the gradient you need from a backward of that "
    "output alone, or call retain_grad() inside the compiled function"
)


class _Hooks(OrderedDict):
    """An output's ``_backward_hooks``, where ``Tensor.register_hook`` puts the caller's hooks (as
    it finds one there), which the node calls only on a gradient (``_calling_with_gradients``),
    through the dictionary it registered last for them (``holder``)."""

    def __init__(self, out: torch.Tensor, rank: int):
        super().__init__()
        self.tensor, self.rank = weakref.ref(out), rank
        self.holder: OrderedDict = OrderedDict()


def _register(node, out: torch.Tensor, hooks: _Hooks) -> None:
    """Registers with ``node`` a dictionary whose one hook calls ``hooks`` on ``out``'s gradient."""
    hooks.holder.clear()  # (a dictionary registered before calls nothing more)
    hooks.holder = OrderedDict({-1: _calling_with_gradients(hooks)})
    out._backward_hooks = hooks.holder
    try:
        _FunctionBase._register_hook_dict(node, out)
    finally:
        out._backward_hooks = hooks


_FunctionBase = torch._C._FunctionBase


def guard_hooks(function: type, ranks: tuple, inner=None) -> None:
    """Makes the hooks the caller registers on the outputs of the autograd ``function`` of a call
    with several differentiable outputs, where their node is the call's (not a view of an input),
    run only on a gradient (see the module), output by output in eager's order. Nothing is done
    per call: torch's ``register_hook`` asks the output's node to register its hook dictionary
    (``_register_hook_dict``), which the node of ``function`` (its ``_backward_cls``) does as below;
    no other node is touched.

    Eager runs the outputs' nodes, and so their hooks, latest made first; the call's node calls the
    dictionaries registered with it in the order they were. ``ranks``: per flat output position,
    the value id of its value in the trace (recorded in program order; -1: none). An output hooked
    for the first time registers its dictionary before those of outputs made before it, which
    register theirs again after it (the ones registered before call nothing more). ``inner``: for
    ``core.base.captured_outputs``."""
    function._thunder_rs_inner = inner  # type: ignore[attr-defined]

    def _register_hook_dict(node, tensor: torch.Tensor) -> None:
        j = tensor.output_nr
        hooked = getattr(node, "hooked", None)
        if hooked is None:
            node.hooked = hooked = {}
        hooks = hooked[j] = _Hooks(tensor, ranks[j] if j < len(ranks) and ranks[j] is not None else -1)
        after = sorted((h for h in hooked.values() if h.rank < hooks.rank), key=lambda h: -h.rank)
        _register(node, tensor, hooks)
        for h in after:
            out = h.tensor()
            if out is not None:  # (a dropped output's hooks stay where they were)
                _register(node, out, h)

    function._backward_cls._register_hook_dict = _register_hook_dict  # type: ignore[attr-defined]
