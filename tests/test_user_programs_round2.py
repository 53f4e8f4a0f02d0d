"""More training programs as users write them, each trained for a few steps under thunder_rs.jit
next to the same model built eagerly from the same seed: losses, outputs, every gradient, the
parameters, the buffers, the optimizer's state and the random state after the steps equal
eager's (bit for bit on the CPU, one thread, where the same kernels run), and the compile count
is what the program needs. Parametrized layers, ``torch.distributions``, state updated under
``torch.no_grad()`` inside the forward, attention with padding masks, and what a program does
around the jitted call (parametrizations added and removed between steps, clipping, EMA).

The models sit in ``user_models_round2.py``. (Models are built twice rather than deep-copied:
a deep copy of a parametrized module shares its class, whose properties
``remove_parametrizations`` deletes.)"""

from collections.abc import Callable

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.distributions as D
import torch.nn.utils.parametrize as parametrize
from torch import nn
from torch.nn.utils import parametrizations
from torch.optim import swa_utils

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError
from user_models_round2 import (
    BoundedPolicy,
    CachedSpectralNorm,
    CenteredTeacher,
    ClippedCritic,
    ClippedPolicy,
    DiagonalVAE,
    MixtureDensity,
    MomentumContrast,
    PaddedAttention,
    Prototypes,
    RenormedEmbedding,
    Seq2SeqTransformer,
    SquashedGaussianPolicy,
    chained_parametrizations,
    lora_mlp,
    orthogonal_mlp,
    spectral_discriminator,
    weight_normed_vocoder,
)

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    # (torch.autograd.forward_ad, which torch.func.jvp imports, scripts a function at its first import)
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated"),
]

#: One step: ``program(model, step) -> (loss, outputs)``, ``model`` jitted or eager.
Program = Callable[[Callable, int], tuple[torch.Tensor, list]]
EXACT = dict(rtol=0, atol=0)


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-2)


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def run_steps(model, call, program: Program, steps: int, make_optimizer, before, after_backward) -> dict:
    """``steps`` steps of ``program`` on ``call`` (``model`` or its jitted form) from one seed,
    ``before(step, model)`` first, ``after_backward(model)`` (gradient clipping) before the
    optimizer's step; what each step computed, and the state after."""
    optimizer = make_optimizer(model.parameters())
    record: dict = {}
    for step in range(steps):
        torch.manual_seed(10 + step)
        if before is not None:
            before(step, model)
        optimizer.zero_grad()
        loss, outputs = program(call, step)
        loss.backward()
        if after_backward is not None:
            record[f"step {step} after backward"] = after_backward(model)
        record[f"step {step} loss"] = loss.detach()
        record.update({f"step {step} output {i}": out.detach() for i, out in enumerate(outputs)})
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        record.update({f"step {step} grad of {n}": g for n, g in grads.items()})
        optimizer.step()
        record[f"step {step} random state"] = torch.get_rng_state()
    record.update({f"parameter {n}": p.detach().clone() for n, p in model.named_parameters()})
    record.update({f"buffer {n}": b.clone() for n, b in model.named_buffers()})
    for i, state in optimizer.state_dict()["state"].items():
        record.update({f"optimizer state {i} {k}": v for k, v in state.items()})
    return record


def trains_as_eager(
    make, program: Program, *, steps=3, compiles=1, make_optimizer=adamw, before=None, after_backward=None, **tol
):
    """Trains ``make()`` jitted, then the same model built eagerly; every recorded tensor equals
    eager's (``tol``: exactly by default), and the jitted model compiled ``compiles`` times."""
    tol = tol or EXACT
    torch.manual_seed(0)
    model = make()
    torch.manual_seed(0)
    eager = make()
    jmodel = thunder_rs.jit(model)
    actual = run_steps(model, jmodel, program, steps, make_optimizer, before, after_backward)
    expected = run_steps(eager, eager, program, steps, make_optimizer, before, after_backward)
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value, equal_nan=True, **tol, msg=lambda m: f"{name}: {m}")
    assert thunder_rs.compile_stats(jmodel).cache_misses == compiles
    return jmodel


def rows(features: int, batch: int = 4):
    def program(model, step):
        out = model(torch.randn(batch, features))
        return out.square().mean(), [out]

    return program


def returns_loss(*make_inputs):
    """A program calling a model that returns ``(loss, output)`` on fresh inputs."""

    def program(model, step):
        loss, out = model(*(make() for make in make_inputs))
        return loss, [out]

    return program


