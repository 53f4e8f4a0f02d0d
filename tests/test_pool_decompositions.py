"""The decompositions of the pooling, interpolation and normalisation symbols and of their
backward kernels, against eager: every OpInfo sample of those families, in each dtype (and in
float64 with gradients), runs under ``torch_ex.decomposing()``, so the prims of the
decompositions run, backward kernels included. The default run takes each op's representative
samples (``opinfos.sampling``); ``--run-slow`` every sample.

``test_ops.py`` checks the same samples through the torch executor, which runs each symbol as
its torch callable; this file checks what a fusion executor taking the decomposition would run.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import thunder_rs
from opinfos import interpolate, layers, normalization, pooling
from opinfos.sampling import sample_indices
from thunder_rs.errors import ThunderNotImplementedError
from thunder_rs.executors.torch_ex import decomposing

OPS = [*pooling.OPS, *interpolate.OPS, *normalization.OPS, *layers.OPS]


def params(dtypes, full):
    """The samples in ``dtypes``: the default run's (``opinfos.sampling``, every kind in an op's
    first dtype here), every sample with ``full`` (``--run-slow``)."""
    return [
        pytest.param(op, dtype, i, id=f"{op.id}-sample{i}-{str(dtype).removeprefix('torch.')}")
        for op in OPS
        for position, dtype in enumerate(d for d in op.dtypes if d in dtypes)
        for i in sample_indices(op, dtype, full, every_kind=position == 0)
    ]


SWEEPS = {
    "test_decomposition_matches_eager": (torch.float32, torch.float64, torch.int64),
    "test_backward_kernel_decompositions_match_eager": (torch.float64,),
}


def pytest_generate_tests(metafunc):
    if metafunc.function.__name__ in SWEEPS:
        full = metafunc.config.getoption("--run-slow")
        metafunc.parametrize(("op", "dtype", "index"), params(SWEEPS[metafunc.function.__name__], full))


def sample(op, dtype, index):
    torch.manual_seed(0)
    for i, s in enumerate(op.sample_inputs(dtype, "cpu")):
        if i == index:
            return s
    raise IndexError(index)


def assert_close(actual, expected, op, dtype):
    actual = actual if isinstance(actual, (tuple, list)) else (actual,)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape
        torch.testing.assert_close(a, e, equal_nan=True, **op.tolerance(dtype))


def test_decomposition_matches_eager(op, dtype, index):
    if index in op.decomposition_skips:
        pytest.skip("the decomposition cannot give eager's result here (see the OpInfo entry)")
    s = sample(op, dtype, index)
    expected = op.op(*s.args, **s.kwargs)
    with decomposing():
        actual = thunder_rs.jit(lambda *a, **k: op.op(*a, **k))(*s.args, **s.kwargs)
    assert_close(actual, expected, op, dtype)


def _grads(fn, s):
    leaves = [
        a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in s.args
    ]
    out = fn(*leaves, **s.kwargs)
    out = [o for o in (out if isinstance(out, tuple) else (out,)) if o.requires_grad]
    torch.manual_seed(1)
    # By shape, not randn_like: a decomposition may give an output another memory layout.
    cotangents = [torch.randn(o.shape, dtype=o.dtype, device=o.device) for o in out]
    inputs = [x for x in leaves if isinstance(x, torch.Tensor) and x.requires_grad]
    return torch.autograd.grad(out, inputs, cotangents, allow_unused=True, materialize_grads=True)


def test_backward_kernel_decompositions_match_eager(op, dtype, index):
    if not op.supports_grad:
        pytest.skip("not differentiable")
    if index in op.decomposition_skips:  # (grid_sampler_3d: no decomposition, eager's kernel only)
        pytest.skip("no decomposition gives eager's result here (see the OpInfo entry)")
    s = sample(op, dtype, index)
    if not all(t.isfinite().all() for t in s.args if isinstance(t, torch.Tensor) and t.is_floating_point()):
        pytest.skip("non-finite inputs")
    try:
        expected = _grads(op.op, s)
    except RuntimeError as e:  # e.g. running statistics that require grad
        pytest.skip(f"eager's own backward fails here: {e}")
    with decomposing():
        actual = _grads(thunder_rs.jit(lambda *a, **k: op.op(*a, **k)), s)
    assert_close(actual, expected, op, dtype)


def test_interpolate_refuses_lanczos():
    # Eager computes it (antialiased); thunder_rs does not, and says so rather than resizing otherwise.
    x = torch.randn(1, 2, 8, 8)
    with pytest.raises(ThunderNotImplementedError, match="interpolate: unsupported mode 'lanczos'"):
        thunder_rs.jit(lambda x: F.interpolate(x, scale_factor=0.5, mode="lanczos", antialias=True))(x)


def test_bilinear_under_autocast_is_refused_by_name():
    a, b, w = torch.randn(3, 4), torch.randn(3, 5), torch.randn(6, 4, 5)
    expected = F.bilinear(a, b, w)
    assert torch.allclose(thunder_rs.jit(F.bilinear)(a, b, w), expected, atol=1e-4)  # and float32 without it
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(ThunderNotImplementedError, match="bilinear.*autocast"):
            thunder_rs.jit(lambda a, b, w: F.bilinear(a, b, w))(a, b, w)
