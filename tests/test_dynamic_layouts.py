"""Inputs dense in another order of their dims (``channels_last`` images, transposes) whose sizes
change between calls (issue 26): their strides follow from their sizes, so the cache key holds
their dim order (``core.base.layouts``), their changing dims become symbolic as a contiguous
input's do, and the trace sees strides of the symbolic sizes (views, ``stride()``). Checked
against eager: outputs, gradients, strides the program reads, the errors of views the strides
refuse, and compile counts. Strided inputs (a slice of a buffer whose length changes) whose
strides change take them as size inputs, under guards on what the trace decided at them."""

import copy

import pytest
import torch

import thunder_rs
from twin_training import misses, train_like_eager

torchvision = pytest.importorskip("torchvision")

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_channels_last_resnet_trains_on_images_of_several_sizes_in_two_compiles():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).train().to(memory_format=torch.channels_last)
    sizes = [(64, 64), (80, 96), (96, 64), (65, 97)]
    inputs = [torch.randn(2, 3, h, w).to(memory_format=torch.channels_last) for h, w in sizes]
    jmodel = train_like_eager(model, inputs, rtol=1e-4, atol=1e-5)
    assert misses(jmodel) == 2
    assert "compiled with symbolic sizes x.shape[2], x.shape[3]" in thunder_rs.compile_stats(jmodel).miss_reasons[1]


def reads_layout(x, w):
    rows = x.reshape(-1)  # a copy: not viewable
    return x @ w, x.stride(), x.mT.view(-1), rows, x.is_contiguous()


def test_a_transposed_input_of_changing_sizes_compiles_twice_and_shows_eagers_strides():
    jfn, jview = thunder_rs.jit(reads_layout), thunder_rs.jit(lambda t: t.view(-1))
    for n, m in [(3, 4), (5, 6), (6, 7), (9, 2)]:
        x, w = torch.randn(m, n).t(), torch.randn(m, 3, requires_grad=True)
        torch.testing.assert_close(jfn(x, w), reads_layout(x, w))
        with pytest.raises(RuntimeError, match="view size is not compatible") as expected:
            x.view(-1)
        with pytest.raises(RuntimeError) as actual:
            jview(x)
        assert str(actual.value).endswith(str(expected.value))
    assert misses(jfn) == 2


def stacks(x):
    return torch.cat([x, x * 2], dim=1).sum(dim=(2, 3))


@pytest.mark.parametrize(
    "arrange",
    [
        lambda t: t.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2),  # channels_last by permutes
        lambda t: t.transpose(2, 3).contiguous().transpose(2, 3),
        lambda t: t.permute(3, 2, 1, 0).contiguous().permute(3, 2, 1, 0),
    ],
)
def test_each_dim_order_is_its_own_entry_and_serves_other_sizes(arrange):
    jfn = thunder_rs.jit(stacks)
    for h, w in [(4, 5), (6, 7), (7, 9)]:
        base = torch.randn(2, 3, h, w)
        for x in (base, arrange(base)):
            torch.testing.assert_close(jfn(x), stacks(x))
    assert misses(jfn) == 4  # each layout: its first sizes, then symbolic


def test_a_size_one_dim_with_a_stride_of_its_own_is_keyed_by_its_strides():
    base = torch.randn(4, 8)
    odd = torch.as_strided(base, (4, 1, 3), (8, 100, 2))  # not dense: the strides themselves
    jfn = thunder_rs.jit(lambda t: (t * 2, t.stride()))
    torch.testing.assert_close(jfn(odd), (odd * 2, odd.stride()))
    narrow = torch.as_strided(base, (4, 1, 3), (8, 1, 2))
    torch.testing.assert_close(jfn(narrow), (narrow * 2, narrow.stride()))


def reads_strided(x):
    merged = x.reshape(x.shape[0], -1)  # a view where the dims step over each other, else a copy
    return x.sin() * 2, x.transpose(0, 1), merged, x.stride(), x.is_contiguous()


