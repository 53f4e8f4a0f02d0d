"""Linear algebra's factorizations and solvers (svd, qr, eigh, cholesky, lu, solve, inv, det, ...)
as opaque symbols.

They have no sensible decomposition into prims: each is an opaque symbol (``opaque``) rather than
an eager fallback. It has a name and a meta rule (torch's own meta kernel, or one written in
``linalg_metas`` where torch has none), the torch executor runs it as one call of its first torch
callable, and its backward ``ltorch.<name>.vjp`` differentiates that call with torch's own
derivative formula (``torch.autograd.grad`` on the saved inputs), or, for the ops
``factorization_backwards`` covers, ``ltorch.<name>.saved_vjp`` (``outputs_vjp``) computes
eager's formula from the saved outputs (det, slogdet and solve of inputs that require grad run
the ATen op eager's node differentiates, which returns the LU factors it saves). They are one
table, ``OPAQUE``; adding an op is one row. In the trace an opaque symbol has no subsymbols,
so no pass looks inside it; its outputs' metadata are what eager's kernels return (int32 pivots
and infos included).
"""

from typing import TYPE_CHECKING

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from thunder_rs import _core, prims
from thunder_rs.core.base.dtypes import CODES
from thunder_rs.core.base.lazy import LazyModule
from thunder_rs.core.base.proxies import TensorProxy, numel_of
from thunder_rs.core.lang.fallback import FALLBACK_IMPLS, _vjp_of, fallback
from thunder_rs.core.lang.grad import get_grad, register_grad
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.core.lang.recorder import current, note_gradient_through, output_meta, proxies
from thunder_rs.core.lang.symint import SymInt
from thunder_rs.errors import (
    ThunderNotImplementedError,
    ThunderRuntimeError,
    ThunderTypeError,
    check,
    thunder_error_like,
)
from thunder_rs.torch.factorization_backwards import COMPLEX, OUTPUTS_ONLY, REAL_OUTPUTS_ONLY, SAVED_BACKWARDS
from thunder_rs.torch.factorization_backwards import UNREAD
from thunder_rs.torch.factorization_backwards import outputs_vjp, saved_vjp
from thunder_rs.torch.linalg_metas import geqrf_meta, lstsq_meta
from thunder_rs.torch.symbols import ltorch, register, torchsymbol

T = torch.Tensor
LA = torch.linalg
#: Output sizes kept symbolic (loaded on the first call of an opaque op with symbolic sizes).
_SIZES = LazyModule("thunder_rs.core.lang.fallback_sizes")


_is_any_autocast_enabled = torch._C._is_any_autocast_enabled


def _differentiable(x) -> bool:
    return x.requires_grad and (x.dtype.is_floating_point or x.dtype.is_complex)


def _as_meta(x):
    """A meta tensor like the proxy ``x``, requiring grad as it does, so that the meta kernel's
    outputs say which of them eager's autograd differentiates."""
    if not isinstance(x, TensorProxy):
        return x
    # Symbolic sizes are taken at their values (guarded): the static way, where the symbolic one
    # (``_symbolic_metadata``) cannot be followed.
    shape = [int(s) for s in x.shape]
    return torch.empty(shape, dtype=x.dtype, device="meta", requires_grad=_differentiable(x))


def _symbolic_metadata(func, args, kwargs):
    """The outputs of ``func`` and their shapes with the inputs' symbolic sizes kept symbolic
    (torch's meta kernel on fake tensors of symbolic sizes: ``fallback_sizes``; what it decides on
    the sizes, ``min(m, n)`` of a factorisation, is recorded as a decision), or None: no input
    size is symbolic, or torch's kernel cannot be followed so (the static way then raises eager's
    error for invalid arguments)."""
    leaves = tree_flatten((args, kwargs))[0]
    if not any(type(x) is SymInt or (isinstance(x, TensorProxy) and x._symbolic) for x in leaves):
        return None
    with torch.enable_grad():
        found = _SIZES.load().symbolic_metadata(func, args, kwargs, False, requires_grad=_differentiable)
    return found if isinstance(found, tuple) else None


