"""matmul's gradients are eager's bit for bit, with eager's strides.

Eager's ``torch.matmul`` is a composite (ATen's ``_matmul_impl``) whose calls autograd
differentiates: ``dot``, ``mv``, ``mm``, a batch folded into one ``mm``/``mv`` (``should_fold``: by
the operands' ranks, which of them requires grad and whether the batch folds without a copy), or
the broadcast batch reshaped (a copy where it does not fold) into ``bmm``. The rule makes the same
calls on the same views, so a product runs with the same operand layouts (GEMM transposition
flags) and in the same order. The sweep walks ranks 1-D to 4-D on both sides with broadcast
batches, operand layouts (contiguous, transposed, heads split from a linear's output and their
transpose, channels-last-like permutations, expanded, sliced, strided vectors), dtypes, which
operand requires grad, cotangent layouts and seeds; the quick table holds a case of each path.
"""

from __future__ import annotations

import itertools
import re

import pytest
import torch

import thunder_rs

pytestmark = pytest.mark.usefixtures("one_thread")

M, K, N = 16, 48, 12


def _leaf(shape, layout: str, dtype, gen) -> torch.Tensor | None:
    """A tensor of ``shape`` laid out as ``layout`` (None where the layout has no such rank)."""
    rank = len(shape)

    def randn(*s):
        return torch.randn(s, generator=gen).to(dtype)

    if layout == "contiguous":
        return randn(*shape)
    if layout == "strided" and rank == 1:
        return randn(2 * shape[0])[::2]
    if layout == "transposed" and rank >= 2:
        return randn(*shape[:-2], shape[-1], shape[-2]).mT
    if layout == "heads" and rank == 4:  # (B, L, H * D).view(B, L, H, D).transpose(1, 2)
        b, h, seq, d = shape
        return randn(b, seq, h * d).view(b, seq, h, d).transpose(1, 2)
    if layout == "heads.mT" and rank == 4:  # the key's heads, transposed: (B, H, D, L)
        b, h, d, seq = shape
        return randn(b, seq, h * d).view(b, seq, h, d).permute(0, 2, 3, 1)
    if layout == "heads" and rank == 3:  # (L, B * H, D).transpose(0, 1), nn.MultiheadAttention's
        bh, seq, d = shape
        return randn(seq, bh, d).transpose(0, 1)
    if layout == "channels_last" and rank == 4:
        b, c, h, w = shape
        return randn(b, h, w, c).permute(0, 3, 1, 2)
    if layout == "expanded" and rank >= 3:
        return randn(1, *shape[1:]).expand(shape)
    if layout == "sliced" and rank >= 3:  # rows sliced: the batch does not fold
        return randn(*shape[:-2], shape[-2] + 3, shape[-1])[..., 1:-2, :]
    return None


LAYOUTS = ("contiguous", "strided", "transposed", "heads", "heads.mT", "channels_last", "expanded", "sliced")


def _shapes(rank_a: int, rank_b: int) -> list[tuple[tuple, tuple]]:
    """Operand shapes of these ranks: equal batches, and a broadcast one (a batch of 1 or fewer dims)."""
    batch_a, batch_b = (2, 3)[4 - max(rank_a, 2) :], (2, 3)[4 - max(rank_b, 2) :]
    a = (K,) if rank_a == 1 else (*batch_a, M, K)
    b = (K,) if rank_b == 1 else (*batch_b, K, N)
    out = [(a, b)]
    if rank_a >= 3 and rank_b >= 3:
        out.append((a, (1, *b[1:])))
        out.append(((1, *a[1:]), b))
    return out


def _check(a, b, requires: str, cotangent: str, seed: int, jfn=None) -> None:
    a.requires_grad_("a" in requires)
    b.requires_grad_("b" in requires)
    expected_out = torch.matmul(a, b)
    gen = torch.Generator().manual_seed(seed + 1000)
    g = torch.randn(expected_out.shape, generator=gen).to(a.dtype)
    if cotangent == "transposed" and g.ndim >= 2:
        g = g.mT.contiguous().mT
    out = (jfn or thunder_rs.jit(lambda x, y: x @ y))(a, b)
    leaves = [x for x in (a, b) if x.requires_grad]
    expected = torch.autograd.grad(expected_out, leaves, g)
    actual = torch.autograd.grad(out, leaves, g)
    what = f"{tuple(a.shape)}:{a.stride()} @ {tuple(b.shape)}:{b.stride()} {a.dtype}, seed {seed}"
    assert torch.equal(out, expected_out), f"output of {what}"
    for name, x, e in zip(requires, actual, expected):
        assert torch.equal(x, e), f"gradient of {name} for {what}: max difference {(x - e).abs().max()}"
        assert x.stride() == e.stride(), f"strides of the gradient of {name} for {what}"


