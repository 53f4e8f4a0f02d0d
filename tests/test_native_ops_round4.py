"""Ops the op database ran as eager fallbacks (round 4), now traced natively: each matches eager
(bit-equal in float32 where the decomposition computes as eager's kernel does), forward and
backward, falls back nowhere, and rejects what eager rejects with eager's exception type.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import thunder_rs
from thunder_rs.executors.torch_ex import decomposing

from test_native_ops_round2 import check_bit_equal, check_same_error

# -- fft.fftshift, fft.ifftshift ---------------------------------------------------------------------


@pytest.mark.parametrize("shift", [torch.fft.fftshift, torch.fft.ifftshift])
def test_fft_shifts_are_rolls(shift) -> None:
    x = torch.randn(5, 6, 7, requires_grad=True)
    check_bit_equal(lambda a: shift(a), x)
    check_bit_equal(lambda a: shift(a.mT, dim=(-1, 0, -1)), x)
    check_bit_equal(lambda a: shift(a, 1), x)
    check_bit_equal(lambda a: shift(a), torch.randn(0, 3))
    check_same_error(lambda a: shift(a), torch.tensor(1.0))
    check_same_error(lambda a: shift(a, 3), x)


# -- segment_reduce ----------------------------------------------------------------------------------


def _decomposed(fn, *args):
    with decomposing():
        return thunder_rs.jit(fn)(*args)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("by", ["lengths", "offsets"])
def test_segment_reduce(reduce: str, by: str) -> None:
    """Long segments (a sum's order shows), an empty one, positions outside every offset, with and
    without an initial value, along the last and a middle axis; the decomposition too."""
    x = torch.randn(3, 40, 2, requires_grad=True)
    for initial in (None, 0.5):
        empty = 1 if reduce == "mean" and initial is None else 0  # (an empty segment's mean: NaN, not equal)
        bounds = {
            "lengths": torch.tensor([[17, empty, 23 - empty]] * 3),
            "offsets": torch.tensor([[2, 19, 19 + empty, 37]] * 3),
        }[by]

        def fn(a, b):
            return torch.segment_reduce(a, reduce, axis=1, initial=initial, **{by: b})

        check_bit_equal(fn, x, bounds)
        expected = fn(x.detach(), bounds)
        torch.testing.assert_close(_decomposed(fn, x.detach(), bounds), expected, equal_nan=True, rtol=0, atol=0)
    check_bit_equal(
        lambda a, b: torch.segment_reduce(a, reduce, initial=1.0, **{by: b}), x[0, :, 0].detach(), bounds[0]
    )


def test_segment_reduce_gradient_of_ties_is_eagers() -> None:
    """eager's backward divides among tied extrema only the positive gradients."""
    x = torch.tensor([1.0, 3.0, 3.0, 2.0, 2.0, 0.5], requires_grad=True)
    lengths = torch.tensor([3, 3])
    out = thunder_rs.jit(lambda a, b: torch.segment_reduce(a, "max", lengths=b))(x, lengths)
    expected = torch.segment_reduce(x, "max", lengths=lengths)
    g = torch.tensor([2.0, -2.0])
    assert torch.equal(torch.autograd.grad(out, x, g)[0], torch.autograd.grad(expected, x, g)[0])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_segment_reduce_half_precision(dtype: torch.dtype) -> None:
    x = torch.randn(30, 4, dtype=dtype, requires_grad=True)
    lengths = torch.tensor([10, 0, 20])
    for reduce in ("sum", "mean", "max"):
        fn = lambda a, b: torch.segment_reduce(a, reduce, lengths=b, initial=0.0)  # noqa: E731
        check_bit_equal(fn, x, lengths)
        # (eager's kernel rounds after each add; the decomposition's scatter adds in float)
        exact = fn(x.detach().double(), lengths).to(dtype)
        torch.testing.assert_close(_decomposed(fn, x.detach(), lengths), exact)


def test_segment_reduce_errors() -> None:
    x = torch.randn(5)
    for lengths in (torch.tensor([1, 2, 3]), torch.tensor([1, -1, 5]), torch.tensor([], dtype=torch.long)):
        check_same_error(lambda a, b: torch.segment_reduce(a, "sum", lengths=b), x, lengths)
        with pytest.raises(RuntimeError):
            _decomposed(lambda a, b: torch.segment_reduce(a, "sum", lengths=b), x, lengths)
    check_same_error(lambda a, b: torch.segment_reduce(a, "sum", offsets=b), x, torch.tensor([0, 3, 2]))
    check_same_error(lambda a, b: torch.segment_reduce(a, "sum", lengths=b, axis=1), x, torch.tensor([5]))
    check_same_error(lambda a, b: torch.segment_reduce(a, "median", lengths=b), x, torch.tensor([5]))


@pytest.mark.parametrize("decompose", [False, True])
def test_segment_reduce_refuses_bounds_eager_reads_past_data_at(decompose: bool) -> None:
    """Offsets past data's end, and unsafe lengths that sum past it, make eager's kernel read
    outside data (garbage, or a crash): refused when the program runs, naming the op."""
    x = torch.randn(5)
    for kwargs in ({"offsets": torch.tensor([1, 3, 9])}, {"lengths": torch.tensor([4, 4]), "unsafe": True}):
        fn = lambda a: torch.segment_reduce(a, "sum", **kwargs)  # noqa: E731
        with pytest.raises(IndexError, match="segment_reduce"):
            _decomposed(fn, x) if decompose else thunder_rs.jit(fn)(x)
    # (lengths that leave positions out are taken, as eager takes them)
    check_bit_equal(lambda a: torch.segment_reduce(a, "sum", lengths=torch.tensor([1, 2]), unsafe=True), x)


# -- fractional max pooling ----------------------------------------------------------------------------


def _seeded_equal(fn, *args) -> None:
    """``fn`` drawing from the default generator from one state, eager and compiled (and its
    decomposition): the same draws, outputs and gradients."""

    def seeded(*a):
        torch.manual_seed(0)
        return fn(*a)

    check_bit_equal(seeded, *args)
    with decomposing():
        actual = thunder_rs.jit(seeded)(*(a.detach() for a in args))
    expected = seeded(*(a.detach() for a in args))
    for e, a in zip(*((v if isinstance(v, tuple) else (v,)) for v in (expected, actual))):
        assert torch.equal(e, a)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_fractional_max_pool2d_draws_and_pools_as_eager(dtype: torch.dtype) -> None:
    """Overlapping windows (a gradient added twice where they share the maximum), ratios,
    indices, unbatched input, the module."""
    x = torch.randn(2, 3, 11, 9, dtype=dtype, requires_grad=True)
    _seeded_equal(lambda a: F.fractional_max_pool2d(a, 3, output_size=(7, 6)), x)
    _seeded_equal(lambda a: F.fractional_max_pool2d(a, (2, 3), output_ratio=(0.5, 0.7), return_indices=True), x)
    _seeded_equal(lambda a: F.fractional_max_pool2d(a[1].mT, 2, output_size=4), x)
    _seeded_equal(torch.nn.FractionalMaxPool2d(2, output_ratio=0.5), x)


def test_fractional_max_pool3d_draws_and_pools_as_eager() -> None:
    x = torch.randn(2, 2, 7, 8, 9, requires_grad=True)
    _seeded_equal(lambda a: F.fractional_max_pool3d(a, 2, output_size=(5, 4, 6)), x)
    _seeded_equal(lambda a: F.fractional_max_pool3d(a[0], (1, 2, 3), output_ratio=0.5, return_indices=True), x)


def test_fractional_max_pool_ties_nan_and_infinity_pick_eagers_index() -> None:
    """Each window's first maximum, its last NaN, its first element when all are -inf."""
    x = torch.randn(2, 3, 9, 8)
    x[0, 0, 1:5, 1:5] = -math.inf
    x[0, 1, 2, 2] = x[0, 1, 3, 3] = math.nan
    x[1, 2] = 1.0
    samples = torch.rand(2, 3, 2)
    fn = lambda a, s: torch._C._nn.fractional_max_pool2d(a, 3, (4, 3), s)  # noqa: E731
    expected = fn(x, samples)
    for actual in (thunder_rs.jit(fn)(x, samples), _decomposed(fn, x, samples)):
        torch.testing.assert_close(actual, expected, equal_nan=True, rtol=0, atol=0)


def test_fractional_max_pool_backward_kernel_and_its_gradient() -> None:
    """aten's backward called by name: the gradients added at the indices, and its own gradient
    (eager's double backward: the cotangent gathered at the indices, zeros for the input)."""
    x = torch.randn(1, 2, 9, 9, dtype=torch.float64, requires_grad=True)
    out, indices = torch._C._nn.fractional_max_pool2d(x.detach(), 3, 5, torch.rand(1, 2, 2, dtype=torch.float64))
    g = torch.randn_like(out, requires_grad=True)
    check_bit_equal(
        lambda a, b, i: torch.ops.aten.fractional_max_pool2d_backward.default(a, b, [3, 3], [5, 5], i), g, x, indices
    )
    y = torch.randn(1, 2, 6, 6, 6, requires_grad=True)
    out, indices = torch._C._nn.fractional_max_pool3d(y.detach(), 2, 4, torch.rand(1, 2, 3))
    g = torch.randn_like(out, requires_grad=True)
    check_bit_equal(
        lambda a, i: torch.ops.aten.fractional_max_pool3d_backward.default(a, y.detach(), [2] * 3, [4] * 3, i),
        g,
        indices,
    )


def test_fractional_max_pool_errors() -> None:
    x = torch.randn(2, 3, 9, 8)
    check_same_error(lambda a: F.fractional_max_pool2d(a, 2, output_ratio=0.5), x)
    check_same_error(lambda a: F.fractional_max_pool2d(a, 2, output_size=8), x)
    check_same_error(lambda a: F.fractional_max_pool2d(a, 2, output_size=4, _random_samples=torch.rand(1, 3, 2)), x)
    check_same_error(lambda a: F.fractional_max_pool2d(a.long(), 2, output_size=4), x)
    check_same_error(lambda a: F.fractional_max_pool3d(a[0], 2, output_size=2), x)


# -- histogram, histogramdd ------------------------------------------------------------------------------


def _equal_results(actual, expected) -> None:
    flat = [torch.utils._pytree.tree_flatten(v)[0] for v in (actual, expected)]
    assert type(actual) is type(expected) and len(flat[0]) == len(flat[1])
    for a, e in zip(*flat):
        assert torch.equal(a, e) and a.stride() == e.stride()


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, w: torch.histogram(a, 7),
        lambda a, w: torch.histogram(a, 4, range=(-1.0, 1.0), weight=w, density=True),
        lambda a, w: torch.histogramdd(a.reshape(-1, 2), [3, 4], weight=w[:, :5].reshape(-1)),
        lambda a, w: torch.histogramdd(a.reshape(-1, 2), [torch.tensor([0.0, -1.0, 2.0]), torch.tensor([-1.0, 1.0])]),
    ],
)
def test_histograms_compile_once_for_any_values(fn) -> None:
    """The bins follow the data's range on each call (the data-dependent call was read once and
    the trace checked every later call against it, compiling again on new values)."""
    jfn = thunder_rs.jit(fn)
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        x, w = torch.randn(6, 10, generator=gen) * (seed + 1), torch.rand(6, 10, generator=gen)
        assert thunder_rs.examine(fn, x, w).fallbacks == {}
        _equal_results(jfn(x, w), fn(x, w))
        assert "eager_" not in str(thunder_rs.last_traces(jfn)[-1])  # (no eager call read once)
        decomposed = _decomposed(fn, x, w)  # (its linspace may differ from eager's in a last bit)
        for a, e in zip(*(torch.utils._pytree.tree_flatten(v)[0] for v in (decomposed, fn(x, w)))):
            torch.testing.assert_close(a, e)
    assert thunder_rs.cache_misses(jfn) == 1


