"""Linear algebra's factorizations and solvers (svd, qr, eigh, cholesky, lu, solve, inv, det, ...)
as opaque symbols.

They have no sensible decomposition into prims: each is an opaque symbol (``opaque``) rather than
an eager fallback. It has a name and a meta rule (torch's own meta kernel, or one written in
``linalg_metas`` where torch has none), the torch executor runs it as one call of its first torch
callable, and its backward ``ltorch.<name>.vjp`` differentiates that call with torch's own
derivative formula (``torch.autograd.grad`` on the saved inputs), or, for the ops
``SAVED_BACKWARDS`` covers, ``ltorch.<name>.saved_vjp`` computes eager's formula from the saved
outputs (det, slogdet and solve of inputs that require grad run the ATen op eager's node
differentiates, which returns the LU factors it saves). They are one table, ``OPAQUE``; adding an
op is one row. In the trace an opaque symbol has no subsymbols, so no pass looks inside it; its
outputs' metadata are what eager's kernels return (int32 pivots and infos included).
"""

from typing import TYPE_CHECKING, Any

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


# -- backwards from the saved outputs --------------------------------------------------------------
# Backwards of the factorizations from their forward's outputs, as eager's derivative formulas
# compute them (``torch/csrc/autograd/FunctionsManual.cpp``: ``linalg_eig_backward``,
# ``svd_backward``, ``linalg_qr_backward``, ``cholesky_backward``, ``linalg_det_backward``,
# ``slogdet_backward``, ``linalg_solve_backward``; ``derivatives.yaml`` for ``linalg_inv_ex``).
#
# The generic backward of an opaque symbol (``fallback._vjp_of``) runs the factorization again
# under torch.autograd: a second decomposition and autograd's bookkeeping, 2 to 20 times eager's
# backward (benchmarks/bench_linalg.py). Eager's node saves the decomposition and its backward is a
# few products; each formula here makes the same ATen calls in the same order, so that the
# gradients are eager's bit for bit. Where eager's node saves an auxiliary output the op does
# not return (the LU factors of det, slogdet and solve), the backward computes it again with the
# ATen call eager's forward made (one factorization, no autograd).
#
# A formula takes ``(args, kwargs, outputs, cotangents)`` (None for an output no gradient flowed
# to, eager's undefined gradient) and returns one gradient per positional argument (None where
# there is none); the symbol's ``saved_vjp`` hands those to the inputs the trace wants. Inputs it
# does not cover (complex dtypes, tensors passed by keyword, modes whose backward raises) take the
# generic backward, which raises eager's errors.


def _arg(args: tuple, kwargs: dict, i: int, name: str, default):
    return args[i] if len(args) > i else kwargs.get(name, default)


_tf32_allowed = torch._C._get_cublas_allow_tf32
_allow_tf32 = torch._C._set_cublas_allow_tf32


def _without_tf32(formula, *args):
    """``formula(*args)`` under eager's ``at::NoTF32Guard`` (float32 products on CUDA in full
    precision); the flag is read once, a C call, where it is off (the common case)."""
    if not _tf32_allowed():
        return formula(*args)
    _allow_tf32(False)
    try:
        return formula(*args)
    finally:
        _allow_tf32(True)


def _diagonal(x):
    return x.diagonal(0, -2, -1)


def eigh_backward(args, kwargs, outputs, cotangents):
    """``linalg_eig_backward`` with ``is_hermitian`` (``_linalg_eigh``'s node), real case."""
    gL, gV = cotangents
    L, V = outputs
    if gL is None and gV is None:
        return (None,)
    if gV is None:  # (eigvalsh)
        return (torch.matmul(V * gL.unsqueeze(-2), V.mH),)
    VhgV = torch.matmul(V.mH, gV)
    VhgV = 0.5 * (VhgV - VhgV.mH)
    Lconj = L.conj()
    Econj = Lconj.unsqueeze(-2) - Lconj.unsqueeze(-1)
    _diagonal(Econj).fill_(1.0)
    gA = VhgV.div_(Econj)
    if gL is not None:
        _diagonal(gA).copy_(gL)
    return (torch.matmul(V, torch.matmul(gA, V.mH)),)


