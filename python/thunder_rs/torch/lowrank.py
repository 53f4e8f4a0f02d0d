"""``torch.svd_lowrank`` and ``torch.pca_lowrank``: randomized low-rank SVD (Halko et al.) and the
PCA built on it. Both are Python in torch (``torch._lowrank``) over ops thunder_rs traces: the
Gaussian draws (``randn``, from the default generator as eager draws them), products, ``qr`` and
``svd``; so each decomposes as eager's body (``_svd_lowrank``, ``get_approximate_basis``), its
draw an ``ltorch.randn``, and differentiates through those ops. Sparse inputs never reach a
trace (thunder_rs traces dense tensors).

Eager's functions are Python, so autocast casts each op they call by that op's policy: under
autocast they run from the program's code, op by op (``autocast.cast_inside``), not as a symbol.
"""

import torch

from thunder_rs.core.lang import autocast
from thunder_rs.core.lang.eager_layouts import LAYOUT_RULES, laid_out, take_layouts
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.errors import ThunderValueError
from thunder_rs.torch.common import require_tensor
from thunder_rs.torch.symbols import ltorch, torchsymbol

__all__ = ["svd_lowrank", "pca_lowrank"]


def _approximate_basis(A, q: int, niter, M):
    """``torch._lowrank.get_approximate_basis``: an orthonormal basis of ``q`` columns for the
    range of ``A - M``, from a Gaussian draw refined by ``niter`` power iterations."""
    niter = 2 if niter is None else niter
    # eager draws in A's dtype when complex or floating (``_utils.get_floating_dtype``), else float32
    floating = (torch.float16, torch.float32, torch.float64)
    dtype = A.dtype if A.dtype.is_complex or A.dtype in floating else torch.float32

    def minus_m(x, m, r):
        return x if m is None else _as_eager(torch.sub, x, _matmul(m, r))

    R = ltorch.randn(A.shape[-1], q, dtype=dtype, device=A.device)
    Q = _qr(minus_m(_matmul(A, R), M, R))
    for _ in range(niter):
        Q = _qr(minus_m(_matmul(A.mH, Q), None if M is None else M.mH, Q))
        Q = _qr(minus_m(_matmul(A, Q), M, Q))
    return Q


def _as_eager(func, *args, **kwargs):
    """``func`` called as the program's own call is (``langctx``): its ltorch op, the outputs laid
    out as eager's. LAPACK's ``Q`` is column-major, so that ``Q.mH @ A``'s gradient is eager's
    product, not the transposed one (a call of the ltorch op took ``Q`` for row-major: ulps)."""
    op = TORCH_TO_LTORCH[func]
    out = op(*args, **kwargs)
    ruled = func if func in LAYOUT_RULES else op
    if laid_out(ruled, args, kwargs):
        take_layouts(ruled, args, kwargs, out)
    return out


def _matmul(a, b):
    return _as_eager(torch.matmul, *autocast.cast_inside("matmul", a, b))


def _qr(x):
    return _as_eager(torch.linalg.qr, *autocast.cast_inside("linalg_qr", x)).Q


def _svd_lowrank(A, q, niter, M):
    """``torch._lowrank._svd_lowrank`` (Algorithm 5.1 of Halko et al., 2009)."""
    q = 6 if q is None else q
    m, n = A.shape[-2:]
    if M is not None:
        M = ltorch.broadcast_to(M, A.shape)
    if m < n:  # (taken as tall)
        A = A.mH
        M = None if M is None else M.mH
    Q = _approximate_basis(A, q, niter, M)
    B = _matmul(Q.mH, A)
    if M is not None:
        B = _as_eager(torch.sub, B, _matmul(Q.mH, M))
    U, S, Vh = _as_eager(torch.linalg.svd, *autocast.cast_inside("linalg_svd", B), full_matrices=False)
    V, U = Vh.mH, _matmul(Q, U)
    return (V, S, U) if m < n else (U, S, V)


def _svd_lowrank_checked(A, q=6, niter=2, M=None):
    require_tensor("ltorch.svd_lowrank", A, "A")
    return _svd_lowrank(A, q, niter, M)


@torchsymbol(torch.svd_lowrank)
def svd_lowrank(A, q=6, niter=2, M=None):
    return _svd_lowrank_checked(A, q, niter, M)


def _pca_lowrank(A, q=None, center=True, niter=2):
    """eager's body for dense inputs, its checks raising its errors."""
    require_tensor("ltorch.pca_lowrank", A, "A")
    m, n = A.shape[-2:]
    if q is None:
        q = min(6, m, n)
    elif not (q >= 0 and q <= min(m, n)):
        raise ThunderValueError(
            f"ltorch.pca_lowrank: q(={q}) must be non-negative integer and not greater than min(m, n)={min(m, n)} "
            "(argument q)"
        )
    if not (niter >= 0):
        raise ThunderValueError(f"ltorch.pca_lowrank: niter(={niter}) must be non-negative integer (argument niter)")
    if not center:
        return _svd_lowrank(A, q, niter, None)
    return _svd_lowrank(_as_eager(torch.sub, A, _as_eager(torch.mean, A, (-2,), keepdim=True)), q, niter, None)


@torchsymbol(torch.pca_lowrank)
def pca_lowrank(A, q=None, center=True, niter=2):
    return _pca_lowrank(A, q, center, niter)


def _symbol_or_body(symbol, body):
    """``symbol``, or under autocast ``body`` from the program's code (each op cast by its policy)."""

    def call(*args, **kwargs):
        return symbol(*args, **kwargs) if autocast.state() is None else body(*args, **kwargs)

    return call


TORCH_TO_LTORCH[torch.svd_lowrank] = _symbol_or_body(svd_lowrank, _svd_lowrank_checked)
TORCH_TO_LTORCH[torch.pca_lowrank] = _symbol_or_body(pca_lowrank, _pca_lowrank)
