"""Training loops as users write them, round 7, next to eager step by step from one seed (harness
in ``user_loops_round6.py``, programs in ``user_loops_round7.py``): the model jitted with the loop
eager, and the step (or the model) under ``torch.compile(backend="thunder_rs")``. Every optimizer
torch has with its options (foreach, fused, maximize, capturable, amsgrad, differentiable),
schedulers (plateau driven by a jitted metric, cyclic with momentum, polynomial, chained, the
warmup of ``transformers``), weight tying undone mid-run, parametrizations, pruning, fake
quantization, fp32 master weights, gradient noise, DP-SGD, curriculum lengths, GANs, REINFORCE,
PPO, a VAE, a diffusion step, triplet mining, weighted multi-label losses."""

import contextlib
import functools
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations, parametrize, prune
from torch.optim import lr_scheduler

import thunder_rs

from user_loops_round6 import trains_as_eager
from user_loops_round7 import (
    VAE,
    ActorCritic,
    Denoiser,
    DiscreteVAE,
    FakeQuantized,
    Policy,
    QuantAware,
    Skew,
    TiedLM,
    batch,
    call_step,
    classify,
    info_nce,
    loop,
    mlp,
    two_views,
)

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore::UserWarning"),  # (Dynamo's graph breaks, at backward())
]


def optimized(make_optimizer, model=mlp, **extra):
    def build():
        net = model()
        return {"model": net, "optimizer": make_optimizer(net.parameters()), **extra}

    return build


# ---------------------------------------------------------------------------------- optimizers

OPTIMIZERS = {
    "adagrad_foreach": lambda ps: torch.optim.Adagrad(ps, 0.1, lr_decay=0.01, foreach=True),
    "adagrad_for_loop": lambda ps: torch.optim.Adagrad(ps, 0.1, weight_decay=0.1, foreach=False),
    "adagrad_fused": lambda ps: torch.optim.Adagrad(ps, 0.1, fused=True),
    "rmsprop_for_loop": lambda ps: torch.optim.RMSprop(ps, 1e-2, alpha=0.9, foreach=False),
    "rmsprop_maximize": lambda ps: torch.optim.RMSprop(ps, 1e-2, momentum=0.9, maximize=True, foreach=True),
    "adadelta": lambda ps: torch.optim.Adadelta(ps, 1.0, weight_decay=0.01),
    "nadam_decoupled": lambda ps: torch.optim.NAdam(ps, 1e-2, weight_decay=0.1, decoupled_weight_decay=True),
    "nadam_for_loop": lambda ps: torch.optim.NAdam(ps, 1e-2, foreach=False),
    "radam_decoupled": lambda ps: torch.optim.RAdam(ps, 1e-2, weight_decay=0.1, decoupled_weight_decay=True),
    "adamax": lambda ps: torch.optim.Adamax(ps, 1e-2, foreach=True),
    "asgd": lambda ps: torch.optim.ASGD(ps, 0.1, t0=1),
    "rprop": lambda ps: torch.optim.Rprop(ps, 1e-2, foreach=False),
    "sgd_fused_maximize": lambda ps: torch.optim.SGD(ps, 0.1, momentum=0.9, maximize=True, fused=True),
    "adamw_differentiable": lambda ps: torch.optim.AdamW(ps, 1e-2, differentiable=True),
    "adam_fused_amsgrad_maximize": lambda ps: torch.optim.Adam(ps, 1e-2, amsgrad=True, maximize=True, fused=True),
}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_each_optimizer_with_its_options_steps_the_jitted_and_compiled_models_as_eager(name):
    """The model jitted or compiled, the optimizer eager's: its state bit for bit eager's."""
    trains_as_eager(loop(optimized(OPTIMIZERS[name]), classify, whole=False), call_step, misses=1)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["nadam_decoupled", "asgd", "rprop", "adamax"])
def test_compiled_whole_steps_with_more_optimizers_are_dynamos(name):
    trains_as_eager(loop(optimized(OPTIMIZERS[name]), classify), call_step, dynamo=True)


# ---------------------------------------------------------------------------------- schedulers


