"""Custom ``torch.autograd.Function``s inside a traced program.

``Fn.apply(*args)`` on traced tensors becomes one composite call, ``autograd_function.<Fn>``, whose
decomposition is ``Fn.forward`` traced and whose grad rule is ``Fn.backward`` traced, as eager
runs them: the forward with a context that saves tensors and attributes, the backward with the
outputs' cotangents (zeros for outputs without one unless the forward turned materialising off),
its gradients summed to the inputs' shapes and cast to their dtypes as autograd does. Both
``forward(ctx, ...)`` and ``forward(...)`` + ``setup_context(ctx, inputs, output)`` are supported.
What a trace cannot keep is refused with the Function's name: ``ctx.mark_dirty`` (in-place
forwards), forward-mode AD (``jvp``), outputs other than tensors.
"""

import inspect

import torch
from torch.autograd.function import Function

from thunder_rs import _core
from thunder_rs.core.lang import autocast, inner_leaves
from thunder_rs.core.lang.fallback import materialized
from thunder_rs.core.lang.grad import get_grad, put_grad
from thunder_rs.core.lang.langctx import torch_symbol, user_location
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.recorder import GRAD_RULES, lift_captured, record_composite
from thunder_rs.core.lang.version_tracking import note_saved
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError
from thunder_rs.core.lang.symint import same_shape

#: Function class -> its composite symbol id.
_SYMBOLS: dict[type, int] = {}


class TraceContext:
    """The ``ctx`` a custom Function's forward and backward see while traced."""

    def __init__(self, name: str, args: tuple):
        self._name = name
        self.needs_input_grad = tuple(isinstance(a, TensorProxy) and a.requires_grad for a in args)
        self.materialize_grads = True
        self.non_differentiable: list = []
        self.to_save: tuple = ()

    def save_for_backward(self, *tensors) -> None:
        self.to_save = tensors

    @property
    def saved_tensors(self) -> tuple:
        return self.to_save

    def mark_non_differentiable(self, *tensors) -> None:
        self.non_differentiable.extend(tensors)

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = value

    def mark_dirty(self, *tensors) -> None:
        raise ThunderNotImplementedError(
            f"torch.autograd.Function: {self._name}.forward marks its inputs dirty (writes them in place) at "
            f"{user_location()}, which thunder_rs.jit does not trace; return new tensors instead"
        )

    def save_for_forward(self, *tensors) -> None:
        raise ThunderNotImplementedError(
            f"torch.autograd.Function: {self._name} saves for forward-mode AD, which thunder_rs.jit does not support"
        )


def function_symbols() -> list[tuple[type, int]]:
    """Each Function class traced so far with its composite symbol id."""
    return list(_SYMBOLS.items())


def apply(cls, args: tuple, kwargs: dict):
    """``cls.apply(*args, **kwargs)`` recorded on traced tensors."""
    name = f"autograd_function.{cls.__qualname__}"
    if _has_setup_context(cls):  # eager binds the forward's defaults (and keywords) into its inputs
        bound = inspect.signature(cls.forward).bind(*args, **kwargs)
        bound.apply_defaults()
        args, kwargs = bound.args, {}
    if kwargs:
        raise ThunderNotImplementedError(
            f"torch.autograd.Function: {cls.__qualname__}.apply at {user_location()} "
            "takes keyword arguments; pass them positionally"
        )
    # A tensor the program holds (a parameter read through a closure or a global) is the trace input
    # capturing it, which requires grad as the tensor does: its gradient flows through the backward.
    args, _ = lift_captured(args, {})
    sid = _SYMBOLS.get(cls)
    if sid is None:
        sid = _SYMBOLS[cls] = _core.register_symbol(f"{name}.{len(_SYMBOLS)}")
        GRAD_RULES[sid] = _grad_rule(cls)
    _last_context[0] = None
    out = record_composite(sid, name, lambda *a: _forward(cls, TraceContext(cls.__qualname__, a), a), args, {})
    ctx, _last_context[0] = _last_context[0], None
    if ctx is not None:  # what it saved, which eager's backward checks the versions of
        note_saved(f"{cls.__qualname__}.apply", ctx.to_save, out)
    return out


#: The context of the forward traced last (by the decomposition or by the grad rule).
_last_context: list = [None]


def _has_setup_context(cls) -> bool:
    return getattr(cls.setup_context, "__func__", cls.setup_context) is not getattr(
        Function.setup_context, "__func__", Function.setup_context
    )


