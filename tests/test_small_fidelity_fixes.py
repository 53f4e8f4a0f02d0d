"""Small differences from eager found one at a time, each checked against eager PyTorch."""

import pytest
import torch

import thunder_rs


@pytest.mark.parametrize("some", [True, False])
def test_svd_values_only_of_an_input_that_requires_grad_are_computed_with_the_vectors_as_eager(some):
    """Eager's torch.svd(compute_uv=False) takes its values from linalg.svdvals, which computes the
    singular vectors too where the input requires grad (LAPACK's values then differ in their last
    bits); the compiled forward ran the values-only kernel, so the values and gradients differed."""
    gen = torch.Generator().manual_seed(0)

    def fn(a):
        return torch.svd(a, some=some, compute_uv=False)

    for _ in range(3):
        a = torch.randn(2, 5, 4, generator=gen, requires_grad=True)
        expected, actual = fn(a), thunder_rs.jit(fn)(a)
        for e, c in zip(expected, actual):
            assert torch.equal(e, c) and e.stride() == c.stride() and e.requires_grad == c.requires_grad
        cotangent = torch.randn(expected[1].shape, generator=gen)
        (e,), (g,) = (torch.autograd.grad(out[1], a, cotangent) for out in (expected, actual))
        assert torch.equal(e, g)
        with torch.no_grad():  # (without grad: the values alone, as eager's)
            assert all(torch.equal(e, c) for e, c in zip(fn(a), thunder_rs.jit(fn)(a)))


def _mul_(x):
    x.mul_(2j)
    return x


def _add_(x):
    x.add_(1j)
    return x


def _div_(x):
    x.div_(1 + 1j)
    return x


def _imul(x):
    x *= 2j
    return x


def _view_sub_(x):
    x[1:].sub_(1j)
    return x


IN_PLACE_COMPLEX_NUMBER = [_mul_, _add_, _div_, _imul, _view_sub_]


@pytest.mark.parametrize("fn", IN_PLACE_COMPLEX_NUMBER, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_in_place_ops_with_a_complex_number_on_a_complex_tensor_match_eager(fn, dtype):
    """x.mul_(2j) raised (prims.mul took the complex number for an unsupported operand); eager
    computes it: the in-place op now runs eager's op, as the out-of-place x * 2j does."""
    x = torch.randn(5, dtype=dtype, generator=torch.Generator().manual_seed(0))
    expected, actual = fn(x.clone()), thunder_rs.jit(fn)(x.clone())
    assert actual.dtype == expected.dtype and torch.equal(actual, expected)


@pytest.mark.parametrize("fn", [lambda x: x * 2j, lambda x: x + 1j, lambda x: x / (1 + 1j)])
def test_out_of_place_ops_with_a_complex_number_promote_a_real_tensor_as_eager(fn):
    x = torch.randn(5, generator=torch.Generator().manual_seed(0))
    expected, actual = fn(x), thunder_rs.jit(fn)(x)
    assert actual.dtype == expected.dtype == torch.complex64 and torch.equal(actual, expected)


@pytest.mark.parametrize("fn", IN_PLACE_COMPLEX_NUMBER, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64])
def test_in_place_ops_with_a_complex_number_on_a_real_tensor_raise_as_eager(fn, dtype):
    """Eager raises: the complex result cannot be cast into the real tensor. The compiled call
    raised another error (prims.mul ... PyConst); it now raises eager's, naming the user's line."""
    x = torch.ones(5, dtype=dtype)
    with pytest.raises(RuntimeError) as eager:
        fn(x.clone())
    message = str(eager.value)
    with pytest.raises(RuntimeError, match=message.replace("(", r"\(").replace(")", r"\)")) as compiled:
        thunder_rs.jit(fn)(x.clone())
    assert "test_small_fidelity_fixes.py" in str(compiled.value)


@pytest.mark.filterwarnings("ignore:.*nuclear_norm is deprecated")
@pytest.mark.parametrize(
    "fn",
    [lambda a: torch.nuclear_norm(a), lambda a: torch.nuclear_norm(a, True), lambda a: torch.nuclear_norm(a, (1, 0))],
    ids=["plain", "keepdim", "dim"],
)
def test_nuclear_norm_of_an_input_that_requires_grad_is_computed_with_the_vectors_as_eager(fn):
    """torch.nuclear_norm ran whole inside the no-grad forward, so its singular values came from the
    values-only kernel; eager's (linalg.matrix_norm 'nuc') computes them with the vectors there."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        a = torch.randn(5, 5, generator=gen, requires_grad=True)
        expected, actual = fn(a), thunder_rs.jit(fn)(a)
        assert expected.shape == actual.shape and torch.equal(expected, actual)
        cotangent = torch.randn(expected.shape, generator=gen)
        (e,), (g,) = (torch.autograd.grad(out, a, cotangent) for out in (expected, actual))
        assert torch.equal(e, g)
        with torch.no_grad():
            assert torch.equal(fn(a), thunder_rs.jit(fn)(a))


@pytest.mark.filterwarnings("ignore:.*nuclear_norm is deprecated")
@pytest.mark.parametrize(
    "fn",
    [
        torch.linalg.svdvals,
        lambda a: torch.linalg.eigvalsh(a + a.mH),
        lambda a: torch.svd(a, compute_uv=False)[1],
        lambda a: torch.linalg.matrix_norm(a, "nuc"),
        torch.nuclear_norm,
        torch.linalg.cond,
    ],
    ids=["svdvals", "eigvalsh", "svd_values", "matrix_norm_nuc", "nuclear_norm", "cond"],
)
def test_complex_values_of_an_input_that_requires_grad_are_computed_with_the_vectors_as_eager(fn):
    """A call that differentiates complex values runs eager's op (a fallback), but the compiled
    forward ran it without grad, so the values-only kernel; it now runs with grad as eager's."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        a = torch.randn(5, 5, dtype=torch.complex64, generator=gen, requires_grad=True)
        expected, actual = fn(a), thunder_rs.jit(fn)(a)
        assert torch.equal(expected, actual)
        cotangent = torch.randn(expected.shape, dtype=expected.dtype, generator=gen)
        (e,), (g,) = (torch.autograd.grad(out, a, cotangent) for out in (expected, actual))
        assert torch.equal(e, g)


def test_a_linear_bias_gradient_sums_the_rows_as_eager_s_addmm_does():
    # Eager's linear of a contiguous 3-D input is addmm of its rows: the bias's gradient sums the
    # gradient reshaped to rows, a contiguous copy where an attention's key gradient arrives
    # transposed. The trace summed the strided gradient over its batch dims, in another order: the
    # key bias's gradient (zero up to rounding) differed in every sample, and BERT's training drifted.
    torch.manual_seed(0)
    lin_q, lin_k = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)

    def attention(x):
        b, t, _ = x.shape
        q = lin_q(x).view(b, t, 4, 8).transpose(1, 2)
        k = lin_k(x).view(b, t, 4, 8).transpose(1, 2)
        return torch.softmax(q @ k.transpose(-1, -2), -1).sum((0, 1))

    jfn = thunder_rs.jit(attention)
    for seed in range(3):
        x = torch.randn(3, 10, 32, generator=torch.Generator().manual_seed(seed))
        g = torch.randn(10, 10, generator=torch.Generator().manual_seed(seed + 10))
        expected = torch.autograd.grad(attention(x), [lin_k.bias, lin_k.weight, lin_q.bias], g)
        got = torch.autograd.grad(jfn(x), [lin_k.bias, lin_k.weight, lin_q.bias], g)
        for a, e in zip(got, expected):
            torch.testing.assert_close(a, e, rtol=0, atol=0)