def _metadata(func, meta, name: str, args, kwargs):
    """The outputs of ``func`` as meta tensors and ``shape(t)`` of each: ``meta`` (given the
    proxies) when there is one, else torch's meta kernel, with symbolic sizes where the inputs
    have them. Invalid arguments raise what eager raises, with the op's name; torch's Python meta
    kernels assert where eager's kernels raise RuntimeError."""
    if meta is not None:
        return meta(*args, **kwargs), _shape
    symbolic = _symbolic_metadata(func, args, kwargs)
    if symbolic is not None:
        return symbolic
    return _meta_outputs(func, name, args, kwargs), _shape


def _shape(t):
    return t.shape


def _meta_outputs(func, name: str, args, kwargs):
    meta_args, meta_kwargs = tree_map(_as_meta, (args, kwargs))
    try:
        with torch._C.DisableTorchFunctionSubclass(), torch.enable_grad():
            return func(*meta_args, **meta_kwargs)
    except NotImplementedError as e:
        raise ThunderNotImplementedError(
            f"{name}: torch cannot compute its output metadata on meta tensors ({e})"
        ) from e
    except AssertionError as e:
        raise ThunderRuntimeError(f"{name}: {e}") from e
    except Exception as e:
        raise thunder_error_like(e, f"{name}: {e}") from e


def _check_dtype(name: str, a, integers_rejected: bool) -> None:
    """Meta kernels reject an integer input with a RuntimeError where eager's kernels raise
    NotImplementedError (``integers_rejected``): the check is made here, with eager's type."""
    check(
        not integers_rejected or a.dtype.is_floating_point or a.dtype.is_complex,
        name,
        lambda: f"Expected a floating point or complex tensor as input. Got {a.dtype} (argument input)",
        ThunderNotImplementedError,
    )


def _record(sid: int, func, meta, name: str, args: tuple, kwargs: dict, integers_rejected: bool):
    """Records one call of the opaque symbol ``sid``; its outputs' metadata come from ``meta``."""
    in_leaves = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, TensorProxy)]
    check(bool(in_leaves), name, "expected a tensor argument", ThunderTypeError)
    _check_dtype(name, in_leaves[0], integers_rejected)
    out, shape = _metadata(func, meta, name, args, kwargs)
    leaves, spec = tree_flatten(out)
    device = str(in_leaves[0].device)
    requires_grad = torch.is_grad_enabled() and any(x.requires_grad for x in in_leaves)
    for t in leaves:  # (half-precision complex: what fake CUDA tensors give for eig or stft of bf16/fp16)
        check(
            t.dtype in CODES,
            name,
            lambda: f"gives a {t.dtype} result, which thunder_rs does not represent (argument input)",
            ThunderNotImplementedError,
        )
    metas = [output_meta(shape(t), t.dtype, device, requires_grad and t.requires_grad) for t in leaves]
    if requires_grad:  # (a view input a gradient flows into: ``TensorProxy._view_grad``)
        note_gradient_through(metas, (*args, *kwargs.values()))
    outs = proxies(current().call(sid, tuple(args), kwargs or None, metas))
    return outs[0] if isinstance(out, torch.Tensor) else tree_unflatten(outs, spec)


def _solve_saving_factors(A, B, *, left=True):
    """``linalg.solve`` as eager runs it (``_linalg_solve_ex``, then its error check), returning
    the LU factors its node saves too."""
    X, LU, pivots, info = torch.ops.aten._linalg_solve_ex(A, B, left=left)
    try:
        torch._linalg_check_errors(info, "torch.linalg.solve", is_matrix=A.dim() == 2)
    except RuntimeError as e:  # (eager's message, which names torch.linalg.solve, not this stand-in)
        raise thunder_error_like(e, str(e)) from e
    return X, LU, pivots


def _no_reflectors(input, tau, *args, **kwargs) -> bool:
    """``householder_product_backward`` gives no gradient (undefined) where there are no
    reflectors or no vectors."""
    return numel_of(input) == 0 or numel_of(tau) == 0


#: ltorch name -> whether eager's backward gives the inputs no gradient at all (``.grad`` stays
#: None) for these arguments, which their shapes tell.
NO_GRADIENT = {"linalg_householder_product": _no_reflectors, "orgqr": _no_reflectors}


def _gradient_stopped(args: tuple) -> tuple:
    """``args`` with their tensors that require grad through ``stop_gradient``: the call's outputs
    require grad as eager's do, but no gradient reaches them."""
    return tuple(ltorch.stop_gradient(a) if isinstance(a, TensorProxy) and a.requires_grad else a for a in args)


