"""Grad rules for the nn, linalg and shape composites: each backward is a few whole torch calls
instead of the prim-by-prim VJP of a decomposition.

Where eager's autograd runs a fused kernel (layer_norm, gelu, softmax, nll_loss, embedding,
attention) the rule calls the same kernel through a symbol of ``kernels.py`` (for attention on
CUDA, of ``fused_attention.py``: the kernel torch chooses), whose forward also returns the
statistics the backward reuses. The other rules compute their forward
by calling their own symbol, which records the plain decomposition (an executor runs it as one
call), and write the backward with ltorch ops. Half-precision values are differentiated in
float32, as eager kernels compute, and each gradient is returned in its input's dtype.

A rule returns the plain forward without asking for a cotangent for calls it does not handle
(attention with dropout, nll_loss whose class weights require grad); the VJP pass then
differentiates the decomposition.
"""

import math

import torch

from thunder_rs.torch.symbols import ltorch
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.torch import kernels
from thunder_rs.torch.fused_attention import fused_attention
from thunder_rs.torch.kernels import REDUCTIONS, cast as _cast, sum_to as _sum_to, upcast as _upcast
from thunder_rs.torch.attention import _check_attention
from thunder_rs.torch.base_losses import _check_nll, _reduction
from thunder_rs.torch.nn import _LOW_PRECISION
from thunder_rs.torch.reductions import _correction, _dims, _keep


# -- activations -----------------------------------------------------------------------------------


@register_grad(ltorch.gelu)
def gelu_grad(input, approximate="none"):
    out = ltorch.gelu(input, approximate)
    put_grad(input, kernels.gelu_backward(get_grad(out), input, approximate))
    return out


def _put_floating(input, grad) -> None:
    if input.dtype.is_floating_point:
        put_grad(input, grad)


@register_grad(ltorch.relu)
def relu_grad(input, inplace=False):
    out = ltorch.relu(input, inplace)
    _put_floating(input, kernels.threshold_backward(get_grad(out), out, 0))  # eager's: from the result
    return out


@register_grad(ltorch.threshold)
def threshold_grad(input, threshold, value, inplace=False):
    out = ltorch.threshold(input, threshold, value, inplace)
    _put_floating(input, kernels.threshold_backward(get_grad(out), input, threshold))
    return out


@register_grad(ltorch.leaky_relu)
def leaky_relu_grad(input, negative_slope=0.01, inplace=False):
    out = ltorch.leaky_relu(input, negative_slope, inplace)
    _put_floating(input, kernels.leaky_relu_backward(get_grad(out), input, negative_slope))
    return out


@register_grad(ltorch.hardtanh)
def hardtanh_grad(input, min_val=-1.0, max_val=1.0, inplace=False):
    out = ltorch.hardtanh(input, min_val, max_val, inplace)
    _put_floating(input, kernels.hardtanh_backward(get_grad(out), input, min_val, max_val))
    return out


@register_grad(ltorch.relu6)
def relu6_grad(input, inplace=False):
    out = ltorch.relu6(input, inplace)
    _put_floating(input, kernels.hardtanh_backward(get_grad(out), input, 0.0, 6.0))
    return out


@register_grad(ltorch.dropout)
def dropout_grad(input, p=0.5, training=True, inplace=False):
    if not training or not 0 < p < 1 or not input.dtype.is_floating_point:
        return ltorch.dropout(input, p, training, inplace)
    out, mask = kernels.native_dropout(input, p, True)
    put_grad(input, kernels.native_dropout_backward(get_grad(out), mask, 1.0 / (1.0 - p)))
    return out


#: Eager's hardsigmoid backward multiplies by 1/6 rounded to float32 (``1.0f / 6.0f``), in
#: every dtype: dividing by 6 gives float64 gradients 3e-8 apart from eager's.
_ONE_SIXTH_F32 = torch.tensor(1.0 / 6.0, dtype=torch.float32).item()


