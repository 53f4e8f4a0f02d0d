"""Elementwise math beyond the prims' own: fused arithmetic (addcmul, lerp), log-space sums,
``torch.special`` functions built from existing prims, and the metadata predicates
(``torch.is_floating_point``) that answer in Python (the floating-point predicates and logical ops
are in ``predicates.py``).

Each decomposition mirrors eager's kernel formula (its branch order, its treatment of NaN and
infinities) and selects with ``where`` on eager's own comparison, so that the gradient at ties and
edges is eager's. A value computed only to be masked out is computed on a safe operand, so that its
NaN gradient cannot leak through the mask. fmax and fmin have grad rules of their own: at ties and
NaN operands eager's subgradient is a convention that changed across torch releases
(``elementwise.SPLIT_TIES``), which the VJP of the decompositions' prims follows in none or only some.
"""

import math

import torch

from thunder_rs import clang, prims
from thunder_rs.clang import DEFAULT, INT_TO_FLOAT
from thunder_rs.core.base import dtypes
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, ThunderTypeError, check
from thunder_rs.torch.common import conj_for, is_number
from thunder_rs.torch.creation import filled
from thunder_rs.torch.elementwise import NAN_SELECTING_FMAX, SPLIT_TIES, put_operand_grads, sign, sub
from thunder_rs.torch.symbols import ltorch, torchsymbol
from thunder_rs.core.lang.symfloat import SymFloat
from thunder_rs.core.lang.symint import same_shape

T = torch.Tensor
__all__ = [
    "addcmul",
    "addcdiv",
    "lerp",
    "logaddexp",
    "logaddexp2",
    "xlogy",
    "xlog1py",
    "copysign",
    "frac",
    "deg2rad",
    "rad2deg",
    "fmax",
    "fmin",
    "hypot",
    "heaviside",
    "ldexp",
    "float_power",
    "square",
    "sgn",
    "positive",
    "logit",
    "nan_to_num",
    "sinc",
    "entr",
    "ndtr",
    "polygamma",
    "tensor_polygamma",
    "angle",
    "real",
    "frexp",
    "mvlgamma",
]


# -- helpers ---------------------------------------------------------------------------------------


def _operands(op: str, *operands, kind=DEFAULT):
    """``operands`` converted to their computation dtype and broadcast to one shape (numbers become
    tensors of it), with the result dtype."""
    tensors = [x for x in operands if isinstance(x, torch.Tensor)]
    check(bool(tensors), op, "expected at least one tensor argument", ThunderTypeError)
    for x in operands:
        check(
            isinstance(x, (torch.Tensor, bool, int, float, SymFloat)),
            op,
            lambda: f"expected a tensor or a number, got {type(x).__name__}",
            ThunderTypeError,
        )
    compute, result = clang.promote(op, operands, kind)
    shape = clang.broadcast_shapes(op, *(t.shape for t in tensors))
    device = tensors[0].device
    converted = [
        clang.expand_to(clang.maybe_convert(x, compute), shape)
        if isinstance(x, torch.Tensor)
        else filled(shape, x, device, compute)
        for x in operands
    ]
    return converted, compute, result


def _float_only(op: str, dtype, arg: str = "input") -> None:
    """Eager has these kernels for floating dtypes only."""
    check(
        dtype.is_floating_point or dtype.is_complex,
        op,
        lambda: f"not implemented for {dtype} (argument {arg})",
        ThunderNotImplementedError,
    )


def _real_only(op: str, *operands) -> None:
    for x in operands:
        if isinstance(x, torch.Tensor):
            check(
                not x.dtype.is_complex,
                op,
                lambda: f"complex inputs are not supported, got {x.dtype}",
                ThunderNotImplementedError,
            )


def _full_like(a, value, dtype):
    return prims.full(tuple(a.shape), value, a.device, dtype)


def _is_nan(x):
    """NaN test on a tensor of computation dtype: only floats can hold NaN."""
    return prims.ne(x, x) if x.dtype.is_floating_point else _full_like(x, False, torch.bool)


def _safe(mask, x, value):
    """``x`` with ``value`` where ``mask``: an operand whose masked-out results stay finite."""
    return prims.where(mask, clang.maybe_convert(value, x.dtype), x)


# -- fused arithmetic ------------------------------------------------------------------------------


