"""Creation and conversion ops: arange, zeros, ones, full, empty, the *_like and Tensor.new_* ops, tril,
triu, to, type_as, type, cpu and the conversion methods.

Creation ops take no tensor: their samples pass sizes, fill values, `dtype` and `device`. Samples that
leave the dtype to inference are listed once, under float32 (the default dtype).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

import torch

from .core import (
    ALL,
    NUMERIC,
    ErrorInput,
    OpInfo,
    SampleInput,
    Strided,
    Transposed,
    cases,
    cpu,
    make,
    transposed,
    with_kwargs,
)
from .elementwise import unary_samples

# Conversions of NaN or infinity to integers differ between platforms, so they are not sampled.
FINITE = partial(unary_samples, extremal_values=False)


def arange_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    if dtype == torch.get_default_dtype():
        # Integer arguments give int64, any float argument the default dtype.
        for args in ((5,), (2, 7), (0,), (5, 0, -1), (0, 1, 0.25), (1, 2.5), (-0.5, 0.5, 0.3)):
            yield SampleInput(*args, device=device)
    for args in ((5,), (1, 8, 3)):
        yield SampleInput(*args, dtype=dtype, device=device)


def arange_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(0, 5, 0), RuntimeError)
    yield ErrorInput(SampleInput(0, 5, -1), RuntimeError)  # the step walks away from the end


def filled_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Sizes as a tuple, as varargs, 0-dim and empty, for zeros and ones."""
    if dtype == torch.get_default_dtype():
        yield SampleInput((2, 3), device=device)
    for sizes in (((3, 4),), (3, 4), ((),), ((0, 3),)):
        yield SampleInput(*sizes, dtype=dtype, device=device)


def full_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    # Without a dtype, full takes the dtype of its fill value.
    inferred = {torch.float32: 1.5, torch.int64: 7, torch.bool: True}
    if dtype in inferred:
        yield SampleInput((2, 3), inferred[dtype], device=device)
    for size in ((2, 3), (), (0, 2)):
        yield SampleInput(size, 2, dtype=dtype, device=device)
    yield SampleInput((2, 3), 2.5, dtype=dtype, device=device)  # cast to the dtype, truncating


def negative_size_errors(*args) -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput((-1, 3), *args), RuntimeError)


# empty's values are unspecified: the samples write over them (fill_), which keeps the result's
# shape, dtype and device under test.
def _empty_filled(*sizes, **kwargs):
    return torch.empty(*sizes, **kwargs).fill_(2)


def _empty_like_filled(a, **kwargs):
    return torch.empty_like(a, **kwargs).fill_(2)


def _empty_strided_filled(size, stride, **kwargs):
    return torch.empty_strided(size, stride, **kwargs).fill_(2)


def strided_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """Sizes and strides: contiguous, transposed, every other element, 0-dim, empty."""
    for size, stride in (((2, 3), (3, 1)), ((2, 3), (1, 2)), ((4, 3), (8, 2)), ((), ()), ((0, 2), (2, 1))):
        yield SampleInput(size, stride, dtype=dtype, device=device)


def strided_errors(*args) -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput((2, 3), (1,)), RuntimeError, "dimensionality")


def _new_empty_strided_filled(a, size, stride, **kwargs):
    return a.new_empty_strided(size, stride, **kwargs).fill_(2)


def new_strided_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """``strided_samples``' sizes and strides, dtype and device ``a``'s (or a given dtype)."""
    a = torch.zeros(3, dtype=dtype, device=device)
    for sample in strided_samples(dtype, device):
        yield SampleInput(a, *sample.args)
    yield SampleInput(a, (2, 3), (1, 2), dtype=torch.float64)


def new_strided_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(torch.zeros(3), (2, 3), (1,)), RuntimeError, "dimensionality")


def _new_empty_filled(a, *sizes, **kwargs):
    return a.new_empty(*sizes, **kwargs).fill_(2)