# ----------------------------------------------------------------------------- parametrizations


@pytest.mark.parametrize(
    "make, features",
    [(lora_mlp, 8), (chained_parametrizations, 6), (orthogonal_mlp, 6)],
    ids=["lora", "chained", "orthogonal"],
)
def test_parametrized_layers_train_as_eager(make, features):
    trains_as_eager(make, rows(features))


def test_a_spectrally_normalised_discriminator_updates_its_power_iterations_as_eager():
    images = returns_loss(lambda: torch.randn(2, 3, 8, 8))
    trains_as_eager(lambda: Loss(spectral_discriminator()), images, make_optimizer=sgd)


def test_a_weight_normalised_vocoder_block_trains_as_eager():
    trains_as_eager(lambda: Loss(weight_normed_vocoder()), returns_loss(lambda: torch.randn(2, 2, 10)))


def test_spectral_norm_applied_twice_under_cached_iterates_once_per_call_as_eager():
    trains_as_eager(CachedSpectralNorm, rows(4), make_optimizer=sgd)


class Loss(nn.Module):
    """``model``'s output and its mean square, as a program's model returns them."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        out = self.model(x)
        return out.square().mean(), out


def remove_weight_norm_at_step_2(step, model):
    if step == 2:
        parametrize.remove_parametrizations(model[0], "weight")


def add_spectral_norm_at_step_1(step, model):
    if step == 1:  # (draws the power iteration's vectors: seeded alike for both models)
        parametrizations.spectral_norm(model[0])


@pytest.mark.parametrize(
    "make, before",
    [
        (lambda: nn.Sequential(parametrizations.weight_norm(nn.Linear(4, 4)), nn.Tanh()), remove_weight_norm_at_step_2),
        (lambda: nn.Sequential(nn.Linear(4, 4), nn.Tanh()), add_spectral_norm_at_step_1),
    ],
    ids=["removed", "added"],
)
def test_a_parametrization_added_or_removed_between_steps_recompiles_and_matches_eager(make, before):
    trains_as_eager(make, rows(4), make_optimizer=sgd, before=before, compiles=2)


class TwiceNormalised(nn.Module):
    """A spectrally normalised layer applied twice: inside ``parametrize.cached()`` its power
    iteration runs once per call, outside it once per use."""

    def __init__(self):
        super().__init__()
        self.layer = parametrizations.spectral_norm(nn.Linear(4, 4))

    def forward(self, x):
        return self.layer(self.layer(x).tanh())


CACHED_AROUND = r"parametrize.cached\(\) around the jitted call at .*round2\.py:\d+"


def test_a_model_compiled_outside_parametrize_cached_is_not_run_inside_it():
    """Compiled outside ``cached()``, the trace ran the power iteration once per use inside it
    too, where eager runs it once: other outputs and buffers, silently. Whether the call is inside
    ``cached()`` is guarded for modules with parametrizations: the call inside compiles again, and
    is refused."""
    torch.manual_seed(0)
    model, x = TwiceNormalised(), torch.randn(2, 4)
    torch.manual_seed(0)
    eager = TwiceNormalised()
    jitted = thunder_rs.jit(model)
    torch.testing.assert_close(jitted(x), eager(x), **EXACT)
    with parametrize.cached(), pytest.raises(ThunderNotImplementedError, match=CACHED_AROUND):
        jitted(x)
    torch.testing.assert_close(jitted(x), eager(x), **EXACT)  # (the refused call left the buffers as they were)
    torch.testing.assert_close(dict(model.named_buffers()), dict(eager.named_buffers()), **EXACT)
    assert thunder_rs.compile_stats(jitted).cache_misses == 1


# ----------------------------------------------------------------------------- torch.distributions


def policy_step(policy, step):
    obs, actions = torch.randn(6, 4), torch.randint(0, 3, (6,))
    loss, ratio = policy(obs, actions, torch.randn(6) * 0.1 - 1, torch.randn(6))
    return loss, [ratio]


@pytest.mark.parametrize(
    "make, program",
    [
        (SquashedGaussianPolicy, returns_loss(lambda: torch.randn(5, 4))),
        (ClippedPolicy, policy_step),
        (MixtureDensity, returns_loss(lambda: torch.randn(5, 4), lambda: torch.randn(5))),
    ],
    ids=["sac_tanh_gaussian", "ppo_categorical", "mixture_density"],
)
def test_policies_and_densities_from_torch_distributions_train_as_eager(make, program):
    trains_as_eager(make, program)


def test_a_beta_policy_with_reparametrised_actions_trains_as_eager():
    """``Beta.rsample``'s backward calls ``torch._dirichlet_grad``, which has no meta kernel: it was
    refused as a data-dependent read in a backward. Its output is sized as its first argument."""
    trains_as_eager(BoundedPolicy, returns_loss(lambda: torch.randn(5, 4)))


def test_a_vae_taking_its_kl_term_from_kl_divergence_trains_as_eager(monkeypatch):
    """``kl_divergence`` memoises the rule it finds for the two distributions' classes in a global
    dict (``_KL_MEMOIZE[type(p), type(q)] = fun``): a store of a function under classes, which was
    refused as one a compiled call cannot repeat. It stores the same function again; the next call
    finds the rule there and compiles once more, as for any cache the program fills."""
    monkeypatch.setattr(D.kl, "_KL_MEMOIZE", {})
    trains_as_eager(DiagonalVAE, returns_loss(lambda: torch.rand(5, 10)), compiles=2)


class Shifted(D.Normal):
    pass


def _kl_shifted(p, q):
    return D.kl.kl_divergence(D.Normal(p.loc, p.scale), D.Normal(q.loc, q.scale)) + 1


def test_a_kl_rule_registered_after_compiling_is_used_as_in_eager(monkeypatch):
    """``register_kl`` clears the memo: the guarded dict no longer holds the rule the trace read."""
    monkeypatch.setattr(D.kl, "_KL_MEMOIZE", {})
    monkeypatch.setattr(D.kl, "_KL_REGISTRY", dict(D.kl._KL_REGISTRY))

    def kl(loc, scale):
        return D.kl_divergence(Shifted(loc, scale), Shifted(torch.zeros_like(loc), torch.ones_like(scale)))

    jitted, loc, scale = thunder_rs.jit(kl), torch.randn(3), torch.rand(3) + 0.5
    for _ in range(2):
        torch.testing.assert_close(jitted(loc, scale), kl(loc, scale), **EXACT)
    D.register_kl(Shifted, Shifted)(_kl_shifted)
    torch.testing.assert_close(jitted(loc, scale), kl(loc, scale), **EXACT)
    torch.testing.assert_close(jitted(loc, scale), D.kl.kl_divergence(D.Normal(loc, scale), D.Normal(0, 1)) + 1)


def prune_hidden_units_at_step_1(step, model):
    """Structural pruning: the first layer's weakest hidden units go, with the second layer's
    columns that read them (new, smaller parameters; the optimizer is made again)."""
    if step == 1:
        keep = model[0].weight.norm(dim=1).argsort()[2:].sort().values
        with torch.no_grad():
            model[0].weight = nn.Parameter(model[0].weight[keep].clone())
            model[0].bias = nn.Parameter(model[0].bias[keep].clone())
            model[2].weight = nn.Parameter(model[2].weight[:, keep].clone())


def test_a_layer_pruned_to_fewer_units_between_steps_recompiles_and_trains_as_eager():
    """Parameters given tensors of other sizes kept the cache entry (sizes were left out of the
    key): the trace of the unpruned layers ran, and its backward returned gradients of the old
    sizes (torch raised ``invalid gradient``). A slot's sizes are part of the key now."""

    def make_optimizer(params):  # (SGD without state: the pruned parameters are new ones)
        return torch.optim.SGD(params, lr=0.1)

    def program(model, step):
        out = model(torch.randn(4, 6))
        return out.square().mean(), [out]

    def make():
        return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))

    torch.manual_seed(0)
    model = make()
    torch.manual_seed(0)
    eager = make()
    jmodel = thunder_rs.jit(model)
    records = []
    for m, call in ((model, jmodel), (eager, eager)):
        record = {}
        for step in range(3):
            prune_hidden_units_at_step_1(step, m)
            steps = run_steps(m, call, program, 1, make_optimizer, None, None)
            record.update({f"step {step}: {name}": value for name, value in steps.items()})
            record[f"parameters after step {step}"] = [p.detach().clone() for p in m.parameters()]
        records.append(record)
    torch.testing.assert_close(records[0], records[1], **EXACT)
    assert thunder_rs.compile_stats(jmodel).cache_misses == 2


