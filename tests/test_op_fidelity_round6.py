"""Op fidelity, round 6: outputs and gradients bit-equal to eager's (``torch.equal``) where
eager's kernels are the ones compiled calls run.

- ``F.affine_grid``'s decomposition (what an Inductor region runs when theta requires grad, and
  the torch executor under ``decomposing``): its base grid is aten's ``linspace(-1, 1, steps)``,
  whose CPU kernel takes each point as one FMA from its nearer end; the decomposition multiplied
  and added in the dtype (an ulp off in most sizes over 6, float32 and float64).
- ``torch.native_group_norm``'s input gradient through its mean and rstd outputs: eager adds
  ``var_mean_backward`` of the variance's cotangent (-rstd^3 / 2 times rstd's) and the mean's to
  the backward kernel's, each op in the input's dtype and the group's mean taken again from a
  contiguous copy of the input; the grad rule wrote the two as one ``a + b * x`` in float32 (an
  ulp off in float32 and float64, more in bfloat16).
- ``F.binary_cross_entropy_with_logits``'s gradients: eager's backward multiplies by the
  cotangent, then the weight, then divides by the count for ``mean``; the rule divided the
  cotangent by the count first (an ulp off).
- ``torch.quantile``/``nanquantile`` of a 0-d tensor along dim 0 with ``keepdim``: eager's result
  is 0-d; the decomposition (what runs when the input requires grad) unsqueezed it to ``[1]``.
- ``Tensor.float``/``double``/``bfloat16`` given a ``memory_format``: eager's result is the tensor
  itself where it has the dtype and the layout, else a copy in that format; the trace dropped
  the format (the tensor itself, its own strides).
- ``F.huber_loss``/``F.smooth_l1_loss`` gradients: eager's backward kernels round the outer
  branch one way in their vector loop (``norm * delta * g``) and another in their scalar tail
  (``norm * g * delta`` in double); the torch executor now runs the kernels themselves
  (``ltorch.huber_loss_backward``, ``smooth_l1_loss_backward``), for the target too (eager's
  kernel of (target, input), not a negation).
- ``torch.remainder``/``fmod``/``__rmod__``: the divisor's gradient is ``-grad * dividend.div(divisor,
  rounding_mode=...)``, eager's rounded division; the prim's VJP rounded ``a / b`` to the dtype
  before the floor (bfloat16's ``764 / 3`` is 255, floor-divided 254: a whole ``grad`` off).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import thunder_rs
from thunder_rs.executors.torch_ex import decomposing

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("align_corners", [False, True])
def test_affine_grid_decomposition_is_eager_s_kernel(dtype, align_corners):
    theta = torch.randn(2, 2, 3, generator=torch.Generator().manual_seed(0)).to(dtype)
    for h, w in [(2, 7), (11, 16), (23, 37), (5, 100)]:

        def program(theta, size=(2, 3, h, w)):
            return F.affine_grid(theta, size, align_corners=align_corners)

        with decomposing():
            actual = thunder_rs.jit(program)(theta)
        assert torch.equal(actual, program(theta)), (h, w)


@pytest.mark.slow
@pytest.mark.inductor
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_affine_grid_in_an_inductor_region_is_eager_s(dtype):
    """With theta requiring grad the grid is computed in the region; eager's values and gradient."""
    gen = torch.Generator().manual_seed(1)
    theta = torch.randn(2, 3, 4, generator=gen).to(dtype)
    cotangent = torch.randn(2, 5, 13, 19, 3, generator=gen).to(dtype)

    def program(theta):
        return F.affine_grid(theta, (2, 1, 5, 13, 19), align_corners=False)

    results = []
    for fn in (thunder_rs.jit(program, executors=["inductor"]), program):
        t = theta.clone().requires_grad_()
        out = fn(t)
        (grad,) = torch.autograd.grad(out, t, cotangent)
        results.append((out.detach(), grad))
    (out, grad), (expected, expected_grad) = results
    assert torch.equal(out, expected) and torch.equal(grad, expected_grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("stats", ["mean", "rstd", "both", "only"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_native_group_norm_gradient_through_its_statistics(dtype, stats, channels_last):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, 6, 5, 4, generator=gen).to(dtype)
    x = x.to(memory_format=torch.channels_last) if channels_last else x
    weight, bias = (torch.randn(6, generator=gen).to(dtype) for _ in range(2))

    def program(x, weight, bias):
        out, mean, rstd = torch.native_group_norm(x, weight, bias, 3, 6, 20, 3, 1e-5)
        through = (mean * mean).sum() * 2 if stats != "rstd" else 0
        through = through + (rstd.sum() * 3 if stats != "mean" else 0)
        return through if stats == "only" else (out * out).sum() * 0.3 + through

    results = []
    for fn in (thunder_rs.jit(program), program):
        args = [t.clone().requires_grad_() for t in (x, weight, bias)]
        fn(*args).backward()
        results.append([a.grad for a in args])
    for actual, expected in zip(*results, strict=True):
        assert torch.equal(actual, expected) and actual.stride() == expected.stride()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", ["none", "weight", "pos_weight", "both"])
def test_binary_cross_entropy_with_logits_gradients(dtype, reduction, weighted):
    """Eager multiplies each gradient by the cotangent, then by the weight, then divides by the
    element count for ``mean``; the rule divided the cotangent first (ulps in 41 of 54 cases)."""
    gen = torch.Generator().manual_seed(3)
    x, target = torch.randn(5, 7, generator=gen).to(dtype), torch.rand(5, 7, generator=gen).to(dtype)
    weight = torch.rand(5, 7, generator=gen).to(dtype) if weighted in ("weight", "both") else None
    pos_weight = torch.rand(7, generator=gen).to(dtype) if weighted in ("pos_weight", "both") else None
    cotangent = torch.randn(() if reduction != "none" else (5, 7), generator=gen).to(dtype)

    def program(x, target):
        return F.binary_cross_entropy_with_logits(x, target, weight, reduction=reduction, pos_weight=pos_weight)

    results = []
    for fn in (thunder_rs.jit(program), program):
        args = [x.clone().requires_grad_(), target.clone().requires_grad_()]
        out = fn(*args)
        results.append([out.detach(), *torch.autograd.grad(out, args, cotangent)])
    for actual, expected in zip(*results, strict=True):
        assert torch.equal(actual, expected)


@pytest.mark.parametrize("quantile", [torch.quantile, torch.nanquantile])
@pytest.mark.parametrize("interpolation", ["linear", "midpoint", "nearest"])
def test_quantile_of_a_0d_tensor_keeping_its_dim_is_0d(quantile, interpolation):
    def program(x):
        return quantile(x, 0.5, dim=0, keepdim=True, interpolation=interpolation)

    results = []
    for fn in (thunder_rs.jit(program), program):
        x = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
        out = fn(x)
        out.backward(torch.ones_like(out))
        results.append((out.detach(), x.grad))
    (out, grad), (expected, expected_grad) = results
    assert out.shape == expected.shape and torch.equal(out, expected) and torch.equal(grad, expected_grad)


@pytest.mark.parametrize("method", ["float", "double", "bfloat16"])
@pytest.mark.parametrize("memory_format", [torch.channels_last, torch.contiguous_format, torch.preserve_format])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_a_conversion_given_a_memory_format_lays_out_and_aliases_as_eager(method, memory_format, layout):
    """``x.float(memory_format=...)`` of a float32 tensor: eager returns the tensor itself where
    it is laid out so, and a copy in that format otherwise (the trace returned the tensor itself)."""
    x = torch.arange(36.0).reshape(2, 3, 2, 3)
    x = x.to(memory_format=torch.channels_last) if layout == "channels_last" else x

    def program(x):
        return getattr(x, method)(memory_format=memory_format)

    results = []
    for fn in (thunder_rs.jit(program), program):
        written = x.clone(memory_format=torch.preserve_format)
        out = fn(written)
        out.add_(1)
        results.append((out, out.stride(), written))
    (out, strides, written), (expected, expected_strides, eager_written) = results
    assert torch.equal(out, expected) and strides == expected_strides and torch.equal(written, eager_written)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("loss", ["huber", "smooth_l1", "huber_weighted"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_loss_gradients_are_eager_s_kernels(dtype, loss, reduction):
    gen = torch.Generator().manual_seed(4)
    x, target, weight = ((torch.rand(3, 37, generator=gen) * 18 - 9).to(dtype) for _ in range(3))
    cotangent = torch.randn(() if reduction != "none" else (3, 37), generator=gen).to(dtype)

    def program(x, target):
        if loss == "smooth_l1":
            return F.smooth_l1_loss(x, target, reduction=reduction, beta=0.5)
        return F.huber_loss(x, target, reduction, 8.7, weight if loss == "huber_weighted" else None)

    results = []
    for fn in (thunder_rs.jit(program), program):
        args = [x.clone().requires_grad_(), target.clone().requires_grad_()]
        out = fn(*args)
        results.append([out.detach(), *torch.autograd.grad(out, args, cotangent)])
    for actual, expected in zip(*results, strict=True):
        assert torch.equal(actual, expected) and actual.stride() == expected.stride()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("op", ["remainder", "fmod", "mod", "rmod"])
@pytest.mark.parametrize("broadcast", [False, True])
def test_the_divisor_s_gradient_of_a_remainder_is_eager_s(dtype, op, broadcast):
    gen = torch.Generator().manual_seed(5)
    dividend = torch.cat([torch.tensor([764.0, -764.0, 13.5]), torch.rand(37, generator=gen) * 200 - 100]).to(dtype)
    divisor = torch.cat([torch.tensor([3.0, 3.0, 0.25]), torch.rand(37, generator=gen) * 4 + 0.5]).to(dtype)
    dividend = dividend.expand(2, 40).contiguous() if not broadcast else dividend

    def program(a, b):
        if op == "rmod":
            return b.__rmod__(a)
        return a % b if op == "mod" else getattr(torch, op)(a, b)

    results = []
    for fn in (thunder_rs.jit(program), program):
        args = [dividend.clone().requires_grad_(), divisor.expand(2, 40).clone().requires_grad_()]
        out = fn(*args)
        results.append([out.detach(), *torch.autograd.grad(out, args, torch.ones_like(out))])
    for actual, expected in zip(*results, strict=True):
        assert torch.equal(actual, expected)
