"""Input gradients laid out as eager's: ``torch.autograd.grad(out, x)`` (and what a hook or
``retain_grad`` sees) returns the strides the backward formula produced, which AccumulateGrad does
not re-lay out as it does a parameter's ``.grad``. Each case compares the gradients' strides and
values with eager's on non-contiguous inputs (transposed, sliced with a step, channels_last) and
on contiguous ones where eager's differ from the obvious (a mean's gradient is a new tensor, not
a broadcast). The sweep these cases came from ran over the OpInfo samples with their inputs made
non-contiguous.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import thunder_rs

# (eager's own warnings: the even kernel of the "same" padding case, the broadcast target)
pytestmark = [
    pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths"),
    pytest.mark.filterwarnings("ignore:Using a target size"),
    pytest.mark.filterwarnings(r"ignore:index_reduce\(\) is in beta"),
]


def transposed(t: torch.Tensor) -> torch.Tensor:
    return t.t().contiguous().t()


def stepped(t: torch.Tensor) -> torch.Tensor:
    wide = torch.zeros(t.shape[0], 2 * t.shape[1], dtype=t.dtype)
    wide[:, ::2] = t
    return wide[:, ::2]


def contiguous(t: torch.Tensor) -> torch.Tensor:
    return t


LAYOUTS = {"transposed": transposed, "stepped": stepped, "contiguous": contiguous}
MATRIX = ((3, 4),)
PAIR = ((3, 4), (3, 4))


def positive(x: torch.Tensor) -> torch.Tensor:
    return x.abs() + 0.5


def any_value(x: torch.Tensor) -> torch.Tensor:
    return x


SCATTER_INDEX = torch.tensor([[0, 1, 0], [2, 2, 1], [3, 0, 0]])
POS_WEIGHT = torch.linspace(0.5, 2.0, 4, dtype=torch.float64)

#: name -> (program, the shapes of its inputs, the values they take)
CASES: dict[str, tuple[Callable, tuple, Callable]] = {
    # in-place reuse of a dying second operand laid the product out as that operand
    "div": (torch.div, PAIR, any_value),
    "true_divide": (torch.true_divide, PAIR, any_value),
    "fmod": (torch.fmod, PAIR, positive),
    "remainder": (torch.remainder, PAIR, positive),
    "addcmul": (lambda a, b, c: torch.addcmul(a, b, c, value=0.5), PAIR + MATRIX, any_value),
    "addcdiv": (lambda a, b, c: torch.addcdiv(a, b, c, value=0.5), PAIR + MATRIX, positive),
    # pow's exponent gradient: the cotangent times the rest, as eager's formula
    "pow": (torch.pow, PAIR, positive),
    "float_power": (torch.float_power, PAIR, positive),
    # rounded division: zeros_like the cotangent
    "div trunc": (lambda a, b: torch.div(a, b, rounding_mode="trunc"), PAIR, positive),
    "div floor by a row": (lambda a, b: torch.div(a, b[0], rounding_mode="floor"), PAIR, positive),
    # selections along a dim: scattered into new contiguous zeros
    "kthvalue": (lambda a: torch.kthvalue(a, 2, 1).values, MATRIX, any_value),
    "mode": (lambda a: torch.mode(a, 0).values, MATRIX, any_value),
    "median dim": (lambda a: torch.median(a, 1, keepdim=True).values, MATRIX, any_value),
    # reductions of a whole tensor that share the gradient: new zeros filled on the CPU
    "max": (torch.max, MATRIX, any_value),
    "median": (torch.median, MATRIX, any_value),
    "nanmedian": (torch.nanmedian, MATRIX, any_value),
    # mean: the cotangent expanded, then divided
    "mean": (torch.mean, MATRIX, any_value),
    "mean dim": (lambda a: a.mean(1), MATRIX, any_value),
    "mean keepdim": (lambda a: a.mean(0, keepdim=True), MATRIX, any_value),
    # constant padding: the cotangent padded back, a new tensor
    "pad": (lambda a: F.pad(a, (1, 2)), MATRIX, any_value),
    "pad rows and crop": (lambda a: F.pad(a, (-1, 0, 2, 1), value=3.0), MATRIX, any_value),
    "constant_pad_nd": (lambda a: torch.constant_pad_nd(a, (0, 1, 1, 0)), MATRIX, any_value),
    "conv1d same, even kernel": (
        lambda a, w: F.conv1d(a[None], w[:, None, :2], padding="same", groups=3),
        PAIR,
        any_value,
    ),
    # an added dim of size 1 is squeezed off the cotangent: a view of it, as eager's
    "stack": (lambda a, b: torch.stack([a, b], 1), PAIR, any_value),
    "unsqueeze": (lambda a: a.unsqueeze(1) * 2, MATRIX, any_value),
    "dstack": (lambda a, b: torch.dstack([a, b]), PAIR, any_value),
    # products: a column-major matrix gets a column-major gradient (mm_mat1/mm_mat2_backward)
    "mm": (torch.mm, ((3, 4), (4, 5)), any_value),
    "addmm": (lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0), ((3, 5), (3, 4), (4, 5)), any_value),
    "linear": (F.linear, ((3, 4), (5, 4)), any_value),
    "tensordot": (lambda a, b: torch.tensordot(a, b, 1), ((3, 4), (4, 5)), any_value),
    "inner": (torch.inner, ((3, 4), (2, 4)), any_value),
    "multi_dot": (lambda a, b, c: torch.linalg.multi_dot([a, b, c]), ((3, 4), (4, 5), (5, 2)), any_value),
    "linear with bias": (lambda x, w, b: F.linear(x, w, b[0]), ((3, 4), (5, 4), (2, 5)), any_value),
    # regression losses: eager's kernels write contiguous gradients
    "mse_loss": (F.mse_loss, PAIR, any_value),
    "mse_loss none": (lambda a, b: F.mse_loss(a, b, reduction="none"), PAIR, any_value),
    "mse_loss sum, broadcast": (lambda a, b: F.mse_loss(a, b[0], reduction="sum"), PAIR, any_value),
    "smooth_l1_loss": (lambda a, b: F.smooth_l1_loss(a, b, beta=0.5), PAIR, any_value),
    "huber_loss none": (lambda a, b: F.huber_loss(a, b, reduction="none", delta=0.5), PAIR, any_value),
    # F.huber_loss's weighted form: the mean's gradient, mul's, then the kernel's, contiguous
    "huber_loss weight": (lambda a, b, w: F.huber_loss(a, b, delta=0.5, weight=w), PAIR + MATRIX, any_value),
    "huber_loss weight sum": (lambda a, b, w: F.huber_loss(a, b, reduction="sum", weight=w), PAIR + MATRIX, any_value),
    "huber_loss weight none": (
        lambda a, b, w: F.huber_loss(a, b, reduction="none", weight=w),
        PAIR + MATRIX,
        any_value,
    ),
    # cdist's matmul form: _euclidean_dist_backward's products, in the operands' layouts
    "cdist by matmul": (
        lambda a, b: torch.cdist(a, b, compute_mode="use_mm_for_euclid_dist"),
        PAIR,
        any_value,
    ),
    # an empty operand: _cdist_backward's zeros_like of each operand
    "cdist of none": (lambda a, b: torch.cdist(a[:0], b), PAIR, any_value),
    # multi_margin_loss_backward's kernel writes a new contiguous tensor
    "multi_margin_loss": (lambda a: F.multi_margin_loss(a, torch.tensor([0, 3, 1])), MATRIX, any_value),
    "multi_margin_loss p=2 none": (
        lambda a: F.multi_margin_loss(a, torch.tensor([0, 3, 1]), p=2, reduction="none"),
        MATRIX,
        any_value,
    ),
    # composite losses: the mean's gradient a new tensor (eager's loss.mean()), then the ops'
    "l1_loss": (F.l1_loss, PAIR, any_value),
    "kl_div none": (lambda a, b: F.kl_div(a, b, reduction="none"), PAIR, positive),
    "kl_div log_target": (lambda a, b: F.kl_div(a, b, reduction="batchmean", log_target=True), PAIR, any_value),
    "poisson_nll_loss sum": (lambda a, b: F.poisson_nll_loss(a, b, reduction="sum"), PAIR, positive),
    "poisson_nll_loss": (lambda a, b: F.poisson_nll_loss(a, b, log_input=False), PAIR, positive),
    "poisson_nll_loss full": (lambda a, b: F.poisson_nll_loss(a, b * 2, full=True), PAIR, positive),
    # binary cross entropy: eager's gradients are in the input's layout
    "binary_cross_entropy": (lambda a, b: F.binary_cross_entropy(a, b, reduction="none"), PAIR, torch.sigmoid),
    "binary_cross_entropy mean": (F.binary_cross_entropy, PAIR, torch.sigmoid),
    "binary_cross_entropy_with_logits": (
        lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction="none"),
        PAIR,
        torch.sigmoid,
    ),
    "binary_cross_entropy_with_logits pos_weight": (
        lambda a, b: F.binary_cross_entropy_with_logits(a, b, pos_weight=POS_WEIGHT),
        PAIR,
        torch.sigmoid,
    ),
    # diagonals: new zeros with the cotangent on the diagonal; an embedding's is a diagonal view
    "diagonal": (lambda a: torch.diagonal(a, 0, 1, 0), MATRIX, any_value),
    "diagonal offset": (lambda a: a.diagonal(1), MATRIX, any_value),
    "diagonal_scatter": (lambda a, b: torch.diagonal_scatter(a, b[0, :3], 0, 1, 0), PAIR, any_value),
    "diag_embed": (lambda a: torch.diag_embed(a, 1, 0, 2), MATRIX, any_value),
    "diagflat": (lambda a: torch.diagflat(a, -1), MATRIX, any_value),
    # matrix_power(A, 0): new contiguous zeros, not a broadcast zero
    "matrix_power 0": (lambda a: torch.linalg.matrix_power(a, 0), ((3, 3),), any_value),
    # other powers: the products' gradients, column-major for a column-major matrix as mm's
    "matrix_power 4": (lambda a: torch.linalg.matrix_power(a, 4), ((3, 3),), any_value),
    "matrix_power 3": (lambda a: torch.linalg.matrix_power(a, 3), ((3, 3),), any_value),
    # masked_scatter's: grad.masked_fill(mask, 0), and the source's read at the masked positions
    "masked_scatter": (lambda a, b: torch.masked_scatter(a, b > 0, b.flatten()), PAIR, any_value),
    # take's: the cotangent put into zeros_like the input (a repeated index accumulates)
    "take": (lambda a: torch.take(a, torch.tensor([[0, 5], [5, 11]])), MATRIX, any_value),
    # scatter_reduce's excluded input: grad_self.scatter(dim, index, 0), a new contiguous tensor
    "scatter_reduce amax": (
        lambda a, s: a.scatter_reduce(1, SCATTER_INDEX, s[:, :3], "amax", include_self=False),
        PAIR,
        any_value,
    ),
    "scatter_reduce amin": (
        lambda a, s: a.scatter_reduce(1, SCATTER_INDEX, s[:, :3], "amin", include_self=False),
        PAIR,
        any_value,
    ),
    "scatter_reduce mean": (
        lambda a, s: a.scatter_reduce(1, SCATTER_INDEX, s[:, :3] * 2, "mean", include_self=False),
        PAIR,
        any_value,
    ),
    # index_reduce's: grad_self.index_fill(dim, index, 0), in its own layout
    "index_reduce amax": (
        lambda a, s: a.index_reduce(1, torch.tensor([0, 2, 0]), s[:, :3], "amax", include_self=False),
        PAIR,
        any_value,
    ),
    # derivatives.yaml's formulas in eager's operand order; xlogy's a masked_fill, a new tensor
    "xlogy": (torch.xlogy, PAIR, positive),
    "xlog1py by a row": (lambda a, b: torch.special.xlog1py(a, b[0]), PAIR, positive),
    "copysign": (torch.copysign, PAIR, any_value),
    "lerp": (lambda a, b, w: torch.lerp(a, b[0], w[:, :1]), PAIR + MATRIX, any_value),
    "logaddexp": (torch.logaddexp, PAIR, any_value),
    "logaddexp2": (torch.logaddexp2, PAIR, any_value),
}

#: The default run: one case of each cause, on the layout that showed it.
DEFAULT = {("div", "transposed"), ("pow", "transposed"), ("div trunc", "transposed"), ("kthvalue", "transposed")}
DEFAULT |= {("max", "transposed"), ("mean dim", "contiguous"), ("pad", "stepped"), ("stack", "transposed")}
DEFAULT |= {("mm", "transposed"), ("linear", "stepped"), ("diagonal", "stepped"), ("diagflat", "transposed")}
DEFAULT |= {("matrix_power 4", "transposed"), ("scatter_reduce amax", "transposed"), ("huber_loss weight", "stepped")}
DEFAULT |= {("xlogy", "transposed"), ("lerp", "transposed"), ("l1_loss", "transposed"), ("kl_div none", "transposed")}


def params() -> list:
    return [
        pytest.param(name, layout, id=f"{name}-{layout}", marks=() if (name, layout) in DEFAULT else pytest.mark.slow)
        for name in CASES
        for layout in LAYOUTS
    ]


def input_grads(fn: Callable, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    leaves = [x.detach().requires_grad_() for x in inputs]
    out = fn(*leaves)
    torch.manual_seed(1)
    cotangent = torch.randn(out.shape, dtype=out.dtype)
    return torch.autograd.grad(out, leaves, cotangent)


@pytest.mark.parametrize(("name", "layout"), params())
def test_input_gradients_have_eagers_strides(name: str, layout: str):
    program, shapes, domain = CASES[name]
    torch.manual_seed(0)
    inputs = [LAYOUTS[layout](domain(torch.randn(shape, dtype=torch.float64))) for shape in shapes]
    expected = input_grads(program, inputs)
    actual = input_grads(thunder_rs.jit(program), inputs)
    for i, (grad, eager) in enumerate(zip(actual, expected, strict=True)):
        torch.testing.assert_close(grad, eager)
        assert grad.stride() == eager.stride(), f"input {i}: strides {grad.stride()}, eager's {eager.stride()}"


def test_copysign_gives_its_sign_operand_eagers_zero_gradient():
    """Eager's formula for ``other`` is ``zeros_like(other)``: ``.grad`` is zeros, not None."""
    grads = []
    for fn in (torch.copysign, thunder_rs.jit(torch.copysign)):
        torch.manual_seed(0)
        a, b = (transposed(torch.randn(3, 4, dtype=torch.float64)).requires_grad_() for _ in range(2))
        fn(a, b).sum().backward()
        grads.append((a.grad, b.grad))
    for grad, eager in zip(*reversed(grads), strict=True):
        assert grad is not None
        torch.testing.assert_close(grad, eager, rtol=0, atol=0)
        assert grad.stride() == eager.stride()


