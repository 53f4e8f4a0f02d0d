"""Gradients at ties (a value at a clamp bound, equal operands of fmax/fmin/maximum/minimum, NaN
operands) equal eager's, whichever executor runs the backward: the torch executor, and the nvFuser
executor on the stand-in ``nvfuser_direct``, where the grad rules' prims are fused.

Eager's convention at ties changed in torch 2.14 and 2.15 (``elementwise.SPLIT_TIES``); the
H100 run of issue 23 had torch 2.11, where clamp passes the gradient at its bounds and fmax gives a
tie to ``self``. These tests compare against the installed torch's eager, so they check whichever
convention it has; the last one checks that the rules chose the installed torch's.
"""

import math
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import thunder_rs
from thunder_rs.torch import elementwise

import fake_nvfuser_direct as fake

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the named executor warns that the real nvfuser_direct is absent
    from thunder_rs.executors.nvfuser_ex import NvFuserExecutor

NAN = math.nan
#: Values at, between and beyond the bounds 0 and 1 (and -1), with NaN.
VALUES = (-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 6.0, 0.0, 1.0, -1.0, NAN)
LOW = (0.0,) * 10 + (NAN, 0.0)
HIGH = (1.0,) * 9 + (NAN, 1.0, 1.0)


def _t(values, dtype):
    return torch.tensor(values, dtype=dtype)


#: id -> (function, inputs as a function of the dtype). Every floating input is differentiated.
CASES = {
    "clamp_numbers": (lambda x: torch.clamp(x, -1.0, 1.0), lambda d: (_t(VALUES, d),)),
    "clamp_numbers_reversed": (lambda x: torch.clamp(x, 1.0, -1.0), lambda d: (_t(VALUES, d),)),
    "clamp_number_min": (lambda x: torch.clamp(x, min=0.5), lambda d: (_t(VALUES, d),)),
    "clamp_number_max": (lambda x: x.clamp(max=0.5), lambda d: (_t(VALUES, d),)),
    "clamp_min_number": (lambda x: torch.clamp_min(x, 0.5), lambda d: (_t(VALUES, d),)),
    "clamp_max_number": (lambda x: x.clamp_max(0.5), lambda d: (_t(VALUES, d),)),
    "clip_numbers": (lambda x: torch.clip(x, 0.0, 6.0), lambda d: (_t(VALUES, d),)),
    "clamp_tensors": (torch.clamp, lambda d: (_t(VALUES, d), _t(LOW, d), _t(HIGH, d))),
    "clamp_tensors_reversed": (torch.clamp, lambda d: (_t(VALUES, d), _t(HIGH, d), _t(LOW, d))),
    "clamp_tensors_equal": (torch.clamp, lambda d: (_t(VALUES, d), _t(LOW, d), _t(LOW, d))),
    "clamp_tensor_min": (lambda x, lo: torch.clamp(x, min=lo), lambda d: (_t(VALUES, d), _t(LOW, d))),
    "clamp_tensor_max": (lambda x, hi: torch.clamp(x, max=hi), lambda d: (_t(VALUES, d), _t(HIGH, d))),
    "clamp_min_tensor": (torch.clamp_min, lambda d: (_t(VALUES, d), _t(LOW, d))),
    "clamp_max_tensor": (lambda x, hi: x.clamp_max(hi), lambda d: (_t(VALUES, d), _t(HIGH, d))),
    "clamp_broadcast_bounds": (torch.clamp, lambda d: (_t(VALUES, d).reshape(3, 4), _t(LOW[:4], d), _t(HIGH[-4:], d))),
    "fmax": (torch.fmax, lambda d: (_t(VALUES, d), _t(LOW, d))),
    "fmax_reversed": (torch.fmax, lambda d: (_t(LOW, d), _t(VALUES, d))),
    "fmin": (torch.fmin, lambda d: (_t(VALUES, d), _t(HIGH, d))),
    "fmin_method": (lambda a, b: a.fmin(b), lambda d: (_t(HIGH, d), _t(VALUES, d))),
    "fmax_broadcast": (torch.fmax, lambda d: (_t(VALUES, d).reshape(3, 4), _t(HIGH[-4:], d))),
    "maximum": (torch.maximum, lambda d: (_t(VALUES, d), _t(LOW, d))),
    "minimum": (torch.minimum, lambda d: (_t(VALUES, d), _t(HIGH, d))),
    "max_of_two": (torch.max, lambda d: (_t(VALUES, d), _t(LOW, d))),
    "min_of_two": (torch.min, lambda d: (_t(VALUES, d), _t(HIGH, d))),
    "hardtanh": (F.hardtanh, lambda d: (_t(VALUES, d),)),
    "relu6": (F.relu6, lambda d: (_t(VALUES, d),)),
    "relu": (F.relu, lambda d: (_t(VALUES, d),)),
}
DTYPES = (torch.float32, torch.bfloat16, torch.float64)


@pytest.fixture(scope="module")
def nvfuser_stand_in():
    """An nvFuser executor on the stand-in module, allowed CPU tensors."""
    saved = sys.modules.get("nvfuser_direct")
    sys.modules["nvfuser_direct"] = fake
    yield NvFuserExecutor("nvfuser_fake", module=fake, allow_cpu=True)
    if saved is None:
        del sys.modules["nvfuser_direct"]
    else:
        sys.modules["nvfuser_direct"] = saved


def _grads(fn, inputs):
    leaves = [x.clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    cotangent = torch.arange(1, out.numel() + 1, dtype=out.dtype).reshape(out.shape)  # which element went where
    return torch.autograd.grad(out, leaves, cotangent)


def _assert_grads(fn, jfn, dtype, case: str):
    inputs = CASES[case][1](dtype)
    expected = _grads(fn, inputs)
    actual = _grads(jfn, inputs)
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype and a.shape == e.shape
        torch.testing.assert_close(a, e, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{case} {dtype}: {m}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES)
def test_tie_grads_match_eager_with_the_torch_executor(case, dtype):
    fn = CASES[case][0]
    _assert_grads(fn, thunder_rs.jit(fn, executors=[]), dtype, case)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES)
def test_tie_grads_match_eager_in_nvfuser_regions(case, dtype, nvfuser_stand_in):
    op = CASES[case][0]

    def fn(*args):
        # A product after the op, so the backward has a region to fuse with where the op's own
        # backward is one kernel (an activation's, which alone the torch executor runs).
        return op(*args) * 3.0

    jfn = thunder_rs.jit(fn, executors=[nvfuser_stand_in])
    _assert_grads(fn, jfn, dtype, case)
    assert thunder_rs.last_backward_traces(jfn)[-1].regions(), "the backward ran in no nvFuser region"


def _eager_grad(fn, *values):
    leaves = [torch.tensor(v, requires_grad=True) for v in values]
    return [g.item() for g in torch.autograd.grad(fn(*leaves), leaves)]


def test_tie_conventions_are_the_installed_torchs():
    """The rules' choice by torch version is eager's: a scalar bound's tie, a tensor tie of fmax,
    and fmax with a NaN ``self``."""
    split = elementwise.SPLIT_TIES
    assert _eager_grad(lambda x: torch.clamp(x, 0.0, 1.0), 0.0) == [0.0 if split else 1.0]
    assert _eager_grad(torch.fmax, 1.0, 1.0) == ([0.5, 0.5] if split else [1.0, 0.0])
    nan_selecting = elementwise.NAN_SELECTING_FMAX
    assert _eager_grad(torch.fmax, NAN, 1.0) == ([0.0, 1.0] if nan_selecting or not split else [1.0, 1.0])
