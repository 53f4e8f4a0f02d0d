"""The factorizations' backwards from their forward's outputs (the opaque symbols' ``saved_vjp`` and
``outputs_vjp``, ``factorizations.opaque``).

Backwards of the factorizations from their forward's outputs, as eager's derivative formulas
compute them (``torch/csrc/autograd/FunctionsManual.cpp``: ``linalg_eig_backward``,
``svd_backward``, ``linalg_qr_backward``, ``cholesky_backward``, ``linalg_det_backward``,
``slogdet_backward``, ``linalg_solve_backward``; ``derivatives.yaml`` for ``linalg_inv_ex``).

The generic backward of an opaque symbol (``fallback._vjp_of``) runs the factorization again
under torch.autograd: a second decomposition and autograd's bookkeeping, 2 to 20 times eager's
backward (benchmarks/bench_linalg.py). Eager's node saves the decomposition and its backward is a
few products; each formula here makes the same ATen calls in the same order, so that the
gradients are eager's bit for bit. Where eager's node saves an auxiliary output the op does
not return (the LU factors of det, slogdet and solve), the backward computes it again with the
ATen call eager's forward made (one factorization, no autograd).

A formula takes ``(args, kwargs, outputs, cotangents)`` (None for an output no gradient flowed
to, eager's undefined gradient) and returns one gradient per positional argument (None where
there is none); the symbol's ``saved_vjp`` hands those to the inputs the trace wants. Inputs it
does not cover (complex dtypes of the ops not in ``COMPLEX``, tensors passed by keyword, modes
whose backward raises) take the generic backward, which raises eager's errors. The outputs and
arguments a formula does not read (``UNREAD``) are not handed to it, so that the compiled forward
saves for backward what eager's node saves, no more.
"""

from typing import Any

import torch

from thunder_rs.core.lang.fallback import _vjp_of


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


def _eig_backward(gL, gV, L, V, hermitian: bool):
    """``linalg_eig_backward``: ``hermitian`` for ``_linalg_eigh``'s node, else ``linalg_eig``'s."""
    if gL is None and gV is None:
        return None
    if gV is None:  # (eigvalsh, eigvals)
        if hermitian:
            return torch.matmul(V * gL.unsqueeze(-2), V.mH)
        return torch.linalg.solve(V.mH, gL.unsqueeze(-1) * V.mH)
    VhgV = torch.matmul(V.mH, gV)
    diag_VhgV = _diagonal(VhgV)
    if V.is_complex():
        imag = torch.imag(diag_VhgV)
        if not torch.allclose(imag, torch.zeros_like(imag), rtol=1e-2, atol=1e-2):
            raise RuntimeError(
                f"{'linalg_eigh_backward' if hermitian else 'linalg_eig_backward'}: The eigenvectors in the "
                "complex case are specified up to multiplication by e^{i phi}. The specified loss function "
                "depends on this quantity, so it is ill-defined."
            )
    if hermitian:
        VhgV = 0.5 * (VhgV - VhgV.mH)
    else:  # (projected onto the tangent space of matrices with columns of norm 1)
        VhgV = VhgV - torch.matmul(V.mH, V * torch.real(diag_VhgV).unsqueeze(-2))
    Lconj = L.conj()
    Econj = Lconj.unsqueeze(-2) - Lconj.unsqueeze(-1)
    _diagonal(Econj).fill_(1.0)
    gA = VhgV.div_(Econj)
    if gL is not None:
        _diagonal(gA).copy_(gL)
    if hermitian:
        return torch.matmul(V, torch.matmul(gA, V.mH))
    return torch.linalg.solve(V.mH, torch.matmul(gA, V.mH))


def eigh_backward(args, kwargs, outputs, cotangents):
    """``linalg_eig_backward`` with ``is_hermitian`` (``_linalg_eigh``'s node)."""
    return (_eig_backward(*cotangents, *outputs, hermitian=True),)


def eig_backward(args, kwargs, outputs, cotangents):
    """``linalg_eig``'s node: ``linalg_eig_backward``, its real part for a real matrix
    (``handle_r_to_c``: the eigenpairs are complex either way). The matrix is never read (eager's
    node does not save it): a real one takes ``outputs_vjp`` (None in its place), a complex one
    ``saved_vjp`` (its shape in its place: ``UNREAD``, ``REAL_OUTPUTS_ONLY``)."""
    grad = _eig_backward(*cotangents, *outputs, hermitian=False)
    real = args[0] is None or (isinstance(args[0], torch.Tensor) and not args[0].is_complex())
    return (torch.real(grad) if real and grad is not None else grad,)


