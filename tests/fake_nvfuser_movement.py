"""The stand-in ``fake_nvfuser_direct``'s data movement and factories (csrc/ops/alias.cpp,
indexing.cpp, arith.cpp): what each computes, on meta tensors while defining (symbolic extents as
their samples) and on the inputs' device when the definition executes.
"""

import math

import torch

import fake_nvfuser_allocation as allocation
import fake_nvfuser_binding as binding
import fake_nvfuser_checks as checks
import fake_nvfuser_layouts as layouts
from fake_nvfuser_promotion import HALF, DataType
from fake_nvfuser_recording import SYMBOLIC_EXTENT, Val, _as, _defined_by_scalars, _device, _fd, _ints, _operand
from fake_nvfuser_recording import _record

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
    # (by ``aten.slice``, not indexing: ``Tensor.__getitem__`` enters a CUDA device guard outside a
    # FakeTensorMode, which needs a CUDA driver)
    for d, (s, e, st) in enumerate(zip(start, end, strides)):
        a = torch.ops.aten.slice.Tensor(a, d, int(s), int(e), st)
    return a


def _reshape(a, shape, scalars=(), static=False):
    """``reshape`` (csrc/ops/alias.cpp): ``scalars``, the positions of ``shape`` given as values that
    are not constants; ``static``, whether the input's extents and the sizes are all constants."""
    sizes = _ints(shape)
    # While defining, a symbolic extent stands as its sample: a reshape to constants (the trace knows
    # the extent's value where it reshapes) relates the two only when nvFuser executes, and a -1 among
    # the sizes is an extent of its own (the symbolic reshape's: numel over the other sizes).
    if a.is_meta and (SYMBOLIC_EXTENT in a.shape or _defined_by_scalars(a, shape)):
        return a.new_empty([SYMBOLIC_EXTENT if s == -1 else s for s in sizes])
    numel, known = a.numel(), math.prod(s for s in sizes if s != -1)
    # DynamicTransformConcretizationInfo::analyzeReshapes, when it executes: a value that is -1 then
    # is refused (only a constant -1 is inferred, when defining).
    binding.nvf_check(
        numel == 0 or all(sizes[i] != -1 for i in scalars),
        "is_empty || out_id->extent()->isConst()",
        "Values of -1 passed to reshape must be constant at definition.",
    )
    if -1 in sizes:
        # A static reshape's inferViewShapes (csrc/transform_view.cpp) refuses a -1 that does not
        # divide; a symbolic one's -1 is numel / the others' product, checked below as any extent.
        binding.nvf_error(
            not static or numel == 0 or (known != 0 and numel % known == 0),
            "kNumElements == 0 || kNumElements % new_size_num_elements == 0",
            "Cannot infer the actual size of -1 output domain as the number of input elements is not divisible by "
            f"the number of the output elements computed from the other output domains. Number of input elements: "
            f"{numel}. Number of output elements: {known}",
            at="csrc/transform_view.cpp:756",
        )
        sizes = [(numel // known if numel and known else 0) if s == -1 else s for s in sizes]
    binding.nvf_error(
        math.prod(sizes) == numel,
        "original_num_elements == new_num_elements",
        f"Total element counts across view operation must match: {numel} vs {math.prod(sizes)}",
        at="csrc/transform_view.cpp:358",
    )
    return a.reshape(sizes)


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
    checks.cat([t.meta.dtype for t in tensors], [t.ndim for t in tensors], dim)
    rule = allocation.catted(list(tensors), dim)
    return _record("cat", lambda ts: torch.cat(ts, dim), (list(tensors),), expanded=layouts.none_expanded, ids=rule)


def _constant(value):
    """A Python number's value or a ``define_scalar`` constant's (``Val::isConst``), else None."""
    if isinstance(value, Val):
        return value.sample if value.const else None
    return value


def _iota(length, start=None, step=None, dtype=DataType.Int):
    checks.iota(*(None if v is None else _operand(v)[1] for v in (length, start, step)), dtype)
    checks.iota_constants(*(_constant(v) for v in (start, step)))
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