@pytest.mark.parametrize(
    "sliced",
    [
        lambda n: torch.randn(2, 3, n + 4, 8)[:, :, :n],  # a KV cache's filled part: its strides grow with the buffer
        lambda n: torch.randn(3, 2 * n)[:, ::2],  # every other column
        lambda n: torch.randn(6, n + 3)[1:5, 1:n].t(),  # a slice of a weight of n + 3 columns, transposed
    ],
)
def test_a_slice_of_a_buffer_whose_length_changes_compiles_twice_over_many_sizes(sliced):
    jfn = thunder_rs.jit(reads_strided)
    for n in [3, 4, 5, 7, 10, 16, 23]:
        torch.manual_seed(n)
        x = sliced(n).requires_grad_()
        torch.manual_seed(n)
        twin = sliced(n).requires_grad_()
        out, expected = jfn(x), reads_strided(twin)
        torch.testing.assert_close(out, expected)
        assert [t.stride() for t in out[:3]] == [t.stride() for t in expected[:3]]
        sum(t.square().sum() for t in out[:3]).backward()
        sum(t.square().sum() for t in expected[:3]).backward()
        torch.testing.assert_close(x.grad, twin.grad)
        assert x.grad.stride() == twin.grad.stride()
    assert misses(jfn) == 2
    assert ".stride(" in thunder_rs.compile_stats(jfn).miss_reasons[1]


def strided(n, rows, planes):
    """A ``(2, 3, n)`` tensor of strides ``(planes, rows, 1)`` in a buffer that holds it."""
    return torch.randn(2 * planes + 3 * rows + n).as_strided((2, 3, n), (planes, rows, 1))


def merges(x):
    return x.view(6, -1) * 2


def test_symbolic_strides_keep_what_the_trace_decided_at_them():
    """Dims 0 and 1 of ``x`` merge in a view where dim 0 steps over dim 1 (``planes == 3 *
    rows``); where it does not, eager refuses the view, and so does the compiled program. A
    stride order that flips (the order of an elementwise result's strides) or elements that
    overlap compile again too; sizes and strides of the same kind reuse what was compiled."""
    jview, jscale = thunder_rs.jit(merges), thunder_rs.jit(lambda t: t * 2)
    layouts = [(4, 8, 24), (5, 9, 27), (6, 10, 31), (7, 11, 33), (6, 20, 8), (7, 21, 9), (6, 4, 12), (7, 11, 35)]
    for n, rows, planes in layouts:
        x = strided(n, rows, planes)
        scaled = jscale(x)
        torch.testing.assert_close(scaled, x * 2)
        assert scaled.stride() == (x * 2).stride()
        if planes == 3 * rows:
            torch.testing.assert_close(jview(x), merges(x))
            continue
        with pytest.raises(RuntimeError, match="view size is not compatible") as expected:
            merges(x)
        with pytest.raises(RuntimeError) as actual:
            jview(x)
        assert str(actual.value).endswith(str(expected.value))
    # The first strides, symbolic, not stepping over (the guard does not ask whether the program
    # relied on it), the order flipped, overlapping.
    assert misses(jscale) == 5


def small_channels_last_net() -> torch.nn.Module:
    torch.manual_seed(0)
    nn = torch.nn
    layers = [nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2)]
    layers += [nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.GELU(), nn.Upsample(scale_factor=2), nn.Conv2d(8, 4, 1)]
    return nn.Sequential(*layers).train().to(memory_format=torch.channels_last)


