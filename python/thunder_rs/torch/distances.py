"""Distances and normalisation (``torch.nn.functional``): p-norm distances between pairs of
rows (``pairwise_distance``, ``pdist``, ``cdist``), cosine similarity and ``normalize``, and the
p-norm and broadcast difference the losses share with them.

Each follows eager's formula: ``cdist``'s matmul form for p = 2 on many rows, otherwise aten's
``_cdist_forward`` and ``_cdist_backward`` kernels (declared here with decompositions, for
executors that fuse prims), norms clamped by ``eps`` as eager clamps them.
"""

import math

import torch
import torch.nn.functional as F

from thunder_rs import clang, prims
from thunder_rs.torch.symbols import ltorch
from thunder_rs.errors import ThunderRuntimeError, ThunderTypeError, check
from thunder_rs.torch.autograd import with_zero_gradient
from thunder_rs.torch.symbols import torchsymbol
from thunder_rs.torch.elementwise import clamp_min
from thunder_rs.torch.common import flows, kept, require_float, sum_to
from thunder_rs.torch.norms import norm_backward
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.torch.base_losses import kernel_layout
from thunder_rs.core.lang.symfloat import SymFloat

__all__ = [
    "pairwise_distance",
    "pdist",
    "pdist_backward",
    "cosine_similarity",
    "normalize",
    "cdist",
    "cdist_forward",
    "cdist_backward",
]


# -- helpers ---------------------------------------------------------------------------------------


def _pair(op: str, input, target):
    """``input`` and ``target`` broadcast together, as eager's ``torch.broadcast_tensors``."""
    shape = clang.broadcast_shapes(op, input.shape, target.shape)
    return clang.expand_to(input, shape), clang.expand_to(target, shape)


def _difference(op: str, input, target):
    x, y = _pair(op, input, target)
    return clang.elementwise(prims.sub, op, x, y)


def _vector_norm(x, p, dims: tuple[int, ...], keepdim: bool):
    """The ``p``-norm of ``x`` over ``dims``. For p = 2 a zero norm has gradient 0, as eager's."""
    absolute = prims.abs(x)
    if p == math.inf or p == -math.inf:
        out = (prims.amax if p > 0 else prims.amin)(absolute, dims)
    elif p == 0:
        out = with_zero_gradient(prims.sum(clang.maybe_convert(prims.ne(x, 0.0), x.dtype), dims), x)
    elif p == 1:
        out = prims.sum(absolute, dims)
    elif p == 2:
        total = prims.sum(prims.mul(x, x), dims)
        zero = prims.eq(total, 0.0)
        out = prims.where(zero, 0.0, prims.sqrt(prims.where(zero, 1.0, total)))
    else:
        total = prims.sum(prims.pow(absolute, p if type(p) is SymFloat else float(p)), dims)
        zero = prims.eq(total, 0.0)
        out = prims.where(zero, 0.0, prims.pow(prims.where(zero, 1.0, total), 1.0 / p))
    if keepdim:
        out = prims.broadcast_in_dim(
            out,
            tuple(1 if d in dims else s for d, s in enumerate(x.shape)),
            tuple(d for d in range(x.ndim) if d not in dims),
        )
    return out


# -- distances -------------------------------------------------------------------------------------


@torchsymbol(torch.pairwise_distance, F.pairwise_distance)
def pairwise_distance(x1, x2, p=2.0, eps=1e-06, keepdim=False):
    op = "ltorch.pairwise_distance"
    ndim = max(x1.ndim, x2.ndim)
    diff = clang.elementwise(prims.add, op, _difference(op, x1, x2), eps)
    if ndim == 0:
        return _vector_norm(diff, p, (), keepdim)
    # eager's at::norm: the vector norm's kernel, whose gradient (norm_backward) is eager's
    return ltorch.linalg_vector_norm(diff, p, (ndim - 1,), keepdim)


