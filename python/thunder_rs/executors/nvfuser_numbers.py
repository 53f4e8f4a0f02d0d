"""The nvFuser translations of prims whose torch kernels compute otherwise with a number operand:
``pow`` (PowKernel.cpp and PowKernel.cu compute some exponents with other functions than ``pow``,
where nvFuser's generated code calls ``pow``, CUDA's ``powf``) and ``div`` (CUDA's kernel multiplies
by the number's reciprocal), and ``var``/``var_mean`` (torch's CUDA kernel divides a Welford M2 by the
count, nvFuser multiplies by its reciprocal). The region computes them as torch does."""

import math

import torch

from thunder_rs.core.lang.symfloat import SymFloat
from thunder_rs.executors.nvfuser_symbolic import _float32

#: Reduced-precision floats, whose squares torch's kernels round to their dtype.
HALF = (torch.float16, torch.bfloat16)

#: Exponents torch's ``pow(tensor, number)`` computes otherwise than ``pow`` (``pow_tensor_scalar_kernel``):
#: sqrt, rsqrt and reciprocal, and ``x * x``, ``x * x * x`` and ``1 / (x * x)``, a half tensor's square
#: rounded to its dtype first (CUDA's kernels in Half and BFloat16, CPU's in BFloat16). nvFuser's
#: generated code calls ``pow`` but for constant exponents 1, 2 and 3 (codegen.cpp
#: ``genPowerWithMul``), whose ``x * x * x`` of a half computes in Float and rounds once.
POW_KERNELS = {
    0.5: lambda cx, a: cx.ops.sqrt(a),
    -0.5: lambda cx, a: cx.ops.rsqrt(a),
    -1.0: lambda cx, a: cx.ops.reciprocal(a),
    2.0: lambda cx, a: cx.ops.mul(a, a),
    3.0: lambda cx, a: cx.ops.mul(_square(cx, a), a),
    -2.0: lambda cx, a: cx.ops.reciprocal(_square(cx, a)),
}


def _square(cx, a):
    """``a * a`` rounded to ``a``'s dtype, as torch's kernels keep it (a half's is exact in Float)."""
    square = cx.ops.mul(a, a)
    dtype = cx.dtype_of(a)
    return cx.ops.cast(square, cx.data_type(dtype)) if dtype in HALF else square


def _rounded(number, dtype: torch.dtype) -> float:
    """``number`` rounded to ``dtype``, as torch rounds a number it reads in a half dtype."""
    return float(torch.tensor(float(number), dtype=dtype))


#: The exponents torch tests before it rounds the exponent to the tensor's dtype.
UNROUNDED = (0.5, -0.5, -1.0)


def translate_pow(cx, a, b):
    """``pow``, as torch's kernel computes it: a floating tensor to a number torch special-cases
    is that kernel's ops (``x ** 0.5`` a sqrt, bit for bit: nvFuser's ``pow`` is CUDA's ``powf``);
    other powers nvFuser's ``pow``, of the exponent rounded to a half tensor's dtype as torch's
    kernels round it (``exp_scalar.to<scalar_t>()``; ``x ** 0.1`` of a bfloat16 x is ``x **
    0.10009765625``, and one that rounds to 2 squares). A float of sizes is not a number here."""
    if type(a) in (int, float) and cx._is_tensor(b) and cx.dtype_of(b) in HALF:
        # A number base is a 0-dim tensor of the exponent's dtype (Pow.cpp pow_Scalar_out's
        # wrapped_scalar_tensor): 1.3 ** x of a bfloat16 x is 1.296875 ** x.
        return cx.ops.pow(*cx.operands(_rounded(a, cx.dtype_of(b)), b))
    if type(b) not in (int, float) or not cx._is_tensor(a) or not cx.dtype_of(a).is_floating_point:
        return cx.ops.pow(*cx.operands(a, b))
    dtype = cx.dtype_of(a)
    exponent = float(b) if dtype not in HALF else _rounded(b, dtype)
    if float(b) in UNROUNDED:
        return POW_KERNELS[float(b)](cx, a)
    if exponent in POW_KERNELS and exponent not in UNROUNDED:  # (0.5001 of a bfloat16 is a pow of 0.5)
        return POW_KERNELS[exponent](cx, a)
    return cx.ops.pow(*cx.operands(a, exponent))


def translate_div(cx, a, b):
    """``div``; on CUDA a floating tensor by a number (a float of sizes, a size too) is, as torch's CUDA
    kernel computes it (BinaryDivTrueKernel.cu ``div_true_kernel_cuda``: a CPU scalar divisor),
    ``a * (1 / b)``, the reciprocal in the tensor's opmath dtype (float32 for halves), where nvFuser
    divides. CPU tensors (the stand-in's) divide, as torch's CPU kernel does."""
    if not (cx.cuda and type(b) is not bool and cx._is_tensor(a) and cx.dtype_of(a).is_floating_point):
        return cx.ops.div(*cx.operands(a, b))
    double = cx.dtype_of(a) == torch.float64
    if type(b) in (int, float):
        return cx.ops.mul(*cx.operands(a, _reciprocal(float(b), double)))
    if not isinstance(b, SymFloat) and cx._is_tensor(b):
        return cx.ops.div(a, b)
    # A float of sizes, a size, a number input: its reciprocal in opmath, in the definition.
    a, b = cx.operands(a, b)
    opmath = cx.data_type(torch.float64 if double else torch.float32)
    return cx.ops.mul(a, cx.ops.reciprocal(cx.ops.cast(b, opmath)))


def _reciprocal(b: float, double: bool) -> float:
    """``1 / b`` as torch's CUDA kernel computes it: in double, or in float32 of ``b`` in float32."""
    if not double:
        b = _float32(b)
    if b == 0:
        return math.copysign(math.inf, b)
    return 1.0 / b if double else _float32(1.0 / b)


def translate_var_mean(cx, a, dims, correction):
    """``var_mean`` as torch's CUDA kernel computes it (ReduceMomentKernel.cu ``std_var_kernel_cuda``,
    SharedReduceOps.h ``WelfordOps::project``): a Welford reduction's M2 divided by ``max(N - correction,
    0)`` in the accumulation dtype. nvFuser's ``var_mean`` and ``var`` multiply by its reciprocal
    (csrc/ops/normalization.cpp ``variance_mean``, ``variance``), and ``var`` reduces in two passes:
    the region divides the M2 of ``welford`` (python_direct ops.cpp) instead. Halves run in Float, and
    an operand that may be expanded is materialized (``WelfordRaw`` does not squeeze its broadcasts)."""
    a = cx.materialized(cx.upcast(a))
    mean, m2, _ = cx.ops.welford(a, list(dims))
    count = None
    for d in dims:
        extent = cx.ops.size(a, d)
        count = extent if count is None else cx.ops.mul(count, extent)
    if correction:
        count = cx.ops.sub(count, int(correction))
        count = cx.ops.where(cx.ops.ge(count, 0), count, 0)
    return cx.ops.div(m2, count), mean


def translate_var(cx, a, dims, correction):
    return translate_var_mean(cx, a, dims, correction)[0]
