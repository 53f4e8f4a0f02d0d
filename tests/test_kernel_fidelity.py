"""Ops whose compiled results are bit-equal to eager's because the trace runs eager's own kernels,
forward and backward: values, gradients and their strides, in float32 and float64, on
contiguous, channels_last and otherwise non-contiguous inputs. A decomposition (or the VJP of
one) rounds otherwise than those kernels by a few ulps, which these tests would see. Each sweep
takes every value of each axis by default and the whole product with ``--run-slow``.

- ``torch.native_group_norm`` called directly: its kernel and ``native_group_norm_backward``, as
  ``F.group_norm`` (a mean or rstd output the program differentiates adds its terms).
- ``torch.cdist`` off the matmul path (p != 2, few rows, ``donot_use_mm_for_euclid_dist``):
  ``_cdist_forward`` and ``_cdist_backward``, x2's from the transposed cotangent and distances.
- ``F.pdist``: ``_pdist_forward`` and ``_pdist_backward``; ``F.pairwise_distance``: its ``norm`` of
  ``x1 - x2 + eps`` and eager's ``norm_backward`` of that difference (no gradient for p = 0).
- ``F.grid_sample`` (every mode and padding mode, 2-D and 3-D): aten's ``grid_sampler`` and the
  backward kernel eager's autograd runs for it (cuDNN's where aten's forward took cuDNN's, which
  only fake CUDA tensors show here).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import thunder_rs
from thunder_rs.torch.sampling import _aten_grid_sampler_backward

DTYPES = [torch.float32, torch.float64]


def _like(t: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    """A copy of ``t`` with its strides, a leaf that requires grad when asked and floating."""
    copy = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).copy_(t)
    return copy.requires_grad_(requires_grad and t.is_floating_point())


def _run(program: Callable, inputs: list[torch.Tensor], differentiated):
    """The outputs of ``program`` and the gradients of its inputs that require grad (those
    ``differentiated`` says, all when None), from a cotangent drawn contiguous (the same values
    whatever the output's layout)."""
    wanted = differentiated or [True] * len(inputs)
    args = [_like(t, w) for t, w in zip(inputs, wanted, strict=True)]
    out = program(*args)
    outs = out if isinstance(out, tuple) else (out,)
    gen = torch.Generator().manual_seed(7)
    cotangents = [torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in outs]
    grads = torch.autograd.grad(outs, [a for a in args if a.requires_grad], cotangents)
    return (*outs, *grads)


def assert_bit_equal_to_eager(
    program: Callable, inputs: list[torch.Tensor], differentiated=None, executors=None
) -> None:
    expected = _run(program, inputs, differentiated)
    actual = _run(thunder_rs.jit(program, executors=executors), inputs, differentiated)
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert a.stride() == e.stride(), f"result {i}: strides {a.stride()}, eager {e.stride()}"
        assert torch.equal(a, e), f"result {i}: differs from eager by {(a - e).abs().max().item():.3g}"


def channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last if t.ndim == 4 else torch.channels_last_3d)


def stepped(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values, every other element of a tensor twice as wide in the last dim."""
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., ::2] = t
    return wide[..., ::2]


def contiguous(t: torch.Tensor) -> torch.Tensor:
    return t


LAYOUTS = {"contiguous": contiguous, "channels_last": channels_last, "stepped": stepped}


def sweep(**axes: list):
    """``(argnames, params)`` for ``pytest.mark.parametrize`` over every combination of the axes'
    values. The default run takes those that differ from the first combination in one axis at
    most (each value once, the others at their first); the rest are slow."""
    params = []
    for combination in itertools.product(*axes.values()):
        changed = sum(value != values[0] for value, values in zip(combination, axes.values()))
        ids = "-".join(str(v) for v in combination)
        params.append(pytest.param(*combination, id=ids, marks=() if changed <= 1 else pytest.mark.slow))
    return ",".join(axes), params


def randn(*shape: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).to(dtype)


# -- group norm ------------------------------------------------------------------------------------


@pytest.mark.parametrize(*sweep(shape=[(2, 6, 5, 4), (2, 6, 3, 2, 4)], dtype=DTYPES, layout=list(LAYOUTS)))
def test_native_group_norm_called_directly_is_eagers(shape, dtype, layout):
    x = LAYOUTS[layout](randn(*shape, dtype=dtype))
    w, b = randn(6, dtype=dtype, seed=1), randn(6, dtype=dtype, seed=2)
    hxw = x[0, 0].numel()

    def program(x, w, b):
        return torch.native_group_norm(x, w, b, shape[0], 6, hxw, 3, 1e-5)[0]

    assert_bit_equal_to_eager(program, [x, w, b])


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_group_norm_module_is_eagers(layout):
    x = LAYOUTS[layout](randn(2, 8, 6, 7, dtype=torch.float32))
    w, b = randn(8, dtype=torch.float32, seed=1), randn(8, dtype=torch.float32, seed=2)
    assert_bit_equal_to_eager(lambda x, w, b: F.group_norm(x, 4, w, b), [x, w, b])


def test_native_group_norm_statistics_carry_their_gradients():
    """The mean and rstd outputs differentiated too: eager's formula for them (its
    ``infinitely_differentiable`` backward) rounds otherwise, so the values agree within
    float64's tolerance."""
    x = randn(4, 6, 5, dtype=torch.float64).requires_grad_()

    def program(x):
        out, mean, rstd = torch.native_group_norm(x, None, None, 4, 6, 5, 3, 1e-5)
        return (out * out).sum() + 3 * mean.sum() + (rstd * rstd).sum()

    (expected,) = torch.autograd.grad(program(x), x)
    (actual,) = torch.autograd.grad(thunder_rs.jit(program)(x), x)
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)