def test_histogram_range_checks_run_on_each_call() -> None:
    fn = lambda a: torch.histogramdd(a, [2, 2])  # noqa: E731
    jfn = thunder_rs.jit(fn)
    jfn(torch.randn(5, 2))
    for bad in (torch.tensor([[1.0, math.nan]]), torch.tensor([[1.0, 2.0], [math.inf, 0.0]])):
        check_same_error(fn, bad)
        with pytest.raises(RuntimeError, match="not finite"):
            jfn(bad)
        with pytest.raises(RuntimeError, match="not finite"):
            _decomposed(fn, bad)


def test_histogram_of_an_input_that_requires_grad_is_eagers() -> None:
    """eager defines no derivative: its outputs require grad and their backward raises. Such a
    call stays eager's (a fallback), so the program still computes the histogram and fails the
    backward as eager does."""
    x = torch.randn(5, requires_grad=True)
    fn = lambda a: torch.histogram(a, 3)  # noqa: E731
    hist, edges = thunder_rs.jit(fn)(x)
    _equal_results((hist.detach(), edges.detach()), tuple(t.detach() for t in fn(x)))
    assert hist.requires_grad == fn(x).hist.requires_grad
    with pytest.raises(RuntimeError) as eager:
        fn(x).hist.sum().backward()
    with pytest.raises(type(eager.value), match="not implemented"):
        hist.sum().backward()


