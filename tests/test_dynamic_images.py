"""Images and sequences of changing sizes through convolutions (issue 26): a convolution's meta
rule computes its output's spatial sizes from symbolic input sizes (``(H + 2p - d(k - 1) - 1) // s
+ 1``, transposed ``(H - 1) s - 2p + d(k - 1) + op + 1``), so a CNN over images of several sizes
compiles twice, not once per size; channels stay constant (the weight's) except where a symbolic
``groups`` counts them (a depthwise convolution of any channel count, vmap's per-sample weights). A mean over symbolic
sizes divides by them as sizes (group norm, mean pooling), and a view's ``-1`` divides a multiple
of a length less one (wav2vec2's feature encoder over audio of any length). Every call is checked
against eager: outputs, gradients, and the error of an input too small for its kernel.
"""

import copy

import pytest
import torch
import torch.nn.functional as F

import thunder_rs
from twin_training import train_like_eager

torchvision = pytest.importorskip("torchvision")

pytestmark = pytest.mark.usefixtures("one_thread")


def misses(jfn) -> int:
    return thunder_rs.compile_stats(jfn).cache_misses


def test_resnet_trains_on_images_of_several_sizes_in_two_compiles():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).train()
    sizes = [(64, 64), (80, 96), (96, 64), (72, 72), (65, 97)]
    inputs = [torch.randn(2, 3, h, w) for h, w in sizes]
    jmodel = train_like_eager(model, inputs, rtol=1e-4, atol=1e-5)
    assert misses(jmodel) == 2
    assert "compiled with symbolic sizes x.shape[2], x.shape[3]" in thunder_rs.compile_stats(jmodel).miss_reasons[1]


class TextCNN(torch.nn.Module):
    """A 1-D CNN over token embeddings of any length: strided, padded and dilated convolutions."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)
        self.conv1 = torch.nn.Conv1d(8, 16, 5, stride=2, padding=2)
        self.conv2 = torch.nn.Conv1d(16, 16, 3, dilation=2)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, ids):
        h = self.embed(ids).transpose(1, 2)
        h = F.relu(self.conv2(F.relu(self.conv1(h))))
        return self.head(h.amax(-1))


def test_a_text_cnn_trains_over_every_sequence_length():
    torch.manual_seed(0)
    model = TextCNN()
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    for n in [12, 17, 30, 41, 64, 13]:
        ids = torch.randint(0, 50, (3, n))
        out, expected = jmodel(ids), eager(ids)
        torch.testing.assert_close(out, expected)
        out.sum().backward()
        expected.sum().backward()
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
    assert misses(jmodel) == 2


def test_a_transposed_convolution_upsamples_every_size():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.ConvTranspose2d(8, 3, 3, stride=2, padding=1, output_padding=1),
    )
    inputs = [torch.randn(1, 3, h, w) for h, w in [(8, 8), (10, 14), (16, 12), (22, 6)]]
    jmodel = train_like_eager(model, inputs)
    assert misses(jmodel) == 2
    assert jmodel(torch.randn(1, 3, 9, 9)).shape == (1, 3, 10, 10)


def test_an_image_too_small_for_the_kernel_fails_as_eager_fails():
    conv = torch.nn.Conv2d(3, 4, 5)
    jconv = thunder_rs.jit(conv)
    with torch.no_grad():
        for n in [8, 12, 16]:
            x = torch.randn(1, 3, n, n)
            torch.testing.assert_close(jconv(x), conv(x))
        assert misses(jconv) == 2
        x = torch.randn(1, 3, 4, 4)
        with pytest.raises(RuntimeError) as eager_error:
            conv(x)
        with pytest.raises(RuntimeError, match="too small"):
            jconv(x)
    assert type(eager_error.value) is RuntimeError


def test_a_size_that_shared_a_symbol_and_no_longer_does_is_named_in_the_miss_reason():
    # Square images first: height and width share one size (duck sizing, as torch.compile).
    conv = torch.nn.Conv2d(3, 4, 3)
    jconv = thunder_rs.jit(conv)
    with torch.no_grad():
        for h, w in [(8, 8), (10, 10), (12, 12), (12, 16)]:
            x = torch.randn(1, 3, h, w)
            torch.testing.assert_close(jconv(x), conv(x))
    assert misses(jconv) == 3
    reason = thunder_rs.compile_stats(jconv).miss_reasons[-1]
    assert "does not serve it: input.shape[3] == t0 fails (t0 = input.shape[2] = 12)" in reason


class GroupNormCNN(torch.nn.Module):
    """Convolutions with group norm (statistics over the spatial sizes) and mean pooling."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.norm = torch.nn.GroupNorm(2, 8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.head(F.gelu(self.norm(self.conv(x))).mean((2, 3)))


def test_group_norm_and_mean_pooling_over_image_sizes_in_two_compiles():
    torch.manual_seed(0)
    inputs = [torch.randn(2, 3, h, w) for h, w in [(8, 8), (10, 14), (16, 12), (7, 9)]]
    jmodel = train_like_eager(GroupNormCNN(), inputs, rtol=1e-4, atol=1e-5)
    assert misses(jmodel) == 2


