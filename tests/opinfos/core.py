"""The OpInfo record, sample and error inputs, and the tensor makers the family tables share.

An OpInfo names one callable (a torch function, a method, an operator or a small lambda) and says how
to call it: `sample_inputs(dtype, device)` yields valid calls, `error_inputs()` yields calls that eager
PyTorch rejects. The reference is always eager PyTorch running the very same callable.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

FLOATS = (torch.float32, torch.float64)
INTS = (torch.int64,)
NUMERIC = FLOATS + INTS
ALL = NUMERIC + (torch.bool,)
INTEGRAL = INTS + (torch.bool,)

# Partner dtypes for mixed-dtype samples: each pairing exercises a different type-promotion rule
# (float widening, int -> float, bool -> int).
PROMOTION_PARTNER = {
    torch.float32: torch.float64,
    torch.float64: torch.float32,
    torch.int64: torch.float32,
    torch.bool: torch.int64,
}

# Values where elementwise definitions disagree most: signed zero, infinities, NaN, and halves
# (round() rounds half to even).
EXTREMAL = (-math.inf, math.inf, math.nan, -0.0, 0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1.0, -1.0, 1e-30)


class Tolerance(NamedTuple):
    rtol: float
    atol: float


# Ops that accumulate (reductions, norms, matmul, losses) may legitimately reassociate sums.
ACCUMULATING = {torch.float32: Tolerance(rtol=1e-5, atol=1e-5)}


class SampleInput:
    """One call of an op: positional and keyword arguments, tensors already on the device."""

    __slots__ = ("args", "kwargs")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs

    def __repr__(self) -> str:
        parts = [describe(a) for a in self.args]
        parts += [f"{k}={describe(v)}" for k, v in self.kwargs.items()]
        return f"SampleInput({', '.join(parts)})"


@dataclass(frozen=True)
class ErrorInput:
    """A call that eager PyTorch rejects with `exc_type`.

    `match` is a case-insensitive regex that thunder_rs's message must contain; None means the op's
    name. Eager messages rarely name the op, so the self-check compares the exception type only.
    """

    sample: SampleInput
    exc_type: type[Exception]
    match: str | None = None


SampleGenerator = Callable[[torch.dtype, str], Iterable[SampleInput]]
ErrorGenerator = Callable[[], Iterable[ErrorInput]]


def no_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    return ()


def no_errors() -> Iterable[ErrorInput]:
    return ()


@dataclass(frozen=True)
class OpInfo:
    """How to test one op: what to call, with which inputs, and how close the result must be."""

    name: str  # the op as thunder_rs errors name it ("add" for `a + b` too)
    op: Callable[..., Any]
    sample_inputs: SampleGenerator = no_samples
    error_inputs: ErrorGenerator = no_errors
    dtypes: tuple[torch.dtype, ...] = FLOATS
    variant: str = ""  # tells apart several entries for one op (`div` with rounding_mode="floor")
    tolerances: Mapping[torch.dtype, Tolerance] = field(default_factory=dict)
    supports_grad: bool = True
    nondifferentiable: tuple[str, ...] = ()  # keyword arguments eager cannot differentiate
    # Samples whose result the decomposition cannot give (the entry says why); the torch
    # executor, which runs the op whole, is still checked on them.
    decomposition_skips: tuple[int, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.name}_{self.variant}" if self.variant else self.name

    def tolerance(self, dtype: torch.dtype) -> dict[str, float]:
        """Keyword arguments for `torch.testing.assert_close`; empty means its defaults."""
        tol = self.tolerances.get(dtype)
        return tol._asdict() if tol else {}


# Tensors.


def make(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: str,
    *,
    low: float | None = None,
    high: float | None = None,
    exclude_zero: bool = False,
    noncontiguous: bool = False,
) -> torch.Tensor:
    """A random tensor; `low`/`high` bound the values of numeric dtypes and are ignored for bool."""
    if dtype == torch.bool:
        low = high = None
    return torch.testing.make_tensor(
        shape,
        dtype=dtype,
        device=device,
        low=low,
        high=high,
        exclude_zero=exclude_zero,
        noncontiguous=noncontiguous,
    )


def transposed(shape: tuple[int, ...], dtype: torch.dtype, device: str, **domain: Any) -> torch.Tensor:
    """A tensor of `shape` whose last two dims are swapped in memory (dense, not contiguous)."""
    stored = (*shape[:-2], shape[-1], shape[-2])
    return make(stored, dtype, device, **domain).mT


def strided(shape: tuple[int, ...], dtype: torch.dtype, device: str, **domain: Any) -> torch.Tensor:
    """A tensor of `shape` that skips every other element of its last dim (not dense)."""
    return make(shape, dtype, device, noncontiguous=True, **domain)


def extremal(dtype: torch.dtype, device: str) -> torch.Tensor:
    return torch.tensor(EXTREMAL, dtype=dtype, device=device)


def cpu(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A CPU tensor for error inputs, where values do not matter."""
    return make(shape, dtype, "cpu")


@dataclass(frozen=True)
class Transposed:
    """In a case table: a tensor of `shape` made by `transposed`."""

    shape: tuple[int, ...]


@dataclass(frozen=True)
class Strided:
    """In a case table: a tensor of `shape` made by `strided`."""

    shape: tuple[int, ...]


TensorSpec = tuple[int, ...] | Transposed | Strided


def tensor(spec: TensorSpec, dtype: torch.dtype, device: str, **domain: Any) -> torch.Tensor:
    """The tensor a case table describes: a plain shape is contiguous."""
    if isinstance(spec, Transposed):
        return transposed(spec.shape, dtype, device, **domain)
    if isinstance(spec, Strided):
        return strided(spec.shape, dtype, device, **domain)
    return make(spec, dtype, device, **domain)


# Building sample and error generators.


def cases(*rows: tuple) -> SampleGenerator:
    """A sample generator from rows of (tensor spec, *args): the tensor, then the other arguments."""

    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        for spec, *args in rows:
            yield SampleInput(tensor(spec, dtype, device), *args)

    return generate


def with_kwargs(samples: SampleGenerator, **kwargs: Any) -> SampleGenerator:
    """The samples of `samples`, each also passing `kwargs`."""

    def generate(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
        for sample in samples(dtype, device):
            yield SampleInput(*sample.args, **sample.kwargs, **kwargs)

    return generate


def chain_samples(*generators: SampleGenerator) -> SampleGenerator:
    """One sample generator that yields the samples of each of `generators` in turn."""
    return lambda dtype, device: (s for generate in generators for s in generate(dtype, device))


def chain_errors(*generators: ErrorGenerator) -> ErrorGenerator:
    """One error generator that yields the errors of each of `generators` in turn."""
    return lambda: (error for generate in generators for error in generate())


def describe(value: Any) -> str:
    """A short description of an argument for failure messages: `float32[3, 4] noncontiguous`."""
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        text = f"{dtype}{list(value.shape)}"
        return text if value.is_contiguous() else f"{text} noncontiguous"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(describe(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    return repr(value)