#: Products that ignore their input's values with ``beta=0``: name -> (program, input shapes).
BETA_ZERO = {
    "addmm": (lambda c, a, b: torch.addmm(c, a, b, beta=0), ((3, 5), (3, 4), (4, 5))),
    "baddbmm": (lambda c, a, b: torch.baddbmm(c, a, b, beta=0), ((2, 3, 5), (2, 3, 4), (2, 4, 5))),
    "addbmm": (lambda c, a, b: torch.addbmm(c, a, b, beta=0), ((3, 5), (2, 3, 4), (2, 4, 5))),
    "addmv": (lambda c, a, b: torch.addmv(c, a, b, beta=0), ((3,), (3, 4), (4,))),
    "addr": (lambda c, a, b: torch.addr(c, a, b, beta=0), ((3, 4), (3,), (4,))),
}


@pytest.mark.parametrize("name", list(BETA_ZERO))
def test_an_input_ignored_by_beta_zero_gets_eagers_zero_gradient(name: str):
    """Eager's gradient of the ignored input is the cotangent times 0: ``.grad`` is zeros, with
    the cotangent's layout, where it stayed None."""
    program, shapes = BETA_ZERO[name]
    torch.manual_seed(0)
    values = [torch.randn(shape, dtype=torch.float64) for shape in shapes]
    values[0] = transposed(values[0]) if values[0].ndim == 2 else values[0]
    values[0][0] = float("nan")  # ignored by the forward
    grads = []
    for fn in (program, thunder_rs.jit(program)):
        leaves = [x.detach().requires_grad_() for x in values]
        out = fn(*leaves)
        assert not out.isnan().any()
        out.backward(torch.ones_like(out))
        grads.append([x.grad for x in leaves])
    for grad, eager in zip(*reversed(grads), strict=True):
        assert grad is not None
        torch.testing.assert_close(grad, eager)
        assert grad.stride() == eager.stride()


def channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last)


#: Gradients whose layout follows the cotangent's, given one laid out as eager's output (as a
#: loss's gradient through later layout-preserving ops is): name -> (program, its inputs).
FOLLOW_COTANGENT: dict[str, tuple[Callable, Callable]] = {
    # eager's formulas write zeros into the cotangent, or read the written part back from it
    "slice_scatter": (
        lambda a, b: torch.slice_scatter(a, b, 0, 1, 3),
        lambda: [transposed(torch.randn(n, 4, dtype=torch.float64)) for n in (5, 2)],
    ),
    "select_scatter": (
        lambda a, b: torch.select_scatter(a, b, 1, -1),
        lambda: [transposed(torch.randn(3, 4, dtype=torch.float64)), torch.randn(3, dtype=torch.float64)],
    ),
    "put": (
        lambda a, b: torch.put(a, torch.tensor([0, 5, 2]), b),
        lambda: [transposed(torch.randn(2, 4, dtype=torch.float64)), torch.randn(3, dtype=torch.float64)],
    ),
    "index_put": (
        lambda a, b: torch.index_put(a, (torch.tensor([0, 1]), torch.tensor([[0], [2]])), b),
        lambda: (
            [torch.randn(2, 4, 3, dtype=torch.float64).permute(2, 1, 0).contiguous().permute(2, 1, 0)]
            + [torch.randn(3, dtype=torch.float64)]
        ),
    ),
    # the inverse shuffle's kernel keeps a channels_last cotangent so
    "pixel_shuffle": (lambda a: F.pixel_shuffle(a, 2), lambda: [channels_last(torch.randn(1, 8, 2, 3))]),
    "pixel_unshuffle": (lambda a: F.pixel_unshuffle(a, 2), lambda: [channels_last(torch.randn(1, 2, 4, 6))]),
    # pow_backward's ``where(exponent == 0, 0, ...)``: the mask of a broadcast exponent is expanded
    "pow by a row": (
        torch.pow,
        lambda: [transposed(torch.rand(3, 4, dtype=torch.float64) + 0.5), torch.randn(4, dtype=torch.float64)],
    ),
    "pow by a 0-d float32": (
        torch.pow,
        lambda: [transposed(torch.rand(3, 4, dtype=torch.float64) + 0.5), torch.tensor(2.7, dtype=torch.float32)],
    ),
    "float_power by a 0-d": (
        torch.float_power,
        lambda: [transposed(torch.rand(3, 4, dtype=torch.float32) + 0.5), torch.tensor(0.6, dtype=torch.float64)],
    ),
    # indices apart (the index shape in front): index_backward's new zeros, contiguous whatever the
    # input's layout; a repeated index accumulates
    "getitem apart": (
        lambda a: a[torch.tensor([[0], [2], [0]]), :, torch.tensor([1, -1])],
        lambda: [torch.randn(3, 4, 5, dtype=torch.float64)],
    ),
    "getitem apart, permuted": (
        lambda a: a[torch.tensor([0, 2]), :, torch.tensor([1, 0])],
        lambda: [torch.randn(5, 4, 3, dtype=torch.float64).permute(2, 1, 0)],
    ),
    # bilinear's _trilinear_backward: each gradient a _trilinear, contiguous
    "bilinear": (
        F.bilinear,
        lambda: [
            transposed(torch.randn(3, 4, dtype=torch.float64)),
            transposed(torch.randn(3, 5, dtype=torch.float64)),
            torch.randn(6, 4, 5, dtype=torch.float64).permute(2, 1, 0).contiguous().permute(2, 1, 0),
            torch.randn(6, dtype=torch.float64),
        ],
    ),
    # grad.masked_fill(mask, 0): a new contiguous tensor whatever the mask's layout
    "masked_fill": (
        lambda a, m: torch.masked_fill(a, m, -1.5),
        lambda: [transposed(torch.randn(3, 4, dtype=torch.float64)), transposed(torch.randn(3, 4) > 0)],
    ),
}


