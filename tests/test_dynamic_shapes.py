"""Shapes that change between calls (issue 26): a size seen to change is traced as symbolic in the
next compile, and that entry serves later calls of other sizes where the guards its trace relied
on hold; every call computes what eager computes (outputs, gradients), a decision taken on a size
recompiles when it would go the other way, and sizes 0 and 1 stay constant."""

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
    (entry,) = symbolic(jf)
    assert entry.dims == {(0, 0)}
    assert '"size 5"' in entry.entry.source, entry.entry.source


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


def test_sizes_read_as_values_are_computed_per_call():
    jf = thunder_rs.jit(sizes_as_values, dynamic=True)
    for n in [3, 8, 5]:
        x = torch.randn(n, 2)
        out, expected = jf(x), sizes_as_values(x)
        torch.testing.assert_close(out[0], expected[0])
        assert out[1:] == expected[1:] and type(out[1]) is int and type(out[2]) is torch.Size
    assert misses(jf) == 1
    # ``len()`` needs a Python int: the size is specialised, each length its own compile.
    jl = thunder_rs.jit(uses_len, dynamic=True)
    for n in [3, 8, 8]:
        x = torch.randn(n, 2)
        torch.testing.assert_close(jl(x), uses_len(x))
    assert misses(jl) == 2 and all(f"t0 - {n} == 0" in e.guards for n, e in zip([3, 8], symbolic(jl)))


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


def _llama(transformers):
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(config)


def _bert(transformers):
    config = transformers.BertConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=100,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
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
    import copy  # noqa: PLC0415

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
