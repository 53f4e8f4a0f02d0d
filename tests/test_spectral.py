"""torch.stft and torch.istft over signals whose length changes between calls (issue 26): the
frame count (istft's signal length) follows a symbolic length, so a spectral loss or a model
with a spectrogram front end or an istft head compiles twice over many audio lengths, not once
per length. Values, strides, gradients and errors are checked against eager on every call."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from twin_training import misses, train_like_eager

import thunder_rs

pytestmark = pytest.mark.usefixtures("one_thread")

#: (n_fft, hop) of a multi-resolution STFT loss, as in vocoder and codec training.
RESOLUTIONS = ((64, 16), (32, 8), (16, 4))
LENGTHS = (300, 411, 517, 1024)


def magnitudes(x, n_fft: int, hop: int):
    window = torch.hann_window(n_fft, dtype=x.dtype)
    return torch.stft(x, n_fft, hop, window=window, return_complex=True).abs()


def multi_resolution_loss(y_hat, y):
    """Spectral convergence plus L1 of log magnitudes, summed over resolutions."""
    total = 0
    for n_fft, hop in RESOLUTIONS:
        a, b = magnitudes(y_hat, n_fft, hop), magnitudes(y, n_fft, hop)
        convergence = torch.linalg.norm(b - a) / torch.linalg.norm(b)
        total = total + convergence + F.l1_loss(torch.log(a + 1e-7), torch.log(b + 1e-7))
    return total


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_multi_resolution_stft_loss_differentiates_like_eager_in_two_compiles(dtype):
    jf = thunder_rs.jit(multi_resolution_loss)
    for n in LENGTHS:
        y = torch.randn(2, n, dtype=dtype)
        y_hat = torch.randn(2, n, dtype=dtype, requires_grad=True)
        y_hat_eager = y_hat.detach().clone().requires_grad_()
        loss, expected = jf(y_hat, y), multi_resolution_loss(y_hat_eager, y)
        torch.testing.assert_close(loss, expected, rtol=0, atol=0)
        loss.backward()
        expected.backward()
        torch.testing.assert_close(y_hat.grad, y_hat_eager.grad, rtol=0, atol=0)
    assert misses(jf) == 2, thunder_rs.compile_stats(jf).miss_reasons
    assert jf._dynamic_off is None


class SpectrogramClassifier(torch.nn.Module):
    """A spectrogram front end (log magnitudes) and a linear layer over its mean over time."""

    def __init__(self):
        super().__init__()
        self.register_buffer("window", torch.hann_window(64))
        self.head = torch.nn.Linear(33, 4)

    def forward(self, x):
        spec = torch.stft(x, n_fft=64, hop_length=16, window=self.window, return_complex=True).abs()
        return self.head(torch.log1p(spec).mean(-1))


def test_a_spectrogram_front_end_trains_like_eager_in_two_compiles():
    torch.manual_seed(0)
    jmodel = train_like_eager(SpectrogramClassifier(), [torch.randn(3, n) for n in LENGTHS])
    assert misses(jmodel) == 2 and jmodel._jfn._dynamic_off is None


def spectrogram_layout(x):
    spec = torch.stft(x, 32, 8, window=torch.hann_window(32, dtype=x.dtype), return_complex=True)
    real = torch.stft(x, 32, 8, return_complex=False, center=False)
    return spec, spec.abs() * 2, torch.tensor(spec.stride()), real.transpose(-2, -1).reshape(-1)


@pytest.mark.parametrize("batch", [(), (2,)])
def test_stft_outputs_have_eagers_strides_at_every_length(batch):
    jf = thunder_rs.jit(spectrogram_layout)
    for n in LENGTHS:
        x = torch.randn(*batch, n, dtype=torch.float64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (return_complex=False is deprecated)
            expected = spectrogram_layout(x)
        for out, e in zip(jf(x), expected, strict=True):
            torch.testing.assert_close(out, e, rtol=0, atol=0)
            assert out.stride() == e.stride()
    assert misses(jf) == 2 and jf._dynamic_off is None


def resynthesized(mag, phase, n: int):
    """A vocoder's istft head (Vocos, iSTFTNet): magnitudes and phases to a signal of length n."""
    spec = torch.polar(mag.exp(), phase)
    return torch.istft(spec, 32, 8, window=torch.hann_window(32, dtype=mag.dtype), length=n)


def overlap_added(mag, phase):
    spec = torch.polar(mag.exp(), phase)
    return torch.istft(spec, 32, 8, window=torch.hann_window(32, dtype=mag.dtype))