def test_a_plateau_schedule_driven_by_a_jitted_evaluation_metric_is_eagers():
    """The metric is computed under ``no_grad`` in eval mode by the same jitted model."""
    x_val, y_val = batch(8)

    def build():
        net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.3), nn.Tanh(), nn.Linear(8, 3))
        optimizer = torch.optim.SGD(net.parameters(), 0.5)
        plateau = lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0, threshold=0.05, cooldown=1)
        return {"model": net, "optimizer": optimizer, "scheduler": plateau}

    def body(world, x, y):
        world["model"].train()
        loss = classify(world, x, y)
        world["model"].eval()
        with torch.no_grad():
            metric = F.cross_entropy(world["forward"].model(x_val), y_val)
        world["scheduler"].step(metric)
        return loss, metric, world["scheduler"].num_bad_epochs

    trains_as_eager(loop(build, body, whole=False), call_step, steps=6, misses=2)


SCHEDULES = {
    "cyclic_momentum": lambda o: lr_scheduler.CyclicLR(o, 0.01, 0.1, step_size_up=2, mode="triangular2"),
    "polynomial": lambda o: lr_scheduler.PolynomialLR(o, total_iters=4, power=2.0),
    "chained": lambda o: lr_scheduler.ChainedScheduler(
        [lr_scheduler.ConstantLR(o, 0.5, total_iters=2), lr_scheduler.ExponentialLR(o, 0.9)]
    ),
}


def scheduled(name, optimizer):
    """The scheduler, and the schedulers the harness reads (a chain has no epoch of its own: its links')."""
    scheduler = SCHEDULES[name](optimizer)
    links = getattr(scheduler, "_schedulers", [scheduler])
    return {"scheduler": SimpleNamespace(step=scheduler.step), **{f"link {i}": s for i, s in enumerate(links)}}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("cyclic_momentum", marks=pytest.mark.slow),
        pytest.param("polynomial", marks=pytest.mark.slow),
        "chained",
    ],
)
def test_cyclic_polynomial_and_chained_schedules_stepped_in_a_compiled_step_are_eagers(name):
    """CyclicLR cycles SGD's momentum inversely to the learning rate."""

    def build():
        net = mlp()
        optimizer = torch.optim.SGD(net.parameters(), 0.1, momentum=0.9)
        return {"model": net, "optimizer": optimizer, **scheduled(name, optimizer)}

    def body(world, x, y):
        loss = classify(world, x, y)
        world["scheduler"].step()
        return loss, [g["momentum"] for g in world["optimizer"].param_groups]

    trains_as_eager(loop(build, body), call_step, steps=5)


def test_the_linear_warmup_of_transformers_in_a_loop_without_trainer_is_eagers():
    transformers = pytest.importorskip("transformers")

    def build():
        net = mlp()
        optimizer = torch.optim.AdamW(net.parameters(), 1e-2, weight_decay=0.01)
        schedule = transformers.get_linear_schedule_with_warmup(optimizer, 2, 6)
        return {"model": net, "optimizer": optimizer, "scheduler": schedule}

    def body(world, x, y):
        loss = F.cross_entropy(world["forward"].model(x), y)
        loss.backward()
        nn.utils.clip_grad_norm_(world["model"].parameters(), 1.0)
        world["optimizer"].step()
        world["scheduler"].step()
        world["optimizer"].zero_grad()
        return loss.detach()

    trains_as_eager(loop(build, body, whole=False), call_step, steps=5, misses=1)


# ------------------------------------------------------------------- tying, parametrizations


def lm_batch():
    return torch.randint(0, 11, (3, 5)), torch.randint(0, 11, (3, 5))


def test_an_embedding_tied_to_the_head_then_untied_mid_run_trains_as_eager():
    """Untying gives the head a new parameter, which the optimizer is given: the jitted model
    reads the new one (a second compile: one parameter more)."""

    def body(world, ids, targets):
        loss = world["forward"].model(ids, targets)
        loss.backward()
        world["optimizer"].step()
        world["optimizer"].zero_grad()
        return loss.detach()

    def step(world, i):
        if i == 2:
            world["optimizer"].add_param_group({"params": [world["model"].untie()], "lr": 0.05})
        return world["step"](*lm_batch())

    make = loop(optimized(lambda ps: torch.optim.SGD(ps, 0.1, momentum=0.9), TiedLM), body, whole=False)
    trains_as_eager(make, step, steps=4, misses=2)


