"""Int arguments as sizes (issue 26): an int argument a later call passes changed (a length, a
number of tokens, the ``SymInt`` inputs of torch.compile's dynamic graphs) is traced as a symbolic
size in the next compile, as torch.compile treats ints; what the program decides on it is a guard.
Ints 0 and 1, negative ints and bools stay constants. Every call is checked against eager."""

import itertools
import math
import traceback

import pytest
import torch
import torch.nn.functional as F

import thunder_rs

pytestmark = pytest.mark.usefixtures("one_thread")


def stats(jfn):
    return thunder_rs.compile_stats(jfn)


def first_n(x, n):
    return x[:, :n].sum(1) * 2 + torch.arange(n).sum()


def test_an_int_argument_seen_changing_is_a_symbolic_size():
    jf = thunder_rs.jit(first_n)
    x = torch.randn(4, 12)
    for n in [3, 5, 7, 9, 11, 4]:
        torch.testing.assert_close(jf(x, n), first_n(x, n))
    assert stats(jf).cache_misses == 2, stats(jf).miss_reasons
    assert stats(jf).miss_reasons[1] == "n: 3 -> 5; compiled with symbolic sizes n"
    assert jf._dynamic_off is None


def scaled(x, n):
    return x[: max(n, 0) + 1] * n


@pytest.mark.parametrize("n", [1, 0, -3])
def test_ints_below_two_stay_constants(n):
    jf = thunder_rs.jit(scaled)
    x = torch.randn(12)
    for m in [3, 5, 7, n, n]:
        torch.testing.assert_close(jf(x, m), scaled(x, m))
    assert stats(jf).cache_misses == 3
    assert stats(jf).miss_reasons[2].startswith(f"n: 5 -> {n}; the entry with symbolic sizes does not serve it")


def scale_and_branch(x, n):
    y = x * n + x / n  # a size as a scalar operand: true division is a float
    return y.relu() if n > 6 else y.sigmoid()


def test_arithmetic_with_an_int_and_a_branch_on_it_equal_eager():
    jf = thunder_rs.jit(scale_and_branch)
    x = torch.randn(3, 5)
    for n in [2, 3, 4, 7, 9, 5]:
        torch.testing.assert_close(jf(x, n), scale_and_branch(x, n))
    # static at 2, symbolic at 3 (n <= 6), served at 4, again at 7 (n > 6), served at 9 and 5
    assert stats(jf).cache_misses == 3, stats(jf).miss_reasons
    assert "-t0 + 6 >= 0 fails (t0 = n = 7)" in stats(jf).miss_reasons[2]


def test_an_int_equal_to_a_tensor_size_shares_its_symbol_and_must_stay_equal():
    def fn(x, n):
        return x.reshape(n, -1).sum(0)

    jf = thunder_rs.jit(fn)
    for rows, n in [(4, 4), (6, 6), (8, 8), (8, 4), (10, 10)]:
        x = torch.randn(rows, 3)
        torch.testing.assert_close(jf(x, n), fn(x, n))
    assert stats(jf).cache_misses == 3, stats(jf).miss_reasons
    assert "(and 1 sizes equal to them)" in stats(jf).miss_reasons[1]


def test_bools_are_not_sizes_and_dynamic_false_keeps_ints_constant():
    def fn(x, n, flag):
        return x[:n] * 2 if flag else x[:n]

    jf = thunder_rs.jit(fn, dynamic=False)
    x = torch.randn(9)
    for n, flag in [(3, True), (5, True), (7, False), (5, False)]:
        torch.testing.assert_close(jf(x, n, flag), fn(x, n, flag))
    assert stats(jf).cache_misses == 4
    jd = thunder_rs.jit(fn, dynamic=True)
    for n, flag in [(3, True), (5, True), (7, False), (5, False)]:
        torch.testing.assert_close(jd(x, n, flag), fn(x, n, flag))
    # x symbolic from the first compile, n from the second (ints only once seen changing): one
    # compile per flag after that
    assert stats(jd).cache_misses == 3, stats(jd).miss_reasons
    assert stats(jd).miss_reasons[0] == "first call; compiled with symbolic sizes x.shape[0]"
    assert stats(jd).miss_reasons[1].endswith("holds n constant; compiled with symbolic sizes x.shape[0], n")


