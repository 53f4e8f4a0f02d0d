"""The families of ``test_models_round13.py``: tiny Hugging Face configs built in code (nothing is
downloaded), each with the batch of a training step (the batches of ``models_round9``-``12``;
waveforms, spectrogram features and variable-resolution patches where a family needs them).
Families whose models give no loss (image and audio encoders, codecs, depth without labels) train
through ``Regressed``: the mean square of one of their outputs (plus the codec's own loss)."""

import dataclasses

import torch

import transformers as T

from models_round9 import DEC, ENC, V, Family, _generator, causal_lm, images, masked_lm
from models_round10 import MHA
from models_round12 import image_text

EXPERTS = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
LATENT = dict(q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
SLIDING = dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"])


@dataclasses.dataclass
class RegressedOutput(T.utils.ModelOutput):
    loss: torch.Tensor | None = None
    output: torch.Tensor | None = None


class Regressed(torch.nn.Module):
    """``model``'s output ``key`` regressed to one (its mean square distance, in float32), with the model's
    own loss (a codec's commitment and codebook losses) added where it gives one."""

    def __init__(self, model: torch.nn.Module, key: str):
        super().__init__()
        self.model, self.key = model, key

    def forward(self, **batch):
        out = self.model(**batch)
        value = out[self.key]
        loss = (value.float() - 1).pow(2).mean()
        if getattr(out, "loss", None) is not None:
            loss = loss + out.loss.float().mean()
        return RegressedOutput(loss=loss, output=value)


def _dots1():
    config = T.Dots1Config(n_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=1, **EXPERTS, **DEC)
    return T.Dots1ForCausalLM(config)


def _hunyuan_moe():
    config = T.HunYuanMoEV1Config(head_dim=8, num_experts=4, moe_topk=2, **DEC)
    return T.HunYuanMoEV1ForCausalLM(config)


def _flex_olmo():
    config = T.FlexOlmoConfig(num_experts=4, num_experts_per_tok=2, output_router_logits=True, **DEC)
    return T.FlexOlmoForCausalLM(config)


def _minicpm3():
    return T.MiniCPM3ForCausalLM(T.MiniCPM3Config(**LATENT, **MHA))


def _llama4():
    layers = dict(no_rope_layers=[1, 0], moe_layers=[1], interleave_moe_layer_step=2, attention_chunk_size=4)
    experts = dict(num_local_experts=4, num_experts_per_tok=1, intermediate_size_mlp=64)
    return T.Llama4ForCausalLM(T.Llama4TextConfig(head_dim=8, **layers, **experts, **DEC))


def _afmoe():
    experts = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, num_dense_layers=1)
    return T.AfmoeForCausalLM(T.AfmoeConfig(head_dim=8, sliding_window=4, **experts, **DEC))


def _glm4_moe_lite():
    routing = dict(n_group=1, topk_group=1, first_k_dense_replace=1)
    return T.Glm4MoeLiteForCausalLM(T.Glm4MoeLiteConfig(**LATENT, **routing, **EXPERTS, **MHA))


def _modernbert_decoder():
    config = T.ModernBertDecoderConfig(local_attention=4, global_attn_every_n_layers=2, **ENC)
    return T.ModernBertDecoderForCausalLM(config)


def _exaone_moe():
    experts = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    return T.ExaoneMoeForCausalLM(T.ExaoneMoeConfig(head_dim=8, **experts, **DEC))


def _cohere2_moe():
    config = T.Cohere2MoeConfig(head_dim=8, num_experts=4, num_experts_per_tok=2, sliding_window=4, **DEC)
    return T.Cohere2MoeForCausalLM(config)


def _qwen3_5():
    linear = dict(linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8)
    config = T.Qwen3_5TextConfig(head_dim=8, layer_types=["linear_attention", "full_attention"], **linear, **DEC)
    return T.Qwen3_5ForCausalLM(config)


