"""``nn.TransformerEncoder`` while tracing: the results of eager's nested-tensor fast path.

In evaluation without grad, given a ``src_key_padding_mask`` and ``enable_nested_tensor``, eager's
encoder packs the batch into a nested tensor of the unpadded tokens, runs the layers on it and pads
the result back with zeros: the padded positions come out as 0 (then the final norm of 0), not as
the layers' values there. It does so only when the mask is left-aligned (each row's tokens first),
which it checks by value on each call. Tracing cannot take that path (proxies override torch
functions, and ``is_compiling()`` makes the encoder skip the check), so the trace runs the layers
with the padding mask, as eager's other path does, and zeroes the padded positions where the mask
is left-aligned: one trace for both of eager's paths, chosen per call by the mask's values.

The kept tokens' values are those of the layers' slow path, within rounding of eager's fused
kernels (as for a layer's own fast path). ``mask_check=False`` nests any mask as if it were
left-aligned (eager then packs each row's first tokens, whichever were masked): refused.
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

__all__: list[str] = []

_encoder_forward = nn.TransformerEncoder.forward
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


def _nests(encoder, src, mask, src_key_padding_mask) -> bool:
    """Whether eager's ``TransformerEncoder.forward`` nests the batch when the mask is
    left-aligned: its conditions but that one, which it checks by value."""
    first = encoder.layers[0]
    if not torch.backends.mha.get_fastpath_enabled() or not getattr(encoder, "use_nested_tensor", False):
        return False
    if first.training or src.dim() != 3 or src_key_padding_mask is None or mask is not None:
        return False
    if torch.is_autocast_enabled() or src.device.type not in _FAST_DEVICES:
        return False
    tensors = (src, *_first_layer_tensors(first))
    return not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors))


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


OVERRIDES[(nn.TransformerEncoder, "forward")] = _encoder_forward_in_trace
