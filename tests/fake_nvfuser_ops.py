"""The stand-in ``nvfuser_direct``'s tables of unary, binary and ternary ops (``fake_nvfuser_direct``):
each ``fd.ops`` name of NVIDIA/Fuser's ``csrc/ops/arith.cpp`` and ``csrc/ops/composite.cpp`` macros,
the torch function that computes it, and which of them nvFuser's generated code has no half kernel for."""

import torch

#: ``NVFUSER_DEFINE_UNARY_OP``, ``abs``, ``set``: unaryOp without promotion; the result has the input's dtype.
SAME_DTYPE = {
    "abs": torch.abs,
    "ceil": torch.ceil,
    "floor": torch.floor,
    "round": torch.round,
    "trunc": torch.trunc,
    "relu": torch.relu,
    "set": torch.clone,
    "segment_set": torch.clone,
}
#: ``NVFUSER_DEFINE_UNARY_FLOAT_OP``: float_op_config, so integers and halves compute in Float.
FLOAT_UNARY = {
    "acos": torch.acos,
    "acosh": torch.acosh,
    "asin": torch.asin,
    "asinh": torch.asinh,
    "atan": torch.atan,
    "atanh": torch.atanh,
    "cos": torch.cos,
    "cosh": torch.cosh,
    "exp": torch.exp,
    "exp2": torch.exp2,
    "expm1": torch.expm1,
    "erf": torch.erf,
    "erfc": torch.erfc,
    "erfinv": torch.erfinv,
    "lgamma": torch.lgamma,
    "log": torch.log,
    "log10": torch.log10,
    "log1p": torch.log1p,
    "log2": torch.log2,
    "reciprocal": torch.reciprocal,
    "rsqrt": torch.rsqrt,
    "sigmoid": torch.sigmoid,
    "sin": torch.sin,
    "sinh": torch.sinh,
    "sqrt": torch.sqrt,
    "tan": torch.tan,
    "tanh": torch.tanh,
}
#: ``NVFUSER_DEFINE_UNARY_IS_OP``: a Bool result, the input not promoted.
IS_OPS = {"isfinite": torch.isfinite, "isinf": torch.isinf, "isnan": torch.isnan}
#: ``NVFUSER_DEFINE_BINARY_CAST_OP``: default_op_config (halves compute in Float).
DEFAULT_BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "pow": torch.pow,
    "fmod": torch.fmod,
    "remainder": torch.remainder,
    "mod": torch.fmod,  # C++'s %: the remainder has the dividend's sign
    "maximum": torch.maximum,
    "minimum": torch.minimum,
}
#: ``NVFUSER_DEFINE_BINARY_COMPARE_OP`` and ``NVFUSER_DEFINE_LOGICAL_OP``: compared in the common
#: dtype, a Bool result (``getOutputType``: ``isLogicalOp``).
LOGICAL_BINARY = {
    "eq": torch.eq,
    "ne": torch.ne,
    "lt": torch.lt,
    "le": torch.le,
    "gt": torch.gt,
    "ge": torch.ge,
    "logical_and": torch.logical_and,
    "logical_or": torch.logical_or,
}
#: ``NVFUSER_DEFINE_BITWISE_OP``: integers or bools only; two bools take the logical alternative.
BITWISE = {
    "bitwise_and": (torch.bitwise_and, "logical_and"),
    "bitwise_or": (torch.bitwise_or, "logical_or"),
    "bitwise_xor": (torch.bitwise_xor, "ne"),
}

#: Ops without promotion that nvFuser's generated code has no function of its Half or BFloat16
#: for (on the H100: NVRTC "no instance of overloaded function ceil matches (nvf::__half)", and
#: no ``!=`` of ``nvf::__half`` for isnan): a definition asking for one fails to compile.
NO_HALF_KERNEL = {"ceil", "floor", "round", "trunc", "isfinite", "isinf", "isnan"}
