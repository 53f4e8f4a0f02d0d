"""Sizes that change together become symbolic together, in one compile rather than one each:
the same dim of the other items of a list argument when one item's changed
(``dynamic.siblings``), each item with size inputs of its own (items' sizes are equal by
chance); and every size computed from values that differs from the compile before
(``ValueReads._groups``), not only the one whose check failed. Against eager: outputs,
gradients, parameters after training, and the exact compile counts."""

import copy

import pytest
import torch
import torch.nn as nn
from torch.utils._pytree import tree_flatten

import thunder_rs
from thunder_rs.core.acquisition.dynamic import siblings
from test_data_dependent import assert_calls_match
from twin_training import misses

pytestmark = pytest.mark.usefixtures("one_thread")


def _mask(n: int, size: int = 16, seed: int = 0) -> torch.Tensor:
    """A boolean mask of ``size`` elements, ``n`` of them set, at places drawn from ``seed``."""
    mask = torch.zeros(size, dtype=torch.bool)
    mask[torch.randperm(size, generator=torch.Generator().manual_seed(seed))[:n]] = True
    return mask


# -- items of a list --------------------------------------------------------------------------------


def pooled(xs, w):
    return torch.stack([(x @ w).relu().mean(0) for x in xs]).sum(0)


def _rows(lengths, container=list):
    g = torch.Generator().manual_seed(sum(lengths))
    return container(torch.randn(n, 4, generator=g, requires_grad=True) for n in lengths)


def test_the_other_items_of_a_list_turn_symbolic_with_the_one_that_changed():
    """One item's length changed: the other items' lengths are symbolic in that compile too, so
    later calls where they change compile nothing."""
    w = torch.randn(4, 3, requires_grad=True)
    jfn = thunder_rs.jit(pooled)
    calls = [(_rows(n), w) for n in ((2, 3, 4), (5, 3, 4), (6, 7, 8), (3, 9, 2))]
    for xs, _ in calls:
        assert_calls_match(pooled, jfn, [(xs, w)], grad_of=(1,))
        expected = torch.autograd.grad(pooled(xs, w).sum(), xs)
        torch.testing.assert_close(torch.autograd.grad(jfn(xs, w).sum(), xs), expected)
    assert misses(jfn) == 2
    assert thunder_rs.compile_stats(jfn).miss_reasons[1] == (
        "xs[0]: shape torch.Size([2, 4]) -> torch.Size([5, 4]); "
        "compiled with symbolic sizes xs[0].shape[0], xs[1].shape[0], xs[2].shape[0]"
    )


def test_the_items_of_a_tuple_are_not_alike():
    """A tuple's items are not alike by convention (``(input, mask)``): only the one that changed
    turns symbolic, and a change of another compiles again."""
    w = torch.randn(4, 3)
    jfn = thunder_rs.jit(pooled)
    for lengths in ((2, 3, 4), (5, 3, 4), (6, 7, 4), (3, 9, 5)):
        xs = _rows(lengths, tuple)
        torch.testing.assert_close(jfn(xs, w), pooled(xs, w))
    assert misses(jfn) == 4


def test_siblings_have_the_changed_tensors_place_rank_and_dtype():
    x, m = torch.zeros(3, 4), torch.zeros(3, dtype=torch.bool)
    args = ([x, x, x[:, :1].squeeze(1), m], dict(a=[x, x], b=x))
    flat, spec = tree_flatten((args, {}))
    assert siblings(spec, flat, [(0, 0)]) == {(1, 0)}  # not the vector, nor the mask, nor a's
    assert siblings(spec, flat, [(4, 1)]) == {(5, 1)}
    assert siblings(spec, flat, [(6, 0)]) == set()  # b is no item of a list


def boxes_loss(images, targets):
    """Per image, its target's boxes and labels: the box count is each item's own size."""
    loss = 0
    for image, target in zip(images, targets):
        loss = loss + (target["boxes"] * image.mean()).sum() + target["labels"].float().sum()
    return loss


def _targets(counts):
    g = torch.Generator().manual_seed(sum(counts))
    return [dict(boxes=torch.rand(n, 4, generator=g), labels=torch.randint(1, 3, (n,), generator=g)) for n in counts]


