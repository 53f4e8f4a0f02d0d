"""Multi-head attention (``F.multi_head_attention_forward``, what ``nn.MultiheadAttention`` and
``nn.TransformerEncoderLayer`` call): its decomposition, step for step eager's Python one.

The in-projection (packed or separate weights), ``bias_k``/``bias_v``, ``add_zero_attn``,
``static_k``/``static_v`` and the merge of ``key_padding_mask`` into ``attn_mask`` are shape ops
and additions. Attention then takes eager's two paths: with ``need_weights`` the weights are an
explicit softmax (dropped out, then averaged over heads when asked), without it the call is
``scaled_dot_product_attention`` with the merged mask (or ``is_causal``), so that dropout draws
what eager's kernels draw. Sequence lengths and the batch stay the proxies' sizes, symbolic
where the trace made them so.

``nn.MultiheadAttention``'s inference fast path (``torch._native_multi_head_attention``) is not
reached by the module's own check while tracing (proxies override torch functions): where eager
would take it, ``transformer_fast_paths`` records the fused kernel whole instead of calling this
function. Under autocast the call stays eager (see ``_call``).
"""

import math
import warnings

import torch
import torch.nn.functional as F

from thunder_rs.core.lang.fallback import user_fallback
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.core.lang.symint import same_shape
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, check
from thunder_rs.torch.symbols import ltorch, torchsymbol

__all__ = ["multi_head_attention_forward"]

_OP = "ltorch.multi_head_attention_forward"


def _canonical_mask(mask, name: str, other_type, other_name: str, target_type):
    """A bool ``mask`` as a float one of ``target_type``: -inf where it is True, 0 elsewhere
    (eager's ``F._canonical_mask``, its deprecation warning for mixed mask types included)."""
    if mask is None:
        return None
    is_float = mask.dtype.is_floating_point
    check(
        mask.dtype == torch.bool or is_float,
        _OP,
        f"only bool and floating types of {name} are supported (argument {name})",
        ThunderRuntimeError,
    )
    if other_type is not None and mask.dtype != other_type:
        warnings.warn(
            f"Support for mismatched {name} and {other_name} is deprecated. Use same type for both instead.",
            stacklevel=2,
        )
    if is_float:
        return mask
    zeros = ltorch.zeros_like(mask, dtype=target_type)
    return ltorch.masked_fill(zeros, mask, float("-inf"))


def _check_ranks(query, key, value, key_padding_mask, attn_mask, num_heads: int) -> bool:
    """Whether the call is batched (a 3-D query), after eager's checks of the ranks."""
    rank = query.ndim
    check(
        rank in (2, 3),
        _OP,
        f"query should be unbatched 2D or batched 3D tensor but received {rank}-D query tensor (argument query)",
        ThunderRuntimeError,
    )
    check(
        key.ndim == rank and value.ndim == rank,
        _OP,
        f"For {rank}-D `query`, expected `key` and `value` to be {rank}-D but found {key.ndim}-D and "
        f"{value.ndim}-D tensors respectively (argument key)",
        ThunderRuntimeError,
    )
    check(
        key_padding_mask is None or key_padding_mask.ndim == rank - 1,
        _OP,
        lambda: f"expected `key_padding_mask` to be `None` or {rank - 1}-D (argument key_padding_mask)",
        ThunderRuntimeError,
    )
    check(
        attn_mask is None or attn_mask.ndim in (2, 3),
        _OP,
        lambda: f"expected `attn_mask` to be `None`, 2-D or 3-D but found {attn_mask.ndim}-D (argument attn_mask)",
        ThunderRuntimeError,
    )
    if rank == 2 and attn_mask is not None and attn_mask.ndim == 3:
        expected = (num_heads, query.shape[0], key.shape[0])
        check(
            same_shape(attn_mask.shape, expected),
            _OP,
            lambda: (
                f"Expected `attn_mask` shape to be {expected} but got {tuple(attn_mask.shape)} (argument attn_mask)"
            ),
            ThunderRuntimeError,
        )
    return rank == 3


def _head_dim(embed_dim, embed_dim_to_check: int, num_heads: int) -> int:
    """The width of a head, after eager's checks of the query's embedding size."""
    check(
        embed_dim == embed_dim_to_check,
        _OP,
        f"was expecting embedding dimension of {embed_dim_to_check}, but got {embed_dim} (argument query)",
        ThunderRuntimeError,
    )
    head_dim = embed_dim_to_check // num_heads
    check(
        head_dim * num_heads == embed_dim_to_check,
        _OP,
        f"embed_dim {embed_dim_to_check} not divisible by num_heads {num_heads} (argument num_heads)",
        ThunderRuntimeError,
    )
    return head_dim