@pytest.mark.parametrize("name", list(FOLLOW_COTANGENT))
def test_input_gradients_of_a_cotangent_laid_out_as_the_output_have_eagers_strides(name: str):
    program, make = FOLLOW_COTANGENT[name]
    torch.manual_seed(0)
    inputs = make()
    results = []
    for fn in (program, thunder_rs.jit(program)):
        leaves = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
        out = fn(*leaves)
        cotangent = torch.empty_like(out).copy_(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)))
        results.append(torch.autograd.grad(out, [x for x in leaves if x.requires_grad], cotangent))
    for i, (grad, eager) in enumerate(zip(*reversed(results), strict=True)):
        torch.testing.assert_close(grad, eager, rtol=0, atol=0)
        assert grad.stride() == eager.stride(), f"input {i}: strides {grad.stride()}, eager's {eager.stride()}"


#: Cases at several sizes, so that later calls run a variant compiled with symbolic sizes (dense
#: layouts: a strided input keys by its strides):
#: name -> (program, layout, the input shapes at a size n).
SYMBOLIC = {
    "div": (torch.div, "transposed", lambda n: ((3, n), (3, n))),
    "mean dim": (lambda a: a.mean(1), "contiguous", lambda n: ((3, n),)),
    "pad": (lambda a: F.pad(a, (1, 2)), "transposed", lambda n: ((3, n),)),
    "stack": (lambda a, b: torch.stack([a, b], 1), "transposed", lambda n: ((3, n), (3, n))),
    "mm": (torch.mm, "transposed", lambda n: ((3, n), (n, 5))),
    "linear": (F.linear, "transposed", lambda n: ((3, n), (5, n))),
    "kthvalue": (lambda a: torch.kthvalue(a, 2, 1).values, "transposed", lambda n: ((3, n),)),
}