class Counts(nn.Module):
    """A module normalising by the size of a buffer it is given between calls."""

    def __init__(self):
        super().__init__()
        self.register_buffer("counts", torch.ones(2))

    def forward(self, x):
        return x * self.counts.numel() + self.counts.sum()


def test_a_buffer_given_a_tensor_of_other_sizes_recompiles():
    """The trace holds ``counts.numel()``: the entry of the 2-element buffer gave 7 where eager gives 10."""
    model, x = Counts(), torch.ones(3)
    jitted = thunder_rs.jit(model)
    torch.testing.assert_close(jitted(x), model(x), **EXACT)
    model.counts = torch.ones(5)
    torch.testing.assert_close(jitted(x), model(x), **EXACT)
    assert "sizes) (torch.float32" in thunder_rs.compile_stats(jitted).miss_reasons[-1]


# ---------------------------------------------------------------- state written under no_grad in the forward


@pytest.mark.parametrize(
    "make, program",
    [
        (CenteredTeacher, returns_loss(lambda: torch.randint(0, 10, (3, 5)))),
        (Prototypes, returns_loss(lambda: torch.randn(5, 4))),
        (ClippedCritic, returns_loss(lambda: torch.randn(5, 4), lambda: torch.randn(5, 4))),
        (RenormedEmbedding, returns_loss(lambda: torch.randint(0, 10, (3, 5)))),
    ],
    ids=["dino_center", "swav_prototypes", "wgan_weight_clipping", "embedding_max_norm"],
)
def test_state_written_under_no_grad_inside_the_forward_is_eagers(make, program):
    trains_as_eager(make, program)