def test_items_of_a_list_have_size_inputs_of_their_own():
    """Two targets' box counts equal at the compile that made them symbolic (3 and 3) do not share
    a size input (duck sizing), so a call where they differ compiles nothing; one target's boxes and
    labels still share theirs. A count of 1 is compiled for, as a size of 1 is."""
    images = [torch.randn(3, 8, 8, requires_grad=True) for _ in range(2)]
    jfn = thunder_rs.jit(boxes_loss)
    for counts in ((2, 2), (3, 3), (4, 5), (5, 4), (2, 2)):
        _assert_matches_with_image_grads(jfn, images, _targets(counts))
    assert misses(jfn) == 2
    reason = thunder_rs.compile_stats(jfn).miss_reasons[1]
    symbolic = "targets[0]['boxes'].shape[0], targets[1]['boxes'].shape[0] (and 2 sizes equal to them)"
    assert reason.endswith(f"compiled with symbolic sizes {symbolic}")
    _assert_matches_with_image_grads(jfn, images, _targets((1, 3)))
    assert misses(jfn) == 3


def _assert_matches_with_image_grads(jfn, images, targets):
    out, expected = jfn(images, targets), boxes_loss(images, targets)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(torch.autograd.grad(out, images), torch.autograd.grad(expected, images))


def stacked(xs):
    return torch.stack(xs).sum(0) * 2


def test_items_a_program_relies_on_being_equal_are_guarded_so():
    """``torch.stack`` needs its items' sizes equal: the trace guards it, and unequal items raise
    as eager raises."""
    jfn = thunder_rs.jit(stacked)
    for lengths in ((2, 2), (3, 3), (4, 4)):
        xs = [torch.randn(n) for n in lengths]
        torch.testing.assert_close(jfn(xs), stacked(xs))
    assert misses(jfn) == 2
    assert "guard t0 - t1 == 0" in str(thunder_rs.last_traces(jfn)[-1])
    xs = [torch.randn(4), torch.randn(5)]
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        stacked(xs)
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        jfn(xs)


# -- sizes computed from values -------------------------------------------------------------------


def two_masks(x, w, a, b):
    first = (x[a] @ w).sum()
    return first + (x[b] @ w).square().mean()


@pytest.mark.parametrize(
    "counts, compiles",
    [
        # the first call; then both counts changed: both symbolic in one compile
        (((3, 4), (5, 6), (7, 8), (4, 9)), 2),
        # the second count stayed at the second call: constant there, symbolic once it changes
        (((3, 4), (5, 4), (7, 8), (4, 9)), 3),
    ],
)
def test_every_count_that_changed_since_the_compile_before_is_symbolic(counts, compiles):
    x, w = torch.randn(16, 4, requires_grad=True), torch.randn(4, 3, requires_grad=True)
    jfn = thunder_rs.jit(two_masks)
    calls = [(x, w, _mask(n, seed=1), _mask(k, seed=2)) for n, k in counts]
    assert_calls_match(two_masks, jfn, calls, grad_of=(0, 1))
    assert misses(jfn) == compiles
    assert str(thunder_rs.last_traces(jfn)[-1]).count("check_sizes") == 2


def masked_sums(x, masks):
    return sum((x[m] * (i + 1)).sum(0) for i, m in enumerate(masks))


def test_the_reads_of_one_line_are_told_apart_by_their_order():
    """A line read once per item (a loop over images): each read is compared with the read in the
    same place of the compile before."""
    x = torch.randn(16, 3, requires_grad=True)
    jfn = thunder_rs.jit(masked_sums)
    counts = ((3, 4, 5), (6, 7, 8), (2, 9, 4), (5, 5, 5))
    calls = [(x, [_mask(n, seed=s) for s, n in enumerate(c)]) for c in counts]
    assert_calls_match(masked_sums, jfn, calls, grad_of=(0,))
    assert misses(jfn) == 2


def scaled_rows(x, mask):
    return x[mask].sum(0) * x.shape[0]


def test_a_count_that_changed_with_an_input_size_is_symbolic_in_the_same_compile():
    """A compile for a new input size compares the counts with the compile before it too."""
    jfn = thunder_rs.jit(scaled_rows)
    calls = [(torch.randn(n, 3, requires_grad=True), _mask(k, size=n)) for n, k in ((16, 3), (20, 5), (24, 7))]
    assert_calls_match(scaled_rows, jfn, calls, grad_of=(0,))
    assert misses(jfn) == 2


