"""Hugging Face families over shapes that change between calls (issue 26): each trains at several
lengths or image sizes next to an eager copy, with eager's outputs and gradients, in the number of
compiles automatic dynamic shapes allow (the first size, then one with the changed sizes symbolic),
more only where the family's own Python branches on a size.

What made them compile once per size: BEiT's relative position bias writes a size into its index
(``index[0, 0:] = num_relative_distance - 3``, which turned dynamic shapes off) and interpolates its
table to ``torch_int`` of the patch counts (``int`` of a size); Swin pads each stage up to a
multiple of its window (``x + (4 - x % 4) % 4``), which the symbolic sizes did not know to be a
multiple of 4 when it is viewed into windows, and ``F.pad`` by an amount that is 0 at one size
decided on it. T5 and BART shift their labels right (``shifted[..., 1:] = labels[..., :-1]``): the
write asked whether ``t - 1`` was 1 (to broadcast) and whether it was more than 1 (an expanded
dim), so a target of 2 tokens compiled again.
"""

import copy

import pytest
import torch

import thunder_rs

transformers = pytest.importorskip("transformers")
from test_hf_families import FAMILIES, TOLERANCES, VOCAB  # noqa: E402
from test_hf_models import assert_grads_close  # noqa: E402

T = transformers
F64 = dict(rtol=1e-10, atol=1e-10)
VISION = dict(image_size=32, num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64)

pytestmark = pytest.mark.usefixtures("one_thread")


def misses(jm) -> int:
    return thunder_rs.compile_stats(jm).cache_misses


def _vision_models():
    """name -> a tiny image classifier of float64 (nothing downloaded)."""
    return {
        "beit": lambda: T.BeitForImageClassification(
            T.BeitConfig(patch_size=8, use_relative_position_bias=True, num_labels=3, **VISION)
        ),
        "data2vec_vision": lambda: T.Data2VecVisionForImageClassification(
            T.Data2VecVisionConfig(patch_size=8, use_relative_position_bias=True, num_labels=3, **VISION)
        ),
        "swin": lambda: T.SwinForImageClassification(
            T.SwinConfig(
                image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4, num_labels=3
            )
        ),
    }


VISION_MODELS = _vision_models()