@pytest.mark.parametrize(
    "name", [n if n in ("mean dim", "mm") else pytest.param(n, marks=pytest.mark.slow) for n in SYMBOLIC]
)
def test_input_gradients_at_symbolic_sizes_have_eagers_strides(name: str):
    program, layout, shapes = SYMBOLIC[name]
    jitted = thunder_rs.jit(program)
    torch.manual_seed(0)
    for n in (4, 6, 7):
        inputs = [LAYOUTS[layout](torch.randn(shape, dtype=torch.float64)) for shape in shapes(n)]
        expected = input_grads(program, inputs)
        for grad, eager in zip(input_grads(jitted, inputs), expected, strict=True):
            torch.testing.assert_close(grad, eager)
            assert grad.stride() == eager.stride(), f"size {n}: strides {grad.stride()}, eager's {eager.stride()}"
    assert thunder_rs.compile_stats(jitted).cache_misses == 2


#: Pooling to one element, which eager computes as a mean over the pooled dims.
GLOBAL_POOLS = {
    "adaptive_avg_pool2d channels_last": (
        lambda x: F.adaptive_avg_pool2d(x, 1),
        lambda: torch.randn(2, 6, 5, 4, dtype=torch.float64).contiguous(memory_format=torch.channels_last),
    ),
    "adaptive_avg_pool3d channels_last_3d": (
        lambda x: F.adaptive_avg_pool3d(x, (1, 1, 1)),
        lambda: torch.randn(2, 3, 4, 2, 3, dtype=torch.float64).contiguous(memory_format=torch.channels_last_3d),
    ),
    "adaptive_avg_pool1d transposed": (
        lambda x: F.adaptive_avg_pool1d(x, 1),
        lambda: torch.randn(5, 3, 2, dtype=torch.float64).permute(2, 1, 0),
    ),
}


