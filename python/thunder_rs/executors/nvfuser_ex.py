"""The nvFuser executor (``jit(fn, executors=["nvfuser"])``, and the default fusion executor on
CUDA when ``nvfuser_direct`` imports): each fusion region becomes one ``nvfuser_direct``
``FusionDefinition`` per input layout, translated prim by prim from the region's decomposed
calls (``Region.calls``).

Written against nvFuser's ``nvfuser_direct`` bindings as of NVIDIA/Fuser commit 81c4b22fd750
(2026-04-03, ``python/version.txt`` 0.2.36; the newest ``nvfuser-cu130-torch210`` wheel is
0.2.36.dev20260301, built from the source of 2026-03-01 (7e04d265): ops.cpp, __init__.py and
python_utils.cpp are unchanged from it to 81c4b22, ir.cpp only gained swizzle1d):
``FusionDefinition`` (a context manager), ``fd.define_tensor(shape, contiguity, dtype, is_cpu,
stride_order)``, ``fd.define_scalar(dtype=...)``, ``fd.ops.*`` (``python/python_direct/ops.cpp``),
``fd.add_output``, ``fd.execute(inputs)``, ``compute_tensor_descriptor(sizes, strides)`` and
``DataType``. The legacy ``nvfuser`` frontend is not supported.

What it claims: the prims of ``TRANSLATIONS`` on CUDA tensors of the dtypes nvFuser has
(``DTYPES``), and every composite whose whole decomposition is such prims
(``fuses_decompositions``). It leaves to the torch executor what nvFuser cannot compute as eager
does: random prims (nvFuser's Philox stream is not eager's), matmuls (cuBLAS and flash attention
stay with torch), the special functions nvFuser has no op for, ``flip``, ``argmax``/``argmin``,
``sort``/``topk``, scatters, and pads with interior or negative widths. On the CPU it claims
nothing, so CPU programs are unchanged.

A region's definition is built on its first call with each input layout (dtype, shape, strides),
and kept; the per-call path is a comparison with the last layout and ``fd.execute``. A layout
nvFuser cannot define or compile runs the region's eager torch calls, with a warning.
"""

import os
import sys
import threading
import warnings
from collections.abc import Callable

import torch

from thunder_rs.errors import ThunderNotImplementedError
from thunder_rs.executors.extend import FusionExecutor, Region, _bump, register_named_executor
from thunder_rs.executors.torch_ex import torch_ex

#: torch dtypes nvFuser's ``DataType`` has, by name (complex and 8-bit types stay with torch).
DTYPES = {
    torch.float64: "Double", torch.float32: "Float", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.int64: "Int", torch.int32: "Int32", torch.bool: "Bool",
}
#: ``DataType`` of a Python number input (``define_scalar``), as nvFuser's ``pytorch_utils``.
SCALAR_TYPES = {bool: "Bool", int: "Int", float: "Double"}

UNARY = (
    "abs neg exp exp2 expm1 log log1p log2 log10 sin cos tan tanh sinh cosh asin acos atan asinh acosh atanh erf "
    "erfc erfinv sqrt rsqrt reciprocal sign signbit floor ceil round trunc isfinite bitwise_not lgamma"
).split()
BINARY = (
    "add sub mul div pow fmod remainder maximum minimum atan2 eq ne lt le gt ge bitwise_and bitwise_or bitwise_xor "
    "nextafter"
).split()


def _unary(name):
    return lambda fd, a: getattr(fd.ops, name)(a)


def _binary(name):
    return lambda fd, a, b: getattr(fd.ops, name)(a, b)


def _copy_or(reduce):
    """A prim reduction over no dims reduces nothing: the result is a copy of its input."""
    return lambda fd, a, dims, *rest: reduce(fd, a, list(dims), *rest) if dims else fd.ops.set(a)


def _dtype(fd_module, torch_dtype):
    return getattr(fd_module.DataType, DTYPES[torch_dtype])


