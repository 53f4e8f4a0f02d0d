"""aten's antialiased resize kernels called by name: ``torch.ops.aten._upsample_bilinear2d_aa``
and ``_upsample_bicubic2d_aa`` (and ``torch._C._nn``'s), which ``F.interpolate(..., antialias=True)``
calls. The ``vec`` form takes exactly one of an output size and scale factors, as ``F.interpolate``
passes them, and is ``F.interpolate``'s antialiased resize (its gradient too). The default form
with scales given apart from the size (no ``F.interpolate`` call passes both) stays an eager
fallback.
"""

import torch

from thunder_rs.core.lang.fallback import user_fallback
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.errors import ThunderRuntimeError, check
from thunder_rs.torch.common import is_number, require_tensor
from thunder_rs.torch.interpolate import interpolate
from thunder_rs.torch.symbols import torchsymbol

__all__ = ["upsample_bilinear2d_aa", "upsample_bicubic2d_aa"]

_aten = torch.ops.aten


def _aa(mode: str, input, output_size, align_corners, scale_factors):
    op = f"ltorch.upsample_{mode}2d_aa"
    require_tensor(op, input, "input")
    check(
        input.ndim == 4,
        op,
        lambda: f"It is expected input_size equals to 4, but got size {input.ndim} (argument input)",
        ThunderRuntimeError,
    )
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


def _vec_or_eager(symbol, torch_fn):
    """``symbol`` for the ``vec`` form; the default form with scales (a number, or ``scales_w``)
    stays eager's call."""

    def call(input, output_size=None, align_corners=False, scale_factors=None, scales_w=None, **kwargs):
        if is_number(scale_factors) or scales_w is not None or kwargs:
            extra = {"scales_w": scales_w} if scales_w is not None else {}
            return user_fallback(torch_fn, (input, output_size, align_corners, scale_factors), {**extra, **kwargs})
        return symbol(input, output_size, align_corners, scale_factors)

    return call


for _symbol, _name in (
    (upsample_bilinear2d_aa, "_upsample_bilinear2d_aa"),
    (upsample_bicubic2d_aa, "_upsample_bicubic2d_aa"),
):
    for _fn in (getattr(_aten, _name), getattr(_aten, _name).default, getattr(torch._C._nn, _name)):
        TORCH_TO_LTORCH[_fn] = _vec_or_eager(_symbol, _fn)
