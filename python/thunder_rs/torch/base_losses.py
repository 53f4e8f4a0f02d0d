"""The base losses (``torch.nn.functional``): ``nll_loss``, ``cross_entropy`` and ``mse_loss``,
with the reduction and target checks that the other losses (``losses.py``) share, and nll_loss's
fused kernels (``nll_loss_forward``, ``nll_loss_backward``), which eager's autograd runs and its
grad rule calls.

Half-precision inputs are computed in float32 and converted back, as eager kernels do.
"""

import math
import sys
import types

import torch
import torch.nn.functional as F

from thunder_rs import clang, prims
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.core.lang.recorder import lift_captured
from thunder_rs.errors import (
    ThunderRuntimeError,
    check,
)
from thunder_rs.core.lang.eager_layouts import eager_strides
from thunder_rs.torch.common import flows, like, require_float, sum_all, sum_to
from thunder_rs.torch.strides import contiguous_strides
from thunder_rs.torch.nn import log_softmax
from thunder_rs.torch.symbols import ltorch, torchsymbol
from thunder_rs.core.lang.symint import identical, same_shape

T = torch.Tensor


__all__ = ["nll_loss", "cross_entropy", "mse_loss", "nll_loss_forward", "nll_loss_backward", "kept_weight_total"]


#: aten's reduction codes, as nll_loss_forward takes them.
REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


# -- losses ----------------------------------------------------------------------------------------


def _reduction(op: str, reduction: str, size_average, reduce) -> str:
    """The reduction, from the deprecated size_average/reduce flags when either is given."""
    if size_average is not None or reduce is not None:
        size_average = True if size_average is None else size_average
        reduce = True if reduce is None else reduce
        reduction = "none" if not reduce else ("mean" if size_average else "sum")
    check(
        reduction in ("none", "mean", "sum"), op, f"{reduction} is not a valid value for reduction (argument reduction)"
    )
    return reduction


def _reduce(op: str, loss, reduction: str, divisor=None):
    """``loss`` reduced: summed, or summed and divided by ``divisor`` (default: its element count,
    eager's ``loss.mean()``, whose gradient is a new tensor where sum-then-divide's is a broadcast)."""
    if reduction == "none":
        return loss
    if reduction == "mean" and divisor is None and loss.dtype.is_floating_point:
        return ltorch.mean(loss)
    total = sum_all(loss)
    if reduction == "sum":
        return total
    if divisor is None:
        divisor = loss.numel()  # an int, symbolic where the size is: float() would specialise it
    return clang.elementwise(prims.div, op, total, divisor)


def _check_class_weight(op: str, weight, classes: int) -> None:
    if weight is None:
        return
    check(
        weight.ndim == 1 and weight.shape[0] == classes,
        op,
        lambda: (
            f"weight tensor should be defined either for all {classes} classes or no classes but got weight "
            f"tensor of shape: {list(weight.shape)} (argument weight)"
        ),
        ThunderRuntimeError,
    )


def _check_targets(op: str, input, target) -> None:
    """Class-index targets: an integer tensor shaped like ``input`` without its class dim."""
    check(input.ndim >= 1, op, f"Expected 1 or more dimensions (got {input.ndim}) (argument input)")
    batch = target.shape[0] if target.ndim else 0
    check(
        input.ndim == 1 or input.shape[0] == batch,
        op,
        f"Expected input batch_size ({input.shape[0]}) to match target batch_size ({batch}) (argument target)",
    )
    check(
        target.dtype in (torch.int64, torch.uint8),
        op,
        f"expected target dtype to be Long or Byte, but got {target.dtype} (argument target)",
        ThunderRuntimeError,
    )
    expected = tuple(input.shape[:1]) + tuple(input.shape[2:]) if input.ndim > 1 else ()
    check(
        same_shape(target.shape, expected),
        op,
        f"Expected target size {list(expected)}, got {list(target.shape)} (argument target)",
        ThunderRuntimeError,
    )


