"""A CPU stand-in for nvFuser's ``nvfuser_direct`` bindings, for tests: the same names, argument
conventions and type rules as the real module (NVIDIA/Fuser 81c4b22: ``python/python_direct/ops.cpp``
binds each ``fd.ops`` name to a C++ op of ``csrc/ops/*.cpp``, whose dtypes ``csrc/type_promotion.cpp``
decides), recording each definition and evaluating it with torch on whatever device the inputs are.

Each value carries a meta tensor of its shape and dtype, computed as the op is defined: dtype and
shape errors surface at definition time, as nvFuser's do. Ops compute as nvFuser's kernels do, in
the op's common dtype (``fake_nvfuser_promotion``: Half and BFloat16 in Float for arithmetic).
What nvFuser's generated code has no function for (a half ``ceil``: NVRTC errors on the H100)
fails at the first ``execute``, which checks its inputs against the declared layouts and replays
the ops. Layouts follow nvFuser's (``fake_nvfuser_layouts``): expanded broadcasts have stride 0,
and what nvFuser's schedulers refused on a GPU (a column-major normalization) fails to compile.
Outputs are allocated in the order nvFuser's ``AllocationDomainPass`` gives them (an input's stride
order, ``fake_nvfuser_allocation``) unless ``ops.stride_order`` pins one.

Symbolic extents are nvFuser's too: ``define_tensor`` takes -1 for a dim of any extent (1 is a
broadcast, other numbers constants: ``TensorViewBuilder::shape``), ``define_scalar(dtype=...)``
makes a scalar input, ``ops.size``/``ops.shape``/``tv.shape()`` give a tensor's extents as scalar
values, scalar arithmetic (``add``, ``mul``, ``div`` truncating, ``mod`` C++'s remainder) builds
more, and shapes, slice bounds, pad widths and iota lengths take them. While defining, a symbolic
extent stands as ``SYMBOLIC_EXTENT`` (only ranks and dtypes are checked against it, as nvFuser
concretizes symbolic extents when it executes); ``execute`` computes the real ones.
"""

import traceback

import torch

import fake_nvfuser_allocation as allocation
import fake_nvfuser_checks as checks
import fake_nvfuser_binding as binding
import fake_nvfuser_layouts as layouts
import fake_nvfuser_promotion as promotion
import fake_nvfuser_signatures as signatures
from fake_nvfuser_layouts import compute_tensor_descriptor  # noqa: F401 (a name of the bindings)
from fake_nvfuser_promotion import DEFAULT, FLOAT_ONLY, FLOAT_OP, HALF, PYTHON_TYPES, DataType
from fake_nvfuser_ops import BITWISE, DEFAULT_BINARY, FLOAT_UNARY, IS_OPS, LOGICAL_BINARY, NO_HALF_KERNEL, SAME_DTYPE

__version__ = "0.2.36+fake"


def version():
    return __version__


#: What a symbolic extent (a -1 dim, an Int scalar input and what is computed from them) stands as
#: while defining: a number most small divisors divide, so that shapes computed from it agree.
SYMBOLIC_EXTENT = 2 * 3 * 4 * 5 * 7
#: What the other scalar inputs stand as while defining, by dtype kind.
SYMBOLIC_SAMPLE = {True: 1.0, False: SYMBOLIC_EXTENT}

#: Every definition made, in order (tests count them).
definitions: list = []


class Val:
    """A scalar or tensor value of a definition: ``meta`` has its dtype and shape; ``expanded``
    says of each dim whether it is an expanded broadcast (``bS{1 ex n}``): extent 1 in the
    IterDomain, n in the tensor, which nvFuser allocates with stride 0. ``fake_nvfuser_allocation``
    keeps the rest of its layout: the inputs it depends on (``deps``), its dims' exact-map groups
    (``ids``, ``reduced``) and its allocation domain (``alloc``: logical dims, outermost first)."""

    deps, ids, reduced, alloc = frozenset(), (), (), None

    def __init__(self, fd, meta, symbolic=False, sample=None):
        #: ``sample``: a scalar's value while defining (a constant's own, a symbolic one's stand-in).
        self.fd, self.meta, self.symbolic, self.sample = fd, meta, symbolic, sample
        self.slot = fd._slots = fd._slots + 1
        self.expanded = (False,) * meta.ndim

    def is_symbolic(self):
        return self.symbolic

    def is_tensor(self):
        return isinstance(self, TensorView)


