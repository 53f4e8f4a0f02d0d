"""The families of ``test_models_round12.py``: tiny Hugging Face configs built in code (nothing is
downloaded), each with the batch of a training step (the batches of ``models_round9``-``11``, and
spectrogram frames, detection targets, time series, image-text pairs where a family needs them)."""

import torch

import transformers as T

from models_round9 import DEC, ENC, TOKENS, V, Family, _generator, causal_lm, images, masked_lm
from models_round10 import BART, MHA, seq2seq
from models_round11 import segmentation


def spectrogram(step: int) -> dict:
    g = _generator(step)
    return dict(input_values=torch.randn(2, 24, 16, generator=g), labels=torch.tensor([0, 2]))


def text_classes(step: int) -> dict:
    b = masked_lm(step)
    b["labels"] = torch.tensor([0, 2])
    return b


def _zamba():
    mamba = dict(mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, n_mamba_heads=2, use_mamba_kernels=False)
    layers = dict(layers_block_type=["mamba", "hybrid", "hybrid"], attention_head_dim=16, num_hidden_layers=3)
    layers.update(use_associative_scan=False)
    dims = {k: v for k, v in DEC.items() if k != "num_hidden_layers"}
    config = T.ZambaConfig(**layers, **mamba, **dims)
    return T.ZambaForCausalLM(config)


def _zamba2():
    mamba = dict(mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_ngroups=1, n_mamba_heads=4, chunk_size=4)
    layers = dict(layers_block_type=["mamba", "hybrid"], num_mem_blocks=1, use_shared_attention_adapter=True)
    config = T.Zamba2Config(adapter_rank=4, use_mem_rope=True, use_mamba_kernels=False, **mamba, **layers, **MHA)
    return T.Zamba2ForCausalLM(config)


def _nemotron_h():
    mamba = dict(ssm_state_size=8, mamba_num_heads=4, mamba_head_dim=8, n_groups=1, conv_kernel=4, chunk_size=4)
    experts = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1)
    experts.update(moe_shared_expert_intermediate_size=32, n_group=1, topk_group=1)
    dims = {k: v for k, v in DEC.items() if k != "num_hidden_layers"}
    config = T.NemotronHConfig(
        layers_block_type=["mamba", "attention", "moe", "mlp"],
        head_dim=8,
        use_mamba_kernels=False,
        **mamba,
        **experts,
        **dims,
    )
    return T.NemotronHForCausalLM(config)


def _granitemoehybrid():
    mamba = dict(mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=4)
    experts = dict(num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=32, output_router_logits=True)
    config = T.GraniteMoeHybridConfig(
        layer_types=["mamba", "attention"], mamba_d_conv=4, mamba_expand=2, **mamba, **experts, **DEC
    )
    return T.GraniteMoeHybridForCausalLM(config)


def _xlstm():
    config = T.xLSTMConfig(
        vocab_size=V,
        hidden_size=32,
        num_hidden_layers=2,
        num_heads=2,
        chunk_size=4,
        mode="train",
        use_cache=False,
        chunkwise_kernel="chunkwise--native_autograd",
        sequence_kernel="native_sequence__native",
        step_kernel="native",
        pad_token_id=0,
    )
    return T.xLSTMForCausalLM(config)


def _glm4_moe():
    experts = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1)
    routing = dict(n_group=2, topk_group=1, first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.5)
    return T.Glm4MoeForCausalLM(T.Glm4MoeConfig(use_qk_norm=True, **experts, **routing, **DEC))


def _ernie4_5_moe():
    experts = dict(moe_num_experts=4, moe_k=2, moe_intermediate_size=32, moe_num_shared_experts=1)
    config = T.Ernie4_5_MoeConfig(moe_layer_start_index=1, output_router_logits=True, **experts, **DEC)
    return T.Ernie4_5_MoeForCausalLM(config)


def _lfm2_moe():
    experts = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, use_expert_bias=True)
    config = T.Lfm2MoeConfig(
        layer_types=["conv", "full_attention"], num_dense_layers=1, conv_L_cache=3, **experts, **DEC
    )
    return T.Lfm2MoeForCausalLM(config)


def _t5gemma():
    module = dict(head_dim=8, sliding_window=4, layer_types=["sliding_attention", "full_attention"], **DEC)
    config = T.T5GemmaConfig(
        encoder=T.T5GemmaModuleConfig(**module), decoder=T.T5GemmaModuleConfig(**module), vocab_size=V
    )
    return T.T5GemmaForConditionalGeneration(config)


