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
broadcast, other numbers constants: ``TensorViewBuilder::shape``), or a tensor's ``sizes`` and
``strides`` (its third overload: symbolic extents but at size 1 unless ``static_sizes``);
``define_scalar(dtype=...)`` makes a scalar input, ``ops.size``/``ops.shape``/``tv.shape()`` give a
tensor's extents as scalar values, scalar arithmetic (``add``, ``mul``, ``div`` truncating, ``mod``
C++'s remainder) builds more, and shapes, slice bounds, pad widths and iota lengths take them. While
defining, a symbolic extent stands as ``SYMBOLIC_EXTENT`` (only ranks and dtypes are checked against
it, as nvFuser concretizes symbolic extents when it executes); ``execute`` computes the real ones.

Here: the bindings' face (``ops``, ``FusionDefinition``); the values and the recording of a
definition in ``fake_nvfuser_recording``, the arithmetic in ``fake_nvfuser_arith``, data movement
and factories in ``fake_nvfuser_movement``.
"""

import functools
import traceback

import torch

import fake_nvfuser_aliases as aliases
import fake_nvfuser_allocation as allocation
import fake_nvfuser_binding as binding
import fake_nvfuser_checks as checks
import fake_nvfuser_layouts as layouts
import fake_nvfuser_promotion as promotion
import fake_nvfuser_signatures as signatures
import fake_nvfuser_arith as arith
import fake_nvfuser_movement as movement
from fake_nvfuser_layouts import compute_tensor_descriptor  # noqa: F401 (a name of the bindings)
from fake_nvfuser_promotion import PYTHON_TYPES, DataType
from fake_nvfuser_recording import SYMBOLIC_EXTENT, SYMBOLIC_SAMPLE, TensorView, Val, _bind, _current, _record
from fake_nvfuser_recording import _elementwise, _evaluated_by_aten

__version__ = "0.2.36+fake"


def version():
    return __version__


#: Every definition made, in order (tests count them).
definitions: list = []


def _normalized_stride_order(stride_order, rank: int) -> list:
    """``normalizeStrideOrder`` (python_common/python_utils.cpp): each entry in [-n, n) of its own
    length n, negative ones wrapped, no two the same; then ``TensorViewBuilder::strideOrder``'s check
    of that length against the shape's."""
    n = len(stride_order)
    for order in stride_order:
        low = order < 0
        binding.nvf_check(
            order >= -n if low else order < n,
            "order >= -rank" if low else "order < rank",
            f"defineTensor stride_order argument is out of range, expects {'>= ' + str(-n) if low else '< ' + str(n)}, "
            f"but got: {order}",
        )
    wrapped = [order % n for order in stride_order]
    binding.nvf_check(
        len(set(wrapped)) == n,
        "order_set.size() == stride_order.size()",
        "defineTensor got duplicated stride_order entries: " + ", ".join(map(str, stride_order)),
    )
    binding.nvf_check(n in (0, rank), "ndims_ == 0 || ndims_ == (int64_t)stride_order.size()")
    return wrapped


def _inferred_sizes(arg, new_shape) -> tuple:
    """``reshape`` (csrc/ops/alias.cpp) takes one constant -1 among the sizes: the input's numel over
    the others'. A static reshape (constant extents and sizes) refuses a second in ``inferViewShapes``
    (an internal assert), a symbolic one where it meets it. The positions of the sizes that are not
    constants, and whether the reshape is static."""
    inferred = sum(1 for s in new_shape if (s.sample if isinstance(s, Val) and s.const else s) == -1)
    scalars = tuple(i for i, s in enumerate(new_shape) if isinstance(s, Val) and not s.const)
    static = SYMBOLIC_EXTENT not in arg.meta.shape and not scalars
    if static:
        binding.nvf_error(
            inferred <= 1,
            "dynamic_index == -1",
            "Only one dimension can by inferred.",
            at="csrc/transform_view.cpp:743",
        )
    binding.nvf_check(inferred <= 1, "!found_neg_one", "A maximum of one value of -1 can be provided to reshape.")
    return scalars, static