def pinv_backward(args, kwargs, outputs, cotangents):
    """``pinv_backward`` (``linalg_pinv``'s node saves the input and the result)."""
    grad = cotangents[0]
    if grad is None:
        return (None,) * len(args)
    return (_pinv_backward(grad, outputs[0], args[0]), *(None,) * (len(args) - 1))


def _pinv_backward(grad, pinvA, A):
    m, n = A.shape[-2], A.shape[-1]
    pinvAh, gradh = pinvA.mH, grad.mH
    if m <= n:
        K = gradh.matmul(pinvA)
        KpinvAh = K.matmul(pinvAh)
        return (
            -(pinvA.matmul(K)).mH
            + KpinvAh
            - (A.matmul(pinvA)).matmul(KpinvAh)
            + (pinvAh.matmul(pinvA)).matmul(gradh - K.matmul(A))
        )
    K = pinvA.matmul(gradh)
    pinvAhK = pinvAh.matmul(K)
    return (
        -(K.matmul(pinvA)).mH
        + (gradh - A.matmul(K)).matmul(pinvA).matmul(pinvAh)
        + pinvAhK
        - pinvAhK.matmul(pinvA).matmul(A)
    )


def lstsq_backward(args, kwargs, outputs, cotangents):
    """``linalg_lstsq_backward`` (the node saves A, B and the solution; the pseudo-inverse is
    computed again, as eager's backward computes it)."""
    gX_, gL_ = cotangents[0], cotangents[1]
    A, B_, X_ = args[0], args[1], outputs[0]
    rest = (None,) * (len(args) - 2)
    if gX_ is None and (gL_ is None or gL_.numel() == 0):
        return (None, None, *rest)
    vector = B_.ndim == 1 or (A.ndim - 1 == B_.ndim and B_.shape == A.shape[:-1])
    B = B_.unsqueeze(-1) if vector else B_
    gA = gB = None
    if gX_ is not None:
        gX = gX_.unsqueeze(-1) if vector else gX_
        pinvA = torch.linalg.pinv(A)
        gA = _pinv_backward(gX.matmul(B.mH), pinvA, A)
        gB = pinvA.mH.matmul(gX)
        gB = gB.squeeze(-1) if vector else gB
    if gL_ is not None and gL_.numel():
        X = X_.unsqueeze(-1) if vector else X_
        r = A.matmul(X) - B
        gL = gL_.unsqueeze(-2)
        gA_L = 2 * (gL * r).matmul(X.mH)
        gA = gA_L if gA is None else gA + gA_L
        gB_L = -2 * gL * r
        gB_L = gB_L.squeeze(-1) if vector else gB_L
        gB = gB_L if gB is None else gB + gB_L
    return (gA, gB, *rest)


def matrix_exp_backward(args, kwargs, outputs, cotangents):
    """``linalg_matrix_exp_differential`` with ``adjoint`` (the node saves the input alone): the
    exponential of the block matrix ``[[A^H, grad], [0, A^H]]``, its upper right block."""
    grad = cotangents[0]
    if grad is None:
        return (None,)
    A = args[0].mT.conj()
    n = A.shape[-1]
    meta_grad = torch.zeros((*A.shape[:-2], 2 * n, 2 * n), dtype=grad.dtype, device=grad.device)
    meta_grad.narrow(-2, 0, n).narrow(-1, 0, n).copy_(A)
    meta_grad.narrow(-2, n, n).narrow(-1, n, n).copy_(A)
    meta_grad.narrow(-2, 0, n).narrow(-1, n, n).copy_(grad)
    return (torch.linalg.matrix_exp(meta_grad).narrow(-2, 0, n).narrow(-1, n, n),)


def solve_triangular_backward(args, kwargs, outputs, cotangents):
    """``linalg_solve_triangular_backward`` (the node saves A and the result, not B)."""
    grad = cotangents[0]
    if grad is None:
        return (None, None)
    A, X = args[0], outputs[0]
    upper, left, unitriangular = kwargs["upper"], kwargs.get("left", True), kwargs.get("unitriangular", False)
    G_B = torch.linalg.solve_triangular(A.mH, grad, upper=not upper, left=left, unitriangular=unitriangular)
    X_H = X.mH
    G_A = -torch.matmul(G_B, X_H) if left else -torch.matmul(X_H, G_B)
    G_A = G_A.triu(int(unitriangular)) if upper else G_A.tril(-int(unitriangular))
    return (G_A, G_B)


