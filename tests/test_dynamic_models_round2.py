"""Real models over shapes that change between calls, as a demanding user runs them (issue 26, a
second sweep): tiny configs built in code (nothing downloaded), each trained with AdamW next to an
eager copy over batch sizes and lengths or image sizes that change every step. Every step's loss,
every parameter's gradient, the buffers and the parameters after the optimizer's steps are
bit-equal to eager's, in the compiles automatic dynamic shapes allow: the first shapes, then one
with the changed sizes symbolic, and one more for a batch of 1 (0 and 1 stay specialised, as in
torch.compile). What the families cannot run at some size (Whisper's encoder at another frame
count) fails as eager fails.

The sweep found no silent difference of shapes that change (``nn.LSTM`` on the CPU under grad is
a rounding off eager's at any shape: oneDNN's kernel differs with grad mode, and a fallback's
compiled forward runs without grad; not fixed here). It found one compile per sequence length: ``nn.GRU`` and
``nn.RNN`` run torch's ``gru``/``rnn_tanh``/``rnn_relu`` as fallbacks, whose symbolic output sizes
came from torch's decomposition on fake tensors, which steps through the sequence in Python and
so guarded its length (``nn.LSTM`` takes a oneDNN kernel there and did not); a rule gives their
outputs' metadata now (``fallback_sizes``). These tests also keep what the sweep checked that no
other test does:
Whisper's encoder-decoder over batches and target lengths, ViT's interpolated position encoding
at image sizes that are not whole patches, T5 over batches with source and target lengths that
change together, gradient checkpointing, and the features of channels_last CNNs at odd image sizes
with eager's strides.
"""

import copy

import pytest
import torch

import thunder_rs
from twin_training import misses

transformers = pytest.importorskip("transformers")
torchvision = pytest.importorskip("torchvision")

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:thunder_rs.*recompiled"),
    pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated:FutureWarning"),
]
T = transformers
EXACT = dict(rtol=0, atol=0)
VOCAB = 100
DECODER = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


def train_bit_equal(model, batches, loss=lambda out: out.loss) -> thunder_rs.ThunderModule:
    """Trains ``model`` jitted next to an eager copy with AdamW, one step per batch of keyword
    arguments (or one tensor), dropout seeded alike: each step's loss, gradients and buffers and
    the parameters after the last step bit-equal to eager's. Returns the jitted module."""
    eager, jmodel = copy.deepcopy(model), thunder_rs.jit(model)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, eager)]
    for step, batch in enumerate(batches):
        args, kwargs = ((), batch) if isinstance(batch, dict) else ((batch,), {})
        losses = []
        for fn, opt in zip((jmodel, eager), optimizers):
            opt.zero_grad(set_to_none=True)
            torch.manual_seed(step)
            losses.append(loss(fn(*args, **kwargs)))
            losses[-1].backward()
        torch.testing.assert_close(losses[0], losses[1], **EXACT)
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **EXACT, msg=lambda m, name=name: f"{name}: {m}")
        torch.testing.assert_close(dict(model.named_buffers()), dict(eager.named_buffers()), **EXACT)
        for opt in optimizers:
            opt.step()
    torch.testing.assert_close(dict(model.named_parameters()), dict(eager.named_parameters()), **EXACT)
    return jmodel


def texts(shapes, seed: int = 0) -> list:
    """A causal LM's batches of the (batch, length) ``shapes``, the last text padded on the right."""
    batches = []
    for i, (batch, length) in enumerate(shapes):
        ids = torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed + i))
        mask = torch.ones_like(ids)
        if batch > 1:
            mask[-1, length - length // 3 :] = 0
        batches.append(dict(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)))
    return batches


