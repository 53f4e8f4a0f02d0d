"""torch.nn.functional ops: activations, softmax, norms, dropout, embedding, losses, attention."""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import partial

import torch
import torch.nn.functional as F

from .core import (
    ACCUMULATING,
    ALL,
    FLOATS,
    INTS,
    NUMERIC,
    PROMOTION_PARTNER,
    ErrorInput,
    OpInfo,
    SampleInput,
    Strided,
    Transposed,
    cases,
    chain_errors,
    chain_samples,
    cpu,
    make,
    tensor,
    transposed,
    with_kwargs,
)
from .elementwise import rejects, tie_samples, unary, unary_samples


def bad_approximate() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), approximate="bogus"), RuntimeError)


def bad_hardtanh() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), 1.0, -1.0), ValueError)
    yield ErrorInput(SampleInput(cpu((3,), torch.bool)), NotImplementedError)


def threshold_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,), torch.bool), 0.5, 1.0), NotImplementedError)


ACTIVATION_OPS = [
    unary("relu", F.relu, dtypes=NUMERIC, error_inputs=rejects(torch.bool)),
    unary("sigmoid", F.sigmoid),
    unary("silu", F.silu, dtypes=FLOATS, error_inputs=rejects(torch.int64, torch.bool)),
    # Sample 7 holds +inf: oneDNN's kernel, which eager runs for a contiguous float32 tensor of more
    # than one element, gives NaN there on AVX-512, aten's own kernels inf (``torch/onednn.py``).
    unary("gelu", F.gelu, dtypes=FLOATS, error_inputs=chain_errors(rejects(torch.int64), bad_approximate)),
    OpInfo("gelu", F.gelu, with_kwargs(unary_samples, approximate="tanh"), variant="tanh"),
    unary("sigmoid", torch.sigmoid, variant="torch"),
    unary("relu", torch.relu, dtypes=NUMERIC, variant="torch"),
    unary("tanh", F.tanh, variant="functional"),
    unary("relu6", F.relu6, dtypes=NUMERIC, error_inputs=rejects(torch.bool)),
    # Integer inputs clamp to the bounds truncated to integers.
    OpInfo("hardtanh", F.hardtanh, with_kwargs(unary_samples, min_val=-0.5, max_val=2.5), bad_hardtanh, NUMERIC),
    unary("leaky_relu", F.leaky_relu, dtypes=FLOATS, error_inputs=rejects(torch.int64)),
    OpInfo("leaky_relu", F.leaky_relu, with_kwargs(unary_samples, negative_slope=0.2), variant="slope"),
    unary("elu", F.elu, dtypes=FLOATS, error_inputs=rejects(torch.int64)),
    OpInfo("elu", F.elu, with_kwargs(unary_samples, alpha=0.5), variant="alpha"),
    unary("softplus", F.softplus, dtypes=FLOATS, error_inputs=rejects(torch.int64)),
    OpInfo("threshold", F.threshold, with_kwargs(unary_samples, threshold=0.5, value=-2.0), threshold_errors, NUMERIC),
    # Gradients at the thresholds themselves, where eager's kernels pick a side.
    OpInfo("relu", F.relu, tie_samples(((), {})), dtypes=NUMERIC, variant="ties"),
    OpInfo("relu6", F.relu6, tie_samples(((), {})), variant="ties"),
    OpInfo("hardtanh", F.hardtanh, tie_samples(((-1.0, 1.0), {}), ((0.0, 6.0), {})), variant="ties"),
    OpInfo("leaky_relu", F.leaky_relu, tie_samples(((0.2,), {})), variant="ties"),
    OpInfo("elu", F.elu, tie_samples(((), {}), ((0.5,), {})), variant="ties"),
    OpInfo("threshold", F.threshold, tie_samples(((0.5, -3.0), {}), ((0.0, 0.0), {})), variant="ties"),
    OpInfo("softplus", F.softplus, with_kwargs(unary_samples, beta=2.0, threshold=5.0), variant="beta"),
    unary("logsigmoid", F.logsigmoid, dtypes=FLOATS, error_inputs=rejects(torch.int64)),
]

