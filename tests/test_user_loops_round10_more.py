"""Round 10's loops continued (``test_user_loops_round10.py``): reinforcement learning (PPO with
GAE, value clipping and a KL stop, double DQN with a target network), generative models (a VAE with
a cyclical KL over ``Independent`` normals, a RealNVP flow, DDIM sampling), MAML through a jitted
function of its weights, pruning applied again mid-run, observers of quantization written in
place, weight norm under ``parametrize.cached``, checkpointing toggled per epoch, early stopping by
a parameter vector, evaluation under ``inference_mode``, gradient reversal, FixMatch, Barlow
Twins, centre loss, temperature scaling."""

import copy
import inspect
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parameters_to_vector, parametrize, prune, vector_to_parameters

import thunder_rs

from thunder_rs.errors import ThunderNotImplementedError

from user_loops_round6 import trains_as_eager
from user_loops_round7 import VAE, Policy, batch, call_step, classify, loop, mlp
from user_loops_round9 import optimized
from user_loops_round10 import Checkpointed, DomainAdversarial, Flow, NoisePredictor, Observed, ddim_sample

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore::UserWarning"),  # (Dynamo's graph breaks, at backward())
]
SLOW = pytest.mark.slow
F32 = dict(rtol=1.3e-6, atol=1e-5)
MODES = ["jit", pytest.param("compile", marks=SLOW)]


def misses(mode, n):
    return None if mode == "compile" else n


def fit(world, loss, optimizer="optimizer"):
    loss.backward()
    world[optimizer].step()
    world[optimizer].zero_grad()
    return loss.detach()


# ---------------------------------------------------------------------------- reinforcement


def gae(rewards, values, last, gamma=0.9, lam=0.8):
    advantages, running = torch.zeros_like(rewards), torch.zeros(())
    for t in reversed(range(rewards.shape[0])):
        following = values[t + 1] if t + 1 < rewards.shape[0] else last
        delta = rewards[t] + gamma * following - values[t]
        running = delta + gamma * lam * running
        advantages[t] = running
    return advantages


def ppo_body(world, obs, rewards, epochs=3, clip=0.2, target_kl=0.02):
    """PPO over a rollout of the jitted policy under ``no_grad`` (old log-probabilities and values
    detached), advantages by GAE, epochs of minibatches by ``randperm``, the value loss clipped
    around the old values, and the epochs stopped early when the approximate KL passes a target."""
    with torch.no_grad():
        logits, values = world["forward"].model(obs)
        dist = torch.distributions.Categorical(logits=logits)
        actions = dist.sample()
        old_log_probs = dist.log_prob(actions)
        advantages = gae(rewards, values, values[-1])
        returns = advantages + values
    stats = []
    for _ in range(epochs):
        for rows in torch.randperm(obs.shape[0]).split(4):
            logits, value = world["forward"].model(obs[rows])
            dist = torch.distributions.Categorical(logits=logits)
            log_ratio = dist.log_prob(actions[rows]) - old_log_probs[rows]
            ratio, adv = log_ratio.exp(), advantages[rows]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            policy = -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv).mean()
            clipped = values[rows] + (value - values[rows]).clamp(-clip, clip)
            value_loss = torch.max((value - returns[rows]) ** 2, (clipped - returns[rows]) ** 2).mean()
            loss = policy + 0.5 * value_loss - 0.01 * dist.entropy().mean()
            world["optimizer"].zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(world["model"].parameters(), 0.5)
            world["optimizer"].step()
            with torch.no_grad():
                kl = ((ratio - 1) - log_ratio).mean()
            stats.append(torch.stack([loss.detach(), kl]))
        if kl > target_kl:
            break
    return torch.stack(stats), actions


@pytest.mark.parametrize("mode", MODES)
def test_ppo_with_gae_value_clipping_and_a_kl_early_stop_is_eagers(mode):
    build = optimized(lambda ps: torch.optim.Adam(ps, 3e-2), Policy)
    step = lambda world, i: world["step"](torch.randn(8, 4), torch.rand(8))  # noqa: E731
    trains_as_eager(loop(build, ppo_body, whole=False), step, modes=(mode,), steps=2, misses=misses(mode, 2))