def test_a_view_of_a_length_less_one_into_heads_stays_symbolic():
    # (T - 1) tokens viewed as heads with -1: the -1 divides 16*(T - 1) by 8*(T - 1).
    def fn(x):
        y = x[:, 1:] * 2
        return y.view(2, x.shape[1] - 1, -1, 4).transpose(1, 2).sum(-1)

    jf = thunder_rs.jit(fn)
    for n in [5, 8, 13, 21]:
        x = torch.randn(2, n, 8)
        torch.testing.assert_close(jf(x), fn(x))
    assert misses(jf) == 2


def tiny_wav2vec2(layerdrop: float):
    """A two-layer HF wav2vec2 in train mode, seeded: its feature encoder convolves audio of any length."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Wav2Vec2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        conv_dim=(16, 16),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        mask_time_prob=0.0,
        layerdrop=layerdrop,
    )
    torch.manual_seed(0)
    return transformers.Wav2Vec2Model(config).train()


def test_wav2vec2_trains_over_audio_lengths_in_two_compiles():
    model = tiny_wav2vec2(layerdrop=0.0)
    batches = [dict(input_values=torch.randn(2, n)) for n in [400, 560, 720, 1001]]
    jmodel = train_like_eager(model, batches, lambda out: out.last_hidden_state, rtol=1e-4, atol=1e-5)
    assert misses(jmodel) == 2


class UpsamplingDecoder(torch.nn.Module):
    """An FPN-like decoder: features downsampled by a strided convolution, upsampled by 2
    (nearest and bilinear) and added back."""

    def __init__(self):
        super().__init__()
        self.down = torch.nn.Conv2d(3, 6, 3, stride=2, padding=1)
        self.lateral = torch.nn.Conv2d(3, 6, 1)
        self.up = torch.nn.Upsample(scale_factor=2, mode="nearest")

    def forward(self, x):
        coarse = self.down(x)
        smooth = F.interpolate(coarse, scale_factor=2, mode="bilinear", align_corners=False)
        return self.lateral(x) + self.up(coarse) + smooth


def test_upsampling_by_a_whole_factor_keeps_image_sizes_symbolic():
    torch.manual_seed(0)
    # Even sizes: the strided convolution halves them exactly, so the upsampled map fits again.
    inputs = [torch.randn(2, 3, h, w) for h, w in [(8, 8), (10, 14), (16, 12), (22, 6)]]
    jmodel = train_like_eager(UpsamplingDecoder(), inputs, rtol=1e-4, atol=1e-5)
    assert misses(jmodel) == 2


def test_a_torchvision_vit_trains_over_batch_sizes_in_two_compiles():
    """torchvision's ViT checks its input with ``torch._assert(..., f"... got {input.shape}")``:
    the message no longer specialises the batch size (it compiled once per batch size)."""
    vision_transformer = pytest.importorskip("torchvision.models.vision_transformer")
    torch.manual_seed(0)
    model = vision_transformer.VisionTransformer(
        image_size=32, patch_size=8, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=32, num_classes=5
    )
    jmodel = train_like_eager(model, [torch.randn(b, 3, 32, 32) for b in (2, 3, 5, 4)])
    assert misses(jmodel) == 2


def test_a_convolution_grouped_by_a_changing_channel_count_compiles_twice():
    # ``groups=x.shape[1]`` (a depthwise convolution of however many channels come, with their
    # weights): the count is symbolic, as the channels it groups; once a guard per channel count.
    def f(x, w, b):
        return F.conv2d(x, w, b, padding=1, groups=x.shape[1]).relu().sum((2, 3))

    jf = thunder_rs.jit(f)
    for channels in (3, 5, 7, 4):
        args = [torch.randn(s, requires_grad=True) for s in ((2, channels, 6, 6), (channels, 1, 3, 3), (channels,))]
        eager_args = [a.detach().clone().requires_grad_() for a in args]
        out, expected = jf(*args), f(*eager_args)
        torch.testing.assert_close(out, expected)
        out.square().sum().backward()
        expected.square().sum().backward()
        torch.testing.assert_close([a.grad for a in args], [a.grad for a in eager_args])
    assert misses(jf) == 2, thunder_rs.compile_stats(jf).miss_reasons


def test_per_sample_grouped_convolutions_under_vmap_compile_twice_over_batch_and_channel_sizes():
    # vmap folds the per-sample weights into the groups (``2 * B`` of a weight dim ``B * C``): whether
    # ``C`` divides by 2 is a guard on ``C``, not the batch size made constant (a compile per batch size).
    def f(xs, ws):
        return torch.vmap(lambda x, w: F.conv1d(x, w, groups=2))(xs, ws)

    jf = thunder_rs.jit(f)
    for b, c in ((2, 4), (3, 6), (4, 8), (5, 10), (3, 4)):
        xs, ws = torch.randn(b, 1, 4, 8), torch.randn(b, c, 2, 3)
        torch.testing.assert_close(jf(xs, ws), f(xs, ws))
    assert misses(jf) == 2, thunder_rs.compile_stats(jf).miss_reasons
    xs, ws = torch.randn(3, 1, 4, 8), torch.randn(3, 5, 2, 3)  # (an odd C: eager's error)
    for fn in (f, jf):
        with pytest.raises(RuntimeError, match="divisible by"):
            fn(xs, ws)
