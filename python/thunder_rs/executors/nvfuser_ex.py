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

What it claims (``nvfuser_claims``' checkers): the prims of ``TRANSLATIONS`` on CUDA tensors of
the dtypes nvFuser has (``DTYPES``), and every composite whose whole decomposition is such prims
(``fuses_decompositions``). It leaves to the torch executor what nvFuser cannot compute as eager
does: random prims (nvFuser's Philox stream is not eager's), matmuls (cuBLAS and flash attention
stay with torch), the special functions nvFuser has no op for, ``flip``, ``argmax``/``argmin``,
``sort``/``topk``, scatters, pads with interior or negative widths, and slices with steps. On the
CPU it claims nothing, so CPU programs are unchanged.

Layouts: nvFuser keeps a broadcast of extent > 1 as an expanded IterDomain, hands such a result on
with stride 0, and lets a gather's result inherit its index's; ATen evaluates gathers in segments
of their own and hands their results on densely, which the next segment then refuses. The
definition materializes the gathers' operands and its outputs that may be expanded (eager's results
have no stride-0 dims either). nvFuser orders a fusion's outputs by its own inference, which is not
always eager's; the definition pins each output whose order could differ to eager's
(``nvfuser_layouts``).

Dtypes: nvFuser computes Half and BFloat16 arithmetic in Float and its ops return Float (and
Double for a Python float with an integer tensor, Int for an integer sum) unless the definition
casts. The definition casts each prim's result to the dtype the trace gives it, which is eager's:
torch's kernels also compute halves in float32 and round each op's result, so a region hands on
eager's dtypes and, op for op, eager's values (the values the torch executor computes from the same
decomposition). A decomposition that computes in float32 as torch's kernel does (softmax, layer
norm) says so with its own conversions, and the region follows them. Python float operands of
float tensors become Float constants, as torch computes ``t * 0.1`` in float32 where nvFuser would
compute in double (rounded to the tensor's dtype where torch reads them so: comparisons,
``maximum``...). A float computed from sizes (``x * T ** -0.5``) is a Double input instead, which
the region computes on the host on each call and rounds as it would round the constant
(``nvfuser_symbolic.host_floats``). Ops nvFuser has no half kernels for (reductions, ``floor``,
``isfinite``...) run on the operand cast to Float, exactly.

