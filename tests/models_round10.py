"""The families of ``test_models_round10.py``: tiny Hugging Face configs built in code (nothing is
downloaded), each with the batch of a training step (the batches of ``models_round9``, and a
sequence-to-sequence one with decoder labels, and log-mel features for Speech2Text)."""

import torch

import transformers as T

from models_round9 import AUDIO, DEC, ENC, TOKENS, V, Family, causal_lm, images, masked_lm, padded_audio, _generator


def seq2seq(step: int) -> dict:
    g = _generator(step)
    ids = torch.randint(3, V, (2, 8), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    return dict(input_ids=ids, attention_mask=mask, labels=torch.randint(3, V, (2, 6), generator=g))


def unmasked_lm(step: int) -> dict:
    """Nystromformer's landmark attention adds a mask of every key to scores over the landmarks."""
    batch = masked_lm(step)
    del batch["attention_mask"]
    return batch


def large_images(step: int) -> dict:
    return dict(pixel_values=torch.randn(2, 3, 64, 64, generator=_generator(step)), labels=torch.tensor([0, 2]))


def speech_features(step: int) -> dict:
    g = _generator(step)
    mask = torch.ones(2, 24, dtype=torch.long)
    mask[1, 16:] = 0
    features = torch.randn(2, 24, 16, generator=g)
    return dict(input_features=features, attention_mask=mask, labels=torch.randint(3, V, (2, 5), generator=g))


MHA = {k: v for k, v in DEC.items() if k != "num_key_value_heads"}  # (Persimmon has no grouped heads)
BART = dict(
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    decoder_start_token_id=2,
    **TOKENS,
)


def _led():
    config = T.LEDConfig(
        attention_window=4, max_encoder_position_embeddings=64, max_decoder_position_embeddings=64, **BART
    )
    return T.LEDForConditionalGeneration(config)


def _speech_to_text():
    subsampler = dict(num_conv_layers=2, conv_kernel_sizes=(5, 5), conv_channels=16, input_feat_per_channel=16)
    config = T.Speech2TextConfig(max_source_positions=64, max_target_positions=64, **subsampler, **BART)
    return T.Speech2TextForConditionalGeneration(config)


def _granitemoe():
    scales = dict(embedding_multiplier=2.0, residual_multiplier=0.5)
    return T.GraniteMoeForCausalLM(T.GraniteMoeConfig(num_local_experts=4, num_experts_per_tok=2, **scales, **DEC))


def _qwen3_moe():
    experts = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    return T.Qwen3MoeForCausalLM(T.Qwen3MoeConfig(head_dim=8, **experts, **DEC))


def _pegasus_x():
    config = T.PegasusXConfig(block_size=4, num_global_tokens=2, max_position_embeddings=64, **BART)
    return T.PegasusXForConditionalGeneration(config)


def _swinv2():
    config = T.Swinv2Config(
        image_size=32,
        patch_size=4,
        embed_dim=16,
        depths=[1, 1],
        num_heads=[2, 2],
        window_size=4,
        drop_path_rate=0.1,
        num_labels=3,
    )
    return T.Swinv2ForImageClassification(config)


def _rwkv():
    config = T.RwkvConfig(
        vocab_size=V,
        context_length=16,
        hidden_size=32,
        num_hidden_layers=2,
        attention_hidden_size=32,
        intermediate_size=64,
        rescale_every=0,
    )
    return T.RwkvForCausalLM(config)


FAMILIES = {
    # sinusoidal positions offset by the padding index
    "xglm": Family(
        lambda: T.XGLMForCausalLM(
            T.XGLMConfig(d_model=32, num_layers=2, attention_heads=4, ffn_dim=64, max_position_embeddings=64, **TOKENS)
        ),
        causal_lm,
    ),
    # the time-mix recurrence in Python (no CUDA kernel), its state per token
    "rwkv": Family(_rwkv, causal_lm),
    # queries, keys and values clamped (clip_qkv)
    "olmo": Family(lambda: T.OlmoForCausalLM(T.OlmoConfig(clip_qkv=1.0, **DEC)), causal_lm),
    # LayerNorm1P and squared ReLU
    "nemotron": Family(lambda: T.NemotronForCausalLM(T.NemotronConfig(head_dim=8, **DEC)), causal_lm),
    # differential attention: two softmaxes subtracted, lambda re-parametrised
    "diffllama": Family(lambda: T.DiffLlamaForCausalLM(T.DiffLlamaConfig(**DEC)), causal_lm),
    # attention sinks, a sliding window every other layer, clamped SwiGLU experts
    "gpt_oss": Family(
        lambda: T.GptOssForCausalLM(
            T.GptOssConfig(num_local_experts=4, num_experts_per_tok=2, head_dim=8, sliding_window=4, **DEC)
        ),
        causal_lm,
    ),
    # the selective scan's slow path, RMS norms of B, C and dt
    "falcon_mamba": Family(
        lambda: T.FalconMambaForCausalLM(
            T.FalconMambaConfig(
                vocab_size=V,
                hidden_size=32,
                state_size=8,
                num_hidden_layers=2,
                expand=2,
                conv_kernel=4,
                time_step_rank=4,
                use_mambapy=False,
            )
        ),
        causal_lm,
    ),
    # a parallel-experts router with multipliers
    "granitemoe": Family(_granitemoe, causal_lm),
    # sliding and global layers interleaved, parallel blocks
    "cohere2": Family(lambda: T.Cohere2ForCausalLM(T.Cohere2Config(sliding_window=4, head_dim=8, **DEC)), causal_lm),
    "helium": Family(lambda: T.HeliumForCausalLM(T.HeliumConfig(head_dim=8, **DEC)), causal_lm),
    # partial rotary with query-key LayerNorms
    "persimmon": Family(lambda: T.PersimmonForCausalLM(T.PersimmonConfig(**MHA)), causal_lm),
    "qwen3_moe": Family(_qwen3_moe, causal_lm),
    # Longformer's banded and global attention in an encoder-decoder
    "led": Family(_led, seq2seq),
    "pegasus_x": Family(_pegasus_x, seq2seq),  # blocks of 4 tokens and 2 global tokens
    # a convolutional subsampler of log-mel features, a padded row
    "speech_to_text": Family(_speech_to_text, speech_features),
    # NoNorm, bottlenecks, a prediction head adding its bias in place
    "mobilebert": Family(
        lambda: T.MobileBertForMaskedLM(
            T.MobileBertConfig(
                embedding_size=16, intra_bottleneck_size=16, num_feedforward_networks=2, true_hidden_size=16, **ENC
            )
        ),
        masked_lm,
    ),
    # landmark attention with an iterative pseudo-inverse
    "nystromformer": Family(
        lambda: T.NystromformerForMaskedLM(
            T.NystromformerConfig(num_landmarks=4, segment_means_seq_len=8, conv_kernel_size=3, **ENC)
        ),
        unmasked_lm,
    ),
    # squeezed sequence, DeBERTa's disentangled attention on audio
    "sew_d": Family(
        lambda: T.SEWDForCTC(
            T.SEWDConfig(
                num_conv_pos_embeddings=16, squeeze_factor=2, position_buckets=16, max_position_embeddings=64, **AUDIO
            )
        ),
        padded_audio,
    ),
    # speaker-aware wav2vec2, a padded row
    "unispeech_sat": Family(
        lambda: T.UniSpeechSatForCTC(T.UniSpeechSatConfig(num_conv_pos_embeddings=16, **AUDIO)), padded_audio
    ),
    # cosine attention with a log-spaced continuous position bias
    "swinv2": Family(_swinv2, images),
    # convolutional projections with batch norms, a class token in the last stage
    "cvt": Family(
        lambda: T.CvtForImageClassification(
            T.CvtConfig(
                embed_dim=[8, 8, 16],
                num_heads=[1, 1, 2],
                depth=[1, 2, 3],
                patch_sizes=[7, 3, 3],
                patch_stride=[4, 2, 2],
                patch_padding=[2, 1, 1],
                mlp_ratio=[2.0, 2.0, 2.0],
                drop_path_rate=[0.0, 0.0, 0.1],
                num_labels=3,
            )
        ),
        images,
    ),
    # separable linear attention over unfolded patches
    "mobilevitv2": Family(
        lambda: T.MobileViTV2ForImageClassification(
            T.MobileViTV2Config(image_size=64, width_multiplier=0.25, num_labels=3)
        ),
        large_images,
    ),
    # spatial-reduction attention, overlapping patch embeddings
    "pvt_v2": Family(
        lambda: T.PvtV2ForImageClassification(
            T.PvtV2Config(
                image_size=32,
                hidden_sizes=[8, 16],
                depths=[1, 1],
                num_attention_heads=[1, 2],
                sr_ratios=[2, 1],
                num_encoder_blocks=2,
                patch_sizes=[7, 3],
                strides=[4, 2],
                mlp_ratios=[2, 2],
                drop_path_rate=0.1,
                num_labels=3,
            )
        ),
        images,
    ),
}
