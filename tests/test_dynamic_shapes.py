"""Shapes that change between calls (issue 26): a size seen to change is traced as symbolic in the
next compile, and that entry serves later calls of other sizes where the guards its trace relied
on hold; every call computes what eager computes (outputs, gradients), a decision taken on a size
recompiles when it would go the other way, and sizes 0 and 1 stay constant."""

import copy
import inspect
import math

import pytest
import torch

import thunder_rs


def misses(jfn) -> int:
    return thunder_rs.compile_stats(jfn).cache_misses


def symbolic(jfn) -> list:
    f = jfn._jfn if isinstance(jfn, thunder_rs.ThunderModule) else jfn
    assert f._dynamic_off is None, f._dynamic_off
    return f._symbolic


def softmax_rows(x, w):
    return torch.softmax(x @ w, dim=-1).sum(0)


def test_a_changing_length_compiles_once_more():
    jf = thunder_rs.jit(softmax_rows)
    w = torch.randn(4, 4)
    for n in [3, 5, 7, 9, 5, 30]:
        x = torch.randn(n, 4)
        torch.testing.assert_close(jf(x, w), softmax_rows(x, w))
    assert misses(jf) == 2
    assert thunder_rs.compile_stats(jf).miss_reasons[1] == (
        "x: shape torch.Size([3, 4]) -> torch.Size([5, 4]); compiled with symbolic sizes x.shape[0]"
    )
    (entry,) = symbolic(jf)
    assert entry.dims == {(0, 0)}
    assert '"size 5"' in entry.entry.source, entry.entry.source


def test_a_lower_rank_after_a_changing_dim_of_a_higher_one_runs_as_eager():
    """A dim marked symbolic by calls of rank 3 is past the end of a later rank-2 argument (the
    choice of symbolic sizes indexed its shape there: an IndexError where eager runs)."""
    jf = thunder_rs.jit(lambda a: a * 2)
    for shape in [(2, 3, 4), (2, 3, 5), (3, 4), (1, 1), (2, 3, 6)]:
        x = torch.randn(shape)
        assert torch.equal(jf(x), x * 2)


def test_dynamic_false_compiles_per_size_and_true_from_the_first_call():
    w = torch.randn(4, 4)
    static, eager_dynamic = thunder_rs.jit(softmax_rows, dynamic=False), thunder_rs.jit(softmax_rows, dynamic=True)
    for n in [3, 5, 7]:
        x = torch.randn(n, 4)
        torch.testing.assert_close(static(x, w), softmax_rows(x, w))
        torch.testing.assert_close(eager_dynamic(x, w), softmax_rows(x, w))
    assert (misses(static), misses(eager_dynamic)) == (3, 1)
    with pytest.raises(ValueError, match="dynamic must be None, True or False"):
        thunder_rs.jit(softmax_rows, dynamic="auto")


def test_slices_of_a_fixed_buffer_stay_symbolic():
    # A strided input whose strides do not change with its sizes (``buf[:, :T]``, a preallocated
    # cache read up to its length): its length is symbolic too, with eager's results and gradients.
    def f(x, w):
        return (x.transpose(0, 1) @ w).softmax(-1).sum(0) + x.reshape(-1)[:3].sum()

    buf, w = torch.randn(4, 64, dtype=torch.float64, requires_grad=True), torch.randn(4, 3, dtype=torch.float64)
    jf = thunder_rs.jit(f)
    for n in [5, 7, 9, 64, 13, 30]:
        (actual,) = torch.autograd.grad(jf(buf[:, :n], w).sum(), buf)
        (expected,) = torch.autograd.grad(f(buf[:, :n], w).sum(), buf)
        torch.testing.assert_close(actual, expected)
    assert misses(jf) == 3  # 5, then 7 symbolic (serving 9, 13, 30); 64 is contiguous