def _svd_backward(gU, gS, gVh, U, S, Vh):
    """``svd_backward``, real case."""
    if gS is None and gU is None and gVh is None:
        return None
    m, n = U.shape[-2], Vh.shape[-1]
    if gU is None and gVh is None:  # (svdvals)
        return torch.matmul(U, gS.unsqueeze(-1) * Vh) if m >= n else torch.matmul(U * gS.unsqueeze(-2), Vh)
    UhgU = None if gU is None else _skew(torch.matmul(U.mH, gU))
    VhgV = None if gVh is None else _skew(torch.matmul(Vh, gVh.mH))
    S2 = S * S
    E = S2.unsqueeze(-2) - S2.unsqueeze(-1)
    _diagonal(E).fill_(1)
    if gU is not None and gVh is not None:
        gA = (UhgU * S.unsqueeze(-2) + S.unsqueeze(-1) * VhgV) / E
    elif gU is not None:
        gA = (UhgU / E) * S.unsqueeze(-2)
    else:
        gA = S.unsqueeze(-1) * (VhgV / E)
    if gS is not None:
        gA = gA + gS.diag_embed()
    if m > n and gU is not None:
        gA = torch.matmul(U, gA)
        gUSinv = gU / S.unsqueeze(-2)
        gA = gA + gUSinv - torch.matmul(U, torch.matmul(U.mH, gUSinv))
        return torch.matmul(gA, Vh)
    if m < n and gVh is not None:
        gA = torch.matmul(gA, Vh)
        SinvgVh = gVh / S.unsqueeze(-1)
        gA = gA + SinvgVh - torch.matmul(torch.matmul(SinvgVh, Vh.mH), Vh)
        return torch.matmul(U, gA)
    return torch.matmul(U, torch.matmul(gA, Vh)) if m >= n else torch.matmul(torch.matmul(U, gA), Vh)


def _skew(x):
    return x - x.mH


def _narrowed(full: bool, gU, gVh, U, Vh, k: int):
    """``_linalg_svd``'s derivative: the first ``k`` singular vectors where ``full_matrices``."""
    if not full:
        return gU, gVh, U, Vh
    return (
        None if gU is None else gU.narrow(-1, 0, k),
        None if gVh is None else gVh.narrow(-2, 0, k),
        U.narrow(-1, 0, k),
        Vh.narrow(-2, 0, k),
    )


def linalg_svd_backward(args, kwargs, outputs, cotangents):
    U, S, Vh = outputs
    gU, gS, gVh = cotangents
    full = _arg(args, kwargs, 1, "full_matrices", True)
    gU, gVh, U, Vh = _narrowed(full, gU, gVh, U, Vh, S.shape[-1])
    return (_svd_backward(gU, gS, gVh, U, S, Vh),)


def svd_backward(args, kwargs, outputs, cotangents):
    """``torch.svd``: ``linalg_svd(A, full_matrices=not some)`` and ``V = Vh.mH`` (a view, whose
    backward transposes the gradient back)."""
    if not _arg(args, kwargs, 2, "compute_uv", True):
        return NotImplemented
    U, S, V = outputs
    gU, gS, gV = cotangents
    Vh, gVh = V.mH, None if gV is None else gV.mH
    gU, gVh, U, Vh = _narrowed(not _arg(args, kwargs, 1, "some", True), gU, gVh, U, Vh, S.shape[-1])
    return (_svd_backward(gU, gS, gVh, U, S, Vh),)