def test_a_momentum_encoder_updated_by_assigning_data_trains_as_eager():
    """``param_k.data = ...`` reached the eager fallback, which ran the setter while tracing and
    again as the compiled call's value check: the first call moved the key encoder twice. It is a
    write into the parameter autograd does not see now. (The queue's pointer, read from a buffer
    by ``int()``, is 0, 4, 0: two compiles.)"""
    pair = returns_loss(lambda: torch.randn(4, 4), lambda: torch.randn(4, 4))
    trains_as_eager(MomentumContrast, pair, compiles=2)


def tie_by_data(model, x):
    model[1].weight.data = model[0].weight.data
    return model(x)


def resize_by_data(model, x):
    model[0].bias.data = torch.zeros(5)
    return model(x)


@pytest.mark.parametrize(
    "program, why",
    [(tie_by_data, "share its memory"), (resize_by_data, r"size, dtype or device would change \(from \[3\]")],
    ids=["tied", "resized"],
)
def test_assigning_data_that_would_share_memory_or_change_the_size_is_refused_naming_the_line(program, why):
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    with pytest.raises(ThunderNotImplementedError, match=rf"Tensor.data = value at .*round2\.py:\d+: .*{why}"):
        thunder_rs.jit(program)(model, torch.randn(2, 3))


def tie_head_to_embedding_at_step_1(step, model):
    if step == 1:
        model[1].weight = model[0].weight


def reinitialise_through_views_under_no_grad(step, model):
    with torch.no_grad():
        model[1].weight.copy_(model[0].weight)
        model[1].weight[:, 0].zero_()


@pytest.mark.parametrize(
    "before, compiles",
    [(tie_head_to_embedding_at_step_1, 2), (reinitialise_through_views_under_no_grad, 1)],
    ids=["tied_at_step_1", "views_written_under_no_grad"],
)
def test_parameters_tied_or_written_through_views_between_steps_match_eager(before, compiles):
    def program(model, step):
        logits = model(torch.randint(0, 10, (3, 5)))
        return logits.logsumexp(-1).mean(), [logits]

    make = lambda: nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))  # noqa: E731
    trains_as_eager(make, program, make_optimizer=sgd, before=before, compiles=compiles)


# ----------------------------------------------------------------------------- attention with padding


def padding(lengths, length):
    return torch.arange(length) >= torch.tensor(lengths)[:, None]


def cross_attention_step(model, step):
    query, key, value = torch.randn(2, 4, 8), torch.randn(2, 5, 6), torch.randn(2, 5, 5)
    loss, weights = model(query, key, value, padding([5, 3], 5))
    return loss, [weights]