# -- svd_lowrank, pca_lowrank ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, m: torch.svd_lowrank(a, q=3),
        lambda a, m: torch.svd_lowrank(a.mT, 4, niter=1, M=m.mT),
        lambda a, m: torch.pca_lowrank(a),
        lambda a, m: torch.pca_lowrank(a[0], q=2, center=False, niter=0),
        lambda a, m: torch.svd_lowrank(a[0, :5] @ m[:5].mT, q=2),
        lambda a, m: torch.svd_lowrank(a[0, :5], q=2, niter=0)[2],
    ],
)
def test_lowrank_decompositions_draw_and_differentiate_as_eager(fn) -> None:
    """eager's Python body on traced tensors: the same Gaussian draw, QR and SVD, and the
    gradients of the products of LAPACK's column-major factors (``Q.mH @ A``) multiply as eager's
    (the body called the ltorch ops, whose outputs it took for row-major: ulps), so the values and
    the gradients are bit-equal."""
    a = torch.randn(2, 7, 5, dtype=torch.float64, requires_grad=True)
    m = torch.randn(7, 5, dtype=torch.float64)

    def seeded(*args):
        torch.manual_seed(0)
        return fn(*args)

    assert thunder_rs.examine(seeded, a, m).fallbacks == {}

    def results(fn, *args):
        out = fn(*args)
        return tuple(out) if isinstance(out, tuple) else (out,)

    expected, actual = results(seeded, a, m), results(thunder_rs.jit(seeded), a, m)
    with decomposing():
        decomposed = results(thunder_rs.jit(seeded), a.detach(), m)
    for e, x, d in zip(expected, actual, decomposed, strict=True):
        assert torch.equal(e, x) and torch.equal(e, d)
    cotangents = [torch.randn_like(e) for e in expected]
    grads = [
        torch.autograd.grad(sum((o * c).sum() for o, c in zip(outs, cotangents)), a)[0] for outs in (expected, actual)
    ]
    assert torch.equal(grads[1], grads[0])