def spectral():
    net = mlp()
    parametrizations.spectral_norm(net[0], n_power_iterations=2)
    return net


@pytest.mark.slow
def test_a_spectral_norm_parametrization_trained_updates_its_power_iterations_as_eager():
    trains_as_eager(loop(optimized(lambda ps: torch.optim.Adam(ps, 1e-2), spectral), classify), call_step, dynamo=True)


def orthogonal_by_hand():
    net = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 3))
    parametrize.register_parametrization(net[0], "weight", Skew())
    return net


def test_a_custom_orthogonal_parametrization_trains_as_eager():
    """The weight is the exponential of a skew-symmetric matrix, recomputed every call."""
    make = loop(optimized(lambda ps: torch.optim.SGD(ps, 0.1), orthogonal_by_hand), classify, whole=False)
    trains_as_eager(make, call_step, misses=1, rtol=1.3e-6, atol=1e-5)


@pytest.mark.slow
def test_a_custom_orthogonal_parametrization_in_a_compiled_whole_step_is_eagers():
    trains_as_eager(loop(optimized(lambda ps: torch.optim.SGD(ps, 0.1), orthogonal_by_hand), classify), call_step)


def test_pruning_masks_applied_then_removed_mid_run_train_as_eager():
    """``prune`` reparametrizes the weight by a forward pre-hook (``weight_orig * weight_mask``);
    ``prune.remove`` makes the pruned weight the parameter ``weight`` again (the object the
    optimizer holds as ``weight_orig``): a second compile."""

    def build():
        net = mlp()
        prune.l1_unstructured(net[0], "weight", amount=0.4)
        prune.random_unstructured(net[2], "weight", amount=0.3)
        return {"model": net, "optimizer": torch.optim.SGD(net.parameters(), 0.1, momentum=0.5)}

    def step(world, i):
        if i == 2:
            prune.remove(world["model"][0], "weight")
        return call_step(world, i)

    trains_as_eager(loop(build, classify, whole=False), step, steps=4, misses=2)


def test_fake_quantization_with_straight_through_gradients_trains_as_eager():
    make = loop(optimized(lambda ps: torch.optim.SGD(ps, 0.1), FakeQuantized), classify, whole=False)
    trains_as_eager(make, call_step, misses=1)


# ------------------------------------------------------------------------- weights and noise


def test_fp32_master_weights_with_a_bf16_model_copy_synced_each_step_are_eagers():
    def build():
        master = mlp()
        model = mlp().to(torch.bfloat16)
        model.load_state_dict(master.state_dict())
        return {"model": model, "master": master, "optimizer": torch.optim.Adam(master.parameters(), 1e-2)}

    def body(world, x, y):
        model, master = world["model"], world["master"]
        loss = F.cross_entropy(world["forward"].model(x.bfloat16()).float(), y)
        loss.backward()
        for p, m in zip(model.parameters(), master.parameters()):
            m.grad = p.grad.float()
            p.grad = None
        world["optimizer"].step()
        world["optimizer"].zero_grad()
        with torch.no_grad():
            for p, m in zip(model.parameters(), master.parameters()):
                p.copy_(m)
        return loss.detach()

    trains_as_eager(loop(build, body, whole=False), call_step, misses=1)


def test_gradient_noise_from_a_seeded_generator_annealed_by_step_is_eagers():
    def build():
        net = mlp()
        return {"model": net, "optimizer": torch.optim.SGD(net.parameters(), 0.1), "generator": torch.Generator()}

    def body(world, x, y, i):
        loss = F.cross_entropy(world["forward"].model(x), y)
        loss.backward()
        for p in world["model"].parameters():
            p.grad += torch.randn(p.shape, generator=world["generator"]) * (0.01 / (1 + i) ** 0.55)
        world["optimizer"].step()
        world["optimizer"].zero_grad()
        return loss.detach(), world["generator"].get_state()

    def make(mode):
        world = loop(build, body)(mode)
        world["generator"].manual_seed(7)
        return world

    trains_as_eager(make, lambda world, i: world["step"](*batch(), i))


