"""Shapes that change between calls (issue 26), a fifteenth sweep: recompiles that should not
happen. Every call's outputs (and gradients where the program trains) are checked against eager,
and the compiles counted.

What the sweep found, each fixed and pinned here: a jitted module dropped every entry when its
structure changed (a submodule set, a parameter or buffer registered or deleted, a forward set on
an instance), so changing it back (a LoRA wrapper put on a layer and taken off, a submodule
swapped and swapped back) compiled again each time; torch.compile keeps its earlier entries. The
structure's number is now in the key (``core.state.structures``): a structure the module had finds
its entries while its modules all stay in the tree (taking a LoRA wrapper off finds the base's;
the wrapper's, dropped with the wrapper so that it is freed as in eager, compiles again), whose
guards decide as ever (an attribute, a hook or a parameter changed meanwhile runs as eager).
Clearing the entries had also left the symbolic ones: after a structure change
(``model.act = nn.Tanh()``) or ``thunder_rs.reset()``, a symbolic entry of the old structure served
calls whose sizes it takes, running the module as it was (ReLU for Tanh: silently not eager).

An RNN over ``pack_padded_sequence`` compiled once per distinct packed sizes (the lengths' sum and
maximum, which the packed data's rows and ``batch_sizes``' length are): the variant with them
symbolic failed to compile, as the RNN's output metadata over a packed sequence and
``_pad_packed_sequence``'s (a CPU kernel, no meta one) were taken by specialising the sizes, which
cannot be done to sizes read from values, and a call sized by values could not have a gradient.
The RNN's outputs are given by its arguments (``fallback_sizes._recurrent_outputs``), a kernel that
takes no symbolic sizes is sized by its values, a call sized by values has its tensors' backward
(not a random one), and a read's size that the pattern had constant and that changed (the longest
length, where the total was symbolic) widens the pattern, in a variant and at the next compile:
three compiles for any lengths. What the kernels read of the lengths' values (``batch_sizes[0]``,
the number of sequences) stays a value read, checked per call.

Checked and equal to eager, nothing to fix (compiles): an HF GPT-2's training with batch and
length changing together (2); torchvision's ResNet-18 over images of varying height and width (2);
timm's ViT with interpolated position embeddings (3); a detection head on ``roi_align`` of 1 to 11
boxes (3); speech frames subsampled, masked, CTC-trained (2); a KV cache growing with the batch
changing between sequences (4: the prompt and the step each static then batch-symbolic); varlen
attention over ``cu_seqlens`` three ways (2 to 3); Inductor regions over batch and length (2).
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import thunder_rs
from thunder_rs.core.state import structures
from test_dynamic_round9 import assert_same, misses

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore:thunder_rs.*recompiled")]


# -- a module changed back to a structure it had ------------------------------------------------------


class LoRA(nn.Module):
    """A low-rank adapter around a linear layer, as PEFT wraps one: the layer stays a submodule."""

    def __init__(self, base: nn.Linear, rank: int = 2, scale: float = 2.0):
        super().__init__()
        self.base, self.scale = base, scale
        self.A = nn.Parameter(0.3 * torch.randn(rank, base.in_features, dtype=torch.float64))
        self.B = nn.Parameter(0.3 * torch.randn(base.out_features, rank, dtype=torch.float64))

    def forward(self, x):
        return self.base(x) + (x @ self.A.T @ self.B.T) * self.scale


class Body(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.act, self.head = nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)
        self.temperature = 1.0

    def forward(self, x):
        return self.head(self.act(self.first(x))) / self.temperature


def _body():
    torch.manual_seed(0)
    return Body().double()


def _step(model, jitted, T: int) -> None:
    """One call of ``model`` eager and jitted on ``T`` rows: outputs and the trainable parameters'
    gradients bit-equal."""
    x = torch.randn(T, 4, dtype=torch.float64)
    params = [p for p in model.parameters() if p.requires_grad]
    expected, got = model(x), jitted(x)
    assert_same(expected, got)
    for a, b in zip(torch.autograd.grad(expected.sin().sum(), params), torch.autograd.grad(got.sin().sum(), params)):
        assert_same(a, b)


def test_a_lora_wrapper_taken_off_and_put_back_finds_the_entries_of_the_base_structure():
    """A LoRA wrapper put on a layer, taken off and put back (the same wrapper), at one length, then
    over lengths that change: the base structure compiles as a new one would (static, then
    symbolic), and taking the wrapper off compiles nothing (it compiled each time: five compiles
    for the first five structures at one length). The wrapper's structure is dropped when the
    wrapper is taken off (``core.state.structures``: keeping its entries would keep the wrapper
    alive, where eager frees it), so putting it back compiles once each time."""
    model = _body()
    jitted = thunder_rs.jit(model)
    base = model.first
    wrapper = LoRA(base)
    for structure in (base, wrapper, base, wrapper, base):
        model.first = structure
        _step(model, jitted, 5)
    assert misses(jitted) == 3, thunder_rs.compile_stats(jitted).miss_reasons
    for structure in (base, wrapper):
        model.first = structure
        for T in (3, 7):
            _step(model, jitted, T)
    assert misses(jitted) == 5
    for structure in (base, wrapper, base, wrapper):
        model.first = structure
        for T in (4, 9, 5):
            _step(model, jitted, T)
    assert misses(jitted) == 7, thunder_rs.compile_stats(jitted).miss_reasons


def test_a_swapped_submodule_runs_as_eager_and_swapping_it_back_compiles_once():
    """``model.act = nn.Tanh()`` after the symbolic compile: the symbolic entry of the ReLU model
    served the calls (ReLU's outputs, not eager's). Now the Tanh model compiles, and the ReLU back
    compiles once, symbolic (the ReLU's structure was dropped when the ReLU left the tree:
    ``core.state.structures``)."""
    model = _body()
    jitted = thunder_rs.jit(model)
    relu = model.act
    for T in (3, 5, 7):
        _step(model, jitted, T)
    model.act = nn.Tanh()
    for T in (3, 9):
        _step(model, jitted, T)
    compiled = misses(jitted)
    model.act = relu
    for T in (3, 6, 11):
        _step(model, jitted, T)
    assert misses(jitted) == compiled + 1


def test_a_structure_returned_to_runs_what_changed_meanwhile_as_eager():
    """While the module had another structure, what its entries read changed: an attribute of the
    root, a hook and an attribute of the swapped-out submodule, that submodule's weight replaced by
    another tensor of the same sizes, a buffer registered and deleted again. Back in the structure,
    every call is eager's (the entries' guards decide; a changed read compiles)."""
    model = _body()
    jitted = thunder_rs.jit(model)
    leaky = model.act = nn.LeakyReLU(0.1)
    for T in (3, 5, 7):
        _step(model, jitted, T)
    first = model.first

    def away_and_back(change) -> None:
        model.first = LoRA(first)
        _step(model, jitted, 5)
        change()
        model.first = first
        for T in (3, 6):
            _step(model, jitted, T)

    away_and_back(lambda: setattr(model, "temperature", 2.0))
    away_and_back(lambda: setattr(leaky, "negative_slope", 0.3))
    handle = first.register_forward_hook(lambda module, args, out: out * 3)
    away_and_back(lambda: None)
    away_and_back(handle.remove)
    away_and_back(lambda: setattr(first, "weight", nn.Parameter(torch.randn(6, 4, dtype=torch.float64))))
    away_and_back(lambda: first.register_buffer("seen", torch.zeros(2)))
    away_and_back(lambda: delattr(first, "seen"))
    with torch.no_grad():
        first.bias.mul_(-1)
    _step(model, jitted, 4)


def test_training_mode_and_hooks_removed_return_to_their_entries():
    """(Checked, unchanged: they were keyed or guarded, not part of the structure.) ``train()`` and
    ``eval()`` toggled and a hook added then removed compile once each state, then hit."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Dropout(0.0), nn.BatchNorm1d(6), nn.Linear(6, 2)).double()
    jitted = thunder_rs.jit(model)
    for mode in (True, False, True, False):
        model.train(mode)
        _step(model, jitted, 5)
    assert misses(jitted) == 2
    for _ in range(2):
        handle = model[3].register_forward_hook(lambda module, args, out: out.flip(-1))
        _step(model, jitted, 5)
        handle.remove()
        _step(model, jitted, 5)
    assert misses(jitted) == 4  # (each hook is a new one: its handle's id is in the hooks' snapshot)


