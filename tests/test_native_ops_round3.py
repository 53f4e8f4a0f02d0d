"""Ops the op database ran as eager fallbacks (round 3), now traced natively: each is bit-equal to
eager (``torch.equal``) in float32, forward and backward, on contiguous, transposed and empty
inputs where eager takes them, falls back nowhere, and rejects what eager rejects with eager's
exception type. Where a fusion executor runs the decomposition instead of eager's kernel
(``torch_ex.decomposing()``), the forward is bit-equal too unless a test says otherwise.
"""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import thunder_rs
from thunder_rs.executors.torch_ex import decomposing

from test_native_ops_round2 import check_bit_equal, check_same_error


def _decomposed_equal(fn, *args) -> None:
    """The decomposition's forward (no kernel run whole) is eager's bit for bit."""
    with decomposing():
        actual = thunder_rs.jit(fn)(*args)
    expected = fn(*args)
    assert torch.equal(actual, expected) and actual.stride() == expected.stride()


# -- multilabel_margin_loss -------------------------------------------------------------------------


def _multilabel_targets(rows: int, classes: int, seed: int = 0) -> torch.Tensor:
    """Targets with a -1 in most rows (later entries ignored, some out of order or repeated)."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.randint(0, classes, (rows, classes), generator=gen)
    stops = torch.randint(0, classes + 1, (rows,), generator=gen)
    for r, s in enumerate(stops.tolist()):
        if s < classes:
            t[r, s] = -1
    return t


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("case", ["2d", "transposed", "1d", "0d", "wide"])
def test_multilabel_margin_loss(reduction: str, case: str) -> None:
    shapes = {"2d": (5, 6), "transposed": (5, 6), "1d": (7,), "0d": (), "wide": (16, 40)}
    shape = shapes[case]
    if case == "transposed":
        x = torch.randn(6, 5).mT.requires_grad_()
    else:
        x = torch.randn(shape, requires_grad=True)
    if case == "0d":
        t = torch.tensor(0)
    elif case == "1d":
        t = _multilabel_targets(1, 7)[0]
    else:
        t = _multilabel_targets(*shape)

    def fn(a, b):
        return F.multilabel_margin_loss(a, b, reduction=reduction)

    check_bit_equal(fn, x, t)
    _decomposed_equal(fn, x.detach(), t)


def test_multilabel_margin_loss_of_no_rows_and_legacy_flags() -> None:
    x, t = torch.randn(0, 4, requires_grad=True), torch.zeros(0, 4, dtype=torch.long)
    check_bit_equal(lambda a, b: F.multilabel_margin_loss(a, b, reduction="none"), x, t)
    x, t = torch.randn(3, 4, requires_grad=True), _multilabel_targets(3, 4)
    check_bit_equal(lambda a, b: F.multilabel_margin_loss(a, b, size_average=False), x, t)
    check_bit_equal(lambda a, b: F.multilabel_margin_loss(a, b, reduce=False), x, t)


def test_multilabel_margin_loss_errors() -> None:
    x, t = torch.randn(3, 4), _multilabel_targets(3, 4)
    loss = F.multilabel_margin_loss
    check_same_error(loss, x.bfloat16(), t)  # (eager's kernel: float and double only)
    check_same_error(loss, x, t.int())
    check_same_error(loss, x, t[:2])
    check_same_error(loss, torch.randn(3, 0), torch.zeros(3, 0, dtype=torch.long))
    check_same_error(loss, x, torch.full((3, 4), 4))  # out of range, read from the data
    check_same_error(loss, x, torch.full((3, 4), -2))
    check_same_error(lambda a, b: loss(a, b, reduction="bogus"), x, t)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_multilabel_margin_loss_in_half_precision_on_cuda_runs_eagers_kernels(dtype) -> None:
    """CUDA's kernel takes half precision (the CPU's does not): the loss was refused on CUDA with
    the CPU kernel's error. On fake CUDA tensors: eager's dtype and shape, the forward and backward
    each eager's kernel (the backward kernel has no fake implementation: its trace is read)."""
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415

    targets = _multilabel_targets(3, 5)
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.randn(3, 5, device="cuda", dtype=dtype, requires_grad=True)
        t = targets.to("cuda")
        jfn = thunder_rs.jit(F.multilabel_margin_loss)
        actual, expected = jfn(x, t), F.multilabel_margin_loss(x, t)
    assert (actual.dtype, actual.shape, actual.requires_grad) == (expected.dtype, expected.shape, True)
    assert "torch_multilabel_margin_loss(" in str(thunder_rs.last_traces(jfn)[-1])
    assert "torch_multilabel_margin_loss_backward(" in str(thunder_rs.last_backward_traces(jfn)[-1])


