"""The stand-in ``fake_nvfuser_direct``'s arithmetic: unary, binary and ternary ops, reductions,
scans and normalization, each computed in the dtype nvFuser computes it in (csrc/ops/arith.cpp,
csrc/ops/composite.cpp, csrc/ops/normalization.cpp; the type rules in ``fake_nvfuser_promotion``).
"""

import math

import torch

import fake_nvfuser_allocation as allocation
import fake_nvfuser_checks as checks
import fake_nvfuser_layouts as layouts
from fake_nvfuser_ops import BITWISE, DEFAULT_BINARY, FLOAT_UNARY, IS_OPS, LOGICAL_BINARY, NO_HALF_KERNEL, SAME_DTYPE
from fake_nvfuser_promotion import DEFAULT, FLOAT_ONLY, FLOAT_OP, HALF, DataType
from fake_nvfuser_recording import TensorView, Val, _as, _check, _device, _elementwise, _fd, _operand, _record
from fake_nvfuser_recording import compute_types

# -- unary, binary and ternary ops (csrc/ops/arith.cpp, csrc/ops/composite.cpp) ------------------------


def _div(a, b):
    # ``div`` is C++'s operator /: integers truncate.
    if a.dtype.is_floating_point:
        return torch.true_divide(a, b)
    return torch.div(a, b, rounding_mode="trunc")


def _same_dtype_op(name, fn, out_dtype=None):
    def op(arg):
        dtype = _operand(arg)[1]
        if name in NO_HALF_KERNEL and dtype in HALF:
            _fd().unsupported.append(f"{name} of {DataType(dtype).name}")
        return _elementwise(name, fn, (arg,), dtype, out_dtype)

    return op


def _promoting_unary(name, fn, config, out_dtype=None):
    def op(arg):
        return _elementwise(name, fn, (arg,), compute_types(config, (arg,)), out_dtype)

    return op


def _promoting_binary(name, fn, config, out_dtype=None):
    def op(lhs, rhs):
        return _elementwise(name, fn, (lhs, rhs), compute_types(config, (lhs, rhs)), out_dtype)

    return op


def _constant_exponent(rhs, dtype):
    """The value of a ``pow`` exponent the generated code sees as a constant (``Val::isConst``): a
    Python number or a ``define_scalar`` constant that ``promoteValues`` leaves uncast
    (``optionalCast``, type_promotion.cpp: a scalar of the op's dtype or of its kind, not a Bool),
    else None."""
    is_val = isinstance(rhs, Val)
    if is_val and not rhs.const:
        return None
    kind = _operand(rhs)[1]
    uncast = kind == dtype or (kind != torch.bool and kind.is_floating_point == dtype.is_floating_point)
    return (rhs.sample if is_val else rhs) if uncast else None


def _pow(lhs, rhs):
    """``pow`` (default_op_config); codegen.cpp ``genPowerWithMul`` writes a constant exponent of
    1, 2 or 3 as that many multiplications (``x * x * x``, in the op's dtype), others call ``pow``."""
    dtype = compute_types(DEFAULT, (lhs, rhs))
    exponent = None if isinstance(rhs, TensorView) else _constant_exponent(rhs, dtype)
    if exponent is None or exponent not in (1, 2, 3):
        return _elementwise("pow", torch.pow, (lhs, rhs), dtype)

    def product(a, b):
        a = out = a.to(dtype)  # (not the Double a Double exponent would compute in: it is not read)
        for _ in range(int(exponent) - 1):
            out = out * a
        return out

    return _elementwise("pow", product, (lhs, rhs), dtype)


def _bitwise(name, fn, logical):
    def op(lhs, rhs):
        dtypes = [_operand(x)[1] for x in (lhs, rhs)]
        for dtype in dtypes:
            _check(
                not dtype.is_floating_point,
                "isIntegralType(v->dtype()) || isBooleanType(v->dtype())",
                f"Integer or boolean input is required for {name} but found {DataType(dtype).name}",
            )
        if dtypes == [torch.bool, torch.bool]:
            return getattr(_fd().ops, logical)(lhs, rhs)
        return _elementwise(name, fn, (lhs, rhs), compute_types(DEFAULT, (lhs, rhs)))

    return op


