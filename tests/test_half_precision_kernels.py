"""Ops in bfloat16 and float16 and their gradients bit-equal to eager's on the CPU, where the torch
executor runs eager's kernels: a decomposition or grad rule computes in the dtype and order of
eager's kernel (float32 for most half-precision kernels, float16 itself for a few), over every
finite value below 64 in magnitude and a random cotangent."""

import pytest
import torch
import torch.nn.functional as F

import thunder_rs

HALF = [torch.bfloat16, torch.float16]

#: name -> a program of one tensor, each its op's forward and backward.
OPS = {
    "sigmoid": torch.sigmoid,
    "softshrink": lambda x: F.softshrink(x, 0.3),  # (lambd rounded to the dtype, as the kernel's)
    "hardshrink": lambda x: F.hardshrink(x, 0.3),
    "glu": lambda x: F.glu(x.reshape(-1, 4, 2), dim=1),
    "square": torch.square,
    "var": lambda x: x.reshape(-1, 8).var(-1),
    "var_all_uncorrected": lambda x: x.var(correction=0),
    "logsumexp": lambda x: x.reshape(-1, 8).logsumexp(-1),
}


def every_value(dtype) -> torch.Tensor:
    """Every finite ``dtype`` value below 64 in magnitude, shuffled, a multiple of 8 of them."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    x = bits[bits.isfinite() & (bits.abs() < 64)]
    x = x[: x.numel() // 8 * 8]
    return x[torch.randperm(x.numel(), generator=torch.Generator().manual_seed(0))]


def assert_bit_equal(actual, expected, what):
    assert actual.dtype == expected.dtype, what
    differ = ~((actual == expected) | (actual.isnan() & expected.isnan()))
    assert not differ.any(), f"{what}: {int(differ.sum())} of {differ.numel()} elements differ"


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", OPS)
def test_an_op_and_its_gradient_equal_eagers_bit_for_bit(name, dtype):
    fn, x = OPS[name], every_value(dtype)
    actual, expected = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, want = thunder_rs.jit(fn)(actual), fn(expected)
    assert_bit_equal(out, want, "output")
    g = torch.randn(want.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    out.backward(g)
    want.backward(g)
    assert_bit_equal(actual.grad, expected.grad, "gradient")


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_sigmoid_backwards_decomposition_rounds_as_the_cpu_kernel(dtype):
    """float16 op by op, bfloat16 in float32: what a fusion executor gets from the decomposition."""
    from test_kernels import decomposed  # noqa: PLC0415

    import thunder_rs.torch as ltorch  # noqa: PLC0415

    y, g = torch.sigmoid(every_value(dtype)), torch.randn(every_value(dtype).shape).to(dtype)
    with decomposed(ltorch.sigmoid_backward):
        jfn = thunder_rs.jit(ltorch.sigmoid_backward)
        out = jfn(g, y)
    assert "torch_sigmoid_backward" not in str(thunder_rs.last_traces(jfn)[-1])
    assert_bit_equal(out, torch.ops.aten.sigmoid_backward(g, y), "gradient")


#: key -> (table shape, index shape): the indexed dim has 20 rows.
KEYS = {
    "[index]": ((20, 3), (500,)),
    "[index_2d]": ((20, 3), (25, 20)),
    "[:, index]": ((4, 20), (49, 49)),
    "[:, :, index]": ((2, 3, 20, 5), (7, 9)),
    "[..., index]": ((3, 5, 20), (30,)),
}


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("key", KEYS)
def test_a_table_indexed_by_repeated_integers_gets_eagers_gradient(dtype, key):
    """``table[index]``, ``biases[:, index]``: eager's ``index_put(..., accumulate=True)`` adds
    repeated rows in its order."""
    torch.manual_seed(0)
    (shape, index_shape), lead = KEYS[key], key.count(":")

    def take(t, i):
        return t[..., i] if "..." in key else t[(slice(None),) * lead + (i,)]

    table, index = torch.randn(shape).to(dtype), torch.randint(0, 20, index_shape)
    actual, expected = table.clone().requires_grad_(), table.clone().requires_grad_()
    out, want = thunder_rs.jit(take)(actual, index), take(expected, index)
    g = torch.randn(want.shape).to(dtype)
    out.backward(g)
    want.backward(g)
    assert_bit_equal(actual.grad, expected.grad, "gradient")


#: name -> loss(input, target, reduction): eager's backward kernels round their norm (``1 / n``) to
#: the dtype (mse_loss) or compute in float32 with it unrounded (smooth_l1_loss).
LOSSES = {
    "mse": F.mse_loss,
    "smooth_l1": lambda x, t, reduction: F.smooth_l1_loss(x, t, reduction=reduction, beta=0.7),
}


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("name", LOSSES)
def test_a_regression_losss_gradients_equal_eagers_bit_for_bit(name, reduction, dtype):
    torch.manual_seed(0)
    x, target = torch.randn(3000).to(dtype), torch.randn(3000).to(dtype)
    actual, expected = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = thunder_rs.jit(lambda x, t: LOSSES[name](x, t, reduction=reduction))(actual, target)
    want = LOSSES[name](expected, target, reduction=reduction)
    assert_bit_equal(out, want, "loss")
    g = torch.randn(want.shape).to(dtype)
    out.backward(g)
    want.backward(g)
    assert_bit_equal(actual.grad, expected.grad, "gradient")


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("mask", ["bias_requiring_grad", "3d_bias", "causal_3d"])
def test_attention_on_eagers_math_path_gets_its_float32_gradients(dtype, mask):
    """A bias that requires grad (relative position biases) or a 3-D one sends eager's CPU attention
    to its math path, which computes half precision in float32; so do 3-D causal calls."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 8).to(dtype) for _ in range(3))
    bias = torch.randn(3, 16, 16).to(dtype)
    if mask == "causal_3d":
        q, k, v = (x.reshape(6, 16, 8) for x in (q, k, v))
    tensors = [q, k, v] + ([bias] if mask != "causal_3d" else [])

    def attention(q, k, v, bias=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=bias is None)

    actual = [t.clone().requires_grad_(i < 3 or mask == "bias_requiring_grad") for i, t in enumerate(tensors)]
    expected = [t.clone().requires_grad_(i < 3 or mask == "bias_requiring_grad") for i, t in enumerate(tensors)]
    out, want = thunder_rs.jit(attention)(*actual), attention(*expected)
    assert_bit_equal(out, want, "output")
    g = torch.randn(want.shape).to(dtype)
    out.backward(g)
    want.backward(g)
    for i, (a, e) in enumerate(zip(actual, expected)):
        if e.grad is not None:
            assert_bit_equal(a.grad, e.grad, f"gradient {i}")


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("eps", [None, 1e-5])
def test_rms_norm_and_its_gradients_equal_eagers_composite_bit_for_bit(dtype, eps):
    """Eager's CPU rms_norm is a composite in float32 (``x * rsqrt(mean(x²) + eps) * weight``,
    rounded back) that its autograd differentiates op by op."""
    torch.manual_seed(0)
    x, w = torch.randn(256, 100).to(dtype), torch.randn(100).to(dtype)
    actual = [x.clone().requires_grad_(), w.clone().requires_grad_()]
    expected = [x.clone().requires_grad_(), w.clone().requires_grad_()]
    out = thunder_rs.jit(lambda x, w: F.rms_norm(x, (100,), w, eps))(*actual)
    want = F.rms_norm(expected[0], (100,), expected[1], eps)
    assert_bit_equal(out, want, "output")
    g = torch.randn(want.shape).to(dtype)
    out.backward(g)
    want.backward(g)
    for name, a, e in zip(["input", "weight"], actual, expected):
        assert_bit_equal(a.grad, e.grad, f"gradient of the {name}")
