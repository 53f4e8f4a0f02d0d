"""Margin and embedding losses (``torch.nn.functional``): margin ranking, hinge embedding, soft
margin and multi-label soft margin, cosine embedding, multi-class margin (with eager's backward
kernel) and triplet margin losses, and the grad rules that compute eager's backward formulas.

Each follows eager's formula (its clamps, epsilons and masks) and eager's argument checks; the
reductions and checks are ``base_losses.py``'s, as for the other losses (``losses.py``).
"""

import math

import torch
import torch.nn.functional as F

from thunder_rs import clang, prims
from thunder_rs.core.base import dtypes
from thunder_rs.torch.symbols import ltorch
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.core.lang.symint import SymInt
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.errors import (
    ThunderRuntimeError,
    ThunderTypeError,
    ThunderValueError,
    check,
)
from thunder_rs.torch.symbols import torchsymbol
from thunder_rs.torch.losses import _in_place
from thunder_rs.torch.elementwise import clamp_min, where
from thunder_rs.torch.base_losses import (
    REDUCTIONS,
    _reduce,
    _reduction,
    kernel_norm,
    refuse_grad,
)
from thunder_rs.torch.activations import logsigmoid
from thunder_rs.torch.common import flows, like
from thunder_rs.torch.distances import _difference, pairwise_distance, triplet_loss_with

__all__ = [
    "margin_ranking_loss",
    "hinge_embedding_loss",
    "soft_margin_loss",
    "multilabel_soft_margin_loss",
    "cosine_embedding_loss",
    "multi_margin_loss",
    "multi_margin_loss_backward",
    "triplet_margin_loss",
    "triplet_margin_with_distance_loss",
]


# -- margin losses ---------------------------------------------------------------------------------


@torchsymbol(F.margin_ranking_loss)
def margin_ranking_loss(input1, input2, target, margin=0, size_average=None, reduce=None, reduction="mean"):
    op = "ltorch.margin_ranking_loss"
    reduction = _reduction(op, reduction, size_average, reduce)
    check(
        input1.ndim == input2.ndim == target.ndim,
        op,
        lambda: (
            "margin_ranking_loss : All input tensors should have same dimension but got sizes: input1: "
            f"{list(input1.shape)}, input2: {list(input2.shape)}, target: {list(target.shape)} (argument target)"
        ),
        ThunderRuntimeError,
    )
    gap = clang.elementwise(prims.mul, op, clang.elementwise(prims.neg, op, target), _difference(op, input1, input2))
    return _reduce(op, clamp_min(clang.elementwise(prims.add, op, gap, margin), 0), reduction)


@torchsymbol(F.hinge_embedding_loss)
def hinge_embedding_loss(input, target, margin=1.0, size_average=None, reduce=None, reduction="mean"):
    op = "ltorch.hinge_embedding_loss"
    reduction = _reduction(op, reduction, size_average, reduce)
    margin_clamp = clamp_min(clang.elementwise(prims.sub, op, margin, input), 0)
    zero = clang.maybe_convert(0, margin_clamp.dtype)
    output_margin = where(clang.elementwise(prims.ne, op, target, 1, kind=clang.ALWAYS_BOOL), margin_clamp, zero)
    output_self = where(clang.elementwise(prims.ne, op, target, -1, kind=clang.ALWAYS_BOOL), input, zero)
    return _reduce(op, clang.elementwise(prims.add, op, output_margin, output_self), reduction)


@torchsymbol(F.soft_margin_loss)
def soft_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    op = "ltorch.soft_margin_loss"
    reduction = _reduction(op, reduction, size_average, reduce)
    refuse_grad(op, "soft_margin_loss", "target", target)
    # ATen: ``neg_out(output, input).mul_(target).exp_().log1p_()``, all in the input's dtype.
    product = _in_place(op, prims.mul, clang.elementwise(prims.neg, op, input), target)
    return _reduce(op, prims.log1p(prims.exp(product)), reduction)