def per_sample_grads(model):
    """Per-sample gradients by ``vmap(grad)`` of a functional call."""

    def loss_of(p, xi, yi):
        return F.cross_entropy(torch.func.functional_call(model, p, (xi[None],)), yi[None])

    def grads(params, x, y):
        return torch.func.vmap(torch.func.grad(loss_of), in_dims=(None, 0, 0))(params, x, y)

    return grads


def dp_sgd_body(world, x, y):
    """DP-SGD: per-sample gradients each clipped to norm 1, summed, noised from the generator and
    averaged."""
    model = world["model"]
    grads = world["forward"].per_sample({k: v.detach() for k, v in model.named_parameters()}, x, y)
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads.values()]).norm(dim=0)
    factor = (1.0 / (norms + 1e-6)).clamp(max=1.0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            clipped = (grads[name] * factor.view(-1, *[1] * (grads[name].dim() - 1))).sum(0)
            noise = torch.randn(p.shape, generator=world["generator"]) * 0.5
            p.grad = (clipped + noise) / x.shape[0]
    world["optimizer"].step()
    world["optimizer"].zero_grad()
    return norms


@pytest.mark.slow
def test_dp_sgd_with_per_sample_gradients_clipped_and_noised_is_eagers():
    def build():
        net = mlp()
        generator = torch.Generator().manual_seed(3)
        optimizer = torch.optim.SGD(net.parameters(), 0.2)
        return {"model": net, "per_sample": per_sample_grads(net), "optimizer": optimizer, "generator": generator}

    trains_as_eager(loop(build, dp_sgd_body, forwards=("per_sample",)), call_step, misses=1, rtol=1.3e-6, atol=1e-5)


# ------------------------------------------------------------------------ curricula, GANs, RL


@pytest.mark.slow
def test_a_curriculum_growing_the_sequence_length_each_epoch_is_eagers():
    """Lengths 2, 3, 4, 5: the jitted GRU compiles for the first and once more for lengths that
    vary (the size becomes symbolic)."""

    def build():
        rnn, head = nn.GRU(3, 5, batch_first=True), nn.Linear(5, 2)
        return {"rnn": rnn, "head": head, "optimizer": torch.optim.Adam([*rnn.parameters(), *head.parameters()], 1e-2)}

    def body(world, x, y):
        out, _ = world["forward"].rnn(x)
        loss = F.cross_entropy(world["head"](out[:, -1]), y)
        loss.backward()
        world["optimizer"].step()
        world["optimizer"].zero_grad()
        return loss.detach()

    step = lambda world, i: world["step"](torch.randn(4, 2 + i, 3), torch.randint(0, 2, (4,)))  # noqa: E731
    trains_as_eager(loop(build, body, forwards=("rnn",)), step, steps=4, misses=2, dynamo=True)


def gan_world():
    torch.manual_seed(0)
    generator = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 4))
    discriminator = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))
    return {
        "generator": generator,
        "discriminator": discriminator,
        "g_optimizer": torch.optim.SGD(generator.parameters(), 0.05, momentum=0.5),
        "d_optimizer": torch.optim.SGD(discriminator.parameters(), 0.05, momentum=0.5),
    }


def gan_body(world, real):
    """D on real and detached fakes, then G through D with D's ``requires_grad`` off."""
    G, D = world["forward"].generator, world["forward"].discriminator
    fake = G(torch.randn(real.shape[0], 2))
    ones, zeros = torch.ones(real.shape[0], 1), torch.zeros(real.shape[0], 1)
    d_loss = F.binary_cross_entropy_with_logits(D(real), ones) + F.binary_cross_entropy_with_logits(
        D(fake.detach()), zeros
    )
    world["d_optimizer"].zero_grad()
    d_loss.backward()
    world["d_optimizer"].step()
    world["discriminator"].requires_grad_(False)
    g_loss = F.binary_cross_entropy_with_logits(D(fake), ones)
    world["g_optimizer"].zero_grad()
    g_loss.backward()
    world["g_optimizer"].step()
    world["discriminator"].requires_grad_(True)
    return d_loss.detach(), g_loss.detach()