def _check_value(op: str, value) -> None:
    check(
        is_number(value),
        op,
        lambda: f"expected a number for value, got {type(value).__name__} (argument value)",
        ThunderTypeError,
    )


@torchsymbol(torch.addcmul, T.addcmul)
def addcmul(input, tensor1, tensor2, *, value=1):
    op = "ltorch.addcmul"
    (a, t1, t2), compute, _ = _operands(op, input, tensor1, tensor2)
    check(
        compute != torch.bool,
        op,
        "\"addcmul_cpu_out\" not implemented for 'Bool' (argument input)",
        ThunderNotImplementedError,
    )
    _check_value(op, value)
    if _cuda_floats(compute, input, tensor1, tensor2):
        # CUDA's kernel (PointwiseOpsKernel.cu ``pointwise_op_impl``): ``fma(value, t1 * t2, self)``
        # in opmath, ``fma(t1, t2, self)`` for a value of 1; halves rounded once.
        return _in_opmath(lambda a, t1, t2: _fused(a, prims.mul(t1, t2), value), compute, a, t1, t2)
    # Eager's CPU kernel: self + value * t1 * t2, with value in the computation dtype (halves in float32).
    return _in_opmath(
        lambda a, t1, t2: prims.add(a, prims.mul(prims.mul(t1, clang.maybe_convert(value, a.dtype)), t2)),
        compute,
        a,
        t1,
        t2,
    )


@torchsymbol(torch.addcdiv, T.addcdiv)
def addcdiv(input, tensor1, tensor2, *, value=1):
    op = "ltorch.addcdiv"
    check(
        all(x.dtype.is_floating_point or x.dtype.is_complex for x in (tensor1, tensor2)),
        op,
        "Integer division with addcdiv is no longer supported, and in a future release addcdiv will perform a true "
        "division of tensor1 and tensor2. Use torch.div and torch.addcmul instead (argument tensor1)",
        ThunderRuntimeError,
    )
    (a, t1, t2), compute, _ = _operands(op, input, tensor1, tensor2)
    _check_value(op, value)
    if _cuda_floats(compute, input, tensor1, tensor2):
        # CUDA's kernel: ``fma(value, t1 / t2, self)`` in opmath (the CPU's divides value * t1).
        return _in_opmath(lambda a, t1, t2: _fused(a, prims.div(t1, t2), value), compute, a, t1, t2)
    return _in_opmath(
        lambda a, t1, t2: prims.add(a, prims.div(prims.mul(t1, clang.maybe_convert(value, a.dtype)), t2)),
        compute,
        a,
        t1,
        t2,
    )


def _cuda_floats(compute, *operands) -> bool:
    """Whether CUDA's kernel computes these floating operands (a real floating computation dtype)."""
    on_cuda = any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in operands)
    return on_cuda and compute.is_floating_point


def _in_opmath(body, compute, *operands):
    """``body`` of ``operands`` in their opmath dtype (float32 for halves, as eager's CPU and CUDA
    kernels compute them), its result rounded once to ``compute``."""
    if compute not in (torch.float16, torch.bfloat16):
        return body(*operands)
    return clang.maybe_convert(body(*(clang.maybe_convert(x, torch.float32) for x in operands)), compute)


def _fused(a, product, value):
    """``a + value * product``, ``a + product`` for a value of 1 (CUDA's ``pointwise_op_impl``)."""
    if type(value) is not SymFloat and value == 1:
        return prims.add(a, product)
    return prims.add(a, prims.mul(clang.maybe_convert(value, a.dtype), product))


#: The C++ type names eager's lerp messages give dtypes (``TORCH_CHECK`` of ``scalar_type``).
_CPP_TYPES = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16",
    torch.complex64: "c10::complex<float>",
    torch.complex128: "c10::complex<double>",
}


def _cpp_type(dtype) -> str:
    return _CPP_TYPES.get(dtype, str(dtype))