def test_past_the_structures_kept_the_oldest_is_dropped_with_its_entries():
    """More structures than ``STRUCTURES_KEPT`` whose modules all stay in the tree (buffers
    registered one after another, then deleted): the least recently bound one is dropped with its
    entries and compiles again when it returns; the others are found."""
    model = _body()
    jitted = thunder_rs.jit(model)
    _step(model, jitted, 3)
    for i in range(structures.STRUCTURES_KEPT):
        model.register_buffer(f"seen{i}", torch.zeros(1))
        _step(model, jitted, 3)
    assert len(jitted._jfn._structures.numbers()) == structures.STRUCTURES_KEPT
    compiled = misses(jitted)
    for i in reversed(range(1, structures.STRUCTURES_KEPT)):
        delattr(model, f"seen{i}")
        _step(model, jitted, 3)
    assert misses(jitted) == compiled
    delattr(model, "seen0")
    _step(model, jitted, 3)
    assert misses(jitted) == compiled + 1


def test_reset_drops_the_symbolic_entries_too():
    """``thunder_rs.reset()`` cleared the entries by key but not the symbolic ones, which served the
    next call of other sizes without compiling."""
    jitted = thunder_rs.jit(lambda x: x.relu() * 2)
    for T in (3, 5, 7):
        jitted(torch.randn(T))
    thunder_rs.reset()
    x = torch.randn(9)
    assert torch.equal(jitted(x), x.relu() * 2)
    assert misses(jitted) == 3