def test_a_gan_alternating_two_optimizers_with_the_discriminator_frozen_for_the_generator_is_eagers():
    """The jitted discriminator compiles once with its parameters requiring grad, once without.
    Compiled whole, one graph returns ``d_loss`` and the fakes: ``d_loss.backward()`` reached the
    loss only and freed the residuals of the generator too, so that ``g_loss.backward()`` raised
    eager's error for a graph freed (eager's frees the discriminator's nodes only)."""
    make = loop(gan_world, gan_body, forwards=("generator", "discriminator"))
    trains_as_eager(make, lambda world, i: world["step"](torch.randn(6, 4) + 1), misses=3)


def two_losses(x, w, v):
    h = (x * w).sin()
    return h.sum(), (h * 2).sum(), (x * v).cos().sum()


@pytest.mark.parametrize(
    "hooks", [contextlib.nullcontext, torch.autograd.graph.save_on_cpu], ids=["plain", "save_on_cpu"]
)
def test_backwards_from_outputs_of_one_call_one_at_a_time_free_what_eagers_free(hooks):
    """Each loss's backward frees the residuals it read only (the call's inputs, which the caller
    holds, none): a later backward from an output whose graph is apart from the first's runs; one
    from an output sharing a node that saved tensors raises eager's error. Under saved-tensor
    hooks too, where the residuals are packed."""
    outcomes = []
    for fn in (two_losses, thunder_rs.jit(two_losses)):
        torch.manual_seed(0)
        x, w, v = torch.randn(3), torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
        with hooks():
            a, b, c = fn(x, w, v)
        a.backward()
        c.backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            b.backward()
        outcomes.append((w.grad, v.grad))
    torch.testing.assert_close(outcomes[1], outcomes[0], rtol=0, atol=0)


def reinforce_body(world, obs, returns):
    """REINFORCE with a baseline: actions sampled from ``Categorical``, their log-probabilities
    weighted by the advantage, an entropy bonus."""
    logits, value = world["forward"].model(obs)
    dist = torch.distributions.Categorical(logits=logits)
    actions = dist.sample()
    advantage = returns - value.detach()
    loss = -(dist.log_prob(actions) * advantage).mean() + F.mse_loss(value, returns) - 0.01 * dist.entropy().mean()
    loss.backward()
    world["optimizer"].step()
    world["optimizer"].zero_grad()
    return loss.detach(), actions


@pytest.mark.slow
def test_reinforce_with_sampled_actions_and_an_entropy_bonus_is_eagers():
    make = loop(optimized(lambda ps: torch.optim.Adam(ps, 1e-2), Policy), reinforce_body)
    trains_as_eager(make, lambda world, i: world["step"](torch.randn(8, 4), torch.randn(8)), misses=1, dynamo=True)


def ppo_step(world, i):
    """A rollout collected under ``no_grad`` by the same model, then two epochs of PPO's clipped
    objective over shuffled minibatches of the buffer."""
    forward = world["forward"].model
    obs = torch.randn(8, 4)
    with torch.no_grad():
        logits, values = forward(obs)
        dist = torch.distributions.Categorical(logits=logits)
        actions = dist.sample()
        old_log_probs = dist.log_prob(actions)
    returns = values + torch.randn(8)
    advantages = (returns - values) / ((returns - values).std() + 1e-8)
    losses = []
    for _ in range(2):
        for index in torch.randperm(8).chunk(2):
            losses.append(
                world["step"](obs[index], actions[index], old_log_probs[index], advantages[index], returns[index])
            )
    return losses


