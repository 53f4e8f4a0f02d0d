"""Products built on matmul: addmv, addbmm, addr, vdot, tensordot, cross, linalg.cross,
linalg.vecdot, linalg.multi_dot, linalg.matrix_power and linalg.vander.

Contractions become permute/reshape/matmul, so the VJP pass differentiates them through matmul;
the torch executor still runs each symbol whole. As in ``linalg.py``, products do not promote
(eager requires one dtype), except ``addr``, which eager computes as a promoting outer product.
"""

import math

import torch

from thunder_rs import clang, prims
from thunder_rs.torch.common import require_tensor, sum_to
from thunder_rs.torch.symbols import ltorch
from thunder_rs.core.base import dtypes
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, ThunderTypeError, check
from thunder_rs.torch.autograd import with_zero_gradient
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.torch.symbols import torchsymbol
from thunder_rs.torch.creation import identity
from thunder_rs.torch.elementwise import sub
from thunder_rs.torch.linalg import _add_scaled, _check_inner, _check_operands, _scaled, check_lengths, ignoring
from thunder_rs.core.lang.fallback import fallback
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.core.lang.symint import same_shape

T = torch.Tensor
LA = torch.linalg
__all__ = [
    "addmv",
    "addbmm",
    "addr",
    "vdot",
    "tensordot",
    "cross",
    "linalg_cross",
    "linalg_vecdot",
    "linalg_multi_dot",
    "linalg_matrix_power",
    "linalg_vander",
    "vander",
]


def _check_tensor(op: str, x, name: str) -> None:
    require_tensor(op, x, name)


def same_dtype(op: str, tensors, message: str) -> None:
    for t in tensors[1:]:
        check(
            t.dtype == tensors[0].dtype,
            op,
            lambda: f"{message}, but found {tensors[0].dtype} and {t.dtype}",
            ThunderRuntimeError,
        )


def _real(op: str, x, name: str) -> None:
    check(
        not x.dtype.is_complex,
        op,
        f"complex inputs are not supported by thunder_rs (argument {name})",
        ThunderNotImplementedError,
    )


# -- add-and-multiply ------------------------------------------------------------------------------


@torchsymbol(torch.addmv, T.addmv)
def addmv(input, mat, vec, *, beta=1, alpha=1):
    op = "ltorch.addmv"
    _check_tensor(op, input, "input")
    _check_operands(op, mat, vec, ("mat", "vec"), ranks=(2, 1))
    _check_inner(op, mat, vec, ("mat", "vec"))
    return _add_scaled(op, prims.matmul(mat, vec), input, beta, alpha)


@register_grad(ltorch.addmv)
def addmv_grad(input, mat, vec, *, beta=1, alpha=1):
    """Eager's: ``g * beta`` for ``input`` (summed to its shape), ``g.ger(vec) * alpha`` and
    ``mat.t().mv(g) * alpha``: the products scaled after (the decomposition's VJP scaled the
    cotangent first)."""
    out = ltorch.addmv(input, mat, vec, beta=beta, alpha=alpha)
    if mat.dtype.is_complex or not out.dtype.is_floating_point:
        return out  # the decomposition's VJP
    g = get_grad(out)
    if input.requires_grad:
        put_grad(input, sum_to(_scaled(g, beta), input.shape))
    if mat.requires_grad:
        put_grad(mat, _scaled(ltorch.outer(g, vec), alpha))
    if vec.requires_grad:
        put_grad(vec, _scaled(ltorch.mv(ltorch.t(mat), g), alpha))
    return out