class TensorView(Val):
    @property
    def ndim(self):
        return self.meta.ndim

    def dtype(self):  # only a TensorView has one in the bindings (python_direct/ir.cpp)
        return DataType(self.meta.dtype)

    def shape(self):  # the (maybe expanded) extents as scalar values (python_direct ir.cpp)
        return ops.shape(self)


# -- type promotion (csrc/type_promotion.cpp: ``fake_nvfuser_promotion``) ------------------------------


def _operand(x):
    """``(is a tensor, dtype, rank)`` of an operand, as ``getValueType(Val*)`` sees it."""
    if isinstance(x, TensorView):
        return True, x.meta.dtype, x.meta.ndim
    if isinstance(x, Val):
        return False, x.meta.dtype, 0
    return False, PYTHON_TYPES[type(x)], 0


def compute_types(config, operands, cast_half_to_float=True):
    """The dtype nvFuser computes an op of ``operands`` in (``computeTypes``)."""
    return promotion.compute_types(config, [_operand(x) for x in operands], cast_half_to_float)


# -- recording ----------------------------------------------------------------------------------------

_current: list = []
_check = binding.nvf_check  # NVF_CHECK: a RuntimeError "Expected <condition> . <message>"


def _fd():
    assert _current, "nvfuser_direct: ops need an active FusionDefinition (with FusionDefinition() as fd)"
    return _current[-1]


def _record(name, fn, args, tensor_out=None, expanded=None, ids=None):
    """Defines one op: checks its operands belong to this definition, computes its outputs'
    metadata on meta tensors and records it for ``execute``. Its outputs are TensorViews when an
    operand is one (``promoteType(ValType)``) unless ``tensor_out`` says otherwise. ``expanded(out
    meta)``: which dims of an output are expanded broadcasts; by default an elementwise op's rule
    (``ops::newOutputDomain``: a dim is expanded where every operand of the output's rank has it so).
    ``ids(out)``: which operand dims an output's dims are exact-mapped to (``allocation.link``)."""
    fd = _fd()
    vals = list(_vals(args))
    for v in vals:
        assert v.fd is fd, f"nvfuser_direct.ops.{name}: a value of another FusionDefinition"
    if tensor_out is None:
        tensor_out = any(isinstance(v, TensorView) for v in vals)
    try:
        out = fn(*_bind(args, _defining))
    except RuntimeError:
        if not fd.symbolic:
            raise
        out = fn(*_bind(args, _leniently))
    outs = out if isinstance(out, tuple) else (out,)
    made = tuple(
        TensorView(fd, torch.empty_like(o, device="meta"))
        if tensor_out
        else Val(fd, torch.empty_like(o, device="meta"), sample=None if o.is_meta else o.item())
        for o in outs
    )
    for v in made:
        v.expanded = tuple(expanded(v.meta) if expanded else layouts.elementwise_expansion(vals, v.meta))
    allocation.link(fd, vals, made, ids)
    fd._ops.append((fn, args, made))
    fd.recorded.append(name)
    return made if isinstance(out, tuple) else made[0]


def _defining(v):
    """What a value stands as while defining: a tensor's meta tensor, a scalar's sample as a CPU
    0-dim tensor (so that shapes computed from it have extents)."""
    if v.sample is None:
        return v.meta
    return torch.tensor(v.sample, dtype=v.meta.dtype)


def _leniently(v):
    """What a value stands as while defining, where its stand-in shapes disagree: a tensor's
    extents other than 1 all ``SYMBOLIC_EXTENT``. nvFuser relates no symbolic extents while
    defining (an input's -1 dim of ``t // 2`` stands as ``SYMBOLIC_EXTENT`` as one of ``t`` does);
    ``execute`` computes with the real ones and fails where they disagree."""
    meta = _defining(v)
    if not v.is_tensor():
        return meta
    return meta.new_empty([1 if size == 1 else SYMBOLIC_EXTENT for size in meta.shape])


