"""Programs that read tensor values under thunder_rs.jit: branches on ``bool(t)``, ``.item()`` used
as a number, ``nonzero``/``where``/boolean-mask sizes, value checks that raise, MoE routing, and
the Hugging Face models that do these (DeBERTa-v2's classification loss, Wav2Vec2's CTC loss).

Each read is answered with the call's own value and the trace is specialised on it, with a check
where it was read (``core/lang/values.py``); a call whose values differ runs the variant for them, so
every call computes what eager computes, gradients included, and its effects (generator draws,
buffer updates, prints) happen once. Every test compares with eager over calls whose values change.
"""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import thunder_rs
from thunder_rs.core.lang.values import ValueTree

pytestmark = pytest.mark.usefixtures("one_thread")


def grads(out, tensors) -> list:
    """The gradients of the sum of ``out``'s floating tensors (one, or a tuple) with respect to ``tensors``."""
    outs = out if isinstance(out, tuple) else (out,)
    total = sum(o.sum() for o in outs if isinstance(o, torch.Tensor) and o.dtype.is_floating_point)
    return list(torch.autograd.grad(total, tensors, allow_unused=True, materialize_grads=True))


def variants(jfn) -> int:
    return thunder_rs.cache_misses(jfn)


def assert_calls_match(fn, jfn, inputs: list, grad_of: tuple = ()) -> None:
    """``jfn(*args)`` equals ``fn(*args)`` for each ``args`` in ``inputs``; so do the gradients
    of the outputs' sum with respect to ``args[i]`` for ``i`` in ``grad_of``."""
    for args in inputs:
        expected, actual = fn(*args), jfn(*args)
        torch.testing.assert_close(actual, expected)
        if grad_of:
            wrt = [args[i] for i in grad_of]
            for a, e in zip(grads(actual, wrt), grads(expected, wrt)):
                torch.testing.assert_close(a, e)


# -- branches and numbers -------------------------------------------------------------------------


def branch_on_sum(x, w):
    y = x @ w
    if y.sum() > 0:
        return y.relu() * 2
    return y.tanh() - 1


def test_a_branch_on_a_value_takes_both_sides_as_eager_with_gradients():
    torch.manual_seed(0)
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(3, 4, requires_grad=True)
    negated = (-x).detach().requires_grad_()  # (a leaf as x is: whether one is, is in the cache key)
    jfn = thunder_rs.jit(branch_on_sum)
    calls = [(x, w), (negated, w), (x, w), (negated, w), (x, w)]
    assert_calls_match(branch_on_sum, jfn, calls, grad_of=(0, 1))
    assert variants(jfn) == 2  # one per side; later flips find theirs in the value tree
    assert "was False where the compiled variant has True" in thunder_rs.compile_stats(jfn).miss_reasons[1]


def scaled_by_item(x):
    s = x.abs().max().item()
    n = int((x > 0).sum())
    return x / s + n, n


def test_item_used_as_a_python_number_in_later_ops():
    xs = [torch.tensor([1.0, -4.0, 2.0]), torch.tensor([3.0, 1.0, -0.5]), torch.tensor([1.0, -4.0, 2.0])]
    jfn = thunder_rs.jit(scaled_by_item)
    assert_calls_match(scaled_by_item, jfn, [(x.requires_grad_(),) for x in xs])
    assert variants(jfn) == 2  # the third call's values are the first's


class NamedExperts(nn.ModuleDict):
    """Switch Transformers' experts: each chosen one found by a name formatted from an index
    tensor (``self[f"expert_{idx[0]}"]``), and a value formatted with a spec."""

    def __init__(self):
        super().__init__({f"expert_{i}": nn.Linear(3, 3) for i in range(3)})

    def forward(self, x, choice):
        out = torch.zeros_like(x)
        for idx in torch.bincount(choice, minlength=3).nonzero():
            out = out + self[f"expert_{idx[0]}"](x)
        return out + float(f"{choice.sum() / 4:.1f}")


def test_a_0_dim_tensor_formats_its_value_as_in_eager():
    # The f-string formatted the stand-in: KeyError 'expert_TensorProxy(t12, "cpu torch.int64[]")'.
    model = NamedExperts()
    jmodel = thunder_rs.jit(model)
    calls = [(torch.randn(4, 3, requires_grad=True), torch.tensor(c)) for c in ([0, 2, 2], [1, 2, 0], [2, 0, 1])]
    assert_calls_match(model, jmodel, calls, grad_of=(0,))
    assert variants(jmodel) == 2  # the experts and the sum read per call: the third is the second's


