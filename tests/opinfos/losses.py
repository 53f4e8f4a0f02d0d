"""torch.nn.functional losses and distances: every reduction, weights, 0-d, empty and non-contiguous
operands, and the argument checks eager makes."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

import math

import torch
import torch.nn.functional as F

from .core import (
    ACCUMULATING,
    FLOATS,
    ErrorInput,
    OpInfo,
    SampleInput,
    Strided,
    Transposed,
    chain_errors,
    cpu,
    make,
    tensor,
    transposed,
)

REDUCTIONS = ("mean", "sum", "none")
LOSS_TOLERANCE = {**ACCUMULATING, torch.float64: ACCUMULATING[torch.float32]._replace(rtol=1e-7, atol=1e-7)}


def pair_samples(
    dtype: torch.dtype, device: str, *, lhs: dict | None = None, rhs: dict | None = None, **kwargs
) -> Iterable[SampleInput]:
    """(input, target) pairs: each reduction, 0-d, empty, non-contiguous, and the legacy flags."""
    lhs, rhs = lhs or {}, rhs or {}

    def t(spec, domain):
        return tensor(spec, dtype, device, **domain)

    for reduction in REDUCTIONS:
        yield SampleInput(t((3, 4), lhs), t((3, 4), rhs), reduction=reduction, **kwargs)
    yield SampleInput(t((), lhs), t((), rhs), **kwargs)
    yield SampleInput(t((0, 4), lhs), t((0, 4), rhs), reduction="sum", **kwargs)
    yield SampleInput(t(Transposed((3, 4)), lhs), t(Strided((3, 4)), rhs), **kwargs)
    yield SampleInput(t((2, 3, 4), lhs), t((2, 3, 4), rhs), reduction="none", **kwargs)


def legacy_flags(dtype: torch.dtype, device: str, *, lhs: dict | None = None, rhs: dict | None = None):
    yield SampleInput(
        make((3, 4), dtype, device, **(lhs or {})), make((3, 4), dtype, device, **(rhs or {})), size_average=False
    )
    yield SampleInput(
        make((3, 4), dtype, device, **(lhs or {})), make((3, 4), dtype, device, **(rhs or {})), reduce=False
    )


def bad_reduction(*args: Callable) -> Callable:
    def errors() -> Iterable[ErrorInput]:
        yield ErrorInput(SampleInput(*(a() for a in args), reduction="bogus"), ValueError)

    return errors


def l1_errors() -> Iterable[ErrorInput]:
    ints = cpu((3,), torch.int64)
    yield ErrorInput(SampleInput(ints, ints), NotImplementedError)
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((3, 5))), RuntimeError)


def smooth_l1_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), cpu((3,)), beta=-1.0), RuntimeError)


def huber_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), cpu((3,)), delta=0.0), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3,)), cpu((3,)), weight=cpu((2,))), ValueError)


def huber_weighted(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for reduction in REDUCTIONS:
        yield SampleInput(
            make((3, 4), dtype, device),
            make((3, 4), dtype, device),
            weight=make((3, 4), dtype, device, low=0, high=1),
            reduction=reduction,
        )


PROBABILITIES = {"low": 0.05, "high": 0.95}
UNIT = {"low": 0.0, "high": 1.0}


def bce_weighted(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for reduction in REDUCTIONS:
        for weight_shape in ((3, 4), (4,)):
            yield SampleInput(
                make((3, 4), dtype, device, **PROBABILITIES),
                make((3, 4), dtype, device, **UNIT),
                weight=make(weight_shape, dtype, device, **UNIT),
                reduction=reduction,
            )


def bce_edges(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Probabilities of exactly 0 and 1, where eager's logs are clamped at -100."""
    p = torch.tensor([0.0, 1.0, 0.5, 1e-30], dtype=dtype, device=device)
    yield SampleInput(p, torch.tensor([0.0, 1.0, 1.0, 0.5], dtype=dtype, device=device), reduction="none")


