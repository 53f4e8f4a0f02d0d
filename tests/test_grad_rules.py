"""The grad rules of the nn, linalg and shape composites (``register_grad`` beside each op in its
ltorch family file).

For each case of a table: the gradients match eager autograd in float64 and float32, the backward
is the rule's (its ltorch calls, no prims beyond the few the split recomputes, none of the
forward's reductions), and bfloat16 gradients come back in eager's dtypes and close to its values.
Then the cases the rules leave to the decomposition, and the ones eager treats specially.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import torch.nn.functional as F

import thunder_rs

#: float32 gradients against eager's: the rules round after each op and sum (at most 8 terms) in
#: another order than eager's fused kernels, so they differ by a few units in the last place
#: (at most 1e-6 measured, on gradients of magnitude up to 7).
FLOAT32 = dict(rtol=1e-5, atol=2e-6)
FLOAT64 = dict(rtol=1e-10, atol=1e-10)


def randn(*shape, dtype, grad=True):
    return torch.randn(shape, dtype=dtype).requires_grad_(grad)


def transposed(rows, cols, *, dtype):
    """A non-contiguous (rows, cols) leaf."""
    return torch.randn(cols, rows, dtype=dtype).t().requires_grad_()


def targets(*shape, classes=5, ignored=-100):
    t = torch.randint(0, classes, shape)
    if t.numel():
        t.view(-1)[0] = ignored
    return t


def at_bounds(*bounds, dtype):
    """A (3, 4) leaf with entries exactly at each of ``bounds``, where the gradient is a convention."""
    x = torch.randn(3, 4, dtype=dtype)
    for i, b in enumerate(bounds):
        x[i, :2] = b
    return x.requires_grad_()


@dataclass
class Case:
    id: str
    fn: Callable
    inputs: Callable[[torch.dtype], tuple]
    #: ltorch symbols the rule's backward calls.
    calls: tuple[str, ...]
    #: prims the split may recompute at the top level of the backward (all others are an error).
    prims: tuple[str, ...] = ()
    #: names that must not be called anywhere in the executed backward.
    absent: tuple[str, ...] = ()


SOFTMAX_CALLS = ("ltorch.softmax_backward",)
LOG_SOFTMAX_CALLS = ("ltorch.log_softmax_backward",)
LAYER_NORM_CALLS = ("ltorch.native_layer_norm_backward",)
#: rms_norm on the CPU is eager's composite, differentiated op by op as eager's autograd does
#: (mean's backward divides, the products' and pow's VJPs multiply, the broadcasts sum back).
NORM_PRIMS = ("prims.broadcast_in_dim", "prims.add", "prims.mul", "prims.pow", "prims.reshape", "prims.sum")
LOSS_CALLS = ("ltorch.nll_loss_backward",)
CROSS_ENTROPY_CALLS = ("ltorch.nll_loss_backward", "ltorch.log_softmax_backward")
#: Label smoothing's extra term is differentiated prim by prim.
SMOOTHING_PRIMS = (
    "prims.where",
    "prims.neg",
    "prims.mul",
    "prims.broadcast_in_dim",
    "prims.div",
    "prims.eq",
    "prims.reshape",
    "prims.add",
    "prims.sum",
    "prims.convert_element_type",
)
FLASH_CALLS = ("ltorch.sdpa_flash_backward",)


def sdpa(**kwargs):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs)


CASES = [
    Case(
        "softmax", lambda x: F.softmax(x, -1), lambda d: (randn(3, 4, dtype=d),), SOFTMAX_CALLS, absent=("amax", "exp")
    ),
    Case("softmax_noncontiguous", lambda x: F.softmax(x, 0), lambda d: (transposed(3, 4, dtype=d),), SOFTMAX_CALLS),
    Case("softmax_implicit_dim", lambda x: F.softmax(x), lambda d: (randn(2, 3, 4, dtype=d),), SOFTMAX_CALLS),
    Case("tensor_softmax", lambda x: x.softmax(1), lambda d: (randn(2, 3, 4, dtype=d),), SOFTMAX_CALLS),
    Case(
        "softmax_dtype", lambda x: torch.softmax(x, -1, torch.float64), lambda d: (randn(3, 4, dtype=d),), SOFTMAX_CALLS
    ),
    Case(
        "log_softmax",
        lambda x: F.log_softmax(x, -1),
        lambda d: (randn(3, 4, dtype=d),),
        LOG_SOFTMAX_CALLS,
        absent=("amax", "log"),
    ),
    Case(
        "tensor_log_softmax",
        lambda x: torch.log_softmax(x, 0),
        lambda d: (transposed(4, 3, dtype=d),),
        LOG_SOFTMAX_CALLS,
    ),
    Case(
        "layer_norm",
        lambda x, w, b: F.layer_norm(x, (3, 4), w, b),
        lambda d: (randn(2, 3, 4, dtype=d), randn(3, 4, dtype=d), randn(3, 4, dtype=d)),
        LAYER_NORM_CALLS,
        absent=("var_mean",),
    ),
    Case(
        "layer_norm_plain",
        lambda x: F.layer_norm(x, (4,)),
        lambda d: (transposed(3, 4, dtype=d),),
        LAYER_NORM_CALLS,
        absent=("var_mean",),
    ),
    Case(
        "layer_norm_weight",
        lambda x, w: F.layer_norm(x, (4,), w, eps=1e-2),
        lambda d: (randn(5, 4, dtype=d), randn(4, dtype=d)),
        LAYER_NORM_CALLS,
        absent=("var_mean",),
    ),
    Case(
        "rms_norm",
        lambda x, w: F.rms_norm(x, (4,), w),
        lambda d: (randn(2, 3, 4, dtype=d), randn(4, dtype=d)),
        ("ltorch.true_divide",),
        NORM_PRIMS,
    ),
    Case(
        "rms_norm_plain",
        lambda x: F.rms_norm(x, (3, 4), eps=1e-3),
        lambda d: (randn(2, 3, 4, dtype=d),),
        ("ltorch.true_divide",),
        NORM_PRIMS,
    ),
    Case("nll_loss", lambda x, t: F.nll_loss(x, t), lambda d: (randn(4, 5, dtype=d), targets(4)), LOSS_CALLS),
    Case(
        "nll_loss_weight_sum",
        lambda x, t, w: F.nll_loss(x, t, w, reduction="sum"),
        lambda d: (randn(4, 5, dtype=d), targets(4), torch.rand(5, dtype=d) + 0.1),
        LOSS_CALLS,
    ),
    Case(
        "nll_loss_extra_dims",
        lambda x, t, w: F.nll_loss(x, t, w, ignore_index=2, reduction="none"),
        lambda d: (randn(2, 5, 3, dtype=d), targets(2, 3, ignored=2), torch.rand(5, dtype=d) + 0.1),
        LOSS_CALLS,
    ),
    Case(
        "nll_loss_byte_targets",
        lambda x, t: F.nll_loss(x, t.to(torch.uint8), ignore_index=1, reduction="sum"),
        lambda d: (randn(4, 5, dtype=d), targets(4, ignored=1)),
        LOSS_CALLS,
    ),
    Case(
        "nll_loss_unbatched", lambda x, t: F.nll_loss(x, t), lambda d: (randn(5, dtype=d), torch.tensor(3)), LOSS_CALLS
    ),
    Case(
        "cross_entropy",
        lambda x, t: F.cross_entropy(x, t),
        lambda d: (randn(4, 5, dtype=d), targets(4)),
        CROSS_ENTROPY_CALLS,
        absent=("log", "log_softmax"),
    ),
    Case(
        "cross_entropy_weight",
        lambda x, t, w: F.cross_entropy(x, t, w),
        lambda d: (transposed(4, 5, dtype=d), targets(4), torch.rand(5, dtype=d) + 0.1),
        CROSS_ENTROPY_CALLS,
    ),
    Case(
        "cross_entropy_extra_dims",
        lambda x, t: F.cross_entropy(x, t, ignore_index=1, reduction="sum"),
        lambda d: (randn(2, 5, 3, dtype=d), targets(2, 3, ignored=1)),
        CROSS_ENTROPY_CALLS,
    ),
    Case(
        "cross_entropy_smoothing",
        lambda x, t: F.cross_entropy(x, t, label_smoothing=0.2),
        lambda d: (randn(4, 5, dtype=d), targets(4)),
        CROSS_ENTROPY_CALLS,
        SMOOTHING_PRIMS,
    ),
    Case(
        "cross_entropy_smoothing_weight",
        lambda x, t, w: F.cross_entropy(x, t, w, label_smoothing=0.1, reduction="none"),
        lambda d: (randn(2, 5, 3, dtype=d), targets(2, 3), torch.rand(5, dtype=d) + 0.1),
        CROSS_ENTROPY_CALLS,
        SMOOTHING_PRIMS,
    ),
    Case(
        "cross_entropy_smoothing_weight_mean",
        lambda x, t, w: F.cross_entropy(x, t, w, ignore_index=2, label_smoothing=0.3),
        lambda d: (randn(5, dtype=d), torch.tensor(1), torch.rand(5, dtype=d) + 0.1),
        CROSS_ENTROPY_CALLS,
        SMOOTHING_PRIMS,
    ),
    Case(
        "sdpa",
        sdpa(),
        lambda d: (randn(2, 2, 3, 8, dtype=d), randn(2, 2, 5, 8, dtype=d), randn(2, 2, 5, 6, dtype=d)),
        # (eager's math path: its probabilities are kept from the forward, as eager's autograd keeps
        # them; each product's gradients the bmm calls of eager's matmul backward)
        ("ltorch.bmm", "ltorch.softmax_backward"),
        absent=("safe_softmax", "exp"),
    ),
    Case(
        "sdpa_causal_scale",
        sdpa(is_causal=True, scale=0.3),
        lambda d: (randn(2, 3, 8, dtype=d), randn(2, 5, 8, dtype=d), randn(2, 5, 6, dtype=d)),
        ("ltorch.bmm", "ltorch.softmax_backward"),
        absent=("safe_softmax", "tril"),
    ),
    Case(
        "sdpa_3d_flash",  # (eager's CPU flash kernels, on the inputs unsqueezed to 4-D)
        sdpa(is_causal=True, scale=0.3),
        lambda d: (randn(2, 3, 8, dtype=d), randn(2, 5, 8, dtype=d), randn(2, 5, 8, dtype=d)),
        FLASH_CALLS,
        absent=("softmax", "exp"),
    ),
    Case(
        "sdpa_bool_mask",
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        lambda d: (
            randn(2, 2, 3, 8, dtype=d),
            randn(2, 2, 5, 8, dtype=d),
            randn(2, 2, 5, 8, dtype=d),
            torch.tensor([[True, False, True, False, True], [False] * 5, [True] * 5]),
        ),
        FLASH_CALLS,  # (eager's CPU flash kernels take a mask; a row that sees no key gets zeros)
        absent=("softmax", "exp"),
    ),
    Case(
        "sdpa_float_mask",
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        lambda d: (
            randn(2, 2, 3, 8, dtype=d),
            randn(2, 2, 5, 8, dtype=d),
            randn(2, 2, 5, 8, dtype=d),
            randn(2, 1, 3, 5, dtype=d),
        ),
        ("ltorch.bmm", "ltorch.softmax_backward", "ltorch.sum"),
        absent=("safe_softmax", "exp"),
    ),
    Case(
        "sdpa_gqa_broadcast",
        sdpa(enable_gqa=True),
        lambda d: (randn(2, 4, 3, 8, dtype=d), randn(1, 2, 5, 8, dtype=d), randn(1, 2, 5, 8, dtype=d)),
        ("ltorch.bmm", "ltorch.expand", "ltorch.sum"),
    ),
    Case(
        "sdpa_noncontiguous",
        sdpa(),
        lambda d: (randn(2, 3, 2, 8, dtype=d).transpose(1, 2), randn(2, 2, 5, 8, dtype=d), randn(2, 2, 5, 8, dtype=d)),
        FLASH_CALLS,
        absent=("softmax", "exp"),
    ),
    Case(
        "sdpa_flash_causal",
        sdpa(is_causal=True),
        lambda d: (
            randn(2, 2, 5, 8, dtype=d),
            randn(2, 2, 3, 8, dtype=d),
            # (a broadcast value; a transposed one eager's math path takes: its last dim is not dense)
            randn(3, 8, dtype=d).expand(2, 2, 3, 8),
        ),
        FLASH_CALLS,
        absent=("softmax", "tril"),
    ),
    Case("relu", F.relu, lambda d: (at_bounds(0.0, dtype=d),), ("ltorch.threshold_backward",), absent=("where",)),
    Case(
        "threshold",
        lambda x: F.threshold(x, 0.5, -2.0),
        lambda d: (at_bounds(0.5, dtype=d),),
        ("ltorch.threshold_backward",),
        absent=("where",),
    ),
    Case(
        "leaky_relu",
        lambda x: F.leaky_relu(x, 0.2),
        lambda d: (at_bounds(0.0, dtype=d),),
        ("ltorch.leaky_relu_backward",),
        absent=("where",),
    ),
    Case(
        "hardtanh",
        lambda x: F.hardtanh(x, -0.5, 0.5),
        lambda d: (at_bounds(-0.5, 0.5, dtype=d),),
        ("ltorch.hardtanh_backward",),
        absent=("where",),
    ),
    Case("relu6", F.relu6, lambda d: (at_bounds(0.0, 6.0, dtype=d),), ("ltorch.hardtanh_backward",), absent=("where",)),
    Case(
        "linear",
        F.linear,
        lambda d: (randn(2, 3, 4, dtype=d), randn(5, 4, dtype=d), randn(5, dtype=d)),
        ("ltorch.matmul", "ltorch.sum"),
    ),
    Case("linear_vector_input", F.linear, lambda d: (randn(4, dtype=d), transposed(5, 4, dtype=d)), ("ltorch.matmul",)),
    Case(
        "linear_vector_weight",
        F.linear,
        lambda d: (randn(3, 4, dtype=d), randn(4, dtype=d)),
        ("ltorch.mul", "ltorch.sum"),
    ),
    Case(
        "linear_broadcast_bias",
        F.linear,
        lambda d: (randn(3, 4, dtype=d), randn(5, 4, dtype=d), randn(1, dtype=d)),
        ("ltorch.matmul", "ltorch.sum"),
    ),
    Case(
        "matmul_weight",
        lambda a, b: a @ b,
        lambda d: (randn(2, 3, 4, dtype=d), transposed(4, 5, dtype=d)),
        ("ltorch.matmul", "ltorch.t"),
    ),
    Case(
        "embedding",
        F.embedding,
        lambda d: (torch.randint(0, 6, (2, 3)), randn(6, 3, dtype=d)),
        ("ltorch.embedding_backward",),
    ),
    Case(
        "embedding_padding",
        lambda i, w: F.embedding(i, w, padding_idx=-2),
        lambda d: (torch.tensor([[4, 1, 4], [0, 1, 1]], dtype=torch.int32), randn(6, 3, dtype=d)),
        ("ltorch.embedding_backward",),
    ),
    Case(
        "embedding_scale_grad_by_freq",
        lambda i, w: F.embedding(i, w, padding_idx=0, scale_grad_by_freq=True),
        lambda d: (torch.tensor([0, 2, 2, 5, 2, 0]), randn(6, 3, dtype=d)),
        ("ltorch.embedding_backward",),
    ),
    Case("gelu", F.gelu, lambda d: (transposed(3, 4, dtype=d),), ("ltorch.gelu_backward",), absent=("erf",)),
    Case(
        "gelu_tanh",
        lambda x: F.gelu(x, approximate="tanh"),
        lambda d: (randn(2, 3, 4, dtype=d),),
        ("ltorch.gelu_backward",),
        absent=("tanh",),
    ),
]


def leaves(inputs: tuple) -> list[torch.Tensor]:
    return [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]


def gradients(fn, inputs: tuple, seed: int = 1):
    """The output and the gradients of ``fn`` for a fixed random cotangent."""
    out = fn(*inputs)
    torch.manual_seed(seed)
    cotangent = torch.randn(out.shape, dtype=out.dtype)
    return out, torch.autograd.grad(out, leaves(inputs), cotangent)


def fresh(inputs: tuple) -> tuple:
    """The same values as new leaves (strides kept), so that eager and jit do not share a graph."""
    return tuple(x.detach().requires_grad_() if isinstance(x, torch.Tensor) and x.requires_grad else x for x in inputs)


def compare(case: Case, dtype: torch.dtype):
    torch.manual_seed(0)
    inputs = case.inputs(dtype)
    jfn = thunder_rs.jit(case.fn)
    expected_out, expected = gradients(case.fn, fresh(inputs))
    out, actual = gradients(jfn, fresh(inputs))
    return jfn, (out, expected_out), list(zip(actual, expected, strict=True))


@pytest.mark.filterwarnings("ignore:Implicit dimension choice:UserWarning")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_gradients_match_eager(case: Case, dtype: torch.dtype):
    tolerance = FLOAT64 if dtype == torch.float64 else FLOAT32
    _, (out, expected_out), grads = compare(case, dtype)
    torch.testing.assert_close(out, expected_out, **tolerance)
    for actual, expected in grads:
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        torch.testing.assert_close(actual, expected, **tolerance)


_CALL = re.compile(r"^  \S.* = ((?:ltorch|prims)\.\w+)\(", re.MULTILINE)


def backward_calls(jfn) -> set[str]:
    """The symbols the backward calls at top level, read from its trace before view folding
    (which rewrites the rules' views and products) and execution (which prints prims and ltorch
    calls alike as tensor methods)."""
    (before_views,) = [t for t in thunder_rs.last_backward_traces(jfn) if t.label == "cse"]
    return set(_CALL.findall(str(before_views)))


@pytest.mark.filterwarnings("ignore:Implicit dimension choice:UserWarning")
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_backward_is_the_rules(case: Case):
    jfn, _, _ = compare(case, torch.float32)
    calls = backward_calls(jfn)
    assert set(case.calls) <= calls, f"missing {set(case.calls) - calls}"
    prims = {c for c in calls if c.startswith("prims.")}
    assert prims <= set(case.prims), f"the decomposition's prims in the backward: {prims - set(case.prims)}"
    executed = str(thunder_rs.last_backward_traces(jfn)[-1])
    for name in case.absent:
        assert not re.search(rf"\b(prim_|torch_|\.){name}\(", executed), f"{name} runs in the backward:\n{executed}"


#: bfloat16 gradients against eager's: both round to 8 bits; the rules compute in float32 and
#: round once, as eager's kernels do, so they differ by a few units in the last place.
BFLOAT16 = dict(rtol=1.6e-2, atol=1.6e-2)


@pytest.mark.filterwarnings("ignore:Implicit dimension choice:UserWarning")
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bfloat16_gradients_have_eagers_dtype(case: Case):
    _, (out, expected_out), grads = compare(case, torch.bfloat16)
    assert out.dtype == expected_out.dtype
    for actual, expected in grads:
        assert actual.dtype == expected.dtype
        torch.testing.assert_close(actual.float(), expected.float(), **BFLOAT16)


def test_half_precision_weights_keep_their_dtype():
    # layer_norm of bfloat16 activations takes float32 parameters, as under autocast.
    x = randn(3, 4, dtype=torch.bfloat16)
    w, b = randn(4, dtype=torch.float32), randn(4, dtype=torch.float32)
    fn = lambda x, w, b: F.layer_norm(x, (4,), w, b)  # noqa: E731
    _, expected = gradients(fn, fresh((x, w, b)))
    _, actual = gradients(thunder_rs.jit(fn), fresh((x, w, b)))
    assert [g.dtype for g in actual] == [torch.bfloat16, torch.float32, torch.float32]
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.float(), e.float(), **BFLOAT16)


# -- losses: every target ignored, and the cases left to the decomposition --------------------------


def smoothed_cross_entropy(x, t, w):
    return F.cross_entropy(x, t, w, label_smoothing=0.1)


@pytest.mark.parametrize(
    "loss",
    [F.nll_loss, F.cross_entropy, smoothed_cross_entropy],
    ids=["nll_loss", "cross_entropy", "smoothed_cross_entropy"],
)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_all_targets_ignored_gives_zero_gradients(loss, weighted: bool):
    x, t = randn(4, 5, dtype=torch.float64), torch.full((4,), -100)
    w = torch.rand(5, dtype=torch.float64) if weighted else None
    out, (grad,) = gradients(thunder_rs.jit(loss), fresh((x, t, w)))
    assert out.isnan()  # 0 / 0, as in eager
    torch.testing.assert_close(grad, torch.zeros_like(x))
    torch.testing.assert_close(grad, gradients(loss, fresh((x, t, w)))[1][0])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("kwargs", [dict(), dict(label_smoothing=0.3, reduction="sum")], ids=["plain", "smoothing"])
def test_cross_entropy_with_class_probabilities_is_left_to_the_decomposition(kwargs: dict, dtype: torch.dtype):
    torch.manual_seed(0)
    x = randn(4, 5, dtype=dtype)
    t = torch.softmax(torch.randn(4, 5, dtype=dtype), -1)
    fn = lambda x, t: F.cross_entropy(x, t, **kwargs)  # noqa: E731
    jfn = thunder_rs.jit(fn)
    _, (actual,) = gradients(jfn, fresh((x, t)))
    _, (expected,) = gradients(fn, fresh((x, t)))
    torch.testing.assert_close(actual, expected, **(FLOAT64 if dtype == torch.float64 else FLOAT32))
    # The decomposition's log_softmax is differentiated by its own rule; nll_loss takes no part.
    calls = backward_calls(jfn)
    assert "ltorch.log_softmax_backward" in calls and "ltorch.nll_loss_backward" not in calls


@pytest.mark.parametrize(
    "loss", [F.nll_loss, F.cross_entropy, lambda x, t, w: F.cross_entropy(x, t, w, label_smoothing=0.1)]
)
def test_class_weights_that_require_grad_raise_eagers_error(loss):
    # Eager's nll_loss has no derivative for its class weights: its forward raises.
    x, t, w = randn(4, 5, dtype=torch.float64), targets(4), randn(5, dtype=torch.float64).abs().requires_grad_()
    with pytest.raises(RuntimeError, match="not differentiable with respect to argument 'weight'"):
        loss(x, t, w)
    with pytest.raises(RuntimeError, match="not differentiable with respect to argument 'weight'"):
        thunder_rs.jit(loss)(x, t, w)
    with torch.no_grad():
        torch.testing.assert_close(thunder_rs.jit(loss)(x, t, w), loss(x, t, w))


def test_attention_with_dropout_is_left_to_the_decomposition():
    # Random masks need not match eager's, so the gradient is checked against central differences
    # of the compiled function itself, reseeded so that every call draws the same mask; the
    # shifted inputs require grad so that they take the same (decomposed) forward.
    torch.manual_seed(0)
    q, k, v = (randn(1, 2, 3, 4, dtype=torch.float64) for _ in range(3))
    jfn = thunder_rs.jit(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.4))

    def loss(*inputs):
        torch.manual_seed(7)
        return (jfn(*inputs) * torch.arange(24, dtype=torch.float64).reshape(1, 2, 3, 4)).sum()

    grads = torch.autograd.grad(loss(q, k, v), (q, k, v))
    assert "ltorch.tensor_softmax" not in backward_calls(jfn)
    h = 1e-6
    for i, g in enumerate(grads):
        direction = torch.randn_like(g)
        shifted = [
            [
                (x.detach() + s * h * direction if j == i else x.detach()).requires_grad_()
                for j, x in enumerate((q, k, v))
            ]
            for s in (1, -1)
        ]
        numeric = (loss(*shifted[0]) - loss(*shifted[1])) / (2 * h)
        torch.testing.assert_close((g * direction).sum(), numeric, rtol=1e-6, atol=1e-6)


def _biased_attention(q, k, v, bias):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=q.dtype == torch.float32):
        q, k, v = (x * 1.5 for x in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["autocast_bf16", "float64"])
def test_a_float_mask_that_requires_grad_takes_eagers_math_kernel(dtype):
    """On the CPU eager takes its math kernel for a mask that requires grad (T5's learned position
    bias), its flash kernel for one that does not; the compiled forward ran the flash kernel for
    both, a bfloat16 step apart under autocast (T5's loss 0.04 apart)."""
    torch.manual_seed(0)
    q, k, v = (randn(2, 2, 8, 16, dtype=dtype) for _ in range(3))
    for requires_grad in (True, False):
        bias = randn(1, 2, 8, 8, dtype=dtype, grad=requires_grad)
        jfn = thunder_rs.jit(_biased_attention)
        out, expected = jfn(q, k, v, bias), _biased_attention(q, k, v, bias)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        # (the math path op by op, its probabilities kept for the backward as eager's autograd keeps them)
        assert ("torch_sdpa_flash(" in str(thunder_rs.last_traces(jfn)[-1])) != requires_grad
        if dtype == torch.float64:  # bfloat16 gradients: both as far from float64's, not equal
            inputs, g = (q, k, v, bias) if requires_grad else (q, k, v), torch.randn_like(out)
            grads, expected_grads = (torch.autograd.grad(y, inputs, g) for y in (out, expected))
            torch.testing.assert_close(grads, expected_grads)


@pytest.mark.parametrize("inplace", [False, True], ids=["functional", "inplace"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_hardsigmoid_gradient_is_eagers_to_the_bit(dtype: torch.dtype, inplace: bool):
    """Eager's backward multiplies by 1/6 rounded to float32 in every dtype; dividing by 6, as
    differentiating the forward's ``(x + 3) / 6`` does, put float64 gradients 3e-8 apart
    (MobileNetV3's and EfficientNet's squeeze-excitation gates)."""

    def fn(x):
        y = x * 1.0
        return F.hardsigmoid(y, inplace=True) * 2 if inplace else F.hardsigmoid(y) * 2

    special = torch.tensor([-3.0, 3.0, 0.0, float("nan"), float("inf"), -float("inf")], dtype=torch.float64)
    x = torch.cat([torch.randn(64, dtype=torch.float64) * 4, special]).to(dtype)
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    g = torch.randn(x.shape, dtype=dtype)
    (thunder_rs.jit(fn)(ours) * g).sum().backward()
    (fn(theirs) * g).sum().backward()
    assert torch.equal(ours.grad, theirs.grad)


@pytest.mark.parametrize(
    "fn",
    [
        lambda t: t.std(-1),
        lambda t: t.std(0, keepdim=True, unbiased=False),
        lambda t: t.std(),
        lambda t: torch.std(t, (0, 1), correction=2),
        lambda t: sum(torch.std_mean(t, -1)),
        lambda t: torch.std_mean(t, 0, keepdim=True)[0],
    ],
    ids=["dim", "keepdim_biased", "all", "correction", "std_mean", "std_mean_std_only"],
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_std_of_constant_slices_has_eagers_zero_gradient(fn, dtype: torch.dtype):
    """Eager's std backward is 0 where the std is 0; differentiating sqrt(var) gave NaN there
    (a constant feature, a padded row). The forward stays eager's one std (or std_mean) kernel."""
    x = torch.tensor([[1.5, 1.5, 1.5, 2.0], [1.0, 2.0, 4.0, 2.0], [2.0, 2.0, 2.0, 2.0]], dtype=dtype)
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, expected = thunder_rs.jit(fn)(ours), fn(theirs)
    assert torch.equal(out, expected)
    g = torch.randn(out.shape, dtype=dtype)
    out.backward(g)
    expected.backward(g)
    torch.testing.assert_close(ours.grad, theirs.grad, **(FLOAT64 if dtype == torch.float64 else FLOAT32))
    assert not ours.grad.isnan().any()


#: One value reaching a grad rule through more than one input or call, after CSE merges equal
#: expressions into it (``x[0]`` written twice): every contribution must reach it.
_SD = F.scaled_dot_product_attention
_IDX = (torch.tensor([1, 2]), torch.tensor([1, 0]))
MERGED_INPUTS = {
    "sdpa_of_three_equal_transposes": lambda x: _SD(x.transpose(1, 2), x.transpose(1, 2), x.transpose(1, 2)),
    "sdpa_key_and_value_equal": lambda x: _SD(x, x * 2, x * 2),
    "linear_of_a_slice_with_itself": lambda x: F.linear(x[0, 0], x[0, 0]),
    "two_linears_sharing_a_computed_weight": lambda x: F.linear(x[1, 0], x[0, 0] * 2) + F.linear(x[1, 1], x[0, 0] * 2),
    "layer_norm_weight_and_bias_equal": lambda x: F.layer_norm(x, (8,), x[0, 0, 0], x[0, 0, 0]),
    "two_embeddings_of_one_slice": lambda x: F.embedding(_IDX[0], x[0, 0]) + F.embedding(_IDX[1], x[0, 0]),
}


@pytest.mark.parametrize("name", list(MERGED_INPUTS))
def test_gradients_of_merged_equal_inputs_of_grad_rules_all_arrive(name):
    program = MERGED_INPUTS[name]
    x = torch.randn(2, 4, 3, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    grads = []
    for fn in (program, thunder_rs.jit(program)):
        leaf = x.clone().requires_grad_()
        out = fn(leaf)
        out.backward(torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view(out.shape))
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[1], grads[0], **FLOAT64)


def test_a_linear_called_twice_under_autocast_gets_both_weight_gradients():
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 8)
    a, b = torch.randn(4, 8), torch.randn(4, 8)

    def program(a, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return (linear(a) + linear(b)).float()

    grads = []
    for fn in (program, thunder_rs.jit(program)):
        linear.zero_grad()
        fn(a, b).sum().backward()
        grads.append((linear.weight.grad.clone(), linear.bias.grad.clone()))
    for jitted, eager in zip(grads[1], grads[0]):
        torch.testing.assert_close(jitted, eager, rtol=1e-2, atol=1e-2)


#: Activations whose decompositions overflow at large |x| (exp(-x) of sigmoid below -89, the
#: unused where branch of elu and softplus above 89): the gradients are eager's, never NaN.
SATURATING = {
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    "softplus": F.softplus,
    "softplus_beta_threshold": lambda x: F.softplus(x, 2.0, 5.0),
    "elu": lambda x: F.elu(x, 0.7),
    "selu": F.selu,
    "celu": lambda x: F.celu(x, 1.3),
    "mish": F.mish,
    "sigmoid_of_a_minus_inf_mask": lambda x: torch.sigmoid(x.masked_fill(x < -50, float("-inf"))),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(SATURATING))
def test_saturating_activations_have_eager_gradients_at_large_inputs(name, dtype):
    fn = SATURATING[name]
    extremes = torch.tensor([-1000.0, -100.0, -89.0, -20.0, 0.0, 20.0, 89.0, 100.0, 1000.0])
    x0 = torch.cat([extremes, torch.randn(32, generator=torch.Generator().manual_seed(3)) * 5]).to(dtype)
    g = torch.linspace(-1, 1, x0.numel()).to(dtype)
    grads = []
    for f in (fn, thunder_rs.jit(fn)):
        x = x0.clone().requires_grad_()
        f(x).backward(g)
        grads.append(x.grad)
    assert not grads[1].isnan().any()
    tolerance = FLOAT64 if dtype == torch.float64 else FLOAT32 if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(grads[1], grads[0], **tolerance)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fn", [torch.tanh, F.logsigmoid])
def test_gradients_in_half_precision_are_eagers_bit_for_bit(fn, dtype):
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0)) * 8
    x = x.to(dtype).requires_grad_()
    g = torch.randn(64, 8, generator=torch.Generator().manual_seed(1)).to(dtype)
    (expected,) = torch.autograd.grad(fn(x), x, g)
    (got,) = torch.autograd.grad(thunder_rs.jit(fn)(x), x, g)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("batch", [(), (2, 3)], ids=["mm", "batch_against_matrix"])
def test_matmuls_gradient_of_a_transposed_matrix_with_a_dim_of_size_one_has_eagers_strides(batch):
    """ATen's mm lays out the gradient of a column-major matrix (``rel_k.t()`` of shape [k, 1],
    timm's BotNet) column-major; its transpose's is then row-major, [1, k] with strides (k, 1),
    which ``AccumulateGrad`` keeps as it comes (a size-1 dim's stride is free)."""
    w = torch.nn.Parameter(torch.randn(1, 4, dtype=torch.float64))
    x = torch.randn(*batch, 5, 4, dtype=torch.float64)
    grads = []
    for fn in (lambda x: x @ w.t(), thunder_rs.jit(lambda x: x @ w.t())):
        fn(x).square().sum().backward()
        grads.append(w.grad)
        w.grad = None
    torch.testing.assert_close(grads[0], grads[1])
    assert grads[1].stride() == grads[0].stride() == (4, 1)


CLASSES, CLASS_WEIGHT = torch.arange(64) % 8, torch.linspace(0.5, 2, 8, dtype=torch.float64)
#: Gradients with constants (a number operand, an activation's coefficients) that eager's formulas
#: round in their own order: name -> (program, its number of inputs or their shapes).
CONSTANTS = {
    "addcmul": (lambda a, b, c: torch.addcmul(a, b, c, value=0.3), 3),
    "addcdiv": (lambda a, b, c: torch.addcdiv(a, b, c.abs() + 0.5, value=0.3), 3),
    "number / tensor": (lambda a: 0.3 / (a.abs() + 0.5), 1),
    # (the backward kernels' own exponentials: torch.exp rounds some differently)
    "softplus": (lambda a: F.softplus(a, 0.7, 3.0), 1),
    "celu": (lambda a: F.celu(a, 0.7), 1),
    "selu": (F.selu, 1),
    "silu": (F.silu, 1),
    "mish": (F.mish, 1),
    "hardswish": (F.hardswish, 1),
    # (tanh_backward's vector kernel: one fused multiply-add)
    "tanh": (torch.tanh, 1),
    "tanh_": (lambda a: (a * 1).tanh_(), 1),
    # (computed in place, eager differentiates from the result: elu_backward with is_result)
    "elu inplace=True": (lambda a: F.elu(a * 1, 0.7, inplace=True), 1),
    "ELU(inplace=True)": (lambda a: torch.nn.ELU(inplace=True)(a * 1), 1),
    "selu_": (lambda a: torch.selu_(a * 1), 1),
    "celu inplace=True": (lambda a: F.celu(a * 1, 0.7, inplace=True), 1),
    "leaky_relu_": (lambda a: F.leaky_relu_(a * 1, 0.2), 1),
    # (eager's engine adds up a target's gradients in the order its ops' backwards run)
    "kl_div": (lambda a, b: F.kl_div(a, b.abs(), reduction="batchmean"), 2),
    "poisson_nll_loss": (lambda a, b: F.poisson_nll_loss(a, b.abs()), 2),
    "poisson_nll_loss full": (lambda a, b: F.poisson_nll_loss(a, b.abs(), full=True, reduction="none"), 2),
    "poisson_nll_loss full, rates": (lambda a, b: F.poisson_nll_loss(a.abs(), b.abs(), False, True), 2),
    # (eager's kernels and its formulas' order: the grad rules of these ops tell which)
    "multi_margin_loss": (lambda a: F.multi_margin_loss(a, CLASSES), 1),
    "multi_margin_loss p=2, weight": (lambda a: F.multi_margin_loss(a, CLASSES, 2, 0.7, CLASS_WEIGHT.to(a.dtype)), 1),
    "cdist": (torch.cdist, 2),
    "cdist batched": (torch.cdist, ((2, 1, 30, 8), (3, 27, 8))),
    "bilinear": (F.bilinear, ((2, 7, 16), (2, 7, 12), (8, 16, 12), (8,))),
    "huber_loss weight": (lambda a, b, w: F.huber_loss(a, b, delta=0.7, weight=w), 3),
    "matrix_power batched": (lambda a: torch.linalg.matrix_power(a, 3), ((3, 5, 5),)),
    # (the norm's kernel and its grad rule, then eager's clamp and quotient)
    "normalize": (F.normalize, 1),
    "normalize p=3": (lambda a: F.normalize(a, p=3.0, dim=0), 1),
    # (eager's CPU flash kernels for 3-D attention too)
    "sdpa 3-D": (F.scaled_dot_product_attention, ((4, 6, 8), (4, 7, 8), (4, 7, 8))),
    "sdpa grouped heads": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
        ((2, 4, 6, 8), (2, 2, 7, 8), (2, 2, 7, 8)),
    ),
    "sdpa with a mask": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=torch.arange(7) < torch.arange(6)[:, None]),
        ((2, 3, 6, 8), (2, 3, 7, 8), (2, 3, 7, 8)),
    ),
    # (eager's math path, differentiated op by op: a mask that requires grad, 5-D inputs)
    "sdpa math, a mask with a gradient": (
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        ((2, 3, 6, 8), (2, 3, 7, 8), (2, 3, 7, 8), (6, 7)),
    ),
    "sdpa math, broadcast batch, negative scale": (
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=-0.4),
        ((2, 3, 6, 8), (1, 3, 7, 8), (2, 1, 7, 8), (6, 7)),
    ),
    "sdpa math, 5-D causal": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        ((2, 2, 3, 6, 8), (2, 2, 3, 7, 8), (2, 2, 3, 7, 8)),
    ),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(CONSTANTS))
def test_gradients_with_constants_are_eagers_to_the_bit(name, dtype):
    fn, shapes = CONSTANTS[name]
    shapes = [(64, 8)] * shapes if isinstance(shapes, int) else shapes
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn(shape, generator=generator, dtype=dtype) * 2 for shape in shapes]
    results = []
    for f in (fn, thunder_rs.jit(fn)):
        leaves = [x.clone().requires_grad_() for x in inputs]
        out = f(*leaves)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
        results.append((out, torch.autograd.grad(out, leaves, g)))
    (expected, expected_grads), (got, grads) = results
    assert torch.equal(got, expected)
    for grad, eager in zip(grads, expected_grads, strict=True):
        assert torch.equal(grad, eager)