def _forward(cls, ctx: TraceContext, args: tuple):
    # As eager runs it: the forward's own calls are not differentiated, and autocast casts them.
    with torch.no_grad(), autocast.user_code():
        if _has_setup_context(cls):
            out = cls.forward(*args)
            cls.setup_context(ctx, args, out)
        else:
            out = cls.forward(ctx, *args)
    _last_context[0] = ctx
    outs = out if isinstance(out, tuple) else (out,)
    if not outs or not all(isinstance(o, TensorProxy) for o in outs):
        raise ThunderNotImplementedError(
            f"torch.autograd.Function: {cls.__qualname__}.forward returns {type(out).__name__} values other than "
            "tensors of the traced program, which thunder_rs.jit does not trace"
        )
    # An input returned as it is (``x.view_as(x)``, a gradient reversal layer) is a new value of
    # the Function, which its backward differentiates: a copy of it.
    inputs = {a._vid for a in args if isinstance(a, TensorProxy)}
    if any(o._vid in inputs for o in outs):
        copied = tuple(torch_symbol(torch.clone)(o) if o._vid in inputs else o for o in outs)
        return copied if isinstance(out, tuple) else copied[0]
    return out


def _grad_rule(cls):
    """The grad rule of ``cls``'s composite: its forward, then its backward on the cotangents."""

    def rule(*args):
        ctx = TraceContext(cls.__qualname__, args)
        out = _forward(cls, ctx, args)
        outs = out if isinstance(out, tuple) else (out,)
        for o in outs:
            _mark_as_eager(o, ctx)
        cotangents = [_cotangent(o, ctx) for o in outs]
        if not any(isinstance(o, TensorProxy) and o.requires_grad for o in outs):
            return out  # no output is differentiable: eager never calls the backward
        with autocast.user_code_without_autocast():
            grads = cls.backward(ctx, *cotangents)
        grads = grads if isinstance(grads, tuple) else (grads,)
        if len(grads) > len(args) and all(g is None for g in grads[len(args) :]):
            grads = grads[: len(args)]  # eager accepts extra trailing Nones
        if len(grads) != len(args):
            raise ThunderRuntimeError(
                f"torch.autograd.Function: {cls.__qualname__}.backward returned an incorrect "
                f"number of gradients (expected {len(args)}, got {len(grads)})"
            )
        for a, g in zip(args, grads):
            if isinstance(a, TensorProxy) and a.requires_grad and g is not None:
                put_grad(a, _conform(cls, a, g))
        return out

    return rule


def _mark_as_eager(out: TensorProxy, ctx: TraceContext) -> None:
    """Gives ``out`` the ``requires_grad`` eager gives a Function's output (some input requires
    grad here): a floating-point output not marked non-differentiable requires grad whatever its
    forward computed it from (a straight-through ``sign``, a forward under ``no_grad``)."""
    differentiable = (out.dtype.is_floating_point or out.dtype.is_complex) and not any(
        out is t for t in ctx.non_differentiable
    )
    if differentiable != out.requires_grad:
        torch_symbol(torch.Tensor.requires_grad_)(out, differentiable)
        inner_leaves.forget(out)  # (the output of the Function's node)


def _cotangent(out: TensorProxy, ctx: TraceContext):
    differentiable = out.dtype.is_floating_point or out.dtype.is_complex
    if differentiable and not any(out is t for t in ctx.non_differentiable):
        return materialized(get_grad(out)) if ctx.materialize_grads else get_grad(out)
    return torch_symbol(torch.zeros_like)(out) if ctx.materialize_grads else None


def _conform(cls, a: TensorProxy, g):
    """``g`` as autograd makes a Function's gradient: summed to the input's shape where it
    broadcasts to it (``sum_to_size``, as autograd's ``validate_outputs``), cast to its dtype."""
    if not isinstance(g, TensorProxy):
        raise ThunderRuntimeError(
            f"torch.autograd.Function: {cls.__qualname__}.backward returned "
            f"{type(g).__name__} as a gradient; expected a tensor or None"
        )
    if not same_shape(g.shape, a.shape):
        try:
            expandable = torch.broadcast_shapes(tuple(a.shape), tuple(g.shape)) == tuple(g.shape)
        except RuntimeError:
            expandable = False
        if not expandable:
            raise ThunderRuntimeError(
                f"torch.autograd.Function: {cls.__qualname__}.backward returned a gradient of "
                f"shape {tuple(g.shape)} for an input of shape {tuple(a.shape)}"
            )
        g = torch_symbol(torch.Tensor.sum_to_size)(g, tuple(a.shape))
    return g if g.dtype == a.dtype else torch_symbol(torch.Tensor.to)(g, a.dtype)