def dqn_body(world, obs, i, k=2, gamma=0.9, epsilon=0.3):
    """Double DQN over a replay list: epsilon-greedy actions from the jitted online network,
    transitions appended, a minibatch drawn by ``randint``, the next action by the online network
    and its value by the target network (under ``no_grad``), ``smooth_l1_loss``, the target
    network synced by ``load_state_dict`` every ``k`` steps."""
    with torch.no_grad():
        greedy = world["forward"].model(obs).argmax(-1)
    explore = torch.rand(obs.shape[0]) < epsilon
    actions = torch.where(explore, torch.randint(0, 3, (obs.shape[0],)), greedy)
    rewards, next_obs = -(obs[:, 0] - actions.float() + 1).abs(), obs + 0.1 * torch.randn_like(obs)
    world["replay"].extend(zip(obs, actions, rewards, next_obs))
    drawn = torch.randint(0, len(world["replay"]), (6,)).tolist()
    o, a, r, o2 = (torch.stack(column) for column in zip(*(world["replay"][j] for j in drawn)))
    with torch.no_grad():
        best = world["forward"].model(o2).argmax(-1, keepdim=True)
        target = r + gamma * world["forward"].target(o2).gather(1, best).squeeze(1)
    q = world["forward"].model(o).gather(1, a[:, None]).squeeze(1)
    loss = F.smooth_l1_loss(q, target, beta=0.5)
    world["optimizer"].zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(world["model"].parameters(), 10.0)
    world["optimizer"].step()
    if i % k == k - 1:
        world["target"].load_state_dict(world["model"].state_dict())
    return loss.detach(), actions


@pytest.mark.parametrize("mode", MODES)
def test_double_dqn_with_a_replay_list_and_a_target_network_synced_every_k_steps_is_eagers(mode):
    def build():
        online, target = mlp(), mlp()
        target.load_state_dict(online.state_dict())
        return {
            "model": online,
            "target": target.requires_grad_(False),
            "replay": [],
            "optimizer": torch.optim.RMSprop(online.parameters(), 1e-2),
        }

    make = loop(build, dqn_body, whole=False, forwards=("model", "target"))
    step = lambda world, i: world["step"](torch.randn(3, 4), i)  # noqa: E731
    trains_as_eager(make, step, modes=(mode,), steps=5, misses=misses(mode, 4))


# ------------------------------------------------------------------------------ generative


class IndependentVAE(VAE):
    """The KL by ``kl_divergence`` of ``Independent`` normals, the sample by ``rsample``."""

    def forward(self, x, beta):
        mu, log_var = self.encoder(x).chunk(2, dim=-1)
        posterior = torch.distributions.Independent(torch.distributions.Normal(mu, (0.5 * log_var).exp()), 1)
        prior = torch.distributions.Independent(
            torch.distributions.Normal(torch.zeros_like(mu), torch.ones_like(mu)), 1
        )
        kl = torch.distributions.kl_divergence(posterior, prior).mean()
        reconstruction = (
            F.binary_cross_entropy_with_logits(self.decoder(posterior.rsample()), x, reduction="sum") / x.shape[0]
        )
        return reconstruction + beta * kl, kl


@pytest.mark.parametrize("mode", MODES)
def test_a_vae_over_independent_normals_with_a_cyclical_kl_schedule_is_eagers(mode):
    """The KL weight cycling linearly from 0 to 1 over two steps then held (cyclical annealing)."""

    def body(world, x, i):
        beta = min(1.0, (i % 3) / 2)
        loss, kl = world["forward"].model(x, beta)
        return fit(world, loss), kl.detach()

    build = optimized(lambda ps: torch.optim.Adam(ps, 1e-2), IndependentVAE)
    step = lambda world, i: world["step"](torch.rand(5, 6).round(), i)  # noqa: E731
    trains_as_eager(loop(build, body, whole=False), step, modes=(mode,), steps=4, misses=misses(mode, 2))


