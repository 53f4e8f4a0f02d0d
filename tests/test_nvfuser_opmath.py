"""Half-precision tensors with Python numbers in nvFuser regions, against torch's CUDA kernels: each
such kernel is one pointwise kernel computing in opmath (float32 for Half and BFloat16) with the
number read as an opmath value, its result rounded once (CUDALoops.cuh ``opmath_type``), so the
region computes the composite's formula in Float and casts once, where its decomposition rounded
each step to the half dtype. The cases, by torch's kernel (pytorch 2.15):

- ``add``/``sub``/``rsub`` with ``alpha`` (ufunc add.h ``self + alpha * other`` on opmath operands,
  ``opmath_symmetric_gpu_kernel_with_scalars``);
- ``lerp`` (Lerp.cu / Lerp.h ``lerp``: ``|w| < 0.5 ? self + w * (end - self) : end - (end - self) *
  (1 - w)``, ``1 - w`` in opmath of the opmath weight; CPU's LerpKernel.cpp computes halves in float
  too, so the decomposition computes so on every device);
- ``addcmul`` and ``addcdiv`` (PointwiseOpsKernel.cu ``pointwise_op_impl``: ``fma(alpha, t1 * t2,
  self)``, ``fma(alpha, t1 / t2, self)``, ``fma(t1, t2, self)`` for alpha 1): the product or quotient
  of the tensors first, then the value, where the CPU's kernel computes ``value * t1 * t2``;
- ``softplus`` divides by ``beta`` (Activation ``softplus_kernel``: ``log1p(exp(x * beta)) / beta``),
  where the region multiplied by its reciprocal as for a tensor divided by a number.

(The numbers ``where``, ``threshold`` and ``masked_fill`` hand on need nothing: torch converts a
double to a half through float32, ``c10::BFloat16(float)``, as the region's Float constant cast does.)

The CPU checks define each region on fake CUDA tensors (the definition a GPU gets), run that
definition on the stand-in with CPU tensors, and compare with the kernel's formula computed op by op
in float32 (``torch.equal``, NaNs where the kernel's are). On a GPU both sides contract ``a + b * c``
into an fma (torch's kernels by nvcc's default ``--fmad=true`` and ``pointwise_op_impl``'s explicit
``fma``; nvFuser's NVRTC options are ``--fmad=true`` unless ``NVFUSER_DISABLE=fma``, Fuser
csrc/runtime/compiled_kernel.cpp), which this op-by-op reference does not: the ``gpu`` twin compares
the region with eager CUDA bit for bit.
"""

import sys
import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

import thunder_rs

import fake_nvfuser_direct as fake

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the named executor warns that the real nvfuser_direct is absent
    from thunder_rs.executors.nvfuser_ex import NvFuserExecutor

HALVES = (torch.bfloat16, torch.float16)
F32 = torch.float32


def f32(x: float) -> float:
    return float(torch.tensor(x, dtype=F32))


# -- the kernels' formulas, op by op in float32 ----------------------------------------------------


def _lerp(a, b, w):
    a, b = a.float(), b.float()
    w = f32(w)
    diff = b - a
    return a + w * diff if abs(w) < 0.5 else b - diff * f32(1.0 - w)


def _lerp_tensor(a, b, w):
    a, b, w = a.float(), b.float(), w.float()
    diff = b - a
    return torch.where(w.abs() < 0.5, a + w * diff, b - diff * (1.0 - w))


def _softplus(x, beta, threshold):
    x = x.float()
    scaled = x * f32(beta)
    return torch.where(scaled > f32(threshold), x, torch.log1p(torch.exp(scaled)) / f32(beta))


