"""What the nvFuser executor claims (``nvfuser_ex``): the prims it translates by family, the dtypes
nvFuser has, and each prim's checker: CUDA tensors (any device for the stand-in's tests) of those
dtypes, and what nvFuser's op requires or computes differently from torch (``EXTRA_CHECKS``).
A prim a checker refuses runs on the torch executor."""

from collections.abc import Callable

import torch

from thunder_rs._core import SymExpr
from thunder_rs.core.lang.symfloat import SymFloat
from thunder_rs.core.lang.symint import identical

#: torch dtypes nvFuser's ``DataType`` has, by name (complex and 8-bit types stay with torch).
DTYPES = {
    torch.float64: "Double",
    torch.float32: "Float",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.int64: "Int",
    torch.int32: "Int32",
    torch.bool: "Bool",
}
UNARY = (
    "abs neg exp exp2 expm1 log log1p log2 log10 sin cos tan tanh sinh cosh asin acos atan asinh acosh atanh erf "
    "erfc erfinv sqrt rsqrt reciprocal sign signbit floor ceil round trunc isfinite bitwise_not lgamma"
).split()
BINARY = (
    "add sub mul div pow fmod remainder maximum minimum atan2 eq ne lt le gt ge bitwise_and bitwise_or bitwise_xor "
    "nextafter"
).split()


def _tensors(args):
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (tuple, list)):
            yield from _tensors(a)


def _holds_symfloat(args) -> bool:
    """Whether a float computed from sizes (``SymFloat``) is among ``args``."""
    return any(type(a) is SymFloat or (type(a) in (tuple, list) and _holds_symfloat(a)) for a in args)


#: Prims whose translation takes a float computed from sizes as an operand: a Double input of the
#: definition computed on the host (``nvfuser_symbolic.host_floats``), handled as a constant float.
#: The others read their numbers while defining (a pad's value, an iota's start): torch runs them.
TAKES_SYMFLOAT = {*BINARY, "where", "full"}


def _int64_index(a, index, dim, *rest) -> bool:
    return index.dtype == torch.int64


def _take_index(a, index, dim) -> bool:
    return index.dtype == torch.int64 and index.ndim == 1


def _same_but_dim(a, index, dim) -> bool:
    # Sizes compared as data: a checker runs after tracing, where no decision can become a guard
    # (symbolic sizes that are equal at every call are one expression).
    return (
        index.dtype == torch.int64
        and a.ndim == index.ndim
        and all(i == dim or identical(x, y) for i, (x, y) in enumerate(zip(a.shape, index.shape)))
    )


def _plain_pad(a, value, config) -> bool:
    # Widths that crop are left to torch; a symbolic width is taken where it is never negative
    # for any size the entry serves (``12 - t0`` of a slice's backward may be, as far as it says),
    # counts of 0 included (a width that reads one is as far as it says: ``t0 - 2`` may be).
    return all(_never_negative(lo) and _never_negative(hi) and interior == 0 for lo, hi, interior in config)


def _never_negative(width) -> bool:
    if isinstance(width, SymExpr):
        bound = width.lower_bound(0)
        return bound is not None and bound >= 0
    return width >= 0


def _integral_correction(a, dims, correction) -> bool:
    # Over no dims each element is a sample of one (torch: nan for correction 1); left to torch.
    return bool(dims) and float(correction) == int(correction)


def _not_bool(a, *params) -> bool:
    return a.dtype != torch.bool  # torch's bool sum is an any(); nvFuser's has no such reduction


def _full_precision(a, b) -> bool:
    # nextafter needs Float or Double operands (float_only_op_config, checked before halves
    # become Float, csrc/type_promotion.cpp); a half one's neighbour is not a Float one's either.
    return all(x.dtype in (torch.float32, torch.float64) for x in (a, b) if isinstance(x, torch.Tensor))


def _unit_steps(a, start, end, strides) -> bool:
    # "nvFuser Limitation: All slice operation strides must be of const size 1" (python_direct
    # ops.cpp slice_fn; diagonal_scatter's gradient on the H200).
    return all(step == 1 for step in strides)


def _float_scan(a, dim) -> bool:
    # Integer scans overflow as torch's do only in int64; nvFuser's scan takes no 0-dim tensor
    # ("Tried to access out of boundary index 0", seen on the H100).
    return a.dtype.is_floating_point and a.ndim > 0


#: Checks beyond the device and dtypes, by prim: what nvFuser's op requires or computes differently.
EXTRA_CHECKS: dict[str, Callable[..., bool]] = {
    "pad": _plain_pad,
    "slice": _unit_steps,
    "var": _integral_correction,
    "var_mean": _integral_correction,
    "take": _take_index,
    "take_along_axis": _same_but_dim,
    "gather": _int64_index,
    "cumsum": _float_scan,
    "cumprod": _float_scan,
    "nextafter": _full_precision,
    "sum": _not_bool,
    "prod": _not_bool,
    "amax": _not_bool,
    "amin": _not_bool,
    "convert_element_type": lambda a, dtype: dtype in DTYPES,
    "full": lambda shape, fill, device, dtype: dtype in DTYPES and not isinstance(fill, complex),
    "iota": lambda length, start, step, device, dtype: dtype in DTYPES,
}
#: Prims with no tensor operand: their device parameter says where they run.
_DEVICE_AT = {"full": 2, "iota": 3}


def make_checker(name: str, allow_cpu: bool):
    """The claim checker of prim ``name``: CUDA tensors (any device when ``allow_cpu``, for tests)
    of nvFuser's dtypes, and the prim's own conditions."""
    extra = EXTRA_CHECKS.get(name)
    device_at = _DEVICE_AT.get(name)
    takes_symfloat = name in TAKES_SYMFLOAT

    def check(*args, **kwargs) -> bool:
        if device_at is not None and not allow_cpu and torch.device(args[device_at]).type != "cuda":
            return False
        tensors = list(_tensors(args))
        if not tensors and device_at is None:
            return False  # arithmetic on numbers alone: no kernel to fuse
        for t in tensors:
            if t.dtype not in DTYPES or (t.device.type != "cuda" and not allow_cpu):
                return False
        if any(isinstance(a, complex) for a in args) or (not takes_symfloat and _holds_symfloat(args)):
            return False
        return extra is None or bool(extra(*args, **kwargs))

    check.__name__ = f"nvfuser_{name}_checker"
    return check
