"""Pooling over inputs whose spatial sizes change between calls: adaptive average and max pooling
(and ``F.interpolate(mode="area")``, which is adaptive average pooling) to a constant output size
compute aten's windows from the symbolic input size on each call, window o being
[floor(o * I / O), ceil((o + 1) * I / O)); average and max pooling's right padding and ceil_mode's
last window, which depend on the size's residue modulo the stride, are a bound and a slice, and a
floor division. So a program over several sizes compiles
twice (static, then symbolic), not once per size class: VGG's and AlexNet's heads over images of
several sizes, an audio model's AdaptiveAvgPool1d over lengths.

Every call is checked against eager: outputs, max pooling's indices (a flat index into the input's
spatial dims, the first maximum on ties) and input gradients. The decomposition's prims run under
``decomposing()`` (as a fusion executor runs them); outside it the torch executor runs eager's own
kernel per call, and the decomposition only gives the trace its shapes.
"""

import contextlib

import pytest
import torch
import torch.nn.functional as F

import thunder_rs
from thunder_rs.executors.torch_ex import decomposing
from twin_training import misses, stays_symbolic, train_like_eager

pytestmark = pytest.mark.usefixtures("one_thread")


#: Input spatial sizes per number of spatial dims: smaller than, equal to and larger than the
#: output sizes below, odd and even; the first two differ in every dim (the second call compiles
#: them all symbolic). No size 1: a size of 1 is never symbolic.
SIZES = {
    1: [(10,), (7,), (3,), (16,), (23,), (2,), (8,)],
    2: [(8, 9), (7, 5), (3, 12), (16, 7), (23, 2), (10, 10)],
    3: [(4, 5, 6), (7, 3, 2), (3, 8, 5), (9, 6, 3), (2, 2, 7)],
}
#: (spatial dims, output size): ints, tuples and None (the input's size along that dim).
OUTPUTS = [
    (1, 1),
    (1, 3),
    (1, 7),
    (2, 1),
    (2, 3),
    (2, 7),
    (2, (7, 5)),
    (2, (None, 3)),
    (2, (4, None)),
    (3, 1),
    (3, 3),
    (3, (3, None, 2)),
]
ADAPTIVE_AVG = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}
ADAPTIVE_MAX = {1: F.adaptive_max_pool1d, 2: F.adaptive_max_pool2d, 3: F.adaptive_max_pool3d}


def sample(size, dtype, seed: int, ties: bool):
    """A (2, 3, *size) input; with ``ties``, of few distinct values, so that windows hold several
    maxima (eager picks the first)."""
    torch.manual_seed(seed)
    x = torch.randint(0, 3, (2, 3, *size)).to(dtype) if ties else torch.randn(2, 3, *size, dtype=dtype)
    return x.requires_grad_()


def check_like_eager(fn, sizes, dtype, *, ties=False, decomposed=True, **jit_options):
    """``fn`` jitted, called on an input of each spatial size: its outputs (integer ones exactly)
    and the input's gradient equal eager's; returns the jitted function."""
    jfn = thunder_rs.jit(fn, **jit_options)
    tol = dict(rtol=1.6e-2, atol=1.6e-2) if dtype == torch.bfloat16 else {}
    with decomposing() if decomposed else contextlib.nullcontext():
        for i, size in enumerate(sizes):
            x = sample(size, dtype, i, ties)
            out, expected = jfn(x), fn(x)
            out, expected = (out, expected) if isinstance(out, tuple) else ((out,), (expected,))
            for o, e in zip(out, expected):
                torch.testing.assert_close(o, e, **({} if o.dtype == torch.int64 else tol))
            g = torch.randn_like(out[0])
            torch.testing.assert_close(
                torch.autograd.grad(out[0], x, g)[0], torch.autograd.grad(expected[0], x, g)[0], **tol
            )
    return jfn


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("dims", "output_size"), OUTPUTS, ids=str)
def test_adaptive_avg_pool_compiles_twice_over_input_sizes(dims, output_size, dtype):
    jfn = check_like_eager(lambda x: ADAPTIVE_AVG[dims](x, output_size), SIZES[dims], dtype)
    assert misses(jfn) == 2
    assert stays_symbolic(jfn)


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize(("dims", "output_size"), OUTPUTS, ids=str)
def test_adaptive_max_pool_compiles_twice_with_eagers_indices(dims, output_size, dtype, ties):
    fn = lambda x: ADAPTIVE_MAX[dims](x, output_size, return_indices=True)  # noqa: E731
    jfn = check_like_eager(fn, SIZES[dims], dtype, ties=ties)
    assert misses(jfn) == 2
    assert stays_symbolic(jfn)


