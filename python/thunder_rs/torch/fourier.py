"""``torch.fft``'s transforms (fft, ifft, rfft, irfft, hfft, ihfft and their 2-D and n-D forms),
reduced as ``SpectralOps.cpp`` reduces them to ATen's three kernels: the prims ``fft_r2c``,
``fft_c2r`` and ``fft_c2c`` (meta and VJP rules in ``crates/trace_ir/src/prims/fft.rs``).

Each call promotes as eager does (integers and bool to the default dtype, real to complex where
the kernel takes complex), trims or zero-pads the input to the transform's sizes (``n``, ``s``),
takes the kernel's normalization from ``norm`` and the direction, and conjugates where eager's
function does. The torch executor runs each symbol whole as its ``torch.fft`` function; the
backward is the prims' rules, eager's derivative formulas, for real and complex inputs alike
(the symbols are ``complex_grads``), so gradients are eager's bit for bit.
"""

import torch

from thunder_rs import clang, prims
from thunder_rs.errors import ThunderIndexError, ThunderNotImplementedError, ThunderRuntimeError, ThunderTypeError
from thunder_rs.errors import check
from thunder_rs.torch.common import require_tensor
from thunder_rs.torch.symbols import ltorch, torchsymbol

__all__ = [
    *("fft_fft", "fft_ifft", "fft_rfft", "fft_irfft", "fft_hfft", "fft_ihfft"),
    *("fft_fft2", "fft_ifft2", "fft_rfft2", "fft_irfft2", "fft_hfft2", "fft_ihfft2"),
    *("fft_fftn", "fft_ifftn", "fft_rfftn", "fft_irfftn", "fft_hfftn", "fft_ihfftn"),
]

#: ATen's ``fft_norm_mode``: no scaling, by ``1/sqrt(n)``, by ``1/n``.
_NONE, _BY_ROOT_N, _BY_N = 0, 1, 2
_ATEN_NAMES = {
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.complex64: "ComplexFloat",
    torch.complex128: "ComplexDouble",
}
_COMPLEX = {torch.float32: torch.complex64, torch.float64: torch.complex128}


def _norm(op: str, norm, forward: bool) -> int:
    """The kernel's normalization for ``norm`` in this direction (``norm_from_string``)."""
    if norm is None or norm == "backward":
        return _NONE if forward else _BY_N
    if norm == "forward":
        return _BY_N if forward else _NONE
    check(norm == "ortho", op, lambda: f'Invalid normalization mode: "{norm}"', ThunderRuntimeError)
    return _BY_ROOT_N


def _promote(op: str, x, to_complex: bool):
    """``x`` in a dtype the kernels take (``promote_tensor_fft``): integers and bool as the default
    dtype, and complex where ``to_complex``. Half precision has CUDA kernels only, whose complex
    results (complex32) the trace cannot hold."""
    dtype = x.dtype
    if dtype.is_complex:
        check(dtype in _ATEN_NAMES, op, lambda: f"Unsupported dtype {dtype}", ThunderNotImplementedError)
        return x
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    if dtype in (torch.float16, torch.bfloat16):
        message = f"Unsupported dtype {_ATEN_NAMES[dtype]}"
        if dtype == torch.float16 and x.device.type == "cuda":
            message = "a half-precision transform gives complex32 values, which thunder_rs does not represent"
        raise ThunderNotImplementedError(f"{op}: {message}")
    return clang.maybe_convert(x, _COMPLEX[dtype] if to_complex else dtype)


def _real_input(op: str, x, name: str, what: str = "a real input tensor") -> None:
    require_tensor(op, x)
    check(
        not x.dtype.is_complex,
        op,
        lambda: f"{name} expects {what}, but got {_ATEN_NAMES.get(x.dtype, x.dtype)}",
        ThunderTypeError,
    )


def _wrap(op: str, x, dim) -> int:
    check(
        x.ndim > 0,
        op,
        lambda: f"Dimension specified as {dim} but tensor has no dimensions",
        ThunderIndexError,
    )
    return clang.canonicalize_dim(x.ndim, dim, op)


