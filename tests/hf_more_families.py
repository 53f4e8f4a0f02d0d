"""Tiny configs of the Hugging Face families ``test_hf_more_families`` sweeps (nothing
downloaded): name -> ``Family``, grouped by the batch they take. Float64 unless a family computes
in float32 itself (Mamba-2's scan) or turns a float64 model to float32 in its forward (Switch
Transformers' router, which eager converts on its first call and thunder_rs refuses)."""

import dataclasses
from collections.abc import Callable

import torch

T = __import__("transformers")

VOCAB = 99
LENGTHS = (8, 12)  # the two text lengths
BATCHES = (2, 3)  # the two batch sizes of image, video and series batches
ENCODER = dict(
    num_hidden_layers=2,
    num_attention_heads=2,
    hidden_size=32,
    intermediate_size=64,
    max_position_embeddings=64,
    num_labels=3,
    vocab_size=VOCAB,
    pad_token_id=0,
)
DECODER = dict(
    num_hidden_layers=2,
    num_attention_heads=4,
    hidden_size=32,
    intermediate_size=64,
    max_position_embeddings=64,
    vocab_size=VOCAB,
    pad_token_id=0,
)
SEQ2SEQ = dict(
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    d_model=32,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
    vocab_size=VOCAB,
    pad_token_id=0,
    decoder_start_token_id=2,
    bos_token_id=1,
    eos_token_id=2,
)
T5 = dict(
    num_layers=2, num_heads=2, d_model=32, d_kv=16, d_ff=64, decoder_start_token_id=0, vocab_size=VOCAB, pad_token_id=0
)
VISION = dict(image_size=32, num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64)
TEXT_TOWER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=VOCAB)
SERIES = dict(
    prediction_length=4,
    context_length=12,
    lags_sequence=[1, 2, 3],
    num_time_features=2,
    d_model=16,
    encoder_layers=1,
    decoder_layers=1,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
)
GENERATE = (
    dict(max_new_tokens=4, do_sample=False, pad_token_id=0),
    dict(max_new_tokens=4, num_beams=2, do_sample=False, pad_token_id=0),
)


@dataclasses.dataclass
class Family:
    """How to build a family's model and call it: ``batch(size, seed)`` at size 0 or 1,
    ``loss(out)`` what a step backpropagates, ``prompt(size, seed)`` what ``generate`` takes
    (None: the family does not generate); ``train`` False for a family run in eval only."""

    build: Callable
    batch: Callable
    loss: Callable = lambda out: out.loss
    prompt: Callable | None = None
    dtype: torch.dtype = torch.float64
    train: bool = True


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def tokens(size: int, seed: int) -> dict:
    """Two texts of ``LENGTHS[size]`` tokens, the second padded on the right."""
    n = LENGTHS[size]
    ids = torch.randint(3, VOCAB, (2, n), generator=_generator(seed))
    mask = torch.ones(2, n, dtype=torch.long)
    mask[1, n - 3 :] = 0
    return dict(input_ids=ids, attention_mask=mask)


def _classified(size: int, seed: int) -> dict:
    return dict(tokens(size, seed), labels=torch.tensor([0, 2]))


def _long_classified(size: int, seed: int) -> dict:
    """Texts long enough for BigBird's block-sparse attention (more than 18 tokens at its blocks
    of 2 with 2 random blocks; shorter ones make it swap in full attention)."""
    ids = torch.randint(3, VOCAB, (2, (32, 40)[size]), generator=_generator(seed))
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    return dict(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 2]))


def _language_modelled(size: int, seed: int) -> dict:
    batch = tokens(size, seed)
    return dict(batch, labels=batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100))


def _translated(size: int, seed: int) -> dict:
    return dict(tokens(size, seed), labels=tokens(size, seed + 7)["input_ids"][:, : 6 + size].contiguous())


def _with_boxes(size: int, seed: int) -> dict:
    batch = _classified(size, seed)
    corners = torch.randint(0, 500, (*batch["input_ids"].shape, 2), generator=_generator(seed))
    return dict(batch, bbox=torch.cat([corners, corners + 10], -1))


def pixels(size: int, seed: int, side: int = 32) -> torch.Tensor:
    return torch.randn(BATCHES[size], 3, side, side, generator=_generator(seed), dtype=torch.float64)


