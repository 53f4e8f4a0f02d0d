"""The nvFuser translator against torch's CUDA kernels where nvFuser's generated code computes
otherwise (round 2, after test_nvfuser_standin_fidelity.py): each case cites the Fuser source
(NVIDIA/Fuser 81c4b22, nvfuser_direct 0.2.36) and torch's kernel that decide it, runs on the
stand-in here (which computes what Fuser's source says) and on the real bindings on a GPU (``gpu``).

- sums and products over an expanded (stride-0) dim: Fuser's ``reductionOp`` squeezes the dim and
  multiplies the result by its extent (a ``prod``: raises it to that power; csrc/ops/arith.cpp:1389
  "[Trivial reductions]", 1436-1452); torch's reduction kernels (ReduceOps, Reduce.cuh) read the
  stride-0 dim as any other and add the copies, which rounds otherwise (0.1 added 7 times is not
  ``0.1 * 7`` in float32). The translator materializes an operand that may be expanded;
- variance: torch's CUDA kernel divides a Welford reduction's M2 by ``max(N - correction, 0)``
  (ReduceMomentKernel.cu ``std_var_kernel_cuda`` -> SharedReduceOps.h ``WelfordOps::project``:
  ``divisor = acc.nf > correction ? acc.nf - correction : 0; var = acc.m2 / divisor``), nvFuser's
  ``var`` and ``var_mean`` multiply by its reciprocal (csrc/ops/normalization.cpp ``variance``,
  ``variance_mean``: ``mul(var_sum, reciprocal(denom))``) and ``var`` reduces in two passes. The
  region divides the M2 of nvFuser's ``welford`` (python_direct ops.cpp:1857) instead;
- subtraction with a bool (two bool tensors, or one and a Python bool): torch raises
  (BinaryOps.cpp ``sub_check``), nvFuser's ``sub`` of two Bools compiles; thunder_rs raises eager's
  error naming the user's line while tracing, before any executor sees it.
"""

import warnings

import pytest
import torch

import thunder_rs

import fake_nvfuser_direct as fake

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the named executor warns that the real nvfuser_direct is absent
    from thunder_rs.executors.nvfuser_ex import NvFuserExecutor

#: Extents of the expanded dim: 7 and 1000 are not powers of 2 (0.1 * 7 != 0.1 + ... + 0.1 in float32).
EXTENTS = (3, 7, 1000)


# -- reductions over an expanded dim ----------------------------------------------------------------


def _trivial_reductions(module, device):
    """Fuser's own result: the sum over an expanded broadcast is the product with its extent, the
    prod the power (arith.cpp:1436-1452, the factor cast to the result's dtype)."""
    x = torch.tensor([0.1, -1.3, 3.7], device=device)
    for n in EXTENTS:
        with module.FusionDefinition() as fd:
            t = fd.define_tensor([3], [True], module.DataType.Float)
            b = fd.ops.broadcast_in_dim(t, [n, 3], [1])
            fd.add_output(fd.ops.sum(b, [0]))
            fd.add_output(fd.ops.prod(fd.ops.broadcast_in_dim(t, [5, 3], [1]), [0]))
        summed, product = fd.execute([x])
        assert torch.equal(summed, x * n), n
        assert torch.equal(product, torch.pow(x, torch.tensor(5.0, device=device))), n


def test_the_stand_in_reduces_an_expanded_dim_as_fusers_source():
    x = torch.tensor([0.1, -1.3, 3.7])
    assert not torch.equal(x.expand(7, 3).sum(0), x * 7)  # the case is one that can fail
    _trivial_reductions(fake, "cpu")


@pytest.mark.gpu
def test_the_real_bindings_reduce_an_expanded_dim_by_a_product(real_nvfuser):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    _trivial_reductions(real_nvfuser, "cuda")


def _expanded_reductions(a):
    n = a.shape[0]
    return tuple(
        r * 1
        for r in (
            a[:1].expand(n, -1).sum(0),
            a[:1].expand(n, -1).sum(),
            a[:, :1].expand(-1, 6).sum(1, keepdim=True),
            (a[:1].expand(n, -1) * 2).sum(0),  # (computed from an expanded operand: still expanded)
            a[:1, :4].expand(7, -1).prod(0),
        )
    )


def _translated_expanded_reductions(executor, device, exact: bool):
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for n in EXTENTS:
            x = (torch.rand(n, 5, device=device) + 0.5).to(dtype)
            expected = _expanded_reductions(x)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a region running eagerly warns
                actual = thunder_rs.jit(_expanded_reductions, executors=[executor])(x)
            for i, (got, want) in enumerate(zip(actual, expected)):
                assert got.dtype == want.dtype and got.shape == want.shape, (dtype, n, i)
                # (nvFuser's reduction, and torch's CPU one of 1000 copies, add in their own orders; CPU's
                # prod of a half multiplies in it, CUDA's and the region's in float32: ReduceSumProdKernel.cu)
                if exact and n < 16 and (i < 4 or dtype == torch.float32):
                    assert torch.equal(got, want), (dtype, n, i)
                else:
                    tolerance = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {}
                    torch.testing.assert_close(got, want, **tolerance)
    assert executor.stats["failures"] == 0, executor.fallbacks


