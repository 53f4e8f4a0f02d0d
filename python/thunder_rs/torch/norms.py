"""Norms and NaN-aware reductions: linalg.vector_norm, linalg.matrix_norm, linalg.norm, torch.norm,
dist, renorm, nansum, nanmean, aminmax, msort, and diff.

Norms follow eager's ATen definitions (``LinearAlgebra.cpp``): matrix norms reduce to vector norms
and to the singular values (``ltorch.linalg_svdvals``, an opaque symbol). The gradient of
vector_norm is eager's ``norm_backward`` (its grad rule, at the end of this file), which is zero
where the norm is, rather than the NaN that differentiating ``sqrt(sum(x * x))`` gives there.
"""

import math

import torch

from thunder_rs import clang, prims
from thunder_rs.torch.symbols import ltorch
from thunder_rs.core.base import dtypes
from thunder_rs.errors import (
    ThunderIndexError,
    ThunderNotImplementedError,
    ThunderRuntimeError,
    ThunderTypeError,
    check,
)
from thunder_rs.torch.autograd import with_zero_gradient
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.torch.common import LOW_PRECISION, is_int, kept, require_tensor
from thunder_rs.torch.symbols import torchsymbol
from thunder_rs.torch.elementwise import add, sub
from thunder_rs.torch.factorizations import singular_values
from thunder_rs.torch.reductions import _dims

T = torch.Tensor
LA = torch.linalg
__all__ = [
    "linalg_vector_norm",
    "linalg_matrix_norm",
    "linalg_norm",
    "norm",
    "tensor_norm",
    "nuclear_norm",
    "dist",
    "renorm",
    "nansum",
    "nanmean",
    "aminmax",
    "msort",
    "diff",
]


def _check_floating(op: str, x, name: str = "input", exc=ThunderNotImplementedError, complex_values=False) -> None:
    require_tensor(op, x, name)
    check(
        dtypes.is_inexact(x.dtype),
        op,
        lambda: f"Expected a floating point or complex tensor as input. Got {x.dtype} (argument {name})",
        exc,
    )
    check(
        complex_values or not x.dtype.is_complex,
        op,
        f"complex inputs are not supported by thunder_rs (argument {name})",
        ThunderNotImplementedError,
    )


def _norm_dtype(op: str, x, dtype):
    """The dtype a norm computes in: ``dtype`` when given, which must widen ``x``'s."""
    if dtype is None:
        return x.dtype
    check(
        dtypes.is_inexact(dtype),
        op,
        f"dtype should be floating point or complex, but got {dtype} (argument dtype)",
        ThunderRuntimeError,
    )
    check(
        torch.promote_types(x.dtype, dtype) == dtype,
        op,
        f"the dtype of the input ({x.dtype}) should be convertible without narrowing to the specified dtype ({dtype}) "
        "(argument dtype)",
        ThunderRuntimeError,
    )
    return dtype


def _check_ord(op: str, ord) -> float:
    check(
        isinstance(ord, (int, float)) and not isinstance(ord, bool),
        op,
        lambda: f"expected a number for ord, got {type(ord).__name__} (argument ord)",
        ThunderTypeError,
    )
    return float(ord)


@torchsymbol(LA.vector_norm)
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None, out=None):
    op = "ltorch.linalg_vector_norm"
    # (complex values without ``dtype=``: their magnitudes' norm, eager's kernel; with it, eager's op)
    _check_floating(op, x, "x", complex_values=dtype is None)
    p = _check_ord(op, ord)
    dims = _dims(x, dim, op)
    if p < 0 or math.isinf(p):
        reduced = math.prod(x.shape[d] for d in dims) if x.ndim else 1
        check(
            reduced != 0,
            op,
            f"linalg.vector_norm cannot compute the {ord} norm on an empty tensor because the operation does not have "
            "an identity",
            ThunderRuntimeError,
        )
    a = ltorch.abs(clang.maybe_convert(x, _norm_dtype(op, x, dtype)))
    if p == 0:
        return with_zero_gradient(ltorch.sum(clang.maybe_convert(ltorch.ne(a, 0), a.dtype), dims, keepdim), x)
    if p == math.inf:
        return ltorch.amax(a, dims, keepdim)
    if p == -math.inf:
        return ltorch.amin(a, dims, keepdim)
    if p == 1:
        return ltorch.sum(a, dims, keepdim)
    if p == 2:
        return ltorch.sqrt(ltorch.sum(ltorch.mul(a, a), dims, keepdim))
    return ltorch.pow(ltorch.sum(ltorch.pow(a, p), dims, keepdim), 1.0 / p)


