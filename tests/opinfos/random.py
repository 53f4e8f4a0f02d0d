"""Random ops: samplers, channel-wise and alpha dropout, rrelu, the in-place samplers.

Each op runs seeded inside the call (as PyTorch's own OpInfos for random ops do), so eager and the
compiled program draw from the same generator state and must give the same numbers and gradients.
Consecutive calls, ``generator=`` and the gradients are covered further by ``tests/test_random.py``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

from .core import ErrorInput, OpInfo, SampleInput, Strided, Transposed, cpu, make, tensor


def seeded(fn):
    """``fn`` drawing from the default generator seeded at the start of each call. (``generator=``
    arguments are tested in ``tests/test_random.py``: a compiled program may not reseed one.)"""

    def call(*args, **kwargs):
        torch.manual_seed(0)
        return fn(*args, **kwargs)

    call.__name__ = call.__qualname__ = getattr(fn, "__name__", "random_op")
    return call


SHAPES = ((), (0,), (4, 5), Transposed((3, 4)), Strided((3, 4)), (2, 3, 4))


def like_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for spec in SHAPES:
        yield SampleInput(tensor(spec, dtype, device))
    yield SampleInput(make((17,), dtype, device), dtype=torch.float64)


def size_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    yield SampleInput(2, 3, dtype=dtype, device=device)
    yield SampleInput((5, 17), dtype=dtype, device=device)
    yield SampleInput((0, 3), dtype=dtype, device=device)


def randint_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    yield SampleInput(10, (3, 4), device=device)
    yield SampleInput(-5, 5, (7,), dtype=torch.int32, device=device)


def randint_like_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for spec in SHAPES[:4]:
        yield SampleInput(tensor(spec, dtype, device), 7)


def randperm_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    yield SampleInput(0, device=device)
    yield SampleInput(9, device=device)


def normal_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    std = make((5,), dtype, device, low=0.1, high=2.0)
    yield SampleInput(make((4, 5), dtype, device), std)  # broadcasting
    yield SampleInput(tensor(Transposed((3, 4)), dtype, device), 2.0)
    yield SampleInput(1.0, std)
    yield SampleInput(0.5, 2.0, (3, 17), dtype=dtype, device=device)


def probability_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for spec in ((), (0,), (4, 5), Transposed((3, 4)), Strided((3, 4))):
        yield SampleInput(tensor(spec, dtype, device, low=0.0, high=1.0))


def bernoulli_p_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for spec in ((), (4, 5), Transposed((3, 4))):
        yield SampleInput(tensor(spec, dtype, device), 0.3)


def multinomial_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    weights = make((3, 6), dtype, device, low=0.1, high=1.0)
    yield SampleInput(weights, 4)
    yield SampleInput(weights[0], 6)
    yield SampleInput(weights, 10, True)


def feature_samples(ranks: tuple[int, ...]):
    """Inputs of ``ranks`` (batch, channels, spatial dims of 2 or 3), one non-contiguous, and ``p``."""

    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        for rank in ranks:
            shape = (2, 5, 3, 2, 2)[:rank]
            for p in (0.0, 0.3, 1.0):
                yield SampleInput(make(shape, dtype, device), p)
            yield SampleInput(tensor(Transposed(shape), dtype, device), 0.5, training=True)
            yield SampleInput(make(shape, dtype, device), 0.5, training=False)
        yield SampleInput(make((0, 5, 3)[: max(ranks[0], 2)], dtype, device), 0.5)

    return generate


def alpha_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for spec in ((), (4, 5), Transposed((3, 4)), Strided((3, 4))):
        yield SampleInput(tensor(spec, dtype, device), 0.3, True)
    yield SampleInput(make((4, 5), dtype, device), 0.3)  # eval by default
    yield SampleInput(make((4, 5), dtype, device), 1.0, training=True)


def gumbel_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for spec in ((), (4, 6), Transposed((3, 4)), Strided((3, 4))):
        yield SampleInput(tensor(spec, dtype, device), 0.5)
        yield SampleInput(tensor(spec, dtype, device), hard=True)
    yield SampleInput(make((2, 5, 3), dtype, device), 2.0, True, dim=1)


def rrelu_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for spec in ((), (0,), (4, 5), Transposed((3, 4)), Strided((3, 4))):
        yield SampleInput(tensor(spec, dtype, device), training=True)
    yield SampleInput(make((30,), dtype, device), 0.1, 0.6, True)
    yield SampleInput(make((30,), dtype, device), 0.2, 0.2, training=True)
    yield SampleInput(make((30,), dtype, device), 0.1, 0.6)  # eval: the mean slope


def sampler_samples(*params: tuple):
    """``Tensor.<sampler>_`` calls on copies of tensors of several layouts, with ``params``."""

    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        for spec in SHAPES:
            for args in params:
                yield SampleInput(tensor(spec, dtype, device), *args)

    return generate


def dropout_backward_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """The gradient of dropout given its mask (deterministic): bool masks, as eager saves them."""
    for spec in ((), (4, 5), Transposed((3, 4)), Strided((3, 4))):
        grad = tensor(spec, dtype, device)
        mask = make(tuple(grad.shape), torch.bool, device)
        yield SampleInput(grad, mask, 1.0 / 0.7)


def _method_on_copy(name: str):
    method = getattr(torch.Tensor, name)
    return seeded(lambda x, *args, **kwargs: method(x.clone(), *args, **kwargs))


def dropout_errors() -> Iterable[ErrorInput]:
    for p in (1.5, -0.1):
        yield ErrorInput(SampleInput(cpu((2, 3, 4, 2)), p), ValueError)


def feature_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), 0.5, True), RuntimeError)  # fewer than 2 dims
    yield ErrorInput(SampleInput(cpu((2, 3), torch.int64), 0.5, True), RuntimeError)  # no integer noise


def dropout1d_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((2, 3, 4, 5)), 0.5), RuntimeError)
    yield ErrorInput(SampleInput(cpu((2, 3, 4)), 1.5), ValueError)


def multinomial_errors() -> Iterable[ErrorInput]:
    weights = make((3, 4), torch.float32, "cpu", low=0.1, high=1.0)
    yield ErrorInput(SampleInput(weights, 5), RuntimeError)  # more samples than categories, without replacement
    yield ErrorInput(SampleInput(make((2, 3, 4), torch.float32, "cpu", low=0.1, high=1.0), 2), RuntimeError)


def normal_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), -1.0), RuntimeError)


def randint_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(5, 2, (3,)), RuntimeError)


def rand_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(2, 3, dtype=torch.int64), RuntimeError)


def rrelu_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), 0.5, 0.1, True), RuntimeError)


NOGRAD = {"supports_grad": False}

OPS = [
    OpInfo("rand", seeded(torch.rand), size_samples, rand_errors, **NOGRAD),
    OpInfo("randn", seeded(torch.randn), size_samples, **NOGRAD),
    OpInfo("rand_like", seeded(torch.rand_like), like_samples),
    OpInfo("randn_like", seeded(torch.randn_like), like_samples),
    OpInfo("randint", seeded(torch.randint), randint_samples, randint_errors, **NOGRAD),
    OpInfo("randint_like", seeded(torch.randint_like), randint_like_samples, dtypes=(torch.float32, torch.int64)),
    OpInfo("randperm", seeded(torch.randperm), randperm_samples, **NOGRAD),
    OpInfo("normal", seeded(torch.normal), normal_samples, normal_errors),
    OpInfo("bernoulli", seeded(torch.bernoulli), probability_samples),
    OpInfo("bernoulli", seeded(torch.bernoulli), bernoulli_p_samples, variant="p", supports_grad=False),
    OpInfo("poisson", seeded(torch.poisson), probability_samples),
    OpInfo("multinomial", seeded(torch.multinomial), multinomial_samples, multinomial_errors),
    OpInfo("dropout1d", seeded(F.dropout1d), feature_samples((2, 3)), dropout1d_errors),
    OpInfo("dropout2d", seeded(F.dropout2d), feature_samples((4,)), dropout_errors),
    OpInfo("dropout3d", seeded(F.dropout3d), feature_samples((4, 5)), dropout_errors),
    OpInfo("alpha_dropout", seeded(F.alpha_dropout), alpha_samples, dropout_errors),
    OpInfo("feature_alpha_dropout", seeded(F.feature_alpha_dropout), feature_samples((2, 4)), feature_errors),
    OpInfo("rrelu", seeded(F.rrelu), rrelu_samples, rrelu_errors),
    OpInfo("gumbel_softmax", seeded(F.gumbel_softmax), gumbel_samples),
    OpInfo("native_dropout_backward", torch.ops.aten.native_dropout_backward.default, dropout_backward_samples),
    OpInfo("uniform_", _method_on_copy("uniform_"), sampler_samples((), (-2.0, 3.0))),
    OpInfo("normal_", _method_on_copy("normal_"), sampler_samples((), (1.0, 3.0))),
    OpInfo("exponential_", _method_on_copy("exponential_"), sampler_samples((), (2.0,))),
    OpInfo("geometric_", _method_on_copy("geometric_"), sampler_samples((0.3,))),
    OpInfo("cauchy_", _method_on_copy("cauchy_"), sampler_samples((), (0.5, 2.0))),
    OpInfo("log_normal_", _method_on_copy("log_normal_"), sampler_samples((), (0.2, 0.5))),
    OpInfo(
        "random_", _method_on_copy("random_"), sampler_samples((), (7,), (-3, 7)), dtypes=(torch.float32, torch.int64)
    ),
    OpInfo("bernoulli_", _method_on_copy("bernoulli_"), sampler_samples((0.3,))),
]