SOFTMAX_CASES = cases(
    ((), 0),
    ((5,), 0),
    ((3, 4), -1),
    ((3, 4), 0),
    ((2, 3, 4), 1),
    ((0, 4), -1),
    ((3, 0), -1),
    (Transposed((3, 4)), -1),
    (Strided((2, 3, 4)), -1),
)


def masked_rows(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Rows with -inf entries, as attention masks make them; a row of only -inf gives NaN."""
    x = make((3, 4), dtype, device)
    x[0, 1:3] = -math.inf
    x[1] = -math.inf
    yield SampleInput(x, -1)


SOFTMAX_SAMPLES = chain_samples(SOFTMAX_CASES, masked_rows)


def softmax_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4), torch.int64), -1), NotImplementedError)
    yield ErrorInput(SampleInput(cpu((3, 4)), 2), IndexError)


def positional_dtype(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """torch.softmax(x, dim, dtype): the third positional argument is dtype, not F.softmax's _stacklevel."""
    for sample in SOFTMAX_CASES(dtype, device):
        yield SampleInput(*sample.args, torch.float64)


def softmax_entries(name: str, op) -> list[OpInfo]:
    # With dtype=, the input is cast first, so integer inputs are fine.
    to_float64 = with_kwargs(SOFTMAX_CASES, dtype=torch.float64)
    return [
        OpInfo(name, op, SOFTMAX_SAMPLES, softmax_errors, tolerances=ACCUMULATING),
        OpInfo(name, op, to_float64, dtypes=ALL, variant="dtype", tolerances=ACCUMULATING),
        OpInfo(name, getattr(torch, name), SOFTMAX_SAMPLES, softmax_errors, variant="torch", tolerances=ACCUMULATING),
        OpInfo(
            name,
            getattr(torch.Tensor, name),
            positional_dtype,
            dtypes=ALL,
            variant="method_dtype",
            tolerances=ACCUMULATING,
        ),
    ]


# (input, normalized_shape): the normalized dims are the trailing ones.
NORM_CASES = (
    ((3, 4), (4,)),
    ((2, 3, 4), (3, 4)),
    ((2, 3, 4), (4,)),
    ((5,), (5,)),
    ((0, 4), (4,)),
    (Transposed((3, 4)), (4,)),
)


def norm_samples(dtype: torch.dtype, device: str, *, bias: bool) -> Iterable[SampleInput]:
    """Each case without affine parameters, with a weight, and (layer_norm) with a weight and bias."""
    for spec, shape in NORM_CASES:
        x = tensor(spec, dtype, device)
        weight = make(shape, dtype, device)
        yield SampleInput(x, shape)
        yield SampleInput(x, shape, weight)
        if bias:
            yield SampleInput(x, shape, weight, make(shape, dtype, device))
    yield SampleInput(make((3, 4), dtype, device), (4,), eps=1e-2)


def norm_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), (3,)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), (4,), cpu((3,))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4), torch.int64), (4,)), NotImplementedError)


def _native_layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return torch.native_layer_norm(input, normalized_shape, weight, bias, eps)


def softmax_backward_data_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """The gradient and the softmax output it flows back through, along each dim."""
    for spec, dim in (((3, 5), 1), ((3, 5), 0), ((2, 3, 4), -1), (Transposed((3, 5)), 1), ((), 0), ((0, 4), 1)):
        grad = tensor(spec, dtype, device)
        output = torch.softmax(tensor(spec, dtype, device), dim)
        yield SampleInput(grad, output, dim, dtype)


def softmax_backward_data_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((3, 4)), 2, torch.float32), IndexError)
    yield ErrorInput(SampleInput(cpu((2, 4)), cpu((3, 4)), 1, torch.float32), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((3, 4), torch.float64), 1, torch.float32), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((3, 4)), 1, torch.float16), RuntimeError)


