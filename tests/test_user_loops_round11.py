"""Training loops as users write them, round 11, next to eager step by step from one seed (harness
in ``user_loops_round6.py``, loop maker in ``user_loops_round7.py``, programs in
``user_loops_round11.py``): the model jitted with the loop eager, and the model (or the whole step)
under ``torch.compile(backend="thunder_rs")``, compile counts read. Adversarial training (FGSM, PGD
with the model in evaluation for the attack, free adversarial training replaying a batch, virtual
adversarial training), ASAM, R-Drop, stochastic depth, gradient centralization, manifold mixup,
random erasing in place, EWC, PCGrad, Reptile, prompt tuning, a VQ-VAE's codebook moved in place,
an energy model trained from a replay buffer of Langevin samples, a physics-informed network,
SAC, Adafactor, Lion by hand, a step schedule, a Lookahead wrapper saved and loaded,
``channels_last`` convolutions and an LSTM over packed sequences. Decoding is in
``test_user_loops_round11_decoding.py``.

What differed from eager before: ``nn.EmbeddingBag(sparse=True)`` (and ``F.embedding_bag``) was
refused even where eager makes no sparse gradient (under ``no_grad``, or the weight frozen), and
the refusal did not name the user's line; R-Drop's symmetric KL compiled in a whole step (or
jitted) got gradients a last bit off eager's: ``kl_div``'s and ``poisson_nll_loss``'s rules summed
a target's terms before adding them to what another loss had given it; ``torch.gradient``'s rule
likewise (a physics-informed loss by finite differences)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import lr_scheduler

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError
from user_loops_round6 import trains_as_eager
from user_loops_round7 import batch, call_step, loop, mlp
from user_loops_round9 import MultiTask, optimized
from user_loops_round11 import (
    Actor,
    Adaptable,
    DeepResidual,
    Lookahead,
    ManifoldMixer,
    PackedTagger,
    SmallConvNet,
    SoftPrompt,
    TwinCritic,
    VectorQuantizer,
    fgsm,
    langevin,
    pgd,
    poisson_both_ways,
    symmetric_kl,
    symmetric_kl_of_probabilities,
)

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore::UserWarning"),  # (Dynamo's graph breaks, at backward())
]
SLOW = pytest.mark.slow
MODES = ["jit", pytest.param("compile", marks=SLOW)]
F32 = dict(rtol=1.3e-6, atol=1e-5)


def misses(mode, n):
    return None if mode == "compile" else n


def fit(world, loss, optimizer="optimizer"):
    world[optimizer].zero_grad()
    loss.backward()
    world[optimizer].step()
    return loss.detach()


def sgd(lr=0.1, model=mlp, decay=0.0, **extra):
    return optimized(lambda ps: torch.optim.SGD(ps, lr, momentum=0.9, weight_decay=decay), model=model, **extra)


# ---------------------------------------------------------------------------------- adversarial


@pytest.mark.parametrize("mode", MODES)
def test_fgsm_adversarial_training_on_clean_and_perturbed_halves_is_eagers(mode):
    """The input's gradient by ``autograd.grad`` through the model (the parameters' untouched),
    the adversarial batch clamped in place, the loss half clean and half adversarial."""

    def body(world, x, y):
        call = world["forward"].model
        adversarial = fgsm(call, x, y)
        loss = 0.5 * F.cross_entropy(call(x), y) + 0.5 * F.cross_entropy(call(adversarial), y)
        return fit(world, loss), adversarial

    trains_as_eager(loop(sgd(), body, whole=False), call_step, modes=(mode,), misses=misses(mode, 2))


@pytest.mark.parametrize("mode", MODES)
def test_pgd_with_the_model_in_evaluation_for_the_attack_is_eagers(mode):
    """Three PGD steps from a uniform start with ``loss.backward()`` (the parameters' gradients
    accumulated, then zeroed), the model in ``eval()`` for the attack (batch norm's running
    statistics, no dropout) and back in ``train()`` for the step on the adversarial batch: two
    entries, one per mode."""

    def model():
        return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.2), nn.Linear(8, 3))

    def body(world, x, y):
        world["model"].eval()
        adversarial = pgd(world["forward"].model, x, y)
        world["model"].train()
        return fit(world, F.cross_entropy(world["forward"].model(adversarial), y)), adversarial

    trains_as_eager(loop(sgd(model=model), body, whole=False), call_step, modes=(mode,), misses=misses(mode, 2))


@pytest.mark.parametrize("mode", MODES)
def test_free_adversarial_training_replaying_a_batch_with_a_persistent_perturbation_is_eagers(mode):
    """Free adversarial training: each batch replayed three times, one backward giving the
    parameters' gradients (stepped) and the perturbation's (a leaf the world keeps, moved by its
    sign and clamped in place under ``no_grad``, its gradient cleared)."""

    def build():
        return {**sgd(0.05)(), "delta": torch.zeros(6, 4, requires_grad=True)}

    def body(world, x, y):
        delta, losses = world["delta"], []
        for _ in range(3):
            losses.append(fit(world, F.cross_entropy(world["forward"].model(x + delta), y)))
            with torch.no_grad():
                delta.add_(0.1 * delta.grad.sign()).clamp_(-0.3, 0.3)
            delta.grad = None
        return torch.stack(losses)

    trains_as_eager(loop(build, body, whole=False), call_step, modes=(mode,), misses=misses(mode, 1))


def vat_loss(call, x, xi: float = 1e-6, eps: float = 0.5):
    """Virtual adversarial training's smoothness loss: a random direction refined by one power
    iteration (the KL's gradient with respect to it), the KL at the adversarial perturbation."""
    with torch.no_grad():
        p = torch.softmax(call(x), -1)
    d = F.normalize(torch.randn_like(x), dim=1).requires_grad_()
    kl = F.kl_div(F.log_softmax(call(x + xi * d), -1), p, reduction="batchmean")
    (grad,) = torch.autograd.grad(kl, d)
    r = eps * F.normalize(grad, dim=1)
    return F.kl_div(F.log_softmax(call(x + r), -1), p, reduction="batchmean")


@pytest.mark.parametrize("mode", MODES)
def test_virtual_adversarial_training_on_unlabelled_rows_is_eagers(mode):
    """Four entries: the labelled rows, the unlabelled ones under ``no_grad``, with a perturbation
    that requires grad, and with the adversarial one."""

    def body(world, x, y, unlabelled):
        call = world["forward"].model
        smooth = vat_loss(call, unlabelled)
        return fit(world, F.cross_entropy(call(x), y) + smooth), smooth.detach()

    step = lambda world, i: world["step"](*batch(), torch.randn(5, 4))  # noqa: E731
    trains_as_eager(loop(sgd(), body, whole=False), step, modes=(mode,), misses=misses(mode, 4))


def asam_body(world, x, y, rho: float = 0.5):
    """ASAM: the ascent ``rho * |w|^2 g / ||(|w| g)||`` added to the weights in place, the second
    forward's gradient taken, the ascent subtracted, the base optimizer stepped."""
    call, optimizer = world["forward"].model, world["optimizer"]
    loss = F.cross_entropy(call(x), y)
    loss.backward()
    params = [p for p in world["model"].parameters() if p.grad is not None]
    with torch.no_grad():
        scaled = torch._foreach_mul(torch._foreach_abs(params), [p.grad for p in params])
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(scaled)))
        ascent = torch._foreach_mul(torch._foreach_abs(params), scaled)
        torch._foreach_mul_(ascent, rho / (norm + 1e-12))
        torch._foreach_add_(params, ascent)
    optimizer.zero_grad()
    sharp = F.cross_entropy(call(x), y)
    sharp.backward()
    with torch.no_grad():
        torch._foreach_sub_(params, ascent)
    optimizer.step()
    optimizer.zero_grad()
    return loss.detach(), sharp.detach(), norm