@torchsymbol(torch.lerp, T.lerp)
def lerp(input, end, weight):
    op = "ltorch.lerp"
    check(
        end.dtype == input.dtype,
        op,
        lambda: (
            f"expected dtype {_cpp_type(input.dtype)} for `end` but got dtype {_cpp_type(end.dtype)} (argument end)"
        ),
        ThunderRuntimeError,
    )
    if isinstance(weight, torch.Tensor):
        check(
            weight.dtype == input.dtype or weight.ndim == 0,
            op,
            lambda: (
                f"expected dtype {_cpp_type(input.dtype)} for `weight` but got dtype {_cpp_type(weight.dtype)} "
                "(argument weight)"
            ),
            ThunderRuntimeError,
        )
    _float_only(op, input.dtype)
    tensors = [x for x in (input, end, weight) if isinstance(x, torch.Tensor)]
    shape = clang.broadcast_shapes(op, *(t.shape for t in tensors))
    # Eager's kernels (Lerp.h ``lerp``, CPU's and CUDA's) compute in opmath, float32 for halves, with
    # the weight and ``1 - weight`` in it, and round once.
    opmath = torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype
    a, b = (clang.expand_to(clang.maybe_convert(x, opmath), shape) for x in (input, end))
    if isinstance(weight, torch.Tensor):  # (a 0-d weight of another dtype read in the input's, as before)
        w = clang.expand_to(clang.maybe_convert(clang.maybe_convert(weight, input.dtype), opmath), shape)
    else:
        w = weight
    if opmath == torch.float32 and type(w) is not SymFloat and not isinstance(w, torch.Tensor):
        w = float(torch.tensor(w, dtype=opmath))  # (``weight.to<opmath_t>()``)
    # Eager's two-sided formula is exact at both ends: weight < 0.5 from input, else from end.
    diff = prims.sub(b, a)
    low = prims.add(a, prims.mul(diff, w))
    one_minus = prims.sub(_full_like(a, 1.0, a.dtype), w) if isinstance(w, torch.Tensor) else _one_minus(w, opmath)
    high = prims.sub(b, prims.mul(diff, one_minus))
    if not isinstance(w, torch.Tensor):
        # (``abs(w) < 0.5`` as two comparisons: a weight from sizes decides relations of them)
        return clang.maybe_convert(low if -0.5 < w < 0.5 else high, input.dtype)
    return clang.maybe_convert(prims.where(prims.lt(prims.abs(w), 0.5), low, high), input.dtype)


def _one_minus(w, opmath):
    """``1 - w`` of a number weight in ``opmath`` (float32's difference is the double one rounded)."""
    if type(w) is SymFloat or opmath != torch.float32:
        return 1.0 - w
    return float(torch.tensor(1.0 - w, dtype=opmath))


# -- log-space sums --------------------------------------------------------------------------------


def _logaddexp(op: str, a, b, log1p_of_pow):
    _real_only(op, a, b)
    (x, y), compute, _ = _operands(op, a, b)
    _float_only(op, compute)
    # max + log1p(exp(-|x - y|)); equal infinities would give inf - inf = NaN, eager returns them.
    big = prims.maximum(x, y)
    same_inf = prims.bitwise_and(prims.eq(x, y), prims.eq(prims.abs(x), math.inf))
    diff = _safe(same_inf, prims.sub(x, y), 0.0)
    return prims.where(same_inf, x, prims.add(big, log1p_of_pow(prims.neg(prims.abs(diff)))))


@torchsymbol(torch.logaddexp, T.logaddexp)
def logaddexp(input, other):
    return _logaddexp("ltorch.logaddexp", input, other, lambda d: prims.log1p(prims.exp(d)))


@torchsymbol(torch.logaddexp2, T.logaddexp2)
def logaddexp2(input, other):
    return _logaddexp(
        "ltorch.logaddexp2", input, other, lambda d: prims.mul(prims.log1p(prims.exp2(d)), 1.0 / math.log(2.0))
    )


def _xlog(op: str, a, b, log):
    (x, y), _, _ = _operands(op, a, b, kind=INT_TO_FLOAT)
    # NaN in y wins; x == 0 gives 0 even where log(y) is infinite.
    zero = prims.eq(x, 0.0)
    product = prims.mul(x, log(_safe(zero, y, 1.0)))
    return prims.where(_is_nan(y), y, prims.where(zero, 0.0, product))


@torchsymbol(torch.xlogy, T.xlogy, torch.special.xlogy)
def xlogy(input, other):
    return _xlog("ltorch.xlogy", input, other, prims.log)


@torchsymbol(torch.special.xlog1py)
def xlog1py(input, other):
    return _xlog("ltorch.xlog1py", input, other, prims.log1p)


# -- floating-point arithmetic ---------------------------------------------------------------------