def _unary_ops(ops_):
    for name, fn in SAME_DTYPE.items():
        setattr(ops_, name, _same_dtype_op(name, fn))
    for name, fn in FLOAT_UNARY.items():
        setattr(ops_, name, _promoting_unary(name, fn, FLOAT_OP))
    for name, fn in IS_OPS.items():
        setattr(ops_, name, _same_dtype_op(name, fn, torch.bool))
    # neg: default_op_config, "as a workaround to #1541" (halves to Float, integers kept).
    ops_.neg = _promoting_unary("neg", torch.neg, DEFAULT)
    ops_.signbit = _promoting_unary("signbit", torch.signbit, DEFAULT, torch.bool)
    ops_.real, ops_.imag = _complex_part("real", torch.real), _complex_part("imag", torch.imag)


#: a complex dtype's real one (``real``/``imag``'s results: ``ops::newValLike`` of Float or Double)
_PART = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def _complex_part(name, fn):
    """``real``/``imag`` (csrc/ops/arith.cpp): a complex operand's part, of its real dtype; ``real``
    of any other is a ``set`` (a copy of its dtype), ``imag`` of one an error, where it is defined."""

    def op(arg):
        dtype = _operand(arg)[1]
        if dtype.is_complex:
            return _elementwise(name, lambda a: fn(a).clone(), (arg,), dtype, _PART[dtype])
        _check(name == "real", "false", "imag not supported for non-complex tensors")
        return _elementwise(name, torch.clone, (arg,), dtype)

    return op


def _binary_ops(ops_):
    for name, fn in DEFAULT_BINARY.items():
        setattr(ops_, name, _promoting_binary(name, fn, DEFAULT))
    ops_.pow = _pow
    ops_.div = _promoting_binary("div", _div, DEFAULT)
    ops_.truediv = _promoting_binary("truediv", torch.true_divide, FLOAT_OP)
    ops_.atan2 = _promoting_binary("atan2", torch.atan2, FLOAT_OP)
    # nextafter: float_only_op_config, checked before halves become Float: a Half one is an error.
    ops_.nextafter = _promoting_binary("nextafter", torch.nextafter, FLOAT_ONLY)
    for name, fn in LOGICAL_BINARY.items():
        setattr(ops_, name, _promoting_binary(name, fn, DEFAULT, torch.bool))
    for name, (fn, logical) in BITWISE.items():
        setattr(ops_, name, _bitwise(name, fn, logical))


# -- reductions, scans and normalization (csrc/ops/arith.cpp, csrc/ops/normalization.cpp) -----------------


def _reduce_dims(rank, dims):
    """The axes a reduction of a rank-``rank`` tensor reduces: ``canonicalizeAxes`` (ops/utils.cpp),
    each dim wrapped or refused (``wrapDim``); none of a 0-dim tensor (``reductionOpZeroDimTensor``)."""
    dims = range(rank) if dims is None else [dims] if isinstance(dims, int) else dims
    return sorted({checks.wrap_dim(d, rank) for d in dims}) if rank else []


def _reduced(arg, axes, keepdim):
    """The expansion rule of a reduction of ``arg`` over ``axes`` (its other dims are ``arg``'s), and
    what its scheduling refuses: on the H100 and the H200, nvFuser's normalization scheduler
    vectorized the innermost logical dim of a column-major input's cached copy, whose innermost
    allocated dim is the other one, and lowering refused it (a layer norm, test_cuda.py)."""
    fd = _fd()
    if arg.ndim - 1 in axes and any(layouts.innermost_permuted(spec) for _, spec in fd._inputs):
        fd.compile_errors.append(
            "Expected last_alloc_dim == vec_alloc_id . Vectorized dim for producer has to be from an inner most "
            "position. (Exception raised from validateAllocationVectorizedId at csrc/device_lower/validation.cpp)"
        )
    kept = [False if d in axes else e for d, e in enumerate(arg.expanded) if keepdim or d not in axes]
    return lambda out: kept