def dropout_errors() -> Iterable[ErrorInput]:
    for p in (1.5, -0.1):
        yield ErrorInput(SampleInput(cpu((3,)), p), ValueError)
    yield ErrorInput(SampleInput(cpu((3,), torch.int64), 0.5), RuntimeError)  # no integer noise


# Only dropout calls with a deterministic result are compared here; the statistics of p=0.25 are
# checked in test_ops.py.
def _dropout_scaling(a, p=0.5):
    """Which elements dropout keeps is random; that the kept ones are scaled by 1 / (1 - p) and the
    others zeroed is not: zero wherever dropout behaves (and a gradient that is zero too)."""
    out = F.dropout(a, p, training=True)
    return torch.where(out == 0, 0.0, out * (1 - p) - a)


DROPOUT_OPS = [
    OpInfo(
        "dropout", _dropout_scaling, partial(unary_samples, exclude_zero=True, extremal_values=False), variant="scaling"
    ),
    OpInfo("dropout", F.dropout, with_kwargs(unary_samples, p=0.0, training=True), dropout_errors, variant="p0"),
    OpInfo("dropout", F.dropout, with_kwargs(unary_samples, p=0.5, training=False), variant="eval"),
    OpInfo("dropout", F.dropout, with_kwargs(unary_samples, p=1.0, training=True), variant="p1"),
]


def batch_norm_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Eval mode with running statistics, training mode with them (updated in place) and without,
    affine or not, for 2-D to 5-D inputs and a non-contiguous one."""
    for spec in ((6, 3), (4, 3, 5), (2, 3, 4, 4), (2, 3, 2, 3, 2), Transposed((5, 3))):
        x = tensor(spec, dtype, device)
        stats = {"running_mean": make((3,), dtype, device), "running_var": make((3,), dtype, device, low=0.5, high=2.0)}
        params = {"weight": make((3,), dtype, device), "bias": make((3,), dtype, device)}
        yield SampleInput(x, **stats, **params, training=False)
        yield SampleInput(x, **stats, **params, training=True, momentum=0.3)
        yield SampleInput(x, running_mean=None, running_var=None, **params, training=True)
    x = make((4, 3, 2), dtype, device)
    yield SampleInput(x, make((3,), dtype, device), make((3,), dtype, device, low=0.5, high=2.0), eps=0.1)
    yield SampleInput(x, None, None, training=True, eps=1e-3)


def batch_norm_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((1, 3)), None, None, training=True), ValueError)  # one value per channel
    yield ErrorInput(SampleInput(cpu((4, 3)), torch.zeros(4), torch.ones(4)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((4, 3)), None, None, weight=torch.ones(2), training=True), RuntimeError)


def embedding_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Index tensors of several shapes and both integer dtypes into a (10, 3) table."""
    weight = make((10, 3), dtype, device)
    for shape in ((4,), (2, 3), (), (0,)):
        yield SampleInput(torch.randint(0, 10, shape, device=device), weight)
    yield SampleInput(torch.randint(0, 10, (5,), dtype=torch.int32, device=device), weight)
    yield SampleInput(torch.randint(0, 10, (4,), device=device), transposed((10, 3), dtype, device))