@torchsymbol(torch.copysign, T.copysign)
def copysign(input, other):
    (x, y), _, _ = _operands("ltorch.copysign", input, other, kind=INT_TO_FLOAT)
    magnitude = prims.abs(x)
    return prims.where(prims.signbit(y), prims.neg(magnitude), magnitude)


@torchsymbol(torch.frac, T.frac)
def frac(input):
    _float_only("ltorch.frac", input.dtype)
    return prims.sub(input, prims.trunc(input))


def _scale_by(op: str, a, factor):
    (x,), _, _ = _operands(op, a, kind=INT_TO_FLOAT)
    return prims.mul(x, factor)


@torchsymbol(torch.deg2rad, T.deg2rad)
def deg2rad(input):
    return _scale_by("ltorch.deg2rad", input, math.pi / 180.0)


@torchsymbol(torch.rad2deg, T.rad2deg)
def rad2deg(input):
    return _scale_by("ltorch.rad2deg", input, 180.0 / math.pi)


def _nan_ignoring(op: str, a, b, prim):
    """fmax/fmin: ``prim`` (maximum/minimum, which split the gradient at ties as eager does) of
    ``a`` and ``b`` where neither is NaN, else the one that is not NaN."""
    _real_only(op, a, b)
    (x, y), _, _ = _operands(op, a, b)
    return prims.where(_is_nan(y), x, prims.where(_is_nan(x), y, prim(x, y)))


@torchsymbol(torch.fmax, T.fmax)
def fmax(input, other):
    return _nan_ignoring("ltorch.fmax", input, other, prims.maximum)


@torchsymbol(torch.fmin, T.fmin)
def fmin(input, other):
    return _nan_ignoring("ltorch.fmin", input, other, prims.minimum)


@torchsymbol(torch.hypot, T.hypot)
def hypot(input, other):
    op = "ltorch.hypot"
    (x, y), compute, _ = _operands(op, input, other)
    _float_only(op, compute)
    return prims.sqrt(prims.add(prims.mul(x, x), prims.mul(y, y)))


@torchsymbol(torch.heaviside, T.heaviside)
def heaviside(input, values):
    op = "ltorch.heaviside"
    check(isinstance(values, torch.Tensor), op, "expected a tensor for values (argument values)", ThunderTypeError)
    check(
        input.dtype == values.dtype,
        op,
        "heaviside is not yet implemented for tensors with different dtypes. (argument values)",
        ThunderRuntimeError,
    )
    _real_only(op, input)
    (x, v), compute, _ = _operands(op, input, values)
    step = clang.maybe_convert(prims.gt(x, clang.maybe_convert(0, compute)), compute)
    return prims.where(prims.eq(x, clang.maybe_convert(0, compute)), v, step)


@torchsymbol(torch.ldexp, T.ldexp)
def ldexp(input, other):
    # Eager: input * 2 ** other, in floating point.
    (x, e), _, _ = _operands("ltorch.ldexp", input, other, kind=INT_TO_FLOAT)
    return prims.mul(x, prims.pow(_full_like(e, 2.0, e.dtype), e))


@torchsymbol(torch.float_power, T.float_power)
def float_power(input, exponent):
    op = "ltorch.float_power"
    _real_only(op, input, exponent)
    target = torch.float64
    base = clang.maybe_convert(input, target) if isinstance(input, torch.Tensor) else float(input)
    power = clang.maybe_convert(exponent, target) if isinstance(exponent, torch.Tensor) else float(exponent)
    if isinstance(base, torch.Tensor) and isinstance(power, torch.Tensor):
        return ltorch.pow(base, power)  # eager's, and its gradients (elementwise.pow_grad)
    return clang.elementwise(prims.pow, op, base, power)


@torchsymbol(torch.square, T.square)
def square(input):
    # Eager computes pow(input, 2): bool squares to int64.
    x = clang.maybe_convert(input, torch.int64) if input.dtype == torch.bool else input
    return prims.mul(x, x)


@register_grad(ltorch.square)
def square_grad(input):
    """Eager's ``pow(input, 2)`` backward, ``g * (2 * input)``; the product's VJP added the
    cotangent times each operand, one rounding more (a squareplus's gradient was an ulp apart)."""
    out = ltorch.square(input)
    if not input.dtype.is_floating_point:
        return out  # the decomposition's VJP
    put_grad(input, ltorch.mul(get_grad(out), ltorch.mul(input, 2.0)))
    return out


