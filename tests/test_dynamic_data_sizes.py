"""Sizes computed from values (the count of ``nonzero``'s indices, of a boolean mask's elements,
of ``masked_select``'s and ``unique``'s outputs) as symbolic sizes of the trace: a compile for the
first count, then one whose count is a size the call computes, which serves every count (0 and 1
included) that keeps what the trace relied on. Everything against eager: outputs, gradients,
parameters after training, and the compile counts."""

import copy
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import thunder_rs
from test_data_dependent import TopKMoE, assert_calls_match, check_training, train_moe_like_eager, wav2vec2_ctc
from twin_training import misses

pytestmark = pytest.mark.usefixtures("one_thread")


def _mask(n: int, size: int = 16, seed: int = 0) -> torch.Tensor:
    """A boolean mask of ``size`` elements, ``n`` of them set, at places drawn from ``seed``."""
    mask = torch.zeros(size, dtype=torch.bool)
    mask[torch.randperm(size, generator=torch.Generator().manual_seed(seed))[:n]] = True
    return mask


def masked_loss(x, w, labels, mask):
    """Token classification scored on the tokens a mask keeps (``logits[mask]``), as masked
    language modelling and padded batches do."""
    logits = x @ w
    return F.cross_entropy(logits[mask], labels[mask]), logits[mask].shape[0]


def test_a_loss_over_the_masked_tokens_compiles_twice_for_every_count():
    w = torch.randn(8, 5, requires_grad=True)
    labels = torch.randint(0, 5, (16,), generator=torch.Generator().manual_seed(1))
    jfn = thunder_rs.jit(masked_loss)
    calls = [(torch.randn(16, 8), w, labels, _mask(n, seed=n)) for n in (5, 9, 3, 16, 7, 12, 2)]
    assert_calls_match(masked_loss, jfn, calls, grad_of=(1,))
    assert misses(jfn) == 2  # the first count, then every count
    assert "check_sizes" in str(thunder_rs.last_traces(jfn)[-1])


def test_dynamic_false_keeps_counts_constant():
    """``jit(dynamic=False)`` compiles per size, counts read from values included."""
    w = torch.randn(8, 5, requires_grad=True)
    labels = torch.randint(0, 5, (16,), generator=torch.Generator().manual_seed(1))
    jfn = thunder_rs.jit(masked_loss, dynamic=False)
    assert_calls_match(masked_loss, jfn, [(torch.randn(16, 8), w, labels, _mask(n, seed=n)) for n in (5, 9, 3)])
    assert misses(jfn) == 3 and "check_sizes" not in str(thunder_rs.last_traces(jfn)[-1])


def rows_doubled_and_summed(x, m):
    return x[m] * 2, x[m].sum(0)


@pytest.mark.parametrize(
    "counts, compiles",
    [((4, 6, 1, 0, 9), 2), ((4, 0, 6, 1, 9), 2), ((0, 1, 5, 8, 0, 1), 2), ((1, 0, 0, 1, 1, 0), 2)],
    ids=["symbolic-first", "zero-between", "zero-and-one-first", "only-zero-and-one"],
)
def test_counts_of_0_and_1_run_the_symbolic_variant(counts, compiles):
    """A count is a size the trace may see at 0 or 1 (an expert no token or one token chose): the
    symbolic variant serves them where the trace relied on nothing they change. A count that
    changes to 0 or 1 is made symbolic too, traced at 2 (size-obliviously, as torch.compile's
    unbacked sizes): a decode loop whose counts are all 0 or 1 compiles once for them all."""
    x = torch.randn(16, 3, requires_grad=True)
    jfn = thunder_rs.jit(rows_doubled_and_summed)
    assert_calls_match(rows_doubled_and_summed, jfn, [(x, _mask(n)) for n in counts], grad_of=(0,))
    assert misses(jfn) == compiles, thunder_rs.compile_stats(jfn).miss_reasons


def rows_max(x, m):
    return x[m].amax(0)