def _reduction(name, fn, identity_dtype):
    """``NVFUSER_DEFINE_REDUCTION_OP``'s three overloads: ``(arg, dtype)``, ``(arg, dim, keepdim,
    dtype)``, ``(arg, dims, keepdim, dtype)``. ``identity_dtype(input dtype, dtype)`` is the
    result's dtype (``sum``/``prod``: the given dtype, else Int for integers and bools, else the
    input's; ``max``/``min``: the input's, and no dtype may be given)."""

    def op(arg, dims=None, keepdim=False, dtype=DataType.Null, dim=None):
        if isinstance(dims, DataType):
            dims, dtype = None, dims
        if dim is not None:  # the int overload's keyword (ops.cpp: py::arg("dim"))
            dims = dim
        out_dtype = identity_dtype(arg.meta.dtype, dtype.value)
        init = _INITS.get(name, lambda d: None)(out_dtype)
        # (the overload without dims names all of them: none of a 0-dim tensor)
        named = range(arg.ndim) if dims is None else [dims] if isinstance(dims, int) else dims
        _check(len(named) > 0, "!axes.empty()", "No reduction axis specified")
        axes = _reduce_dims(arg.ndim, dims)
        if axes and out_dtype in HALF:  # no arithmetic of its half types (codegen.cpp; failed on the H100)
            _fd().unsupported.append(f"a {name} ReductionOp of {DataType(out_dtype).name}")

        def run(a):
            a = a.to(out_dtype)  # optionalCastStrict before the reduction
            if init is not None and any(a.shape[d] == 0 for d in axes):
                # (a reduction over an empty dim is a full of its init: RemoveEmptyPass; torch's raises)
                shape = [1 if d in axes else n for d, n in enumerate(a.shape) if keepdim or d not in axes]
                return torch.full(shape, init, dtype=out_dtype, device=a.device)
            if not axes:
                return a.clone()  # over no dims: reductionOpZeroDimTensor's set
            return _trivially_reduced(name, fn, a, axes, keepdim, [d for d in axes if arg.expanded[d]])

        rule = allocation.reduction(arg, axes, keepdim)
        return _record(name, run, (arg,), expanded=_reduced(arg, axes, keepdim), ids=rule)

    op.__name__ = name
    return op


def _trivially_reduced(name, fn, a, axes, keepdim, expanded):
    """A reduction whose reduced dims include expanded broadcasts (``bS{1 ex n}``), as Fuser's
    ``reductionOp`` computes it (csrc/ops/arith.cpp:1389 "[Trivial reductions]"): those dims are
    squeezed, the others reduced, then a ``sum`` is multiplied by the product of their extents and
    a ``prod`` raised to it (arith.cpp:1436-1452, the factor cast to the result's dtype); ``max``
    and ``min`` only squeeze (the same value as reducing the copies)."""
    if not expanded or name not in ("sum", "prod"):
        return fn(a, axes, keepdim)
    factor = math.prod(a.shape[d] for d in expanded)
    squeezed = a.narrow(expanded[0], 0, 1)
    for d in expanded[1:]:
        squeezed = squeezed.narrow(d, 0, 1)
    out = fn(squeezed, axes, keepdim)  # (the squeezed dims of extent 1 reduce to themselves)
    if out.device.type == "cuda":  # (``full``: a fake CUDA tensor under a FakeTensorMode, needing no driver)
        factor_t = torch.full((), factor, dtype=out.dtype, device=out.device)
    else:
        factor_t = torch.tensor(factor, dtype=out.dtype, device=out.device)
    return out * factor_t if name == "sum" else torch.pow(out, factor_t)


def _sum_dtype(arg_dtype, dtype):
    if dtype is not None:
        return dtype
    return arg_dtype if arg_dtype.is_floating_point or arg_dtype.is_complex else torch.int64


def _limit(op: str, low: bool):
    """``getMinimumValue`` (``low``) or ``getMaximumValue`` of a dtype (csrc/ops/utils.cpp): the
    init of ``max`` (``min``); a dtype without one (complex, UInt64) is refused as ``max`` (``min``)
    is defined."""

    def init(dtype):
        _check(dtype in _LIMITED, "false", f"Could not generate a {op} op for tensor with type: {DataType(dtype).name}")
        if dtype is torch.bool:
            return not low
        if dtype.is_floating_point:
            finfo = torch.finfo(dtype)
            return (finfo.min if low else finfo.max) if dtype in _FINITE else -float("inf") if low else float("inf")
        iinfo = torch.iinfo(dtype)
        return iinfo.min if low else iinfo.max

    return init