def new_samples(dtype: torch.dtype, device: str, *fill) -> Iterable[SampleInput]:
    """``a.new_*(size, *fill)``: dtype and device default to ``a``'s; sizes as a tuple, empty, 0-dim,
    and with another dtype."""
    a = make((3,), dtype, device)
    yield SampleInput(a, (2, 3), *fill)
    yield SampleInput(a, (), *fill)
    yield SampleInput(a, (0, 3), *fill)
    yield SampleInput(transposed((3, 4), dtype, device), [4], *fill)
    yield SampleInput(a, (2, 2), *fill, dtype=torch.float64)
    yield SampleInput(a, torch.Size([2, 1]), *fill, device=device)


def new_vararg_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """new_zeros/new_ones/new_empty also take the sizes as varargs."""
    yield from new_samples(dtype, device)
    yield SampleInput(make((3,), dtype, device), 2, 3)
    yield SampleInput(make((3,), dtype, device), 4, dtype=torch.int64)


def new_full_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    yield from new_samples(dtype, device, 2)
    yield SampleInput(make((3,), dtype, device), (2, 3), 2.5)  # cast to a's dtype, truncating
    yield SampleInput(make((3,), dtype, device), (2, 3), True)


def new_size_errors(*fill):
    def errors() -> Iterable[ErrorInput]:
        yield ErrorInput(SampleInput(cpu((3,)), (-1, 3), *fill), RuntimeError)

    return errors


def _zeros_in_fn(a):
    return a + torch.zeros(a.shape[-1:], dtype=a.dtype, device=a.device)


def _arange_in_fn(a):
    return a * torch.arange(a.numel(), device=a.device).reshape(a.shape)


def _full_like(a):
    return torch.full_like(a, 2.5)


TRIANGLES = cases(
    ((3, 4),),
    ((3, 4), 1),
    ((4, 3), -1),
    ((2, 3, 4), 2),
    ((3, 3), 5),
    ((3, 3), -5),
    ((0, 3),),
    (Transposed((3, 4)), 1),
    (Strided((2, 3, 4)), -1),
)


def triangle_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,))), RuntimeError)


def to_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    x = make((3, 4), dtype, device)
    for target in (*ALL, torch.int32):
        yield SampleInput(x, target)
    yield SampleInput(make((), dtype, device), torch.float64)
    yield SampleInput(make((0, 3), dtype, device), torch.int64)
    yield SampleInput(transposed((3, 4), dtype, device), torch.float64)
    yield SampleInput(x, make((2,), torch.float64, device))
    yield SampleInput(x, device)
    yield SampleInput(x, device, torch.float64)
    yield SampleInput(x, dtype=torch.int64, copy=True)


def to_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), "float"), RuntimeError)  # a dtype name is not a device


def _to_by_methods(a):
    return a.float(), a.double(), a.long(), a.int(), a.bool()


def _to_narrow_by_methods(a):
    return a.half(), a.bfloat16(), a.char(), a.short()


def _to_complex_by_methods(a):
    return a.cfloat(), a.cdouble()


def _to_byte(a):
    return a.byte()


def type_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """``Tensor.type``: the type name (no dtype), a dtype, or a legacy type name."""
    x = make((3, 4), dtype, device)
    yield SampleInput(x)
    for target in (torch.float64, torch.int32, torch.bool, dtype):
        yield SampleInput(x, target)
    yield SampleInput(x, "torch.DoubleTensor")
    yield SampleInput(transposed((3, 4), dtype, device), "torch.IntTensor")
    yield SampleInput(make((), dtype, device), dtype=torch.float32)
    yield SampleInput(make((0, 2), dtype, device), torch.int64)


def type_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), "torch.NoSuchTensor"), ValueError)


def type_as_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    for target in ALL:
        yield SampleInput(make((3, 4), dtype, device), make((2,), target, device))
    yield SampleInput(transposed((3, 4), dtype, device), make((), torch.float64, device))


def cpu_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """``Tensor.cpu()``: the tensor itself on the CPU (a copy in the layout asked for, if another)."""
    yield SampleInput(make((3, 4), dtype, device))
    yield SampleInput(transposed((3, 4), dtype, device))
    yield SampleInput(transposed((3, 4), dtype, device), memory_format=torch.contiguous_format)
    yield SampleInput(make((2, 3, 4, 4), dtype, device), memory_format=torch.channels_last)