@pytest.mark.parametrize("mode", MODES)
def test_asam_with_an_adaptive_ascent_added_and_removed_in_place_is_eagers(mode):
    trains_as_eager(loop(sgd(), asam_body, whole=False), call_step, modes=(mode,), misses=misses(mode, 1))


# ------------------------------------------------------------------------------- regularization


@pytest.mark.parametrize("mode", MODES)
def test_r_drop_with_two_dropout_forwards_and_a_symmetric_kl_is_eagers(mode):
    """Under ``compile`` the whole step, the loss in the graph (the KL's gradients: below)."""

    def model():
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 3))

    def body(world, x, y):
        call = world["forward"].model
        a, b = call(x), call(x)
        kl = symmetric_kl(a, b) / 2
        return fit(world, (F.cross_entropy(a, y) + F.cross_entropy(b, y)) / 2 + 0.5 * kl), kl.detach()

    trains_as_eager(loop(sgd(model=model), body, whole=mode != "jit"), call_step, modes=(mode,), misses=misses(mode, 1))


@pytest.mark.parametrize("loss", [symmetric_kl, symmetric_kl_of_probabilities, poisson_both_ways])
def test_losses_whose_target_is_another_losss_input_get_eagers_gradients_bit_for_bit(loss):
    """R-Drop's symmetric KL (and Poisson losses alike): a target that another loss's input is too
    gets its gradient terms added as eager's engine adds them, after the other loss's ("(c + a) +
    b"), where the rules summed a target's terms first ("c + (a + b)"): the last bits differed."""
    for seed in range(4):
        grads = []
        for call in (loss, thunder_rs.jit(loss)):
            torch.manual_seed(seed)
            a, b = torch.randn(6, 5, requires_grad=True), torch.randn(6, 5, requires_grad=True)
            call(a, b).backward()
            grads.append((a.grad, b.grad))
        torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)