@pytest.mark.parametrize(
    "executors", [None, pytest.param(["inductor"], marks=[pytest.mark.inductor, pytest.mark.slow])]
)
def test_a_channels_last_net_trains_over_image_sizes_with_eagers_strides(executors):
    # With Inductor, the claim of a convolution's backward compared its symbolic sizes outside
    # tracing (an error that turned symbolic compiles off: a compile per image size).
    model = small_channels_last_net()
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model, executors=executors)
    for h, w in [(16, 16), (20, 24), (24, 18), (17, 29)]:
        image = torch.randn(2, 3, h, w).to(memory_format=torch.channels_last)
        x, twin = image.clone().requires_grad_(), image.clone().requires_grad_()
        out, expected = jmodel(x), eager(twin)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
        cotangent = torch.randn_like(expected)
        out.backward(cotangent)
        expected.backward(cotangent)
        pairs = [
            (out, expected),
            (x.grad, twin.grad),
            *((p.grad, q.grad) for p, q in zip(model.parameters(), eager.parameters())),
        ]
        for a, b in pairs:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
            assert a.stride() == b.stride()
        for b, c in zip(model.buffers(), eager.buffers()):
            torch.testing.assert_close(b, c)
        model.zero_grad()
        eager.zero_grad()
    assert misses(jmodel) == 2


def writes_through_views(x):
    y = x * 1
    every_other, rows = y[:, ::2], y.t()[1:]
    every_other.mul_(2)
    rows.add_(1)
    return every_other, rows, y


def test_views_written_in_place_and_returned_have_eagers_strides_at_every_size():
    # The written view was returned as the value written, contiguous, where eager's is a view.
    jfn = thunder_rs.jit(writes_through_views)
    for n in [4, 5, 7, 10]:
        x = torch.randn(3, 2 * n)
        out, expected = jfn(x), writes_through_views(x)
        torch.testing.assert_close(out, expected)
        assert [t.stride() for t in out] == [t.stride() for t in expected]
    assert misses(jfn) == 2


def laid_out_by_sizes(x):
    n = x.shape[0]
    columns = torch.empty_strided((n, 3), (1, n)).copy_(x[:, :3])
    windows = x.as_strided((n - 1, 2), (x.shape[1], 1))
    return columns, columns * 2, windows, x.t()[1:], x[:1].expand(n, -1)


def test_outputs_laid_out_by_symbolic_sizes_have_eagers_strides():
    # torch.empty_strided of a symbolic size ran eagerly while tracing (an error that turned
    # symbolic compiles off: a compile per size), and its writes were laid out contiguously.
    jfn = thunder_rs.jit(laid_out_by_sizes)
    for n in [4, 5, 7, 10]:
        x = torch.randn(n, 6)
        out, expected = jfn(x), laid_out_by_sizes(x)
        torch.testing.assert_close(out, expected)
        assert [t.stride() for t in out] == [t.stride() for t in expected]
    assert misses(jfn) == 2


@pytest.mark.parametrize(
    "program",
    [
        lambda x: x.as_strided((2, x.shape[0] - 1), (1, 1)) * 2,  # overlapping windows
        lambda x: x.as_strided((x.shape[0] // 2 - 1, 2, 2), (2, 0, 1)),  # a stride of 0
    ],
    ids=["windows", "stride 0"],
)
def test_as_strided_of_symbolic_sizes_under_autograd_is_eagers_view_and_gradient(program):
    """The view of the strides asked for, and ``as_strided_backward``'s gradient, over sizes of
    one symbolic compile (the decomposition gathered a contiguous copy, strides ``(T - 1, 1)``)."""
    jfn = thunder_rs.jit(program)
    for n in [5, 6, 7, 9]:
        sides = []
        for fn in (program, jfn):
            x = torch.randn(n, generator=torch.Generator().manual_seed(n), requires_grad=True)
            out = fn(x)
            (grad,) = torch.autograd.grad(out, x, torch.randn(out.shape, generator=torch.Generator().manual_seed(0)))
            sides.append((out, grad))
        for got, expected in zip(*sides):
            assert got.stride() == expected.stride()
            assert torch.equal(got, expected)
    assert thunder_rs.compile_stats(jfn).cache_misses == 2, thunder_rs.compile_stats(jfn).miss_reasons
