"""The families of ``test_models_round11.py``: tiny Hugging Face configs built in code (nothing is
downloaded), each with a batch of ``models_round9``/``models_round10`` (a causal-LM, masked-LM or
sequence-to-sequence batch with a padded row, 32-pixel images with labels, a waveform with CTC
labels)."""

import torch

import transformers as T

from models_round9 import AUDIO, DEC, ENC, V, Family, _generator, causal_lm, images, masked_lm, padded_audio
from models_round10 import BART, MHA, seq2seq


def segmentation(step: int) -> dict:
    g = _generator(step)
    return dict(
        pixel_values=torch.randn(2, 3, 32, 32, generator=g), labels=torch.randint(0, 3, (2, 32, 32), generator=g)
    )


def labelled_text(step: int) -> dict:
    b = masked_lm(step)
    b["labels"] = torch.tensor([0, 2])
    return b


def depth(step: int) -> dict:
    g = _generator(step)
    return dict(pixel_values=torch.randn(2, 3, 32, 32, generator=g), labels=torch.rand(2, 32, 32, generator=g) * 5)


def bert_audio(step: int) -> dict:
    g = _generator(step)
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, 15:] = 0
    return dict(
        input_features=torch.randn(2, 20, 16, generator=g),
        attention_mask=mask,
        labels=torch.randint(1, 20, (2, 5), generator=g),
    )


def _dbrx():
    config = T.DbrxConfig(
        d_model=32,
        n_heads=4,
        n_layers=2,
        max_seq_len=64,
        vocab_size=DEC["vocab_size"],
        attn_config=dict(kv_n_heads=2, clip_qkv=1.0, rope_theta=10000.0),
        ffn_config=dict(ffn_hidden_size=32, moe_num_experts=4, moe_top_k=2),
        output_router_logits=True,
        router_aux_loss_coef=0.02,
        pad_token_id=0,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0),
    )
    return T.DbrxForCausalLM(config)


def _deepseek_v2():
    latent = dict(q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8)
    experts = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1)
    layers = dict(first_k_dense_replace=1, topk_method="greedy", n_group=1, topk_group=1)
    return T.DeepseekV2ForCausalLM(T.DeepseekV2Config(**latent, **experts, **layers, **MHA))


def _phimoe():
    experts = dict(num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=0.01, input_jitter_noise=0.01)
    return T.PhimoeForCausalLM(T.PhimoeConfig(output_router_logits=True, **experts, **DEC))


def _bamba():
    mamba = dict(mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=4)
    config = T.BambaConfig(attn_layer_indices=[1], mamba_expand=2, mamba_d_conv=4, **mamba, **DEC)
    return T.BambaForCausalLM(config)


def _lfm2():
    config = T.Lfm2Config(layer_types=["conv", "full_attention"], conv_L_cache=3, block_ff_dim=64, **DEC)
    return T.Lfm2ForCausalLM(config)


def _qwen3_next():
    linear = dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8)
    experts = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
    layers = dict(layer_types=["linear_attention", "full_attention"], head_dim=8, linear_conv_kernel_dim=4)
    return T.Qwen3NextForCausalLM(T.Qwen3NextConfig(**linear, **experts, **layers, **DEC))


def _fnet():
    config = T.FNetConfig(
        vocab_size=DEC["vocab_size"],
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        use_tpu_fourier_optimizations=False,
    )
    return T.FNetForMaskedLM(config)


def _segformer():
    config = T.SegformerConfig(
        num_encoder_blocks=2,
        depths=[1, 1],
        sr_ratios=[2, 1],
        hidden_sizes=[8, 16],
        num_attention_heads=[1, 2],
        patch_sizes=[7, 3],
        strides=[4, 2],
        mlp_ratios=[2, 2],
        decoder_hidden_size=16,
        drop_path_rate=0.1,
        num_labels=3,
    )
    return T.SegformerForSemanticSegmentation(config)