# -- igamma and igammac: one prim each (eager's kernel), eager's derivative in x ---------------------


INCOMPLETE_GAMMA = {
    "igamma": torch.igamma,
    "igammac": torch.igammac,
    "gammainc": torch.special.gammainc,
    "gammaincc": torch.special.gammaincc,
    "method": torch.Tensor.igamma,
}


@pytest.mark.parametrize("name", INCOMPLETE_GAMMA)
@pytest.mark.parametrize("case", ["plain", "broadcast", "transposed", "bfloat16", "promoted", "empty"])
def test_incomplete_gamma(name: str, case: str) -> None:
    fn = INCOMPLETE_GAMMA[name]
    gen = torch.Generator().manual_seed(0)
    a, x = torch.rand(4, 5, generator=gen) * 3 + 0.1, torch.rand(4, 5, generator=gen) * 4
    if case == "broadcast":
        a, x = a[:, :1], x[0]
    elif case == "transposed":
        a = a.mT.contiguous().mT  # (column-major)
    elif case == "bfloat16":
        a, x = a.bfloat16(), x.bfloat16()
    elif case == "promoted":
        a = a.double()
    elif case == "empty":
        a, x = a[:0], x[:0]
    check_bit_equal(fn, a, x.requires_grad_())


@pytest.mark.parametrize("fn", [torch.igamma, torch.igammac])
def test_incomplete_gamma_at_edges(fn) -> None:
    """Zero, infinite and NaN operands give eager's values (NaN where eager's is)."""
    a = torch.tensor([0.0, 1.0, float("inf"), float("nan"), -1.0, 2.0, 0.0])
    x = torch.tensor([1.0, 0.0, 2.0, 1.0, 1.0, float("inf"), 0.0])
    torch.testing.assert_close(thunder_rs.jit(fn)(a, x), fn(a, x), atol=0, rtol=0, equal_nan=True)


def test_incomplete_gamma_errors_and_refused_gradient() -> None:
    ints = torch.ones(3, dtype=torch.long)
    check_same_error(torch.igamma, ints, ints)
    check_same_error(torch.igamma, torch.ones(3), 2.0)
    check_same_error(torch.igammac, torch.ones(3), torch.ones(4))
    a = torch.rand(3, requires_grad=True)  # (eager raises in its backward: no derivative in a)
    out = thunder_rs.jit(torch.igamma)(a, torch.rand(3))
    with pytest.raises(NotImplementedError, match="the derivative for 'igamma: input' is not implemented"):
        out.sum().backward()
    with torch.no_grad():
        assert torch.equal(thunder_rs.jit(torch.igamma)(a, a), torch.igamma(a, a))


# -- linalg.tensorinv and linalg.tensorsolve: eager's reshapes around its inverse and solve -----------


def _invertible(n: int, *, transposed: bool = False) -> torch.Tensor:
    a = torch.randn(n, n, generator=torch.Generator().manual_seed(n)) + n * torch.eye(n)
    return a.mT.contiguous().mT if transposed else a


@pytest.mark.parametrize(
    "shape, ind, transposed", [((6, 2, 3), 1, False), ((2, 3, 2, 3), 2, False), ((6, 2, 3), 1, True), ((4, 4), 1, True)]
)
def test_linalg_tensorinv(shape, ind: int, transposed: bool) -> None:
    a = _invertible(shape[0] if ind == 1 else 6, transposed=transposed).reshape(shape)
    check_bit_equal(lambda x: torch.linalg.tensorinv(x, ind), a.requires_grad_())


@pytest.mark.parametrize("case", ["flat", "matrix", "dims"])
def test_linalg_tensorsolve(case: str) -> None:
    b = torch.randn(2, 3, generator=torch.Generator().manual_seed(1))
    if case == "flat":
        a, dims = _invertible(6).reshape(2, 3, 6), None
    elif case == "matrix":
        a, b, dims = _invertible(6, transposed=True), b.flatten(), None
    else:  # (the system's matrix is eager's movedim of a by dims, reshaped)
        a, b, dims = torch.movedim(_invertible(6).reshape(3, 2, 2, 3), (2, 3), (0, 2)), b.reshape(3, 2), (0, 2)
    check_bit_equal(lambda x, y: torch.linalg.tensorsolve(x, y, dims), a.requires_grad_(), b.requires_grad_())


