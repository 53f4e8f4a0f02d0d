"""F.interpolate to sizes that change between calls: an explicit ``size`` (an FPN or UNet decoder
resizing to its skip connection's shape), ``align_corners=True`` and scale factors that are short
binary fractions keep the sizes symbolic, so a program over images of several sizes compiles
twice (static, then symbolic), not once per size. The decomposition computes aten's scales from
the sizes on each call, as aten does (``area_pixel_compute_scale``, in the compute dtype), and
takes aten's nearest shortcuts (out == in copies, out == 2 * in halves) per call, without a guard.

Every call is checked against eager. The decomposition's prims run under ``decomposing()`` (as a
fusion executor runs them); outside it the torch executor runs eager's own kernel per call.
"""

import collections
import contextlib
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import thunder_rs
from thunder_rs._core import SymExpr
from thunder_rs.executors.torch_ex import decomposing
from twin_training import misses, stays_symbolic, train_like_eager

pytestmark = pytest.mark.usefixtures("one_thread")


#: (input, output) spatial sizes: odd ones, smaller and larger, equal (nearest's copy) and
#: twice (nearest's halving) along some dims. No size 1: a size of 1 is never symbolic.
PAIRS_2D = [
    ((5, 7), (10, 14)),
    ((6, 9), (12, 7)),
    ((7, 7), (7, 7)),
    ((9, 4), (3, 13)),
    ((11, 6), (22, 6)),
    ((4, 5), (13, 2)),
]
PAIRS = {
    1: [((i[0],), (o[0],)) for i, o in PAIRS_2D] + [((6,), (6,))],
    2: PAIRS_2D,
    3: [((3, 4, 5), (6, 4, 9)), ((5, 3, 4), (2, 6, 7)), ((4, 4, 3), (4, 8, 7)), ((3, 5, 2), (7, 5, 4))],
}
#: (mode, spatial dims, align_corners)
MODES = [
    ("nearest", 2, None),
    ("nearest", 1, None),
    ("nearest-exact", 2, None),
    ("linear", 1, False),
    ("linear", 1, True),
    ("bilinear", 2, False),
    ("bilinear", 2, True),
    ("bicubic", 2, False),
    ("bicubic", 2, True),
    ("trilinear", 3, False),
    ("trilinear", 3, True),
]
DTYPES = [torch.float32, torch.float64, torch.bfloat16]


def resize_to(mode, align_corners, unpacked):
    """``F.interpolate(x, size=<y's spatial shape>)``, the size as y's shape or as its ints."""

    def resized(x, y):
        size = y.shape[2:]
        if unpacked:
            size = tuple(s for s in size)
        return F.interpolate(x, size=size, mode=mode, align_corners=align_corners) * 2.0

    return resized


def check_like_eager(fn, pairs, dtype, *, channels=2, exact=False, **jit_options):
    """``fn`` jitted, called on inputs of each (input, output) size pair: outputs and input
    gradients equal to eager's; returns the jitted function."""
    jfn = thunder_rs.jit(fn, **jit_options)
    # bfloat16: aten's linear kernels round their weights to it, the decomposition keeps them in
    # float32 (the static trace does the same): one bfloat16 step apart near 0.
    tol = dict(rtol=0, atol=0) if exact else dict(rtol=1.6e-2, atol=1.6e-2) if dtype == torch.bfloat16 else {}
    for i, (in_size, out_size) in enumerate(pairs):
        torch.manual_seed(i)
        x = torch.randn(2, channels, *in_size, dtype=dtype, requires_grad=True)
        y = torch.empty(()) if out_size is None else torch.empty(1, 1, *out_size)
        out, expected = jfn(x, y), fn(x, y)
        torch.testing.assert_close(out, expected, **tol)
        g = torch.randn_like(out)
        grad_tol = tol if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            torch.autograd.grad(out, x, g)[0], torch.autograd.grad(expected, x, g)[0], **grad_tol
        )
    return jfn


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize(("mode", "dims", "align_corners"), MODES, ids=lambda v: str(v))
def test_resizing_to_another_inputs_size_compiles_twice(mode, dims, align_corners, dtype):
    fn = resize_to(mode, align_corners, unpacked=dims == 2)
    with decomposing():
        jfn = check_like_eager(fn, PAIRS[dims], dtype, exact=mode.startswith("nearest"))
    assert misses(jfn) == 2
    assert stays_symbolic(jfn)


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_the_torch_executor_runs_eagers_kernel_at_each_size(mode):
    jfn = check_like_eager(resize_to(mode, None, unpacked=False), PAIRS_2D, torch.float32, exact=True)
    assert misses(jfn) == 2
    assert stays_symbolic(jfn)