@pytest.mark.parametrize("dtype", [torch.complex128, torch.complex64])
@pytest.mark.parametrize("fn", [lambda a: torch.svd_lowrank(a, q=3), lambda a: torch.pca_lowrank(a.mT, q=3, niter=1)])
def test_lowrank_of_complex_inputs_draws_and_differentiates_as_eager(dtype, fn) -> None:
    """eager draws the Gaussian basis in a complex input's own dtype (``get_approximate_basis``:
    a float32 draw made the product raise a dtype error where eager runs), and the eager call that
    differentiates complex values replays its forward's draw in the backward (it drew a new basis,
    so the gradient was of another decomposition, and raised eager's phase error)."""
    a = torch.randn(7, 5, dtype=dtype, requires_grad=True)
    cotangent = torch.randn(7, 5, dtype=dtype)  # of the reconstruction, which the phases leave alone

    def seeded(a):
        torch.manual_seed(0)
        u, s, v = fn(a)
        return u, s, v, torch.randn(2)

    jitted = thunder_rs.jit(seeded)
    for _ in range(2):
        expected, actual = seeded(a), jitted(a)
        for e, x in zip(expected, actual, strict=True):
            assert torch.equal(x, e)
        rebuilt = [(u * s) @ v.mH for u, s, v, _ in (expected, actual)]
        losses = [
            torch.view_as_real(r.mT if r.shape != cotangent.shape else r) * torch.view_as_real(cotangent)
            for r in rebuilt
        ]
        grads = [torch.autograd.grad(x.sum(), a)[0] for x in losses]
        assert torch.allclose(grads[1], grads[0])


