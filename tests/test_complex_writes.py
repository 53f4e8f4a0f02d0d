"""In-place writes into part of a complex tensor that carries a gradient, as a Fourier neural
operator writes its kept modes (``out_ft[:, :, :modes] = einsum(...)``), compared with eager.

What differed: a view op of a complex tensor that carries a gradient (``z[:, :2]``, ``z.select``,
``z.t()``) is eager's op, run as a fallback, and its result was a tensor of its own to the trace: an
in-place write through it left the tensor it views as it was, and a write to that tensor left the
view as it was, silently. A write into part of a complex tensor made by an op the trace maps was
refused (a Fourier layer could not train), and so were writes through ``z.real``, ``z.imag`` and
``torch.view_as_real(z)``; ``z.conj()`` (eager's op, a view with the conjugate bit) was a tensor of
its own even without gradients. All are now eager's write, on a copy
(``thunder_rs.torch.complex_views``)."""

import pytest
import torch
from torch import nn

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError
from user_training import trains_as_eager

pytestmark = pytest.mark.usefixtures("one_thread")


class SpectralConv2d(nn.Module):
    """The spectral convolution of the Fourier neural operator (Li et al.'s ``SpectralConv2d``): the
    lowest modes of each corner of ``rfft2``'s spectrum mixed by complex weights, the rest zero."""

    def __init__(self, channels: int, modes: int):
        super().__init__()
        self.modes = modes
        scale = 1 / channels**2
        shape = (channels, channels, modes, modes)
        self.w1 = nn.Parameter(scale * torch.rand(*shape, dtype=torch.cfloat))
        self.w2 = nn.Parameter(scale * torch.rand(*shape, dtype=torch.cfloat))

    def forward(self, x):
        m = self.modes
        x_ft = torch.fft.rfft2(x)
        out_ft = torch.zeros(x.shape[0], self.w1.shape[1], x.shape[-2], x.shape[-1] // 2 + 1, dtype=torch.cfloat)
        out_ft[:, :, :m, :m] = torch.einsum("bixy,ioxy->boxy", x_ft[:, :, :m, :m], self.w1)
        out_ft[:, :, -m:, :m] = torch.einsum("bixy,ioxy->boxy", x_ft[:, :, -m:, :m], self.w2)
        return torch.fft.irfft2(out_ft, s=(x.shape[-2], x.shape[-1]))


class FourierBlock(nn.Module):
    def __init__(self, channels: int = 2, modes: int = 2):
        super().__init__()
        self.lift = nn.Conv2d(1, channels, 1)
        self.spectral = SpectralConv2d(channels, modes)
        self.skip = nn.Conv2d(channels, channels, 1)
        self.project = nn.Conv2d(channels, 1, 1)

    def forward(self, x):
        h = self.lift(x)
        h = nn.functional.gelu(self.spectral(h) + self.skip(h))
        return self.project(h)


def test_a_fourier_neural_operator_block_trains_as_eager():
    # The modes written into ``out_ft`` were refused ("writing in place into part of a complex
    # tensor that carries a gradient is not supported").
    def program(model, step):
        x, target = torch.randn(2, 1, 6, 6), torch.randn(2, 1, 6, 6)
        out = model(x)
        return (out - target).square().mean(), [out]

    trains_as_eager(FourierBlock, program, steps=2)


def _written_through_a_view(x, w):
    z = torch.fft.fft(x) * 2
    part = z[:, :2]
    part.mul_(w)
    z.select(1, 3).add_(w[0])
    z.t()[2] *= 3
    return torch.view_as_real(z), part.abs()


def _written_after_taking_a_view(x, w):
    z = torch.fft.fft(x)
    part = z[1:, ::2]
    z.mul_(w[0])
    z[0] = w[1]
    return part.abs(), z.angle()


def _a_view_of_a_view_written(x, w):
    z = torch.fft.fft(x).reshape(2, 6)
    rows = z[:, 1:]
    rows[0].copy_(w.repeat(3)[:5])
    return torch.view_as_real(rows), torch.view_as_real(z)


@pytest.mark.parametrize("x_grad", [False, True], ids=["x", "x_requiring_grad"])
@pytest.mark.parametrize("program", [_written_through_a_view, _written_after_taking_a_view, _a_view_of_a_view_written])
def test_views_of_complex_tensors_with_gradients_share_their_writes_as_in_eager(program, x_grad):
    # With ``x`` requiring grad, ``z[:, :2]`` was a tensor of its own: ``part.mul_(w)`` left ``z``
    # as it was (and ``z.mul_`` left ``part``), silently.
    x = torch.randn(3, 4, requires_grad=x_grad)
    w = torch.randn(2, dtype=torch.cfloat, requires_grad=True)
    inputs = [t.detach().clone().requires_grad_(t.requires_grad) for t in (x, w)]
    expected, got = program(x, w), thunder_rs.jit(program)(*inputs)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
    wanted = [t for t in (x, w) if t.requires_grad]
    grads = torch.autograd.grad(sum(t.sum() for t in got), [t for t in inputs if t.requires_grad])
    for g, e in zip(grads, torch.autograd.grad(sum(t.sum() for t in expected), wanted)):
        torch.testing.assert_close(g, e)


def _conj_taken_then_tensor_written(x, w):
    z = torch.fft.fft(x) * w
    conjugate = z.conj()
    z.mul_(2)
    return (torch.view_as_real(conjugate.resolve_conj()),)


def _written_through_conj(x, w):
    z = torch.fft.fft(x) * w
    z.conj()[1:].mul_(2)
    return (torch.view_as_real(z),)


def _written_through_real_and_imag(x, w):
    z = torch.fft.fft(x) * w
    z.real[:, 1] = 0
    z.imag.mul_(2)
    return (torch.view_as_real(z),)


def _written_through_view_as_real(x, w):
    z = torch.fft.fft(x) * w
    torch.view_as_real(z)[..., 0].add_(1)
    return (z.abs(),)


@pytest.mark.parametrize("w_grad", [False, True], ids=["w", "w_requiring_grad"])
@pytest.mark.parametrize(
    "program",
    [
        _conj_taken_then_tensor_written,
        _written_through_conj,
        _written_through_real_and_imag,
        _written_through_view_as_real,
    ],
)
def test_conjugate_real_and_imaginary_views_share_their_writes_as_in_eager(program, w_grad):
    # ``z.conj()`` of a tensor without a gradient was a tensor of its own too (silently); writes
    # through ``z.real``, ``z.imag`` and ``view_as_real(z)`` were refused.
    x = torch.randn(3, 4)
    w = torch.randn(4, dtype=torch.cfloat, requires_grad=w_grad)
    w_copy = w.detach().clone().requires_grad_(w_grad)
    (expected,), (got,) = program(x, w), thunder_rs.jit(program)(x, w_copy)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    if w_grad:
        torch.testing.assert_close(torch.autograd.grad(got.sum(), w_copy), torch.autograd.grad(expected.sum(), w))


def test_a_detached_complex_tensor_follows_writes_to_the_tensor_as_in_eager():
    # ``z.detach()`` shares ``z``'s memory (no view to autograd): it kept ``z``'s old values.
    def f(x, w):
        z = torch.fft.fft(x) * w
        detached = z.detach()
        z.mul_(2)
        return torch.view_as_real(detached) + torch.view_as_real(z)

    x, w = torch.randn(3, 4), torch.randn(4, dtype=torch.cfloat, requires_grad=True)
    w_copy = w.detach().clone().requires_grad_()
    expected, got = f(x, w), thunder_rs.jit(f)(x, w_copy)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), w_copy), torch.autograd.grad(expected.sum(), w))


def test_a_write_through_a_detached_complex_tensor_with_gradients_is_refused_naming_the_line():
    # Autograd does not see it in eager, which eager's write on a copy cannot be.
    def f(x, w):
        z = torch.fft.fft(x) * w
        z.detach()[0] = 0
        return torch.view_as_real(z)

    w = torch.randn(4, dtype=torch.cfloat, requires_grad=True)
    with pytest.raises(ThunderNotImplementedError, match=r"detached view of a complex tensor.*test_complex_writes"):
        thunder_rs.jit(f)(torch.randn(3, 4), w)


def test_writing_one_of_several_views_of_a_complex_tensor_raises_as_eager():
    def f(x, w):
        z = torch.fft.fft(x)
        z.chunk(2, dim=1)[0].mul_(w)
        return torch.view_as_real(z)

    x, w = torch.randn(3, 4, requires_grad=True), torch.randn((), dtype=torch.cfloat)
    with pytest.raises(RuntimeError, match="returns multiple views") as eager:
        f(x, w)
    with pytest.raises(RuntimeError, match="returns multiple views") as jitted:
        thunder_rs.jit(f)(x, w)
    assert str(jitted.value).startswith(str(eager.value))
    assert "test_complex_writes.py" in str(jitted.value)