def qr_backward(args, kwargs, outputs, cotangents):
    """``linalg_qr_backward``, real case (mode 'r' and complete with more rows than columns,
    whose backward raises, take the generic one)."""
    mode = _arg(args, kwargs, 1, "mode", "reduced")
    Q, R = outputs
    gQ, gR = cotangents
    if mode == "r" or (mode == "complete" and Q.shape[-2] > R.shape[-1]):  # (mode 'r': Q is empty, 1-D)
        return NotImplemented
    m, n = Q.shape[-2], R.shape[-1]
    if gQ is None and gR is None:
        return (None,)
    if gQ is None:
        gA = gR.matmul(R.mH)
    elif gR is None:
        gA = -Q.mH.matmul(gQ)
    else:
        gA = gR.matmul(R.mH) - Q.mH.matmul(gQ)
    if m >= n:
        X = gA.triu()
        sym = X + X.mH
        _diagonal(sym).mul_(0.5)
        gA = Q.matmul(sym)
        if gQ is not None:
            gA = gA + gQ
        return (torch.linalg.solve_triangular(R.mH, gA, upper=False, left=False),)
    X = -gA
    gA = Q.matmul((X - X.mH).tril())
    gA = torch.linalg.solve_triangular(R.narrow(-1, 0, m).mH, gA, upper=False, left=False)
    shape = list(R.shape)
    shape[-1] = n - m
    gA = torch.cat([gA, gA.new_zeros(shape)], dim=-1)
    if gR is not None:
        gA = gA + Q.matmul(gR)
    return (gA,)


def cholesky_backward(args, kwargs, outputs, cotangents):
    """``cholesky_backward`` (``linalg_cholesky_ex``'s node)."""
    gL = cotangents[0]
    if gL is None:
        return (None,)
    upper = _arg(args, kwargs, 1, "upper", False)
    L = outputs[0]
    L_ = L.mH if upper else L
    gL_ = gL.mH if upper else gL
    gA = L_.mH.matmul(gL_).tril()
    gA = 0.5 * (gA + gA.tril(-1).mH)
    gA = torch.linalg.solve_triangular(L_.mH, gA, upper=True, left=True)
    return (torch.linalg.solve_triangular(L_, gA, upper=False, left=False),)


def inv_backward(args, kwargs, outputs, cotangents):
    """``linalg_inv_ex``'s: ``-inverse^H @ (grad @ inverse^H)``."""
    g = cotangents[0]
    if g is None:
        return (None,)
    inverse = outputs[0]
    return (-torch.matmul(inverse.mH, torch.matmul(g, inverse.mH)),)


def _uses_A_T(A) -> bool:
    """Eager's LU-based kernels factor ``A.mT`` of a contiguous real ``A`` (then solve adjoint)."""
    return A.is_contiguous() and not A.is_complex()


def det_backward(args, kwargs, outputs, cotangents):
    """``linalg_det_backward`` without grad mode (a singular matrix's zero pivots perturbed by
    eps), from the LU factors eager's ``_linalg_det`` saves: the forward's where it was
    ``_linalg_det`` (``determinant``), else computed again."""
    grad = cotangents[0]
    A = args[0]
    if grad is None or A.numel() == 0:
        return (None,)
    if torch.is_grad_enabled():
        return NotImplemented  # (eager recomputes through an SVD for higher-order gradients)
    if A.shape[-1] == 1:  # (eager's gradient of a 1x1 determinant is the cotangent itself, singular or not)
        return (grad.reshape(A.shape).clone(),)
    det, LU, pivots = outputs if len(outputs) == 3 else torch.ops.aten._linalg_det(A)
    d = torch.diag_embed((grad * det.conj()).unsqueeze(-1).expand_as(pivots)).mT
    eps = torch.finfo(LU.dtype).eps
    LU_ = LU + torch.diag_embed(torch.where(_diagonal(LU) == 0.0, eps, 0.0))
    return (torch.linalg.lu_solve(LU_, pivots, d, left=True, adjoint=not _uses_A_T(A)),)