def test_a_nan_read_is_the_same_value_at_every_call():
    def program(x):
        return x * x.sum().item()

    jfn = thunder_rs.jit(program)
    x = torch.tensor([1.0, float("nan")])
    for _ in range(3):
        torch.testing.assert_close(jfn(x), program(x), equal_nan=True)
    assert variants(jfn) == 1


def test_a_mask_any_guard():
    def program(x, mask):
        if mask.any():
            x = x.masked_fill(mask, 0.0) * 3
        return x.sum(0)

    x = torch.randn(4, 3, requires_grad=True)
    masks = [torch.rand(4, 3) > 0.5, torch.zeros(4, 3, dtype=torch.bool), torch.rand(4, 3) > 0.5]
    jfn = thunder_rs.jit(program)
    assert_calls_match(program, jfn, [(x, m) for m in masks], grad_of=(0,))
    assert variants(jfn) == 2


def test_a_value_check_that_raises_raises_as_eager_and_the_valid_variant_runs_on():
    def program(logits, labels):
        if labels.max() >= logits.shape[-1]:
            raise ValueError(f"Label values must be < {logits.shape[-1]}")
        return F.cross_entropy(logits, labels)

    logits = torch.randn(4, 5, requires_grad=True)
    good, bad = torch.tensor([0, 4, 2, 1]), torch.tensor([0, 7, 2, 1])
    jfn = thunder_rs.jit(program)
    assert_calls_match(program, jfn, [(logits, good)], grad_of=(0,))
    for _ in range(2):
        with pytest.raises(ValueError, match="Label values must be < 5"):
            jfn(logits, bad)
    assert_calls_match(program, jfn, [(logits, good)], grad_of=(0,))
    assert variants(jfn) == 1  # a raising path compiles nothing
    with pytest.raises(ValueError, match="Label values must be < 5"):
        thunder_rs.jit(program)(logits, bad)  # on the first call too


@pytest.mark.parametrize(
    "test",
    [
        lambda x: torch.equal(x, x.abs()),
        lambda x: torch.allclose(x, x.abs(), atol=0.5),
        lambda x: x.sum().is_nonzero(),
        lambda x: 1.0 in x,
    ],
    ids=["equal", "allclose", "is_nonzero", "contains"],
)
def test_calls_that_return_python_values_steer_the_program(test):
    def program(x):
        return x * 2 if test(x) else x - 1

    jfn = thunder_rs.jit(program)
    assert_calls_match(program, jfn, [(x,) for x in (torch.ones(3), -torch.ones(3), torch.zeros(3), torch.ones(3))])
    assert variants(jfn) == 2


def test_a_captured_tensor_is_read_at_every_call():
    flag = torch.tensor(True)

    def program(x):
        return x + 1 if flag else x - 1

    jfn = thunder_rs.jit(program)
    x = torch.ones(2)
    torch.testing.assert_close(jfn(x), x + 1)
    flag.fill_(False)
    torch.testing.assert_close(jfn(x), x - 1)


def test_variants_are_found_by_value_not_by_trying_each():
    def program(x):
        k = int(x.argmax())
        return x * k

    jfn = thunder_rs.jit(program)
    xs = [torch.eye(4)[i] for i in (0, 1, 2, 3)]
    for _ in range(3):
        assert_calls_match(program, jfn, [(x,) for x in xs])
    assert variants(jfn) == 4
    entry = jfn._variants[next(iter(jfn._variants))][0]
    assert isinstance(entry.tree, ValueTree) and len(entry.tree) == 4


def test_tolist_sizes_a_split():
    def program(x):
        sizes = (x > 0).sum(1).tolist()  # ragged rows, as MoE dispatch by counts does
        return tuple(part.sum() * 2 for part in torch.split(x[x > 0], sizes))

    jfn = thunder_rs.jit(program)
    x = torch.randn(4, 3, requires_grad=True)
    assert_calls_match(program, jfn, [(x,), (x * -1,), (x,)], grad_of=(0,))


class SignedScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        positive = bool(x.sum() > 0)
        ctx.scale = 2.0 if positive else 3.0
        return x * ctx.scale

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale


class ReadsInBackward(SignedScale):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 2 if x.sum() > 0 else grad * 3


def test_a_custom_functions_forward_reads_a_value_and_a_backward_that_reads_one_is_refused():
    program = lambda x: SignedScale.apply(x).sin()  # noqa: E731
    x = torch.ones(3, requires_grad=True)
    jfn = thunder_rs.jit(program)
    assert_calls_match(program, jfn, [(x,), (-x,), (x,)], grad_of=(0,))
    with pytest.raises(NotImplementedError, match=r"value access at .*test_data_dependent.py:\d+ in a backward"):
        thunder_rs.jit(lambda x: ReadsInBackward.apply(x))(x)


def test_a_program_without_reads_records_no_check():
    jfn = thunder_rs.jit(lambda x: x * 2)
    jfn(torch.ones(2))
    assert "check_value" not in str(thunder_rs.last_traces(jfn)[-1])


def test_values_read_through_numpy_are_refused_with_the_line():
    with pytest.raises(thunder_rs.errors.ThunderRuntimeError, match=r"numpy: data-dependent.*test_data_dependent"):
        thunder_rs.jit(lambda x: x * float(x.sum().numpy()))(torch.ones(2))


# -- sizes read from values ---------------------------------------------------------------------


def selections(x, mask):
    idx = mask.nonzero()
    rows, cols = torch.where(mask)
    return x[mask] * 2, torch.masked_select(x, mask).sum(), x[idx[:, 0], idx[:, 1]] + rows + cols


@pytest.mark.parametrize("n", [3, 0])
def test_nonzero_where_and_mask_sizes_match_eager_with_gradients(n):
    x = torch.randn(4, 5, requires_grad=True)
    masks = [torch.rand(4, 5) > 0.5 for _ in range(n)] + [torch.zeros(4, 5, dtype=torch.bool), torch.ones(4, 5) > 0]
    jfn = thunder_rs.jit(selections)
    assert_calls_match(selections, jfn, [(x, m) for m in masks], grad_of=(0,))


def counted(x, w):
    values, counts = torch.unique(x, return_counts=True)
    return values * 2, torch.bincount(x), torch.repeat_interleave(counts), w.repeat_interleave(counts, dim=0) * 3


def test_unique_bincount_and_repeat_interleave_by_counts():
    xs = [torch.tensor([1, 2, 2, 5]), torch.tensor([3, 3, 3, 0]), torch.tensor([1, 2, 2, 5])]
    jfn = thunder_rs.jit(counted)
    assert_calls_match(
        counted, jfn, [(x, torch.randn(len(x.unique()), 2, requires_grad=True)) for x in xs], grad_of=(1,)
    )
    assert variants(jfn) == 2


def test_a_masked_assignment_of_one_value_per_true_element():
    def program(x, v):
        y = x.clone()
        y[y > 0.5] = v[: int((y > 0.5).sum())] * 2
        return y

    v = torch.randn(12, requires_grad=True)
    jfn = thunder_rs.jit(program)
    assert_calls_match(program, jfn, [(torch.rand(3, 4), v) for _ in range(3)], grad_of=(1,))


class TopKMoE(nn.Module):
    """Mixtral-style routing: top-k experts per token, a loop over the experts that got tokens,
    each run on the tokens ``where`` its mask says, added back with ``index_add_``."""

    def __init__(self, dim: int = 8, experts: int = 4, k: int = 2):
        super().__init__()
        self.k = k
        self.gate = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 16), nn.SiLU(), nn.Linear(16, dim)) for _ in range(experts)
        )

    def forward(self, x):
        h = x.reshape(-1, x.shape[-1])
        weights, chosen = torch.topk(F.softmax(self.gate(h), dim=-1, dtype=torch.float), self.k, dim=-1)
        weights /= weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(h)
        mask = F.one_hot(chosen, num_classes=len(self.experts)).permute(2, 1, 0)
        for expert in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero():
            slot, token = torch.where(mask[expert].squeeze(0))
            y = self.experts[expert](h[None, token].reshape(-1, h.shape[-1])) * weights[token, slot, None]
            out.index_add_(0, token, y.to(h.dtype))
        return out.reshape(x.shape)


