"""Dtype codes shared with Rust, and torch's type-promotion rules for the decompositions."""

import functools
import warnings
from typing import cast

import torch

from thunder_rs import _core

#: torch dtypes indexed by the code Rust uses.
DTYPES: list[torch.dtype] = [getattr(torch, name) for name in _core.dtype_names()]
CODES: dict[torch.dtype, int] = {d: i for i, d in enumerate(DTYPES)}

_FLOAT = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_COMPLEX = (torch.complex64, torch.complex128)
_INT = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def is_float(d: torch.dtype) -> bool:
    return d in _FLOAT


def is_complex(d: torch.dtype) -> bool:
    return d in _COMPLEX


def is_inexact(d: torch.dtype) -> bool:
    return d in _FLOAT or d in _COMPLEX


def is_int(d: torch.dtype) -> bool:
    return d in _INT


# Categories ordered as torch orders them: bool < int < float < complex.
def category(d) -> int:
    if d is bool or d == torch.bool:
        return 0
    if d is int or d in _INT:
        return 1
    if d is float or d in _FLOAT:
        return 2
    return 3


def _number_dtype(kind: type) -> torch.dtype:
    """The dtype a Python number of ``kind`` has among other numbers (torch's wrapped numbers)."""
    if kind is complex:
        return torch.complex128 if torch.get_default_dtype() == torch.float64 else torch.complex64
    return {bool: torch.bool, int: torch.int64, float: torch.get_default_dtype()}[kind]


def _promote(dtypes):
    out = dtypes[0]
    for d in dtypes[1:]:
        out = torch.promote_types(out, d)
    return out


@functools.cache
def _combine(
    dim: torch.dtype | None, zero: torch.dtype | None, number: type | None, default: torch.dtype
) -> torch.dtype:
    """Torch's own combination of the three tiers (``default`` keys the cache: numbers depend on it).

    ``torch.result_type`` of one tensor and one number or 0-dim tensor applies exactly the rule
    ``result_type`` needs between two tiers, so thunder_rs keeps no promotion table of its own.
    Its meta tensors are made with torch functions overrides off: tracing's language mode would
    take them for the program's calls.
    """
    with torch._C.DisableTorchFunction():
        return _torch_combine(dim, zero, number)


def _torch_combine(dim: torch.dtype | None, zero: torch.dtype | None, number: type | None) -> torch.dtype:
    if dim is None and zero is None:
        return _number_dtype(cast(type, number))
    if zero is not None and number is not None:
        zero, number = torch.result_type(_scalar_tensor(zero), number(1)), None
    if dim is None or (zero is None and number is None):
        return cast(torch.dtype, dim or zero)
    lower = _scalar_tensor(zero) if zero is not None else cast(type, number)(1)
    return torch.result_type(torch.empty((1,), dtype=dim, device="meta"), lower)


def _scalar_tensor(dtype: torch.dtype) -> torch.Tensor:
    with warnings.catch_warnings():  # torch warns that complex32 is experimental
        warnings.simplefilter("ignore", UserWarning)
        return torch.empty((), dtype=dtype, device="meta")


def result_type(*operands) -> torch.dtype:
    """``torch.result_type`` over any number of tensors (or proxies) and Python numbers.

    Tiers in order: dimensioned tensors, 0-dim tensors, numbers; within a tier dtypes promote as
    ``torch.promote_types``, and torch itself combines the tiers (``_combine``).
    """
    dims: list[torch.dtype] = []
    zeros: list[torch.dtype] = []
    numbers: list[type] = []
    for x in operands:
        if isinstance(x, torch.Tensor):
            (dims if x.ndim > 0 else zeros).append(x.dtype)
        elif isinstance(x, (bool, int, float, complex)):
            numbers.append(type(x))
        elif isinstance(x, torch.SymFloat):  # a float computed from sizes (``symfloat``)
            numbers.append(float)
    if not (dims or zeros or numbers):
        return torch.get_default_dtype()
    number = _promote_kinds(numbers) if numbers else None
    return _combine(
        _promote(dims) if dims else None, _promote(zeros) if zeros else None, number, torch.get_default_dtype()
    )


def _promote_kinds(kinds: list[type]) -> type:
    """The kind of Python number several numbers promote to (bool < int < float < complex)."""
    return max(kinds, key=category)
