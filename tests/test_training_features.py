"""Training-loop features around and inside a jitted program, three steps each next to an eager
copy: outputs, gradients, parameters, buffers, optimizer state and compile counts equal eager's.
Activation checkpointing, parametrizations, pruning, mixed precision and GradScaler, gradient
clipping and accumulation, freezing, train/eval toggles, packed sequences, QAT fake-quantize
modules, and EMA updates with ``torch._foreach_*_``."""

import copy

import pytest
import torch
import torch.ao.quantization as quant
import torch.nn.utils.parametrize as parametrize
import torch.nn.utils.prune as prune
from torch import nn
from torch.nn.utils import parametrizations
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import thunder_rs

pytestmark = pytest.mark.usefixtures("one_thread")


def _loss(out):
    return (out[0] if isinstance(out, tuple) else out).float().square().mean()


def train_three_steps(make, inputs, *, before=None, opt=None, scaler=False, autocast=False, **tol) -> int:
    """Trains ``make()`` jitted next to the same model built eagerly (same seed), three steps of
    ``inputs(i)``: the random state seeded alike for both calls (dropout), ``before(i, model)``
    applied to both first. Outputs, gradients, parameters, buffers, optimizer state (and the
    GradScaler's scale) equal eager's. Returns the compile count."""
    tol = {"equal_nan": True, **tol}  # (an inf in a GradScaler's step gives NaNs alike)
    torch.manual_seed(0)
    model = make()
    torch.manual_seed(0)
    eager = make()
    jmodel = thunder_rs.jit(model)
    opt = opt or (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    runs = [(jmodel, model, opt(model.parameters())), (eager, eager, opt(eager.parameters()))]
    scalers = [torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=1) if scaler else None for _ in runs]
    for i in range(3):
        x, seen = inputs(i), []
        for (call, module, optimizer), grad_scaler in zip(runs, scalers):
            if before is not None:
                before(i, module)
            torch.manual_seed(100 + i)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = call(x)
            seen.append((out, torch.get_rng_state()))
            loss = _loss(out)
            (grad_scaler.scale(loss) if grad_scaler else loss).backward()
            seen.append({n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None})
            if grad_scaler:
                grad_scaler.step(optimizer)
                grad_scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad()
        torch.testing.assert_close(seen[0], seen[2], **tol)
        torch.testing.assert_close(seen[1], seen[3], **tol)
        torch.testing.assert_close(dict(model.named_parameters()), dict(eager.named_parameters()), **tol)
        torch.testing.assert_close(dict(model.named_buffers()), dict(eager.named_buffers()), **tol)
        states = [[o.state[p] for p in m.parameters()] for (_, m, o) in runs]
        torch.testing.assert_close(states[0], states[1], **tol)
        if scaler:
            assert scalers[0].get_scale() == scalers[1].get_scale()
    return thunder_rs.compile_stats(jmodel).cache_misses


def mlp(dropout=0.0):
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Dropout(dropout), nn.Linear(16, 4))


def rows(i):
    return torch.randn(4, 8)


def images(i):
    return torch.randn(2, 3, 8, 8)


def tiny_cnn():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)
    )


# ----------------------------------------------------------------------------- QAT fake quantization


def qat_mlp(backend: str):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).train()
    model.qconfig = quant.get_default_qat_qconfig(backend)
    return quant.prepare_qat(model)


def test_fused_fake_quantize_observers_train_as_eager():
    """``torch.fused_moving_avg_obs_fake_quant`` writes the observer's running minimum and maximum,
    the scale and the zero point in place: the fallback's backward ran it again, so every step
    updated them twice (the scale, and from the second step the outputs and gradients, differed)."""
    assert train_three_steps(lambda: qat_mlp("qnnpack"), rows) == 1


def test_a_per_channel_observers_first_step_is_refused_then_trains_as_eager_once_sized():
    """A per-channel observer's first step resizes its empty buffers to the channels: refused,
    naming the line; after one eager step the jitted steps equal eager's."""
    jmodel = thunder_rs.jit(qat_mlp("fbgemm"))
    with pytest.raises(thunder_rs.errors.ThunderNotImplementedError, match=r"running_min in place.*\[0\] to \[16\]"):
        jmodel(torch.randn(4, 8))

    def warmed():
        model = qat_mlp("fbgemm")
        model(torch.randn(4, 8))
        return model

    assert train_three_steps(warmed, rows) == 1


