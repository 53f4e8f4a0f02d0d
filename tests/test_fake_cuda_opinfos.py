"""The OpInfo table on fake CUDA tensors (``FakeTensorMode``: no GPU needed) with the CUDA default
executors: nvFuser (its stand-in, claiming CUDA tensors only) before the torch executor, in
bfloat16, float16 and float32, each op's first sample with its floating inputs requiring grad.

What no CPU run sees: a program the torch executor alone takes on CUDA tensors must also be taken
with nvFuser among the executors (its claims read the decompositions, which a kernel without one
must not refuse: grid_sampler's 3-D and bicubic sampling were refused there), with eager's output
dtypes, shapes, devices and requires_grad; and the compiled backward, called directly (the autograd
engine wants a GPU), gives every input that requires grad a gradient of its dtype.

Fake tensors carry no values, and some CUDA kernels have no fake implementation (a backward kernel
without a meta registration; an eager fallback's backward, which runs torch's autograd engine):
those cases are skipped naming why. A representative subset runs by default, the whole table
(about 4 minutes on one core) under ``--run-slow``.
"""

import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import thunder_rs
import test_ops
from opinfos import OPINFOS

pytestmark = [*test_ops.WARNING_FILTERS, pytest.mark.filterwarnings("ignore")]

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: The ops the default run takes in bfloat16: sampling and resizing kernels, normalisations, losses,
#: attention, indexing and pooling, whose CUDA paths differ from the CPU's.
SUBSET = {
    "grid_sampler_3d",
    "interpolate_bicubic_align0",
    "layer_norm",
    "cross_entropy",
    "scaled_dot_product_attention",
    "index_put",
    # bf16 gradients the H100 failed whose CPU runs skip (eager has no bf16 avg_pool3d on the CPU)
    # or share their cause (a pad fill of another kind than the tensor): h100_failures_audit.md row 5
    "lp_pool3d",
    "local_response_norm",
}
#: What a fake tensor cannot run without a GPU (torch's messages).
NEEDS_A_GPU = ("Found no NVIDIA driver", "hasPrimaryContext", "Torch not compiled with CUDA")


def _marks(op, dtype):
    return () if op.id in SUBSET and dtype == torch.bfloat16 else pytest.mark.slow


def _params():
    ids = {op.id for op in OPINFOS}
    assert SUBSET <= ids, f"not OpInfo ids: {sorted(SUBSET - ids)}"
    return [
        pytest.param(op, dtype, id=f"{op.id}-{test_ops.dtype_name(dtype)}", marks=_marks(op, dtype))
        for op in OPINFOS
        if op.supports_grad and torch.float32 in op.dtypes
        for dtype in DTYPES
    ]


@pytest.fixture
def cuda_ex(fake_ex):
    from thunder_rs.executors.nvfuser_ex import NvFuserExecutor  # noqa: PLC0415

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return NvFuserExecutor("nvfuser_fake_cuda", module=fake_ex.module)


def _metadata(outputs) -> list:
    return [(t.dtype, tuple(t.shape), t.device, t.requires_grad) for t in outputs]


def _compiled_node(outputs: list):
    """The compiled call's backward node the outputs reach (through eager's views of them)."""
    nodes = [t.grad_fn for t in outputs if t.grad_fn is not None]
    while nodes:
        node = nodes.pop(0)
        if hasattr(node, "apply"):
            return node
        nodes.extend(n for n, _ in node.next_functions if n is not None)
    return None


def _or_skip_where_a_gpu_is_needed(run):
    try:
        return run()
    except RuntimeError as e:
        if any(m in str(e) for m in NEEDS_A_GPU):
            pytest.skip(f"a fake CUDA tensor cannot run this kernel: {e}")
        raise


@pytest.mark.parametrize(("op", "dtype"), _params())
def test_the_cuda_default_executors_take_what_the_torch_executor_takes(op, dtype, cuda_ex):
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        try:
            torch.manual_seed(0)
            sample = next(iter(op.sample_inputs(dtype, "cuda")))
            expected = test_ops.differentiable_call(op, sample, op.op)[1]
        except Exception as e:  # noqa: BLE001 (no sample, or no eager result, on fake CUDA tensors)
            pytest.skip(f"eager on fake CUDA tensors: {type(e).__name__}: {e}")
        try:
            test_ops.differentiable_call(op, sample, thunder_rs.jit(op.op, executors=["torch"]))
        except Exception as e:  # noqa: BLE001
            pytest.skip(f"refused by the torch executor alone too: {type(e).__name__}: {e}")
        leaves, outputs = _or_skip_where_a_gpu_is_needed(
            lambda: test_ops.differentiable_call(op, sample, thunder_rs.jit(op.op, executors=[cuda_ex, "torch"]))
        )
        assert _metadata(outputs) == _metadata(expected)
        assert cuda_ex.stats["failures"] == 0, cuda_ex.fallbacks  # no region nvFuser refused ran eagerly
        node = _compiled_node([t for t in outputs if t.requires_grad])
        if node is None:
            return
        cotangents = [torch.ones(m.shape, dtype=m.dtype, device=m.device) for m in node._input_metadata]
        with torch.no_grad():
            grads = _or_skip_where_a_gpu_is_needed(lambda: node.apply(*cotangents))
    grads = grads if isinstance(grads, tuple) else (grads,)
    assert {g.dtype for g in grads if isinstance(g, torch.Tensor)} <= {t.dtype for t in leaves}