# -- embedding_bag -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mode": "sum"},
        {"mode": "mean"},
        {"mode": "sum", "padding_idx": 1},
        {"mode": "mean", "include_last_offset": True},
    ],
)
def test_embedding_bag_scales_gradients_by_frequency(kwargs) -> None:
    """scale_grad_by_freq (it was refused): each index's gradient divided by how often the input
    names it, as eager's backward; values bit-equal, gradients within rounding (eager scales once
    per occurrence, the decomposition's gradient divides by the bag size and then the count)."""
    weight = torch.randn(10, 4, requires_grad=True)
    indices = torch.tensor([1, 2, 1, 5, 1, 9, 2, 0])
    offsets = torch.tensor([0, 3, 3, 8] if kwargs.get("include_last_offset") else [0, 3, 3, 6])

    def fn(w, i, o):
        return F.embedding_bag(i, w, o, scale_grad_by_freq=True, **kwargs)

    expected, actual = fn(weight, indices, offsets), thunder_rs.jit(fn)(weight, indices, offsets)
    assert torch.equal(actual, expected)
    g = torch.randn_like(expected)
    grads = [torch.autograd.grad(out, weight, g)[0] for out in (expected, actual)]
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("decompose", [False, True])
def test_embedding_bag_offsets_are_checked_on_each_call(decompose: bool) -> None:
    """eager's checks of the offsets' values (the first is 0, the last within the input, none
    decreases) hold on the decomposition's path too (it took any offsets, bagging positions by
    them); a last offset short of the input with include_last_offset, on which eager's modes
    disagree, is refused there (eager's own call, run whole, gives eager's result)."""
    weight, indices = torch.randn(10, 4), torch.tensor([1, 2, 1, 5, 1, 9, 2, 0])
    fn = lambda w, i, o: F.embedding_bag(i, w, o, mode="sum")  # noqa: E731
    jfn = thunder_rs.jit(fn)
    for bad in (torch.tensor([1, 3]), torch.tensor([0, 3, 9]), torch.tensor([0, 5, 3])):
        decreasing = bad[0] == 0 and bad[-1] <= len(indices)  # (eager's kernel reads past its bags then and
        if not decreasing:  # raises or not by what memory holds: "Expected i < index_size" in one run, not another)
            with pytest.raises(RuntimeError):
                fn(weight, indices, bad)
        if decompose or not decreasing:  # (the jitted call runs eager's kernel whole)
            with pytest.raises(RuntimeError):
                _decomposed(fn, weight, indices, bad) if decompose else jfn(weight.requires_grad_(), indices, bad)
    last = lambda w, i, o: F.embedding_bag(i, w, o, mode="sum", include_last_offset=True)  # noqa: E731
    with pytest.raises(NotImplementedError, match="include_last_offset"):
        _decomposed(last, weight.detach(), indices, torch.tensor([0, 3, 6]))


