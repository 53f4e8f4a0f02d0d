"""Scaled dot-product attention (``F.scaled_dot_product_attention``): its decomposition (the
scores, their mask and softmax, and the weighted sum of the values), the flash-attention kernel
eager's CPU autograd runs (``sdpa_flash`` and its backward) and the grad rule.

The rule calls the kernel eager's autograd would: on the CPU ``sdpa_flash``, on CUDA a symbol of
``fused_attention.py`` (the kernel torch chooses), whose forward also returns the statistics the
backward reuses. Where eager takes its math path (a composite its autograd differentiates op by
op), the rule records that path op by op and its backward reads the probabilities the forward
kept, as eager's nodes keep them: the backward computes no attention again. With dropout it
returns the plain forward without asking for a cotangent; the VJP pass then differentiates the
decomposition.
"""

import math

import torch
import torch.nn.functional as F

from thunder_rs import clang, prims
from thunder_rs.core.lang import sdp_state, symfloat
from thunder_rs.core.lang.fallback import draws_again
from thunder_rs.core.lang.eager_layouts import eager_strides
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.errors import (
    ThunderRuntimeError,
    check,
)
from thunder_rs.torch.common import (
    LOW_PRECISION,
    broadcast_back,
    cast,
    compute_dtype,
    flows,
    sum_to,
    to_compute_dtype,
    upcast,
)
from thunder_rs.torch.elementwise import where
from thunder_rs.torch.fused_attention import fused_attention
from thunder_rs.torch.linalg import eager_matmul_grads, matmul
from thunder_rs.torch.nn import dropout, softmax_backward, tensor_softmax
from thunder_rs.torch.symbols import ltorch, torchsymbol
from thunder_rs.core.lang.symint import same_shape

T = torch.Tensor


__all__ = ["scaled_dot_product_attention", "sdpa_flash", "sdpa_flash_backward"]


# -- attention -------------------------------------------------------------------------------------


def _check_attention(op, query, key, value, attn_mask, dropout_p, is_causal):
    for x, name in ((query, "query"), (key, "key"), (value, "value")):
        check(
            x.ndim >= 2,
            op,
            f"Expected query, key, and value to all be at least 2 dimensional, but got "
            f"{name}.dim: {x.ndim} (argument {name})",
            ThunderRuntimeError,
        )
        check(
            x.dtype == query.dtype,
            op,
            f"Expected query, key, and value to have the same dtype, but got "
            f"query.dtype: {query.dtype} and {name}.dtype: {x.dtype} (argument {name})",
            ThunderRuntimeError,
        )
    check(
        query.dtype.is_floating_point,
        op,
        f"expected a floating-point query, got {query.dtype} (argument query)",
        ThunderRuntimeError,
    )
    check(
        key.shape[-1] == query.shape[-1],
        op,
        f"query's embedding size {query.shape[-1]} differs from key's {key.shape[-1]} (argument key)",
        ThunderRuntimeError,
    )
    check(
        key.shape[-2] == value.shape[-2],
        op,
        f"key has {key.shape[-2]} positions but value has {value.shape[-2]} (argument value)",
        ThunderRuntimeError,
    )
    check(
        0.0 <= dropout_p <= 1.0,
        op,
        f"dropout probability has to be between 0 and 1, but got {dropout_p} (argument dropout_p)",
        ThunderRuntimeError,
    )
    if attn_mask is not None:
        check(
            not is_causal,
            op,
            "Explicit attn_mask should not be set when is_causal=True (argument attn_mask)",
            ThunderRuntimeError,
        )
        check(
            attn_mask.dtype in (torch.bool, query.dtype),
            op,
            f"Expected attn_mask dtype to be bool or to match "
            f"query dtype, but got {attn_mask.dtype} and {query.dtype} (argument attn_mask)",
            ThunderRuntimeError,
        )


def _repeat_heads(op, x, query_heads: int, arg: str):
    """``x`` with each of its heads (dim -3) repeated to make ``query_heads``, as repeat_interleave does."""
    heads = x.shape[-3]
    check(
        query_heads % heads == 0,
        op,
        f"Number of heads in key and value must divide the number of heads in query (argument {arg})",
        ThunderRuntimeError,
    )
    groups = query_heads // heads
    if groups == 1:
        return x
    n = x.ndim
    expanded = prims.broadcast_in_dim(x, (*x.shape[:-2], groups, *x.shape[-2:]), (*range(n - 2), n - 1, n))
    return prims.reshape(expanded, (*x.shape[:-3], query_heads, *x.shape[-2:]))