def _image_classified(size: int, seed: int) -> dict:
    return dict(pixel_values=pixels(size, seed), labels=torch.tensor([0, 2, 1][: BATCHES[size]]))


def _images(size: int, seed: int) -> dict:
    return dict(pixel_values=pixels(size, seed))


def _video_classified(size: int, seed: int) -> dict:
    video = torch.randn(BATCHES[size], 4, 3, 32, 32, generator=_generator(seed), dtype=torch.float64)
    return dict(pixel_values=video, labels=torch.tensor([0, 2, 1][: BATCHES[size]]))


def _captioned(size: int, seed: int) -> dict:
    ids = torch.randint(3, VOCAB, (BATCHES[size], 7), generator=_generator(seed))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return dict(input_ids=ids, attention_mask=mask, pixel_values=pixels(size, seed), return_loss=True)


def _series(size: int, seed: int) -> dict:
    g, n, past = _generator(seed), BATCHES[size], 15  # the context and the longest lag
    return dict(
        past_values=torch.randn(n, past, generator=g, dtype=torch.float64),
        past_time_features=torch.randn(n, past, 2, generator=g, dtype=torch.float64),
        past_observed_mask=torch.ones(n, past, dtype=torch.float64),
        future_values=torch.randn(n, 4, generator=g, dtype=torch.float64),
        future_time_features=torch.randn(n, 4, 2, generator=g, dtype=torch.float64),
    )


def _patched_series(size: int, seed: int) -> dict:
    g, n = _generator(seed), BATCHES[size]
    return dict(
        past_values=torch.randn(n, 16, 2, generator=g, dtype=torch.float64),
        future_values=torch.randn(n, 4, 2, generator=g, dtype=torch.float64),
    )


def _mean_square(name: str) -> Callable:
    return lambda out: getattr(out, name).square().mean()


def _classifier(cls, config) -> Family:
    return Family(lambda: cls(config), _classified)


def _image_classifier(cls, config) -> Family:
    return Family(lambda: cls(config), _image_classified)


def _translator(cls, config, dtype=torch.float64) -> Family:
    return Family(lambda: cls(config), _translated, prompt=tokens, dtype=dtype)


def _decoder(cls, config, dtype=torch.float64) -> Family:
    return Family(lambda: cls(config), _language_modelled, prompt=tokens, dtype=dtype)


def text_families() -> dict:
    """Encoders of text (sequence classifiers; ESM's masked LM), and layouts of boxes."""
    bert = {**ENCODER, "pad_token_id": 1}
    return {
        "convbert": _classifier(T.ConvBertForSequenceClassification, T.ConvBertConfig(embedding_size=32, **ENCODER)),
        "roformer": _classifier(T.RoFormerForSequenceClassification, T.RoFormerConfig(**ENCODER)),
        "yoso": _classifier(T.YosoForSequenceClassification, T.YosoConfig(**ENCODER)),
        "squeezebert": _classifier(
            T.SqueezeBertForSequenceClassification,
            T.SqueezeBertConfig(
                embedding_size=32,
                q_groups=2,
                k_groups=2,
                v_groups=2,
                post_attention_groups=2,
                intermediate_groups=2,
                output_groups=2,
                **ENCODER,
            ),
        ),
        "esm": _classifier(T.EsmForSequenceClassification, T.EsmConfig(position_embedding_type="rotary", **bert)),
        "esm_mlm": Family(lambda: T.EsmForMaskedLM(T.EsmConfig(**bert)), _language_modelled),
        "tapas": _classifier(T.TapasForSequenceClassification, T.TapasConfig(**ENCODER)),
        "layoutlm": Family(lambda: T.LayoutLMForSequenceClassification(T.LayoutLMConfig(**ENCODER)), _with_boxes),
        "mpnet": _classifier(T.MPNetForSequenceClassification, T.MPNetConfig(**bert)),
        "funnel": _classifier(
            T.FunnelForSequenceClassification,
            T.FunnelConfig(
                block_sizes=[1, 1],
                num_decoder_layers=1,
                n_head=2,
                d_model=32,
                d_head=16,
                d_inner=64,
                vocab_size=VOCAB,
                num_labels=3,
                pad_token_id=0,
            ),
        ),
        "xlnet": _classifier(
            T.XLNetForSequenceClassification,
            T.XLNetConfig(n_layer=2, n_head=2, d_model=32, d_inner=64, vocab_size=VOCAB, num_labels=3, pad_token_id=0),
        ),
        "modernbert": _classifier(T.ModernBertForSequenceClassification, T.ModernBertConfig(**ENCODER)),
        "megatron_bert": _classifier(T.MegatronBertForSequenceClassification, T.MegatronBertConfig(**ENCODER)),
        "rembert": _classifier(
            T.RemBertForSequenceClassification,
            T.RemBertConfig(input_embedding_size=16, output_embedding_size=16, **ENCODER),
        ),
        "ibert": _classifier(T.IBertForSequenceClassification, T.IBertConfig(**bert)),
        # block-sparse attention (its band mask unsqueezed in place); evaluated only: in training
        # its random blocks are drawn with numpy.random
        "bigbird": Family(
            lambda: T.BigBirdForSequenceClassification(
                T.BigBirdConfig(attention_type="block_sparse", block_size=2, num_random_blocks=2, **ENCODER)
            ),
            _long_classified,
            train=False,
        ),
        "xlm": _classifier(
            T.XLMForSequenceClassification,
            T.XLMConfig(n_layers=2, n_heads=2, emb_dim=32, vocab_size=VOCAB, num_labels=3, pad_token_id=0),
        ),
    }


