"""Inductor regions compute what eager computes where eager's kernels read their operands in a
particular way: Python numbers meeting half-precision tensors (``executors.inductor_half``) and
gelu at +inf where eager runs oneDNN's kernel (``inductor_claims``)."""

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


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gelu_at_inf_is_eagers(dtype):
    """Where eager's gelu runs oneDNN's kernel (contiguous float32 or bfloat16 on a CPU with
    AVX-512), its value at +inf is NaN; Inductor's kernel gave inf. Such a gelu stays with the
    torch executor (the rest of the program still compiles by Inductor); values and gradient are
    eager's, NaN where eager's are."""
    x = torch.tensor(SPECIAL * 3, dtype=dtype)
    y = torch.ones_like(x, requires_grad=True)
    ye = y.detach().clone().requires_grad_()
    jfn = thunder_rs.jit(_gelu, executors=["inductor"])
    actual, expected = jfn(x, y), _gelu(x, ye)
    torch.testing.assert_close(actual, expected, equal_nan=True, rtol=0, atol=0)
    torch.autograd.backward(actual, torch.ones_like(actual))
    torch.autograd.backward(expected, torch.ones_like(expected))
    # The backward region is Inductor's gelu_backward: eager's formula, within float32's rounding.
    torch.testing.assert_close(y.grad, ye.grad, equal_nan=True)
    assert thunder_rs.last_backward_traces(jfn)[-1].regions()


def test_a_gelu_left_to_eager_keeps_sizes_symbolic(monkeypatch):
    """The claim's decision on gelu is taken outside tracing, where a symbolic size is not compared:
    it reads dtype and device only. (Was: the checker asked for the input's layout, which failed on
    a symbolic shape, and the program compiled once per length from then on.) Regions run their
    eager functions here: claiming and the compile count are what is checked."""
    from thunder_rs.executors import inductor_ex

    monkeypatch.setattr(inductor_ex.InductorExecutor, "fuse", lambda self, region: region.function)
    jfn = thunder_rs.jit(_gelu, executors=["inductor"])
    for n in (8, 12, 16, 20):
        x, y = torch.randn(2, n), torch.randn(2, n)
        torch.testing.assert_close(jfn(x, y), _gelu(x, y), equal_nan=True, rtol=0, atol=0)
    assert thunder_rs.compile_stats(jfn).cache_misses == 2


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
