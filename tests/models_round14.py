"""The families of ``test_models_round14.py``: tiny Hugging Face configs built in code (nothing is
downloaded), each with the batch of a training step (the batches of ``models_round9``-``13``; boxes
and classes for the detectors, images with prompts for the vision-language models, codebook rows
for MusicGen). Families whose models give no loss train through ``Regressed`` (``models_round13``)."""

import dataclasses

import torch

import transformers as T

from models_round9 import DEC, ENC, V, Family, _generator, causal_lm, masked_lm
from models_round10 import MHA, seq2seq
from models_round13 import Regressed, pixels

LATENT = dict(q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)


def _mistral4():
    experts = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1)
    return T.Mistral4ForCausalLM(T.Mistral4Config(**LATENT, **experts, **MHA))


def _minimax_m2():
    experts = dict(num_local_experts=4, num_experts_per_tok=2)
    return T.MiniMaxM2ForCausalLM(T.MiniMaxM2Config(head_dim=8, output_router_logits=True, **experts, **DEC))


def _longcat_flash():
    """Zero experts (the identity) routed beside real ones, two attentions and MLPs a layer."""
    config = T.LongcatFlashConfig(
        num_layers=1,
        ffn_hidden_size=64,
        moe_topk=2,
        n_routed_experts=4,
        zero_expert_num=2,
        expert_ffn_hidden_size=32,
        head_dim=4,
        **LATENT,
        **{k: v for k, v in MHA.items() if k not in ("num_hidden_layers", "intermediate_size")},
    )
    return T.LongcatFlashForCausalLM(config)


def _deepseek_v32():
    """DeepSeek sparse attention: an indexer picks each query's top keys (``index_topk``)."""
    experts = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1)
    routing = dict(n_group=2, topk_group=1, first_k_dense_replace=1)
    indexer = dict(index_topk=4, index_head_dim=8, index_n_heads=2)
    config = T.DeepseekV32Config(**LATENT, **experts, **routing, **indexer, **MHA)
    return T.DeepseekV32ForCausalLM(config)


def fsmt_batch(step: int) -> dict:
    """FSMT's decoder reads the labels as given (no shift): its inputs start from EOS."""
    b = seq2seq(step)
    return dict(b, decoder_input_ids=torch.cat([torch.full((2, 1), 2), b["labels"][:, :-1]], 1))


@dataclasses.dataclass
class DetectedOutput(T.utils.ModelOutput):
    loss: torch.Tensor | None = None
    output: torch.Tensor | None = None
    pred_boxes: torch.Tensor | None = None


class Detected(torch.nn.Module):
    """A detector trained without its Hungarian matcher (SciPy on the host): its class logits'
    mean square and its boxes' distance from the image's centre."""

    def __init__(self, model: torch.nn.Module, key: str = "logits"):
        super().__init__()
        self.model, self.key = model, key

    def forward(self, **batch):
        out = self.model(**batch)
        loss = out[self.key].float().pow(2).mean()
        if getattr(out, "pred_boxes", None) is not None:
            loss = loss + (out.pred_boxes.float() - 0.5).pow(2).mean()
        return DetectedOutput(loss=loss, output=out[self.key], pred_boxes=getattr(out, "pred_boxes", None))


def _resnet(**kwargs):
    return T.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", **kwargs)


DETR = dict(
    num_queries=4,
    encoder_layers=1,
    decoder_layers=2,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    d_model=16,
    num_labels=3,
    auxiliary_loss=True,
)


def _detr():
    config = T.DetrConfig(backbone_config=_resnet(out_features=["stage2"]), **DETR)
    return Detected(T.DetrForObjectDetection(config))


def _conditional_detr():
    config = T.ConditionalDetrConfig(backbone_config=_resnet(out_features=["stage2"]), **DETR)
    return Detected(T.ConditionalDetrForObjectDetection(config))


def _table_transformer():
    config = T.TableTransformerConfig(backbone_config=_resnet(out_features=["stage2"]), **DETR)
    return Detected(T.TableTransformerForObjectDetection(config))


def _dab_detr():
    dab = {k: v for k, v in DETR.items() if k != "d_model"}
    config = T.DabDetrConfig(backbone_config=_resnet(out_features=["stage2"]), hidden_size=16, **dab)
    return Detected(T.DabDetrForObjectDetection(config))


