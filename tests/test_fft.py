"""``torch.fft``'s transforms traced natively (the prims ``fft_r2c``, ``fft_c2r``, ``fft_c2c``):
outputs, strides, conjugate bits and gradients equal eager's bit for bit, for real and complex
inputs that require grad, whole and as their decompositions (as a fusion executor takes them),
with no eager fallback; what eager rejects raises eager's exception type.
"""

import pytest
import torch

import thunder_rs
from thunder_rs.executors.torch_ex import decomposing

F = torch.fft

#: (id, transform, whether it takes a real input (else complex)).
CASES = [
    ("fft_real", lambda a: F.fft(a, n=7, dim=0), True),
    ("fft", lambda a: F.fft(a, norm="ortho"), False),
    ("ifft_real", lambda a: F.ifft(a, n=11), True),
    ("ifft", lambda a: F.ifft(a, n=5, dim=0, norm="forward"), False),
    ("rfft", lambda a: F.rfft(a, n=9, norm="ortho"), True),
    ("ihfft", lambda a: F.ihfft(a, dim=0), True),
    ("irfft", lambda a: F.irfft(a), False),
    ("irfft_odd", lambda a: F.irfft(a, n=7, norm="forward"), False),
    ("hfft", lambda a: F.hfft(a, n=10), False),
    ("hfft_real", lambda a: F.hfft(a, dim=0, norm="ortho"), True),
    ("fftn", lambda a: F.fftn(a, s=(2, 9)), False),
    ("fft2_real", lambda a: F.fft2(a, norm="forward"), True),
    ("ifftn", lambda a: F.ifftn(a, dim=(1, 0)), False),
    ("rfftn", lambda a: F.rfftn(a, s=(5, -1), dim=(1, 0)), True),
    ("rfft2", lambda a: F.rfft2(a, norm="ortho"), True),
    ("irfftn", lambda a: F.irfftn(a, s=(3, 5)), False),
    ("irfft2", lambda a: F.irfft2(a, norm="forward"), False),
    ("hfftn", lambda a: F.hfftn(a, dim=(1, 0), norm="ortho"), False),
    ("hfft2", lambda a: F.hfft2(a, s=(4, 6)), False),
    ("ihfftn", lambda a: F.ihfftn(a, s=(5, 6), dim=(1, 0)), True),
    ("ihfft2", lambda a: F.ihfft2(a, norm="forward"), True),
]
REAL_TO_COMPLEX = {torch.float32: torch.complex64, torch.float64: torch.complex128}


def _input(real: bool, dtype: torch.dtype) -> torch.Tensor:
    torch.manual_seed(0)
    x = torch.randn(4, 6, dtype=dtype)
    x = x if real else torch.complex(x, torch.randn_like(x))
    return x.requires_grad_()


def _same(actual: torch.Tensor, expected: torch.Tensor, conj: bool = True) -> None:
    """Equal values, dtypes, shapes and strides; with ``conj``, the conjugate bit too."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert actual.stride() == expected.stride()
    if conj:
        assert actual.is_conj() == expected.is_conj()
    assert torch.equal(actual.resolve_conj(), expected.resolve_conj())


def _check(fn, x: torch.Tensor, conj: bool = True) -> None:
    """``fn(x)`` and the gradient it leaves in ``x.grad`` for one random cotangent, under ``jit``
    and eager. (The raw gradients ``torch.autograd.grad`` returns differ in strides where the
    input was padded or trimmed: thunder_rs's ``pad`` and ``slice`` rules give views where eager's
    backward copies.)"""
    assert thunder_rs.examine(fn, x).fallbacks == {}
    expected, actual = fn(x), thunder_rs.jit(fn)(x)
    _same(actual, expected, conj)
    torch.manual_seed(1)
    cotangent = torch.randn_like(expected.resolve_conj())
    grads = []
    for out in (expected, actual):
        x.grad = None
        out.backward(cotangent)
        grads.append(x.grad)
    # (a complex input's gradient through ``input.conj()``, in ``hfft``, is a conjugate view in
    # eager; computed here)
    _same(grads[1], grads[0], conj=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("fn", "real"), [pytest.param(fn, real, id=name) for name, fn, real in CASES])
def test_a_transform_and_its_gradient_are_eagers(fn, real: bool, dtype: torch.dtype) -> None:
    _check(fn, _input(real, dtype))


@pytest.mark.parametrize(("fn", "real"), [pytest.param(fn, real, id=name) for name, fn, real in CASES])
def test_a_decomposed_transform_and_its_gradient_are_eagers(fn, real: bool) -> None:
    """As a fusion executor takes it: the prims, not the torch function. (The conjugation ending
    ``ifft`` of a real input and ``ihfft`` is computed there, where eager's is a conjugate view;
    the torch executor, which runs the symbol whole, returns eager's view.)"""
    with decomposing():
        _check(lambda a: fn(a), _input(real, torch.float64), conj=False)


def test_a_spectral_loss_trains_as_eager() -> None:
    """Magnitudes of a one-sided spectrum (``abs`` of complex values runs eagerly), a filter
    applied in the frequency domain and the signal taken back."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, requires_grad=True)
    w = torch.randn(17, requires_grad=True)

    def fn(x, w):
        spectrum = F.rfft(x, norm="ortho")
        filtered = F.irfft(spectrum * w, n=32, norm="ortho")
        return spectrum.abs().square().mean() + (filtered - x).square().mean()

    expected, actual = fn(x, w), thunder_rs.jit(fn)(x, w)
    assert torch.equal(actual, expected)
    for e, a in zip(torch.autograd.grad(expected, (x, w)), torch.autograd.grad(actual, (x, w))):
        assert torch.equal(a, e)


@pytest.mark.parametrize(
    "fn", [lambda a: F.fft(a), lambda a: F.rfftn(a, dim=(1, 2)), lambda a: F.irfft(a), lambda a: F.hfft2(a)]
)
def test_empty_batches_and_integer_inputs_are_eagers(fn) -> None:
    for x in (torch.randn(0, 3, 4), torch.arange(24).reshape(2, 3, 4), torch.ones(2, 3, 4, dtype=torch.bool)):
        assert thunder_rs.examine(fn, x).fallbacks == {}
        _same(thunder_rs.jit(fn)(x), fn(x))


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: F.fft(a, norm="bad"),
        lambda a: F.rfft(a.to(torch.complex64)),
        lambda a: F.ihfft2(a.to(torch.complex64)),
        lambda a: F.fft(a, n=0),
        lambda a: F.irfft(a[:, :1]),
        lambda a: F.fft(a, dim=2),
        lambda a: F.fft(a.sum()),
        lambda a: F.fftn(a, dim=(1, -1)),
        lambda a: F.fftn(a, s=(1, 2, 3)),
        lambda a: F.fft2(a, s=(2,)),
        lambda a: F.rfftn(a, dim=()),
        lambda a: F.hfftn(a, dim=[]),
        lambda a: F.fft(a.half()),
        lambda a: F.rfft(a.bfloat16()),
    ],
)
def test_what_eager_rejects_raises_eagers_type(fn) -> None:
    x = torch.randn(3, 4)
    with pytest.raises(Exception) as eager:
        fn(x)
    with pytest.raises(type(eager.value)) as traced:
        thunder_rs.jit(fn)(x)
    assert isinstance(traced.value, thunder_rs.errors.ThunderError)
