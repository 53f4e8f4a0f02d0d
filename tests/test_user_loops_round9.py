"""Training and generation loops as users write them, round 9, next to eager step by step from one
seed (harness in ``user_loops_round6.py``, loop maker in ``user_loops_round7.py``, programs in
``user_loops_round9.py``): the model jitted with the loop eager, and the model (or the whole step)
under ``torch.compile(backend="thunder_rs")``, compile counts read. Optimizers with options not yet
covered (nesterov with gradients kept, RMSprop centered with momentum, Adagrad's initial
accumulator, RAdam past its rectification, LBFGS with a strong Wolfe line search), schedulers
(warm restarts at fractional epochs, a one-cycle cycling Adam's betas, a plateau on a maximized
metric, lambdas over the loop's state), clipping that raises on a non-finite norm, a WGAN-GP
alternating with its generator, a non-saturating GAN, MoCo with its queue as buffers, mixup or
CutMix per step, curriculum lengths, learned task uncertainties, a rollback to a saved state,
evaluation between micro-batches, dropout reseeded per epoch, anomaly detection, scheduled
sampling per token, REINFORCE over a Python environment, sampling and beam search by hand, a
transformer evaluated without grad and a linear probe over a frozen encoder (eager's fused kernels)."""

import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import lr_scheduler

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError

from user_loops_round6 import trains_as_eager, wrap
from user_loops_round7 import Policy, batch, call_step, classify, loop, mlp
from user_loops_round9 import (
    Adversaries,
    Corridor,
    EncoderClassifier,
    KeyedEncoders,
    MultiTask,
    RecurrentLM,
    Seq2Seq,
    TinyLM,
    beam_search_by_hand,
    discounted,
    optimized,
    sample_by_hand,
)

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore::UserWarning"),  # (Dynamo's graph breaks, at backward())
]
SLOW = pytest.mark.slow
F32 = dict(rtol=1.3e-6, atol=1e-5)


def keeping_grads(world, x, y):
    """``classify`` with the gradients zeroed in place (the base class's ``zero_grad``)."""
    loss = F.cross_entropy(world["forward"].model(x), y)
    loss.backward()
    world["optimizer"].step()
    torch.optim.Optimizer.zero_grad(world["optimizer"], set_to_none=False)
    return loss.detach()


# ---------------------------------------------------------------------------------- optimizers

OPTIMIZERS = {
    "sgd_nesterov_for_loop": lambda ps: torch.optim.SGD(
        ps, 0.1, momentum=0.9, nesterov=True, weight_decay=0.01, foreach=False
    ),
    "rmsprop_centered_momentum": lambda ps: torch.optim.RMSprop(
        ps, 1e-2, centered=True, momentum=0.5, weight_decay=0.01, foreach=False
    ),
    "adagrad_initial_accumulator": lambda ps: torch.optim.Adagrad(
        ps, 0.1, lr_decay=0.01, initial_accumulator_value=0.1, foreach=True
    ),
    "adamax_maximize_for_loop": lambda ps: torch.optim.Adamax(ps, 1e-2, weight_decay=0.1, maximize=True, foreach=False),
    "nadam_momentum_decay": lambda ps: torch.optim.NAdam(
        ps, 1e-2, momentum_decay=0.01, weight_decay=0.1, decoupled_weight_decay=True, foreach=True
    ),
    "adam_amsgrad_for_loop": lambda ps: torch.optim.Adam(ps, 1e-2, amsgrad=True, weight_decay=0.1, foreach=False),
    "sgd_dampened_fused_off": lambda ps: torch.optim.SGD(ps, 0.1, momentum=0.8, dampening=0.3, fused=False),
}
DEFAULT_OPTIMIZERS = ("sgd_nesterov_for_loop", "rmsprop_centered_momentum")


@pytest.mark.parametrize("name", [n if n in DEFAULT_OPTIMIZERS else pytest.param(n, marks=SLOW) for n in OPTIMIZERS])
def test_optimizers_with_gradients_zeroed_in_place_step_the_jitted_and_compiled_models_as_eager(name):
    """The gradients kept as tensors zeroed in place (``set_to_none=False``): the jitted call's
    backward accumulates into them as eager's does."""
    trains_as_eager(loop(optimized(OPTIMIZERS[name]), keeping_grads, whole=False), call_step, misses=1)


def test_radam_past_its_rectification_threshold_is_eagers():
    """RAdam's variance rectification starts at its sixth step (``rho_t > 5``)."""
    build = optimized(lambda ps: torch.optim.RAdam(ps, 1e-2, foreach=False))
    trains_as_eager(loop(build, classify, whole=False), call_step, steps=7, misses=1)