def test_a_max_over_a_count_of_0_raises_eagers_error():
    """``amax`` over no rows is eager's error; the symbolic variant relied on ``count != 0``."""
    x = torch.randn(16, 3)
    jfn = thunder_rs.jit(rows_max)
    assert_calls_match(rows_max, jfn, [(x, _mask(n)) for n in (4, 6, 1)])
    with pytest.raises(IndexError, match="amax") as expected:
        rows_max(x, _mask(0))
    with pytest.raises(thunder_rs.errors.ThunderError, match="non-zero size") as got:
        jfn(x, _mask(0))
    assert isinstance(got.value, type(expected.value)), (got.value, expected.value)
    assert misses(jfn) == 2  # 4, then every count but 0 (whose compile failed)


def squeezed(x, m):
    """``squeeze(0)`` drops the count's dim where it is 1: a program that differs at 1."""
    return x[m].squeeze(0) * 2, x[m].view(-1, 3)[-1:] + 1


def test_a_count_of_1_that_a_trace_decided_on_compiles_for_it():
    """The symbolic variant relied on ``count != 1`` (``squeeze`` keeps the dim): a count of 1
    fails that guard at its check and runs a variant of its own, with eager's shapes."""
    x = torch.randn(16, 3, requires_grad=True)
    jfn = thunder_rs.jit(squeezed)
    assert_calls_match(squeezed, jfn, [(x, _mask(n)) for n in (4, 6, 1, 5, 1, 9)], grad_of=(0,))
    assert misses(jfn) == 3
    assert jfn(x, _mask(1))[0].shape == (3,) and jfn(x, _mask(7))[0].shape == (7, 3)


def branch_on_count(x, mask):
    y = x[mask]
    return y.sum() if y.shape[0] > 6 else y.mean() * 10


def test_a_branch_on_a_count_is_guarded_where_it_was_read():
    """The trace for counts above 6 relies on ``count > 6``: a count of 4 fails that guard in the
    check right after ``nonzero``, and takes the other path, in a variant of its own whose count is
    symbolic too (``value_sizes.other_side``): 5 and 2 run it, 12 the first again; and counts of 1
    and 0 (a mean of no elements: eager's NaN)."""
    x = torch.randn(16, requires_grad=True)
    jfn = thunder_rs.jit(branch_on_count)
    assert_calls_match(branch_on_count, jfn, [(x, _mask(n)) for n in (3, 8, 10, 4, 12, 9, 5, 2, 12)], grad_of=(0,))
    # 3; then every count above 6 (symbolic); then every count from 2 to 6 (symbolic)
    assert misses(jfn) == 3
    assert thunder_rs.compile_stats(jfn).eager_calls == 0
    assert "a guard they relied on fails" in thunder_rs.compile_stats(jfn).miss_reasons[2]
    assert_calls_match(branch_on_count, jfn, [(x, _mask(1))], grad_of=(0,))
    torch.testing.assert_close(jfn(x, _mask(0)), branch_on_count(x, _mask(0)), equal_nan=True)
    assert misses(jfn) == 3


def test_counts_of_several_calls_and_an_input_size_compared():
    """Two masks' counts meet in one add (equal counts: a guard across two reads), and a count
    slices a symbolic input (a guard between a count and an input size)."""

    def program(x, a, b, w):
        picked = x[a] + x[b]
        return picked * w[: picked.shape[0]].unsqueeze(1)

    jfn = thunder_rs.jit(program, dynamic=True)
    x = torch.randn(16, 3, requires_grad=True)
    calls = [(x, _mask(n, seed=1), _mask(n, seed=2), torch.randn(n + k)) for n, k in ((4, 3), (6, 2), (9, 5))]
    assert_calls_match(program, jfn, calls, grad_of=(0,))


def test_unique_counts_and_masked_select_are_symbolic():
    def program(x, values, w):
        kept, counts = torch.unique(values, return_counts=True)
        return kept * 2, counts.float() * torch.masked_select(x, x > 0).sum(), w * x[x > 0.5].numel()

    jfn = thunder_rs.jit(program)
    g = torch.Generator().manual_seed(0)
    calls = [
        (torch.randn(20, generator=g), torch.randint(0, k, (30,), generator=g), torch.randn(())) for k in (4, 7, 9)
    ]
    assert_calls_match(program, jfn, calls)
    # The first call; then one compile where the second call's output sizes that changed since the
    # first are all symbolic: unique's, the nonzero of masked_select's mask, and that of ``x[x > 0.5]``
    # (a call at the same line; the site's reads are told apart by their order there)
    assert misses(jfn) == 2
    trace = str(thunder_rs.last_traces(jfn)[-1])
    assert "unique" in trace and trace.count("check_sizes") == 3


