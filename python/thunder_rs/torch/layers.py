"""Layers with weights beyond linear and embedding (``torch.nn.functional``): bilinear and
embedding_bag.

embedding_bag reads its offsets only through arithmetic: each looked-up row's bag is the number
of offsets at or before its position, less one (a comparison against every offset), so no
tensor value decides a shape. Sums and means add the rows into their bags with ``index_add``;
``max`` compares each row against each bag and takes the first maximum, as eager does, so that
the gradient of a tie goes to the row eager's ``max_indices`` names.
"""

import math

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

from thunder_rs import prims
from thunder_rs.core.lang import autocast
from thunder_rs.torch.symbols import ltorch
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, ThunderValueError, check
from thunder_rs.torch.symbols import torchsymbol
from thunder_rs.core.lang.symint import same_shape
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.torch.common import OpaqueKernel, flows, refuse_sparse_grads, sum_to

__all__ = ["bilinear", "trilinear", "embedding_bag"]


# -- bilinear --------------------------------------------------------------------------------------


def _check_bilinear(op: str, input1, input2, weight, bias) -> None:
    check(
        input1.ndim == input2.ndim,
        op,
        f"bilinear(): input dimensions do not match: got {input1.ndim} and {input2.ndim} (argument input2)",
        ThunderRuntimeError,
    )
    check(
        same_shape(input1.shape[:-1], input2.shape[:-1]),
        op,
        f"bilinear(): input batch dimensions do not match:"
        f" got {list(input1.shape[:-1])} and {list(input2.shape[:-1])} (argument input2)",
        ThunderRuntimeError,
    )
    check(
        weight.ndim == 3,
        op,
        f"bilinear(): weight must be 3-D, got {weight.ndim}-D (argument weight)",
        ThunderRuntimeError,
    )
    check(
        input1.shape[-1] == weight.shape[1],
        op,
        f"bilinear(): input1 size does not match weight size: got "
        f"{input1.shape[-1]} but expected {weight.shape[1]} (argument input1)",
        ThunderRuntimeError,
    )
    check(
        input2.shape[-1] == weight.shape[2],
        op,
        f"bilinear(): input2 size does not match weight size: got "
        f"{input2.shape[-1]} but expected {weight.shape[2]} (argument input2)",
        ThunderRuntimeError,
    )
    check(
        bias is None or (bias.ndim == 1 and bias.shape[0] == weight.shape[0]),
        op,
        lambda: (
            f"bilinear(): bias size "
            f"does not match weight size: got {list(bias.shape)} but expected [{weight.shape[0]}] (argument bias)"
        ),
        ThunderRuntimeError,
    )
    for name, t in (("input2", input2), ("weight", weight), ("bias", bias)):
        check(
            t is None or t.dtype == input1.dtype,
            op,
            lambda: f"expected {name} to have dtype {input1.dtype}, but got {t.dtype} (argument {name})",
            ThunderRuntimeError,
        )


@torchsymbol(F.bilinear, torch.bilinear)
def bilinear(input1, input2, weight, bias=None):
    """out[..., o] = sum_ij input1[..., i] * weight[o, i, j] * input2[..., j] + bias[o]: one
    matrix product with the weight's (i, o * j) view, then a product with input2 summed over j."""
    op = "ltorch.bilinear"
    _check_bilinear(op, input1, input2, weight, bias)
    active = autocast.state()
    lowered = active is not None and input1.dtype == torch.float32 and input1.device.type in dict(active.devices())
    check(
        not lowered,
        op,
        "under autocast eager computes bilinear's inner products in lower precision inside aten's "
        "_trilinear, which thunder_rs does not reproduce; call it outside autocast or in float64 (argument input1)",
        ThunderNotImplementedError,
    )
    outs, ins1, ins2 = weight.shape
    lead = tuple(input1.shape[:-1])
    rows = math.prod(lead)
    x1, x2 = ltorch.reshape(input1, (rows, ins1)), ltorch.reshape(input2, (rows, ins2))
    out = trilinear(x1, weight, x2, *_BILINEAR_DIMS)
    if bias is not None:
        out = out + bias
    return ltorch.reshape(out, (*lead, outs))


#: at::bilinear's _trilinear of (rows, i), (o, i, j), (rows, j): expand1, expand2, expand3, sumdim.
_BILINEAR_DIMS = ((1, 3), (0,), (1, 2), (2, 3))