def long_seq2seq(step: int) -> dict:
    """Sixteen tokens, the shortest BigBird's block sparse attention takes (else it attends fully)."""
    g = _generator(step)
    ids = torch.randint(3, V, (2, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 13:] = 0
    return dict(input_ids=ids, attention_mask=mask, labels=torch.randint(3, V, (2, 6), generator=g))


def _bigbird_pegasus():
    config = T.BigBirdPegasusConfig(
        attention_type="block_sparse", block_size=2, num_random_blocks=1, max_position_embeddings=64, **BART
    )
    return T.BigBirdPegasusForConditionalGeneration(config)


def _speecht5():
    convolutions = dict(conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16)
    layers = dict(hidden_size=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2)
    layers.update(decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_text_positions=64)
    config = T.SpeechT5Config(
        apply_spec_augment=False,
        decoder_start_token_id=2,
        encoder_max_relative_position=8,
        **convolutions,
        **layers,
        **TOKENS,
    )
    return T.SpeechT5ForSpeechToText(config)


def speech_to_text(step: int) -> dict:
    g = _generator(step)
    mask = torch.ones(2, 800, dtype=torch.long)
    mask[1, 600:] = 0
    values = torch.randn(2, 800, generator=g)
    return dict(input_values=values, attention_mask=mask, labels=torch.randint(3, V, (2, 5), generator=g))


def _moonshine():
    config = T.MoonshineConfig(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        encoder_num_hidden_layers=2,
        decoder_num_hidden_layers=2,
        encoder_num_attention_heads=2,
        decoder_num_attention_heads=2,
        max_position_embeddings=64,
        decoder_start_token_id=1,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return T.MoonshineForConditionalGeneration(config)


def raw_speech_to_text(step: int) -> dict:
    g = _generator(step)
    mask = torch.ones(2, 1600, dtype=torch.long)
    mask[1, 1200:] = 0
    values = torch.randn(2, 1600, generator=g)
    return dict(input_values=values, attention_mask=mask, labels=torch.randint(3, V, (2, 5), generator=g))


def _poolformer():
    config = T.PoolFormerConfig(
        depths=[1, 1, 1, 1], hidden_sizes=[8, 16, 16, 32], drop_path_rate=0.1, num_labels=3, num_encoder_blocks=4
    )
    return T.PoolFormerForImageClassification(config)


def _upernet():
    backbone = T.ConvNextConfig(
        hidden_sizes=[8, 16, 16, 32], depths=[1, 1, 1, 1], out_features=["stage1", "stage2", "stage3", "stage4"]
    )
    config = T.UperNetConfig(
        backbone_config=backbone,
        hidden_size=16,
        pool_scales=[1, 2],
        use_auxiliary_head=True,
        auxiliary_in_channels=16,
        auxiliary_channels=8,
        num_labels=3,
    )
    return T.UperNetForSemanticSegmentation(config)


def _autoformer():
    config = T.AutoformerConfig(
        prediction_length=4,
        context_length=8,
        lags_sequence=[1, 2],
        num_time_features=1,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        moving_average=3,
        autocorrelation_factor=1,
        label_length=4,
    )
    return T.AutoformerForPrediction(config)


def forecast(step: int) -> dict:
    g = _generator(step)
    return dict(
        past_values=torch.randn(2, 10, generator=g),
        past_time_features=torch.randn(2, 10, 1, generator=g),
        past_observed_mask=torch.ones(2, 10),
        future_values=torch.randn(2, 4, generator=g),
        future_time_features=torch.randn(2, 4, 1, generator=g),
    )


def _patchtsmixer():
    config = T.PatchTSMixerConfig(
        context_length=16,
        patch_length=4,
        patch_stride=4,
        num_input_channels=2,
        d_model=16,
        num_layers=2,
        self_attn=True,
        self_attn_heads=2,
        gated_attn=True,
        prediction_length=4,
        mode="mix_channel",
    )
    return T.PatchTSMixerForPrediction(config)


def channels_forecast(step: int) -> dict:
    g = _generator(step)
    return dict(past_values=torch.randn(2, 16, 2, generator=g), future_values=torch.randn(2, 4, 2, generator=g))


def _roformer():
    return T.RoFormerForMaskedLM(T.RoFormerConfig(rotary_value=True, embedding_size=16, **ENC))


def _vitdet():
    return T.VitDetBackbone(
        T.VitDetConfig(
            image_size=32,
            patch_size=4,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            window_block_indices=[0],
            use_relative_position_embeddings=True,
            window_size=4,
            drop_path_rate=0.1,
        )
    )


def _groupvit():
    text = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    vision = dict(hidden_size=32, intermediate_size=64, depths=[1, 1], num_group_tokens=[8, 4])
    vision.update(num_output_groups=[8, 4], num_attention_heads=2, image_size=32, patch_size=8)
    config = T.GroupViTConfig(
        text_config=dict(text, max_position_embeddings=64, pad_token_id=0),
        vision_config=vision,
        projection_dim=16,
        projection_intermediate_dim=32,
    )
    return T.GroupViTModel(config)


def image_text(step: int) -> dict:
    b = masked_lm(step)
    del b["labels"]
    return dict(b, pixel_values=torch.randn(2, 3, 32, 32, generator=_generator(step)), return_loss=True)


def _blip():
    text = dict(vocab_size=V, hidden_size=32, encoder_hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    text.update(num_attention_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, sep_token_id=2)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    config = T.BlipConfig(text_config=text, vision_config=dict(vision, image_size=32, patch_size=8))
    return T.BlipForConditionalGeneration(config)


def captions(step: int) -> dict:
    b = causal_lm(step)
    return dict(b, pixel_values=torch.randn(2, 3, 32, 32, generator=_generator(step)))


def _vilt():
    config = T.ViltConfig(image_size=32, patch_size=8, max_image_length=8, num_labels=3, **ENC)
    return T.ViltForQuestionAnswering(config)


def questions(step: int) -> dict:
    b = masked_lm(step)
    g = _generator(step)
    b["labels"] = (torch.rand(2, 3, generator=g) > 0.5).float()
    return dict(b, pixel_values=torch.randn(2, 3, 32, 32, generator=g))


def _perceiver():
    config = T.PerceiverConfig(
        num_latents=8,
        d_latents=32,
        d_model=32,
        num_blocks=1,
        num_self_attends_per_block=2,
        num_self_attention_heads=2,
        num_cross_attention_heads=1,
        vocab_size=V,
        max_position_embeddings=8,
        qk_channels=16,
        v_channels=32,
    )
    return T.PerceiverForMaskedLM(config)


def _timesfm():
    config = T.TimesFmConfig(
        patch_length=4,
        context_length=16,
        horizon_length=4,
        num_hidden_layers=2,
        hidden_size=32,
        intermediate_size=64,
        head_dim=16,
        num_attention_heads=2,
        quantiles=[0.25, 0.5, 0.75],
    )
    return T.TimesFmModelForPrediction(config)


def series(step: int) -> dict:
    g = _generator(step)
    return dict(past_values=torch.randn(2, 16, generator=g), future_values=torch.randn(2, 4, generator=g))


def _pix2struct():
    text = dict(vocab_size=V, hidden_size=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2, pad_token_id=0)
    vision = dict(hidden_size=32, patch_embed_hidden_size=48, d_ff=64, d_kv=16, num_hidden_layers=2)
    config = T.Pix2StructConfig(
        text_config=dict(text, decoder_start_token_id=0, relative_attention_num_buckets=8),
        vision_config=dict(vision, num_attention_heads=2, seq_len=16, relative_attention_num_buckets=8),
    )
    return T.Pix2StructForConditionalGeneration(config)


def flattened_patches(step: int) -> dict:
    g = _generator(step)
    patches = torch.randn(2, 16, 50, generator=g)
    patches[:, :, 0] = torch.arange(16).div(4, rounding_mode="floor") + 1  # (row, column) of each patch
    patches[:, :, 1] = torch.arange(16) % 4 + 1
    mask = torch.ones(2, 16)
    mask[1, 12:] = 0
    labels = torch.randint(3, V, (2, 5), generator=g)
    return dict(flattened_patches=patches, attention_mask=mask, labels=labels)


FAMILIES = {
    "zamba": Family(_zamba, causal_lm),
    "zamba2": Family(_zamba2, causal_lm),
    "nemotron_h": Family(_nemotron_h, causal_lm),
    "granitemoehybrid": Family(_granitemoehybrid, causal_lm),
    "granitemoeshared": Family(
        lambda: T.GraniteMoeSharedForCausalLM(
            T.GraniteMoeSharedConfig(num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=32, **DEC)
        ),
        causal_lm,
    ),
    "xlstm": Family(_xlstm, causal_lm),
    "glm4_moe": Family(_glm4_moe, causal_lm),
    "ernie4_5_moe": Family(_ernie4_5_moe, causal_lm),
    "lfm2_moe": Family(_lfm2_moe, causal_lm),
    "t5gemma": Family(_t5gemma, seq2seq),
    "bigbird_pegasus": Family(_bigbird_pegasus, long_seq2seq),
    "roformer": Family(_roformer, masked_lm),
    "audio_spectrogram_transformer": Family(
        lambda: T.ASTForAudioClassification(
            T.ASTConfig(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                patch_size=8,
                frequency_stride=4,
                time_stride=4,
                max_length=24,
                num_mel_bins=16,
                num_labels=3,
            )
        ),
        spectrogram,
    ),
    "speecht5": Family(_speecht5, speech_to_text),
    "moonshine": Family(_moonshine, raw_speech_to_text),
    "poolformer": Family(_poolformer, images),
    "upernet": Family(_upernet, segmentation),
    "autoformer": Family(_autoformer, forecast),
    "patchtsmixer": Family(_patchtsmixer, channels_forecast),
    "groupvit": Family(_groupvit, image_text),
    "blip": Family(_blip, captions),
    "vilt": Family(_vilt, questions),
    "perceiver": Family(_perceiver, masked_lm),
    "timesfm": Family(_timesfm, series),
    "pix2struct": Family(_pix2struct, flattened_patches),
}