# -- cdist -----------------------------------------------------------------------------------------

CDIST_MODES = ["use_mm_for_euclid_dist_if_necessary", "donot_use_mm_for_euclid_dist"]


@pytest.mark.parametrize(
    *sweep(
        mode=CDIST_MODES,
        p=[2.0, 0.0, 0.5, 1.0, 1.5, 3.0, math.inf],
        dtype=DTYPES,
        layout=["contiguous", "stepped", "transposed"],
    )
)
def test_cdist_off_the_matmul_path_is_eagers(mode, p, dtype, layout):
    """Few rows (eager's ``_cdist_forward`` kernel even for p = 2 unless told to use matmul), the
    batch dims broadcast, a row of x2 equal to one of x1 (a zero distance)."""
    x1, x2 = randn(2, 5, 3, dtype=dtype), randn(1, 4, 3, dtype=dtype, seed=1)
    x2[0, 1] = x1[1, 2]
    if layout == "transposed":
        x1, x2 = (t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in (x1, x2))
    else:
        x1, x2 = LAYOUTS[layout](x1), LAYOUTS[layout](x2)
    assert_bit_equal_to_eager(lambda a, b: torch.cdist(a, b, p, compute_mode=mode), [x1, x2])


# -- pdist and pairwise_distance ------------------------------------------------------------------

DISTANCE_PS = [2.0, 0.0, 0.5, 1.0, 1.5, 3.0, math.inf]


@pytest.mark.parametrize(*sweep(p=DISTANCE_PS, dtype=DTYPES, layout=["contiguous", "stepped", "transposed"]))
def test_pdist_is_eagers(p, dtype, layout):
    """Five rows, two of them equal (a zero distance)."""
    x = randn(5, 4, dtype=dtype)
    x[3] = x[1]
    x = x.T.contiguous().T if layout == "transposed" else LAYOUTS[layout](x)
    assert_bit_equal_to_eager(lambda x: F.pdist(x, p), [x])


def test_pdist_of_one_row_is_eagers():
    assert_bit_equal_to_eager(lambda x: F.pdist(x, 1.5), [randn(1, 4, dtype=torch.float32)])


def test_pdist_of_no_rows_has_a_zero_gradient():
    """Eager's ``_pdist_backward`` of a (0, 4) tensor ends the process (torch 2.15); the compiled
    backward gives the zeros it gives for one row."""
    x = torch.randn(0, 4, requires_grad=True)
    out = thunder_rs.jit(lambda x: F.pdist(x, 1.5))(x)
    (grad,) = torch.autograd.grad(out, [x], torch.randn(0))
    assert out.shape == (0,) and torch.equal(grad, torch.zeros(0, 4))


PAIRWISE_SHAPES = {
    "same": ((4, 5), (4, 5)),
    "broadcast": ((2, 4, 5), (5,)),
    "kept": ((4, 5), (1, 5)),
    "0-dim": ((), ()),
}


@pytest.mark.parametrize(
    *sweep(p=[p for p in DISTANCE_PS if p != 0], dtype=DTYPES, shapes=list(PAIRWISE_SHAPES), keepdim=[False, True])
)
def test_pairwise_distance_is_eagers(p, dtype, shapes, keepdim):
    first, second = PAIRWISE_SHAPES[shapes]
    x1, x2 = randn(*first, dtype=dtype), randn(*second, dtype=dtype, seed=1)
    assert_bit_equal_to_eager(lambda a, b: F.pairwise_distance(a, b, p, keepdim=keepdim), [x1, x2])