# -- packed sequences ------------------------------------------------------------------------------------


def _packed_lstm():
    torch.manual_seed(0)
    lstm = nn.LSTM(3, 4, batch_first=True).double()

    def program(x, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, (h, c) = lstm(packed)
        return nn.utils.rnn.pad_packed_sequence(out, batch_first=True)[0], h, c

    return program, list(lstm.parameters())


def _packed_gru():
    torch.manual_seed(0)
    gru = nn.GRU(3, 4, num_layers=2, bidirectional=True).double()

    def program(x, lengths, h0):
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=True)
        out, h = gru(packed, h0)
        padded, sizes = nn.utils.rnn.pad_packed_sequence(out, total_length=x.shape[0] + 1, padding_value=-1.0)
        return padded, h, sizes, out.data * 2, out.batch_sizes

    return program, list(gru.parameters())


#: Lengths of four sequences, the first the longest: their sums and maxima change together and apart.
PACKED_LENGTHS = ([7, 7, 4, 1], [7, 5, 4, 4], [6, 4, 3, 5], [5, 5, 2, 3], [5, 1, 5, 3], [8, 3, 5, 2], [9, 2, 6, 8])


@pytest.mark.parametrize("make", [_packed_lstm, _packed_gru], ids=["lstm", "gru"])
def test_rnns_over_packed_sequences_compile_at_most_three_times(make):
    """An RNN over ``pack_padded_sequence`` compiled once per distinct packed sizes (the lengths'
    sum and maximum): the packed data's rows and ``batch_sizes``' length come from the lengths'
    values, and the variant with them symbolic failed to compile (the RNN's and
    ``_pad_packed_sequence``'s metadata were taken by specialising the sizes, and a call sized by
    values could not have gradients), so each new sum or maximum compiled a constant one. They are
    symbolic now (read from the values, checked per call: what eager's kernels read of them, the
    number of sequences in ``batch_sizes[0]``, stays a value read); outputs and gradients eager's."""
    program, params = make()
    jitted = thunder_rs.jit(program)
    for lengths in PACKED_LENGTHS:
        x = torch.randn(max(lengths), 4, 3, dtype=torch.float64)
        if make is _packed_lstm:
            x = x.transpose(0, 1).contiguous()
        else:
            lengths = sorted(lengths, reverse=True)
        args = [x, torch.tensor(lengths)] + ([torch.randn(4, 4, 4, dtype=torch.float64)] if make is _packed_gru else [])
        copies = [[a.detach().clone().requires_grad_(a.is_floating_point()) for a in args] for _ in range(2)]
        expected, got = program(*copies[0]), jitted(*copies[1])
        assert_same(expected, got)
        wanted = [[a for a in c if a.requires_grad] + params for c in copies]
        floats = [[t for t in outs if t.requires_grad] for outs in (expected, got)]
        grads = [torch.autograd.grad(sum(t.sin().sum() for t in f), w) for f, w in zip(floats, wanted)]
        for a, b in zip(*grads):
            assert_same(a, b)
    assert misses(jitted) <= 3, thunder_rs.compile_stats(jitted).miss_reasons