def test_lbfgs_with_a_strong_wolfe_line_search_calling_the_jitted_model_is_eagers():
    """The closure is called a varying number of times per step by the line search."""

    def body(world, x, y):
        calls = []

        def closure():
            world["optimizer"].zero_grad()
            loss = F.cross_entropy(world["forward"].model(x), y)
            loss.backward()
            calls.append(loss.detach())
            return loss

        loss = world["optimizer"].step(closure)
        return loss.detach(), torch.stack(calls)

    build = optimized(lambda ps: torch.optim.LBFGS(ps, lr=1, max_iter=5, history_size=3, line_search_fn="strong_wolfe"))
    trains_as_eager(loop(build, body, whole=False), call_step, misses=1)


def test_sparse_embedding_gradients_for_sparse_adam_are_refused_naming_the_line():
    """Eager's gradient of ``nn.Embedding(sparse=True)`` is a sparse tensor (SparseAdam refuses a
    dense one): the jitted call refuses, naming the user's line that called the embedding; under
    ``torch.compile`` the graph runs eagerly with a warning naming it, and trains as eager."""

    class Bag(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = nn.Embedding(10, 4, sparse=True), nn.Linear(4, 2)

        def forward(self, ids):
            return self.head(self.embed(ids).mean(1))  # the line named

    where = rf"sparse gradients .*test_user_loops_round9\.py:{Bag.forward.__code__.co_firstlineno + 1}"
    with pytest.raises(ThunderNotImplementedError, match=where):
        thunder_rs.jit(Bag())(torch.randint(0, 10, (3, 5)))

    def train(mode):
        torch.manual_seed(0)
        model = Bag()
        call = wrap(mode, model)
        sparse, dense = torch.optim.SparseAdam([model.embed.weight], 1e-2), torch.optim.Adam(model.head.parameters())
        record = []
        for _ in range(3):
            loss = call(torch.randint(0, 10, (3, 5))).square().mean()
            loss.backward()
            record.append((loss.detach(), model.embed.weight.grad.is_sparse, model.embed.weight.grad.to_dense()))
            for optimizer in (sparse, dense):
                optimizer.step()
                optimizer.zero_grad()
        return record, [p.detach().clone() for p in model.parameters()], torch.get_rng_state()

    torch._dynamo.reset()
    with pytest.warns(UserWarning, match=f"runs eagerly: .*{where}"):
        compiled = train("compile")
    torch.testing.assert_close(compiled, train("eager"), rtol=0, atol=0)


# ---------------------------------------------------------------------------------- schedulers


def test_warm_restarts_stepped_at_fractional_epochs_are_eagers():
    """``CosineAnnealingWarmRestarts.step(epoch + i / iters)`` per batch, the period doubling."""

    def body(world, x, y, epoch):
        loss = classify(world, x, y)
        world["scheduler"].step(epoch)
        return loss, world["scheduler"].T_cur, world["scheduler"].T_i

    build = optimized(
        lambda ps: torch.optim.SGD(ps, 0.1, momentum=0.9),
        scheduler=lambda o: lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=1, T_mult=2, eta_min=1e-3),
    )
    trains_as_eager(loop(build, body, whole=False), lambda world, i: world["step"](*batch(), i / 2 + 0.25), steps=6)


def test_a_one_cycle_schedule_cycling_adams_betas_is_eagers():
    """OneCycleLR cycles Adam's first beta inversely to the learning rate (``cycle_momentum``)."""

    def body(world, x, y):
        loss = classify(world, x, y)
        world["scheduler"].step()
        return loss, torch.tensor(world["optimizer"].param_groups[0]["betas"])

    build = optimized(
        lambda ps: torch.optim.Adam(ps, 1e-2),
        scheduler=lambda o: lr_scheduler.OneCycleLR(
            o, 0.05, total_steps=5, anneal_strategy="linear", base_momentum=0.8
        ),
    )
    trains_as_eager(loop(build, body, whole=False), call_step, steps=5, misses=1)