def one_hot_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Labels of several shapes, every class hit or not, and no labels at all."""
    yield SampleInput(torch.tensor([0, 2, 1, 2], device=device), 3)
    yield SampleInput(torch.randint(0, 4, (2, 3), device=device), 6)
    yield SampleInput(torch.tensor(1, device=device), num_classes=2)
    yield SampleInput(torch.zeros(0, dtype=torch.int64, device=device), 3)


def embedding_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(torch.tensor([0.0]), cpu((10, 3))), RuntimeError)
    yield ErrorInput(SampleInput(torch.tensor([0]), cpu((10,))), RuntimeError)
    yield ErrorInput(SampleInput(torch.tensor([0]), cpu((10, 3)), padding_idx=10), AssertionError)


def embedding_renormed(input, weight, **kwargs):
    """F.embedding with ``max_norm`` on a copy of ``weight``: the lookup and the table it renormalised
    (F.embedding writes the referenced rows of ``weight`` in place)."""
    table = weight.clone()
    return F.embedding(input, table, **kwargs), table


def embedding_renorm_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """embedding's samples (values in [-9, 9]: row norms on both sides of ``max_norm``) in several
    norms, and an index referenced twice with a padding row."""
    yield from with_kwargs(embedding_samples, max_norm=8.0)(dtype, device)
    for norm_type in (1.0, 3.0, math.inf):
        table = make((10, 3), dtype, device)
        yield SampleInput(torch.tensor([[4, 1], [1, 9]], device=device), table, max_norm=6.0, norm_type=norm_type)
    yield SampleInput(
        torch.tensor([2, 0, 2, 2], device=device), make((10, 3), dtype, device), max_norm=6.0, padding_idx=2
    )


def embedding_renorm_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(torch.tensor([0.0]), cpu((10, 3)), max_norm=1.0), RuntimeError)
    yield ErrorInput(SampleInput(torch.tensor([0]), cpu((10,)), max_norm=1.0), RuntimeError)


def cross_entropy_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def logits(spec):
        return tensor(spec, dtype, device)

    def targets(shape, classes=5):
        return torch.randint(0, classes, shape, device=device)

    def probabilities(shape):
        return torch.softmax(make(shape, dtype, device), -1)

    for reduction in ("mean", "sum", "none"):
        yield SampleInput(logits((3, 5)), targets((3,)), reduction=reduction)
        ignored = targets((4,))
        ignored[0] = 2
        yield SampleInput(logits((4, 5)), ignored, ignore_index=2, reduction=reduction)
        yield SampleInput(logits((3, 5)), probabilities((3, 5)), reduction=reduction)
    yield SampleInput(logits((2, 5, 4)), targets((2, 4)))  # class dim 1, then extra dims
    yield SampleInput(logits((5,)), targets(()))  # unbatched
    yield SampleInput(logits((3, 5)), targets((3,)), weight=make((5,), dtype, device, low=0.1, high=1))
    yield SampleInput(logits((3, 5)), targets((3,)), label_smoothing=0.1)
    yield SampleInput(logits((3, 5)), probabilities((3, 5)), label_smoothing=0.2, reduction="none")
    yield SampleInput(logits((0, 5)), targets((0,)), reduction="sum")
    yield SampleInput(logits(Transposed((3, 5))), targets((3,)))
    yield SampleInput(logits((3, 5)), torch.full((3,), 1, device=device), ignore_index=1)  # all ignored: NaN


def class_index_samples(dtype: torch.dtype, device: str, *, log_probs: bool) -> Iterable[SampleInput]:
    """Targets with ignored entries (-100), class weights, extra dims and label smoothing.

    `log_probs` makes the inputs log-probabilities, as nll_loss expects; nll_loss takes no smoothing.
    """

    def inputs(spec):
        x = tensor(spec, dtype, device)
        return torch.log_softmax(x, 1 if x.ndim > 1 else 0) if log_probs else x

    def targets(shape):
        t = torch.randint(0, 5, shape, device=device)
        if t.numel():
            t.view(-1)[0] = -100
        return t

    weight = make((5,), dtype, device, low=0.1, high=1)
    smoothing = (0.0,) if log_probs else (0.0, 0.2)
    for reduction in ("mean", "sum", "none"):
        for ls in smoothing:
            extra = {"label_smoothing": ls} if ls else {}
            yield SampleInput(inputs((4, 5)), targets((4,)), reduction=reduction, **extra)
            yield SampleInput(inputs((4, 5)), targets((4,)), weight=weight, reduction=reduction, **extra)
            yield SampleInput(inputs((2, 5, 3)), targets((2, 3)), weight=weight, reduction=reduction, **extra)
    yield SampleInput(inputs((5,)), torch.tensor(3, device=device))
    yield SampleInput(inputs((4, 5)), torch.full((4,), -100, device=device))  # all ignored: NaN
    yield SampleInput(inputs((4, 5)), targets((4,)).clamp(min=0).to(torch.uint8), ignore_index=3)
    yield SampleInput(inputs(Transposed((4, 5))), targets((4,)), reduce=False)  # deprecated flags


def nll_loss_errors() -> Iterable[ErrorInput]:
    log_probs, target = cpu((3, 4)), torch.tensor([0, 1, 3])
    yield ErrorInput(SampleInput(cpu(()), torch.tensor(0)), ValueError)
    yield ErrorInput(SampleInput(log_probs, target.float()), RuntimeError)
    yield ErrorInput(SampleInput(log_probs, target[:, None]), RuntimeError)
    yield ErrorInput(SampleInput(log_probs, target, cpu((4,), torch.float64)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 4, 3)), torch.tensor([0, 1])), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4), torch.int64), target), NotImplementedError)


def cross_entropy_errors() -> Iterable[ErrorInput]:
    logits, target = cpu((3, 4)), torch.tensor([0, 1, 3])
    yield ErrorInput(SampleInput(logits, torch.tensor([0, 1])), ValueError)
    yield ErrorInput(SampleInput(logits, target.int()), RuntimeError)
    yield ErrorInput(SampleInput(logits, target, reduction="bogus"), ValueError)
    yield ErrorInput(SampleInput(logits, torch.softmax(logits, 1), ignore_index=1), RuntimeError)
    yield ErrorInput(SampleInput(logits, target, weight=torch.ones(3)), RuntimeError)
    yield ErrorInput(SampleInput(logits, cpu((3, 5))), RuntimeError)
    yield ErrorInput(SampleInput(logits, target, label_smoothing=1.5), RuntimeError)
    yield ErrorInput(SampleInput(logits, torch.ones(3, 4, dtype=torch.int64)), RuntimeError)


def mse_loss_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def t(spec, dt=dtype):
        return tensor(spec, dt, device)

    for reduction in ("mean", "sum", "none"):
        yield SampleInput(t((3, 4)), t((3, 4)), reduction=reduction)
    yield SampleInput(t(()), t(()))
    yield SampleInput(t((0, 4)), t((0, 4)), reduction="sum")
    yield SampleInput(t(Transposed((3, 4))), t(Strided((3, 4))))
    yield SampleInput(t((3, 4)), t((3, 4), PROMOTION_PARTNER[dtype]))


def mse_loss_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((3, 5))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((3, 4)), reduction="bogus"), ValueError)
    yield ErrorInput(SampleInput(cpu((3, 4), torch.int64), cpu((3, 4), torch.int64)), NotImplementedError)


def mha_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """``F.multi_head_attention_forward`` (what ``nn.MultiheadAttention`` calls): (length, batch,
    embedding) inputs, two heads, a packed in-projection; keys longer than queries."""

    def t(*shape):
        return make(shape, dtype, device)

    q, k = t(3, 2, 8), t(5, 2, 8)
    weights = (t(24, 8), t(24), None, None, False, 0.0, t(8, 8), t(8))
    yield SampleInput(q, k, k, 8, 2, *weights)
    yield SampleInput(q, q, q, 8, 2, *weights, need_weights=False)
    yield SampleInput(q, k, k, 8, 2, *weights, key_padding_mask=make((2, 5), torch.bool, device))
    yield SampleInput(q, k, k, 8, 2, *weights, attn_mask=t(3, 5), average_attn_weights=False)
    yield SampleInput(t(3, 8), t(5, 8), t(5, 8), 8, 2, *weights)  # unbatched


_SELF_ATTENTION = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()


def self_attention_fast_path(x, in_weight, in_bias, out_weight, out_bias, **kwargs):
    """``nn.MultiheadAttention`` over ``x`` as its query, key and value, in evaluation with weights
    that do not require grad: eager's fast path (``torch._native_multi_head_attention``)."""
    weights = dict(in_proj_weight=in_weight, in_proj_bias=in_bias)
    weights.update({"out_proj.weight": out_weight, "out_proj.bias": out_bias})
    return torch.func.functional_call(_SELF_ATTENTION, weights, (x, x, x), kwargs)


