"""A CPU stand-in for nvFuser's ``nvfuser_direct`` bindings, for tests: the same names and argument
conventions as the real module (NVIDIA/Fuser 81c4b22, ``python/nvfuser_direct/__init__.py`` and
``python/python_direct/{ir,ops,bindings}.cpp``), recording each definition and evaluating it with
torch on whatever device the inputs are.

Each value carries a meta tensor of its shape and dtype, computed as the op is defined, so that
``tv.dtype()`` answers as nvFuser's does and shape errors surface at definition time, as
nvFuser's do. ``execute`` checks that its inputs have the dtypes, shapes, contiguity and stride
order the definition declared (nvFuser would reject or misread them), then replays the ops.
"""

import enum

import torch

__version__ = "0.2.36+fake"


def version():
    return __version__


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


#: Every definition made, in order (tests count them).
definitions: list = []


def compute_tensor_descriptor(sizes, strides):
    """``(contiguity, stride_order)`` of a tensor, a port of nvFuser's computeTensorDescriptor:
    contiguity in allocation order (None for broadcast dims), stride order per logical dim."""
    assert len(sizes) == len(strides), "compute_tensor_descriptor: Sizes and strides must have the same length"
    dims = [dict(index=i, size=s, stride=st, order=-1, contiguity=None)
            for i, (s, st) in enumerate(zip(sizes, strides))]
    assert all(d["stride"] >= 0 for d in dims), "negative stride on tensor is not supported"
    ordered = sorted((d for d in dims if d["stride"] != 0), key=lambda d: -d["stride"])
    for d in dims:
        if d["stride"] == 0:
            ordered.insert(d["index"], d)

    def broadcast(d):
        return d["stride"] == 0 or d["size"] == 1

    n, i = len(sizes), 0
    while i < n:
        ordered[i]["order"] = n - 1 - i
        if not broadcast(ordered[i]):
            left, expected = i, 1
            i += 1
            while i < n:
                ordered[i]["order"] = n - 1 - i
                if not broadcast(ordered[i]):
                    expected = ordered[i]["stride"] * ordered[i]["size"]
                    break
                i += 1
            ordered[left]["contiguity"] = ordered[left]["stride"] == expected
        else:
            i += 1
    stride_order = [-1] * n
    for d in ordered:
        stride_order[d["index"]] = d["order"]
    return [d["contiguity"] for d in ordered], stride_order


class Val:
    """A scalar or tensor value of a definition: ``meta`` has its dtype and shape."""

    def __init__(self, fd, meta, symbolic=False):
        self.fd, self.meta, self.symbolic = fd, meta, symbolic
        self.slot = fd._slots = fd._slots + 1

    def is_symbolic(self):
        return self.symbolic

    def is_tensor(self):
        return isinstance(self, TensorView)

    def dtype(self):
        return DataType(self.meta.dtype)


class TensorView(Val):
    @property
    def ndim(self):
        return self.meta.ndim


_current: list = []


def _fd():
    assert _current, "nvfuser_direct: ops need an active FusionDefinition (with FusionDefinition() as fd)"
    return _current[-1]


def _record(name, fn, args, kwargs=None):
    """Defines one op: checks its operands belong to this definition, computes its outputs'
    metadata on meta tensors and records it for ``execute``."""
    fd, kwargs = _fd(), kwargs or {}
    for v in _vals((args, kwargs)):
        assert v.fd is fd, f"nvfuser_direct.ops.{name}: a value of another FusionDefinition"
    out = fn(*_bind(args, lambda v: v.meta), **_bind(kwargs, lambda v: v.meta))
    outs = out if isinstance(out, tuple) else (out,)
    vals = tuple((TensorView if isinstance(o, torch.Tensor) and o.ndim >= 0 and o.device.type == "meta" else Val)(fd, o)
                 for o in outs)
    fd._ops.append((fn, args, kwargs, vals))
    fd.recorded.append(name)
    return vals if isinstance(out, tuple) else vals[0]