def test_a_realnvp_flow_trained_by_its_log_determinant_and_sampled_by_its_inverse_is_eagers():
    """The negative log-likelihood of the couplings' outputs under a normal base plus their log
    determinants; samples from the inverses (a jitted method) under ``no_grad`` each step."""

    def build():
        flow = Flow()
        return {"model": flow, "sample": flow.sample, "optimizer": torch.optim.Adam(flow.parameters(), 1e-2)}

    def body(world, x):
        loss = fit(world, world["forward"].model(x))
        with torch.no_grad():
            return loss, world["forward"].sample(torch.randn(3, 4))

    make = loop(build, body, whole=False, forwards=("model", "sample"))
    step = lambda world, i: world["step"](torch.randn(6, 4) * torch.tensor([1.0, 0.5, 2.0, 1.0]))  # noqa: E731
    trains_as_eager(make, step, steps=3, misses=2)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("eta", [0.0, pytest.param(1.0, marks=SLOW)], ids=["ddim", "ddpm_like"])
def test_diffusion_training_then_ddim_sampling_through_the_jitted_noise_predictor_is_eagers(mode, eta):
    """Training steps (timesteps and noise drawn, a cosine schedule), then DDIM sampling in
    ``eval()`` under ``no_grad`` with the noise predictor called at every fifth timestep (``eta``:
    the draws of the stochastic sampler)."""

    def body(world, x0, i):
        loss = fit(world, world["forward"].loss(x0))
        if i < 2:
            return loss, torch.zeros(3, 4)
        world["model"].eval()
        with torch.no_grad():
            sampled = ddim_sample(world["forward"].model, world["model"].alphas, torch.randn(3, 4), eta=eta)
        world["model"].train()
        return loss, sampled

    def build():
        model = NoisePredictor()
        return {"model": model, "loss": model.loss, "optimizer": torch.optim.Adam(model.parameters(), 1e-2)}

    make = loop(build, body, whole=False, forwards=("model", "loss"))
    step = lambda world, i: world["step"](torch.randn(6, 4), i)  # noqa: E731
    trains_as_eager(make, step, modes=(mode,), steps=3, misses=misses(mode, 2))


# ---------------------------------------------------------------------------------- MAML


def net_of(weights, x):
    w1, b1, w2, b2 = weights
    return F.linear(torch.tanh(F.linear(x, w1, b1)), w2, b2)


def warmed(world):
    """A double backward through the jitted function once, before the loop, from fixed values and
    into no ``.grad``: the first double backward through a compiled call is eager's within a
    rounding (``test_double_backward_order.py``: it differentiates the program computed again),
    every later one eager's bit for bit."""
    if world.setdefault("warm", []):
        return
    x = torch.linspace(-1, 1, 5)[:, None]
    weights = list(world["weights"])
    (grad,) = torch.autograd.grad(world["forward"].model(weights, x).sum(), [weights[0]], create_graph=True)
    world["warm"].append(torch.autograd.grad(grad.sum(), weights)[0])


def maml_body(world, tasks, inner_lr=0.1, inner_steps=2):
    """Second-order MAML: per task, inner SGD steps by ``autograd.grad(create_graph=True)`` through
    the jitted function of the weights, the query loss of the adapted weights summed, and the meta
    step over the initial weights (after :func:`warmed`)."""
    warmed(world)
    meta, query_losses = list(world["weights"]), []
    for xs, ys, xq, yq in tasks:
        fast = meta
        for _ in range(inner_steps):
            loss = F.mse_loss(world["forward"].model(fast, xs), ys)
            grads = torch.autograd.grad(loss, fast, create_graph=True)
            fast = [w - inner_lr * g for w, g in zip(fast, grads)]
        query_losses.append(F.mse_loss(world["forward"].model(fast, xq), yq))
    return fit(world, torch.stack(query_losses).mean()), torch.stack(query_losses).detach()