@torchsymbol(torch.sgn, T.sgn)
def sgn(input):
    _real_only("ltorch.sgn", input)
    return sign(input)


@torchsymbol(torch.positive, T.positive)
def positive(input):
    check(
        input.dtype != torch.bool,
        "ltorch.positive",
        "The `+` operator, on a bool tensor is not supported. (argument input)",
        ThunderNotImplementedError,
    )
    return input


TORCH_TO_LTORCH[torch.subtract] = TORCH_TO_LTORCH[T.subtract] = sub
sub.torch_fns = (*sub.torch_fns, torch.subtract, T.subtract)


@torchsymbol(torch.logit, T.logit, torch.special.logit)
def logit(input, eps=None):
    (x,), _, _ = _operands("ltorch.logit", input, kind=INT_TO_FLOAT)
    if eps is not None:
        # Eager clamps to [eps, 1 - eps] by comparison: NaN stays NaN and the bounds pass the gradient.
        low, high = float(eps), 1.0 - float(eps)
        x = prims.where(prims.lt(x, low), low, prims.where(prims.gt(x, high), high, x))
    return prims.log(prims.div(x, prims.sub(_full_like(x, 1.0, x.dtype), x)))


@torchsymbol(torch.nan_to_num, T.nan_to_num)
def nan_to_num(input, nan=0.0, posinf=None, neginf=None):
    if not input.dtype.is_floating_point:
        _real_only("ltorch.nan_to_num", input)
        return input
    info = torch.finfo(input.dtype)
    high = info.max if posinf is None else posinf
    low = info.min if neginf is None else neginf
    out = prims.where(prims.eq(input, math.inf), clang.maybe_convert(high, input.dtype), input)
    out = prims.where(prims.eq(input, -math.inf), clang.maybe_convert(low, input.dtype), out)
    return prims.where(_is_nan(input), clang.maybe_convert(nan, input.dtype), out)


# -- special functions from existing prims ---------------------------------------------------------


@torchsymbol(torch.sinc, T.sinc, torch.special.sinc)
def sinc(input):
    (x,), _, _ = _operands("ltorch.sinc", input, kind=INT_TO_FLOAT)
    zero = prims.eq(x, 0.0)
    scaled = prims.mul(_safe(zero, x, 1.0), math.pi)
    return prims.where(zero, 1.0, prims.div(prims.sin(scaled), scaled))


@torchsymbol(torch.special.entr)
def entr(input):
    (x,), _, _ = _operands("ltorch.entr", input, kind=INT_TO_FLOAT)
    # Eager: NaN -> NaN, x > 0 -> -x log x, x == 0 -> 0, x < 0 -> -inf.
    positive_ = prims.gt(x, 0.0)
    value = prims.neg(prims.mul(x, prims.log(_safe(prims.bitwise_not(positive_), x, 1.0))))
    value = prims.where(positive_, value, prims.where(prims.eq(x, 0.0), _full_like(x, 0.0, x.dtype), -math.inf))
    return prims.where(_is_nan(x), x, value)


@torchsymbol(torch.special.ndtr)
def ndtr(input):
    (x,), _, _ = _operands("ltorch.ndtr", input, kind=INT_TO_FLOAT)
    return prims.mul(prims.erfc(prims.mul(x, -math.sqrt(0.5))), 0.5)


def _polygamma(op: str, n, input):
    check(
        isinstance(n, int) and not isinstance(n, bool),
        op,
        lambda: f"expected an int for n, got {type(n).__name__} (argument n)",
        ThunderTypeError,
    )
    check(n >= 0, op, "polygamma(n, x) does not support negative n. (argument n)", ThunderRuntimeError)
    (x,), _, _ = _operands(op, input, kind=INT_TO_FLOAT)
    return prims.digamma(x) if n == 0 else prims.polygamma(x, n)


@torchsymbol(torch.polygamma, torch.special.polygamma)
def polygamma(n, input):
    return _polygamma("ltorch.polygamma", n, input)


# Tensor.polygamma takes the tensor first.
@torchsymbol(T.polygamma)
def tensor_polygamma(input, n):
    return _polygamma("ltorch.polygamma", n, input)


