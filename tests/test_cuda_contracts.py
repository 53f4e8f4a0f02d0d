"""The aten calls the generated code makes on CUDA satisfy the CUDA kernels' contracts, checked
without a GPU: the program runs on fake CUDA tensors (``FakeTensorMode``, meta computations only),
its backward is called directly (torch's autograd engine needs a CUDA context), and a dispatch mode
records the aten calls, whose arguments are checked against what the CUDA kernels require.

BatchNorm's backward: ``batch_norm_backward_cuda`` (aten/src/ATen/native/cuda/Normalization.cu;
the assert is at line 607 in torch 2.11) outside its fused kernel (2-D and channels-last inputs,
only some gradients asked for) asserts ``save_mean->defined()`` and ``save_invstd->defined()``,
takes non-empty saved statistics as the mean and inverse standard deviation, and empty ones as
"recompute from the running statistics" under ``TORCH_CHECK(!train && running_mean->defined())``;
its fused kernel and ``batch_norm_backward_reduce_cuda`` read them as the accumulate type of the
input (``packed_accessor_or_dummy<accscalar_t>``, ``TORCH_CHECK(mean_st == invstd_st)``).
"""

import contextlib
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import thunder_rs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from opinfos.core import SampleInput  # noqa: E402
from opinfos.nn import batch_norm_samples  # noqa: E402

_BACKWARD = torch.ops.aten.native_batch_norm_backward.default


class _Calls(TorchDispatchMode):
    """Records the arguments of every call of ``op``."""

    def __init__(self, op):
        super().__init__()
        self.op, self.calls = op, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is self.op:
            self.calls.append(args)
        return func(*args, **(kwargs or {}))


def _accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    """``at::toAccumulateType(dtype, /*is_cuda=*/true)`` for the floating dtypes."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_backward_contract(args) -> None:
    grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, mask = args
    assert input.is_cuda
    assert isinstance(save_mean, torch.Tensor) and isinstance(save_invstd, torch.Tensor), (
        "TORCH_INTERNAL_ASSERT(save_mean->defined()) / (save_invstd->defined())"
    )
    if save_mean.numel() == 0 or save_invstd.numel() == 0:
        assert not train and running_mean is not None and running_var is not None, (
            "TORCH_CHECK(!train && running_mean->defined())"
        )
    for saved in (save_mean, save_invstd):
        assert saved.dtype == _accumulate_dtype(input.dtype)
        assert saved.numel() in (0, input.shape[1])


def _backward_calls(fn, sample) -> list:
    """The ``native_batch_norm_backward`` calls of ``fn``'s backward on ``sample``, whose floating
    tensors other than the running statistics require grad."""
    running = {id(sample.kwargs.get(k)) for k in ("running_mean", "running_var")} | {id(a) for a in sample.args[1:3]}
    leaves = [
        t for t in (*sample.args, *sample.kwargs.values()) if isinstance(t, torch.Tensor) and id(t) not in running
    ]
    for t in leaves:
        t.requires_grad_(True)
    out = fn(*sample.args, **sample.kwargs)
    # The node's own backward, with a cotangent for ``out`` among its forward's outputs (a compiled
    # call also returns the running statistics it writes back).
    cotangents: list = [None] * len(out.grad_fn._input_metadata)
    cotangents[out.output_nr] = torch.ones_like(out)
    calls = _Calls(_BACKWARD)
    with calls, torch.no_grad():
        getattr(out.grad_fn, "apply", out.grad_fn)(*cotangents)  # a compiled call's node, or eager's
    return calls.calls


def _cuda_samples(dtype):
    """The OpInfo samples (eval, training with and without running statistics, affine or not, 2-D
    to 5-D, non-contiguous) and channels-last inputs, which CUDA's backward never takes through its
    fused kernel."""
    yield from batch_norm_samples(dtype, "cuda")
    x = torch.randn(2, 3, 4, 4, dtype=dtype, device="cuda").to(memory_format=torch.channels_last)
    for training in (False, True):
        stats = torch.zeros(3, dtype=dtype, device="cuda"), torch.ones(3, dtype=dtype, device="cuda")
        yield SampleInput(x, *stats, torch.ones(3, dtype=dtype, device="cuda"), training=training)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_batch_norm_backward_on_cuda_gets_the_saved_statistics_its_kernel_requires(dtype):
    with FakeTensorMode():
        samples = list(_cuda_samples(dtype))
        checked = 0
        for sample in samples:
            calls = _backward_calls(thunder_rs.jit(F.batch_norm), sample)
            for args in calls:
                _check_backward_contract(args)
            checked += len(calls)
    assert checked >= len(samples) - 1  # one call per sample with a gradient to compute


def test_eager_on_fake_cuda_meets_the_contract_the_check_states():
    """The contract check accepts what eager's own CUDA autograd passes (its forward's statistics)."""
    with FakeTensorMode():
        for sample in _cuda_samples(torch.float32):
            for args in _backward_calls(F.batch_norm, sample):
                _check_backward_contract(args)


def test_cuda_eval_backward_gets_empty_statistics():
    """In eval mode the kernel recomputes them from the running statistics, as eager's does."""
    with FakeTensorMode():
        stats = torch.zeros(3, device="cuda"), torch.ones(3, device="cuda")
        sample = SampleInput(torch.randn(6, 3, device="cuda"), *stats, torch.ones(3, device="cuda"), training=False)
        [args] = _backward_calls(thunder_rs.jit(F.batch_norm), sample)
    assert args[5].shape == (0,) and args[6].shape == (0,) and args[7] is False


# -- numbers beside CUDA tensors -------------------------------------------------------------------