def _svd_backward(gU, gS, gVh, U, S, Vh):
    """``svd_backward``, real case."""
    if gS is None and gU is None and gVh is None:
        return None
    m, n = U.shape[-2], Vh.shape[-1]
    if gU is None and gVh is None:  # (svdvals)
        return torch.matmul(U, gS.unsqueeze(-1) * Vh) if m >= n else torch.matmul(U * gS.unsqueeze(-2), Vh)
    UhgU = None if gU is None else _skew(torch.matmul(U.mH, gU))
    VhgV = None if gVh is None else _skew(torch.matmul(Vh, gVh.mH))
    if U.is_complex():
        _check_svd_phases(UhgU, VhgV, S)
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
    if U.is_complex() and gU is not None and gVh is not None:
        gA = gA + (_diagonal(UhgU) / (2.0 * S)).diag_embed()
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


_PHASES = (
    "The singular vectors in the complex case are specified up to multiplication by e^{i phi}. The "
    "specified loss function depends on this phase term, making it ill-defined."
)


def _check_svd_phases(UhgU, VhgV, S) -> None:
    """Eager's check that a loss of complex singular vectors does not depend on their phases."""
    im_U = torch.zeros_like(S) if UhgU is None else torch.imag(_diagonal(UhgU))
    im_V = torch.zeros_like(S) if VhgV is None else torch.imag(_diagonal(VhgV))
    if not torch.allclose(im_U, -im_V, rtol=1e-2, atol=1e-2):
        raise RuntimeError(f"svd_backward: {_PHASES}")


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
        torch.real(_diagonal(sym)).mul_(0.5)
        gA = Q.matmul(sym)
        if gQ is not None:
            gA = gA + gQ
        return (torch.linalg.solve_triangular(R.mH, gA, upper=False, left=False),)
    X = -gA
    skew = (X - X.mH).tril()
    if skew.is_complex():
        torch.imag(_diagonal(skew)).mul_(0.5)
    gA = Q.matmul(skew)
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
    """``slogdet_backward`` from ``_linalg_slogdet``'s LU (its log's output is not read: eager's node
    does not save it); of a real matrix the sign's gradient is zero, of a complex one it adds
    ``-i imag(conj(grad_sign) * sign)``."""
    gsign, g = cotangents[0], cotangents[1]
    A = args[0]
    if torch.is_grad_enabled():
        return NotImplemented
    if A.is_complex() and gsign is not None:  # (eager's products, in its order)
        signed = torch.imag(gsign.conj() * outputs[0])
        g = -1j * signed if g is None else g - 1j * signed
    elif A.is_complex() and g is not None:
        g = g.to(A.dtype)  # (the log's real gradient, cast as eager's)
    if g is None:
        return (None,)
    _, _, LU, pivots = outputs if len(outputs) == 4 else torch.ops.aten._linalg_slogdet(A)
    d = torch.diag_embed(g.unsqueeze(-1).expand_as(pivots)).mT
    return (torch.linalg.lu_solve(LU, pivots, d, left=True, adjoint=not _uses_A_T(A)),)


def solve_backward(args, kwargs, outputs, cotangents):
    """``linalg_solve_backward`` without grad mode, from ``_linalg_solve_ex``'s LU."""
    gX = cotangents[0]
    if gX is None:
        return (None, None)
    if len(args) < 2 or (len(outputs) < 3 and not isinstance(args[1], torch.Tensor)):
        return NotImplemented
    A, B = args[0], args[1]  # (B's shape alone where the forward did not save it: ``UNREAD``)
    left = kwargs.get("left", True)
    X = outputs[0]
    _, LU, pivots = outputs if len(outputs) == 3 else torch.ops.aten._linalg_solve_ex(A, B, left=left)[:3]
    batch = LU.shape[:-1]
    vector = X.ndim == 1 or (LU.ndim - 1 == X.ndim and X.shape == batch)
    if torch.is_grad_enabled():  # (higher-order gradients: eager solves again, differentiably)
        gB_ = torch.linalg.solve(A.mH, gX.unsqueeze(-1) if vector else gX, left=left)
    else:
        # (``_linalg_solve_ex`` factors ``A`` itself in this torch, whatever its layout, and its
        # backward solves adjoint: the ``use_A_T`` of det and slogdet is not solve's)
        gB_ = torch.linalg.lu_solve(LU, pivots, gX.unsqueeze(-1) if vector else gX, left=left, adjoint=True)
    X_ = X.unsqueeze(-1) if vector else X
    gA = -gB_.matmul(X_.mH) if left else -X_.mH.matmul(gB_)
    return (gA, gB_.squeeze(-1) if vector else gB_)


def _lu_backward(gL, gU, P, L, U, pivot: bool):
    """``linalg_lu_backward`` (its adjoints ``mH`` make it the complex case's too)."""
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
    "linalg_eig": eig_backward,
    "linalg_pinv": pinv_backward,
    "pinverse": pinv_backward,
    "linalg_lstsq": lstsq_backward,
    "linalg_solve_triangular": solve_triangular_backward,
    "linalg_matrix_exp": matrix_exp_backward,
    "matrix_exp": matrix_exp_backward,
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