def test_linalg_tensorinv_and_tensorsolve_errors() -> None:
    LA = torch.linalg
    check_same_error(lambda a: LA.tensorinv(a, 0), torch.randn(6, 2, 3))
    check_same_error(lambda a: LA.tensorinv(a, 2), torch.randn(2, 3, 5))
    check_same_error(lambda a: LA.tensorinv(a, 2), torch.zeros(2, 3, 6))  # singular, found by the inverse
    check_same_error(lambda a: LA.tensorinv(a, 1), torch.ones(6, 2, 3, dtype=torch.long))
    check_same_error(LA.tensorsolve, torch.randn(2, 3, 4), torch.randn(2, 3))
    check_same_error(LA.tensorsolve, torch.zeros(2, 3, 6), torch.randn(2, 3))
    check_same_error(LA.tensorsolve, torch.randn(2, 3, 6), torch.randn(2, 3).double())


# -- linear_cross_entropy: eager's reference path (linear, reshape, cross_entropy) ---------------------


_LCE_TARGET = torch.tensor([0, 3, 1, -100, 2])


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"reduction": "sum"},
        {"reduction": "none"},
        {"label_smoothing": 0.1, "weight": torch.tensor([0.7, 0.6, 0.1, 0.2])},
        {"ignore_index": 3},
    ],
    ids=["mean", "sum", "none", "smoothed_weighted", "ignore_index"],
)
@pytest.mark.parametrize("bias", [False, True])
def test_linear_cross_entropy(kwargs, bias: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 8, generator=gen), torch.randn(8, 4, generator=gen).mT
    b = torch.randn(4, generator=gen).requires_grad_() if bias else None
    target = _LCE_TARGET.clamp(min=0) if "ignore_index" in kwargs else _LCE_TARGET

    def fn(a, weight, linear_bias):
        return F.linear_cross_entropy(a, weight, target, linear_bias=linear_bias, **kwargs)

    check_bit_equal(fn, x.requires_grad_(), w.requires_grad_(), b)


def test_linear_cross_entropy_shapes() -> None:
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 8, generator=gen, requires_grad=True), torch.randn(4, 8, generator=gen, requires_grad=True)
    probabilities = torch.softmax(torch.randn(5, 4, generator=gen), 1)
    check_bit_equal(lambda a, b: F.linear_cross_entropy(a, b, probabilities), x, w)
    check_bit_equal(lambda a, b: F.linear_cross_entropy(a, b, torch.tensor(2)), x[0].detach().requires_grad_(), w)
    w3, b3 = torch.randn(4, 3, 8, generator=gen), torch.randn(4, 3, generator=gen)
    t3 = torch.randint(0, 4, (5, 3), generator=gen)
    check_bit_equal(
        lambda a, b, c: F.linear_cross_entropy(a, b, t3, linear_bias=c), x, w3.requires_grad_(), b3.requires_grad_()
    )


def test_linear_cross_entropy_with_options_stays_eagers_and_errors() -> None:
    x, w, target = torch.randn(5, 8), torch.randn(4, 8), _LCE_TARGET.clamp(min=0)
    options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=2)

    def chunked(a, b):
        return F.linear_cross_entropy(a, b, target, options=options)

    with warnings.catch_warnings():  # (eager's chunked op may warn, asked of meta tensors)
        warnings.simplefilter("ignore")
        assert set(thunder_rs.examine(chunked, x, w).fallbacks) == {"torch.nn.functional.linear_cross_entropy"}
    loss = F.linear_cross_entropy
    check_same_error(lambda a, b: loss(a, b, target), x, torch.randn(4, 7))
    check_same_error(lambda a, b: loss(a, b, target), torch.randn(2, 5, 8), w)
    check_same_error(lambda a, b: loss(a, b, target, linear_bias=torch.randn(3)), x, w)
    check_same_error(lambda a, b: loss(a, b, torch.softmax(a @ b.mT, 1), ignore_index=3), x, w)
    check_same_error(lambda a, b: loss(a, b, torch.tensor(1)), torch.randn(8), torch.randn(4, 3, 8))