def _matrix_dims(op: str, A, dim):
    check(
        isinstance(dim, (tuple, list)) and len(dim) == 2,
        op,
        f"dim must be a 2-tuple. Got {dim!r} (argument dim)",
        ThunderRuntimeError,
    )
    check(A.ndim >= 2, op, "The input tensor A must have at least 2 dimensions.", ThunderRuntimeError)
    d0, d1 = (clang.canonicalize_dim(A.ndim, d, op) for d in dim)
    check(d0 != d1, op, f"dims must be different. Got ({dim[0]}, {dim[1]}) (argument dim)", ThunderRuntimeError)
    return d0, d1


def _singular_norm(A, ord, d0, d1, keepdim: bool):
    """Norms of the singular values: 'nuc' their sum, 2 the largest, -2 the smallest."""
    others = [i for i in range(A.ndim) if i not in (d0, d1)]
    values = singular_values(ltorch.permute(A, (*others, d0, d1)))
    if ord == "nuc":
        out = ltorch.sum(values, -1)
    else:
        out = (ltorch.amax if ord > 0 else ltorch.amin)(values, -1)
    if keepdim:
        out = ltorch.unsqueeze(ltorch.unsqueeze(out, min(d0, d1)), max(d0, d1))
    return out


@torchsymbol(LA.matrix_norm)
def linalg_matrix_norm(A, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None, out=None):
    op = "ltorch.linalg_matrix_norm"
    # (complex values: the Frobenius norm, eager's vector 2-norm; the others are eager's op)
    _check_floating(op, A, "A", complex_values=isinstance(ord, str) and ord == "fro" and dtype is None)
    d0, d1 = _matrix_dims(op, A, dim)
    if isinstance(ord, str):
        check(ord in ("fro", "nuc"), op, f"Order {ord} not supported.", ThunderRuntimeError)
        if ord == "fro":
            return linalg_vector_norm(A, 2, (d0, d1), keepdim, dtype=dtype)
        return _singular_norm(clang.maybe_convert(A, _norm_dtype(op, A, dtype)), ord, d0, d1, keepdim)
    p = _check_ord(op, ord)
    check(p in (1, -1, 2, -2, math.inf, -math.inf), op, f"Order {ord} not supported.", ThunderRuntimeError)
    if abs(p) == 2:
        return _singular_norm(clang.maybe_convert(A, _norm_dtype(op, A, dtype)), p, d0, d1, keepdim)
    # eager: the vector 1-norm along one dim (columns for +-1, rows for +-inf), then max or min.
    if math.isinf(p):
        d0, d1 = d1, d0
    if not keepdim and d0 < d1:
        d1 -= 1
    sums = linalg_vector_norm(A, 1, d0, keepdim, dtype=dtype)
    return (ltorch.amax if p > 0 else ltorch.amin)(sums, d1, keepdim)


@torchsymbol(LA.norm)
def linalg_norm(A, ord=None, dim=None, keepdim=False, *, out=None, dtype=None):
    """A matrix norm for a 2-D input or two dims with ``ord`` given, else a vector norm."""
    op = "ltorch.linalg_norm"
    require_tensor(op, A, "A")
    if dim is not None:
        dims = [dim] if isinstance(dim, int) else list(dim)
        check(
            len(dims) in (1, 2),
            op,
            f"If dim is specified, it must be of length 1 or 2. Got {dims}",
            ThunderRuntimeError,
        )
    else:
        dims = None
        check(
            ord is None or A.ndim in (1, 2),
            op,
            f"If dim is not specified but ord is, the input must be 1D or 2D. Got {A.ndim}D.",
            ThunderRuntimeError,
        )
    if isinstance(ord, str) or (ord is not None and (len(dims) == 2 if dims is not None else A.ndim == 2)):
        return linalg_matrix_norm(A, ord, dims if dims is not None else (0, 1), keepdim, dtype=dtype)
    return linalg_vector_norm(A, 2 if ord is None else ord, dims, keepdim, dtype=dtype)