def test_a_strided_view_decided_at_one_size_is_not_reused_where_eager_decides_otherwise():
    # Dims 0 and 1 of buf[:, :T, :8] (buf of 4x128x16) merge into a view only at T = 128, where
    # the slice is still not contiguous (the same strides at every T): the entry traced there
    # must not serve other lengths, where eager refuses the view and ``reshape`` copies.
    def viewed(x):
        return x.view(-1, 8)

    def reshaped(x):
        y = x.reshape(-1, 8)
        y.mul_(2)  # writes through to x where reshape viewed
        return x.sum()

    buf = torch.randn(4, 128, 16)
    jv, jr = thunder_rs.jit(viewed, dynamic=True), thunder_rs.jit(reshaped, dynamic=True)
    torch.testing.assert_close(jv(buf[:, :128, :8]), viewed(buf[:, :128, :8]))
    for n in [100, 50]:
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            viewed(buf[:, :n, :8])
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            jv(buf[:, :n, :8])
    for n in [128, 100, 50, 128]:
        eager_buf, jit_buf = buf.clone(), buf.clone()
        # A sum of up to 4096 floats, in another order than eager's: float32 rounding apart.
        torch.testing.assert_close(jr(jit_buf[:, :n, :8]), reshaped(eager_buf[:, :n, :8]), rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(jit_buf, eager_buf)


def test_dims_marked_with_torchs_own_calls():
    # mark_dynamic (and maybe_mark_dynamic): symbolic from the first call; mark_static: constant
    # even where every dim is symbolic (dynamic=True).
    w = torch.randn(4, 4)
    marked, weak, pinned = (
        thunder_rs.jit(softmax_rows),
        thunder_rs.jit(softmax_rows),
        thunder_rs.jit(softmax_rows, dynamic=True),
    )
    for n in [3, 5, 7]:
        x, y, z = torch.randn(n, 4), torch.randn(n, 4), torch.randn(n, 4)
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.maybe_mark_dynamic(y, 0)
        torch._dynamo.mark_static(z, 0)
        torch.testing.assert_close(marked(x, w), softmax_rows(x, w))
        torch.testing.assert_close(weak(y, w), softmax_rows(y, w))
        torch.testing.assert_close(pinned(z, w), softmax_rows(z, w))
    assert (misses(marked), misses(weak), misses(pinned)) == (1, 1, 3)
    assert symbolic(marked)[0].dims == {(0, 0)}


def test_a_symbolic_size_is_an_int_to_the_program():
    # In eager a size is an int: a program asking so takes the same branch when it is symbolic.
    def f(x):
        n = x.shape[0]
        return x * 2 if isinstance(n, int) and not isinstance(n, (bool, float)) else x

    jf = thunder_rs.jit(f, dynamic=True)
    for n in [3, 5]:
        x = torch.randn(n)
        torch.testing.assert_close(jf(x), f(x))


class Window:
    """A cache that counts the tokens it saw in a Python int and keeps the last few, as Gemma-2's
    sliding layers do."""

    def __init__(self, size):
        self.size, self.seen, self.keys = size, 0, torch.zeros(1, 0, 4)

    def twin(self):
        other = Window(self.size)
        other.seen, other.keys = self.seen, self.keys.clone()
        return other


def window_step(x, cache):
    positions = torch.arange(cache.seen, cache.seen + x.shape[1])
    cache.seen += x.shape[1]
    keys = torch.cat([cache.keys, x], 1)
    cache.keys = keys[:, -cache.size :]
    offset = max(cache.seen - cache.size, 0)
    late = 2.0 if cache.seen > 9 else 1.0
    return keys.sum(1) * late + positions.float().sum() + offset, cache.seen


def test_an_int_a_cache_counts_with_is_a_size_once_seen_changing():
    # The count (an int attribute set one higher each step) becomes a size input: the step's
    # positions and offset are computed from it, the count it sets is that call's, a branch on it
    # is guarded (recompiles when it flips).
    jf = thunder_rs.jit(window_step)
    compiled, eager = Window(4), Window(4)
    prompt = torch.randn(1, 5, 4)
    for step in range(10):
        x = prompt if step == 0 else torch.randn(1, 1, 4)
        (actual, seen), (expected, eager_seen) = jf(x, compiled), window_step(x, eager)
        torch.testing.assert_close(actual, expected)
        assert seen == eager_seen == compiled.seen == eager.seen
        torch.testing.assert_close(compiled.keys, eager.keys)
    stats = thunder_rs.compile_stats(jf)
    # the prompt; a step, the count seen changing from 0 to 5 (symbolic at once, as an int
    # argument would be); the branch at 10
    assert stats.cache_misses == 3, stats.miss_reasons
    assert "cache.seen" in stats.miss_reasons[1].split("compiled with symbolic sizes")[1]
    assert "fail a guard of the trace (-t3 + 8 >= 0" in stats.miss_reasons[2]
    where = line_of(window_step, "late =")
    decided = f"-t3 + 8 >= 0 fails (t1 = cache.keys.shape[1] = 4, t3 = cache.seen = 9), decided at {where};"
    assert decided in stats.miss_reasons[2], stats.miss_reasons[2]


def test_sizes_0_and_1_stay_constant():
    jf = thunder_rs.jit(lambda x: (x * 2).sum(0), dynamic=True)
    for n in [4, 1, 0, 6, 1]:
        x = torch.randn(n, 3)
        torch.testing.assert_close(jf(x), (x * 2).sum(0))
    assert misses(jf) == 3  # 4 (symbolic, then serving 6), 1, 0


def branches(x):
    if x.shape[0] > 4:
        return x * 2
    return x - 1


def test_a_branch_on_a_size_is_guarded_and_recompiles_the_other_way():
    jf = thunder_rs.jit(branches)
    for n in [3, 6, 7, 8, 3, 2, 9]:
        x = torch.randn(n)
        torch.testing.assert_close(jf(x), branches(x))
    # 3 (static), 6 (symbolic, n > 4: serves 7, 8, 9), 2 (n > 4 fails: symbolic again, n <= 4)
    assert misses(jf) == 3
    guards = {g for e in symbolic(jf) for g in e.guards}
    assert {"t0 - 5 >= 0", "-t0 + 4 >= 0"} <= guards, guards


def sizes_as_values(x):
    n, rows = x.numel(), x.size(0)
    return x.sum() / n + rows, x.size(0) * 3, x.shape


def uses_len(x):
    return x * len(x)


def uses_int(x):
    return x * int(x.shape[0])


def test_sizes_read_as_values_are_computed_per_call():
    jf = thunder_rs.jit(sizes_as_values, dynamic=True)
    for n in [3, 8, 5]:
        x = torch.randn(n, 2)
        out, expected = jf(x), sizes_as_values(x)
        torch.testing.assert_close(out[0], expected[0])
        assert out[1:] == expected[1:] and type(out[1]) is int and type(out[2]) is torch.Size
    assert misses(jf) == 1
    # ``len()`` is the first size, symbolic (``test_dynamic_round11``); ``int()`` needs a Python
    # int: the size is specialised, each length its own compile.
    jl = thunder_rs.jit(uses_len, dynamic=True)
    for n in [3, 8, 8]:
        x = torch.randn(n, 2)
        torch.testing.assert_close(jl(x), uses_len(x))
    assert misses(jl) == 1
    ji = thunder_rs.jit(uses_int, dynamic=True)
    for n in [3, 8, 8]:
        x = torch.randn(n, 2)
        torch.testing.assert_close(ji(x), uses_int(x))
    assert misses(ji) == 2 and all(f"t0 - {n} == 0" in e.guards for n, e in zip([3, 8], symbolic(ji)))


class Attention(torch.nn.Module):
    """nanoGPT's causal self-attention with learned positions: views over the length, a causal
    mask sliced from a buffer, positions from ``arange``."""

    def __init__(self, width=16, heads=2, max_len=32):
        super().__init__()
        self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.wpe, self.ln, self.heads = torch.nn.Embedding(max_len, width), torch.nn.LayerNorm(width), heads
        self.register_buffer("bias", torch.tril(torch.ones(max_len, max_len)).view(1, 1, max_len, max_len))

    def forward(self, x):
        B, T, C = x.size()
        x = self.ln(x + self.wpe(torch.arange(0, T, dtype=torch.long, device=x.device)))
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = torch.softmax(att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf")), dim=-1)
        return self.proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))


