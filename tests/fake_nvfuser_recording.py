"""The values and the recording of the stand-in ``fake_nvfuser_direct``'s definitions: ``Val`` and
``TensorView`` (each with a meta tensor of its shape and dtype), the dtype an op computes in
(``compute_types``), and ``_record``, which checks an op's operands, computes its outputs' metadata
and records it for ``execute``. The ops' modules (``fake_nvfuser_arith``, ``fake_nvfuser_movement``)
share these helpers.
"""

import torch

import fake_nvfuser_allocation as allocation
import fake_nvfuser_binding as binding
import fake_nvfuser_layouts as layouts
import fake_nvfuser_promotion as promotion
from fake_nvfuser_promotion import PYTHON_TYPES, DataType

#: What a symbolic extent (a -1 dim, an Int scalar input and what is computed from them) stands as
#: while defining: a number most small divisors divide, so that shapes computed from it agree.
SYMBOLIC_EXTENT = 2 * 3 * 4 * 5 * 7
#: What the other scalar inputs stand as while defining, by dtype kind.
SYMBOLIC_SAMPLE = {True: 1.0, False: SYMBOLIC_EXTENT}


class Val:
    """A scalar or tensor value of a definition: ``meta`` has its dtype and shape; ``expanded``
    says of each dim whether it is an expanded broadcast (``bS{1 ex n}``): extent 1 in the
    IterDomain, n in the tensor, which nvFuser allocates with stride 0. ``fake_nvfuser_allocation``
    keeps the rest of its layout: the inputs it depends on (``deps``), its dims' exact-map groups
    (``ids``, ``reduced``) and its allocation domain (``alloc``: logical dims, outermost first)."""

    deps, ids, reduced, alloc = frozenset(), (), (), None
    #: A constant of ``define_scalar``'s (``Val::isConst``).
    const = False

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
        return self.fd.ops.shape(self)

    def size(self, dim):  # the (maybe expanded) extent at dim, as ``ops.size`` (python_direct ir.cpp:206)
        return self.fd.ops.size(self, dim)


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
    if torch.device(device).type != "cuda":  # (a real CPU one: scalar arithmetic reads its item)
        return torch.tensor(x, dtype=dtype, device=device)
    # (``full``, not ``torch.tensor``: a FakeTensorMode makes a fake CUDA tensor of a factory, where
    # ``torch.tensor`` copies its data to the device outside the mode and needs a CUDA driver)
    return torch.full((), x, dtype=dtype, device=device)


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
