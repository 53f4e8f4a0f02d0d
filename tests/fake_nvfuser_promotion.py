"""The type promotion of the ``nvfuser_direct`` stand-in (``fake_nvfuser_direct``), as nvFuser's
``csrc/type_promotion.cpp`` decides it, and the ``DataType`` names of the bindings."""

import enum
from typing import NamedTuple

import torch


class DataType(enum.Enum):
    Double = torch.float64
    Float = torch.float32
    Half = torch.float16
    Int = torch.int64
    Int32 = torch.int32
    Bool = torch.bool
    BFloat16 = torch.bfloat16
    ComplexFloat = torch.complex64
    ComplexDouble = torch.complex128
    Null = None


HALF = (torch.float16, torch.bfloat16)


class Config(NamedTuple):
    """``TypePromotionConfig`` (csrc/type_promotion.h)."""

    promote_integer_inputs_to_float: bool = False
    require_full_precision_promoted: bool = False


DEFAULT = Config()  # TypePromotion::default_op_config, also comparison_op_config
FLOAT_OP = Config(promote_integer_inputs_to_float=True)  # float_op_config
FLOAT_ONLY = Config(require_full_precision_promoted=True)  # float_only_op_config

#: ``convertToVal`` (ops.cpp): a Python number becomes a constant of the PolymorphicValue's type.
#: A Python bool is an Int: pybind11 converts to the first alternative of the variant that takes
#: it without conversion (``complex``, ``double``, ``int64_t``, ``bool``), and its int64_t caster
#: takes any ``PyLong``, bools included. A Bool constant is ``define_scalar(v, dtype=DataType.Bool)``.
PYTHON_TYPES = {bool: torch.int64, int: torch.int64, float: torch.float64, complex: torch.complex128}


def _promote(a, b):
    # promoteType (csrc/type.h): C++'s common_type for native types, float with half -> Float,
    # double with half -> Double, half with integers -> half: torch.promote_types agrees on all of them.
    if a is None:
        return b
    return a if b is None else torch.promote_types(a, b)


#: a real dtype's complex one (``getComplexTypeFromType``)
_COMPLEX = {torch.float32: torch.complex64, torch.float64: torch.complex128}


def _combine_categories(higher, lower):
    """``combineCategories``: a complex ``higher`` wins; a complex ``lower`` is of a floating
    ``higher``'s precision, and wins over an integral one."""
    if higher is not None and higher.is_complex:
        return higher
    if lower is not None and lower.is_complex:
        return _COMPLEX.get(higher, lower) if higher is not None and higher.is_floating_point else lower
    if higher is not None and higher.is_floating_point:
        return higher
    if higher == torch.bool or (lower is not None and lower.is_floating_point):
        return _promote(higher, lower)
    return higher if higher is not None else lower


def compute_types(config, types, cast_half_to_float=True):
    """The dtype nvFuser computes an op in (``computeTypes``), its operands being ``types``
    (``(is a tensor, dtype, rank)`` each, as ``getValueType`` sees them): their common dtype
    when they differ, by category as torch (dimensioned tensors over 0-dim ones over scalars,
    a Half or BFloat16 scalar counting as Float); integers to Float under ``promote_integer_inputs_to_float``;
    then Half and BFloat16 to Float unless ``cast_half_to_float`` is False (``where``)."""
    dtypes = {dtype for _, dtype, _ in types}
    if len(dtypes) == 1:
        common = dtypes.pop()
    else:
        dim = zero = wrapped = None
        for is_tensor, dtype, rank in types:
            if is_tensor and rank > 0:
                dim = _promote(dim, dtype)
            elif is_tensor:
                zero = _promote(zero, dtype)
            else:
                wrapped = _promote(wrapped, torch.float32 if dtype in HALF else dtype)
        common = _combine_categories(dim, _combine_categories(zero, wrapped))
    if config.promote_integer_inputs_to_float and not (common.is_floating_point or common.is_complex):
        common = torch.float32
    if config.require_full_precision_promoted and common not in (torch.float32, torch.float64):
        raise RuntimeError(
            "Expected common_dtype == DataType::Float || common_dtype == DataType::Double . Promoted type must be "
            f"single or double precision float but found {DataType(common).name}"
        )
    if cast_half_to_float and common in HALF:
        common = torch.float32
    return common


def execute_arguments(inputs) -> list:
    """``fd.execute``'s inputs as the bindings read them (``from_pyiterable``,
    python_direct/direct_utils.cpp): a list or tuple among them flattened into its items."""
    return [_polymorphic(item) for x in inputs for item in (x if isinstance(x, (list, tuple)) else (x,))]


def _polymorphic(x):
    """``toPolymorphicValue``: a tensor, a bool, an int (of int64's range), a float or a complex,
    by ``isinstance`` in that order (a NumPy float64 is a float; a NumPy int64, a SymInt or None
    is none of them)."""
    for kind in (torch.Tensor, bool, int, float, complex):
        if isinstance(x, kind):
            if kind is int and not -(2**63) <= x < 2**63:
                raise RuntimeError(f"Unable to cast Python instance of type {type(x)} to C++ type 'int64_t'")
            return x if kind in (torch.Tensor, bool) else kind(x)
    raise RuntimeError(f"Cannot convert provided py::handle to a PolymorphicValue. ({type(x).__name__})")
