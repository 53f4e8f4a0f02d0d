"""The layouts an nvFuser region hands on: eager's.

nvFuser lays out a fusion's outputs by its own rule: a pre-segmentation pass
(``AllocationDomainPass``, csrc/preseg_passes/allocation_order_inference.cpp) gives each output the
stride order of the input it depends on with the most non-broadcast dims, mapped through the
fusion's ops, and row-major where no input decides. That is often eager's layout (a pointwise op of
a channels_last tensor) and often not: ``x.t().contiguous()`` (eager: row-major; nvFuser: the
transpose's order), a reshape of a channels_last tensor (eager copies row-major; nvFuser keeps the
channels innermost), two inputs laid out in different orders (TensorIterator follows the first;
nvFuser takes neither). The trace decides views and copies from eager's layouts, and the program
sees them; a tensor handed back to the user must have them.

So each definition pins its outputs' stride orders (``fd.ops.stride_order``) to the ones eager's
kernels give on the definition's inputs: the region's torch calls run once on meta tensors of the
inputs' strides when the definition is built (per input layout, beside nvFuser's compile), and an
output is pinned where eager's order is not row-major, or where nvFuser could choose another (an
input laid out otherwise than row-major, or a transpose in the region). An output eager returns
not dense (a broadcast, a view with gaps) is left to nvFuser; one whose eager layout the meta run
cannot tell (an op without a meta kernel) too, and the region counts it (``stats["unpinned"]``).
"""

import torch

from thunder_rs.core.base.layouts import is_contiguous

#: Prims that order a value's dims otherwise than its input's.
_REORDERING = ("prims.transpose", "prims.permute")


def _meta(a):
    if isinstance(a, torch.Tensor):
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
    return a


def eager_outputs(region, args):
    """The region's outputs as eager computes them on ``args``, as meta tensors (None where its
    torch calls cannot run on meta tensors)."""
    try:
        with torch.no_grad(), torch.autocast("cpu", enabled=False), torch.autocast("cuda", enabled=False):
            return tuple(region.function(*[_meta(a) for a in args]))
    except Exception:  # noqa: BLE001 (an op without a meta kernel: nvFuser's layout stays)
        return None


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: the elements fill a span of memory exactly, in some order."""
    expected = 1
    for stride, size in sorted((s, n) for s, n in zip(t.stride(), t.shape) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _row_major(t: torch.Tensor) -> bool:
    return is_contiguous(tuple(t.shape), tuple(t.stride()))


def _may_reorder(region, args) -> bool:
    """Whether nvFuser may lay an output out otherwise than row-major: an input is, or a transpose
    maps an input's dims to other positions."""
    if any(isinstance(a, torch.Tensor) and a.ndim > 1 and not _row_major(a) for a in args):
        return True
    return any(call.name in _REORDERING for call in region.calls)


def pinned_orders(region, args, descriptor) -> tuple | None:
    """Per region output, the stride order (``compute_tensor_descriptor``'s: per dim, the rank of
    its stride, 0 innermost) to pin it to, or None to leave it to nvFuser; None in all where
    eager's layouts could not be told."""
    outputs = eager_outputs(region, args)
    if outputs is None:
        return None
    reorder = _may_reorder(region, args)
    orders = []
    for out in outputs:
        if not isinstance(out, torch.Tensor) or out.ndim < 2 or out.numel() <= 1 or not _dense(out):
            orders.append(None)
        elif not _row_major(out) or reorder:
            orders.append(list(descriptor(list(out.shape), list(out.stride()))[1]))
        else:
            orders.append(None)
    return tuple(orders)
