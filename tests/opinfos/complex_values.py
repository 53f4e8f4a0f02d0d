"""Complex values from real ones and back: ``polar``, ``complex``, ``view_as_complex``,
``view_as_real``, and complex ``mul`` between them as rotary embeddings compute it. Gradients
flow from real inputs through complex values to real or complex outputs (eager's convention)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .core import ErrorInput, OpInfo, SampleInput, Transposed, cpu, make, tensor


def parts_samples(dtype, device) -> Iterable[SampleInput]:
    """Two real tensors: equal shapes, broadcast ones, a transposed one, zeros, an empty pair."""
    yield SampleInput(make((3, 4), dtype, device), make((3, 4), dtype, device))
    yield SampleInput(make((3, 1), dtype, device, low=0.0), make((4,), dtype, device))
    yield SampleInput(tensor(Transposed((4, 3)), dtype, device), make((4, 3), dtype, device))
    yield SampleInput(torch.zeros(2, 3, dtype=dtype, device=device), make((2, 3), dtype, device))
    yield SampleInput(make((0, 3), dtype, device), make((0, 3), dtype, device))


def parts_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), cpu((3,), torch.float64)), RuntimeError, "scalar type")
    yield ErrorInput(SampleInput(cpu((3,), torch.int64), cpu((3,), torch.int64)), NotImplementedError, "Float")
    yield ErrorInput(SampleInput(cpu((3,), torch.bfloat16), cpu((3,), torch.bfloat16)), NotImplementedError, "Half")
    yield ErrorInput(SampleInput(cpu((2, 3)), cpu((4,))), RuntimeError, "broadcast|shape")


def _permuted(dtype, device) -> torch.Tensor:
    """A (3, 4, 2) tensor whose first two dims are swapped in memory: even strides, last one 1."""
    return make((4, 3, 2), dtype, device).permute(1, 0, 2)


def as_complex_samples(dtype, device) -> Iterable[SampleInput]:
    yield SampleInput(make((3, 2), dtype, device))
    yield SampleInput(make((2, 3, 4, 2), dtype, device))
    yield SampleInput(make((2,), dtype, device))
    yield SampleInput(_permuted(dtype, device))
    yield SampleInput(make((8, 2), dtype, device)[2:6])
    yield SampleInput(make((0, 2), dtype, device))


def as_complex_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3, 3))), RuntimeError, "last dimension of size 2")
    yield ErrorInput(SampleInput(cpu(())), RuntimeError, "one or more dimensions")
    yield ErrorInput(SampleInput(cpu((3, 2), torch.int64)), NotImplementedError, "half, float and double")
    yield ErrorInput(SampleInput(cpu((2, 3)).mT), RuntimeError, "stride 1")
    yield ErrorInput(SampleInput(cpu((3, 3))[:, 1:]), RuntimeError, "stride divisible by 2")
    yield ErrorInput(SampleInput(cpu((8,))[1:7].view(3, 2)), RuntimeError, "storage_offset")


def as_real_samples(dtype, device) -> Iterable[SampleInput]:
    complex_dtype = torch.complex64 if dtype == torch.float32 else torch.complex128
    yield SampleInput(torch.randn(3, 4, dtype=complex_dtype, device=device))
    yield SampleInput(torch.randn(4, 3, dtype=complex_dtype, device=device).mT)
    yield SampleInput(torch.randn(0, 3, dtype=complex_dtype, device=device))


def as_real_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,))), TypeError, "complex")


def as_real_of(real, imag):
    """``view_as_real`` of a complex tensor built from real ones (real inputs: gradients flow)."""
    return torch.view_as_real(torch.complex(real, imag))


def complex_mul(x, y):
    """Two real (..., 2) tensors multiplied as complex numbers, read back as real pairs."""
    return torch.view_as_real(torch.view_as_complex(x) * torch.view_as_complex(y))


def rotary(x, angles):
    """Meta's Llama rotary embedding: ``x`` (B, S, H, D) rotated by ``polar(1, angles)`` (S, D/2)."""
    freqs_cis = torch.polar(torch.ones_like(angles), angles)
    x_ = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, x_.shape[1], 1, x_.shape[-1])
    return torch.view_as_real(x_ * freqs_cis).flatten(3).type_as(x)


def _pairs(*shapes):
    def generate(dtype, device) -> Iterable[SampleInput]:
        for a, b in shapes:
            yield SampleInput(make(a, dtype, device), make(b, dtype, device))

    return generate


MUL_SAMPLES = _pairs(((3, 4, 2), (3, 4, 2)), ((2, 3, 2), (3, 2)), ((5, 2), (1, 2)))
ROTARY_SAMPLES = _pairs(((2, 5, 3, 8), (5, 4)), ((1, 4, 2, 4), (4, 2)))

OPS = [
    OpInfo("polar", torch.polar, parts_samples, parts_errors),
    OpInfo("complex", torch.complex, parts_samples, parts_errors),
    OpInfo("view_as_complex", torch.view_as_complex, as_complex_samples, as_complex_errors),
    OpInfo("view_as_real", torch.view_as_real, as_real_samples, as_real_errors, supports_grad=False),
    OpInfo("view_as_real", as_real_of, parts_samples, variant="of_parts"),
    OpInfo("mul", complex_mul, MUL_SAMPLES, variant="complex"),
    OpInfo("rotary", rotary, ROTARY_SAMPLES),
]