@pytest.mark.parametrize("mode", MODES)
def test_second_order_maml_through_a_jitted_function_of_the_weights_is_eagers(mode):
    def build():
        layers = mlp(1, 8, 1)
        weights = nn.ParameterList([layers[0].weight, layers[0].bias, layers[2].weight, layers[2].bias])
        return {"weights": weights, "model": net_of, "optimizer": torch.optim.Adam(weights.parameters(), 1e-2)}

    def step(world, i):
        tasks = []
        for _ in range(2):
            amplitude, phase = torch.rand(()) + 0.5, torch.rand(()) * 3
            xs, xq = torch.rand(5, 1) * 6 - 3, torch.rand(5, 1) * 6 - 3
            tasks.append((xs, amplitude * (xs + phase).sin(), xq, amplitude * (xq + phase).sin()))
        return world["step"](tasks)

    trains_as_eager(loop(build, maml_body, whole=False), step, modes=(mode,), steps=2, misses=misses(mode, 1))


# ------------------------------------------------------------------- what the loop changes


def test_global_pruning_applied_again_mid_run_and_a_random_prune_are_eagers():
    """``global_unstructured`` L1 pruning of both layers at step 1 (the optimizer over the
    ``weight_orig`` parameters), a ``random_unstructured`` prune of the head at step 2 (a draw,
    combined by a ``PruningContainer``), and L1 again at step 3: the masks are buffers the jitted
    model reads."""

    def body(world, x, y, i):
        net = world["model"]
        if i == 1:
            prune.global_unstructured([(net[0], "weight"), (net[2], "weight")], prune.L1Unstructured, amount=0.3)
            world["optimizer"] = torch.optim.SGD(net.parameters(), 0.2, momentum=0.9)
        if i == 2:
            prune.random_unstructured(net[2], "weight", amount=0.2)
        if i == 3:
            prune.global_unstructured([(net[0], "weight"), (net[2], "weight")], prune.L1Unstructured, amount=0.2)
        return classify(world, x, y), int(sum((m == 0).sum() for _, m in net.named_buffers()))

    build = optimized(lambda ps: torch.optim.SGD(ps, 0.2, momentum=0.9))
    trains_as_eager(loop(build, body, whole=False), lambda world, i: world["step"](*batch(), i), steps=5)


@pytest.mark.parametrize("mode", MODES)
def test_observers_of_quantization_moved_in_place_by_the_forward_are_eagers(mode):
    """The observer's buffers written by the jitted forward while training (``lerp_`` under
    ``no_grad``), read as tensor scale and zero point; per-channel fake quantization of the
    weights; an evaluation in ``eval()`` (the observer frozen) every other step."""
    x_val = torch.randn(4, 4)

    def body(world, x, y, i):
        loss = classify(world, x, y)
        if i % 2 == 0:
            return loss, torch.zeros(4, 3)
        world["model"].eval()
        with torch.no_grad():
            out = world["forward"].model(x_val)
        world["model"].train()
        return loss, out

    build = optimized(lambda ps: torch.optim.Adam(ps, 1e-2), Observed)
    step = lambda world, i: world["step"](*batch(), i)  # noqa: E731
    trains_as_eager(loop(build, body, whole=False), step, modes=(mode,), steps=4, misses=misses(mode, 2))


class Consistent(nn.Module):
    """Weight-normed layers (one over the whole weight, ``dim=None``), a clean and a noisy pass
    inside ``parametrize.cached()`` (each weight computed once per call), a consistency loss."""

    def __init__(self):
        super().__init__()
        self.body = mlp()
        nn.utils.parametrizations.weight_norm(self.body[0])
        nn.utils.parametrizations.weight_norm(self.body[2], dim=None)

    def forward(self, x, y, noise):
        with parametrize.cached():
            clean, noisy = self.body(x), self.body(x + noise)
        return F.cross_entropy(clean, y) + F.mse_loss(noisy.softmax(-1), clean.softmax(-1).detach())


def test_weight_norm_cached_around_two_jitted_calls_is_refused_and_cached_inside_is_eagers():
    """``parametrize.cached()`` around jitted calls is refused naming the line (eager reads the
    weights cached at the first call in later ones); entered inside the program, it trains as
    eager."""
    net = mlp()
    nn.utils.parametrizations.weight_norm(net[0])
    jitted, x = thunder_rs.jit(net), torch.randn(3, 4)
    with pytest.raises(ThunderNotImplementedError) as refused:
        with parametrize.cached():
            called_at = inspect.currentframe().f_lineno + 1
            jitted(x)
    assert re.search(rf"cached\(\) around the jitted call at .*round10_more\.py:{called_at}:", str(refused.value))

    def body(world, x, y):
        return fit(world, world["forward"].model(x, y, 0.1 * torch.randn_like(x)))

    build = optimized(lambda ps: torch.optim.Adam(ps, 1e-2), Consistent)
    trains_as_eager(loop(build, body, whole=False), call_step, steps=3, misses=1)