def test_the_symbolic_decomposition_computes_what_the_static_one_does():
    # Bit for bit: the scales divided in the trace are the constants the static trace folds.
    for mode, align_corners in [("nearest", None), ("nearest-exact", None), ("bilinear", False), ("bicubic", True)]:
        fn = resize_to(mode, align_corners, unpacked=False)
        with decomposing():
            symbolic, static = thunder_rs.jit(fn), thunder_rs.jit(fn, dynamic=False)
            for in_size, out_size in PAIRS_2D:
                x, y = torch.randn(1, 2, *in_size), torch.empty(1, 1, *out_size)
                torch.testing.assert_close(symbolic(x, y), static(x, y), rtol=0, atol=0)
        assert misses(symbolic) == 2


@pytest.mark.parametrize(("mode", "align_corners"), [("nearest", None), ("bilinear", True), ("bicubic", False)])
def test_a_fusion_executor_computes_the_scales_from_its_size_inputs(fake_ex, mode, align_corners):
    fused, fuse = [], fake_ex.fuse
    fake_ex.fuse = lambda region: fused.append(fuse(region)) or fused[-1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a region running eagerly warns
        jfn = check_like_eager(
            resize_to(mode, align_corners, unpacked=False),
            PAIRS_2D,
            torch.float32,
            exact=mode == "nearest",
            executors=[fake_ex, "torch"],
        )
    assert misses(jfn) == 2
    assert fake_ex.stats["failures"] == 0, fake_ex.fallbacks
    calls = [call for r in fused for call in r.region.calls]
    # A size made a tensor inside the region: an iota starting at it.
    assert any(c.name == "prims.iota" and isinstance(c.args[1], SymExpr) for c in calls)


def scaled_by(factor, mode, recompute=None):
    return lambda x, y: F.interpolate(x, scale_factor=factor, mode=mode, recompute_scale_factor=recompute)


#: Image sizes none of which a factor below makes 1 (a size of 1 is never symbolic).
SCALED = [((4, 6), None), ((5, 7), None), ((9, 3), None), ((16, 11), None), ((8, 13), None)]


@pytest.mark.parametrize(
    ("factor", "mode", "recompute", "compiles"),
    [
        (1.5, "nearest", None, 2),
        (1.5, "bilinear", None, 2),
        (1.5, "bicubic", True, 2),
        (0.75, "nearest-exact", None, 2),
        (2.5, "bilinear", True, 2),
        (3.0, "nearest", None, 2),
        # By 1.25, 3 stays 3: where the sizes are equal aten's linear kernel copies whatever the
        # scale, a guard that (9, 3) fails; the other sizes are the symbolic entry's.
        (1.25, "bilinear", None, 3),
        # 1.7 is no short binary fraction: floor(n * 1.7) is n * 17 // 10 where n * 17 / 10 is no
        # integer (``interpolate._near_fraction``; ``test_dynamic_round12``), as for every size here
        (1.7, "bilinear", None, 2),
    ],
)
def test_scale_factors_that_are_short_fractions_keep_sizes_symbolic(factor, mode, recompute, compiles):
    with decomposing():
        jfn = check_like_eager(scaled_by(factor, mode, recompute), SCALED, torch.float32, exact=mode.startswith("n"))
    assert misses(jfn) == compiles


def test_a_short_fraction_sizes_its_output_as_the_float_product_does():
    for factor in (1.5, 0.5, 0.75, 1.25, 2.5, 0.375):
        m, d = factor.as_integer_ratio()
        assert all(math.floor(float(n) * factor) == n * m // d for n in range(2, 20000))


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_a_given_scale_where_the_sizes_are_equal_copies_as_aten_does(mode):
    # By 1.25, 3 stays 3: aten's bilinear takes each element at its own index, its bicubic
    # backward copies the gradient (its forward interpolates by 0.8).
    fn = scaled_by(1.25, mode)
    with decomposing():
        check_like_eager(fn, [((3, 3), None), ((3, 5), None)], torch.float32)
        check_like_eager(fn, [((3, 3), None)], torch.float64, dynamic=False)


class SkipDecoder(torch.nn.Module):
    """A UNet-like block: features downsampled by strided convolutions, resized to the skip
    connection's size (odd sizes make it not twice the coarse one) and added to it."""

    def __init__(self, mode, align_corners=None):
        super().__init__()
        self.mode, self.align_corners = mode, align_corners
        self.down1 = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.down2 = torch.nn.Conv2d(4, 4, 3, stride=2, padding=1)
        self.head = torch.nn.Conv2d(4, 2, 1)

    def forward(self, x):
        skip = torch.relu(self.down1(x))
        coarse = torch.relu(self.down2(skip))
        up = F.interpolate(coarse, size=skip.shape[-2:], mode=self.mode, align_corners=self.align_corners)
        return self.head(up + skip)


IMAGES = [(16, 16), (19, 23), (21, 14), (32, 9), (13, 13)]


@pytest.mark.parametrize(
    ("mode", "align_corners", "decomposed"),
    [("nearest", None, False), ("nearest", None, True), ("bilinear", False, True), ("bilinear", True, False)],
)
def test_a_decoder_resizing_to_its_skip_trains_at_every_image_size(mode, align_corners, decomposed):
    torch.manual_seed(0)
    inputs = [torch.randn(2, 3, h, w) for h, w in IMAGES]
    with decomposing() if decomposed else contextlib.nullcontext():
        jmodel = train_like_eager(SkipDecoder(mode, align_corners), inputs, rtol=1e-4, atol=1e-5)
    assert misses(jmodel) == 2
    assert stays_symbolic(jmodel)


class PyramidOnConvs(torch.nn.Module):
    """torchvision's FeaturePyramidNetwork over three strided convolutions' maps of an image."""

    def __init__(self, torchvision):
        super().__init__()
        self.convs = torch.nn.ModuleList(
            [torch.nn.Conv2d(c, o, 3, stride=2, padding=1) for c, o in [(3, 4), (4, 8), (8, 8)]]
        )
        self.fpn = torchvision.ops.FeaturePyramidNetwork([4, 8, 8], 6)

    def forward(self, x):
        maps = collections.OrderedDict()
        for i, conv in enumerate(self.convs):
            x = torch.relu(conv(x))
            maps[f"c{i}"] = x
        return tuple(self.fpn(maps).values())


def test_torchvisions_feature_pyramid_compiles_twice_over_image_sizes():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = PyramidOnConvs(torchvision)
    jmodel = thunder_rs.jit(model)
    for h, w in [(32, 32), (37, 29), (45, 64), (24, 51), (33, 33)]:
        x = torch.randn(1, 3, h, w)
        torch.testing.assert_close(jmodel(x), model(x))
    assert misses(jmodel) == 2
    assert stays_symbolic(jmodel)


def antialiased_to(mode, align_corners):
    return lambda x, y: F.interpolate(x, size=y.shape[2:], mode=mode, align_corners=align_corners, antialias=True)


#: Upsampling (and sizes kept) along each dim: aten's antialiased filter is as wide at every such
#: size. No output width of 1: aten's CPU kernel then repeats the first row (the OpInfo entry).
UPSAMPLED = [((4, 5), (7, 9)), ((5, 7), (10, 14)), ((6, 9), (12, 9)), ((7, 7), (7, 7)), ((3, 4), (13, 6))]


@pytest.mark.parametrize(("mode", "align_corners"), [("bilinear", False), ("bicubic", False), ("bicubic", True)])
def test_antialiased_upsampling_keeps_sizes_symbolic(mode, align_corners):
    with decomposing():
        jfn = check_like_eager(antialiased_to(mode, align_corners), UPSAMPLED, torch.float64)
    assert misses(jfn) == 2
    assert stays_symbolic(jfn)


def test_antialiased_downsampling_widens_the_filter_per_size():
    """Downsampling, the filter widens with the scale and its number of taps with it: the sizes
    are taken at their values (a compile per size); those that upsample share one entry."""
    pairs = [((4, 5), (7, 9)), ((5, 7), (10, 14)), ((12, 12), (5, 5)), ((12, 12), (5, 5)), ((9, 10), (4, 3))]
    with decomposing():
        jfn = check_like_eager(antialiased_to("bicubic", False), pairs, torch.float64)
    assert misses(jfn) == 4


@pytest.mark.slow  # importing timm
def test_a_timm_vit_of_dynamic_image_size_trains_over_image_sizes():
    """timm's ViT with ``dynamic_img_size=True`` resizes its position embeddings to each image's
    grid of patches with antialiased bicubic interpolation (``resample_abs_pos_embed``): refused
    before, now as eager's, with one compile for the grids larger than the embeddings' and one per
    smaller grid."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=5, dynamic_img_size=True
    ).double()
    sizes = [(32, 32), (48, 40), (64, 32), (40, 56), (24, 32)]
    jmodel = train_like_eager(model, [torch.randn(2, 3, h, w, dtype=torch.float64) for h, w in sizes])
    assert misses(jmodel) == 3


def test_a_fusion_executor_takes_antialiased_resizing_at_every_size(fake_ex):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a region running eagerly warns
        jfn = check_like_eager(antialiased_to("bicubic", False), UPSAMPLED, torch.float32, executors=[fake_ex, "torch"])
    assert misses(jfn) == 2
    assert fake_ex.stats["failures"] == 0, fake_ex.fallbacks
