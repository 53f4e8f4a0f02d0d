"""Fourier transforms: ``torch.fft``'s (real and complex inputs, ``n``/``s`` trimming and padding,
each norm, chosen dims, empty batches, integer inputs promoted), and the short-time ones, run
whole by torch: ``stft`` over 1-D and batched signals with each of its options, and ``istft`` of
such spectrograms."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from .core import ALL, NUMERIC, ErrorInput, OpInfo, SampleInput, Transposed, cpu, make, tensor


def stft(input, n_fft, **kwargs):
    return torch.stft(input, n_fft, **kwargs)


def istft(input, n_fft, **kwargs):
    return torch.istft(input, n_fft, **kwargs)


def window(n: int, dtype, device) -> torch.Tensor:
    return torch.hann_window(n, dtype=dtype, device=device)


def stft_samples(dtype, device) -> Iterable[SampleInput]:
    signal, batch = make((40,), dtype, device), make((2, 37), dtype, device)
    yield SampleInput(signal, 16, hop_length=4, window=window(16, dtype, device), return_complex=True)
    yield SampleInput(batch, 16, window=window(16, dtype, device), return_complex=True, normalized=True)
    yield SampleInput(batch, 16, hop_length=5, win_length=10, window=window(10, dtype, device), return_complex=True)
    yield SampleInput(signal, 8, return_complex=True, onesided=False, center=False)
    for mode in ("constant", "replicate", "circular"):
        yield SampleInput(batch, 16, hop_length=3, return_complex=True, pad_mode=mode)
    yield SampleInput(batch[:, ::2], 8, hop_length=2, window=window(8, dtype, device), return_complex=False)
    yield SampleInput(batch.mT.contiguous().mT, 12, window=window(12, dtype, device), return_complex=True)
    w8 = window(8, dtype, device)
    yield SampleInput(
        signal, 16, hop_length=4, win_length=8, window=w8, center=False, return_complex=True, align_to_window=True
    )


def stft_errors() -> Iterable[ErrorInput]:
    signal = cpu((40,))
    yield ErrorInput(SampleInput(signal, 16), RuntimeError, match="return_complex")
    yield ErrorInput(SampleInput(signal, 100, return_complex=True), RuntimeError)
    yield ErrorInput(SampleInput(signal, 64, center=False, return_complex=True), RuntimeError, match="n_fft")
    yield ErrorInput(SampleInput(signal, 16, window=cpu((12,)), return_complex=True), RuntimeError, match="window")
    yield ErrorInput(SampleInput(signal, 16, win_length=20, return_complex=True), RuntimeError, match="win_length")
    yield ErrorInput(SampleInput(signal, 16, hop_length=0, return_complex=True), RuntimeError, match="hop_length")
    yield ErrorInput(SampleInput(cpu((2, 3, 40)), 16, return_complex=True), RuntimeError)
    yield ErrorInput(SampleInput(signal, 16, return_complex=True, pad_mode="wrap"), NotImplementedError)


def spectrogram(shape, n_fft: int, hop: int, dtype, device, **kwargs) -> torch.Tensor:
    w = window(n_fft, dtype, device)
    return torch.stft(make(shape, dtype, device), n_fft, hop, window=w, return_complex=True, **kwargs)


def istft_samples(dtype, device) -> Iterable[SampleInput]:
    w = window(16, dtype, device)
    yield SampleInput(spectrogram((40,), 16, 4, dtype, device), 16, hop_length=4, window=w)
    yield SampleInput(spectrogram((2, 37), 16, 4, dtype, device), 16, hop_length=4, window=w, length=37)
    yield SampleInput(spectrogram((2, 37), 16, 4, dtype, device), 16, hop_length=4, window=w, length=50)
    yield SampleInput(
        spectrogram((2, 37), 16, 4, dtype, device, normalized=True), 16, hop_length=4, window=w, normalized=True
    )
    # (uncentred, the frames' edges must not be zero: a rectangular window)
    ones = torch.ones(16, dtype=dtype, device=device)
    uncentred = torch.stft(make((40,), dtype, device), 16, 4, window=ones, center=False, return_complex=True)
    yield SampleInput(uncentred, 16, hop_length=4, window=ones, center=False, length=36)
    twosided = spectrogram((40,), 16, 4, dtype, device, onesided=False)
    yield SampleInput(twosided, 16, hop_length=4, window=w, onesided=False, return_complex=True)


def istft_errors() -> Iterable[ErrorInput]:
    spec = torch.stft(cpu((40,)), 16, 4, window=torch.hann_window(16), return_complex=True)
    yield ErrorInput(SampleInput(spec, 16, hop_length=4, window=cpu((12,))), RuntimeError, match="window")
    yield ErrorInput(SampleInput(spec, 32, hop_length=4), RuntimeError)
    yield ErrorInput(SampleInput(spec.real, 16, hop_length=4), TypeError, match="complex")


def shift_samples(dtype, device) -> Iterable[SampleInput]:
    """Every dim (odd and even sizes), one dim, a negative one named twice, a transposed, an empty
    and a 1-element input."""
    yield SampleInput(make((5, 6), dtype, device))
    yield SampleInput(make((3, 4, 7), dtype, device), 1)
    yield SampleInput(make((5, 6), dtype, device), dim=(-1, 0, -1))
    yield SampleInput(tensor(Transposed((4, 7)), dtype, device), dim=[0])
    yield SampleInput(make((0, 3), dtype, device))
    yield SampleInput(make((1,), dtype, device))


def shift_errors() -> Iterable[ErrorInput]:
    yield ErrorInput(SampleInput(cpu(())), RuntimeError, match="shifts")
    yield ErrorInput(SampleInput(cpu((3,)), 1), IndexError, match="out of range")
    yield ErrorInput(SampleInput(cpu((3,)), dim=1.5), TypeError, match="dim")


def complex_of(shape, dtype, device) -> torch.Tensor:
    """A complex tensor whose parts are random ``dtype`` values (integers promoted as eager does)."""
    parts = [make(shape, dtype, device).to(torch.promote_types(dtype, torch.float32)) for _ in range(2)]
    return torch.complex(*parts)


def fft_samples(dtype, device) -> Iterable[SampleInput]:
    """One dim: real and complex inputs, trimmed and padded, each norm, a middle dim of a
    transposed input, an empty batch."""
    yield SampleInput(make((3, 8), dtype, device))
    yield SampleInput(complex_of((3, 8), dtype, device), n=5, dim=0, norm="ortho")
    yield SampleInput(make((2, 7), dtype, device), n=10, norm="forward")
    yield SampleInput(tensor(Transposed((4, 6)), dtype, device), dim=0, norm="backward")
    yield SampleInput(make((0, 4), dtype, device))


def hermitian_samples(dtype, device) -> Iterable[SampleInput]:
    """To a real signal (``irfft``, ``hfft``): its default length, odd and even ``n``."""
    yield SampleInput(complex_of((3, 5), dtype, device))
    yield SampleInput(complex_of((3, 5), dtype, device), n=7, dim=0, norm="ortho")
    yield SampleInput(make((2, 6), dtype, device), n=4, norm="forward")
    yield SampleInput(complex_of((0, 4), dtype, device))


def fftn_samples(dtype, device) -> Iterable[SampleInput]:
    """Several dims: every dim, ``s`` of the last dims, chosen dims out of order, -1 in ``s``."""
    yield SampleInput(make((2, 3, 4), dtype, device))
    yield SampleInput(complex_of((2, 3, 4), dtype, device), s=(5, 2), norm="ortho")
    yield SampleInput(make((2, 3, 4), dtype, device), s=(3, -1), dim=(2, 0), norm="forward")
    yield SampleInput(tensor(Transposed((4, 6)), dtype, device), dim=(0, 1))
    yield SampleInput(make((0, 3, 4), dtype, device), dim=(1, 2))


def fft2_samples(dtype, device) -> Iterable[SampleInput]:
    yield SampleInput(make((2, 3, 4), dtype, device))
    yield SampleInput(complex_of((3, 4), dtype, device), s=(2, 7), norm="ortho")
    yield SampleInput(make((3, 4, 5), dtype, device), dim=(0, 2), norm="forward")


def hermitian_nd_samples(dtype, device) -> Iterable[SampleInput]:
    yield SampleInput(complex_of((2, 3, 4), dtype, device))
    yield SampleInput(complex_of((3, 4), dtype, device), s=(2, 7), norm="ortho")
    yield SampleInput(make((3, 4, 5), dtype, device), dim=(2, 0), norm="forward")


def _fft_errors(fn, real_only: bool) -> Callable[[], Iterable[ErrorInput]]:
    several = fn.__name__.endswith(("n", "2"))

    def errors() -> Iterable[ErrorInput]:
        yield ErrorInput(SampleInput(cpu((3, 4)), norm="bad"), RuntimeError, match="normalization mode")
        yield ErrorInput(SampleInput(cpu((3, 4)).half()), NotImplementedError, match="Half")
        if real_only:
            yield ErrorInput(SampleInput(complex_of((3, 4), torch.float32, "cpu")), TypeError)
        if several:
            yield ErrorInput(SampleInput(cpu((3, 4)), dim=(0, 0)), RuntimeError, match="unique")
            yield ErrorInput(SampleInput(cpu((3, 4)), s=(2, 2, 2)), RuntimeError, match="shape")
            yield ErrorInput(SampleInput(cpu((3, 4)), s=(0, 2)), RuntimeError, match="data points")
        else:
            yield ErrorInput(SampleInput(cpu(())), IndexError, match="no dimensions")
            yield ErrorInput(SampleInput(cpu((3, 4)), dim=2), IndexError, match="out of range")
            yield ErrorInput(SampleInput(cpu((3, 4)), n=-1), RuntimeError, match="data points")

    errors.__name__ = f"{fn.__name__}_errors"
    return errors


F = torch.fft
_FFT_OPS = (
    (F.fft, fft_samples, False),
    (F.ifft, fft_samples, False),
    (F.rfft, fft_samples, True),
    (F.ihfft, fft_samples, True),
    (F.irfft, hermitian_samples, False),
    (F.hfft, hermitian_samples, False),
    (F.fftn, fftn_samples, False),
    (F.ifftn, fftn_samples, False),
    (F.rfftn, fftn_samples, True),
    (F.ihfftn, fftn_samples, True),
    (F.irfftn, hermitian_nd_samples, False),
    (F.hfftn, hermitian_nd_samples, False),
    (F.fft2, fft2_samples, False),
    (F.ifft2, fft2_samples, False),
    (F.rfft2, fft2_samples, True),
    (F.ihfft2, fft2_samples, True),
    (F.irfft2, hermitian_nd_samples, False),
    (F.hfft2, hermitian_nd_samples, False),
)


def _real_only(samples):
    """``samples`` without the complex inputs, which ``rfft`` and ``ihfft`` refuse."""

    def generate(dtype, device) -> Iterable[SampleInput]:
        return (s for s in samples(dtype, device) if not s.args[0].is_complex())

    return generate


OPS = [
    OpInfo("stft", stft, stft_samples, stft_errors),
    OpInfo("istft", istft, istft_samples, istft_errors),
    OpInfo("fft_fftshift", torch.fft.fftshift, shift_samples, shift_errors, ALL),
    OpInfo("fft_ifftshift", torch.fft.ifftshift, shift_samples, shift_errors, ALL),
    *(
        OpInfo(
            f"fft_{fn.__name__.removeprefix('fft_')}",
            fn,
            _real_only(samples) if real_only else samples,
            _fft_errors(fn, real_only),
            NUMERIC,
        )
        for fn, samples, real_only in _FFT_OPS
    ),
]