def self_attention_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """(batch, length, 8) inputs, two heads; masks by key, by query and key, rows fully masked."""

    def t(*shape):
        return make(shape, dtype, device)

    x, weights = t(2, 3, 8), (t(24, 8), t(24), t(8, 8), t(8))
    padding = torch.tensor([[False, False, True], [True, True, True]], device=device)
    yield SampleInput(x, *weights)
    yield SampleInput(x, *weights, need_weights=False)
    yield SampleInput(x, *weights, key_padding_mask=padding, average_attn_weights=False)
    yield SampleInput(x, *weights, attn_mask=torch.ones(3, 3, dtype=torch.bool, device=device).triu(1))
    yield SampleInput(t(0, 3, 8), *weights, need_weights=False)


_ENCODER_LAYERS = {
    norm_first: torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, norm_first=norm_first).eval()
    for norm_first in (False, True)
}


def encoder_layer_fast_path(src, weights, norm_first=False, **kwargs):
    """``nn.TransformerEncoderLayer`` in evaluation with ``weights`` (by name) that do not require
    grad: eager's fast path (``torch._transformer_encoder_layer_fwd``)."""
    return torch.func.functional_call(_ENCODER_LAYERS[norm_first], weights, (src,), kwargs)


def encoder_layer_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """(batch, length, 8) inputs, two heads; a padding mask (a row fully masked), a causal one."""
    weights = {name: make(tuple(p.shape), dtype, device) for name, p in _ENCODER_LAYERS[False].named_parameters()}
    x = make((2, 3, 8), dtype, device)
    padding = torch.tensor([[False, False, True], [True, True, True]], device=device)
    yield SampleInput(x, weights)
    yield SampleInput(x, weights, norm_first=True, src_key_padding_mask=padding)
    yield SampleInput(x, weights, src_mask=torch.ones(3, 3, dtype=torch.bool, device=device).triu(1))


