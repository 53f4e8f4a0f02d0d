"""Fused kernels of eager's autograd: forwards that also return the statistics their backward
reuses, and the backwards themselves.

Each is a symbol whose body, written with ltorch ops, is what it computes; the torch executor
runs it as one aten call instead (``torch_ex._KERNELS``), and a fusion executor may take the
decomposition. The grad rules in ``grads.py`` call them, so that a compiled training step makes
about as many torch calls as eager's autograd does.

Statistics have the dtypes aten's kernels give them (see ``_norm_stats_dtype``), so that a
trace's metadata is what runs. Half-precision values are computed in float32 and returned in
their input's dtype, as eager kernels do.
"""

import math

import torch

from thunder_rs.torch.symbols import ltorch
from thunder_rs.torch.symbols import torchsymbol
from thunder_rs.torch.base_losses import _target_weights
from thunder_rs.torch.nn import _LOW_PRECISION, batch_norm_stats, batch_normalized, channel_dims, per_channel

__all__ = [
    "native_layer_norm",
    "native_layer_norm_backward",
    "native_dropout",
    "native_dropout_backward",
    "gelu_backward",
    "threshold_backward",
    "leaky_relu_backward",
    "hardtanh_backward",
    "softmax_backward",
    "log_softmax_backward",
    "embedding_backward",
    "nll_loss_forward",
    "nll_loss_backward",
    "sdpa_flash",
    "sdpa_flash_backward",
    "native_batch_norm",
    "native_batch_norm_no_stats",
    "native_batch_norm_backward",
]

#: aten's reduction codes, as nll_loss_forward takes them.
REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


# -- helpers shared with the grad rules ------------------------------------------------------------


def cast(a, dtype):
    return a if a.dtype == dtype else ltorch.to(a, dtype)


def upcast(a):
    """``a`` in the dtype eager kernels compute in: float32 for half-precision floats."""
    return cast(a, torch.float32) if a.dtype in _LOW_PRECISION else a


def compute_dtype(dtype):
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def sum_to(grad, shape):
    """``grad`` summed over the dims that broadcasting added in front of ``shape`` or expanded
    from size 1, so that it has ``shape``."""
    shape = tuple(shape)
    lead = grad.ndim - len(shape)
    expanded = tuple(lead + i for i, s in enumerate(shape) if s == 1 and grad.shape[lead + i] != 1)
    if not expanded:
        return ltorch.sum(grad, tuple(range(lead))) if lead else grad
    total = ltorch.sum(grad, (*range(lead), *expanded), keepdim=True)
    return ltorch.reshape(total, shape) if lead else total


def _one_or_tuple(values: list):
    """A symbol's outputs: one tensor alone, several as a tuple."""
    return values[0] if len(values) == 1 else tuple(values)


# Each kernel's meta rule describes the outputs its decomposition records, as ``(shape, dtype)``
# or ``(shape, dtype, flows)`` where ``flows`` is False for an output that no input requiring
# grad reaches, so that it can be recorded whole (``recorder.record_kernel``). tests/test_kernels.py
# checks each against its decomposition.


def _like(t):
    return tuple(t.shape), t.dtype


def _flows(*tensors) -> bool:
    """Whether one of ``tensors`` (numbers and None allowed) requires grad."""
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def _masked_meta(output_mask, *outputs):
    """The outputs that ``output_mask`` asks for."""
    return [o for wanted, o in zip(output_mask, outputs) if wanted]


# -- layer norm ------------------------------------------------------------------------------------


def _norm_stats_dtype(input, *params):
    """The dtype of native_layer_norm's mean and rstd: on CPU the parameters' dtype (the input's
    without them); elsewhere the compute dtype (CUDA accumulates half precision in float32)."""
    if input.device.type != "cpu":
        return compute_dtype(input.dtype)
    present = [p for p in params if p is not None]
    return present[0].dtype if present else input.dtype