#: Stand-ins the program never calls by name -> the ltorch symbol their errors name (eager's op).
STANDS_FOR = {
    "linalg_solve_saving_factors": "linalg_solve",
    "_linalg_det": "linalg_det",
    "_linalg_slogdet": "linalg_slogdet",
}


def opaque(name: str, *torch_fns, meta=None, integers_rejected: bool = True, autocast_inside: bool = False):
    """Registers ``ltorch.<name>`` for ``torch_fns``: an opaque symbol the torch executor runs as
    ``torch_fns[0]``, with ``meta`` (or torch's meta kernel) for its outputs, and a backward that
    runs torch's derivative of ``torch_fns[0]``. ``integers_rejected``: eager raises
    NotImplementedError for an integer input (else a RuntimeError, as its meta kernel does).
    ``autocast_inside``: a kernel with a meta rule whose own calls autocast casts (a fused layer
    calling linear), run as the eager fallback under autocast as the composites are."""
    sym_name, shown_name = f"ltorch.{name}", f"ltorch.{STANDS_FOR.get(name, name)}"
    sid = _core.register_symbol(sym_name, fallback=True)
    func = torch_fns[0]
    no_gradient = NO_GRADIENT.get(name)
    FALLBACK_IMPLS[_core.register_symbol(f"{sym_name}.vjp", fallback=True)] = _vjp_of(func)
    if name in SAVED_BACKWARDS:  # (the VJP pass calls it in place of the one above)
        FALLBACK_IMPLS[_core.register_symbol(f"{sym_name}.saved_vjp", fallback=True)] = saved_vjp(name, func)
    if name in OUTPUTS_ONLY:  # (and this one, for a real input, or a complex one it covers)
        FALLBACK_IMPLS[_core.register_symbol(f"{sym_name}.outputs_vjp", fallback=True)] = outputs_vjp(name, func)
        if name in COMPLEX and name not in REAL_OUTPUTS_ONLY:
            _core.register_symbol(f"{sym_name}.outputs_vjp.complex", fallback=True)
    for what, positions in zip(("output", "arg"), UNREAD.get(name, ((), ()))):
        for i in positions:  # (declarations the VJP pass looks up: never called)
            _core.register_symbol(f"{sym_name}.unread_{what}.{i}", fallback=True)

    def symbol(*args, **kwargs):
        if "out" in kwargs and kwargs["out"] is None:  # torch.functional's wrappers pass it on
            del kwargs["out"]
        if (meta is None or autocast_inside) and _is_any_autocast_enabled():
            # Eager's composites (pinv, ...) autocast the ops inside them: the call runs as an
            # eager fallback under the traced autocast state. (Those with a meta rule here are
            # kernels that autocast casts whole, as the language context has.)
            return fallback(func, args, kwargs)
        if no_gradient is not None and torch.is_grad_enabled() and no_gradient(*args, **kwargs):
            args = _gradient_stopped(args)
        return _record(sid, func, meta, shown_name, args, kwargs, integers_rejected)

    symbol.__name__ = symbol.__qualname__ = name
    symbol.__doc__ = f"Records {sym_name}, run whole as {getattr(func, '__name__', name)}."
    return register(symbol, sid, sym_name, torch_fns, opaque=True)


