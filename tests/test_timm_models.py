"""timm's image models trained under thunder_rs.jit next to an eager copy (``pretrained=False``,
nothing is downloaded): ResNets, EfficientNets, MobileNets, ConvNeXt, NFNets, CSP and DLA nets,
HRNet, ViT, DeiT (distilled too), Swin, BEiT, EVA-02, CaiT, XCiT, MaxViT, CoAtNet, MobileViT,
PoolFormer, MLP-Mixer, ConvNeXt-V2, TNT, LeViT and EfficientFormer (v2) and others, each at the
smallest input it takes, in float64; a few with stochastic depth.

Each step compares every output (values, dtypes and strides), every gradient, the buffers and the
parameters after an SGD step (``test_torchvision_zoo.train_like_eager``). timm's ``test_*`` models,
a few hundred thousand parameters, run by default; the rest are ``slow``.
"""

import copy

import pytest
import torch

import thunder_rs

timm = pytest.importorskip("timm")

from test_torchvision_zoo import TOL, assert_like_eager, tensors, train_like_eager  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

#: EfficientViT's linear attention computes in float32 whatever the model's dtype (``q.float()``).
FLOAT32_INSIDE = dict(rtol=1e-4, atol=1e-5)

#: name -> image size, for models whose sizes are fixed or that need more than 32 px.
SIZES = {
    "efficientformer_l1": 224,  # attention biases for a 7 x 7 grid
    "levit_128s": 64,
    "crossvit_tiny_240": 240,
    "halonet26t": 256,  # eager asserts the feature maps divide into its blocks below 256
    "coatnet_nano_rw_224": 64,
    "efficientformerv2_s0": 224,
    "levit_conv_128s": 64,
    "tnt_s_patch16_224": 224,
}

MODELS = """
test_resnet test_vit test_vit2 test_vit3 test_vit4 test_vit_relpos test_convnext test_convnext2
test_convnext3 test_efficientnet test_efficientnet_gn test_efficientnet_ln test_efficientnet_evos
test_byobnet test_nfnet test_coatnet test_maxvit test_mambaout resnet10t resnet18 efficientnet_b0
tf_efficientnet_lite0 mobilenetv3_small_050 mobilenetv4_conv_small convnext_atto vit_tiny_patch16_224
deit_tiny_patch16_224 mobilevit_xxs regnetx_002 nf_resnet26 eca_nfnet_l0 cspresnet50 cspdarknet53
cs3darknet_focus_s dla34 hrnet_w18_small res2net50_14w_8s skresnet18 ghostnet_050 pit_ti_224
xcit_nano_12_p16_224 convit_tiny poolformer_s12 fastvit_t8 repvgg_a0 edgenext_xx_small mixer_s32_224
resmlp_12_224 tinynet_e lcnet_050 rexnet_100 repvit_m0_9 hgnetv2_b0 coatnet_nano_rw_224
maxvit_nano_rw_256 swin_tiny_patch4_window7_224 davit_tiny gcvit_xxtiny twins_svt_small cait_xxs24_224
eva02_tiny_patch14_224 beit_base_patch16_224 pvt_v2_b0 focalnet_tiny_srf mambaout_femto starnet_s050
fasternet_t0 inception_next_atto selecsls42b dpn68 legacy_seresnet18 resnest14d ese_vovnet19b_dw
mixnet_s gernet_s botnet26t_256 lambda_resnet26t visformer_tiny sequencer2d_s hiera_tiny_224
efficientvit_b0 efficientformer_l1 levit_128s crossvit_tiny_240 halonet26t convnextv2_atto
deit_tiny_distilled_patch16_224 efficientformerv2_s0 levit_conv_128s tnt_s_patch16_224
""".split()
DEFAULT = ("test_resnet", "test_vit")


def make(name: str, size: int, **kwargs):
    """``name`` with 10 classes, for ``size`` px images where the model takes an ``img_size``."""
    try:
        return timm.create_model(name, pretrained=False, num_classes=10, img_size=size, **kwargs)
    except TypeError:
        return timm.create_model(name, pretrained=False, num_classes=10, **kwargs)


def params(names):
    return [pytest.param(n, marks=() if n in DEFAULT else pytest.mark.slow) for n in names]