@pytest.mark.parametrize("name", list(GLOBAL_POOLS))
def test_a_global_average_pool_has_eagers_gradient_strides(name: str):
    program, make = GLOBAL_POOLS[name]
    torch.manual_seed(0)
    x = make()
    (expected,) = input_grads(program, [x])
    (actual,) = input_grads(thunder_rs.jit(program), [x])
    torch.testing.assert_close(actual, expected)
    assert actual.stride() == expected.stride()


@pytest.mark.parametrize(("mode", "padding"), [("bilinear", "zeros"), ("nearest", "border")])
def test_grid_sample_of_a_permuted_grid_has_eagers_grid_gradient_strides(mode: str, padding: str):
    """Eager's grid_sampler_2d_backward writes the grid's gradient contiguous (the trace runs that
    kernel)."""
    torch.manual_seed(0)
    x = channels_last(torch.randn(2, 3, 5, 6, dtype=torch.float64))
    grid = torch.rand(2, 2, 7, 4, dtype=torch.float64).permute(0, 3, 2, 1) * 2 - 1
    program = lambda a, g: F.grid_sample(a, g, mode, padding, align_corners=False)  # noqa: E731
    expected = input_grads(program, [x, grid])
    actual = input_grads(thunder_rs.jit(program), [x, grid])
    for grad, eager in zip(actual, expected, strict=True):
        torch.testing.assert_close(grad, eager)
        assert grad.stride() == eager.stride()


