"""The families of ``test_models_round15.py``: tiny Hugging Face configs built in code (nothing is
downloaded), each with the batch of a training step (the batches of ``models_round9``-``14``; images
with decoder labels for the vision encoder-decoders, waveforms with decoder labels, video clips,
trajectories for the Decision Transformer, a denoising step for a UNet written with ``torch.nn``).
Families whose models give no loss train through ``Regressed`` (``models_round13``) or ``Detected``
(``models_round14``)."""

import math

import torch
import torch.nn.functional as F

import transformers as T

from models_round9 import AUDIO, DEC, ENC, V, Family, _generator, causal_lm
from models_round10 import BART, seq2seq
from models_round13 import Regressed, RegressedOutput, pixels
from models_round14 import DETR, Detected, _resnet, large_pixels

VIT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
EXPERTS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)


def captioned(step: int) -> dict:
    """Images with the token labels of a caption (a vision encoder-decoder's batch)."""
    g = _generator(step)
    return dict(pixel_values=torch.randn(2, 3, 32, 32, generator=g), labels=torch.randint(3, V, (2, 6), generator=g))


def transcribed(step: int) -> dict:
    """Waveforms (the second padded) with the token labels of a transcript."""
    g = _generator(step)
    mask = torch.ones(2, 800, dtype=torch.long)
    mask[1, 600:] = 0
    values, labels = torch.randn(2, 800, generator=g), torch.randint(3, V, (2, 5), generator=g)
    return dict(input_values=values, attention_mask=mask, labels=labels)


def clips(step: int) -> dict:
    """Video clips: 4 frames of 32 pixels, with class labels."""
    return dict(pixel_values=torch.randn(2, 4, 3, 32, 32, generator=_generator(step)), labels=torch.tensor([0, 2]))


def _vision_encoder_decoder(encoder, decoder):
    model = T.VisionEncoderDecoderModel(encoder=encoder, decoder=decoder)
    model.config.decoder_start_token_id, model.config.pad_token_id = 2, 0
    return model


def _trocr():
    """TrOCR: a ViT encoder and a decoder with learned (or sinusoidal) positions, cross-attending."""
    encoder = T.ViTModel(T.ViTConfig(image_size=32, patch_size=8, **VIT), add_pooling_layer=False)
    decoder_config = T.TrOCRConfig(
        vocab_size=V, d_model=32, decoder_layers=2, decoder_attention_heads=2, decoder_ffn_dim=64
    )
    decoder_config.update(dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, cross_attention_hidden_size=32))
    return _vision_encoder_decoder(encoder, T.TrOCRForCausalLM(decoder_config))


def _donut():
    """Donut: a Swin encoder (shifted windows, patch merging) and an MBart decoder."""
    swin = dict(embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=2)
    encoder = T.DonutSwinModel(T.DonutSwinConfig(image_size=32, patch_size=4, **swin))
    decoder = T.MBartForCausalLM(T.MBartConfig(add_cross_attention=True, is_decoder=True, **BART))
    return _vision_encoder_decoder(encoder, decoder)


def _speech_encoder_decoder():
    """A wav2vec2 encoder (feature extractor, padded frames) and a BERT decoder cross-attending."""
    encoder = T.Wav2Vec2Model(T.Wav2Vec2Config(**AUDIO))
    decoder = T.BertLMHeadModel(T.BertConfig(is_decoder=True, add_cross_attention=True, **ENC))
    model = T.SpeechEncoderDecoderModel(encoder=encoder, decoder=decoder)
    model.config.decoder_start_token_id, model.config.pad_token_id = 2, 0
    return model


def _vivit():
    """ViViT: tubelet embedding (a 3D convolution) and attention over every tubelet."""
    config = T.VivitConfig(image_size=32, num_frames=4, tubelet_size=[2, 8, 8], num_labels=3, **VIT)
    return T.VivitForVideoClassification(config)


def _mask2former():
    """Mask2Former: a Swin backbone, a multi-scale deformable pixel decoder and masked attention
    (each decoder layer attends where the last predicted its query's mask), regressed through its
    queries (its segmentation head's loss needs SciPy's matcher, not installed)."""
    backbone = T.SwinConfig(
        image_size=32, patch_size=4, embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2], window_size=2
    )
    backbone.out_features = ["stage1", "stage2", "stage3", "stage4"]
    config = T.Mask2FormerConfig(
        backbone_config=backbone,
        feature_size=32,
        mask_feature_size=32,
        hidden_dim=32,
        encoder_feedforward_dim=32,
        dim_feedforward=32,
        encoder_layers=1,
        decoder_layers=2,
        num_attention_heads=2,
        num_queries=4,
        num_labels=3,
        common_stride=4,
    )
    return Regressed(T.Mask2FormerModel(config), "transformer_decoder_last_hidden_state")


