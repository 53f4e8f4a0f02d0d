"""Ops the op database ran as eager fallbacks (round 4), now traced natively: each matches eager
(bit-equal in float32 where the decomposition computes as eager's kernel does), forward and
backward, falls back nowhere, and rejects what eager rejects with eager's exception type.
"""

import pytest
import torch

from test_native_ops_round2 import check_bit_equal, check_same_error

# -- fft.fftshift, fft.ifftshift ---------------------------------------------------------------------


@pytest.mark.parametrize("shift", [torch.fft.fftshift, torch.fft.ifftshift])
def test_fft_shifts_are_rolls(shift) -> None:
    x = torch.randn(5, 6, 7, requires_grad=True)
    check_bit_equal(lambda a: shift(a), x)
    check_bit_equal(lambda a: shift(a.mT, dim=(-1, 0, -1)), x)
    check_bit_equal(lambda a: shift(a, 1), x)
    check_bit_equal(lambda a: shift(a), torch.randn(0, 3))
    check_same_error(lambda a: shift(a), torch.tensor(1.0))
    check_same_error(lambda a: shift(a, 3), x)
