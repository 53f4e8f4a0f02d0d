"""Half precision to the bit: where the torch executor runs eager's own kernels on the CPU, a
compiled program in bfloat16 or float16 gives eager's outputs and gradients exactly, as it does in
float32. Each op-level case here was a rounding apart before its fix (the rule or decomposition
computed in another dtype or order than eager's kernel or autograd formula); the model-level
sweep over the Hugging Face families is ``test_half_precision_families``.
"""

import pytest
import torch
import torch.nn.functional as F

import thunder_rs

HALF = [torch.bfloat16, torch.float16]

pytestmark = pytest.mark.usefixtures("one_thread")


def _grads_of(fn, inputs, seed: int = 5):
    """``fn(*inputs)`` and the gradients of its inputs that require grad, for a fixed cotangent,
    with the RNG seeded before the call (dropout draws alike)."""
    torch.manual_seed(seed)
    out = fn(*inputs)
    leaves = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype)
    return (out, *torch.autograd.grad(out, leaves, cotangent))


def assert_equal_to_eager(fn, inputs) -> None:
    expected = _grads_of(fn, inputs)
    actual = _grads_of(thunder_rs.jit(fn), inputs)
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a.dtype == e.dtype and a.shape == e.shape, i
        assert torch.equal(a, e), f"#{i}: max difference {(a.double() - e.double()).abs().max().item()}"


def _qkv(dtype, heads=(3, 3), size=12):
    torch.manual_seed(0)
    q = torch.randn(2, heads[0], 8, size).to(dtype).requires_grad_()
    k, v = (torch.randn(2, heads[1], 8, size).to(dtype).requires_grad_() for _ in range(2))
    return q, k, v


ATTENTION_MASKS = {
    "none": lambda dtype: None,
    "causal": lambda dtype: "causal",
    "bool": lambda dtype: torch.rand(8, 8, generator=torch.Generator().manual_seed(2)) > 0.3,
    "float requiring grad": lambda dtype: torch.randn(2, 1, 8, 8).to(dtype).requires_grad_(),
}


@pytest.mark.parametrize("mask", list(ATTENTION_MASKS))
@pytest.mark.parametrize("dtype", [torch.float32, *HALF], ids=str)
def test_attention_with_dropout_is_eagers_math_path(dtype, mask):
    """Eager's CPU kernels take no dropout: its math path runs (half precision upcast to float32,
    query and key each scaled by sqrt(scale), dropout drawn in float32, the product rounded back)
    and autograd differentiates it op by op. The decomposition scored in the input's dtype and
    scaled after the product (float32 too, at a head size whose scale is no power of 4)."""
    attn_mask = ATTENTION_MASKS[mask](dtype)
    causal = attn_mask == "causal"
    attn_mask = None if causal else attn_mask

    def attention(q, k, v, attn_mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p=0.3, is_causal=causal)

    assert_equal_to_eager(attention, (*_qkv(dtype), attn_mask))


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_grouped_attention_with_dropout_is_eagers_math_path(dtype):
    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True, enable_gqa=True)

    assert_equal_to_eager(attention, _qkv(dtype, heads=(4, 2)))


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_a_mask_requiring_grad_takes_the_math_path_in_float32(dtype):
    """Without dropout, a mask that requires grad sends eager's CPU attention to its math path,
    which computes half precision in float32: the rule's gradients did it in the input's dtype."""

    def attention(q, k, v, attn_mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask)

    assert_equal_to_eager(attention, (*_qkv(dtype), ATTENTION_MASKS["float requiring grad"](dtype)))