Written inputs: where the trace writes a region's output back into a module's buffer that only
the region reads (BatchNorm's running statistics and counts: ``Region.writes``), the definition
aliases the output to the buffer (``fd.add_output(value)`` then ``fd.add_output(value, buffer)``:
``Fusion::aliasOutputToInput``, csrc/fusion.cpp), so nvFuser writes the buffer and returns it, and
the write-backs skip the copy (``writeback.WriteBacks.in_place``). Not for an inference tensor (the
copy raises eager's error) nor a value of another dtype; a definition nvFuser refuses so is made
again without the aliases.

A region's definition is built on its first call with each input layout (dtype, shape, strides),
and kept; a region of a symbolic trace has one for all the extents of its symbolic sizes and all
the values of its floats of sizes (``nvfuser_symbolic``), its layouts holding the rest. The
per-call path is a comparison with the last layout and ``fd.execute``, the casts being in the
definition. A layout nvFuser cannot define or compile runs on its inputs copied row-major where
they are not, and if that fails too, the region's eager torch calls, with a warning.
"""

import dataclasses
import os
import sys
import threading
import time
import warnings

import torch

from thunder_rs._core import SymExpr
from thunder_rs.core.lang.executor_api import FusionExecutor, Region, register_named_executor
from thunder_rs.core.lang.symfloat import SymFloat, text
from thunder_rs.errors import ThunderNotImplementedError
from thunder_rs.executors.nvfuser_claims import _DEVICE_AT, BINARY, DTYPES, UNARY, make_checker
from thunder_rs.executors.nvfuser_layouts import pinned_orders
from thunder_rs.executors.nvfuser_numbers import translate_div, translate_pow, translate_var, translate_var_mean
from thunder_rs.executors.nvfuser_symbolic import Extents, host_floats, symbolic_dims, symbolic_layouts
from thunder_rs.executors.torch_ex import torch_ex

#: The dtype of a Python number input (``define_scalar``), as nvFuser's ``pytorch_utils``.
SCALAR_TYPES = {bool: torch.bool, int: torch.int64, float: torch.float64}
#: Reduced-precision floats: nvFuser computes their arithmetic in Float (``computeTypes`` with
#: ``cast_half_to_float``, csrc/type_promotion.cpp), as torch's kernels do, and rounds only where
#: the definition casts.
HALF = (torch.float16, torch.bfloat16)

#: Unary ops nvFuser defines without promotion (``unaryOp`` with no config, the is-ops, in
#: csrc/ops/arith.cpp): a Half operand stays Half, and nvFuser's half types have no such functions
#: in generated code (on the H100 ``ceil`` and ``isnan`` of Half failed to compile: NVRTC found no
#: overload for ``nvf::__half``). They run on Float, which is exact for them.
KEEPS_HALF = {"floor", "ceil", "round", "trunc", "isfinite"}


def _unary(name):
    if name in KEEPS_HALF:
        return lambda cx, a: getattr(cx.ops, name)(cx.upcast(a))
    return lambda cx, a: getattr(cx.ops, name)(a)


#: Binary prims whose torch implementation reads a number operand in the tensor's dtype: the
#: torch executor makes it a tensor of that dtype (``maximum``, ``minimum``, ``fmod``, ``atan2``),
#: and torch's comparison and remainder kernels read it as one (``scalar_value<scalar_t>``,
#: CompareKernels.cu; ``gpu_kernel_with_scalars`` of ``scalar_t``, BinaryRemainderKernel.cu).
#: Their numbers are rounded to it (``x > 0.8`` of a bfloat16 0.8 is false).
ROUNDED_NUMBER = {"maximum", "minimum", "fmod", "remainder", "atan2", "eq", "ne", "lt", "le", "gt", "ge"}


def _binary(name):
    rounded = name in ROUNDED_NUMBER
    return lambda cx, a, b: getattr(cx.ops, name)(*cx.operands(a, b, rounded=rounded))


def _copy_or(reduce):
    """A prim reduction over no dims reduces nothing: the result is a copy of its input."""
    return lambda cx, a, dims, *rest: reduce(cx, a, list(dims), *rest) if dims else cx.ops.set(a)


def _pad(cx, a, value, config):
    # nvFuser's pad_widths are torch's: (lo, hi) of the innermost dim first; its value must be of
    # the tensor's kind (hasSimilarDtype, csrc/ops/alias.cpp: a float tensor takes no int 0, a
    # Bool one no Python bool, which the bindings read as an Int: ``constant``).
    kind = cx.kind(cx.dtype_of(a))
    return cx.ops.pad(a, [w for lo, hi, _ in reversed(config) for w in (lo, hi)], cx.constant(kind(value)))


def _iota(cx, length, start, step, device, dtype):
    # iota's start and step must be of its dtype's kind (csrc/ops/arith.cpp); a half one runs on
    # Float and is rounded once, as torch's arange computes in float for halves. A symbolic start
    # is an Int scalar: cast for a floating iota.
    computed = torch.float32 if dtype in HALF else dtype
    kind = cx.kind(computed)
    start, step = (
        kind(v) if isinstance(v, (bool, int, float)) else cx.ops.cast(v, cx.data_type(computed)) for v in (start, step)
    )
    return cx.ops.iota(length, start, step, cx.data_type(computed))


def _sum(cx, a, dims):
    # torch accumulates a half sum in float32; nvFuser casts to the given dtype first. An operand
    # that may have an expanded dim is materialized: nvFuser's sum over one is a product with its
    # extent (prod: a power; csrc/ops/arith.cpp "[Trivial reductions]"), torch's kernels add the copies.
    return cx.ops.sum(cx.materialized(a), dims, False, cx.data_type(cx.computed(cx.dtype_of(a))))


def _prod(cx, a, dims):
    return cx.ops.prod(cx.materialized(a), dims, False, cx.data_type(cx.computed(cx.dtype_of(a))))


#: prim name -> ``translate(cx, *args)``: the ``fd.ops`` calls computing the prim, with the
#: prim's positional arguments (values as nvFuser tensors or scalars); ``cx`` is the
#: ``_Definition`` being built. A translation may return a dtype other than the prim's (nvFuser
#: computes halves in Float): ``define`` casts each value to the dtype the region keeps it in.
TRANSLATIONS = {
    **{name: _unary(name) for name in UNARY},
    **{name: _binary(name) for name in BINARY},
    "pow": translate_pow,
    "div": translate_div,
    "where": lambda cx, pred, a, b: cx.ops.where(pred, *cx.operands(a, b)),
    "convert_element_type": lambda cx, a, dtype: cx.ops.cast(a, cx.data_type(dtype)),
    "broadcast_in_dim": lambda cx, a, shape, dims: cx.ops.broadcast_in_dim(a, list(shape), list(dims)),
    "reshape": lambda cx, a, shape: cx.ops.reshape(a, list(shape)),
    "transpose": lambda cx, a, perm: cx.ops.permute(a, list(perm)),
    "slice": lambda cx, a, start, end, strides: cx.ops.slice(a, list(start), list(end), list(strides)),
    "squeeze": lambda cx, a, dims: cx.ops.squeeze(a, list(dims)) if dims else cx.ops.set(a),
    "cat": lambda cx, tensors, dim: cx.ops.cat(list(tensors), dim),
    "pad": _pad,
    "full": lambda cx, shape, fill, device, dtype: cx.ops.full(list(shape), cx.constant(fill), cx.data_type(dtype)),
    "iota": _iota,
    "sum": _copy_or(_sum),
    "prod": _copy_or(_prod),
    "amax": _copy_or(lambda cx, a, dims: cx.ops.max(cx.upcast(a), dims, False)),
    "amin": _copy_or(lambda cx, a, dims: cx.ops.min(cx.upcast(a), dims, False)),
    "var": translate_var,
    "var_mean": translate_var_mean,
    "cumsum": lambda cx, a, dim: cx.ops.cumsum(a, dim),
    "cumprod": lambda cx, a, dim: cx.ops.cumprod(a, dim),
    # nvFuser evaluates these with ATen in a segment of their own, which hands on its result laid
    # out densely; the result's dims taken from an expanded operand dim stay expanded in the
    # definition, and the next segment refuses the dense tensor (expr_evaluator.cpp:156, seen on
    # the H200): their operands are materialized first.
    "take": lambda cx, a, index, dim: cx.ops.index_select(cx.materialized(a), cx.materialized(index), dim),
    "take_along_axis": lambda cx, a, index, dim: cx.ops.take_along_axis(
        cx.materialized(a), cx.materialized(index), dim
    ),
    "gather": lambda cx, a, index, dim: cx.ops.gather(a, cx.materialized(index), dim),
}
#: Prims whose results have no expanded dims: factories, and the gathers (operands materialized).
MATERIALIZED = {"full", "iota", "take", "take_along_axis", "gather"}
ELEMENTWISE = {*UNARY, *BINARY, "where", "convert_element_type"}


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
    """A definition being built, as the translators see it: its ``ops``, the dtype of each value
    (``DataType`` and torch dtypes both ways) and the casts that make nvFuser compute as torch."""

    def __init__(self, module, fd, region: Region):
        self.module, self.fd, self.ops, self.region = module, fd, fd.ops, region
        self.cuda = True  #: whether the region's tensors are CUDA ones (not the stand-in's CPU ones)
        self._torch_dtypes = {getattr(module.DataType, name): dtype for dtype, name in DTYPES.items()}
        #: id(nvFuser scalar) -> (the scalar, kept alive so that its id stays its own; its dtype),
        #: for the number inputs and constants (only a TensorView has ``dtype()``).
        self._scalars: dict = {}
        #: (a symbolic float's text, the dtype its value is rounded to) -> its Double scalar input,
        #: in the order they are defined, after the region's inputs (``nvfuser_symbolic.host_floats``).
        self.host_floats: dict = {}
        #: id(TensorView) -> the TensorView, for the values that may have an expanded dim (a
        #: broadcast of extent > 1, which nvFuser keeps with stride 0): an input with a stride-0
        #: dim, a broadcast_in_dim, and what is computed from them.
        self._expanded: dict = {}

    def data_type(self, dtype):
        return getattr(self.module.DataType, DTYPES[dtype])

    def dtype_of(self, x) -> torch.dtype:
        """The torch dtype of an operand: a tensor's, a number input's, a Python number's."""
        if isinstance(x, (bool, int, float)):
            return SCALAR_TYPES[type(x)]
        return self._torch_dtypes[x.dtype()] if x.is_tensor() else self._scalars[id(x)][1]

    @staticmethod
    def computed(dtype: torch.dtype) -> torch.dtype:
        """The dtype torch's kernels compute ``dtype`` in."""
        return torch.float32 if dtype in HALF else dtype

    @staticmethod
    def kind(dtype: torch.dtype) -> type:
        return float if dtype.is_floating_point else bool if dtype == torch.bool else int

    def input(self, arg, symbolic: tuple = ()):
        """A definition input for ``arg``; a tensor's ``symbolic`` dims have extent -1 (any)."""
        if isinstance(arg, torch.Tensor):
            sizes, strides = list(arg.shape), list(arg.stride())
            contiguity, stride_order = self.module.compute_tensor_descriptor(sizes, strides)
            tv = self.fd.define_tensor(
                shape=[-1 if d in symbolic else size for d, size in enumerate(sizes)],
                contiguity=list(contiguity),
                dtype=self.data_type(arg.dtype),
                is_cpu=False,
                stride_order=list(stride_order),
            )
            if any(stride == 0 and size != 1 for size, stride in zip(sizes, strides)):
                self._expanded[id(tv)] = tv  # defined as an expanded broadcast (getExpanded)
            return tv
        return self._scalar(self.fd.define_scalar(dtype=self.data_type(SCALAR_TYPES[type(arg)])), type(arg))

    def extent(self, scalar):
        """A symbolic size as an operand: an Int scalar (a Python int where it is constant)."""
        return scalar if isinstance(scalar, int) else self._scalar(scalar, int)

    def _scalar(self, scalar, kind: type):
        self._scalars[id(scalar)] = (scalar, SCALAR_TYPES[kind])
        return scalar

    def host_float(self, value: SymFloat, dtype: torch.dtype):
        """The Double input holding ``value``, computed on the host on each call and rounded to
        ``dtype`` (one per float and dtype)."""
        key = (text(value.ops), dtype)
        if key not in self.host_floats:
            scalar = self.fd.define_scalar(dtype=self.module.DataType.Double)
            self.host_floats[key] = self._scalar(scalar, float)
        return self.host_floats[key]

    def constant(self, value):
        """A Python number as an operand of ``fd.ops``: a float of sizes as a Double input (as a
        Python float is a Double constant); a bool as a Bool scalar. The bindings read
        a Python bool as an Int (pybind11 converts to the first alternative of nvFuser's scalar
        variant that takes it, and ``int64_t`` takes a bool before ``bool`` is tried): a Bool
        tensor's pad value would be an Int, which ``pad`` refuses (the H200's select_scatter and
        slice_scatter gradients)."""
        if isinstance(value, bool):
            return self._scalar(self.fd.define_scalar(value, dtype=self.module.DataType.Bool), bool)
        if type(value) is SymFloat:
            return self.host_float(value, torch.float64)
        return value

    def note_expanded(self, name: str, args, results) -> None:
        """Marks the results of prim ``name`` that may have an expanded dim: a broadcast_in_dim's;
        an elementwise prim's whose tensor operands all may (an operand's iteration dim makes the
        result's one: ``ops::newOutputDomain``); any other's with an operand that may, save the
        ``MATERIALIZED`` prims'."""
        tensors = [a for a in _values_of(args) if a.is_tensor()]
        flagged = [id(a) in self._expanded for a in tensors]
        if name in ELEMENTWISE:  # a 0-dim operand broadcasts: only those of the result's rank count
            rank = max((t.ndim for t in tensors), default=0)
            expanded = any(flagged) and all(f for f, t in zip(flagged, tensors) if t.ndim == rank)
        else:
            expanded = name == "broadcast_in_dim" or (name not in MATERIALIZED and any(flagged))
        if expanded:
            self._expanded.update(
                (id(r), r) for r in results if not isinstance(r, (bool, int, float)) and r.is_tensor()
            )

    def materialized(self, a):
        """``a`` with no expanded dim: a ``where`` of it with a ``full`` of its shape, whose dims
        are iterations, where it may have one."""
        if id(a) not in self._expanded:
            return a
        everywhere = self.ops.full(a.shape(), self.constant(True), self.module.DataType.Bool)
        return self.ops.where(everywhere, a, a)

    def upcast(self, a):
        """``a`` as Float if it is a half tensor: for the ops nvFuser would run in its dtype."""
        return self.ops.cast(a, self.module.DataType.Float) if self.dtype_of(a) in HALF else a

    def operands(self, *args, rounded: bool = False) -> tuple:
        """``args`` with each floating number (a Python float, a float of sizes, a float input) a
        Float scalar when a float32 or half tensor is among them: torch computes ``t + 0.1`` in
        float32 (CUDA's kernels read the number as float32 for halves too) where nvFuser would
        compute in double and round. ``rounded``: the number rounded to the tensor's dtype first,
        as torch reads it for the ``ROUNDED_NUMBER`` prims."""
        floating = [self.dtype_of(a) for a in args if self._is_tensor(a) and self.dtype_of(a).is_floating_point]
        if floating and torch.float64 not in floating:
            args = tuple(self._as_float(a, floating[0] if rounded else torch.float32) for a in args)
        return tuple(self.constant(a) for a in args)

    @staticmethod
    def _is_tensor(x) -> bool:
        return not isinstance(x, (bool, int, float, SymFloat)) and x.is_tensor()

    def _as_float(self, a, dtype: torch.dtype):
        """A floating number ``a`` as a Float scalar of its value rounded to ``dtype``."""
        if isinstance(a, float):
            return self.fd.define_scalar(float(torch.tensor(a, dtype=dtype)), dtype=self.data_type(torch.float32))
        if type(a) is SymFloat:  # rounded on the host as the constant above
            return self.ops.cast(self.host_float(a, dtype), self.data_type(torch.float32))
        if isinstance(a, (bool, int)) or a.is_tensor() or self.dtype_of(a) != torch.float64:
            return a
        if dtype != torch.float32:
            a = self.ops.cast(a, self.data_type(dtype))
        return self.ops.cast(a, self.data_type(torch.float32))

    def kept(self, name: str, value):
        """``value``, the translation of the region's value ``name``, in the trace's dtype: nvFuser
        computes a half op in Float and would hand on Float; torch rounds each op's result to its
        dtype, and so does the region, for the region's own later ops too (a decomposition that
        computes in float32, as torch's kernel does, says so with its own conversions)."""
        want = self.region.dtypes.get(name)
        if want is None or not value.is_tensor() or self.dtype_of(value) == want:
            return value
        return self.ops.cast(value, self.data_type(want))


def _tuple(result) -> tuple:
    return result if isinstance(result, tuple) else (result,)


def _values_of(args):
    """The nvFuser values among a call's resolved arguments (nested in lists for ``cat``)."""
    for a in args:
        if isinstance(a, (tuple, list)):
            yield from _values_of(a)
        elif not isinstance(a, (bool, int, float, SymFloat, str, torch.dtype, torch.device)) and a is not None:
            yield a


def _resolve(arg, env, extent):
    """A call's argument with the values it names from ``env`` and each SymExpr as ``extent`` builds it."""
    if isinstance(arg, str):
        return env[arg]
    if isinstance(arg, SymExpr):
        return extent(arg)
    if isinstance(arg, (tuple, list)):
        return type(arg)(_resolve(a, env, extent) for a in arg)
    return arg


def define(module, region: Region, args, orders=None, writes=()):
    """The ``FusionDefinition`` computing ``region`` on inputs laid out as ``args``; each value
    it hands on has the trace's dtype, which is eager's, and the stride order ``orders`` pins
    (``nvfuser_layouts``: eager's, where nvFuser's could differ); each output of ``writes``
    (``Region.writes``' pairs) aliased to its input, which the definition writes and returns.
    With it, the floats of sizes it takes after ``args`` (``_Definition.host_floats``' keys, in
    input order)."""
    fd = module.FusionDefinition()
    failed = None
    with fd:
        # A failure is raised after the block: nvfuser_direct's __exit__ prints an exception leaving
        # it, with its traceback, to stdout (nvfuser_direct/__init__.py), and the region falls back.
        try:
            cx = _define_in(module, fd, region, args, orders, dict(writes))
        except Exception as e:  # noqa: BLE001 (re-raised below)
            failed = e
    if failed is not None:
        raise failed
    return fd, tuple(cx.host_floats)


def _define_in(module, fd, region: Region, args, orders, writes: dict) -> _Definition:
    """Defines ``region`` in the open ``fd`` (``define``)."""
    cx = _Definition(module, fd, region)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]  # (CUDA's kernels read numbers as eager's CUDA ones)
    cx.cuda = (tensors[0].device if tensors else factory_device(region, args) or torch.device("cuda")).type == "cuda"
    shapes = region.input_shapes or (None,) * len(args)
    inputs = [cx.input(a, dims) for a, dims in zip(args, symbolic_dims(shapes))]
    env = dict(zip(region.inputs, inputs))
    extents = Extents(fd.ops, region.name, shapes, inputs)
    for call in region.calls:
        name = call.name
        translate = TRANSLATIONS.get(name.removeprefix("prims."))
        if translate is None or not name.startswith("prims."):
            raise ThunderNotImplementedError(f"nvfuser executor: no translation for {name} (region {region.name})")
        args = _resolve(call.args, env, lambda e: cx.extent(extents.of(e)))
        result = translate(cx, *args)
        results = tuple(cx.kept(out, value) for out, value in zip(call.outputs, _tuple(result)))
        cx.note_expanded(name.removeprefix("prims."), args, results)
        env.update(zip(call.outputs, results))
    given = set(region.inputs)
    for name, order in zip(region.outputs, orders or (None,) * len(region.outputs)):
        if name in writes:
            # Written into its input (a BatchNorm's running statistic): nvFuser replays the input's
            # layout on it and returns the input itself (``Fusion::aliasOutputToInput``, csrc/fusion.cpp).
            fd.add_output(env[name])
            fd.add_output(env[name], env[writes[name]])
            continue
        # An output that is an input is copied: nvFuser would hand back the input itself. One
        # with an expanded dim is materialized: nvFuser would hand it on with stride 0 there,
        # which eager's result has not (an in-place write to it would fail).
        value = fd.ops.set(env[name]) if name in given else cx.materialized(env[name])
        fd.add_output(value if order is None else fd.ops.stride_order(value, order))
    return cx


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


def _dense(args) -> list:
    """``args`` with each tensor that is not row-major contiguous copied into one that is."""
    return [a.contiguous() if isinstance(a, torch.Tensor) and not a.is_contiguous() else a for a in args]


def factory_device(region: Region, args) -> torch.device | None:
    """The device of the tensors a region creates when its inputs hold no tensor (else None).
    nvFuser runs a definition with no tensor input on device 0 unless ``fd.execute`` is told
    one (``getCommonDeviceCUDA``, csrc/utils.cpp), where eager creates them on the device its
    factories name: ``cuda:1``, or the current device for ``cuda`` (a process per GPU)."""
    if any(isinstance(a, torch.Tensor) for a in args):
        return None
    for call in region.calls:
        at = _DEVICE_AT.get(call.name.removeprefix("prims."))
        if at is not None:
            return torch.device(call.args[at])
    return None


def _indexed(device: torch.device) -> torch.device:
    """``device`` with its index: ``cuda`` is the current CUDA device (0 where CUDA is not there)."""
    if device.type != "cuda" or device.index is not None:
        return device
    return torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)