@pytest.mark.parametrize("mode", MODES)
def test_stochastic_depth_trained_and_evaluated_every_step_is_eagers(mode):
    """Blocks dropped per row by ``torch.rand`` in training; in ``eval()`` under ``no_grad`` all kept."""
    x_val = torch.randn(4, 4)

    def body(world, x, y):
        loss = fit(world, F.cross_entropy(world["forward"].model(x), y))
        world["model"].eval()
        with torch.no_grad():
            evaluated = world["forward"].model(x_val)
        world["model"].train()
        return loss, evaluated

    build = optimized(lambda ps: torch.optim.AdamW(ps, 1e-2), model=DeepResidual)
    trains_as_eager(loop(build, body, whole=False), call_step, modes=(mode,), misses=misses(mode, 2))


@pytest.mark.parametrize("mode", ["jit", pytest.param("compile", marks=SLOW)])
def test_gradient_centralization_in_place_before_adamw_is_eagers(mode):
    """The gradients of matrices centred in place (their mean over the input dimension removed);
    under ``compile`` the whole step, AdamW's step included (Dynamo's: ``dynamo``)."""

    def body(world, x, y):
        loss = F.cross_entropy(world["forward"].model(x), y)
        loss.backward()
        for p in world["model"].parameters():
            if p.dim() > 1:
                p.grad.sub_(p.grad.mean(dim=1, keepdim=True))
        world["optimizer"].step()
        world["optimizer"].zero_grad()
        return loss.detach()

    build = optimized(lambda ps: torch.optim.AdamW(ps, 1e-2, weight_decay=0.1))
    make = loop(build, body, whole=mode != "jit")
    trains_as_eager(make, call_step, modes=(mode,), misses=misses(mode, 1), dynamo=mode == "compile")


@pytest.mark.parametrize("mode", MODES)
def test_manifold_mixup_at_a_layer_drawn_per_step_is_eagers(mode):
    """The layer drawn by ``torch.randint(...).item()`` (a Python int the forward branches on: a
    compile per layer drawn), the weight from ``Beta(2, 2)``, the partner rows by ``randperm``."""

    def body(world, x, y):
        layer = int(torch.randint(0, 3, ()).item())
        lam, order = torch.distributions.Beta(2.0, 2.0).sample(), torch.randperm(x.shape[0])
        logits = world["forward"].model(x, layer, lam, order)
        loss = lam * F.cross_entropy(logits, y) + (1 - lam) * F.cross_entropy(logits, y[order])
        world["layers"].append(layer)
        return fit(world, loss)

    build = optimized(lambda ps: torch.optim.SGD(ps, 0.1, momentum=0.9), model=ManifoldMixer, layers=lambda _: [])
    worlds = trains_as_eager(loop(build, body, whole=False), call_step, modes=(mode,), steps=4)
    if mode == "jit":
        assert thunder_rs.cache_misses(worlds[mode]["jitted"][0]) == len(set(worlds[mode]["layers"])) > 1


@pytest.mark.parametrize("mode", MODES)
def test_random_erasing_in_place_inside_the_step_is_eagers(mode):
    """Rows erased in place (a random span overwritten with noise) when a draw says so; under
    ``compile`` the whole step is compiled, the erasing in the graph."""

    def body(world, x, y):
        x = x.clone()
        for row in range(x.shape[0]):
            if torch.rand(()) < 0.5:
                start = int(torch.randint(0, 3, ()))
                x[row, start : start + 2] = torch.randn(2)
        return fit(world, F.cross_entropy(world["forward"].model(x), y)), x

    trains_as_eager(loop(sgd(), body), call_step, modes=(mode,), misses=misses(mode, 1))


@pytest.mark.parametrize("mode", MODES)
def test_ewc_with_a_fisher_from_per_sample_gradients_between_tasks_is_eagers(mode):
    """Elastic weight consolidation: task A for two steps, then the diagonal Fisher from squared
    per-sample gradients (``autograd.grad`` of each sample's log-likelihood of a sampled label)
    and the anchor weights kept, then task B with the quadratic penalty."""

    def body(world, x, y, i):
        call, model = world["forward"].model, world["model"]
        if i == 2:
            params = list(model.parameters())
            fisher = [torch.zeros_like(p) for p in params]
            for row in x:
                log_p = call(row[None]).log_softmax(-1)
                label = torch.multinomial(log_p.exp().detach(), 1)[0]
                for f, g in zip(fisher, torch.autograd.grad(log_p[0, label].sum(), params)):
                    f.add_(g.square() / x.shape[0])
            world["fisher"], world["anchor"] = fisher, [p.detach().clone() for p in params]
        loss = F.cross_entropy(call(x if i < 2 else x.flip(1)), y)
        if "anchor" in world:
            penalty = sum(
                (f * (p - a).square()).sum() for f, p, a in zip(world["fisher"], model.parameters(), world["anchor"])
            )
            loss = loss + 5.0 * penalty
        return fit(world, loss)

    step = lambda world, i: world["step"](*batch(), i)  # noqa: E731
    trains_as_eager(loop(sgd(), body, whole=False), step, modes=(mode,), steps=4, misses=misses(mode, 2))


