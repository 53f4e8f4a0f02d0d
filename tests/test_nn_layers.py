"""torch.nn's own layers under thunder_rs.jit, as a user builds models from them: outputs and
parameter gradients equal eager's, on the first call and on a cached one."""

import copy

import pytest
import torch
from torch import nn

import thunder_rs


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _layers():
    x = torch.randn(2, 5, 16)
    image = torch.randn(2, 3, 8, 8)
    return {
        "multihead_attention": (nn.MultiheadAttention(16, 4, batch_first=True), (x, x, x), {}),
        "multihead_attention_without_weights": (
            nn.MultiheadAttention(16, 4, batch_first=True),
            (x, x, x),
            {"need_weights": False},
        ),
        "lstm": (nn.LSTM(16, 8, batch_first=True), (x,), {}),
        "gru_two_layers": (nn.GRU(16, 8, num_layers=2, batch_first=True), (x,), {}),
        "rnn_relu": (nn.RNN(16, 8, batch_first=True, nonlinearity="relu"), (x,), {}),
        "transformer_encoder_layer": (nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True), (x,), {}),
        "transformer_decoder_layer": (nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True), (x, x), {}),
        "transformer": (nn.Transformer(16, 2, 1, 1, 32, dropout=0.0, batch_first=True), (x, x), {}),
        "conv_batchnorm_inplace_silu": (
            nn.Sequential(nn.Conv1d(5, 8, 3), nn.BatchNorm1d(8), nn.SiLU(inplace=True)),
            (x,),
            {},
        ),
        "groupnorm_mish": (nn.Sequential(nn.Conv2d(3, 8, 3), nn.GroupNorm(2, 8), nn.Mish()), (image,), {}),
        "pixel_shuffle_upsample": (
            nn.Sequential(nn.Conv2d(3, 12, 1), nn.PixelShuffle(2), nn.Upsample(scale_factor=2, mode="bilinear")),
            (image,),
            {},
        ),
        "embedding_bag": (nn.EmbeddingBag(10, 4, mode="mean"), (torch.randint(0, 10, (3, 4)),), {}),
    }


@pytest.mark.parametrize("name", list(_layers()))
def test_layer_outputs_and_gradients_equal_eager(name):
    torch.manual_seed(0)
    model, args, kwargs = _layers()[name]
    reference = copy.deepcopy(model)
    jitted = thunder_rs.jit(model)
    for _ in range(2):  # the first call compiles, the second runs the cached program
        model.zero_grad()
        reference.zero_grad()
        out, expected = _first(jitted(*args, **kwargs)), _first(reference(*args, **kwargs))
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
        out.square().sum().backward()
        expected.square().sum().backward()
        for (param, p), q in zip(model.named_parameters(), reference.parameters()):
            assert (p.grad is None) == (q.grad is None), param
            if p.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=lambda m, n=param: f"{n}: {m}")
    for name, buffer in model.named_buffers():
        torch.testing.assert_close(buffer, reference.get_buffer(name), msg=name)


def test_attention_weights_are_none_when_not_asked_for():
    """multi_head_attention_forward returns (output, None): the None stays in the structure."""
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(16, 4, batch_first=True)
    x = torch.randn(2, 5, 16)
    out, weights = thunder_rs.jit(attention)(x, x, x, need_weights=False)
    assert weights is None
    torch.testing.assert_close(out, attention(x, x, x, need_weights=False)[0])


@pytest.mark.parametrize("layer", ["encoder", "decoder"])
def test_transformer_layers_in_eval_mode_without_grad_equal_eager(layer):
    """Under no_grad in eval mode, torch's encoder layer takes its fused fast path."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    if layer == "encoder":
        model, args = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True).eval(), (x,)
    else:
        model, args = nn.TransformerDecoderLayer(16, 4, 32, batch_first=True).eval(), (x, x)
    jitted = thunder_rs.jit(model)
    with torch.no_grad():
        torch.testing.assert_close(jitted(*args), model(*args), atol=1e-5, rtol=1e-4)


def test_packing_a_padded_batch_inside_a_program_runs_as_eager():
    """Refused while torch's meta kernel failed on it; its sizes are read from the values now
    (``test_dynamic_round12``: a compile per distinct packed sizes)."""
    lstm = torch.nn.LSTM(4, 3, batch_first=True)

    def program(x, lengths):
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        return lstm(packed)[1][0]

    x, lengths = torch.randn(2, 5, 4), torch.tensor([3, 5])
    assert torch.equal(thunder_rs.jit(program)(x, lengths), program(x, lengths))


def _scaled_embedding(dtype, **kwargs):
    """An embedding (rows of norm about 6) and a linear head, so that ``max_norm`` renormalises."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 4, **kwargs), nn.Linear(4, 2)).to(dtype)
    with torch.no_grad():
        model[0].weight.mul_(3)
    return model