class PerItemLoss(nn.Module):
    """Per item of a batch given as lists, a loss over the rows its mask keeps: the items' lengths
    are input sizes, the kept rows' counts sizes computed from values."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, feats, masks):
        return sum(self.lin(f[m]).square().mean() for f, m in zip(feats, masks))


def test_a_module_over_lists_of_items_and_their_masks_trains_as_eager_in_two_compiles():
    torch.manual_seed(0)
    model = PerItemLoss()
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, eager)]
    g = torch.Generator().manual_seed(0)
    for step in range(6):
        lengths = torch.randint(4, 12, (3,), generator=g).tolist()
        feats = [torch.randn(n, 4, generator=g) for n in lengths]
        masks = [_mask(int(torch.randint(2, n, (), generator=g)), size=n, seed=step) for n in lengths]
        loss, expected = jmodel(feats, masks), eager(feats, masks)
        torch.testing.assert_close(loss, expected)
        loss.backward()
        expected.backward()
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
        for opt in opts:
            opt.step()
            opt.zero_grad()
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p, q)
    assert misses(jmodel) == 2


# -- a guard on a symbolic count --------------------------------------------------------------------


def sample(x, mask):
    """torchvision's ``BalancedPositiveNegativeSampler``: at most 5 of the indices a mask keeps."""
    idx = torch.where(mask)[0]
    kept = idx[: min(idx.numel(), 5)]
    return x[kept].sum(0) * kept.shape[0]


def capped_by_item(x, mask):
    n = mask.sum().item()
    return x[:n].sum() if n > 4 else x[:n].mean()


@pytest.mark.parametrize(
    "fn, counts",
    [
        (sample, (3, 7, 9, 2, 4, 12, 3, 6)),  # min(count, 5) relies on count >= 5, then on count < 5
        (capped_by_item, (3, 7, 9, 2, 4, 12, 3, 6)),  # ints read with item(): checked as a size too
    ],
)
def test_each_outcome_of_a_guard_on_a_symbolic_count_has_a_symbolic_variant(fn, counts):
    """The first count; then every count the first symbolic variant's guard holds for; then every
    count on the guard's other side, symbolic too, where it compiled a variant per count before
    (one per count up to the variant limit, then eager calls). Calls go from one to the other by
    the value tree without compiling again."""
    x = torch.randn(16, 3, requires_grad=True)
    jfn = thunder_rs.jit(fn)
    assert_calls_match(fn, jfn, [(x, _mask(n)) for n in counts], grad_of=(0,))
    stats = thunder_rs.compile_stats(jfn)
    assert (stats.cache_misses, stats.eager_calls) == (3, 0)
    assert str(thunder_rs.last_traces(jfn)[-1]).count("check_") == 1


# -- a cache's sizes, changed with what hid them ----------------------------------------------------------------------


class Window:
    """A sliding window over keys, as transformers' ``DynamicSlidingWindowLayer``: the last
    ``size - 1`` keys, sliced from the keys it attended to, and the count of tokens it saw."""

    def __init__(self, prompt: torch.Tensor, size: int = 4):
        self.size, self.seen, self.keys = size, prompt.shape[1], prompt[:, -size + 1 :]


def window_step(x, cache: Window):
    keys = torch.cat([cache.keys, x], 1)
    cache.keys = keys[:, -cache.size + 1 :]
    cache.seen += x.shape[1]
    return keys.softmax(1).sum(1) * cache.seen


def window_steps(jf, prompts, steps: int = 4) -> None:
    """Steps of ``window_step`` over a window of each prompt, compiled and eager, compared."""
    for base in prompts:
        compiled, eager = Window(base), Window(base.clone())
        for _ in range(steps):
            x = torch.randn(2, 1, 3, dtype=torch.float64)
            torch.testing.assert_close(jf(x, compiled), window_step(x, eager))
            assert compiled.seen == eager.seen and compiled.keys.stride() == eager.keys.stride()
            torch.testing.assert_close(compiled.keys, eager.keys)


def test_a_count_changing_with_the_strides_of_a_window_turns_symbolic_at_once():
    # The window's keys are a slice of the prompt's (strides of 5 tokens), then of each step's
    # (of 4): the second step fails their guard on strides and the count's on its value. The
    # count turned symbolic only at the third step when the strides hid it; the strides that
    # changed are symbolic too.
    jf = thunder_rs.jit(window_step)
    window_steps(jf, [torch.randn(2, 5, 3, dtype=torch.float64)], steps=6)
    stats = thunder_rs.compile_stats(jf)
    assert stats.cache_misses == 2, stats.miss_reasons
    assert stats.miss_reasons[1].endswith("compiled with symbolic sizes cache.keys.stride(0), cache.seen")


def test_windows_of_prompts_of_every_length_share_one_entry():
    # The first step's keys step over the prompt's length: a stride read per call. It compiled
    # once per prompt length (Mistral's and Gemma-2's generate, one per prompt).
    jf = thunder_rs.jit(window_step)
    window_steps(jf, [torch.randn(2, n, 3, dtype=torch.float64) for n in (5, 7, 9, 6, 12)])
    assert misses(jf) == 2, thunder_rs.compile_stats(jf).miss_reasons