# ------------------------------------------------------------------------- multi-task, meta, tuning


def pcgrad_body(world, x, y, target):
    """PCGrad: each task's gradient over all parameters by ``autograd.grad`` (``retain_graph``),
    a task's gradient projected off the other's where they conflict, their sum set as ``.grad``."""
    params = list(world["model"].parameters())
    regress, logits = world["forward"].model(x)
    losses = [F.mse_loss(regress, target), F.cross_entropy(logits, y)]
    grads = [
        torch.cat([g.flatten() for g in torch.autograd.grad(loss, params, retain_graph=True, materialize_grads=True)])
        for loss in losses
    ]
    projected = []
    for i, g in enumerate(grads):
        other = grads[1 - i]
        dot = g @ other
        projected.append(g - dot / other.square().sum() * other if dot < 0 else g)
    total = projected[0] + projected[1]
    for p, g in zip(params, total.split([p.numel() for p in params])):
        p.grad = g.view_as(p).clone()
    world["optimizer"].step()
    world["optimizer"].zero_grad()
    return torch.stack(losses).detach(), grads[0] @ grads[1]


@pytest.mark.parametrize("mode", MODES)
def test_pcgrad_projecting_conflicting_task_gradients_is_eagers(mode):
    step = lambda world, i: world["step"](*batch(), torch.randn(6, 2))  # noqa: E731
    build = optimized(lambda ps: torch.optim.Adam(ps, 1e-2), model=MultiTask)
    trains_as_eager(loop(build, pcgrad_body, whole=False), step, modes=(mode,), misses=misses(mode, 1))


@pytest.mark.parametrize("mode", MODES)
def test_reptile_with_an_inner_sgd_on_a_fast_copy_and_an_outer_interpolation_is_eagers(mode):
    """Reptile: the fast model loaded from the slow one (``load_state_dict`` copies in place), three
    inner SGD steps on a task through the jitted fast model, the slow one moved halfway to it."""

    def build():
        slow = mlp()
        fast = copy.deepcopy(slow)
        return {"model": slow, "fast": fast, "inner": torch.optim.SGD(fast.parameters(), 0.2)}

    def body(world, x, y):
        world["fast"].load_state_dict(world["model"].state_dict())
        losses = [fit(world, F.cross_entropy(world["forward"].fast(x), y), "inner") for _ in range(3)]
        with torch.no_grad():
            for s, f in zip(world["model"].parameters(), world["fast"].parameters()):
                s.add_(f - s, alpha=0.5)
        return torch.stack(losses)

    make = loop(build, body, whole=False, forwards=("fast",))
    trains_as_eager(make, call_step, modes=(mode,), misses=misses(mode, 1))


@pytest.mark.parametrize("mode", MODES)
def test_prompt_tuning_over_a_frozen_model_is_eagers(mode):
    """Only the soft prompt trains: the frozen weights keep no gradient, as in eager."""

    def build():
        model = SoftPrompt()
        return {"model": model, "optimizer": torch.optim.Adam([model.prompt], 0.05)}

    def body(world, ids, y):
        return fit(world, F.cross_entropy(world["forward"].model(ids), y))

    step = lambda world, i: world["step"](torch.randint(0, 11, (4, 5)), torch.randint(0, 3, (4,)))  # noqa: E731
    trains_as_eager(loop(build, body, whole=False), step, modes=(mode,), misses=misses(mode, 1))


@pytest.mark.parametrize("mode", MODES)
def test_lora_attached_mid_run_as_a_new_group_then_merged_in_place_and_detached_is_eagers(mode):
    """The head alone for two steps; at step 2 an adapter attached to the frozen first layer and
    its parameters added to the optimizer (``add_param_group``, a learning rate of their own); at
    step 4 merged into the frozen weight in place and detached (the head trains on). The jitted
    model compiles at the first call and at each change of the module's structure (three)."""

    def body(world, x, y, i):
        model, optimizer = world["model"], world["optimizer"]
        if i == 2:
            optimizer.add_param_group({"params": model.attach(), "lr": 0.05})
        if i == 4:
            model.merge()
        return fit(world, F.cross_entropy(world["forward"].model(x), y))

    build = optimized(lambda ps: torch.optim.AdamW([p for p in ps if p.requires_grad], 1e-2), model=Adaptable)
    step = lambda world, i: world["step"](*batch(), i)  # noqa: E731
    trains_as_eager(loop(build, body, whole=False), step, modes=(mode,), steps=6, misses=misses(mode, 3))


# ---------------------------------------------------------------------------------- generative


@pytest.mark.parametrize("mode", MODES)
def test_a_vq_vae_whose_forward_moves_its_codebook_in_place_is_eagers(mode):
    def body(world, x):
        loss, index = world["forward"].model(x)
        return fit(world, loss), index

    step = lambda world, i: world["step"](torch.randn(6, 6))  # noqa: E731
    build = optimized(lambda ps: torch.optim.Adam(ps, 1e-2), model=VectorQuantizer)
    trains_as_eager(loop(build, body, whole=False), step, modes=(mode,), misses=misses(mode, 1))