@register_grad(ltorch.hardsigmoid)
def hardsigmoid_grad(input, inplace=False):
    out = ltorch.hardsigmoid(input, inplace)
    inside = ltorch.bitwise_and(ltorch.gt(input, -3.0), ltorch.lt(input, 3.0))
    put_grad(input, ltorch.where(inside, ltorch.mul(get_grad(out), _ONE_SIXTH_F32), 0.0))
    return out


def _kept(t, input, dims, keepdim: bool):
    """``t``, reduced over ``dims`` of ``input`` (``keepdim`` as the forward had it), with those dims as size 1."""
    return t if keepdim else _keep(t, input.shape, dims, True)


def _std_input_grad(g, std, input, dim, unbiased, keepdim, correction, op: str):
    """Eager's std backward: the variance's gradient is ``g / (2 std)``, 0 where std is 0 (a
    constant slice), where differentiating ``sqrt(var)`` gave NaN there; then var's backward.
    Also returns the reduced dims and their element count."""
    dim, correction = _correction(dim, unbiased, correction, op)
    dims = _dims(input, dim, op)
    count = math.prod(input.shape[d] for d in dims) if input.ndim else 1
    g_var = _kept(ltorch.where(ltorch.eq(std, 0), 0.0, ltorch.true_divide(g, ltorch.mul(std, 2))), input, dims, keepdim)
    freedom = count - correction
    scale = 2.0 / freedom if freedom else math.inf  # eager's double division
    centered = ltorch.sub(input, ltorch.mean(input, dims, keepdim=True))
    return ltorch.mul(ltorch.mul(g_var, scale), centered), dims, count