@torchsymbol(torch.addbmm, T.addbmm)
def addbmm(input, batch1, batch2, *, beta=1, alpha=1):
    """``beta * input + alpha * sum_b batch1[b] @ batch2[b]``."""
    op = "ltorch.addbmm"
    _check_tensor(op, input, "input")
    _check_operands(op, batch1, batch2, ("batch1", "batch2"), ranks=(3, 3))
    check(
        batch1.shape[0] == batch2.shape[0],
        op,
        f"batch1 and batch2 must have same number of batches, got {batch1.shape[0]} and {batch2.shape[0]} "
        "(argument batch2)",
        ThunderRuntimeError,
    )
    _check_inner(op, batch1, batch2, ("batch1", "batch2"))
    products = prims.matmul(batch1, batch2)
    # (eager's integer addbmm accumulates each product into the result in its dtype, wrapping: the
    # sum of integers stays in the batches' dtype, not ``sum``'s int64)
    exact = None if dtypes.is_inexact(products.dtype) else products.dtype
    return _add_scaled(op, ltorch.sum(products, 0, dtype=exact), input, beta, alpha)


@register_grad(ltorch.addbmm)
def addbmm_grad(input, batch1, batch2, *, beta=1, alpha=1):
    """Eager's: ``g * beta`` for ``input`` (summed to its shape), and the batched products with
    ``g`` expanded over the batch, ``g @ batch2^T`` and ``batch1^T @ g``, times ``alpha`` after."""
    out = ltorch.addbmm(input, batch1, batch2, beta=beta, alpha=alpha)
    if batch1.dtype.is_complex or not out.dtype.is_floating_point:
        return out  # the decomposition's VJP
    g = get_grad(out)
    if input.requires_grad:
        put_grad(input, sum_to(_scaled(g, beta), input.shape))
    expanded = ltorch.expand(ltorch.unsqueeze(g, 0), (batch1.shape[0], batch1.shape[1], batch2.shape[2]))
    if batch1.requires_grad:
        put_grad(batch1, _scaled(ltorch.bmm(expanded, ltorch.transpose(batch2, 1, 2)), alpha))
    if batch2.requires_grad:
        put_grad(batch2, _scaled(ltorch.bmm(ltorch.transpose(batch1, 1, 2), expanded), alpha))
    return out


def _check_scale(op: str, value, name: str, dtype) -> None:
    """Eager's rules for beta and alpha: bools only for bool tensors, no floats for integer ones."""
    check(
        not isinstance(value, bool) or dtype == torch.bool,
        op,
        f"Boolean {name} only supported for Boolean results (argument {name})",
        ThunderRuntimeError,
    )
    if not dtypes.is_inexact(dtype):
        check(
            not isinstance(value, float),
            op,
            f"For integral input tensors, argument {name} must not be a floating point number.",
            ThunderRuntimeError,
        )


@torchsymbol(torch.addr, T.addr)
def addr(input, vec1, vec2, *, beta=1, alpha=1):
    """``beta * input + alpha * outer(vec1, vec2)``, promoting like ``input + vec1 * vec2``; for
    bools ``(beta and input) or (alpha and outer)``."""
    op = "ltorch.addr"
    for x, name in ((input, "input"), (vec1, "vec1"), (vec2, "vec2")):
        _check_tensor(op, x, name)
    for x, name in ((vec1, "vec1"), (vec2, "vec2")):
        check(x.ndim == 1, op, f"{name} must be a 1-D tensor, got {x.ndim}-D (argument {name})", ThunderRuntimeError)
    column, row = prims.reshape(vec1, (vec1.shape[0], 1)), prims.reshape(vec2, (1, vec2.shape[0]))
    common = torch.promote_types(vec1.dtype, vec2.dtype)
    if dtypes.is_inexact(common):
        # A product of one term, as exact as the multiplication; its gradients are matrix
        # products that accumulate in float32 as eager's ``grad.mv(vec2)`` does (a multiplication
        # rounded each product to bfloat16 first: 6x eager's error from float64 on an H200).
        outer = prims.matmul(clang.maybe_convert(column, common), clang.maybe_convert(row, common))
    else:
        outer = ltorch.mul(column, row)
    out_dtype = torch.promote_types(input.dtype, outer.dtype)
    shape = clang.broadcast_shapes(op, input.shape, outer.shape)
    check(
        same_shape(shape, outer.shape),
        op,
        f"input of shape {list(input.shape)} does not broadcast to the outer product's shape {list(outer.shape)} "
        "(argument input)",
        ThunderRuntimeError,
    )
    for value, name in ((beta, "beta"), (alpha, "alpha")):
        _check_scale(op, value, name, out_dtype)
    outer = clang.maybe_convert(outer, out_dtype)
    if out_dtype == torch.bool:
        product = outer if alpha else ltorch.zeros_like(outer)
        return ltorch.bitwise_or(clang.expand_to(input, outer.shape), product) if beta else product
    if alpha != 1:
        outer = prims.mul(outer, clang.maybe_convert(alpha, out_dtype))
    if beta == 0:
        return ignoring(outer, input)
    scaled = clang.maybe_convert(input, out_dtype)
    scaled = scaled if beta == 1 else prims.mul(scaled, clang.maybe_convert(beta, out_dtype))
    return prims.add(clang.expand_to(scaled, outer.shape), outer)