def seq2seq_step(model, step):
    loss, out = model(torch.randn(2, 5, 8), torch.randn(2, 4, 8), padding([5, 3], 5), padding([4, 2], 4))
    return loss, [out]


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask and attn_mask is deprecated")
@pytest.mark.parametrize(
    "make, program",
    [(PaddedAttention, cross_attention_step), (Seq2SeqTransformer, seq2seq_step)],
    ids=["multihead_attention_weights", "transformer"],
)
def test_attention_with_padding_masks_and_dropout_trains_as_eager(make, program):
    trains_as_eager(make, program)


# ---------------------------------------------------------------- around the call: clipping, EMA, loss scaling


@pytest.mark.parametrize(
    "clip",
    [
        lambda ps: nn.utils.clip_grad_norm_(ps, 0.1, norm_type=float("inf")),
        lambda ps: nn.utils.clip_grad_norm_(ps, 0.1, norm_type=1.0, foreach=True),
        lambda ps: nn.utils.clip_grad_norm_(ps, 0.1, foreach=False, error_if_nonfinite=True),
    ],
    ids=["inf_norm", "l1_foreach", "checked"],
)
def test_gradients_of_a_jitted_backward_clip_as_eagers(clip):
    make = lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))  # noqa: E731
    trains_as_eager(make, rows(4), after_backward=lambda model: clip(model.parameters()))


def ema_update(ema: nn.Module, model: nn.Module, decay: float):
    """timm's ModelEmaV2: every float entry of the state dict moves towards the model's; the
    others (BatchNorm's ``num_batches_tracked``) are copied."""
    with torch.no_grad():
        for averaged, current in zip(ema.state_dict().values(), model.state_dict().values()):
            if averaged.dtype.is_floating_point:
                averaged.copy_(averaged * decay + (1.0 - decay) * current)
            else:
                averaged.copy_(current)


def test_a_jitted_ema_of_a_models_state_dict_is_eagers():
    torch.manual_seed(0)
    make = lambda: nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))  # noqa: E731
    model, ema, expected = make(), make(), make()
    ema.load_state_dict(model.state_dict())
    expected.load_state_dict(model.state_dict())
    jitted = thunder_rs.jit(ema_update)
    for _ in range(3):
        model(torch.randn(5, 4)).square().mean().backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
        jitted(ema, model, 0.9)
        ema_update(expected, model, 0.9)
        torch.testing.assert_close(ema.state_dict(), expected.state_dict(), **EXACT)
    assert thunder_rs.compile_stats(jitted).cache_misses == 1


def test_batch_norm_with_a_cumulative_average_trains_as_eager():
    """``momentum=None`` averages the batches seen: eager passes ``1 / float(num_batches_tracked)``
    to its kernel, which the trace computes as a 0-d tensor. Only the decomposition took a tensor
    momentum, normalising and updating in float32 where eager's kernel updates in double: outputs,
    gradients and running statistics differed by ulps. The kernel takes it now, read as eager's number."""
    make = lambda: nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6, momentum=None), nn.ReLU(), nn.Linear(6, 2))  # noqa: E731
    trains_as_eager(make, rows(4), steps=4)


def test_an_averaged_model_with_recomputed_batch_norm_statistics_is_eagers():
    """SWA's recipe: an EMA of the weights (``AveragedModel``), then ``update_bn`` recomputing the
    averaged model's BatchNorm statistics (``momentum=None``) over the data, the averaged model jitted."""

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2))

    results = []
    for jit in (True, False):
        model = make()
        averaged = swa_utils.AveragedModel(model, multi_avg_fn=swa_utils.get_ema_multi_avg_fn(0.9))
        call, averaged_call = (thunder_rs.jit(model), thunder_rs.jit(averaged)) if jit else (model, averaged)
        optimizer = torch.optim.SGD(model.parameters(), 0.1)
        torch.manual_seed(1)
        for _ in range(3):
            call(torch.randn(5, 4)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            averaged.update_parameters(model)
        swa_utils.update_bn([torch.randn(5, 4) for _ in range(3)], averaged_call)
        with torch.no_grad():
            out = averaged_call.eval()(torch.ones(2, 4))
        results.append((out, dict(averaged.named_buffers()), dict(averaged.named_parameters())))
    torch.testing.assert_close(results[0], results[1], **EXACT)


def unscale_and_update(grads: list, scale, growth_tracker):
    """A hand-written GradScaler step: unscale the gradients, note an inf or a NaN among them, then
    back the scale off or grow it."""
    found_inf = torch.zeros(1)
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, scale.double().reciprocal().float())
    torch._amp_update_scale_(scale, growth_tracker, found_inf, 1.7, 0.3, 2)
    return found_inf