def bce_saturated(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Probabilities of exactly 0 and 1 (a saturated sigmoid): eager's gradient is still finite."""
    p = torch.tensor([0.0, 1.0, 0.5, 1e-30, 1.0, 0.0], dtype=dtype, device=device)
    t = torch.tensor([0.0, 1.0, 1.0, 0.5, 0.3, 0.5], dtype=dtype, device=device)
    for reduction in REDUCTIONS:
        yield SampleInput(p, target=t, reduction=reduction)
    yield SampleInput(p, target=t, weight=torch.linspace(0.5, 1.0, 6, dtype=dtype, device=device))


def bce_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((4,))), ValueError)
    yield ErrorInput(SampleInput(cpu((3,)), cpu((3,), torch.float64)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3,)), cpu((3,)), reduction="bogus"), ValueError)


def bce_logits_weighted(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def x(*shape, **domain):
        return make(shape, dtype, device, **domain)

    for reduction in REDUCTIONS:
        yield SampleInput(
            x(3, 4), x(3, 4, **UNIT), weight=x(4, **UNIT), pos_weight=x(4, low=0.5, high=2), reduction=reduction
        )
    yield SampleInput(x(3, 4), x(3, 4, **UNIT), pos_weight=x(3, 4, low=0.5, high=2))
    yield SampleInput(x(), x(**UNIT), weight=x(**UNIT))


def bce_logits_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((4,))), ValueError)
    yield ErrorInput(SampleInput(cpu((3,)), torch.ones(3, dtype=torch.int64)), RuntimeError)


def kl_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def x(*shape, **domain):
        return make(shape, dtype, device, **domain)

    for log_target in (False, True):
        for reduction in ("mean", "sum", "none", "batchmean"):
            target = x(3, 4, low=-2, high=0) if log_target else x(3, 4, **UNIT)
            yield SampleInput(x(3, 4, high=0), target, reduction=reduction, log_target=log_target)
    yield SampleInput(x(high=0), x(**UNIT), reduction="batchmean")
    yield SampleInput(x(0, 3), x(0, 3, **UNIT), reduction="sum")
    target = x(3, 4, **UNIT)
    target[0, :2] = 0.0  # xlogy(0, 0) = 0
    yield SampleInput(x(3, 4), target, reduction="none")
    yield SampleInput(x(3, 4), x(3, 4, **UNIT), size_average=False)


def poisson_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def x(*shape, **domain):
        return make(shape, dtype, device, **domain)

    for reduction in REDUCTIONS:
        yield SampleInput(x(3, 4), x(3, 4, low=0, high=4), reduction=reduction)
    yield SampleInput(x(3, 4, low=0.1, high=3), x(3, 4, low=0, high=4), log_input=False)
    yield SampleInput(x(3, 4), x(3, 4, low=1.5, high=6), full=True)
    yield SampleInput(x(3, 4, low=0.1, high=3), x(3, 4, low=0.5, high=6), log_input=False, full=True, eps=1e-3)
    yield SampleInput(x(), x(low=0, high=3))


def gaussian_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def x(*shape, **domain):
        return make(shape, dtype, device, **domain)

    positive = {"low": 0.1, "high": 2}
    for reduction in REDUCTIONS:
        yield SampleInput(x(3, 4), x(3, 4), x(3, 4, **positive), reduction=reduction)
    yield SampleInput(x(3, 4), x(3, 4), x(3, **positive), full=True)
    yield SampleInput(x(3, 4), x(3, 4), x(3, 1, **positive))
    yield SampleInput(x(3, 4), x(3, 4), 0.5)
    var = x(3, 4, **positive)
    var[0] = 1e-9  # clamped to eps; its gradient still flows
    yield SampleInput(x(3, 4), x(3, 4), var, eps=1e-3)


def gaussian_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((3, 4)), -1.0), ValueError)
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((3, 4)), cpu((2,))), ValueError)
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((3, 4)), cpu((3, 4)).abs(), reduction="bogus"), ValueError)


def signs(shape, dtype, device):
    return torch.where(torch.rand(shape, device=device) > 0.5, 1.0, -1.0).to(dtype)


def margin_ranking_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for reduction in REDUCTIONS:
        yield SampleInput(
            make((5,), dtype, device),
            make((5,), dtype, device),
            signs((5,), dtype, device),
            margin=0.3,
            reduction=reduction,
        )
    yield SampleInput(make((3, 4), dtype, device), make((3, 4), dtype, device), signs((3, 4), dtype, device))
    yield SampleInput(make((), dtype, device), make((), dtype, device), signs((), dtype, device))