def test_sums_over_an_expanded_dim_add_the_copies_as_torchs_kernels(fake_ex):
    """A region summing over an expanded dim materializes its operand (a ``where`` with a ``full``):
    the stand-in, computing as Fuser, multiplied by the extent (0.1 * 7 where eager adds 7 copies)."""
    _translated_expanded_reductions(fake_ex, "cpu", exact=True)
    recorded = [op for d in fake.definitions for op in d.recorded]
    assert {"full", "where", "sum", "prod"} <= set(recorded), recorded


@pytest.mark.gpu
def test_on_cuda_sums_over_an_expanded_dim_add_the_copies(real_nvfuser):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    _translated_expanded_reductions(NvFuserExecutor("nvfuser_real", module=real_nvfuser), "cuda", exact=False)


# -- variance: M2 divided by the count, as torch's WelfordOps ----------------------------------------


def _variances(a):
    v, m = torch.var_mean(a, 1)
    std = a.std(1, keepdim=True)
    return v * 1, m * 1, a.var(0, correction=0) * 1, a.var(correction=3) * 1, std * 1, a.var(0, correction=9) * 1


def test_on_fake_cuda_a_variance_divides_welfords_m2_by_the_count(monkeypatch, fake_cuda):
    """The definition divides ``welford``'s M2 by ``max(N - correction, 0)`` (sizes of the reduced
    dims, so for every length too): nvFuser's ``var``/``var_mean`` multiplied by the reciprocal."""
    import sys  # noqa: PLC0415

    monkeypatch.setitem(sys.modules, "nvfuser_direct", fake)
    fake.definitions.clear()
    executor = NvFuserExecutor("nvfuser_fake_cuda", module=fake)
    for dtype in (torch.float32, torch.bfloat16):
        out = thunder_rs.jit(_variances, executors=[executor])(torch.randn(5, 8, device="cuda", dtype=dtype))
        assert {(o.dtype, o.device.type) for o in out} == {(dtype, "cuda")}
    thunder_rs.jit(_variances, executors=[executor], dynamic=True)(torch.randn(6, 8, device="cuda"))
    recorded = [op for d in fake.definitions for op in d.recorded]
    assert {"welford", "div", "size"} <= set(recorded), recorded
    assert not {"var", "var_mean", "reciprocal"} & set(recorded), recorded
    assert executor.stats["failures"] == 0, executor.fallbacks


def _translated_variances(executor, device):
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        for n in (5, 64):
            x = (torch.randn(n, 257, device=device) * 3 + 1).to(dtype)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                expected = _variances(x)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a region running eagerly warns
                warnings.filterwarnings("ignore", message=r"var\(\): degrees of freedom")  # (eager's)
                actual = thunder_rs.jit(_variances, executors=[executor])(x)
            for got, want in zip(actual, expected):
                assert got.dtype == want.dtype and got.shape == want.shape
                torch.testing.assert_close(got, want, equal_nan=True)  # (Welford's order is each's own)
    assert executor.stats["failures"] == 0, executor.fallbacks


def test_variances_through_welford_are_eagers(fake_ex):
    _translated_variances(fake_ex, "cpu")


@pytest.mark.gpu
def test_on_cuda_variances_through_welford_are_eagers(real_nvfuser):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    _translated_variances(NvFuserExecutor("nvfuser_real", module=real_nvfuser), "cuda")


# -- subtraction with a bool ----------------------------------------------------------------------

BOOL_SUBTRACTIONS = {
    "two bool tensors": lambda m, f: (m - ~m) * 1,
    "a bool tensor and True": lambda m, f: (m - True) * 1,
    "torch.sub of bools": lambda m, f: torch.sub(m, m, alpha=1) * 1,
    "rsub of bools": lambda m, f: torch.rsub(m, ~m) * 1,
    "True - a bool tensor": lambda m, f: (True - m) * 1,
    "a float tensor - True": lambda m, f: (f - True) * 1,
    "True - a float tensor": lambda m, f: (True - f) * 1,
    "1 - a bool tensor": lambda m, f: (1 - m) * 1,
    "a bool tensor - 1.5": lambda m, f: (m - 1.5) * 1,
    "a float tensor - a bool tensor": lambda m, f: (f - m) * 1,
}


@pytest.mark.parametrize("what", list(BOOL_SUBTRACTIONS))
def test_a_subtraction_with_a_bool_raises_eagers_error_naming_the_line(what, fake_ex):
    """torch raises (BinaryOps.cpp ``sub_check``); nvFuser's ``sub`` of Bools compiles, so no region
    may claim it: the trace raises eager's message with the user's line (two bool tensors raised
    prims.sub's "not implemented for b8", no line; one bool ran as an eager fallback naming a trace line)."""
    program = BOOL_SUBTRACTIONS[what]
    m, f = torch.tensor([True, False, True]), torch.randn(3)
    with pytest.raises(NotImplementedError) as eager:
        program(m, f)
    with pytest.raises(NotImplementedError) as traced:
        thunder_rs.jit(program, executors=[fake_ex])(m, f)
    message = str(traced.value)
    assert str(eager.value) in message, message
    assert f"{__file__}:" in message, message  # the user's line
    assert not fake.definitions, "a region claimed the subtraction"