@register_grad(ltorch.std)
def std_grad(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    out = ltorch.std(input, dim, unbiased, keepdim, correction=correction)
    if input.dtype.is_complex:
        return out  # the decomposition's VJP
    grad, _, _ = _std_input_grad(get_grad(out), out, input, dim, unbiased, keepdim, correction, "ltorch.std")
    put_grad(input, grad)
    return out


@register_grad(ltorch.std_mean)
def std_mean_grad(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    std, mean = ltorch.std_mean(input, dim, unbiased, keepdim, correction=correction)
    if input.dtype.is_complex:
        return std, mean  # the decomposition's VJP
    g_std, g_mean = get_grad(std), get_grad(mean)
    grad, dims, count = _std_input_grad(g_std, std, input, dim, unbiased, keepdim, correction, "ltorch.std_mean")
    put_grad(input, ltorch.add(grad, ltorch.true_divide(_kept(g_mean, input, dims, keepdim), count)))
    return std, mean


@register_grad(ltorch.div)
def div_grad(input, other, *, rounding_mode=None):
    """A rounded division has eager's zero gradients: differentiating the rounding gave zeros
    too, but NaN where ``other`` is 0 (zero times the infinite quotient's derivative)."""
    out = ltorch.div(input, other, rounding_mode=rounding_mode)
    if rounding_mode is None or not out.dtype.is_floating_point:
        return out  # the decomposition's VJP
    get_grad(out)
    for x in (input, other):
        if isinstance(x, torch.Tensor) and x.requires_grad:
            put_grad(x, ltorch.zeros_like(x))
    return out


# -- softmax ---------------------------------------------------------------------------------------


def _softmax_backward(input, out, dim, log: bool) -> None:
    """Puts the gradient of ``input`` from that of ``out``, its (log-)softmax along ``dim``
    (None: F.softmax's implicit dim). ``out`` may have another dtype (softmax's ``dtype``)."""
    if dim is None:
        dim = 0 if input.ndim in (0, 1, 3) else 1
    backward = kernels.log_softmax_backward if log else kernels.softmax_backward
    put_grad(input, _cast(backward(get_grad(out), out, dim), input.dtype))


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
    other than the input's (or one float32 for a half-precision input)."""
    if not isinstance(normalized_shape, (tuple, list, torch.Size)) or not input.dtype.is_floating_point:
        return None
    shape = tuple(normalized_shape)
    if not 1 <= len(shape) <= input.ndim or tuple(input.shape[input.ndim - len(shape) :]) != shape:
        return None
    present = [p for p in params if p is not None]
    dtypes = (input.dtype, torch.float32) if input.dtype in _LOW_PRECISION else (input.dtype,)
    if not all(isinstance(p, torch.Tensor) and tuple(p.shape) == shape for p in present):
        return None
    if len({p.dtype for p in present}) > 1 or any(p.dtype not in dtypes for p in present):
        return None
    return tuple(range(input.ndim - len(shape), input.ndim))


def _wants_grad(x) -> bool:
    return x is not None and x.requires_grad


def _put_param_grads(g, xhat, lead: int, weight, bias) -> None:
    """The gradients of an elementwise ``weight`` and ``bias`` applied to ``xhat``, summed over
    the ``lead`` batch dims."""
    if _wants_grad(weight):
        put_grad(weight, _cast(_sum_to(g * xhat, xhat.shape[lead:]), weight.dtype))
    if _wants_grad(bias):
        put_grad(bias, _cast(_sum_to(g, xhat.shape[lead:]), bias.dtype))


@register_grad(ltorch.layer_norm)
def layer_norm_grad(input, normalized_shape, weight=None, bias=None, eps=1e-05):
    if _normalized_dims(input, normalized_shape, weight, bias) is None:
        return ltorch.layer_norm(input, normalized_shape, weight, bias, eps)
    shape = tuple(normalized_shape)
    out, mean, rstd = kernels.native_layer_norm(input, shape, weight, bias, eps)
    g = get_grad(out)
    wanted = [(x, _wants_grad(x)) for x in (input, weight, bias)]
    grads = kernels.native_layer_norm_backward(g, input, shape, mean, rstd, weight, bias, [w for _, w in wanted])
    grads = grads if isinstance(grads, tuple) else (grads,)
    for x, grad in zip([x for x, w in wanted if w], grads):
        put_grad(x, grad)
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


def _put_batch_norm_grads(g, input, weight, bias, running_mean, running_var, save_mean, save_invstd, train: bool, eps):
    wanted = [(x, _wants_grad(x)) for x in (input, weight, bias)]
    if not any(w for _, w in wanted):
        return
    grads = kernels.native_batch_norm_backward(
        g, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, [w for _, w in wanted]
    )
    for x, grad in zip([x for x, w in wanted if w], grads if isinstance(grads, tuple) else (grads,)):
        put_grad(x, grad)


@register_grad(kernels.native_batch_norm)
def native_batch_norm_grad(input, weight, bias, running_mean, running_var, training, momentum, eps):
    outs = kernels.native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)
    _put_batch_norm_grads(get_grad(outs[0]), input, weight, bias, None, None, outs[1], outs[2], True, eps)
    return outs


@register_grad(kernels.native_batch_norm_no_stats)
def native_batch_norm_no_stats_grad(input, weight, bias, eps):
    outs = kernels.native_batch_norm_no_stats(input, weight, bias, eps)
    _put_batch_norm_grads(get_grad(outs[0]), input, weight, bias, None, None, outs[1], outs[2], True, eps)
    return outs


@register_grad(ltorch.batch_norm)
def batch_norm_grad(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-05):
    if training and running_mean is not None:  # the decomposition refuses it
        return ltorch.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    if training:
        out, mean, invstd = kernels.native_batch_norm_no_stats(input, weight, bias, eps)
        _put_batch_norm_grads(get_grad(out), input, weight, bias, None, None, mean, invstd, True, eps)
        return out
    out = ltorch.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    _put_batch_norm_grads(get_grad(out), input, weight, bias, running_mean, running_var, None, None, False, eps)
    return out


# -- losses ----------------------------------------------------------------------------------------


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
    out, total_weight = kernels.nll_loss_forward(rows, flat_target, weight, code, ignore_index)
    if code == REDUCTIONS["none"] and input.ndim > 2:
        out = ltorch.reshape(out, target.shape)
    g = get_grad(out)
    if code == REDUCTIONS["none"] and input.ndim > 2:
        g = ltorch.reshape(g, flat_target.shape)
    grad = kernels.nll_loss_backward(g, rows, flat_target, weight, code, ignore_index, total_weight)
    if input.ndim > 2:
        moved = (input.shape[0], *input.shape[2:], input.shape[1])
        grad = ltorch.movedim(ltorch.reshape(grad, moved), -1, 1)
    put_grad(input, grad)
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
def embedding_grad(
    input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False
):
    out = ltorch.embedding(input, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)
    rows = weight.shape[0]
    padding = -1 if padding_idx is None else padding_idx % rows
    put_grad(weight, kernels.embedding_backward(get_grad(out), input, rows, padding, scale_grad_by_freq))
    return out


# -- splitting -------------------------------------------------------------------------------------


def _tiles_grad(a, pieces, dim: int):
    """Puts the gradient of ``a`` from those of ``pieces``, which tile it along ``dim``: one cat
    instead of a pad per piece. Pieces that are ``a`` itself (one whole piece) take no rule."""
    if any(p is a for p in pieces):
        return pieces
    put_grad(a, ltorch.cat([get_grad(p) for p in pieces], dim))
    return pieces


@register_grad(ltorch.split)
def split_grad(a, split_size_or_sections, dim=0):
    return _tiles_grad(a, ltorch.split(a, split_size_or_sections, dim), dim)


@register_grad(ltorch.chunk)
def chunk_grad(a, chunks, dim=0):
    return _tiles_grad(a, ltorch.chunk(a, chunks, dim), dim)


@register_grad(ltorch.tensor_split)
def tensor_split_grad(a, sections=None, dim=0, *, indices=None, tensor_indices_or_sections=None):
    pieces = ltorch.tensor_split(
        a, sections, dim, indices=indices, tensor_indices_or_sections=tensor_indices_or_sections
    )
    return _tiles_grad(a, pieces, dim)


# -- attention -------------------------------------------------------------------------------------


def _softmax_in_compute_dtype(a, dim: int):
    """softmax(a) along ``dim``, in float32 for a half-precision ``a`` (one call either way)."""
    return ltorch.tensor_softmax(a, dim, torch.float32 if a.dtype in _LOW_PRECISION else None)


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


def _flash_on_cpu(query, key, value, attn_mask, dropout_p) -> bool:
    """Whether eager's CPU flash kernels take the call: 4-D query, key and value on the CPU with
    one batch and head count and one head size, positions on both sides, no mask, no dropout."""
    if query.device.type != "cpu" or attn_mask is not None or dropout_p != 0 or query.dtype not in _FLASH_DTYPES:
        return False
    if not all(x.ndim == 4 for x in (query, key, value)):
        return False
    batch_heads, size = tuple(query.shape[:2]), query.shape[-1]
    same = all(tuple(x.shape[:2]) == batch_heads and x.shape[-1] == size for x in (key, value))
    return same and key.shape[2] == value.shape[2] and min(query.shape[2], key.shape[2], size) > 0


_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


@register_grad(ltorch.scaled_dot_product_attention)
def scaled_dot_product_attention_grad(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    if _flash_on_cpu(query, key, value, attn_mask, dropout_p):
        _check_attention("ltorch.scaled_dot_product_attention", query, key, value, attn_mask, dropout_p, is_causal)
        scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
        out, lse = kernels.sdpa_flash(query, key, value, is_causal, scale)
        grads = kernels.sdpa_flash_backward(get_grad(out), query, key, value, out, lse, is_causal, scale)
        for x, grad in zip((query, key, value), grads):
            if x.requires_grad:
                put_grad(x, grad)
        return out
    if query.device.type == "cuda":  # the fused kernel torch chooses, unless it chooses the math path
        _check_attention("ltorch.scaled_dot_product_attention", query, key, value, attn_mask, dropout_p, is_causal)
        out = fused_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        if out is not None:
            return out
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
