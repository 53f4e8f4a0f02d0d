"""Shapes that change between calls (issue 26), an eleventh sweep: lengths the program takes as
Python ints (``len(x)``), several uses of one input at length 1, and patterns the other sweeps
left out (strided audio convolutions, a classifier head sized by an int, attention with padding
masks at every length, the encoder's fast path, causal attention over queries and keys of other
lengths, interpolation by scale factors, pairwise distances, unique and nonzero counts, masked
selections reshaped, repeat_interleave by tensor repeats, einsum, top-k of a quarter of the
length). Every call's outputs, gradients and returned numbers are checked against eager over at
least five sizes, 0 and 1 among them where eager takes them, and the compiles counted as in
``test_dynamic_round9`` (the first shapes, the symbolic ones, and 0 and 1 each specialised, as
torch.compile's automatic dynamic shapes keep them).

What the sweep found, each fixed and pinned here: ``len(x)`` of a tensor whose first size is
symbolic was a plain int (Python's ``len`` takes the size's ``__index__``), a guard on its value,
so ``torch.arange(len(x))`` or ``x[: len(x) // 2]`` compiled once per length where
``x.shape[0]`` compiles once (torch.compile keeps both symbolic); a flip or a roll that keeps
every element in place (length 1) returned its input, and the copy eager makes there came at the
trace's end, so its gradient was added to the input's others first, not at the op's place as
eager's engine adds it (1 ulp off; ``test_dynamic_round9``'s strict xfail), and its strides were
row-major where eager's keep the input's; ``F.pad`` by amounts all 0 likewise; ``tril`` and
``triu`` of a permuted batch under grad were laid out as their decomposition's ``where``;
``diff``'s two slices were taken in the other order than eager's, so their gradients were added
in another order among the input's other uses (1 ulp off at most lengths), and the
trapezoids' likewise (a cumulative trapezoid by ``dx`` also scaled the sums, not the heights);
``scaled_dot_product_attention(x, x, x)`` of a 3-D ``x`` summed its three gradients query first,
where eager's reach ``x`` through the views it unsqueezed, value first; ``F.bilinear(x, x, w)``
likewise added its first operand's gradient first, where eager adds the second's; circular
padding gave its input one gradient per slice it took, where eager's gives one.

Left as they are, each equal to eager: ``int(x.size(0))`` and ``float(len(x))`` are plain numbers
(Python's ``int`` and ``float`` take exact ints and floats from ``__int__`` and ``__float__``;
torch.compile keeps them symbolic by interpreting the bytecode), one compile per length (since
``test_dynamic_round12``: symbolic in modules that only call them);
``F.interpolate(..., recompute_scale_factor=True)`` by a factor with no short binary fraction
(1.7) sizes its output by a double product's floor, taken at the value; ``pack_padded_sequence``
is refused, naming the line (since ``test_dynamic_round12``: runs as eager); the encoder's fast
path in evaluation matches within rounding (its fused kernels); the gradients of an input that
some outputs are views of (``einsum("bij->bji", a)``) and that the trace uses twice more are
added in another order than eager's (the views are made after the trace's call, so their
gradients come first), likewise an input returned as it is (``F.dropout(x, 0.0)``); circular
padding with a crop keeps the slices' gradients (added one by one); ``masked_select``'s first two
compiles in a process import Dynamo's fake tensors and ``ShapeEnv`` (about 10 s each on a loaded
machine), which ``x[x > 0]`` does not.
"""

import pytest
import torch
import torch.nn.functional as F

import thunder_rs
from test_dynamic_round9 import copied, grads, misses, run_lengths

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore:thunder_rs.*recompiled")]

LENGTHS = (5, 7, 9, 1, 0, 12, 3)


# -- len(x) of a tensor whose length changes ---------------------------------------------------------