# -- variable-shape programs not tested before (checked: equal to eager, the compiles counted) ----------


def _grads_equal(expected, got, params) -> None:
    for a, b in zip(torch.autograd.grad(expected, params), torch.autograd.grad(got, params)):
        assert_same(a, b)


@pytest.mark.slow
def test_hf_gpt2_training_with_batch_and_length_changing_together_compiles_twice():
    """A tiny HF GPT-2's loss and gradients with padding masks, batch size and length both changing
    on every step: the second compile has both symbolic (two compiles)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50, n_positions=64, n_embd=16, n_layer=2, n_head=2)
    config.attn_pdrop = config.resid_pdrop = config.embd_pdrop = 0.0
    model = transformers.GPT2LMHeadModel(config).double()
    jitted = thunder_rs.jit(model)
    params = list(model.parameters())
    for batch, length in ((2, 8), (3, 11), (4, 6), (2, 13), (5, 9), (3, 8)):
        ids = torch.randint(0, 50, (batch, length))
        mask = torch.ones(batch, length, dtype=torch.long)
        mask[0, -2:] = 0
        expected = model(input_ids=ids, attention_mask=mask, labels=ids).loss
        got = jitted(input_ids=ids, attention_mask=mask, labels=ids).loss
        assert_same(expected, got)
        _grads_equal(expected, got, params)
    assert misses(jitted) == 2, thunder_rs.compile_stats(jitted).miss_reasons


def test_resnet_over_images_of_varying_height_and_width_compiles_twice():
    """torchvision's ResNet-18 (adaptive average pooling to 1x1) in eval mode over images of five
    sizes, odd ones among them: bit-equal, two compiles (height and width symbolic)."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=5).eval()
    jitted = thunder_rs.jit(model)
    with torch.no_grad():
        for height, width in ((32, 32), (48, 40), (64, 56), (40, 72), (33, 47)):
            x = torch.randn(2, 3, height, width)
            assert_same(model(x), jitted(x))
    assert misses(jitted) == 2