def _operands(shape_a, layout_a, shape_b, layout_b, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return _leaf(shape_a, layout_a, dtype, gen), _leaf(shape_b, layout_b, dtype, gen)


#: One case of each of eager's paths: name -> (shape, layout) of each operand, which require grad.
QUICK = {
    "dot of strided vectors": (((K,), "strided"), ((K,), "contiguous"), "ab"),
    "mv": (((M, K), "transposed"), ((K,), "strided"), "ab"),
    "vector @ matrix": (((K,), "contiguous"), ((K, N), "transposed"), "ab"),
    "mm of a transposed matrix": (((M, K), "contiguous"), ((K, N), "transposed"), "ab"),
    "batch @ vector, folded into mv": (((2, 3, M, K), "contiguous"), ((K,), "contiguous"), "ab"),
    "vector @ batch, other.mT folded (a copy)": (((K,), "contiguous"), ((2, K, N), "contiguous"), "ab"),
    "matrix @ batch, other.mT folded": (((M, K), "contiguous"), ((2, 3, K, N), "heads.mT"), "ab"),
    "sliced batch @ matrix, folded (a copy)": (((2, M, K), "sliced"), ((K, N), "contiguous"), "ab"),
    "sliced batch @ constant matrix: bmm": (((2, M, K), "sliced"), ((K, N), "contiguous"), "a"),
    # (the forward too: eager folds because the matrix requires grad, the torch executor's
    # torch.matmul sees tensors that do not)
    "constant transposed batch @ matrix, folded (a copy)": (((2, M, K), "transposed"), ((K, N), "contiguous"), "b"),
    "batch of 1 squeezed, then folded": (((1, M, K), "contiguous"), ((3, K, N), "transposed"), "ab"),
    "broadcast batches: bmm of expanded copies": (((2, 1, M, K), "contiguous"), ((3, K, N), "transposed"), "ab"),
    "q @ k.mT of heads": (((2, 3, M, K), "heads"), ((2, 3, K, N), "heads.mT"), "ab"),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("name", QUICK)
def test_matmuls_gradients_are_eagers_on_each_of_its_paths(name: str, dtype: torch.dtype):
    (shape_a, layout_a), (shape_b, layout_b), requires = QUICK[name]
    jfn = thunder_rs.jit(lambda x, y: x @ y)
    for seed in range(4):
        _check(*_operands(shape_a, layout_a, shape_b, layout_b, dtype, seed), requires, "contiguous", seed, jfn)


#: The calls of the backward of some paths (eager's: dot's products, mv's of a folded batch, bmm's).
CALLS = {
    "dot of strided vectors": {"ltorch.mul"},
    "batch @ vector, folded into mv": {"ltorch.mv", "ltorch.outer"},
    "vector @ batch, other.mT folded (a copy)": {"ltorch.mv", "ltorch.outer"},
    "broadcast batches: bmm of expanded copies": {"ltorch.bmm", "ltorch.sum"},
}


@pytest.mark.parametrize("name", CALLS)
def test_matmuls_backward_makes_eagers_calls(name: str):
    (shape_a, layout_a), (shape_b, layout_b), requires = QUICK[name]
    jfn = thunder_rs.jit(lambda x, y: x @ y)
    _check(*_operands(shape_a, layout_a, shape_b, layout_b, torch.float32, 0), requires, "contiguous", 0, jfn)
    (before_views,) = [t for t in thunder_rs.last_backward_traces(jfn) if t.label == "cse"]
    calls = set(re.findall(r"^  \S.* = ((?:ltorch|prims)\.\w+)\(", str(before_views), re.MULTILINE))
    assert CALLS[name] <= calls and "ltorch.matmul" not in calls


@pytest.mark.parametrize("grad_mode", [True, False], ids=["grad", "no_grad"])
def test_matmuls_forward_folds_as_eagers_by_which_operand_requires_grad(grad_mode: bool):
    """Eager folds a batch against a matrix, or squeezes a batch of one, where that operand
    requires grad (its flag, in grad mode or not; not an intermediate computed without grad):
    the torch executor's torch.matmul sees an intermediate that does not, and multiplied the
    batch with bmm, which rounds differently (float16, 6 seeds in 20 here)."""
    programs = (lambda x, w: x @ (w * 2), lambda x, w: (w * 2).mT @ x.mT)
    for seed, program, w_shape in itertools.product(range(8), programs, [(64, N), (1, 64, N)]):
        gen = torch.Generator().manual_seed(seed)
        x = _leaf((2, M, 64), "transposed", torch.float16, gen)
        w = torch.randn(w_shape, generator=gen).half().requires_grad_()
        with torch.set_grad_enabled(grad_mode):
            expected, actual = program(x, w), thunder_rs.jit(program)(x, w)
        assert torch.equal(actual, expected), f"seed {seed}, {tuple(w_shape)}"


@pytest.mark.parametrize("shape", [(M, M), (3, M, M), (2, 3, M, M)], ids=["2-D", "3-D", "4-D"])
def test_a_matrix_times_itself_accumulates_both_gradients_in_eagers_order(shape):
    for seed in range(4):
        gen = torch.Generator().manual_seed(seed)
        base, before = torch.randn(shape, generator=gen).half(), torch.randn(shape, generator=gen).half()
        grads = []
        square, batch_square = (lambda a: a @ a), (lambda a: a[0] @ a)
        for fn in (square, thunder_rs.jit(square), batch_square, thunder_rs.jit(batch_square)):
            a = base.clone().requires_grad_()
            a.grad = before.clone()
            out = fn(a)
            out.backward(torch.full_like(out, 0.37))
            grads.append(a.grad)
        assert torch.equal(grads[1], grads[0]) and torch.equal(grads[3], grads[2])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("ranks", list(itertools.product(range(1, 5), repeat=2)), ids=lambda r: f"{r[0]}-D@{r[1]}-D")
def test_matmuls_gradients_are_eagers_over_ranks_layouts_and_seeds(ranks, dtype: torch.dtype):
    for (shape_a, shape_b), layout_a, layout_b in itertools.product(_shapes(*ranks), LAYOUTS, LAYOUTS):
        if _operands(shape_a, layout_a, shape_b, layout_b, dtype, 0).count(None):
            continue
        for requires, cotangent in itertools.product(("ab", "a", "b"), ("contiguous", "transposed")):
            jfn = thunder_rs.jit(lambda x, y: x @ y)
            for seed in range(3):
                a, b = _operands(shape_a, layout_a, shape_b, layout_b, dtype, seed)
                _check(a, b, requires, cotangent, seed, jfn)