def test_a_plateau_schedule_on_a_maximized_accuracy_with_per_group_minimums_is_eagers():
    x_val, y_val = batch(12)

    def build():
        net = mlp()
        groups = [{"params": net[0].parameters()}, {"params": net[2].parameters(), "lr": 0.3}]
        optimizer = torch.optim.SGD(groups, 0.5)
        plateau = lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="max", factor=0.3, patience=0, threshold=0.01, threshold_mode="abs", min_lr=[0.1, 0.05]
        )
        return {"model": net, "optimizer": optimizer, "scheduler": plateau}

    def body(world, x, y):
        loss = classify(world, x, y)
        with torch.no_grad():
            accuracy = (world["forward"].model(x_val).argmax(-1) == y_val).float().mean()
        world["scheduler"].step(accuracy.item())
        return loss, accuracy, world["scheduler"].best, world["scheduler"].num_bad_epochs

    trains_as_eager(loop(build, body, whole=False), call_step, steps=5, misses=2)


def test_lambda_schedules_over_the_loops_state_in_a_sequence_are_eagers():
    """A LambdaLR whose lambdas (one per group) read a dict the loop writes from the loss, then a
    StepLR, in a SequentialLR."""
    seen = {"worse": 0, "last": float("inf")}

    def build():
        seen.update(worse=0, last=float("inf"))
        net = mlp()
        optimizer = torch.optim.SGD([{"params": net[0].parameters()}, {"params": net[2].parameters()}], 0.2)
        lambdas = [lambda s: 0.5 ** seen["worse"], lambda s: 1 / (1 + s + seen["worse"])]
        first = lr_scheduler.LambdaLR(optimizer, lambdas)
        second = lr_scheduler.StepLR(optimizer, 1, gamma=0.7)
        sequence = lr_scheduler.SequentialLR(optimizer, [first, second], milestones=[3])
        return {"model": net, "optimizer": optimizer, "scheduler": sequence, "first": first, "second": second}

    def body(world, x, y):
        loss = classify(world, x, y)
        seen["worse"] += int(loss.item() > seen["last"])
        seen["last"] = loss.item()
        world["scheduler"].step()
        return loss, seen["worse"]

    trains_as_eager(loop(build, body, whole=False), call_step, steps=5, misses=1)


# ---------------------------------------------------------------------------------- clipping


def test_clipping_raising_on_a_non_finite_norm_skips_the_step_as_eager():
    """An infinite input at the second step: its gradients non-finite, ``clip_grad_norm_(...,
    error_if_nonfinite=True)`` raises, the loop catches it, zeroes the gradients and goes on."""

    def body(world, x, y, i):
        if i == 1:
            x = x.index_fill(0, torch.tensor([2]), float("inf"))
        loss = F.cross_entropy(world["forward"].model(x), y)
        loss.backward()
        try:
            norm = nn.utils.clip_grad_norm_(world["model"].parameters(), 0.5, error_if_nonfinite=True, foreach=False)
        except RuntimeError as e:
            world["optimizer"].zero_grad()
            return loss.detach(), str(e)
        world["optimizer"].step()
        world["optimizer"].zero_grad()
        return loss.detach(), norm

    build = optimized(lambda ps: torch.optim.Adam(ps, 1e-2))
    trains_as_eager(loop(build, body, whole=False), lambda world, i: world["step"](*batch(), i), steps=3, misses=1)


@SLOW  # (the whole step compiled: about 20 s)
def test_total_norms_clipped_by_hand_after_value_clipping_are_eagers():
    """``clip_grad_value_`` (foreach), then ``get_total_norm`` of the gradients (infinity norm) and
    ``clip_grads_with_norm_`` with it."""

    def body(world, x, y):
        loss = F.cross_entropy(world["forward"].model(x), y)
        loss.backward()
        grads = [p.grad for p in world["model"].parameters()]
        nn.utils.clip_grad_value_(world["model"].parameters(), 0.05, foreach=True)
        norm = nn.utils.get_total_norm(grads, norm_type=float("inf"))
        nn.utils.clip_grads_with_norm_(world["model"].parameters(), 0.02, norm)
        world["optimizer"].step()
        world["optimizer"].zero_grad()
        return loss.detach(), norm

    build = optimized(lambda ps: torch.optim.SGD(ps, 0.5, momentum=0.9))
    trains_as_eager(loop(build, body), call_step)


# ------------------------------------------------------------------------------------ GANs


def adversaries(g_lr=1e-3, d_lr=1e-3):
    def build():
        pair = Adversaries()
        return {
            "generator": pair.generator,
            "critic": pair.critic,
            "g_optimizer": torch.optim.Adam(pair.generator.parameters(), g_lr, betas=(0.5, 0.9)),
            "d_optimizer": torch.optim.Adam(pair.critic.parameters(), d_lr, betas=(0.5, 0.9)),
        }

    return build