def train_moe_like_eager(model, batches: list, lr: float):
    """Trains ``model`` jitted and a copy eagerly with SGD, one step per batch; the parameters
    must stay equal. Returns the jitted model."""
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    optimizers = [torch.optim.SGD(m.parameters(), lr=lr) for m in (model, eager)]
    for x in batches:
        for m, opt in zip((jmodel, eager), optimizers):
            m(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p, q)
    return jmodel


def test_a_tiny_moe_trains_as_eager():
    torch.manual_seed(0)
    batches = [torch.randn(2, 3, 8) for _ in range(2)]
    jmodel = train_moe_like_eager(TopKMoE(), batches * 2, lr=0.5)  # each batch twice: its variant is found again
    assert variants(jmodel) == 2  # one per routing (the tokens each expert got): each batch keeps its own here


# -- effects happen once per call ---------------------------------------------------------------


class DropThenBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(4)
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = F.dropout(self.norm(x), 0.5, self.training)
        print("positive:", bool(y.sum() > 0))
        y = self.lin(y) if y.sum() > 0 else -y
        return y * torch.rand(1)


def test_draws_buffer_updates_and_prints_happen_once_per_call_when_a_variant_is_abandoned(capsys):
    torch.manual_seed(0)
    model = DropThenBranch()
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    for i in range(5):
        x = torch.randn(3, 4) + (2 if i % 2 else -2)
        results = []
        for m in (jmodel, eager):
            torch.manual_seed(i)
            out = m(x)
            results.append((out, torch.get_rng_state(), grads(out, [m.lin.weight, m.norm.weight])))
        (out, state, g), (ref, ref_state, ref_g) = results
        torch.testing.assert_close(out, ref)
        assert torch.equal(state, ref_state)
        for a, e in zip(g, ref_g):
            torch.testing.assert_close(a, e)
        torch.testing.assert_close(model.norm.running_mean, eager.norm.running_mean)
        assert model.norm.num_batches_tracked == eager.norm.num_batches_tracked == i + 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0::2] == lines[1::2] and len(lines) == 10  # jit's print, then eager's, per call
    assert variants(jmodel) == 2


# -- Hugging Face models ------------------------------------------------------------------------

transformers = pytest.importorskip("transformers")


def check_training(model, batches: list, steps: int, tol=dict(rtol=1e-4, atol=1e-5)) -> int:
    """Trains ``model`` jitted and a copy eagerly with AdamW on ``batches`` (keyword arguments,
    cycled), under the same seeds; loss, logits, gradients and parameters must match. Returns the
    jitted model."""
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, eager)]
    for step in range(steps):
        batch = batches[step % len(batches)]
        outs = []
        for m in (jmodel, eager):
            torch.manual_seed(step)
            outs.append(m(**batch))
        out, ref = outs
        torch.testing.assert_close(out.loss, ref.loss, **tol)
        torch.testing.assert_close(out.logits, ref.logits, **tol)
        assert out.loss.requires_grad == ref.loss.requires_grad
        if ref.loss.requires_grad:  # no labelled example: eager's loss is a constant zero
            out.loss.backward()
            ref.loss.backward()
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            if q.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, **tol, msg=name)
        for opt in optimizers:
            opt.step()
            opt.zero_grad()
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p, q, **tol)
    return jmodel


def deberta_v2_classifier() -> tuple:
    """A tiny DeBERTa-v2 classifier and batches with 1, 2, 0 and 2 labelled examples (label -1: none)."""
    torch.manual_seed(0)
    config = transformers.DebertaV2Config(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=3,
        pad_token_id=0,
    )
    model = transformers.DebertaV2ForSequenceClassification(config).train()
    ids = torch.randint(3, 99, (2, 8), generator=torch.Generator().manual_seed(0))
    labels = [[1, -1], [2, 0], [-1, -1], [0, 2]]
    return model, [dict(input_ids=ids, labels=torch.tensor(row)) for row in labels]


def qwen2_moe_eager_experts() -> tuple:
    """A tiny Qwen2-MoE causal LM with transformers' "eager" experts loop, and two batches."""
    torch.manual_seed(0)
    config = transformers.Qwen2MoeConfig(
        vocab_size=99,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=32,
    )
    config._experts_implementation = "eager"
    model = transformers.Qwen2MoeForCausalLM(config).train()
    g = torch.Generator().manual_seed(0)
    return model, [
        dict(input_ids=ids, labels=ids) for ids in (torch.randint(0, 99, (2, 8), generator=g) for _ in range(2))
    ]