def _vals(x):
    if isinstance(x, Val):
        yield x
    elif isinstance(x, (tuple, list)):
        for y in x:
            yield from _vals(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _vals(y)


def _bind(x, value_of):
    if isinstance(x, Val):
        return value_of(x)
    if isinstance(x, dict):
        return {k: _bind(v, value_of) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_bind(v, value_of) for v in x)
    return x


def _tensor(x, like):
    """A Python scalar as the 0-dim tensor torch promotes like a scalar."""
    if isinstance(x, torch.Tensor):
        return x
    device = like.device if isinstance(like, torch.Tensor) else "cpu"
    return torch.tensor(x, device=device)


def _div(a, b):
    if not any(isinstance(x, float) or (isinstance(x, torch.Tensor) and x.dtype.is_floating_point) for x in (a, b)):
        return torch.div(_tensor(a, b), b, rounding_mode="trunc")  # nvFuser's integer div truncates
    return torch.true_divide(a, b)


_UNARY = {
    "abs": torch.abs, "neg": torch.neg, "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1, "log": torch.log,
    "log1p": torch.log1p, "log2": torch.log2, "log10": torch.log10, "sin": torch.sin, "cos": torch.cos,
    "tan": torch.tan, "tanh": torch.tanh, "sinh": torch.sinh, "cosh": torch.cosh, "asin": torch.asin,
    "acos": torch.acos, "atan": torch.atan, "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh,
    "erf": torch.erf, "erfc": torch.erfc, "erfinv": torch.erfinv, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
    "reciprocal": torch.reciprocal, "sign": torch.sign, "signbit": torch.signbit, "floor": torch.floor,
    "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc, "isfinite": torch.isfinite,
    "bitwise_not": torch.bitwise_not, "lgamma": torch.lgamma, "relu": torch.relu, "sigmoid": torch.sigmoid,
    "isnan": torch.isnan, "isinf": torch.isinf, "logical_not": torch.logical_not, "set": torch.clone,
    "segment_set": torch.clone,
}
_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": _div, "truediv": torch.true_divide,
    "pow": torch.pow, "fmod": torch.fmod, "remainder": torch.remainder, "maximum": torch.maximum,
    "minimum": torch.minimum, "atan2": torch.atan2, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le,
    "gt": torch.gt, "ge": torch.ge, "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or,
    "bitwise_xor": torch.bitwise_xor, "nextafter": torch.nextafter, "logical_and": torch.logical_and,
    "logical_or": torch.logical_or,
}


def _unary_op(name, fn):
    def op(arg):
        return _record(name, lambda a: fn(_tensor(a, a)) if not isinstance(a, torch.Tensor) else fn(a), (arg,))

    op.__name__ = name
    return op


def _binary_op(name, fn):
    def op(lhs, rhs):
        def run(a, b):
            if name in ("maximum", "minimum", "atan2", "nextafter", "fmod", "remainder", "pow"):
                if not isinstance(a, torch.Tensor):
                    a = _tensor(a, b)
                elif not isinstance(b, torch.Tensor):
                    b = _tensor(b, a)
            return fn(a, b)

        return _record(name, run, (lhs, rhs))

    op.__name__ = name
    return op


def _dims_of(arg, dims):
    return [d % arg.ndim for d in ([dims] if isinstance(dims, int) else dims)]


def _reduction(name, fn):
    def op(arg, dims=None, keepdim=False, dtype=DataType.Null):
        if isinstance(dims, DataType):  # the (arg, dtype) overload: every dim
            dims, dtype = None, dims

        def run(a):
            ds = list(range(a.ndim)) if dims is None else _dims_of(a, dims)
            out = fn(a, ds, keepdim)
            return out if dtype in (None, DataType.Null) else out.to(dtype.value)

        return _record(name, run, (arg,))

    op.__name__ = name
    return op


def _sum(a, dims, keepdim):
    return torch.sum(a, dims, keepdim=keepdim, dtype=a.dtype if a.dtype.is_floating_point else torch.int64)


def _prod(a, dims, keepdim):
    out = a if a.dtype.is_floating_point else a.to(torch.int64)
    for d in sorted(dims, reverse=True):
        out = torch.prod(out, d, keepdim=keepdim)
    return out