def slogdet_backward(args, kwargs, outputs, cotangents):
    """``slogdet_backward``, real case (the sign's gradient is zero), from ``_linalg_slogdet``'s LU."""
    g = cotangents[1]
    A = args[0]
    if g is None:
        return (None,)
    if torch.is_grad_enabled():
        return NotImplemented
    _, _, LU, pivots = outputs if len(outputs) == 4 else torch.ops.aten._linalg_slogdet(A)
    d = torch.diag_embed(g.unsqueeze(-1).expand_as(pivots)).mT
    return (torch.linalg.lu_solve(LU, pivots, d, left=True, adjoint=not _uses_A_T(A)),)


def solve_backward(args, kwargs, outputs, cotangents):
    """``linalg_solve_backward`` without grad mode, from ``_linalg_solve_ex``'s LU."""
    gX = cotangents[0]
    if gX is None:
        return (None, None)
    if torch.is_grad_enabled() or len(args) < 2:
        return NotImplemented
    A, B = args[0], args[1]
    left = kwargs.get("left", True)
    X = outputs[0]
    _, LU, pivots = outputs if len(outputs) == 3 else torch.ops.aten._linalg_solve_ex(A, B, left=left)[:3]
    batch = LU.shape[:-1]
    vector = X.ndim == 1 or (LU.ndim - 1 == X.ndim and X.shape == batch)
    # (``_linalg_solve_ex`` factors ``A`` itself in this torch, whatever its layout, and its
    # backward solves adjoint: the ``use_A_T`` of det and slogdet is not solve's)
    gB_ = torch.linalg.lu_solve(LU, pivots, gX.unsqueeze(-1) if vector else gX, left=left, adjoint=True)
    X_ = X.unsqueeze(-1) if vector else X
    gA = -gB_.matmul(X_.mH) if left else -X_.mH.matmul(gB_)
    return (gA, gB_.squeeze(-1) if vector else gB_)


def _lu_backward(gL, gU, P, L, U, pivot: bool):
    """``linalg_lu_backward``, real case."""
    if gL is None and gU is None:
        return None
    m, n = L.shape[-2], U.shape[-1]
    k = min(m, n)
    solve = torch.linalg.solve_triangular
    gA: Any
    if m == n:
        gA = None if gL is None else L.mH.matmul(gL).tril(-1)
        if gU is not None:
            gA = gU.matmul(U.mH).triu() if gA is None else gA + gU.matmul(U.mH).triu()
        gA = solve(U.mH, gA, upper=False, left=False)
        gA = solve(L.mH, gA, upper=True, left=True, unitriangular=True)
        return P.matmul(gA) if pivot else gA
    if m < n:  # (wide)
        gA = None if gL is None else L.mH.matmul(gL)
        if gU is not None:
            gA = -gU.triu().matmul(U.mH) if gA is None else gA - gU.triu().matmul(U.mH)
        gA = solve(U.narrow(-1, 0, k).mH, gA.tril(-1), upper=False, left=False)
        if gU is not None:
            gA = torch.cat([gA + gU.narrow(-1, 0, k).triu(), gU.narrow(-1, k, n - k)], dim=-1)
        gA = solve(L.mH, gA, upper=True, left=True, unitriangular=True)
        if gU is None:
            gA = torch.cat([gA, torch.zeros_like(U.narrow(-1, k, n - k))], dim=-1)
    else:  # (tall)
        gA = None if gU is None else gU.matmul(U.mH)
        if gL is not None:
            gA = -L.mH.matmul(gL.tril(-1)) if gA is None else gA - L.mH.matmul(gL.tril(-1))
        gA = solve(L.narrow(-2, 0, k).mH, gA.triu(), upper=True, left=True, unitriangular=True)
        if gL is not None:
            gA = torch.cat([gA + gL.narrow(-2, 0, k).tril(-1), gL.narrow(-2, k, m - k)], dim=-2)
        gA = solve(U.mH, gA, upper=False, left=False)
        if gL is None:
            gA = torch.cat([gA, torch.zeros_like(L.narrow(-2, k, m - k))], dim=-2)
    return P.matmul(gA) if pivot else gA