def _defined_by_scalars(a, params) -> bool:
    """Whether a shape op is being defined (``a`` a meta tensor) with scalar values among its
    shape ``params``: nvFuser relates them to ``a``'s extents only when it executes, so the
    stand-in takes the result's shape from them (its stand-in extents may disagree with ``a``'s)."""
    return a.is_meta and any(isinstance(p, torch.Tensor) for p in params)


def _ints(values):
    """A shape's extents as Python ints (scalar values evaluate to 0-dim tensors)."""
    return [int(v) for v in values]


def _evaluated_by_aten(name, out):
    """A gather's result is computed by ATen in a segment of its own (``ExprEval``), which hands it
    on laid out densely; a dim of it that is an expanded broadcast in the definition makes the
    next segment refuse it (seen on the H200 for gathers whose index came from a broadcast)."""
    for i, (size, expanded) in enumerate(zip(out.meta.shape, out.expanded)):
        if expanded:
            out.fd.compile_errors.append(
                " INTERNAL ASSERT FAILED at /workspace/Fuser/csrc/expr_evaluator.cpp:156, please report a bug with "
                f"repro script to NVFuser at https://github.com/NVIDIA/Fuser/issues. Expected logical_sizes[i] == 1 "
                f"|| t.stride(i) == 0 . IterDomain of the {name} result has expanded extent but input tensor has "
                f"size {size} and stride 1 in dimension {i}"
            )
    return out


def _vals(x):
    if isinstance(x, Val):
        yield x
    elif isinstance(x, (tuple, list)):
        for y in x:
            yield from _vals(y)


def _bind(x, value_of):
    if isinstance(x, Val):
        return value_of(x)
    if isinstance(x, (tuple, list)):
        return type(x)(_bind(v, value_of) for v in x)
    return x


def _device(values):
    return next(
        (v.device for v in values if isinstance(v, torch.Tensor) and v.ndim > 0),
        next((v.device for v in values if isinstance(v, torch.Tensor)), "cpu"),
    )


def _as(x, dtype, device):
    """An operand as a tensor of ``dtype`` (a scalar as a 0-dim one, which torch promotes like a
    scalar): what ``promoteValues`` casts it to."""
    if isinstance(x, torch.Tensor):
        return x.to(dtype)
    return torch.tensor(x, dtype=dtype, device=device)


def _elementwise(name, fn, operands, dtype, out_dtype=None):
    """Records ``fn`` of ``operands`` computed in ``dtype`` (each operand cast to it first, as
    ``promoteValues`` does), its result of ``out_dtype`` (``dtype`` by default). A Double scalar
    stays Double in a Float op (``optionalCast`` casts no floating scalar to another floating
    type): the generated code computes ``float op double`` in double, and rounds the result."""
    out_dtype = dtype if out_dtype is None else out_dtype
    if dtype.is_floating_point and any(not t and d == torch.float64 for t, d, _ in map(_operand, operands)):
        dtype = torch.float64

    def run(*args):
        device = _device(args)
        return fn(*(_as(a, dtype, device) for a in args)).to(out_dtype)

    return _record(name, run, tuple(operands))


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
            return getattr(ops, logical)(lhs, rhs)
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


def _binary_ops(ops_):
    for name, fn in DEFAULT_BINARY.items():
        setattr(ops_, name, _promoting_binary(name, fn, DEFAULT))
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
    dims = range(rank) if dims is None else [dims] if isinstance(dims, int) else dims
    return sorted({d % rank for d in dims}) if rank else []


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

    def op(arg, dims=None, keepdim=False, dtype=DataType.Null):
        if isinstance(dims, DataType):
            dims, dtype = None, dims
        out_dtype = identity_dtype(arg.meta.dtype, dtype.value)
        axes = _reduce_dims(arg.ndim, dims)
        if axes and out_dtype in HALF:  # no arithmetic of its half types (codegen.cpp; failed on the H100)
            _fd().unsupported.append(f"a {name} ReductionOp of {DataType(out_dtype).name}")

        def run(a):
            a = a.to(out_dtype)  # optionalCastStrict before the reduction
            return fn(a, axes, keepdim) if axes else a.clone()  # over no dims: reductionOpZeroDimTensor's set

        rule = allocation.reduction(arg, axes, keepdim)
        return _record(name, run, (arg,), expanded=_reduced(arg, axes, keepdim), ids=rule)

    op.__name__ = name
    return op