def margin_ranking_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((3, 4)), cpu((4,))), RuntimeError)


def hinge_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for reduction in REDUCTIONS:
        yield SampleInput(make((3, 4), dtype, device), signs((3, 4), dtype, device), reduction=reduction)
    yield SampleInput(make((3, 4), dtype, device), signs((4,), dtype, device), margin=0.5)
    yield SampleInput(make((), dtype, device), signs((), dtype, device))
    yield SampleInput(
        make((3,), dtype, device), torch.tensor([1.0, -1.0, 0.0], dtype=dtype, device=device), reduction="none"
    )


def soft_margin_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for reduction in REDUCTIONS:
        yield SampleInput(make((3, 4), dtype, device), signs((3, 4), dtype, device), reduction=reduction)
    yield SampleInput(make((), dtype, device), signs((), dtype, device))
    yield SampleInput(transposed((3, 4), dtype, device), signs((3, 4), dtype, device))


def multilabel_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def labels(*shape):
        return (torch.rand(shape, device=device) > 0.5).to(dtype)

    for reduction in REDUCTIONS:
        yield SampleInput(make((3, 4), dtype, device), labels(3, 4), reduction=reduction)
    yield SampleInput(make((3, 4), dtype, device), labels(3, 4), weight=make((4,), dtype, device, **UNIT))
    yield SampleInput(make((4,), dtype, device), labels(4))
    yield SampleInput(transposed((3, 4), dtype, device), labels(3, 4), reduction="sum")


def cosine_embedding_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for reduction in REDUCTIONS:
        yield SampleInput(
            make((3, 4), dtype, device),
            make((3, 4), dtype, device),
            signs((3,), dtype, device),
            margin=0.2,
            reduction=reduction,
        )
    yield SampleInput(make((4,), dtype, device), make((4,), dtype, device), signs((), dtype, device))
    yield SampleInput(transposed((3, 4), dtype, device), make((3, 4), dtype, device), signs((3,), dtype, device))


def cosine_embedding_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((3, 4)), cpu((3, 1))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((3, 4)), cpu(())), RuntimeError)


def multi_margin_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    target = torch.tensor([0, 3, 2], device=device)
    for reduction in REDUCTIONS:
        yield SampleInput(make((3, 4), dtype, device), target, reduction=reduction)
    yield SampleInput(make((3, 4), dtype, device), target, p=2, margin=0.5)
    yield SampleInput(make((3, 4), dtype, device), target, weight=make((4,), dtype, device, **UNIT))
    yield SampleInput(make((4,), dtype, device), torch.tensor([1], device=device), reduction="none")
    yield SampleInput(make((4,), dtype, device), torch.tensor(2, device=device), reduction="none")


def multilabel_margin_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Class indices before each row's first -1 (repeated, out of order, none in the last row)."""
    target = torch.tensor([[3, 0, -1, 1], [0, 1, 2, 3], [-1, 2, 0, 0]], device=device)
    for reduction in REDUCTIONS:
        yield SampleInput(make((3, 4), dtype, device), target, reduction=reduction)
    yield SampleInput(transposed((3, 4), dtype, device), target, reduction="sum")
    yield SampleInput(make((4,), dtype, device), torch.tensor([2, 2, -1, 0], device=device), reduction="none")
    yield SampleInput(make((), dtype, device), torch.tensor(0, device=device))


def multilabel_margin_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), torch.zeros(2, 4, dtype=torch.long)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), torch.zeros(3, 4, dtype=torch.int32)), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), torch.full((3, 4), 4)), RuntimeError)