def _broadcast_in_dim(a, shape, broadcast_dims):
    assert len(broadcast_dims) == a.ndim, "broadcast_in_dim: one broadcast dim per input dim"
    view = [1] * len(shape)
    for i, d in enumerate(broadcast_dims):
        view[d] = a.shape[i]
    return a.reshape(view).expand(list(shape))


def _slice(a, start, end, strides=None, manual_normalization=False):
    strides = strides or [1] * a.ndim
    return a[tuple(slice(s, e, st) for s, e, st in zip(start, end, strides))]


def _pad(a, pad_widths, value=None):
    assert len(pad_widths) <= 2 * a.ndim, "Number of pad widths must be at most twice the input dimension"
    return torch.nn.functional.pad(a, list(pad_widths), value=0 if value is None else value)


def _iota(fd, length, start=None, step=None, dtype=DataType.Int):
    start, step = 0 if start is None else start, 1 if step is None else step
    return torch.arange(length, dtype=dtype.value, device=fd._device) * step + start


class _Ops:
    """``fd.ops``: the ops of ``nvfuser_direct.ops`` the translators use, and a few more."""

    def __init__(self):
        for name, fn in _UNARY.items():
            setattr(self, name, _unary_op(name, fn))
        for name, fn in _BINARY.items():
            setattr(self, name, _binary_op(name, fn))
        self.sum = _reduction("sum", _sum)
        self.prod = _reduction("prod", _prod)
        self.max = _reduction("max", lambda a, d, k: torch.amax(a, d, keepdim=k))
        self.min = _reduction("min", lambda a, d, k: torch.amin(a, d, keepdim=k))

    def where(self, condition, x, y):
        return _record("where", lambda c, a, b: torch.where(c, a, b), (condition, x, y))

    def cast(self, arg, dtype):
        return _record("cast", lambda a: _tensor(a, a).to(dtype.value), (arg,))

    def broadcast_in_dim(self, arg, shape, broadcast_dims):
        return _record("broadcast_in_dim", _broadcast_in_dim, (arg, list(shape), list(broadcast_dims)))

    def reshape(self, arg, new_shape):
        return _record("reshape", lambda a, s: a.reshape(s), (arg, list(new_shape)))

    def permute(self, arg, dims):
        assert len(dims) == arg.ndim, "Operator permute expects `dims` argument to have the same length as input!"
        return _record("permute", lambda a, d: a.permute(d), (arg, list(dims)))

    def slice(self, arg, start_indices, end_indices, strides=None, manual_normalization=False):
        return _record("slice", _slice, (arg, list(start_indices), list(end_indices), strides, manual_normalization))

    def squeeze(self, arg, dims, squeeze_expanded=False):
        return _record("squeeze", lambda a, d: a.squeeze(tuple(d)), (arg, list(dims)))

    def cat(self, tensors, dim=0, manual_padding=False):
        return _record("cat", lambda ts, d: torch.cat(ts, d), (list(tensors), dim))

    def pad(self, arg, pad_widths, value=None):
        return _record("pad", _pad, (arg, list(pad_widths), value))

    def full(self, shape, fill_value, dtype):
        fd = _fd()
        return _record("full", lambda s, v: torch.full(s, v, dtype=dtype.value, device=fd._device),
                       (list(shape), fill_value))

    def iota(self, length, start=None, step=None, dtype=DataType.Int):
        fd = _fd()
        return _record("iota", lambda n, s, st: _iota(fd, n, s, st, dtype), (length, start, step))

    def var(self, arg, dims, correction=1, keepdim=False):
        return _record("var", lambda a: torch.var(a, dims, correction=correction, keepdim=keepdim), (arg,))

    def var_mean(self, arg, dims, correction=1, keepdim=False):
        return _record("var_mean", lambda a: tuple(torch.var_mean(a, dims, correction=correction, keepdim=keepdim)),
                       (arg,))

    def cumsum(self, arg, dim, init=None):
        return _record("cumsum", lambda a: torch.cumsum(a, dim), (arg,))

    def cumprod(self, arg, dim, init=None):
        return _record("cumprod", lambda a: torch.cumprod(a, dim), (arg,))

    def index_select(self, arg, index, dim):
        return _record("index_select", lambda a, i: torch.index_select(a, dim, i), (arg, index))

    def take_along_axis(self, arg, index, dim):
        assert arg.ndim == index.ndim, "Tensor arguments have different dimensions"
        return _record("take_along_axis", lambda a, i: torch.take_along_dim(a, i, dim), (arg, index))

    def gather(self, arg, index, dim):
        assert arg.ndim == index.ndim, "Tensor arguments have different dimensions"
        return _record("gather", lambda a, i: torch.gather(a, dim, i), (arg, index))