def _pad(fd, a, value, config):
    # nvFuser's pad_widths are torch's: (lo, hi) of the innermost dim first.
    return fd.ops.pad(a, [w for lo, hi, _ in reversed(config) for w in (lo, hi)], value)


def _var_mean(fd, a, dims, correction):
    return tuple(fd.ops.var_mean(a, list(dims), int(correction), False))


def _var(fd, a, dims, correction):
    return fd.ops.var(a, list(dims), int(correction), False)


#: prim name -> ``translate(fd, *args)``: the ``fd.ops`` calls computing the prim, with the
#: prim's positional arguments (values as nvFuser tensors or scalars). ``fd.module`` is the
#: ``nvfuser_direct`` module the definition belongs to.
TRANSLATIONS = {
    **{name: _unary(name) for name in UNARY},
    **{name: _binary(name) for name in BINARY},
    "where": lambda fd, pred, a, b: fd.ops.where(pred, a, b),
    "convert_element_type": lambda fd, a, dtype: fd.ops.cast(a, _dtype(fd.module, dtype)),
    "broadcast_in_dim": lambda fd, a, shape, dims: fd.ops.broadcast_in_dim(a, list(shape), list(dims)),
    "reshape": lambda fd, a, shape: fd.ops.reshape(a, list(shape)),
    "transpose": lambda fd, a, perm: fd.ops.permute(a, list(perm)),
    "slice": lambda fd, a, start, end, strides: fd.ops.slice(a, list(start), list(end), list(strides)),
    "squeeze": lambda fd, a, dims: fd.ops.squeeze(a, list(dims)) if dims else fd.ops.set(a),
    "cat": lambda fd, tensors, dim: fd.ops.cat(list(tensors), dim),
    "pad": _pad,
    "full": lambda fd, shape, fill, device, dtype: fd.ops.full(list(shape), fill, _dtype(fd.module, dtype)),
    "iota": lambda fd, length, start, step, device, dtype: fd.ops.iota(length, start, step, _dtype(fd.module, dtype)),
    "sum": _copy_or(lambda fd, a, dims: fd.ops.sum(a, dims, False, fd.tensor_dtype(a))),
    "prod": _copy_or(lambda fd, a, dims: fd.ops.prod(a, dims, False, fd.tensor_dtype(a))),
    "amax": _copy_or(lambda fd, a, dims: fd.ops.max(a, dims, False)),
    "amin": _copy_or(lambda fd, a, dims: fd.ops.min(a, dims, False)),
    "var": _var,
    "var_mean": _var_mean,
    "cumsum": lambda fd, a, dim: fd.ops.cumsum(a, dim),
    "cumprod": lambda fd, a, dim: fd.ops.cumprod(a, dim),
    "take": lambda fd, a, index, dim: fd.ops.index_select(a, index, dim),
    "take_along_axis": lambda fd, a, index, dim: fd.ops.take_along_axis(a, index, dim),
    "gather": lambda fd, a, index, dim: fd.ops.gather(a, index, dim),
}


# -- claims ----------------------------------------------------------------------------------------

def _tensors(args):
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (tuple, list)):
            yield from _tensors(a)


def _int64_index(a, index, dim, *rest) -> bool:
    return index.dtype == torch.int64


def _take_index(a, index, dim) -> bool:
    return index.dtype == torch.int64 and index.ndim == 1


def _same_but_dim(a, index, dim) -> bool:
    return index.dtype == torch.int64 and a.ndim == index.ndim and all(
        i == dim or x == y for i, (x, y) in enumerate(zip(a.shape, index.shape)))


def _plain_pad(a, value, config) -> bool:
    return all(lo >= 0 and hi >= 0 and interior == 0 for lo, hi, interior in config)


def _integral_correction(a, dims, correction) -> bool:
    # Over no dims each element is a sample of one (torch: nan for correction 1); left to torch.
    return bool(dims) and float(correction) == int(correction)


def _not_bool(a, *params) -> bool:
    return a.dtype != torch.bool  # torch's bool sum is an any(); nvFuser's has no such reduction