def linear_cross_entropy_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Eager's reference path (no options): class indices (some ignored), probabilities, a bias,
    class weights, smoothing, an unbatched input and a K-dimensional weight."""
    target = torch.tensor([0, 3, 1, -100, 2], device=device)
    for reduction in REDUCTIONS:
        yield SampleInput(make((5, 8), dtype, device), make((4, 8), dtype, device), target, reduction=reduction)
    yield SampleInput(
        make((5, 8), dtype, device), make((4, 8), dtype, device), target, linear_bias=make((4,), dtype, device)
    )
    yield SampleInput(
        transposed((5, 8), dtype, device),
        make((4, 8), dtype, device),
        target.clamp(min=0),
        weight=make((4,), dtype, device, **UNIT),
        label_smoothing=0.2,
        ignore_index=1,
    )
    yield SampleInput(make((5, 8), dtype, device), make((4, 8), dtype, device), make((5, 4), dtype, device, **UNIT))
    yield SampleInput(make((8,), dtype, device), make((4, 8), dtype, device), torch.tensor(2, device=device))
    yield SampleInput(
        make((5, 8), dtype, device),
        make((4, 3, 8), dtype, device),
        torch.tensor([[0, 1, 2], [3, 3, 0], [1, 1, 1], [2, 0, 3], [0, 0, 0]], device=device),
        linear_bias=make((4, 3), dtype, device),
    )


def linear_cross_entropy_errors() -> Iterable[ErrorInput]:
    target = torch.tensor([0, 1, 2])
    yield ErrorInput(SampleInput(cpu((3, 8)), cpu((4, 7)), target), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 3, 8)), cpu((4, 8)), target), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 8)), cpu((4, 8)), target, linear_bias=cpu((3,))), RuntimeError)


def multi_margin_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), torch.tensor([0, 1, 2]), p=3), ValueError)
    yield ErrorInput(SampleInput(cpu((3, 4)), torch.tensor([0, 1])), RuntimeError)


def triplet_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def x(*shape):
        return make(shape, dtype, device)

    for reduction in REDUCTIONS:
        yield SampleInput(x(3, 4), x(3, 4), x(3, 4), reduction=reduction)
    yield SampleInput(x(3, 4), x(3, 4), x(3, 4), swap=True, margin=0.5)
    yield SampleInput(x(3, 4), x(3, 4), x(3, 4), p=1)
    yield SampleInput(x(3, 4), x(3, 4), x(3, 4), p=3.0)
    yield SampleInput(x(4), x(4), x(4))


def triplet_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((3, 4)), cpu((4,))), RuntimeError)


def triplet_distance_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def x(*shape):
        return make(shape, dtype, device)

    for reduction in REDUCTIONS:
        yield SampleInput(x(3, 4), x(3, 4), x(3, 4), reduction=reduction)
    yield SampleInput(x(3, 4), x(3, 4), x(3, 4), swap=True, margin=0.5)
    yield SampleInput(x(4), x(4), x(4))
    # A user's distance function: one eager call, gradients through torch.autograd.
    yield SampleInput(x(3, 4), x(3, 4), x(3, 4), distance_function=l1_distance)


def l1_distance(x, y):
    return (x - y).abs().sum(-1)


def triplet_distance_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((3, 4)), cpu((4,))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((3, 4)), cpu((3, 4)), margin=0.0), ValueError)
    yield ErrorInput(SampleInput(cpu((3, 4)), cpu((3, 4)), cpu((3, 4)), reduction="bogus"), ValueError)


def distance_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def x(*shape):
        return make(shape, dtype, device)

    for p in (2.0, 1.0, 3.0, 0.0, float("inf")):
        yield SampleInput(x(3, 4), x(3, 4), p=p)
    yield SampleInput(x(3, 4), x(4), keepdim=True)
    yield SampleInput(x(2, 3, 4), x(3, 4))
    yield SampleInput(x(4), x(4))
    yield SampleInput(transposed((3, 4), dtype, device), x(3, 4), eps=0.0)
    yield SampleInput(x(0, 4), x(0, 4))


def cosine_similarity_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def x(*shape):
        return make(shape, dtype, device)

    yield SampleInput(x(3, 4), x(3, 4))
    yield SampleInput(x(3, 4), x(4), dim=-1)
    yield SampleInput(x(2, 3, 4), x(3, 4), dim=0)
    yield SampleInput(x(3, 4), torch.zeros(3, 4, dtype=dtype, device=device), dim=1)
    yield SampleInput(transposed((3, 4), dtype, device), x(3, 4), eps=1e-3)
    yield SampleInput(x(4), x(4), dim=0)


def cosine_similarity_errors() -> Iterable[ErrorInput]:
    ints = cpu((3, 4), torch.int64)
    yield ErrorInput(SampleInput(ints, ints), RuntimeError)


def normalize_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def x(*shape):
        return make(shape, dtype, device)

    yield SampleInput(x(3, 4))
    yield SampleInput(x(3, 4), p=1.0, dim=0)
    yield SampleInput(x(3, 4), p=3.0, dim=-1)
    yield SampleInput(x(2, 3, 4), p=float("inf"))
    zero_row = x(3, 4)
    zero_row[1] = 0.0
    yield SampleInput(zero_row, dim=1)
    yield SampleInput(transposed((3, 4), dtype, device))
    yield SampleInput(x(0, 4))


def normalize_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 4), torch.int64)), NotImplementedError)


def cdist_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    def x(*shape):
        return make(shape, dtype, device)

    for p in (2.0, 1.0, 3.0, 0.0, float("inf")):
        yield SampleInput(x(3, 4), x(5, 4), p=p)
    yield SampleInput(x(30, 3), x(5, 3))  # more than 25 rows: eager's matmul form
    yield SampleInput(x(3, 3), x(5, 3), compute_mode="use_mm_for_euclid_dist")
    yield SampleInput(x(30, 3), x(5, 3), compute_mode="donot_use_mm_for_euclid_dist")
    yield SampleInput(x(2, 3, 4), x(5, 4))
    yield SampleInput(x(2, 1, 3, 4), x(4, 5, 4), p=1.0)
    yield SampleInput(transposed((3, 4), dtype, device), x(2, 4))
    yield SampleInput(x(0, 4), x(2, 4))


def cdist_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), cpu((3, 3))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 2)), cpu((3, 4))), RuntimeError)
    yield ErrorInput(SampleInput(cpu((3, 2)), cpu((3, 2)), p=-1.0), RuntimeError)


def loss(name: str, op, samples, errors=None, **kw) -> OpInfo:
    return OpInfo(name, op, samples, errors or (lambda: ()), FLOATS, tolerances=LOSS_TOLERANCE, **kw)


def x34():
    return cpu((3, 4))


def pdist_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Rows of every norm order (p = 0 counts differing coordinates), repeated rows (distance 0,
    where the 2-norm's gradient is zero), one row, and a non-contiguous input."""
    for p in (2, 1, 0, 3.5, math.inf):
        yield SampleInput(make((5, 3), dtype, device), p)
    repeated = make((3, 4), dtype, device)
    yield SampleInput(torch.cat([repeated, repeated[:1]]), 2)
    yield SampleInput(make((1, 3), dtype, device))  # (eager's backward of no rows crashes: left out)
    yield SampleInput(transposed((4, 6), dtype, device), 2)


