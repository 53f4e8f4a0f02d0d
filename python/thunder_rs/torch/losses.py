"""Losses (``torch.nn.functional``): regression, binary and KL losses, Poisson and Gaussian
likelihoods, CTC (an opaque symbol); and the grad rules of the binary cross entropies and
regression losses (eager's backward kernels). Margin and embedding losses are
``margin_losses.py``'s, distances ``distances.py``'s.

Each follows eager's kernel formula (its clamps, epsilons and masks) and eager's argument checks.
Value checks eager makes on data (``binary_cross_entropy``'s inputs in [0, 1],
``gaussian_nll_loss``'s ``var >= 0``) would read a traced tensor's values: they are not made.
"""

import math

import torch
import torch.nn.functional as F

from thunder_rs import clang, prims
from thunder_rs.torch.symbols import ltorch
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.errors import (
    ThunderNotImplementedError,
    ThunderRuntimeError,
    ThunderTypeError,
    ThunderValueError,
    check,
)
from thunder_rs.torch.symbols import torchsymbol
from thunder_rs.torch.elementwise import where
from thunder_rs.torch.base_losses import (
    _reduce,
    _reduction,
    kernel_layout,
    dropped_argument,
    kernel_norm,
    refuse_grad,
)
from thunder_rs.torch.activations import logsigmoid
from thunder_rs.torch.common import LOW_PRECISION, require_float, sum_all, sum_to, to_compute_dtype
from thunder_rs.torch.factorizations import opaque
from thunder_rs.torch.linalg_metas import meta as _meta
from thunder_rs.torch.special import xlogy
from thunder_rs.torch.distances import _difference
from thunder_rs.core.lang.symint import same_shape

__all__ = [
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "kl_div",
    "poisson_nll_loss",
    "gaussian_nll_loss",
]


# -- helpers ---------------------------------------------------------------------------------------


def _check_weight_size(op: str, weight, input) -> None:
    check(
        same_shape(weight.shape, input.shape),
        op,
        "Weights and input must have the same size. (argument weight)",
        ThunderValueError,
    )


def _weighted_reduce(op: str, loss, weight, reduction: str, mean_by_weight: bool):
    """``loss * weight`` reduced; ``mean_by_weight`` divides the mean by the weights' sum."""
    weighted = clang.elementwise(prims.mul, op, loss, weight)
    if reduction == "mean" and mean_by_weight:
        return clang.elementwise(prims.div, op, sum_all(weighted), sum_all(weight))
    return _reduce(op, weighted, reduction)


# -- regression losses -----------------------------------------------------------------------------


@torchsymbol(F.l1_loss)
def l1_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    op = "ltorch.l1_loss"
    reduction = _reduction(op, reduction, size_average, reduce)
    errors = prims.abs(_difference(op, input, target))
    check(
        reduction != "mean" or errors.dtype.is_floating_point,
        op,
        lambda: (
            f"mean(): could not infer output dtype. Input dtype must be either a floating point or complex dtype. Got: "
            f"{errors.dtype} (argument input)"
        ),
        ThunderNotImplementedError,
    )
    if weight is None:
        return _reduce(op, errors, reduction)
    _check_weight_size(op, weight, input)
    return _weighted_reduce(op, errors, weight, reduction, mean_by_weight=True)