def region_devices(region: Region, args) -> set:
    """The devices of a region's tensors: its tensor inputs' and its factories' (``_DEVICE_AT``)."""
    devices = {a.device for a in args if isinstance(a, torch.Tensor)}
    for call in region.calls:
        at = _DEVICE_AT.get(call.name.removeprefix("prims."))
        if at is not None:
            devices.add(_indexed(torch.device(call.args[at])))
    return devices


def _told_device(execute, device: torch.device | None):
    """``execute`` told the CUDA device ``device`` names (the current one when it names none), if any."""
    if device is None or device.type != "cuda":
        return execute
    if device.index is not None:
        return lambda inputs: execute(inputs, device=device.index)
    return lambda inputs: execute(inputs, device=torch.cuda.current_device())


class NvFuserRegion:
    """The callable ``fuse`` returns: the region run by the ``FusionDefinition`` of its inputs'
    layout, defined on the first call with each layout."""

    __slots__ = ("region", "executor", "definitions", "_last", "_layout", "_written")

    def __init__(self, region: Region, executor):
        self.region, self.executor = region, executor
        #: layout -> run(args) -> tuple
        self.definitions: dict = {}
        self._last = (None, None)
        dims = symbolic_dims(region.input_shapes)
        descriptor = executor.module.compute_tensor_descriptor
        #: A region with symbolic dims has one definition for all their extents: its layouts hold none.
        self._layout = symbolic_layouts(dims, descriptor, layout) if any(dims) else layout
        #: The positions of the inputs the region may write (``Region.writes``): none is written
        #: where one is an inference tensor, which eager's in-place write refuses (the copy raises it).
        self._written = tuple(region.inputs.index(i) for _, i in region.writes)

    def __call__(self, *args):
        key = self._layout(args)
        if self._written:
            key = (key, *[args[i].is_inference() for i in self._written])
        last_key, run = self._last
        if key != last_key:
            run = self.definitions.get(key)
            if run is None:
                run = self.definitions[key] = self._define(args)
            self._last = (key, run)
        return run(args)

    def _define(self, args):
        if any(isinstance(a, torch.Tensor) and a.is_neg() for a in args):
            run = self._define([a.resolve_neg() if isinstance(a, torch.Tensor) else a for a in args])
            return lambda args: run([a.resolve_neg() if isinstance(a, torch.Tensor) else a for a in args])
        devices = region_devices(self.region, args)
        if len(devices) > 1:
            # nvFuser makes every tensor of a definition on one device (its inputs' or the one
            # ``execute`` is told): a factory's on another device would be made on that one.
            names = ", ".join(sorted(map(str, devices)))
            return self._fallback(f"its tensors are on {names}, and nvFuser runs a definition on one device")
        orders = pinned_orders(self.region, args)
        if orders is None:
            self.executor.stats["unpinned"] += 1
        writes = self._writes(args)
        try:
            return self._compiled(args, orders, writes)
        except Exception as e:  # noqa: BLE001 (any nvFuser failure leaves the eager calls, which are exact)
            error = f"{type(e).__name__}: {e}"
        if writes:  # (the write-backs copy the values instead)
            try:
                run = self._compiled(args, orders)
            except Exception as e:  # noqa: BLE001
                error += f" (and without writing its inputs: {type(e).__name__}: {e})"
            else:
                self.executor.stats["unwritten"] += 1
                return run
        if any(d is not a for d, a in zip(_dense(args), args)):
            # nvFuser's schedulers fail on some layouts they define (on the H100 and H200, the
            # layer norm of a column-major input: "Vectorized dim for producer has to be from an
            # inner most position"); the region then runs on its inputs copied row-major.
            try:
                run = self._compiled(_dense(args), orders)
            except Exception as e:  # noqa: BLE001
                error += f" (and with its inputs copied row-major: {type(e).__name__}: {e})"
            else:
                self.executor.stats["dense_copies"] += 1
                return lambda args: run(_dense(args))
        return self._fallback(error)

    def _writes(self, args) -> tuple:
        """``Region.writes`` of the inputs ``args``: none where a written one is an inference tensor
        or of another dtype than its value."""
        region = self.region
        if any(args[i].is_inference() for i in self._written):
            return ()
        if any(region.dtypes.get(out) != args[i].dtype for (out, _), i in zip(region.writes, self._written)):
            return ()
        return region.writes

    def _fallback(self, error: str):
        region, executor = self.region, self.executor
        message = (
            f"thunder_rs nvfuser executor: {region.name} ({len(region.calls)} prims) runs eagerly: "
            f"nvFuser could not define or compile it: {error}"
        )
        # Kept as well as warned: an H100 run counted a fallback whose warning a filter hid.
        del executor.fallbacks[:-7]
        executor.fallbacks.append(message)
        warnings.warn(message, stacklevel=5)
        executor.stats["failures"] += 1
        function = region.function
        if region.writes:
            # (the write-backs take a returned view of a written input for the region's own write:
            # the eager calls' outputs there are made their own tensors)
            at = {region.outputs.index(out) for out, _ in region.writes}
            return lambda args: tuple(
                o.clone() if i in at and o._base is not None else o for i, o in enumerate(function(*args))
            )
        return lambda args: function(*args)

    def _compiled(self, args, orders, writes=()):
        """The callable running the definition of ``args``' layout (its outputs in ``orders``, those
        of ``writes`` written into their inputs), compiled by running it on ``args``."""
        stats, start = self.executor.stats, time.perf_counter()
        fd, floats = define(self.executor.module, self.region, args, orders, writes)
        compute = host_floats(self.region.name, self.region.input_shapes, floats, self.region.inputs)
        defined = time.perf_counter()
        execute = _told_device(fd.execute, factory_device(self.region, args))
        inputs = list if compute is None else (lambda args: [*args, *compute(args)])
        first = [tuple(execute(inputs(args)))]  # compiles: a failure here falls back too
        # Where a first call's time goes (benchmarks/gpu_bench.py reports them): building the
        # definitions in Python, and nvFuser's scheduling and compiling inside the first execute.
        stats["define_s"] += defined - start
        stats["compile_s"] += time.perf_counter() - defined
        stats["definitions"] += 1

        def run(args):
            if first:  # the compiling call's outputs serve the call that compiled
                return first.pop()
            return tuple(execute(inputs(args)))

        run.fd = fd  # for measurements of the host time around it
        return run