@torchsymbol(torch.norm)
def norm(input, p="fro", dim=None, keepdim=False, out=None, dtype=None):
    """torch.functional.norm for strided tensors: 'fro' (over at most two dims) and numbers are
    vector norms, other strings matrix norms."""
    op = "ltorch.norm"
    require_tensor(op, input)
    dims = None if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    if isinstance(p, str):
        if p == "fro" and (dims is None or len(dims) <= 2):
            return linalg_vector_norm(input, 2, dims, keepdim, dtype=dtype)
        return linalg_matrix_norm(input, p, dims if dims is not None else list(range(input.ndim)), keepdim, dtype=dtype)
    return linalg_vector_norm(input, 2.0 if p is None else p, dims, keepdim, dtype=dtype)


@torchsymbol(T.norm)
def tensor_norm(input, p="fro", dim=None, keepdim=False, dtype=None):
    """``Tensor.norm``, which takes no ``out``."""
    return norm(input, p, dim, keepdim, dtype=dtype)


@torchsymbol(torch.nuclear_norm)
def nuclear_norm(input, dim=None, keepdim=False, *, out=None):
    """``torch.nuclear_norm(input, keepdim)`` or ``(input, dim, keepdim)``: eager's is
    ``linalg.matrix_norm(input, 'nuc', dim, keepdim)`` (over the last two dims without ``dim``),
    whose singular values are computed with the vectors where ``input`` requires grad."""
    if isinstance(dim, bool):
        dim, keepdim = None, dim
    return linalg_matrix_norm(input, "nuc", (-2, -1) if dim is None else dim, keepdim)


@torchsymbol(torch.dist, T.dist)
def dist(input, other, p=2):
    """The ``p``-norm of ``input - other`` (broadcast, promoted)."""
    op = "ltorch.dist"
    for x, name in ((input, "input"), (other, "other")):
        require_tensor(op, x, name)
    difference = sub(input, other)
    check(
        dtypes.is_inexact(difference.dtype),
        op,
        f"norm(): input dtype should be either floating point or complex. Got {difference.dtype} instead.",
        ThunderNotImplementedError,
    )
    return linalg_vector_norm(difference, p)


@torchsymbol(torch.renorm, T.renorm)
def renorm(input, p, dim, maxnorm):
    """Each slice along ``dim`` whose ``p``-norm exceeds ``maxnorm`` scaled to norm ``maxnorm``
    (divided by ``norm + 1e-7``, as eager)."""
    op = "ltorch.renorm"
    _check_floating(op, input)
    check(p > 0, op, "non-positive-norm not supported (argument p)", ThunderRuntimeError)
    check(maxnorm >= 0, op, f"expected maxnorm to be >= 0 but got {maxnorm} (argument maxnorm)", ThunderRuntimeError)
    check(
        input.ndim > 1,
        op,
        f"renorm: input needs at least 2 dimensions, got {input.ndim} dimensions",
        ThunderRuntimeError,
    )
    d = clang.canonicalize_dim(input.ndim, dim, op)
    # (eager's norm and factor of half precision in float32, the factor rounded once)
    wide = torch.float32 if input.dtype in LOW_PRECISION else None
    norms = linalg_vector_norm(input, p, [i for i in range(input.ndim) if i != d], True, dtype=wide)
    factor = ltorch.where(ltorch.gt(norms, maxnorm), ltorch.true_divide(maxnorm, add(norms, 1e-7)), 1.0)
    return ltorch.mul(input, clang.maybe_convert(factor, input.dtype))


