"""Sliding blocks (``torch.nn.functional``): unfold (im2col) and fold (col2im), with their grad
rules: each is the other's transpose, one aten call each, as in eager's autograd. The window
geometry is ``pooling.py``'s.
"""

import torch
import torch.nn.functional as F

from thunder_rs import prims
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.errors import (
    ThunderIndexError,
    ThunderNotImplementedError,
    ThunderRuntimeError,
    check,
)
from thunder_rs.torch.symbols import ltorch, torchsymbol
from thunder_rs.torch.pooling import (
    _pad_spatial,
    check_pool_input,
    gather_windows,
    padded_lengths,
    pool_out_size,
    scatter_windows,
    spatial_tuple,
    unpad_spatial,
    window_tables,
)


__all__ = [
    "im2col",
    "col2im",
]


# -- sliding blocks (im2col and col2im) ------------------------------------------------------------


def _check_block_dtype(op: str, input) -> None:
    """im2col and col2im take floating and bool tensors, not integers."""
    check(
        input.dtype.is_floating_point or input.dtype == torch.bool,
        op,
        lambda: f"not implemented for {input.dtype} (argument input)",
        ThunderNotImplementedError,
    )


def block_geometry(op: str, sizes, kernel_size, dilation, padding, stride):
    """Per spatial dim of unfold and fold: (size, kernel, stride, padding, dilation, blocks)."""
    kernel, dils = spatial_tuple(op, kernel_size, 2, "kernel_size"), spatial_tuple(op, dilation, 2, "dilation")
    pads, strides = spatial_tuple(op, padding, 2, "padding"), spatial_tuple(op, stride, 2, "stride")
    for name, values, low in (
        ("kernel size", kernel, 1),
        ("dilation", dils, 1),
        ("padding", pads, 0),
        ("stride", strides, 1),
    ):
        arg = name.replace(" ", "_")
        check(
            all(v >= low for v in values),
            op,
            f"{name} should be {'non-negative' if low == 0 else 'greater than zero'}"
            f", but got {values} (argument {arg})",
            ThunderRuntimeError,
        )
    geometry = [
        (size, k, s, p, d, pool_out_size(size, k, s, p, d, False))
        for size, k, s, p, d in zip(sizes, kernel, strides, pads, dils)
    ]
    blocks = tuple(g[-1] for g in geometry)
    check(
        all(b > 0 for b in blocks),
        op,
        f"Given spatial size {tuple(sizes)}, kernel_size={kernel}, dilation={dils}, "
        f"padding={pads}, the calculated shape of the array of sliding blocks is {blocks}, which is too small "
        "(argument kernel_size)",
        ThunderRuntimeError,
    )
    return geometry


# im2col and col2im, not unfold and fold: Tensor.unfold is another op.
@torchsymbol(F.unfold)
def im2col(input, kernel_size, dilation=1, padding=0, stride=1):
    """Each sliding block of a (N, C, H, W) or (C, H, W) input as a column: (N, C * kh * kw, L)."""
    op = "ltorch.im2col (F.unfold)"
    check(
        input.ndim in (3, 4),
        op,
        f"Input Error: Only 3D or 4D input Tensors are supported (got {input.ndim}D) (argument input)",
        ThunderNotImplementedError if input.ndim > 4 else ThunderIndexError,
    )
    check_pool_input(op, input, 2)
    _check_block_dtype(op, input)
    geometry = block_geometry(op, input.shape[-2:], kernel_size, dilation, padding, stride)
    windows = gather_windows(
        _pad_spatial(input, geometry, False if input.dtype == torch.bool else 0), window_tables(input.device, geometry)
    )
    lead = input.ndim - 2  # (lead..., oh, ow, K) -> (lead[:-1]..., C * K, oh * ow)
    moved = prims.transpose(windows, (*range(lead), lead + 2, lead, lead + 1))
    channels = input.shape[lead - 1] * windows.shape[-1]
    return prims.reshape(moved, (*input.shape[: lead - 1], channels, windows.shape[lead] * windows.shape[lead + 1]))


@torchsymbol(F.fold)
def col2im(input, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """Sums sliding-block columns (N, C * kh * kw, L) or (C * kh * kw, L) into (N, C, H, W)."""
    op = "ltorch.col2im (F.fold)"
    check(
        input.ndim in (2, 3),
        op,
        f"Input Error: Only unbatched (2D) or batched (3D) input Tensors are supported "
        f"(got {input.ndim}D) (argument input)",
        ThunderNotImplementedError,
    )
    _check_block_dtype(op, input)
    sizes = spatial_tuple(op, output_size, 2, "output_size")
    geometry = block_geometry(op, sizes, kernel_size, dilation, padding, stride)
    window = geometry[0][1] * geometry[1][1]
    columns, blocks = input.shape[-2:]
    check(
        columns % window == 0,
        op,
        f"Expected size of input's dimension {input.ndim - 2} to be divisible by the "
        f"product of kernel_size, but got input.size({input.ndim - 2})={columns} and kernel_size="
        f"{(geometry[0][1], geometry[1][1])} (argument input)",
        ThunderRuntimeError,
    )
    outs = (geometry[0][-1], geometry[1][-1])
    check(
        blocks == outs[0] * outs[1],
        op,
        f"Given output_size={sizes}, expected size of input's dimension "
        f"{input.ndim - 1} to match the calculated number of sliding blocks {outs[0]} * {outs[1]} = "
        f"{outs[0] * outs[1]}, but got input.size({input.ndim - 1})={blocks} (argument input)",
        ThunderRuntimeError,
    )
    lead = tuple(input.shape[:-2])
    split = prims.reshape(input, (*lead, columns // window, window, *outs))
    n = len(lead) + 1  # the channel dim's index after lead
    windows = prims.transpose(split, (*range(n), n + 1, n + 2, n))
    return unpad_spatial(
        scatter_windows(windows, window_tables(input.device, geometry), padded_lengths(geometry)), geometry
    )


# -- grad rules ------------------------------------------------------------------------------------


@register_grad(ltorch.im2col)
def im2col_grad(input, kernel_size, dilation=1, padding=0, stride=1):
    out = ltorch.im2col(input, kernel_size, dilation, padding, stride)
    put_grad(input, ltorch.col2im(get_grad(out), tuple(input.shape[-2:]), kernel_size, dilation, padding, stride))
    return out


@register_grad(ltorch.col2im)
def col2im_grad(input, output_size, kernel_size, dilation=1, padding=0, stride=1):
    out = ltorch.col2im(input, output_size, kernel_size, dilation, padding, stride)
    put_grad(input, ltorch.im2col(get_grad(out), kernel_size, dilation, padding, stride))
    return out