def doubled_keys(cache: Window):
    return cache.keys * cache.seen, cache.keys.is_contiguous(), cache.keys.transpose(0, 1).reshape(-1)


def test_a_window_s_strides_in_another_order_recompile():
    # Eager's product keeps the order of the keys' strides, and whether the reshape views
    # depends on which dims step over which: an entry of symbolic strides serves keys of the
    # order and steps it was compiled for.
    jf = thunder_rs.jit(doubled_keys)
    keys = [torch.randn(2, 5, 3)[:, -2:].transpose(0, 1), torch.randn(2, 5, 4)[:, -2:, :3].transpose(0, 1)]
    keys.append(torch.randn(2, 5, 4)[:, -2:, :3])  # strides (3, 15, 1), (4, 20, 1), then (20, 4, 1)
    for k in [*keys, keys[0]]:
        window = Window(torch.zeros(2, 5, 3))
        window.keys, window.seen = k, 3
        (out, contiguous, flat), (want, want_contiguous, want_flat) = jf(window), doubled_keys(window)
        torch.testing.assert_close((out, flat), (want, want_flat))
        assert out.stride() == want.stride() and contiguous == want_contiguous
    assert misses(jf) == 3, thunder_rs.compile_stats(jf).miss_reasons
    assert (
        thunder_rs.compile_stats(jf)
        .miss_reasons[1]
        .endswith("compiled with symbolic sizes cache.keys.stride(0), cache.keys.stride(1)")
    )


class Layer:
    """A cache layer made empty, filled by the prompt, grown by each step (transformers'
    ``DynamicLayer``)."""

    keys = None


def cached_step(x, layer: Layer):
    layer.keys = x if layer.keys is None else torch.cat([layer.keys, x], 1)
    return (layer.keys.softmax(1) * x[:, -1:]).sum(1)


def decode(call, prompt: torch.Tensor, steps: int = 4):
    layer = Layer()
    outs = [call(prompt, layer)]
    for i in range(steps):
        outs.append(call(prompt[:, -1:] * (i + 2), layer))
    return outs, layer


def test_a_new_cache_of_another_batch_is_compared_with_the_steps_of_the_last():
    # Each decode makes a new layer; its first step was compared with the entry compiled last,
    # the prompt's (no keys yet), so the layer's batch stayed constant, guarded equal to the
    # input's through torch.cat: a compile more for every batch.
    jf = thunder_rs.jit(cached_step)
    for batch, length in [(2, 5), (3, 5), (4, 7), (2, 6), (5, 5)]:
        prompt = torch.randn(batch, length, 3, generator=torch.Generator().manual_seed(batch))
        (outs, layer), (want, want_layer) = decode(jf, prompt), decode(cached_step, prompt)
        torch.testing.assert_close(outs, want)
        torch.testing.assert_close(layer.keys, want_layer.keys)
    # The first decode: its prompt, its first step, its second with the length symbolic; the
    # second: its prompt and first step with the batch symbolic too; the others reuse them.
    assert misses(jf) == 5, thunder_rs.compile_stats(jf).miss_reasons


def _layer_holding(keys) -> Layer:
    layer = Layer()
    layer.keys = keys
    return layer


def test_a_new_cache_with_a_step_s_input_sizes_is_not_read_for_the_step_s_sizes():
    # Beam search's prefill of an encoder-decoder: the decoder's input is one token per row, as at
    # every step, and the cache is new (its layers' keys None). The step's entry with the batch
    # symbolic read its layer's keys' length from None to check its guards: AttributeError.
    jf = thunder_rs.jit(cached_step)
    for batch, length in [(2, None), (2, 1), (2, 2), (3, 4), (4, None), (5, 3)]:
        g = torch.Generator().manual_seed(batch)
        x = torch.randn(batch, 1, 3, generator=g)
        keys = None if length is None else torch.randn(batch, length, 3, generator=g)
        layer, want_layer = _layer_holding(keys), _layer_holding(keys)
        torch.testing.assert_close(jf(x, layer), cached_step(x, want_layer))
        torch.testing.assert_close(layer.keys, want_layer.keys)
    reasons = thunder_rs.compile_stats(jf).miss_reasons
    assert misses(jf) == 5, reasons
    assert "reads a size of a tensor that an argument object no longer holds" in reasons[4]


# -- a held tensor a symbolic size meets -------------------------------------------------------------


class CrossCache:
    """An encoder-decoder's cache of the cross-attention's keys: None until the first step."""

    def __init__(self, keys=None):
        self.keys = keys