def seq2seq_families() -> dict:
    """Encoder-decoders (labels for the decoder; greedy and beam generation)."""
    return {
        "mt5": _translator(T.MT5ForConditionalGeneration, T.MT5Config(**T5)),
        "umt5": _translator(T.UMT5ForConditionalGeneration, T.UMT5Config(**T5)),
        "longt5": _translator(
            T.LongT5ForConditionalGeneration, T.LongT5Config(local_radius=2, global_block_size=4, **T5)
        ),
        "plbart": _translator(T.PLBartForConditionalGeneration, T.PLBartConfig(**SEQ2SEQ)),
        "blenderbot": _translator(T.BlenderbotForConditionalGeneration, T.BlenderbotConfig(**SEQ2SEQ)),
        "m2m100": _translator(T.M2M100ForConditionalGeneration, T.M2M100Config(**SEQ2SEQ)),
        # routed experts picked by self[f"expert_{idx[0]}"]; its router converts itself to float32
        "switch_transformers": _translator(
            T.SwitchTransformersForConditionalGeneration,
            T.SwitchTransformersConfig(
                num_experts=4,
                expert_capacity=8,
                num_sparse_encoder_layers=1,
                num_sparse_decoder_layers=1,
                num_decoder_layers=2,
                **T5,
            ),
            torch.float32,
        ),
    }


def vision_families() -> dict:
    """Image and video classifiers over two batch sizes; ViT-MAE's random masking (torch.rand)."""
    no_intermediate = {k: v for k, v in VISION.items() if k != "intermediate_size"}
    channels = dict(num_channels=3, num_labels=3)
    return {
        "vit": _image_classifier(T.ViTForImageClassification, T.ViTConfig(patch_size=8, num_labels=3, **VISION)),
        "deit": _image_classifier(T.DeiTForImageClassification, T.DeiTConfig(patch_size=8, num_labels=3, **VISION)),
        "dinov2": _image_classifier(
            T.Dinov2ForImageClassification, T.Dinov2Config(patch_size=8, num_labels=3, **no_intermediate)
        ),
        "vit_msn": _image_classifier(
            T.ViTMSNForImageClassification, T.ViTMSNConfig(patch_size=8, num_labels=3, **VISION)
        ),
        "vit_mae": Family(
            lambda: T.ViTMAEForPreTraining(
                T.ViTMAEConfig(
                    patch_size=8,
                    decoder_hidden_size=32,
                    decoder_num_hidden_layers=1,
                    decoder_num_attention_heads=2,
                    decoder_intermediate_size=64,
                    mask_ratio=0.5,
                    **VISION,
                )
            ),
            _images,
        ),
        "videomae": Family(
            lambda: T.VideoMAEForVideoClassification(
                T.VideoMAEConfig(patch_size=8, num_frames=4, tubelet_size=2, num_labels=3, **VISION)
            ),
            _video_classified,
        ),
        "timesformer": Family(
            lambda: T.TimesformerForVideoClassification(
                T.TimesformerConfig(patch_size=8, num_frames=4, num_labels=3, **VISION)
            ),
            _video_classified,
        ),
        **_convolutional(channels),
    }