@torchsymbol(torch.angle, T.angle)
def angle(input):
    _real_only("ltorch.angle", input)
    (x,), _, _ = _operands("ltorch.angle", input, kind=INT_TO_FLOAT)
    # Real inputs: pi for negatives, 0 otherwise, NaN kept.
    return prims.where(_is_nan(x), x, prims.where(prims.lt(x, 0.0), math.pi, _full_like(x, 0.0, x.dtype)))


@torchsymbol(torch.real)
def real(input):
    _real_only("ltorch.real", input)
    return input


# -- metadata predicates ---------------------------------------------------------------------------
# Answered from the proxy's metadata: they return Python values, never a traced tensor.

TORCH_TO_LTORCH.update(
    {
        torch.is_floating_point: lambda input: input.dtype.is_floating_point,
        torch.is_complex: lambda input: input.dtype.is_complex,
        torch.is_same_size: lambda input, other: same_shape(input.shape, other.shape),
        T.is_same_size: lambda input, other: same_shape(input.shape, other.shape),
        torch.is_signed: lambda input: input.dtype.is_signed,
        torch.numel: lambda input: input.numel(),
        torch.result_type: lambda tensor, other: dtypes.result_type(tensor, other),
    }
)


@torchsymbol(torch.frexp, T.frexp)
def frexp(input, *, out=None):
    op = "ltorch.frexp"
    check(out is None, op, "out= is not supported (argument out)", ThunderNotImplementedError)
    check(
        input.dtype.is_floating_point,
        op,
        "torch.frexp() only supports floating-point dtypes (argument input)",
        ThunderRuntimeError,
    )
    return torch.return_types.frexp(prims.frexp(input))


@torchsymbol(torch.mvlgamma, T.mvlgamma, torch.special.multigammaln)
def mvlgamma(input, p):
    """The multivariate log-gamma: ``sum(lgamma(input - i / 2) for i < p) + p (p - 1) / 4 log(pi)``."""
    op = "ltorch.mvlgamma"
    check(isinstance(p, int) and p >= 1, op, "p has to be greater than or equal to 1 (argument p)", ThunderRuntimeError)
    x = clang.maybe_convert(input, input.dtype if input.dtype.is_floating_point else torch.get_default_dtype())
    total = clang.elementwise(prims.lgamma, op, x)
    for i in range(1, p):
        total = clang.elementwise(
            prims.add, op, total, clang.elementwise(prims.lgamma, op, clang.elementwise(prims.sub, op, x, i / 2))
        )
    return clang.elementwise(prims.add, op, total, p * (p - 1) / 4 * math.log(math.pi))


# -- grad rules of fmax and fmin (at ties: see elementwise.py) -------------------------------------


def _fmax_grads(g, a, b, wins):
    """The gradients of fmax (``wins`` is ``ltorch.gt``) or fmin (``ltorch.lt``) of ``a`` and ``b``."""
    if not SPLIT_TIES:  # a tie, and a NaN ``b``, give ``a`` the gradient
        a_selected = ltorch.bitwise_or(ltorch.bitwise_or(wins(a, b), a == b), ltorch.isnan(b))
        return ltorch.where(a_selected, g, 0.0), ltorch.where(a_selected, 0.0, g)
    tie, half = a == b, g * 0.5
    if not NAN_SELECTING_FMAX:  # maximum's rule: where neither wins (a NaN), both get the gradient
        return (
            ltorch.where(tie, half, ltorch.where(wins(b, a), 0.0, g)),
            ltorch.where(tie, half, ltorch.where(wins(a, b), 0.0, g)),
        )
    a_selected = ltorch.bitwise_or(wins(a, b), ltorch.isnan(b))
    return ltorch.where(tie, half, ltorch.where(a_selected, g, 0.0)), ltorch.where(
        tie, half, ltorch.where(a_selected, 0.0, g)
    )


def _fmax_grad(symbol, wins, input, other):
    out = symbol(input, other)
    if out.dtype.is_floating_point and isinstance(input, torch.Tensor) and isinstance(other, torch.Tensor):
        put_operand_grads((input, other), _fmax_grads(get_grad(out), input, other, wins))
    return out


@register_grad(ltorch.fmax)
def fmax_grad(input, other):
    return _fmax_grad(ltorch.fmax, ltorch.gt, input, other)