def _hiera():
    config = T.HieraConfig(
        image_size=[32, 32],
        patch_size=[3, 3],
        patch_stride=[2, 2],
        patch_padding=[1, 1],
        embed_dim=8,
        num_heads=[1, 2],
        depths=[1, 1],
        query_stride=[2, 2],
        num_query_pool=1,
        masked_unit_size=[4, 4],
        masked_unit_attention=[True, False],
        drop_path_rate=0.1,
        num_labels=3,
    )
    return T.HieraForImageClassification(config)


def _xmod():
    model = T.XmodForMaskedLM(T.XmodConfig(languages=["en_XX", "de_DE"], **ENC))
    model.set_default_language("de_DE")
    return model


VIT = dict(
    image_size=32, patch_size=8, num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64
)


FAMILIES = {
    "arcee": Family(lambda: T.ArceeForCausalLM(T.ArceeConfig(**DEC)), causal_lm),  # squared ReLU MLP
    "glm4": Family(lambda: T.Glm4ForCausalLM(T.Glm4Config(head_dim=8, **DEC)), causal_lm),  # post norms, half rotary
    "exaone4": Family(
        lambda: T.Exaone4ForCausalLM(T.Exaone4Config(sliding_window=4, sliding_window_pattern=2, **DEC)), causal_lm
    ),
    "smollm3": Family(lambda: T.SmolLM3ForCausalLM(T.SmolLM3Config(no_rope_layer_interval=2, **DEC)), causal_lm),
    "dbrx": Family(_dbrx, causal_lm),
    "deepseek_v2": Family(_deepseek_v2, causal_lm),
    "phimoe": Family(_phimoe, causal_lm),
    "bamba": Family(_bamba, causal_lm),
    "lfm2": Family(_lfm2, causal_lm),
    "qwen3_next": Family(_qwen3_next, causal_lm),
    "apertus": Family(lambda: T.ApertusForCausalLM(T.ApertusConfig(**DEC)), causal_lm),  # xIELU
    "vaultgemma": Family(lambda: T.VaultGemmaForCausalLM(T.VaultGemmaConfig(head_dim=8, **DEC)), causal_lm),
    "fnet": Family(_fnet, masked_lm),
    "roberta_prelayernorm": Family(
        lambda: T.RobertaPreLayerNormForMaskedLM(T.RobertaPreLayerNormConfig(**ENC)), masked_lm
    ),
    "xmod": Family(_xmod, masked_lm),  # a language adapter per layer
    "prophetnet": Family(
        lambda: T.ProphetNetForConditionalGeneration(
            T.ProphetNetConfig(
                hidden_size=32,
                encoder_ffn_dim=64,
                decoder_ffn_dim=64,
                num_encoder_layers=2,
                num_decoder_layers=2,
                num_encoder_attention_heads=2,
                num_decoder_attention_heads=2,
                ngram=2,
                num_buckets=8,
                relative_max_distance=16,
                max_position_embeddings=64,
                vocab_size=DEC["vocab_size"],
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
                decoder_start_token_id=2,
            )
        ),
        seq2seq,
    ),
    "blenderbot_small": Family(
        lambda: T.BlenderbotSmallForConditionalGeneration(T.BlenderbotSmallConfig(max_position_embeddings=64, **BART)),
        seq2seq,
    ),
    "dinov2_with_registers": Family(
        lambda: T.Dinov2WithRegistersForImageClassification(
            T.Dinov2WithRegistersConfig(
                num_register_tokens=2, layerscale_value=0.1, drop_path_rate=0.1, num_labels=3, **VIT
            )
        ),
        images,
    ),
    "ijepa": Family(lambda: T.IJepaForImageClassification(T.IJepaConfig(num_labels=3, **VIT)), images),
    "hiera": Family(_hiera, images),
    "segformer": Family(_segformer, segmentation),
    "swiftformer": Family(
        lambda: T.SwiftFormerForImageClassification(
            T.SwiftFormerConfig(depths=[1, 1, 1, 1], embed_dims=[8, 16, 16, 32], drop_path_rate=0.1, num_labels=3)
        ),
        images,
    ),
    "sew": Family(
        lambda: T.SEWForCTC(T.SEWConfig(num_conv_pos_embeddings=16, squeeze_factor=2, **AUDIO)), padded_audio
    ),
    "unispeech": Family(
        lambda: T.UniSpeechForCTC(T.UniSpeechConfig(num_conv_pos_embeddings=16, **AUDIO)), padded_audio
    ),
    "gemma3n": Family(
        lambda: T.Gemma3nForCausalLM(
            T.Gemma3nTextConfig(
                head_dim=8,
                sliding_window=4,
                layer_types=["sliding_attention", "full_attention"],
                vocab_size_per_layer_input=V,
                hidden_size_per_layer_input=8,
                laurel_rank=4,
                altup_num_inputs=2,
                num_kv_shared_layers=0,
                activation_sparsity_pattern=[0.95, 0.0],
                intermediate_size=64,
                **{k: v for k, v in DEC.items() if k != "intermediate_size"},
            )
        ),
        causal_lm,
    ),
    "falcon_h1": Family(
        lambda: T.FalconH1ForCausalLM(
            T.FalconH1Config(
                mamba_d_ssm=32,
                mamba_n_heads=4,
                mamba_d_head=8,
                mamba_n_groups=1,
                mamba_d_state=8,
                mamba_chunk_size=4,
                mamba_expand=1,
                **DEC,
            )
        ),
        causal_lm,
    ),
    "minimax": Family(
        lambda: T.MiniMaxForCausalLM(
            T.MiniMaxConfig(
                head_dim=8,
                num_local_experts=4,
                num_experts_per_tok=2,
                layer_types=["linear_attention", "full_attention"],
                block_size=4,
                **DEC,
            )
        ),
        causal_lm,
    ),
    "doge": Family(lambda: T.DogeForCausalLM(T.DogeConfig(keep_window_size=4, is_moe=False, **DEC)), causal_lm),
    "canine": Family(
        lambda: T.CanineForSequenceClassification(
            T.CanineConfig(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                num_hash_buckets=64,
                downsampling_rate=2,
                max_position_embeddings=64,
                num_labels=3,
            )
        ),
        labelled_text,
    ),
    "nllb_moe": Family(
        lambda: T.NllbMoeForConditionalGeneration(
            T.NllbMoeConfig(
                num_experts=4,
                expert_capacity=4,
                encoder_sparse_step=2,
                decoder_sparse_step=2,
                max_position_embeddings=64,
                output_router_logits=True,
                **BART,
            )
        ),
        seq2seq,
    ),
    "wav2vec2_bert": Family(
        lambda: T.Wav2Vec2BertForCTC(
            T.Wav2Vec2BertConfig(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                feature_projection_input_dim=16,
                vocab_size=20,
                pad_token_id=0,
                mask_time_prob=0.0,
                layerdrop=0.0,
                conv_depthwise_kernel_size=3,
                left_max_position_embeddings=8,
                right_max_position_embeddings=8,
                position_embeddings_type="relative_key",
            )
        ),
        bert_audio,
    ),
    "glpn": Family(
        lambda: T.GLPNForDepthEstimation(
            T.GLPNConfig(
                num_encoder_blocks=2,
                depths=[1, 1],
                sr_ratios=[2, 1],
                hidden_sizes=[8, 16],
                num_attention_heads=[1, 2],
                patch_sizes=[7, 3],
                strides=[4, 2],
                mlp_ratios=[2, 2],
                decoder_hidden_size=16,
                drop_path_rate=0.1,
            )
        ),
        depth,
    ),
    "mobilenet_v1": Family(
        lambda: T.MobileNetV1ForImageClassification(
            T.MobileNetV1Config(image_size=32, depth_multiplier=0.25, num_labels=3)
        ),
        images,
    ),
    "kimi_linear": Family(
        lambda: T.KimiLinearForCausalLM(
            T.KimiLinearConfig(
                layer_types=["linear_attention", "full_attention"],
                linear_head_dim=8,
                linear_num_heads=4,
                linear_conv_kernel_dim=4,
                num_local_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                kv_lora_rank=16,
                q_lora_rank=16,
                qk_rope_head_dim=4,
                qk_nope_head_dim=4,
                v_head_dim=8,
                mlp_layer_types=["dense", "sparse"],
                **MHA,
            )
        ),
        causal_lm,
    ),
}