#: ltorch name -> the positions of the outputs and of the arguments its backward from the outputs
#: does not read (``<name>.unread_output.<i>``, ``<name>.unread_arg.<i>``: the VJP pass passes None,
#: or an argument's shape, in their place), so that the compiled forward saves what eager's node
#: saves (``derivatives.yaml``): slogdet's node saves no log, cholesky_ex's, inv_ex's and
#: lu_factor_ex's no info, solve's no B.
UNREAD = {
    "linalg_slogdet": ((1,), ()),
    "_linalg_slogdet": ((1,), ()),
    "slogdet": ((1,), ()),
    "linalg_cholesky_ex": ((1,), ()),
    "linalg_inv_ex": ((1,), ()),
    "linalg_lu_factor_ex": ((2,), ()),
    "linalg_solve_saving_factors": ((), (1,)),
    "linalg_lstsq": ((1, 2, 3), ()),
    "linalg_solve_triangular": ((), (1,)),
    "linalg_matrix_exp": ((0,), ()),
    "linalg_eig": ((), (0,)),
    "matrix_exp": ((0,), ()),
}

#: The ops whose formulas here are eager's for complex inputs too (the others' complex inputs take
#: the generic backward).
COMPLEX = {"linalg_cholesky", "linalg_cholesky_ex", "linalg_inv", "inverse", "linalg_inv_ex"}
COMPLEX |= {"linalg_det", "_linalg_det", "det", "linalg_slogdet", "_linalg_slogdet", "slogdet"}
COMPLEX |= {"linalg_solve", "linalg_solve_saving_factors", "linalg_svd", "svd", "linalg_eigh", "linalg_qr"}
COMPLEX |= {"linalg_pinv", "pinverse", "linalg_lstsq", "linalg_solve_triangular", "linalg_matrix_exp", "matrix_exp"}
COMPLEX |= {"linalg_eig"}
COMPLEX |= {"linalg_lu", "linalg_lu_factor", "linalg_lu_factor_ex"}

#: The ops of ``COMPLEX`` whose backward from the outputs alone covers real inputs only (it cannot
#: tell a complex input's gradient from a real one's: eig's eigenpairs are complex either way); a
#: complex input takes ``saved_vjp``.
REAL_OUTPUTS_ONLY = {"linalg_eig"}


def _covered(name: str, args, kwargs) -> bool:
    """Floating tensors, or complex ones where the formula covers them (``COMPLEX``), passed
    positionally (the formulas read them by position)."""
    if any(isinstance(v, torch.Tensor) for v in kwargs.values()):
        return False
    complex_ = name in COMPLEX
    return all(a.dtype.is_floating_point or (complex_ and a.dtype.is_complex) for a in _tensors(args))


def _tensors(args):
    return (a for a in args if isinstance(a, torch.Tensor))


def _is(a, w) -> bool:
    """Whether the argument ``a`` is the wanted input ``w``: the same tensor, or the same shape where
    the forward saved neither (an unread argument: ``UNREAD``)."""
    return a is w or (type(w) is tuple and type(a) is tuple and a == w)


def saved_vjp(name: str, func):
    """The ``saved_vjp`` of the opaque symbol ``name`` running ``func``: its formula's gradients
    for the inputs ``wanted`` (summed where one tensor is several arguments; zeros where none
    flowed, as the generic backward gives), else the generic backward."""
    formula = SAVED_BACKWARDS[name]
    generic = _vjp_of(func)

    def vjp(args, outputs, cotangents, wanted, **kwargs):
        grads = NotImplemented
        if _covered(name, args, kwargs):
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
                    if _is(a, w) and ga is not None:
                        g = ga if g is None else g + ga
            shape = w if type(w) is tuple else w.shape
            if g is not None and g.shape != shape:
                g = g.sum_to_size(shape)  # (autograd's sum over broadcast dims)
            found.append(_zeros_like(w, outputs) if g is None else g)
        return found[0] if len(found) == 1 else tuple(found)

    vjp.__name__ = f"{name}_saved_vjp"
    return vjp


def _zeros_like(w, outputs):
    """Zeros for the wanted input ``w``, or of its shape (an unread argument, of the outputs' dtype
    and device: solve's ``B`` is its result's)."""
    if type(w) is not tuple:
        return torch.zeros_like(w)
    return _zeros(w, next(_tensors(outputs)))


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
    "linalg_eig": lambda outputs: _zeros(outputs[1].shape, outputs[1].real),
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
    "svd": lambda outputs: _zeros((*outputs[0].shape[:-1], outputs[2].shape[-2]), outputs[0]),
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