def _causal_mask(scores):
    """True where key position <= query position (the lower-left triangle of the last two dims)."""
    rows, cols = scores.shape[-2:]
    q_pos = prims.iota(rows, 0, 1, scores.device, torch.int64)
    k_pos = prims.iota(cols, 0, 1, scores.device, torch.int64)
    shape = (rows, cols)
    return prims.ge(prims.broadcast_in_dim(q_pos, shape, (0,)), prims.broadcast_in_dim(k_pos, shape, (1,)))


@torchsymbol(torch.ops.aten._safe_softmax.default, name="safe_softmax")
def safe_softmax(scores, dim, dtype=None):
    """Softmax along ``dim``; rows that are entirely -inf give zeros, as eager's masked attention
    does (``aten._safe_softmax``, which the torch executor runs: one kernel and a ``where``, where
    this decomposition's prims were 1.3x eager's step for a padded GPT-2 on the CPU)."""
    if dtype is not None:
        scores = clang.maybe_convert(scores, dtype)
    dims = (clang.canonicalize_dim(scores.ndim, dim, "ltorch.safe_softmax"),)
    row_max = prims.amax(scores, dims)
    masked_row = broadcast_back(prims.eq(row_max, float("-inf")), scores.shape, dims)
    shift = prims.where(masked_row, 0.0, broadcast_back(row_max, scores.shape, dims))
    exps = prims.exp(prims.sub(scores, shift))
    probs = prims.div(exps, broadcast_back(prims.sum(exps, dims), scores.shape, dims))
    return prims.where(masked_row, 0.0, probs)


@register_grad(ltorch.safe_softmax)
def safe_softmax_grad(scores, dim, dtype=None):
    # softmax's backward from the output, whose masked rows are zeros: their gradient is zero.
    out = ltorch.safe_softmax(scores, dim, dtype)
    put_grad(scores, cast(softmax_backward(get_grad(out), out, dim), scores.dtype))
    return out


@torchsymbol(F.scaled_dot_product_attention)
def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    op = "ltorch.scaled_dot_product_attention"
    _check_attention(op, query, key, value, attn_mask, dropout_p, is_causal)
    if enable_gqa and query.ndim >= 3:
        key = _repeat_heads(op, key, query.shape[-3], "key")
        value = _repeat_heads(op, value, query.shape[-3], "value")
    clang.broadcast_shapes(op, query.shape[:-2], key.shape[:-2], value.shape[:-2])
    if query.device.type == "cpu" and not _flash_on_cpu(query, key, value, attn_mask, dropout_p, enable_gqa):
        # eager's CPU math kernel scales query and key by sqrt(scale) each, not the scores
        grouped = enable_gqa and query.ndim >= 3
        return _math_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, grouped)
    if scale is None:
        scale = 1.0 / symfloat.sqrt(query.shape[-1])
    key_t = prims.transpose(key, (*range(key.ndim - 2), key.ndim - 1, key.ndim - 2))
    scores = prims.mul(matmul(query, key_t), scale)
    if is_causal:
        scores = where(_causal_mask(scores), scores, float("-inf"))
    elif attn_mask is not None:
        clang.broadcast_shapes(op, scores.shape, attn_mask.shape)  # eager adds the mask to the scores
        if attn_mask.dtype == torch.bool:
            scores = where(attn_mask, scores, float("-inf"))
        else:
            scores = clang.elementwise(prims.add, op, scores, attn_mask)
    if scores.shape[-1] > 0 and attn_mask is None:
        # Every row sees a key: softmax as a symbol, whose grad rule differentiates it when the
        # decomposition is (attention with dropout).
        compute = torch.float32 if query.dtype in LOW_PRECISION else None
        scores = clang.maybe_convert(tensor_softmax(scores, -1, compute), query.dtype)
    elif scores.shape[-1] > 0:  # no key positions: the product below is zeros anyway
        scores = clang.maybe_convert(safe_softmax(upcast(scores), -1), query.dtype)
    if dropout_p > 0:
        scores = dropout(scores, dropout_p)
    return matmul(scores, value)


