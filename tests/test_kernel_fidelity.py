"""Ops whose compiled results are bit-equal to eager's because the trace runs eager's own kernels,
forward and backward: values, gradients and their strides, in float32 and float64, on
contiguous, channels_last and otherwise non-contiguous inputs. A decomposition (or the VJP of
one) rounds otherwise than those kernels by a few ulps, which these tests would see.

- ``torch.native_group_norm`` called directly: its kernel and ``native_group_norm_backward``, as
  ``F.group_norm`` (a mean or rstd output the program differentiates adds its terms).
- ``torch.cdist`` off the matmul path (p != 2, few rows, ``donot_use_mm_for_euclid_dist``):
  ``_cdist_forward`` and ``_cdist_backward``, x2's from the transposed cotangent and distances.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import thunder_rs

DTYPES = [torch.float32, torch.float64]


def _like(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with its strides, a leaf that requires grad when ``t`` is floating."""
    copy = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).copy_(t)
    return copy.requires_grad_(t.is_floating_point())


def _run(program: Callable, inputs: list[torch.Tensor]):
    """The outputs of ``program`` and the gradients of its inputs that require grad, from a
    cotangent drawn contiguous (the same values whatever the output's layout)."""
    args = [_like(t) for t in inputs]
    out = program(*args)
    outs = out if isinstance(out, tuple) else (out,)
    gen = torch.Generator().manual_seed(7)
    cotangents = [torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in outs]
    grads = torch.autograd.grad(outs, [a for a in args if a.requires_grad], cotangents)
    return (*outs, *grads)


def assert_bit_equal_to_eager(program: Callable, inputs: list[torch.Tensor]) -> None:
    expected = _run(program, inputs)
    actual = _run(thunder_rs.jit(program), inputs)
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert a.stride() == e.stride(), f"result {i}: strides {a.stride()}, eager {e.stride()}"
        assert torch.equal(a, e), f"result {i}: differs from eager by {(a - e).abs().max().item():.3g}"


def channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last if t.ndim == 4 else torch.channels_last_3d)


def stepped(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values, every other element of a tensor twice as wide in the last dim."""
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., ::2] = t
    return wide[..., ::2]


def contiguous(t: torch.Tensor) -> torch.Tensor:
    return t


LAYOUTS = {"contiguous": contiguous, "channels_last": channels_last, "stepped": stepped}


def randn(*shape: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).to(dtype)


# -- group norm ------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 6, 5, 4), (2, 6, 3, 2, 4)], ids=["2d", "3d"])
def test_native_group_norm_called_directly_is_eagers(shape, dtype, layout):
    x = LAYOUTS[layout](randn(*shape, dtype=dtype))
    w, b = randn(6, dtype=dtype, seed=1), randn(6, dtype=dtype, seed=2)
    hxw = x[0, 0].numel()

    def program(x, w, b):
        return torch.native_group_norm(x, w, b, shape[0], 6, hxw, 3, 1e-5)[0]

    assert_bit_equal_to_eager(program, [x, w, b])


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_group_norm_module_is_eagers(layout):
    x = LAYOUTS[layout](randn(2, 8, 6, 7, dtype=torch.float32))
    w, b = randn(8, dtype=torch.float32, seed=1), randn(8, dtype=torch.float32, seed=2)
    assert_bit_equal_to_eager(lambda x, w, b: F.group_norm(x, 4, w, b), [x, w, b])


def test_native_group_norm_statistics_carry_their_gradients():
    """The mean and rstd outputs differentiated too: eager's formula for them (its
    ``infinitely_differentiable`` backward) rounds otherwise, so the values agree within
    float64's tolerance."""
    x = randn(4, 6, 5, dtype=torch.float64).requires_grad_()

    def program(x):
        out, mean, rstd = torch.native_group_norm(x, None, None, 4, 6, 5, 3, 1e-5)
        return (out * out).sum() + 3 * mean.sum() + (rstd * rstd).sum()

    (expected,) = torch.autograd.grad(program(x), x)
    (actual,) = torch.autograd.grad(thunder_rs.jit(program)(x), x)
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)


# -- cdist -----------------------------------------------------------------------------------------

CDIST_MODES = ["use_mm_for_euclid_dist_if_necessary", "donot_use_mm_for_euclid_dist"]


@pytest.mark.parametrize("layout", ["contiguous", "stepped", "transposed"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, math.inf])
@pytest.mark.parametrize("mode", CDIST_MODES, ids=["if_necessary", "donot_use_mm"])
def test_cdist_off_the_matmul_path_is_eagers(mode, p, dtype, layout):
    """Few rows (eager's ``_cdist_forward`` kernel even for p = 2 unless told to use matmul), the
    batch dims broadcast, a row of x2 equal to one of x1 (a zero distance)."""
    x1, x2 = randn(2, 5, 3, dtype=dtype), randn(1, 4, 3, dtype=dtype, seed=1)
    x2[0, 1] = x1[1, 2]
    if layout == "transposed":
        x1, x2 = (t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in (x1, x2))
    else:
        x1, x2 = LAYOUTS[layout](x1), LAYOUTS[layout](x2)
    assert_bit_equal_to_eager(lambda a, b: torch.cdist(a, b, p, compute_mode=mode), [x1, x2])