def test_half_precision_reduction_in_the_math_path_follows_its_switch():
    """``allow_fp16_bf16_reduction_math_sdp(True)`` makes eager's math path compute in the inputs'
    dtype: the switch is read where it matters and guarded, so flipping it compiles again."""

    def attention(q, k, v, attn_mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p=0.3)

    inputs = (*_qkv(torch.bfloat16), ATTENTION_MASKS["float requiring grad"](torch.bfloat16))
    jitted = thunder_rs.jit(attention)
    allowed = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    try:
        for allow in (True, False):
            torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(allow)
            expected, actual = _grads_of(attention, inputs), _grads_of(jitted, inputs)
            for a, e in zip(actual, expected):
                assert torch.equal(a, e)
    finally:
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(allowed)
    stats = thunder_rs.compile_stats(jitted)
    assert stats.cache_misses == 2 and "math_fp16_bf16_reduction True -> False" in str(stats.miss_reasons)


@pytest.mark.parametrize("dtype", [torch.float32, *HALF], ids=str)
def test_one_key_head_shared_by_every_query_head_takes_the_flash_kernel(dtype):
    """Falcon's multi-query attention: a key and value of one head, broadcast over the query's
    heads without ``enable_gqa``, which eager's CPU flash kernel takes (as grouped heads); the
    rule differentiated the math path instead."""

    def attention(q, k, v, attn_mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask)

    mask = ATTENTION_MASKS["bool"](dtype).expand(2, 1, 8, 8)
    assert_equal_to_eager(attention, (*_qkv(dtype, heads=(4, 1)), mask))


@pytest.mark.parametrize("dtype", [torch.float32, *HALF], ids=str)
def test_baddbmm_scales_its_products_gradients_after_the_product(dtype):
    """Eager's baddbmm backward is ``grad.bmm(batch2^T) * alpha`` (Bloom's attention scores);
    the decomposition's VJP scaled the cotangent first."""

    def scores(bias, batch1, batch2):
        return torch.baddbmm(bias, batch1, batch2, beta=0.7, alpha=0.3)

    torch.manual_seed(0)
    bias = torch.randn(1, 8, 8).to(dtype).requires_grad_()
    batch1, batch2 = torch.randn(4, 8, 6).to(dtype).requires_grad_(), torch.randn(4, 6, 8).to(dtype).requires_grad_()
    assert_equal_to_eager(scores, (bias, batch1, batch2))


@pytest.mark.parametrize("dtype", [torch.float32, *HALF], ids=str)
def test_square_has_pows_gradient(dtype):
    """Eager's square is ``pow(x, 2)``, whose gradient is ``g * (2 * x)``; the product's VJP added
    ``g * x`` twice (a squareplus, as the time-series transformers map their scales)."""

    def squareplus(x):
        return (x + torch.sqrt(torch.square(x) + 4.0)) / 2.0

    torch.manual_seed(0)
    assert_equal_to_eager(squareplus, (torch.randn(4, 16).to(dtype).requires_grad_(),))


LOOKUPS = {
    "columns (LeViT's attention biases)": (lambda w: w[:, LOOKUP], (3, 4)),
    "rows (Swin's relative position bias)": (lambda w: w[LOOKUP.view(-1)], (4, 3)),
    "two adjacent dims": (lambda w: w[:, LOOKUP, LOOKUP], (2, 4, 4, 3)),
    "negative indices": (lambda w: w[..., LOOKUP - 4], (2, 4)),
}
LOOKUP = torch.tensor([[0, 1, 2, 3], [1, 0, 1, 2], [2, 1, 0, 1], [3, 2, 1, 0]])


@pytest.mark.parametrize("lookup", list(LOOKUPS))
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_advanced_indexing_accumulates_as_eagers_index_put(dtype, lookup):
    """A table looked up at repeated indices: eager's gradient is ``index_put_(accumulate=True)``,
    which adds in the table's dtype one value after another; the take's ``index_add`` summed in
    float32 and rounded once (LeViT's biases in bfloat16 were 16 apart at 2496)."""
    fn, shape = LOOKUPS[lookup]
    torch.manual_seed(0)
    table = (torch.randn(shape) * 300).to(dtype).requires_grad_()
    assert_equal_to_eager(fn, (table,))