def train_on_images(name: str, sizes) -> thunder_rs.ThunderModule:
    """A training step's forward and gradients at each image size, compiled and eager, compared."""
    torch.manual_seed(0)
    model = VISION_MODELS[name]().to(torch.float64).train()
    eager = copy.deepcopy(model)
    jm = thunder_rs.jit(model)
    options = {"interpolate_pos_encoding": True} if name != "swin" else {}
    for i, (h, w) in enumerate(sizes):
        x = torch.randn(2, 3, h, w, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
        labels = torch.tensor([0, 2])
        outs = []
        for fn in (jm, eager):
            for p in fn.parameters():
                p.grad = None
            torch.manual_seed(i)  # dropout draws the same masks
            out = fn(pixel_values=x, labels=labels, **options)
            out.loss.backward()
            outs.append(out)
        torch.testing.assert_close(outs[0].logits, outs[1].logits, **F64)
        assert_grads_close(model, eager, F64)
    return jm


def test_beit_trains_over_image_sizes_in_two_compiles():
    # Without the symbolic setitem, dynamic shapes were off (one compile per size); without
    # torch_int of a size, the second entry was specialised to its patch counts.
    jm = train_on_images("beit", [(32, 48), (48, 40), (40, 64), (64, 32)])
    assert misses(jm) == 2, thunder_rs.compile_stats(jm).miss_reasons
    assert (
        thunder_rs.compile_stats(jm)
        .miss_reasons[1]
        .endswith("compiled with symbolic sizes pixel_values.shape[2], pixel_values.shape[3]")
    )


def test_data2vec_vision_trains_over_image_sizes_in_two_compiles():
    # BEiT's relative position bias, copied.
    jm = train_on_images("data2vec_vision", [(32, 48), (48, 40), (40, 64), (64, 32)])
    assert misses(jm) == 2, thunder_rs.compile_stats(jm).miss_reasons


def test_swin_recompiles_only_where_its_own_code_branches_on_the_padding():
    # Every stage of these sizes pads up to a multiple of the window: the first size, then one
    # entry with the size symbolic (each was one compile). A size that needs no padding in some
    # stage takes the other side of Swin's ``if pad_values[3] > 0 or pad_values[5] > 0``.
    jm = train_on_images("swin", [(40, 40), (56, 56), (72, 72), (88, 88)])
    assert misses(jm) == 2, thunder_rs.compile_stats(jm).miss_reasons
    train_more = train_on_images("swin", [(40, 40), (56, 56), (64, 64), (72, 72), (96, 96)])
    assert misses(train_more) == 3, thunder_rs.compile_stats(train_more).miss_reasons
    assert "- 1 >= 0 fails" in thunder_rs.compile_stats(train_more).miss_reasons[2]


def index_with_a_size_written(x):
    """BEiT's relative position index, in small: sizes written into a tensor by setitem."""
    n = x.shape[0]
    index = torch.zeros(n + 1, n + 1, dtype=torch.long)
    index[1:, 1:] = torch.arange(n * n).view(n, n)
    index[0, 0:] = n * n
    index[0:, 0] = n * n + 1
    return x.repeat(2)[index[:, :2].reshape(-1) % (2 * n)]


def test_a_size_written_by_setitem_stays_symbolic():
    jf = thunder_rs.jit(index_with_a_size_written)
    for n in [3, 5, 8, 6]:
        x = torch.randn(n)
        torch.testing.assert_close(jf(x), index_with_a_size_written(x))
    assert misses(jf) == 2, thunder_rs.compile_stats(jf).miss_reasons


def resized_by_torch_int(x):
    size = T.utils.generic.torch_int(2 * x.shape[-1] - 1)
    return torch.nn.functional.interpolate(x, size=(size,), mode="linear")


def test_torch_int_of_a_size_stays_symbolic():
    jf = thunder_rs.jit(resized_by_torch_int)
    for n in [4, 6, 9, 5]:
        x = torch.randn(1, 2, n)
        torch.testing.assert_close(jf(x), resized_by_torch_int(x))
    assert misses(jf) == 2, thunder_rs.compile_stats(jf).miss_reasons


def windows(x):
    """Swin's padding up to whole windows of 4, then the windows' means."""
    pad = (4 - x.shape[1] % 4) % 4
    padded = torch.nn.functional.pad(x, (0, pad))
    return padded.view(x.shape[0], -1, 4).mean(-1) + padded.shape[1] // 4


def test_a_size_padded_to_whole_windows_is_viewed_into_them_for_every_size():
    # 9 pads by 3, 12 by 0, 14 by 2: the amount is symbolic and 0 at one size, with no guard.
    jf = thunder_rs.jit(windows)
    for n in [5, 9, 12, 14, 16]:
        x = torch.randn(3, n)
        torch.testing.assert_close(jf(x), windows(x))
    assert misses(jf) == 2, thunder_rs.compile_stats(jf).miss_reasons


def shifted_right(labels):
    """T5's ``_shift_right``, in small."""
    shifted = labels.new_zeros(labels.shape)
    shifted[..., 1:] = labels[..., :-1].clone()
    return shifted * 2


def test_a_shift_right_writes_every_length():
    jf = thunder_rs.jit(shifted_right)
    for n in [5, 7, 2, 3, 9]:
        x = torch.arange(2 * n).view(2, n)
        torch.testing.assert_close(jf(x), shifted_right(x))
    assert misses(jf) == 2, thunder_rs.compile_stats(jf).miss_reasons


def text_batch(kind: str, seed: int, length: int, target: int | None = None) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (2, length), generator=g)
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, length - 3 :] = 0  # the second text is padded on the right
    if kind == "lm":
        return dict(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
    if kind == "cls":
        return dict(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 2]))
    target = length - 2 if target is None else target
    return dict(input_ids=ids, attention_mask=mask, labels=torch.randint(3, VOCAB, (2, target), generator=g))


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, family in FAMILIES.items() if family[2] != "image_lm"])
def test_text_families_train_over_padded_lengths_in_two_compiles(name):
    """Two AdamW steps at each of five lengths, every family of ``test_hf_families``: two compiles,
    three for sequence classifiers, whose first call sets ``config.problem_type`` (the second
    call reads another value there, as eager's does)."""
    cls, config, kind, dtype = FAMILIES[name]
    torch.manual_seed(0)
    model = cls(config).to(dtype).train()
    eager = copy.deepcopy(model)
    jm = thunder_rs.jit(model)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, eager)]
    for length in [8, 12, 20, 9, 27]:
        for step in range(2):
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            outs = _backward_both((jm, eager), text_batch(kind, length + step, length), step)
            torch.testing.assert_close(outs[0].logits, outs[1].logits, **TOLERANCES[dtype])
            assert_grads_close(model, eager, TOLERANCES[dtype])
            for opt in optimizers:
                opt.step()
    expected = UNROLLED.get(name, 3 if kind == "cls" else 2)
    assert misses(jm) == expected, thunder_rs.compile_stats(jm).miss_reasons