def _unsqueezed_shape(shape, expand) -> list:
    out = list(shape)
    for d in sorted(expand):
        out.insert(d, 1)
    return out


def _trilinear_meta(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    shapes = [_unsqueezed_shape(t.shape, e) for t, e in ((i1, expand1), (i2, expand2), (i3, expand3))]
    sizes = [next((s[d] for s in shapes if s[d] != 1), 1) for d in range(len(shapes[0]))]
    shape = tuple(n for d, n in enumerate(sizes) if d not in sumdim)
    return [(shape, i1.dtype, any(t.requires_grad for t in (i1, i2, i3)))]


@torchsymbol(name="trilinear", meta=_trilinear_meta)
def trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """aten's ``_trilinear``: ``(i1.unsqueeze(expand1) * i2.unsqueeze(expand2) *
    i3.unsqueeze(expand3)).sum(sumdim)``, the kernel of bilinear and of its gradients."""
    ops = []
    for t, expand in ((i1, expand1), (i2, expand2), (i3, expand3)):
        for d in sorted(expand):
            t = ltorch.unsqueeze(t, d)
        ops.append(t)
    return ltorch.sum(ops[0] * ops[1] * ops[2], tuple(sumdim))


@register_grad(ltorch.bilinear)
def bilinear_grad(input1, input2, weight, bias=None):
    """Eager's ``_trilinear_backward``: each operand's gradient a ``_trilinear`` of the others and
    the cotangent (and the bias's, the cotangent summed)."""
    out = bilinear(input1, input2, weight, bias)
    lead, (outs, ins1, ins2) = tuple(input1.shape[:-1]), weight.shape
    rows = math.prod(lead)
    cotangent = get_grad(out)
    g = ltorch.reshape(cotangent, (rows, outs))
    x1, x2 = ltorch.reshape(input1, (rows, ins1)), ltorch.reshape(input2, (rows, ins2))
    e1, e2, e3, sumdim = _BILINEAR_DIMS
    if weight.requires_grad:
        put_grad(weight, trilinear(x1, g, x2, e1, sumdim, e3, e2))
    # (input2's first: eager's reach the inputs through the views it flattened them with, the last
    # taken first, so one tensor passed as both sums its gradients in that order)
    if input2.requires_grad:
        put_grad(input2, ltorch.reshape(trilinear(x1, weight, g, e1, e2, sumdim, e3), input2.shape))
    if input1.requires_grad:
        put_grad(input1, ltorch.reshape(trilinear(g, weight, x2, sumdim, e2, e3, e1), input1.shape))
    if bias is not None and bias.requires_grad:
        put_grad(bias, sum_to(cotangent, bias.shape))  # (the bias is added after the reshape)
    return out


# -- embedding_bag ---------------------------------------------------------------------------------

_MODES = ("sum", "mean", "max")


def _check_bags(op: str, input, offsets) -> None:
    """Eager's checks of the input's and offsets' ranks and dtypes."""
    if input.ndim == 2:
        check(
            offsets is None,
            op,
            "if input is 2D, then offsets has to be None, as input is treated is a mini-batch "
            "of fixed length sequences (argument offsets)",
            ThunderValueError,
        )
        return
    check(
        input.ndim == 1,
        op,
        f"input has to be 1D or 2D Tensor, but got Tensor of dimension {input.ndim} (argument input)",
        ThunderValueError,
    )
    check(offsets is not None, op, "offsets has to be a 1D Tensor but got None (argument offsets)", ThunderValueError)
    check(offsets.ndim == 1, op, "offsets has to be a 1D Tensor (argument offsets)", ThunderValueError)
    check(
        offsets.dtype == input.dtype,
        op,
        f"expected input and offsets to have the same dtype, got {input.dtype} and {offsets.dtype} (argument offsets)",
        ThunderRuntimeError,
    )


def _bags(op: str, input, offsets, per_sample_weights, include_last_offset):
    """The flat indices, the bags' starts, the flat per-sample weights and the bag count, as
    F.embedding_bag reads a 1-D input with offsets or a 2-D input of equal bags. Offsets are
    data: eager's checks of their values are made where the starts are taken
    (``embedding_bag_bounds``)."""
    _check_bags(op, input, offsets)
    if input.ndim == 2:
        flat = ltorch.reshape(input, (input.numel(),))
        starts = prims.iota(input.shape[0], 0, input.shape[1], input.device, input.dtype)
        weights = None if per_sample_weights is None else ltorch.reshape(per_sample_weights, (input.numel(),))
        return flat, starts, weights, input.shape[0]
    count = _bag_count(op, offsets, include_last_offset)
    starts = embedding_bag_bounds(offsets, count, input.shape[0], include_last_offset)[0]
    return input, starts, per_sample_weights, count


def _bag_count(op: str, offsets, include_last_offset) -> int:
    """The number of bags 1-D ``offsets`` make."""
    count = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    check(
        count >= 0,
        op,
        "include_last_offset: number of offsets should be at least 1 (argument offsets)",
        ThunderRuntimeError,
    )
    return count


def _bounds_meta(offsets, count, length, include_last_offset):
    return [((count,), torch.int64, False, None)]


#: ``(offsets, bag count, input length, include_last_offset)`` -> the bags' starts (int64), after
#: eager's checks of the offsets' values (``offsets[0]`` is 0, the last is no greater than the
#: input's length, none decreases). With ``include_last_offset`` a last offset short of the input's
#: length (which its documentation rules out) is refused: eager's kernels then disagree on the
#: positions past it (sum drops them, max keeps them, mean divides by their count).
embedding_bag_bounds = OpaqueKernel("embedding_bag_bounds", _bounds_meta)


def _aten_embedding_bag_bounds(offsets, count, length, include_last_offset):
    offsets = offsets.long()
    if offsets.numel() and not (offsets.is_meta or isinstance(offsets, FakeTensor)):
        values = offsets.tolist()  # (one host read for the three checks)
        first, last = values[0], values[-1]
        torch._check(
            first == 0,
            lambda: (
                "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from position 0. "
                f"However, got {first}"
            ),
        )
        torch._check(
            last <= length,
            lambda: f"offsets[-1] can not be greater than input's length {length} but got offsets[-1] of {last}",
        )
        torch._check(all(map(int.__le__, values, values[1:])), lambda: "embedding_bag: offsets must not decrease")
        if include_last_offset and last != length:
            raise ThunderNotImplementedError(
                f"ltorch.embedding_bag: with include_last_offset the last offset ({last}) must be the input's length "
                f"({length}); eager's modes disagree on the positions past it (argument offsets)"
            )
    return offsets[:count]


def _check_embedding_bag(op, input, weight, max_norm, scale_grad_by_freq, mode, sparse, per_sample_weights):
    check(
        input.dtype in (torch.int64, torch.int32),
        op,
        f"Expected tensor for argument #1 'indices' to have one of the "
        f"following scalar types: Long, Int; but got {input.dtype} instead (argument input)",
        ThunderRuntimeError,
    )
    check(
        per_sample_weights is None or same_shape(input.shape, per_sample_weights.shape),
        op,
        lambda: (
            "If "
            f"per_sample_weights ({list(per_sample_weights.shape)}) is not None, then it must have the same shape as "
            f"the input ({list(input.shape)}) (argument per_sample_weights)"
        ),
        ThunderValueError,
    )
    check(
        weight.ndim == 2,
        op,
        f"weight has to be a 2D Tensor, but got Tensor of dimension {weight.ndim} (argument weight)",
        ThunderValueError,
    )
    check(mode in _MODES, op, "mode has to be one of sum, mean or max (argument mode)", ThunderValueError)
    check(
        mode != "max" or not scale_grad_by_freq,
        op,
        "max mode does not support scaling the gradient by the frequency (argument scale_grad_by_freq)",
        ThunderValueError,
    )
    check(
        mode != "max" or not sparse, op, "max mode does not support sparse weights (argument sparse)", ThunderValueError
    )
    check(
        per_sample_weights is None or mode == "sum",
        op,
        f"per_sample_weights was not None. per_sample_weights is "
        f"only supported for mode='sum' (got mode='{mode}') (argument per_sample_weights)",
        ThunderNotImplementedError,
    )
    check(
        max_norm is None,
        op,
        "max_norm renormalises weight in place, which only F.embedding_bag does (argument max_norm)",
        ThunderNotImplementedError,
    )
    refuse_sparse_grads(op, weight, sparse)
    check(
        weight.dtype.is_floating_point,
        op,
        f"expected a floating weight, got {weight.dtype} (argument weight)",
        ThunderRuntimeError,
    )


def _bag_of_each(flat, starts, count: int):
    """Each position's bag: the number of bag starts at or before it, less one."""
    positions = prims.iota(flat.shape[0], 0, 1, flat.device, starts.dtype)
    grid = (flat.shape[0], count)
    started = prims.ge(prims.broadcast_in_dim(positions, grid, (0,)), prims.broadcast_in_dim(starts, grid, (1,)))
    return prims.sub(prims.sum(prims.convert_element_type(started, torch.int64), (1,)), 1)


def _max_of_bags(rows, bag, valid, count: int):
    """Each bag's elementwise maximum row, taken as the first maximum (empty bags give zeros)."""
    length, features = rows.shape
    member = prims.eq(
        prims.broadcast_in_dim(bag, (length, count), (0,)),
        prims.broadcast_in_dim(prims.iota(count, 0, 1, rows.device, torch.int64), (length, count), (1,)),
    )
    if valid is not None:
        member = prims.bitwise_and(member, prims.broadcast_in_dim(valid, (length, count), (0,)))
    cube = (length, count, features)
    inside = prims.broadcast_in_dim(member, cube, (0, 1))
    candidates = prims.where(inside, prims.broadcast_in_dim(rows, cube, (0, 2)), -math.inf)
    best = prims.reshape(prims.argmax(candidates, 0), (1, count, features))
    out = prims.reshape(prims.take_along_axis(candidates, best, 0), (count, features))
    empty = prims.eq(prims.sum(prims.convert_element_type(member, torch.int64), (0,)), 0)
    return prims.where(prims.broadcast_in_dim(empty, (count, features), (0,)), 0.0, out)


@torchsymbol(F.embedding_bag)
def embedding_bag(
    input,
    weight,
    offsets=None,
    max_norm=None,
    norm_type=2,
    scale_grad_by_freq=False,
    mode="mean",
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=None,
):
    op = "ltorch.embedding_bag"
    _check_embedding_bag(op, input, weight, max_norm, scale_grad_by_freq, mode, sparse, per_sample_weights)
    flat, starts, sample_weights, count = _bags(op, input, offsets, per_sample_weights, include_last_offset)
    padding_idx = _padding(op, weight, padding_idx)
    rows = ltorch.embedding(flat, weight, scale_grad_by_freq=scale_grad_by_freq)
    bag = _bag_of_each(flat, starts, count)
    valid = None if padding_idx is None else prims.ne(flat, padding_idx)
    if mode == "max":
        return _max_of_bags(rows, bag, valid, count)
    return _sum_or_mean_of_bags(rows, bag, valid, sample_weights, count, mode == "mean")[0]


def _padding(op: str, weight, padding_idx):
    """``padding_idx`` as a row of ``weight`` (None for none)."""
    if padding_idx is None:
        return None
    check(
        -weight.shape[0] <= padding_idx < weight.shape[0],
        op,
        "padding_idx must be within the number of embeddings (argument padding_idx)",
        ThunderRuntimeError,
    )
    return padding_idx % weight.shape[0]


def _sum_or_mean_of_bags(rows, bag, valid, sample_weights, count: int, mean: bool):
    """Each bag's sum (or mean) of its rows (times their per-sample weights), and each bag's
    number of rows that are not the padding index."""
    if sample_weights is not None:
        rows = rows * ltorch.unsqueeze(sample_weights, 1)
    if valid is not None:
        rows = ltorch.where(ltorch.unsqueeze(valid, 1), rows, 0.0)
    zeros = ltorch.zeros((count, rows.shape[1]), dtype=rows.dtype, device=rows.device)
    total = ltorch.index_add(zeros, 0, bag, rows)
    ones = ltorch.ones((rows.shape[0],), dtype=rows.dtype, device=rows.device)
    members = ones if valid is None else ltorch.where(valid, ones, 0.0)
    sizes = ltorch.index_add(ltorch.zeros((count,), dtype=rows.dtype, device=rows.device), 0, bag, members)
    if not mean:
        return total, sizes
    return ltorch.where(ltorch.unsqueeze(sizes == 0, 1), 0.0, total / ltorch.unsqueeze(sizes, 1)), sizes


_MODE_NUMBERS = {"sum": 0, "mean": 1, "max": 2}


def _make_offset2bag(offsets, length: int):
    """Each position's bag as eager's ``make_offset2bag`` numbers them (``_embedding_bag_backward``
    makes it so from the offsets where the forward left it empty)."""
    offset2bag = torch.zeros(length + 1, dtype=offsets.dtype, device=offsets.device)
    offset2bag.index_add_(0, offsets, torch.ones_like(offsets))
    offset2bag[0] -= 1
    return offset2bag.cumsum(0, dtype=offsets.dtype)[:length]


def _eager_bag_forward(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx):
    """Eager's ``_embedding_bag`` (what ``F.embedding_bag`` runs when a gradient is wanted): the
    bags and the bookkeeping its backward reads. Where the CPU kernel's sum fast path leaves the
    position-to-bag map empty, it is made here as the backward would make it (the trace holds one
    size for it)."""
    indices, offsets = indices.contiguous(), offsets.contiguous()  # (as eager's embedding_bag passes them)
    out, offset2bag, bag_size, _ = torch.ops.aten._embedding_bag(
        weight, indices, offsets, False, mode, False, per_sample_weights, include_last_offset, padding_idx
    )
    if offset2bag.shape[0] != indices.shape[0]:
        offset2bag = _make_offset2bag(offsets, indices.shape[0])
    return out, offset2bag, bag_size


def _bag_forward_meta(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx):
    """The bags, each position's bag and each bag's size (CUDA's kernel keeps one per offset); None
    on other devices (the decomposition's)."""
    device = weight.device.type
    if device not in ("cpu", "cuda"):
        return None
    count = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    return [
        ((count, weight.shape[1]), weight.dtype, flows(weight, per_sample_weights)),
        ((indices.shape[0],), indices.dtype, False),
        ((count if device == "cpu" else offsets.shape[0],), indices.dtype, False),
    ]


@torchsymbol(name="embedding_bag_forward", meta=_bag_forward_meta)
def embedding_bag_forward(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx):
    """A sum or mean ``embedding_bag`` of 1-D ``indices`` (``padding_idx`` -1 for none) with what
    its backward reads: each position's bag and, for a mean, each bag's size not counting the
    padding index (zeros for a sum, as eager's CPU kernel leaves them)."""
    count = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    starts = embedding_bag_bounds(offsets, count, indices.shape[0], include_last_offset)[0]
    bag = _bag_of_each(indices, starts, count)
    valid = None if padding_idx < 0 else prims.ne(indices, padding_idx)
    rows = ltorch.embedding(indices, weight)
    mean = mode == _MODE_NUMBERS["mean"]
    out, sizes = _sum_or_mean_of_bags(rows, bag, valid, per_sample_weights, count, mean)
    if mean:
        sizes = prims.convert_element_type(sizes, indices.dtype)
    else:
        sizes = ltorch.zeros((count,), dtype=indices.dtype, device=indices.device)
    return out, prims.convert_element_type(bag, indices.dtype), sizes


def _eager_bag_weight_grad(
    grad, weight, indices, offsets, bags, mode, per_sample_weights, include_last_offset, padding_idx
):
    """Eager's weight gradient of ``torch.embedding_bag``: its backward kernel on the forward's
    bookkeeping (``bags``: ``embedding_bag_forward``'s position-to-bag map and bag sizes; the
    maxima eager's kernel takes are read by max bags only)."""
    offset2bag, bag_size = bags
    return torch.ops.aten._embedding_bag_backward(
        grad,
        indices.contiguous(),
        offsets.contiguous(),
        offset2bag,
        bag_size,
        bag_size,
        weight.shape[0],
        False,
        mode,
        False,
        per_sample_weights,
        padding_idx,
    )


@torchsymbol(_eager_bag_weight_grad, name="embedding_bag_weight_grad")
def embedding_bag_weight_grad(
    grad, weight, indices, offsets, bags, mode, per_sample_weights, include_last_offset, padding_idx
):
    """The gradient of a sum or mean ``embedding_bag``'s weight: each looked-up row gets its bag's
    cotangent (divided by the bag's size for a mean, times its per-sample weight), added into the
    weight's row. The torch executor runs eager's kernel, which adds them in the order of the
    sorted indices with its BLAS's ``axpy`` (this decomposition's ``index_add`` rounded otherwise)."""
    count = grad.shape[0]
    starts = ltorch.narrow(offsets, 0, 0, count) if include_last_offset else offsets
    bag = _bag_of_each(indices, starts, count)
    rows = ltorch.index_select(grad, 0, bag)
    valid = None if padding_idx < 0 else prims.ne(indices, padding_idx)
    if per_sample_weights is not None:
        rows = rows * ltorch.unsqueeze(per_sample_weights, 1)
    if mode == _MODE_NUMBERS["mean"]:
        ones = ltorch.ones(indices.shape, dtype=grad.dtype, device=grad.device)
        members = ones if valid is None else ltorch.where(valid, ones, 0.0)
        sizes = ltorch.index_add(ltorch.zeros((count,), dtype=grad.dtype, device=grad.device), 0, bag, members)
        rows = rows / ltorch.unsqueeze(ltorch.index_select(ltorch.clamp(sizes, 1), 0, bag), 1)
    if valid is not None:
        rows = ltorch.where(ltorch.unsqueeze(valid, 1), rows, 0.0)
    return ltorch.index_add(ltorch.zeros(weight.shape, dtype=grad.dtype, device=grad.device), 0, indices, rows)


def _eager_bag_sample_weights_grad(
    grad, weight, indices, offsets, bags, mode, per_sample_weights, include_last_offset, padding_idx
):
    """Eager's gradient of ``torch.embedding_bag``'s per-sample weights: its backward kernel (a dot
    product per sample) on the forward's position-to-bag map."""
    return torch.ops.aten._embedding_bag_per_sample_weights_backward(
        grad, weight, indices.contiguous(), offsets.contiguous(), bags[0], mode, padding_idx
    )


@torchsymbol(_eager_bag_sample_weights_grad, name="embedding_bag_sample_weights_grad")
def embedding_bag_sample_weights_grad(
    grad, weight, indices, offsets, bags, mode, per_sample_weights, include_last_offset, padding_idx
):
    """The gradient of a sum ``embedding_bag``'s per-sample weights: each sample's looked-up row
    times its bag's cotangent, summed over the features (zero for the padding index)."""
    count = grad.shape[0]
    starts = ltorch.narrow(offsets, 0, 0, count) if include_last_offset else offsets
    bag = _bag_of_each(indices, starts, count)
    dots = ltorch.sum(ltorch.index_select(grad, 0, bag) * ltorch.embedding(indices, weight), 1)
    return dots if padding_idx < 0 else ltorch.where(prims.ne(indices, padding_idx), dots, 0.0)


@register_grad(ltorch.embedding_bag)
def embedding_bag_grad(
    input,
    weight,
    offsets=None,
    max_norm=None,
    norm_type=2,
    scale_grad_by_freq=False,
    mode="mean",
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=None,
):
    """Eager's kernels for sum and mean bags, as its autograd runs them: ``_embedding_bag``
    (``embedding_bag_forward``), whose bookkeeping its backward kernels read
    (``embedding_bag_weight_grad``, ``embedding_bag_sample_weights_grad``); the VJP of the
    decomposition for max bags and for gradients scaled by the frequency."""
    args = (max_norm, norm_type, scale_grad_by_freq, mode, sparse, per_sample_weights, include_last_offset)
    if mode == "max" or scale_grad_by_freq:  # (eager's kernels here take no frequency scaling)
        return ltorch.embedding_bag(input, weight, offsets, *args, padding_idx)
    op = "ltorch.embedding_bag"
    _check_embedding_bag(op, input, weight, max_norm, scale_grad_by_freq, mode, sparse, per_sample_weights)
    _check_bags(op, input, offsets)
    indices, sample_weights = input, per_sample_weights
    if input.ndim == 2:  # (F.embedding_bag's bags of equal length)
        indices = ltorch.reshape(input, (input.numel(),))
        offsets = prims.iota(input.shape[0], 0, input.shape[1], input.device, input.dtype)
        if per_sample_weights is not None:
            sample_weights = ltorch.reshape(per_sample_weights, (input.numel(),))
    else:
        _bag_count(op, offsets, include_last_offset)
    padding = _padding(op, weight, padding_idx)
    padding = -1 if padding is None else padding
    number = _MODE_NUMBERS[mode]
    out, *bags = embedding_bag_forward(weight, indices, offsets, number, sample_weights, include_last_offset, padding)
    context = (indices, offsets, tuple(bags), number, sample_weights, include_last_offset, padding)
    g = get_grad(out)
    if weight.requires_grad:
        put_grad(weight, embedding_bag_weight_grad(g, weight, *context))
    if per_sample_weights is not None and per_sample_weights.requires_grad:
        grad = embedding_bag_sample_weights_grad(g, weight, *context)
        put_grad(per_sample_weights, ltorch.reshape(grad, tuple(per_sample_weights.shape)))
    return out


#: The aten calls the torch executor runs for the kernels.
TORCH_IMPLS = {embedding_bag_bounds: _aten_embedding_bag_bounds, embedding_bag_forward: _eager_bag_forward}
