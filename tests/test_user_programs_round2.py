"""More training programs as users write them, each trained for a few steps under thunder_rs.jit
next to the same model built eagerly (``user_training.trains_as_eager``): losses, outputs, every
gradient, the parameters, the buffers, the optimizer's state and the random state after the steps
equal eager's (bit for bit on the CPU, one thread, where the same kernels run), and the compile
count is what the program needs. Parametrized layers (added, removed, pruned between steps),
``torch.distributions``, state updated under ``torch.no_grad()`` inside the forward, and attention
with padding masks. The models sit in ``user_models_round2.py``."""

import pytest
import torch
import torch.distributions as D
import torch.nn.utils.parametrize as parametrize
from torch import nn
from torch.nn.utils import parametrizations

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
from user_training import EXACT, Loss, returns_loss, rows, run_steps, sgd, trains_as_eager

pytestmark = pytest.mark.usefixtures("one_thread")


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


def resize_by_data(model, x):
    model[0].bias.data = torch.zeros(5)
    return model(x)


def test_assigning_data_of_another_size_then_using_it_raises_as_eager():
    # (Refused before, naming the line; other sizes now run: test_refusals_round2.py.) The bias of 5
    # does not fit the layer's 3 outputs, which eager's linear and the trace's both raise for.
    for run in (resize_by_data, thunder_rs.jit(resize_by_data)):
        model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
        with pytest.raises(RuntimeError, match=r"size .*\(5\)|\(5\).* size"):
            run(model, torch.randn(2, 3))


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
