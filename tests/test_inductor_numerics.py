"""Inductor regions compute what eager computes where eager's kernels read their operands in a
particular way: Python numbers meeting half-precision tensors (``executors.inductor_half``) and
gelu at +inf where eager runs oneDNN's kernel (``inductor_claims.gelu_as_eager``)."""

import math

import pytest
import torch

import thunder_rs

pytestmark = [pytest.mark.inductor, pytest.mark.usefixtures("one_thread")]


def _numbers(x, y):
    """Each of add, sub, mul and div of a half tensor by a Python number, on either side, alone and
    chained (a rewritten op's result meeting another number)."""
    return (
        x.exp() + 0.1,  # the CPU's add rounds 0.1 to x's dtype
        x.exp() - 0.3,
        0.7 - x.exp(),  # (a number first: rounded)
        x.exp() * 1.1,  # the CPU's mul and div read it in float32
        x.exp() / 1.3,
        x * 1.1 * 1.3,
        (x + 0.1) + 0.3,
        (x * 1.1 + 0.1) * 1.3 - 0.7,
        (x + 0.1) / 0.3,
        x * y + 257,  # (257 is 256 in bfloat16)
        2.5 * x + y,
        (x * y).sum() + 0.1,
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow)])
def test_a_python_number_meets_a_half_tensor_as_in_eager(dtype):
    """Was: ``x + 0.1`` read 0.1 in float32 (eager on the CPU rounds it to bfloat16 first: 0.10009765625),
    and an op on a rewritten op's result (``x * 1.1 * 1.3``) was not rewritten, read as Inductor
    reads it (1.3 rounded): differences of up to 0.06 in bfloat16. Bit-equal: the same float32
    operations, rounded where eager rounds."""
    torch.manual_seed(0)
    x, y = torch.randn(1000, dtype=dtype), torch.randn(1000, dtype=dtype)
    jfn = thunder_rs.jit(_numbers, executors=["inductor"])
    for i, (actual, expected) in enumerate(zip(jfn(x, y), _numbers(x, y))):
        assert actual.dtype == expected.dtype and torch.equal(actual, expected), (i, (actual - expected).abs().max())
    assert [r.name for r in thunder_rs.last_traces(jfn)[-1].regions()] == ["inductor_fusion0"]


def _gelu(x, y):
    return torch.nn.functional.gelu(x * y) * y


SPECIAL = [math.inf, -math.inf, math.nan, 0.0, -0.0, 1e30, -1e30, 3.0, -3.0, 10.0, -10.0, 1e-30]


def _assert_gelu_as_eager(actual, expected):
    """Eager's value wherever the input is special (+-inf, NaN, zeros, huge): NaN where eager's
    is; elsewhere within the dtype's tolerance (Inductor's erf is not oneDNN's)."""
    torch.testing.assert_close(actual, expected, equal_nan=True)
    assert torch.equal(actual.isnan(), expected.isnan())
    special = ~expected.isfinite() | (expected.abs() > 1e20) | (expected == 0)
    assert torch.equal(actual[special & ~expected.isnan()], expected[special & ~expected.isnan()])


def _gelu_of_transposed(x, y):
    return torch.nn.functional.gelu(x.t() * y) * y


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("program", [_gelu, _gelu_of_transposed])
def test_gelu_in_a_region_is_eagers_at_inf(dtype, program):
    """Where eager's gelu runs oneDNN's kernel (a contiguous float32 or bfloat16 tensor on a CPU
    with AVX-512), its value at +inf is NaN, where Inductor's kernel gives inf; of a transposed
    tensor eager's own kernel gives inf. The gelu compiles inside the region (it was left to the
    torch executor, splitting the region), with eager's value at +inf for the layout the graph
    gives its input; the gradient is Inductor's gelu_backward, within the dtype's rounding."""
    x = torch.tensor(SPECIAL * 3, dtype=dtype)
    x = x.reshape(1, -1) if program is _gelu_of_transposed else x
    y = torch.ones(x.shape[::-1] if program is _gelu_of_transposed else x.shape, dtype=dtype, requires_grad=True)
    ye = y.detach().clone().requires_grad_()
    jfn = thunder_rs.jit(program, executors=["inductor"])
    actual, expected = jfn(x, y), program(x, ye)
    _assert_gelu_as_eager(actual, expected)
    forward = thunder_rs.last_traces(jfn)[-1]
    assert [r.name for r in forward.regions()] == ["inductor_fusion0"] and "ltorch.gelu" in forward.regions()[
        0
    ].symbol_names
    torch.autograd.backward(actual, torch.ones_like(actual))
    torch.autograd.backward(expected, torch.ones_like(expected))
    torch.testing.assert_close(y.grad, ye.grad, equal_nan=True)
    assert thunder_rs.last_backward_traces(jfn)[-1].regions()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")