def test_a_nonzero_matrix_indexes_rows_and_columns():
    def program(x, mask):
        idx = mask.nonzero()
        return x[idx[:, 0], idx[:, 1]] * 3, idx.shape

    x = torch.randn(4, 5, requires_grad=True)
    masks = [torch.rand(4, 5, generator=torch.Generator().manual_seed(s)) > 0.5 for s in range(4)]
    jfn = thunder_rs.jit(program)
    assert_calls_match(program, jfn, [(x, m) for m in masks], grad_of=(0,))
    assert misses(jfn) == 2


def test_a_tiny_moe_trains_as_eager_with_a_compile_per_expert_at_most():
    """Mixtral-style routing: each expert's token count changes every step. After a compile for
    the first batch, each expert's count becomes symbolic when it first changes."""
    torch.manual_seed(0)
    jmodel = train_moe_like_eager(TopKMoE(), [torch.randn(4, 8, 8) for _ in range(10)], lr=0.1)
    stats = thunder_rs.compile_stats(jmodel)
    assert stats.cache_misses <= 1 + 4 + 1 and stats.eager_calls == 0


class MaskedMean(nn.Module):
    """Mean pooling over the tokens that are not padding, by gathering them (``h[mask]``)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 6)

    def forward(self, h, mask):
        kept = self.proj(h)[mask]
        return kept.mean(0) + kept.std(0)


def test_a_module_with_a_symbolic_length_and_a_count():
    """Input lengths change (symbolic input sizes) and so does the count of unpadded tokens."""
    model = MaskedMean()
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    g = torch.Generator().manual_seed(0)
    for length in (8, 11, 9, 14, 12):
        h = torch.randn(2, length, 6, generator=g)
        mask = torch.rand(2, length, generator=g) > 0.3
        out, expected = jmodel(h, mask), eager(h, mask)
        torch.testing.assert_close(out, expected)
        out.sum().backward()
        expected.sum().backward()
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
    assert misses(jmodel) <= 3


def test_wav2vec2_ctc_over_transcripts_of_changing_length():
    """CTC gathers each batch's target tokens with ``masked_select``: a count per batch."""
    model, batches = wav2vec2_ctc()
    g = torch.Generator().manual_seed(1)
    audio = batches[0]["input_values"]
    for cut in (3, 1, 4, 2):
        labels = torch.randint(1, 12, (2, 5), generator=g)
        labels[1, cut:] = -100
        batches.append(dict(input_values=audio, labels=labels))
    model.config.layerdrop = 0.0
    jmodel = check_training(model, batches, steps=len(batches))
    assert misses(jmodel) <= 3


def gathered_mlp(x, w1, w2, mask):
    """Elementwise work on the gathered tokens: fusion regions whose extents are the count."""
    h = x[mask]
    return (torch.nn.functional.gelu(h @ w1) * h.sigmoid().sum(-1, keepdim=True)) @ w2


@pytest.mark.parametrize(
    "executor", ["nvfuser", pytest.param("inductor", marks=[pytest.mark.inductor, pytest.mark.slow])]
)  # (Inductor compiles C++ for its regions here: ~50 s on 2 cores)
def test_fusion_regions_over_a_count_are_defined_once(executor, request):
    """The default CUDA path: nvFuser regions (here the CPU stand-in) take the count as a size
    input, as they take input sizes; Inductor's regions are compiled with it dynamic."""
    ex = request.getfixturevalue("fake_ex") if executor == "nvfuser" else "inductor"
    params = [torch.randn(8, 8, requires_grad=True) for _ in range(2)]
    jfn = thunder_rs.jit(gathered_mlp, executors=[ex, "torch"])
    calls = [(torch.randn(16, 8), *params, _mask(n, seed=n)) for n in (5, 9, 12, 7)]
    assert_calls_match(gathered_mlp, jfn, calls, grad_of=(1, 2))
    assert misses(jfn) == 2
    trace = str(thunder_rs.last_traces(jfn)[-1])
    assert ("nvFusion" in trace or "nvfuser" in trace) if executor == "nvfuser" else "inductor" in trace.lower()