#: (ltorch name, the torch callables it stands for (the first is what runs), meta rule or None
#: for torch's own, whether eager rejects integer inputs with NotImplementedError).
OPAQUE = (
    ("linalg_solve", (LA.solve,), None, True),
    ("linalg_solve_ex", (LA.solve_ex,), None, True),
    ("linalg_solve_saving_factors", (_solve_saving_factors,), None, True),
    ("linalg_lstsq", (LA.lstsq,), lstsq_meta, False),
    ("linalg_svd", (LA.svd,), None, True),
    ("linalg_svdvals", (LA.svdvals,), None, True),
    ("svd", (torch.svd, T.svd), None, True),
    ("linalg_qr", (LA.qr,), None, True),
    ("geqrf", (torch.geqrf, T.geqrf), geqrf_meta, True),
    ("ormqr", (torch.ormqr, T.ormqr), None, False),
    ("linalg_householder_product", (LA.householder_product,), None, False),
    ("orgqr", (torch.orgqr, T.orgqr), None, False),
    ("linalg_eigh", (LA.eigh,), None, True),
    ("linalg_eigvalsh", (LA.eigvalsh,), None, True),
    ("linalg_cholesky", (LA.cholesky,), None, True),
    ("linalg_cholesky_ex", (LA.cholesky_ex,), None, True),
    ("cholesky_solve", (torch.cholesky_solve, T.cholesky_solve), None, False),
    ("cholesky_inverse", (torch.cholesky_inverse, T.cholesky_inverse), None, True),
    ("linalg_pinv", (LA.pinv,), None, False),
    ("pinverse", (torch.pinverse, T.pinverse), None, False),
    ("linalg_matrix_rank", (LA.matrix_rank,), None, False),
    ("linalg_det", (LA.det,), None, True),
    ("det", (torch.det, T.det), None, True),
    ("linalg_slogdet", (LA.slogdet,), None, True),
    ("_linalg_det", (torch.ops.aten._linalg_det.default,), None, True),
    ("_linalg_slogdet", (torch.ops.aten._linalg_slogdet.default,), None, True),
    ("slogdet", (torch.slogdet, T.slogdet), None, True),
    ("logdet", (torch.logdet, T.logdet), None, True),
    ("linalg_inv", (LA.inv,), None, True),
    ("inverse", (torch.inverse, T.inverse), None, True),
    ("linalg_inv_ex", (LA.inv_ex,), None, True),
    ("linalg_solve_triangular", (LA.solve_triangular,), None, True),
    ("triangular_solve", (torch.triangular_solve, T.triangular_solve), None, False),
    ("linalg_lu_factor", (LA.lu_factor,), None, True),
    ("linalg_lu_factor_ex", (LA.lu_factor_ex,), None, True),
    ("linalg_lu", (LA.lu,), None, True),
    ("lu", (torch.functional.lu, T.lu), None, True),
    ("linalg_lu_solve", (LA.lu_solve,), None, True),
    ("lu_solve", (torch.lu_solve, T.lu_solve), None, False),
    ("linalg_ldl_factor", (LA.ldl_factor,), None, True),
    ("linalg_ldl_factor_ex", (LA.ldl_factor_ex,), None, True),
    ("linalg_ldl_solve", (LA.ldl_solve,), None, True),
    ("linalg_matrix_exp", (LA.matrix_exp,), None, True),
    ("matrix_exp", (torch.matrix_exp, T.matrix_exp), None, True),
    ("linalg_matrix_sqrth", (LA.matrix_sqrth,), None, True),
    ("linalg_polar", (LA.polar,), None, True),
    ("linalg_eig", (LA.eig,), None, True),
    ("linalg_eigvals", (LA.eigvals,), None, True),
)


globals().update({name: opaque(name, *fns, meta=meta, integers_rejected=ints) for name, fns, meta, ints in OPAQUE})
__all__ = [row[0] for row in OPAQUE] + ["gradient_free"]


def _differentiated(A) -> bool:
    return torch.is_grad_enabled() and A.requires_grad


def singular_values(A, *, driver=None, out=None):
    """``linalg.svdvals`` as eager computes it: where ``A`` requires grad, eager's kernel computes the
    singular vectors too (``_may_require_fw_or_bw_grad``), and LAPACK's values then differ in their
    last bits from those computed alone, so the differentiable call is ``linalg_svd``'s."""
    if _differentiated(A):
        return ltorch.linalg_svd(A, full_matrices=False, driver=driver)[1]
    return ltorch.linalg_svdvals(A, driver=driver)


def hermitian_eigenvalues(A, UPLO="L", *, out=None):
    """``linalg.eigvalsh`` as eager computes it: with the eigenvectors where ``A`` requires grad (as
    ``singular_values``)."""
    if _differentiated(A):
        return ltorch.linalg_eigh(A, UPLO)[0]
    return ltorch.linalg_eigvalsh(A, UPLO)


def eigenvalues(A, *, out=None):
    """``linalg.eigvals`` as eager computes it: with the eigenvectors where ``A`` requires grad (as
    ``singular_values``)."""
    if _differentiated(A):
        return ltorch.linalg_eig(A)[0]
    return ltorch.linalg_eigvals(A)