def _maskformer():
    """MaskFormer: a ResNet backbone, an FPN pixel decoder and a DETR decoder over queries."""
    config = T.MaskFormerConfig(
        backbone_config=_resnet(out_features=["stage1", "stage2"]),
        decoder_config=T.DetrConfig(**dict(DETR, d_model=32)),
        mask_feature_size=32,
        fpn_feature_size=32,
        num_queries=4,
        num_labels=3,
    )
    return Regressed(T.MaskFormerModel(config), "transformer_decoder_last_hidden_state")


def video_text(step: int) -> dict:
    """X-CLIP's: a caption a clip (the second padded), clips of 4 frames."""
    g = _generator(step)
    ids = torch.randint(3, V, (2, 8), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    return dict(
        input_ids=ids, attention_mask=mask, pixel_values=torch.randn(2, 4, 3, 32, 32, generator=g), return_loss=True
    )


def _x_clip():
    """X-CLIP: per-frame ViT with cross-frame message tokens, a multi-frame integration transformer
    and a video-conditioned text prompt generator."""
    vision = dict(VIT, image_size=32, patch_size=8, num_frames=4, mit_hidden_size=32, mit_intermediate_size=64)
    vision.update(mit_num_hidden_layers=1, mit_num_attention_heads=2, drop_path_rate=0.1)
    text = dict(ENC, max_position_embeddings=16)
    text.pop("pad_token_id"), text.pop("bos_token_id"), text.pop("eos_token_id")
    config = T.XCLIPConfig(text_config=text, vision_config=vision, projection_dim=32, prompt_num_attention_heads=2)
    return T.XCLIPModel(config)


def composed(step: int) -> dict:
    """Pop2Piano's: log-mel features (projected by the encoder) with MIDI token labels."""
    g = _generator(step)
    return dict(input_features=torch.randn(2, 8, 32, generator=g), labels=torch.randint(3, V, (2, 6), generator=g))


def _pop2piano():
    """Pop2Piano: T5 with relative position buckets, gated GELU, a composer embedding."""
    config = T.Pop2PianoConfig(
        vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4, pad_token_id=0
    )
    config.decoder_start_token_id = 0
    return T.Pop2PianoForConditionalGeneration(config)


def _mvp():
    """MVP: BART with per-layer prompts (lightweight prompt tuning) in every attention."""
    return T.MvpForConditionalGeneration(T.MvpConfig(use_prompt=True, prompt_length=3, prompt_mid_dim=16, **BART))


def trajectories(step: int) -> dict:
    """Decision Transformer's: states, actions, returns-to-go, timesteps, a padded second row."""
    g = _generator(step)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0
    return dict(
        states=torch.randn(2, 6, 5, generator=g),
        actions=torch.randn(2, 6, 3, generator=g),
        rewards=torch.randn(2, 6, 1, generator=g),
        returns_to_go=torch.randn(2, 6, 1, generator=g),
        timesteps=torch.arange(6).expand(2, 6),
        attention_mask=mask,
    )


def _decision_transformer():
    """A GPT-2 over interleaved (return, state, action) tokens, predicting actions."""
    config = T.DecisionTransformerConfig(state_dim=5, act_dim=3, hidden_size=32, max_ep_len=16, n_layer=2, n_head=2)
    return Regressed(T.DecisionTransformerModel(config), "action_preds")


def documents(step: int) -> dict:
    """LayoutLMv3's: tokens with their boxes (0-1000) and the page image, token labels."""
    g = _generator(step)
    ids = torch.randint(3, V, (2, 8), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    corners = torch.randint(0, 500, (2, 8, 2), generator=g)
    boxes = torch.cat([corners, corners + torch.randint(1, 500, (2, 8, 2), generator=g)], -1)
    labels = torch.randint(0, 3, (2, 8), generator=g)
    return dict(
        input_ids=ids,
        attention_mask=mask,
        bbox=boxes,
        pixel_values=torch.randn(2, 3, 32, 32, generator=g),
        labels=labels,
    )


def _layoutlmv3():
    """LayoutLMv3: text and image patches in one encoder with 1D and 2D relative position biases."""
    config = T.LayoutLMv3Config(
        input_size=32,
        patch_size=8,
        coordinate_size=4,
        shape_size=8,
        num_labels=3,
        rel_pos_bins=8,
        max_rel_pos=16,
        rel_2d_pos_bins=8,
        max_rel_2d_pos=64,
        **ENC,
    )
    return T.LayoutLMv3ForTokenClassification(config)


def _qwen3_5_moe():
    """Qwen3.5-MoE: gated delta-net linear attention beside full attention, routed and shared experts."""
    config = T.Qwen3_5MoeTextConfig(
        head_dim=8,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        shared_expert_intermediate_size=32,
        layer_types=["linear_attention", "full_attention"],
        **EXPERTS,
        **DEC,
    )
    return T.Qwen3_5MoeForCausalLM(config)


def _bark():
    """Bark's semantic model: a GPT with causal attention over text and semantic tokens."""
    config = T.BarkSemanticConfig(
        block_size=64, input_vocab_size=V, output_vocab_size=V, num_layers=2, num_heads=2, hidden_size=32
    )
    return Regressed(T.BarkSemanticModel(config), "logits")  # (its training is not implemented)


def unlabelled_lm(step: int) -> dict:
    b = causal_lm(step)
    del b["labels"]
    return b


def _superpoint():
    """SuperPoint: a VGG-style encoder with a keypoint head (a softmax over 8 x 8 cells) and a
    descriptor head, regressed through its dense scores (keypoints are picked by value)."""
    config = T.SuperPointConfig(encoder_hidden_sizes=[8, 8, 16, 16], decoder_hidden_size=32, descriptor_decoder_dim=16)
    return Regressed(T.SuperPointForKeypointDetection(config), "scores")


def gray_pixels(step: int) -> dict:
    return dict(pixel_values=torch.randn(2, 1, 32, 32, generator=_generator(step)))


RTDETR = dict(
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


def _rtdetr_backbone():
    return T.RTDetrResNetConfig(
        embedding_size=8,
        hidden_sizes=[8, 16, 16, 32],
        depths=[1, 1, 1, 1],
        layer_type="basic",
        out_features=["stage2", "stage3", "stage4"],
    )


def _rt_detr_v2():
    """RT-DETR v2: deformable attention sampling a set number of points per level (discrete sampling off)."""
    config = T.RTDetrV2Config(backbone_config=_rtdetr_backbone(), **RTDETR)
    return Detected(T.RTDetrV2ForObjectDetection(config))


def _d_fine():
    """D-FINE: RT-DETR's encoder, a decoder refining box edges as distributions over bins (FDR)."""
    config = T.DFineConfig(backbone_config=_rtdetr_backbone(), decoder_offset_scale=0.5, **RTDETR)
    config.update(dict(encoder_in_channels=[16, 16, 32], hidden_expansion=0.5))
    return Detected(T.DFineForObjectDetection(config))


def spoken(step: int) -> dict:
    """FastSpeech2's: phonemes (the second padded), their durations summing to 12 frames a row,
    the mel spectrogram of those frames, and pitch and energy per phoneme."""
    g = _generator(step)
    ids = torch.randint(3, 40, (2, 6), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    durations = torch.tensor([[2, 2, 2, 2, 2, 2], [3, 3, 3, 3, 0, 0]])
    return dict(
        input_ids=ids,
        attention_mask=mask,
        spectrogram_labels=torch.randn(2, 12, 8, generator=g),
        duration_labels=durations,
        pitch_labels=torch.randn(2, 6, 1, generator=g),
        energy_labels=torch.randn(2, 6, 1, generator=g),
    )


def _fastspeech2_conformer():
    """FastSpeech2 with Conformer blocks (macaron feed-forwards, convolution modules, relative
    positions), variance predictors and a length regulator expanding phonemes by their durations."""
    config = T.FastSpeech2ConformerConfig(
        hidden_size=32,
        vocab_size=40,
        num_mel_bins=8,
        encoder_num_attention_heads=2,
        encoder_layers=1,
        encoder_linear_units=64,
        decoder_layers=1,
        decoder_num_attention_heads=2,
        decoder_linear_units=64,
        speech_decoder_postnet_layers=2,
        speech_decoder_postnet_units=16,
        duration_predictor_layers=1,
        duration_predictor_channels=16,
        energy_predictor_layers=1,
        energy_predictor_channels=16,
        pitch_predictor_layers=1,
        pitch_predictor_channels=16,
    )
    return T.FastSpeech2ConformerModel(config)


class _TimeResBlock(torch.nn.Module):
    """A diffusion UNet's residual block: group norm, SiLU, convolution, the timestep's embedding
    added per channel, dropout, a second convolution, and a 1x1 skip where the width changes."""

    def __init__(self, cin: int, cout: int, tdim: int):
        super().__init__()
        self.norm1, self.conv1 = torch.nn.GroupNorm(4, cin), torch.nn.Conv2d(cin, cout, 3, padding=1)
        self.time = torch.nn.Linear(tdim, cout)
        self.norm2, self.conv2 = torch.nn.GroupNorm(4, cout), torch.nn.Conv2d(cout, cout, 3, padding=1)
        self.drop = torch.nn.Dropout(0.1)
        self.skip = torch.nn.Conv2d(cin, cout, 1) if cin != cout else torch.nn.Identity()

    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time(F.silu(temb))[:, :, None, None]
        h = self.conv2(self.drop(F.silu(self.norm2(h))))
        return self.skip(x) + h


class _SpatialAttention(torch.nn.Module):
    """Self-attention over a feature map's positions with cross-attention to a context (a prompt)."""

    def __init__(self, channels: int, context: int):
        super().__init__()
        self.norm = torch.nn.GroupNorm(4, channels)
        self.attn = torch.nn.MultiheadAttention(channels, 2, batch_first=True)
        self.cross = torch.nn.MultiheadAttention(channels, 2, kdim=context, vdim=context, batch_first=True)

    def forward(self, x, context):
        b, c, h, w = x.shape
        seq = self.norm(x).flatten(2).transpose(1, 2)
        seq = seq + self.attn(seq, seq, seq, need_weights=False)[0]
        seq = seq + self.cross(seq, context, context, need_weights=False)[0]
        return x + seq.transpose(1, 2).reshape(b, c, h, w)


class TinyUNet(torch.nn.Module):
    """A denoising UNet written with ``torch.nn`` (DDPM-style): sinusoidal timestep embedding, two
    resolutions with residual blocks, attention at the bottom, nearest upsampling and skip
    concatenation; trained on the noise it adds (drawn inside the step) at the batch's timesteps."""

    def __init__(self, channels: int = 16, context: int = 8):
        super().__init__()
        self.tdim = channels * 2
        self.temb = torch.nn.Sequential(torch.nn.Linear(channels, self.tdim), torch.nn.SiLU())
        self.stem = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.down = _TimeResBlock(channels, channels, self.tdim)
        self.pool = torch.nn.Conv2d(channels, channels, 3, stride=2, padding=1)
        self.mid = _TimeResBlock(channels, 2 * channels, self.tdim)
        self.attn = _SpatialAttention(2 * channels, context)
        self.up = _TimeResBlock(3 * channels, channels, self.tdim)
        self.out = torch.nn.Sequential(
            torch.nn.GroupNorm(4, channels), torch.nn.SiLU(), torch.nn.Conv2d(channels, 3, 3, padding=1)
        )
        betas = torch.linspace(1e-4, 0.02, 100)
        self.register_buffer("alphas_cumprod", torch.cumprod(1 - betas, 0))

    def embed(self, t):
        half = self.stem.out_channels // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
        args = t.float()[:, None] * freqs[None]
        return self.temb(torch.cat([args.sin(), args.cos()], -1))

    def forward(self, pixel_values, timesteps, context):
        noise = torch.randn_like(pixel_values)
        a = self.alphas_cumprod[timesteps][:, None, None, None]
        x = a.sqrt() * pixel_values + (1 - a).sqrt() * noise
        temb = self.embed(timesteps)
        skip = self.down(self.stem(x), temb)
        h = self.attn(self.mid(self.pool(skip), temb), context)
        h = F.interpolate(h, scale_factor=2.0, mode="nearest")
        predicted = self.out(self.up(torch.cat([h, skip], 1), temb))
        return RegressedOutput(loss=F.mse_loss(predicted, noise), output=predicted)


def noised(step: int) -> dict:
    g = _generator(step)
    return dict(
        pixel_values=torch.randn(2, 3, 16, 16, generator=g),
        timesteps=torch.randint(0, 100, (2,), generator=g),
        context=torch.randn(2, 5, 8, generator=g),
    )


IMAGE = 98  # (the image token of the vision-language families here)
SIGLIP = dict(VIT, num_hidden_layers=1, image_size=16, patch_size=4)


def _instructblip():
    """InstructBLIP: a Q-Former reading the instruction beside its queries, an OPT decoder."""
    qformer = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    text = T.OPTConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=2, word_embed_proj_dim=32
    )
    config = T.InstructBlipConfig(
        vision_config=SIGLIP,
        qformer_config=dict(qformer, encoder_hidden_size=32, vocab_size=V),
        text_config=text,
        num_query_tokens=4,
        image_token_index=IMAGE,
    )
    return T.InstructBlipForConditionalGeneration(config)


def instructed_images(step: int) -> dict:
    """4 image tokens (the queries' places) then text (the second row padded), and the instruction
    the Q-Former reads."""
    g = _generator(step)
    text = torch.randint(3, 90, (2, 6), generator=g)
    ids = torch.cat([torch.full((2, 4), IMAGE), text], 1)
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    labels = ids.masked_fill((mask == 0) | (ids == IMAGE), -100)
    instruction = torch.randint(3, 90, (2, 5), generator=g)
    return dict(
        input_ids=ids,
        attention_mask=mask,
        labels=labels,
        pixel_values=torch.randn(2, 3, 16, 16, generator=g),
        qformer_input_ids=instruction,
        qformer_attention_mask=torch.ones_like(instruction),
    )


def _kosmos2():
    """Kosmos-2: a CLIP vision tower resampled to latent queries whose embeddings replace the
    text's image positions (``image_embeds_position_mask``), a decoder with sinusoidal positions."""
    text = dict(vocab_size=V, embed_dim=32, layers=2, ffn_dim=64, attention_heads=2, max_position_embeddings=64)
    vision = dict(VIT, image_size=16, patch_size=4)
    return T.Kosmos2ForConditionalGeneration(
        T.Kosmos2Config(text_config=text, vision_config=vision, latent_query_num=4)
    )


def grounded_images(step: int) -> dict:
    g = _generator(step)
    text = torch.randint(3, 90, (2, 6), generator=g)
    ids = torch.cat([torch.ones(2, 1, dtype=torch.long), torch.full((2, 4), 3), text], 1)
    positions = torch.zeros_like(ids)
    positions[:, 1:5] = 1
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    labels = ids.masked_fill((mask == 0) | (positions == 1), -100)
    return dict(
        input_ids=ids,
        attention_mask=mask,
        image_embeds_position_mask=positions,
        labels=labels,
        pixel_values=torch.randn(2, 3, 16, 16, generator=g),
    )


def _owlv2():
    """OWLv2: CLIP towers, per-patch boxes (a box bias by patch position) and class embeddings
    matched against text queries, an objectness head; regressed through logits and boxes."""
    text = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    vision = dict(VIT, image_size=32, patch_size=8)
    config = T.Owlv2Config(text_config=dict(text, max_position_embeddings=16), vision_config=vision, projection_dim=32)
    return Detected(T.Owlv2ForObjectDetection(config))


def queried_pixels(step: int) -> dict:
    """Two text queries an image (four rows of tokens for two images)."""
    g = _generator(step)
    ids = torch.randint(3, 90, (4, 6), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    return dict(input_ids=ids, attention_mask=mask, pixel_values=torch.randn(2, 3, 32, 32, generator=g))


def _zoedepth():
    """ZoeDepth: a BEiT backbone, DPT's neck and a metric bins head with attractors."""
    backbone = T.BeitConfig(
        image_size=32,
        patch_size=8,
        out_indices=[1, 2, 3, 4],
        use_relative_position_bias=True,
        reshape_hidden_states=False,
        **dict(VIT, num_hidden_layers=4),
    )
    config = T.ZoeDepthConfig(
        backbone_config=backbone,
        neck_hidden_sizes=[8, 16, 16, 32],
        reassemble_factors=[4, 2, 1, 0.5],
        fusion_hidden_size=16,
        bottleneck_features=16,
        num_relative_features=16,
        bin_embedding_dim=16,
        num_attractors=[4, 4, 2, 1],
        num_patch_transformer_layers=1,
        patch_transformer_hidden_size=16,
        patch_transformer_intermediate_size=32,
        patch_transformer_num_attention_heads=2,
        bin_configurations=[{"n_bins": 8, "min_depth": 0.001, "max_depth": 10.0, "name": "nyu"}],
    )
    return Regressed(T.ZoeDepthForDepthEstimation(config), "predicted_depth")


def _vitmatte():
    """ViTMatte: a ViTDet backbone over image and trimap, a convolutional detail capture decoder."""
    backbone = T.VitDetConfig(
        image_size=32, patch_size=8, num_channels=4, out_features=["stage2"], **dict(VIT, hidden_size=16)
    )
    config = T.VitMatteConfig(backbone_config=backbone, hidden_size=16, convstream_hidden_sizes=[8, 16])
    config.fusion_hidden_sizes = [16, 8, 4]
    return Regressed(T.VitMatteForImageMatting(config), "alphas")


def trimapped(step: int) -> dict:
    return dict(pixel_values=torch.randn(2, 4, 32, 32, generator=_generator(step)))


def _vits():
    """VITS: a text encoder with windowed relative attention, a stochastic duration predictor
    (flows over noise), a flow and a HiFi-GAN decoder; durations predicted from noise set the
    waveform's length, so a call's length is its own."""
    config = T.VitsConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        ffn_dim=32,
        flow_size=8,
        spectrogram_bins=9,
        upsample_initial_channel=16,
        upsample_rates=[4, 4],
        upsample_kernel_sizes=[8, 8],
        resblock_kernel_sizes=[3],
        resblock_dilation_sizes=[[1, 3]],
        depth_separable_channels=2,
        depth_separable_num_layers=2,
        duration_predictor_filter_channels=16,
        prior_encoder_num_flows=2,
        prior_encoder_num_wavenet_layers=2,
        wavenet_kernel_size=3,
        layerdrop=0.0,  # (its LayerDrop draws from NumPy's generator: ``jit`` refuses the line where it is used)
    )
    return Regressed(T.VitsModel(config), "waveform")


def phonemes(step: int) -> dict:
    g = _generator(step)
    ids = torch.randint(3, 40, (2, 6), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    return dict(input_ids=ids, attention_mask=mask)


def _idefics2():
    """Idefics2: a SigLIP-style vision tower over padded image tiles (a pixel attention mask), a
    perceiver resampler to 4 latents, a Mistral decoder."""
    text = T.MistralConfig(head_dim=8, **DEC)
    perceiver = dict(resampler_n_latents=4, resampler_depth=1, resampler_n_heads=2, resampler_head_dim=8)
    config = T.Idefics2Config(
        text_config=text,
        vision_config=SIGLIP,
        perceiver_config=dict(perceiver, num_key_value_heads=1),
        image_token_id=IMAGE,
    )
    return T.Idefics2ForConditionalGeneration(config)


def resampled_images(step: int) -> dict:
    """4 image tokens (the latents' places) then text, one 16-pixel image a row."""
    b = instructed_images(step)
    return dict(
        input_ids=b["input_ids"],
        attention_mask=b["attention_mask"],
        labels=b["labels"],
        pixel_values=b["pixel_values"][:, None],
    )


FAMILIES = {
    "trocr": Family(_trocr, captioned),
    "donut": Family(_donut, captioned),
    "speech_encoder_decoder": Family(_speech_encoder_decoder, transcribed),
    "vivit": Family(_vivit, clips),
    "mask2former": Family(_mask2former, pixels),
    "maskformer": Family(_maskformer, pixels),
    "x_clip": Family(_x_clip, video_text),
    "pop2piano": Family(_pop2piano, composed),
    "mvp": Family(_mvp, seq2seq),
    "decision_transformer": Family(_decision_transformer, trajectories),
    "layoutlmv3": Family(_layoutlmv3, documents),
    "qwen3_5_moe": Family(_qwen3_5_moe, causal_lm),
    "bark": Family(_bark, unlabelled_lm),
    "superpoint": Family(_superpoint, gray_pixels),
    "rt_detr_v2": Family(_rt_detr_v2, large_pixels),
    "d_fine": Family(_d_fine, large_pixels),
    "fastspeech2_conformer": Family(_fastspeech2_conformer, spoken),
    "unet": Family(TinyUNet, noised),
    "instructblip": Family(_instructblip, instructed_images),
    "kosmos2": Family(_kosmos2, grounded_images),
    "owlv2": Family(_owlv2, queried_pixels),
    "zoedepth": Family(_zoedepth, pixels),
    "vitmatte": Family(_vitmatte, trimapped),
    "vits": Family(_vits, phonemes),
    "idefics2": Family(_idefics2, resampled_images),
}
