"""How the stand-in ``fake_nvfuser_direct`` lays tensors out as nvFuser does: the descriptor of an
input's strides (``compute_tensor_descriptor``), which dims of a value are expanded broadcasts
(extent 1 in the IterDomain, n in the tensor: ``bS{1 ex n}``) by the rule of the op that made it,
how outputs are allocated (stride 0 in expanded dims), and the layouts nvFuser's schedulers refuse.
"""

import torch

from fake_nvfuser_binding import nvf_check


def compute_tensor_descriptor(sizes, strides):
    """``(contiguity, stride_order)`` of a tensor, a port of nvFuser's computeTensorDescriptor:
    contiguity in allocation order (None for broadcast dims), stride order per logical dim."""
    nvf_check(
        len(sizes) == len(strides),
        "sizes.size() == strides.size()",
        "compute_tensor_descriptor: Sizes and strides must have the same number of dimensions",
    )
    dims = [
        dict(index=i, size=s, stride=st, order=-1, contiguity=None) for i, (s, st) in enumerate(zip(sizes, strides))
    ]
    for d in dims:
        nvf_check(
            d["stride"] >= 0,
            "strides[i] >= 0",
            f"negative stride on tensor is not supported: strides[{d['index']}]={d['stride']}",
        )
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


def broadcast_at(spec, d) -> bool:
    """Whether dim ``d`` of a tensor input defined by ``spec`` (shape, contiguity in allocation
    order, dtype, stride order) is a broadcast: its contiguity is None (getExpanded, python_utils.cpp)."""
    shape, contiguity, _, stride_order = spec
    return contiguity[len(shape) - 1 - stride_order[d] if stride_order else d] is None


def innermost_permuted(spec) -> bool:
    """Whether a tensor input's innermost non-broadcast logical dim is not its innermost allocated one."""
    if not isinstance(spec, tuple):  # a scalar input's DataType
        return False
    shape, contiguity, _, stride_order = spec
    dims = [d for d, size in enumerate(shape) if size != 1 and not (stride_order and broadcast_at(spec, d))]
    return bool(stride_order and dims) and stride_order[dims[-1]] != min(stride_order[d] for d in dims)


def elementwise_expansion(vals, out):
    """An elementwise op's rule (``ops::newOutputDomain``): a dim is expanded where every tensor
    operand of the output's rank has it so."""
    same_rank = [v for v in vals if v.is_tensor() and v.meta.ndim == out.ndim]
    return [bool(same_rank) and out.shape[d] != 1 and all(v.expanded[d] for v in same_rank) for d in range(out.ndim)]


def none_expanded(out):
    """Ops whose outputs' IterDomains are new iterations (reshape, slice, pad, cat, factories)."""
    return [False] * out.ndim


def broadcast_in_dim_expansion(arg, shape, broadcast_dims):
    """A dim of extent > 1 that is new, or an extent-1 (broadcast) dim of ``arg``, is expanded
    (``expand`` of ``broadcast``, python_direct ops.cpp broadcast_in_dim_fn)."""
    expanded = [size != 1 for size in shape]
    for i, d in enumerate(broadcast_dims):
        expanded[d] = arg.expanded[i] or (arg.meta.shape[i] == 1 and shape[d] != 1)
    return lambda out: expanded


def take_along_axis_expansion(arg, index, dim):
    # indexing.cpp takeAlongAxis: the index's IterDomain at dim, and where arg's is a broadcast
    # and the index's is not, or both are and the index's is expanded; arg's elsewhere.
    def from_index(d):
        arg_broadcast = arg.meta.shape[d] == 1 or arg.expanded[d]
        index_broadcast = index.meta.shape[d] == 1 or index.expanded[d]
        return d == dim % arg.ndim or (arg_broadcast and (not index_broadcast or index.expanded[d]))

    return lambda out: [(index if from_index(d) else arg).expanded[d] for d in range(out.ndim)]


def allocated(value, expanded, order=None):
    """An output as nvFuser allocates it: a fresh tensor laid out densely in ``order`` (its logical
    dims, outermost first; row-major if None), but for its expanded broadcast dims, of stride 0."""
    if not isinstance(value, torch.Tensor):
        return value
    compact = value
    for d, e in enumerate(expanded):
        if e:
            compact = compact.narrow(d, 0, 1)
    order = list(range(value.ndim)) if order is None else list(order)
    dense = compact.permute(order).clone(memory_format=torch.contiguous_format)
    return dense.permute([order.index(d) for d in range(value.ndim)]).expand(value.shape)


def contiguity_vec(shape, stride_order, contiguity: bool) -> list:
    """``getContiguityVec`` (python_utils.cpp): a bool contiguity as one flag per dim in allocation
    order, None at the dims of extent 1."""
    flags: list = [None] * len(shape)
    for d, size in enumerate(shape):
        flags[len(shape) - 1 - stride_order[d] if stride_order else d] = None if size == 1 else contiguity
    return flags


def squeezed(a, dims):
    """``a`` without its broadcast ``dims`` (checked when defined): an expanded one has its expanded
    extent (stride 0) here; a symbolic one is concretized when executed, and must be one then."""
    for d in sorted(dims, reverse=True):
        nvf_check(
            a.is_meta or a.shape[d] == 1 or a.stride(d) == 0,
            "id->extent()->evaluate().as<int64_t>() == 1",
            "Can not squeeze dimension(s) with size != 1.",
        )
        a = a.select(d, 0)
    return a