CPU_SCALARS = {
    "mul": lambda x, s: x * s,
    "div": lambda x, s: x / s,
    "in-place div": lambda x, s: (x * 1).div_(s),
    "torch.div": lambda x, s: torch.div(x, s),
}


@pytest.mark.parametrize("op", list(CPU_SCALARS))
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_a_0d_float32_tensor_scales_at_its_own_value(dtype, op):
    """``x / torch.tensor(d).sqrt()`` (DeBERTa's scale): type promotion leaves the 0-d float32
    tensor out, but eager's CPU mul and div kernels take its float32 value and round once; the
    decomposition rounded it to the half-precision dtype first (forward and gradient apart)."""
    scale = torch.sqrt(torch.tensor(16, dtype=torch.float) * 3)
    torch.manual_seed(0)
    x = torch.randn(64).to(dtype).requires_grad_()
    assert_equal_to_eager(lambda x: CPU_SCALARS[op](x, scale), (x,))


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_sigmoids_gradient_is_eagers_kernel(dtype):
    """CLIP's quick GELU, ``x * sigmoid(1.702 * x)``: eager's CPU ``sigmoid_backward`` computes
    float16 op by op in float16 (bfloat16 in float32); the rule computed both in float32."""

    def quick_gelu(x):
        return x * torch.sigmoid(1.702 * x)

    torch.manual_seed(0)
    assert_equal_to_eager(quick_gelu, ((torch.randn(4, 64) * 3).to(dtype).requires_grad_(),))


# -- ops eager writes in Python, under autocast ----------------------------------------------------

LRN_SHAPES = {"1-d": (2, 6, 7), "2-d": (2, 6, 5, 4), "3-d": (2, 5, 3, 4, 2)}


@pytest.mark.parametrize("shape", list(LRN_SHAPES))
@pytest.mark.parametrize("low", HALF, ids=str)
def test_local_response_norm_under_cpu_autocast_is_eagers(low, shape):
    """``F.local_response_norm`` is Python in eager, so CPU autocast casts the ops it calls:
    avg_pool3d (2-d and 3-d images) to float32, and the result is float32. The symbol's
    decomposition ran unautocast: avg_pool3d of the linear's lower-precision output, which has no
    CPU kernel in bfloat16 or float16 (refused at run time)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(LRN_SHAPES[shape][-1], 8), torch.nn.LocalResponseNorm(3))
    x = torch.randn(LRN_SHAPES[shape]).requires_grad_()

    def fn(x):
        with torch.autocast("cpu", dtype=low):
            return model(x)

    jmodel = thunder_rs.jit(model)

    def jfn(x):
        with torch.autocast("cpu", dtype=low):
            return jmodel(x)

    expected = _grads_of(lambda x, *params: fn(x).float(), (x, *model.parameters()))
    actual = _grads_of(lambda x, *params: jfn(x).float(), (x, *model.parameters()))
    assert fn(x).dtype == jfn(x).dtype
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert a.dtype == e.dtype and torch.equal(a, e), i


@pytest.mark.parametrize("shape", list(LRN_SHAPES))
def test_local_response_norm_under_cuda_autocast_has_eagers_dtype(shape):
    """CUDA autocast casts ``pow`` to float32, so eager's local response norm of a float16
    tensor is float32; the decomposition gave float16. (Fake CUDA tensors: dtypes only.)"""
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415

    mode = FakeTensorMode()
    with mode:
        x = torch.empty(LRN_SHAPES[shape], device="cuda", dtype=torch.float16)
    jfn = thunder_rs.jit(lambda x: F.local_response_norm(x, 3))
    was, previous = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)  # torch.autocast("cuda") stays off without a GPU
    torch.set_autocast_dtype("cuda", torch.float16)
    try:
        with mode:
            dtypes = F.local_response_norm(x, 3).dtype, jfn(x).dtype
    finally:
        torch.set_autocast_enabled("cuda", was)
        torch.set_autocast_dtype("cuda", previous)
    assert dtypes == (torch.float32, torch.float32)