def ppo_body(world, obs, actions, old_log_probs, advantages, returns):
    logits, values = world["forward"].model(obs)
    dist = torch.distributions.Categorical(logits=logits)
    ratio = (dist.log_prob(actions) - old_log_probs).exp()
    clipped = torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)
    loss = -clipped.mean() + 0.5 * F.mse_loss(values, returns) - 0.01 * dist.entropy().mean()
    world["optimizer"].zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(world["model"].parameters(), 0.5)
    world["optimizer"].step()
    return loss.detach()


@pytest.mark.slow
def test_ppo_with_a_clipped_objective_over_minibatches_of_a_rollout_is_eagers():
    """The jitted model compiles for the rollout (no grad) and for the minibatches."""
    make = loop(optimized(lambda ps: torch.optim.SGD(ps, 0.05, momentum=0.9), Policy), ppo_body)
    trains_as_eager(make, ppo_step, misses=2)


# ------------------------------------------------------------------------- generative models


@pytest.mark.slow
def test_a_vae_with_rsample_and_kl_annealing_is_eagers():
    def body(world, x, i):
        loss, kl = world["forward"].model(x, min(1.0, i / 2))
        loss.backward()
        world["optimizer"].step()
        world["optimizer"].zero_grad()
        return loss.detach(), kl.detach()

    make = loop(optimized(lambda ps: torch.optim.SGD(ps, 0.05), VAE), body)
    trains_as_eager(make, lambda world, i: world["step"](torch.randn(5, 6), i), steps=4)


@pytest.mark.slow
def test_a_diffusion_step_with_sampled_timesteps_and_an_ema_model_is_eagers():
    def build():
        net = Denoiser()
        ema = torch.optim.swa_utils.AveragedModel(net, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9))
        return {"model": net, "ema": ema, "optimizer": torch.optim.AdamW(net.parameters(), 1e-2)}

    def body(world, x0):
        loss = world["forward"].model(x0)
        loss.backward()
        world["optimizer"].step()
        world["optimizer"].zero_grad()
        world["ema"].update_parameters(world["model"])
        return loss.detach()

    trains_as_eager(loop(build, body), lambda world, i: world["step"](torch.randn(6, 4)), misses=1, dynamo=True)


# ------------------------------------------------------------------------------------- losses


def triplet_body(world, x, labels):
    """Batch-hard mining: for each anchor the farthest positive and the nearest negative (argmax
    of masked distances), then ``triplet_margin_loss``."""
    z = F.normalize(world["forward"].model(x), dim=-1)
    with torch.no_grad():
        d = torch.cdist(z, z)
        same = labels[:, None] == labels[None, :]
        positive = torch.where(same, d, torch.full_like(d, -1.0)).argmax(1)
        negative = torch.where(same, torch.full_like(d, -1e9), -d).argmax(1)
    loss = F.triplet_margin_loss(z, z[positive], z[negative], margin=0.3)
    loss.backward()
    world["optimizer"].step()
    world["optimizer"].zero_grad()
    return loss.detach(), positive, negative


def test_a_triplet_loss_with_hard_negatives_mined_in_the_batch_is_eagers():
    make = loop(optimized(lambda ps: torch.optim.SGD(ps, 0.1), lambda: mlp(4, 8, 5)), triplet_body)
    trains_as_eager(make, lambda world, i: world["step"](torch.randn(8, 4), torch.arange(8) % 3), misses=1)


def test_multi_label_bce_with_logits_and_a_pos_weight_is_eagers():
    pos_weight = torch.tensor([1.0, 3.0, 0.5, 2.0])

    def body(world, x, targets):
        loss = F.binary_cross_entropy_with_logits(world["forward"].model(x), targets, pos_weight=pos_weight)
        loss.backward()
        world["optimizer"].step()
        world["optimizer"].zero_grad()
        return loss.detach()

    make = loop(optimized(lambda ps: torch.optim.SGD(ps, 0.1), lambda: mlp(4, 8, 4)), body)
    trains_as_eager(make, lambda world, i: world["step"](torch.randn(6, 4), (torch.rand(6, 4) < 0.3).float()), misses=1)