def sdpa_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """(batch, heads, length, embedding) inputs; keys and values may be longer than queries."""

    def t(*shape):
        return make(shape, dtype, device)

    q, k, v = t(2, 2, 3, 8), t(2, 2, 5, 8), t(2, 2, 5, 8)
    yield SampleInput(q, k, v)
    yield SampleInput(q, q, q, is_causal=True)
    yield SampleInput(q, k, v, is_causal=True)  # the causal mask is aligned to the top left
    yield SampleInput(q, k, v, attn_mask=make((3, 5), torch.bool, device))
    fully_masked = make((3, 5), torch.bool, device)
    fully_masked[1] = False
    yield SampleInput(q, k, v, attn_mask=fully_masked)  # eager gives zeros for a fully masked row
    yield SampleInput(q, k, v, attn_mask=t(2, 1, 3, 5))
    # A bias per head shared by the batch (T5's learned positions): differentiated, eager's CPU
    # dispatch takes the math path for it (recorded op by op).
    yield SampleInput(q, k, v, attn_mask=t(1, 2, 3, 5), is_causal=False)
    yield SampleInput(q, k, v, scale=0.5)
    yield SampleInput(t(2, 3, 8), t(2, 5, 8), t(2, 5, 8))  # no head dim
    yield SampleInput(q, k, t(2, 2, 5, 6))  # values with their own embedding size
    yield SampleInput(t(2, 4, 3, 8), k, v, enable_gqa=True)  # two query heads share each key head
    yield SampleInput(t(2, 3, 2, 8).transpose(1, 2), k, v)  # (batch, length, heads, dim) storage


