"""Grad rules for the nn and linalg composites: each backward is written with ltorch ops, so
that it runs as a few whole torch calls instead of the prim-by-prim VJP of a decomposition.

A rule computes its forward by calling its own symbol, which records the plain decomposition
(an executor runs it as one call), except where the backward reuses the forward's statistics
(layer_norm, rms_norm). Everything after ``get_grad`` is the backward; attention recomputes its
probabilities there rather than saving them. Half-precision values are differentiated in
float32, as eager kernels compute, and each gradient is returned in its input's dtype.

A rule returns the plain forward without asking for a cotangent for calls it does not handle
(attention with dropout, cross entropy with class-probability targets, losses whose class
weights require grad); the VJP pass then differentiates the decomposition.
"""

import math

import torch

from thunder_rs import torch as ltorch
from thunder_rs.core.grad import get_grad, put_grad, register_grad
from thunder_rs.torch.nn import _LOW_PRECISION, _reduction


# -- helpers ---------------------------------------------------------------------------------------


def _cast(a, dtype):
    return a if a.dtype == dtype else ltorch.to(a, dtype)


def _upcast(a):
    """``a`` in the dtype eager kernels compute in: float32 for half-precision floats."""
    return _cast(a, torch.float32) if a.dtype in _LOW_PRECISION else a


def _compute_dtype(dtype):
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def _softmax_in_compute_dtype(a, dim: int):
    """softmax(a) along ``dim``, in float32 for a half-precision ``a`` (one call either way)."""
    return ltorch.tensor_softmax(a, dim, torch.float32 if a.dtype in _LOW_PRECISION else None)


def _sum_to(grad, shape):
    """``grad`` summed over the dims that broadcasting added in front of ``shape`` or expanded
    from size 1, so that it has ``shape``."""
    shape = tuple(shape)
    lead = grad.ndim - len(shape)
    expanded = tuple(lead + i for i, s in enumerate(shape) if s == 1 and grad.shape[lead + i] != 1)
    if not expanded:
        return ltorch.sum(grad, tuple(range(lead))) if lead else grad
    total = ltorch.sum(grad, (*range(lead), *expanded), keepdim=True)
    return ltorch.reshape(total, shape) if lead else total


# -- activations -----------------------------------------------------------------------------------

_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_TANH_CUBIC = 0.044715


@register_grad(ltorch.gelu)
def gelu_grad(input, approximate="none"):
    out = ltorch.gelu(input, approximate)
    g = get_grad(out)
    x = _upcast(input)
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
    put_grad(input, _cast(_upcast(g) * slope, input.dtype))
    return out


# -- softmax ---------------------------------------------------------------------------------------


def _softmax_backward(input, out, dim, log: bool) -> None:
    """Puts the gradient of ``input`` from that of ``out``, its (log-)softmax along ``dim``
    (None: F.softmax's implicit dim). ``out`` may have another dtype (softmax's ``dtype``)."""
    if dim is None:
        dim = 0 if input.ndim in (0, 1, 3) else 1
    g = _upcast(get_grad(out))
    y = _upcast(out)
    if log:
        grad = g - ltorch.exp(y) * ltorch.sum(g, dim, keepdim=True)
    else:
        grad = y * (g - ltorch.sum(g * y, dim, keepdim=True))
    put_grad(input, _cast(grad, input.dtype))


@register_grad(ltorch.softmax)
def softmax_grad(input, dim=None, _stacklevel=3, dtype=None):
    out = ltorch.softmax(input, dim, _stacklevel, dtype)
    _softmax_backward(input, out, dim, log=False)
    return out


@register_grad(ltorch.log_softmax)
def log_softmax_grad(input, dim=None, _stacklevel=3, dtype=None):
    out = ltorch.log_softmax(input, dim, _stacklevel, dtype)
    _softmax_backward(input, out, dim, log=True)
    return out


@register_grad(ltorch.tensor_softmax)
def tensor_softmax_grad(input, dim, dtype=None):
    out = ltorch.tensor_softmax(input, dim, dtype)
    _softmax_backward(input, out, dim, log=False)
    return out


@register_grad(ltorch.tensor_log_softmax)
def tensor_log_softmax_grad(input, dim, dtype=None):
    out = ltorch.tensor_log_softmax(input, dim, dtype)
    _softmax_backward(input, out, dim, log=True)
    return out


# -- normalisation ---------------------------------------------------------------------------------