class NvFuserExecutor(FusionExecutor):
    """Claims the prims ``TRANSLATIONS`` translates on CUDA tensors, and composites made of them;
    ``fuse`` makes a region's callable. ``module`` is the ``nvfuser_direct`` module to use (by
    default the installed one); ``allow_cpu`` lets it claim CPU tensors, for tests with a
    CPU stand-in module."""

    fuses_decompositions = True
    fuses_symbolic = True
    fuses_float_inputs = True
    writes_inputs = True

    def __init__(self, name: str = "nvfuser", *, module=None, allow_cpu: bool = False):
        super().__init__(name)
        #: ``dense_copies``: layouts whose definition failed and that run on row-major copies;
        #: ``unpinned``: definitions whose outputs' eager layouts could not be told (``nvfuser_layouts``);
        #: ``unwritten``: definitions that failed writing their inputs (``Region.writes``) and copy instead.
        self.stats = {
            "definitions": 0,
            "failures": 0,
            "dense_copies": 0,
            "unpinned": 0,
            "unwritten": 0,
            "define_s": 0.0,
            "compile_s": 0.0,
        }
        #: The last few fallbacks' messages (the warnings'), newest last.
        self.fallbacks: list[str] = []
        self.unavailable = None
        if module is None:
            try:
                module = import_nvfuser_direct()
            except Exception as e:  # noqa: BLE001 (a broken install is reported, not fatal)
                self.unavailable = f"{type(e).__name__}: {e}"
        self.module = module
        if module is None:
            return  # claims nothing: every symbol runs on the torch executor
        # The torch executor's implementations (region code calls them), with nvFuser's checkers;
        # without in-place forms, which the region's translation does not use.
        self.registry.register(
            *(
                dataclasses.replace(torch_ex.registry[prim], checker=make_checker(prim, allow_cpu), inplace_method=None)
                for prim in TRANSLATIONS
            )
        )

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
                warnings.warn(
                    f"thunder_rs nvfuser executor: nvfuser_direct does not import ({executor.unavailable}); "
                    "the torch executor runs everything",
                    stacklevel=3,
                )
            _named.append(register_named_executor(executor))
        return _named[0]


nvfuser_ex = nvfuser_executor()