def test_swa_with_update_bn_over_a_loader_calling_the_jitted_model_is_eagers():
    """``update_bn`` resets the averaged model's batch-norm statistics and runs the loader through
    it with momentum ``None``: through the jitted averaged model."""

    def build():
        net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
        averaged = torch.optim.swa_utils.AveragedModel(net)
        return {"model": net, "averaged": averaged, "optimizer": torch.optim.SGD(net.parameters(), 0.1)}

    def body(world, x, y):
        loss = classify(world, x, y)
        world["averaged"].update_parameters(world["model"])
        return loss

    def step(world, i):
        loss = world["step"](*batch())
        loader = [torch.randn(5, 4) for _ in range(3)]
        torch.optim.swa_utils.update_bn(loader, world["forward"].averaged)
        return loss

    trains_as_eager(loop(build, body, whole=False, forwards=("model", "averaged")), step, misses=None)


# ---------------------------------------------------------------------- more compiled variants


@pytest.mark.slow
def test_an_embedding_tied_to_the_head_untied_mid_run_in_a_compiled_whole_step_is_eagers():
    def body(world, ids, targets):
        loss = world["forward"].model(ids, targets)
        loss.backward()
        world["optimizer"].step()
        world["optimizer"].zero_grad()
        return loss.detach()

    def step(world, i):
        if i == 2:
            world["optimizer"].add_param_group({"params": [world["model"].untie()], "lr": 0.05})
        return world["step"](*lm_batch())

    make = loop(optimized(lambda ps: torch.optim.SGD(ps, 0.1, momentum=0.9), TiedLM), body)
    trains_as_eager(make, step, steps=4, modes=("compile",))


@pytest.mark.slow
def test_pruning_and_fake_quantization_in_compiled_whole_steps_are_eagers():
    def pruned():
        net = mlp()
        prune.random_unstructured(net[0], "weight", amount=0.5)
        return net

    for model in (pruned, FakeQuantized):
        make = loop(optimized(lambda ps: torch.optim.SGD(ps, 0.1, momentum=0.5), model), classify)
        trains_as_eager(make, call_step, modes=("compile",))


@pytest.mark.slow
def test_simclr_over_a_large_batch_of_two_views_drawn_in_the_step_is_eagers():
    def body(world, x):
        h1, h2 = (world["forward"].model(v) for v in two_views(x))
        loss = info_nce(h1, h2)
        loss.backward()
        world["optimizer"].step()
        world["optimizer"].zero_grad()
        return loss.detach()

    make = loop(optimized(lambda ps: torch.optim.SGD(ps, 0.1, momentum=0.9), lambda: mlp(4, 16, 8)), body)
    trains_as_eager(make, lambda world, i: world["step"](torch.randn(128, 4)), misses=1, rtol=1.3e-6, atol=1e-5)


def evaluate(world, x, y):
    """An evaluation pass: top-1 and top-2 hits and a confusion matrix accumulated by index_put_."""
    with torch.no_grad():
        logits = world["forward"].model(x)
        top2 = logits.topk(2, dim=1).indices
        confusion = torch.zeros(3, 3).index_put_((y, top2[:, 0]), torch.ones(len(y)), accumulate=True)
        return (top2[:, 0] == y).sum(), (top2 == y[:, None]).any(1).sum(), confusion


def dropped():
    return nn.Sequential(mlp(), nn.Dropout(0.2))


def test_an_evaluation_loop_with_top_k_hits_and_a_confusion_matrix_between_epochs_is_eagers():
    def step(world, i):
        loss = world["step"](*batch())
        world["model"].eval()
        hits = [world["evaluate"](*batch(5)) for _ in range(2)]
        world["model"].train()
        return loss, hits

    def make(mode):
        world = loop(optimized(lambda ps: torch.optim.SGD(ps, 0.1), dropped), classify)(mode)
        evaluating = functools.partial(evaluate, world)
        world["evaluate"] = evaluating if mode in ("eager", "jit") else torch.compile(evaluating, backend="thunder_rs")
        return world

    trains_as_eager(make, step, misses=2)


