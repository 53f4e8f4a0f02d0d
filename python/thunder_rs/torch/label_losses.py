"""Multi-label margin loss (``F.multilabel_margin_loss``) as eager's CPU kernel computes it, with
its backward kernel beside it; and ``F.linear_cross_entropy``'s reference path.

Each row's targets are the class indices before its first ``-1``; for each of them ``j`` and each
class ``d`` that is no target, ``z = (1 - x[j]) + x[d]`` (rounded in the input's dtype at each op)
counts where it is positive. The kernel sums the ``z`` in its accumulation type (double for float)
and returns each row's sum rounded to the dtype; the rows' sums add in the accumulation type again,
divided by the class count (and the row count for a mean) there and rounded once at the end (a
row's loss of reduction none is divided in the dtype). The sums here are in
double too: the float ``z`` add exactly there, so their order does not matter. Targets below
``-1`` or past the classes raise as eager's range check does, from the gather that reads them.

``F.linear_cross_entropy`` without ``options`` is eager's reference path: ``linear`` of the weight
(and bias) flattened to ``(C * d1 * ..., in_features)``, the logits reshaped to ``(N, C, d1, ...)``
and ``cross_entropy``, each op ltorch's (bit-equal to eager's, with their own gradients). With
``options`` eager may take its chunked custom op, whose chunked sums no decomposition follows: such
a call stays eager's (an eager fallback).
"""

import math

import torch
import torch.nn.functional as F

from thunder_rs import clang, prims
from thunder_rs.core.lang.fallback import fallback
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, check
from thunder_rs.torch.base_losses import REDUCTIONS, _reduction
from thunder_rs.torch.common import flows, like
from thunder_rs.torch.symbols import ltorch, torchsymbol

__all__ = ["multilabel_margin_loss", "multilabel_margin_loss_backward", "linear_cross_entropy"]


def _frames(op: str, input, target):
    """(rows, classes) as eager's shape check reads them, with its errors."""
    ndim = input.ndim
    check(
        (ndim == 2 and input.shape[1] != 0) or (ndim == 1 and input.shape[0] != 0) or ndim == 0,
        op,
        lambda: (
            "Expected non-empty vector or matrix with optional 0-dim batch size, but got: "
            f"{list(input.shape)} (argument input)"
        ),
        ThunderRuntimeError,
    )
    if ndim <= 1:
        frames, classes = 1, (1 if ndim == 0 else input.shape[0])
        ok = target.ndim <= 1 and target.numel() == classes
    else:
        frames, classes = input.shape
        ok = target.ndim == 2 and target.shape[0] == frames and target.shape[1] == classes
    check(ok, op, lambda: f"inconsistent size {list(target.shape)} for argument #2 'target'", ThunderRuntimeError)
    return frames, classes


#: The input dtypes eager's kernels take, by device: the CPU's (``multilabel_margin_loss_forward_out_frame``)
#: has no half-precision one, CUDA's (``multilabel_margin_loss_forward_kernel``) has.
_KERNEL_DTYPES = {
    "cpu": ("multilabel_margin_loss_forward_out_frame", (torch.float32, torch.float64)),
    "cuda": ("multilabel_margin_loss_forward_kernel", (torch.float32, torch.float64, torch.float16, torch.bfloat16)),
}


def _check_dtypes(op: str, input, target) -> None:
    kernel, dtypes = _KERNEL_DTYPES.get(input.device.type, _KERNEL_DTYPES["cpu"])
    check(
        input.dtype in dtypes,
        op,
        lambda: f'"{kernel}" not implemented for {input.dtype} (argument input)',
        ThunderNotImplementedError,
    )
    check(
        target.dtype == torch.int64,
        op,
        lambda: f"expected scalar type Long but found {target.dtype} (argument target)",
        ThunderRuntimeError,
    )


