"""``torch.fft.fftshift`` and ``ifftshift``: the zero-frequency term moved to the middle of each
dimension and back. aten's are rolls by half of each size (``fft_fftshift`` in SpectralOps.cpp,
half rounded down to shift and up to shift back), so each is ``roll`` of the whole tensor, every
dimension by default; values, strides and gradients are roll's.
"""

import torch

from thunder_rs import clang
from thunder_rs.errors import ThunderTypeError, check
from thunder_rs.torch.common import is_int, require_tensor
from thunder_rs.torch.shape import roll
from thunder_rs.torch.symbols import torchsymbol

__all__ = ["fft_fftshift", "fft_ifftshift"]


def _shift(op: str, input, dim, rounding: int):
    """``roll`` of ``input`` by half of each size of ``dim`` (all by default), plus ``rounding``
    before halving (0 for fftshift, 1 for ifftshift)."""
    require_tensor(op, input, "input")
    many = isinstance(dim, (tuple, list))
    check(
        dim is None or is_int(dim) or (many and all(is_int(d) for d in dim)),
        op,
        lambda: f"{op.removeprefix('ltorch.')}(): argument 'dim' must be tuple of ints, not {type(dim).__name__}",
        ThunderTypeError,
    )
    dims = tuple(range(input.ndim)) if dim is None else tuple(dim) if many else (dim,)
    # (aten wraps each dim, repeats allowed: a dim named twice is rolled twice)
    dims = tuple(clang.canonicalize_dim(input.ndim, d, op) for d in dims)
    return roll(input, [(input.shape[d] + rounding) // 2 for d in dims], dims)


@torchsymbol(torch.fft.fftshift)
def fft_fftshift(input, dim=None):
    return _shift("ltorch.fft_fftshift", input, dim, 0)


@torchsymbol(torch.fft.ifftshift)
def fft_ifftshift(input, dim=None):
    return _shift("ltorch.fft_ifftshift", input, dim, 1)


# (rolls: the elements moved, their complex gradients moved back; ``complex_values.COMPLEX_GRADS``)
fft_fftshift.complex_grads = fft_ifftshift.complex_grads = True