def actor_critic_body(world, obs, returns):
    """The critic's loss backpropagated and stepped, then the actor's from the same call's logits,
    with the critic's values detached as the baseline."""
    logits, values = world["forward"].model(obs)
    critic_loss = F.mse_loss(values, returns)
    critic_loss.backward()
    world["critic_optimizer"].step()
    dist = torch.distributions.Categorical(logits=logits)
    actions = dist.sample()
    actor_loss = -(dist.log_prob(actions) * (returns - values.detach())).mean()
    actor_loss.backward()
    world["actor_optimizer"].step()
    world["actor_optimizer"].zero_grad()
    world["critic_optimizer"].zero_grad()
    return critic_loss.detach(), actor_loss.detach(), actions


def test_an_actor_and_a_critic_of_one_call_backpropagated_one_after_the_other_are_eagers():
    """The critic's backward reached one output of the jitted call and freed the residuals of the
    other: the actor's backward raised eager's error for a graph freed (eager's runs)."""

    def build():
        model = ActorCritic()
        return {
            "model": model,
            "actor_optimizer": torch.optim.SGD(model.actor.parameters(), 0.1),
            "critic_optimizer": torch.optim.SGD(model.critic.parameters(), 0.1, momentum=0.9),
        }

    make = loop(build, actor_critic_body)
    trains_as_eager(make, lambda world, i: world["step"](torch.randn(8, 4), torch.randn(8)), misses=1)


def test_quantization_aware_training_with_observers_frozen_mid_run_is_eagers():
    """The observer of the input is disabled at the third step (a flag buffer the forward reads)."""

    def step(world, i):
        if i == 2:
            world["model"].q_in.disable_observer()
        return call_step(world, i)

    make = loop(optimized(lambda ps: torch.optim.SGD(ps, 0.1), QuantAware), classify, whole=False)
    trains_as_eager(make, step, steps=4)


def normalized():
    net = mlp()
    parametrizations.weight_norm(net[0])
    parametrizations.spectral_norm(net[2])
    return net


def test_parametrizations_removed_mid_run_with_a_new_optimizer_train_as_eager():
    """Weight norm removed as its weight, spectral norm with ``leave_parametrized=True``: the
    jitted model reads the new parameters (a second compile)."""

    def step(world, i):
        if i == 2:
            parametrize.remove_parametrizations(world["model"][0], "weight")
            parametrize.remove_parametrizations(world["model"][2], "weight", leave_parametrized=True)
            world["optimizer"] = torch.optim.SGD(world["model"].parameters(), 0.1, momentum=0.9)
        return call_step(world, i)

    make = loop(optimized(lambda ps: torch.optim.SGD(ps, 0.1, momentum=0.9), normalized), classify, whole=False)
    trains_as_eager(make, step, steps=4, misses=2)


def test_a_discrete_vae_with_gumbel_softmax_and_beta_and_gamma_rsamples_is_eagers():
    """Two compiles: the temperature, a Python float, is specialised on first, then symbolic."""

    def body(world, x, i):
        loss = world["forward"].model(x, 1.0 / (1 + i))
        loss.backward()
        world["optimizer"].step()
        world["optimizer"].zero_grad()
        return loss.detach()

    make = loop(optimized(lambda ps: torch.optim.SGD(ps, 0.1), DiscreteVAE), body, whole=False)
    trains_as_eager(make, lambda world, i: world["step"](torch.randn(5, 6), i), misses=2)


@pytest.mark.slow
def test_the_cosine_warmup_of_transformers_with_clipping_in_a_compiled_whole_step_is_dynamos():
    transformers = pytest.importorskip("transformers")

    def build():
        net = mlp()
        optimizer = torch.optim.AdamW(net.parameters(), 1e-2, weight_decay=0.01)
        return {
            "model": net,
            "optimizer": optimizer,
            "scheduler": transformers.get_cosine_schedule_with_warmup(optimizer, 2, 6),
        }

    def body(world, x, y):
        loss = F.cross_entropy(world["forward"].model(x), y)
        loss.backward()
        nn.utils.clip_grad_norm_(world["model"].parameters(), 1.0)
        world["optimizer"].step()
        world["scheduler"].step()
        world["optimizer"].zero_grad()
        return loss.detach()

    trains_as_eager(loop(build, body), call_step, steps=5, modes=("compile",), dynamo=True)
