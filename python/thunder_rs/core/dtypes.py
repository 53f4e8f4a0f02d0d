"""Dtype codes shared with Rust, and torch's type-promotion rules for the decompositions."""

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


def _complex_of(d: torch.dtype) -> torch.dtype:
    return torch.complex128 if d == torch.float64 else torch.complex64


def _number_dtype(kind: type, result: torch.dtype | None) -> torch.dtype:
    """The dtype a Python number of ``kind`` promotes to next to tensors of ``result``."""
    default = torch.get_default_dtype()
    if kind is complex:
        return _complex_of(result if result in _FLOAT else default)
    return {bool: torch.bool, int: torch.int64, float: default}[kind]


def _promote(dtypes):
    out = dtypes[0]
    for d in dtypes[1:]:
        out = torch.promote_types(out, d)
    return out


def result_type(*operands) -> torch.dtype:
    """``torch.result_type`` over tensors (or proxies) and Python numbers.

    Tiers in order: dimensioned tensors, 0-dim tensors, numbers. A later tier changes the result
    only when its category (bool < int < float < complex) is higher.
    """
    dims: list[torch.dtype] = []
    zeros: list[torch.dtype] = []
    numbers: list[type] = []
    for x in operands:
        if isinstance(x, torch.Tensor):
            (dims if x.ndim > 0 else zeros).append(x.dtype)
        elif isinstance(x, (bool, int, float, complex)):
            numbers.append(type(x))
    result = _promote(dims) if dims else None
    if zeros:
        top = max(category(d) for d in zeros)
        if result is None:
            result = _promote(zeros)
        elif top > category(result):
            result = _promote([d for d in zeros if category(d) == top])
    if numbers:
        kind = max(numbers, key=category)
        if result is None:
            result = _promote([_number_dtype(k, None) for k in numbers])
        elif category(kind) > category(result):
            result = _number_dtype(kind, result)
    return result if result is not None else torch.get_default_dtype()