# -- kernels ---------------------------------------------------------------------------------------


def _scores(query, key, is_causal: bool, scale: float, attn_mask=None):
    """query @ key^T * scale in the compute dtype plus a float mask, -inf above the diagonal
    when causal."""
    scores = to_compute_dtype(ltorch.matmul(query, ltorch.transpose(key, -1, -2))) * scale
    if attn_mask is not None:
        scores = scores + to_compute_dtype(attn_mask)
    if not is_causal:
        return scores
    rows, cols = scores.shape[-2:]
    visible = ltorch.tril(ltorch.ones(rows, cols, dtype=torch.bool, device=query.device))
    return ltorch.where(visible, scores, float("-inf"))


def _finite_or_zero(lse):
    """A row's logsumexp, 0 where its mask hides every key (-inf), as the kernel's: the row's
    probabilities are then zeros."""
    return ltorch.where(lse == float("-inf"), 0.0, lse)


def _sdpa_flash_meta(query, key, value, is_causal, scale, attn_mask=None):
    rows = tuple(query.shape[:-1])
    return [((*rows, value.shape[-1]), query.dtype), (rows, compute_dtype(query.dtype), flows(query, key, attn_mask))]


@torchsymbol(name="sdpa_flash", meta=_sdpa_flash_meta)
def sdpa_flash(query, key, value, is_causal, scale, attn_mask=None):
    """Attention of 4-D query, key and value (one batch count, one head size; the key's and
    value's heads each shared by a group of the query's) without dropout, with a float mask added
    to the scores, and the logsumexp of each row's scores (float32 for half precision)."""
    key, value = (_grouped_heads(x, query.shape[-3]) for x in (key, value))
    scores = _scores(query, key, is_causal, scale, attn_mask)
    lse = _finite_or_zero(ltorch.logsumexp(scores, -1))
    probs = ltorch.exp(scores - ltorch.unsqueeze(lse, -1))
    return ltorch.matmul(cast(probs, query.dtype), value), lse


def _sdpa_flash_backward_meta(grad_out, query, key, value, out, logsumexp, is_causal, scale, attn_mask=None):
    dtype = query.dtype
    return [
        ((*query.shape[:-2], query.shape[-2], key.shape[-1]), dtype),
        ((*key.shape[:-2], key.shape[-2], query.shape[-1]), dtype),
        ((*value.shape[:-2], value.shape[-2], grad_out.shape[-1]), dtype),
    ]


@torchsymbol(name="sdpa_flash_backward", meta=_sdpa_flash_backward_meta)
def sdpa_flash_backward(grad_out, query, key, value, out, logsumexp, is_causal, scale, attn_mask=None):
    """The gradients of ``sdpa_flash``'s query, key and value; the probabilities are recomputed
    from the saved logsumexp; a key's or value's head shared by a group gets the group's sum."""
    dtype, shared = query.dtype, (key, value)
    key, value = (_grouped_heads(x, query.shape[-3]) for x in (key, value))
    scores = _scores(query, key, is_causal, scale, attn_mask)
    probs = ltorch.exp(scores - ltorch.unsqueeze(logsumexp, -1))
    grad_value = ltorch.matmul(ltorch.transpose(cast(probs, dtype), -1, -2), grad_out)
    dprobs = to_compute_dtype(ltorch.matmul(grad_out, ltorch.transpose(value, -1, -2)))
    row = ltorch.sum(to_compute_dtype(grad_out) * to_compute_dtype(out), -1, keepdim=True)  # = sum(probs * dprobs)
    dscores = cast(probs * (dprobs - row) * scale, dtype)
    grad_query = ltorch.matmul(dscores, key)
    grad_key = ltorch.matmul(ltorch.transpose(dscores, -1, -2), query)
    return grad_query, _unrepeat(grad_key, shared[0], True), _unrepeat(grad_value, shared[1], True)


# -- grad rule -------------------------------------------------------------------------------------