@pytest.mark.parametrize("mode", MODES)
def test_gradient_checkpointing_toggled_between_epochs_with_dropout_is_eagers(mode):
    """``model.checkpointing`` on for odd epochs (two steps each): the jitted model compiled for
    each setting, dropout's masks drawn again in the recomputation as eager's."""

    def body(world, x, y, i):
        world["model"].checkpointing = (i // 2) % 2 == 1
        return classify(world, x, y)

    build = optimized(lambda ps: torch.optim.SGD(ps, 0.1, momentum=0.9), Checkpointed)
    step = lambda world, i: world["step"](*batch(), i)  # noqa: E731
    trains_as_eager(loop(build, body, whole=False), step, modes=(mode,), steps=6, misses=misses(mode, 2))


def test_early_stopping_restoring_a_parameter_vector_and_the_optimizers_state_is_eagers():
    """The best weights kept as ``parameters_to_vector`` and the optimizer's state as a deep copy
    of its state dict; at patience 1, ``vector_to_parameters`` and ``load_state_dict`` restore them
    and the learning rate is halved."""
    x_val, y_val = batch(8)

    def build():
        net = mlp()
        return {"model": net, "optimizer": torch.optim.Adam(net.parameters(), 0.3), "best": [], "log": []}

    def body(world, x, y):
        loss = classify(world, x, y)
        with torch.no_grad():
            val = F.cross_entropy(world["forward"].model(x_val), y_val)
        best, log = world["best"], world["log"]
        if not best or val < best[0]:
            best[:] = [
                val,
                parameters_to_vector(world["model"].parameters()),
                copy.deepcopy(world["optimizer"].state_dict()),
            ]
            log.append(0)
        elif log[-1] >= 0:
            vector_to_parameters(best[1], world["model"].parameters())
            world["optimizer"].load_state_dict(best[2])
            for group in world["optimizer"].param_groups:
                group["lr"] /= 2
            log.append(-1)
        else:
            log.append(1)
        return loss, val

    trains_as_eager(loop(build, body, whole=False), call_step, steps=6, misses=2)


@pytest.mark.parametrize("mode", MODES)
def test_evaluation_under_inference_mode_picking_the_next_steps_hard_examples_is_eagers(mode):
    """Each step an evaluation of a pool under ``inference_mode`` in ``eval()`` (batch norm and
    dropout); its losses (inference tensors) pick the hardest rows by ``topk``, which the next
    step trains on with a weight from the inference tensor cloned outside."""
    pool_x, pool_y = batch(10)

    def build():
        net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.2), nn.ReLU(), nn.Linear(8, 3))
        return {
            "model": net,
            "optimizer": torch.optim.SGD(net.parameters(), 0.1, momentum=0.9),
            "hard": [torch.arange(4)],
        }

    def body(world):
        rows = world["hard"][-1]
        weight = world["weights"][-1].clone() if "weights" in world else torch.ones(4)
        loss = (F.cross_entropy(world["forward"].model(pool_x[rows]), pool_y[rows], reduction="none") * weight).mean()
        loss = fit(world, loss)
        world["model"].eval()
        with torch.inference_mode():
            losses = F.cross_entropy(world["forward"].model(pool_x), pool_y, reduction="none")
            hardest = losses.topk(4)
        world["model"].train()
        world["hard"].append(hardest.indices)
        world.setdefault("weights", []).append(hardest.values.softmax(0) * 4)
        return loss, losses.clone(), torch.is_inference(losses)

    make = loop(build, body, whole=False)
    trains_as_eager(make, lambda world, i: world["step"](), modes=(mode,), steps=4, misses=misses(mode, 2))