# -- aten's antialiased resize kernels by name ----------------------------------------------------------------


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: torch.ops.aten._upsample_bilinear2d_aa(
            a, output_size=[3, 3], align_corners=False, scale_factors=None
        ),
        lambda a: torch.ops.aten._upsample_bicubic2d_aa(a, None, True, [1.7, 0.9]),
        lambda a: torch._C._nn._upsample_bilinear2d_aa(a.mT, [5, 7], False),
    ],
)
def test_aten_antialiased_resizes_are_interpolates(fn) -> None:
    """``vec`` calls (as ``F.interpolate`` makes them) are its antialiased resize: bit-equal values
    and gradients through the torch executor."""
    check_bit_equal(fn, torch.randn(2, 3, 10, 20, requires_grad=True))


def test_aten_antialiased_resize_with_separate_scales_is_native() -> None:
    """The default form (scales given apart from the size) is traced, with eager's values and
    gradients (round 8: it was an eager fallback; tests/test_op_fidelity_round8.py)."""
    fn = lambda a: torch.ops.aten._upsample_bilinear2d_aa(a, [3, 3], False, 0.5, 0.5)  # noqa: E731
    x = torch.randn(2, 3, 10, 20)
    assert not thunder_rs.examine(fn, x).fallbacks
    check_bit_equal(fn, x.requires_grad_())


# -- linalg.matrix_sqrth, linalg.polar, linalg.eig, linalg.eigvals ----------------------------------------------


@pytest.mark.parametrize("name", ["matrix_sqrth", "polar", "eig", "eigvals"])
def test_linalg_kernels_run_as_eagers_with_its_derivative(name: str) -> None:
    """Eager's kernel whole and its derivative (complex outputs for eig and eigvals, whose
    gradient eager defines), as the other linalg kernels: bit-equal values and gradients."""
    a = torch.randn(2, 4, 4, dtype=torch.float64)
    if name == "matrix_sqrth":
        a = a @ a.mT + torch.eye(4, dtype=torch.float64)
    x = a.requires_grad_()
    fn = getattr(torch.linalg, name)
    assert thunder_rs.examine(fn, x).fallbacks == {}
    expected, actual = fn(x), thunder_rs.jit(fn)(x)
    expected, actual = (v if isinstance(v, tuple) else (v,) for v in (expected, actual))
    for e, r in zip(expected, actual, strict=True):
        assert torch.equal(e, r) and e.dtype == r.dtype
    grads = [torch.autograd.grad(sum(t.abs().sum() for t in outs), x)[0] for outs in (expected, actual)]
    assert torch.equal(grads[0], grads[1])


def test_embedding_bag_bounds_read_the_offsets_once(monkeypatch) -> None:
    """The offsets' checks take one host read (``tolist``), not one per check (two ``item`` and a
    ``bool``: three device syncs on CUDA); the checks raise eager's errors as before."""
    from thunder_rs.torch.layers import _aten_embedding_bag_bounds

    reads: list = []
    for name in ("item", "tolist", "__bool__"):
        method = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, _m=method, _n=name: reads.append(_n) or _m(self))
    offsets = torch.tensor([0, 2, 2, 5])
    assert torch.equal(_aten_embedding_bag_bounds(offsets, 3, 8, False), offsets[:3])
    assert reads == ["tolist"]
    monkeypatch.undo()
    indices, weight = torch.tensor([1, 2, 1, 5, 1, 9, 2, 0]), torch.randn(10, 4)
    for bad in (torch.tensor([1, 3]), torch.tensor([0, 3, 9])):
        with pytest.raises(RuntimeError) as eager:
            F.embedding_bag(indices, weight, bad, mode="sum")
        with pytest.raises(RuntimeError) as ours:
            _aten_embedding_bag_bounds(bad, len(bad), len(indices), False)
        assert str(ours.value).split("\n")[0] == str(eager.value).split("\n")[0]