@register_grad(ltorch.addr)
def addr_grad(input, vec1, vec2, *, beta=1, alpha=1):
    """Eager's: ``g * beta`` for ``input`` (summed to its shape), ``g.mv(vec2) * alpha`` and
    ``g.t().mv(vec1) * alpha`` (operands of one floating dtype; others keep the decomposition's
    VJP)."""
    out = ltorch.addr(input, vec1, vec2, beta=beta, alpha=alpha)
    if not (out.dtype.is_floating_point and input.dtype == vec1.dtype == vec2.dtype == out.dtype):
        return out  # the decomposition's VJP
    g = get_grad(out)
    if input.requires_grad:
        put_grad(input, sum_to(_scaled(g, beta), input.shape))
    if vec1.requires_grad:
        put_grad(vec1, _scaled(ltorch.mv(g, vec2), alpha))
    if vec2.requires_grad:
        put_grad(vec2, _scaled(ltorch.mv(ltorch.t(g), vec1), alpha))
    return out


@torchsymbol(torch.vdot, T.vdot)
def vdot(input, other):
    """For real tensors, ``dot``."""
    op = "ltorch.vdot"
    _check_operands(op, input, other, ("input", "other"), ranks=(1, 1))
    _real(op, input, "input")
    check_lengths(op, input, other, "other")
    return prims.matmul(input, other)


# -- contractions ----------------------------------------------------------------------------------


def _contract(op: str, a, b, a_dims, b_dims):
    """``a`` and ``b`` contracted over ``a_dims`` with ``b_dims`` (paired in order): the result
    has ``a``'s free dims, then ``b``'s, as one matrix product."""
    a_free = [d for d in range(a.ndim) if d not in a_dims]
    b_free = [d for d in range(b.ndim) if d not in b_dims]
    k = math.prod(a.shape[d] for d in a_dims)
    # The tensor methods, as eager's tensordot calls them: the trace tracks their views' strides,
    # from which mm's rule lays its gradients out as eager's (column-major for a column-major operand)
    rows, columns = math.prod(a.shape[d] for d in a_free), math.prod(b.shape[d] for d in b_free)
    lhs, rhs = a.permute(*a_free, *a_dims), b.permute(*b_dims, *b_free)
    shape = (*(a.shape[d] for d in a_free), *(b.shape[d] for d in b_free))
    # One element: eager's product is a dot product's (an mm of one row and one column rounds
    # otherwise) where both permuted operands are contiguous, else the sum of their elementwise
    # product, each with its dims of size 1 squeezed (which lays the gradients out as the operands).
    # (A symbolic size is never 1: 0 and 1 stay specialised.)
    if type(rows) is int and type(columns) is int and rows == columns == 1:
        if not (lhs.is_contiguous() and rhs.is_contiguous()):
            return torch.mul(lhs.squeeze(), rhs.squeeze()).sum().reshape(shape)
        return torch.dot(lhs.reshape(rows, k).reshape(k), rhs.reshape(k, columns).reshape(k)).reshape(shape)
    return torch.mm(lhs.reshape(rows, k), rhs.reshape(k, columns)).reshape(shape)


