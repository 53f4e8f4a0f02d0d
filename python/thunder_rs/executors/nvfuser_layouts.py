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
inputs' strides when the definition is built (per input layout, beside nvFuser's compile). Every
output with two or more dims of extent above 1 is pinned, row-major ones too: the inference
reorders a result of row-major inputs as well (a ``[3, 4]`` result that maps only its first dim to
the input it depends on, ``x[:, None].expand(3, 4) + 1``, comes out column-major: the mapped dims go
innermost). An output eager returns not dense (a broadcast, a view with gaps) is left to nvFuser;
one whose eager layout the meta run cannot tell (an op without a meta kernel) too, and the executor
counts it (``stats["unpinned"]``).
"""

import torch


def _meta(a):
    if isinstance(a, torch.Tensor):
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
    return a


class _FactoriesOnMeta(torch.overrides.TorchFunctionMode):
    """Torch calls given a ``device`` make meta tensors: a region's factories (``full``, ``iota``)
    name the CUDA device, beside its inputs made meta."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs and "device" in kwargs:
            kwargs = {**kwargs, "device": "meta"}
        return func(*args, **(kwargs or {}))


def eager_outputs(region, args):
    """The region's outputs as eager computes them on ``args``, as meta tensors (None where its
    torch calls cannot run on meta tensors)."""
    try:
        with torch.no_grad(), torch.autocast("cpu", enabled=False), torch.autocast("cuda", enabled=False):
            with _FactoriesOnMeta():
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


def pinned_orders(region, args) -> tuple | None:
    """Per region output, the stride order (``compute_tensor_descriptor``'s convention: per dim,
    the rank of its stride, 0 innermost) to pin it to, or None to leave it to nvFuser; None in all
    where eager's layouts could not be told."""
    outputs = eager_outputs(region, args)
    if outputs is None:
        return None
    return tuple(stride_order(out) if _ordered(out) else None for out in outputs)


def stride_order(out: torch.Tensor) -> list:
    """The order whose dense allocation (each dim's stride the product of the extents inside it)
    gives ``out``'s strides: its dims by stride, a dim of extent 1 inside the dims of its stride.
    Torch gives a size-1 dim the stride of the dim it sits inside of (channels_last with one
    channel: ``(20, 1, 5, 1)``, C inside W); ``compute_tensor_descriptor`` keeps such ties in
    logical order, which puts C outside W: ``(20, 5, 5, 1)``."""
    inner_first = sorted(range(out.ndim), key=lambda d: (out.stride(d), out.shape[d] != 1))
    order = [0] * out.ndim
    for rank, d in enumerate(inner_first):
        order[d] = rank
    return order


def _ordered(out) -> bool:
    """Whether an output has an order to pin: two or more dims of extent above 1, densely."""
    return isinstance(out, torch.Tensor) and sum(size > 1 for size in out.shape) > 1 and _dense(out)