#: name -> (program on tensors a, b, c, m, the CUDA kernel's result in float32 before its rounding).
#: Each program negates its op's result (exactly) so that the op is in a region.
CASES = {
    "add alpha": (lambda a, b, c, m: -a.add(b, alpha=0.1), lambda a, b, c, m: a.float() + f32(0.1) * b.float()),
    "sub alpha": (lambda a, b, c, m: -torch.sub(a, b, alpha=0.7), lambda a, b, c, m: a.float() - f32(0.7) * b.float()),
    "rsub alpha": (
        lambda a, b, c, m: -torch.rsub(a, b, alpha=1.3),
        lambda a, b, c, m: b.float() - f32(1.3) * a.float(),
    ),
    "lerp 0.3": (lambda a, b, c, m: -torch.lerp(a, b, 0.3), lambda a, b, c, m: _lerp(a, b, 0.3)),
    "lerp 0.7": (lambda a, b, c, m: -torch.lerp(a, b, 0.7), lambda a, b, c, m: _lerp(a, b, 0.7)),
    "lerp -0.7": (lambda a, b, c, m: -torch.lerp(a, b, -0.7), lambda a, b, c, m: _lerp(a, b, -0.7)),
    "lerp tensor weight": (lambda a, b, c, m: -torch.lerp(a, b, c), lambda a, b, c, m: _lerp_tensor(a, b, c)),
    "addcmul": (
        lambda a, b, c, m: -torch.addcmul(a, b, c, value=0.1),
        lambda a, b, c, m: a.float() + f32(0.1) * (b.float() * c.float()),
    ),
    "addcmul value 1": (
        lambda a, b, c, m: -torch.addcmul(a, b, c),
        lambda a, b, c, m: a.float() + b.float() * c.float(),
    ),
    "addcdiv": (
        lambda a, b, c, m: -torch.addcdiv(a, b, c, value=0.3),
        lambda a, b, c, m: a.float() + f32(0.3) * (b.float() / c.float()),
    ),
    "softplus": (
        lambda a, b, c, m: -torch.nn.functional.softplus(a, beta=3.0, threshold=2.0),
        lambda a, b, c, m: _softplus(a, 3.0, 2.0),
    ),
    # What regions computed as torch's kernels already (kept so): a number in float32 (mul, add,
    # div as a product with the reciprocal, BinaryDivTrueKernel.cu), read in the tensor's dtype
    # (clamp_scalar, threshold, where: ``to<scalar_t>()``), slopes and alpha in opmath.
    "x * 0.1": (lambda a, b, c, m: -(a * 0.1), lambda a, b, c, m: a.float() * f32(0.1)),
    "x + 1e-3": (lambda a, b, c, m: -(a + 1e-3), lambda a, b, c, m: a.float() + f32(1e-3)),
    "x / 3": (lambda a, b, c, m: -(a / 3), lambda a, b, c, m: a.float() * f32(1 / f32(3))),
    "clamp": (lambda a, b, c, m: -a.clamp(0.1, 0.7), lambda a, b, c, m: a.clamp(_in(a, 0.1), _in(a, 0.7)).float()),
    "where": (lambda a, b, c, m: -torch.where(m, a, 0.1), lambda a, b, c, m: torch.where(m, a, _in(a, 0.1)).float()),
    "threshold": (
        lambda a, b, c, m: -torch.nn.functional.threshold(a, 0.1, 0.3),
        lambda a, b, c, m: torch.where(a <= _in(a, 0.1), _in(a, 0.3), a).float(),
    ),
    "hardtanh": (
        lambda a, b, c, m: -torch.nn.functional.hardtanh(a, -0.3, 0.7),
        lambda a, b, c, m: a.clamp(_in(a, -0.3), _in(a, 0.7)).float(),
    ),
    "leaky_relu": (
        lambda a, b, c, m: -torch.nn.functional.leaky_relu(a, 0.1),
        lambda a, b, c, m: torch.where(a.float() > 0, a.float(), a.float() * f32(0.1)),
    ),
    "elu": (
        lambda a, b, c, m: -torch.nn.functional.elu(a, 0.7),
        lambda a, b, c, m: torch.where(a.float() > 0, a.float(), torch.expm1(a.float()) * f32(0.7)),
    ),
}


def _in(a, number: float):
    """``number`` as torch's kernel reads it in ``a``'s dtype (``Scalar::to<scalar_t>()``)."""
    return torch.tensor(number, dtype=a.dtype)


