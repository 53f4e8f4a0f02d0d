"""aten's antialiased resize kernels called by name: ``torch.ops.aten._upsample_bilinear2d_aa``
and ``_upsample_bicubic2d_aa`` (and ``torch._C._nn``'s), which ``F.interpolate(..., antialias=True)``
calls. The ``vec`` form takes exactly one of an output size and scale factors, as ``F.interpolate``
passes them, and is ``F.interpolate``'s antialiased resize (its gradient too). The default form
takes the output size and, apart, the scales the kernel is given (``scales_h``, ``scales_w``: no
``F.interpolate`` call passes both): the same resize with those scales, its gradient eager's
backward kernel given them too. (Was an eager fallback, whose call passed the default form's
arguments as the ``vec`` form's: eager's overloads refused them.) The ``out=`` form stays eager's.
"""

import torch

from thunder_rs.core.lang.fallback import user_fallback
from thunder_rs.core.lang.grad import get_grad, put_grad, register_grad
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.errors import ThunderRuntimeError, check
from thunder_rs.torch.common import is_number, require_tensor
from thunder_rs.torch.interpolate import (
    _HALVES,
    _check_half_antialias,
    _resample,
    interpolate,
    upsample_aa_backward,
    upsample_backward,
)
from thunder_rs.torch.symbols import torchsymbol

__all__ = [
    "upsample_bilinear2d_aa",
    "upsample_bicubic2d_aa",
    "upsample_bilinear2d_aa_sized",
    "upsample_bicubic2d_aa_sized",
]

_aten = torch.ops.aten


def _check_4d(op: str, input) -> None:
    """Eager's check of an anti-aliased resize's input (``upsample_2d_common_check``)."""
    require_tensor(op, input, "input")
    check(
        input.ndim == 4,
        op,
        lambda: f"It is expected input_size equals to 4, but got size {input.ndim} (argument input)",
        ThunderRuntimeError,
    )


def _aa(mode: str, input, output_size, align_corners, scale_factors):
    op = f"ltorch.upsample_{mode}2d_aa"
    _check_4d(op, input)
    check(
        (output_size is None) != (scale_factors is None),
        op,
        "Must specify exactly one of output_size and scale_factors",
        ThunderRuntimeError,
    )
    scale = None if scale_factors is None else list(scale_factors)
    size = None if output_size is None else list(output_size)
    return interpolate(input, size, scale, mode, bool(align_corners), None, True)


@torchsymbol(_aten._upsample_bilinear2d_aa.vec)
def upsample_bilinear2d_aa(input, output_size, align_corners, scale_factors):
    return _aa("bilinear", input, output_size, align_corners, scale_factors)


@torchsymbol(_aten._upsample_bicubic2d_aa.vec)
def upsample_bicubic2d_aa(input, output_size, align_corners, scale_factors):
    return _aa("bicubic", input, output_size, align_corners, scale_factors)


def _check_sized(op: str, input, output_size):
    """The default form's checks, eager's messages (``upsample_2d_common_check``)."""
    _check_4d(op, input)
    sizes = tuple(output_size)
    check(
        len(sizes) == 2,
        op,
        lambda: f"It is expected output_size equals to 2, but got size {len(sizes)} (argument output_size)",
        ThunderRuntimeError,
    )
    height, width = input.shape[2:]
    check(
        height > 0 and width > 0 and sizes[0] > 0 and sizes[1] > 0,
        op,
        lambda: (
            f"Input and output sizes should be greater than 0, but got input (H: {height}, W: {width}) "
            f"output (H: {sizes[0]}, W: {sizes[1]}) (argument output_size)"
        ),
        ThunderRuntimeError,
    )
    return sizes


def _aa_sized(mode: str, input, output_size, align_corners, scales_h, scales_w):
    op = f"ltorch.upsample_{mode}2d_aa_sized"
    sizes = _check_sized(op, input, output_size)
    if input.dtype in _HALVES:
        _check_half_antialias(op, input, mode, sizes, (scales_h, scales_w))
    return _resample(input, sizes, mode, bool(align_corners), (scales_h, scales_w), True)


@torchsymbol(_aten._upsample_bilinear2d_aa.default)
def upsample_bilinear2d_aa_sized(input, output_size, align_corners, scales_h=None, scales_w=None):
    return _aa_sized("bilinear", input, output_size, align_corners, scales_h, scales_w)


@torchsymbol(_aten._upsample_bicubic2d_aa.default)
def upsample_bicubic2d_aa_sized(input, output_size, align_corners, scales_h=None, scales_w=None):
    return _aa_sized("bicubic", input, output_size, align_corners, scales_h, scales_w)


def _sized_grad(mode: str, symbol):
    """Eager's ``_upsample_<mode>2d_aa_backward`` given the forward's scales."""

    def rule(input, output_size, align_corners, scales_h=None, scales_w=None):
        out = symbol(input, output_size, align_corners, scales_h, scales_w)
        if not input.requires_grad:
            return out
        scales, shape, corners = (scales_h, scales_w), tuple(input.shape), bool(align_corners)
        g = get_grad(out)
        if input.dtype in _HALVES:
            grad = upsample_aa_backward(g, shape, mode, corners, scales)[0]
        else:
            grad = upsample_backward(g, shape, mode, corners, scales, True)
        put_grad(input, grad)
        return out

    return rule


register_grad(upsample_bilinear2d_aa_sized)(_sized_grad("bilinear", upsample_bilinear2d_aa_sized))
register_grad(upsample_bicubic2d_aa_sized)(_sized_grad("bicubic", upsample_bicubic2d_aa_sized))


def _vec_or_sized(symbol, sized, torch_fn, default_only: bool):
    """``symbol`` for the ``vec`` form (a list of scale factors, or none and no size), ``sized``
    for the default form (``scales_h``/``scales_w``, or a number fourth argument); the ``out=``
    form stays eager's call."""

    def call(input, output_size=None, align_corners=False, *rest, **kwargs):
        if "out" in kwargs:
            return user_fallback(torch_fn, (input, output_size, align_corners, *rest), kwargs)
        given = rest[0] if rest else kwargs.get("scale_factors")
        vec = not default_only and "scales_h" not in kwargs and "scales_w" not in kwargs and len(rest) <= 1
        vec = vec and (output_size is None or "scale_factors" in kwargs or (bool(rest) and not is_number(given)))
        if vec:
            return symbol(input, output_size, align_corners, given)
        scales_h = rest[0] if rest else kwargs.get("scales_h")
        scales_w = rest[1] if len(rest) > 1 else kwargs.get("scales_w")
        return sized(input, output_size, align_corners, scales_h, scales_w)

    return call


for _symbol, _sized, _name in (
    (upsample_bilinear2d_aa, upsample_bilinear2d_aa_sized, "_upsample_bilinear2d_aa"),
    (upsample_bicubic2d_aa, upsample_bicubic2d_aa_sized, "_upsample_bicubic2d_aa"),
):
    _packet = getattr(_aten, _name)
    for _fn in (_packet, _packet.default, getattr(torch._C._nn, _name)):
        TORCH_TO_LTORCH[_fn] = _vec_or_sized(_symbol, _sized, _fn, _fn is _packet.default)