def _grouped_heads(x, heads: int):
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
        grad = sum_to(grad, (*like.shape[:-3], grad.shape[-3], *like.shape[-2:]))
        *batch, _, length, size = grad.shape
        grad = ltorch.sum(ltorch.reshape(grad, (*batch, like.shape[-3], groups, length, size)), -3)
    return sum_to(grad, like.shape)


def _math_dtype(dtype):
    """The dtype eager's math path (``_scaled_dot_product_attention_math``) computes ``dtype``
    attention in: float32 for half precision, unless its switch allows half-precision reductions
    (``allow_fp16_bf16_reduction_math_sdp``, guarded where it matters)."""
    if dtype not in LOW_PRECISION or sdp_state.guard()[sdp_state.FIELDS.index("math_fp16_bf16_reduction")]:
        return dtype
    return torch.float32


def _math_probs(query, key, attn_mask, is_causal: bool, scale):
    """Eager's math path up to its probabilities, from query and key in its compute dtype: both
    scaled by ``sqrt(scale)`` before their product, the mask (a boolean or causal one made -inf
    and 0) added, the rows softmaxed (none where every key is masked). Returns the scaled query,
    the scaled key (transposed), the factor and the probabilities."""
    factor = math.sqrt(abs(scale) if scale is not None else 1.0 / symfloat.sqrt(query.shape[-1]))
    query_scaled = query * (-factor if scale is not None and scale < 0 else factor)
    key_scaled = ltorch.transpose(key, -1, -2) * factor
    scores = ltorch.matmul(query_scaled, key_scaled)
    mask = attn_mask
    if is_causal:
        mask = ltorch.tril(ltorch.ones(scores.shape[-2:], dtype=torch.bool, device=query.device))
    if mask is not None and mask.dtype == torch.bool:  # (eager's convert_boolean_attn_mask)
        mask = ltorch.masked_fill(ltorch.zeros(mask.shape, dtype=query.dtype, device=mask.device), ~mask, -math.inf)
    if mask is not None:
        scores = scores + mask
    # (eager's _safe_softmax: zeros for a row that sees no key, and zero gradients, whose rule
    # differentiates from its output)
    probs = safe_softmax(scores, -1) if scores.shape[-1] > 0 else ltorch.tensor_softmax(scores, -1)
    return query_scaled, key_scaled, factor, probs


def _math_attention(query, key, value, attn_mask, dropout_p: float, is_causal: bool, scale, grouped: bool):
    """Attention with dropout as eager's math path computes it (its CPU kernels take no dropout;
    on CUDA, where torch chose it): query, key and value in its compute dtype, the probabilities
    of ``_math_probs``, dropout drawn in that dtype, the product with the values rounded back to
    the query's dtype. Recorded op by op for the VJP pass to differentiate, as eager's autograd
    differentiates the composite."""
    dtype = _math_dtype(query.dtype)
    q, k, v = (cast(x, dtype) for x in (query, key, value))
    k = _grouped_heads(k, query.shape[-3]) if grouped else k
    v = _grouped_heads(v, query.shape[-3]) if grouped else v
    probs = dropout(_math_probs(q, k, attn_mask, is_causal, scale)[3], dropout_p)
    return cast(ltorch.matmul(probs, v), query.dtype)


def _math_operands(query, key, value, attn_mask, is_causal: bool, scale, grouped: bool):
    """Eager's math path's value (its grouped heads repeated) and ``_math_probs``, in its compute dtype."""
    dtype = _math_dtype(query.dtype)
    q, k, v = (cast(x, dtype) for x in (query, key, value))
    k = _grouped_heads(k, query.shape[-3]) if grouped else k
    v = _grouped_heads(v, query.shape[-3]) if grouped else v
    return v, *_math_probs(q, k, attn_mask, is_causal, scale)


def _math_recorded(query, key, value, attn_mask, is_causal: bool, scale, grouped: bool):
    """A differentiated call eager sends to its math path, without dropout (on the CPU: a value of
    another head size, a last dim that is not dense, a mask that requires grad; on CUDA, where torch
    chose it): the path op by op in the forward, its probabilities kept for the backward as eager's
    autograd keeps them (the [B, H, L, S] matrix eager saves; the backward computes no attention
    again), the gradients ``_put_math_gradients``'s. (Recorded whole, F.scaled_dot_product_attention
    would run without grad in the forward, where on CUDA torch may choose a fused kernel: cuDNN's
    backward head sizes on sm90, flash's on sm86-89 and sm120 are asked only of inputs that
    require grad.)"""
    operands = _math_operands(query, key, value, attn_mask, is_causal, scale, grouped)
    out = cast(ltorch.matmul(operands[-1], operands[0]), query.dtype)
    _put_math_gradients(get_grad(out), query, key, value, attn_mask, is_causal, scale, grouped, operands)
    return out