def _accumulate_dtype(x):
    """ATen's ``toAccumulateType`` of ``x``'s dtype on its device: on the CPU float32 sums in float64."""
    if x.dtype in LOW_PRECISION:
        return torch.float32
    return torch.float64 if x.device.type == "cpu" else x.dtype


@register_grad(ltorch.renorm)
def renorm_grad(input, p, dim, maxnorm):
    """Eager's ``renorm_backward``: the norms and ``sum(input * grad)`` over the other dims in the
    accumulate dtype (float64 for float32 on the CPU), ``norm_backward`` of them, and
    ``maxnorm * invnorm * (grad - invnorm * nb)`` rounded to the gradient's dtype where the norm
    exceeds ``maxnorm``. (The VJP of the decomposition rounded in the input's dtype.)"""
    out = ltorch.renorm(input, p, dim, maxnorm)
    g = get_grad(out)
    d = clang.canonicalize_dim(input.ndim, dim, "ltorch.renorm")
    dims = [i for i in range(input.ndim) if i != d]
    acc = _accumulate_dtype(input)
    norm = linalg_vector_norm(input, p, dims, True, dtype=acc)
    nb = norm_backward(ltorch.sum(ltorch.mul(input, g), dims, True, dtype=acc), input, float(p), norm, dims)
    invnorm = ltorch.reciprocal(add(norm, 1e-7))
    grad = ltorch.mul(ltorch.mul(invnorm, maxnorm), sub(g, ltorch.mul(invnorm, nb)))
    put_grad(input, ltorch.where(ltorch.gt(norm, maxnorm), ltorch.to(grad, g.dtype), g))
    return out


def _not_nan(x):
    return ltorch.eq(x, x)


@torchsymbol(torch.nansum, T.nansum)
def nansum(input, dim=None, keepdim=False, *, dtype=None):
    """``sum`` with NaNs counted as zero."""
    zeroed = ltorch.where(_not_nan(input), input, 0) if dtypes.is_inexact(input.dtype) else input
    return ltorch.sum(zeroed, dim, keepdim, dtype=dtype)


@torchsymbol(torch.nanmean, T.nanmean)
def nanmean(input, dim=None, keepdim=False, *, dtype=None):
    """``nansum`` divided by the number of elements that are not NaN."""
    op = "ltorch.nanmean"
    check(
        dtypes.is_inexact(input.dtype),
        op,
        f"nanmean(): expected input to have floating point or complex dtype but got {input.dtype}",
        ThunderNotImplementedError,
    )
    count = ltorch.sum(_not_nan(input), dim, keepdim)
    return ltorch.div(nansum(input, dim, keepdim, dtype=dtype), count)


@torchsymbol(torch.aminmax, T.aminmax)
def aminmax(input, *, dim=None, keepdim=False):
    op = "ltorch.aminmax"
    dims = _dims(input, dim, op, sequences=False)
    empty = any(input.shape[d] == 0 for d in dims) if input.ndim else False
    check(
        not empty,
        op,
        "aminmax(): cannot compute aminmax over an empty dimension as the operation has no identity.",
        ThunderIndexError if dim is not None else ThunderRuntimeError,
    )
    reduce_dims = () if dim is None else dims
    return torch.return_types.aminmax(
        (ltorch.amin(input, reduce_dims, keepdim), ltorch.amax(input, reduce_dims, keepdim))
    )


@torchsymbol(torch.msort, T.msort)
def msort(input):
    return ltorch.sort(input, 0)[0]


def _difference(x, d: int):
    """``x[1:] - x[:-1]`` along ``d`` (for bools, ``!=``). The slices are taken in the order
    eager's ``diff`` takes them (its C++ evaluates the right operand first), so that their
    gradients reach ``x`` in the order its autograd adds them among ``x``'s other uses."""
    n = x.shape[d]
    earlier = ltorch.narrow(x, d, 0, n - 1)
    later = ltorch.narrow(x, d, 1, n - 1)
    return ltorch.ne(later, earlier) if x.dtype == torch.bool else sub(later, earlier)