@pytest.mark.slow
def test_fused_conv_batch_norm_qat_trains_as_eager():
    def make():
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(144, 2))
        model = quant.fuse_modules_qat(model.train(), [["0", "1", "2"]])
        model.qconfig = quant.get_default_qat_qconfig("fbgemm")
        quant.prepare_qat(model, inplace=True)
        model(images(0))
        return model

    def toggles(i, model):
        if i == 2:
            model.apply(quant.disable_observer)

    # (the observers' switch is a buffer the fused op reads at run time: no compile more)
    assert train_three_steps(make, images, before=toggles, rtol=1e-5, atol=1e-5) == 1


@pytest.mark.parametrize(
    "norm",
    [
        lambda x, w, b, rm, rv: torch.batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5, False),
        lambda x, w, b, rm, rv: torch.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)[0],
        lambda x, w, b, rm, rv: torch._native_batch_norm_legit(x, w, b, rm, rv, True, 0.3, 1e-5)[0],
        lambda x, w, b, rm, rv: torch.instance_norm(x.reshape(2, 3, 2), w, b, rm, rv, True, 0.1, 1e-5, False),
    ],
    ids=["batch_norm", "native_batch_norm", "_native_batch_norm_legit", "instance_norm"],
)
def test_torchs_own_batch_norms_update_the_running_statistics_once_as_eager(norm):
    """Called as ``torch.*``, not through ``F``, the batch norms write their running statistics
    in place though neither their names nor their schemas say it: the fallback's backward ran
    them again (twice the update), or the update was lost."""
    torch.manual_seed(0)
    args = [torch.randn(4, 3), torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)]
    args += [torch.randn(3), torch.rand(3) + 0.5]
    expected = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    jnorm = thunder_rs.jit(norm)
    for _ in range(2):
        out, out_eager = jnorm(*args), norm(*expected)
        torch.testing.assert_close(out, out_eager)
        out.square().sum().backward()
        out_eager.square().sum().backward()
        torch.testing.assert_close(args, expected)
        torch.testing.assert_close([a.grad for a in args[1:3]], [a.grad for a in expected[1:3]])


def test_a_torch_function_writing_an_argument_with_no_functional_form_is_refused_naming_the_line():
    """Its aten schema says it writes ``values`` and ``indices``: run as a fallback, it would write
    them outside the trace, and again in its backward."""

    def program(x):
        values, indices = torch.empty(3), torch.empty(3, dtype=torch.long)
        torch._cummax_helper(x, values, indices, 0)
        return values

    with pytest.raises(
        thunder_rs.errors.ThunderNotImplementedError,
        match=r"_cummax_helper at .*features\.py.*values and indices in place",
    ):
        thunder_rs.jit(program)(torch.randn(3))


# ----------------------------------------------------------------------------- EMA with torch._foreach_*_


def test_an_ema_update_with_foreach_ops_matches_eager():
    """``torch._foreach_mul_`` / ``_foreach_add_`` / ``_foreach_lerp_`` were refused; each is the
    tensor method's in-place op on each tensor, as eager's reference path runs them."""

    def update(ema, params, decay):
        torch._foreach_mul_(ema, decay)
        torch._foreach_add_(ema, params, alpha=1 - decay)
        torch._foreach_lerp_(ema, params, [0.1] * len(ema))

    torch.manual_seed(0)
    model, jupdate = mlp(), thunder_rs.jit(update)
    ema, expected = [copy.deepcopy(list(model.parameters())) for _ in range(2)]
    for p in (*ema, *expected):
        p.requires_grad_(False)
    for _ in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        jupdate(ema, [p.detach() for p in model.parameters()], 0.9)
        update(expected, [p.detach() for p in model.parameters()], 0.9)
        torch.testing.assert_close(ema, expected, rtol=0, atol=0)
    assert thunder_rs.compile_stats(jupdate).cache_misses == 1