@register_grad(ltorch.fmin)
def fmin_grad(input, other):
    return _fmax_grad(ltorch.fmin, ltorch.lt, input, other)


# -- grad rules of eager's formulas (derivatives.yaml) ---------------------------------------------
# In eager's operand order and arithmetic, so that the gradients take eager's layouts (an operand's
# layout decides where the cotangent's is ambiguous) and round as eager's do: torch's operators,
# whose layouts the trace takes. Complex results keep the decompositions' VJPs.


def _xlog_grad(symbol, kernel, pole: float, input, other):
    """``symbol(g, other)``, zero where ``input == 0`` and ``other <= pole`` (a new contiguous
    tensor: eager's ``masked_fill``), and ``g * input / (other - pole)``."""
    out = symbol(input, other)
    if not out.dtype.is_floating_point:
        return out
    g = get_grad(out)
    if isinstance(input, torch.Tensor) and input.requires_grad:
        grad = kernel(g, other)
        if isinstance(other, torch.Tensor):
            grad = grad.masked_fill((input == 0.0) & (other <= pole), 0.0)
        elif other <= pole:
            grad = grad.masked_fill(input == 0.0, 0.0)
        put_operand_grads((input,), (grad,))
    if isinstance(other, torch.Tensor) and other.requires_grad:
        put_operand_grads((other,), (g * input / (other if pole == 0.0 else other + 1),))
    return out


@register_grad(ltorch.xlogy)
def xlogy_grad(input, other):
    return _xlog_grad(ltorch.xlogy, torch.xlogy, 0.0, input, other)


@register_grad(ltorch.xlog1py)
def xlog1py_grad(input, other):
    return _xlog_grad(ltorch.xlog1py, torch.special.xlog1py, -1.0, input, other)


@register_grad(ltorch.copysign)
def copysign_grad(input, other):
    """``g * (result / input)``, the ratio 0 where ``input == 0``; ``other``'s gradient is new
    contiguous zeros (eager's ``zeros_like(other)`` formula, which leaves ``other.grad`` zeros)."""
    out = ltorch.copysign(input, other)
    if not out.dtype.is_floating_point:
        return out
    g = get_grad(out)
    if input.requires_grad:
        ratio = out / input
        ratio.masked_fill_(input == 0.0, 0.0)
        put_operand_grads((input,), (g * ratio,))
    if isinstance(other, torch.Tensor) and other.requires_grad:
        put_grad(other, ltorch.zeros(tuple(other.shape), dtype=other.dtype, device=other.device))
    return out


@register_grad(ltorch.lerp)
def lerp_grad(input, end, weight):
    """``g * (1 - weight)``, ``g * weight`` and ``g * (end - input)``, conjugated for complex values
    (a number weight's ``1 - weight`` computed in double, as eager's)."""
    out = ltorch.lerp(input, end, weight)
    if not dtypes.is_inexact(out.dtype):
        return out
    g, conj = get_grad(out), conj_for(out)
    if isinstance(weight, torch.Tensor):
        grads = (g * conj(1 - weight), g * conj(weight), g * conj(end - input))
    else:
        grads = (g * (1 - weight), g * weight, None)
    put_operand_grads((input, end, weight), grads)
    return out


def _logaddexp_grad(symbol, power, input, other):
    """``g / (1 + power(other - input))`` and ``g / (1 + power(input - other))``."""
    out = symbol(input, other)
    if not out.dtype.is_floating_point:
        return out
    g = get_grad(out)
    put_operand_grads((input, other), (g / (1 + power(other - input)), g / (1 + power(input - other))))
    return out


@register_grad(ltorch.logaddexp)
def logaddexp_grad(input, other):
    return _logaddexp_grad(ltorch.logaddexp, torch.exp, input, other)


@register_grad(ltorch.logaddexp2)
def logaddexp2_grad(input, other):
    return _logaddexp_grad(ltorch.logaddexp2, lambda x: torch.pow(2, x), input, other)


@register_grad(ltorch.addcmul)
def addcmul_grad(input, tensor1, tensor2, *, value=1):
    """``g``, ``g * (tensor2 * value)`` and ``g * (tensor1 * value)`` (conjugated, complex)."""
    out = ltorch.addcmul(input, tensor1, tensor2, value=value)
    if not dtypes.is_inexact(out.dtype):
        return out
    g, conj = get_grad(out), conj_for(out)
    put_operand_grads((input, tensor1, tensor2), (g, g * conj(tensor2 * value), g * conj(tensor1 * value)))
    return out