# -- nonzero_static: the table of indices traced from a running count of the mask --------------------


_NONZERO = torch.tensor([[0.0, 1.0, 0.0, float("nan")], [2.0, -0.0, 3.0, 0.0]])


@pytest.mark.parametrize(
    "input, kwargs",
    [
        (_NONZERO, {"size": 8}),
        (_NONZERO, {"size": 2, "fill_value": 7}),
        (_NONZERO.mT, {"size": 4}),
        (_NONZERO.bool(), {"size": 5}),
        (torch.tensor(3.0), {"size": 2}),
        (torch.zeros(0, 3), {"size": 2}),
        (_NONZERO, {"size": 0}),
        (torch.arange(24).reshape(2, 3, 4) % 5, {"size": 30, "fill_value": -5}),
    ],
    ids=["filled", "cut", "transposed", "bool", "0d", "empty", "no_rows", "3d"],
)
def test_nonzero_static(input: torch.Tensor, kwargs) -> None:
    check_bit_equal(lambda a: torch.nonzero_static(a, **kwargs), input)
    check_bit_equal(lambda a: a.nonzero_static(**kwargs), input)
    _decomposed_equal(lambda a: torch.nonzero_static(a, **kwargs), input)


def test_nonzero_static_serves_other_lengths_and_errors() -> None:
    fn = thunder_rs.jit(lambda a: torch.nonzero_static(a.relu(), size=4), dynamic=True)
    for n in (5, 7, 9):
        a = torch.randn(n, generator=torch.Generator().manual_seed(n))
        assert torch.equal(fn(a), torch.nonzero_static(a.relu(), size=4))
    assert thunder_rs.compile_stats(fn).cache_misses == 1
    check_same_error(lambda a: torch.nonzero_static(a, size=-1), _NONZERO)
    check_same_error(lambda a: torch.nonzero_static(a, size=2, fill_value=1.5), _NONZERO)


# -- lu_unpack: the pivots' swaps in turn, and the triangles of LU as new contiguous tensors -----------


@pytest.mark.parametrize("shape", [(4, 4), (2, 5, 3), (3, 5), (0, 3, 3)])
@pytest.mark.parametrize("unpack", [(True, True), (False, True), (True, False)], ids=["both", "pivots", "data"])
def test_lu_unpack(shape, unpack) -> None:
    LU, pivots = torch.linalg.lu_factor(torch.randn(shape, generator=torch.Generator().manual_seed(0)))

    def fn(a, p):
        return torch.lu_unpack(a, p, *unpack)

    # (eager's own backward fails where L and U are not unpacked: their cotangents are empty)
    check_bit_equal(fn, LU.requires_grad_(), pivots, grad=unpack[0])
    _decomposed_equal(lambda a, p: torch.cat([t.flatten() for t in fn(a, p)]), LU.detach(), pivots)


def test_lu_unpack_errors() -> None:
    LU, pivots = torch.linalg.lu_factor(torch.randn(3, 3))
    for bad in [(LU, pivots.long()), (LU, pivots[:2]), (LU[0], pivots), (LU, pivots + 5), (LU, pivots - 5)]:
        check_same_error(torch.lu_unpack, *bad)


# -- linalg.cond: eager's composite over svdvals, or the norms of A and its inverse -------------------


@pytest.mark.parametrize("p", [None, 2, -2, "nuc", 1, -1, math.inf, -math.inf, "fro"])
@pytest.mark.parametrize("case", ["square", "batched_transposed", "singular"])
def test_linalg_cond(p, case: str) -> None:
    gen = torch.Generator().manual_seed(0)
    a = {
        "square": torch.randn(3, 3, generator=gen),
        "batched_transposed": torch.randn(2, 4, 4, generator=gen).mT,
        "singular": torch.zeros(3, 3),
    }[case]

    def fn(x):
        return torch.linalg.cond(x, p)

    if case == "singular":  # (0 / 0 for 2-norms, infinity through the inverse: eager's NaN and inf)
        torch.testing.assert_close(thunder_rs.jit(fn)(a), fn(a), atol=0, rtol=0, equal_nan=True)
        return
    # (eager cannot differentiate the orders through the inverse: see the next test)
    check_bit_equal(fn, a.requires_grad_(p in (None, 2, -2, "nuc")))


