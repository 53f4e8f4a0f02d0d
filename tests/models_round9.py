"""The families of ``test_models_round9.py``: tiny Hugging Face configs built in code (nothing is
downloaded), each with the batch of a training step. Text families get a causal-LM (or masked-LM,
or replaced-token) batch with a padded second row; image families 32-pixel images with labels;
audio families a raw waveform with CTC labels."""

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F

import transformers as T

V = 99
TOKENS = dict(vocab_size=V, pad_token_id=0, bos_token_id=1, eos_token_id=2)
DEC = dict(
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_size=32,
    intermediate_size=64,
    max_position_embeddings=64,
    **TOKENS,
)
ENC = dict(
    num_hidden_layers=2,
    num_attention_heads=2,
    hidden_size=32,
    intermediate_size=64,
    max_position_embeddings=64,
    **TOKENS,
)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def causal_lm(step: int) -> dict:
    ids = torch.randint(3, V, (2, 8), generator=_generator(step))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    return dict(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))


def masked_lm(step: int) -> dict:
    g = _generator(step)
    ids = torch.randint(3, V, (2, 8), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    labels = ids.masked_fill(torch.rand(2, 8, generator=g) > 0.5, -100)
    return dict(input_ids=ids, attention_mask=mask, labels=labels)


def replaced_tokens(step: int) -> dict:
    g = _generator(step)
    ids = torch.randint(3, V, (2, 8), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    return dict(input_ids=ids, attention_mask=mask, labels=torch.randint(0, 2, (2, 8), generator=g))


def images(step: int) -> dict:
    return dict(pixel_values=torch.randn(2, 3, 32, 32, generator=_generator(step)), labels=torch.tensor([0, 2]))


def audio(step: int) -> dict:
    g = _generator(step)
    return dict(input_values=torch.randn(2, 800, generator=g), labels=torch.randint(1, 20, (2, 5), generator=g))


def padded_audio(step: int) -> dict:
    mask = torch.ones(2, 800, dtype=torch.long)
    mask[1, 600:] = 0
    return dict(audio(step), attention_mask=mask)


@dataclasses.dataclass(frozen=True)
class Family:
    build: Callable[[], torch.nn.Module]
    batch: Callable[[int], dict]


def _moe():
    experts = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
    return T.Qwen2MoeForCausalLM(T.Qwen2MoeConfig(decoder_sparse_step=1, output_router_logits=True, **experts, **DEC))


def _mixtral():
    experts = dict(num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=0.1, router_aux_loss_coef=0.02)
    return T.MixtralForCausalLM(T.MixtralConfig(output_router_logits=True, **experts, **DEC))


def _olmoe():
    experts = dict(num_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02)
    return T.OlmoeForCausalLM(T.OlmoeConfig(output_router_logits=True, **experts, **DEC))


def _granite():
    scales = dict(embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.3, logits_scaling=4.0)
    return T.GraniteForCausalLM(T.GraniteConfig(**scales, **DEC))


def _gemma2():
    config = T.Gemma2Config(
        head_dim=8, sliding_window=4, attn_logit_softcapping=50.0, final_logit_softcapping=30.0, **DEC
    )
    return T.Gemma2ForCausalLM(config)


def _gemma3():
    return T.Gemma3ForCausalLM(T.Gemma3TextConfig(head_dim=8, sliding_window=4, sliding_window_pattern=2, **DEC))


def _hubert(**masks):
    convolutions = dict(conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3))
    positions = dict(num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2)
    layers = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    config = T.HubertConfig(vocab_size=20, pad_token_id=0, **convolutions, **positions, **layers, **masks)
    return T.HubertForCTC(config)


AUDIO = dict(
    conv_dim=(16, 16),
    conv_stride=(5, 2),
    conv_kernel=(10, 3),
    num_conv_pos_embedding_groups=2,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    vocab_size=20,
    mask_time_prob=0.0,
    pad_token_id=0,
    layerdrop=0.0,
    feat_extract_norm="layer",  # (the group norm's models take no attention mask)
)


def _wavlm():
    buckets = dict(num_buckets=16, max_bucket_distance=40)
    return T.WavLMForCTC(T.WavLMConfig(num_conv_pos_embeddings=16, **buckets, **AUDIO))


def _conformer():
    conformer = dict(position_embeddings_type="rotary", conv_depthwise_kernel_size=3)
    return T.Wav2Vec2ConformerForCTC(T.Wav2Vec2ConformerConfig(num_conv_pos_embeddings=16, **conformer, **AUDIO))


def _beit():
    vision = dict(image_size=32, patch_size=8, num_hidden_layers=2, num_attention_heads=2, hidden_size=32)
    scales = dict(use_relative_position_bias=True, layer_scale_init_value=0.1, drop_path_rate=0.1)
    return T.BeitForImageClassification(T.BeitConfig(intermediate_size=64, num_labels=3, **scales, **vision))


def _efficientnet():
    config = T.EfficientNetConfig(
        image_size=32,
        width_coefficient=0.25,
        depth_coefficient=0.25,
        hidden_dim=320,
        drop_connect_rate=0.2,
        num_labels=3,
    )
    return T.EfficientNetForImageClassification(config)


class Classifier(torch.nn.Module):
    """A timm model with a cross-entropy loss, called as the Hugging Face classifiers are."""

    def __init__(self, name: str, **kwargs):
        super().__init__()
        import timm

        self.model = timm.create_model(name, pretrained=False, num_classes=3, **kwargs)

    def forward(self, pixel_values, labels):
        logits = self.model(pixel_values)
        return T.modeling_outputs.ImageClassifierOutput(loss=F.cross_entropy(logits, labels), logits=logits)


FAMILIES = {
    "qwen3": Family(lambda: T.Qwen3ForCausalLM(T.Qwen3Config(head_dim=8, **DEC)), causal_lm),
    "qwen2_moe": Family(_moe, causal_lm),
    "mixtral_jitter": Family(_mixtral, causal_lm),  # the router's logits multiplied by uniform noise
    "olmoe": Family(_olmoe, causal_lm),
    "granite": Family(_granite, causal_lm),
    "starcoder2": Family(lambda: T.Starcoder2ForCausalLM(T.Starcoder2Config(**DEC)), causal_lm),
    "gemma2": Family(_gemma2, causal_lm),
    "gemma3": Family(_gemma3, causal_lm),
    "phi3": Family(lambda: T.Phi3ForCausalLM(T.Phi3Config(**DEC)), causal_lm),
    "olmo2": Family(lambda: T.Olmo2ForCausalLM(T.Olmo2Config(**DEC)), causal_lm),
    "cohere": Family(lambda: T.CohereForCausalLM(T.CohereConfig(logit_scale=0.5, **DEC)), causal_lm),
    "deberta_v2": Family(
        lambda: T.DebertaV2ForMaskedLM(
            T.DebertaV2Config(relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=8, **ENC)
        ),
        masked_lm,
    ),
    "electra": Family(lambda: T.ElectraForPreTraining(T.ElectraConfig(embedding_size=16, **ENC)), replaced_tokens),
    # (no SpecAugment: its masks are drawn with numpy.random, which a trace refuses at the line)
    "hubert": Family(lambda: _hubert(mask_time_prob=0.0), audio),
    # SpecAugment's masks (numpy.random, between Dynamo's graphs) and the row put where they are
    "hubert_spec_augment": Family(lambda: _hubert(mask_time_prob=0.3, mask_time_length=2, layerdrop=0.0), audio),
    "wavlm": Family(_wavlm, padded_audio),  # gated relative position bias, a padded row
    "wav2vec2_conformer": Family(_conformer, padded_audio),
    "data2vec_audio": Family(
        lambda: T.Data2VecAudioForCTC(T.Data2VecAudioConfig(num_conv_pos_embeddings=5, **AUDIO)), padded_audio
    ),
    "beit": Family(_beit, images),
    "convnextv2": Family(
        lambda: T.ConvNextV2ForImageClassification(
            T.ConvNextV2Config(
                num_stages=2,
                hidden_sizes=[8, 16],
                depths=[1, 1],
                drop_path_rate=0.1,
                num_labels=3,
                problem_type="single_label_classification",
            )
        ),
        images,
    ),
    "efficientnet": Family(_efficientnet, images),
    "timm_mobilenetv3": Family(lambda: Classifier("mobilenetv3_small_050", drop_path_rate=0.1), images),
    "timm_efficientnet": Family(lambda: Classifier("efficientnet_b0", drop_path_rate=0.1, drop_rate=0.2), images),
    "timm_convnext": Family(lambda: Classifier("convnext_atto", drop_path_rate=0.1, ls_init_value=0.1), images),
    "timm_regnet": Family(lambda: Classifier("regnetx_002"), images),
}