def spectrogram_ctc(step: int) -> dict:
    g = _generator(step)
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, 15:] = 0
    features = torch.randn(2, 20, 16, generator=g)
    return dict(input_features=features, attention_mask=mask, labels=torch.randint(1, 20, (2, 3), generator=g))


def _parakeet():
    encoder = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    encoder.update(conv_kernel_size=3, subsampling_factor=4, subsampling_conv_channels=8, num_mel_bins=16)
    return T.ParakeetForCTC(T.ParakeetCTCConfig(vocab_size=20, encoder_config=encoder, pad_token_id=0))


def _textnet():
    config = T.TextNetConfig(
        stem_out_channels=8,
        hidden_sizes=[8, 16, 16, 32, 32],
        conv_layer_kernel_sizes=[[[3, 3]], [[1, 3]], [[3, 1]], [[3, 3]]],
        conv_layer_strides=[[1], [2], [2], [2]],
        num_labels=3,
    )
    return T.TextNetForImageClassification(config)


def _hgnet_v2():
    stages = dict(stage_in_channels=[8, 16, 16, 32], stage_mid_channels=[8, 8, 16, 16])
    stages.update(stage_out_channels=[16, 16, 32, 32], stage_num_blocks=[1, 1, 1, 1], stage_numb_of_layers=[2] * 4)
    stages.update(stage_light_block=[False, False, True, True], stage_kernel_size=[3, 3, 5, 5])
    stages.update(stage_downsample=[False, True, True, True], stage_downsample_strides=[2] * 4)
    config = T.HGNetV2Config(
        stem_channels=[3, 8, 8],
        hidden_sizes=[16, 16, 32, 32],
        depths=[1, 1, 1, 1],
        embedding_size=8,
        num_labels=3,
        use_learnable_affine_block=True,
        **stages,
    )
    return T.HGNetV2ForImageClassification(config)


def pixels(step: int) -> dict:
    return dict(pixel_values=torch.randn(2, 3, 32, 32, generator=_generator(step)))


def _aimv2():
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    model = T.Aimv2VisionModel(T.Aimv2VisionConfig(image_size=32, patch_size=8, use_head=True, **vision))
    return Regressed(model, "pooler_output")


def _sam():
    vision = dict(hidden_size=32, output_channels=16, num_hidden_layers=2, num_attention_heads=2, mlp_dim=64)
    config = T.SamVisionConfig(image_size=32, patch_size=4, window_size=4, global_attn_indexes=[1], **vision)
    return Regressed(T.SamVisionModel(config), "last_hidden_state")


def small_pixels(step: int) -> dict:
    return dict(pixel_values=torch.randn(2, 3, 28, 28, generator=_generator(step)))


def _depth_anything():
    stages = ["stage1", "stage2", "stage3", "stage4"]
    backbone = T.Dinov2Config(
        image_size=28,
        patch_size=14,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=64,
        out_features=stages,
        reshape_hidden_states=False,
    )
    config = T.DepthAnythingConfig(
        backbone_config=backbone,
        patch_size=14,
        reassemble_hidden_size=32,
        neck_hidden_sizes=[8, 16, 16, 32],
        fusion_hidden_size=16,
        head_hidden_size=8,
    )
    return Regressed(T.DepthAnythingForDepthEstimation(config), "predicted_depth")


def waveforms(step: int) -> dict:
    return dict(input_values=torch.randn(2, 1, 64, generator=_generator(step)))


def _dac():
    config = T.DacConfig(
        encoder_hidden_size=4,
        downsampling_ratios=[2, 2],
        decoder_hidden_size=16,
        n_codebooks=2,
        codebook_size=16,
        codebook_dim=4,
        hidden_size=16,
    )
    return Regressed(T.DacModel(config), "audio_values")


def _mimi():
    config = T.MimiConfig(
        sampling_rate=100,
        hidden_size=16,
        num_filters=4,
        upsampling_ratios=[2, 2],
        upsample_groups=16,
        codebook_size=16,
        codebook_dim=16,
        vector_quantization_hidden_dimension=16,
        num_quantizers=2,
        num_semantic_quantizers=1,
        num_hidden_layers=1,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        sliding_window=8,
    )
    return Regressed(T.MimiModel(config), "audio_values")