def tiny_whisper() -> torch.nn.Module:
    config = T.WhisperConfig(
        vocab_size=VOCAB,
        num_mel_bins=8,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        d_model=16,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_source_positions=8,
        max_target_positions=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    torch.manual_seed(0)
    return T.WhisperForConditionalGeneration(config).train()


def speech(batch: int, targets: int, seed: int, frames: int = 16) -> dict:
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(batch, 8, frames, generator=g)
    return dict(input_features=features, labels=torch.randint(3, VOCAB, (batch, targets), generator=g))


def test_whisper_trains_over_batches_and_target_lengths_in_two_compiles():
    batches = [speech(batch, targets, seed) for seed, (batch, targets) in enumerate([(2, 4), (3, 9), (4, 6)])]
    jmodel = train_bit_equal(tiny_whisper(), batches)
    assert misses(jmodel) == 2, thunder_rs.compile_stats(jmodel).miss_reasons


def test_whisper_at_another_frame_count_raises_eagers_error():
    model = tiny_whisper()
    jmodel = thunder_rs.jit(copy.deepcopy(model))
    jmodel(**speech(2, 4, 0))
    with pytest.raises(ValueError, match="length 16, but found 20") as expected:
        model(**speech(2, 4, 1, frames=20))
    with pytest.raises(ValueError, match=str(expected.value)[:60]):
        jmodel(**speech(2, 4, 1, frames=20))


def test_vit_interpolates_its_position_encoding_at_sizes_that_are_not_whole_patches():
    config = T.ViTConfig(
        image_size=32, patch_size=8, num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64
    )
    torch.manual_seed(0)
    model = T.ViTForImageClassification(config).train()
    batches = []
    for i, (batch, h, w) in enumerate([(2, 35, 33), (3, 47, 41), (2, 29, 63), (3, 57, 50)]):
        g = torch.Generator().manual_seed(i)
        pixels, labels = torch.randn(batch, 3, h, w, generator=g), torch.randint(0, 2, (batch,), generator=g)
        batches.append(dict(pixel_values=pixels, labels=labels, interpolate_pos_encoding=True))
    jmodel = train_bit_equal(model, batches)
    assert misses(jmodel) == 2, thunder_rs.compile_stats(jmodel).miss_reasons


def test_t5_trains_over_batches_with_source_and_target_lengths_changing_together():
    config = T.T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(0)
    model = T.T5ForConditionalGeneration(config).train()
    batches = []
    for i, (batch, source, target) in enumerate([(2, 9, 4), (3, 13, 7), (2, 6, 11), (4, 17, 3), (1, 21, 9)]):
        g = torch.Generator().manual_seed(i)
        ids, labels = torch.randint(3, VOCAB, (batch, source), generator=g), torch.randint(3, VOCAB, (batch, target))
        mask = torch.ones_like(ids)
        mask[-1, source // 2 :] = 0
        labels[0, target - 1 :] = -100
        batches.append(dict(input_ids=ids, attention_mask=mask, labels=labels))
    jmodel = train_bit_equal(model, batches)
    # The first shapes, every batch of 2 or more, the batch of 1.
    assert misses(jmodel) == 3, thunder_rs.compile_stats(jmodel).miss_reasons


@pytest.mark.parametrize("reentrant", [False, True])
def test_qwen2_with_gradient_checkpointing_trains_over_batches_and_lengths(reentrant):
    torch.manual_seed(0)
    model = T.Qwen2ForCausalLM(T.Qwen2Config(**DECODER)).train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    jmodel = train_bit_equal(model, texts([(2, 7), (3, 11), (2, 16), (4, 5)]))
    assert misses(jmodel) == 2, thunder_rs.compile_stats(jmodel).miss_reasons


@pytest.mark.parametrize("arch", ["mobilenet_v3_small", "resnet18"])
def test_channels_last_features_at_odd_image_sizes_have_eagers_values_and_strides(arch):
    torch.manual_seed(0)
    model = getattr(torchvision.models, arch)(num_classes=10).eval().to(memory_format=torch.channels_last)
    features = model.features if arch != "resnet18" else torch.nn.Sequential(*list(model.children())[:-2])
    jfeatures = thunder_rs.jit(features)
    for batch, h, w in [(2, 64, 64), (3, 97, 81), (2, 65, 130), (2, 200, 70)]:
        x = torch.randn(batch, 3, h, w).to(memory_format=torch.channels_last)
        with torch.no_grad():
            out, expected = jfeatures(x), features(x)
        torch.testing.assert_close(out, expected, **EXACT)
        assert out.stride() == expected.stride(), (x.shape, out.stride(), expected.stride())
    assert misses(jfeatures) == 2, thunder_rs.compile_stats(jfeatures).miss_reasons


class Tagger(torch.nn.Module):
    """Embeddings, a two-layer bidirectional recurrent layer (``kind``) and a linear head per token."""

    def __init__(self, kind: str, batch_first: bool, **options):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)
        self.rnn = getattr(torch.nn, kind)(8, 6, num_layers=2, bidirectional=True, batch_first=batch_first, **options)
        self.head = torch.nn.Linear(12, 3)

    def forward(self, ids):
        steps, last = self.rnn(self.embed(ids))
        return self.head(steps), steps, last


@pytest.mark.parametrize(
    ("kind", "batch_first", "options"),
    [
        ("GRU", True, {}),
        ("GRU", False, {"dropout": 0.5}),
        ("RNN", True, {"nonlinearity": "relu"}),
        ("RNN", False, {}),
    ],
    ids=["gru", "gru_time_major_dropout", "rnn_relu", "rnn_tanh"],
)
def test_recurrent_layers_train_over_every_length_and_batch_in_two_compiles(kind, batch_first, options):
    # torch's decomposition of gru and rnn steps through the sequence in Python: the fake run
    # that gave the outputs' symbolic sizes guarded the length, and each length compiled again.
    torch.manual_seed(0)
    model = Tagger(kind, batch_first, **options).train()
    eager, jmodel = copy.deepcopy(model), thunder_rs.jit(model)
    for step, (batch, length) in enumerate([(3, 5), (2, 9), (4, 12), (3, 7), (2, 16)]):
        ids = torch.randint(0, 50, (batch, length) if batch_first else (length, batch))
        torch.manual_seed(step)
        outs, grads = jmodel(ids), []
        torch.manual_seed(step)
        expected = eager(ids)
        torch.testing.assert_close(outs, expected, **EXACT)
        assert [o.stride() for o in outs] == [e.stride() for e in expected]
        for m, outs in ((model, outs), (eager, expected)):
            sum(o.square().sum() for o in outs).backward()
            grads.append([p.grad for p in m.parameters()])
            m.zero_grad(set_to_none=True)
        torch.testing.assert_close(grads[0], grads[1], **EXACT)
    assert misses(jmodel) == 2, thunder_rs.compile_stats(jmodel).miss_reasons