@pytest.mark.gpu
def test_on_cuda_counts_are_symbolic_with_the_default_executors():
    """The default CUDA path (nvFuser regions where it imports) over a count, and the tiny MoE."""
    params = [torch.randn(8, 8, device="cuda", requires_grad=True) for _ in range(2)]
    jfn = thunder_rs.jit(gathered_mlp)
    calls = [(torch.randn(16, 8, device="cuda"), *params, _mask(n, seed=n).cuda()) for n in (5, 9, 12, 7)]
    assert_calls_match(gathered_mlp, jfn, calls, grad_of=(1, 2))
    assert misses(jfn) == 2
    torch.manual_seed(0)
    model = TopKMoE().cuda()
    jmodel = thunder_rs.jit(model)
    for _ in range(4):
        x = torch.randn(4, 8, 8, device="cuda")
        torch.testing.assert_close(jmodel(x), model(x))
    assert misses(jmodel) <= 1 + 4


def selected(x, mask, w):
    return torch.masked_select(x, mask) * 2, x.masked_select(mask[:, :1]).sum() * w


def test_masked_select_is_differentiable_broadcasts_and_its_count_is_symbolic():
    """``masked_select`` is ``input[mask]`` after broadcasting: gradients reach ``input`` through
    the gather (it was an eager fallback, a compile per count)."""
    jfn = thunder_rs.jit(selected)
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn((), requires_grad=True)
    masks = [torch.rand(3, 4, generator=g) > p for p in (0.3, 0.5, 0.7, 0.4)]
    masks[1][:, 0] = True  # mask[:, :1] broadcasts over x's columns: counts of 4, 8 and 12
    assert_calls_match(selected, jfn, [(x, m, w) for m in masks], grad_of=(0, 2))
    assert misses(jfn) <= 3  # the first call; then both sites' counts symbolic, one after the other
    one = thunder_rs.jit(torch.masked_select)
    for args in [(torch.randn(()), torch.tensor(True)), (torch.randn(2, 1), torch.tensor([True, False, True]))]:
        torch.testing.assert_close(one(*args), torch.masked_select(*args))


@pytest.mark.parametrize(
    "mask, error",
    [(torch.ones(3, 4), "expected BoolTensor for mask"), (torch.ones(5, dtype=torch.bool), "must match the size")],
)
def test_masked_select_refuses_what_eager_refuses(mask, error):
    with pytest.raises(RuntimeError, match=error):
        thunder_rs.jit(torch.masked_select)(torch.randn(3, 4), mask)


# -- ints read as sizes (item, tolist) ----------------------------------------------------------


def ragged_sums(x, counts):
    """Rows split into groups of the sizes a tensor holds, as packed sequences and MoE dispatch by
    counts do."""
    parts = torch.split(x, counts.tolist())
    return torch.stack([p.sum(0) * (i + 1) for i, p in enumerate(parts)])


def test_sizes_read_with_tolist_split_rows_with_one_compile_for_all_counts():
    jfn = thunder_rs.jit(ragged_sums)
    x = torch.randn(12, 3, requires_grad=True)
    counts = ([3, 4, 5], [1, 6, 5], [2, 6, 4], [5, 5, 2], [7, 3, 2], [4, 4, 4], [6, 4, 2])
    assert_calls_match(ragged_sums, jfn, [(x, torch.tensor(c)) for c in counts], grad_of=(0,))
    # The first counts; then, from [1, 6, 5] (ints read are traced symbolic at 1 too: its split
    # decided nothing on a count of 1), every counts that sum to 12
    assert misses(jfn) == 2
    assert "check_ints" in str(thunder_rs.last_traces(jfn)[-1])


def experts_by_counts(x, counts, weights):
    """JetMoe's ``ParallelExperts``: the tokens sorted by expert are split by the per-expert counts
    (``tolist``), each expert's rows through its own weights, the results joined; an expert no
    token chose has a count of 0."""
    parts = x.split(counts.tolist())
    return torch.cat([F.linear(part, weights[i]) for i, part in enumerate(parts)]) * 2