def _normalized_dims(input, normalized_shape, *params):
    """The trailing dims a norm normalises, or None for a call the rule leaves to the
    decomposition: malformed ones (the decomposition reports them) or parameters of a dtype
    other than the input's (or float32 for a half-precision input)."""
    if not isinstance(normalized_shape, (tuple, list, torch.Size)) or not input.dtype.is_floating_point:
        return None
    shape = tuple(normalized_shape)
    if not 1 <= len(shape) <= input.ndim or tuple(input.shape[input.ndim - len(shape):]) != shape:
        return None
    dtypes = (input.dtype, torch.float32) if input.dtype in _LOW_PRECISION else (input.dtype,)
    for p in params:
        if p is not None and not (isinstance(p, torch.Tensor) and tuple(p.shape) == shape and p.dtype in dtypes):
            return None
    return tuple(range(input.ndim - len(shape), input.ndim))


def _put_param_grads(g, xhat, lead: int, weight, bias) -> None:
    """The gradients of an elementwise ``weight`` and ``bias`` applied to ``xhat``, summed over
    the ``lead`` batch dims."""
    if weight is not None and weight.requires_grad:
        put_grad(weight, _cast(_sum_to(g * xhat, xhat.shape[lead:]), weight.dtype))
    if bias is not None and bias.requires_grad:
        put_grad(bias, _cast(_sum_to(g, xhat.shape[lead:]), bias.dtype))