def test_an_int_length_trains_like_eager():
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    w2 = w.detach().clone().requires_grad_()

    def step(x, w, n):
        h = torch.tanh(x[:, :n] @ w[:n])
        return h.softmax(-1).mean()

    jf = thunder_rs.jit(step)
    for n in [3, 5, 8, 6]:
        x = torch.randn(4, 8)
        out, expected = jf(x, w, n), step(x, w2, n)
        torch.testing.assert_close(out, expected)
        out.backward()
        expected.backward()
        torch.testing.assert_close(w.grad, w2.grad)
    assert stats(jf).cache_misses == 2


def broadcast_bias(x, w, b):
    return torch.addmm(b, x.reshape(-1, 32), w)


def test_shapes_of_different_ranks_are_not_compared_size_by_size():
    # (32,) == (2*T, 32) compared 32 with 2*T first: a guard T != 16 that recompiled at T = 16.
    jf = thunder_rs.jit(broadcast_bias)
    w, b = torch.randn(32, 8), torch.randn(8)
    for t in [8, 12, 16, 20]:
        x = torch.randn(2, t, 32)
        torch.testing.assert_close(jf(x, w, b), broadcast_bias(x, w, b))
    assert stats(jf).cache_misses == 2, stats(jf).miss_reasons


@pytest.mark.parametrize("split", [torch.hsplit, torch.tensor_split])
def test_a_changing_number_of_sections_is_specialised_not_read_as_indices(split):
    # tensor_split(x, n): n sections. A symbolic n went the indices branch (one split point at n),
    # two outputs where eager has n.
    def fn(x, n):
        return [t * 2 for t in split(x, n)]

    jf = thunder_rs.jit(fn)
    x = torch.randn(12)
    for n in [2, 3, 4, 6, 3]:
        out, expected = jf(x, n), fn(x, n)
        assert len(out) == len(expected) == n
        for a, b in zip(out, expected):
            torch.testing.assert_close(a, b)
    assert stats(jf).cache_misses == 4


def halves(x):
    return [t * 2 for t in torch.hsplit(x, 2)]


def test_sections_of_a_symbolic_length_stay_symbolic():
    # divmod of a symbolic size (was a TypeError that turned symbolic compiles off), and the
    # sections' bounds used as they are (slice.indices specialised them).
    jf = thunder_rs.jit(halves, dynamic=True)
    for n in [4, 6, 8, 10]:
        x = torch.randn(n)
        for a, b in zip(jf(x), halves(x), strict=True):
            torch.testing.assert_close(a, b)
    assert stats(jf).cache_misses == 1 and jf._dynamic_off is None
    with pytest.raises(RuntimeError, match="not divisible by the split_size 2"):
        jf(torch.randn(7))


def solved(a, b):
    return torch.linalg.solve(a, b).sum(-1) + b.mean(-1)


def test_a_factorisation_over_changing_sizes_keeps_them_symbolic():
    # linalg's sizes follow torch's own size rules on symbolic sizes (was: a compile per size)
    jf = thunder_rs.jit(solved)
    for n in [3, 4, 5, 6]:
        a, b = torch.randn(2, n, n) + n * torch.eye(n), torch.randn(2, n, 7)
        torch.testing.assert_close(jf(a, b), solved(a, b))
    assert stats(jf).cache_misses == 2 and jf._dynamic_off is None


def top(x, k):
    return x.topk(k).values.sum(-1) + x.roll(k, 1)[:, 0]