def lu_backward(args, kwargs, outputs, cotangents):
    """``linalg_lu``'s node: ``linalg_lu_backward`` of L's and U's gradients."""
    P, L, U = outputs
    return (_lu_backward(cotangents[1], cotangents[2], P, L, U, kwargs.get("pivot", True)),)


def lu_factor_backward(args, kwargs, outputs, cotangents):
    """``lu_factor_ex_backward`` (``linalg_lu_factor_ex``'s node): the packed factors unpacked."""
    grad = cotangents[0]
    if grad is None:
        return (None,)
    LU, pivots = outputs[0], outputs[1]
    pivot = kwargs.get("pivot", True)
    P, L, U = torch.lu_unpack(LU, pivots, unpack_data=True, unpack_pivots=pivot)
    k = min(LU.shape[-2], LU.shape[-1])
    return (_lu_backward(grad.narrow(-1, 0, k), grad.narrow(-2, 0, k), P, L, U, pivot),)


#: ltorch name -> its backward from the forward's outputs.
SAVED_BACKWARDS = {
    "linalg_eigh": eigh_backward,
    "linalg_svd": linalg_svd_backward,
    "svd": svd_backward,
    "linalg_qr": qr_backward,
    "linalg_cholesky": cholesky_backward,
    "linalg_cholesky_ex": cholesky_backward,
    "linalg_inv": inv_backward,
    "inverse": inv_backward,
    "linalg_inv_ex": inv_backward,
    "linalg_det": det_backward,
    "_linalg_det": det_backward,
    "det": det_backward,
    "linalg_slogdet": slogdet_backward,
    "_linalg_slogdet": slogdet_backward,
    "slogdet": slogdet_backward,
    "linalg_solve": solve_backward,
    "linalg_solve_saving_factors": solve_backward,
    "linalg_lu": lu_backward,
    "linalg_lu_factor": lu_factor_backward,
    "linalg_lu_factor_ex": lu_factor_backward,
}


def _covered(args, kwargs) -> bool:
    """Real floating tensors, passed positionally (the formulas read them by position)."""
    if any(isinstance(v, torch.Tensor) for v in kwargs.values()):
        return False
    return all(a.dtype.is_floating_point for a in args if isinstance(a, torch.Tensor))


def saved_vjp(name: str, func):
    """The ``saved_vjp`` of the opaque symbol ``name`` running ``func``: its formula's gradients
    for the inputs ``wanted`` (summed where one tensor is several arguments; zeros where none
    flowed, as the generic backward gives), else the generic backward."""
    formula = SAVED_BACKWARDS[name]
    generic = _vjp_of(func)

    def vjp(args, outputs, cotangents, wanted, **kwargs):
        grads = NotImplemented
        if _covered(args, kwargs):
            grads = _without_tf32(formula, args, kwargs, outputs, cotangents)
        if grads is NotImplemented:
            return generic(args, cotangents, wanted, **kwargs)
        found: list = []
        seen: set[int] = set()
        for w in wanted:
            g = None
            if id(w) not in seen:  # (values that are one tensor when run: the first gets its sum)
                seen.add(id(w))
                for a, ga in zip(args, grads):
                    if a is w and ga is not None:
                        g = ga if g is None else g + ga
            if g is not None and g.shape != w.shape:
                g = g.sum_to_size(w.shape)  # (autograd's sum over broadcast dims)
            found.append(torch.zeros_like(w) if g is None else g)
        return found[0] if len(found) == 1 else tuple(found)

    vjp.__name__ = f"{name}_saved_vjp"
    return vjp


def _zeros(shape, like):
    return torch.zeros(shape, dtype=like.dtype, device=like.device)


def _square_input(outputs):
    return _zeros(outputs[0].shape, outputs[0])


def _product_input(first, last):
    """The input of a factorization ``first @ ... @ last`` (svd's ``U``, ``Vh``; lu's ``L``, ``U``)."""
    return _zeros((*first.shape[:-1], last.shape[-1]), first)