@register_grad(ltorch.layer_norm)
def layer_norm_grad(input, normalized_shape, weight=None, bias=None, eps=1e-05):
    dims = _normalized_dims(input, normalized_shape, weight, bias)
    if dims is None:
        return ltorch.layer_norm(input, normalized_shape, weight, bias, eps)
    # The forward is spelled out so that the backward reuses its mean and rstd.
    x = _upcast(input)
    var, mean = ltorch.var_mean(x, dims, correction=0, keepdim=True)
    rstd = ltorch.rsqrt(var + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    out = _cast(out, input.dtype)

    g = _upcast(get_grad(out))
    xhat = (x - mean) * rstd  # two elementwise calls again rather than a saved input-sized tensor
    if input.requires_grad:
        gxhat = g if weight is None else g * weight
        centred = gxhat - ltorch.mean(gxhat, dims, keepdim=True)
        grad = rstd * (centred - xhat * ltorch.mean(gxhat * xhat, dims, keepdim=True))
        put_grad(input, _cast(grad, input.dtype))
    _put_param_grads(g, xhat, dims[0], weight, bias)
    return out


@register_grad(ltorch.rms_norm)
def rms_norm_grad(input, normalized_shape, weight=None, eps=None):
    dims = _normalized_dims(input, normalized_shape, weight)
    if dims is None:
        return ltorch.rms_norm(input, normalized_shape, weight, eps)
    # The forward is spelled out so that the backward reuses its rstd.
    x = _upcast(input)
    if eps is None:  # eager uses the epsilon of the dtype it computes in
        eps = torch.finfo(x.dtype).eps
    rstd = ltorch.rsqrt(ltorch.mean(x * x, dims, keepdim=True) + eps)
    out = x * rstd
    if weight is not None:
        out = out * weight
    out = _cast(out, input.dtype)

    g = _upcast(get_grad(out))
    xhat = x * rstd
    if input.requires_grad:
        gxhat = g if weight is None else g * weight
        grad = rstd * (gxhat - xhat * ltorch.mean(gxhat * xhat, dims, keepdim=True))
        put_grad(input, _cast(grad, input.dtype))
    _put_param_grads(g, xhat, dims[0], weight, None)
    return out


# -- losses ----------------------------------------------------------------------------------------


def _class_index_grads(input, target, weight, ignore_index: int, reduction: str, g):
    """For class-index targets, with the class dim kept: the derivative of the loss with respect
    to each element's loss (zero where the target is ignored), that times the element's class
    weight (the derivative with respect to its picked log-probability, negated), and the targets
    as an index along the class dim (ignored ones replaced by 0).

    Where every target is ignored, a mean's divisor is zero; ``where`` rather than a product
    with the mask keeps those gradients zero, as eager's are, instead of NaN.
    """
    class_dim = 0 if input.ndim == 1 else 1
    dtype = _compute_dtype(input.dtype)
    target = _cast(target, torch.int64)
    kept = target != ignore_index
    safe = ltorch.where(kept, target, 0)
    picked_weight = None if weight is None else ltorch.where(kept, _cast(weight[safe], dtype), 0.0)
    g = _upcast(g)
    if reduction == "mean":
        g = g / (ltorch.sum(kept, dtype=dtype) if weight is None else ltorch.sum(picked_weight))
    scale = ltorch.unsqueeze(ltorch.where(kept, g, 0.0), class_dim)
    picked = scale if weight is None else ltorch.unsqueeze(ltorch.where(kept, picked_weight * g, 0.0), class_dim)
    return scale, picked, ltorch.unsqueeze(safe, class_dim)


@register_grad(ltorch.nll_loss)
def nll_loss_grad(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    out = ltorch.nll_loss(input, target, weight, size_average, ignore_index, reduce, reduction)
    if not input.requires_grad or (weight is not None and weight.requires_grad):
        return out
    g = get_grad(out)
    reduction = _reduction("ltorch.nll_loss", reduction, size_average, reduce)
    _, picked, index = _class_index_grads(input, target, weight, ignore_index, reduction, g)
    class_dim = 0 if input.ndim == 1 else 1
    # Zeros made from the shape alone, so that the backward need not save the input.
    zeros = ltorch.zeros(input.shape, dtype=picked.dtype, device=input.device)
    grad = ltorch.scatter_add(zeros, class_dim, index, -picked)
    put_grad(input, _cast(grad, input.dtype))
    return out


@register_grad(ltorch.cross_entropy)
def cross_entropy_grad(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                       reduction="mean", label_smoothing=0.0):
    out = ltorch.cross_entropy(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing)
    probabilities = tuple(target.shape) == tuple(input.shape)
    if probabilities or not input.requires_grad or (weight is not None and weight.requires_grad):
        return out
    g = get_grad(out)
    reduction = _reduction("ltorch.cross_entropy", reduction, size_average, reduce)
    scale, picked, index = _class_index_grads(input, target, weight, ignore_index, reduction, g)
    class_dim = 0 if input.ndim == 1 else 1
    probs = _softmax_in_compute_dtype(input, class_dim)
    # loss = (1 - s) nll(lp) - s / C sum_c w_c lp_c per element, lp = log_softmax(x), and
    # d lp_c / dx = onehot(c) - softmax(x): the target's term and each class's weighted term.
    if label_smoothing:
        classes = input.shape[class_dim]
        picked = picked * (1 - label_smoothing)
        spread = scale * (label_smoothing / classes)
        if weight is None:
            grad = probs * (picked + spread * classes) - spread
        else:
            along_classes = tuple(classes if d == class_dim else 1 for d in range(input.ndim))
            w = _cast(ltorch.reshape(weight, along_classes), probs.dtype)
            grad = probs * (picked + spread * ltorch.sum(w)) - spread * w
    else:
        grad = probs * picked
    grad = ltorch.scatter_add(grad, class_dim, index, -picked)
    put_grad(input, _cast(grad, input.dtype))
    return out


# -- linear, matmul, embedding ---------------------------------------------------------------------


@register_grad(ltorch.linear)
def linear_grad(input, weight, bias=None):
    out = ltorch.linear(input, weight, bias)
    g = get_grad(out)
    if weight.ndim == 1:  # out = input @ weight, one feature
        column = ltorch.unsqueeze(g, -1)
        if input.requires_grad:
            put_grad(input, column * weight)
        if weight.requires_grad:
            put_grad(weight, _sum_to(column * input, weight.shape))
        return out
    if input.requires_grad:
        put_grad(input, ltorch.matmul(g, weight))
    if weight.requires_grad:
        # One product over the flattened batch: (out, rows) @ (rows, in).
        rows = math.prod(input.shape[:-1])
        g2 = ltorch.reshape(g, (rows, weight.shape[0]))
        put_grad(weight, ltorch.matmul(ltorch.t(g2), ltorch.reshape(input, (rows, weight.shape[1]))))
    if bias is not None and bias.requires_grad:
        put_grad(bias, _sum_to(g, bias.shape))
    return out


@register_grad(ltorch.matmul)
def matmul_grad(input, other):
    out = ltorch.matmul(input, other)
    g = get_grad(out)
    # As matrices: a 1-D input is a row, a 1-D other a column; the cotangent gets the same dims.
    a = input if input.ndim > 1 else ltorch.unsqueeze(input, 0)
    b = other if other.ndim > 1 else ltorch.unsqueeze(other, -1)
    if other.ndim == 1:
        g = ltorch.unsqueeze(g, -1)
    if input.ndim == 1:
        g = ltorch.unsqueeze(g, -2)
    if input.requires_grad:
        grad = _sum_to(ltorch.matmul(g, ltorch.transpose(b, -1, -2)), a.shape)
        put_grad(input, ltorch.reshape(grad, input.shape))
    if other.requires_grad:
        if b.ndim == 2 and a.ndim > 2:
            # A matrix against a batch: one product over the flattened batch, no sum after it.
            rows, k = math.prod(a.shape[:-1]), a.shape[-1]
            a2 = ltorch.reshape(a, (rows, k))
            grad = ltorch.matmul(ltorch.t(a2), ltorch.reshape(g, (rows, b.shape[-1])))
        else:
            grad = _sum_to(ltorch.matmul(ltorch.transpose(a, -1, -2), g), b.shape)
        put_grad(other, ltorch.reshape(grad, other.shape))
    return out


@register_grad(ltorch.embedding)
def embedding_grad(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                   sparse=False):
    out = ltorch.embedding(input, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)
    g = get_grad(out)
    (num_rows, features), dtype, device = weight.shape, weight.dtype, weight.device
    index = ltorch.reshape(input, (input.numel(),))
    rows = ltorch.reshape(g, (input.numel(), features))
    if padding_idx is not None:  # lookups of the padding row contribute nothing to it
        padding = ltorch.unsqueeze(index == padding_idx % num_rows, -1)
        rows = ltorch.where(padding, 0.0, rows)
    grad = ltorch.index_add(ltorch.zeros(weight.shape, dtype=dtype, device=device), 0, index, rows)
    if scale_grad_by_freq:  # each row's gradient is divided by how often it was looked up
        ones = ltorch.ones_like(index, dtype=dtype)
        lookups = ltorch.index_add(ltorch.zeros(num_rows, dtype=dtype, device=device), 0, index, ones)
        grad = grad / ltorch.unsqueeze(ltorch.clamp(lookups, min=1), -1)
    put_grad(weight, grad)
    return out


# -- attention -------------------------------------------------------------------------------------


def _repeat_heads(x, heads: int):
    """``x`` with each of its heads (dim -3) repeated to make ``heads``, as repeat_interleave does."""
    groups = heads // x.shape[-3]
    if groups == 1:
        return x
    *batch, kv_heads, length, size = x.shape
    grouped = ltorch.expand(ltorch.unsqueeze(x, -3), (*batch, kv_heads, groups, length, size))
    return ltorch.reshape(grouped, (*batch, heads, length, size))


def _unrepeat(grad, like, grouped: bool):
    """The gradient of ``like`` from that of its use broadcast against the other operands and,
    when ``grouped``, with its heads repeated by ``_repeat_heads``."""
    groups = grad.shape[-3] // like.shape[-3] if grouped else 1
    if groups > 1:
        grad = _sum_to(grad, (*like.shape[:-3], grad.shape[-3], *like.shape[-2:]))
        *batch, _, length, size = grad.shape
        grad = ltorch.sum(ltorch.reshape(grad, (*batch, like.shape[-3], groups, length, size)), -3)
    return _sum_to(grad, like.shape)


def _attention_probs(query, key, attn_mask, is_causal: bool, scale: float):
    """softmax(query @ key^T * scale + mask) in the compute dtype; rows that see no key give
    zeros, as eager's attention does."""
    scores = ltorch.matmul(query, ltorch.transpose(key, -1, -2)) * scale
    rows, cols = scores.shape[-2:]
    if is_causal:
        visible = ltorch.tril(ltorch.ones(rows, cols, dtype=torch.bool, device=query.device))
        scores = ltorch.where(visible, scores, float("-inf"))
    elif attn_mask is not None and attn_mask.dtype == torch.bool:
        scores = ltorch.where(attn_mask, scores, float("-inf"))
    elif attn_mask is not None:
        scores = scores + attn_mask
    probs = _softmax_in_compute_dtype(scores, -1)
    if attn_mask is None or cols == 0:
        return probs
    blind = ltorch.all(attn_mask == float("-inf") if attn_mask.dtype != torch.bool else ~attn_mask, -1, keepdim=True)
    return ltorch.where(blind, 0.0, probs)


@register_grad(ltorch.scaled_dot_product_attention)
def scaled_dot_product_attention_grad(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                      enable_gqa=False):
    out = ltorch.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if dropout_p > 0:
        return out
    g = get_grad(out)
    grouped = enable_gqa and query.ndim >= 3
    k = _repeat_heads(key, query.shape[-3]) if grouped else key
    v = _repeat_heads(value, query.shape[-3]) if grouped else value
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    probs = _attention_probs(query, k, attn_mask, is_causal, scale)
    dtype = query.dtype
    if value.requires_grad:
        grad = ltorch.matmul(ltorch.transpose(_cast(probs, dtype), -1, -2), g)
        put_grad(value, _unrepeat(grad, value, grouped))
    dprobs = _upcast(ltorch.matmul(g, ltorch.transpose(v, -1, -2)))
    dscores = probs * (dprobs - ltorch.sum(probs * dprobs, -1, keepdim=True))
    if attn_mask is not None and attn_mask.requires_grad:
        put_grad(attn_mask, _cast(_sum_to(dscores, attn_mask.shape), attn_mask.dtype))
    dscores = _cast(dscores * scale, dtype)
    if query.requires_grad:
        put_grad(query, _sum_to(ltorch.matmul(dscores, k), query.shape))
    if key.requires_grad:
        grad = ltorch.matmul(ltorch.transpose(dscores, -1, -2), query)
        put_grad(key, _unrepeat(grad, key, grouped))
    return out
