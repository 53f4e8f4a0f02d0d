"""Short-time Fourier transforms: ``torch.stft`` and ``torch.istft``, opaque symbols run whole
by torch, with output sizes that follow a signal length that changes between calls.

As fallbacks their sizes came from torch's fake kernels, whose FFT stride computation takes the
signal length as an int (``_exec_fft`` permutes with ``sizes()``): a guard on the exact length,
so a spectral loss over audio of varying length compiled once per length. Here eager's own
kernel, run on meta tensors at the traced sizes, makes eager's checks and gives the dtype and
the frequency count; the frame count (and istft's signal length) is computed from the symbolic
length, with what the checks relied on (the center padding fits, the padded signal holds one
frame) recorded as guards. Values, strides and gradients are eager's: torch runs the op and its
derivative (``factorizations.opaque``).
"""

from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.symint import SymInt, hint
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, thunder_error_like
from thunder_rs.torch.factorizations import opaque

__all__ = ["stft", "istft"]


@dataclass(frozen=True)
class _Output:
    """An output's metadata, its sizes the recording's (symbolic where the input's are)."""

    shape: tuple
    dtype: torch.dtype
    requires_grad: bool


def _at_hints(x):
    """A meta tensor like the proxy ``x`` at its traced sizes (no guard is taken: only the
    checks that do not depend on the signal's length are read from what it gives)."""
    if type(x) is SymInt:
        return hint(x)
    if not isinstance(x, TensorProxy):
        return x
    differentiable = x.requires_grad and (x.dtype.is_floating_point or x.dtype.is_complex)
    shape = [hint(s) for s in x.shape]
    return torch.empty(shape, dtype=x.dtype, device="meta", requires_grad=differentiable)


class _ValuesUnchecked(TorchDispatchMode):
    """Takes checks on values as passed: istft's that the window's overlap-add is nonzero
    everywhere (``at::equal`` of a 0-dim tensor, which meta tensors cannot answer) is made by
    eager's kernel when the program runs, and raises there as it does in eager."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.equal.default:
            return False
        return func(*args, **(kwargs or {}))


def _eager_meta(name: str, func, args, kwargs):
    """``func`` on meta tensors at the traced sizes: eager's checks and errors, and the outputs'
    dtypes and sizes at those sizes."""
    meta_args, meta_kwargs = tree_map(_at_hints, (args, kwargs))
    try:
        with torch._C.DisableTorchFunctionSubclass(), torch.enable_grad(), _ValuesUnchecked():
            return func(*meta_args, **meta_kwargs)
    except Exception as e:
        raise thunder_error_like(e, f"{name}: {e}") from e


def _relied_on(holds: bool, name: str) -> None:
    """A size relation the meta run's checks passed on (a guard where the sizes are symbolic)."""
    if not holds:  # the meta run raised eager's error first
        raise ThunderRuntimeError(f"{name}: a size check passed at the traced sizes and fails symbolically")


def _agrees(name: str, size, traced: int) -> None:
    """The size computed from the symbolic sizes is the one eager's kernel gave at the traced ones."""
    if hint(size) != traced:
        raise ThunderNotImplementedError(f"{name}: an output size {traced} that thunder_rs does not follow")


def _padded_length(name: str, length, n_fft: int, center: bool, pad_mode: str):
    """The signal length the frames are cut from: ``center`` pads ``n_fft // 2`` each side, which
    ``reflect`` takes from fewer samples than the signal has, ``circular`` from no more."""
    if not center:
        return length
    pad = n_fft // 2
    if pad_mode == "reflect":
        _relied_on(length > pad, name)
    elif pad_mode == "circular":
        _relied_on(length >= pad, name)
    return length + 2 * pad


def _frequencies(input, n_fft, window, onesided):
    """How many frequencies each frame has: ``n_fft // 2 + 1`` one-sided (the default for a real
    signal and window), else ``n_fft``; symbolic where ``n_fft`` is."""
    if onesided is None:
        onesided = not (input.dtype.is_complex or (window is not None and window.dtype.is_complex))
    return n_fft // 2 + 1 if onesided else n_fft


def _stft_meta(
    input,
    n_fft,
    hop_length=None,
    win_length=None,
    window=None,
    center=True,
    pad_mode="reflect",
    normalized=False,
    onesided=None,
    return_complex=None,
    align_to_window=None,
):
    name = "ltorch.stft"
    # (frame parameters from sizes stay symbolic: eager's kernel runs on each call's values, its
    # meta run here at the traced ones)
    params = (n_fft, hop_length, win_length, window, center, pad_mode, normalized, onesided, return_complex)
    out = _eager_meta(name, torch.stft, (input, *params), {"align_to_window": align_to_window})
    hop = n_fft // 4 if hop_length is None else hop_length
    length = _padded_length(name, input.shape[-1], n_fft, center, pad_mode)
    _relied_on(length >= n_fft, name)
    # ``align_to_window`` cuts the frames of the window's length, not n_fft's.
    span = win_length if align_to_window and win_length is not None and win_length < n_fft else n_fft
    frames = 1 + (length - span) // hop
    complex_dims = () if out.dtype.is_complex else (2,)
    traced_freq, traced_frames = out.shape[len(out.shape) - 2 - len(complex_dims) :][:2]
    freq = _frequencies(input, n_fft, window, onesided)
    _agrees(name, freq, traced_freq)
    _agrees(name, frames, traced_frames)
    return _Output((*input.shape[:-1], freq, frames, *complex_dims), out.dtype, out.requires_grad)


def _istft_meta(
    input,
    n_fft,
    hop_length=None,
    win_length=None,
    window=None,
    center=True,
    normalized=False,
    onesided=None,
    length=None,
    return_complex=False,
):
    name = "ltorch.istft"
    params = (n_fft, hop_length, win_length, window, center, normalized, onesided, length, return_complex)
    out = _eager_meta(name, torch.istft, (input, *params), {})
    if length is None:
        hop = n_fft // 4 if hop_length is None else hop_length
        frames = input.shape[-1]
        _relied_on(frames >= 1, name)
        length = n_fft + hop * (frames - 1) - (2 * (n_fft // 2) if center else 0)
    _agrees(name, length, out.shape[-1])
    batch = input.shape[:-2] if input.ndim == 3 else ()
    return _Output((*batch, length), out.dtype, out.requires_grad)


stft = opaque("stft", torch.stft, torch.Tensor.stft, meta=_stft_meta, integers_rejected=False)
istft = opaque("istft", torch.istft, torch.Tensor.istft, meta=_istft_meta, integers_rejected=False)
# Complex spectrograms keep the symbols, gradients included (``core.lang.complex_calls`` runs
# complex calls eagerly where a gradient would go through thunder_rs's real-valued VJP rules):
# the backward is torch's derivative of the whole op.
stft.takes_complex = istft.takes_complex = True