def _rt_detr():
    """RT-DETR: a hybrid encoder (attention on the coarsest level, convolutions across levels) and
    a deformable decoder whose queries are the encoder's top-scoring anchors."""
    backbone = T.RTDetrResNetConfig(
        embedding_size=8,
        hidden_sizes=[8, 16, 16, 32],
        depths=[1, 1, 1, 1],
        layer_type="basic",
        out_features=["stage2", "stage3", "stage4"],
    )
    config = T.RTDetrConfig(
        backbone_config=backbone,
        encoder_in_channels=[16, 16, 32],
        encoder_hidden_dim=16,
        encoder_ffn_dim=32,
        encoder_attention_heads=2,
        d_model=16,
        decoder_in_channels=[16, 16, 16],
        decoder_ffn_dim=32,
        decoder_attention_heads=2,
        decoder_layers=2,
        decoder_n_points=2,
        num_queries=4,
        num_denoising=0,
        num_labels=3,
    )
    return Detected(T.RTDetrForObjectDetection(config))


def _deformable_detr():
    """Multi-scale deformable attention: ``grid_sample`` at offsets the queries predict."""
    deformable = dict(num_feature_levels=2, encoder_n_points=2, decoder_n_points=2, with_box_refine=True)
    deformable.update(d_model=32)  # (its input projections' group norms: 32 groups)
    backbone = _resnet(out_features=["stage1", "stage2"])
    config = T.DeformableDetrConfig(
        backbone_config=backbone, **deformable, **{k: v for k, v in DETR.items() if k != "d_model"}
    )
    return Detected(T.DeformableDetrForObjectDetection(config))


def _dinov3_vit():
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    config = T.DINOv3ViTConfig(image_size=32, patch_size=8, num_register_tokens=2, layerscale_value=0.1, **vision)
    return Regressed(T.DINOv3ViTModel(config), "pooler_output")


def _dinov3_convnext():
    config = T.DINOv3ConvNextConfig(hidden_sizes=[8, 16, 16, 32], depths=[1, 1, 1, 1], drop_path_rate=0.1)
    return Regressed(T.DINOv3ConvNextModel(config), "pooler_output")


def _vitpose():
    vit = dict(image_size=[32, 24], patch_size=[8, 8], hidden_size=32, num_hidden_layers=2, num_attention_heads=2)
    backbone = T.VitPoseBackboneConfig(mlp_ratio=2, out_indices=[2], **vit)
    config = T.VitPoseConfig(backbone_config=backbone, use_simple_decoder=True, num_labels=4)
    return Regressed(T.VitPoseForPoseEstimation(config), "heatmaps")


def large_pixels(step: int) -> dict:
    return dict(pixel_values=torch.randn(2, 3, 64, 64, generator=_generator(step)))


def poses(step: int) -> dict:
    return dict(pixel_values=torch.randn(2, 3, 32, 24, generator=_generator(step)))


GEMMA = dict(head_dim=8, **DEC)
SIGLIP = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=16, patch_size=4
)
IMAGE = 98  # (the image token of every vision-language family here)


def _paligemma():
    config = T.PaliGemmaConfig(
        text_config=T.GemmaConfig(**GEMMA), vision_config=T.SiglipVisionConfig(**SIGLIP), image_token_index=IMAGE
    )
    config.vision_config.projection_dim = 32
    return T.PaliGemmaForConditionalGeneration(config)


def prefixed_images(step: int) -> dict:
    """PaliGemma's: 16 image tokens and a prefix attended both ways, then a suffix learned causally."""
    g = _generator(step)
    text = torch.randint(3, 90, (2, 8), generator=g)
    ids = torch.cat([torch.full((2, 16), IMAGE), torch.ones(2, 1, dtype=torch.long), text], 1)
    types = torch.zeros_like(ids)
    types[:, 21:] = 1
    labels = ids.masked_fill(types == 0, -100)
    images = torch.randn(2, 3, 16, 16, generator=g)
    return dict(input_ids=ids, token_type_ids=types, labels=labels, pixel_values=images)