def pdist_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((4,))), RuntimeError, "2D")
    yield ErrorInput(SampleInput(cpu((4, 3)), -1), RuntimeError, "non-negative")


def ctc_loss_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Batched sequences with lengths as tensors or lists, padded and concatenated targets, every
    reduction, another blank, zero_infinity with an impossible alignment, and one unbatched."""
    frames, batch, classes, longest = 12, 3, 5, 4
    log_probs = make((frames, batch, classes), dtype, device).log_softmax(2)
    g = torch.Generator().manual_seed(0)
    targets = torch.randint(1, classes, (batch, longest), generator=g).to(device)
    input_lengths = torch.tensor([12, 10, 7], device=device)
    target_lengths = torch.tensor([4, 2, 3], device=device)
    for reduction in ("mean", "sum", "none"):
        yield SampleInput(log_probs, targets, input_lengths, target_lengths, reduction=reduction)
    flat = torch.cat([targets[i, :n] for i, n in enumerate(target_lengths.tolist())])
    yield SampleInput(log_probs, flat, [12, 10, 7], [4, 2, 3])
    yield SampleInput(log_probs, targets.clamp(max=classes - 2), input_lengths, target_lengths, blank=classes - 1)
    yield SampleInput(
        log_probs,
        targets,
        torch.tensor([2, 10, 7], device=device),
        target_lengths,
        reduction="none",
        zero_infinity=True,
    )
    yield SampleInput(log_probs[:, 0], targets[0], torch.tensor(12, device=device), torch.tensor(4, device=device))


def ctc_loss_errors() -> Iterable[ErrorInput]:
    log_probs = cpu((6, 2, 4)).log_softmax(2)
    targets, lengths = torch.ones(2, 3, dtype=torch.long), torch.tensor([6, 6])
    yield ErrorInput(
        SampleInput(log_probs, targets, lengths, torch.tensor([3, 3]), reduction="bogus"), ValueError, "reduction"
    )


OPS = [
    OpInfo("ctc_loss", F.ctc_loss, ctc_loss_samples, ctc_loss_errors, FLOATS, tolerances=ACCUMULATING),
    OpInfo("pdist", torch.pdist, pdist_samples, pdist_errors, tolerances=ACCUMULATING),
    loss("l1_loss", F.l1_loss, pair_samples, chain_errors(l1_errors, bad_reduction(x34, x34))),
    loss("l1_loss", F.l1_loss, legacy_flags, variant="legacy"),
    loss("smooth_l1_loss", F.smooth_l1_loss, pair_samples, smooth_l1_errors),
    loss("smooth_l1_loss", F.smooth_l1_loss, partial(pair_samples, beta=0.5), variant="beta"),
    loss("smooth_l1_loss", F.smooth_l1_loss, partial(pair_samples, beta=0.0), variant="beta0"),
    loss("huber_loss", F.huber_loss, pair_samples, huber_errors),
    loss("huber_loss", F.huber_loss, partial(pair_samples, delta=0.4), variant="delta"),
    loss("huber_loss", F.huber_loss, huber_weighted, variant="weight"),
    loss(
        "binary_cross_entropy", F.binary_cross_entropy, partial(pair_samples, lhs=PROBABILITIES, rhs=UNIT), bce_errors
    ),
    loss("binary_cross_entropy", F.binary_cross_entropy, bce_weighted, variant="weight", nondifferentiable=("weight",)),
    loss("binary_cross_entropy", F.binary_cross_entropy, bce_edges, variant="edges", supports_grad=False),
    loss(
        "binary_cross_entropy",
        F.binary_cross_entropy,
        bce_saturated,
        variant="saturated",
        nondifferentiable=("target", "weight"),
    ),
    loss(
        "binary_cross_entropy_with_logits",
        F.binary_cross_entropy_with_logits,
        partial(pair_samples, rhs=UNIT),
        bce_logits_errors,
    ),
    loss("binary_cross_entropy_with_logits", F.binary_cross_entropy_with_logits, bce_logits_weighted, variant="weight"),
    loss("kl_div", F.kl_div, kl_samples, bad_reduction(x34, x34)),
    loss("poisson_nll_loss", F.poisson_nll_loss, poisson_samples, bad_reduction(x34, x34)),
    loss("gaussian_nll_loss", F.gaussian_nll_loss, gaussian_samples, gaussian_errors),
    loss("margin_ranking_loss", F.margin_ranking_loss, margin_ranking_samples, margin_ranking_errors),
    loss("hinge_embedding_loss", F.hinge_embedding_loss, hinge_samples),
    loss("soft_margin_loss", F.soft_margin_loss, soft_margin_samples),
    loss("multilabel_soft_margin_loss", F.multilabel_soft_margin_loss, multilabel_samples),
    loss("cosine_embedding_loss", F.cosine_embedding_loss, cosine_embedding_samples, cosine_embedding_errors),
    loss("multi_margin_loss", F.multi_margin_loss, multi_margin_samples, multi_margin_errors),
    loss("multilabel_margin_loss", F.multilabel_margin_loss, multilabel_margin_samples, multilabel_margin_errors),
    loss("linear_cross_entropy", F.linear_cross_entropy, linear_cross_entropy_samples, linear_cross_entropy_errors),
    loss("triplet_margin_loss", F.triplet_margin_loss, triplet_samples, triplet_errors),
    loss(
        "triplet_margin_with_distance_loss",
        F.triplet_margin_with_distance_loss,
        triplet_distance_samples,
        triplet_distance_errors,
    ),
    loss("pairwise_distance", F.pairwise_distance, distance_samples),
    loss("cosine_similarity", F.cosine_similarity, cosine_similarity_samples, cosine_similarity_errors),
    loss("normalize", F.normalize, normalize_samples, normalize_errors),
    loss("cdist", torch.cdist, cdist_samples, cdist_errors),
]