#: (a complex input's backward is eager's formula: ``factorization_backwards.COMPLEX``)
eigenvalues.complex_grads = True  # type: ignore[attr-defined]


def _itself(a):
    return a


@torchsymbol(_itself, name="gradient_free")
def gradient_free(a):
    """``a``, an output whose cotangent eager's backward formula never reads (``slogdet``'s real
    sign): it requires grad, and run by torch it is the output itself, yet in the trace's backward
    no gradient flows through it."""
    return prims.convert_element_type(a, a.dtype)


@register_grad(gradient_free)
def _gradient_free_grad(a):
    out = gradient_free(a)
    get_grad(out)
    return out


def _sign_without_gradient(sign):
    """``slogdet``'s sign as eager differentiates it: of a real matrix, it requires grad as the
    matrix does, yet no gradient flows through it (``slogdet_backward`` reads the log's cotangent
    alone), so a loss of the sign alone gives the matrix no gradient (None, not zeros)."""
    if not isinstance(sign, TensorProxy) or not sign.requires_grad or sign.dtype.is_complex:
        return sign
    return gradient_free(sign)


def _determinant(plain: str):
    def determinant(A, *, out=None):
        """``linalg.det`` (``torch.det``) as eager computes it: where ``A`` requires grad, its
        ``_linalg_det``, whose LU factors the backward reads (eager's node saves them)."""
        if _differentiated(A):
            return ltorch._linalg_det(A)[0]
        return getattr(ltorch, plain)(A)

    return determinant


def solved(A, B, *, left=True, out=None):
    """``linalg.solve`` as eager computes it: where an operand requires grad, with the LU factors
    its backward reads (eager's node saves them)."""
    if torch.is_grad_enabled() and (A.requires_grad or getattr(B, "requires_grad", False)):
        return ltorch.linalg_solve_saving_factors(A, B, left=left)[0]
    return ltorch.linalg_solve(A, B, left=left)


def _log_determinant(structseq):
    def slogdet(A, *, out=None):
        """``linalg.slogdet`` (``torch.slogdet``) as eager computes it: where ``A`` requires grad,
        its ``_linalg_slogdet``, whose LU factors the backward reads (eager's node saves them); the
        sign of a real matrix passes no gradient (``_sign_without_gradient``)."""
        if _differentiated(A):
            sign, logabsdet, _, _ = ltorch._linalg_slogdet(A)
            return structseq((_sign_without_gradient(sign), logabsdet))
        return ltorch.slogdet(A) if structseq is torch.return_types.slogdet else ltorch.linalg_slogdet(A)

    return slogdet


TORCH_TO_LTORCH[LA.svdvals] = singular_values
TORCH_TO_LTORCH[LA.eigvalsh] = hermitian_eigenvalues
TORCH_TO_LTORCH[LA.eigvals] = eigenvalues
TORCH_TO_LTORCH[LA.det] = _determinant("linalg_det")
TORCH_TO_LTORCH.update(dict.fromkeys((torch.det, T.det), _determinant("det")))
TORCH_TO_LTORCH[LA.solve] = solved
TORCH_TO_LTORCH[LA.slogdet] = _log_determinant(torch.return_types.linalg_slogdet)  # type: ignore[attr-defined]
TORCH_TO_LTORCH.update(dict.fromkeys((torch.slogdet, T.slogdet), _log_determinant(torch.return_types.slogdet)))


def _mark_complex_grads() -> None:
    """The ops whose backward here is eager's formula for complex inputs too (``COMPLEX``) are
    recorded as their symbols where they differentiate complex values (``complex_calls``), not as
    eager's op run again by torch.autograd: the forward saves what eager's node saves."""
    for name, fns, _, _ in OPAQUE:
        if name in COMPLEX:
            for fn in fns:
                TORCH_TO_LTORCH[fn].complex_grads = True


_mark_complex_grads()

if TYPE_CHECKING:
    # The symbols above are made from ``OPAQUE`` at import, which type checkers cannot follow.
    # Unannotated on purpose: an annotated return type is left unanalyzed by mypy inside the
    # ltorch import cycle (python/mypy#5345), whereas an unannotated one is plain Any.
    def __getattr__(name): ...
