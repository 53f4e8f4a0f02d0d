"""torchvision's model zoo trained under thunder_rs.jit next to an eager copy: classification
(ConvNeXt, EfficientNet v1/v2 with stochastic depth, ShuffleNet's channel shuffle, DenseNet's
concatenations, RegNet, MNASNet, GoogLeNet and Inception v3 with their auxiliary logits in train
mode, Swin v1/v2, MaxViT, ViT, SqueezeNet), segmentation (FCN, DeepLabV3, LR-ASPP), video (R3D,
MC3, R(2+1)D, MViT) and optical flow (RAFT's iterative updates), and in eval mode over image and
batch sizes.

Each step compares every output (values, dtypes and strides), every gradient, the buffers (batch
norm's running statistics) and the parameters after an SGD step, in float64. Randomly initialised
networks over tiny batches are ill-conditioned (EfficientNet's gradients reach 1e9, and a batch
norm's bias gradient that is zero in exact arithmetic is 1e-7 of rounding), so gradients are
compared to the model's largest one, and the jitted model restarts each step from eager's
parameters (rounding differences would otherwise grow step by step, in eager against eager too).
Inputs are the smallest the models take (2 x 3 x 32 x 32; Inception's auxiliary head needs 299).
ShuffleNet and a small ConvNeXt run by default; the rest are ``slow``."""

import copy

import pytest
import torch

import thunder_rs

torchvision = pytest.importorskip("torchvision")
models = torchvision.models

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = dict(rtol=1e-7, atol=1e-9)


def image(batch=2, size=32):
    return torch.randn(batch, 3, size, size)


def clip(batch=2, size=32):
    return torch.randn(batch, 3, 4, size, size)


def small_convnext():
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt  # noqa: PLC0415

    # The last stage is 1x1 at 32 px: its blocks permute [N, 1, 1, C] back to [N, C, 1, 1].
    blocks = [CNBlockConfig(8, 16, 1), CNBlockConfig(16, 32, 1), CNBlockConfig(32, 32, 2), CNBlockConfig(32, None, 2)]
    return ConvNeXt(blocks, stochastic_depth_prob=0.2, num_classes=10)


def small_swin(v2: bool):
    from torchvision.models import swin_transformer as swin  # noqa: PLC0415

    kind = dict(block=swin.SwinTransformerBlockV2, downsample_layer=swin.PatchMergingV2) if v2 else {}
    return swin.SwinTransformer(
        [4, 4], 16, [1, 1, 2], [2, 2, 4], [4, 4], stochastic_depth_prob=0.2, num_classes=10, **kind
    )


def small_maxvit():
    from torchvision.models.maxvit import MaxVit  # noqa: PLC0415

    return MaxVit(
        input_size=(32, 32), stem_channels=8, partition_size=2, block_channels=[16, 32], block_layers=[1, 1],
        head_dim=8, stochastic_depth_prob=0.2, num_classes=10,
    )  # fmt: skip


def small_mvit():
    from torchvision.models.video.mvit import MSBlockConfig, MViT  # noqa: PLC0415

    stages = [
        MSBlockConfig(1, 16, 16, [3, 3, 3], [3, 3, 3], [1, 1, 1], [1, 2, 2]),
        MSBlockConfig(2, 16, 32, [3, 3, 3], [3, 3, 3], [1, 2, 2], [1, 1, 1]),
    ]
    return MViT(
        (32, 32), 4, stages, residual_pool=True, residual_with_cls_embed=False, rel_pos_embed=True,
        proj_after_attn=True, stochastic_depth_prob=0.2, num_classes=10, patch_embed_kernel=(3, 7, 7),
        patch_embed_stride=(2, 4, 4), patch_embed_padding=(1, 3, 3),
    )  # fmt: skip


NC = dict(num_classes=10)
SEGMENTATION = dict(weights=None, weights_backbone=None, **NC)
segmentation = torchvision.models.segmentation

#: name -> (model factory, input); the names in DEFAULT run without --run-slow.
ZOO = {
    "shufflenet_v2": (lambda: models.shufflenet_v2_x0_5(**NC), image),
    "convnext_small_config": (small_convnext, image),
    "convnext_tiny": (lambda: models.convnext_tiny(**NC), image),
    "efficientnet_b0": (lambda: models.efficientnet_b0(**NC), image),
    "efficientnet_v2_s": (lambda: models.efficientnet_v2_s(**NC), image),
    "densenet121": (lambda: models.densenet121(**NC), image),
    "regnet_y_400mf": (lambda: models.regnet_y_400mf(**NC), image),
    "mnasnet0_5": (lambda: models.mnasnet0_5(**NC), image),
    "googlenet": (lambda: models.googlenet(aux_logits=True, init_weights=False, **NC), image),
    "inception_v3": (
        lambda: models.inception_v3(aux_logits=True, init_weights=False, **NC),
        lambda: image(size=299),
    ),
    "swin": (lambda: small_swin(v2=False), image),
    "swin_v2": (lambda: small_swin(v2=True), image),
    "maxvit": (small_maxvit, image),
    "vit": (lambda: models.VisionTransformer(32, 8, 2, 2, 16, 32, num_classes=10), image),
    "fcn_resnet50": (lambda: segmentation.fcn_resnet50(aux_loss=True, **SEGMENTATION), image),
    "deeplabv3_mobilenet_v3": (lambda: segmentation.deeplabv3_mobilenet_v3_large(aux_loss=True, **SEGMENTATION), image),
    "lraspp_mobilenet_v3": (lambda: segmentation.lraspp_mobilenet_v3_large(**SEGMENTATION), image),
    "squeezenet1_1": (lambda: models.squeezenet1_1(**NC), lambda batch=2, size=64: image(batch, size)),
    "r3d_18": (lambda: models.video.r3d_18(**NC), clip),
    "mc3_18": (lambda: models.video.mc3_18(**NC), clip),
    "r2plus1d_18": (lambda: models.video.r2plus1d_18(**NC), clip),
    "mvit": (small_mvit, clip),
}
DEFAULT = ("shufflenet_v2", "convnext_small_config")