def _in_projection_packed(q, k, v, w, b):
    """q, k and v projected by the packed ``in_proj_weight``: one product for self-attention,
    two when key is value, three otherwise, as eager splits it (the sums are eager's)."""
    check(
        same_shape(k.shape, v.shape),
        _OP,
        lambda: f"key shape {tuple(k.shape)} does not match value shape {tuple(v.shape)} (argument value)",
        ThunderRuntimeError,
    )
    check(w is not None, _OP, "use_separate_proj_weight is False but in_proj_weight is None", ThunderRuntimeError)
    embed = q.shape[-1]
    if k is v and q is k:
        return tuple(ltorch.chunk(ltorch.linear(q, w, b), 3, -1))
    if k is v:
        w_q, w_kv = ltorch.split(w, [embed, embed * 2])
        b_q, b_kv = (None, None) if b is None else ltorch.split(b, [embed, embed * 2])
        k_proj, v_proj = ltorch.chunk(ltorch.linear(k, w_kv, b_kv), 2, -1)
        return ltorch.linear(q, w_q, b_q), k_proj, v_proj
    w_q, w_k, w_v = ltorch.chunk(w, 3)
    b_q, b_k, b_v = (None, None, None) if b is None else ltorch.chunk(b, 3)
    return ltorch.linear(q, w_q, b_q), ltorch.linear(k, w_k, b_k), ltorch.linear(v, w_v, b_v)


def _in_projection(q, k, v, w_q, w_k, w_v, in_proj_bias):
    """q, k and v projected by their own weights (``use_separate_proj_weight``; key and value
    may have their own widths, ``kdim`` and ``vdim``)."""
    check(
        w_q is not None and w_k is not None and w_v is not None,
        _OP,
        "use_separate_proj_weight is True but q_proj_weight, k_proj_weight or v_proj_weight is None",
        ThunderRuntimeError,
    )
    check(
        same_shape(k.shape[:2], v.shape[:2]),
        _OP,
        lambda: (
            f"key's sequence and batch dims {tuple(k.shape[:2])} do not match value's {tuple(v.shape[:2])} "
            "(argument value)"
        ),
        ThunderRuntimeError,
    )
    e_q = q.shape[-1]
    for w, x, name in ((w_q, q, "q_proj_weight"), (w_k, k, "k_proj_weight"), (w_v, v, "v_proj_weight")):
        check(
            same_shape(w.shape, (e_q, x.shape[-1])),
            _OP,
            lambda: f"expecting {name} of shape {(e_q, x.shape[-1])}, but got {tuple(w.shape)} (argument {name})",
            ThunderRuntimeError,
        )
    b_q, b_k, b_v = (None, None, None) if in_proj_bias is None else ltorch.chunk(in_proj_bias, 3)
    return ltorch.linear(q, w_q, b_q), ltorch.linear(k, w_k, b_k), ltorch.linear(v, w_v, b_v)


def _check_attn_mask(attn_mask, tgt_len, src_len, heads):
    """A 2-D ``attn_mask`` of (tgt_len, src_len) as (1, tgt_len, src_len); a 3-D one must have
    ``heads`` (batch * num_heads) rows."""
    if attn_mask.ndim == 2:
        check(
            same_shape(attn_mask.shape, (tgt_len, src_len)),
            _OP,
            lambda: (
                f"The shape of the 2D attn_mask is {tuple(attn_mask.shape)}, but should be "
                f"{(tgt_len, src_len)} (argument attn_mask)"
            ),
            ThunderRuntimeError,
        )
        return ltorch.unsqueeze(attn_mask, 0)
    check(
        same_shape(attn_mask.shape, (heads, tgt_len, src_len)),
        _OP,
        lambda: (
            f"The shape of the 3D attn_mask is {tuple(attn_mask.shape)}, but should be "
            f"{(heads, tgt_len, src_len)} (argument attn_mask)"
        ),
        ThunderRuntimeError,
    )
    return attn_mask


def _heads(x, static, heads, head_dim: int, name: str):
    """``x`` (length, batch, embed) as (batch * num_heads, length, head_dim), or ``static`` in its place."""
    if static is None:
        return ltorch.transpose(ltorch.reshape(x, (x.shape[0], heads, head_dim)), 0, 1)
    check(
        static.ndim == 3 and static.shape[0] == heads and static.shape[2] == head_dim,
        _OP,
        lambda: f"expecting {name} of shape ({heads}, *, {head_dim}), but got {tuple(static.shape)} (argument {name})",
        ThunderRuntimeError,
    )
    return static


def _pad_last(mask):
    return None if mask is None else ltorch.pad(mask, (0, 1))


