"""Which outputs of a differentiable call torch may return as views, decided when the call is
compiled: ``autograd._own_views`` detaches an output that is a view of a tensor only the call made
(torch's ``tensordot`` is ``mm(...).reshape(...)``), reading ``_is_view()`` of each output on every
call (~0.1 us an output); outputs whose implementation returns new tensors are not read.

An implementation returns new tensors where it is a builtin binding of aten ops (``torch.mul``,
``torch._C._nn.gelu``, ``operator.mul`` on tensors) none of which is a composite
(CompositeImplicitAutograd: it runs above autograd, so the views it takes of its intermediates are
views, as tensordot's are) or returns an alias of its inputs (a view op: ``aten::t``); a kernel
below autograd takes no view autograd sees. Anything else may: a Python function, a fusion
region's callable, an eager fallback.
"""

import functools
import types

import torch

#: What a call may be made by that binds aten ops by its name.
_BUILTINS = (types.BuiltinFunctionType, types.MethodDescriptorType)
_has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key


def returns_new_tensors(fn) -> bool:
    """Whether each tensor ``fn`` returns is new memory torch does not take for a view (see above)."""
    try:
        return _returns_new_tensors(fn)
    except TypeError:  # (an unhashable callable: not a builtin)
        return False


@functools.cache
def _returns_new_tensors(fn) -> bool:
    if isinstance(fn, torch._ops.OpOverload):
        return _new(fn) is True
    if not isinstance(fn, _BUILTINS):
        return False
    try:
        packet = getattr(torch.ops.aten, fn.__name__)
        overloads = [getattr(packet, name) for name in packet.overloads()]
    except (AttributeError, RuntimeError):
        return False
    # (``out=`` forms are never called by the generated code, and the interpreter's own overloads
    # of a name, ``aten::mul.int``, are not dispatched)
    found = [_new(op) for op in overloads if not _writes_out(op)]
    return True in found and False not in found


def _writes_out(op) -> bool:
    return any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)


def _new(op) -> bool | None:
    """Whether the aten ``op`` returns new tensors; None for an overload the dispatcher does not run."""
    try:
        composite = _has_kernel(op.name(), "CompositeImplicitAutograd")
    except RuntimeError:
        return None
    return not composite and all(r.alias_info is None for r in op._schema.returns)


def viewable_outputs(trace, impls: dict) -> tuple | None:
    """The positions of a differentiated forward's flat outputs (``trace``, its execution trace)
    that may be views torch made; None where the trace does not say which call computes each."""
    callees = trace.output_callees()
    if callees is None:
        return None
    return tuple(i for i, name in enumerate(callees) if name is not None and not returns_new_tensors(impls.get(name)))