#: Families whose forward loops in Python over the sequence (RecurrentGemma's RG-LRU scan,
#: ``for t in range(x.shape[1])``): the loop is unrolled, a compile per length.
#: Longformer pads each text to a multiple of its window: no padding, 1 token or more, each a
#: branch of its own.
UNROLLED = {"recurrent_gemma": 5, "longformer": 5}


def _backward_both(fns, batch: dict, seed: int) -> list:
    """Each of ``fns``' outputs for ``batch``, its loss backpropagated; dropout draws as eager's."""
    outs = []
    for fn in fns:
        torch.manual_seed(seed)
        out = fn(**batch)
        out.loss.backward()
        outs.append(out)
    return outs


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_encoder_decoders_train_with_short_targets_in_two_compiles(name):
    # Targets of 2 and 3 tokens among longer ones: the entry with both lengths symbolic serves them.
    cls, config, _, dtype = FAMILIES[name]
    torch.manual_seed(0)
    model = cls(config).to(dtype).train()
    eager = copy.deepcopy(model)
    jm = thunder_rs.jit(model)
    for i, (length, target) in enumerate([(8, 6), (12, 10), (5, 2), (4, 3), (20, 18)]):
        for m in (model, eager):
            m.zero_grad(set_to_none=True)
        outs = _backward_both((jm, eager), text_batch("seq2seq", i, length, target), i)
        torch.testing.assert_close(outs[0].logits, outs[1].logits, **TOLERANCES[dtype])
        assert_grads_close(model, eager, TOLERANCES[dtype])
    assert misses(jm) == 2, thunder_rs.compile_stats(jm).miss_reasons


def numpy_named(x):
    """Funnel's ``torch.cat(..., axis=...)``: torch takes NumPy's names for ``dim`` and ``keepdim``;
    and ``torch.concatenate``, documented with ``axis``, takes torch's ``dim`` too (Zamba-2's)."""
    joined = torch.concatenate([x, x], axis=0).mean() + torch.concatenate([x, x], dim=-1).mean()
    return torch.cat([x, x * 2], axis=1).sum(axis=0, keepdims=True) + joined


def test_numpy_names_of_arguments_are_torch_s():
    x = torch.randn(3, 4)
    torch.testing.assert_close(thunder_rs.jit(numpy_named)(x), numpy_named(x))


def ranges_by_whole_steps(x):
    """Funnel's relative positions (``arange(-2 * T, 2 * T, 1.0, dtype=torch.int64)``) and whole
    steps of either sign and type: lengths in integers, symbolic."""
    n = x.shape[0]
    a = torch.arange(-n * 2, n * 2, 1.0, dtype=torch.int64)
    b = torch.arange(n, -1, -2, dtype=torch.long)
    c = torch.arange(0, n, 1.0)
    d = torch.arange(n, 0, -1.0, dtype=torch.float64)
    return x.sum() + a.sum() + b.sum() + c.sum() + d.sum(), a, b, c, d


def test_a_range_of_a_size_by_a_whole_float_step_stays_symbolic():
    jf = thunder_rs.jit(ranges_by_whole_steps)
    for n in [3, 5, 8, 6, 2]:
        x = torch.randn(n)
        torch.testing.assert_close(jf(x), ranges_by_whole_steps(x))
    assert misses(jf) == 2, thunder_rs.compile_stats(jf).miss_reasons


class Autocast(torch.nn.Module):
    """``model`` called under CPU autocast to bfloat16."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, **batch):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.model(**batch)


@pytest.mark.slow  # test_grad_rules.py's test_a_float_mask_that_requires_grad_takes_eagers_math_kernel is quick
def test_t5_trains_under_cpu_autocast_over_source_and_target_lengths_as_eager():
    """T5's learned position bias is a float attention mask that requires grad, for which eager's
    CPU attention takes its math kernel: the compiled forward ran the flash kernel, a bfloat16
    step apart (the loss 0.04 apart). Losses and logits now equal to the bit at every length.
    Without dropout: with it, attention's decomposition rounds otherwise than eager's math kernel
    in bfloat16 (which computes in float32)."""
    cls, config, _, _ = FAMILIES["t5"]
    config = copy.deepcopy(config)
    config.dropout_rate = 0.0
    torch.manual_seed(0)
    model = Autocast(cls(config).train())
    eager = copy.deepcopy(model)
    jm = thunder_rs.jit(model)
    for i, (length, target) in enumerate([(8, 6), (12, 10), (5, 3)]):
        outs = _backward_both((jm, eager), text_batch("seq2seq", i, length, target), i)
        torch.testing.assert_close(outs[0].loss, outs[1].loss, rtol=0, atol=0)
        torch.testing.assert_close(outs[0].logits, outs[1].logits, rtol=0, atol=0)
    assert misses(jm) == 2, thunder_rs.compile_stats(jm).miss_reasons