def _inputs(dtype, device="cpu"):
    torch.manual_seed(0)
    a, b = (torch.randn(4096, device=device) * 4).to(dtype), (torch.randn(4096, device=device) * 4).to(dtype)
    c = (torch.rand(4096, device=device) * 3 - 1).to(dtype)  # (lerp weights on both sides of 0.5)
    c = torch.where(c.abs() < 0.05, 0.5, c).to(dtype)  # (no divisors near 0)
    return a, b, c, torch.rand(4096, device=device) < 0.5


def _on_fake_cuda(program, inputs, monkeypatch):
    """The output of the definition a region of ``program`` gets on CUDA tensors like ``inputs``,
    run by the stand-in on ``inputs`` themselves."""
    fake.definitions.clear()
    executor = NvFuserExecutor("nvfuser_fake_cuda", module=fake)
    on_cuda = [torch.empty_like(x, device="cuda") for x in inputs]
    given: list = []
    execute = fake.FusionDefinition.execute
    monkeypatch.setattr(
        fake.FusionDefinition, "execute", lambda fd, args, **kw: given.append(args) or execute(fd, args, **kw)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a region running eagerly warns
        thunder_rs.jit(program, executors=[executor])(*on_cuda)
    assert len(fake.definitions) == 1 and len(given) == 1, "one region"
    real = [inputs[next(i for i, y in enumerate(on_cuda) if y is x)] for x in given[0]]
    with unset_fake_temporarily():
        return execute(fake.definitions[0], real)[0]


def _same(actual, expected) -> bool:
    return bool(((actual == expected) | (actual.isnan() & expected.isnan())).all())


@pytest.mark.parametrize("dtype", HALVES + (F32,))
@pytest.mark.parametrize("case", list(CASES))
def test_on_fake_cuda_a_regions_definition_computes_as_torchs_cuda_kernel(case, dtype, monkeypatch, fake_cuda):
    monkeypatch.setitem(sys.modules, "nvfuser_direct", fake)
    program, kernel = CASES[case]
    with unset_fake_temporarily():
        inputs = _inputs(dtype)
        expected = -kernel(*inputs).to(dtype)
    actual = _on_fake_cuda(program, inputs, monkeypatch)
    with unset_fake_temporarily():
        assert actual.dtype == dtype and _same(actual, expected), (case, dtype, int((actual != expected).sum()))


def _smooth_l1(a, b):
    return -torch.nn.functional.smooth_l1_loss(a, b, reduction="none", beta=0.3)


def test_on_fake_cuda_smooth_l1_divides_by_beta_as_torchs_kernel(monkeypatch, fake_cuda):
    """smooth_l1's kernel divides by beta (BinaryMiscOpsKernels.cu ``0.5 * z * z / beta_val``); the
    region multiplied by its reciprocal as for a tensor divided by a number. (float32: the halves'
    kernel has been written in scalar_t and in opmath across releases; the region is unchanged there.)"""
    monkeypatch.setitem(sys.modules, "nvfuser_direct", fake)
    with unset_fake_temporarily():
        a, b, _, _ = _inputs(F32)
        a = a / 16  # (most differences below beta)
        z, beta = (a - b).abs(), f32(0.3)
        expected = -torch.where(z < beta, 0.5 * z * z / beta, z - 0.5 * beta)
    actual = _on_fake_cuda(_smooth_l1, (a, b), monkeypatch)
    with unset_fake_temporarily():
        assert _same(actual, expected), int((actual != expected).sum())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALVES + (F32,))
def test_on_cuda_opmath_kernels_with_numbers_match_eager_bit_for_bit(dtype, real_nvfuser):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    executor = NvFuserExecutor("nvfuser_real", module=real_nvfuser)
    inputs = _inputs(dtype, "cuda")
    float32_only = {"smooth_l1": (lambda a, b, c, m: _smooth_l1(a, b), None)} if dtype == F32 else {}
    for case, (program, _) in {**CASES, **float32_only}.items():
        actual, expected = thunder_rs.jit(program, executors=[executor])(*inputs), program(*inputs)
        assert actual.dtype == expected.dtype and _same(actual, expected), (case, dtype)
    assert executor.stats["failures"] == 0, executor.fallbacks