@pytest.mark.parametrize("fn", [resynthesized, overlap_added])
def test_an_istft_head_differentiates_like_eager_in_two_compiles(fn):
    jf = thunder_rs.jit(fn)
    for frames in (20, 27, 33, 41):
        inputs = [torch.randn(2, 17, frames, dtype=torch.float64, requires_grad=True) for _ in range(2)]
        twins = [t.detach().clone().requires_grad_() for t in inputs]
        extra = (frames * 8,) if fn is resynthesized else ()
        out, expected = jf(*inputs, *extra), fn(*twins, *extra)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        assert out.stride() == expected.stride()
        cotangent = torch.randn_like(expected)
        out.backward(cotangent)
        expected.backward(cotangent)
        for t, e in zip(inputs, twins, strict=True):
            torch.testing.assert_close(t.grad, e.grad, rtol=0, atol=0)
    assert misses(jf) == 2, thunder_rs.compile_stats(jf).miss_reasons
    assert jf._dynamic_off is None


def sized_frames(x):
    """Frames a fixed fraction of the signal long (an analysis over whole clips): n_fft, hop and
    window from the length. (A Hann window of a symbolic length is a float of it: specialised.)"""
    n_fft = x.shape[-1] // 4
    window = torch.ones(n_fft, dtype=x.dtype).cumsum(0).rsqrt()
    return torch.stft(x, n_fft, hop_length=n_fft // 4, window=window, return_complex=True).abs()


def sized_synthesis(mag, phase):
    """An istft whose n_fft follows the frequency count (2 * (F - 1)), its hop n_fft // 4."""
    n_fft = 2 * (mag.shape[-2] - 1)
    spec = torch.polar(mag.exp(), phase)
    return torch.istft(spec, n_fft, window=torch.ones(n_fft, dtype=mag.dtype))


@pytest.mark.parametrize("fn", [sized_frames, sized_synthesis])
def test_frame_parameters_from_sizes_stay_symbolic(fn):
    # (n_fft and the hop were specialised: a compile per size)
    jf = thunder_rs.jit(fn)
    for n in (8, 10, 13, 17):
        shape = [(2, 32 * n)] if fn is sized_frames else [(2, n + 1, 9)] * 2
        inputs = [torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in shape]
        twins = [t.detach().clone().requires_grad_() for t in inputs]
        out, expected = jf(*inputs), fn(*twins)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        assert out.stride() == expected.stride()
        cotangent = torch.randn_like(expected)
        out.backward(cotangent)
        expected.backward(cotangent)
        for t, e in zip(inputs, twins, strict=True):
            torch.testing.assert_close(t.grad, e.grad, rtol=0, atol=0)
    assert misses(jf) == 2, thunder_rs.compile_stats(jf).miss_reasons
    assert jf._dynamic_off is None


def complex_stft(z):
    return torch.stft(z, 16, 4, window=torch.hann_window(16), return_complex=True)


def test_a_complex_signals_two_sided_stft_equals_eagers_with_gradients():
    jf = thunder_rs.jit(complex_stft)
    for n in (40, 57, 70):
        z = torch.randn(n, dtype=torch.complex64, requires_grad=True)
        twin = z.detach().clone().requires_grad_()
        out, expected = jf(z), complex_stft(twin)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        assert out.stride() == expected.stride()
        cotangent = torch.randn_like(expected)
        out.backward(cotangent)
        expected.backward(cotangent)
        torch.testing.assert_close(z.grad, twin.grad, rtol=0, atol=0)
    assert misses(jf) == 2 and jf._dynamic_off is None


def reflected(x):
    return torch.stft(x, 64, 16, window=torch.hann_window(64), return_complex=True)


def test_a_length_too_short_for_the_padding_raises_eagers_error_after_a_symbolic_compile():
    jf = thunder_rs.jit(reflected)
    for n in (300, 411):
        x = torch.randn(n)
        torch.testing.assert_close(jf(x), reflected(x), rtol=0, atol=0)
    x = torch.randn(20)  # (reflect padding by 32 needs more than 32 samples)
    message = "Padding size should be less than the corresponding input dimension"
    with pytest.raises(RuntimeError, match=message):
        reflected(x)
    with pytest.raises(RuntimeError, match=f"stft: .*{message}"):
        jf(x)


def spectra(x):
    """Fallbacks on and to complex values: FFTs and polar coordinates."""
    half = torch.fft.rfft(x, norm="ortho")
    whole = torch.fft.fft(torch.polar(x.abs(), x))
    return torch.fft.irfft(half * half.abs(), n=x.shape[-1]), whole.abs(), torch.fft.ifft(whole).real


def test_ffts_and_polar_of_a_changing_length_stay_symbolic_with_eagers_gradients():
    jf = thunder_rs.jit(spectra)
    for n in (40, 57, 70, 128):
        x = torch.randn(3, n, dtype=torch.float64, requires_grad=True)
        twin = x.detach().clone().requires_grad_()
        outs, expected = jf(x), spectra(twin)
        for out, e in zip(outs, expected, strict=True):
            torch.testing.assert_close(out, e, rtol=0, atol=0)
            assert out.stride() == e.stride()
        sum(o.sum() for o in outs).backward()
        sum(e.sum() for e in expected).backward()
        torch.testing.assert_close(x.grad, twin.grad, rtol=0, atol=0)
    assert misses(jf) == 2, thunder_rs.compile_stats(jf).miss_reasons
    assert jf._dynamic_off is None