def _l1_loss_call(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    """``F.l1_loss`` as the program calls it: its ``__torch_function__`` call leaves the weight out
    (torch 2.x), which its frame still holds; without it the loss was silently unweighted."""
    if weight is None:
        weight = dropped_argument(F.l1_loss, "weight")
    return l1_loss(input, target, size_average, reduce, reduction, weight)


TORCH_TO_LTORCH[F.l1_loss] = _l1_loss_call


@torchsymbol(F.smooth_l1_loss)
def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    op = "ltorch.smooth_l1_loss"
    reduction = _reduction(op, reduction, size_average, reduce)
    check(
        beta >= 0, op, "smooth_l1_loss does not support negative values for beta. (argument beta)", ThunderRuntimeError
    )
    z = prims.abs(_difference(op, input, target))
    if beta == 0:
        return _reduce(op, z, reduction)
    # Eager's kernels divide by beta (BinaryMiscOpsKernels.cu ``0.5 * z * z / beta_val``): a 0-d
    # tensor of it stays a division where a number divisor is CUDA's ``div`` kernel's, a product with
    # its reciprocal (nvfuser_numbers). (A float of sizes stays one.)
    number = type(beta) in (int, float) and beta != 1
    divisor = clang.expand_to(prims.full((), beta, z.device, z.dtype), z.shape) if number else beta
    quadratic = prims.div(prims.mul(prims.mul(z, z), 0.5), divisor)
    return _reduce(op, prims.where(prims.lt(z, beta), quadratic, prims.sub(z, 0.5 * beta)), reduction)


@torchsymbol(F.huber_loss)
def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    op = "ltorch.huber_loss"
    reduction = _reduction(op, reduction, None, None)
    check(
        delta > 0,
        op,
        "huber_loss does not support non-positive values for delta. (argument delta)",
        ThunderRuntimeError,
    )
    z = prims.abs(_difference(op, input, target))
    loss = prims.where(prims.lt(z, delta), prims.mul(prims.mul(z, z), 0.5), prims.mul(prims.sub(z, 0.5 * delta), delta))
    # ATen writes the elementwise loss into ``empty_like(input)``: computed in the common dtype,
    # rounded to the input's (a float64 target does not widen a float32 loss).
    loss = clang.maybe_convert(loss, input.dtype)
    if weight is None:
        return _reduce(op, loss, reduction)
    _check_weight_size(op, weight, input)
    return _weighted_reduce(op, loss, weight, reduction, mean_by_weight=False)


# -- binary and distribution losses ----------------------------------------------------------------


def _same_size(op: str, input, target, message: str) -> None:
    check(
        same_shape(target.shape, input.shape),
        op,
        lambda: message.format(list(target.shape), list(input.shape)),
        ThunderValueError,
    )


@torchsymbol(F.binary_cross_entropy)
def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    op = "ltorch.binary_cross_entropy"
    reduction = _reduction(op, reduction, size_average, reduce)
    refuse_grad(op, "binary_cross_entropy", "weight", weight)
    _same_size(
        op,
        input,
        target,
        "Using a target size ({}) that is different to the input size ({}) is deprecated. "
        "Please ensure they have the same size. (argument target)",
    )
    require_float(op, input)
    check(
        target.dtype == input.dtype,
        op,
        lambda: f"expected target to have dtype {input.dtype}, got {target.dtype} (argument target)",
        ThunderRuntimeError,
    )
    # Eager clamps each log at -100 so that a probability of exactly 0 or 1 gives a finite loss.
    log_p = prims.maximum(prims.log(input), -100.0)
    log_1mp = prims.maximum(prims.log1p(prims.neg(input)), -100.0)
    loss = prims.sub(prims.mul(prims.sub(target, 1.0), log_1mp), prims.mul(target, log_p))
    if weight is None:
        return _reduce(op, loss, reduction)
    clang.broadcast_shapes(op, target.shape, weight.shape)
    return _weighted_reduce(op, loss, weight, reduction, mean_by_weight=False)


@torchsymbol(F.binary_cross_entropy_with_logits)
def binary_cross_entropy_with_logits(
    input, target, weight=None, size_average=None, reduce=None, reduction="mean", pos_weight=None
):
    op = "ltorch.binary_cross_entropy_with_logits"
    reduction = _reduction(op, reduction, size_average, reduce)
    refuse_grad(op, "binary_cross_entropy_with_logits", "weight", weight)
    refuse_grad(op, "binary_cross_entropy_with_logits", "pos_weight", pos_weight)
    _same_size(op, input, target, "Target size ({}) must be the same as input size ({}) (argument target)")
    check(
        target.dtype.is_floating_point,
        op,
        lambda: f"result type Float can't be cast to the desired output type {target.dtype} (argument target)",
        ThunderRuntimeError,
    )
    # ATen computes with in-place ops, each rounding to the dtype of the tensor it writes:
    # ``(1 - target).mul_(input).sub_(log_sigmoid)``, then ``.mul_(weight)``: the loss has the
    # target's dtype (float32 for a float64 input and a float32 target), ``log_sigmoid`` the input's.
    log_sigmoid = logsigmoid(input)
    if pos_weight is not None:
        log_weight = clang.elementwise(
            prims.add, op, clang.elementwise(prims.mul, op, clang.elementwise(prims.sub, op, pos_weight, 1), target), 1
        )
        log_sigmoid = _in_place(op, prims.mul, log_sigmoid, log_weight)
    loss = _in_place(op, prims.mul, clang.elementwise(prims.sub, op, 1, target), input)
    loss = _in_place(op, prims.sub, loss, log_sigmoid)
    if weight is not None:
        loss = _in_place(op, prims.mul, loss, weight)
    return _reduce(op, loss, reduction)


def _in_place(op: str, prim, a, b):
    """``a.<prim>_(b)``: computed in the operands' common dtype, rounded to ``a``'s."""
    return clang.maybe_convert(clang.elementwise(prim, op, a, b), a.dtype)


@torchsymbol(F.kl_div)
def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    op = "ltorch.kl_div"
    batchmean = reduction == "batchmean" and size_average is None and reduce is None
    reduction = "sum" if batchmean else _reduction(op, reduction, size_average, reduce)
    if log_target:
        loss = clang.elementwise(prims.mul, op, prims.exp(target), _difference(op, target, input))
    else:
        loss = clang.elementwise(prims.sub, op, xlogy(target, target), clang.elementwise(prims.mul, op, target, input))
    out = _reduce(op, loss, reduction)
    if batchmean and input.ndim != 0:
        out = clang.elementwise(prims.div, op, out, input.shape[0])
    return out


@torchsymbol(F.poisson_nll_loss)
def poisson_nll_loss(
    input, target, log_input=True, full=False, size_average=None, eps=1e-08, reduce=None, reduction="mean"
):
    op = "ltorch.poisson_nll_loss"
    reduction = _reduction(op, reduction, size_average, reduce)

    # (Integer and bool operands promote as eager's ops do: ``exp``/``log`` to the default dtype.)
    def ew(prim, *operands, kind=clang.DEFAULT):
        return clang.elementwise(prim, op, *operands, kind=kind)

    if log_input:
        loss = ew(prims.sub, ew(prims.exp, input, kind=clang.INT_TO_FLOAT), ew(prims.mul, target, input))
    else:
        log = ew(prims.log, ew(prims.add, input, eps), kind=clang.INT_TO_FLOAT)
        loss = ew(prims.sub, input, ew(prims.mul, target, log))
    if full:
        # Stirling's approximation of log(target!), masked where target <= 1.
        t = target
        log_t = ew(prims.log, t, kind=clang.INT_TO_FLOAT)
        stirling = ew(
            prims.add,
            ew(prims.sub, ew(prims.mul, t, log_t), t),
            ew(prims.mul, ew(prims.log, ew(prims.mul, t, 2 * math.pi), kind=clang.INT_TO_FLOAT), 0.5),
        )
        masked = where(ew(prims.le, t, 1, kind=clang.ALWAYS_BOOL), 0.0, stirling)
        loss = ew(prims.add, loss, masked)
    return _reduce(op, loss, reduction)


def _gaussian_var(op: str, input, var):
    """``var`` shaped for the loss as eager's checks allow (one dim short, or one mismatched dim)."""
    if same_shape(var.shape, input.shape):
        return var
    if same_shape(input.shape[:-1], var.shape):
        return prims.broadcast_in_dim(var, (*var.shape, 1), tuple(range(var.ndim)))
    mismatched = input.ndim == var.ndim and sum(y for x, y in zip(input.shape, var.shape) if x != y) == 1
    check(mismatched, op, "var is of incorrect size (argument var)", ThunderValueError)
    return var


@torchsymbol(F.gaussian_nll_loss)
def gaussian_nll_loss(input, target, var, full=False, eps=1e-06, reduction="mean"):
    op = "ltorch.gaussian_nll_loss"
    if isinstance(var, float):
        check(var >= 0, op, "var has negative entry/entries (argument var)", ThunderValueError)
        var = prims.full(tuple(input.shape), var, input.device, input.dtype)
    check(
        isinstance(var, torch.Tensor),
        op,
        lambda: f"expected a tensor or a float for var, got {type(var).__name__} (argument var)",
        ThunderTypeError,
    )
    var = _gaussian_var(op, input, var)
    check(reduction in ("none", "mean", "sum"), op, f"{reduction} is not valid (argument reduction)", ThunderValueError)
    # Eager clamps a copy of var under no_grad: the clamped value, with var's gradient passing.
    var = var.clone()
    with torch.no_grad():
        var.clamp_(min=eps)
    diff = clang.elementwise(prims.sub, op, input, target)
    ratio = clang.elementwise(prims.div, op, prims.mul(diff, diff), var)
    loss = clang.elementwise(prims.mul, op, clang.elementwise(prims.add, op, prims.log(var), ratio), 0.5)
    if full:
        loss = prims.add(loss, 0.5 * math.log(2 * math.pi))
    return _reduce(op, loss, reduction)


# -- connectionist temporal classification ---------------------------------------------------------


def _ctc_loss_meta(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean", zero_infinity=False):
    """ctc_loss (torch has no meta kernel): the per-sequence losses with reduction='none', else
    one number; its dynamic program has no decomposition into prims, so it is run whole."""
    op = "ltorch.ctc_loss"
    check(
        log_probs.ndim in (2, 3),
        op,
        f"expected log_probs of rank 2 or 3, got {log_probs.ndim} (argument log_probs)",
        ThunderRuntimeError,
    )
    check(
        reduction in ("none", "mean", "sum"),
        op,
        f"{reduction} is not a valid value for reduction (argument reduction)",
        ThunderValueError,
    )
    shape = (log_probs.shape[1],) if reduction == "none" and log_probs.ndim == 3 else ()
    return _meta(shape, log_probs.dtype, log_probs.requires_grad)


# No decomposition: a dynamic program over the sequences, run whole as an opaque symbol.
ctc_loss = opaque("ctc_loss", F.ctc_loss, meta=_ctc_loss_meta, integers_rejected=False)
__all__.append("ctc_loss")


# -- grad rules: eager's backward kernels ---------------------------------------------------------


# Eager's backward divides by ``max(p * (1 - p), 1e-12)``, so a probability of exactly 0 or 1 (a
# saturated float32 sigmoid) still gets a gradient; the decomposition's logs are clamped at -100
# there and pass none.


_BCE_EPSILON = 1e-12


def _loss_cotangent(g, reduction: str, like):
    """The cotangent of a reduced loss, spread over the elements of ``like``."""
    if reduction == "mean":
        g = g / max(like.numel(), 1)
    return ltorch.expand(g, like.shape) if reduction != "none" else g


@register_grad(ltorch.binary_cross_entropy)
def binary_cross_entropy_grad(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    """Eager's ``binary_cross_entropy_backward`` kernel, ``g * (x - t) / max((1 - x) * x, eps)``,
    and ``binary_cross_entropy_target_backward``, ``-logit(x) * g``, each then times the weight
    and, for ``mean``, divided by the element count, the input's terms first: eager writes both
    in the input's layout."""
    out = ltorch.binary_cross_entropy(input, target, weight, size_average, reduce, reduction)
    reduction = _reduction("ltorch.binary_cross_entropy", reduction, size_average, reduce)
    g = get_grad(out)
    g = ltorch.expand(g, input.shape) if reduction != "none" else g
    count = input.numel() if reduction == "mean" else 1

    def finished(grad):
        grad = grad if weight is None else grad * weight
        return grad if type(count) is int and count == 1 else grad / count

    if input.requires_grad:
        put_grad(input, finished(g * (input - target) / ltorch.clamp_min((1 - input) * input, _BCE_EPSILON)))
    if target.requires_grad:
        put_grad(target, finished(-ltorch.logit(input) * g))
    return out


@register_grad(ltorch.binary_cross_entropy_with_logits)
def binary_cross_entropy_with_logits_grad(
    input, target, weight=None, size_average=None, reduce=None, reduction="mean", pos_weight=None
):
    """Eager's: ``(sigmoid(input) - target) * g`` (with ``pos_weight``, ``((p * t + 1 - t) *
    sigmoid(input) - p * t) * g``) and ``-input * g`` (``(log_sigmoid(-input) - log_sigmoid(input)
    * p) * g``), the input's terms first, so that the gradients take its layout as eager's do; each
    then times the weight and, for ``mean``, divided by the element count, as eager rounds them."""
    op = "ltorch.binary_cross_entropy_with_logits"
    out = ltorch.binary_cross_entropy_with_logits(input, target, weight, size_average, reduce, reduction, pos_weight)
    if input.dtype != target.dtype or input.dtype != out.dtype:
        return out  # the decomposition's VJP
    reduction = _reduction(op, reduction, size_average, reduce)
    g = get_grad(out)
    g = ltorch.expand(g, input.shape) if reduction != "none" else g
    count = input.numel() if reduction == "mean" else 1

    def finished(grad):
        grad = grad * g if weight is None else grad * g * weight
        return grad if type(count) is int and count == 1 else grad / count

    if input.requires_grad:
        if pos_weight is None:
            grad = ltorch.sigmoid(input) - target
        else:
            scaled = pos_weight * target
            grad = (scaled + 1 - target) * ltorch.sigmoid(input) - scaled
        put_grad(input, finished(grad))
    if target.requires_grad:
        grad = -input if pos_weight is None else logsigmoid(-input) - logsigmoid(input) * pos_weight
        put_grad(target, finished(grad))
    return out


def _kernel_grad(input, target, reduction: str, g, slope, opmath=False):
    """Eager's regression kernels' gradient of ``input``: ``slope(input - target, norm, g)``, with
    the norm of ``mean`` (rounded as eager's: ``kernel_norm``), contiguous as the kernel writes it.
    With ``opmath`` (smooth_l1's kernel) half precision computes all of it in float32, the norm
    unrounded."""
    if opmath and g.dtype in LOW_PRECISION:
        dtype, difference = g.dtype, to_compute_dtype(input) - to_compute_dtype(target)
        count = difference.numel() if reduction == "mean" else 1
        g = to_compute_dtype(g) if type(count) is int else to_compute_dtype(g) / count
        norm = 1.0 / count if type(count) is int else 1.0
        return kernel_layout(ltorch.to(slope(difference, norm, g), dtype))
    difference = input - target
    norm, g = kernel_norm(1.0, difference.numel() if reduction == "mean" else 1, g)
    return kernel_layout(slope(difference, norm, g))


def _huber_slope(delta: float):
    def slope(x, n, g):
        return torch.where(x <= -delta, -n * g * delta, torch.where(x >= delta, n * g * delta, n * x * g))

    return slope


def _smooth_l1_slope(beta: float, half: bool):
    # (the kernel's half-precision loop divides by beta before the cotangent multiplies)
    def slope(x, n, g):
        inside = n * x / beta * g if half else n * x * g / beta
        return torch.where(x <= -beta, -n * g, torch.where(x >= beta, n * g, inside))

    return slope


@torchsymbol(name="huber_loss_backward")
def huber_loss_backward(grad_output, input, target, reduction: str, delta: float):
    """Eager's ``huber_loss_backward`` kernel, which the torch executor runs (``TORCH_IMPLS``): its
    vector loop and its scalar tail round the outer branch otherwise (``n * delta * g`` and
    ``n * g * delta`` in double), so only the kernel itself is eager's bit for bit. The
    decomposition is the kernel's formula."""
    return _kernel_grad(input, target, reduction, grad_output, _huber_slope(delta))


@torchsymbol(name="smooth_l1_loss_backward")
def smooth_l1_loss_backward(grad_output, input, target, reduction: str, beta: float):
    """Eager's ``smooth_l1_loss_backward`` kernel, as ``huber_loss_backward``."""
    slope = _smooth_l1_slope(beta, input.dtype in LOW_PRECISION)
    return _kernel_grad(input, target, reduction, grad_output, slope, opmath=True)


def _kernel_grads(input, target, reduction: str, g, kernel, param, slope, opmath=False) -> None:
    """The gradients eager's autograd gives ``input`` and ``target`` of a regression loss: its
    backward ``kernel`` of (input, target) and of (target, input); of a broadcast pair, the
    kernel's formula on the broadcast difference, summed back (and negated for ``target``)."""
    if same_shape(input.shape, target.shape):
        for x, other in ((input, target), (target, input)):
            if x.requires_grad:
                put_grad(x, kernel(g, x, other, reduction, param))
        return
    grad = _kernel_grad(input, target, reduction, g, slope, opmath)
    if input.requires_grad:
        put_grad(input, sum_to(grad, input.shape))
    if target.requires_grad:
        put_grad(target, sum_to(-grad, target.shape))


@register_grad(ltorch.smooth_l1_loss)
def smooth_l1_loss_grad(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    out = ltorch.smooth_l1_loss(input, target, size_average, reduce, reduction, beta)
    if beta == 0 or input.dtype != target.dtype:
        return out  # (eager's beta=0 is l1_loss, differentiated as a composite)
    reduction = _reduction("ltorch.smooth_l1_loss", reduction, size_average, reduce)
    slope = _smooth_l1_slope(beta, input.dtype in LOW_PRECISION)
    g = get_grad(out)
    _kernel_grads(input, target, reduction, g, smooth_l1_loss_backward, beta, slope, opmath=True)
    return out


@register_grad(ltorch.huber_loss)
def huber_loss_grad(input, target, reduction="mean", delta=1.0, weight=None):
    out = ltorch.huber_loss(input, target, reduction, delta, weight)
    if input.dtype != target.dtype:
        return out  # the decomposition's VJP
    if weight is not None:
        same = same_shape(input.shape, target.shape) and same_shape(input.shape, weight.shape)
        if not same or weight.dtype != input.dtype:
            return out  # the decomposition's VJP
    reduction = _reduction("ltorch.huber_loss", reduction, None, None)
    slope = _huber_slope(delta)
    if weight is None:
        _kernel_grads(input, target, reduction, get_grad(out), huber_loss_backward, delta, slope)
        return out
    # F.huber_loss's ``huber_loss(reduction="none") * weight``, then ``mean()`` or ``sum()``: their
    # backwards (a mean's a new tensor), mul's, then the kernel's, contiguous
    g = _unreduced_cotangent(get_grad(out), reduction, input)
    if weight.requires_grad:
        put_grad(weight, g * ltorch.huber_loss(input, target, "none", delta))
    _kernel_grads(input, target, "none", g * weight, huber_loss_backward, delta, slope)
    return out


_REDUCTION_ENUMS = {"none": 0, "mean": 1, "sum": 2}

#: The aten calls the torch executor runs for the backward kernels.
TORCH_IMPLS = {
    huber_loss_backward: lambda g, x, t, reduction, delta: torch.ops.aten.huber_loss_backward(
        g, x, t, _REDUCTION_ENUMS[reduction], delta
    ),
    smooth_l1_loss_backward: lambda g, x, t, reduction, beta: torch.ops.aten.smooth_l1_loss_backward(
        g, x, t, _REDUCTION_ENUMS[reduction], beta
    ),
}


# -- grad rules of the composite losses: eager's autograd through their ops ------------------------
# In the order eager's engine runs the ops' backwards and adds up an input's gradients (ATen
# evaluates the right operand of ``a - b`` first, so ``a``'s backward runs first), so that the
# gradients round and are laid out as eager's. Broadcast or promoted operands keep the
# decompositions' VJPs.


def _unreduced_cotangent(g, reduction: str, like):
    """The cotangent of each element of the unreduced loss: eager's ``mean`` and ``sum``
    backward (the cotangent expanded, then divided: a new tensor)."""
    if reduction == "none":
        return g
    g = g.expand(like.shape)
    return g / like.numel() if reduction == "mean" else g


def _stirling_grad(g, t):
    """The target's gradient through ``t * log(t) - t + 0.5 * log(2 * pi * t)`` masked where
    ``t <= 1``: its terms, in the order eager's engine runs the ops' backwards (the latest op's
    first; ATen computes the right operand of ``+`` and ``-`` first) and adds them into a buffer
    laid out as the first (the masked_fill's cotangent negated, contiguous)."""
    kept = ltorch.masked_fill(g, t <= 1, 0)
    through_log = kept * 0.5 / (t * (2 * math.pi)) * (2 * math.pi)
    return [-kept, kept * torch.log(t), kept * t / t, through_log]


def _same_operands(input, target, out) -> bool:
    return input.dtype == target.dtype == out.dtype and same_shape(input.shape, target.shape)


@register_grad(ltorch.kl_div)
def kl_div_grad(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    """ATen's ``xlogy(target, target) - target * input`` (``exp(target) * (target - input)``)
    differentiated; ``batchmean`` is a sum divided by the batch size."""
    out = ltorch.kl_div(input, target, size_average, reduce, reduction, log_target)
    if not _same_operands(input, target, out) or not out.dtype.is_floating_point:
        return out
    g = get_grad(out)
    if reduction == "batchmean" and size_average is None and reduce is None:
        g, reduction = (g / input.shape[0] if input.ndim else g), "sum"
    g = _unreduced_cotangent(g, _reduction("ltorch.kl_div", reduction, size_average, reduce), input)
    if log_target:
        e = torch.exp(target)
        grads = ([-(g * e)], [g * (target - input) * e, g * e])
    else:
        negated = -g
        own = torch.xlogy(g, target).masked_fill((target == 0.0) & (target <= 0.0), 0.0)
        grads = ([negated * target], [own, g * target / target, negated * input])
    _put_terms((input, target), grads)
    return out


def _put_terms(inputs, terms) -> None:
    """Each input's gradient terms put one by one, in the order eager's engine adds them into its
    buffer: after the gradients that ops run later in the forward gave it (a target also another
    loss's input: R-Drop's symmetric KL), as eager's ``(earlier + a) + b``, not ``earlier + (a + b)``."""
    for x, grads in zip(inputs, terms):
        if x.requires_grad:
            for grad in grads:
                put_grad(x, grad)


@register_grad(ltorch.poisson_nll_loss)
def poisson_nll_loss_grad(
    input, target, log_input=True, full=False, size_average=None, eps=1e-08, reduce=None, reduction="mean"
):
    """ATen's ``exp(input) - target * input`` (``input - target * log(input + eps)``)
    differentiated; with ``full``, ``loss += stirling.masked_fill(target <= 1, 0)`` too."""
    out = ltorch.poisson_nll_loss(input, target, log_input, full, size_average, eps, reduce, reduction)
    if not _same_operands(input, target, out) or not out.dtype.is_floating_point:
        return out
    reduction = _reduction("ltorch.poisson_nll_loss", reduction, size_average, reduce)
    g = _unreduced_cotangent(get_grad(out), reduction, input)
    negated = -g
    if log_input:
        grads = ([g * torch.exp(input), negated * target], [negated * input])
    else:
        shifted = input + eps
        grads = ([g, negated * target / shifted], [negated * torch.log(shifted)])
    if full:
        grads = (grads[0], _stirling_grad(g, target) + grads[1])
    _put_terms((input, target), grads)
    return out
