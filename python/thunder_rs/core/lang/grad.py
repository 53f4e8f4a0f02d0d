"""Grad rules for composite symbols, in Thunder's ``get_grad``/``put_grad`` style.

A rule replaces a symbol's decomposition while a gradient may flow through the call. It
computes the forward (usually by calling the symbol itself, which then records its plain
decomposition), asks for the cotangent of each output with ``get_grad``, computes the inputs'
gradients with ltorch ops and hands them over with ``put_grad``, and returns the forward's
result::

    @thunder_rs.register_grad(ltorch.softmax)
    def softmax_grad(a, dim, dtype=None):
        out = ltorch.softmax(a, dim, dtype=dtype)
        g = get_grad(out)
        put_grad(a, out * (g - (g * out).sum(dim, keepdim=True)))
        return out

Calls before the first ``get_grad`` belong to the forward; calls after it to the backward,
which the Rust VJP pass emits in place of differentiating the decomposition.
"""

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.recorder import GRAD_RULES, current, enter_backward, note_gradient_into, proxies
from thunder_rs.errors import ThunderNotImplementedError, ThunderTypeError, ThunderValueError
from thunder_rs.core.lang.symint import same_shape


def register_grad(symbol, rule=None):
    """Registers ``rule`` as the grad rule of the ltorch ``symbol``; usable as a decorator."""
    symbol_id = getattr(symbol, "symbol_id", None)
    if symbol_id is None:
        raise ThunderTypeError(f"register_grad: expected an ltorch symbol, got {symbol!r} (argument symbol)")

    def register(fn):
        if not callable(fn):
            raise ThunderTypeError(f"register_grad: expected a callable rule, got {type(fn).__name__} (argument rule)")
        GRAD_RULES[symbol_id] = fn
        return fn

    return register if rule is None else register(rule)


def _proxy(x, fn: str, arg: str) -> TensorProxy:
    if not isinstance(x, TensorProxy):
        raise ThunderTypeError(
            f"{fn}: expected a tensor of the traced program, got {type(x).__name__} (argument {arg})"
        )
    return x


def get_grad(x):
    """The cotangent of ``x``, an output of the rule's forward."""
    cotangent = proxies(current().get_grad(_proxy(x, "get_grad", "x")._vid))[0]
    enter_backward()
    return cotangent


def put_grad(x, grad, *, complex_values: bool = False) -> None:
    """Declares ``grad`` the gradient of ``x``, an input of the rule. A complex ``x`` only with
    ``complex_values``: a rule whose gradient moves the cotangent's elements, or scales them by
    real numbers (``pad``'s crop), holds for complex values as eager's conjugate convention takes
    them; others are written for real values."""
    _proxy(x, "put_grad", "x")
    _proxy(grad, "put_grad", "grad")
    if x.dtype.is_complex and not complex_values:
        raise ThunderNotImplementedError("put_grad: gradients of complex tensors are not supported (argument x)")
    if not same_shape(grad.shape, x.shape):
        raise ThunderValueError(
            f"put_grad: the gradient's shape {tuple(grad.shape)} differs from x's {tuple(x.shape)} (argument grad)"
        )
    # (a view input of the call gets its gradient through autograd as the ops' operands do: a
    # rule may give one where no op of the forward does, copysign's sign operand)
    note_gradient_into(x)
    current().put_grad(x._vid, grad)