# ------------------------------------------------------------------------- losses, calibration


@pytest.mark.parametrize("mode", MODES)
def test_domain_adversarial_training_through_a_gradient_reversal_is_eagers(mode):
    """DANN: a custom ``autograd.Function`` reversing the gradient inside the jitted model, its
    strength (a float argument) ramped per step, the domain loss over source and target batches."""

    def body(world, xs, ys, xt, i):
        lam = 2 / (1 + torch.exp(torch.tensor(-2.0 * i)).item()) - 1
        logits, domain_s = world["forward"].model(xs, lam)
        _, domain_t = world["forward"].model(xt, lam)
        domains = torch.cat([domain_s, domain_t])
        labels = torch.cat([torch.zeros(xs.shape[0]), torch.ones(xt.shape[0])])
        loss = F.cross_entropy(logits, ys) + F.binary_cross_entropy_with_logits(domains, labels)
        return fit(world, loss)

    build = optimized(lambda ps: torch.optim.SGD(ps, 0.1, momentum=0.9), DomainAdversarial)
    step = lambda world, i: world["step"](*batch(), torch.randn(6, 4) + 1, i)  # noqa: E731
    trains_as_eager(loop(build, body, whole=False), step, modes=(mode,), steps=4, misses=misses(mode, 2))


def fixmatch_body(world, x, y, unlabeled, threshold=0.6):
    """FixMatch: pseudo-labels from the weakly augmented view under ``no_grad`` kept where their
    confidence passes a threshold (a mask), the strongly augmented view trained on them."""
    weak = unlabeled + 0.05 * torch.randn_like(unlabeled)
    strong = unlabeled * (torch.rand_like(unlabeled) > 0.3) + 0.3 * torch.randn_like(unlabeled)
    with torch.no_grad():
        confidence, pseudo = world["forward"].model(weak).softmax(-1).max(-1)
    mask = (confidence >= threshold).float()
    unsupervised = (F.cross_entropy(world["forward"].model(strong), pseudo, reduction="none") * mask).mean()
    loss = F.cross_entropy(world["forward"].model(x), y) + unsupervised
    return fit(world, loss), mask


def test_fixmatch_with_thresholded_pseudo_labels_is_eagers():
    build = optimized(lambda ps: torch.optim.SGD(ps, 0.3, momentum=0.9, nesterov=True))
    step = lambda world, i: world["step"](*batch(4), torch.randn(8, 4) * 2)  # noqa: E731
    trains_as_eager(loop(build, fixmatch_body, whole=False), step, steps=4, misses=3)


def barlow_body(world, x, lambd=0.05):
    """Barlow Twins: two views through the jitted network, their embeddings normalised by a batch
    norm without affine, the cross-correlation's diagonal pulled to 1 and its off-diagonal to 0."""
    a, b = (world["forward"].model(x + 0.2 * torch.randn_like(x)) for _ in range(2))
    c = world["bn"](a).T @ world["bn"](b) / x.shape[0]
    on = (torch.diagonal(c) - 1).pow(2).sum()
    off = c.flatten()[:-1].view(c.shape[0] - 1, c.shape[0] + 1)[:, 1:].pow(2).sum()
    return fit(world, on + lambd * off)


def test_barlow_twins_with_its_cross_correlation_is_eagers():
    def build():
        net = mlp(4, 8, 6)
        return {
            "model": net,
            "bn": nn.BatchNorm1d(6, affine=False),
            "optimizer": torch.optim.Adam(net.parameters(), 1e-2),
        }

    step = lambda world, i: world["step"](torch.randn(8, 4))  # noqa: E731
    trains_as_eager(loop(build, barlow_body, whole=False), step, steps=3, misses=1)