def cuda_samples(dtype: torch.dtype, device: str) -> Iterable[SampleInput]:
    """``Tensor.cuda()`` of a tensor on the CUDA device: itself, or a copy in the layout asked for.
    None on the CPU, where the move needs a GPU (test_cuda_devices.py moves fake CUDA tensors)."""
    if device != "cuda":
        return
    yield SampleInput(make((3, 4), dtype, device))
    yield SampleInput(transposed((3, 4), dtype, device), 0, non_blocking=True)
    yield SampleInput(make((2, 3, 4, 4), dtype, device), memory_format=torch.channels_last)


def cuda_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu((3,)), "cpu"), RuntimeError, "Invalid device, must be cuda device")


OPS = [
    OpInfo("arange", torch.arange, arange_samples, arange_errors, NUMERIC, supports_grad=False),
    OpInfo("arange", _arange_in_fn, FINITE, dtypes=ALL, variant="in_fn"),
    OpInfo("zeros", torch.zeros, filled_samples, negative_size_errors, ALL, supports_grad=False),
    OpInfo("zeros", _zeros_in_fn, FINITE, dtypes=ALL, variant="in_fn"),
    OpInfo("ones", torch.ones, filled_samples, negative_size_errors, ALL, supports_grad=False),
    OpInfo("full", torch.full, full_samples, partial(negative_size_errors, 1.0), ALL, supports_grad=False),
    OpInfo("empty", _empty_filled, filled_samples, negative_size_errors, ALL, supports_grad=False),
    OpInfo("empty_strided", _empty_strided_filled, strided_samples, strided_errors, ALL, supports_grad=False),
    OpInfo("zeros_like", torch.zeros_like, FINITE, dtypes=ALL),
    OpInfo("ones_like", torch.ones_like, with_kwargs(FINITE, dtype=torch.float64), dtypes=ALL),
    OpInfo("full_like", _full_like, FINITE, dtypes=ALL),
    OpInfo("empty_like", _empty_like_filled, FINITE, dtypes=ALL),
    OpInfo("empty_like", _empty_like_filled, with_kwargs(FINITE, dtype=torch.int64), dtypes=ALL, variant="dtype"),
    OpInfo("new_zeros", torch.Tensor.new_zeros, new_vararg_samples, new_size_errors(), ALL, supports_grad=False),
    OpInfo("new_ones", torch.Tensor.new_ones, new_vararg_samples, new_size_errors(), ALL, supports_grad=False),
    OpInfo("new_empty", _new_empty_filled, new_vararg_samples, new_size_errors(), ALL, supports_grad=False),
    OpInfo(
        "new_empty_strided",
        _new_empty_strided_filled,
        new_strided_samples,
        new_strided_errors,
        ALL,
        supports_grad=False,
    ),
    OpInfo("new_full", torch.Tensor.new_full, new_full_samples, new_size_errors(1), ALL, supports_grad=False),
    OpInfo("tril", torch.tril, TRIANGLES, triangle_errors, ALL),
    OpInfo("triu", torch.triu, TRIANGLES, triangle_errors, ALL),
    OpInfo("to", torch.Tensor.to, to_samples, to_errors, ALL),
    OpInfo("to", _to_by_methods, FINITE, dtypes=ALL, variant="methods"),
    OpInfo("to", _to_narrow_by_methods, FINITE, dtypes=ALL, variant="narrow_methods"),
    # Negative floats have no uint8 value (C leaves the conversion undefined).
    OpInfo("to", _to_byte, partial(FINITE, low=0), dtypes=ALL, variant="byte"),
    OpInfo("to", _to_complex_by_methods, FINITE, dtypes=ALL, variant="complex_methods"),
    OpInfo("type", torch.Tensor.type, type_samples, type_errors, ALL),
    OpInfo("type_as", torch.Tensor.type_as, type_as_samples, dtypes=ALL),
    OpInfo("cpu", torch.Tensor.cpu, cpu_samples, dtypes=ALL),
    OpInfo("cuda", torch.Tensor.cuda, cuda_samples, cuda_errors, ALL),
]
