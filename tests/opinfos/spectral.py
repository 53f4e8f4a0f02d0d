"""Short-time Fourier transforms, run whole by torch: ``stft`` over 1-D and batched signals with
each of its options, and ``istft`` of such spectrograms."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .core import ALL, ErrorInput, OpInfo, SampleInput, Transposed, cpu, make, tensor


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


OPS = [
    OpInfo("stft", stft, stft_samples, stft_errors),
    OpInfo("istft", istft, istft_samples, istft_errors),
    OpInfo("fft_fftshift", torch.fft.fftshift, shift_samples, shift_errors, ALL),
    OpInfo("fft_ifftshift", torch.fft.ifftshift, shift_samples, shift_errors, ALL),
]
