"""``nn.TransformerEncoder``, ``TransformerEncoderLayer`` and ``MultiheadAttention`` while tracing:
the results of eager's fast paths, which tracing cannot take (proxies override torch functions, and
``is_compiling()`` makes the encoder skip its check of the mask's values).

In evaluation without grad eager runs fused kernels, which the trace runs too where eager would:
``ltorch.native_self_attention`` (``MultiheadAttention``'s ``torch._native_multi_head_attention``)
and ``ltorch.native_encoder_layer`` (``TransformerEncoderLayer``'s ``_transformer_encoder_layer_fwd``),
recorded whole: bit for bit eager's. They differ from the slow path, beyond rounding, where a mask
hides things:

- The encoder, given a ``src_key_padding_mask`` and ``enable_nested_tensor``, packs the batch into
  a nested tensor of the unpadded tokens and pads the result with zeros: its padded positions come
  out as 0 (then the final norm of 0), not as the layers' values there. It does so only when the
  mask is left-aligned (each row's tokens first), which it checks by value on each call, so the
  trace zeroes the padded positions where the mask is left-aligned: one trace for both of eager's
  paths, chosen per call by the mask's values. ``mask_check=False`` nests any mask as if it were
  left-aligned (eager then packs each row's first tokens, whichever were masked): refused.
- The fused layer and attention read a mask as booleans (a float mask's nonzero entries hide their
  keys, where the slow path adds them to the scores), and a query whose every key is hidden in some
  head gets NaN (their softmax divides 0 by 0; the slow path's gives zeros). The kernels give both.
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.transformer import _detect_is_causal_mask

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.langctx import user_location
from thunder_rs.core.lang.recorder import active_recorder
from thunder_rs.core.lang.torch_overrides import OVERRIDES
from thunder_rs.core.state.observe import thread_state
from thunder_rs.errors import ThunderNotImplementedError
from thunder_rs.torch.factorizations import opaque
from thunder_rs.torch.linalg_metas import meta

__all__: list[str] = []

_encoder_forward = nn.TransformerEncoder.forward
_layer_forward = nn.TransformerEncoderLayer.forward
_attention_forward = nn.MultiheadAttention.forward
#: Where eager's encoder takes its fast path (``_supported_device_type``).
_FAST_DEVICES = ("cpu", "cuda", "xpu", torch.utils.backend_registration._privateuse1_backend_name)


def _first_layer_tensors(layer) -> tuple:
    attention = layer.self_attn
    return (
        attention.in_proj_weight,
        attention.in_proj_bias,
        attention.out_proj.weight,
        attention.out_proj.bias,
        layer.norm1.weight,
        layer.norm1.bias,
        layer.norm2.weight,
        layer.norm2.bias,
        layer.linear1.weight,
        layer.linear1.bias,
        layer.linear2.weight,
        layer.linear2.bias,
    )


def _fused(tensors) -> bool:
    """Eager's last conditions of a fast path: its tensors on a device it serves, none of them
    requiring grad where grad is enabled."""
    tensors = [t for t in tensors if t is not None]
    if torch.is_autocast_enabled() or not all(t.device.type in _FAST_DEVICES for t in tensors):
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def _nests(encoder, src, mask, src_key_padding_mask) -> bool:
    """Whether eager's ``TransformerEncoder.forward`` nests the batch when the mask is
    left-aligned: its conditions but that one, which it checks by value."""
    first = encoder.layers[0]
    if not torch.backends.mha.get_fastpath_enabled() or not getattr(encoder, "use_nested_tensor", False):
        return False
    if first.training or src.dim() != 3 or src_key_padding_mask is None or mask is not None:
        return False
    return _fused((src, *_first_layer_tensors(first)))


def _layer_is_fused(layer, src) -> bool:
    """Whether eager's ``TransformerEncoderLayer.forward`` runs its fused kernel."""
    attention = layer.self_attn
    if not torch.backends.mha.get_fastpath_enabled() or src.dim() != 3 or layer.training:
        return False
    if not attention.batch_first or attention.in_proj_bias is None or not attention._qkv_same_embed_dim:
        return False
    if not layer.activation_relu_or_gelu or layer.norm1.eps != layer.norm2.eps or attention.num_heads % 2:
        return False
    if any(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in layer.modules()):
        return False
    return _fused((src, *_first_layer_tensors(layer)))