def test_loss_scaling_by_hand_with_the_amp_kernels_is_eagers():
    """``_amp_foreach_non_finite_check_and_unscale_`` and ``_amp_update_scale_`` write their
    arguments in place and were refused; they are eager's CPU kernels now, computed from the
    gradients each call gets (an inf at step 2 skips the step and backs the scale off)."""
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2)) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    jitted = thunder_rs.jit(unscale_and_update)
    runs = [(jitted, models[0], torch.full((1,), 2.0**10), torch.zeros(1, dtype=torch.int32))]
    runs.append((unscale_and_update, models[1], torch.full((1,), 2.0**10), torch.zeros(1, dtype=torch.int32)))
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    for step in range(5):
        x = torch.randn(3, 4)
        if step == 2:
            x[0, 0] = float("inf")
        found = []
        for (update, model, scale, tracker), optimizer in zip(runs, optimizers):
            (model(x).square().mean() * scale).backward()
            found.append(update([p.grad for p in model.parameters()], scale, tracker))
            if not found[-1].item():
                optimizer.step()
            optimizer.zero_grad()
        torch.testing.assert_close(found[0], found[1], **EXACT)
        torch.testing.assert_close(runs[0][2:], runs[1][2:], **EXACT)  # the scales and the counts
        torch.testing.assert_close(dict(models[0].named_parameters()), dict(models[1].named_parameters()), **EXACT)
    assert thunder_rs.compile_stats(jitted).cache_misses == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_unscaling_gradients_of_other_dtypes_is_eagers(dtype):
    """Half and bfloat16 gradients times the float inverse scale in float, rounded once."""
    grads = [torch.randn(5, 3).to(dtype) * 1000, torch.tensor(3.0, dtype=dtype)]
    expected, found, found_expected = [g.clone() for g in grads], torch.zeros(1), torch.zeros(1)
    inv_scale = torch.tensor([1 / 3])
    thunder_rs.jit(torch._amp_foreach_non_finite_check_and_unscale_)(grads, found, inv_scale)
    torch._amp_foreach_non_finite_check_and_unscale_(expected, found_expected, inv_scale)
    torch.testing.assert_close((grads, found), (expected, found_expected), **EXACT)


def test_a_scale_growing_past_float_keeps_its_value_as_eager():
    scale, tracker = torch.tensor([3e38]), torch.tensor([1], dtype=torch.int32)
    expected = (scale.clone(), tracker.clone())
    thunder_rs.jit(torch._amp_update_scale_)(scale, tracker, torch.zeros(1), 2.0, 0.5, 2)
    torch._amp_update_scale_(*expected, torch.zeros(1), 2.0, 0.5, 2)
    torch.testing.assert_close((scale, tracker), expected, **EXACT)


# ----------------------------------------------------------------------------- torch.func and forward-mode AD


def tangent_by_forward_ad(x):
    with fwAD.dual_level():
        y = fwAD.make_dual(x, torch.ones_like(x)).sin()
        return fwAD.unpack_dual(y).tangent


def jvp_of_sine(x):
    return torch.func.jvp(torch.sin, (x,), (torch.ones_like(x),))


@pytest.mark.parametrize("program", [tangent_by_forward_ad, jvp_of_sine], ids=["forward_ad", "jvp"])
def test_forward_mode_differentiation_inside_the_program_is_refused_naming_the_line(program):
    """The traced tensor carried no tangent: ``unpack_dual(y).tangent`` was None where eager's is
    cos(x), and ``jvp`` failed at run time on the forward-AD level recorded while tracing."""
    with pytest.raises(ThunderNotImplementedError, match=r"forward mode at .*round2\.py:\d+ \(torch\.func\.jvp"):
        thunder_rs.jit(program)(torch.randn(3))


def test_reverse_mode_transforms_inside_the_program_are_refused_naming_the_line():
    def program(x):
        return torch.func.grad(lambda y: (y.sin() * y).sum())(x)

    with pytest.raises(ThunderNotImplementedError, match=r"transforms over traced tensors .*round2\.py:\d+"):
        thunder_rs.jit(program)(torch.randn(3))