def _convolutional(channels: dict) -> dict:
    """Convolutional and hierarchical image classifiers."""
    return {
        "mobilevit": _image_classifier(
            T.MobileViTForImageClassification,
            T.MobileViTConfig(
                image_size=32, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], num_labels=3
            ),
        ),
        "segformer": _image_classifier(
            T.SegformerForImageClassification,
            T.SegformerConfig(
                num_encoder_blocks=2,
                depths=[1, 1],
                sr_ratios=[2, 1],
                hidden_sizes=[8, 16],
                num_attention_heads=[1, 2],
                num_labels=3,
            ),
        ),
        "levit": _image_classifier(
            T.LevitForImageClassification,
            T.LevitConfig(
                image_size=32,
                hidden_sizes=[16, 32, 48],
                num_attention_heads=[1, 2, 3],
                depths=[1, 1, 1],
                key_dim=[8, 8, 8],
                num_labels=3,
            ),
        ),
        "pvt": _image_classifier(
            T.PvtForImageClassification,
            T.PvtConfig(
                image_size=32,
                num_encoder_blocks=2,
                depths=[1, 1],
                sequence_reduction_ratios=[2, 1],
                hidden_sizes=[8, 16],
                patch_sizes=[4, 2],
                strides=[4, 2],
                num_attention_heads=[1, 2],
                mlp_ratios=[2, 2],
                num_labels=3,
            ),
        ),
        "focalnet": _image_classifier(
            T.FocalNetForImageClassification,
            T.FocalNetConfig(
                image_size=32,
                patch_size=4,
                embed_dim=8,
                depths=[1, 1],
                focal_levels=[2, 2],
                focal_windows=[3, 3],
                num_labels=3,
            ),
        ),
        **_residual(channels),
    }


def _residual(channels: dict) -> dict:
    """Residual convolutional classifiers, a super-resolution and a depth model."""
    return {
        "regnet": _image_classifier(
            T.RegNetForImageClassification,
            T.RegNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], groups_width=8, **channels),
        ),
        "resnet": _image_classifier(
            T.ResNetForImageClassification,
            T.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], **channels),
        ),
        "bit": _image_classifier(
            T.BitForImageClassification,
            T.BitConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_groups=4, **channels),
        ),
        "mobilenet_v2": _image_classifier(
            T.MobileNetV2ForImageClassification, T.MobileNetV2Config(image_size=32, depth_multiplier=0.25, num_labels=3)
        ),
        "poolformer": _image_classifier(
            T.PoolFormerForImageClassification,
            T.PoolFormerConfig(
                hidden_sizes=[8, 16],
                depths=[1, 1],
                num_encoder_blocks=2,
                patch_sizes=[7, 3],
                strides=[4, 2],
                padding=[2, 1],
                pool_size=3,
                num_labels=3,
            ),
        ),
        "swin2sr": Family(
            lambda: T.Swin2SRForImageSuperResolution(
                T.Swin2SRConfig(
                    image_size=16, patch_size=1, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4, upscale=2
                )
            ),
            lambda size, seed: dict(pixel_values=pixels(size, seed, 16)),
            _mean_square("reconstruction"),
        ),
        "dpt": Family(
            lambda: T.DPTForDepthEstimation(
                T.DPTConfig(
                    patch_size=8,
                    backbone_out_indices=[0, 1],
                    neck_hidden_sizes=[8, 16],
                    fusion_hidden_size=16,
                    head_hidden_size=8,
                    reassemble_factors=[2, 1],
                    **VISION,
                )
            ),
            _images,
            _mean_square("predicted_depth"),
        ),
    }