def cross_attention(q, mask, cache):
    keys = q if cache.keys is None else cache.keys
    return (q @ keys.transpose(-1, -2) + mask[:, None, :].log()).softmax(-1) @ keys


def test_a_held_tensor_whose_size_a_symbolic_size_met_is_symbolic_with_it():
    """The prompt at two lengths made the mask's length symbolic; the first step at the first
    length meets it with the cache's keys, of that length, constant (the keys never changed yet):
    traced with them symbolic at once, the step at the second length is served (PLBart's and
    Blenderbot's beam search compiled each step again at a second prompt length)."""
    jfn = thunder_rs.jit(cross_attention)
    g = torch.Generator().manual_seed(0)
    calls = []
    for n, cached in ((8, False), (12, False), (8, True), (12, True), (10, True)):
        q = torch.randn(2, n, 4, generator=g, requires_grad=True)
        mask = torch.rand(2, n, generator=g) + 0.5
        cache = CrossCache(torch.randn(2, n, 4, generator=g, requires_grad=True) if cached else None)
        calls.append((q, mask, cache))
    for q, mask, cache in calls:
        out, expected = jfn(q, mask, cache), cross_attention(q, mask, cache)
        torch.testing.assert_close(out, expected)
        wrt = [q] if cache.keys is None else [q, cache.keys]
        for a, e in zip(torch.autograd.grad(out.sum(), wrt), torch.autograd.grad(expected.sum(), wrt)):
            torch.testing.assert_close(a, e)
    # the prompt; the prompt's length symbolic; the step, its keys' length symbolic with it
    assert misses(jfn) == 3, thunder_rs.compile_stats(jfn).miss_reasons


# -- a held tensor dense in another order ------------------------------------------------------------


class ConvState:
    """A convolution's state kept as its window's transpose (``(batch, width, taps)`` dense in dim
    order (0, 2, 1)), as RecurrentGemma's ``conv1d_state`` after the prompt."""

    def __init__(self, batch: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.state = torch.randn(batch, 3, 5, dtype=torch.float64, generator=g).transpose(1, 2)


def conv_step(x, cache: ConvState):
    return cache.state * x[..., None], (cache.state * x[..., None]).sum(-1)


def test_a_held_tensor_dense_in_another_order_turns_symbolic_with_the_batch():
    # Its batch changing was no change at all to ``held_changes`` (a layout compiled for, sizes
    # and all), and no stand-in took it symbolic: its batch stayed constant, guarded equal to the
    # input's by the product, a compile per batch.
    jf = thunder_rs.jit(conv_step)
    for batch in (2, 3, 4, 5, 6):
        x = torch.randn(batch, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(batch))
        cache = ConvState(batch, batch)
        (out, summed), (want, want_summed) = jf(x, cache), conv_step(x, cache)
        assert torch.equal(out, want) and torch.equal(summed, want_summed)
        assert out.stride() == want.stride()
    assert misses(jf) == 2, thunder_rs.compile_stats(jf).miss_reasons


# -- a module's state kept as a plain attribute ------------------------------------------------------


class Recurrent(nn.Module):
    """A recurrence whose state is a plain attribute, made anew for another batch and set by each
    call (RecurrentGemma's ``conv1d_state`` and ``recurrent_states``)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4, dtype=torch.float64)
        self.state = None

    def forward(self, x):
        if self.state is None or self.state.shape[0] != x.shape[0]:
            self.state = torch.zeros(x.shape[0], 4, dtype=x.dtype)
        self.state = torch.tanh(self.lin(x) + self.state * 0.5)
        return self.state * 2


def test_a_module_state_set_per_call_turns_symbolic_with_the_batch():
    # The state was taken constant: ``self.state.shape[0] != x.shape[0]`` guarded the batch equal
    # to it, and every run of another batch compiled its steps again (9 compiles, not 5).
    torch.manual_seed(0)
    model = Recurrent()
    eager, jmodel = copy.deepcopy(model), thunder_rs.jit(model)
    for batch in (2, 3, 4, 2, 5):
        for step in range(3):
            x = torch.randn(batch, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(batch + step))
            with torch.no_grad():  # (as generate: a state requiring grad is captured as it is)
                assert torch.equal(jmodel(x), eager(x))
            assert torch.equal(model.state, eager.state) and model.state.stride() == eager.state.stride()
    # The first batch's first call (no state yet) and steps; the second's, the batch symbolic (its
    # first call reads only the batch of the state it replaces, guarded as that tensor); once more
    # when the state's batch and the input's, equal at that compile, differ (the third's first).
    assert misses(jmodel) == 5, thunder_rs.compile_stats(jmodel).miss_reasons