def _tensordot_dims(op: str, a, b, dims):
    if isinstance(dims, int) and not isinstance(dims, bool):
        check(dims >= 0, op, f"tensordot expects dims >= 0, but got dims={dims} (argument dims)", ThunderRuntimeError)
        check(
            dims <= a.ndim and dims <= b.ndim,
            op,
            f"tensordot expects dims < ndim_a or ndim_b, but got dims={dims} (argument dims)",
            ThunderRuntimeError,
        )
        a_dims, b_dims = list(range(a.ndim - dims, a.ndim)), list(range(dims))
    else:
        a_dims, b_dims = _dims_lists(op, a, b, dims)
    for da, db in zip(a_dims, b_dims):
        check(
            a.shape[da] == b.shape[db] or 1 in (a.shape[da], b.shape[db]),
            op,
            f"contracted dimensions need to match, but first has size {a.shape[da]} in dim {da} and second has size "
            f"{b.shape[db]} in dim {db}",
            ThunderRuntimeError,
        )
    return a_dims, b_dims


def _dims_lists(op: str, a, b, dims):
    """``dims`` given as a pair of dim lists (or of single dims), canonicalised."""
    check(
        not isinstance(dims, torch.Tensor),
        op,
        "dims given as a tensor are not supported (argument dims)",
        ThunderNotImplementedError,
    )
    check(
        isinstance(dims, (list, tuple)) and len(dims) == 2,
        op,
        "expected dims to be an int or a pair of lists (argument dims)",
        ThunderRuntimeError,
    )
    a_dims, b_dims = ([d] if isinstance(d, int) else list(d) for d in dims)
    check(
        len(a_dims) == len(b_dims),
        op,
        "both dimension lists should have same length (argument dims)",
        ThunderRuntimeError,
    )
    a_dims = [clang.canonicalize_dim(a.ndim, d, op, "dims") for d in a_dims]
    b_dims = [clang.canonicalize_dim(b.ndim, d, op, "dims") for d in b_dims]
    return a_dims, b_dims


@torchsymbol(torch.tensordot)
def tensordot(a, b, dims=2, out=None):
    op = "ltorch.tensordot"
    _check_tensor(op, a, "a")
    _check_tensor(op, b, "b")
    same_dtype(op, (a, b), "both inputs should have same dtype")
    check(a.dtype != torch.bool, op, "not implemented for 'Bool' (argument a)", ThunderNotImplementedError)
    a_dims, b_dims = _tensordot_dims(op, a, b, dims)
    # A contracted dim of size 1 against a longer one: eager sums the longer one first.
    a_sum = [da for da, db in zip(a_dims, b_dims) if a.shape[da] != b.shape[db] and b.shape[db] == 1]
    b_sum = [db for da, db in zip(a_dims, b_dims) if a.shape[da] != b.shape[db] and a.shape[da] == 1]
    a = ltorch.sum(a, a_sum, True) if a_sum else a
    b = ltorch.sum(b, b_sum, True) if b_sum else b
    return _contract(op, a, b, a_dims, b_dims)


# -- cross and vecdot ------------------------------------------------------------------------------


def _cross(op: str, input, other, dim):
    """``a[i+1] * b[i+2] - a[i+2] * b[i+1]`` along ``dim`` (indices mod 3), as eager computes it."""
    _check_tensor(op, input, "input")
    _check_tensor(op, other, "other")
    check(
        input.ndim == other.ndim,
        op,
        f"inputs must have the same number of dimensions, got {input.ndim} and {other.ndim} (argument other)",
        ThunderRuntimeError,
    )
    same_dtype(op, (input, other), "expected both inputs to have the same dtype")
    shape = clang.broadcast_shapes(op, input.shape, other.shape)
    if dim is None:  # the first dim of size 3 (deprecated in eager)
        check(3 in shape, op, "no dimension of size 3 in input (argument dim)", ThunderRuntimeError)
        dim = list(shape).index(3)
    d = clang.canonicalize_dim(len(shape), dim, op)
    check(
        shape[d] == 3,
        op,
        f"inputs dimension {dim} must have length 3, got {shape[d]} (argument dim)",
        ThunderRuntimeError,
    )
    a, b = clang.expand_to(input, shape), clang.expand_to(other, shape)
    return _cross_of(a, b, d)