ops = _Ops()


class FusionDefinition:
    """Records ``define_tensor`` / ``define_scalar`` / ``ops.*`` / ``add_output`` inside its
    ``with`` block; ``execute(inputs)`` evaluates them with torch."""

    def __init__(self):
        self.ops = ops
        self._inputs, self._ops, self._outputs, self.recorded = [], [], [], []
        self._slots = 0
        self._device = "meta"
        self.executions = 0
        definitions.append(self)

    def __enter__(self):
        _current.append(self)
        return self

    def __exit__(self, *exc):
        _current.remove(self)

    def define_tensor(self, shape, contiguity=False, dtype=DataType.Float, is_cpu=False, stride_order=()):
        assert all(s >= -1 for s in shape), f"define_tensor: bad shape {shape}"
        assert not (is_cpu and shape), "CPU non-scalar tensor is not supported!"
        if isinstance(contiguity, bool):
            contiguity = [None if s == 1 else contiguity for s in shape]
        assert len(contiguity) == len(shape), "Length of contiguity argument must match that of shape argument"
        assert not stride_order or sorted(stride_order) == list(range(len(shape))), f"bad stride_order {stride_order}"
        tv = TensorView(self, torch.empty([max(s, 1) for s in shape], dtype=dtype.value, device="meta"))
        self._inputs.append((tv, (list(shape), list(contiguity), dtype, list(stride_order))))
        return tv

    def define_scalar(self, value=None, dtype=DataType.Double):
        if value is None:  # symbolic: an input of the fusion
            v = Val(self, torch.ones((), dtype=dtype.value, device="meta"), symbolic=True)
            self._inputs.append((v, dtype))
            return v
        return value

    def add_output(self, output):
        assert isinstance(output, Val) and output.fd is self, "add_output: a value of this FusionDefinition"
        self._outputs.append(output)

    def _check(self, spec, arg):
        if isinstance(spec, DataType):
            assert not isinstance(arg, torch.Tensor), "a scalar input was given a tensor"
            return
        shape, contiguity, dtype, stride_order = spec
        assert isinstance(arg, torch.Tensor) and arg.dtype == dtype.value, f"input dtype {arg.dtype}, defined {dtype}"
        assert all(s == -1 or s == n for s, n in zip(shape, arg.shape)) and len(shape) == arg.ndim, (
            f"input shape {list(arg.shape)}, defined {shape}")
        got = compute_tensor_descriptor(list(arg.shape), list(arg.stride()))
        assert got == (contiguity, stride_order or got[1]), f"input layout {got}, defined {(contiguity, stride_order)}"

    def execute(self, inputs, *, device=None, **options):
        assert self._outputs, "Fusion is empty!"
        assert len(inputs) == len(self._inputs), f"{len(inputs)} inputs for {len(self._inputs)} defined"
        env = {}
        for (val, spec), arg in zip(self._inputs, inputs):
            self._check(spec, arg)
            env[val.slot] = arg
        devices = {a.device for a in inputs if isinstance(a, torch.Tensor)}
        self._device = next(iter(devices)) if devices else "cpu"
        for fn, args, kwargs, vals in self._ops:
            out = fn(*_bind(args, lambda v: env[v.slot]), **_bind(kwargs, lambda v: env[v.slot]))
            for v, r in zip(vals, out if isinstance(out, tuple) else (out,)):
                env[v.slot] = r
        self.executions += 1
        # nvFuser's outputs are fresh tensors laid out contiguously.
        return [env[o.slot].contiguous().clone() if isinstance(env[o.slot], torch.Tensor) else env[o.slot]
                for o in self._outputs]