def _float_scan(a, dim) -> bool:
    return a.dtype.is_floating_point  # integer scans overflow as torch's do only in int64


#: Checks beyond the device and dtypes, by prim: what nvFuser's op requires or computes differently.
EXTRA_CHECKS: dict[str, Callable[..., bool]] = {
    "pad": _plain_pad, "var": _integral_correction, "var_mean": _integral_correction,
    "take": _take_index, "take_along_axis": _same_but_dim, "gather": _int64_index,
    "cumsum": _float_scan, "cumprod": _float_scan,
    "sum": _not_bool, "prod": _not_bool, "amax": _not_bool, "amin": _not_bool,
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

    def check(*args, **kwargs) -> bool:
        if device_at is not None and not allow_cpu and torch.device(args[device_at]).type != "cuda":
            return False
        tensors = list(_tensors(args))
        if not tensors and device_at is None:
            return False  # arithmetic on numbers alone: no kernel to fuse
        for t in tensors:
            if t.dtype not in DTYPES or (t.device.type != "cuda" and not allow_cpu):
                return False
        if any(isinstance(a, complex) for a in args):
            return False
        return extra is None or bool(extra(*args, **kwargs))

    check.__name__ = f"nvfuser_{name}_checker"
    return check


# -- definitions -----------------------------------------------------------------------------------

def import_nvfuser_direct():
    """``nvfuser_direct``, imported after torch with lazily bound symbols: a wheel built for an
    older torch misses c10 symbols it binds only on use (GPU.md). Raises ImportError."""
    flags = sys.getdlopenflags()
    sys.setdlopenflags(os.RTLD_LAZY | os.RTLD_GLOBAL)
    try:
        import nvfuser_direct  # noqa: PLC0415 (optional, slow to import: only an nvFuser executor pays it)
    finally:
        sys.setdlopenflags(flags)
    return nvfuser_direct


class _Definition:
    """What the translators see while a definition is built: its ``ops``, the ``nvfuser_direct``
    module (for ``DataType``) and the dtype of a defined tensor."""

    def __init__(self, module, fd):
        self.module, self.fd, self.ops = module, fd, fd.ops

    def tensor_dtype(self, tv):
        return tv.dtype()


def _resolve(arg, env):
    if isinstance(arg, str):
        return env[arg]
    if isinstance(arg, (tuple, list)):
        return type(arg)(_resolve(a, env) for a in arg)
    return arg


def _define_input(module, fd, arg):
    if isinstance(arg, torch.Tensor):
        sizes, strides = list(arg.shape), list(arg.stride())
        contiguity, stride_order = module.compute_tensor_descriptor(sizes, strides)
        return fd.define_tensor(shape=sizes, contiguity=list(contiguity), dtype=_dtype(module, arg.dtype),
                                is_cpu=False, stride_order=list(stride_order))
    return fd.define_scalar(dtype=getattr(module.DataType, SCALAR_TYPES[type(arg)]))


def define(module, region: Region, args):
    """The ``FusionDefinition`` computing ``region`` on inputs laid out as ``args``."""
    fd = module.FusionDefinition()
    with fd:
        cx = _Definition(module, fd)
        env = {name: _define_input(module, fd, a) for name, a in zip(region.inputs, args)}
        for name, call_args, outputs in region.calls:
            translate = TRANSLATIONS.get(name.removeprefix("prims."))
            if translate is None or not name.startswith("prims."):
                raise ThunderNotImplementedError(f"nvfuser executor: no translation for {name} (region {region.name})")
            result = translate(cx, *_resolve(call_args, env))
            results = result if isinstance(result, tuple) else (result,)
            env.update(zip(outputs, results))
        inputs = set(region.inputs)
        for name in region.outputs:
            # An output that is an input is copied: nvFuser would hand back the input itself.
            fd.add_output(fd.ops.set(env[name]) if name in inputs else env[name])
    return fd


def layout(args) -> tuple:
    """What a definition is specialised on: each tensor's dtype, shape, strides and lazy
    negation bit, each number's type."""
    key: list = []
    for a in args:
        if isinstance(a, torch.Tensor):
            key += (a.dtype, a.shape, a.stride(), a.is_neg())
        else:
            key.append(type(a))
    return tuple(key)


class NvFuserRegion:
    """The callable ``fuse`` returns: the region run by the ``FusionDefinition`` of its inputs'
    layout, defined on the first call with each layout."""

    __slots__ = ("region", "executor", "definitions", "_last")

    def __init__(self, region: Region, executor):
        self.region, self.executor = region, executor
        #: layout -> run(args) -> tuple
        self.definitions: dict = {}
        self._last = (None, None)

    def __call__(self, *args):
        key = layout(args)
        last_key, run = self._last
        if key != last_key:
            run = self.definitions.get(key)
            if run is None:
                run = self.definitions[key] = self._define(args)
            self._last = (key, run)
        return run(args)

    def _define(self, args):
        region, executor = self.region, self.executor
        if any(isinstance(a, torch.Tensor) and a.is_neg() for a in args):
            run = self._define([a.resolve_neg() if isinstance(a, torch.Tensor) else a for a in args])
            return lambda args: run([a.resolve_neg() if isinstance(a, torch.Tensor) else a for a in args])
        try:
            fd = define(executor.module, region, args)
            outputs = fd.execute(list(args))  # compiles: a failure here falls back too
        except Exception as e:  # noqa: BLE001 (any nvFuser failure leaves the eager calls, which are exact)
            warnings.warn(f"thunder_rs nvfuser executor: {region.name} ({len(region.calls)} prims) runs eagerly: "
                          f"nvFuser could not define or compile it: {type(e).__name__}: {e}", stacklevel=4)
            executor.stats["failures"] += 1
            function = region.function
            return lambda args: function(*args)
        executor.stats["definitions"] += 1
        execute = fd.execute
        first = [tuple(outputs)]

        def run(args):
            if first:  # the compiling call's outputs serve the call that compiled
                return first.pop()
            return tuple(execute(list(args)))

        run.fd = fd  # for measurements of the host time around it
        return run


class NvFuserExecutor(FusionExecutor):
    """Claims the prims ``TRANSLATIONS`` translates on CUDA tensors, and composites made of them;
    ``fuse`` makes a region's callable. ``module`` is the ``nvfuser_direct`` module to use (by
    default the installed one); ``allow_cpu`` lets it claim CPU tensors, for tests with a
    CPU stand-in module."""

    fuses_decompositions = True

    def __init__(self, name: str = "nvfuser", *, module=None, allow_cpu: bool = False):
        super().__init__(name)
        self.stats = {"definitions": 0, "failures": 0}
        self.unavailable = None
        if module is None:
            try:
                module = import_nvfuser_direct()
            except Exception as e:  # noqa: BLE001 (a broken install is reported, not fatal)
                self.unavailable = f"{type(e).__name__}: {e}"
        self.module = module
        if module is None:
            return  # claims nothing: every symbol runs on the torch executor
        for prim in TRANSLATIONS:
            impl_name, _, impl = torch_ex.implmap[prim]
            self.implmap[prim] = (impl_name, make_checker(prim, allow_cpu), impl)
            if prim in torch_ex.methods:
                self.methods[prim] = torch_ex.methods[prim]
        _bump()

    @property
    def available(self) -> bool:
        return self.module is not None

    def fuse(self, region: Region) -> NvFuserRegion:
        return NvFuserRegion(region, self)


_lock = threading.Lock()
_named: list = []


def nvfuser_executor() -> NvFuserExecutor:
    """The named executor (``executors=["nvfuser"]``), made on first use."""
    with _lock:
        if not _named:
            executor = NvFuserExecutor()
            if not executor.available:
                warnings.warn(f"thunder_rs nvfuser executor: nvfuser_direct does not import ({executor.unavailable}); "
                              "the torch executor runs everything", stacklevel=3)
            _named.append(register_named_executor(executor))
        return _named[0]


nvfuser_ex = nvfuser_executor()