def _sum_dtype(arg_dtype, dtype):
    if dtype is not None:
        return dtype
    return torch.int64 if not arg_dtype.is_floating_point else arg_dtype


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


def _var(arg, dims, correction=1, keepdim=False):
    _check(correction >= 0, "correction >= 0", f"correction must be non-negative, but got {correction}")
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


def _scan(name, fn):
    """``scan``: the input's dtype, halves included ("unlike ReductionOp, low-precision input is
    not upcast to float"), computed in it."""

    def op(arg, dim, init=None):
        _check(-arg.ndim <= dim < arg.ndim, "dim >= 0 && dim < ndim", f"Tried to access out of boundary index {dim}")
        return _record(name, lambda a: fn(a, dim).to(a.dtype), (arg,))

    op.__name__ = name
    return op


# -- data movement and factories (csrc/ops/alias.cpp, indexing.cpp, arith.cpp) -------------------------


def _broadcast_in_dim(a, shape, broadcast_dims):
    if _defined_by_scalars(a, shape):
        return a.new_empty(_ints(shape))
    view = [1] * len(shape)
    for i, d in enumerate(broadcast_dims):
        view[d] = a.shape[i]
    return a.reshape(view).expand(_ints(shape))


def _slice(a, start, end, strides=None, manual_normalization=False):
    strides = strides or [1] * a.ndim
    if _defined_by_scalars(a, (*start, *end)):  # the bounds taken as in range (samples may cross)
        return a.new_empty([max(int(e) - int(s), 0) for s, e in zip(start, end)])
    return a[tuple(slice(int(s), int(e), st) for s, e, st in zip(start, end, strides))]


def _reshape(a, shape):
    # While defining, a symbolic extent stands as its sample: a reshape to constants (the trace knows
    # the extent's value where it reshapes) relates the two only when nvFuser executes.
    sampled = a.is_meta and SYMBOLIC_EXTENT in a.shape
    return a.new_empty(_ints(shape)) if sampled or _defined_by_scalars(a, shape) else a.reshape(_ints(shape))