def test_attention_trains_with_every_length():
    torch.manual_seed(0)
    model = Attention()
    jm = thunder_rs.jit(model)
    for n in [5, 7, 9, 12, 31, 7]:
        x = torch.randn(2, n, 16, requires_grad=True)
        out, ref = jm(x), model(x)
        torch.testing.assert_close(out, ref)
        params = [x, *model.parameters()]
        got = torch.autograd.grad(out.square().sum(), params)
        want = torch.autograd.grad(ref.square().sum(), params)
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e)
    assert misses(jm) == 2
    (entry,) = symbolic(jm)
    assert "-t0 + 32 >= 0" in entry.guards  # the mask is sliced from a buffer of 32


def test_attention_beyond_the_buffer_fails_as_eager_does():
    model = Attention()
    jm = thunder_rs.jit(model)
    for n in [5, 7]:
        jm(torch.randn(2, n, 16))
    x = torch.randn(2, 40, 16)  # positions past the embedding's 32: the guard T <= 32 fails
    with pytest.raises(IndexError, match="index out of range"):
        model(x)
    # The trace, recompiled for 40, finds the mask's 32 rows too few before any index is read.
    with pytest.raises((IndexError, RuntimeError), match="out of range|must match the size"):
        jm(x)


def test_an_mlp_trains_with_every_batch_size():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 5))
    jm = thunder_rs.jit(model)
    for batch in [4, 16, 7, 32, 2]:
        x, y = torch.randn(batch, 8), torch.randint(0, 5, (batch,))
        loss = torch.nn.functional.cross_entropy(jm(x), y)
        ref = torch.nn.functional.cross_entropy(model(x), y)
        torch.testing.assert_close(loss, ref)
        got = torch.autograd.grad(loss, list(model.parameters()))
        want = torch.autograd.grad(ref, list(model.parameters()))
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e)
    assert misses(jm) == 2