@torchsymbol(F.multilabel_soft_margin_loss)
def multilabel_soft_margin_loss(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    op = "ltorch.multilabel_soft_margin_loss"
    reduction = _reduction(op, reduction, size_average, reduce)
    positive = clang.elementwise(prims.mul, op, target, logsigmoid(input))
    negative = clang.elementwise(
        prims.mul, op, clang.elementwise(prims.sub, op, 1, target), logsigmoid(clang.elementwise(prims.neg, op, input))
    )
    loss = clang.elementwise(prims.neg, op, clang.elementwise(prims.add, op, positive, negative))
    if weight is not None:
        loss = clang.elementwise(prims.mul, op, loss, weight)
    class_dim = input.ndim - 1
    loss = clang.elementwise(prims.div, op, prims.sum(loss, (class_dim,)), input.shape[class_dim])
    return _reduce(op, loss, reduction)


@torchsymbol(F.cosine_embedding_loss)
def cosine_embedding_loss(input1, input2, target, margin=0, size_average=None, reduce=None, reduction="mean"):
    op = "ltorch.cosine_embedding_loss"
    reduction = _reduction(op, reduction, size_average, reduce)
    check(
        target.ndim in (0, 1),
        op,
        "0D or 1D target tensor expected, multi-target not supported (argument target)",
        ThunderRuntimeError,
    )
    expected = target.ndim + 1
    check(
        input1.ndim == expected and input2.ndim == expected,
        op,
        lambda: (
            f"{target.ndim}D target tensor expects {expected}D input tensors, but found inputs with sizes "
            f"{list(input1.shape)} and {list(input2.shape)}. (argument input1)"
        ),
        ThunderRuntimeError,
    )
    dim = (target.ndim,)

    def total(a, b):
        product = clang.elementwise(prims.mul, op, a, b)
        if not dtypes.is_inexact(product.dtype):  # (eager's ``sum`` of integers and bool: int64)
            product = clang.maybe_convert(product, torch.int64)
        return prims.sum(product, dim)

    # Eager's epsilon keeps a zero vector's cosine finite (and makes integer sums floating).
    # (Inputs of two dtypes promote, as eager's products do.) The product's sum comes first, as in
    # eager's kernel: the backward then adds each input's three terms in eager's order.
    prod_sum = total(input1, input2)
    squares = clang.elementwise(
        prims.mul,
        op,
        clang.elementwise(prims.add, op, total(input1, input1), 1e-12),
        clang.elementwise(prims.add, op, total(input2, input2), 1e-12),
    )
    cos = clang.elementwise(prims.div, op, prod_sum, prims.sqrt(squares))
    zero = clang.maybe_convert(0, cos.dtype)
    pos = where(
        clang.elementwise(prims.eq, op, target, 1, kind=clang.ALWAYS_BOOL),
        clang.elementwise(prims.sub, op, 1, cos),
        zero,
    )
    neg = where(
        clang.elementwise(prims.eq, op, target, -1, kind=clang.ALWAYS_BOOL),
        clamp_min(clang.elementwise(prims.sub, op, cos, margin), 0),
        zero,
    )
    return _reduce(op, clang.elementwise(prims.add, op, pos, neg), reduction)


@torchsymbol(F.multi_margin_loss)
def multi_margin_loss(input, target, p=1, margin=1.0, weight=None, size_average=None, reduce=None, reduction="mean"):
    op = "ltorch.multi_margin_loss"
    reduction = _reduction(op, reduction, size_average, reduce)
    refuse_grad(op, "multi_margin_loss", "weight", weight)
    check(p in (1, 2), op, "only p == 1 and p == 2 supported (argument p)", ThunderValueError)
    check(
        input.ndim <= 2 and (input.ndim == 0 or input.shape[-1] > 0),
        op,
        lambda: (
            f"Expected non-empty vector or matrix with optional 0-dim batch size, but got: {list(input.shape)} "
            "(argument input)"
        ),
        ThunderRuntimeError,
    )
    x = input if input.ndim == 2 else prims.reshape(input, (1, input.numel()))
    batch, classes = x.shape
    check(
        target.numel() == batch and target.ndim <= 1,
        op,
        lambda: f"inconsistent target size, expected {batch} but got {list(target.shape)} (argument target)",
        ThunderRuntimeError,
    )
    index = prims.reshape(clang.maybe_convert(target, torch.int64), (batch, 1))
    picked = prims.take_along_axis(x, index, 1)
    z = clang.elementwise(prims.add, op, prims.sub(x, clang.expand_to(picked, x.shape)), margin)
    hinge = prims.where(prims.gt(z, 0.0), z, clang.maybe_convert(0.0, z.dtype))
    if p == 2:
        hinge = prims.mul(hinge, hinge)
    if weight is not None:
        w = prims.reshape(prims.take(weight, prims.reshape(index, (batch,)), 0), (batch, 1))
        hinge = clang.elementwise(prims.mul, op, hinge, clang.expand_to(w, hinge.shape))
    # The target's own class does not count.
    classes_iota = prims.iota(classes, 0, 1, x.device, torch.int64)
    own = prims.eq(clang.expand_to(index, x.shape), clang.expand_to(classes_iota, x.shape))
    hinge = prims.where(own, clang.maybe_convert(0.0, hinge.dtype), hinge)
    # A symbolic count divides as the size it is (``float`` would specialise it).
    loss = prims.div(prims.sum(hinge, (1,)), classes if type(classes) is SymInt else float(classes))
    if input.ndim < 2:
        loss = prims.reshape(loss, tuple(target.shape) if reduction == "none" else (batch,))
    return _reduce(op, loss, reduction)


def _multi_margin_loss_backward_meta(grad_output, input, target, p: int, margin: float, weight, reduction: int):
    return [(*like(input), flows(grad_output, weight, input if p == 2 else None))]


@torchsymbol(name="multi_margin_loss_backward", meta=_multi_margin_loss_backward_meta)
def multi_margin_loss_backward(grad_output, input, target, p: int, margin: float, weight, reduction: int):
    """Eager's kernel: in each row, ``h`` (``1 / n`` rounded, or ``2 / n * z`` for p=2, times the
    target's weight) at each other class whose ``z = margin - x[target] + x`` is positive, minus
    their sum at the target's class, times the cotangent (a row's own unreduced); contiguous."""
    x = ltorch.reshape(input, (1, input.numel())) if input.ndim < 2 else input
    batch, classes = x.shape
    index = ltorch.reshape(ltorch.to(target, torch.int64), (batch, 1))
    z = (margin - ltorch.take_along_dim(x, index, 1)) + x
    n = batch * classes if reduction == REDUCTIONS["mean"] else classes
    h = ltorch.full_like(z, 1.0 / n) if p == 1 else z * (2.0 / n)
    if weight is not None:
        h = h * ltorch.reshape(ltorch.index_select(weight, 0, ltorch.reshape(index, (batch,))), (batch, 1))
    own = ltorch.eq(index, ltorch.arange(classes, device=input.device))
    h = ltorch.where(ltorch.logical_and(z > 0, ltorch.logical_not(own)), h, 0.0)
    grad = ltorch.where(own, -ltorch.sum(h, 1, keepdim=True), h)
    if reduction != REDUCTIONS["none"] or grad_output.ndim == 0:
        grad = grad * grad_output
    else:
        grad = grad * ltorch.reshape(grad_output, (batch, 1))
    return ltorch.reshape(grad, input.shape)


@register_grad(ltorch.multi_margin_loss)
def multi_margin_loss_grad(
    input, target, p=1, margin=1.0, weight=None, size_average=None, reduce=None, reduction="mean"
):
    """Eager's ``multi_margin_loss_backward`` kernel (its order of sums, its contiguous layout).
    (A weight that requires grad is refused, as eager refuses it.)"""
    out = ltorch.multi_margin_loss(input, target, p, margin, weight, size_average, reduce, reduction)
    weighted = weight is not None and weight.dtype != input.dtype
    if weighted or not input.requires_grad or not input.dtype.is_floating_point or input.numel() == 0:
        return out
    code = REDUCTIONS[_reduction("ltorch.multi_margin_loss", reduction, size_average, reduce)]
    put_grad(input, multi_margin_loss_backward(get_grad(out), input, target, p, margin, weight, code))
    return out


@torchsymbol(F.triplet_margin_loss)
def triplet_margin_loss(
    anchor, positive, negative, margin=1.0, p=2, eps=1e-06, swap=False, size_average=None, reduce=None, reduction="mean"
):
    op = "ltorch.triplet_margin_loss"
    reduction = _reduction(op, reduction, size_average, reduce)
    check(
        anchor.ndim == positive.ndim == negative.ndim,
        op,
        lambda: (
            "The anchor, positive, and negative tensors are expected to have the same number of dimensions, but got: "
            f"anchor {anchor.ndim}D, positive {positive.ndim}D, and negative {negative.ndim}D inputs (argument anchor)"
        ),
        ThunderRuntimeError,
    )
    dist_pos = pairwise_distance(anchor, positive, p, eps)
    dist_neg = pairwise_distance(anchor, negative, p, eps)
    if swap:
        dist_neg = clang.elementwise(prims.minimum, op, dist_neg, pairwise_distance(positive, negative, p, eps))
    gap = clang.elementwise(prims.sub, op, clang.elementwise(prims.add, op, dist_pos, margin), dist_neg)
    return _reduce(op, clamp_min(gap, 0), reduction)


@torchsymbol(F.triplet_margin_with_distance_loss)
def triplet_margin_with_distance_loss(
    anchor, positive, negative, *, distance_function=None, margin=1.0, swap=False, reduction="mean"
):
    op = "ltorch.triplet_margin_with_distance_loss"
    check(
        distance_function is None,
        op,
        "a distance_function runs as an eager call (argument distance_function)",
        ThunderTypeError,
    )
    check(
        reduction in ("mean", "sum", "none"), op, f"{reduction} is not a valid value for reduction (argument reduction)"
    )
    check(margin > 0, op, f"margin must be greater than 0, got {margin} (argument margin)")
    # With the default distance (torch.pairwise_distance), it is triplet_margin_loss with p=2, eps=1e-6.
    return triplet_margin_loss(anchor, positive, negative, margin, 2, 1e-06, swap, reduction=reduction)


def _triplet_with_distance_call(anchor, positive, negative, *, distance_function=None, **kwargs):
    """The symbol with the default distance; with the program's own, its calls traced in place."""
    if distance_function is not None:
        return triplet_loss_with(distance_function, anchor, positive, negative, **kwargs)
    return triplet_margin_with_distance_loss(anchor, positive, negative, **kwargs)


TORCH_TO_LTORCH[F.triplet_margin_with_distance_loss] = _triplet_with_distance_call


# -- grad rules ------------------------------------------------------------------------------------


@register_grad(ltorch.soft_margin_loss)
def soft_margin_loss_grad(input, target, size_average=None, reduce=None, reduction="mean"):
    """Eager's ``soft_margin_loss_backward``: ``z = exp(-target * input)``, then ``target * z``
    times ``-norm`` (``1 / numel`` for ``mean``), divided by ``z + 1``, times the cotangent, each
    op rounding to the input's dtype."""
    out = ltorch.soft_margin_loss(input, target, size_average, reduce, reduction)
    if not input.requires_grad or input.dtype != target.dtype:
        return out  # the decomposition's VJP
    g = get_grad(out)
    count = input.numel() if _reduction("ltorch.soft_margin_loss", reduction, size_average, reduce) == "mean" else 1
    # (``mul_(-norm)`` rounds the double to the dtype first: ``-1 / 25`` in bfloat16 too)
    norm, g = kernel_norm(-1.0, count, g) if count != 0 else (-math.inf, g)
    z = ltorch.exp(-target * input)
    grad = target * z * norm
    put_grad(input, grad / (z + 1) * g)
    return out