def other_families() -> dict:
    """Two-tower and captioning models, detection features, time series, decoders, audio."""
    tower = dict(text_config=TEXT_TOWER, vision_config=dict(patch_size=8, **VISION))
    yolos = T.YolosConfig(patch_size=8, num_detection_tokens=5, **{**VISION, "image_size": [32, 32]})
    git = T.GitConfig(vision_config=dict(patch_size=8, **VISION), num_image_with_embedding=None, **DECODER)
    return {
        "clip": Family(lambda: T.CLIPModel(T.CLIPConfig(projection_dim=16, **tower)), _captioned),
        "siglip": Family(
            lambda: T.SiglipModel(T.SiglipConfig(**tower)),
            lambda s, seed: dict(_captioned(s, seed), attention_mask=None),
        ),
        "owlvit": Family(lambda: T.OwlViTModel(T.OwlViTConfig(projection_dim=16, **tower)), _captioned),
        "yolos": Family(lambda: T.YolosModel(yolos), _images, _mean_square("last_hidden_state")),
        "git": Family(
            lambda: T.GitForCausalLM(git),
            lambda s, seed: dict(_language_modelled(s, seed), pixel_values=pixels(s, seed)[:2]),
            prompt=lambda s, seed: dict(tokens(s, seed), pixel_values=pixels(s, seed)[:2]),
        ),
        "time_series_transformer": Family(
            lambda: T.TimeSeriesTransformerForPrediction(T.TimeSeriesTransformerConfig(**SERIES)), _series
        ),
        "informer": Family(lambda: T.InformerForPrediction(T.InformerConfig(**SERIES)), _series),
        "patchtst": Family(
            lambda: T.PatchTSTForPrediction(
                T.PatchTSTConfig(
                    num_input_channels=2,
                    context_length=16,
                    prediction_length=4,
                    patch_length=4,
                    patch_stride=4,
                    d_model=16,
                    num_attention_heads=2,
                    num_hidden_layers=1,
                    ffn_dim=32,
                )
            ),
            _patched_series,
        ),
        "encodec": Family(
            lambda: T.EncodecModel(
                T.EncodecConfig(
                    num_filters=4,
                    upsampling_ratios=[4, 2],
                    hidden_size=16,
                    codebook_size=32,
                    codebook_dim=16,
                    num_lstm_layers=1,
                    target_bandwidths=[1.5],
                    sampling_rate=2000,
                    audio_channels=1,
                )
            ),
            lambda s, seed: dict(
                input_values=torch.randn(2, 1, (64, 96)[s], generator=_generator(seed), dtype=torch.float64)
            ),
            _mean_square("audio_values"),
        ),
        **_decoders(),
    }


def _decoders() -> dict:
    """Causal language models (greedy and beam generation), and Reformer evaluated (its
    reversible layers run inside a custom autograd.Function given the layers)."""
    reformer = T.ReformerConfig(
        attn_layers=["local", "lsh"],
        hidden_size=32,
        feed_forward_size=64,
        num_attention_heads=2,
        attention_head_size=16,
        axial_pos_embds=False,
        max_position_embeddings=64,
        vocab_size=VOCAB,
        pad_token_id=0,
        local_attn_chunk_length=4,
        lsh_attn_chunk_length=4,
        num_buckets=2,
        is_decoder=True,
    )
    small = dict(vocab_size=VOCAB, pad_token_id=0)
    return {
        "biogpt": _decoder(T.BioGptForCausalLM, T.BioGptConfig(**DECODER)),
        "gpt_neo": _decoder(
            T.GPTNeoForCausalLM,
            T.GPTNeoConfig(
                num_layers=2,
                attention_types=[[["global", "local"], 1]],
                num_heads=4,
                hidden_size=32,
                window_size=4,
                max_position_embeddings=64,
                **small,
            ),
        ),
        "gpt_bigcode": _decoder(
            T.GPTBigCodeForCausalLM, T.GPTBigCodeConfig(n_layer=2, n_head=4, n_embd=32, n_positions=64, **small)
        ),
        "mpt": _decoder(T.MptForCausalLM, T.MptConfig(n_layers=2, n_heads=4, d_model=32, max_seq_len=64, **small)),
        "ctrl": _decoder(
            T.CTRLLMHeadModel, T.CTRLConfig(n_layer=2, n_head=4, n_embd=32, dff=64, n_positions=64, **small)
        ),
        # its scan computes in float32 whatever the model's dtype
        "mamba2": _decoder(
            T.Mamba2ForCausalLM,
            T.Mamba2Config(
                num_hidden_layers=2,
                hidden_size=32,
                state_size=8,
                num_heads=4,
                head_dim=16,
                expand=2,
                n_groups=1,
                chunk_size=4,
                **small,
            ),
            torch.float32,
        ),
        "reformer": Family(
            lambda: T.ReformerModelWithLMHead(reformer),
            lambda s, seed: dict(_language_modelled(s, seed), use_cache=False),
            train=False,
        ),
    }


def families() -> dict:
    return {**text_families(), **seq2seq_families(), **vision_families(), **other_families()}