def tensors(out) -> list:
    """The tensors of a model's output: a tensor, GoogLeNet's and Inception's named tuples of
    logits, a segmentation model's dict."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    return [t for part in out for t in tensors(part)]


def assert_like_eager(actual, expected, what, **tol):
    torch.testing.assert_close(actual, expected, **tol, msg=lambda m: f"{what}: {m}")
    assert actual.stride() == expected.stride(), f"{what}: strides {actual.stride()} != {expected.stride()}"


def train_like_eager(model, inputs, tol=TOL, executors=None):
    """An SGD step of ``model`` jitted (with ``executors``) next to an eager copy for each of
    ``inputs`` (see the module doc), in their dtype."""
    model = model.to(inputs[0].dtype).train()
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model, executors=executors)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, eager)]
    for step, x in enumerate(inputs):
        outs = []
        for fn, opt in zip((jmodel, eager), optimizers):
            opt.zero_grad(set_to_none=True)
            torch.manual_seed(step)  # dropout and stochastic depth draw alike
            outs.append(tensors(fn(x)))
            sum(t.square().mean() for t in outs[-1]).backward()
        for i, (out, expected) in enumerate(zip(*outs, strict=True)):
            assert_like_eager(out, expected, f"step {step} output {i}", **tol)
        scale = max(p.grad.abs().max().item() for p in eager.parameters() if p.grad is not None)
        for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
            assert (p.grad is None) == (q.grad is None), f"step {step}: gradient of {name}"
            if q.grad is not None:
                atol = tol["atol"] * max(scale, 1.0)
                assert_like_eager(p.grad, q.grad, f"step {step} gradient of {name}", rtol=tol["rtol"], atol=atol)
        for (name, b), c in zip(model.named_buffers(), eager.buffers(), strict=True):
            assert_like_eager(b, c, f"step {step} buffer {name}", **tol)
        for m, opt in zip((model, eager), optimizers):
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
        for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
            torch.testing.assert_close(p, q, **tol, msg=lambda m: f"step {step} {name} after SGD: {m}")
        model.load_state_dict(eager.state_dict())
    return jmodel


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=() if n in DEFAULT else pytest.mark.slow) for n in ZOO]
)  # fmt: skip
def test_a_zoo_model_trains_as_eager(name):
    make_model, make_input = ZOO[name]
    torch.manual_seed(0)
    jmodel = train_like_eager(make_model(), [make_input().double() for _ in range(2)])
    assert thunder_rs.compile_stats(jmodel).cache_misses == 1


#: name -> (batch, image size): nvFuser's regions reduce in another order than ATen's kernels, and
#: batch norm over 2 x 1 x 1 values turns float64's rounding into differences of 1e-5 (eager's
#: float32 logits differ from its float64 ones by 100% there): these batches are well conditioned.
WITH_NVFUSER = {
    "shufflenet_v2": (2, 32),
    "efficientnet_b0": (4, 64),
    "densenet121": (4, 64),
    "deeplabv3_mobilenet_v3": (2, 32),
}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=() if n in DEFAULT else pytest.mark.slow) for n in WITH_NVFUSER]
)  # fmt: skip
def test_a_zoo_model_trains_as_eager_with_nvfusers_regions(name, fake_ex):
    make_model, make_input = ZOO[name]
    torch.manual_seed(0)
    batch, size = WITH_NVFUSER[name]
    inputs = [make_input(batch, size).double() for _ in range(2)]
    jmodel = train_like_eager(make_model(), inputs, executors=[fake_ex])
    assert thunder_rs.compile_stats(jmodel).cache_misses == 1 and fake_ex.stats["definitions"] >= 1


#: Models whose Python does not branch on the image size: 3 compiles over sizes (the first call's,
#: one with symbolic image sizes, one with a symbolic batch size too).
OVER_SIZES = ["convnext_small_config", "efficientnet_b0", "densenet121", "googlenet", "regnet_y_400mf", "r3d_18"]


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=() if n in DEFAULT else pytest.mark.slow) for n in OVER_SIZES]
)  # fmt: skip
@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels_last"])
def test_a_zoo_model_trains_over_image_and_batch_sizes_in_three_compiles(name, channels_last):
    """In float32, where ATen's kernels choose their layouts (a depthwise convolution after
    ConvNeXt's permute of [N, 1, 1, C] returns channels_last weight gradients)."""
    make_model, make_input = ZOO[name]
    torch.manual_seed(0)
    inputs = [make_input(batch, size) for batch, size in [(2, 32), (2, 48), (3, 40), (2, 56)]]
    model = make_model()
    if channels_last:
        fmt = torch.channels_last if inputs[0].dim() == 4 else torch.channels_last_3d
        model = model.to(memory_format=fmt)
        inputs = [x.contiguous(memory_format=fmt) for x in inputs]
    jmodel = train_like_eager(model, inputs, tol=dict(rtol=1e-4, atol=1e-5))
    assert thunder_rs.compile_stats(jmodel).cache_misses == 3