@pytest.mark.parametrize("name", params(MODELS))
def test_a_timm_model_trains_as_eager(name):
    size = SIZES.get(name, 32)
    torch.manual_seed(0)
    model = make(name, size)
    inputs = [torch.randn(2, 3, size, size, dtype=torch.float64) for _ in range(2)]
    jmodel = train_like_eager(model, inputs, tol=FLOAT32_INSIDE if name == "efficientvit_b0" else TOL)
    assert thunder_rs.compile_stats(jmodel).cache_misses == 1


#: Stochastic depth (timm's ``drop_path_rate``) in the blocks, squeeze-excitation in the
#: EfficientNets and MixNet, GRN in ConvNeXt-V2: drawn alike for both models by the same seed.
DROP_PATH = ["test_efficientnet", "efficientnet_b0", "mixnet_s", "convnextv2_atto", "test_vit", "test_coatnet",
             "test_maxvit", "resnest14d", "res2net50_14w_8s", "poolformer_s12", "xcit_nano_12_p16_224"]  # fmt: skip


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=() if n == DROP_PATH[0] else pytest.mark.slow) for n in DROP_PATH]
)  # fmt: skip
def test_a_timm_model_with_drop_path_trains_as_eager(name):
    torch.manual_seed(0)
    model = make(name, 32, drop_path_rate=0.2)
    inputs = [torch.randn(2, 3, 32, 32, dtype=torch.float64) for _ in range(2)]
    assert thunder_rs.compile_stats(train_like_eager(model, inputs)).cache_misses == 1


EVAL = ["test_resnet", "test_vit", "test_convnext", "test_efficientnet", "test_coatnet", "test_maxvit",
        "test_nfnet", "mobilevit_xxs", "swin_tiny_patch4_window7_224", "hrnet_w18_small"]  # fmt: skip


@pytest.mark.parametrize("name", params(EVAL))
def test_a_timm_model_evaluates_as_eager_without_grad(name):
    torch.manual_seed(0)
    model = make(name, 32).double().eval()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        outs, expected = tensors(thunder_rs.jit(model)(x)), tensors(model(x))
    for i, (out, want) in enumerate(zip(outs, expected, strict=True)):
        assert_like_eager(out, want, f"output {i}", **TOL)


OVER_BATCHES = ["test_resnet", "test_vit", "test_convnext", "resnet18", "convnext_atto", "efficientnet_b0"]


@pytest.mark.parametrize("name", params(OVER_BATCHES))
def test_a_timm_model_trains_over_batch_sizes_in_two_compiles(name):
    """The first call's compile, then one with a symbolic batch size for every later batch."""
    torch.manual_seed(0)
    inputs = [torch.randn(batch, 3, 32, 32, dtype=torch.float64) for batch in (2, 3, 4, 2)]
    jmodel = train_like_eager(make(name, 32), inputs)
    assert thunder_rs.compile_stats(jmodel).cache_misses == 2


def _bias_caches(model) -> list:
    return [m.attention_bias_cache for m in model.modules() if hasattr(m, "attention_bias_cache")]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["levit_128s", "efficientformer_l1"])
def test_an_attention_bias_cache_in_eval_mode_is_filled_and_read_as_eager(name):
    """LeViT and EfficientFormer keep the attention biases they gather in eval mode in a dict for
    later calls: the first call stores them after running, the second finds them there and
    compiles once more to read them, later calls run that compile. ``train()`` clears the dicts,
    and the next eval call fills them again (through the first compile), which the second reads."""
    size = SIZES[name]
    torch.manual_seed(0)
    model = make(name, size).double().eval()
    eager, jmodel = copy.deepcopy(model), thunder_rs.jit(model)
    x = torch.randn(2, 3, size, size, dtype=torch.float64)
    for _ in range(2):
        with torch.no_grad():
            for _ in range(3):
                torch.testing.assert_close(jmodel(x), eager(x), rtol=0, atol=0)
                for cache, expected in zip(_bias_caches(model), _bias_caches(eager), strict=True):
                    assert cache.keys() == expected.keys() == {"cpu"}
                    torch.testing.assert_close(cache["cpu"], expected["cpu"], rtol=0, atol=0)
        model.train().eval(), eager.train().eval()
        assert not any(_bias_caches(model))
    assert thunder_rs.compile_stats(jmodel).cache_misses == 2