@pytest.mark.parametrize("mode", MODES)
def test_an_energy_model_trained_from_a_replay_buffer_of_langevin_samples_is_eagers(mode):
    """Contrastive divergence: rows of a replay buffer (some reset to noise) refined by Langevin
    dynamics through the jitted energy's input gradient, written back into the buffer in place
    (``index_copy_``), the energies of data pushed down and of samples up, regularized."""

    def build():
        return {
            **optimized(lambda ps: torch.optim.Adam(ps, 1e-2), model=lambda: mlp(2, 8, 1))(),
            "buffer": torch.randn(10, 2),
        }

    def body(world, real):
        buffer, energy = world["buffer"], world["forward"].model
        rows = torch.randint(0, buffer.shape[0], (4,))
        start = torch.where(torch.rand(4, 1) < 0.2, torch.randn(4, 2), buffer[rows])
        samples = langevin(energy, start)
        buffer.index_copy_(0, rows, samples)
        e_real, e_fake = energy(real), energy(samples)
        loss = e_real.mean() - e_fake.mean() + 0.1 * (e_real.square().mean() + e_fake.square().mean())
        return fit(world, loss)

    step = lambda world, i: world["step"](torch.randn(4, 2) * 0.5 + 1)  # noqa: E731
    trains_as_eager(loop(build, body, whole=False), step, modes=(mode,), misses=misses(mode, 2))


@pytest.mark.parametrize("mode", MODES)
def test_a_physics_informed_network_with_second_derivatives_of_its_inputs_is_eagers(mode):
    """The heat equation's residual ``u_t - 0.1 u_xx`` at collocation points: first and second
    input derivatives by ``autograd.grad(create_graph=True)`` through the jitted network, the
    weights' gradients through both (third order), plus a boundary loss."""

    def body(world, points, boundary):
        call = world["forward"].model
        points = points.requires_grad_()
        u = call(points)
        (du,) = torch.autograd.grad(u.sum(), points, create_graph=True)
        (ddu,) = torch.autograd.grad(du[:, 0].sum(), points, create_graph=True)
        residual = du[:, 1] - 0.1 * ddu[:, 0]
        edge = call(boundary).squeeze(-1) - torch.sin(boundary[:, 0])
        return fit(world, residual.square().mean() + edge.square().mean()), residual.detach()

    step = lambda world, i: world["step"](torch.rand(6, 2), torch.rand(4, 2))  # noqa: E731
    build = optimized(lambda ps: torch.optim.Adam(ps, 1e-2), model=lambda: mlp(2, 8, 1))
    trains_as_eager(loop(build, body, whole=False), step, modes=(mode,), misses=misses(mode, 2))