@pytest.mark.parametrize("pool", ["avg", "max"])
def test_the_torch_executor_runs_eagers_kernel_at_each_size(pool):
    fn = (lambda x: F.adaptive_avg_pool2d(x, 7)) if pool == "avg" else (lambda x: F.adaptive_max_pool2d(x, (7, 5)))
    jfn = check_like_eager(fn, SIZES[2], torch.float32, decomposed=False)
    assert misses(jfn) == 2
    assert stays_symbolic(jfn)


def test_the_symbolic_trace_takes_no_guard_on_the_sizes():
    fn = lambda x: F.adaptive_max_pool2d(x, (7, 5)) + F.adaptive_avg_pool2d(x, 3).sum()  # noqa: E731
    jfn = check_like_eager(fn, [(8, 9), (12, 13)], torch.float32)
    (entry,) = jfn._symbolic
    assert entry.guards == ()


@pytest.mark.parametrize("size", [(5, 4), 3, (8, 6)], ids=str)
def test_area_interpolation_to_a_constant_size_compiles_twice(size):
    fn = lambda x: F.interpolate(x, size=size, mode="area")  # noqa: E731
    for dtype in (torch.float32, torch.float64):
        jfn = check_like_eager(fn, SIZES[2], dtype)
        assert misses(jfn) == 2
        assert stays_symbolic(jfn)


#: (kernel_size, stride, padding, ceil_mode, count_include_pad)
AVG_POOLS = [
    (2, None, 0, False, True),
    (3, 2, 1, False, True),
    (3, 2, 1, False, False),
    (3, 2, 0, True, True),
    (3, 2, 1, True, False),
    (4, 3, 2, False, True),
    # ceil_mode's last window starts in the right padding for some residues only.
    (2, 2, 1, True, True),
    (3, 3, 1, True, False),
    (2, 3, 0, True, True),
]


@pytest.mark.parametrize("args", AVG_POOLS, ids=str)
@pytest.mark.parametrize("dims", [1, 2])
def test_avg_pool_compiles_twice_whatever_the_sizes_residue(dims, args):
    k, s, p, ceil_mode, count_include_pad = args
    pool = F.avg_pool1d if dims == 1 else F.avg_pool2d
    fn = lambda x: pool(x, k, s, p, ceil_mode, count_include_pad)  # noqa: E731
    sizes = [(9, 10), (12, 7), (8, 8), (13, 11), (10, 17), (11, 12)]
    jfn = check_like_eager(fn, [size[:dims] for size in sizes], torch.float32)
    assert misses(jfn) == 2
    assert stays_symbolic(jfn)


#: (kernel_size, stride, padding, dilation, ceil_mode)
MAX_POOLS = [(3, 2, 1, 1, False), (3, 2, 1, 1, True), (2, 2, 1, 1, True), (3, 3, 1, 2, True), (5, 4, 2, 1, True)]


@pytest.mark.parametrize("args", MAX_POOLS, ids=str)
def test_max_pool_compiles_twice_whatever_the_sizes_residue(args):
    k, s, p, d, ceil_mode = args
    fn = lambda x: F.max_pool2d(x, k, s, p, d, ceil_mode=ceil_mode, return_indices=True)  # noqa: E731
    jfn = check_like_eager(fn, [(9, 10), (12, 7), (8, 8), (13, 11), (10, 17)], torch.float32, ties=True)
    assert misses(jfn) == 2
    assert stays_symbolic(jfn)


def small_vgg(torchvision):
    """torchvision's VGG (3x3 convolutions with batch norm, max pooling, AdaptiveAvgPool2d((7, 7)),
    dropout) at a small width: its own classifier takes 512 * 7 * 7 features."""
    features = torchvision.models.vgg.make_layers([8, "M", 16, "M", 16, 16, "M"], batch_norm=True)
    model = torchvision.models.VGG(features, num_classes=10, dropout=0.5)
    model.classifier = torch.nn.Sequential(
        torch.nn.Linear(16 * 7 * 7, 32), torch.nn.ReLU(True), torch.nn.Dropout(0.5), torch.nn.Linear(32, 10)
    )
    return model


def small_alexnet(torchvision):
    """torchvision's AlexNet (strided 11x11 convolution, overlapping 3x2 max pooling,
    AdaptiveAvgPool2d((6, 6)), dropout) at a small width."""
    model = torchvision.models.AlexNet(num_classes=10, dropout=0.5)
    conv, relu, pool = torch.nn.Conv2d, lambda: torch.nn.ReLU(inplace=True), lambda: torch.nn.MaxPool2d(3, 2)
    model.features = torch.nn.Sequential(
        conv(3, 8, 11, stride=4, padding=2), relu(), pool(),
        conv(8, 12, 5, padding=2), relu(), pool(),
        conv(12, 16, 3, padding=1), relu(), conv(16, 16, 3, padding=1), relu(), pool(),
    )  # fmt: skip
    model.classifier = torch.nn.Sequential(
        torch.nn.Dropout(0.5), torch.nn.Linear(16 * 6 * 6, 32), torch.nn.ReLU(True), torch.nn.Linear(32, 10)
    )
    return model