@pytest.mark.slow
def test_vit_with_interpolated_position_embeddings_over_image_sizes_compiles_three_times():
    """timm's VisionTransformer with ``dynamic_img_size`` (its position embeddings resampled to the
    patch grid by bicubic interpolation) over five image sizes: bit-equal; three compiles (the
    symbolic one guards the grid's height against the embeddings' and a smaller grid compiles
    once more, as torch.compile guards the branch)."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=16, depth=2, num_heads=2, num_classes=4, dynamic_img_size=True
    )
    model = model.double().eval()
    jitted = thunder_rs.jit(model)
    for height, width in ((32, 32), (48, 40), (64, 56), (40, 72), (24, 48)):
        x = torch.randn(2, 3, height, width, dtype=torch.float64)
        assert_same(model(x), jitted(x))
    assert misses(jitted) == 3, thunder_rs.compile_stats(jitted).miss_reasons


def test_roi_align_detection_head_over_varying_numbers_of_boxes_compiles_three_times():
    """A detection head on ``roi_align`` of a varying number of boxes (1 to 11), classes and
    scaled box scores, with the features' gradient: three compiles (the count of boxes symbolic
    from its second value; one box kept constant, as torch does)."""
    ops = pytest.importorskip("torchvision.ops")
    torch.manual_seed(0)
    head = nn.Sequential(nn.Flatten(), nn.Linear(4 * 3 * 3, 8), nn.ReLU(), nn.Linear(8, 5)).double()

    def detect(features, boxes):
        pooled = ops.roi_align(features, boxes, output_size=(3, 3), spatial_scale=0.5, sampling_ratio=2, aligned=True)
        out = head(pooled)
        return out.softmax(-1), out[:, 1:].sigmoid() * boxes[:, 1:].amax(0)

    jitted = thunder_rs.jit(detect)
    for n in (3, 5, 8, 2, 11, 1):
        corners = torch.rand(n, 4, dtype=torch.float64) * 20
        image = torch.randint(0, 2, (n, 1)).double()
        boxes = torch.cat([image, corners[:, :2], corners[:, :2] + corners[:, 2:] / 2 + 1], 1)
        features = [torch.randn(2, 4, 16, 16, dtype=torch.float64, requires_grad=True)]
        features.append(features[0].detach().clone().requires_grad_())
        expected, got = detect(features[0], boxes), jitted(features[1], boxes)
        assert_same(expected, got)
        sum(t.sin().sum() for t in expected).backward()
        sum(t.sin().sum() for t in got).backward()
        assert_same(features[0].grad, features[1].grad)
    assert misses(jitted) == 3


class SpeechEncoder(nn.Module):
    """Filterbank frames subsampled 4x by two strided convolutions, a transformer layer masking
    the padded frames, CTC log-probabilities and the subsampled lengths."""

    def __init__(self):
        super().__init__()
        self.sub = nn.Sequential(nn.Conv1d(20, 16, 3, stride=2), nn.GELU(), nn.Conv1d(16, 16, 3, stride=2), nn.GELU())
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.out = nn.Linear(16, 7)

    def forward(self, feats, lengths):
        h = self.sub(feats.transpose(1, 2)).transpose(1, 2)
        sub_lengths = ((lengths - 3) // 2 + 1 - 3) // 2 + 1
        mask = torch.arange(h.shape[1])[None, :] >= sub_lengths[:, None]
        return self.out(self.layer(h, src_key_padding_mask=mask)).log_softmax(-1), sub_lengths


def test_speech_features_of_varying_frames_with_padding_masks_train_as_eager_in_two_compiles():
    """CTC training of ``SpeechEncoder`` over utterances of 33 to 80 frames: outputs, the CTC loss's
    gradients bit-equal, two compiles."""
    torch.manual_seed(0)
    model = SpeechEncoder().double()
    jitted = thunder_rs.jit(model)
    params = list(model.parameters())
    targets, target_lengths = torch.randint(1, 7, (3, 4)), torch.tensor([4, 3, 2])
    for frames in (40, 57, 33, 80, 64):
        feats, lengths = (
            torch.randn(3, frames, 20, dtype=torch.float64),
            torch.tensor([frames, frames - 5, frames // 2]),
        )
        expected, got = model(feats, lengths), jitted(feats, lengths)
        assert_same(expected, got)
        losses = [F.ctc_loss(logp.transpose(0, 1), targets, n, target_lengths) for logp, n in (expected, got)]
        _grads_equal(*losses, params)
    assert misses(jitted) == 2


class CachedAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.o = nn.Linear(8, 24), nn.Linear(8, 8)

    def forward(self, x, k_cache, v_cache):
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 2, 4).unbind(2)
        k, v = torch.cat([k_cache, k.transpose(1, 2)], 2), torch.cat([v_cache, v.transpose(1, 2)], 2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k, v)
        return self.o(y.transpose(1, 2).reshape(x.shape[0], x.shape[1], 8)), k, v


def test_a_kv_cache_growing_with_the_batch_size_changing_between_sequences():
    """A prompt of 5 tokens then 5 decode steps whose cache grows, for batches of 2, 3 and 4: four
    compiles (the prompt and the step each compile static, then with the batch symbolic; the
    cache's length symbolic from its second value, 0 kept constant), none for the third batch."""
    torch.manual_seed(0)
    model = CachedAttention().double()
    jitted = thunder_rs.jit(model)
    with torch.no_grad():
        for batch in (2, 3, 4):
            caches = [[torch.zeros(batch, 2, 0, 4, dtype=torch.float64) for _ in range(2)] for _ in range(2)]
            x = torch.randn(batch, 5, 8, dtype=torch.float64)
            for _ in range(6):
                expected, got = model(x, *caches[0]), jitted(x, *caches[1])
                assert_same(expected, got)
                caches = [list(expected[1:]), list(got[1:])]
                x = torch.randn(batch, 1, 8, dtype=torch.float64)
    assert misses(jitted) == 4, thunder_rs.compile_stats(jitted).miss_reasons


def test_varlen_attention_over_cu_seqlens_compiles_at_most_three_times():
    """Attention over sequences packed by ``cu_seqlens`` written with torch ops, three ways (split by
    the lengths read as ints, slices at ``.item()`` bounds, a block-diagonal mask from
    ``repeat_interleave``), lengths changing every call: gradients bit-equal, at most three
    compiles (the lengths read are symbolic sizes; the number of sequences, which the loop runs
    over, is a value read and stays guarded)."""

    def split(q, k, v, cu):
        pieces = [x.split(cu.diff().tolist()) for x in (q, k, v)]
        return torch.cat([_attend(a, b, c, causal=True) for a, b, c in zip(*pieces)])

    def items(q, k, v, cu):
        bounds = [(cu[i].item(), cu[i + 1].item()) for i in range(cu.shape[0] - 1)]
        return torch.cat([_attend(q[s:e], k[s:e], v[s:e]) for s, e in bounds])

    def masked(q, k, v, cu):
        lengths = cu.diff()
        ids = torch.repeat_interleave(torch.arange(lengths.shape[0]), lengths, output_size=q.shape[0])
        return _attend(q, k, v, mask=ids[:, None] == ids[None, :])

    torch.manual_seed(0)
    for program in (split, items, masked):
        jitted = thunder_rs.jit(program)
        for lengths in ([3, 7, 5], [8, 2, 6], [4, 4, 9], [5, 3, 2], [9, 6, 7]):
            cu = torch.tensor([0, *lengths]).cumsum(0)
            inputs = [torch.randn(sum(lengths), 2, 4, dtype=torch.float64) for _ in range(3)]
            copies = [[t.clone().requires_grad_() for t in inputs] for _ in range(2)]
            expected, got = program(*copies[0], cu), jitted(*copies[1], cu)
            assert_same(expected, got)
            for out in (expected, got):
                out.sin().sum().backward()
            for a, b in zip(*copies):
                assert_same(a.grad, b.grad)
        assert misses(jitted) <= 3, (program.__name__, thunder_rs.compile_stats(jitted).miss_reasons)


def _attend(q, k, v, causal=False, mask=None):
    """Attention over ``(tokens, heads, dim)`` inputs."""
    q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal).transpose(0, 1)


@pytest.mark.slow
def test_inductor_regions_over_batch_and_length_compile_twice():
    """The Inductor executor on symbolic regions (``executors=["inductor"]``), batch and length
    changing together: two compiles, one Inductor artifact serving every size; within float32's
    tolerance of eager (Inductor fuses the GELU, softmax and mean: other roundings)."""

    def program(x, w):
        return F.gelu(x @ w).mul(x.shape[1] ** -0.5).softmax(-1) + x.mean(1, keepdim=True)

    jitted = thunder_rs.jit(program, executors=["inductor"])
    for batch, length in ((2, 8), (3, 11), (4, 6), (2, 13), (5, 9)):
        x, w = torch.randn(batch, length, 16), torch.randn(16, 16)
        torch.testing.assert_close(jitted(x, w), program(x, w))
    assert misses(jitted) == 2