def _put_math_gradients(g, query, key, value, attn_mask, is_causal: bool, scale, grouped: bool, operands) -> None:
    """The gradients eager's autograd gives its math path (a composite it differentiates op by
    op): from the probabilities of ``_math_probs`` in its compute dtype (float32 for half
    precision: the gradients are computed there and rounded back, as its casts' nodes do), each
    product's gradient a product with the other operand, the softmax's
    ``_softmax_backward_data``. (Each rounding as eager's: the scores scaled after the product, or
    the softmax's gradient written out, were 1 ulp apart.) ``operands``: ``_math_operands`` of the
    forward."""
    g = cast(g, _math_dtype(query.dtype))
    v, query_scaled, key_scaled, factor, probs = operands
    # (the product with the value's gradients as eager's matmul backward computes them too: a
    # value laid out otherwise than dense, e.g. split from a transposed projection as MLA's, is
    # folded into a copy there, and the probabilities' gradient rounds as that copy's product)
    dprobs, grad = eager_matmul_grads(g, probs, v, (True, value.requires_grad))
    if grad is not None:
        put_grad(value, cast(_unrepeat(grad, value, grouped), value.dtype))
    dscores = softmax_backward(dprobs, probs, -1)
    if attn_mask is not None and attn_mask.requires_grad:
        put_grad(attn_mask, cast(sum_to(dscores, attn_mask.shape), attn_mask.dtype))
    # (the product's gradients as eager's matmul backward computes them, each from its operands as
    # laid out there: a product with a transposed or a copied operand rounds otherwise; summed
    # over the batch dims it broadcast, then scaled, as eager's nodes run)
    wanted = (query.requires_grad, key.requires_grad)
    first, second = eager_matmul_grads(dscores, query_scaled, key_scaled, wanted)
    if first is not None:
        grad = sum_to(first, query.shape) * factor
        put_grad(query, cast(-grad if scale is not None and scale < 0 else grad, query.dtype))
    if second is not None:
        grad = second * factor
        put_grad(key, cast(_unrepeat(ltorch.transpose(grad, -1, -2), key, grouped), key.dtype))


def _flash_on_cpu(query, key, value, attn_mask, dropout_p, enable_gqa=False) -> bool:
    """Whether eager's CPU flash kernels take the call: 4-D query, key and value on the CPU with
    one batch and head count (with ``enable_gqa``, the key's and value's heads dividing the
    query's; without, one head of each) and one head size, positions on both sides, a mask of 2 or 4 dims
    (bool, or of the query's dtype) that requires no gradient (the kernel gives it none), no
    dropout, and flash not switched off (``sdpa_kernel(SDPBackend.MATH)``: the switches are
    guarded; under it eager's math path rounds otherwise, and may lay its output out otherwise)."""
    if query.device.type != "cpu" or dropout_p != 0 or query.dtype not in _FLASH_DTYPES:
        return False
    # (inside a reentrant checkpoint, whose forward eager runs without grad: there the mask
    # requires none, and flash may take the call)
    mask_grad = attn_mask is not None and attn_mask.requires_grad
    if mask_grad and not (draws_again.regions and torch.is_grad_enabled()):
        return False
    if attn_mask is not None and (attn_mask.ndim not in (2, 4) or attn_mask.dtype not in (torch.bool, query.dtype)):
        return False
    if not (all(x.ndim == 4 for x in (query, key, value)) or all(x.ndim == 3 for x in (query, key, value))):
        return False  # (3-D ones eager unsqueezes to one batch of heads)
    batch_heads, size = tuple(query.shape[:-2]), query.shape[-1]
    # (one head of key and value is shared by all the query's without enable_gqa too: eager's CPU
    # check takes it as grouped)
    if query.ndim == 4 and same_shape(key.shape[:2], value.shape[:2]) and (enable_gqa or key.shape[1] == 1):
        if key.shape[0] == query.shape[0] and key.shape[1] != query.shape[1] and query.shape[1] % key.shape[1] == 0:
            batch_heads = tuple(key.shape[:2])
    same = all(same_shape(x.shape[:-2], batch_heads) and x.shape[-1] == size for x in (key, value))
    if not same or not all(_last_stride_one(x) for x in (query, key, value, attn_mask) if x is not None):
        return False  # (eager's check_last_dim_stride_equals_1_dense: its math path takes the call)
    if not sdp_state.guard()[0]:  # (the flash switch, read where the kernel could take the call)
        return False
    # Each compared with 0 on its own: ``min`` of symbolic lengths would compare them with each
    # other (a guard ``T <= head size`` that a longer sequence fails: a compile more).
    flash = same and key.shape[-2] == value.shape[-2] and all(d > 0 for d in (query.shape[-2], key.shape[-2], size))
    if flash and mask_grad:  # (eager's forward takes flash, its recompute the math path)
        draws_again.grad_kernels += 1
        return False
    return flash