def _qwen2_vl():
    rope = dict(rope_type="default", mrope_section=[2, 1, 1], rope_theta=10000.0)
    text = T.Qwen2VLTextConfig(head_dim=8, rope_parameters=rope, **DEC)
    vision = dict(embed_dim=16, depth=1, num_heads=2, hidden_size=32, patch_size=4, mlp_ratio=2)
    tokens = dict(image_token_id=IMAGE, video_token_id=97, vision_start_token_id=95, vision_end_token_id=96)
    config = T.Qwen2VLConfig(text_config=text, vision_config=vision, **tokens)
    return T.Qwen2VLForConditionalGeneration(config)


def grid_patches(step: int) -> dict:
    """Qwen2-VL's: each image 4 x 4 patches of 2 frames (merged 2 x 2: 4 image tokens), with 3D positions."""
    g = _generator(step)
    text = torch.randint(3, 90, (2, 6), generator=g)
    vision = torch.tensor([[95, IMAGE, IMAGE, IMAGE, IMAGE, 96]]).expand(2, 6)
    ids = torch.cat([vision, text], 1)
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    types = (ids == IMAGE).int()
    patches = torch.randn(32, 3 * 2 * 4 * 4, generator=g)
    labels = ids.masked_fill((mask == 0) | (types == 1), -100)
    grid = torch.tensor([[1, 4, 4], [1, 4, 4]])
    return dict(
        input_ids=ids,
        attention_mask=mask,
        mm_token_type_ids=types,
        pixel_values=patches,
        image_grid_thw=grid,
        labels=labels,
    )


def _qwen2_5_vl():
    """Qwen2.5-VL's vision blocks attend within 2 x 2 windows of merged patches but its last."""
    rope = dict(rope_type="default", mrope_section=[2, 1, 1], rope_theta=10000.0)
    text = T.Qwen2_5_VLTextConfig(head_dim=8, rope_parameters=rope, **DEC)
    vision = dict(hidden_size=16, depth=2, num_heads=2, intermediate_size=32, out_hidden_size=32, patch_size=4)
    vision.update(window_size=16, fullatt_block_indexes=[1])
    tokens = dict(image_token_id=IMAGE, video_token_id=97, vision_start_token_id=95, vision_end_token_id=96)
    return T.Qwen2_5_VLForConditionalGeneration(T.Qwen2_5_VLConfig(text_config=text, vision_config=vision, **tokens))


def windowed_patches(step: int) -> dict:
    """Qwen2.5-VL's: each image 8 x 8 patches (merged: 16 image tokens)."""
    b = grid_patches(step)
    ids = torch.cat([b["input_ids"][:, :1], torch.full((2, 12), IMAGE), b["input_ids"][:, 1:]], 1)
    mask = torch.cat([torch.ones(2, 12, dtype=torch.long), b["attention_mask"]], 1)
    types = (ids == IMAGE).int()
    labels = ids.masked_fill((mask == 0) | (types == 1), -100)
    patches = torch.randn(128, 3 * 2 * 4 * 4, generator=_generator(step))
    grid = torch.tensor([[1, 8, 8], [1, 8, 8]])
    return dict(
        b,
        input_ids=ids,
        attention_mask=mask,
        mm_token_type_ids=types,
        labels=labels,
        pixel_values=patches,
        image_grid_thw=grid,
    )


def _idefics3(cls=T.Idefics3ForConditionalGeneration, config_cls=T.Idefics3Config):
    text = T.LlamaConfig(head_dim=8, **DEC)
    vision = dict(SIGLIP, num_hidden_layers=2)
    return cls(config_cls(text_config=text, vision_config=vision, image_token_id=IMAGE, scale_factor=2))


def shuffled_pixels(step: int) -> dict:
    """Idefics3's and SmolVLM's: one 16-pixel image a row, its 16 patches shuffled into 4 tokens."""
    g = _generator(step)
    text = torch.randint(3, 90, (2, 6), generator=g)
    ids = torch.cat([torch.full((2, 4), IMAGE), text], 1)
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    labels = ids.masked_fill((mask == 0) | (ids == IMAGE), -100)
    return dict(
        input_ids=ids, attention_mask=mask, labels=labels, pixel_values=torch.randn(2, 1, 3, 16, 16, generator=g)
    )


def _blip_2():
    qformer = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    text = T.OPTConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=2, word_embed_proj_dim=32
    )
    config = T.Blip2Config(
        vision_config=dict(SIGLIP, num_hidden_layers=2),
        qformer_config=dict(qformer, encoder_hidden_size=32),
        text_config=text,
        num_query_tokens=4,
        image_token_index=IMAGE,
    )
    return T.Blip2ForConditionalGeneration(config)