def test_gelu_in_a_region_follows_the_onednn_switch():
    """With ``torch.backends.mkldnn.enabled`` off eager's gelu of +inf is inf (aten's kernel): the
    region compiled with it on (NaN) is not reused; back on, the first is."""
    x, y = torch.tensor(SPECIAL * 3), torch.ones(len(SPECIAL) * 3)
    jfn = thunder_rs.jit(_gelu, executors=["inductor"])
    _assert_gelu_as_eager(jfn(x, y), _gelu(x, y))
    with torch.backends.mkldnn.flags(enabled=False):
        expected = _gelu(x, y)
        assert expected[0] == math.inf
        _assert_gelu_as_eager(jfn(x, y), expected)
    _assert_gelu_as_eager(jfn(x, y), _gelu(x, y))


def test_a_gelu_in_a_region_keeps_sizes_symbolic(monkeypatch):
    """The claim of gelu reads nothing of its input's sizes (its value at +inf is decided when the
    region's graph is traced, on its layout there). (Was: a checker asked for the input's layout,
    which failed on a symbolic shape, and the program compiled once per length from then on.)
    Regions run their eager functions here: claiming and the compile count are what is checked."""
    from thunder_rs.executors import inductor_ex

    monkeypatch.setattr(inductor_ex.InductorExecutor, "fuse", lambda self, region: region.function)
    jfn = thunder_rs.jit(_gelu, executors=["inductor"])
    for n in (8, 12, 16, 20):
        x, y = torch.randn(2, n), torch.randn(2, n)
        torch.testing.assert_close(jfn(x, y), _gelu(x, y), equal_nan=True, rtol=0, atol=0)
    assert thunder_rs.compile_stats(jfn).cache_misses == 2
    assert [r.symbol_names for r in thunder_rs.last_traces(jfn)[-1].regions()] == [
        ["ltorch.mul", "ltorch.gelu", "ltorch.mul"]
    ]


def _sizes(x):
    n = x.shape[0]
    return x.exp() + n, x.exp() - n * 3, n - x.exp(), x.exp() * n, x.exp() / n


@pytest.mark.slow
def test_a_symbolic_size_meets_a_half_tensor_as_in_eager():
    """A size the graph takes as an input is a number too: rounded to bfloat16 for add and sub on
    the CPU (301 is 300 there), read in float32 for mul and div; one compile for every length."""
    jfn = thunder_rs.jit(_sizes, executors=["inductor"])
    for n in (300, 301, 517, 1029):
        x = torch.randn(n, dtype=torch.bfloat16)
        for i, (actual, expected) in enumerate(zip(jfn(x), _sizes(x))):
            assert torch.equal(actual, expected), (n, i)
    assert thunder_rs.compile_stats(jfn).cache_misses == 2


def _with_alpha(x, y):
    return (
        torch.add(x * 2, y, alpha=0.3),
        torch.sub(x, y * 3, alpha=1.7),
        x.add(y[0], alpha=-2.5),
        torch.rsub(x, y * 2, alpha=0.7),
        x.add(0.1, alpha=0.3) * y,
    )


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_add_and_sub_with_alpha_in_a_region_are_one_fma_as_eager(dtype):
    """Eager's CPU kernel computes ``input + alpha * other`` of two float32/float64 tensors as
    ``fma(other, alpha, input)`` (rsub's ``b - alpha * a`` as ``fma(a, -alpha, b)``); Inductor's
    lowering multiplied, then added (1 ulp off in 1 of 5 elements). The region's graph calls
    ``prims.fma`` there. In half precision, and with a number ``other``, eager's kernel rounds by
    each element's place in its loop (``inductor_claims._alpha_as_eager``): those calls are the
    torch executor's. Before: bfloat16 and float16 up to 0.125 and 0.016 apart in 3-29% of the
    elements, rsub 1 ulp in a fifth of them in every dtype, the number ``other``'s a few ulps."""
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randn(3, 1000, generator=gen).to(dtype) for _ in range(2))
    jfn = thunder_rs.jit(_with_alpha, executors=["inductor"])
    for actual, expected in zip(jfn(x, y), _with_alpha(x, y), strict=True):
        assert torch.equal(actual, expected), (actual - expected).abs().max()
    assert [r.name for r in thunder_rs.last_traces(jfn)[-1].regions()] == ["inductor_fusion0"]


@pytest.mark.slow
def test_add_and_sub_with_alpha_of_a_one_element_other_in_a_region_are_eagers():
    """Eager's CPU kernel takes a one-element ``other`` (0-d or of shape ``(1,)``) as a number and
    rounds ``alpha * other`` once for its loop's last elements: an FMA there was 1 ulp off in one
    element of 3000. Those calls are the torch executor's (``inductor_claims._one_element``)."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(3, 1000, generator=gen), torch.randn(3, generator=gen)

    def f(x, y):
        return torch.add(x * 1, y[0], alpha=0.1), torch.sub(x * 1, y[1:2], alpha=0.7)

    for actual, expected in zip(thunder_rs.jit(f, executors=["inductor"])(x, y), f(x, y), strict=True):
        assert torch.equal(actual, expected), (actual - expected).abs().max()