def test_counts_of_zero_read_with_tolist_are_symbolic_sizes_too():
    # An int read at 0 stayed a constant 0 when the read turned symbolic: each place of the
    # experts no token chose was a compile of its own (JetMoe, 16 compiles over 16 small batches).
    jfn = thunder_rs.jit(experts_by_counts)
    x, weights = torch.randn(12, 3, requires_grad=True), torch.randn(4, 5, 3, requires_grad=True)
    counts = ([3, 4, 5, 0], [0, 6, 2, 4], [4, 0, 0, 8], [2, 3, 3, 4], [0, 0, 12, 0], [6, 0, 6, 0])
    assert_calls_match(experts_by_counts, jfn, [(x, torch.tensor(c), weights) for c in counts], grad_of=(0, 2))
    assert misses(jfn) == 2, thunder_rs.compile_stats(jfn).miss_reasons


def skipping_empty_experts(x, counts, weights):
    """As ``experts_by_counts``, skipping the experts with no rows (``if n == 0``)."""
    sizes = counts.tolist()
    outs = [F.linear(part, weights[i]) for i, (n, part) in enumerate(zip(sizes, x.split(sizes))) if n != 0]
    return torch.cat(outs).tanh()


def test_a_branch_on_a_count_traced_at_zero_takes_the_other_side_as_eager():
    jfn = thunder_rs.jit(skipping_empty_experts)
    x, weights = torch.randn(12, 3, requires_grad=True), torch.randn(4, 5, 3, requires_grad=True)
    counts = ([3, 4, 5, 0], [0, 6, 2, 4], [4, 0, 0, 8], [2, 3, 3, 4], [0, 0, 12, 0], [5, 1, 6, 0])
    assert_calls_match(skipping_empty_experts, jfn, [(x, torch.tensor(c), weights) for c in counts], grad_of=(0, 2))


@pytest.mark.slow
def test_jetmoe_trains_as_eager_with_experts_no_token_chose_in_two_compiles():
    transformers = pytest.importorskip("transformers")
    config = transformers.JetMoeConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=2,
        num_key_value_heads=2,
        kv_channels=8,
        intermediate_size=64,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=16,
    )
    torch.manual_seed(0)
    model = transformers.JetMoeForCausalLM(config).to(torch.float64).train()
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(3, 50, (1, 3), generator=g) for _ in range(8)]  # 6 choices of 4 experts
    jmodel = check_training(model, [dict(input_ids=ids, labels=ids) for ids in batches], steps=len(batches))
    assert misses(jmodel) == 2, thunder_rs.compile_stats(jmodel).miss_reasons


class SortedExperts(nn.Module):
    """DeepSeek-style MoE dispatch: tokens sorted by expert, each expert run on its slice of the
    sorted tokens, as many as ``tolist`` of the per-expert counts says."""

    def __init__(self, dim: int = 6, experts: int = 3):
        super().__init__()
        self.gate = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(nn.Linear(dim, dim) for _ in range(experts))

    def forward(self, x):
        chosen = self.gate(x).argmax(-1)
        order = chosen.argsort()
        counts = torch.bincount(chosen, minlength=len(self.experts)).tolist()
        outs, start = [], 0
        for expert, n in zip(self.experts, counts):
            if n == 0:
                continue
            outs.append(expert(x[order[start : start + n]]))
            start += n
        out = torch.empty_like(x)
        out[order] = torch.cat(outs)
        return out


def test_a_moe_dispatching_by_counts_read_with_tolist_trains_as_eager():
    torch.manual_seed(0)
    model = SortedExperts()
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    g = torch.Generator().manual_seed(3)
    for _ in range(6):
        x = torch.randn(24, 6, generator=g)
        out, expected = jmodel(x), eager(x)
        torch.testing.assert_close(out, expected)
        out.square().sum().backward()
        expected.square().sum().backward()
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
    assert misses(jmodel) == 2


def test_a_count_read_with_item_is_a_symbolic_length():
    def program(x, mask):
        n = mask.sum().item()
        return x[:n] * 2, torch.arange(n) + n

    jfn = thunder_rs.jit(program)
    assert_calls_match(program, jfn, [(torch.randn(16), _mask(n)) for n in (4, 9, 13, 2, 0, 11)])
    assert misses(jfn) == 2  # the first count; then all counts (``x[:0]``, ``arange(0)``)


