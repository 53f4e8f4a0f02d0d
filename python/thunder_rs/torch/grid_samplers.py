"""aten's ``torch.grid_sampler_2d`` and ``torch.grid_sampler_3d``: the sampling kernels
``F.grid_sample`` reaches through ``grid_sampler`` (``sampling.py``), called by name. The torch
executor runs each as eager's op, and their gradients are aten's own backward kernels
(``grid_sampler_2d_backward``, ``3d``): called by name they never take cuDNN's kernels, which
``grid_sampler`` may choose on CUDA.
"""

import torch

from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, check
from thunder_rs.torch.common import require_tensor
from thunder_rs.torch.sampling import INTERPOLATIONS, PADDINGS, grid_sampler, grid_sampler_backward
from thunder_rs.torch.symbols import ltorch, torchsymbol

__all__ = ["grid_sampler_2d", "grid_sampler_3d"]


def _check(op: str, input, grid, interpolation, padding, ndim: int) -> None:
    """aten's checks (``check_grid_sampler_common`` and the 2-D or 3-D one), in its order."""
    require_tensor(op, input, "input")
    require_tensor(op, grid, "grid")
    check(
        input.dtype == grid.dtype,
        op,
        lambda: f"expected scalar type {input.dtype} but found {grid.dtype} (argument grid)",
        ThunderRuntimeError,
    )

    def sizes() -> str:
        return f"input with sizes {list(input.shape)} and grid with sizes {list(grid.shape)}"

    check(
        input.ndim == grid.ndim and input.ndim >= 1 and input.shape[0] == grid.shape[0],
        op,
        lambda: f"grid_sampler(): expected grid and input to have same batch size, but got {sizes()}",
        ThunderRuntimeError,
    )
    check(
        grid.shape[-1] == input.ndim - 2,
        op,
        lambda: (
            f"grid_sampler(): expected grid to have size {input.ndim - 2} in last dimension, but got grid with "
            f"sizes {list(grid.shape)}"
        ),
        ThunderRuntimeError,
    )
    check(
        input.ndim == ndim,
        op,
        lambda: f"grid_sampler(): expected {ndim}D input and grid with same number of dimensions, but got {sizes()}",
        ThunderRuntimeError,
    )
    # (aten takes other numbers and computes what its switch falls through to: refused here)
    known = interpolation in INTERPOLATIONS.values() and padding in PADDINGS.values()
    check(
        known and not (ndim == 5 and interpolation == INTERPOLATIONS["bicubic"]),
        op,
        lambda: f"interpolation mode {interpolation} and padding mode {padding} name no sampling of {ndim}D inputs",
        ThunderNotImplementedError,
    )


@torchsymbol(torch.grid_sampler_2d)
def grid_sampler_2d(input, grid, interpolation_mode, padding_mode, align_corners):
    _check("ltorch.grid_sampler_2d", input, grid, interpolation_mode, padding_mode, 4)
    return grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners)


@torchsymbol(torch.grid_sampler_3d)
def grid_sampler_3d(input, grid, interpolation_mode, padding_mode, align_corners):
    _check("ltorch.grid_sampler_3d", input, grid, interpolation_mode, padding_mode, 5)
    return grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners)


def _grid_sampler_nd_grad(symbol, input, grid, interpolation, padding, align_corners):
    """aten's own backward kernel (``cudnn=False``: never cuDNN's, as eager's for the named op)."""
    out = symbol(input, grid, interpolation, padding, align_corners)
    mask = (input.requires_grad, grid.requires_grad)
    if any(mask):
        grads = grid_sampler_backward(get_grad(out), input, grid, interpolation, padding, align_corners, mask, False)
        for x, grad in zip([x for x, wanted in zip((input, grid), mask) if wanted], grads):
            put_grad(x, grad)
    return out


@register_grad(ltorch.grid_sampler_2d)
def grid_sampler_2d_grad(input, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sampler_nd_grad(ltorch.grid_sampler_2d, input, grid, interpolation_mode, padding_mode, align_corners)


@register_grad(ltorch.grid_sampler_3d)
def grid_sampler_3d_grad(input, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sampler_nd_grad(ltorch.grid_sampler_3d, input, grid, interpolation_mode, padding_mode, align_corners)