class FiniteDifferences(nn.Module):
    """A physics-informed loss by finite differences: the network over a grid of ``(x, t)``, the
    advection residual ``u_t + 0.5 u_x`` by ``torch.gradient``, and the initial condition (``u``'s
    first row, read after the differences: its gradient reaches ``u`` before theirs in eager)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))
        x, t = torch.meshgrid(torch.linspace(0, 1, 6), torch.linspace(0, 0.5, 5), indexing="ij")
        self.register_buffer("grid", torch.stack([x, t], -1))

    def forward(self, initial):
        u = self.net(self.grid).squeeze(-1)
        u_x, u_t = torch.gradient(u, spacing=(0.2, 0.125), edge_order=2)
        return (u_t + 0.5 * u_x).square().mean() + (u[:, 0] - initial).square().mean()


@pytest.mark.parametrize("mode", MODES)
def test_a_physics_informed_loss_by_finite_differences_of_the_grid_is_eagers(mode):
    """``torch.gradient`` of an output another term reads later: its rule added its slices' terms
    up before adding them to that term's gradient, eager's engine one by one after it (the last
    bits of the weights' gradients differed)."""
    step = lambda world, i: world["step"](torch.sin(torch.linspace(0, 3, 6)) + 0.1 * torch.randn(6))  # noqa: E731
    body = lambda world, initial: fit(world, world["forward"].model(initial))  # noqa: E731
    build = optimized(lambda ps: torch.optim.Adam(ps, 1e-2), model=FiniteDifferences)
    trains_as_eager(loop(build, body, whole=False), step, modes=(mode,), misses=misses(mode, 1))


# ------------------------------------------------------------------------------ reinforcement


def sac_body(world, obs, action, reward, next_obs, done):
    """SAC: the twin critics toward the entropy-regularized target of the target critics (under
    ``no_grad``), the actor through the frozen critics, the temperature by its own loss, the
    target critics moved by ``torch._foreach_lerp_``."""
    actor, critic, target = world["forward"].actor, world["forward"].critic, world["forward"].target
    alpha = world["log_alpha"].exp()
    with torch.no_grad():
        next_action, next_log_p = actor(next_obs)
        target_q = reward + 0.9 * (1 - done) * (torch.min(*target(next_obs, next_action)) - alpha * next_log_p)
    q1, q2 = critic(obs, action)
    critic_loss = fit(world, F.mse_loss(q1, target_q) + F.mse_loss(q2, target_q), "critic_opt")
    world["critic"].requires_grad_(False)
    new_action, log_p = actor(obs)
    actor_loss = fit(world, (alpha.detach() * log_p - torch.min(*critic(obs, new_action))).mean(), "actor_opt")
    world["critic"].requires_grad_(True)
    alpha_loss = fit(world, -(world["log_alpha"] * (log_p.detach() - 2.0)).mean(), "alpha_opt")
    with torch.no_grad():
        torch._foreach_lerp_(list(world["target"].parameters()), list(world["critic"].parameters()), 0.1)
    return critic_loss, actor_loss, alpha_loss


@pytest.mark.parametrize("mode", MODES)
def test_sac_with_twin_critics_a_learned_temperature_and_polyak_targets_is_eagers(mode):
    def build():
        actor, critic = Actor(), TwinCritic()
        target = copy.deepcopy(critic).requires_grad_(False)
        log_alpha = torch.zeros((), requires_grad=True)
        return {
            "actor": actor,
            "critic": critic,
            "target": target,
            "log_alpha": log_alpha,
            "actor_opt": torch.optim.Adam(actor.parameters(), 1e-2),
            "critic_opt": torch.optim.Adam(critic.parameters(), 1e-2),
            "alpha_opt": torch.optim.Adam([log_alpha], 1e-2),
        }

    def step(world, i):
        done = (torch.rand(5) < 0.2).float()
        return world["step"](torch.randn(5, 3), torch.rand(5, 2) * 2 - 1, torch.randn(5), torch.randn(5, 3), done)

    make = loop(build, sac_body, whole=False, forwards=("actor", "critic", "target"))
    trains_as_eager(make, step, modes=(mode,), misses=misses(mode, 5))


def td3_body(world, obs, action, reward, next_obs, i):
    """TD3: target actions smoothed by clamped noise, the twin targets' minimum, the actor and the
    targets (``_foreach_lerp_``) updated every other step only."""
    with torch.no_grad():
        noise = (0.2 * torch.randn_like(action)).clamp(-0.5, 0.5)
        next_action = (world["forward"].actor_target(next_obs) + noise).clamp(-1, 1)
        target_q = reward + 0.9 * torch.min(*world["forward"].critic_target(next_obs, next_action))
    q1, q2 = world["forward"].critic(obs, action)
    critic_loss = fit(world, F.mse_loss(q1, target_q) + F.mse_loss(q2, target_q), "critic_opt")
    actor_loss = torch.zeros(())
    if i % 2 == 1:
        actor_loss = fit(world, -world["forward"].critic(obs, world["forward"].actor(obs))[0].mean(), "actor_opt")
        with torch.no_grad():
            for source, target in (("actor", "actor_target"), ("critic", "critic_target")):
                torch._foreach_lerp_(list(world[target].parameters()), list(world[source].parameters()), 0.2)
    return critic_loss, actor_loss


@pytest.mark.parametrize("mode", MODES)
def test_td3_with_target_smoothing_and_delayed_actor_updates_is_eagers(mode):
    """The critics' gradients from the actor's loss are kept (not zeroed until their next step),
    as a user's loop leaves them."""

    def build():
        actor, critic = nn.Sequential(mlp(3, 8, 2), nn.Tanh()), TwinCritic()
        return {
            "actor": actor,
            "critic": critic,
            "actor_target": copy.deepcopy(actor).requires_grad_(False),
            "critic_target": copy.deepcopy(critic).requires_grad_(False),
            "actor_opt": torch.optim.Adam(actor.parameters(), 1e-2),
            "critic_opt": torch.optim.Adam(critic.parameters(), 1e-2),
        }

    def step(world, i):
        return world["step"](torch.randn(5, 3), torch.rand(5, 2) * 2 - 1, torch.randn(5), torch.randn(5, 3), i)

    make = loop(build, td3_body, whole=False, forwards=("actor", "critic", "actor_target", "critic_target"))
    trains_as_eager(make, step, modes=(mode,), steps=4, misses=misses(mode, 5))


@pytest.mark.parametrize("mode", MODES)
def test_co_teaching_two_networks_on_each_others_small_loss_rows_is_eagers(mode):
    """Co-teaching on noisy labels: each network's per-row losses ranked (``argsort``), each trained
    on the rows the other finds easiest, the kept fraction shrinking by step."""

    def build():
        first, second = mlp(), mlp()
        return {
            "first": first,
            "second": second,
            "opt_first": torch.optim.SGD(first.parameters(), 0.1),
            "opt_second": torch.optim.SGD(second.parameters(), 0.1),
        }

    def body(world, x, y, i):
        a, b = world["forward"].first(x), world["forward"].second(x)
        keep = x.shape[0] - i
        rank_a = F.cross_entropy(a, y, reduction="none").argsort()[:keep]
        rank_b = F.cross_entropy(b, y, reduction="none").argsort()[:keep]
        loss_a = fit(world, F.cross_entropy(a[rank_b], y[rank_b]), "opt_first")
        loss_b = fit(world, F.cross_entropy(b[rank_a], y[rank_a]), "opt_second")
        return loss_a, loss_b, rank_a, rank_b

    step = lambda world, i: world["step"](*batch(), i)  # noqa: E731
    make = loop(build, body, whole=False, forwards=("first", "second"))
    trains_as_eager(make, step, modes=(mode,), misses=misses(mode, 2))


@pytest.mark.parametrize("mode", MODES)
def test_a_gru_whose_hidden_state_the_world_carries_detached_across_steps_is_eagers(mode):
    """Stateful truncated BPTT over a stream: the hidden state kept in the world between steps,
    detached at the start of each, reset to zeros for the rows a draw marks as a new document."""

    class Stream(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.rnn, self.head = nn.Embedding(7, 5), nn.GRU(5, 6, batch_first=True), nn.Linear(6, 7)

        def forward(self, ids, hidden):
            out, hidden = self.rnn(self.embed(ids), hidden)
            return self.head(out), hidden

    def build():
        return {**optimized(lambda ps: torch.optim.Adam(ps, 1e-2), model=Stream)(), "hidden": torch.zeros(1, 3, 6)}

    def body(world, ids):
        fresh = torch.rand(1, 3, 1) < 0.3
        hidden = world["hidden"].detach().masked_fill(fresh, 0.0)
        logits, hidden = world["forward"].model(ids[:, :-1], hidden)
        world["hidden"] = hidden
        return fit(world, F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()))

    step = lambda world, i: world["step"](torch.randint(0, 7, (3, 5)))  # noqa: E731
    trains_as_eager(loop(build, body, whole=False), step, modes=(mode,), steps=4, misses=misses(mode, 1))


# ------------------------------------------------------------------------- optimizers, schedules


@pytest.mark.parametrize("mode", MODES)
def test_adafactor_with_factored_second_moments_is_eagers(mode):
    build = optimized(lambda ps: torch.optim.Adafactor(ps, 1e-2, weight_decay=0.01))
    body = lambda world, x, y: fit(world, F.cross_entropy(world["forward"].model(x), y))  # noqa: E731
    trains_as_eager(loop(build, body, whole=False), call_step, modes=(mode,), misses=misses(mode, 1))


def lion_body(world, x, y, lr: float = 1e-2, b1: float = 0.9, b2: float = 0.99, wd: float = 0.1):
    """Lion by hand under ``no_grad``: the sign of the interpolated moment, decoupled decay, the
    moments (a list the world keeps) moved by ``lerp_``."""
    loss = F.cross_entropy(world["forward"].model(x), y)
    loss.backward()
    with torch.no_grad():
        for p, m in zip(world["model"].parameters(), world["moments"]):
            update = (m * b1 + p.grad * (1 - b1)).sign_()
            p.mul_(1 - lr * wd).add_(update, alpha=-lr)
            m.lerp_(p.grad, 1 - b2)
            p.grad = None
    return loss.detach()


@pytest.mark.parametrize("mode", MODES)
def test_lion_by_hand_with_its_moments_in_a_list_is_eagers(mode):
    def build():
        model = mlp()
        return {"model": model, "moments": [torch.zeros_like(p) for p in model.parameters()]}

    trains_as_eager(loop(build, lion_body, whole=False), call_step, modes=(mode,), steps=4, misses=misses(mode, 1))


@pytest.mark.parametrize("mode", MODES)
def test_a_step_schedule_with_milestones_and_momentum_changed_mid_run_is_eagers(mode):
    """``MultiStepLR`` halving at steps 1 and 3; the momentum of the group set by hand at step 2."""

    def body(world, x, y, i):
        if i == 2:
            world["optimizer"].param_groups[0]["momentum"] = 0.5
        loss = fit(world, F.cross_entropy(world["forward"].model(x), y))
        world["schedule"].step()
        return loss

    build = sgd(schedule=lambda opt: lr_scheduler.MultiStepLR(opt, [1, 3], 0.5))
    step = lambda world, i: world["step"](*batch(), i)  # noqa: E731
    trains_as_eager(loop(build, body, whole=False), step, modes=(mode,), steps=4, misses=misses(mode, 1))


@pytest.mark.parametrize("mode", MODES)
def test_a_lookahead_wrapper_saved_and_loaded_into_a_fresh_one_mid_run_is_eagers(mode):
    """A ``Lookahead`` optimizer class over Adam (slow weights in the shared state); at step 2 its
    state dict loaded into a fresh wrapper over a fresh Adam, which continues."""

    def build():
        model = mlp()
        return {"model": model, "optimizer": Lookahead(torch.optim.Adam(model.parameters(), 1e-2))}

    def body(world, x, y, i):
        if i == 2:
            fresh = Lookahead(torch.optim.Adam(world["model"].parameters(), 1e-2))
            fresh.load_state_dict(world["optimizer"].state_dict())
            fresh.counter, world["optimizer"] = world["optimizer"].counter, fresh
        return fit(world, F.cross_entropy(world["forward"].model(x), y))

    step = lambda world, i: world["step"](*batch(), i)  # noqa: E731
    trains_as_eager(loop(build, body, whole=False), step, modes=(mode,), steps=5, misses=misses(mode, 1))


# ----------------------------------------------------------------------------- layouts, sequences


@pytest.mark.parametrize("mode", MODES)
def test_channels_last_convolutions_train_with_eagers_gradient_and_momentum_strides(mode):
    """The model and its batches in ``channels_last``: the losses, gradients, momentum buffers and
    running statistics eager's, and the gradients' and momentum buffers' strides too."""

    def body(world, x, y):
        loss = fit(world, F.cross_entropy(world["forward"].model(x.to(memory_format=torch.channels_last)), y))
        params = list(world["model"].parameters())
        kept = world["optimizer"].state
        return loss, [p.grad.stride() for p in params], [kept[p]["momentum_buffer"].stride() for p in params]

    build = sgd(0.05, model=lambda: SmallConvNet().to(memory_format=torch.channels_last), decay=1e-3)
    step = lambda world, i: world["step"](torch.randn(2, 3, 6, 6), torch.randint(0, 3, (2,)))  # noqa: E731
    trains_as_eager(loop(build, body, whole=False), step, modes=(mode,), misses=misses(mode, 1))


@pytest.mark.parametrize("mode", MODES)
def test_an_lstm_over_packed_sequences_of_unsorted_lengths_is_eagers(mode):
    """``pack_padded_sequence(enforce_sorted=False)`` with lengths changing per step, the last
    hidden state classified and the unpacked outputs tagged (padding ignored). The packed batch
    sizes are shapes: one compile per multiset of lengths (steps 0, 2 and 3 permute one)."""

    def body(world, ids, lengths, y):
        logits, tags = world["forward"].model(ids, lengths)
        targets = ids.roll(-1, 1).masked_fill(torch.arange(ids.shape[1]) >= lengths[:, None] - 1, -100)
        loss = F.cross_entropy(logits, y) + F.cross_entropy(tags.flatten(0, 1), targets.flatten(), ignore_index=-100)
        return fit(world, loss)

    def step(world, i):
        lengths = torch.tensor([[3, 6, 2], [5, 5, 4], [2, 3, 6], [6, 2, 3]][i])
        ids = torch.randint(1, 9, (3, 6)).masked_fill(torch.arange(6) >= lengths[:, None], 0)
        return world["step"](ids, lengths, torch.randint(0, 3, (3,)))

    build = optimized(lambda ps: torch.optim.Adam(ps, 1e-2), model=PackedTagger)
    trains_as_eager(loop(build, body, whole=False), step, modes=(mode,), steps=4, misses=misses(mode, 2))


def test_a_sparse_embedding_bag_trained_eagerly_is_evaluated_jitted_and_its_training_refused_naming_the_line():
    """``nn.EmbeddingBag(sparse=True)`` trained eagerly by SparseAdam: evaluated jitted under
    ``no_grad`` each step (no sparse gradient there: eager's bags, bit for bit), and a jitted
    training call refused, naming the user's line."""

    class Bags(nn.Module):
        def __init__(self):
            super().__init__()
            self.bag, self.head = nn.EmbeddingBag(10, 4, sparse=True), nn.Linear(4, 2)

        def forward(self, ids):
            return self.head(self.bag(ids))  # the line named

    torch.manual_seed(0)
    model = Bags()
    jitted = thunder_rs.jit(model)
    sparse, dense = torch.optim.SparseAdam([model.bag.weight], 1e-2), torch.optim.Adam(model.head.parameters(), 1e-2)
    ids_val = torch.randint(0, 10, (3, 4))
    for _ in range(3):
        loss = model(torch.randint(0, 10, (4, 5))).square().mean()
        loss.backward()
        assert model.bag.weight.grad.is_sparse
        for optimizer in (sparse, dense):
            optimizer.step()
            optimizer.zero_grad()
        with torch.no_grad():
            torch.testing.assert_close(jitted(ids_val), model(ids_val), rtol=0, atol=0)
    assert thunder_rs.cache_misses(jitted) == 1
    where = rf"sparse gradients .*test_user_loops_round11\.py:{Bags.forward.__code__.co_firstlineno + 1}"
    with pytest.raises(ThunderNotImplementedError, match=where):
        jitted(ids_val)
    model.bag.weight.requires_grad_(False)  # (frozen: no sparse gradient either)
    torch.testing.assert_close(jitted(ids_val), model(ids_val), rtol=0, atol=0)