def _cross_dim(op: str, input, other, dim) -> int:
    """The dim ``_cross`` takes the product along (canonical; checked there)."""
    shape = clang.broadcast_shapes(op, input.shape, other.shape)
    return clang.canonicalize_dim(len(shape), list(shape).index(3) if dim is None else dim, op)


def _cross_of(a, b, d: int):
    return sub(
        ltorch.mul(ltorch.roll(a, -1, d), ltorch.roll(b, -2, d)),
        ltorch.mul(ltorch.roll(a, -2, d), ltorch.roll(b, -1, d)),
    )


@torchsymbol(torch.cross, T.cross)
def cross(input, other, dim=None, *, out=None):
    return _cross("ltorch.cross", input, other, dim)


@torchsymbol(LA.cross)
def linalg_cross(input, other, *, dim=-1, out=None):
    return _cross("ltorch.linalg_cross", input, other, dim)


def _put_cross_gradients(out, input, other, d: int) -> None:
    """Eager's: ``linalg_cross(other.conj(), grad)`` and ``linalg_cross(grad, input.conj())``, each
    summed to its input's shape, so that the products round as its kernel's (it contracts each
    component's first product and the subtraction into one FMA; the decomposition's VJP
    differentiated the rolls and products instead)."""
    g = get_grad(out)
    if input.requires_grad:
        put_grad(input, sum_to(ltorch.linalg_cross(ltorch.conj(other), g, dim=d), input.shape))
    if other.requires_grad:
        put_grad(other, sum_to(ltorch.linalg_cross(g, ltorch.conj(input), dim=d), other.shape))


@register_grad(ltorch.cross)
def cross_grad(input, other, dim=None, *, out=None):
    result = ltorch.cross(input, other, dim)
    _put_cross_gradients(result, input, other, _cross_dim("ltorch.cross", input, other, dim))
    return result


@register_grad(ltorch.linalg_cross)
def linalg_cross_grad(input, other, *, dim=-1, out=None):
    result = ltorch.linalg_cross(input, other, dim=dim)
    _put_cross_gradients(result, input, other, _cross_dim("ltorch.linalg_cross", input, other, dim))
    return result


@torchsymbol(LA.vecdot)
def linalg_vecdot(x, y, *, dim=-1, out=None):
    """``sum(x * y, dim)`` for real tensors of one floating dtype."""
    op = "ltorch.linalg_vecdot"
    _check_tensor(op, x, "x")
    _check_tensor(op, y, "y")
    same_dtype(op, (x, y), "Expected x and y to have the same dtype")
    check(
        dtypes.is_inexact(x.dtype),
        op,
        f"Expected a floating point or complex tensor as input. Got {x.dtype} (argument x)",
        ThunderNotImplementedError,
    )
    _real(op, x, "x")
    shape = clang.broadcast_shapes(op, x.shape, y.shape)
    d = clang.canonicalize_dim(len(shape), dim, op)
    return ltorch.sum(ltorch.mul(x, y), d)


# -- chains of products ----------------------------------------------------------------------------


def _chain_order(shapes):
    """The cheapest parenthesization of a chain of matrices (eager's dynamic programme): ``split[i][j]``
    is where the product of matrices i..j splits."""
    n = len(shapes)
    dims = [shapes[0][0], *(s[1] for s in shapes)]
    cost = [[0] * n for _ in range(n)]
    split = [[0] * n for _ in range(n)]
    for length in range(1, n):
        for i in range(n - length):
            j = i + length
            cost[i][j] = None
            for k in range(i, j):
                c = cost[i][k] + cost[k + 1][j] + dims[i] * dims[k + 1] * dims[j + 1]
                if cost[i][j] is None or c < cost[i][j]:
                    cost[i][j], split[i][j] = c, k
    return split