@pytest.mark.parametrize("op", [torch.linalg.householder_product, torch.orgqr])
def test_a_householder_product_is_column_major_and_a_product_with_it_differentiates_as_eager(op):
    """LAPACK's orgqr writes Q column-major; mm_mat2_backward then computes ``base @ Q``'s gradient
    of Q as ``(g.t() @ base).t()`` (another GEMM than ``base.t() @ g``, which rounds otherwise on
    AVX-512: the orthogonal parametrization's gradient)."""

    def program(seen):
        def f(a, tau, base):
            q = op(a, tau)
            q.register_hook(lambda g: seen.append(g))
            return base @ q, q.stride()

        return f

    torch.manual_seed(0)
    a, tau = torch.randn(6, 4).tril(-1).requires_grad_(), torch.rand(4).requires_grad_()
    base, cotangent = torch.randn(6, 6), torch.randn(6, 4)
    eager_seen, seen = [], []
    runs = []
    for fn in (program(eager_seen), thunder_rs.jit(program(seen))):
        out, strides = fn(a, tau, base)
        runs.append((strides, torch.autograd.grad(out, (a, tau), cotangent)))
    (eager_strides, eager_grads), (strides, actual) = runs
    assert strides == eager_strides == (1, 6)
    assert seen[0].stride() == eager_seen[0].stride() and torch.equal(seen[0], eager_seen[0])
    for grad, eager in zip(actual, eager_grads, strict=True):
        assert torch.equal(grad, eager)