@pytest.mark.parametrize(
    "program",
    [
        lambda a, b, c: torch._foreach_mul_(a, torch.tensor(3.0)),
        lambda a, b, c: torch._foreach_mul_(a, [1.0, 2.0, 3.0]),
        lambda a, b, c: torch._foreach_addcmul_(a, b, c, 0.2),
        lambda a, b, c: torch._foreach_addcdiv_(a, b, c, [0.1, 0.2, 0.3]),
        lambda a, b, c: torch._foreach_copy_(a, b),
        lambda a, b, c: torch._foreach_sqrt_(c),
    ],
    ids=["mul_tensor", "mul_scalars", "addcmul", "addcdiv_scalars", "copy", "sqrt"],
)
def test_foreach_ops_write_what_eager_writes(program):
    def run(a, b, c):
        program(a, b, c)
        return a[0] + 0

    torch.manual_seed(0)
    lists = [[torch.randn(3), torch.randn(2, 2), torch.randn(())] for _ in range(3)]
    lists[2] = [t.abs() + 1 for t in lists[2]]
    expected = copy.deepcopy(lists)
    torch.testing.assert_close(thunder_rs.jit(run)(*lists), run(*expected), rtol=0, atol=0)
    torch.testing.assert_close(lists, expected, rtol=0, atol=0)


def test_foreach_gradients_through_intermediates_match_eager():
    def program(x):
        ys = [x * 1, x.sin()]
        torch._foreach_mul_(ys, [2.0, 3.0])
        torch._foreach_add_(ys, [x, x], alpha=0.5)
        return ys[0] * ys[1]

    x = torch.randn(5, requires_grad=True)
    x_eager = x.detach().clone().requires_grad_()
    out, expected = thunder_rs.jit(program)(x), program(x_eager)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(x.grad, x_eager.grad)


def test_foreach_scalars_given_as_a_tensor_are_refused_naming_the_line():
    def program(a, b):
        torch._foreach_addcdiv_(a, b, b, torch.tensor([0.1, 0.2]))
        return a[0] + 0

    with pytest.raises(thunder_rs.errors.ThunderNotImplementedError, match=r"_foreach_addcdiv_ at .*features\.py"):
        thunder_rs.jit(program)([torch.randn(2), torch.randn(2)], [torch.ones(2), torch.ones(2)])


# ----------------------------------------------------------------------------- packed sequences


class PackedRNN(nn.Module):
    """An RNN over a sequence packed outside the jitted call, padded again inside."""

    def __init__(self, kind: str):
        super().__init__()
        self.rnn = getattr(nn, kind)(6, 8, num_layers=2, bidirectional=True)
        self.fc = nn.Linear(16, 3)

    def forward(self, packed):
        out, _ = self.rnn(packed)
        out, lengths = pad_packed_sequence(out, batch_first=True)
        return self.fc(out).sum(1) / lengths.unsqueeze(1)


LENGTHS = [[5, 3, 4], [5, 5, 2], [4, 4, 4]]


def packed(i):
    return pack_padded_sequence(torch.randn(3, 5, 6), torch.tensor(LENGTHS[i]), batch_first=True, enforce_sorted=False)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_an_rnn_over_a_sequence_packed_outside_trains_as_eager(kind):
    """The RNN steps through the packed sequence's ``batch_sizes`` on the CPU, which torch's meta
    kernel wants there: it failed ("batch_sizes tensor should be on CPU, but got meta"), though
    the refusal of packing inside points here. The first two batches have one number of rows
    and other ``batch_sizes``: one compile; the third is shorter: another."""
    assert train_three_steps(lambda: PackedRNN(kind), packed, rtol=1e-5, atol=1e-6) == 2


# ----------------------------------------------------------------------------- activation checkpointing


class Checkpointed(nn.Module):
    def __init__(self, use_reentrant: bool, sequential: bool = False):
        super().__init__()
        self.a, self.b, self.drop = nn.Linear(8, 16), nn.Linear(16, 8), nn.Dropout(0.3)
        self.use_reentrant, self.sequential = use_reentrant, sequential

    def block(self, x):
        return self.drop(self.b(self.drop(self.a(x).relu())).relu())

    def forward(self, x):
        if self.sequential:
            layers = nn.Sequential(self.a, nn.ReLU(), self.drop, self.b, nn.ReLU(), self.drop)
            return checkpoint_sequential(layers, 2, x, use_reentrant=self.use_reentrant) + 1
        return checkpoint(self.block, x, use_reentrant=self.use_reentrant) + 1