def test_pairwise_distance_of_p_0_gives_no_gradient_as_eager():
    """Eager's ``norm_backward`` returns an undefined gradient for p = 0: the operands get none
    (``torch.autograd.grad`` gives None), where zeros would differ from eager."""
    x1, x2 = randn(4, 5, dtype=torch.float32).requires_grad_(), randn(4, 5, dtype=torch.float32, seed=1)
    x2.requires_grad_()

    def program(a, b):
        return F.pairwise_distance(a, b, 0.0)

    for fn in (program, thunder_rs.jit(program)):
        out = fn(x1, x2)
        assert torch.equal(out, program(x1, x2))
        assert torch.autograd.grad(out.sum(), [x1, x2], allow_unused=True) == (None, None)


# -- grid_sample -----------------------------------------------------------------------------------

GRID_CASES = [
    *(
        (2, mode, padding)
        for mode in ("bilinear", "nearest", "bicubic")
        for padding in ("zeros", "border", "reflection")
    ),
    *((3, mode, padding) for mode in ("bilinear", "nearest") for padding in ("zeros", "border", "reflection")),
]


def _grid_inputs(dims: int, dtype: torch.dtype, layout: str):
    """An input and a grid reaching a little past [-1, 1] (padding decides those points); the
    layout applies to the input, "permuted grid" lays the grid out with its points' dims swapped."""
    spatial_in, spatial_out = ((5, 6), (4, 7)) if dims == 2 else ((5, 6, 4), (3, 2, 3))
    x = randn(2, 3, *spatial_in, dtype=dtype)
    grid = (
        torch.rand((2, *spatial_out, dims), dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 2.4 - 1.2
    ).to(dtype)
    if layout == "permuted grid":
        grid = grid.transpose(1, 2).contiguous().transpose(1, 2)
    elif layout != "contiguous":
        x = LAYOUTS[layout](x)
    return x, grid


@pytest.mark.parametrize(
    *sweep(
        case=GRID_CASES,
        align_corners=[False, True],
        dtype=DTYPES,
        layout=["contiguous", "channels_last", "stepped", "permuted grid"],
    )
)
def test_grid_sample_is_eagers(case, align_corners, dtype, layout):
    """eager's ``grid_sampler`` kernel and its backward, also for bicubic and 3-D sampling, which
    have no decomposition."""
    dims, mode, padding = case
    x, grid = _grid_inputs(dims, dtype, layout)
    assert_bit_equal_to_eager(lambda x, g: F.grid_sample(x, g, mode, padding, align_corners), [x, grid])


@pytest.mark.parametrize("differentiated", [(True, False), (False, True)], ids=["input", "grid"])
def test_grid_sample_gradient_of_one_operand_is_eagers(differentiated):
    x, grid = _grid_inputs(2, torch.float32, "contiguous")
    assert_bit_equal_to_eager(lambda x, g: F.grid_sample(x, g, align_corners=False), [x, grid], differentiated)


@pytest.mark.parametrize(
    "dims, mode, by_name",
    [(3, "bilinear", False), (2, "bicubic", False), (3, "nearest", True), (2, "bicubic", True)],
    ids=["3d", "bicubic", "grid_sampler_3d", "grid_sampler_2d_bicubic"],
)
def test_sampling_without_a_decomposition_runs_eagers_kernel_beside_a_fusion_executor(dims, mode, by_name, fake_ex):
    """With nvFuser among the executors (the CUDA default; its stand-in here), which translates
    decompositions, 3-D and bicubic sampling run eager's kernel in the torch executor: the kernel's
    decomposition raised 'has no decomposition for an executor that fuses prims' instead."""
    x, grid = _grid_inputs(dims, torch.float32, "contiguous")
    code = {"bilinear": 0, "nearest": 1, "bicubic": 2}[mode]
    aten = torch.grid_sampler_3d if dims == 3 else torch.grid_sampler_2d

    def program(x, g):
        return (aten(x, g, code, 1, False) if by_name else F.grid_sample(x, g, mode, "border", False)) * 2

    assert_bit_equal_to_eager(program, [x, grid], executors=[fake_ex, "torch"])


class _KernelsCalled(TorchDispatchMode):
    """The aten ops called under it (on fake CUDA tensors); cuDNN's grid sampler kernels, which
    have no fake implementation, return new tensors of their outputs' shapes."""

    def __init__(self):
        super().__init__()
        self.called: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.called.append(func.__name__)
        if func is torch.ops.aten.cudnn_grid_sampler.default:
            x, grid = args
            return x.new_empty((*x.shape[:2], *grid.shape[1:-1]))
        if func is torch.ops.aten.cudnn_grid_sampler_backward.default:
            return args[0].new_empty(args[0].shape), args[1].new_empty(args[1].shape)
        return func(*args, **(kwargs or {}))


#: (input shape, dtype, interpolation, padding, align_corners) on CUDA
CUDNN_CASES = [
    ((2, 3, 5, 6), torch.float32, 0, 0, True),
    ((2, 3, 5, 6), torch.float16, 0, 0, True),
    ((2, 3, 5, 6), torch.float32, 0, 0, False),
    ((2, 3, 5, 6), torch.float32, 1, 0, True),
    ((2, 3, 5, 6), torch.float32, 0, 1, True),
    ((2, 3, 5, 6), torch.bfloat16, 0, 0, True),
    ((2, 1025, 2, 2), torch.float32, 0, 0, True),
    ((0, 3, 5, 6), torch.float32, 0, 0, True),
    ((2, 3, 5, 6, 4), torch.float32, 0, 0, True),
    ((1, 1, 1, 2**31 - 1), torch.float32, 0, 0, True),  # INT32_MAX elements: no 32-bit indexing
]


@pytest.mark.parametrize("cudnn_enabled", [True, False])
@pytest.mark.parametrize("case", CUDNN_CASES, ids=str)
def test_grid_sampler_backward_on_cuda_is_the_one_of_the_forward_aten_chose(case, cudnn_enabled):
    """On CUDA aten's ``grid_sampler`` runs cuDNN's kernel for some calls, whose backward is
    cuDNN's: the torch executor's backward asks as aten does (checked on fake CUDA tensors, the
    forward's choice seen as the kernel it dispatches to)."""
    shape, dtype, interpolation, padding, align_corners = case
    with FakeTensorMode(), torch.backends.cudnn.flags(enabled=cudnn_enabled):
        x = torch.empty(shape, dtype=dtype, device="cuda")
        grid = torch.empty(shape[0], *(3,) * (len(shape) - 2), len(shape) - 2, dtype=dtype, device="cuda")
        with _KernelsCalled() as forward:
            out = torch.grid_sampler(x, grid, interpolation, padding, align_corners)
        with _KernelsCalled() as backward:
            _aten_grid_sampler_backward(out, x, grid, interpolation, padding, align_corners, (True, True))
    by_cudnn = "cudnn_grid_sampler.default" in forward.called
    assert ("cudnn_grid_sampler_backward.default" in backward.called) == by_cudnn
    # (the cases cuDNN takes, where torch was built with it)
    assert by_cudnn == (cudnn_enabled and torch.backends.cudnn.is_available() and case in CUDNN_CASES[:2])


def _sampled(x, grid):
    return F.grid_sample(x, grid, align_corners=True)  # (bilinear, zeros: cuDNN's kernel takes it)


def _backward_kernels(fn, forward_enabled: bool, backward_enabled: bool) -> tuple[list, list]:
    """The aten calls of ``fn``'s forward on fake CUDA tensors under ``torch.backends.cudnn.enabled
    == forward_enabled``, and of its backward node under ``backward_enabled``."""
    with FakeTensorMode():
        x = torch.empty(2, 3, 5, 6, device="cuda", requires_grad=True)
        grid = torch.empty(2, 3, 3, 2, device="cuda", requires_grad=True)
        with torch.backends.cudnn.flags(enabled=forward_enabled), _KernelsCalled() as forward:
            out = fn(x, grid)
        cotangents: list = [None] * len(out.grad_fn._input_metadata)
        cotangents[out.output_nr] = torch.ones_like(out)
        with torch.backends.cudnn.flags(enabled=backward_enabled), _KernelsCalled() as backward, torch.no_grad():
            getattr(out.grad_fn, "apply", out.grad_fn)(*cotangents)
    return forward.called, backward.called


@pytest.mark.skipif(not torch.backends.cudnn.is_available(), reason="torch built without cuDNN")
@pytest.mark.parametrize("forward_enabled", [True, False], ids=["cudnn_forward", "aten_forward"])
def test_grid_sample_backward_on_cuda_follows_the_switch_its_forward_ran_under(forward_enabled):
    """Eager's autograd differentiates the kernel its forward ran (cuDNN's under
    ``torch.backends.cudnn.enabled``), whatever the switch is when the backward runs; the trace
    ran the backward that the switch named then."""
    jitted = thunder_rs.jit(_sampled)
    for fn in (_sampled, jitted):
        forward, backward = _backward_kernels(fn, forward_enabled, not forward_enabled)
        assert ("cudnn_grid_sampler.default" in forward) == forward_enabled
        assert ("cudnn_grid_sampler_backward.default" in backward) == forward_enabled, fn
        assert ("grid_sampler_2d_backward.default" in backward) != forward_enabled, fn
    # A changed switch compiles again, naming it.
    assert _backward_kernels(jitted, not forward_enabled, not forward_enabled)[1] != backward


@pytest.mark.gpu
@pytest.mark.parametrize("forward_enabled", [True, False], ids=["cudnn_forward", "aten_forward"])
def test_on_cuda_grid_sample_gradients_follow_the_forwards_switch_as_eagers(forward_enabled):
    """The twin of the fake-CUDA test above on a GPU: values and gradients bit-equal to eager's
    with the switch flipped between the forward and the backward."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(2, 3, 5, 6, device="cuda", generator=gen)
    grid = torch.rand(2, 3, 3, 2, device="cuda", generator=gen) * 2 - 1

    def run(fn):
        a, g = x.clone().requires_grad_(), grid.clone().requires_grad_()
        with torch.backends.cudnn.flags(enabled=forward_enabled):
            out = fn(a, g)
        with torch.backends.cudnn.flags(enabled=not forward_enabled):
            out.backward(torch.linspace(-1, 1, out.numel(), device="cuda").reshape(out.shape))
        return out, a.grad, g.grad

    for actual, expected in zip(run(thunder_rs.jit(_sampled)), run(_sampled), strict=True):
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)


# -- max pooling's backward kernel called directly -------------------------------------------------


@pytest.mark.parametrize(
    "dims,shape", [(2, (1, 2, 5, 6)), (3, (1, 2, 3, 4, 5)), (2, (0, 2, 5, 6))], ids=["2d", "3d", "empty"]
)
@pytest.mark.parametrize("differentiated", [(False, True), (True, True)], ids=["input", "both"])
@pytest.mark.parametrize("dtype", [*DTYPES, torch.bfloat16], ids=str)
def test_max_pool_backward_kernel_is_differentiated_as_eager(dims, shape, dtype, differentiated):
    """aten's ``max_pool{2,3}d_with_indices_backward``: its result requires grad where the input
    does, which gets zeros (``zeros_like(self)``), and the cotangent gets the gradient gathered
    at the indices (``max_pool_double_backward``)."""
    backward = {
        2: torch.ops.aten.max_pool2d_with_indices_backward.default,
        3: torch.ops.aten.max_pool3d_with_indices_backward.default,
    }[dims]
    pool = {2: F.max_pool2d, 3: F.max_pool3d}[dims]
    x = randn(*shape, dtype=dtype)
    g = randn(*pool(x, 2, 1).shape, dtype=dtype, seed=1)

    def program(g, x):
        _, indices = pool(x.detach(), 2, 1, return_indices=True)
        return backward(g, x, [2] * dims, [1] * dims, [0] * dims, [1] * dims, False, indices)

    assert_bit_equal_to_eager(program, [g, x], differentiated)


# -- reflection and replication padding's backward ---------------------------------------------------

PAD_CASES = {
    "1d": ((2, 3, 7), (3, 2)),
    "1d no batch": ((3, 7), (2, 4)),
    "2d": ((2, 3, 5, 6), (2, 3, 1, 4)),
    "3d": ((1, 2, 4, 5, 6), (1, 2, 3, 1, 2, 3)),
    "cropped": ((2, 3, 5, 6), (-1, 3, 2, -2)),
    "empty batch": ((0, 3, 5, 6), (1, 2, 2, 1)),
}


@pytest.mark.parametrize(
    *sweep(
        case=list(PAD_CASES),
        mode=["reflect", "replicate"],
        dtype=DTYPES,
        layout=["contiguous", "stepped", "channels_last"],
    )
)
def test_index_padding_gradient_is_eagers(case, mode, dtype, layout):
    """Eager's ``reflection_pad*d_backward`` and ``replication_pad*d_backward``: each output
    element's gradient added into its source in the output's row-major order."""
    shape, pad = PAD_CASES[case]
    if mode == "reflect" and min(pad) < 0:
        pytest.skip("reflect padding crops nothing")
    if layout == "channels_last" and len(shape) not in (4, 5):
        pytest.skip("channels_last: 4-d and 5-d inputs")
    x = LAYOUTS[layout](randn(*shape, dtype=dtype))
    assert_bit_equal_to_eager(lambda x: F.pad(x, pad, mode=mode), [x])