def sliced_by_tensors(x, start, stop):
    y = x.clone()
    y[start:stop] = 0
    return x[:stop] * 2, y


def test_slice_bounds_that_are_tensors_are_symbolic_lengths():
    """``x[t0:t1]`` takes the tensors' values by ``__index__`` in eager; read as ``item()``, a bound
    that changes is a symbolic size of the next compile (it compiled once per value)."""
    jfn = thunder_rs.jit(sliced_by_tensors)
    calls = [(torch.randn(16), torch.tensor(n // 2), torch.tensor(n)) for n in (4, 9, 13, 6, 11, 8)]
    assert_calls_match(sliced_by_tensors, jfn, calls)
    assert misses(jfn) == 2  # the first values; then every read whose value changed, symbolic


@pytest.mark.parametrize("bound", [torch.tensor(2.0), torch.tensor([1, 2]), torch.tensor(True)])
def test_slice_bounds_that_are_other_tensors_are_taken_or_refused_as_eager(bound):
    x = torch.randn(6)
    try:
        expected = x[:bound]
    except TypeError as e:
        with pytest.raises(TypeError, match=re.escape(str(e))):
            thunder_rs.jit(lambda x, b: x[:b])(x, bound)
    else:
        torch.testing.assert_close(thunder_rs.jit(lambda x, b: x[:b])(x, bound), expected)


@pytest.mark.parametrize(
    "key",
    [
        (torch.tensor([True, False, False, True, False]),),  # longer than the dim, its true elements within it
        (slice(None), torch.ones(3, 5, dtype=torch.bool)),
        (Ellipsis, torch.ones(5, dtype=torch.bool)),
        (None, torch.ones(2, 4, dtype=torch.bool)),
    ],
)
def test_a_mask_of_another_shape_than_the_dims_it_indexes_raises_as_eager(key):
    """Eager checks the mask's shape against the indexed dims; its nonzero indices alone would
    take what a longer mask's true elements select (a result where eager raises)."""
    x = torch.randn(2, 3, 4) if len(key) > 1 else torch.randn(4)
    with pytest.raises(IndexError) as eager:
        x[key]
    with pytest.raises(IndexError, match=re.escape(str(eager.value))):
        thunder_rs.jit(lambda x, *k: x[k])(x, *key)
    with pytest.raises(IndexError, match=re.escape(str(eager.value))):
        thunder_rs.jit(lambda x, *k: x.clone().__setitem__(k, 0.0))(x, *key)


def test_torchvision_faster_rcnn_inference_keeps_its_box_counts_symbolic():
    """Detection: the RPN's and the ROI heads' ``nms`` (a torchvision op sized by its data), score
    thresholds (``torch.where``) and ``topk`` over what they kept; the anchors are stored anew on
    each call (``AnchorGenerator.set_cell_anchors``). Boxes, labels and scores as eager's, and a
    compile for the first image, the path after it, and every box count (it was one per image)."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3
    ).eval()
    jmodel = thunder_rs.jit(model)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _ in range(3):
            images = [torch.rand(3, 160, 160, generator=g)]
            for got, expected in zip(jmodel(images), model(images)):
                torch.testing.assert_close(got, expected)
    # The first call sets MultiScaleRoIAlign's level mapper up (another path from the second on)
    assert misses(jmodel) <= 3


def test_counts_read_with_tolist_and_given_to_numpy_are_ints_there():
    """numpy makes an object array of objects it does not know: a symbolic count is an int to it
    (specialised), so ``np.cumsum`` of counts gives eager's int64 array."""
    np = pytest.importorskip("numpy")

    def program(x, counts):
        sizes = counts.tolist()
        ends = np.cumsum(sizes)
        return [x[e - n : e].sum() for n, e in zip(sizes, ends.tolist())], ends.dtype == np.int64

    jfn = thunder_rs.jit(program)
    assert_calls_match(program, jfn, [(torch.randn(12), torch.tensor(c)) for c in ([3, 4, 5], [2, 6, 4], [5, 5, 2])])
    assert jfn(torch.randn(12), torch.tensor([4, 4, 4]))[1] is True


def test_torch_compile_graphs_that_capture_data_dependent_sizes():
    """With Dynamo capturing them (``capture_dynamic_output_shape_ops``, ``capture_scalar_outputs``),
    its graph holds ``nonzero``, ``item()`` and ``aten.sym_size`` of their results: thunder_rs
    keeps those sizes symbolic as it does its own (``aten.sym_size`` was read as a value)."""
    from thunder_rs.dynamo import compiled_graphs  # noqa: PLC0415 (imports Dynamo)

    def program(x, mask, counts):
        y = x[mask] * 2
        return y.sum() + y.shape[0], x[: counts.sum().item()].sum()

    torch._dynamo.reset()
    earlier = {id(g) for g in compiled_graphs()}
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True, capture_scalar_outputs=True):
        compiled = torch.compile(program, backend="thunder_rs")
        g = torch.Generator().manual_seed(0)
        for k in (5, 9, 3, 12, 7):
            args = (torch.randn(16, generator=g), torch.rand(16, generator=g) > 0.5, torch.tensor([k, 1]))
            torch.testing.assert_close(compiled(*args), program(*args))
    graphs = [g for g in compiled_graphs() if id(g) not in earlier and g.jitted is not None]
    assert sum(misses(g.jitted) for g in graphs) <= 3  # the first call, then each size made symbolic


def test_torchvision_roi_pooling_over_box_counts_keeps_them_symbolic():
    """torchvision's multi-scale RoI pooling sizes its output by ``len(rois)``, which must return
    an int: the box count was specialised (a compile per image for Faster R-CNN ResNet-50 FPN
    inference). While tracing, that module's ``len`` gives the symbolic size; it is restored after."""
    torchvision = pytest.importorskip("torchvision")
    pool = torchvision.ops.MultiScaleRoIAlign(["a", "b"], output_size=3, sampling_ratio=2)
    features = {"a": torch.randn(1, 4, 16, 16), "b": torch.randn(1, 4, 8, 8)}
    eager = copy.deepcopy(pool)
    jfn = thunder_rs.jit(pool)
    for n in (5, 9, 7, 12):
        corners = torch.rand(n, 2) * 40
        boxes = torch.cat([corners, corners + 4 + torch.rand(n, 2) * 20], dim=1)
        torch.testing.assert_close(jfn(features, [boxes], [(64, 64)]), eager(features, [boxes], [(64, 64)]))
    assert misses(jfn) == 2  # the first count (and the level mapper the first call sets up); all others
    assert "len" not in vars(torchvision.ops.poolers)


def test_mask_pasting_sizes_masks_by_int_of_boxes_as_symbolic_sizes():
    """Mask R-CNN's ``paste_mask_in_image`` sizes each mask by ``int(box[2] - box[0] + 1)``; while
    tracing, that module's ``int`` reads the truncated value as a symbolic size once it changed.
    A box that ``int`` refuses (NaN) raises eager's error."""
    roi_heads = pytest.importorskip("torchvision.models.detection.roi_heads")

    def paste(mask, box):
        return roi_heads.paste_mask_in_image(mask, box, 40, 50)

    jfn = thunder_rs.jit(paste)
    for box in ([3.0, 4.0, 20.5, 30.2], [5.0, 6.0, 25.9, 28.0], [4.0, 3.0, 30.0, 33.7], [7.0, 8.0, 17.0, 36.0]):
        mask, box = torch.rand(28, 28), torch.tensor(box).long()
        torch.testing.assert_close(jfn(mask, box), paste(mask, box))
    assert misses(jfn) == 2
    assert "int" not in vars(roi_heads)
    nan_box = torch.tensor([3.0, 4.0, float("nan"), 30.0])
    with pytest.raises(ValueError, match="cannot convert float NaN to integer"):
        paste(torch.rand(28, 28), nan_box)
    with pytest.raises(ValueError, match="cannot convert float NaN to integer"):
        thunder_rs.jit(paste)(torch.rand(28, 28), nan_box)


def test_mask_pasting_clamps_boxes_to_the_image_with_tensor_max_and_min():
    """``paste_mask_in_image`` clamps each box to the image with Python's ``max(box[0], 0)`` and
    ``min(box[2] + 1, im_w)``, which read a bool per bound; while tracing, that module's ``max``
    and ``min`` of integer tensors give ``torch.maximum``/``torch.minimum``, so boxes that cross
    the border and boxes inside it share variants (6 compiles over these 7 boxes before, one per
    pattern of the comparisons). A bound clamped to 0 is a symbolic size as any other (it was a
    constant 0, and the next box's 3 there compiled a third variant). Other arguments take the
    builtins."""
    roi_heads = pytest.importorskip("torchvision.models.detection.roi_heads")

    def paste(mask, box):
        return roi_heads.paste_mask_in_image(mask, box, 40, 50)

    jfn = thunder_rs.jit(paste)
    boxes = [[3, 4, 20, 30], [-5, 6, 25, 28], [4, -3, 55, 33], [7, 8, 17, 46], [-2, -1, 60, 45], [10, 12, 30, 20]]
    for box in [*boxes, boxes[0]]:
        mask, box = torch.rand(28, 28), torch.tensor(box)
        torch.testing.assert_close(jfn(mask, box), paste(mask, box))
    assert misses(jfn) == 2, thunder_rs.compile_stats(jfn).miss_reasons
    assert not {"max", "min"} & set(vars(roi_heads))


def clamped(x, t):
    return x[max(t, 0) : min(t + 4, x.shape[0])] * 2, max(t * 0.5, 0.25), min(3, 4, t)


def test_max_and_min_of_integer_tensors_as_eager_others_builtin(monkeypatch):
    """``max``/``min`` as ``torch_overrides`` gives them (this module made one of them): of an
    integer tensor and an int, the same value as a tensor; of a float tensor, or of three
    arguments, Python's own (its bool read)."""
    from thunder_rs.core.lang import torch_overrides  # noqa: PLC0415 (the override under test)

    names = {"max": torch_overrides._sized_max, "min": torch_overrides._sized_min}
    monkeypatch.setitem(torch_overrides.SIZED_BUILTINS, __name__, names)
    jfn = thunder_rs.jit(clamped)
    for t in (-3, 2, 5, 8, -1, 7):
        x, t = torch.randn(10), torch.tensor(t)
        torch.testing.assert_close(jfn(x, t), clamped(x, t))
    # the first call; the integer bounds symbolic; then the float ``max``'s bool read, each way
    assert misses(jfn) == 4, thunder_rs.compile_stats(jfn).miss_reasons
    reasons = thunder_rs.compile_stats(jfn).miss_reasons
    assert sum("__bool__" in r for r in reasons) == 2, reasons


def sized_by_int(x, t):
    return x[: int(t * 2)] + int(t)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_int_of_a_tensor_in_a_module_of_sized_builtins_truncates_as_eager(monkeypatch, dtype):
    """``int`` as ``torch_overrides._sized_int`` gives there (this module made one of them): the
    value truncated toward zero as ``int`` truncates (2.7, -0.5, a NaN's error), symbolic once it
    changed."""
    from thunder_rs.core.lang import torch_overrides  # noqa: PLC0415 (the override under test)

    monkeypatch.setitem(torch_overrides.SIZED_BUILTINS, __name__, {"int": torch_overrides._sized_int})
    jfn = thunder_rs.jit(sized_by_int)
    values = [2.7, 3.2, 5.9, -0.5, 4.0] if dtype.is_floating_point else [2, 3, 5, 4]
    for v in values:
        x, t = torch.randn(16), torch.tensor(v, dtype=dtype)
        torch.testing.assert_close(jfn(x, t), sized_by_int(x, t))
    # the first value; then the others symbolic; a float's -0.5 (t * 2 truncates to -1: constant)
    assert misses(jfn) == (3 if dtype.is_floating_point else 2)
    if dtype.is_floating_point:
        with pytest.raises(ValueError, match="cannot convert float NaN to integer"):
            jfn(torch.randn(16), torch.tensor(float("nan")))
    two = torch.tensor([1, 2], dtype=dtype)
    with pytest.raises(ValueError, match="only one element tensors can be converted") as expected:
        sized_by_int(torch.randn(16), two)
    with pytest.raises(ValueError, match=re.escape(str(expected.value))):
        jfn(torch.randn(16), two)