def top_and_bytes(x, k):
    return top(x, k) + k.to_bytes(2, "little")[0]  # (an int's method that no symbolic int has)


def test_an_int_a_symbolic_compile_fails_on_stays_constant_and_the_dims_stay_symbolic():
    # The program fails with k symbolic: the int stays a constant (a compile per value of k), the
    # length of x stays symbolic (was: symbolic compiles turned off, a compile per length too).
    jf = thunder_rs.jit(top_and_bytes)
    calls = [(8, 2), (10, 3), (12, 4), (14, 2), (16, 4), (9, 3)]
    for t, k in calls:
        x = torch.randn(4, t)
        torch.testing.assert_close(jf(x, k), top_and_bytes(x, k))
    assert jf._dynamic_off is None
    # static (8, 2); then one symbolic entry per k, each serving every length
    assert stats(jf).cache_misses == 4, stats(jf).miss_reasons
    assert "holds k constant" in stats(jf).miss_reasons[2]


def test_topk_and_roll_take_a_symbolic_k():
    jf = thunder_rs.jit(top)
    for t, k in [(8, 2), (10, 3), (12, 4), (14, 2), (16, 4), (9, 3)]:
        x = torch.randn(4, t)
        torch.testing.assert_close(jf(x, k), top(x, k))
    assert stats(jf).cache_misses == 2, stats(jf).miss_reasons


# -- ints derived from symbolic sizes, passed to torch ops ------------------------------------------


def like_eager_over_sizes(fn, sizes, make=lambda n: torch.randn(3, n), grad=True, **jit_options):
    """``fn`` jitted and eager, called on ``make(n)`` for each size: outputs, dtypes, strides and
    the input's gradient equal; returns the jitted function."""
    jf = thunder_rs.jit(fn, **jit_options)
    for n in sizes:
        x = make(n)
        x.requires_grad_(grad and x.is_floating_point())
        x2 = x.detach().clone().requires_grad_(x.requires_grad)
        out, expected = jf(x), fn(x2)
        out, expected = (out, expected) if isinstance(out, (tuple, list)) else ((out,), (expected,))
        assert len(out) == len(expected)
        for o, e in zip(out, expected):
            torch.testing.assert_close(o, e)
            assert o.stride() == e.stride() or o.numel() <= 1, (n, o.stride(), e.stride())
            assert o.requires_grad == e.requires_grad
        if any(e.requires_grad for e in expected):
            pairs = [(o, e, torch.randn_like(e)) for o, e in zip(out, expected) if e.requires_grad]
            os, es, gs = zip(*pairs)
            torch.testing.assert_close(torch.autograd.grad(os, x, gs)[0], torch.autograd.grad(es, x2, gs)[0])
    return jf