def by_len(x, y):
    n = len(x)
    return (
        torch.arange(n)[:, None] * x,
        x[: len(x) // 2] * 2,
        y.reshape(len(y) * 4, -1),
        torch.zeros(len(x), len(y)),
        x.new_full((n, 2), 2.0),
        n,
        [len(y) - n],
    )


def test_len_of_a_tensor_stays_symbolic_where_the_program_passes_it_to_torch():
    """``len(x)`` was Python's ``len``, which takes the size's ``__index__``: a guard on the
    value, a compile per length. It is ``x.shape[0]``, as torch.compile keeps it."""
    jfn = run_lengths(by_len, lambda T: grads((T, 3), (T + 1, 4)))
    assert misses(jfn) <= 4, thunder_rs.compile_stats(jfn).miss_reasons


def test_len_decided_on_guards_as_a_size_does():
    """A branch on ``len(x)`` is a guard on the relation it took, as on ``x.shape[0]``; a loop over
    ``range(len(x))`` takes the value (as torch.compile does)."""

    def fn(x):
        if len(x) > 6:
            return x[:6].sum(0)
        return torch.stack([x[i] * i for i in range(len(x))]).sum(0)

    jfn = run_lengths(fn, lambda T: grads((T, 3)), (5, 9, 7, 12, 3, 4))
    assert misses(jfn) == 4, thunder_rs.compile_stats(jfn).miss_reasons


def test_len_of_what_is_no_symbolic_tensor_is_pythons():
    def fn(x, items):
        return x * len(items) + len(torch.ones(3)) + len(x.shape), len({"a": 1}), len(x[0, 0].shape)

    jfn = thunder_rs.jit(fn)
    for T in (5, 7, 9):
        e, g = fn(torch.ones(T, 2), [1, 2]), jfn(torch.ones(T, 2), [1, 2])
        assert torch.equal(e[0], g[0]) and e[1:] == g[1:] and all(type(v) is int for v in g[1:])
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
        thunder_rs.jit(lambda x: x * len(x))(torch.tensor(1.0))


def test_len_outside_a_traced_program_is_the_builtin():
    import builtins

    builtin = builtins.len
    thunder_rs.jit(lambda x: x * len(x))(torch.ones(4))
    assert builtins.len is builtin


def split_by_lengths(x, lengths):
    parts = x.split(lengths.tolist())
    return [p * 2 for p in parts], [p.shape[0] for p in parts]


@pytest.mark.parametrize("lengths", [(5, 3, 7, 9, 12, 6), (5, 7, 9, 12, 3, 6, 8, 2)])
def test_split_by_lengths_with_an_empty_part_compiles_twice(lengths):
    """Round 10 left ``x.split(lengths.tolist())`` compiling once more where a part is empty (a
    size read of 0 specialised); at HEAD a part of 0, at the symbolic compile or after it, is
    served by the symbolic entry: pinned."""

    def make(T):
        return [
            torch.randn(T, 3, dtype=torch.float64, requires_grad=True),
            torch.tensor([T // 3, T - T // 3 - T // 4, T // 4]),
        ]

    jfn = run_lengths(split_by_lengths, make, lengths)
    assert misses(jfn) == 2, thunder_rs.compile_stats(jfn).miss_reasons


# -- several uses of one input at length 1 -----------------------------------------------------------


def kept_in_place(x):
    return (
        x.cumsum(1),
        x.flip(1),
        torch.logcumsumexp(x, 1),
        x.roll(x.shape[1] // 2, 1),
        x.cummax(1)[0],
        x.flip(1).roll(3, 1) * 2,
    )


@pytest.mark.parametrize("T", [1, 4])
def test_a_flip_or_roll_that_keeps_every_element_adds_its_gradient_at_its_place(T):
    """A flip or roll of length 1 returned its input; the copy the output needs came at the
    trace's end, and its gradient reached the input before the others, where eager's engine adds
    it at the op's place: 1 ulp off for some inputs. The copy is made where the op is called."""
    torch.manual_seed(0)
    jfn = thunder_rs.jit(kept_in_place)
    for _ in range(8):
        x = torch.randn(2, T, 3, requires_grad=True)
        y = copied(x)
        e, g = kept_in_place(x), jfn(y)
        for a, b in zip(e, g):
            assert torch.equal(a, b) and a.stride() == b.stride() and b.data_ptr() != y.data_ptr()
        for out in (e, g):
            torch.stack([t.sin().sum() for t in out]).sum().backward()
        assert torch.equal(x.grad, y.grad)


def test_a_flip_or_roll_of_length_1_is_a_new_tensor_with_eagers_strides():
    def fn(x):
        return x.flip(1), x.roll(0, 1), x.roll((1, 2), (1, 1)), x[0].t().flip(1), x.roll(2)

    for x in (torch.randn(3, 1, 2).permute(2, 1, 0), torch.randn(1, 1, 1), torch.randn(4, 1, 3)[::2]):
        e, g = fn(x), thunder_rs.jit(fn)(x)
        for a, b in zip(e, g):
            assert torch.equal(a, b) and a.stride() == b.stride() and b.data_ptr() != x.data_ptr()


def unpadded(x):
    return x.exp(), F.pad(x, (0, 0)), x.sin() * 2, F.pad(x, [0, 0, 0, 0], value=1.0), x.cos()


def test_a_constant_pad_of_nothing_is_eagers_copy_at_its_place():
    """``F.pad`` by amounts all 0 copies in eager (``empty_like``: the input's layout) at the
    pad's place among the input's uses; the trace's copy was made after the call, row-major, and
    its gradient added to the input's others first (1 ulp off for some inputs)."""
    torch.manual_seed(0)
    jfn = thunder_rs.jit(unpadded)
    for _ in range(6):
        x = torch.randn(3, 1, 2).permute(2, 1, 0).requires_grad_()
        y = copied(x)
        e, g = unpadded(x), jfn(y)
        for a, b in zip(e, g):
            assert torch.equal(a, b) and a.stride() == b.stride() and b.data_ptr() != y.data_ptr()
        for out in (e, g):
            torch.stack([t.sin().sum() for t in out]).sum().backward()
        assert torch.equal(x.grad, y.grad)


def triangles(x):
    T = x.shape[-1]
    return x.triu(1), x.tril(-1) * 2, x.tril(T // 2), torch.triu(x, -T)


def test_triangles_of_a_permuted_batch_under_grad_are_laid_out_as_eagers():
    """``tril``/``triu`` of a permuted batch that requires grad ran as their decomposition, a
    ``where`` over a mask broadcast across the batch, laid out as the ``where`` (strides ``(1, 6,
    2)`` where eager's kernel gives row-major ones). They run as eager's kernel, with its
    gradient (the gradient's own triangle)."""
    jfn = run_lengths(triangles, lambda T: [torch.randn(T + 1, T + 2, 2).permute(2, 1, 0).requires_grad_()])
    assert misses(jfn) <= 4, thunder_rs.compile_stats(jfn).miss_reasons


def differences(x):
    return x.exp(), x.diff(dim=2), x.sin() * 2, x.diff(dim=1), x.cos(), torch.diff(x, n=2, dim=2)


def test_differences_among_other_uses_add_their_gradients_in_eagers_order():
    """``diff`` took ``x[1:]`` before ``x[:-1]``, where eager's takes ``x[:-1]`` first: the two
    slices' gradients reached ``x`` in the other order among its other uses (1 ulp off for most
    inputs, at every length)."""
    jfn = run_lengths(differences, lambda T: grads((2, T + 1, T + 3)))
    assert misses(jfn) <= 4, thunder_rs.compile_stats(jfn).miss_reasons


def trapezoids(y, x):
    return (
        y.exp(),
        torch.cumulative_trapezoid(y, dim=2),
        y.sin() * 2,
        torch.cumulative_trapezoid(y, dx=0.3, dim=2),
        torch.cumulative_trapezoid(y, x, dim=2),
        torch.trapezoid(y, x, dim=2),
        y.cos(),
        x.cos(),
    )


def test_trapezoids_among_other_uses_add_their_gradients_in_eagers_order():
    """The trapezoids' later slice was taken before the earlier one (eager's takes the earlier
    first), so their gradients reached ``y`` and ``x`` in another order among their other uses;
    a cumulative trapezoid by ``dx`` scaled the sums (``cumsum(h) * dx / 2``) where eager sums the
    scaled heights (``cumsum(dx / 2 * h)``), its gradient rounded otherwise."""

    def make(T):
        return [*grads((2, 3, T + 2)), torch.randn(T + 2).cumsum(0).requires_grad_()]

    jfn = run_lengths(trapezoids, make)
    assert misses(jfn) <= 4, thunder_rs.compile_stats(jfn).miss_reasons


def self_attention(x, y):
    return x.exp(), F.scaled_dot_product_attention(x, x, x), y.sin(), F.scaled_dot_product_attention(y, y, y), x.cos()


def test_attention_of_one_tensor_as_query_key_and_value_sums_its_gradients_as_eager():
    """3-D inputs reach eager's kernel unsqueezed, and their gradients through those views, the
    value's first: ``sdpa(x, x, x)``'s three gradients were summed query first (1 ulp off for
    most inputs). 4-D inputs take the kernel's own order."""
    jfn = run_lengths(self_attention, lambda T: grads((2, T + 1, 4), (2, 2, T + 1, 4)))
    assert misses(jfn) <= 3, thunder_rs.compile_stats(jfn).miss_reasons


def quadratic(x, w):
    return x.exp(), F.bilinear(x, x, w), x.sin() * 2, x.cos()


def test_a_bilinear_form_of_one_tensor_sums_its_gradients_as_eager():
    """``F.bilinear(x, x, w)``: eager's gradients reach ``x`` through the views it flattened each
    operand with, the second's first, each added to what ``x``'s later uses gave; the trace added
    the first's first (1 ulp off for most inputs)."""
    jfn = run_lengths(quadratic, lambda T: grads((2, T + 1, 5), (3, 5, 5)))
    assert misses(jfn) <= 3, thunder_rs.compile_stats(jfn).miss_reasons


def wrapped(x, y, z):
    return (
        x.exp(),
        F.pad(x, (2, 1), mode="circular"),
        x.sin() * 2,
        F.pad(y, (1, 2, 2, 0), mode="circular"),
        y.cos(),
        F.pad(z, (0, 1, 1, 1, 2, 1), mode="circular"),
        z.sin(),
    )


def test_circular_padding_among_other_uses_adds_its_gradient_as_eager():
    """Eager's circular padding copies the input into the middle, then the wraps from the
    output: the input gets one gradient (the wraps' moved onto their sources), added among its
    other uses' as one. The trace's slices each gave one, added in another order (1 ulp off)."""

    def make(T):
        return grads((2, 3, T + 3), (1, 2, T + 3, T + 4), (1, 2, 3, T + 3, 4))

    jfn = run_lengths(wrapped, make)
    assert misses(jfn) <= 4, thunder_rs.compile_stats(jfn).miss_reasons


# -- the patterns of the sweep, each over sizes that change ------------------------------------------

torch.manual_seed(0)
AUDIO = torch.nn.Sequential(
    torch.nn.Conv1d(2, 4, 5, stride=2, padding=1), torch.nn.ReLU(), torch.nn.Conv1d(4, 4, 3, stride=3), torch.nn.GELU()
)
MHA = torch.nn.MultiheadAttention(8, 2, batch_first=True)
ENCODER = torch.nn.TransformerEncoder(
    torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), 2, enable_nested_tensor=False
).eval()


def audio(x):
    """Strided convolutions over a signal's length, and the length formula the program computes."""
    L = (x.shape[-1] + 2 - 5) // 2 + 1
    y = AUDIO(x)
    return y, (L - 3) // 3 + 1, y.mean(-1), torch.arange(y.shape[-1]) < L // 3


def head(x, classes):
    """A classifier head sized by an int argument (a vocabulary that grows)."""
    w = torch.linspace(-1, 1, classes * x.shape[-1]).view(classes, -1)
    return F.linear(x, w).log_softmax(-1), classes


def attention(q, k, mask):
    a, w = MHA(q, k, k, key_padding_mask=mask)
    b, _ = MHA(q, k, k, key_padding_mask=mask, need_weights=False)
    c, heads = MHA(q, k, k, key_padding_mask=mask, average_attn_weights=False)
    return a, w, b, c, heads


def padded_keys(T):
    """Keys of length ``T + 2``, the second row's all hidden but its first."""
    mask = torch.arange(T + 2)[None, :] >= torch.tensor([[T + 2], [1]])
    return [*grads((2, T + 1, 8), (2, T + 2, 8)), mask]


def encoded(x, mask):
    return ENCODER(x, src_key_padding_mask=mask)


def padded_tokens(T):
    mask = torch.arange(T + 1)[None, :] >= torch.tensor([[T + 1], [1]])
    return [*grads((2, T + 1, 8)), mask]


def cross_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True), F.scaled_dot_product_attention(q, k, v)


def scaled(x):
    return (
        F.interpolate(x, scale_factor=1.5, mode="bilinear"),
        F.interpolate(x, scale_factor=2, mode="nearest"),
        F.interpolate(x, scale_factor=(0.5, 2.0), mode="nearest-exact"),
        F.interpolate(x[:, :, 0], scale_factor=2.5, mode="linear"),
    )


def distances(a, b):
    return torch.cdist(a, b), torch.cdist(a, b, p=1), torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist")


def counted(x, i):
    u, counts = torch.unique(i, return_counts=True)
    _, inverse = torch.unique(i, sorted=True, return_inverse=True)
    nz = x.nonzero()
    return u * 2, counts.float().cumsum(0), inverse, x[nz[:, 0]].sum(), nz.shape[0], u.shape[0]


def selected(x):
    kept = x.masked_select(x > 0)
    return kept.reshape(-1, 1) * 2, kept.view(1, -1).sum(1), kept.numel(), kept.unflatten(0, (1, -1))


def repeated(x, r):
    return torch.repeat_interleave(x, r, dim=0) * 2, torch.repeat_interleave(r), r.repeat_interleave(r)


def contracted(a, b, c):
    return torch.einsum("bti,btj->bij", a, b), torch.einsum("ti,si->ts", c, c), torch.einsum("bti->b", a)


def quarter(x):
    T = x.shape[-1]
    values, index = x.topk(T // 4, dim=-1)
    return values, index, torch.topk(x, T // 4, dim=-1, largest=False)[0]


#: (name, program, its arguments at size T, whether slow)
PATTERNS = [
    ("audio", audio, lambda T: grads((2, 2, 6 * T + 12)), False),
    ("head", head, lambda T: [*grads((2, 4)), T + 2], False),
    ("key_padding", attention, padded_keys, True),
    ("encoder_train", encoded, padded_tokens, True),
    ("cross_causal", cross_causal, lambda T: grads((2, 2, T + 1, 4), *[(2, 2, 2 * T + 3, 4)] * 2), False),
    ("scale_factor", scaled, lambda T: grads((2, 3, T + 2, T + 3)), False),
    ("cdist", distances, lambda T: grads((2, T, 3), (2, 2 * T + 1, 3)), False),
    ("unique_nonzero", counted, lambda T: [*grads((T, 2)), torch.randint(0, T + 1, (2 * T,))], True),
    ("masked_select", selected, lambda T: grads((T, 3)), True),
    ("repeat_interleave", repeated, lambda T: [*grads((T, 2)), torch.arange(T) % 3], True),
    ("einsum", contracted, lambda T: grads((2, T, 3), (2, T, 4), (T, 5)), False),
    ("topk_quarter", quarter, lambda T: grads((3, T)), False),
]


@pytest.mark.parametrize(
    "program, make",
    [pytest.param(p, m, id=n, marks=[pytest.mark.slow] if slow else []) for n, p, m, slow in PATTERNS],
)
def test_a_pattern_over_sizes_that_change_equals_eager_in_four_compiles(program, make):
    """Outputs, gradients and returned numbers bit-equal to eager's at every size (0 and 1 among
    them where eager takes them), in at most four compiles: the first size, the symbolic one, 0
    and 1."""
    jfn = run_lengths(program, make, LENGTHS)
    assert misses(jfn) <= 4, thunder_rs.compile_stats(jfn).miss_reasons


def test_the_encoders_fast_path_over_padding_masks_of_every_length_compiles_three_times():
    """In evaluation without grad eager's encoder runs fused kernels (equal within rounding:
    ``transformer_fast_paths``); a mask of every length is one symbolic compile."""
    jfn = thunder_rs.jit(encoded)
    for T in LENGTHS:
        args = padded_tokens(T)
        with torch.no_grad():
            torch.testing.assert_close(jfn(*args), encoded(*args))
    assert misses(jfn) <= 3, thunder_rs.compile_stats(jfn).miss_reasons