def _points(op: str, n) -> None:
    check(n >= 1, op, lambda: f"Invalid number of data points ({n}) specified", ThunderRuntimeError)


def _resize(x, dims, sizes):
    """``x`` trimmed or zero-padded to ``sizes`` along ``dims`` (``resize_fft_input``; -1 keeps
    a dim's size)."""
    ndim = x.ndim
    end, pads = list(x.shape), [0] * ndim
    trimmed = padded = False
    for d, n in zip(dims, sizes):
        if n == -1:
            continue
        if x.shape[d] > n:
            end[d], trimmed = n, True
        elif x.shape[d] < n:
            pads[d], padded = n - x.shape[d], True
    if trimmed:
        x = prims.slice(x, (0,) * ndim, tuple(end), (1,) * ndim)
    if padded:  # (eager's ``constant_pad_nd``, whose gradient is a new tensor laid out as the cotangent)
        x = ltorch.constant_pad_nd(x, [amount for p in reversed(pads) for amount in (0, p)])
    return x


# -- one dim -----------------------------------------------------------------------------------------


def _c2c(op: str, x, n, dim, norm, forward: bool):
    """``fft_c2c``: a complex input's transform along ``dim``."""
    dim = _wrap(op, x, dim)
    n = x.shape[dim] if n is None else n
    _points(op, n)
    x = _resize(x, (dim,), (n,))
    return prims.fft_c2c(x, (dim,), _norm(op, norm, forward), forward)


def _r2c(op: str, x, n, dim, norm, forward: bool, onesided: bool):
    """``fft_r2c``: a real input's transform along ``dim``; the inverse direction is the
    conjugate of the forward's with the inverse's scaling."""
    x = _promote(op, x, False)
    dim = _wrap(op, x, dim)
    n = x.shape[dim] if n is None else n
    _points(op, n)
    x = _resize(x, (dim,), (n,))
    out = prims.fft_r2c(x, (dim,), _norm(op, norm, forward), onesided)
    return out if forward else prims.conj(out)