def wgan_gp_body(world, real, noise, generator_turn):
    """WGAN-GP: the critic's loss with the penalty on the gradient at interpolates (``create_graph``
    through the jitted critic), and on the generator's turn the generator's, the critic frozen."""
    g, d = world["forward"].generator, world["forward"].critic
    fake = g(noise)
    alpha = torch.rand(real.shape[0], 1)
    mixed = (alpha * real + (1 - alpha) * fake.detach()).requires_grad_()
    (grad,) = torch.autograd.grad(d(mixed).sum(), mixed, create_graph=True)
    penalty = ((grad.norm(2, dim=1) - 1) ** 2).mean()
    d_loss = d(fake.detach()).mean() - d(real).mean() + 10 * penalty
    world["d_optimizer"].zero_grad()
    d_loss.backward()
    world["d_optimizer"].step()
    g_loss = torch.zeros(())
    if generator_turn:
        world["critic"].requires_grad_(False)
        g_loss = -d(g(noise)).mean()
        world["g_optimizer"].zero_grad()
        g_loss.backward()
        world["g_optimizer"].step()
        world["critic"].requires_grad_(True)
    return d_loss.detach(), penalty.detach(), g_loss.detach()


@pytest.mark.parametrize("mode", ["jit", pytest.param("compile", marks=SLOW)])
def test_a_wgan_gp_alternating_with_its_generator_is_eagers(mode):
    """The generator's step every other critic step (``n_critic = 2``)."""
    make = loop(adversaries(), wgan_gp_body, whole=False, forwards=("generator", "critic"))
    trains_as_eager(
        make,
        lambda world, i: world["step"](torch.randn(5, 4) + 1, torch.randn(5, 2), i % 2 == 1),
        modes=(mode,),
        steps=4,
        misses=None if mode == "compile" else 4,
    )


def non_saturating_body(world, real, noise):
    """A non-saturating GAN: BCE with one-sided label smoothing for the discriminator, two
    generator steps per discriminator step with the discriminator frozen by ``requires_grad_``."""
    g, d = world["forward"].generator, world["forward"].critic
    fake = g(noise)
    real_logits, fake_logits = d(real), d(fake.detach())
    d_loss = F.binary_cross_entropy_with_logits(
        real_logits, torch.full_like(real_logits, 0.9)
    ) + F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits))
    world["d_optimizer"].zero_grad(set_to_none=False)
    d_loss.backward()
    world["d_optimizer"].step()
    world["critic"].requires_grad_(False)
    g_losses = []
    for _ in range(2):
        logits = d(g(torch.randn_like(noise)))
        g_loss = F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits))
        world["g_optimizer"].zero_grad()
        g_loss.backward()
        world["g_optimizer"].step()
        g_losses.append(g_loss.detach())
    world["critic"].requires_grad_(True)
    return d_loss.detach(), torch.stack(g_losses)


@pytest.mark.parametrize("mode", ["jit", pytest.param("compile", marks=SLOW)])
def test_a_non_saturating_gan_with_two_generator_steps_and_a_frozen_discriminator_is_eagers(mode):
    make = loop(adversaries(2e-3, 1e-3), non_saturating_body, whole=False, forwards=("generator", "critic"))
    step = lambda world, i: world["step"](torch.randn(5, 4) + 1, torch.randn(5, 2))  # noqa: E731
    trains_as_eager(make, step, modes=(mode,), misses=3)


# ----------------------------------------------------------------------- contrastive, mixing


def moco_body(world, x):
    """MoCo: the keys by the jitted key encoder under ``no_grad``, the loss against the queue
    buffer, then the key encoder moved by ``torch._foreach_lerp_`` and the keys enqueued at the
    pointer buffer (``index_copy_``), between the calls."""
    model = world["model"]
    x_q, x_k = x + 0.1 * torch.randn_like(x), x * (1 + 0.1 * torch.randn_like(x))
    with torch.no_grad():
        k = world["forward"].keys(x_k)
    loss = world["forward"].model(x_q, k)
    loss.backward()
    world["optimizer"].step()
    world["optimizer"].zero_grad()
    with torch.no_grad():
        torch._foreach_lerp_(list(model.key.parameters()), list(model.query.parameters()), 0.1)
    model.enqueue(k)
    return loss.detach(), model.ptr.clone()


