"""Torch calls on complex values: eager's op, recorded as a fallback, where the trace would
differentiate a complex value or where thunder_rs has no complex decomposition.

Eager's complex autograd follows conjugate Wirtinger calculus (the gradient of a real loss with
respect to ``z`` is ``conj(dL/dz)``-related, and each op's derivative formula says how it
conjugates). thunder_rs's VJP rules are written for real values, so rather than give every prim a
complex rule, a call that differentiates complex values runs eagerly: a fallback, whose backward
is the op's own derivative run by torch's autograd. Chained fallbacks compose as autograd's nodes
do (their gradients are summed as the engine sums them), so RoPE through ``view_as_complex``, a
complex ``mul`` and ``view_as_real``, or magnitudes of ``torch.fft.rfft``, get eager's gradients.
What stays real around them keeps thunder_rs's decompositions and rules.

Without gradients, complex calls keep their ltorch symbols where thunder_rs has them, and run
eagerly where a symbol refuses complex values (``conj``, ``angle``) or a complex number is an
operand (the trace's numbers are real).
"""

import torch

from thunder_rs.core.lang.fallback import user_fallback
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.errors import ThunderNotImplementedError


_COMPLEX = frozenset({torch.complex32, torch.complex64, torch.complex128})
_SEQUENCES = (list, tuple)


def _complex(x) -> bool:
    t = type(x)
    if t is complex:
        return True
    if t is torch.dtype:
        return x in _COMPLEX
    if t in _SEQUENCES:
        return any(map(_complex, x))
    return isinstance(x, TensorProxy) and x._dtype in _COMPLEX


def involves_complex(args, kwargs) -> bool:
    """Whether a call takes a complex tensor, a complex number or a complex dtype (directly or
    in a list: ``torch.cat([z, w])``). Asked of every traced call: proxies are checked first."""
    for x in args:
        dtype = getattr(x, "_dtype", None)
        if dtype is not None:
            if dtype in _COMPLEX:
                return True
        elif _complex(x):
            return True
    return bool(kwargs) and any(map(_complex, kwargs.values()))


def _differentiates(args, kwargs) -> bool:
    """Whether a call's result would carry a gradient (grad mode on, a tensor requires grad)."""
    if not torch.is_grad_enabled():
        return False
    for x in (*args, *kwargs.values()):
        for y in x if type(x) in (list, tuple) else (x,):
            if isinstance(y, TensorProxy) and y.requires_grad:
                return True
    return False


def differentiates_complex(args, kwargs) -> bool:
    """Whether a call differentiates complex values: eager's op computes it (in-place calls ask
    this of their out-of-place value, ``thunder_rs.torch.inplace``)."""
    return involves_complex(args, kwargs) and _differentiates(args, kwargs)


def complex_call(func, ltorch_fn, args, kwargs):
    """``func(*args, **kwargs)``, a call that ``involves_complex``, with ``ltorch_fn`` its symbol."""
    if _differentiates(args, kwargs):
        return user_fallback(func, args, kwargs)
    values = (*args, *kwargs.values())
    try:
        return ltorch_fn(*args, **kwargs)
    except ThunderNotImplementedError:
        if not any(isinstance(x, TensorProxy) and x._dtype.is_complex for x in values):
            raise
    except TypeError:  # the trace's numbers are real: a complex one (``x * 1j``) is eager's call
        if not any(type(x) is complex for x in values):
            raise
    return user_fallback(func, args, kwargs)