#: dtypes with a min and a max value (the cases of ``getMinimumValue``), of which the finite ones
_LIMITED = {torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool}
_LIMITED |= {getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu") if hasattr(torch, n)}
_FINITE = {getattr(torch, n) for n in ("float8_e4m3fn", "float8_e8m0fnu") if hasattr(torch, n)}
#: reduction -> its init of a dtype, where a reduction over an empty dim differs from torch's
_INITS = {"max": _limit("min", True), "min": _limit("max", False)}


def _max_dtype(arg_dtype, dtype):
    _check(dtype is None, "dtype == DataType::Null", "A dtype other than Null is not currently supported.")
    return arg_dtype


def _prod(a, dims, keepdim):
    for d in reversed(dims):
        a = torch.prod(a, d, keepdim=keepdim)
    return a


def _variance_dtype(dtype):
    # variance(): mean is sum(x) (in x's dtype) over a Double count, so halves give Float, integers Double.
    return torch.float32 if dtype in HALF else dtype if dtype.is_floating_point else torch.float64


def _no_axes(dims) -> None:
    """``reductionOp``'s check, reached through ``variance``'s mean (a sum)."""
    _check(len(dims) > 0, "!axes.empty()", "No reduction axis specified")


def _var(arg, dims, correction=1, keepdim=False):
    _check(correction >= 0, "correction >= 0", f"correction must be non-negative, but got {correction}")
    _no_axes(dims)
    out_dtype, axes = _variance_dtype(arg.meta.dtype), _reduce_dims(arg.ndim, dims)
    if arg.meta.dtype in HALF:  # its mean is a sum ReductionOp of the half dtype
        _fd().unsupported.append(f"a sum ReductionOp of {arg.dtype().name} (variance's mean)")
    return _record(
        "var",
        lambda a: torch.var(a.to(out_dtype), axes, correction=correction, keepdim=keepdim),
        (arg,),
        expanded=_reduced(arg, axes, keepdim),
        ids=allocation.reduction(arg, axes, keepdim),
    )


def _var_mean(arg, dims, correction=1, keepdim=False):
    _check(correction >= 0, "correction >= 0", f"correction must be non-negative, but got {correction}")
    dtype = arg.meta.dtype
    _check(
        dtype not in HALF,
        "!(dtype == DataType::Half ...)",
        f"variance_mean is not supported for {DataType(dtype).name} please upcast to float",
    )
    axes = _reduce_dims(arg.ndim, dims)
    return _record(
        "var_mean",
        lambda a: tuple(torch.var_mean(a, axes, correction=correction, keepdim=keepdim)),
        (arg,),
        expanded=_reduced(arg, axes, keepdim),
        ids=allocation.reduction(arg, axes, keepdim),
    )


def _welford(arg, dims):
    """``welford`` (python_direct ops.cpp:1857, ``WelfordRaw``, arith.cpp:1561): the mean, the sum of
    squared deviations (M2) in the input's dtype and the count (Index) over ``dims``; no 0-dim
    tensor, some dims. M2 is computed in float64 and rounded once, as a Welford's is near to."""
    _check(arg.ndim > 0, "tv->nDims() > 0", "Tried to reduce a 0-dim tensor")
    _no_axes(dims)
    axes = _reduce_dims(arg.ndim, dims)

    def run(a):
        wide = a.double()
        m2 = (wide - wide.mean(axes, keepdim=True)).square().sum(axes)
        count = math.prod(a.shape[d] for d in axes)
        return wide.mean(axes).to(a.dtype), m2.to(a.dtype), torch.full(m2.shape, count, device=a.device)

    return _record(
        "welford",
        run,
        (arg,),
        expanded=_reduced(arg, axes, False),
        ids=allocation.reduction(arg, axes, False),
    )


def _scan(name, fn):
    """``scan``: the input's dtype, halves included ("unlike ReductionOp, low-precision input is
    not upcast to float"), computed in it."""

    def op(arg, dim, init=None):
        _check(-arg.ndim <= dim < arg.ndim, "dim >= 0 && dim < ndim", f"Tried to access out of boundary index {dim}")
        return _record(name, lambda a: fn(a, dim).to(a.dtype), (arg,))

    op.__name__ = name
    return op


# -- where, sign and bitwise_not (csrc/ops/arith.cpp, csrc/ops/composite.cpp) ----------------------------


def _where(condition, x, y):
    _check(
        _operand(condition)[1] == torch.bool,
        "c->getDataType() == DataType::Bool",
        f"Condition should be of DataType Bool, not {_operand(condition)[1]}",
    )
    # where computes its common dtype without turning halves into Float.
    dtype = compute_types(DEFAULT, (x, y), cast_half_to_float=False)

    def run(c, a, b):
        device = _device((c, a, b))
        return torch.where(c, _as(a, dtype, device), _as(b, dtype, device))

    return _record("where", run, (condition, x, y))


def _sign(arg):
    # composite.cpp: where(gt(x, 0.), 1., where(lt(x, 0.), -1., 0.)) cast back to x's dtype.
    return _elementwise("sign", torch.sign, (arg,), _operand(arg)[1])


def _bitwise_not(arg):
    dtype = _operand(arg)[1]
    _check(
        not dtype.is_floating_point,
        "isBooleanType(v->dtype())",
        f"input must have integral or boolean type, but got {DataType(dtype).name}",
    )
    return _elementwise("bitwise_not", torch.bitwise_not, (arg,), dtype)