@register_grad(ltorch.addcdiv)
def addcdiv_grad(input, tensor1, tensor2, *, value=1):
    """``g``, ``g * (value / tensor2)`` and ``-g * (tensor1 * value / (tensor2 * tensor2))``, the
    number ``value`` filled into a tensor and divided (eager's ``Scalar / Tensor``)."""
    out = ltorch.addcdiv(input, tensor1, tensor2, value=value)
    if not out.dtype.is_floating_point:
        return out
    g = get_grad(out)
    quotient = torch.full_like(tensor2, value) / tensor2
    put_operand_grads((input, tensor1, tensor2), (g, g * quotient, -g * (tensor1 * value / (tensor2 * tensor2))))
    return out


@register_grad(ltorch.hypot)
def hypot_grad(input, other):
    """``g * input / result`` and ``g * other / result``."""
    out = ltorch.hypot(input, other)
    g = get_grad(out)
    put_operand_grads((input, other), (g * input / out, g * other / out))
    return out


@register_grad(ltorch.logit)
def logit_grad(input, eps=None):
    """aten's ``logit_backward``: ``g / (x * (1 - x))``, NaN outside [0, 1] without ``eps`` and 0
    outside [eps, 1 - eps] with it (the bounds rounded to the dtype, as the kernel's)."""
    out = ltorch.logit(input, eps)
    if not (isinstance(input, torch.Tensor) and input.requires_grad and out.dtype.is_floating_point):
        return out
    g = get_grad(out)
    grad = g / (input * (1 - input))
    low = torch.tensor(0.0 if eps is None else float(eps), dtype=out.dtype)
    high, fill = (1.0, math.nan) if eps is None else ((1 - low).item(), 0.0)
    put_operand_grads((input,), (ltorch.where((input < low.item()) | (input > high), fill, grad),))
    return out


@register_grad(ltorch.sinc)
def sinc_grad(input):
    """Eager's ``sinc_backward``: ``g * ((x pi cos(x pi) - sin(x pi)) / (x x pi))``, 0 at x = 0."""
    out = ltorch.sinc(input)
    if not (input.requires_grad and input.dtype.is_floating_point):
        return out
    g = get_grad(out)
    x_pi, squared_pi = input * math.pi, input * input * math.pi
    grad = g * ((x_pi * ltorch.cos(x_pi) - ltorch.sin(x_pi)) / squared_pi)
    put_operand_grads((input,), (ltorch.where(squared_pi == 0.0, 0.0, grad),))
    return out


@register_grad(ltorch.entr)
def entr_grad(input):
    """``g * (-(1 + x.log()))``: NaN for x < 0 and -inf times the cotangent's sign at 0."""
    out = ltorch.entr(input)
    if input.requires_grad and input.dtype.is_floating_point:
        put_operand_grads((input,), (get_grad(out) * (-(1 + ltorch.log(input))),))
    return out


@register_grad(ltorch.ldexp)
def ldexp_grad(input, other):
    """``g * pow(2.0, other)`` and ``g * result * ln 2``."""
    out = ltorch.ldexp(input, other)
    if not out.dtype.is_floating_point:
        return out
    g = get_grad(out)
    x_grad = g * torch.pow(2.0, other) if input.requires_grad else None
    other_grad = g * out * math.log(2.0) if other.dtype.is_floating_point and other.requires_grad else None
    put_operand_grads((input, other), (x_grad, other_grad))
    return out


@register_grad(ltorch.mvlgamma)
def mvlgamma_grad(input, p):
    """Eager's ``mvlgamma_backward``: ``g * (arange(-p / 2 + 0.5, 0.5, 0.5) + x.unsqueeze(-1))
    .digamma().sum(-1)``, the digammas summed as one reduction."""
    out = ltorch.mvlgamma(input, p)
    if input.requires_grad and input.dtype.is_floating_point:
        shifts = ltorch.arange(-p / 2.0 + 0.5, 0.5, 0.5, dtype=input.dtype, device=input.device)
        terms = ltorch.digamma(shifts + input.unsqueeze(-1))
        put_operand_grads((input,), (get_grad(out) * ltorch.sum(terms, -1),))
    return out
