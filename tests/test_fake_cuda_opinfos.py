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
those cases are skipped naming why, as are the linalg kernels eager's CUDA build has no half
dtypes for (``NO_HALVES_ON_CUDA``): eager raises as its kernel runs, which no fake tensor does, and
the compiled program runs that kernel (an opaque symbol), raising eager's error. A representative
subset runs by default, the whole table (about 8 minutes on one core) under ``--run-slow``.
"""

import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import thunder_rs
import test_ops
from opinfos import OPINFOS, linalg_opaque

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
#: The OpInfos whose eager CUDA kernels (cuSOLVER, MAGMA, cuBLAS's batched LU) take no float16 or
#: bfloat16 (torch's OpInfo ``dtypesIfCUDA``; checked by ``test_no_halves_on_cuda_is_torchs_list``):
#: eager raises ``"lu_factor_cusolver" not implemented for 'Half'`` (or its MAGMA kernel's name) as
#: it runs. On fake tensors eager's meta runs them and its backward formulas mix dtypes (``det``'s
#: ``LU + diag_embed(where(..., eps, 0.))`` is float32, ``lu_solve`` then refuses a half ``B``).
NO_HALVES_ON_CUDA = frozenset(op.id for op in linalg_opaque.OPS) - {"linalg_matrix_exp", "matrix_exp"}
#: The torch OpInfo of each of those whose function torch's table lists under another name.
TORCH_NAMES = {
    **{"det": "linalg.det", "slogdet": "linalg.slogdet", "inverse": "linalg.inv"},
    **{"orgqr": "linalg.householder_product", "linalg_matrix_exp": "matrix_exp"},
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
    if op.id in NO_HALVES_ON_CUDA and dtype != torch.float32:
        pytest.skip(f"eager's CUDA kernel of {op.name} takes no {dtype}: it raises as it runs (no fake tensor runs it)")
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


@pytest.mark.slow
def test_no_halves_on_cuda_is_torchs_list():
    """``NO_HALVES_ON_CUDA`` is what torch's OpInfos say of its CUDA kernels (an import of torch's
    table: slow)."""
    from torch.testing._internal.common_methods_invocations import op_db  # noqa: PLC0415

    cuda_dtypes: dict = {}
    for info in op_db:
        cuda_dtypes.setdefault(info.op, set()).update(info.dtypesIfCUDA)
        cuda_dtypes.setdefault(info.name, set()).update(info.dtypesIfCUDA)
    for op in linalg_opaque.OPS:
        dtypes = cuda_dtypes.get(op.op) or cuda_dtypes[TORCH_NAMES.get(op.name, op.name)]
        halves = {torch.float16, torch.bfloat16} & dtypes
        assert (op.id in NO_HALVES_ON_CUDA) == (not halves), (op.id, halves)