def _margins(input, target, frames, classes):
    """The kernel's terms as a (rows, targets, classes) tensor (zero where they do not count) and
    the rows' 0/1 target masks (its ``is_target``, in the input's dtype)."""
    x = ltorch.reshape(input, (frames, classes))
    t = ltorch.reshape(target, (frames, classes))
    # A target counts before the row's first negative one.
    valid = ltorch.eq(ltorch.cumsum(ltorch.lt(t, 0), 1), 0)
    # -1 reads class 0 (left out below); other out-of-range targets make the gather raise.
    picked = ltorch.gather(x, 1, ltorch.where(ltorch.eq(t, -1), 0, t))
    spare = ltorch.where(valid, ltorch.where(ltorch.eq(t, -1), 0, t), classes)  # (a column past the classes)
    marks = ltorch.zeros((frames, classes + 1), dtype=input.dtype, device=input.device)
    is_target = ltorch.narrow(ltorch.scatter(marks, 1, spare, 1.0), 1, 0, classes)
    z = ltorch.unsqueeze(1 - picked, 2) + ltorch.unsqueeze(x, 1)
    counted = ltorch.logical_and(ltorch.unsqueeze(valid, 2), ltorch.unsqueeze(ltorch.eq(is_target, 0), 1))
    return ltorch.where(ltorch.logical_and(counted, z > 0), z, 0.0), is_target


def _accumulation(dtype):
    return torch.float64 if dtype in (torch.float32, torch.float64) else torch.float32


@torchsymbol(F.multilabel_margin_loss)
def multilabel_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    op = "ltorch.multilabel_margin_loss"
    reduction = _reduction(op, reduction, size_average, reduce)
    frames, classes = _frames(op, input, target)
    _check_dtypes(op, input, target)
    terms, _ = _margins(input, target, frames, classes)
    wide = _accumulation(input.dtype)
    # Each row's sum is accumulated wide and returned in the input's dtype.
    rows = clang.maybe_convert(ltorch.sum(clang.maybe_convert(terms, wide), (1, 2)), input.dtype)
    if reduction == "none" and target.ndim > 1:
        return clang.elementwise(prims.div, op, rows, classes)
    total = clang.elementwise(prims.div, op, ltorch.sum(clang.maybe_convert(rows, wide)), classes)
    if reduction == "mean":
        total = clang.elementwise(prims.div, op, total, frames)
    return clang.maybe_convert(total, input.dtype)


def _multilabel_margin_loss_backward_meta(grad_output, input, target, reduction: int, is_target):
    return [(*like(input), flows(grad_output))]


@torchsymbol(name="multilabel_margin_loss_backward", meta=_multilabel_margin_loss_backward_meta)
def multilabel_margin_loss_backward(grad_output, input, target, reduction: int, is_target):
    """Eager's kernel: ``g`` (``1 / classes``, over the rows too for a mean, rounded to the dtype)
    added at a class for each target whose term counts, taken from the target for each class it
    counts at, times the cotangent (a row's own for reduction none); contiguous. (The kernel adds
    ``g`` one count at a time, which a product of the count rounds as only where the count is
    small: the torch executor runs the kernel itself.)"""
    frames, classes = _frames("ltorch.multilabel_margin_loss_backward", input, target)
    terms, _ = _margins(input, target, frames, classes)
    counts = ltorch.gt(terms, 0)
    at_class = ltorch.sum(counts, 1, dtype=input.dtype)  # (rows, classes)
    per_target = ltorch.sum(counts, 2, dtype=input.dtype)  # (rows, targets)
    t = ltorch.reshape(target, (frames, classes))
    index = ltorch.where(ltorch.lt(t, 0), 0, t)
    taken = ltorch.scatter_add(ltorch.zeros_like(at_class), 1, index, per_target)
    mean = reduction == REDUCTIONS["mean"]
    g = torch.tensor(1.0 / (frames * classes if mean else classes), dtype=input.dtype).item()
    grad = (at_class - taken) * g
    if reduction != REDUCTIONS["none"] or grad_output.ndim == 0:
        grad = grad * grad_output
    else:
        grad = grad * ltorch.reshape(grad_output, (frames, 1))
    return ltorch.reshape(grad, input.shape)