@pytest.mark.parametrize("mode", ["jit", pytest.param("compile", marks=SLOW)])
def test_moco_with_its_queue_and_pointer_as_buffers_written_between_calls_is_eagers(mode):
    def build():
        model = KeyedEncoders()
        return {"model": model, "keys": model.keys, "optimizer": torch.optim.SGD(model.query.parameters(), 0.1)}

    make = loop(build, moco_body, whole=False, forwards=("model", "keys"))
    step = lambda world, i: world["step"](torch.randn(4, 4))  # noqa: E731
    trains_as_eager(make, step, modes=(mode,), steps=4, misses=None if mode == "compile" else 2)


def mix_body(world, x, y, classes=3):
    """Mixup or CutMix (a coin per step), the weight from ``Beta(0.4, 0.4)``, the targets soft
    one-hots with label smoothing, mixed by the same weight (CutMix: by the area pasted)."""
    lam = torch.distributions.Beta(0.4, 0.4).sample()
    perm = torch.randperm(x.shape[0])
    targets = F.one_hot(y, classes).float() * 0.9 + 0.1 / classes
    if torch.rand(()) < 0.5:
        mixed = lam * x + (1 - lam) * x[perm]
    else:
        width = int(x.shape[1] * (1 - lam).sqrt())
        start = int(torch.randint(0, x.shape[1] - width + 1, ()))
        mixed = x.clone()
        mixed[:, start : start + width] = x[perm, start : start + width]
        lam = torch.tensor(1 - width / x.shape[1])
    loss = F.cross_entropy(world["forward"].model(mixed), lam * targets + (1 - lam) * targets[perm])
    loss.backward()
    world["optimizer"].step()
    world["optimizer"].zero_grad()
    return loss.detach(), lam


def test_mixup_or_cutmix_drawn_per_step_with_smoothed_soft_targets_is_eagers():
    build = optimized(lambda ps: torch.optim.SGD(ps, 0.1, momentum=0.9), lambda: mlp(8))
    trains_as_eager(loop(build, mix_body, whole=False), lambda world, i: world["step"](*batch(6, 8)), steps=5)


def test_cross_entropy_over_sequences_with_class_weights_smoothing_and_ignored_targets_is_eagers():
    """Logits ``(N, C, L)``, a class weight, label smoothing and ``ignore_index`` together (the
    mean over the weights of the targets kept)."""

    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = nn.Embedding(7, 6), nn.Linear(6, 4)
            self.register_buffer("weight", torch.tensor([0.2, 1.0, 2.0, 0.7]))

        def forward(self, ids, tags):
            logits = self.head(torch.tanh(self.embed(ids))).transpose(1, 2)
            return F.cross_entropy(logits, tags, weight=self.weight, label_smoothing=0.15, ignore_index=-1)

    def body(world, ids, tags):
        loss = world["forward"].model(ids, tags)
        loss.backward()
        world["optimizer"].step()
        world["optimizer"].zero_grad()
        return loss.detach()

    def step(world, i):
        tags = torch.randint(0, 4, (3, 5)).masked_fill(torch.rand(3, 5) < 0.3, -1)
        return world["step"](torch.randint(0, 7, (3, 5)), tags)

    trains_as_eager(loop(optimized(lambda ps: torch.optim.AdamW(ps, 1e-2), Tagger), body, whole=False), step, misses=1)


# ------------------------------------------------------------------------- what the loop changes