def test_a_centre_loss_with_centres_moved_by_hand_in_place_is_eagers():
    """Centre loss: the features' distances to their class centres (a tensor the loop keeps),
    the centres moved towards the batch's means by ``index_add_`` under ``no_grad``."""

    class Featured(nn.Module):
        def __init__(self):
            super().__init__()
            self.features, self.head = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)), nn.Linear(2, 3)

        def forward(self, x):
            f = self.features(x)
            return self.head(f), f

    def body(world, x, y, alpha=0.5):
        logits, f = world["forward"].model(x)
        centres = world["centres"]
        loss = fit(world, F.cross_entropy(logits, y) + 0.1 * (f - centres[y]).pow(2).sum(1).mean())
        with torch.no_grad():
            delta = torch.zeros_like(centres).index_add_(0, y, centres[y] - f.detach())
            counts = torch.bincount(y, minlength=3).float()[:, None]
            centres.sub_(alpha * delta / (1 + counts))
        return loss

    build = optimized(lambda ps: torch.optim.SGD(ps, 0.1), Featured, centres=lambda o: torch.zeros(3, 2))
    trains_as_eager(loop(build, body, whole=False), call_step, steps=4, misses=1)


def test_temperature_scaling_by_lbfgs_after_training_is_eagers():
    """Two training steps, then a temperature fitted by LBFGS on validation logits from the jitted
    model under ``no_grad`` (the closure dividing them by the temperature)."""
    x_val, y_val = batch(8)

    def body(world, x, y, i):
        loss = classify(world, x, y)
        if i < 2:
            return loss, torch.ones(1)
        with torch.no_grad():
            logits = world["forward"].model(x_val)
        temperature = nn.Parameter(torch.ones(1) * 1.5)
        lbfgs = torch.optim.LBFGS([temperature], lr=0.1, max_iter=20)

        def closure():
            lbfgs.zero_grad()
            nll = F.cross_entropy(logits / temperature, y_val)
            nll.backward()
            return nll

        lbfgs.step(closure)
        return loss, temperature.detach()

    build = optimized(lambda ps: torch.optim.SGD(ps, 0.5))
    trains_as_eager(loop(build, body, whole=False), lambda world, i: world["step"](*batch(), i), steps=3, misses=2)


# ------------------------------------------------------------------------ whole steps compiled


def maml_world():
    layers = mlp(1, 8, 1)
    weights = nn.ParameterList([layers[0].weight, layers[0].bias, layers[2].weight, layers[2].bias])
    return {"weights": weights, "model": net_of, "optimizer": torch.optim.SGD(weights.parameters(), 1e-2)}


def sine_tasks(world, i):
    tasks = []
    for _ in range(2):
        amplitude, phase = torch.rand(()) + 0.5, torch.rand(()) * 3
        xs, xq = torch.rand(5, 1) * 6 - 3, torch.rand(5, 1) * 6 - 3
        tasks.append((xs, amplitude * (xs + phase).sin(), xq, amplitude * (xq + phase).sin()))
    return world["step"](tasks)


def online_and_target():
    online, target = mlp(), mlp()
    target.load_state_dict(online.state_dict())
    return {"model": online, "target": target.requires_grad_(False), "replay": [],
            "optimizer": torch.optim.SGD(online.parameters(), 1e-2, momentum=0.9)}  # fmt: skip


WHOLE = {
    "ppo": (
        optimized(lambda ps: torch.optim.SGD(ps, 0.1), Policy),
        ppo_body,
        lambda world, i: world["step"](torch.randn(8, 4), torch.rand(8)),
        ("model",),
    ),
    "dqn": (online_and_target, dqn_body, lambda world, i: world["step"](torch.randn(3, 4), i), ("model", "target")),
    "fixmatch": (
        optimized(lambda ps: torch.optim.SGD(ps, 0.3, momentum=0.9)),
        fixmatch_body,
        lambda world, i: world["step"](*batch(4), torch.randn(8, 4) * 2),
        ("model",),
    ),
    "maml": (maml_world, maml_body, sine_tasks, ("model",)),
}


@SLOW
@pytest.mark.parametrize("name", WHOLE)
def test_whole_steps_compiled_for_thunder_rs_are_eagers(name):
    """The step with its losses, backwards and (SGD) optimizer steps under one ``torch.compile``
    (Dynamo breaking its graph where the step reads a value or calls ``autograd.grad``)."""
    build, body, step, forwards = WHOLE[name]
    trains_as_eager(loop(build, body, forwards=forwards), step, modes=("compile",), steps=3)