def test_hf_gpt2_trains_with_padding_lengths_dropout_included():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64, attn_implementation="eager"
    )
    model = transformers.GPT2LMHeadModel(config)  # training mode: dropout draws a mask of the length
    jm = thunder_rs.jit(model)
    for n in [8, 12, 20, 9, 27]:
        ids = torch.randint(0, 100, (2, n))
        mask = (torch.arange(n)[None, :] < torch.tensor([[n], [n - 3]])).long()
        labels = ids.masked_fill(mask == 0, -100)
        torch.manual_seed(n)
        out = jm(input_ids=ids, attention_mask=mask, labels=labels)
        torch.manual_seed(n)
        ref = model(input_ids=ids, attention_mask=mask, labels=labels)
        torch.testing.assert_close(out.logits, ref.logits)
        got = torch.autograd.grad(out.loss, list(model.parameters()))
        want = torch.autograd.grad(ref.loss, list(model.parameters()))
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e)
    assert misses(jm) == 2
    (entry,) = symbolic(jm)
    assert len(entry.dims) == 3  # ids, mask and labels share one length (one size input)
    assert entry.entry.traces[-1].size_inputs() == [entry.entry.traces[-1].size_inputs()[0]]


class Config:
    pass


def writes_sizes(x, cfg):
    cfg.last = tuple(x.shape)
    cfg.text = f"{x.shape[0]} rows"
    print("rows", x.shape[0])
    return x * 2


def test_sizes_written_to_python_state_or_printed_are_this_calls(capsys):
    jf = thunder_rs.jit(writes_sizes, dynamic=True)
    for n in [3, 8]:
        compiled, eager = Config(), Config()
        x = torch.randn(n, 2)
        torch.testing.assert_close(jf(x, compiled), writes_sizes(x, eager))
        assert vars(compiled) == vars(eager) == {"last": (n, 2), "text": f"{n} rows"}
    assert capsys.readouterr().out == "rows 3\nrows 3\nrows 8\nrows 8\n"
    assert misses(jf) == 2  # each specialised: the text holds the size


def compares_with_floats(x):
    n = x.shape[0]
    return x * (1.0 if n == 6.0 else 2.0)


def test_a_size_compared_with_a_float_is_compared_as_eager_compares_it():
    jf = thunder_rs.jit(compares_with_floats, dynamic=True)
    for n in [6, 7, 6]:
        x = torch.randn(n)
        torch.testing.assert_close(jf(x), compares_with_floats(x))
    assert all("==" in g for e in symbolic(jf) for g in e.guards if "t0 - 6" in g)


#: The sizes of the small HF configs below.
SMALL = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    vocab_size=100,
    max_position_embeddings=64,
)


def _llama(transformers):
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=2, **SMALL))


def _bert(transformers):
    config = transformers.BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **SMALL)
    return transformers.BertForMaskedLM(config)


