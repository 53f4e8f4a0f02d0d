"""Errors of linalg ops whose input requires grad, which run a stand-in that also returns what
eager's node saves (``linalg_solve_saving_factors``, ``_linalg_det``, ``_linalg_slogdet``): eager's
error type and message, naming the op the program called, never the stand-in."""

import pytest
import torch

import thunder_rs

STAND_INS = ("saving_factors", "_linalg_det", "_linalg_slogdet")


def _rg(t):
    return t.requires_grad_()


#: name -> (program, arguments)
CASES = {
    "solve, singular": (torch.linalg.solve, lambda: (_rg(torch.zeros(3, 3)), torch.ones(3, 2))),
    "solve, singular batch": (torch.linalg.solve, lambda: (_rg(torch.zeros(2, 3, 3)), torch.ones(2, 3, 2))),
    "solve, shapes": (torch.linalg.solve, lambda: (_rg(torch.eye(3)), torch.ones(4, 2))),
    "solve, not square": (torch.linalg.solve, lambda: (_rg(torch.ones(3, 4)), torch.ones(3, 2))),
    "det, not square": (torch.linalg.det, lambda: (_rg(torch.ones(3, 4)),)),
    "torch.det, not square": (torch.det, lambda: (_rg(torch.ones(3, 4)),)),
    "slogdet, not square": (torch.linalg.slogdet, lambda: (_rg(torch.ones(3, 4)),)),
}


@pytest.mark.parametrize("name", CASES)
def test_errors_of_inputs_requiring_grad_are_eagers_naming_the_called_op(name):
    fn, make = CASES[name]
    with pytest.raises(Exception) as eager:
        fn(*make())
    with pytest.raises(Exception) as compiled:
        thunder_rs.jit(fn)(*make())
    assert isinstance(compiled.value, type(eager.value))
    assert str(eager.value) in str(compiled.value)
    assert not any(s in str(compiled.value) for s in STAND_INS), str(compiled.value)