@pytest.mark.parametrize(
    ("make", "images"),
    [
        # Feature maps of 4x5 to 9x9: smaller than, equal to and larger than the 7x7 pool.
        (small_vgg, [(36, 44), (56, 64), (72, 61), (40, 40), (64, 72)]),
        # Feature maps of 2x3 to 7x7 against the 6x6 pool.
        (small_alexnet, [(96, 112), (127, 120), (160, 99), (131, 150), (100, 100)]),
    ],
    ids=["vgg", "alexnet"],
)
def test_torchvision_classifiers_train_on_images_of_several_sizes_in_two_compiles(make, images):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    inputs = [torch.randn(2, 3, h, w) for h, w in images]
    jmodel = train_like_eager(make(torchvision).train(), inputs, rtol=1e-4, atol=1e-5)
    assert misses(jmodel) == 2
    assert stays_symbolic(jmodel)


class AudioClassifier(torch.nn.Module):
    """Strided 1-d convolutions over a waveform, pooled to a constant number of frames."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv1d(1, 8, 9, stride=4, padding=4)
        self.conv2 = torch.nn.Conv1d(8, 8, 3, stride=2, padding=1)
        self.pool = torch.nn.AdaptiveAvgPool1d(5)
        self.frames = torch.nn.AdaptiveMaxPool1d(3)
        self.head = torch.nn.Linear(8 * 8, 4)

    def forward(self, wave):
        h = F.avg_pool1d(F.relu(self.conv1(wave)), 2)
        h = F.relu(self.conv2(h))
        return self.head(torch.cat([self.pool(h), self.frames(h)], -1).flatten(1))


def test_an_audio_model_trains_over_every_length_in_two_compiles():
    torch.manual_seed(0)
    inputs = [torch.randn(3, 1, n) for n in [200, 163, 97, 256, 31, 130]]
    jmodel = train_like_eager(AudioClassifier(), inputs, rtol=1e-4, atol=1e-5)
    assert misses(jmodel) == 2
    assert stays_symbolic(jmodel)


def test_the_window_table_is_exact_for_constant_sizes_and_a_bound_for_symbolic_ones():
    # 10 pooled to 3: windows [0, 4), [3, 7), [6, 10), a (3, 4) table; for a symbolic size
    # ceil(size / 3) + 1 wide, the elements past each window's length masked.
    fn = lambda x: F.adaptive_avg_pool1d(x, 3)  # noqa: E731
    static, symbolic = thunder_rs.jit(fn, dynamic=False), thunder_rs.jit(fn)
    with decomposing():
        for n in (10, 12, 17):
            for jfn in (static, symbolic):
                torch.testing.assert_close(jfn(torch.ones(1, 2, n)), torch.ones(1, 2, 3))
    assert 'i64[3, 7]"' in str(thunder_rs.last_traces(static)[0])  # 17: [0, 6), [5, 12), [11, 17)
    assert 'i64[3, ((t0 + 2) // 3) + 1]"' in str(thunder_rs.last_traces(symbolic)[0])
    assert misses(symbolic) == 2


@pytest.mark.parametrize("pool", ["adaptive_avg", "adaptive_max", "avg_ceil"])
def test_a_fusion_executor_runs_the_symbolic_pools(fake_ex, pool):
    # The pools' prims, window tables included, run in the nvFuser stand-in's fusions, computed
    # from the size inputs on each call.
    fns = {
        "adaptive_avg": lambda x: F.adaptive_avg_pool2d(x, (7, 5)),
        "adaptive_max": lambda x: F.adaptive_max_pool2d(x, 3, return_indices=True),
        "avg_ceil": lambda x: F.avg_pool2d(x, 2, 2, 1, ceil_mode=True),
    }
    jfn = check_like_eager(fns[pool], SIZES[2], torch.float32, executors=[fake_ex, "torch"])
    assert misses(jfn) == 2
    assert stays_symbolic(jfn)
    assert fake_ex.stats["failures"] == 0, fake_ex.fallbacks
    assert fake_ex.stats["definitions"] > 0  # the pool's prims ran in its fusions


#: Pools whose kernel is computed from the input's sizes: CNN code's global pooling over the
#: spatial dims (``F.avg_pool2d(x, x.shape[2:])``), and kernels of half the size.
SIZED_POOLS = {
    "global_avg": lambda x: F.avg_pool2d(x, x.shape[2:]),
    "global_max": lambda x: F.max_pool2d(x, x.size()[2:], return_indices=True),
    "global_avg_1d": lambda x: F.avg_pool1d(x[:, :, 0], x.shape[-1]),
    "half_avg": lambda x: F.avg_pool2d(x, (x.shape[2] // 2, x.shape[3] // 2)),
    "half_max": lambda x: F.max_pool2d(x, (x.shape[2] // 2, 2), return_indices=True),
    "half_max_1d": lambda x: F.max_pool1d(x[:, :, 0], x.shape[-1] // 2, ceil_mode=True),
}


@pytest.mark.parametrize("decomposed", [True, False], ids=["decomposed", "eager_kernel"])
@pytest.mark.parametrize("name", SIZED_POOLS)
def test_a_kernel_from_the_input_sizes_compiles_twice(name, decomposed):
    # Even sizes (a half kernel's window count stays 2) and odd ones, ties at the maxima.
    sizes = [(8, 9), (6, 7), (10, 5), (12, 11), (4, 9)]
    jfn = check_like_eager(SIZED_POOLS[name], sizes, torch.float32, ties=True, decomposed=decomposed)
    assert misses(jfn) == 2
    assert stays_symbolic(jfn)


@pytest.mark.parametrize(
    ("layout", "decomposed"),
    [(torch.contiguous_format, True), (torch.contiguous_format, False), (torch.channels_last, False)],
    ids=["decomposed", "eager_kernel", "channels_last"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_global_pooling_has_eagers_dtypes_and_strides(dtype, layout, decomposed):
    # (Decomposed, the pools of a channels_last input are row-major at any size: as before.)
    fn = lambda x: (F.avg_pool2d(x, x.shape[2:]), *F.max_pool2d(x, x.shape[2:], return_indices=True))  # noqa: E731
    jfn = thunder_rs.jit(fn)
    with decomposing() if decomposed else contextlib.nullcontext():
        for h, w in [(5, 7), (8, 6), (3, 9)]:
            x = torch.randn(2, 3, h, w, dtype=dtype).to(memory_format=layout)
            for out, expected in zip(jfn(x), fn(x), strict=True):
                torch.testing.assert_close(out, expected)
                assert out.dtype == expected.dtype and out.stride() == expected.stride()
    assert misses(jfn) == 2


def test_a_global_pool_is_a_reduction_not_a_gather():
    jfn = thunder_rs.jit(lambda x: F.avg_pool2d(x, x.shape[2:]) + F.max_pool2d(x, x.shape[2:]))
    with decomposing():
        for h, w in [(5, 7), (8, 6)]:
            jfn(torch.randn(2, 3, h, w))
    trace = str(thunder_rs.last_traces(jfn)[-1])
    assert "take" not in trace and "prim_amax" in trace and "prim_sum" in trace


@pytest.mark.parametrize("name", ["global", "half"])
def test_a_fusion_executor_runs_pools_of_kernels_from_the_sizes(fake_ex, name):
    fns = {
        "global": lambda x: F.avg_pool2d(x, x.shape[2:]) + F.max_pool2d(x, x.shape[2:]),
        "half": lambda x: F.avg_pool2d(x, (x.shape[2] // 2, 2)) + F.max_pool2d(x, (x.shape[2] // 2, 2)),
    }
    sizes = [(8, 9), (6, 7), (10, 5), (4, 9)]
    jfn = check_like_eager(fns[name], sizes, torch.float32, executors=[fake_ex, "torch"])
    assert misses(jfn) == 2
    assert fake_ex.stats["failures"] == 0, fake_ex.fallbacks
    assert fake_ex.stats["definitions"] > 0


class GlobalPoolNet(torch.nn.Module):
    """CNN code's global pooling written with the feature map's own sizes as the kernel."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        h = F.relu(self.conv(x))
        pooled = torch.cat([F.avg_pool2d(h, h.shape[2:]), F.max_pool2d(h, kernel_size=h.size()[2:])], 1)
        return self.head(pooled.flatten(1))


def test_a_cnn_with_global_pooling_by_its_sizes_trains_over_image_sizes_in_two_compiles():
    torch.manual_seed(0)
    inputs = [torch.randn(2, 3, h, w) for h, w in [(16, 20), (24, 18), (31, 31), (12, 40)]]
    jmodel = train_like_eager(GlobalPoolNet(), inputs, rtol=1e-4, atol=1e-5)
    assert misses(jmodel) == 2
    assert stays_symbolic(jmodel)