@torchsymbol(F.pdist, torch.pdist)
def pdist(input, p=2):
    """The ``p``-norm distances of every pair of rows ``i < j``, in row-major order of the pairs."""
    op = "ltorch.pdist"
    check(
        input.ndim == 2, op, f"pdist only supports 2D tensors, got: {input.ndim}D (argument input)", ThunderRuntimeError
    )
    check(p >= 0, op, "pdist only supports non-negative p values (argument p)", ThunderRuntimeError)
    check(
        input.dtype.is_floating_point,
        op,
        "pdist only supports floating-point dtypes (argument input)",
        ThunderRuntimeError,
    )
    n = input.shape[0]
    if n < 2:
        return with_zero_gradient(prims.full((0,), 0.0, input.device, input.dtype), input)
    pairs = ltorch.triu_indices(n, n, 1, device=input.device)
    first, second = (
        prims.reshape(prims.slice(pairs, (k, 0), (k + 1, pairs.shape[1]), (1, 1)), (pairs.shape[1],)) for k in (0, 1)
    )
    diff = prims.sub(prims.take(input, first, 0), prims.take(input, second, 0))
    return _vector_norm(diff, p, (1,), False)


@register_grad(pairwise_distance)
def pairwise_distance_grad(x1, x2, p=2.0, eps=1e-06, keepdim=False):
    """Eager's derivative of ``norm(x1 - x2 + eps, p, -1, keepdim)``: ``norm_backward`` of the
    difference, which the subtraction hands to x1 and, negated, to x2 (each summed back over its
    broadcast dims). For p = 0 ``norm_backward`` gives no gradient, and the operands get none."""
    out = pairwise_distance(x1, x2, p, eps, keepdim)
    g = get_grad(out)
    if p == 0:
        return out
    diff = ltorch.add(ltorch.sub(x1, x2), eps)
    dims = (diff.ndim - 1,) if diff.ndim else ()
    norm = out
    if not keepdim and diff.ndim:
        g, norm = kept(g, diff.shape, dims), kept(norm, diff.shape, dims)
    grad = norm_backward(g, diff, float(p), norm, dims)
    if x1.requires_grad:
        put_grad(x1, sum_to(grad, x1.shape))
    if x2.requires_grad:
        put_grad(x2, sum_to(ltorch.neg(grad), x2.shape))
    return out


def _pdist_backward_meta(grad, input, p, pdist):
    # (as cdist's: zeros for p = 0 or fewer than two rows, distances read in a comparison at most
    # for p = 1 and infinity)
    zeros = p == 0 or input.shape[0] < 2
    reads = () if zeros else (grad, input) if p in (1, math.inf) else (grad, input, pdist)
    return [(tuple(input.shape), input.dtype, flows(*reads))]


@torchsymbol(name="pdist_backward", meta=_pdist_backward_meta)
def pdist_backward(grad, input, p, pdist):
    """aten's ``_pdist_backward``: the gradient of the rows ``input`` from the distances ``pdist``
    of its pairs ``i < j`` and their cotangent ``grad``; each pair's term goes to row i and,
    negated, to row j (zeros for p = 0 or fewer than two rows)."""
    n = input.shape[0]
    zeros = ltorch.zeros(tuple(input.shape), dtype=input.dtype, device=input.device)
    if n < 2 or p == 0:
        return zeros
    pairs = ltorch.triu_indices(n, n, 1, device=input.device)
    first, second = pairs[0], pairs[1]
    diff = ltorch.sub(ltorch.index_select(input, 0, first), ltorch.index_select(input, 0, second))
    terms = _pair_terms(diff, ltorch.unsqueeze(grad, -1), ltorch.unsqueeze(pdist, -1), p)
    return ltorch.index_add(ltorch.index_add(zeros, 0, first, terms), 0, second, ltorch.neg(terms))


@register_grad(pdist)
def pdist_grad(input, p=2):
    """Eager's derivative of ``_pdist_forward``: ``_pdist_backward`` of the input."""
    out = pdist(input, p)
    put_grad(input, pdist_backward(get_grad(out), input, p, out))
    return out