def _c2r(op: str, x, n, dim, norm, forward: bool):
    """``fft_c2r``: the real signal of ``n`` points (``2 * (size - 1)`` by default) whose
    one-sided transform is ``x`` along ``dim``; forward (``hfft``) transforms its conjugate."""
    x = _promote(op, x, True)
    dim = _wrap(op, x, dim)
    n = 2 * (x.shape[dim] - 1) if n is None else n
    _points(op, n)
    x = _resize(x, (dim,), (n // 2 + 1,))
    if forward:
        x = prims.conj(x)
    return prims.fft_c2r(x, (dim,), _norm(op, norm, forward), n)


def _one_dim(x, n, dim, norm, forward: bool, name: str):
    op = f"ltorch.fft_{name}"
    require_tensor(op, x)
    if x.dtype.is_complex:
        return _c2c(op, x, n, dim, norm, forward)
    return _r2c(op, x, n, dim, norm, forward, onesided=False)


@torchsymbol(torch.fft.fft)
def fft_fft(input, n=None, dim=-1, norm=None):
    return _one_dim(input, n, dim, norm, True, "fft")


@torchsymbol(torch.fft.ifft)
def fft_ifft(input, n=None, dim=-1, norm=None):
    return _one_dim(input, n, dim, norm, False, "ifft")


@torchsymbol(torch.fft.rfft)
def fft_rfft(input, n=None, dim=-1, norm=None):
    _real_input("ltorch.fft_rfft", input, "rfft")
    return _r2c("ltorch.fft_rfft", input, n, dim, norm, forward=True, onesided=True)


@torchsymbol(torch.fft.ihfft)
def fft_ihfft(input, n=None, dim=-1, norm=None):
    _real_input("ltorch.fft_ihfft", input, "ihfft")
    return _r2c("ltorch.fft_ihfft", input, n, dim, norm, forward=False, onesided=True)


@torchsymbol(torch.fft.irfft)
def fft_irfft(input, n=None, dim=-1, norm=None):
    require_tensor("ltorch.fft_irfft", input)
    return _c2r("ltorch.fft_irfft", input, n, dim, norm, forward=False)


@torchsymbol(torch.fft.hfft)
def fft_hfft(input, n=None, dim=-1, norm=None):
    require_tensor("ltorch.fft_hfft", input)
    return _c2r("ltorch.fft_hfft", input, n, dim, norm, forward=True)


# -- several dims ------------------------------------------------------------------------------------


def _as_list(v):
    return None if v is None else list(v) if isinstance(v, (tuple, list)) else [v]


def _shape_and_dims(op: str, x, s, dim):
    """The sizes and dims transformed (``canonicalize_fft_shape_and_dim_args``): every dim by
    default, the last ``len(s)`` given ``s``; -1 in ``s`` keeps a dim's size."""
    s, dim = _as_list(s), _as_list(dim)
    dims = None
    if dim is not None:
        dims = [_wrap(op, x, d) for d in dim]
        check(len(set(dims)) == len(dims), op, "FFT dims must be unique", ThunderRuntimeError)
    if s is not None:
        check(
            dims is None or len(dims) == len(s),
            op,
            "When given, dim and shape arguments must have the same length",
            ThunderRuntimeError,
        )
        check(
            len(s) <= x.ndim,
            op,
            lambda: f"Got shape with {len(s)} values but input tensor only has {x.ndim} dimensions.",
            ThunderRuntimeError,
        )
        dims = list(range(x.ndim - len(s), x.ndim)) if dims is None else dims
        shape = [x.shape[d] if n == -1 else n for d, n in zip(dims, s)]
    else:
        dims = list(range(x.ndim)) if dims is None else dims
        shape = [x.shape[d] for d in dims]
    for n in shape:
        _points(op, n)
    return shape, dims


def _some_axis(op: str, name: str, dims) -> None:
    check(bool(dims), op, lambda: f"{name} must transform at least one axis", ThunderRuntimeError)


def _c2r_shape_and_dims(op: str, name: str, x, s, dim):
    """``_shape_and_dims`` for a transform to a real signal, with the signal's size along the last
    dim (``2 * (size - 1)`` unless ``s`` gives it) and the input's there (half of it, plus one)."""
    shape, dims = _shape_and_dims(op, x, s, dim)
    _some_axis(op, name, dims)
    given = _as_list(s)
    last = 2 * (x.shape[dims[-1]] - 1) if given is None or given[-1] == -1 else shape[-1]
    _points(op, last)
    shape[-1] = last // 2 + 1
    return shape, dims, last


def _fftn(name: str, x, s, dim, norm, forward: bool):
    op = f"ltorch.fft_{name}"
    require_tensor(op, x)
    shape, dims = _shape_and_dims(op, x, s, dim)
    x = _resize(_promote(op, x, True), dims, shape)
    return prims.fft_c2c(x, tuple(dims), _norm(op, norm, forward), forward)


def _rfftn(name: str, x, s, dim, norm):
    op = f"ltorch.fft_{name}"
    _real_input(op, x, "rfftn", "a real-valued input tensor")
    shape, dims = _shape_and_dims(op, x, s, dim)
    _some_axis(op, "rfftn", dims)
    x = _resize(_promote(op, x, False), dims, shape)
    return prims.fft_r2c(x, tuple(dims), _norm(op, norm, True), True)


def _irfftn(name: str, x, s, dim, norm):
    op = f"ltorch.fft_{name}"
    require_tensor(op, x)
    shape, dims, last = _c2r_shape_and_dims(op, "irfftn", x, s, dim)
    x = _resize(_promote(op, x, True), dims, shape)
    return prims.fft_c2r(x, tuple(dims), _norm(op, norm, False), last)


def _hfftn(name: str, x, s, dim, norm):
    """The real signal whose inverse transform is the Hermitian ``x``: the other dims' forward
    transforms, then the last's of the conjugate to a real signal."""
    op = f"ltorch.fft_{name}"
    require_tensor(op, x)
    shape, dims, last = _c2r_shape_and_dims(op, "hfftn", x, s, dim)
    x = _resize(_promote(op, x, True), dims, shape)
    mode = _norm(op, norm, True)
    if len(dims) > 1:
        x = prims.fft_c2c(x, tuple(dims[:-1]), mode, True)
    return prims.fft_c2r(prims.conj(x), (dims[-1],), mode, last)


def _ihfftn(name: str, x, s, dim, norm):
    """The inverse of ``hfftn``: the conjugate of the last dim's one-sided transform, then the
    other dims' inverse transforms."""
    op = f"ltorch.fft_{name}"
    require_tensor(op, x)
    shape, dims = _shape_and_dims(op, x, s, dim)
    _some_axis(op, "ihfftn", dims)
    x = _resize(_promote(op, x, False), dims, shape)
    check(
        not x.dtype.is_complex,
        op,
        lambda: f"Only supports floating-point dtypes, but found: {_ATEN_NAMES[x.dtype]}",
        ThunderTypeError,
    )
    mode = _norm(op, norm, False)
    out = prims.conj(prims.fft_r2c(x, (dims[-1],), mode, True))
    return prims.fft_c2c(out, tuple(dims[:-1]), mode, False) if len(dims) > 1 else out


@torchsymbol(torch.fft.fftn)
def fft_fftn(input, s=None, dim=None, norm=None):
    return _fftn("fftn", input, s, dim, norm, True)


@torchsymbol(torch.fft.ifftn)
def fft_ifftn(input, s=None, dim=None, norm=None):
    return _fftn("ifftn", input, s, dim, norm, False)


@torchsymbol(torch.fft.rfftn)
def fft_rfftn(input, s=None, dim=None, norm=None):
    return _rfftn("rfftn", input, s, dim, norm)


@torchsymbol(torch.fft.irfftn)
def fft_irfftn(input, s=None, dim=None, norm=None):
    return _irfftn("irfftn", input, s, dim, norm)


@torchsymbol(torch.fft.hfftn)
def fft_hfftn(input, s=None, dim=None, norm=None):
    return _hfftn("hfftn", input, s, dim, norm)


@torchsymbol(torch.fft.ihfftn)
def fft_ihfftn(input, s=None, dim=None, norm=None):
    return _ihfftn("ihfftn", input, s, dim, norm)


@torchsymbol(torch.fft.fft2)
def fft_fft2(input, s=None, dim=(-2, -1), norm=None):
    return _fftn("fft2", input, s, dim, norm, True)


@torchsymbol(torch.fft.ifft2)
def fft_ifft2(input, s=None, dim=(-2, -1), norm=None):
    return _fftn("ifft2", input, s, dim, norm, False)


@torchsymbol(torch.fft.rfft2)
def fft_rfft2(input, s=None, dim=(-2, -1), norm=None):
    return _rfftn("rfft2", input, s, dim, norm)


@torchsymbol(torch.fft.irfft2)
def fft_irfft2(input, s=None, dim=(-2, -1), norm=None):
    return _irfftn("irfft2", input, s, dim, norm)


@torchsymbol(torch.fft.hfft2)
def fft_hfft2(input, s=None, dim=(-2, -1), norm=None):
    return _hfftn("hfft2", input, s, dim, norm)


@torchsymbol(torch.fft.ihfft2)
def fft_ihfft2(input, s=None, dim=(-2, -1), norm=None):
    return _ihfftn("ihfft2", input, s, dim, norm)


for _symbol in (globals()[name] for name in __all__):
    # Linear maps whose prims' VJP rules hold for complex values (``Prim::differentiates_complex``).
    _symbol.complex_grads = True