def variable_resolution(step: int) -> dict:
    """SigLIP2's NaFlex batch: 16 patches a row (the second image 3 x 4 of them, padded)."""
    b = image_text(step)
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 12:] = 0
    shapes = torch.tensor([[4, 4], [3, 4]])
    patches = torch.randn(2, 16, 48, generator=_generator(step))
    return dict(b, pixel_values=patches, pixel_attention_mask=mask, spatial_shapes=shapes)


def _siglip2():
    text = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    config = T.Siglip2Config(
        text_config=dict(text, max_position_embeddings=64), vision_config=dict(vision, num_patches=16, patch_size=4)
    )
    return T.Siglip2Model(config)


FAMILIES = {
    "dots1": Family(_dots1, causal_lm),
    "hunyuan_v1_dense": Family(
        lambda: T.HunYuanDenseV1ForCausalLM(T.HunYuanDenseV1Config(head_dim=8, **DEC)), causal_lm
    ),
    "hunyuan_v1_moe": Family(_hunyuan_moe, causal_lm),
    "olmo3": Family(lambda: T.Olmo3ForCausalLM(T.Olmo3Config(**SLIDING, **DEC)), causal_lm),
    "seed_oss": Family(lambda: T.SeedOssForCausalLM(T.SeedOssConfig(head_dim=8, **DEC)), causal_lm),
    "flex_olmo": Family(_flex_olmo, causal_lm),
    "minicpm3": Family(_minicpm3, causal_lm),
    "bitnet": Family(lambda: T.BitNetForCausalLM(T.BitNetConfig(**DEC)), causal_lm),
    "llama4": Family(_llama4, causal_lm),
    "afmoe": Family(_afmoe, causal_lm),
    "glm4_moe_lite": Family(_glm4_moe_lite, causal_lm),
    "ministral": Family(lambda: T.MinistralForCausalLM(T.MinistralConfig(head_dim=8, **SLIDING, **DEC)), causal_lm),
    "nanochat": Family(lambda: T.NanoChatForCausalLM(T.NanoChatConfig(**DEC)), causal_lm),
    "modernbert_decoder": Family(_modernbert_decoder, causal_lm),
    "exaone_moe": Family(_exaone_moe, causal_lm),
    "cohere2_moe": Family(_cohere2_moe, causal_lm),
    "jais2": Family(lambda: T.Jais2ForCausalLM(T.Jais2Config(**DEC)), causal_lm),
    "olmo_hybrid": Family(lambda: T.OlmoHybridForCausalLM(T.OlmoHybridConfig(**DEC)), causal_lm),
    "qwen3_5": Family(_qwen3_5, causal_lm),
    "ernie4_5": Family(lambda: T.Ernie4_5ForCausalLM(T.Ernie4_5Config(head_dim=8, **DEC)), causal_lm),
    "nomic_bert": Family(lambda: T.NomicBertForMaskedLM(T.NomicBertConfig(**ENC)), masked_lm),
    "xlm_roberta_xl": Family(lambda: T.XLMRobertaXLForMaskedLM(T.XLMRobertaXLConfig(**ENC)), masked_lm),
    "eurobert": Family(lambda: T.EuroBertForMaskedLM(T.EuroBertConfig(**DEC)), masked_lm),
    "parakeet": Family(_parakeet, spectrogram_ctc),
    "textnet": Family(_textnet, images),
    "hgnet_v2": Family(_hgnet_v2, images),
    "aimv2": Family(_aimv2, pixels),
    "sam": Family(_sam, pixels),
    "depth_anything": Family(_depth_anything, small_pixels),
    "dac": Family(_dac, waveforms),
    "mimi": Family(_mimi, waveforms),
    "siglip2": Family(_siglip2, variable_resolution),
}