@torchsymbol(torch.cosine_similarity, F.cosine_similarity)
def cosine_similarity(x1, x2, dim=1, eps=1e-08):
    op = "ltorch.cosine_similarity"
    compute, _ = clang.promote(op, (x1, x2))
    check(
        compute.is_floating_point,
        op,
        f"expected common dtype to be floating point, yet common dtype is {compute} (argument x1)",
        ThunderRuntimeError,
    )
    a, b = _pair(op, clang.maybe_convert(x1, compute), clang.maybe_convert(x2, compute))
    dims = (clang.canonicalize_dim(a.ndim, dim, op),) if a.ndim else ()
    # Eager normalises each operand by its norm clamped to eps, the clamp invisible to autograd; the
    # norm by its kernel (``linalg_vector_norm``), whose gradient ``x * (g / norm)`` is eager's.
    unit = []
    for x in (a, b):
        norm = ltorch.linalg_vector_norm(x, 2, dims, True).clone()
        with torch.no_grad():
            norm.clamp_(min=eps)
        unit.append(prims.div(x, clang.expand_to(norm, x.shape)))
    return prims.sum(prims.mul(*unit), dims)


@torchsymbol(F.normalize)
def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    """Eager's ``input / input.norm(p, dim, keepdim=True).clamp_min(eps).expand_as(input)``: the
    norm by its kernel (``linalg_vector_norm``), whose rounding and gradient are eager's."""
    op = "ltorch.normalize"
    check(out is None, op, "out= is handled before the symbol (argument out)", ThunderTypeError)
    dims = (clang.canonicalize_dim(input.ndim, dim, op),) if input.ndim else ()
    require_float(op, input)
    denom = clamp_min(ltorch.linalg_vector_norm(input, p, dims, True), eps)
    return ltorch.true_divide(input, ltorch.expand(denom, input.shape))


_CDIST_MODES = {
    "use_mm_for_euclid_dist_if_necessary": 0,
    "use_mm_for_euclid_dist": 1,
    "donot_use_mm_for_euclid_dist": 2,
}


def _euclidean_dist(x1, x2):
    """Eager's matmul form of p=2 distances: |a|^2 - 2 a.b + |b|^2, clamped at 0 before the root."""

    def padded(x, first):
        squares = prims.sum(prims.mul(x, x), (x.ndim - 1,))
        squares = prims.broadcast_in_dim(squares, (*x.shape[:-1], 1), tuple(range(x.ndim - 1)))
        ones = prims.full(tuple(squares.shape), 1.0, x.device, x.dtype)
        return prims.cat([prims.mul(x, -2.0), squares, ones] if first else [x, ones, squares], x.ndim - 1)

    left, right = padded(x1, True), padded(x2, False)
    perm = (*range(right.ndim - 2), right.ndim - 1, right.ndim - 2)
    product = prims.matmul(left, prims.transpose(right, perm))
    # Eager's backward gives 0 where the distance is 0, where sqrt's gradient is infinite.
    zero = prims.le(product, clang.maybe_convert(0.0, product.dtype))
    root = prims.sqrt(prims.where(zero, clang.maybe_convert(1.0, product.dtype), product))
    return prims.where(zero, clang.maybe_convert(0.0, product.dtype), root)


def _by_matmul(x1, x2, p, compute_mode) -> bool:
    """Whether eager computes p=2 distances in matmul form (``_euclidean_dist``)."""
    mode = _CDIST_MODES[compute_mode]
    return p == 2 and (mode == 1 or (mode == 0 and (x1.shape[-2] > 25 or x2.shape[-2] > 25)))


@torchsymbol(torch.cdist)
def cdist(x1, x2, p=2.0, compute_mode="use_mm_for_euclid_dist_if_necessary"):
    op = "ltorch.cdist"
    check(
        x1.ndim >= 2,
        op,
        f"cdist only supports at least 2D tensors, X1 got: {x1.ndim}D (argument x1)",
        ThunderRuntimeError,
    )
    check(
        x2.ndim >= 2,
        op,
        f"cdist only supports at least 2D tensors, X2 got: {x2.ndim}D (argument x2)",
        ThunderRuntimeError,
    )
    check(
        x1.shape[-1] == x2.shape[-1],
        op,
        f"X1 and X2 must have the same number of columns. X1: {x1.shape[-1]} X2: {x2.shape[-1]} (argument x2)",
        ThunderRuntimeError,
    )
    check(p >= 0, op, "cdist only supports non-negative p values (argument p)", ThunderRuntimeError)
    check(
        compute_mode in _CDIST_MODES,
        op,
        f"{compute_mode} is not a valid value for compute_mode (argument compute_mode)",
    )
    for x, arg in ((x1, "x1"), (x2, "x2")):
        require_float(op, x, arg)
    check(
        x1.dtype == x2.dtype,
        op,
        f"X1 and X2 must have the same dtype, but got {x1.dtype} and {x2.dtype} (argument x2)",
        ThunderRuntimeError,
    )
    if _by_matmul(x1, x2, p, compute_mode) and x1.numel() and x2.numel():
        batch = clang.broadcast_shapes(op, x1.shape[:-2], x2.shape[:-2])
        a, b = (clang.expand_to(x, (*batch, *x.shape[-2:])) for x in (x1, x2))
        return _euclidean_dist(a, b)
    return cdist_forward(x1, x2, p, _CDIST_MODES[compute_mode] or None)