def _target_weights(target, weight, ignore_index: int, dtype):
    """Each target's class weight (1 without weights) and 0 where it is ignored; the ignored
    mask; and the targets as int64 indices with ignored ones replaced by 0 (they may be out of range)."""
    target = clang.maybe_convert(target, torch.int64)
    ignored = prims.eq(target, ignore_index)
    safe = prims.where(ignored, 0, target)
    if weight is None:
        weights = prims.where(ignored, 0.0, prims.full(tuple(target.shape), 1.0, target.device, dtype))
    else:
        flat = prims.reshape(safe, (target.numel(),))
        weights = prims.where(ignored, 0.0, prims.reshape(prims.take(weight, flat, 0), target.shape))
    return weights, ignored, safe


def _picked_log_probs(log_probs, target, weight, ignore_index: int):
    """-log_probs at each target class times its weight (zero where ignored), and those weights."""
    class_dim = 0 if log_probs.ndim == 1 else 1
    weights, _, safe = _target_weights(target, weight, ignore_index, log_probs.dtype)
    index_shape = (*target.shape[:class_dim], 1, *target.shape[class_dim:])
    picked = prims.reshape(prims.take_along_axis(log_probs, prims.reshape(safe, index_shape), class_dim), target.shape)
    return prims.mul(prims.neg(picked), weights), weights


def _check_nll(op: str, log_probs, target, weight) -> None:
    require_float(op, log_probs)
    _check_targets(op, log_probs, target)
    _check_class_weight(op, weight, log_probs.shape[0 if log_probs.ndim == 1 else 1])
    check(
        weight is None or weight.dtype == log_probs.dtype,
        op,
        lambda: f"expected weight to have dtype {log_probs.dtype}, but got {weight.dtype} (argument weight)",
        ThunderRuntimeError,
    )


def refuse_grad(op: str, function: str, argument: str, tensor) -> None:
    """Eager's error for a tensor that requires grad given for an argument its kernel ``function``
    has no derivative for (``derivatives.yaml``: ``non_differentiable``, ``not_implemented``):
    with grad on, its forward raises (a loss's class or element weights, ``soft_margin_loss``'s
    target), where differentiating the decomposition would make up a gradient eager refuses."""
    check(
        not (getattr(tensor, "requires_grad", False) and torch.is_grad_enabled()),
        op,
        lambda: (
            f"the function '{function}' is not differentiable with respect to argument '{argument}'. This input "
            f"cannot have requires_grad True; detach the {argument} (argument {argument})"
        ),
        ThunderRuntimeError,
    )