def wav2vec2_ctc() -> tuple:
    """A tiny Wav2Vec2 CTC model and two batches of audio with labels, the second with a shorter transcript."""
    torch.manual_seed(0)
    config = transformers.Wav2Vec2Config(
        vocab_size=12,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        conv_dim=(8, 8),
        conv_stride=(4, 2),
        conv_kernel=(8, 4),
        num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=2,
        mask_time_prob=0.0,
        pad_token_id=0,
        ctc_loss_reduction="mean",
    )
    model = transformers.Wav2Vec2ForCTC(config).train()
    g = torch.Generator().manual_seed(0)
    audio = torch.randn(2, 160, generator=g)
    labels = [torch.randint(1, 12, (2, 5), generator=g) for _ in range(2)]
    labels[1][1, 3:] = -100  # a shorter transcript
    return model, [dict(input_values=audio, labels=lab) for lab in labels]


def test_deberta_v2_classification_with_unlabelled_examples_trains_as_eager():
    """The loss gathers the examples whose label is >= 0 (``nonzero``) and branches on how many."""
    model, batches = deberta_v2_classifier()
    assert variants(check_training(model, batches, steps=5)) == 3  # 1, 2 and 0 labelled examples


def test_qwen2_moe_with_its_eager_experts_loop_matches_eager():
    """transformers 5 runs Qwen2-MoE's experts as grouped matmuls by default (one static graph);
    its "eager" implementation loops over the experts ``nonzero`` says were hit, each on the
    tokens ``torch.where`` gives it."""
    model, batches = qwen2_moe_eager_experts()
    # The first batch's routing, then one variant with the experts' token counts symbolic (sizes
    # computed from values: tests/test_dynamic_data_sizes.py) for every routing after it.
    assert variants(check_training(model, batches, steps=5)) == 2


def test_wav2vec2_ctc_with_labels_trains_as_eager_and_refuses_a_label_out_of_range():
    """``if labels.max() >= vocab_size: raise``, then CTC over ``masked_select``ed targets."""
    model, batches = wav2vec2_ctc()
    audio, labels = batches[0]["input_values"], [b["labels"] for b in batches]
    # LayerDrop (p=0.1) reads a draw (``torch.rand([]) < p``): one step takes the layer where the
    # first skipped it. Its variant reads 8 target tokens (``masked_select``) where the first read
    # 10, so it has that count symbolic at once, and serves the third step: two variants.
    assert variants(check_training(model, batches, steps=3)) == 2
    bad = labels[0].clone()
    bad[0, 0] = 12
    with pytest.raises(ValueError, match="Label values must be <= vocab_size: 12"):
        thunder_rs.jit(model)(audio, labels=bad)


def test_a_value_new_on_every_call_compiles_a_bounded_number_of_variants_then_runs_eagerly():
    """``x / x.abs().max().item()``: each call reads another float. Past the limit of variants a key
    compiles, calls with new values run eagerly (with one warning naming the read), with eager's
    outputs and gradients; values a variant has still run compiled."""
    from thunder_rs.core.run.jit import VALUE_VARIANT_LIMIT

    torch.manual_seed(0)
    xs = [torch.randn(4, 5, requires_grad=True) for _ in range(VALUE_VARIANT_LIMIT + 4)]
    jfn = thunder_rs.jit(scaled_by_item)
    with pytest.warns(UserWarning, match=r"runs calls with other values eagerly \(the value read by torch.Tensor.item"):
        assert_calls_match(scaled_by_item, jfn, [(x,) for x in xs], grad_of=(0,))
    stats = thunder_rs.compile_stats(jfn)
    assert (stats.cache_misses, stats.eager_calls) == (VALUE_VARIANT_LIMIT, 4)
    hits = stats.cache_hits
    assert_calls_match(scaled_by_item, jfn, [(xs[0],)], grad_of=(0,))  # a compiled value: no eager call
    assert thunder_rs.compile_stats(jfn).eager_calls == 4 and thunder_rs.compile_stats(jfn).cache_hits > hits