@pytest.mark.parametrize("use_reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_checkpointing_with_dropout_trains_as_eager(use_reentrant):
    assert train_three_steps(lambda: Checkpointed(use_reentrant), lambda i: torch.randn(4, 8).requires_grad_()) == 1


@pytest.mark.parametrize("use_reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_checkpointed_dropout_without_preserving_the_rng_state_is_refused_naming_the_line(use_reentrant):
    """Without ``preserve_rng_state`` eager's backward draws new dropout masks for its gradients
    (and advances the generator); the compiled call's gradients used the forward's masks."""
    linear, dropout = nn.Linear(8, 8), nn.Dropout(0.5)

    def program(x):
        return checkpoint(lambda y: dropout(linear(y)), x, use_reentrant=use_reentrant, preserve_rng_state=False)

    with pytest.raises(
        thunder_rs.errors.ThunderNotImplementedError,
        match=r"preserve_rng_state=False.*features\.py|features\.py.*preserve",
    ):
        thunder_rs.jit(program)(torch.randn(4, 8, requires_grad=True))
    x = torch.randn(4, 8)
    with torch.no_grad():  # (nothing is computed again)
        torch.manual_seed(0)
        out = thunder_rs.jit(program)(x)
        torch.manual_seed(0)
        torch.testing.assert_close(out, program(x))


class CheckpointedEncoder(nn.Module):
    def __init__(self, use_reentrant: bool):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
        self.use_reentrant = use_reentrant

    def forward(self, x):
        return checkpoint(self.layer, x, use_reentrant=self.use_reentrant)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("use_reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_checkpointed_models_train_as_eager(use_reentrant, dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        x = lambda i: torch.randn(4, 8).requires_grad_()  # noqa: E731
        assert train_three_steps(lambda: Checkpointed(use_reentrant, sequential=True), x) == 1
        tokens = lambda i: torch.randn(2, 5, 16).requires_grad_()  # noqa: E731
        assert train_three_steps(lambda: CheckpointedEncoder(use_reentrant), tokens, rtol=1e-5, atol=1e-5) == 1
    finally:
        torch.set_default_dtype(before)


# ----------------------------------------------------------------------------- parametrizations and pruning


class Symmetric(nn.Module):
    def forward(self, weight):
        return weight.triu() + weight.triu(1).transpose(-1, -2)


def parametrized(kind: str):
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4))
    if kind == "weight_norm":
        parametrizations.weight_norm(model[0])
        parametrizations.weight_norm(model[2], dim=None)
    elif kind == "spectral_norm":
        parametrizations.spectral_norm(model[0])
        parametrizations.spectral_norm(model[2], n_power_iterations=2)
    elif kind == "orthogonal":
        parametrizations.orthogonal(model[0], orthogonal_map="cayley")
        parametrizations.orthogonal(model[2], orthogonal_map="householder")
    elif kind == "custom":
        parametrize.register_parametrization(model[0], "weight", Symmetric())
    elif kind == "old_weight_norm":
        nn.utils.weight_norm(model[0])
    elif kind == "old_spectral_norm":
        nn.utils.spectral_norm(model[0])
    elif kind == "pruned":
        prune.l1_unstructured(model[0], "weight", amount=0.4)
        prune.random_unstructured(model[2], "bias", amount=2)
    return model


def train_eval_train(i, model):
    model.train(i != 1)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated")
@pytest.mark.parametrize(
    "kind", ["weight_norm", "spectral_norm", "orthogonal", "custom", "old_weight_norm", "old_spectral_norm", "pruned"]
)
def test_parametrized_and_pruned_models_train_as_eager_across_train_and_eval(kind):
    """Spectral norm's power iteration updates its buffers in training only; the eval step
    compiles once more."""
    assert train_three_steps(lambda: parametrized(kind), rows, before=train_eval_train, rtol=1e-5, atol=1e-6) == 2


def test_spectral_norm_power_iterations_update_as_eagers_in_training_only():
    assert train_three_steps(lambda: parametrized("spectral_norm"), rows, before=train_eval_train) == 2


def test_pruning_masks_added_and_removed_between_steps_match_eager():
    def repruned(i, model):
        if i == 1:
            prune.l1_unstructured(model[2], "weight", amount=0.3)
        if i == 2:
            prune.remove(model[0], "weight")

    assert train_three_steps(lambda: parametrized("pruned"), rows, before=repruned) == 3


def test_a_parametrization_computed_once_per_call_under_cached_matches_eager():
    class TwiceCached(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = parametrized("weight_norm")

        def forward(self, x):
            with parametrize.cached():
                return self.inner(x) + self.inner(x)

    assert train_three_steps(TwiceCached, rows) == 1


# ----------------------------------------------------------------------------- mixed precision, clipping, freezing


@pytest.mark.slow
@pytest.mark.parametrize("make, inputs", [(mlp, rows), (tiny_cnn, images)], ids=["mlp", "cnn"])
def test_autocast_around_the_call_with_a_grad_scaler_matches_eager(make, inputs):
    def with_an_inf_at_step_1(i):
        x = inputs(i)
        if i == 1:
            x.view(-1)[0] = float("inf")
        return x

    assert train_three_steps(make, with_an_inf_at_step_1, autocast=True, scaler=True) == 1


def test_autocast_inside_the_program_matches_eager():
    class Inside(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))

        def forward(self, x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = self.inner(x)
            return y.float().softmax(-1)

    assert train_three_steps(Inside, rows, scaler=True) == 1


def test_a_grad_scaler_scaling_inside_the_program_keeps_its_scale_as_eager():
    """``GradScaler.scale`` makes the scaler's ``_scale`` on its first call, where it is None:
    torch's code, whose reads were not guarded, so every compiled call set a new scale of the
    initial value again (after a skipped step the scale was 8, eager's 16). A call finding the
    attribute set now runs a trace that reads it: two compiles."""

    def scaled_loss(model, scaler, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().square().mean()
        return scaler.scale(loss)

    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    eager, jitted = copy.deepcopy(model), thunder_rs.jit(scaled_loss)
    runs = []
    for m in (model, eager):
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4, growth_interval=1)
        runs.append((m, scaler, torch.optim.SGD(m.parameters(), 0.1)))
    for step in range(3):
        x = torch.randn(3, 4)
        if step == 1:
            x[0, 0] = float("inf")
        for (m, scaler, optimizer), call in zip(runs, (jitted, scaled_loss)):
            call(m, scaler, x).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        assert runs[0][1].get_scale() == runs[1][1].get_scale()
        torch.testing.assert_close(dict(model.named_parameters()), dict(eager.named_parameters()))
    assert thunder_rs.compile_stats(jitted).cache_misses == 2


def test_clipping_after_accumulated_micro_batches_matches_eager():
    torch.manual_seed(0)
    model = mlp(0.2)
    eager, jmodel = copy.deepcopy(model), thunder_rs.jit(model)
    runs = [(jmodel, model, torch.optim.Adam(model.parameters(), 1e-2)), (eager, eager, None)]
    runs[1] = (eager, eager, torch.optim.Adam(eager.parameters(), 1e-2))
    for step in range(3):
        norms = []
        for call, module, optimizer in runs:
            for micro in range(4):
                torch.manual_seed(10 * step + micro)
                (call(torch.randn(4, 8)).square().mean() / 4).backward()
            norms.append(nn.utils.clip_grad_norm_(module.parameters(), 0.05))
            nn.utils.clip_grad_value_(module.parameters(), 0.01)
            optimizer.step()
            optimizer.zero_grad()
        torch.testing.assert_close(norms[0], norms[1])
        torch.testing.assert_close(dict(model.named_parameters()), dict(eager.named_parameters()))
    assert thunder_rs.compile_stats(jmodel).cache_misses == 1


def test_freezing_a_layer_between_steps_recompiles_and_matches_eager():
    def freeze_at_step_1(i, model):
        model[0].requires_grad_(i != 1)

    assert train_three_steps(lambda: mlp(0.2), rows, before=freeze_at_step_1) == 2


class TinyLM(nn.Module):
    """A two-layer causal transformer language model with tied embeddings and dropout."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(20, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(16, 20)
        self.head.weight = self.embedding.weight

    def forward(self, tokens):
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
        return self.head(self.encoder(self.embedding(tokens), mask=mask, is_causal=True))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_tiny_transformer_trains_as_eager_across_train_and_eval(dtype):
    """(With SGD: the key projection's bias has a gradient of exactly zero but for rounding, which
    Adam's normalised step would turn into steps of either sign.)"""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        tokens = lambda i: torch.randint(0, 20, (2, 6))  # noqa: E731
        assert train_three_steps(TinyLM, tokens, before=train_eval_train, rtol=1e-5, atol=1e-5) == 2
    finally:
        torch.set_default_dtype(before)


@pytest.mark.slow
def test_train_eval_toggles_of_submodules_match_eager():
    def toggles(i, model):
        model.train(i != 1)
        if i == 2:
            model[1].eval()

    assert train_three_steps(tiny_cnn, images, before=toggles) == 3