def _qr_input(outputs):
    Q, R = outputs  # (mode 'r': no Q, and R's shape is the input's for the backward's error)
    return _zeros(R.shape, R) if Q.numel() == 0 else _product_input(Q, R)


#: ltorch name -> an input of its outputs' shapes, for the ops whose eager node saves no input
#: (``derivatives.yaml``: cholesky's L, inv's result, eigh's eigenpairs, svd's and qr's factors,
#: lu's): their backward of a real input reads the outputs alone (``outputs_vjp``), so that the
#: compiled forward does not save the input.
OUTPUTS_ONLY = {
    "linalg_eigh": lambda outputs: _square_input(outputs[1:]),
    "linalg_svd": lambda outputs: _product_input(outputs[0], outputs[2]),
    "linalg_qr": _qr_input,
    "linalg_cholesky": _square_input,
    "linalg_cholesky_ex": _square_input,
    "linalg_inv": _square_input,
    "inverse": _square_input,
    "linalg_inv_ex": _square_input,
    "linalg_lu_factor": _square_input,
    "linalg_lu_factor_ex": _square_input,
    "linalg_lu": lambda outputs: _product_input(outputs[1], outputs[2]),
}


def outputs_vjp(name: str, func):
    """The ``outputs_vjp`` of the opaque symbol ``name``: its formula's gradient of its one real
    input from the outputs alone; where the formula has none (a mode whose backward raises), the
    generic backward of an input of the outputs' shapes, which raises eager's error."""
    formula, input_of, generic = SAVED_BACKWARDS[name], OUTPUTS_ONLY[name], _vjp_of(func)

    def vjp(args, outputs, cotangents, **kwargs):
        grads = _without_tf32(formula, args, kwargs, outputs, cotangents)
        if grads is NotImplemented:
            a = input_of(outputs)
            return generic((a, *args[1:]), cotangents, (a,), **kwargs)
        return input_of(outputs) if grads[0] is None else grads[0]

    vjp.__name__ = f"{name}_outputs_vjp"
    return vjp


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


def opaque(name: str, *torch_fns, meta=None, integers_rejected: bool = True):
    """Registers ``ltorch.<name>`` for ``torch_fns``: an opaque symbol the torch executor runs as
    ``torch_fns[0]``, with ``meta`` (or torch's meta kernel) for its outputs, and a backward that
    runs torch's derivative of ``torch_fns[0]``. ``integers_rejected``: eager raises
    NotImplementedError for an integer input (else a RuntimeError, as its meta kernel does)."""
    sym_name, shown_name = f"ltorch.{name}", f"ltorch.{STANDS_FOR.get(name, name)}"
    sid = _core.register_symbol(sym_name, fallback=True)
    func = torch_fns[0]
    no_gradient = NO_GRADIENT.get(name)
    FALLBACK_IMPLS[_core.register_symbol(f"{sym_name}.vjp", fallback=True)] = _vjp_of(func)
    if name in SAVED_BACKWARDS:  # (the VJP pass calls it in place of the one above)
        FALLBACK_IMPLS[_core.register_symbol(f"{sym_name}.saved_vjp", fallback=True)] = saved_vjp(name, func)
    if name in OUTPUTS_ONLY:  # (and this one, for a real input)
        FALLBACK_IMPLS[_core.register_symbol(f"{sym_name}.outputs_vjp", fallback=True)] = outputs_vjp(name, func)

    def symbol(*args, **kwargs):
        if "out" in kwargs and kwargs["out"] is None:  # torch.functional's wrappers pass it on
            del kwargs["out"]
        if meta is None and _is_any_autocast_enabled():
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

if TYPE_CHECKING:
    # The symbols above are made from ``OPAQUE`` at import, which type checkers cannot follow.
    # Unannotated on purpose: an annotated return type is left unanalyzed by mypy inside the
    # ltorch import cycle (python/mypy#5345), whereas an unannotated one is plain Any.
    def __getattr__(name): ...