def test_transforms_over_a_jitted_function_are_eagers():
    def f(x):
        return (x.exp() * x.cos()).sum()

    jitted, x = thunder_rs.jit(f), torch.randn(4, 3)
    torch.testing.assert_close(torch.func.grad(jitted)(x), torch.func.grad(f)(x), **EXACT)
    torch.testing.assert_close(torch.func.vmap(torch.func.grad(jitted))(x), torch.func.vmap(torch.func.grad(f))(x))
    primal, tangent = torch.func.jvp(thunder_rs.jit(torch.sin), (x,), (torch.ones_like(x),))
    torch.testing.assert_close((primal, tangent), (x.sin(), x.cos()), **EXACT)


def test_functional_call_with_computed_parameters_inside_the_program_is_eagers():
    torch.manual_seed(0)
    layer = nn.Linear(3, 2)

    def doubled(x):
        return torch.func.functional_call(layer, {"weight": layer.weight * 2, "bias": layer.bias}, (x,))

    x = torch.randn(4, 3)
    out, expected = thunder_rs.jit(doubled)(x), doubled(x)
    torch.testing.assert_close(out, expected, **EXACT)
    out.sum().backward()
    grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    expected.sum().backward()
    torch.testing.assert_close(grads, [p.grad for p in layer.parameters()], **EXACT)


# ---------------------------------------------------------------- Hugging Face: sampling, beams, checkpointing

HF_COMMON = dict(vocab_size=99, pad_token_id=0, bos_token_id=1, eos_token_id=2)
HF_LLAMA = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32, intermediate_size=64)


def hf_model(family: str, **config):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if family == "gpt2":
        settings = dict(n_layer=2, n_head=2, n_embd=32, n_positions=64, **HF_COMMON, **config)
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(**settings))
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**HF_LLAMA, **HF_COMMON, **config))


def left_padded_prompt() -> dict:
    ids = torch.randint(3, 99, (2, 5), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[1, :2], mask[1, :2] = 0, 0
    return dict(input_ids=ids, attention_mask=mask, pad_token_id=0)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:thunder_rs.*recompiled")
@pytest.mark.parametrize(
    "family, options",
    [
        ("llama", dict(do_sample=True, top_k=10, temperature=0.7)),
        ("llama", dict(do_sample=True, top_p=0.9, repetition_penalty=1.3)),
        ("llama", dict(num_beams=3, num_return_sequences=2, output_scores=True, return_dict_in_generate=True)),
        ("gpt2", dict(num_beams=2, do_sample=True, no_repeat_ngram_size=2)),
        ("gpt2", dict(do_sample=True, min_p=0.05, output_logits=True, return_dict_in_generate=True)),
    ],
    ids=["top_k_temperature", "top_p_repetition_penalty", "beam_search", "beam_sample", "min_p"],
)
def test_generate_with_sampling_and_beams_on_a_jitted_model_is_eagers(family, options):
    """The logits processors and the draws run in ``generate``, eagerly, on the jitted forwards' logits."""
    model = hf_model(family).eval()
    eager = hf_model(family).eval()
    jmodel = thunder_rs.jit(model)
    results = []
    for call in (jmodel, eager):
        torch.manual_seed(7)
        results.append((call.generate(**left_padded_prompt(), max_new_tokens=5, **options), torch.get_rng_state()))
    (out, state), (expected, expected_state) = results
    if options.get("return_dict_in_generate"):
        torch.testing.assert_close(out.sequences, expected.sequences, **EXACT)
        scores = "scores" if "output_scores" in options else "logits"
        torch.testing.assert_close(getattr(out, scores), getattr(expected, scores), rtol=1e-4, atol=1e-5)
    else:
        torch.testing.assert_close(out, expected, **EXACT)
    assert torch.equal(state, expected_state)
    assert thunder_rs.compile_stats(jmodel).cache_misses == 3  # the prompt, the first step, the later steps


class LanguageModelLoss(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, mask):
        return self.model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated")
@pytest.mark.parametrize(
    "family, dropout, use_reentrant",
    [
        ("gpt2", dict(resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1), False),
        ("llama", dict(attention_dropout=0.1), True),
    ],
    ids=["gpt2", "llama_reentrant"],
)
def test_a_language_model_with_gradient_checkpointing_and_dropout_trains_as_eager(family, dropout, use_reentrant):
    def make():
        model = hf_model(family, **dropout).train()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})
        return LanguageModelLoss(model)

    def program(model, step):
        ids = torch.randint(3, 99, (2, 6))
        mask = torch.ones_like(ids)
        mask[1, 4:] = 0
        return model(ids, mask), []

    trains_as_eager(make, program)