def test_linalg_cond_of_rectangular_and_empty_matrices() -> None:
    gen = torch.Generator().manual_seed(0)
    check_bit_equal(lambda x: torch.linalg.cond(x), torch.randn(3, 5, generator=gen, requires_grad=True))
    check_bit_equal(lambda x: torch.linalg.cond(x, -2), torch.randn(2, 5, 3, generator=gen, requires_grad=True))
    for shape, p in [((0, 3, 4), None), ((2, 0, 0), "fro"), ((0, 3, 4), 1)]:
        check_bit_equal(lambda x: torch.linalg.cond(x, p), torch.zeros(shape))


def test_linalg_cond_errors() -> None:
    bad = [(torch.randn(3), None), (torch.randn(3, 4), 1), (torch.randn(3, 3), 3), (torch.randn(3, 3), "abc")]
    bad += [(torch.randn(3, 4), "fro"), (torch.ones(3, 3).long(), None), (torch.ones(3, 3).long(), 1)]
    for a, p in bad:
        check_same_error(torch.linalg.cond, a, p)


def test_linalg_cond_through_the_inverse_refuses_grad_as_eagers_backward_fails() -> None:
    """Eager fills in place the inverse ``linalg_inv_ex`` saved, so its backward raises."""
    a = torch.randn(3, 3, requires_grad=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(torch.linalg.cond(a, 1), a)
    with pytest.raises(RuntimeError, match="in place"):
        thunder_rs.jit(lambda x: torch.linalg.cond(x, 1))(a)
    with torch.no_grad():
        assert torch.equal(thunder_rs.jit(lambda x: torch.linalg.cond(x, 1))(a), torch.linalg.cond(a, 1))


# -- grid_sampler_2d and grid_sampler_3d: aten's kernels by name, with aten's own backward kernels -----


@pytest.mark.parametrize("interpolation", [0, 1])
@pytest.mark.parametrize("padding", [0, 1, 2])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sampler_2d(interpolation: int, padding: int, align_corners: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 6, 5, generator=gen).transpose(2, 3)
    grid = torch.rand(2, 4, 4, 2, generator=gen) * 2.2 - 1.1

    def fn(a, b):
        return torch.grid_sampler_2d(a, b, interpolation, padding, align_corners)

    check_bit_equal(fn, x.requires_grad_(), grid.requires_grad_())


def test_grid_sampler_bicubic_and_3d_run_eagers_kernels() -> None:
    """(Their decompositions are refused for fusing executors, as F.grid_sample's: examine counts
    them as eager's; the torch executor runs aten's op, with its values and gradients.)"""
    gen = torch.Generator().manual_seed(0)
    x, grid = torch.randn(2, 3, 5, 6, generator=gen), torch.rand(2, 4, 4, 2, generator=gen) * 2 - 1
    assert torch.equal(
        thunder_rs.jit(torch.grid_sampler_2d)(x, grid, 2, 1, False), torch.grid_sampler_2d(x, grid, 2, 1, False)
    )
    x3 = torch.randn(2, 3, 4, 5, 6, generator=gen, requires_grad=True)
    g3 = (torch.rand(2, 4, 4, 4, 3, generator=gen) * 2 - 1).requires_grad_()
    for interpolation, padding in [(0, 0), (1, 2), (0, 1)]:

        def fn(a, b):
            return torch.grid_sampler_3d(a, b, interpolation, padding, True)

        expected, actual = fn(x3, g3), thunder_rs.jit(fn)(x3, g3)
        assert torch.equal(expected, actual)
        grads = [torch.autograd.grad(out.sum(), (x3, g3)) for out in (expected, actual)]
        assert all(torch.equal(e, a) for e, a in zip(*grads))


def test_grid_sampler_nd_errors() -> None:
    x, grid = torch.randn(2, 3, 5, 6), torch.rand(2, 4, 4, 2)
    for args in [(x, grid.double()), (x[0], grid[0]), (x, grid[:1]), (x, grid[..., :1])]:
        check_same_error(torch.grid_sampler_2d, *args, 0, 0, False)
    check_same_error(torch.grid_sampler_3d, x, grid, 0, 0, False)
    with pytest.raises(NotImplementedError, match="interpolation mode 5"):  # (eager computes something)
        thunder_rs.jit(torch.grid_sampler_2d)(x, grid, 5, 0, False)