def dropped_argument(fn, name: str):
    """The argument ``name`` of the innermost running call of the Python function ``fn``, which
    handed ``__torch_function__`` its call without it (torch's ``F.l1_loss`` passes ``weight`` among
    the tensors it dispatches on but not among the arguments), lifted into the trace."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code is not fn.__code__:
        frame = frame.f_back
    value = None if frame is None else frame.f_locals.get(name)
    return lift_captured((value,), {})[0][0]


def _refuse_weight_grad(op: str, weight, input) -> None:
    """Eager's nll_loss has no derivative for its class weights (``nll_loss2d``'s, of images and
    of the other inputs of more than 2 dims, which it reshapes to images)."""
    refuse_grad(op, "nll_loss2d_forward" if input.ndim > 2 else "nll_loss_forward", "weight", weight)


def _eager_nll_loss(input, target, weight=None, *args, **kwargs):
    """``F.nll_loss`` as the program calls it (thunder_rs's own calls of ``ltorch.nll_loss``, in
    kernels' decompositions, may differentiate the weight)."""
    _refuse_weight_grad("ltorch.nll_loss", weight, input)
    return nll_loss(input, target, weight, *args, **kwargs)


def _nll(op: str, log_probs, target, weight, ignore_index: int, reduction: str):
    _check_nll(op, log_probs, target, weight)
    losses, weights = _picked_log_probs(log_probs, target, weight, ignore_index)
    return _reduce(op, losses, reduction, sum_all(weights) if reduction == "mean" else None)


@torchsymbol(F.nll_loss)
def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    op = "ltorch.nll_loss"
    reduction = _reduction(op, reduction, size_average, reduce)
    return _nll(op, input, target, weight, ignore_index, reduction)


TORCH_TO_LTORCH[F.nll_loss] = _eager_nll_loss


def _class_weight(weight, ndim: int, class_dim: int):
    """``weight`` shaped to broadcast along ``class_dim`` of an ``ndim``-dim tensor."""
    return prims.reshape(weight, tuple(weight.shape[0] if d == class_dim else 1 for d in range(ndim)))


def _cross_entropy_probs(op, log_probs, target, weight, reduction, label_smoothing):
    """Cross entropy against class probabilities ``target`` (the same shape as the input)."""
    class_dim = 0 if log_probs.ndim == 1 else 1
    classes = log_probs.shape[class_dim]
    _check_class_weight(op, weight, classes)
    if label_smoothing > 0:
        target = clang.elementwise(
            prims.add, op, clang.elementwise(prims.mul, op, target, 1 - label_smoothing), label_smoothing / classes
        )
    terms = clang.elementwise(prims.mul, op, log_probs, target)
    if weight is not None:
        terms = clang.elementwise(prims.mul, op, terms, _class_weight(weight, log_probs.ndim, class_dim))
    if reduction == "none":
        return prims.neg(prims.sum(terms, (class_dim,)))
    total = prims.neg(sum_all(terms))
    if reduction == "sum":
        return total
    # The mean is over the batch elements, not the classes; an empty batch gives NaN as in eager.
    # (An int, symbolic where the batch is: float() would specialise it.)
    return clang.elementwise(prims.div, op, total, log_probs.numel() // classes if classes else 0.0)


def _smoothing_term(op, log_probs, target, weight, ignore_index: int, reduction: str):
    """The label-smoothing part of cross entropy with class-index targets (before its factor)."""
    class_dim = 0 if log_probs.ndim == 1 else 1
    weights, ignored, _ = _target_weights(target, weight, ignore_index, log_probs.dtype)
    if weight is not None:
        log_probs = prims.mul(
            log_probs, clang.expand_to(_class_weight(weight, log_probs.ndim, class_dim), log_probs.shape)
        )
    smooth = prims.where(ignored, 0.0, prims.neg(prims.sum(log_probs, (class_dim,))))
    if reduction != "mean":
        return _reduce(op, smooth, reduction)
    total = sum_all(weights) if weight is None else kept_weight_total(target, weight, ignore_index)
    return _reduce(op, smooth, reduction, total)


def _kept_weight_total_meta(target, weight, ignore_index: int):
    return [((), weight.dtype, False)]


@torchsymbol(name="kept_weight_total", meta=_kept_weight_total_meta)
def kept_weight_total(target, weight, ignore_index: int):
    """The sum of the class weights of the targets that are not ignored, which a label-smoothed
    mean divides by. Eager sums them compacted (``weight.gather(0, target.masked_select(~ignored))
    .sum()``); summed with zeros in place of the ignored ones they round otherwise (a float32
    loss 1 ulp off), so the torch executor runs eager's expression (``torch_ex``)."""
    return sum_all(_target_weights(target, weight, ignore_index, weight.dtype)[0])


@torchsymbol(F.cross_entropy)
def cross_entropy(
    input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean", label_smoothing=0.0
):
    op = "ltorch.cross_entropy"
    reduction = _reduction(op, reduction, size_average, reduce)
    check(
        0.0 <= label_smoothing <= 1.0,
        op,
        f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing} (argument label_smoothing)",
        ThunderRuntimeError,
    )
    probabilities = same_shape(input.shape, target.shape)
    check(
        not probabilities or target.dtype.is_floating_point,
        op,
        f"Expected floating point type for target with class probabilities, got {target.dtype} (argument target)",
        ThunderRuntimeError,
    )
    check(
        not probabilities or ignore_index == -100,
        op,
        "ignore_index is not supported for floating point target (argument ignore_index)",
        ThunderRuntimeError,
    )
    require_float(op, input)
    class_dim = 0 if input.ndim <= 1 else 1
    log_probs = log_softmax(input, class_dim)
    if probabilities:
        return _cross_entropy_probs(op, log_probs, target, weight, reduction, label_smoothing)
    # nll_loss as a symbol of its own, so that its grad rule (and kernel) differentiates it.
    _check_nll(op, log_probs, target, weight)
    _refuse_weight_grad(op, weight, input)
    loss = nll_loss(log_probs, target, weight, ignore_index=ignore_index, reduction=reduction)
    if label_smoothing == 0:
        return loss
    smooth = _smoothing_term(op, log_probs, target, weight, ignore_index, reduction)
    classes = input.shape[class_dim]
    return prims.add(prims.mul(loss, 1 - label_smoothing), prims.mul(smooth, label_smoothing / classes))


@torchsymbol(F.mse_loss)
def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    op = "ltorch.mse_loss"
    reduction = _reduction(op, reduction, size_average, reduce)
    clang.broadcast_shapes(op, input.shape, target.shape)
    diff = clang.elementwise(prims.sub, op, input, target)
    if weight is None:
        require_float(op, diff)
        return _reduce(op, prims.mul(diff, diff), reduction)
    check(same_shape(weight.shape, input.shape), op, "Weights and input must have the same size. (argument weight)")
    weighted = clang.elementwise(prims.mul, op, prims.mul(diff, diff), weight)
    return _reduce(op, weighted, reduction, sum_all(weight) if reduction == "mean" else None)


# -- kernels ---------------------------------------------------------------------------------------


def _nll_loss_forward_meta(input, target, weight, reduction: int, ignore_index: int):
    out = tuple(target.shape) if reduction == REDUCTIONS["none"] else ()
    weighted = weight is not None and weight.requires_grad and reduction != REDUCTIONS["none"]
    return [(out, input.dtype), ((), input.dtype, weighted)]


@torchsymbol(name="nll_loss_forward", meta=_nll_loss_forward_meta)
def nll_loss_forward(input, target, weight, reduction: int, ignore_index: int):
    """nll_loss of a 1-D or 2-D input, and the total weight of the targets it counted (zero for
    reduction none), which a mean divides by."""
    name = next(k for k, v in REDUCTIONS.items() if v == reduction)
    out = ltorch.nll_loss(input, target, weight, ignore_index=ignore_index, reduction=name)
    if reduction == REDUCTIONS["none"]:
        return out, ltorch.zeros((), dtype=input.dtype, device=input.device)
    return out, ltorch.sum(_target_weights(target, weight, ignore_index, input.dtype)[0])


def _nll_loss_backward_meta(grad_output, input, target, weight, reduction: int, ignore_index: int, total_weight):
    mean = reduction == REDUCTIONS["mean"]
    return [(*like(input), flows(grad_output, weight, total_weight if mean else None))]


@torchsymbol(name="nll_loss_backward", meta=_nll_loss_backward_meta)
def nll_loss_backward(grad_output, input, target, weight, reduction: int, ignore_index: int, total_weight):
    """The gradient of nll_loss's 1-D or 2-D input: minus each picked element's weight times
    the cotangent (over the total weight for a mean), zero elsewhere."""
    picked, ignored, safe = _target_weights(target, weight, ignore_index, input.dtype)
    scale = grad_output / total_weight if reduction == REDUCTIONS["mean"] else grad_output
    # where rather than a product: when every target is ignored, a mean's 0 / 0 stays out.
    values = ltorch.where(ignored, 0.0, -(picked * scale))
    class_dim = 0 if input.ndim == 1 else 1
    zeros = ltorch.zeros(input.shape, dtype=input.dtype, device=input.device)
    return ltorch.scatter_add(zeros, class_dim, ltorch.unsqueeze(safe, class_dim), ltorch.unsqueeze(values, class_dim))


# -- grad rules ------------------------------------------------------------------------------------


def _as_rows(input, target):
    """An (N, C, d1, ...) input as (N * d1 * ..., C) rows and its targets as (N * d1 * ...),
    as nll_loss's kernel takes them; 1-D and 2-D inputs as they are."""
    if input.ndim <= 2:
        return input, target
    count = math.prod(target.shape)
    rows = ltorch.reshape(ltorch.movedim(input, 1, -1), (count, input.shape[1]))
    return rows, ltorch.reshape(target, (count,))


@register_grad(ltorch.nll_loss)
def nll_loss_grad(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    if weight is not None and weight.requires_grad:
        return ltorch.nll_loss(input, target, weight, size_average, ignore_index, reduce, reduction)
    code = REDUCTIONS[_reduction("ltorch.nll_loss", reduction, size_average, reduce)]
    _check_nll("ltorch.nll_loss", input, target, weight)
    rows, flat_target = _as_rows(input, target)
    out, total_weight = nll_loss_forward(rows, flat_target, weight, code, ignore_index)
    if code == REDUCTIONS["none"] and input.ndim > 2:
        out = ltorch.reshape(out, target.shape)
    g = get_grad(out)
    if code == REDUCTIONS["none"] and input.ndim > 2:
        g = ltorch.reshape(g, flat_target.shape)
    grad = nll_loss_backward(g, rows, flat_target, weight, code, ignore_index, total_weight)
    if input.ndim > 2:
        moved = (input.shape[0], *input.shape[2:], input.shape[1])
        grad = ltorch.movedim(ltorch.reshape(grad, moved), -1, 1)
    put_grad(input, grad)
    return out


def kernel_layout(grad):
    """``grad`` as a new contiguous tensor where the trace lays it out otherwise: eager's loss
    kernels write their gradients into ``zeros_like(input, LEGACY_CONTIGUOUS_MEMORY_FORMAT)``,
    whatever the layout of their operands."""
    strides = eager_strides(grad)
    if strides is None or all(identical(a, b) for a, b in zip(strides, contiguous_strides(grad.shape))):
        return grad
    return ltorch.clone(grad, memory_format=torch.contiguous_format)


def kernel_norm(scale: float, count, g):
    """(the factor eager's loss kernels multiply by, the cotangent): ``scale / count``, a double the
    kernel rounds to the dtype first in its products (``norm.to<scalar_t>()``: ``2 / 18`` in
    bfloat16 too), so that the gradient rounds as eager's; a
    symbolic count, as data, divides the cotangent instead (rounding otherwise, keeping the
    variant)."""
    if type(count) is not int:
        return scale, g / count
    return torch.tensor(scale / count, dtype=g.dtype).item(), g


@register_grad(ltorch.mse_loss)
def mse_loss_grad(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    """Eager's ``mse_loss_backward``: ``2 / n * (input - target) * g`` (``2`` unreduced or summed),
    contiguous, and its negation for ``target``."""
    out = ltorch.mse_loss(input, target, size_average, reduce, reduction, weight)
    if weight is not None or input.dtype != target.dtype or input.dtype.is_complex:
        return out  # the decomposition's VJP
    g = get_grad(out)
    # (torch's operators: the trace takes their layouts, which ``kernel_layout`` reads)
    difference = input - target
    mean = _reduction("ltorch.mse_loss", reduction, size_average, reduce) == "mean"
    norm, g = kernel_norm(2.0, difference.numel() if mean else 1, g)
    grad = kernel_layout(difference * norm * g)
    if input.requires_grad:
        put_grad(input, sum_to(grad, input.shape))
    if target.requires_grad:
        put_grad(target, sum_to(-grad, target.shape))
    return out