# -- cdist's kernels -------------------------------------------------------------------------------


def _cdist_shape(x1, x2) -> tuple:
    """The batch dims of x1 and x2 broadcast together, then x1's rows and its columns."""
    return (*clang.broadcast_shapes("ltorch.cdist", x1.shape[:-2], x2.shape[:-2]), *x1.shape[-2:])


def _cdist_forward_meta(x1, x2, p, compute_mode):
    shape = _cdist_shape(x1, x2)
    return [((*shape[:-1], x2.shape[-2]), x1.dtype, flows(x1, x2))]


@torchsymbol(name="cdist_forward", meta=_cdist_forward_meta)
def cdist_forward(x1, x2, p, compute_mode):
    """aten's ``_cdist_forward``: the ``p``-norm of each difference of a row of x1 and a row of
    x2 (eager's cdist off the matmul path, and of empty operands)."""
    batch = _cdist_shape(x1, x2)[:-2]
    a = clang.expand_to(x1, (*batch, *x1.shape[-2:]))
    b = clang.expand_to(x2, (*batch, *x2.shape[-2:]))
    n = len(batch)
    shape = (*batch, a.shape[-2], b.shape[-2], a.shape[-1])
    left = prims.broadcast_in_dim(a, shape, (*range(n), n, n + 2))
    right = prims.broadcast_in_dim(b, shape, (*range(n), n + 1, n + 2))
    return _vector_norm(prims.sub(left, right), p, (n + 2,), keepdim=False)


def _cdist_backward_meta(grad, x1, x2, p, cdist):
    # (p = 0 gives zeros; p = 1 and infinity read the distances only in a comparison, if at all)
    reads = () if p == 0 else (grad, x1, x2) if p in (1, math.inf) else (grad, x1, x2, cdist)
    return [(_cdist_shape(x1, x2), x1.dtype, flows(*reads))]


@torchsymbol(name="cdist_backward", meta=_cdist_backward_meta)
def cdist_backward(grad, x1, x2, p, cdist):
    """aten's ``_cdist_backward``: x1's gradient (x1 expanded to the broadcast batch dims) from
    the distances ``cdist`` and their cotangent ``grad``; each pair of rows contributes its
    difference's term of the p-norm's derivative, 0 where the distance is 0."""
    shape = _cdist_shape(x1, x2)
    n = len(shape) - 2
    a = clang.expand_to(x1, shape)
    b = clang.expand_to(x2, (*shape[:-2], *x2.shape[-2:]))
    pairs = (*shape[:-1], b.shape[-2], shape[-1])
    diff = ltorch.sub(ltorch.unsqueeze(a, n + 1), ltorch.unsqueeze(b, n))
    g, dist = ltorch.unsqueeze(grad, -1), ltorch.unsqueeze(cdist, -1)
    if p == 0:
        return ltorch.zeros(shape, dtype=x1.dtype, device=x1.device)
    return ltorch.sum(ltorch.expand(_pair_terms(diff, g, dist, p), pairs), n + 1)


def _pair_terms(diff, g, dist, p):
    """The derivative of the p-norm ``dist`` of each difference ``diff`` of a pair of rows, times
    its cotangent ``g`` (p > 0; 0 where the distance is 0), as aten's distance kernels."""
    sign = ltorch.sign(diff)
    if p == 1:
        return sign * g
    if p == math.inf:
        return sign * g * (ltorch.abs(diff) == dist)
    if p == 2:
        return ltorch.where(dist == 0, 0.0, g * diff / dist)
    if p < 2:
        vanishing = (dist == 0) | ((diff == 0) & (p < 1))
        return ltorch.where(vanishing, 0.0, sign * ltorch.pow(ltorch.abs(diff), p - 1) * g / ltorch.pow(dist, p - 1))
    return ltorch.where(dist == 0, 0.0, diff * ltorch.pow(ltorch.abs(diff), p - 2) * g / ltorch.pow(dist, p - 1))


