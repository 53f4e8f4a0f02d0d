"""Torch calls on complex values: eager's op, recorded as a fallback, where the trace would
differentiate a complex value or where thunder_rs has no complex decomposition.

Eager's complex autograd follows conjugate Wirtinger calculus (the gradient of a real loss with
respect to ``z`` is ``conj(dL/dz)``-related, and each op's derivative formula says how it
conjugates). Most of thunder_rs's VJP rules are written for real values, so a call that
differentiates complex values runs eagerly: a fallback, whose backward is the op's own derivative
run by torch's autograd. Chained fallbacks compose as autograd's nodes do (their gradients are
summed as the engine sums them), so magnitudes of ``torch.fft.rfft`` get eager's gradients. The
symbols marked ``complex_grads`` (``torch.complex_values``: ``mul``, ``add``, shape ops; the
complex prims' symbols take complex values whatever the grad mode) record prims whose rules hold
for complex values, so RoPE through ``view_as_complex``, a complex ``mul`` and ``view_as_real``
is traced, gradients included. What stays real around them keeps thunder_rs's rules.

Without gradients, complex calls keep their ltorch symbols where thunder_rs has them, and run
eagerly where a symbol refuses complex values (``conj``, ``angle``) or a complex number is an
operand (the trace's numbers are real).
"""

import functools

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from thunder_rs.core.lang.fallback import user_fallback
from thunder_rs.core.lang.rng import is_random
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


#: What links the outputs of a call run eagerly that eager makes views of its input to that input,
#: so that writes through either reach the other (``thunder_rs.torch.complex_views.link``).
VIEW_LINKS: list = []


def complex_call(func, ltorch_fn, args, kwargs):
    """``func(*args, **kwargs)``, a call that ``involves_complex``, with ``ltorch_fn`` its symbol:
    the symbol where it computes complex values (with gradients: where it is marked
    ``complex_grads``, its prims' VJP rules hold for them), eager's op otherwise."""
    differentiates = _differentiates(args, kwargs)
    if differentiates and not complex_grads(ltorch_fn, args, kwargs):
        return _eager_with_grad(func, args, kwargs)
    values = (*args, *kwargs.values())
    try:
        return ltorch_fn(*args, **kwargs)
    except ThunderNotImplementedError:
        # (complex values from a number or a dtype, ``torch.linspace(0, 1j, 5)``, ``torch.linspace(t0,
        # t1, 5, dtype=torch.complex64)``, are eager's too; a random call keeps its symbol's refusal,
        # whose draws it cannot replay)
        if is_random(func) and not any(isinstance(x, TensorProxy) and x._dtype.is_complex for x in values):
            raise
    except TypeError:  # the trace's numbers are real: a complex one (``x * 1j``) is eager's call
        if not any(type(x) is complex for x in values):
            raise
    if differentiates:
        return _eager_with_grad(func, args, kwargs)
    out = user_fallback(func, args, kwargs)
    for link in VIEW_LINKS:  # (``conj``: a view eager's op makes, of a complex tensor without a gradient)
        link(func, args, kwargs, out)
    return out


def complex_grads(ltorch_fn, args, kwargs) -> bool:
    """Whether ``ltorch_fn`` differentiates complex values: its ``complex_grads`` mark, or what
    that mark, a predicate, says of these arguments."""
    native = getattr(ltorch_fn, "complex_grads", False)
    return bool(native(args, kwargs)) if callable(native) else native


def _eager_with_grad(func, args, kwargs):
    given, kwargs = kwargs, dict(kwargs)
    out = user_fallback(_with_grad(func, args, kwargs), args, kwargs, effect=is_random(func))
    for link in VIEW_LINKS:
        link(func, args, given, out)
    return out


_WITH_GRAD: dict = {}
_MARKED = "_thunder_rs_requires_grad"


def _with_grad(func, args, kwargs):
    """``func`` as eager runs it on these arguments: with grad, where the inputs that require grad
    in the trace do (the compiled forward runs without), since some kernels compute otherwise then
    (``linalg.svdvals`` computes the singular vectors too, and LAPACK's values differ in their last
    bits: ``_may_require_fw_or_bw_grad``). Its outputs are detached; the backward's replay
    (``fallback._vjp_of``), with grad on, runs ``func`` itself. One function per ``func`` (so one
    fallback symbol), told the positions of those inputs by the keyword ``_MARKED``."""
    leaves = tree_flatten((args, kwargs))[0]
    kwargs[_MARKED] = tuple(i for i, x in enumerate(leaves) if isinstance(x, TensorProxy) and x.requires_grad)
    run = _WITH_GRAD.get(func)
    if run is None:

        @functools.wraps(func, (*functools.WRAPPER_ASSIGNMENTS, "__objclass__", "__self__"))  # (its name)
        def run(*args, **kwargs):
            marked = kwargs.pop(_MARKED)
            if torch.is_grad_enabled():
                return func(*args, **kwargs)
            leaves, spec = tree_flatten((args, kwargs))
            for i in marked:
                leaves[i] = leaves[i].detach().requires_grad_()
            args, kwargs = tree_unflatten(leaves, spec)
            with torch.enable_grad():
                out = func(*args, **kwargs)
            return tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, out)

        run.__module__ = getattr(func, "__module__", None)
        _WITH_GRAD[func] = run
    return run