def written_at_sizes(x):
    y = x.clone()
    y[:, x.shape[1] - 2] = 0.0
    y[1, x.shape[1] // 2] = 5.0
    return y * 2


def sampled(x, padding_mode="zeros", align_corners=False):
    """x (3, n) sampled at a fixed grid reaching past its edges: pixel positions from its sizes."""
    ys, xs = torch.meshgrid(torch.linspace(-1.2, 1.2, 4), torch.linspace(-1.1, 1.3, 5), indexing="ij")
    grid = torch.stack([xs, ys], -1)[None]
    return F.grid_sample(x[None, None], grid, padding_mode=padding_mode, align_corners=align_corners)


def unfold_fold(x):
    k = x.shape[1] // 2
    return F.fold(F.unfold(x[None, None], (2, k)), (3, x.shape[1]), (2, k))


def diagonal_written(x):
    y = x * 1
    y.diagonal(1).mul_(3.0)
    y.diagonal(-1).fill_(2.0)
    return y


#: Programs that pass an int computed from a symbolic size to an op: over inputs (3, n) for
#: n = 6, 8, 10, 12 they compile twice (static, then symbolic), not once per size.
SIZED_ARGS = {
    "index_last": lambda x: x[:, x.shape[1] - 1],
    "index_middle": lambda x: x[..., x.shape[-1] // 2] * 2,
    "select": lambda x: x.select(1, x.shape[1] // 2),
    "select_from_end": lambda x: x.select(1, 2 - x.shape[1]),
    "topk": lambda x: x.topk(x.shape[1] // 2, dim=1),
    "topk_smallest_unsorted": lambda x: x.topk(x.shape[1] - 2, largest=False, sorted=False).values.sort().values,
    "kthvalue": lambda x: x.kthvalue(x.shape[1] // 2, dim=1, keepdim=True),
    "roll": lambda x: x.roll(x.shape[1] // 2, 1),
    "roll_both": lambda x: x.roll((1 - x.shape[1], x.shape[1] + 1), (1, 0)),
    "tensor_split_at": lambda x: x.tensor_split([x.shape[1] // 2, x.shape[1] - 1], dim=1),
    "tensor_split_from_end": lambda x: x.tensor_split([2 - x.shape[1]], dim=1),
    "avg_pool_kernel": lambda x: F.avg_pool1d(x[None], x.shape[1] // 2),
    "max_pool_kernel": lambda x: F.max_pool1d(x[None], x.shape[1] // 2),
    "tensor_of_shape": lambda x: x.sum(1) + torch.tensor(x.shape).sum(),
    "one_hot": lambda x: F.one_hot(torch.arange(x.shape[1]) % 3, x.shape[1]).float() @ x.T,
    "unfold_step": lambda x: x.unfold(1, 2, x.shape[1] // 2) * 1,
    "unfold_patches": lambda x: x.unfold(1, x.shape[1] // 2, x.shape[1] // 2),
    "fill_size": lambda x: torch.zeros_like(x).fill_(x.shape[1]),
    "fill_size_of_a_transpose": lambda x: x.t().clone().fill_(x.shape[1] // 2).t() * x,
    "floordiv_by_size": lambda x: x[:, : (x.shape[1] - 1) // (x.shape[1] // 2)] * (x.shape[1] % (x.shape[1] // 2 + 1)),
    # (each of these failed the symbolic compile, which turned symbolic compiles off: a compile per size)
    "diag_embed": lambda x: torch.diag_embed(x),
    "diag_embed_offset": lambda x: torch.diag_embed(x, offset=x.shape[1] // 2, dim1=0, dim2=2),
    "diag_of_a_vector": lambda x: torch.diag(x[0], 1 - x.shape[1] // 2),
    "pad_reflect_by_size": lambda x: F.pad(x[None], (x.shape[1] // 2, 1), mode="reflect"),
    "pad_replicate_by_size": lambda x: F.pad(x[None], (1, x.shape[1] // 2), mode="replicate"),
    "pad_circular_by_size": lambda x: F.pad(x[None], (x.shape[1] // 2, x.shape[1] // 3), mode="circular"),
    "histc_bins": lambda x: torch.histc(x.detach(), bins=x.shape[1] // 2),
    "repeat_interleave": lambda x: x.repeat_interleave(x.shape[1] // 2, dim=1),
    "adaptive_avg_pool": lambda x: F.adaptive_avg_pool1d(x[None], x.shape[1] // 2),
    "adaptive_max_pool": lambda x: F.adaptive_max_pool1d(x[None], x.shape[1] // 2, return_indices=True),
    "max_pool_stride": lambda x: F.max_pool1d(x[None], 2, stride=x.shape[1] // 2),
    "grid_sample": sampled,
    "grid_sample_border_corners": lambda x: sampled(x, "border", True),
    "grid_sample_reflection": lambda x: sampled(x, "reflection"),  # (specialised: the folding's span)
    "grid_sample_reflection_corners": lambda x: sampled(x, "reflection", True),
    "setitem_at_size": written_at_sizes,  # (this one specialised: an index tensor's write on a copy)
    # (these specialised: a diagonal's step, cols + 1, and an arange's step were slice and iota
    # steps, which are numbers; a Vandermonde matrix's column count was a loop's; linspace took
    # an end from a size for no number)
    "diagonal": lambda x: torch.diagonal(x),
    "diagonal_offset_by_size": lambda x: x.diagonal(x.shape[1] // 2 - 3) * 2,
    "diag_below": lambda x: torch.diag(x, -1),
    "trace": lambda x: torch.trace(x) * x,
    "diagonal_written": diagonal_written,
    "diagonal_scatter_batched": lambda x: torch.diagonal_scatter(x[None].expand(2, -1, -1) * 1, x[:, :2] * 3, 1, 0, 2),
    "arange_size_step": lambda x: x + torch.arange(1.0, 3 * x.shape[1], x.shape[1])[:, None],
    "arange_negative_size_step": lambda x: x[0] * torch.arange(2 * x.shape[1], -1, -x.shape[1]).sum(),
    "linspace_to_size": lambda x: x + torch.linspace(0, x.shape[1] - 1, x.shape[1]),
    "logspace_to_size": lambda x: x * torch.logspace(-1, x.shape[1] // 3, x.shape[1], base=2.0),
    "vander_columns": lambda x: torch.vander(x.detach()[0], N=x.shape[1] // 2),
    "linalg_vander_columns": lambda x: torch.linalg.vander(x, N=x.shape[1] // 2),
    "tril_indices": lambda x: x[:, torch.tril_indices(x.shape[1], x.shape[1])[1]],
    "triu_indices_offset": lambda x: torch.triu_indices(x.shape[1], x.shape[1] // 2, 1 - x.shape[1] // 3),
    # (a size on the left of a tensor was specialised: an int's op with a tensor is the tensor's
    # reflected op, which takes the size as it is)
    "size_op_tensor": lambda x: (x.shape[1] - x) * (x.shape[1] + x) / (x.shape[1] * x + 50) + 2**x,
    "size_power_of_tensor": lambda x: (x.shape[1] // 4) ** x.clamp(0, 2) + torch.pow(x.shape[1] - 6, x),
    # (the gradients of a power by a symbolic exponent or base failed the symbolic compile, which
    # turned symbolic compiles off)
    "power_by_size": lambda x: x ** (x.shape[1] // 2) + x.pow(x.shape[1] - 4),
    "size_quotient_by_tensor": lambda x: x.shape[1] // (x.detach().abs() + 1) + x.shape[1] % (x.detach().abs() + 1),
    "size_compared_with_tensor": lambda x: x * (x.shape[1] > x * 10) + x * (x.shape[1] <= x * 10) + (x.shape[1] == x),
    # (a size as alpha or value was specialised: the checks wanted a number, scatter's fill and
    # a pad prim's value one)
    "add_alpha": lambda x: torch.add(x, x.exp(), alpha=x.shape[1]) - torch.sub(x, x * 2, alpha=x.shape[1] // 2),
    "add_alpha_ints": lambda x: torch.add((x.detach() * 9).int(), (x.detach() * 5).int(), alpha=x.shape[1]),
    "addcmul_value": lambda x: (
        torch.addcmul(x, x, x.exp(), value=x.shape[1]) + torch.addcdiv(x, x, x.exp(), value=-x.shape[1])
    ),
    "pad_value": lambda x: F.pad(x, (2, 1, 0, 1), value=x.shape[1] // 2),
    "pad_value_ints": lambda x: torch.constant_pad_nd((x.detach() * 9).int(), (1, -1), x.shape[1]),
    "scatter_value": lambda x: x.scatter(1, torch.tensor([[0], [2], [1]]), x.shape[1] // 2),
    # (of two numbers, aten's add, sub, mul and div wrap the first in a 0-d tensor: Longformer's
    # chunk count, torch.div(seq_len, w, rounding_mode="trunc"); each raised, wanting a tensor)
    "numbers_as_tensors": lambda x: (
        x * torch.div(x.shape[1], 4, rounding_mode="trunc"),
        torch.div(x.shape[1], 4),
        torch.div(-x.shape[1], 4, rounding_mode="floor"),
        torch.add(x.shape[1], 2, alpha=3),
        torch.sub(1.5, x.shape[1]),
        torch.mul(x.shape[0], True),
        torch.true_divide(x.shape[1], 2),
        torch.floor_divide(x.shape[1], -3),
    ),
    # (these stayed symbolic already: kept as cases)
    "combinations": lambda x: torch.combinations(x[0], 3, with_replacement=True),
    "cartesian_prod": lambda x: torch.cartesian_prod(x[0], x[1, : x.shape[1] // 2]),
    "eye": lambda x: x @ torch.eye(x.shape[1], x.shape[1] // 2 + 1, dtype=x.dtype),
    "block_diag": lambda x: torch.block_diag(x, x[:, :2].T),
    "cdist": lambda x: torch.cdist(x.T, x.T[: x.shape[1] // 2]),
    "unfold_fold": unfold_fold,
    "shape_arithmetic": lambda x: x.sum(-1, keepdim=True).expand(x.shape[:-1] + (max(x.shape) // 2,)),
    "numel_divisor": lambda x: x.reshape(math.prod(x.shape)) / x.numel() + x.sum() / x.nelement(),
    "fill_diagonal": lambda x: x.new_zeros(x.shape[1], x.shape[1]).fill_diagonal_(2.0) * x[:, :1].sum(),
    "fill_diagonal_of_a_cube": lambda x: (x[0, :, None, None] * x[1, :, None] * x[2]).fill_diagonal_(-1, wrap=True),
    "fill_diagonal_wide_wrapped": lambda x: (x * 1).fill_diagonal_(0.5, wrap=True),
}


@pytest.mark.parametrize("name", SIZED_ARGS)
def test_an_int_from_a_symbolic_size_stays_symbolic_in_the_op(name):
    jf = like_eager_over_sizes(SIZED_ARGS[name], [6, 8, 10, 12])
    assert stats(jf).cache_misses == 2, stats(jf).miss_reasons
    assert jf._dynamic_off is None


#: Programs that pass an int computed from a symbolic size where an op takes a number (a loop
#: count, a prim's parameter): the int is specialised (a guard on x.shape[1] // 4), x's length
#: stays symbolic. Each failed the symbolic compile, which turned symbolic compiles off.
#: (``bincount``'s ``minlength`` is no longer specialised: ``test_dynamic_round10.py``.)
SPECIALISED_ARGS = {
    "diff_order": lambda x: torch.diff(x, n=x.shape[1] // 4),
    "std_correction": lambda x: x.std(1, correction=x.shape[1] // 4),
    "conv_padding": lambda x: F.conv1d(x[None], torch.ones(2, 3, 3), padding=x.shape[1] // 4),
    "slice_step": lambda x: x[:, :: x.shape[1] // 4] * 2,
    "matrix_power": lambda x: torch.linalg.matrix_power(x @ x.T / x.shape[1], x.shape[1] // 4),
    "polygamma_order": lambda x: torch.polygamma(x.shape[1] // 4, x.abs() + 1),
    # (an aten op taking a plain int: torch's argument parser asks the size's node for it)
    "hann_window_length": lambda x: x * torch.hann_window(x.shape[1] // 4, dtype=x.dtype).sum(),
}


@pytest.mark.parametrize("name", SPECIALISED_ARGS)
def test_an_int_from_a_symbolic_size_an_op_takes_as_a_number_is_specialised(name):
    jf = like_eager_over_sizes(SPECIALISED_ARGS[name], [8, 9, 10, 11, 12, 13])
    # static at 8; symbolic at 9 (x.shape[1] // 4 == 2), serving 10 and 11; again at 12
    assert stats(jf).cache_misses == 3, stats(jf).miss_reasons
    assert "(t0 // 4) - 2 == 0 fails (t0 = x.shape[1] = 12)" in stats(jf).miss_reasons[2]
    assert jf._dynamic_off is None


def last_but(x):
    return x[:, x.shape[1] - 5] + x.select(1, x.shape[1] - 5)


def test_an_index_from_a_size_that_turns_negative_or_out_of_range_is_eagers():
    # The index is used as it is where it is not negative (a guard), not reduced modulo the size
    # (which specialised): a call where it is negative compiles again, one out of range raises.
    jf = thunder_rs.jit(last_but)
    for n in [6, 8, 4, 3, 7]:
        x = torch.randn(3, n)
        torch.testing.assert_close(jf(x), last_but(x))
    assert stats(jf).cache_misses == 3, stats(jf).miss_reasons
    assert "t0 - 5 >= 0 fails (t0 = x.shape[1] = 4)" in stats(jf).miss_reasons[2]
    with pytest.raises(IndexError, match="out of bounds|out of range"):
        last_but(torch.randn(3, 2))
    with pytest.raises(IndexError, match="out of bounds|out of range"):
        jf(torch.randn(3, 2))


def test_a_quotient_by_a_size_is_decided_with_guards_on_its_bounds():
    # (T - 1) // (T // 2) is 1 for every even T, 2 for every odd one: the sizes stay symbolic,
    # the bounds the quotient relies on are the guards; one compile for each quotient.
    fn = SIZED_ARGS["floordiv_by_size"]
    jf = thunder_rs.jit(fn)
    for n in [6, 8, 5, 7, 3, 12]:
        x = torch.randn(3, n)
        torch.testing.assert_close(jf(x), fn(x))
    assert stats(jf).cache_misses == 3, stats(jf).miss_reasons
    assert "-t0 + 2*(t0 // 2) >= 0 fails (t0 = x.shape[1] = 5)" in stats(jf).miss_reasons[2]


#: Quotients and remainders by a size expression that reaches 0 at some sizes, as programs of a
#: (rows, width) tensor, with the shapes they are called at (the zero divisor's last but one).
ZERO_DIVISORS = {
    "exact //": (lambda x: x[:, : (2 * x.shape[1] - 10) // (x.shape[1] - 5)], [(3, 7), (3, 8), (3, 5), (3, 6)]),
    "exact %": (lambda x: x[:, : (2 * x.shape[1] - 10) % (x.shape[1] - 5) + 1], [(3, 7), (3, 8), (3, 5), (3, 9)]),
    "T // (S - 2)": (lambda x: x[:, : x.shape[1] // (x.shape[0] - 2)], [(5, 7), (6, 8), (2, 7), (3, 9)]),
    "7 % (T - 5)": (lambda x: x[:, : 7 % (x.shape[1] - 5) + 1], [(3, 6), (3, 7), (3, 5), (3, 8)]),
}


@pytest.mark.parametrize("name", ZERO_DIVISORS)
def test_a_quotient_by_a_size_that_reaches_zero_raises_eagers_error_from_the_programs_line(name):
    # Each decision on the quotient holds only where the divisor is not 0: a call where it is
    # misses the cache, is traced again and raises Python's ZeroDivisionError from the program.
    fn, shapes = ZERO_DIVISORS[name]
    jf = thunder_rs.jit(fn)
    for shape in shapes:
        x = torch.randn(shape)
        try:
            expected = fn(x)
        except ZeroDivisionError:
            with pytest.raises(ZeroDivisionError) as raised:
                jf(x)
            files = [frame.filename for frame in traceback.extract_tb(raised.tb)]
            assert __file__ in files and not any(f.startswith("<thunder_rs") for f in files), files
            continue
        torch.testing.assert_close(jf(x), expected, rtol=0, atol=0)


def top_half(x):
    return x.exp().topk(x.shape[1] // 2, dim=1).values * 2


def test_a_fusion_executor_leaves_a_symbolic_topk_to_torch(fake_ex):
    # nvFuser has no topk: the region around it is fused, the topk of k = T // 2 runs in torch.
    jf = like_eager_over_sizes(top_half, [6, 8, 10], executors=[fake_ex, "torch"])
    assert stats(jf).cache_misses == 2, stats(jf).miss_reasons
    assert fake_ex.stats["failures"] == 0, fake_ex.fallbacks
    assert fake_ex.stats["definitions"] > 0
    assert "topk" in str(thunder_rs.last_traces(jf)[-1])


def classes(x, labels):
    return F.one_hot(labels, x.shape[1]).float() @ x.T


def test_one_hot_with_a_symbolic_number_of_classes_runs_eagers_kernel():
    jf = thunder_rs.jit(classes)
    for n in [6, 8, 10, 12]:
        x, labels = torch.randn(3, n, requires_grad=True), torch.randint(0, n, (5,))
        out, expected = jf(x, labels), classes(x, labels)
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(torch.autograd.grad(out.sum(), x)[0], torch.autograd.grad(expected.sum(), x)[0])
    assert stats(jf).cache_misses == 2, stats(jf).miss_reasons
    assert "ltorch.one_hot" in str(thunder_rs.last_traces(jf)[0])
    # eager's checks of the values run on each call
    with pytest.raises(RuntimeError, match="Class values must be smaller than num_classes"):
        jf(torch.randn(3, 9), torch.tensor([0, 9]))
    with pytest.raises(RuntimeError, match="Class values must be non-negative"):
        jf(torch.randn(3, 9), torch.tensor([0, -1]))


@pytest.mark.parametrize("op", [torch.diag, torch.trace, lambda m: m.diagonal(1).exp(), lambda m: m.diagonal(-2)])
def test_the_diagonal_of_a_square_matrix_of_a_changing_size_is_symbolic(op):
    jf = like_eager_over_sizes(op, [4, 5, 7, 9], make=lambda n: torch.randn(n, n))
    assert stats(jf).cache_misses == 2, stats(jf).miss_reasons
    assert jf._dynamic_off is None


def triangle(lower: bool, rows: int, cols: int, offset: int):
    """tril/triu_indices of sizes ``T + rows``, ``T + cols`` and an ``offset`` (T times it, for
    the large ones) over a length T."""
    op = torch.tril_indices if lower else torch.triu_indices

    def fn(x):
        t = x.shape[0]
        return op(max(t + rows, 0), max(t + cols, 0), offset * t // 5 if abs(offset) == 5 else offset) * 2

    return fn


TRIANGLES = list(itertools.product([True, False], [0, 1, -2], [0, 2, -3], [0, 2, -2, 5, -5]))


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=[] if c[1:] in ((1, -3, 2), (-2, 2, -5)) else pytest.mark.slow) for c in TRIANGLES]
)
def test_triangle_indices_of_symbolic_sizes_decompose_to_eagers(case):
    # The torch executor runs tril_indices whole; a fusion executor runs its decomposition, which
    # counts each row's columns and finds each index's row by a cumulative count of row starts.
    from thunder_rs.executors.torch_ex import decomposing  # noqa: PLC0415

    fn = triangle(*case)
    jf = thunder_rs.jit(fn)
    for n in [3, 4, 5, 7, 9]:
        x = torch.randn(n)
        with decomposing():
            out = jf(x)
        torch.testing.assert_close(out, fn(x), rtol=0, atol=0)
    assert "prim_cumsum" in str(thunder_rs.last_traces(jf)[-1])
    assert stats(jf).cache_misses <= 4, stats(jf).miss_reasons