def queried_images(step: int) -> dict:
    b = shuffled_pixels(step)
    return dict(b, pixel_values=b["pixel_values"][:, 0])


def _musicgen():
    config = T.MusicgenDecoderConfig(
        vocab_size=32,
        num_codebooks=2,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=32,
        bos_token_id=32,
    )
    return T.MusicgenForCausalLM(config)


def codebooks(step: int) -> dict:
    """MusicGen's: two codebooks a row (its input rows are batch x codebook), labels a codebook a column."""
    g = _generator(step)
    codes = torch.randint(0, 32, (2, 8, 2), generator=g)
    return dict(input_ids=codes.transpose(1, 2).reshape(4, 8), labels=codes)


def _univnet():
    config = T.UnivNetConfig(
        model_in_channels=8,
        model_hidden_channels=8,
        num_mel_bins=16,
        resblock_kernel_sizes=[3],
        resblock_stride_sizes=[4],
        resblock_dilation_sizes=[[1, 3]],
        kernel_predictor_num_blocks=1,
        kernel_predictor_hidden_channels=8,
    )
    return Regressed(T.UnivNetModel(config), "waveforms")


def mel_and_noise(step: int) -> dict:
    g = _generator(step)
    return dict(input_features=torch.randn(2, 6, 16, generator=g), noise_sequence=torch.randn(2, 6, 8, generator=g))


FAMILIES = {
    "glm": Family(lambda: T.GlmForCausalLM(T.GlmConfig(head_dim=8, **DEC)), causal_lm),
    "cwm": Family(
        lambda: T.CwmForCausalLM(
            T.CwmConfig(head_dim=8, sliding_window=4, layer_types=["sliding_attention", "full_attention"], **DEC)
        ),
        causal_lm,
    ),
    "ministral3": Family(
        lambda: T.Ministral3ForCausalLM(T.Ministral3Config(head_dim=8, sliding_window=4, **DEC)), causal_lm
    ),
    "mistral4": Family(_mistral4, causal_lm),
    "minimax_m2": Family(_minimax_m2, causal_lm),
    "longcat_flash": Family(_longcat_flash, causal_lm),
    "deepseek_v32": Family(_deepseek_v32, causal_lm),
    "openai_gpt": Family(
        lambda: T.OpenAIGPTLMHeadModel(T.OpenAIGPTConfig(vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=2)),
        causal_lm,
    ),
    "mra": Family(
        lambda: T.MraForMaskedLM(
            T.MraConfig(block_per_row=2, approx_mode="full", initial_prior_first_n_blocks=0, **ENC)
        ),
        masked_lm,
    ),
    "fsmt": Family(
        lambda: T.FSMTForConditionalGeneration(
            T.FSMTConfig(
                src_vocab_size=V,
                tgt_vocab_size=V,
                d_model=32,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=2,
                decoder_attention_heads=2,
                encoder_ffn_dim=64,
                decoder_ffn_dim=64,
                max_position_embeddings=64,
                langs=["en", "de"],
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
                decoder_start_token_id=2,
            )
        ),
        fsmt_batch,
    ),
    "detr": Family(_detr, pixels),
    "conditional_detr": Family(_conditional_detr, pixels),
    "table_transformer": Family(_table_transformer, pixels),
    "dab_detr": Family(_dab_detr, pixels),
    "deformable_detr": Family(_deformable_detr, pixels),
    "rt_detr": Family(_rt_detr, large_pixels),
    "dinov3_vit": Family(_dinov3_vit, pixels),
    "dinov3_convnext": Family(_dinov3_convnext, pixels),
    "vitpose": Family(_vitpose, poses),
    "paligemma": Family(_paligemma, prefixed_images),
    "qwen2_vl": Family(_qwen2_vl, grid_patches),
    "qwen2_5_vl": Family(_qwen2_5_vl, windowed_patches),
    "idefics3": Family(_idefics3, shuffled_pixels),
    "smolvlm": Family(lambda: _idefics3(T.SmolVLMForConditionalGeneration, T.SmolVLMConfig), shuffled_pixels),
    "blip_2": Family(_blip_2, queried_images),
    "musicgen": Family(_musicgen, codebooks),
    "univnet": Family(_univnet, mel_and_noise),
}