def _attention_is_fused(attention, query, key, value, key_padding_mask, attn_mask) -> bool:
    """Whether eager's ``MultiheadAttention.forward`` runs its fused kernel (given boolean masks)."""
    if any(m is not None and torch.is_floating_point(m) for m in (key_padding_mask, attn_mask)):
        return False
    if not torch.backends.mha.get_fastpath_enabled() or query.dim() != 3 or query is not key or key is not value:
        return False
    weight, bias = attention.in_proj_weight, attention.in_proj_bias
    if weight is None or bias is None or query.dtype != weight.dtype or query.dtype != bias.dtype:
        return False
    if attention.training or attention.num_heads % 2 or not attention.batch_first or attention.add_zero_attn:
        return False
    if attention.bias_k is not None or attention.bias_v is not None or not attention._qkv_same_embed_dim:
        return False
    return _fused((query, weight, bias, attention.out_proj.weight, attention.out_proj.bias))


def _left_aligned(kept):
    """Whether every row of ``kept`` (a bool ``[batch, length]``) has its True entries first."""
    if kept.shape[-1] < 2:
        return torch.ones((), dtype=torch.bool, device=kept.device)
    return (kept[:, 1:] <= kept[:, :-1]).all()


def _encoder_forward_in_trace(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
    if active_recorder() is None or not isinstance(src, TensorProxy):
        return _encoder_forward(self, src, mask, src_key_padding_mask, is_causal)
    if thread_state.observer is not None:  # (what eager's forward reads decides its path)
        thread_state.observer.observe_reads(_encoder_forward, self)
    padding = F._canonical_mask(
        mask=src_key_padding_mask,
        mask_name="src_key_padding_mask",
        other_type=F._none_or_dtype(mask),
        other_name="mask",
        target_type=src.dtype,
    )
    if not _nests(self, src, mask, padding):
        return _encoder_forward(self, src, mask, src_key_padding_mask, is_causal)
    if not getattr(self, "mask_check", True):
        raise ThunderNotImplementedError(
            f"nn.TransformerEncoder (mask_check=False) at {user_location()}: in evaluation without grad eager packs "
            "each row's first tokens into a nested tensor, as many as its padding mask keeps, without checking that "
            "they are the kept ones; construct the encoder with mask_check=True (the default)"
        )
    is_causal = _detect_is_causal_mask(None, is_causal, src.shape[1])
    output = src
    for layer in self.layers:
        output = layer(output, src_mask=None, is_causal=is_causal, src_key_padding_mask=padding)
    kept = padding.logical_not()
    output = output.masked_fill((~kept & _left_aligned(kept)).unsqueeze(-1), 0.0)
    return self.norm(output) if self.norm is not None else output


def _native_encoder_layer(src, *weights, mask=None, **options):
    """Eager's fused encoder layer as ``TransformerEncoderLayer.forward`` calls it (``weights``: the
    attention's four, the norms' four, the feed-forward's four; ``options``: ``embed_dim``,
    ``num_heads``, ``use_gelu``, ``norm_first``, ``eps``, ``mask_type``)."""
    attention, norms, feed_forward = weights[:4], weights[4:8], weights[8:]
    head = (options["embed_dim"], options["num_heads"], *attention, options["use_gelu"], options["norm_first"])
    return torch._transformer_encoder_layer_fwd(
        src, *head, options["eps"], *norms, *feed_forward, mask, options.get("mask_type")
    )


def _native_encoder_layer_meta(src, *weights, mask=None, **options):
    return meta(src.shape, src.dtype)


#: ``ltorch.native_encoder_layer``: run whole by torch, in evaluation without grad only, where
#: eager's layer runs it.
native_encoder_layer = opaque(
    "native_encoder_layer", _native_encoder_layer, meta=_native_encoder_layer_meta, autocast_inside=True
)


def _canonical_masks(mask, padding, dtype, names=("src_mask", "src_key_padding_mask")) -> tuple:
    """The masks as eager's layer and attention make them before their fast paths (named as they
    name them): float, -inf where True."""
    padding = F._canonical_mask(
        mask=padding,
        mask_name=names[1],
        other_type=F._none_or_dtype(mask),
        other_name=names[0],
        target_type=dtype,
    )
    mask = F._canonical_mask(
        mask=mask, mask_name=names[0], other_type=None, other_name="", target_type=dtype, check_other=False
    )
    return mask, padding


def _layer_forward_in_trace(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
    if active_recorder() is None or not isinstance(src, TensorProxy) or not _layer_is_fused(self, src):
        return _layer_forward(self, src, src_mask, src_key_padding_mask, is_causal)
    # Eager's fast path: the masks merged, the fused kernel run (bit for bit eager's).
    attention = self.self_attn
    merged, mask_type = attention.merge_masks(*_canonical_masks(src_mask, src_key_padding_mask, src.dtype), src)
    options = dict(embed_dim=attention.embed_dim, num_heads=attention.num_heads, norm_first=self.norm_first)
    options.update(use_gelu=self.activation_relu_or_gelu == 2, eps=self.norm1.eps)
    masks = {} if merged is None else dict(mask=merged, mask_type=mask_type)
    return native_encoder_layer(src, *_first_layer_tensors(self), **masks, **options)


def _native_self_attention(query, in_weight, in_bias, out_weight, out_bias, mask=None, **options):
    """Eager's fused kernel as ``MultiheadAttention.forward`` calls it (``options``: ``embed_dim``,
    ``num_heads``, ``need_weights``, ``average_attn_weights``, ``mask_type``): the output, and the
    weights where ``need_weights`` (else the kernel gives none)."""
    out, weights = torch._native_multi_head_attention(
        query,
        query,
        query,
        options["embed_dim"],
        options["num_heads"],
        in_weight,
        in_bias,
        out_weight,
        out_bias,
        mask,
        options["need_weights"],
        options.get("average_attn_weights", True),
        options.get("mask_type"),
    )
    return (out, weights) if options["need_weights"] else out


def _native_self_attention_meta(query, in_weight, in_bias, out_weight, out_bias, mask=None, **options):
    """The kernel's outputs: the query's shape, and the weights ``(N, L, L)`` averaged over the
    heads (else ``(N, heads, L, L)``)."""
    if not options["need_weights"]:
        return meta(query.shape, query.dtype)
    batch, length = query.shape[:2]
    heads = () if options.get("average_attn_weights", True) else (options["num_heads"],)
    return meta(query.shape, query.dtype), meta((batch, *heads, length, length), query.dtype)


#: ``ltorch.native_self_attention``: run whole by torch, in evaluation without grad only (the
#: kernel has no derivative), where eager's module runs it.
native_self_attention = opaque(
    "native_self_attention", _native_self_attention, meta=_native_self_attention_meta, autocast_inside=True
)


def _attention_forward_in_trace(
    self,
    query,
    key,
    value,
    key_padding_mask=None,
    need_weights=True,
    attn_mask=None,
    average_attn_weights=True,
    is_causal=False,
):
    if active_recorder() is None or not isinstance(query, TensorProxy):
        return _attention_forward(
            self, query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights, is_causal
        )
    if not _attention_is_fused(self, query, key, value, key_padding_mask, attn_mask):
        return _attention_forward(
            self, query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights, is_causal
        )
    # Eager's fast path: its masks made float (-inf where True), merged, and its fused kernel run
    # (bit for bit eager's; NaN where a query's every key is hidden, as the kernel gives).
    masks = _canonical_masks(attn_mask, key_padding_mask, query.dtype, ("attn_mask", "key_padding_mask"))
    merged, mask_type = self.merge_masks(*masks, query)
    options = dict(embed_dim=self.embed_dim, num_heads=self.num_heads, need_weights=need_weights)
    options.update(average_attn_weights=average_attn_weights)
    masks = {} if merged is None else dict(mask=merged, mask_type=mask_type)
    weights = (self.in_proj_weight, self.in_proj_bias, self.out_proj.weight, self.out_proj.bias)
    out = native_self_attention(query, *weights, **masks, **options)
    return out if need_weights else (out, None)


OVERRIDES[(nn.TransformerEncoder, "forward")] = _encoder_forward_in_trace
OVERRIDES[(nn.TransformerEncoderLayer, "forward")] = _layer_forward_in_trace
OVERRIDES[(nn.MultiheadAttention, "forward")] = _attention_forward_in_trace