def _trailing(input, normalized_shape) -> tuple[int, ...]:
    return tuple(range(input.ndim - len(normalized_shape), input.ndim))


def _native_layer_norm_meta(input, normalized_shape, weight, bias, eps):
    stats = (*input.shape[: input.ndim - len(normalized_shape)], *(1,) * len(normalized_shape))
    dtype = _norm_stats_dtype(input, weight, bias)
    return [_like(input), (stats, dtype, input.requires_grad), (stats, dtype, input.requires_grad)]


@torchsymbol(name="native_layer_norm", meta=_native_layer_norm_meta)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    """layer_norm's output, with the mean and reciprocal standard deviation it normalised by
    (kept as size-1 dims)."""
    dims = _trailing(input, normalized_shape)
    x = upcast(input)
    var, mean = ltorch.var_mean(x, dims, correction=0, keepdim=True)
    rstd = ltorch.rsqrt(var + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    stats = _norm_stats_dtype(input, weight, bias)
    return cast(out, input.dtype), cast(mean, stats), cast(rstd, stats)


def _native_layer_norm_backward_meta(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    params = tuple(input.shape[input.ndim - len(normalized_shape) :])
    xhat = (grad_out, input, mean, rstd)
    return _masked_meta(
        output_mask,
        (*_like(input), _flows(*xhat, weight)),
        (params, getattr(weight, "dtype", None), _flows(*xhat)),
        (params, getattr(bias, "dtype", None), _flows(grad_out)),
    )


@torchsymbol(name="native_layer_norm_backward", meta=_native_layer_norm_backward_meta)
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    """The gradients of layer_norm's input, weight and bias that ``output_mask`` asks for."""
    dims = _trailing(input, normalized_shape)
    x, g = upcast(input), upcast(grad_out)
    mean, rstd = upcast(mean), upcast(rstd)
    xhat = (x - mean) * rstd
    grads = []
    if output_mask[0]:
        gxhat = g if weight is None else g * weight
        centred = gxhat - ltorch.mean(gxhat, dims, keepdim=True)
        grad = rstd * (centred - xhat * ltorch.mean(gxhat * xhat, dims, keepdim=True))
        grads.append(cast(grad, input.dtype))
    lead = dims[0]
    if output_mask[1]:
        grads.append(cast(sum_to(g * xhat, xhat.shape[lead:]), weight.dtype))
    if output_mask[2]:
        grads.append(cast(sum_to(g, xhat.shape[lead:]), bias.dtype))
    return _one_or_tuple(grads)


# -- batch norm ------------------------------------------------------------------------------------


def _batch_stats_meta(input):
    channels, dtype = (input.shape[1],), compute_dtype(input.dtype)
    return [(channels, dtype, input.requires_grad), (channels, dtype, input.requires_grad)]


def _native_batch_norm_meta(input, weight, bias, running_mean, running_var, training, momentum, eps):
    return [
        (*_like(input), _flows(input, weight, bias)),
        *_batch_stats_meta(input),
        (*_like(running_mean), _flows(input, running_mean, momentum)),
        (*_like(running_var), _flows(input, running_var, momentum)),
    ]


@torchsymbol(name="native_batch_norm", meta=_native_batch_norm_meta)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """Batch norm in training mode, as aten's ``_native_batch_norm_legit_functional``: the output,
    the batch mean and inverse standard deviation, and the running statistics updated with
    ``momentum`` (a number, or a 0-d tensor for ``nn.BatchNorm``'s cumulative average); the
    running variance takes the unbiased batch variance."""
    x = upcast(input)
    mean, invstd, var = batch_norm_stats(x, eps)
    out = batch_normalized(input, x, mean, invstd, weight, bias)
    count = x.numel() // x.shape[1]
    unbiased = var * (count / (count - 1))
    new_mean = mean * momentum + running_mean * (1 - momentum)
    new_var = unbiased * momentum + running_var * (1 - momentum)
    return out, mean, invstd, cast(new_mean, running_mean.dtype), cast(new_var, running_var.dtype)


def _native_batch_norm_no_stats_meta(input, weight, bias, eps):
    return [_like(input), *_batch_stats_meta(input)]


@torchsymbol(name="native_batch_norm_no_stats", meta=_native_batch_norm_no_stats_meta)
def native_batch_norm_no_stats(input, weight, bias, eps):
    """Batch norm in training mode without running statistics: the output, and the batch mean
    and inverse standard deviation."""
    x = upcast(input)
    mean, invstd, _ = batch_norm_stats(x, eps)
    return batch_normalized(input, x, mean, invstd, weight, bias), mean, invstd


def _native_batch_norm_backward_meta(
    grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask
):
    channels = (input.shape[1],)
    param_dtype = input.dtype if weight is None else weight.dtype
    stats = (save_mean, save_invstd) if train else (running_mean, running_var)
    scale = (input, *stats) if train else (running_var,)
    return _masked_meta(
        output_mask,
        (*_like(input), _flows(grad_out, weight, *scale)),
        (channels, getattr(weight, "dtype", None), _flows(grad_out, input, *stats)),
        (channels, param_dtype, _flows(grad_out)),
    )


@torchsymbol(name="native_batch_norm_backward", meta=_native_batch_norm_backward_meta)
def native_batch_norm_backward(
    grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask
):
    """The gradients of batch norm's input, weight and bias that ``output_mask`` asks for: in
    training mode from the batch statistics saved by the forward, in eval mode from the running
    ones."""
    x, g = upcast(input), upcast(grad_out)
    dims = channel_dims(x)
    if train:
        mean, invstd = save_mean, save_invstd
    else:
        mean = cast(running_mean, x.dtype)
        invstd = 1 / ltorch.sqrt(cast(running_var, x.dtype) + eps)
    mean_b, invstd_b = per_channel(mean, x.ndim), per_channel(invstd, x.ndim)
    xhat = (x - mean_b) * invstd_b
    sum_g = ltorch.sum(g, dims)
    sum_gx = ltorch.sum(g * xhat, dims)
    grads = []
    if output_mask[0]:
        scale = invstd_b if weight is None else invstd_b * per_channel(cast(weight, x.dtype), x.ndim)
        if train:
            count = x.numel() // x.shape[1]
            centred = g - per_channel(sum_g, x.ndim) / count - xhat * per_channel(sum_gx, x.ndim) / count
            grads.append(cast(centred * scale, input.dtype))
        else:
            grads.append(cast(g * scale, input.dtype))
    if output_mask[1]:
        grads.append(cast(sum_gx, weight.dtype))
    if output_mask[2]:
        grads.append(cast(sum_g, weight.dtype if weight is not None else input.dtype))
    return _one_or_tuple(grads)


# -- dropout ---------------------------------------------------------------------------------------


@torchsymbol(name="native_dropout")
def native_dropout(input, p, train):
    """dropout in training mode (0 < p < 1), and its mask: each element kept with probability
    1 - p, as a bool, and scaled by 1 / (1 - p); dropped NaNs stay NaN, as in eager."""
    noise = ltorch.rand_like(input, dtype=compute_dtype(input.dtype))
    keep = noise < 1.0 - p
    return input * keep * (1.0 / (1.0 - p)), keep


def _native_dropout_backward_meta(grad_output, mask, scale):
    return [(tuple(torch.broadcast_shapes(grad_output.shape, mask.shape)), grad_output.dtype)]


@torchsymbol(
    torch.ops.aten.native_dropout_backward.default, name="native_dropout_backward", meta=_native_dropout_backward_meta
)
def native_dropout_backward(grad_output, mask, scale):
    return grad_output * mask * scale


# -- activations and softmax -----------------------------------------------------------------------

_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_TANH_CUBIC = 0.044715


def _gelu_backward_meta(grad_output, input, approximate="none"):
    shape = tuple(torch.broadcast_shapes(grad_output.shape, input.shape))
    return [(shape, input.dtype)]


@torchsymbol(name="gelu_backward", meta=_gelu_backward_meta)
def gelu_backward(grad_output, input, approximate="none"):
    x = upcast(input)
    if approximate == "tanh":
        # d/dx [x (1 + t) / 2] with t = tanh(u), u = k (x + c x^3):
        # (1 + t) / 2 + x (1 - t)(1 + t) k (1 + 3 c x^2) / 2 = (1 + t)(1 + x (1 - t) u') / 2
        x2 = x * x
        t = ltorch.tanh(x * (_SQRT_2_OVER_PI + _SQRT_2_OVER_PI * _TANH_CUBIC * x2))
        du = _SQRT_2_OVER_PI + 3 * _SQRT_2_OVER_PI * _TANH_CUBIC * x2
        slope = (0.5 + 0.5 * t) * (1 + x * (1 - t) * du)
    else:
        # d/dx [x Phi(x)] = Phi(x) + x phi(x)
        cdf = 0.5 + 0.5 * ltorch.erf(x * math.sqrt(0.5))
        slope = cdf + x * ltorch.exp(-0.5 * x * x) * (1 / math.sqrt(2 * math.pi))
    return cast(upcast(grad_output) * slope, input.dtype)


def _elementwise_backward_meta(grad_output, input, *params):
    shape = tuple(torch.broadcast_shapes(grad_output.shape, input.shape))
    return [(shape, grad_output.dtype)]


# The piecewise activations' backward kernels, one aten call each on the torch executor (on the
# CPU, torch.where with a number runs about 18x slower than leaky_relu_backward); the
# decompositions select on eager's comparisons, so the gradient at the kinks and at NaN is eager's.


@torchsymbol(name="threshold_backward", meta=_elementwise_backward_meta)
def threshold_backward(grad_output, input, threshold):
    """``grad_output`` where ``input > threshold``, else 0 (NaN passes nothing, as eager's)."""
    return ltorch.where(ltorch.le(input, threshold), 0.0, grad_output)


@torchsymbol(name="leaky_relu_backward", meta=_elementwise_backward_meta)
def leaky_relu_backward(grad_output, input, negative_slope):
    """``grad_output`` where ``input > 0``, else ``grad_output * negative_slope``."""
    return ltorch.where(ltorch.gt(input, 0.0), grad_output, grad_output * negative_slope)


@torchsymbol(name="hardtanh_backward", meta=_elementwise_backward_meta)
def hardtanh_backward(grad_output, input, min_val, max_val):
    """``grad_output`` strictly inside (min_val, max_val) and at NaN, else 0."""
    outside = ltorch.bitwise_or(ltorch.le(input, min_val), ltorch.ge(input, max_val))
    return ltorch.where(outside, 0.0, grad_output)


def _softmax_backward_meta(grad_output, output, dim):
    return [(tuple(torch.broadcast_shapes(grad_output.shape, output.shape)), output.dtype)]


@torchsymbol(name="softmax_backward", meta=_softmax_backward_meta)
def softmax_backward(grad_output, output, dim):
    """The gradient of softmax's input from its output's, in the output's dtype."""
    g, y = upcast(grad_output), upcast(output)
    return cast(y * (g - ltorch.sum(g * y, dim, keepdim=True)), output.dtype)


@torchsymbol(name="log_softmax_backward", meta=_softmax_backward_meta)
def log_softmax_backward(grad_output, output, dim):
    """The gradient of log_softmax's input from its output's, in the output's dtype."""
    g, y = upcast(grad_output), upcast(output)
    return cast(g - ltorch.exp(y) * ltorch.sum(g, dim, keepdim=True), output.dtype)


# -- embedding and losses --------------------------------------------------------------------------


def _embedding_backward_meta(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    return [((num_weights, grad_output.shape[-1]), grad_output.dtype)]


@torchsymbol(name="embedding_backward", meta=_embedding_backward_meta)
def embedding_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    """The gradient of an embedding table of ``num_weights`` rows; ``padding_idx`` is -1 for
    none (else in range), and its row gets no gradient."""
    features, dtype, device = grad_output.shape[-1], grad_output.dtype, grad_output.device
    index = ltorch.reshape(indices, (indices.numel(),))
    rows = ltorch.reshape(grad_output, (indices.numel(), features))
    if padding_idx >= 0:
        rows = ltorch.where(ltorch.unsqueeze(index == padding_idx, -1), 0.0, rows)
    grad = ltorch.index_add(ltorch.zeros((num_weights, features), dtype=dtype, device=device), 0, index, rows)
    if scale_grad_by_freq:  # each row's gradient is divided by how often it was looked up
        ones = ltorch.ones_like(index, dtype=dtype)
        lookups = ltorch.index_add(ltorch.zeros(num_weights, dtype=dtype, device=device), 0, index, ones)
        grad = grad / ltorch.unsqueeze(ltorch.clamp(lookups, min=1), -1)
    return grad


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
    return [(*_like(input), _flows(grad_output, weight, total_weight if mean else None))]


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


# -- attention -------------------------------------------------------------------------------------


def _scores(query, key, is_causal: bool, scale: float):
    """query @ key^T * scale in the compute dtype, -inf above the diagonal when causal."""
    scores = upcast(ltorch.matmul(query, ltorch.transpose(key, -1, -2))) * scale
    if not is_causal:
        return scores
    rows, cols = scores.shape[-2:]
    visible = ltorch.tril(ltorch.ones(rows, cols, dtype=torch.bool, device=query.device))
    return ltorch.where(visible, scores, float("-inf"))


def _sdpa_flash_meta(query, key, value, is_causal, scale):
    rows = tuple(query.shape[:-1])
    return [((*rows, value.shape[-1]), query.dtype), (rows, compute_dtype(query.dtype), _flows(query, key))]


@torchsymbol(name="sdpa_flash", meta=_sdpa_flash_meta)
def sdpa_flash(query, key, value, is_causal, scale):
    """Attention of 4-D query, key and value (one batch and head count, one head size) without
    mask or dropout, and the logsumexp of each row's scores (float32 for half precision)."""
    scores = _scores(query, key, is_causal, scale)
    lse = ltorch.logsumexp(scores, -1)
    probs = ltorch.exp(scores - ltorch.unsqueeze(lse, -1))
    return ltorch.matmul(cast(probs, query.dtype), value), lse


def _sdpa_flash_backward_meta(grad_out, query, key, value, out, logsumexp, is_causal, scale):
    batch, dtype = tuple(query.shape[:-2]), query.dtype
    return [
        ((*batch, query.shape[-2], key.shape[-1]), dtype),
        ((*batch, key.shape[-2], query.shape[-1]), dtype),
        ((*batch, value.shape[-2], grad_out.shape[-1]), dtype),
    ]


@torchsymbol(name="sdpa_flash_backward", meta=_sdpa_flash_backward_meta)
def sdpa_flash_backward(grad_out, query, key, value, out, logsumexp, is_causal, scale):
    """The gradients of ``sdpa_flash``'s query, key and value; the probabilities are recomputed
    from the saved logsumexp."""
    dtype = query.dtype
    probs = ltorch.exp(_scores(query, key, is_causal, scale) - ltorch.unsqueeze(logsumexp, -1))
    grad_value = ltorch.matmul(ltorch.transpose(cast(probs, dtype), -1, -2), grad_out)
    dprobs = upcast(ltorch.matmul(grad_out, ltorch.transpose(value, -1, -2)))
    row = ltorch.sum(upcast(grad_out) * upcast(out), -1, keepdim=True)  # = sum(probs * dprobs)
    dscores = cast(probs * (dprobs - row) * scale, dtype)
    grad_query = ltorch.matmul(dscores, key)
    grad_key = ltorch.matmul(ltorch.transpose(dscores, -1, -2), query)
    return grad_query, grad_key, grad_value