@torchsymbol(torch.diff, T.diff)
def diff(input, n=1, dim=-1, prepend=None, append=None):
    """The ``n``-th forward difference along ``dim``, after ``prepend`` and ``append``."""
    op = "ltorch.diff"
    require_tensor(op, input)
    check(input.ndim >= 1, op, "diff expects input to be at least one-dimensional", ThunderRuntimeError)
    check(is_int(n) and n >= 0, op, f"order must be non-negative but got {n} (argument n)", ThunderRuntimeError)
    d = clang.canonicalize_dim(input.ndim, dim, op)
    for extra, name in ((prepend, "prepend"), (append, "append")):
        check(
            extra is None or (isinstance(extra, torch.Tensor) and extra.ndim == input.ndim),
            op,
            f"diff expects {name} to be a tensor with as many dims as input (argument {name})",
            ThunderRuntimeError,
        )
    parts = [t for t in (prepend, input, append) if t is not None]
    x = ltorch.cat(parts, d) if len(parts) > 1 else input
    for _ in range(min(n, x.shape[d])):  # (an order from a symbolic size is specialised: a loop count)
        x = _difference(x, d)
    return ltorch.clone(x) if x is input else x  # (``n=0``: eager's copy, not the input)


# -- grad rule of vector_norm ----------------------------------------------------------------------


# Differentiating the decomposition gives NaN where the norm is zero (``x / sqrt(0)``) and splits
# ties of the inf-norm differently; eager's formula is zero there and divides the gradient evenly
# among the elements that attain the maximum (or are NaN).


def norm_backward(g, x, p: float, norm, dims):
    """Eager's ``norm_backward``: ``g`` and ``norm`` have ``x``'s rank; of complex ``x`` its
    ``sgn`` where a real one's sign is (``norm`` and ``g`` are real, each product promoted)."""
    sign = prims.sgn if x.dtype.is_complex else ltorch.sign
    if p == 0:
        return ltorch.zeros_like(x)
    if p == 1:
        return ltorch.mul(sign(x), g)
    if p == 2:
        return ltorch.mul(g, ltorch.where(ltorch.eq(norm, 0), 0.0, ltorch.true_divide(x, norm)))
    if math.isinf(p):
        magnitude = ltorch.abs(x)
        attains = ltorch.bitwise_or(ltorch.eq(magnitude, norm), ltorch.ne(magnitude, magnitude))
        share = ltorch.true_divide(g, ltorch.sum(attains, dims, True))
        return ltorch.mul(sign(x), ltorch.where(attains, share, 0.0))
    if p < 1:
        scaled = ltorch.where(ltorch.eq(x, 0), 0.0, ltorch.mul(sign(x), ltorch.pow(ltorch.abs(x), p - 1)))
        return ltorch.mul(ltorch.mul(scaled, g), ltorch.pow(norm, 1 - p))
    if p < 2:
        scaled = ltorch.mul(sign(x), ltorch.pow(ltorch.abs(x), p - 1))
    else:
        scaled = ltorch.mul(x, ltorch.pow(ltorch.abs(x), p - 2))
    scale = ltorch.where(ltorch.eq(norm, 0), 0.0, ltorch.true_divide(g, ltorch.pow(norm, p - 1)))
    return ltorch.mul(scaled, scale)


@register_grad(ltorch.linalg_vector_norm)
def vector_norm_grad(x, ord=2, dim=None, keepdim=False, *, dtype=None, out=None):
    result = ltorch.linalg_vector_norm(x, ord, dim, keepdim, dtype=dtype)
    g = get_grad(result)
    if float(ord) == 0:
        return result  # eager's norm_backward gives no gradient (None, where zeros would differ)
    dims = _dims(x, dim, "ltorch.linalg_vector_norm")
    norm = result
    if not keepdim and x.ndim:
        g, norm = kept(g, x.shape, dims), kept(norm, x.shape, dims)
    wide = x if x.dtype.is_complex else ltorch.to(x, result.dtype)  # (complex: no ``dtype=``, the symbol's case)
    grad = norm_backward(g, wide, float(ord), norm, dims)
    put_grad(x, grad if x.dtype.is_complex else ltorch.to(grad, x.dtype), complex_values=True)
    return result