@pytest.mark.parametrize(
    ("kwargs", "dtype"),
    [
        ({"max_norm": 1.0}, torch.float32),
        ({"max_norm": 1.0, "padding_idx": 3}, torch.float32),
        ({"max_norm": 4.0, "norm_type": 1.0}, torch.float32),
        ({"max_norm": 2.0, "norm_type": float("inf")}, torch.float64),
        ({"max_norm": 1.0}, torch.bfloat16),
    ],
    ids=["l2", "padding_idx", "l1", "inf_float64", "bfloat16"],
)
def test_embedding_max_norm_renormalises_the_weight_in_place_as_eager(kwargs, dtype):
    """max_norm scales each row a call references (once, however often) in the weight itself under
    no_grad, then looks up: over SGD steps with repeated indices the weight after each call, the
    outputs and the gradients equal eager's; a no_grad call renormalises too. One compile each."""
    model = _scaled_embedding(dtype, **kwargs)
    eager = copy.deepcopy(model)
    jitted = thunder_rs.jit(model)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (model, eager)]
    for step in range(3):
        idx = (torch.tensor([[1, 3, 3, 7], [7, 0, 3, 9]]) + step) % 10
        out, expected = jitted(idx), eager(idx)
        torch.testing.assert_close(model[0].weight, eager[0].weight)
        torch.testing.assert_close(out, expected)
        out.float().square().sum().backward()
        expected.float().square().sum().backward()
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    with torch.no_grad():
        torch.testing.assert_close(jitted(torch.tensor([5, 6, 5])), eager(torch.tensor([5, 6, 5])))
    torch.testing.assert_close(model[0].weight, eager[0].weight)
    assert thunder_rs.compile_stats(jitted).cache_misses == 2  # with and without grad


def test_max_norm_of_functional_embeddings_bags_and_embedding_renorm_writes_their_tables():
    """F.embedding on a table passed in (written back into the caller's tensor), on an
    intermediate (the gradient reaches the table through it), EmbeddingBag, and a direct
    ``torch.embedding_renorm_``."""

    def program(idx, table, bag, other):
        a = nn.functional.embedding(idx, table, max_norm=1.0)
        b = nn.functional.embedding(idx, other * 2, max_norm=1.0)
        with torch.no_grad():
            torch.embedding_renorm_(other, idx[:1], 1.5, 2.0)
        return a + b + bag(idx)[:, None] + other[idx]

    torch.manual_seed(0)
    tensors = [(torch.randn(10, 4) * 3).requires_grad_() for _ in range(2)]
    bag = nn.EmbeddingBag(10, 4, max_norm=2.0, mode="max")
    copies = [t.detach().clone().requires_grad_() for t in tensors]
    eager_bag = copy.deepcopy(bag)
    idx = torch.tensor([[1, 3, 3], [3, 8, 1]])
    out = thunder_rs.jit(program)(idx, tensors[0], bag, tensors[1])
    expected = program(idx, copies[0], eager_bag, copies[1])
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    for t, c in zip([*tensors, bag.weight], [*copies, eager_bag.weight]):
        torch.testing.assert_close(t, c)
        torch.testing.assert_close(t.grad, c.grad)


def test_an_lstm_trains_in_one_compile_keeping_its_flat_weights_its_parameters():
    """nn.LSTM rebuilds ``_flat_weights`` (and weak references to them) when a call finds them
    other than its parameters, as they are while traced: the rebuilt list is stored with the
    parameters themselves, as eager holds them, not copies that would compile each later call again
    (timm's Sequencer)."""
    torch.manual_seed(0)
    model = nn.LSTM(4, 3, batch_first=True, bidirectional=True)
    eager, jitted = copy.deepcopy(model), thunder_rs.jit(model)
    for _ in range(3):
        x = torch.randn(2, 5, 4)
        out, expected = jitted(x)[0], eager(x)[0]
        torch.testing.assert_close(out, expected)
        out.square().sum().backward()
        expected.square().sum().backward()
        assert all(w is p for w, p in zip(model._flat_weights, model.parameters(), strict=True))
        assert all(r() is p for r, p in zip(model._flat_weight_refs, model.parameters(), strict=True))
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert thunder_rs.compile_stats(jitted).cache_misses == 1