#: name -> the two image sizes evaluated (SqueezeNet's final pooling needs 64 px).
OVER_SIZES_EVAL = {
    "squeezenet1_1": (64, 80),
    **{n: (32, 48) for n in ["shufflenet_v2", "densenet121", "googlenet", "regnet_y_400mf", "mnasnet0_5"]},
    **{n: (32, 48) for n in ["efficientnet_v2_s", "r3d_18", "mc3_18", "r2plus1d_18"]},
}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=() if n == "squeezenet1_1" else pytest.mark.slow) for n in OVER_SIZES_EVAL]
)  # fmt: skip
def test_a_zoo_model_evaluates_as_eager_over_image_and_batch_sizes_in_three_compiles(name):
    """In eval mode without grad, batches of 2 and 3 at two image sizes: the first call's
    compile, one with a symbolic batch size, one with symbolic image sizes too."""
    make_model, make_input = ZOO[name]
    torch.manual_seed(0)
    model = make_model().double().eval()
    jmodel = thunder_rs.jit(model)
    for size in OVER_SIZES_EVAL[name]:
        for batch in (2, 3):
            x = make_input(batch, size).double()
            with torch.no_grad():
                outs, expected = tensors(jmodel(x)), tensors(model(x))
            for i, (out, want) in enumerate(zip(outs, expected, strict=True)):
                assert_like_eager(out, want, f"{batch} x {size} px output {i}", **TOL)
    assert thunder_rs.compile_stats(jmodel).cache_misses == 3


def test_a_zoo_model_evaluates_as_eager_without_grad():
    torch.manual_seed(0)
    model = small_convnext().double().eval()
    x = image().double()
    with torch.no_grad():
        out, expected = thunder_rs.jit(model)(x), model(x)
    assert_like_eager(out, expected, "logits", **TOL)


@pytest.mark.slow
def test_raft_trains_and_evaluates_as_eager_in_one_compile_each():
    """RAFT's iterative refinement (3 updates, a flow per update) in float32 (its coordinate grid
    is float32 whatever the model's dtype, which ``grid_sample`` refuses in float64, in eager too).
    Its correlation block stores a new pyramid of tensors on itself at each call and reads it in
    another method: the list the last call left is no state this call reads (every call compiled
    again: 'the contents of CorrBlock.corr_pyramid changed'). Training: flows, gradients and
    the stored pyramid as eager's over 3 steps in one compile; eval at 2 batches and sizes."""
    optical_flow = torchvision.models.optical_flow
    tol = dict(rtol=1e-4, atol=1e-5)
    torch.manual_seed(0)
    model = optical_flow.raft_small(weights=None).train()
    eager, jmodel = copy.deepcopy(model), thunder_rs.jit(model)
    for step in range(3):
        pair = [torch.rand(2, 3, 128, 128) * 2 - 1 for _ in range(2)]
        flows, expected = jmodel(*pair, num_flow_updates=3), eager(*pair, num_flow_updates=3)
        for i, (flow, want) in enumerate(zip(flows, expected, strict=True)):
            assert_like_eager(flow, want, f"step {step} flow {i}", **tol)
        sum(f.square().mean() for f in flows).backward()
        sum(f.square().mean() for f in expected).backward()
        for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
            assert (p.grad is None) == (q.grad is None), name
            if q.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, msg=name, **tol)
        for level, want in zip(model.corr_block.corr_pyramid, eager.corr_block.corr_pyramid, strict=True):
            torch.testing.assert_close(level, want, **tol)
        model.zero_grad(), eager.zero_grad()
    assert thunder_rs.compile_stats(jmodel).cache_misses == 1
    model.eval(), eager.eval()
    jmodel = thunder_rs.jit(model)
    for batch, size in [(2, 128), (3, 128), (2, 160), (3, 160)]:
        pair = [torch.rand(batch, 3, size, size) * 2 - 1 for _ in range(2)]
        with torch.no_grad():
            flows, expected = jmodel(*pair, num_flow_updates=3), eager(*pair, num_flow_updates=3)
        for i, (flow, want) in enumerate(zip(flows, expected, strict=True)):
            assert_like_eager(flow, want, f"eval {batch} x {size} px flow {i}", **tol)
    assert thunder_rs.compile_stats(jmodel).cache_misses == 3