def test_a_curriculum_of_sequence_lengths_growing_per_epoch_over_a_causal_model_is_eagers():
    """Two batches an epoch, the length ``3 + epoch``: symbolic from the second length."""

    def body(world, ids):
        logits = world["forward"].model(ids[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        world["optimizer"].step()
        world["optimizer"].zero_grad()
        return loss.detach()

    build = optimized(lambda ps: torch.optim.Adam(ps, 1e-2), TinyLM)
    step = lambda world, i: world["step"](torch.randint(0, 11, (2, 4 + i // 2)))  # noqa: E731
    trains_as_eager(loop(build, body, whole=False), step, steps=6, misses=2, rtol=0, atol=0)


def test_multi_task_losses_weighted_by_learned_log_variances_in_their_own_group_are_eagers():
    """The log-variances a parameter of the jitted model it does not read (their gradient from the
    loop's weighting), in a parameter group without weight decay and a larger learning rate."""

    def build():
        model = MultiTask()
        shared = [p for name, p in model.named_parameters() if name != "log_vars"]
        groups = [{"params": shared}, {"params": [model.log_vars], "lr": 0.1, "weight_decay": 0.0}]
        return {"model": model, "optimizer": torch.optim.AdamW(groups, 1e-2, weight_decay=0.1)}

    def body(world, x, target, y):
        regressed, logits = world["forward"].model(x)
        losses = torch.stack([F.mse_loss(regressed, target), F.cross_entropy(logits, y)])
        s = world["model"].log_vars
        loss = (torch.exp(-s) * losses + s).sum()
        loss.backward()
        world["optimizer"].step()
        world["optimizer"].zero_grad()
        return loss.detach(), losses.detach()

    def step(world, i):
        x, y = batch()
        return world["step"](x, torch.randn(6, 2), y)

    trains_as_eager(loop(build, body, whole=False), step, steps=4, misses=1)


@pytest.mark.parametrize("mode", ["jit", pytest.param("compile", marks=SLOW)])
def test_a_rollback_to_a_saved_state_after_a_loss_spike_continues_as_eager(mode):
    """The model's, the optimizer's and the scheduler's state dicts saved (``torch.save`` to bytes)
    at step 1 and loaded back at step 3, the loop going on from there with the jitted model."""

    def build():
        net = mlp()
        optimizer = torch.optim.Adam(net.parameters(), 1e-2)
        return {"model": net, "optimizer": optimizer, "scheduler": lr_scheduler.StepLR(optimizer, 1, 0.8), "saved": []}

    def body(world, x, y, i):
        loss = classify(world, x, y)
        world["scheduler"].step()
        names = ("model", "optimizer", "scheduler")
        if i == 1:
            buffer = io.BytesIO()
            torch.save({name: world[name].state_dict() for name in names}, buffer)
            world["saved"].append(buffer.getvalue())
        if i == 3:
            saved = torch.load(io.BytesIO(world["saved"][0]))
            for name in names:
                world[name].load_state_dict(saved[name])
        return loss

    step = lambda world, i: world["step"](*batch(), i)  # noqa: E731
    trains_as_eager(loop(build, body, whole=False), step, modes=(mode,), steps=6, misses=1)


def test_evaluation_between_accumulated_micro_batches_keeps_the_gradients_as_eager():
    """Every other step an evaluation pass (``eval()``, ``no_grad``) between the two micro-batches
    of an accumulated step, the model back in ``train()``: dropout and batch norm's statistics."""
    x_val = torch.randn(5, 4)

    def build():
        net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.3), nn.Tanh(), nn.Linear(8, 3))
        return {"model": net, "optimizer": torch.optim.SGD(net.parameters(), 0.1, momentum=0.9)}

    def body(world, x, y, i):
        forward = world["forward"].model
        first = F.cross_entropy(forward(x[:3]), y[:3]) / 2
        first.backward()
        evaluated = torch.zeros(())
        if i % 2 == 0:
            world["model"].eval()
            with torch.no_grad():
                evaluated = forward(x_val).softmax(-1)
            world["model"].train()
        second = F.cross_entropy(forward(x[3:]), y[3:]) / 2
        second.backward()
        world["optimizer"].step()
        world["optimizer"].zero_grad()
        return first.detach() + second.detach(), evaluated

    trains_as_eager(loop(build, body, whole=False), lambda world, i: world["step"](*batch(), i), steps=4, misses=2)


@pytest.mark.parametrize("whole", [False, pytest.param(True, marks=SLOW)])
def test_dropout_reseeded_at_each_epoch_draws_eagers_masks(whole):
    """``torch.manual_seed(epoch)`` at each epoch's first batch: the same masks each epoch (the
    model jitted or compiled, or the whole step compiled)."""

    def body(world, x, y, i):
        if i % 2 == 0:
            torch.manual_seed(i // 2)
        return classify(world, x, y)

    build = optimized(
        lambda ps: torch.optim.SGD(ps, 0.2), lambda: nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 3))
    )
    x, y = batch()
    step = lambda world, i: world["step"](x, y, i)  # noqa: E731
    if whole:
        trains_as_eager(loop(build, body), step, modes=("compile",), steps=4)
    else:
        trains_as_eager(loop(build, body, whole=False), step, steps=4, misses=1)


def test_a_step_under_anomaly_detection_is_eagers_and_a_nan_gradient_is_named():
    """``torch.autograd.set_detect_anomaly(True)`` on the second step: the same step as eager's;
    on the third a gradient that is NaN (``sqrt`` at 0 times 0) raises as eager's does."""

    class Rooted(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = mlp()

        def forward(self, x, zero):
            return self.body(x) + (zero * zero.sqrt()).sum()

    def body(world, x, y, i):
        zero = torch.zeros(2, requires_grad=i == 2)
        torch.autograd.set_detect_anomaly(i >= 1)
        try:
            loss = F.cross_entropy(world["forward"].model(x, zero), y)
            loss.backward()
        except RuntimeError as e:
            return "returned nan values" in str(e)
        finally:
            torch.autograd.set_detect_anomaly(False)
        world["optimizer"].step()
        world["optimizer"].zero_grad()
        return loss.detach()

    build = optimized(lambda ps: torch.optim.SGD(ps, 0.1), Rooted)
    trains_as_eager(loop(build, body, whole=False), lambda world, i: world["step"](*batch(), i), misses=2)


# ------------------------------------------------------------------------- sequences, RL


def scheduled_sampling_body(world, src, tgt, epoch):
    """Teacher forcing with scheduled sampling per token: the decoder step (a jitted method) fed
    the target with probability ``0.9 ** epoch`` (``torch.rand`` per token), else its own argmax."""
    hidden = world["forward"].model(src)
    token, losses, forced = tgt[:, 0], [], []
    for t in range(1, tgt.shape[1]):
        logits, hidden = world["forward"].decode(token, hidden)
        losses.append(F.cross_entropy(logits, tgt[:, t]))
        teacher = bool(torch.rand(()) < 0.9**epoch)
        forced.append(teacher)
        token = tgt[:, t] if teacher else logits.argmax(-1)
    loss = torch.stack(losses).mean()
    loss.backward()
    nn.utils.clip_grad_norm_(world["model"].parameters(), 1.0)
    world["optimizer"].step()
    world["optimizer"].zero_grad()
    return loss.detach(), torch.tensor(forced)


@pytest.mark.parametrize("mode", ["jit", pytest.param("compile", marks=SLOW)])
def test_seq2seq_with_scheduled_sampling_per_token_through_a_jitted_decoder_step_is_eagers(mode):
    def build():
        model = Seq2Seq()
        return {"model": model, "decode": model.decode, "optimizer": torch.optim.Adam(model.parameters(), 1e-2)}

    def step(world, i):
        return world["step"](torch.randint(0, 9, (3, 5)), torch.randint(0, 9, (3, 4)), 2 * i)

    make = loop(build, scheduled_sampling_body, whole=False, forwards=("model", "decode"))
    trains_as_eager(make, step, modes=(mode,), steps=4, misses=None if mode == "compile" else 2)


def reinforce_body(world, episodes=2, gamma=0.9):
    """REINFORCE over a Python environment: actions drawn from ``Categorical`` of the jitted
    policy's logits one observation at a time (``.item()`` into the environment), the returns
    discounted in Python, normalized, an entropy bonus and a value baseline."""
    env, log_probs, entropies, values, returns, lengths = Corridor(), [], [], [], [], []
    for _ in range(episodes):
        obs, rewards = env.reset(), []
        for _ in range(6):
            logits, value = world["forward"].model(obs[None])
            dist = torch.distributions.Categorical(logits=logits[0])
            action = dist.sample()
            log_probs.append(dist.log_prob(action))
            entropies.append(dist.entropy())
            values.append(value[0])
            obs, reward, done = env.step(int(action.item()))
            rewards.append(reward)
            if done:
                break
        returns += discounted(rewards, gamma)
        lengths.append(len(rewards))
    returns_t = torch.tensor(returns)
    returns_t = (returns_t - returns_t.mean()) / (returns_t.std() + 1e-6)
    values_t = torch.stack(values)
    advantage = returns_t - values_t.detach()
    loss = -(torch.stack(log_probs) * advantage).mean() - 0.01 * torch.stack(entropies).mean()
    loss = loss + 0.5 * F.mse_loss(values_t, returns_t)
    loss.backward()
    world["optimizer"].step()
    world["optimizer"].zero_grad()
    return loss.detach(), torch.tensor(lengths), returns_t


@pytest.mark.parametrize("mode", ["jit", pytest.param("compile", marks=SLOW)])
def test_reinforce_over_a_python_environment_with_a_value_baseline_is_eagers(mode):
    make = loop(optimized(lambda ps: torch.optim.Adam(ps, 1e-2), Policy), reinforce_body, whole=False)
    trains_as_eager(make, lambda world, i: world["step"](), modes=(mode,), misses=None if mode == "compile" else 1)


# ---------------------------------------------------------------------------------- generation


def generates_as_eager(make_model, generate, mode, misses=None, **tol):
    """``generate(call)`` from the same seed eager and with the model in ``mode``, under
    ``no_grad``: the same tokens (and scores) and the random state after; ``misses`` read under jit."""
    results = {}
    for m in ("eager", mode):
        torch.manual_seed(0)
        model = make_model().eval()
        call = wrap(m, model)
        torch.manual_seed(5)
        with torch.no_grad():
            results[m] = generate(call), torch.get_rng_state()
        if m == "jit" and misses is not None:
            assert thunder_rs.cache_misses(call) == misses
    torch.testing.assert_close(results[mode], results["eager"], **(tol or dict(rtol=0, atol=0)))


@pytest.mark.parametrize("mode", ["jit", pytest.param("compile", marks=SLOW)])
def test_sampling_by_hand_with_a_repetition_penalty_and_top_k_over_a_recurrent_step_is_eagers(mode):
    prompt = torch.randint(0, 11, (2, 3), generator=torch.Generator().manual_seed(1))
    generates_as_eager(RecurrentLM, lambda call: sample_by_hand(call, prompt), mode, misses=2)


@pytest.mark.parametrize("mode", ["jit", pytest.param("compile", marks=SLOW)])
def test_beam_search_by_hand_over_a_growing_sequence_is_eagers(mode):
    """No cache: each step's sequence one longer (symbolic from the second length). In evaluation
    without grad eager's ``nn.MultiheadAttention`` runs its fused kernel, which the jitted model
    runs too (bit for bit); Dynamo's graph holds the module's other path (``backend="eager"``'s
    scores differ from eager's in the last bits too), so the compiled scores are eager's within
    float32's rounding, the tokens eager's."""
    prompt = torch.randint(0, 11, (1, 3), generator=torch.Generator().manual_seed(2))
    tol = {} if mode == "jit" else F32
    generates_as_eager(TinyLM, lambda call: beam_search_by_hand(call, prompt), mode, misses=2, **tol)


@pytest.mark.parametrize("mode", ["jit", pytest.param("compile", marks=SLOW)])
def test_a_transformer_classifier_evaluated_without_grad_every_other_step_is_eagers(mode):
    """Training with dropout, and every other step an evaluation in ``eval()`` under ``no_grad``,
    where eager's layers run their fused kernels (``torch._transformer_encoder_layer_fwd``), which
    the jitted model runs too: bit for bit. Dynamo's graph holds the layers' other path
    (``backend="eager"``'s differ from eager's in the last bits too): within float32's rounding."""
    ids_val = torch.randint(0, 11, (3, 5))
    padding_val = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] + [True] * 4])

    def body(world, ids, y, i):
        forward = world["forward"].model
        padding = torch.zeros(ids.shape, dtype=torch.bool)
        loss = F.cross_entropy(forward(ids, padding), y)
        loss.backward()
        world["optimizer"].step()
        world["optimizer"].zero_grad()
        evaluated = torch.zeros(())
        if i % 2 == 1:
            world["model"].eval()
            with torch.no_grad():
                evaluated = forward(ids_val, padding_val)
            world["model"].train()
        return loss.detach(), evaluated

    def step(world, i):
        return world["step"](torch.randint(0, 11, (4, 5)), torch.randint(0, 3, (4,)), i)

    build = optimized(lambda ps: torch.optim.AdamW(ps, 1e-2), EncoderClassifier)
    tol = {} if mode == "jit" else F32
    trains_as_eager(loop(build, body, whole=False), step, modes=(mode,), steps=4, misses=2, **tol)


def test_a_linear_probe_over_a_frozen_encoder_in_evaluation_is_eagers():
    """The embedding and encoder frozen (``requires_grad_(False)``) and in ``eval()``, a new head
    trained on their pooled features with grad enabled: with no tensor of the layers requiring
    grad eager's layers run their fused kernels, and so does the jitted model."""

    def build():
        model = EncoderClassifier()
        model.embed.requires_grad_(False)
        model.encoder.requires_grad_(False).eval()
        return {"model": model, "optimizer": torch.optim.SGD(model.head.parameters(), 0.5, momentum=0.9)}

    def body(world, ids, padding, y):
        loss = F.cross_entropy(world["forward"].model(ids, padding), y)
        loss.backward()
        world["optimizer"].step()
        world["optimizer"].zero_grad()
        return loss.detach()

    def step(world, i):
        padding = torch.arange(5) >= torch.randint(1, 6, (4, 1))
        return world["step"](torch.randint(0, 11, (4, 5)), padding, torch.randint(0, 3, (4,)))

    trains_as_eager(loop(build, body, whole=False), step, modes=("jit",), misses=1)