_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _last_stride_one(x) -> bool:
    """Whether eager's tensor for ``x`` steps by one element along its last dim."""
    strides = eager_strides(x)
    return strides is None or not strides or strides[-1] == 1


def _check_math_call(query, key, value, attn_mask, dropout_p, is_causal: bool, grouped: bool) -> None:
    """The decomposition's checks of a call the grad rule records op by op (its errors, not a
    product's)."""
    op = "ltorch.scaled_dot_product_attention"
    _check_attention(op, query, key, value, attn_mask, dropout_p, is_causal)
    if grouped:
        key = _repeat_heads(op, key, query.shape[-3], "key")
        value = _repeat_heads(op, value, query.shape[-3], "value")
    clang.broadcast_shapes(op, query.shape[:-2], key.shape[:-2], value.shape[:-2])


@register_grad(ltorch.scaled_dot_product_attention)
def scaled_dot_product_attention_grad(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    if _flash_on_cpu(query, key, value, attn_mask, dropout_p, enable_gqa):
        _check_attention("ltorch.scaled_dot_product_attention", query, key, value, attn_mask, dropout_p, is_causal)
        scale = 1.0 / symfloat.sqrt(query.shape[-1]) if scale is None else scale
        batched = query.ndim == 3
        q, k, v = (ltorch.unsqueeze(x, 0) for x in (query, key, value)) if batched else (query, key, value)
        mask = attn_mask
        if mask is not None and mask.dtype == torch.bool:  # (eager's convert_boolean_attn_mask)
            mask = ltorch.masked_fill(ltorch.zeros(mask.shape, dtype=query.dtype, device=mask.device), ~mask, -math.inf)
        # (the backward reads the kernel's output, which eager's node saves, not the squeezed one)
        kernel_out, lse = sdpa_flash(q, k, v, is_causal, scale, mask)
        out = ltorch.squeeze(kernel_out, 0) if batched else kernel_out
        g = get_grad(out)
        g = ltorch.unsqueeze(g, 0) if batched else g
        grads = sdpa_flash_backward(g, q, k, v, kernel_out, lse, is_causal, scale, mask)
        # (3-D, eager's gradients reach the inputs through the views it unsqueezed them with, the
        # last taken first: one tensor passed as several of them sums its gradients in that order)
        pairs = list(zip((query, key, value), grads))
        for x, grad in reversed(pairs) if batched else pairs:
            if x.requires_grad:
                put_grad(x, ltorch.squeeze(grad, 0) if batched else grad)
        return out
    if query.device.type == "cuda":  # the fused kernel torch chooses, unless it chooses the math path
        _check_attention("ltorch.scaled_dot_product_attention", query, key, value, attn_mask, dropout_p, is_causal)
        out = fused_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        if out is not None:
            return out
    grouped = enable_gqa and query.ndim >= 3
    _check_math_call(query, key, value, attn_mask, dropout_p, is_causal, grouped)
    if dropout_p > 0:
        return _math_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, grouped)
    return _math_recorded(query, key, value, attn_mask, is_causal, scale, grouped)