@pytest.mark.parametrize("make", [_llama, _bert], ids=["llama", "bert"])
def test_hf_models_train_with_padding_lengths(make):
    """Llama (rotary positions, grouped keys) and BERT (absolute positions, a padding mask over
    its tokens) trained at several padded lengths: eager's logits and gradients, two compiles.
    BERT indexed a buffer with an int whose bound was a size (``e % size`` specialised the
    length)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = make(transformers)
    jm = thunder_rs.jit(model)
    for n in [8, 12, 20, 9, 27]:
        ids = torch.randint(0, 100, (2, n))
        mask = (torch.arange(n)[None, :] < torch.tensor([[n], [n - 3]])).long()
        labels = ids.masked_fill(mask == 0, -100)
        out = jm(input_ids=ids, attention_mask=mask, labels=labels)
        ref = model(input_ids=ids, attention_mask=mask, labels=labels)
        torch.testing.assert_close(out.logits, ref.logits)
        got = torch.autograd.grad(out.loss, list(model.parameters()))
        want = torch.autograd.grad(ref.loss, list(model.parameters()))
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e)
    assert misses(jm) == 2, thunder_rs.compile_stats(jm).miss_reasons
    (entry,) = symbolic(jm)
    assert len(entry.dims) == 3  # ids, mask and labels share one length


def test_an_int_index_into_a_symbolic_dim_stays_symbolic():
    def last_and_first(x):
        return x[:, -1] * 2 + x[:, 0]

    jf = thunder_rs.jit(last_and_first)
    for n in [4, 6, 9]:
        x = torch.randn(3, n)
        torch.testing.assert_close(jf(x), last_and_first(x))
    assert misses(jf) == 2


def test_a_cnn_trains_with_every_batch_size():
    """Convolutions keep a symbolic batch size (their other sizes specialise): a ResNet-style CNN
    with batch norm trained at five batch sizes has eager's loss, gradients and running
    statistics, in two compiles; the guards ResNet's shapes implied for sizes of at least 2
    (``16*t0 - 1 != 0``) are not recorded."""

    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, stride=2),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
    )
    eager = copy.deepcopy(model)
    jm = thunder_rs.jit(model)
    for batch in [8, 5, 16, 3, 8]:
        x, y = torch.randn(batch, 3, 16, 16), torch.randint(0, 5, (batch,))
        loss = torch.nn.functional.cross_entropy(jm(x), y)
        ref = torch.nn.functional.cross_entropy(eager(x), y)
        torch.testing.assert_close(loss, ref)
        got = torch.autograd.grad(loss, list(model.parameters()))
        want = torch.autograd.grad(ref, list(eager.parameters()))
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e)
        for b, e in zip(model.buffers(), eager.buffers()):
            torch.testing.assert_close(b, e)
    assert misses(jm) == 2
    (entry,) = symbolic(jm)
    assert entry.dims == {(0, 0)} and entry.guards == ()


def _slice_write(x):
    y = x.clone()
    y[:, : x.shape[1] // 2] = 0.0
    return y


LENGTH_PROGRAMS = {
    "chunk": lambda x: torch.cat(x.transpose(0, 1).chunk(2, dim=0)[::-1], 0),
    "split_half": lambda x: x.split(x.shape[1] // 2, dim=1)[-1].sum(1),
    "roll": lambda x: x.roll(3, 1),
    "slice_write": _slice_write,
    "pad_to_64": lambda x: torch.nn.functional.pad(x, (0, 0, 0, 64 - x.shape[1])),
    "index_last": lambda x: x[:, -1] + x[:, 1],
}


@pytest.mark.parametrize("name", list(LENGTH_PROGRAMS))
def test_programs_over_a_length_stay_symbolic(name):
    """Splits, chunks, rolls, slice writes and pads whose amounts come from the length keep it
    symbolic: eager's results at every length, two compiles; what their piece counts and
    remainders relied on is guarded (an odd length makes ``split(T // 2)`` three pieces, and
    compiles for it)."""
    fn = LENGTH_PROGRAMS[name]
    jf = thunder_rs.jit(fn)
    for n in [6, 8, 10, 12]:
        x = torch.randn(2, n, 4)
        torch.testing.assert_close(jf(x), fn(x))
    assert misses(jf) == 2
    x = torch.randn(2, 7, 4)
    torch.testing.assert_close(jf(x), fn(x))
    assert misses(jf) == (3 if name == "split_half" else 2)


TRAINED_OVER_A_LENGTH = {
    "var": lambda x: x.var(1),
    "std": lambda x: x.std(1, unbiased=False),
    "var_mean": lambda x: torch.var_mean(x, 1)[0] * torch.var_mean(x, 1)[1],
    "mean": lambda x: x.mean(1),
    "reflect": lambda x: torch.nn.functional.pad(x.transpose(1, 2), (2, 3), mode="reflect"),
    "replicate": lambda x: torch.nn.functional.pad(x.transpose(1, 2), (0, 2), mode="replicate"),
    "circular": lambda x: torch.nn.functional.pad(x.transpose(1, 2), (3, 1), mode="circular"),
    "unfold": lambda x: x.unfold(1, 3, 2).sum(-1),
    "power": lambda x: x.reshape(-1)[: x.shape[1] ** 2 // 4] * torch.sym_max(x.shape[1] - 6, 1),
}


@pytest.mark.parametrize("name", list(TRAINED_OVER_A_LENGTH))
def test_reductions_pads_and_windows_over_a_length_train_with_two_compiles(name):
    """Variances divide by a symbolic count, pads of a symbolic length are slices of it, windows
    step by symbolic strides, int powers of a size stay sizes: eager's outputs and gradients at
    every length, nothing specialised."""
    fn = TRAINED_OVER_A_LENGTH[name]
    jf = thunder_rs.jit(fn)
    for n in [6, 8, 10, 12, 7]:
        x = torch.randn(3, n, 4, requires_grad=True)
        y = x.detach().clone().requires_grad_()
        out, expected = jf(x), fn(y)
        torch.testing.assert_close(out, expected)
        out.square().sum().backward()
        expected.square().sum().backward()
        torch.testing.assert_close(x.grad, y.grad)
    assert misses(jf) == 2, thunder_rs.compile_stats(jf).miss_reasons


def test_a_size_to_a_float_power_is_a_symbolic_float():
    # Eager computes T ** 0.5 as a float: a symbolic float the program computes on each call as
    # eager does (no RecursionError through torch.SymInt's own power), one compile for the lengths.
    def fn(x):
        return x / x.shape[1] ** 0.5

    jf = thunder_rs.jit(fn)
    for n in [6, 8, 10]:
        x = torch.randn(2, n)
        torch.testing.assert_close(jf(x), fn(x), rtol=0, atol=0)
    assert misses(jf) == 2 and symbolic(jf)


def line_of(fn, text: str) -> str:
    """``file:line in function`` of the line of ``fn`` that holds ``text``."""
    lines, first = inspect.getsourcelines(fn)
    return f"{__file__}:{first + next(i for i, line in enumerate(lines) if text in line)} in {fn.__name__}"


def branch_on_size(x):
    if x.shape[1] % 4:
        return x * 2
    return x + 1


def whole_slice(x):
    return x[:, :12].contiguous() * 2  # (a stride equal to the length decides whether it is contiguous)


def specialised(x):
    n = int(x.shape[1])
    return x * n


@pytest.mark.parametrize(
    "fn, decided, op",
    [
        (branch_on_size, "if x.shape[1] % 4", None),
        (whole_slice, "x[:, :12]", "torch.Tensor.contiguous"),
        (specialised, "int(x.shape[1])", None),
    ],
)
def test_a_failed_size_guard_names_the_line_and_the_call_that_decided(fn, decided, op):
    # As torch.compile's recompiles log names the guard's line: the user's line whose decision on
    # a size the call fails, and the torch call whose decomposition took it on the program's behalf.
    jf = thunder_rs.jit(fn)
    for n in [8, 12, 18]:
        x = torch.randn(3, n)
        torch.testing.assert_close(jf(x), fn(x))
    reasons = thunder_rs.compile_stats(jf).miss_reasons
    assert len(reasons) == 3, reasons
    assert "the entry with symbolic sizes does not serve it" in reasons[2], reasons[2]
    site = f"(t0 = x.shape[1] = 18), decided at {line_of(fn, decided)}{f' ({op})' if op else ''}; compiled"
    assert site in reasons[2], reasons[2]