def _extend_keys(k, v, attn_mask, key_padding_mask, bias_k, bias_v, bsz, statics):
    """``bias_k`` and ``bias_v`` appended to the keys and values (length first), one more
    unmasked key for the masks; ``statics`` (``static_k`` and ``static_v``) take no bias."""
    check(
        bias_k is None or all(s is None for s in statics),
        _OP,
        "bias cannot be added to static key or value (argument bias_k)",
        ThunderRuntimeError,
    )
    check(
        (bias_k is None) == (bias_v is None),
        _OP,
        "bias_k and bias_v must be both set or both None (argument bias_k)",
        ThunderRuntimeError,
    )
    if bias_k is None:
        return k, v, attn_mask, key_padding_mask
    k = ltorch.cat([k, ltorch.expand(bias_k, (1, bsz, bias_k.shape[-1]))])
    v = ltorch.cat([v, ltorch.expand(bias_v, (1, bsz, bias_v.shape[-1]))])
    return k, v, _pad_last(attn_mask), _pad_last(key_padding_mask)


def _zero_attn(k, v, attn_mask, key_padding_mask):
    """A zero key and value appended (``add_zero_attn``), and an unmasked position for it."""
    shape = (k.shape[0], 1, k.shape[2])
    k = ltorch.cat([k, ltorch.zeros(shape, dtype=k.dtype, device=k.device)], 1)
    v = ltorch.cat([v, ltorch.zeros(shape, dtype=v.dtype, device=v.device)], 1)
    return k, v, _pad_last(attn_mask), _pad_last(key_padding_mask)


def _merge_padding(attn_mask, key_padding_mask, bsz, num_heads: int, src_len):
    """``key_padding_mask`` (batch, src_len) repeated over the heads as (batch * num_heads, 1,
    src_len) and added to ``attn_mask``."""
    if key_padding_mask is None:
        return attn_mask
    check(
        same_shape(key_padding_mask.shape, (bsz, src_len)),
        _OP,
        lambda: (
            f"expecting key_padding_mask shape of {(bsz, src_len)}, but got {tuple(key_padding_mask.shape)} "
            "(argument key_padding_mask)"
        ),
        ThunderRuntimeError,
    )
    padding = ltorch.reshape(key_padding_mask, (bsz, 1, 1, src_len))
    padding = ltorch.reshape(ltorch.expand(padding, (bsz, num_heads, 1, src_len)), (bsz * num_heads, 1, src_len))
    return padding if attn_mask is None else ltorch.add(attn_mask, padding)


def _weighted_attention(q, k, v, attn_mask, dropout_p: float, bsz, num_heads: int, average: bool):
    """Eager's ``need_weights`` path: the softmax weights explicitly, dropped out, applied to
    the values. Returns the heads' outputs and the weights as (batch, [heads,] tgt, src)."""
    q_scaled = ltorch.mul(q, math.sqrt(1.0 / float(q.shape[-1])))
    k_t = ltorch.transpose(k, -2, -1)
    if attn_mask is not None:
        weights = ltorch.baddbmm(attn_mask, q_scaled, k_t)
    else:
        weights = ltorch.bmm(q_scaled, k_t)
    weights = ltorch.softmax(weights, -1)
    if dropout_p > 0.0:
        weights = ltorch.dropout(weights, dropout_p)
    out = ltorch.bmm(weights, v)
    tgt_len, src_len = weights.shape[1], weights.shape[2]
    weights = ltorch.reshape(weights, (bsz, num_heads, tgt_len, src_len))
    if average:
        weights = ltorch.mean(weights, 1)
    return out, weights


def _fused_attention(q, k, v, attn_mask, dropout_p: float, is_causal: bool, bsz, num_heads: int):
    """Eager's path without weights: ``scaled_dot_product_attention`` over (batch, heads, length,
    head_dim). Returns the output as (tgt, batch, heads, head_dim)."""
    src_len = k.shape[1]
    if attn_mask is not None:
        if attn_mask.shape[0] == 1 and attn_mask.ndim == 3:
            attn_mask = ltorch.unsqueeze(attn_mask, 0)
        else:
            attn_mask = ltorch.reshape(attn_mask, (bsz, num_heads, attn_mask.shape[1], src_len))
    q, k, v = (ltorch.reshape(x, (bsz, num_heads, x.shape[1], x.shape[2])) for x in (q, k, v))
    out = ltorch.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)
    return ltorch.permute(out, (2, 0, 1, 3))


def _masks(query, key_padding_mask, attn_mask, is_causal: bool, need_weights: bool):
    """The padding and attention masks as float masks, and whether to pass ``is_causal`` on:
    eager drops a causal ``attn_mask`` for the hint only when nothing else needs the mask."""
    key_padding_mask = _canonical_mask(
        key_padding_mask,
        "key_padding_mask",
        None if attn_mask is None else attn_mask.dtype,
        "attn_mask",
        query.dtype,
    )
    check(
        not (is_causal and attn_mask is None),
        _OP,
        "Need attn_mask if specifying the is_causal hint. You may use the Transformer module method "
        "`generate_square_subsequent_mask` to create this mask. (argument is_causal)",
        ThunderRuntimeError,
    )
    if is_causal and key_padding_mask is None and not need_weights:
        return key_padding_mask, None, True
    attn_mask = _canonical_mask(attn_mask, "attn_mask", None, "", query.dtype)
    return key_padding_mask, attn_mask, is_causal and key_padding_mask is None


