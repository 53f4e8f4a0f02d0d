"""Scaled dot-product attention (``F.scaled_dot_product_attention``) as its decomposition: the
scores, their mask and softmax, and the weighted sum of the values.
"""

import math

import torch
import torch.nn.functional as F

from thunder_rs import clang, prims
from thunder_rs.errors import (
    ThunderRuntimeError,
    check,
)
from thunder_rs.torch.symbols import torchsymbol
from thunder_rs.torch.elementwise import where
from thunder_rs.torch.linalg import matmul
from thunder_rs.torch.nn import _LOW_PRECISION, _keepdim, _upcast, dropout, tensor_softmax

T = torch.Tensor
__all__ = ["scaled_dot_product_attention"]


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


def _safe_softmax(scores):
    """Softmax over the last dim; rows that are entirely -inf give zeros, as eager attention does."""
    dims = (scores.ndim - 1,)
    row_max = prims.amax(scores, dims)
    masked_row = _keepdim(prims.eq(row_max, float("-inf")), scores.shape, dims)
    shift = prims.where(masked_row, 0.0, _keepdim(row_max, scores.shape, dims))
    exps = prims.exp(prims.sub(scores, shift))
    probs = prims.div(exps, _keepdim(prims.sum(exps, dims), scores.shape, dims))
    return prims.where(masked_row, 0.0, probs)


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
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    key_t = prims.transpose(key, (*range(key.ndim - 2), key.ndim - 1, key.ndim - 2))
    scores = prims.mul(matmul(query, key_t), scale)
    if is_causal:
        scores = where(_causal_mask(scores), scores, float("-inf"))
    elif attn_mask is not None:
        clang.broadcast_shapes(op, attn_mask.shape, scores.shape)
        if attn_mask.dtype == torch.bool:
            scores = where(attn_mask, scores, float("-inf"))
        else:
            scores = clang.elementwise(prims.add, op, scores, attn_mask)
    if scores.shape[-1] > 0 and attn_mask is None:
        # Every row sees a key: softmax as a symbol, whose grad rule differentiates it when the
        # decomposition is (attention with dropout).
        compute = torch.float32 if query.dtype in _LOW_PRECISION else None
        scores = clang.maybe_convert(tensor_softmax(scores, -1, compute), query.dtype)
    elif scores.shape[-1] > 0:  # no key positions: the product below is zeros anyway
        scores = clang.maybe_convert(_safe_softmax(_upcast(scores)), query.dtype)
    if dropout_p > 0:
        scores = dropout(scores, dropout_p)
    return matmul(scores, value)