class _Ops:
    """``fd.ops``: the ops of ``nvfuser_direct.ops`` the translators use, and a few more."""

    def __init__(self):
        arith._unary_ops(self)
        arith._binary_ops(self)
        self.sum = arith._reduction("sum", lambda a, d, k: torch.sum(a, d, keepdim=k), arith._sum_dtype)
        self.prod = arith._reduction("prod", arith._prod, arith._sum_dtype)
        self.max = arith._reduction("max", lambda a, d, k: torch.amax(a, d, keepdim=k), arith._max_dtype)
        self.min = arith._reduction("min", lambda a, d, k: torch.amin(a, d, keepdim=k), arith._max_dtype)
        self.var, self.var_mean, self.welford = arith._var, arith._var_mean, arith._welford
        self.cumsum, self.cumprod = arith._scan("cumsum", torch.cumsum), arith._scan("cumprod", torch.cumprod)
        self.pad, self.cat, self.iota, self.full, self.cast = (
            movement._pad,
            movement._cat,
            movement._iota,
            movement._full,
            movement._cast,
        )
        self.where, self.sign, self.bitwise_not = arith._where, arith._sign, arith._bitwise_not
        self.logical_not = lambda arg: _elementwise("logical_not", torch.logical_not, (arg,), torch.bool)

    def broadcast_in_dim(self, arg, shape, broadcast_dims):
        broadcast_dims = checks.broadcast_in_dim(arg, shape, broadcast_dims, SYMBOLIC_EXTENT)
        return _record(
            "broadcast_in_dim",
            movement._broadcast_in_dim,
            (arg, list(shape), list(broadcast_dims)),
            expanded=layouts.broadcast_in_dim_expansion(arg, shape, broadcast_dims),
            ids=allocation.broadcast_in_dim(arg, broadcast_dims),
        )

    def reshape(self, arg, new_shape):
        scalars, static = _inferred_sizes(arg, new_shape)
        rule = allocation.reshaped(arg)
        reshape = functools.partial(movement._reshape, scalars=scalars, static=static)
        return _record("reshape", reshape, (arg, list(new_shape)), expanded=layouts.none_expanded, ids=rule)

    def size(self, arg, dim):
        """``size``: the (maybe expanded) extent of ``arg`` at ``dim`` (csrc/ops/arith.cpp), an Int scalar."""
        dim = checks.wrap_dim(dim, arg.ndim)  # arith.cpp size: wrapDim
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
            movement._slice,
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
        dim = checks.wrap_dim(dim, arg.ndim)  # indexing.cpp indexSelect: wrapDim
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
        #: (output, input, visible) of the outputs aliased to inputs (``fake_nvfuser_aliases``)
        self.aliases: list = []
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
        overload = signatures.check_call("define_tensor", signatures.DEFINE_TENSOR, args, kwargs)
        if overload == 2:  # (sizes, strides, dtype, static_sizes, is_cpu)
            return self._define_tensor_of_strides(*args, **kwargs)
        return self._define_tensor(*args, **kwargs)

    def _define_tensor_of_strides(self, sizes, strides, dtype=DataType.Float, static_sizes=False, is_cpu=False):
        """``define_tensor``'s third overload (ir.cpp): the contiguity and stride order of ``sizes``
        and ``strides`` (``computeTensorDescriptor``), each dim symbolic (-1) but the size-1 ones
        unless ``static_sizes`` (``getTensorViewBuilderSizes``); no shape check of its own."""
        binding.nvf_check(
            len(sizes) == len(strides),
            "sizes.size() == strides.size()",
            "The number of sizes does not match the number of strides.",
            len(sizes),
            len(strides),
        )
        contiguity, stride_order = layouts.compute_tensor_descriptor(list(sizes), list(strides))
        for size in sizes:
            binding.nvf_error(
                size >= 0, "sizes[i] >= 0", f"Size of {size} is not supported in nvFuser. Expected size >= 0."
            )
        shape = [size if static_sizes or size == 1 else -1 for size in sizes]
        return self._define_tensor(shape, contiguity, dtype, is_cpu, stride_order)

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
        stride_order = _normalized_stride_order(stride_order, len(shape))
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
        constant = _record("define_scalar", lambda: torch.tensor(value, dtype=dtype.value), (), tensor_out=False)
        constant.const = True  # ``Val::isConst``: a value and no definition (what ops compute has one)
        return constant

    def add_output(self, output, alias_input=None):
        # (two overloads in the bindings: ``add_output(output)``, ``add_output(output, alias_input)``)
        if alias_input is not None:
            aliases.add_aliased_output(self, output, alias_input)
            return
        assert isinstance(output, Val) and output.fd is self, "add_output: a value of this FusionDefinition"
        aliases.add_visible_output(self, output)

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
        aliases.write_aliases(self, env)
        # Outputs in AllocationDomainPass's order (fake_nvfuser_allocation), expanded dims of stride 0;
        # an aliased one is its input; a hidden one is not returned.
        gone, aliased = aliases.hidden(self), {out.slot for out, _, _ in self.aliases}
        return [
            env[o.slot] if o.slot in aliased else layouts.allocated(env[o.slot], o.expanded, allocation.order(self, o))
            for o in self._outputs
            if o.slot not in gone
        ]