@register_grad(cdist)
def cdist_grad(x1, x2, p=2.0, compute_mode="use_mm_for_euclid_dist_if_necessary"):
    """The matmul form: eager's ``_euclidean_dist_backward`` of the operands (of several batches:
    expanded to one batch dim and made contiguous, as ``cdist_impl``), then summed back over the
    broadcast batch dims."""
    out = cdist(x1, x2, p, compute_mode)
    if x1.numel() == 0 or x2.numel() == 0:
        # eager's _cdist_backward of an empty operand: zeros_like each operand, in its layout
        get_grad(out)
        for x in (x1, x2):
            if x.requires_grad:
                put_grad(x, ltorch.zeros_like(x))
        return out
    if not _by_matmul(x1, x2, p, compute_mode):
        # eager's derivative of _cdist_forward: _cdist_backward of each operand, x2's from the
        # transposed distances, summed back over the broadcast batch dims
        g = get_grad(out)
        if x1.requires_grad:
            put_grad(x1, sum_to(cdist_backward(g, x1, x2, p, out), x1.shape))
        if x2.requires_grad:
            g_t, out_t = ltorch.transpose(g, -1, -2), ltorch.transpose(out, -1, -2)
            put_grad(x2, sum_to(cdist_backward(g_t, x2, x1, p, out_t), x2.shape))
        return out
    batch = tuple(out.shape[:-2])
    count = math.prod(batch)

    def as_3d(x):
        return ltorch.reshape(kernel_layout(ltorch.expand(x, (*batch, *x.shape[-2:]))), (count, *x.shape[-2:]))

    # (one batch: the operands as they are)
    raw = count == 1 and x1.ndim == x2.ndim == out.ndim
    a, b = (x1, x2) if raw else (as_3d(x1), as_3d(x2))
    result = out if raw else ltorch.reshape(out, (count, *out.shape[-2:]))
    ratio = ltorch.reshape(get_grad(out), result.shape) / result
    ratio = ltorch.where(result == 0, 0.0, ratio)
    grads = (
        a * ltorch.sum(ratio, -1, keepdim=True) - ltorch.matmul(ratio, b),
        b * ltorch.unsqueeze(ltorch.sum(ratio, -2), -1) - ltorch.matmul(ltorch.transpose(ratio, -1, -2), a),
    )
    for x, grad in zip((x1, x2), grads):
        if x.requires_grad:
            put_grad(x, sum_to(ltorch.reshape(grad, (*batch, *x.shape[-2:])), x.shape))
    return out


def triplet_loss_with(distance_function, anchor, positive, negative, margin=1.0, swap=False, reduction="mean"):
    """``F.triplet_margin_with_distance_loss`` with the program's own ``distance_function``, which
    is called on the traced tensors as eager calls it (``swap``: also on positive and negative),
    then eager's ops in its order: ``clamp_min(margin + d(a, p) - d(a, n), 0)``, reduced."""
    op = "ltorch.triplet_margin_with_distance_loss"
    reductions = ("mean", "sum", "none")
    check(reduction in reductions, op, f"{reduction} is not a valid value for reduction (argument reduction)")
    check(margin > 0, op, f"margin must be greater than 0, got {margin} (argument margin)")
    check(
        anchor.ndim == positive.ndim == negative.ndim,
        op,
        lambda: (
            "The anchor, positive, and negative tensors are expected to have the same number of dimensions, but got: "
            f"anchor {anchor.ndim}D, positive {positive.ndim}D, and negative {negative.ndim}D inputs (argument anchor)"
        ),
        ThunderRuntimeError,
    )
    dist_pos = distance_function(anchor, positive)
    dist_neg = distance_function(anchor, negative)
    if swap:
        dist_neg = ltorch.minimum(dist_neg, distance_function(positive, negative))
    loss = clamp_min(ltorch.sub(ltorch.add(dist_pos, margin), dist_neg), 0)
    return ltorch.sum(loss) if reduction == "sum" else ltorch.mean(loss) if reduction == "mean" else loss