class _HostToDevice(TorchDispatchMode):
    """Records the aten calls that make a CUDA tensor from a CPU one (a copy to the device)."""

    def __init__(self):
        super().__init__()
        self.copies: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        moved = (
            isinstance(out, torch.Tensor)
            and out.device.type == "cuda"
            and any(isinstance(a, torch.Tensor) and a.device.type == "cpu" for a in args)
        )
        if moved and func.overloadpacket in (torch.ops.aten._to_copy, torch.ops.aten.copy_, torch.ops.aten.to):
            self.copies.append(str(func))
        return out


_NUMBER_BINARIES = ("maximum", "minimum", "fmod", "atan2", "nextafter", "zeta", "chebyshev_polynomial_t")


@pytest.mark.parametrize("name", _NUMBER_BINARIES)
def test_a_number_beside_a_cuda_tensor_is_never_copied_to_the_device(name):
    # A copy from pageable host memory waits for the CUDA stream: made on every call, it would
    # keep the host from running ahead of the GPU (the training step is host-bound).
    from thunder_rs.executors.torch_ex import torch_ex  # noqa: PLC0415 (the executor under test)

    impl = next(i.fn for i in torch_ex.registry.values() if i.name == f"prim_{name}")
    torch_fn = getattr(torch, name, None) or getattr(torch.special, name)
    x = torch.rand(5) + 0.5
    for a, b in ((x, 0.75), (0.75, x)):  # the values of a 0-dim tensor of the other operand's dtype
        expected = torch_fn(*(t if isinstance(t, torch.Tensor) else torch.tensor(t) for t in (a, b)))
        torch.testing.assert_close(impl(a, b), expected, rtol=0, atol=0, equal_nan=True)
    with FakeTensorMode():
        y = torch.empty(5, device="cuda")
        with _HostToDevice() as seen:
            outs = [impl(y, 0.75), impl(0.75, y)]
    assert seen.copies == [] and all(o.device.type == "cuda" for o in outs)


# -- autocast on CUDA, and the first call's outputs, with nvFuser's regions --------------------------------


@pytest.fixture
def stand_in_ex(monkeypatch):
    """An nvFuser executor on the stand-in ``nvfuser_direct`` that claims CUDA tensors only
    (fake ones here); ``cpu_ex`` of the same, allowed CPU tensors."""
    import fake_nvfuser_direct as fake  # noqa: PLC0415

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the named executor warns that the real nvfuser_direct is absent
        from thunder_rs.executors.nvfuser_ex import NvFuserExecutor  # noqa: PLC0415

    monkeypatch.setitem(sys.modules, "nvfuser_direct", fake)
    return lambda **options: NvFuserExecutor("nvfuser_stand_in", module=fake, **options)


@contextlib.contextmanager
def _cuda_autocast(monkeypatch, **options):
    """``torch.autocast("cuda", ...)`` without a GPU: its constructor asks whether CUDA (and bf16)
    is there and disables itself otherwise; entered, it sets the CUDA autocast state as on a GPU."""
    with monkeypatch.context() as m:
        m.setattr(torch.cuda, "is_available", lambda: True)
        m.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
        context = torch.autocast("cuda", **options)
    with context:
        yield


@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float16], ids=["default", "bf16", "fp16"])
def test_cuda_autocast_gives_eagers_dtypes_and_strides_through_nvfusers_regions(dtype, stand_in_ex, monkeypatch):
    """Under CUDA autocast (float16 by default) linears run in the low dtype, softmax and layer
    norm in float32: every output's dtype and strides are eager's, first call and later ones."""
    options = {} if dtype is None else {"dtype": dtype}
    ex = stand_in_ex()
    with FakeTensorMode():
        model = nn.Sequential(
            nn.Linear(8, 16, device="cuda"), nn.GELU(), nn.LayerNorm(16, device="cuda"), nn.Linear(16, 4, device="cuda")
        )

        def fn(x):
            h = model(x)
            return h, F.softmax(h, -1), h.float().sum(), model[0](x).transpose(0, 1) + 1

        x = torch.randn(5, 8, device="cuda")
        jfn = thunder_rs.jit(fn, executors=[ex, "torch"])
        with _cuda_autocast(monkeypatch, **options):
            expected = fn(x)
            calls = [jfn(x), jfn(x)]
    assert expected[0].dtype == (dtype or torch.float16)
    for outputs in calls:
        assert [(t.dtype, t.stride(), t.device) for t in outputs] == [(t.dtype, t.stride(), t.device) for t in expected]
    assert ex.stats["definitions"] > 0 and ex.stats["failures"] == 0, ex.fallbacks


def _read_between_regions(x, w):
    y = (x * 2).tanh()
    if y.sum() > 0:  # a read: the first call's outputs come from the segments (``snapshots``)
        y = y + 1
    return y.permute(0, 2, 3, 1) * w, y.transpose(1, 2) * 3, y.half() * 2, y.sum(1), y.amax((2, 3))


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last], ids=str)
def test_a_first_call_returning_its_segments_outputs_lays_them_out_as_the_regions_later(memory_format, stand_in_ex):
    """The first call returns what the torch executor computed while tracing; later calls run
    nvFuser's regions: the same dtypes, strides and devices as eager's, values to the bit."""
    ex = stand_in_ex(allow_cpu=True)
    jfn = thunder_rs.jit(_read_between_regions, executors=[ex, "torch"])
    x, w = torch.randn(2, 3, 4, 5).to(memory_format=memory_format), torch.randn(3)
    expected = _read_between_regions(x, w)
    for _ in range(2):
        outputs = jfn(x, w)
        assert [(t.dtype, t.stride(), t.device) for t in outputs] == [(t.dtype, t.stride(), t.device) for t in expected]
        assert all(torch.equal(a, e) for a, e in zip(outputs, expected))
    assert ex.stats["definitions"] > 0 and ex.stats["failures"] == 0, ex.fallbacks