@register_grad(ltorch.multilabel_margin_loss)
def multilabel_margin_loss_grad(input, target, size_average=None, reduce=None, reduction="mean"):
    """Eager's ``multilabel_margin_loss_backward`` kernel, given the rows' target masks."""
    out = ltorch.multilabel_margin_loss(input, target, size_average, reduce, reduction)
    if not input.requires_grad or input.numel() == 0:
        return out
    frames, classes = _frames("ltorch.multilabel_margin_loss", input, target)
    _, is_target = _margins(input, target, frames, classes)
    code = REDUCTIONS[_reduction("ltorch.multilabel_margin_loss", reduction, size_average, reduce)]
    mask = ltorch.reshape(is_target, tuple(target.shape))
    put_grad(input, multilabel_margin_loss_backward(get_grad(out), input, target, code, mask))
    return out


# -- linear_cross_entropy ----------------------------------------------------------------------------


def _check_linear_cross_entropy(op: str, input, linear_weight, target, linear_bias, ignore_index):
    """Eager's checks (``F.linear_cross_entropy``), with its messages; the logits' shape."""
    check(
        1 <= input.ndim <= 2,
        op,
        lambda: f"expected input with dimensionality 1 or 2, got {input.ndim} (argument input)",
        ThunderRuntimeError,
    )
    check(
        linear_weight.ndim >= 2,
        op,
        lambda: f"expected linear_weight with dimensionality at least 2, got {linear_weight.ndim}",
        ThunderRuntimeError,
    )
    batches, features = tuple(input.shape[:-1]), input.shape[-1]
    check(
        features == linear_weight.shape[-1],
        op,
        lambda: (
            "expected equal input and linear_weight last dimensions (in_features), "
            f"got {features} and {linear_weight.shape[-1]}, respectively"
        ),
        ThunderRuntimeError,
    )
    classes, out_features = linear_weight.shape[0], tuple(linear_weight.shape[1:-1])
    check(
        linear_bias is None or tuple(linear_bias.shape) == (classes, *out_features),
        op,
        lambda: f"expected linear_bias shape {(classes, *out_features)}, got {tuple(linear_bias.shape)}",
        ThunderRuntimeError,
    )
    check(
        not out_features or bool(batches),
        op,
        lambda: (
            f"K-dimensional loss defined by linear_weight shape {tuple(linear_weight.shape)} requires batched "
            f"input, (N, {features}), got unbatched input with shape {tuple(input.shape)}"
        ),
        ThunderRuntimeError,
    )
    logits_shape = (*batches, classes, *out_features)
    check(
        not (tuple(target.shape) == logits_shape and ignore_index is not None),
        op,
        "ignore_index cannot be specified when target contains probabilities",
        ThunderRuntimeError,
    )
    return logits_shape, features


@torchsymbol(F.linear_cross_entropy, name="linear_cross_entropy")
def linear_cross_entropy(
    input,
    linear_weight,
    target,
    *,
    linear_bias=None,
    weight=None,
    reduction="mean",
    ignore_index=None,
    label_smoothing=0.0,
    options=None,
):
    op = "ltorch.linear_cross_entropy"
    check(options is None, op, "chunked options run as eager's call (argument options)", ThunderNotImplementedError)
    logits_shape, features = _check_linear_cross_entropy(op, input, linear_weight, target, linear_bias, ignore_index)
    if linear_weight.ndim > 2:
        rows = math.prod(logits_shape[input.ndim - 1 :])
        linear_weight = ltorch.reshape(linear_weight, (rows, features))
        if linear_bias is not None:
            linear_bias = ltorch.reshape(linear_bias, (rows,))
    logits = ltorch.reshape(ltorch.linear(input, linear_weight, linear_bias), logits_shape)
    return ltorch.cross_entropy(
        logits,
        target,
        weight=weight,
        reduction=reduction,
        ignore_index=-100 if ignore_index is None else ignore_index,
        label_smoothing=label_smoothing,
    )


def _linear_cross_entropy_call(input, linear_weight, target, *, options=None, **kwargs):
    """The symbol for eager's reference path; with ``options``, eager's own call."""
    if options is not None:
        return fallback(F.linear_cross_entropy, (input, linear_weight, target), {"options": options, **kwargs})
    return linear_cross_entropy(input, linear_weight, target, **kwargs)


TORCH_TO_LTORCH[F.linear_cross_entropy] = _linear_cross_entropy_call