def _chain(mats, split, i, j):
    if i == j:
        return mats[i]
    k = split[i][j]
    return ltorch.mm(_chain(mats, split, i, k), _chain(mats, split, k + 1, j))  # (eager's mm: its gradients' layouts)


@torchsymbol(LA.multi_dot)
def linalg_multi_dot(tensors, *, out=None):
    """Matrix products in the order eager chooses: the cheapest for three or more; a 1-D first
    (last) operand is a row (column) vector, dropped from the result."""
    op = "ltorch.linalg_multi_dot"
    check(
        isinstance(tensors, (list, tuple)) and len(tensors) >= 2,
        op,
        "expected at least 2 tensors (argument tensors)",
        ThunderRuntimeError,
    )
    for i, t in enumerate(tensors):
        _check_tensor(op, t, f"tensors[{i}]")
        rank = "1D or 2D" if i in (0, len(tensors) - 1) else "2D"
        check(
            t.ndim == 2 or (t.ndim == 1 and i in (0, len(tensors) - 1)),
            op,
            f"tensor {i} must be {rank} but got {t.ndim}D (argument tensors)",
            ThunderRuntimeError,
        )
    same_dtype(op, tensors, "all tensors must have the same dtype")
    check(
        tensors[0].dtype != torch.bool, op, "not implemented for 'Bool' (argument tensors)", ThunderNotImplementedError
    )
    first, last = tensors[0], tensors[-1]
    mats = list(tensors)
    if first.ndim == 1:
        mats[0] = prims.reshape(first, (1, first.shape[0]))
    if last.ndim == 1:
        mats[-1] = prims.reshape(last, (last.shape[0], 1))
    for i in range(len(mats) - 1):
        check(
            mats[i].shape[1] == mats[i + 1].shape[0],
            op,
            f"tensors[{i}] and tensors[{i + 1}] cannot be multiplied ({mats[i].shape[0]}x{mats[i].shape[1]} and "
            f"{mats[i + 1].shape[0]}x{mats[i + 1].shape[1]})",
            ThunderRuntimeError,
        )
    if len(mats) == 3:  # eager compares the two orders directly: A(BC) where it is cheaper, else (AB)C
        a, b, c = (m.shape for m in mats)
        split = [[0, 0, 0 if a[0] * a[1] * b[1] + a[0] * b[1] * c[1] > a[1] * b[1] * c[1] + a[0] * a[1] * c[1] else 1]]
        split += [[0, 0, 1], [0, 0, 0]]
    else:
        split = _chain_order([m.shape for m in mats])
    result = _chain(mats, split, 0, len(mats) - 1)
    shape = (*(result.shape[:1] if first.ndim == 2 else ()), *(result.shape[1:] if last.ndim == 2 else ()))
    return prims.reshape(result, shape) if not same_shape(shape, result.shape) else result


@torchsymbol(LA.matrix_power, torch.matrix_power, T.matrix_power)
def linalg_matrix_power(A, n, *, out=None):
    """Repeated squaring, multiplying the squares as eager does; ``n < 0`` inverts first."""
    op = "ltorch.linalg_matrix_power"
    _check_tensor(op, A, "A")
    check(
        isinstance(n, int) and not isinstance(n, bool),
        op,
        f"expected an int for n, got {type(n).__name__} (argument n)",
        ThunderTypeError,
    )
    check(
        A.ndim >= 2 and A.shape[-1] == A.shape[-2],
        op,
        f"A must be batches of square matrices, but they are {A.shape[-2] if A.ndim >= 2 else '?'} by "
        f"{A.shape[-1] if A.ndim else '?'} matrices",
        ThunderRuntimeError,
    )
    if n == 0:
        return with_zero_gradient(ltorch.expand(identity(A.shape[-1], A.dtype, A.device), A.shape), A)
    check(A.dtype != torch.bool or n == 1, op, "not implemented for 'Bool' (argument A)", ThunderNotImplementedError)
    if n < 0:
        # Under autocast eager inverts in float32 and multiplies in lower precision, which a
        # call run whole with its inputs cast (as autocast.py does for n > 1) cannot give.
        check(
            not torch._C._is_any_autocast_enabled(),
            op,
            "negative powers are not supported under autocast (argument n)",
            ThunderNotImplementedError,
        )
        A, n = ltorch.linalg_inv(A), -n
    if n == 1:
        return ltorch.clone(A)
    # (ltorch's products, whose gradients are laid out as eager's: column-major for a
    # column-major matrix, as mm_mat1_backward gives)
    if n == 2:
        return ltorch.matmul(A, A)
    if n == 3:
        return ltorch.matmul(ltorch.matmul(A, A), A)
    z = result = None
    while n > 0:
        z = A if z is None else ltorch.matmul(z, z)
        if n & 1:
            result = z if result is None else ltorch.matmul(result, z)
        n >>= 1
    return result