@torchsymbol(name="multi_head_attention_forward")
def multi_head_attention_forward(
    query,
    key,
    value,
    embed_dim_to_check: int,
    num_heads: int,
    in_proj_weight,
    in_proj_bias,
    bias_k,
    bias_v,
    add_zero_attn: bool,
    dropout_p: float,
    out_proj_weight,
    out_proj_bias,
    training: bool = True,
    key_padding_mask=None,
    need_weights: bool = True,
    attn_mask=None,
    use_separate_proj_weight: bool = False,
    q_proj_weight=None,
    k_proj_weight=None,
    v_proj_weight=None,
    static_k=None,
    static_v=None,
    average_attn_weights: bool = True,
    is_causal: bool = False,
):
    """Returns the output, and with ``need_weights`` the attention weights too (a tuple); the
    call of ``F.multi_head_attention_forward`` (``_call``) adds eager's None for the weights."""
    batched = _check_ranks(query, key, value, key_padding_mask, attn_mask, num_heads)
    if not batched:
        query, key, value = (ltorch.unsqueeze(x, 1) for x in (query, key, value))
        if key_padding_mask is not None:
            key_padding_mask = ltorch.unsqueeze(key_padding_mask, 0)
    tgt_len, bsz, embed_dim = query.shape
    key_padding_mask, attn_mask, is_causal = _masks(query, key_padding_mask, attn_mask, is_causal, need_weights)
    head_dim = _head_dim(embed_dim, embed_dim_to_check, num_heads)
    if use_separate_proj_weight:
        q, k, v = _in_projection(query, key, value, q_proj_weight, k_proj_weight, v_proj_weight, in_proj_bias)
    else:
        q, k, v = _in_projection_packed(query, key, value, in_proj_weight, in_proj_bias)
    heads = bsz * num_heads
    if attn_mask is not None:
        attn_mask = _check_attn_mask(attn_mask, tgt_len, key.shape[0], heads)
    k, v, attn_mask, key_padding_mask = _extend_keys(
        k, v, attn_mask, key_padding_mask, bias_k, bias_v, bsz, (static_k, static_v)
    )
    q = ltorch.transpose(ltorch.reshape(q, (tgt_len, heads, head_dim)), 0, 1)
    k = _heads(k, static_k, heads, head_dim, "static_k")
    v = _heads(v, static_v, heads, head_dim, "static_v")
    if add_zero_attn:
        k, v, attn_mask, key_padding_mask = _zero_attn(k, v, attn_mask, key_padding_mask)
    attn_mask = _merge_padding(attn_mask, key_padding_mask, bsz, num_heads, k.shape[1])
    dropout_p = dropout_p if training else 0.0
    if need_weights:
        out, weights = _weighted_attention(q, k, v, attn_mask, dropout_p, bsz, num_heads, average_attn_weights)
        out = ltorch.transpose(out, 0, 1)
    else:
        out = _fused_attention(q, k, v, attn_mask, dropout_p, is_causal, bsz, num_heads)
    out = ltorch.linear(ltorch.reshape(out, (tgt_len * bsz, embed_dim)), out_proj_weight, out_proj_bias)
    out = ltorch.reshape(out, (tgt_len, bsz, out.shape[1]))
    if not batched:
        out = ltorch.squeeze(out, 1)
    if not need_weights:
        return out
    return out, weights if batched else ltorch.squeeze(weights, 0)


def _call(*args, **kwargs):
    """``F.multi_head_attention_forward``: the symbol's output, with None for the weights
    eager does not compute (``need_weights=False``).

    Under autocast, and for arguments a symbol inside refuses, the call runs eagerly instead:
    eager's function is Python, so autocast casts each op inside it by that op's policy, while
    the calls inside a decomposition run unautocast (``autocast.cast_inputs``)."""
    if torch._C._is_any_autocast_enabled():
        return user_fallback(F.multi_head_attention_forward, args, kwargs, effect=True)
    need_weights = kwargs.get("need_weights", args[15] if len(args) > 15 else True)
    try:
        out = multi_head_attention_forward(*args, **kwargs)
    except ThunderNotImplementedError:
        return user_fallback(F.multi_head_attention_forward, args, kwargs, effect=True)
    return out if need_weights else (out, None)


TORCH_TO_LTORCH[F.multi_head_attention_forward] = _call