def _padded_sizes(shape, widths) -> list:
    """``shape`` padded by torch's ``widths`` (innermost dim first), no extent below 0."""
    sizes = list(shape)
    for i in range(len(widths) // 2):
        d = len(sizes) - 1 - i
        sizes[d] = max(sizes[d] + widths[2 * i] + widths[2 * i + 1], 0)
    return sizes


def _pad(arg, pad_widths, value=None):
    checks.pad(arg.ndim, pad_widths, arg.meta.dtype, None if value is None else _operand(value)[1])

    def run(a, widths, v):
        if isinstance(v, torch.Tensor):  # a scalar Val: its value (none yet while defining, on meta)
            v = 0 if v.device.type == "meta" else v.item()
        if _defined_by_scalars(a, widths):
            # Scalar widths stand as samples while defining: nvFuser relates them to the extents only
            # when it executes, so none is negative here (a constant extent minus a sampled size).
            return a.new_empty(_padded_sizes(a.shape, _ints(widths)))
        return torch.nn.functional.pad(a, _ints(widths), value=0 if v is None else v)

    rule = allocation.padded(arg, list(pad_widths))
    return _record("pad", run, (arg, list(pad_widths), value), expanded=layouts.none_expanded, ids=rule)


def _cat(tensors, dim=0, manual_padding=False):
    checks.cat([t.meta.dtype for t in tensors])
    rule = allocation.catted(list(tensors), dim)
    return _record("cat", lambda ts: torch.cat(ts, dim), (list(tensors),), expanded=layouts.none_expanded, ids=rule)


def _iota(length, start=None, step=None, dtype=DataType.Int):
    checks.iota(*(None if v is None else _operand(v)[1] for v in (length, start, step)), dtype)
    fd = _fd()

    def run(n, s, st):
        # Index::iota: start + step * index in a scalar of dtype (a half one computes in Float).
        compute = torch.float32 if dtype.value in HALF else dtype.value
        index = torch.arange(int(n), dtype=compute, device=fd._device)
        return (index * (1 if st is None else st) + (0 if s is None else s)).to(dtype.value)

    new = allocation.new_dims
    return _record("iota", run, (length, start, step), tensor_out=True, expanded=layouts.none_expanded, ids=new)


def _full(shape, fill_value, dtype):
    fd = _fd()
    return _record(
        "full",
        lambda s, v: (
            v.to(dtype.value).expand(_ints(s)).to(fd._device)
            if isinstance(v, torch.Tensor)
            else torch.full(_ints(s), v, dtype=dtype.value, device=fd._device)
        ),
        (list(shape), fill_value),
        tensor_out=True,
        expanded=layouts.none_expanded,
        ids=allocation.new_dims,
    )


def _cast(arg, dtype):
    return _record("cast", lambda a: _as(a, dtype.value, _device((a,))), (arg,))


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


class _Ops:
    """``fd.ops``: the ops of ``nvfuser_direct.ops`` the translators use, and a few more."""

    def __init__(self):
        _unary_ops(self)
        _binary_ops(self)
        self.sum = _reduction("sum", lambda a, d, k: torch.sum(a, d, keepdim=k), _sum_dtype)
        self.prod = _reduction("prod", _prod, _sum_dtype)
        self.max = _reduction("max", lambda a, d, k: torch.amax(a, d, keepdim=k), _max_dtype)
        self.min = _reduction("min", lambda a, d, k: torch.amin(a, d, keepdim=k), _max_dtype)
        self.var, self.var_mean = _var, _var_mean
        self.cumsum, self.cumprod = _scan("cumsum", torch.cumsum), _scan("cumprod", torch.cumprod)
        self.pad, self.cat, self.iota, self.full, self.cast = _pad, _cat, _iota, _full, _cast
        self.where, self.sign, self.bitwise_not = _where, _sign, _bitwise_not
        self.logical_not = lambda arg: _elementwise("logical_not", torch.logical_not, (arg,), torch.bool)

    def broadcast_in_dim(self, arg, shape, broadcast_dims):
        broadcast_dims = checks.broadcast_in_dim(arg, shape, broadcast_dims, SYMBOLIC_EXTENT)
        return _record(
            "broadcast_in_dim",
            _broadcast_in_dim,
            (arg, list(shape), list(broadcast_dims)),
            expanded=layouts.broadcast_in_dim_expansion(arg, shape, broadcast_dims),
            ids=allocation.broadcast_in_dim(arg, broadcast_dims),
        )

    def reshape(self, arg, new_shape):
        rule = allocation.reshaped(arg)
        return _record("reshape", _reshape, (arg, list(new_shape)), expanded=layouts.none_expanded, ids=rule)

    def size(self, arg, dim):
        """``size``: the (maybe expanded) extent of ``arg`` at ``dim`` (csrc/ops/arith.cpp), an Int scalar."""
        return _record("size", lambda a: torch.tensor(a.shape[dim]), (arg,), tensor_out=False)

    def shape(self, arg):
        return [self.size(arg, d) for d in range(arg.ndim)]

    def permute(self, arg, dims):
        checks.permute(arg.ndim, dims)
        return _record(
            "permute",
            lambda a, d: a.permute(d),
            (arg, list(dims)),
            expanded=lambda out: [arg.expanded[d] for d in dims],
            ids=allocation.permuted(arg, dims),
        )

    def slice(self, arg, start_indices, end_indices, strides=None, manual_normalization=False):
        checks.slice_(arg, start_indices, end_indices, strides)
        return _record(
            "slice",
            _slice,
            (arg, list(start_indices), list(end_indices), strides, manual_normalization),
            expanded=layouts.none_expanded,
            ids=allocation.sliced(arg, list(start_indices), list(end_indices)),
        )

    def squeeze(self, arg, dims, squeeze_expanded=False):
        dims = checks.squeeze(arg, list(dims), squeeze_expanded, SYMBOLIC_EXTENT)
        kept = [e for d, e in enumerate(arg.expanded) if d not in dims]
        rule = allocation.squeezed(arg, dims)
        return _record("squeeze", layouts.squeezed, (arg, dims), lambda out: kept, ids=rule)

    def index_select(self, arg, index, dim):
        # indexing.cpp indexSelect: the index's IterDomain at dim, arg's elsewhere.
        expanded = [index.expanded[0] if d == dim % arg.ndim else e for d, e in enumerate(arg.expanded)]
        out = _record(
            "index_select",
            lambda a, i: torch.index_select(a, dim, i),
            (arg, index),
            lambda o: expanded,
            ids=allocation.new_dims,
        )
        return _evaluated_by_aten("index_select", out)

    def take_along_axis(self, arg, index, dim):
        checks.indexing(arg, index, dim)
        out = _record(
            "take_along_axis",
            lambda a, i: torch.take_along_dim(a, i, dim),
            (arg, index),
            expanded=layouts.take_along_axis_expansion(arg, index, dim),
            ids=allocation.new_dims,
        )
        return _evaluated_by_aten("take_along_axis", out)

    def gather(self, arg, index, dim):
        checks.indexing(arg, index, dim)
        # indexing.cpp gather: the index's IterDomains.
        out = _record(
            "gather",
            lambda a, i: torch.gather(a, dim, i),
            (arg, index),
            expanded=lambda o: index.expanded,
            ids=allocation.new_dims,
        )
        return _evaluated_by_aten("gather", out)

    def stride_order(self, arg, stride_order):
        """A ``set`` of ``arg`` allocated in ``stride_order`` (``define_tensor``'s convention; ``[]``:
        just a set): an allocation domain of its own, which allocation order inference leaves alone."""
        allocation.check_stride_order(arg, stride_order)
        out = _record("stride_order", torch.clone, (arg,))
        if stride_order:
            out.alloc = allocation.stride_order_allocation(list(stride_order), arg.ndim)
        return out


ops = _Ops()
signatures.enforce(ops)  # the calls nvfuser_direct 0.2.36's overloads take, and no others


class FusionDefinition:
    """Records ``define_tensor`` / ``define_scalar`` / ``ops.*`` / ``add_output`` inside its
    ``with`` block; ``execute(inputs)`` evaluates them with torch."""

    def __init__(self):
        self.ops = ops
        self._inputs, self._ops, self._outputs, self.recorded = [], [], [], []
        #: What the definition asks that nvFuser's code generation has no kernel for: compiling
        #: it (the first ``execute``) raises.
        self.unsupported: list = []
        #: The messages of what nvFuser's scheduling or segments refuse: compiling raises the first.
        self.compile_errors: list = []
        self._slots = 0
        #: The exact-map groups of its dims (``fake_nvfuser_allocation``).
        self.groups = allocation.Groups()
        #: Whether it has a symbolic extent or scalar input: its stand-in shapes may disagree.
        self.symbolic = False
        self._device = "meta"
        self.executions = 0
        definitions.append(self)

    def __enter__(self):
        _current.append(self)
        return self

    def __exit__(self, exception_type, exception_value, exception_traceback):
        _current.remove(self)
        if exception_type is not None:  # as nvfuser_direct/__init__.py's: printed, and propagated
            print(f"Exception occurred: {exception_type.__name__}: {exception_value}")
            print("Traceback (most recent call last):")
            traceback.print_tb(exception_traceback)

    def define_tensor(self, *args, **kwargs):
        signatures.check_call("define_tensor", signatures.DEFINE_TENSOR, args, kwargs)
        return self._define_tensor(*args, **kwargs)

    def _define_tensor(self, shape, contiguity=False, dtype=DataType.Float, is_cpu=False, stride_order=()):
        for i, s in enumerate(shape):  # verifyShape (python_common/python_utils.cpp)
            binding.nvf_check(
                s >= -1,
                "shape[i] >= -1",
                f"The value {s} at index {i} was neither symbolic(-1), zero_element(0), broadcast(1), or static(>1).",
            )
        if isinstance(contiguity, bool):
            contiguity = layouts.contiguity_vec(shape, stride_order, contiguity)
        binding.nvf_check(
            len(contiguity) == len(shape),
            "contiguity.size() == shape.size()",
            f"Length of contiguity argument ({len(contiguity)}) must match that of shape argument ({len(shape)})",
        )
        binding.nvf_check(not (is_cpu and shape), "!is_cpu", "CPU non-scalar tensor is not supported!")
        assert not stride_order or sorted(stride_order) == list(range(len(shape))), f"bad stride_order {stride_order}"
        self.symbolic = self.symbolic or -1 in shape
        tv = TensorView(
            self, torch.empty([SYMBOLIC_EXTENT if s < 0 else s for s in shape], dtype=dtype.value, device="meta")
        )
        spec = (list(shape), list(contiguity), dtype, list(stride_order))
        # validateContiguity (TensorDomain's constructor): None exactly at the broadcasts, which are
        # the dims of extent 1 and those getExpanded (python_utils.cpp) expands: None, extent not 1.
        binding.nvf_check(
            all(size != 1 or layouts.broadcast_at(spec, d) for d, size in enumerate(shape)),
            "expect_null != contiguity.at(i).has_value()",
            "The contiguity of a broadcast/reduction dimension must be None. The contiguity of a "
            f"non-broadcast/reduction dimension must be true/false. contiguity=[{contiguity}]",
        )
        tv.expanded = tuple(size != 1 and layouts.broadcast_at(spec, d) for d, size in enumerate(shape))
        allocation.define_input(self, tv, stride_order)
        self._inputs.append((tv, spec))
        return tv

    def define_scalar(self, *args, **kwargs):
        signatures.check_call("define_scalar", signatures.DEFINE_SCALAR, args, kwargs)
        if args and isinstance(args[0], DataType):  # the first overload, define_scalar(dtype), by position
            return self._define_scalar(None, *args, **kwargs)
        return self._define_scalar(*args, **kwargs)  # (a value of None is symbolic too: monostate)

    def _define_scalar(self, value=None, dtype=None):
        if value is None:  # symbolic: an input of the fusion (of Double unless told)
            dtype = dtype or DataType.Double
            sample = SYMBOLIC_SAMPLE[dtype.value.is_floating_point] if dtype != DataType.Bool else True
            v = Val(self, torch.ones((), dtype=dtype.value, device="meta"), symbolic=True, sample=sample)
            self.symbolic = True
            self._inputs.append((v, dtype))
            return v
        # A constant: of the number's own type (a float a Double, an int or a bool an Int: pybind11
        # tries the variant's double, then int64_t, which takes a bool) unless told; castToDtype
        # turns it into the dtype's kind (0 with Double is 0.0).
        dtype = dtype or DataType(PYTHON_TYPES[type(value)])
        return _record("define_scalar", lambda: torch.tensor(value, dtype=dtype.value), (), tensor_out=False)

    def add_output(self, output):
        assert isinstance(output, Val) and output.fd is self, "add_output: a value of this FusionDefinition"
        self._outputs.append(output)

    def execute(self, inputs, *, device=None, save_repro_inputs=False, _enable_options=(), _disable_options=()):
        # validate_definition (nvfuser_direct/__init__.py), then the bindings' inputs and device
        # (fake_nvfuser_binding); FusionKernelRuntime::runWithInputs counts them.
        if not self._outputs:
            raise NotImplementedError("Fusion is empty!")
        index = binding.device_index(device)
        inputs = promotion.execute_arguments(inputs)
        binding.nvf_check(
            len(inputs) == len(self._inputs),
            "(args.size()) == (std::ssize(segmented_fusion_->inputs()))",
            f"Found {len(inputs)} vs {len(self._inputs)}. Inputs were not set up correctly.",
        )
        if self.unsupported:
            raise RuntimeError(f"CUDA NVRTC compile error: nvFuser has no kernel for {self.unsupported[0]}")
        if self.compile_errors:
            raise RuntimeError(self.compile_errors[0])
        env = {}
        for i, ((val, spec), arg) in enumerate(zip(self._inputs, inputs)):
            binding.bind(spec, arg, i)
            env[val.slot] = arg
        self._device = self.device = binding.execution_device(inputs, index)
        for fn, args, vals in self._ops:
            out = fn(*_bind(args, lambda v: env[v.slot]))
            for v, r in zip(vals, out if isinstance(out, tuple) else (out,)):
                env[v.slot] = r
        self.executions += 1
        # Outputs in AllocationDomainPass's order (fake_nvfuser_allocation), expanded dims of stride 0.
        return [layouts.allocated(env[o.slot], o.expanded, allocation.order(self, o)) for o in self._outputs]