@register_grad(linalg_matrix_power)
def linalg_matrix_power_grad(A, n, *, out=None):
    """``n == 0``: eager's gradient is new contiguous zeros (``linalg_matrix_power_backward``),
    where the identity's zero gradient (``with_zero_gradient``) was a broadcast with strides of 0.
    Other powers differentiate the products."""
    result = linalg_matrix_power(A, n, out=out)
    if n == 0 and A.dtype.is_floating_point:
        get_grad(result)
        put_grad(A, ltorch.zeros(tuple(A.shape), dtype=A.dtype, device=A.device))
    return result


@torchsymbol(LA.vander)
def linalg_vander(x, *, N=None):
    """Columns ``x**0, x**1, ..., x**(N-1)``, each the previous times ``x`` (eager's cumprod)."""
    op = "ltorch.linalg_vander"
    _check_tensor(op, x, "x")
    check(
        x.dtype != torch.bool,
        op,
        f"linalg.vander supports floating point, complex, and integer tensors, but got {x.dtype}",
        ThunderNotImplementedError,
    )
    if x.ndim == 0:  # one point
        x = ltorch.reshape(x, (1,))
    n = x.shape[-1] if N is None else N
    check(n > 1, op, f"N must be greater than 1, got {n} (argument N)", ThunderRuntimeError)
    return _powers(x, n, None)


def _powers(x, n, dtype):
    """``x`` (..., m) as (..., m, n): ``x**0`` then the cumulative products of ``n - 1`` copies of
    ``x`` (in ``dtype``; integers in int64 by default), as eager computes them; a symbolic ``n``
    stays symbolic."""
    column = ltorch.unsqueeze(x, -1)
    powers = ltorch.cumprod(ltorch.expand(column, (*x.shape, n - 1)), -1, dtype=dtype)
    return ltorch.cat([ltorch.ones_like(column, dtype=powers.dtype), powers], -1)


@torchsymbol(torch.vander)
def vander(x, N=None, increasing=False):
    """``torch.vander``: the columns ``x**(n-1), ..., x**0`` (``increasing``: the other way)."""
    op = "ltorch.vander"
    _check_tensor(op, x, "x")
    check(x.ndim == 1, op, "x must be a one-dimensional tensor. (argument x)", ThunderRuntimeError)
    n = x.shape[0] if N is None else N
    check(n >= 0, op, "N must be non-negative. (argument N)", ThunderRuntimeError)
    dtype = torch.promote_types(x.dtype, torch.int64)
    if n <= 1:
        return ltorch.full((x.shape[0], n), 1, dtype=dtype, device=x.device)
    out = _powers(x, n, dtype)
    return out if increasing else ltorch.flip(out, (1,))


def _vander_as_eager(x, N=None, increasing=False):
    """``torch.vander``: eager's own where ``x`` is differentiated, whose backward fails in eager
    (its cumprod writes into the result autograd saved), so that it fails here as there."""
    if isinstance(x, torch.Tensor) and x.requires_grad and torch.is_grad_enabled():
        return fallback(torch.vander, (x, N, increasing), {})
    return vander(x, N, increasing)


TORCH_TO_LTORCH[torch.vander] = _vander_as_eager