def sdpa_errors() -> Iterable[ErrorInput]:
    q = cpu((2, 2, 3, 8))
    yield ErrorInput(SampleInput(q, q, q, attn_mask=torch.ones(3, 3, dtype=torch.bool), is_causal=True), RuntimeError)
    yield ErrorInput(SampleInput(q, cpu((2, 2, 3, 4)), q), RuntimeError)
    yield ErrorInput(SampleInput(q, q.double(), q), RuntimeError)
    yield ErrorInput(SampleInput(q, q, q, attn_mask=torch.ones(3, 3, dtype=torch.int64)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 4, 3, 8)), q, q), RuntimeError)  # more query heads, no enable_gqa
    # A bias of another window size (CoAtNet's relative positions at another image size): eager
    # adds it to the scores, which are tensor a.
    mask = cpu((1, 2, 4, 4))
    yield ErrorInput(SampleInput(q, q, q, attn_mask=mask), RuntimeError, match=r"tensor a \(3\).*tensor b \(4\)")


OPS = [
    *ACTIVATION_OPS,
    *softmax_entries("softmax", F.softmax),
    *softmax_entries("log_softmax", F.log_softmax),
    OpInfo("layer_norm", F.layer_norm, partial(norm_samples, bias=True), norm_errors, tolerances=ACCUMULATING),
    OpInfo("rms_norm", F.rms_norm, partial(norm_samples, bias=False), norm_errors, tolerances=ACCUMULATING),
    OpInfo(
        "native_layer_norm", _native_layer_norm, partial(norm_samples, bias=True), norm_errors, tolerances=ACCUMULATING
    ),
    OpInfo(
        "_softmax_backward_data",
        torch._softmax_backward_data,
        softmax_backward_data_samples,
        softmax_backward_data_errors,
        tolerances=ACCUMULATING,
    ),
    OpInfo(
        "batch_norm",
        F.batch_norm,
        batch_norm_samples,
        batch_norm_errors,
        tolerances=ACCUMULATING,
        nondifferentiable=("running_mean", "running_var"),
    ),
    *DROPOUT_OPS,
    OpInfo("embedding", F.embedding, embedding_samples, embedding_errors, NUMERIC),
    OpInfo("one_hot", F.one_hot, one_hot_samples, dtypes=INTS, supports_grad=False),
    OpInfo(
        "embedding",
        F.embedding,
        with_kwargs(embedding_samples, padding_idx=0),
        dtypes=NUMERIC,
        variant="padding_idx",
    ),
    OpInfo("embedding", embedding_renormed, embedding_renorm_samples, embedding_renorm_errors, variant="max_norm"),
    OpInfo(
        "cross_entropy",
        F.cross_entropy,
        cross_entropy_samples,
        cross_entropy_errors,
        tolerances=ACCUMULATING,
        nondifferentiable=("weight",),
    ),
    OpInfo(
        "cross_entropy",
        F.cross_entropy,
        partial(class_index_samples, log_probs=False),
        variant="class_index",
        tolerances=ACCUMULATING,
        nondifferentiable=("weight",),
    ),
    OpInfo(
        "nll_loss",
        F.nll_loss,
        partial(class_index_samples, log_probs=True),
        nll_loss_errors,
        tolerances=ACCUMULATING,
        nondifferentiable=("weight",),
    ),
    OpInfo("mse_loss", F.mse_loss, mse_loss_samples, mse_loss_errors, tolerances=ACCUMULATING),
    OpInfo(
        "scaled_dot_product_attention",
        F.scaled_dot_product_attention,
        sdpa_samples,
        sdpa_errors,
        tolerances=ACCUMULATING,
    ),
    OpInfo("multi_head_attention_forward", F.multi_head_attention_forward, mha_samples, tolerances=ACCUMULATING),
    OpInfo("native_self_attention", self_attention_fast_path, self_attention_samples, supports_grad=False),
    OpInfo("native_encoder_layer", encoder_layer_fast_path, encoder_layer_samples, supports_grad=False),
]
