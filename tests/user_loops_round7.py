"""The programs ``test_user_loops_round7.py`` trains (harness: ``user_loops_round6.py``): a loop
maker whose step is jitted model with the loop eager, or compiled whole (or the model compiled), and
the models and losses the loops use: a tied language model, a policy, VAEs, a denoiser, fake
quantization, a skew-symmetric parametrization, SimCLR's views and loss."""

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from user_loops_round6 import wrap


def mlp(inputs: int = 4, hidden: int = 8, outputs: int = 3):
    return nn.Sequential(nn.Linear(inputs, hidden), nn.Tanh(), nn.Linear(hidden, outputs))


def batch(rows: int = 6, inputs: int = 4, classes: int = 3):
    return torch.randn(rows, inputs), torch.randint(0, classes, (rows,))


def loop(build, body, whole: bool = True, forwards=("model",)):
    """A program from ``build() -> world`` whose step is ``body(world, *args)``, the world holding
    the forwards it calls as attributes of ``"forward"`` (one for each of ``forwards``): under ``jit`` each
    forward is jitted and the step eager; under ``compile`` the whole step is compiled when
    ``whole``, else each forward is."""

    def make(mode):
        world = build()
        calls = {name: world[name] for name in forwards}
        if mode == "jit" or (mode != "eager" and not whole):
            calls = {name: wrap(mode, f) for name, f in calls.items()}
        if mode == "jit":
            world["jitted"] = list(calls.values())
        world["forward"] = SimpleNamespace(**calls)  # (not a dict: the harness compares dicts' values)

        def train_step(*args):
            return body(world, *args)

        world["step"] = wrap(mode, train_step) if whole and mode not in ("eager", "jit") else train_step
        return world

    return make


def call_step(world, i):
    return world["step"](*batch())


def classify(world, x, y):
    loss = F.cross_entropy(world["forward"].model(x), y)
    loss.backward()
    world["optimizer"].step()
    world["optimizer"].zero_grad()
    return loss.detach()


class TiedLM(nn.Module):
    """An embedding whose weight the head shares until :meth:`untie` gives the head its own copy."""

    def __init__(self, vocab: int = 11, dim: int = 6):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids, targets):
        logits = self.head(torch.tanh(self.mix(self.embed(ids))))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def untie(self):
        self.head.weight = nn.Parameter(self.embed.weight.detach().clone())
        return self.head.weight


class Policy(nn.Module):
    """A categorical policy and a value head over one trunk."""

    def __init__(self, observations: int = 4, actions: int = 3):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(observations, 8), nn.Tanh())
        self.logits = nn.Linear(8, actions)
        self.value = nn.Linear(8, 1)

    def forward(self, obs):
        h = self.trunk(obs)
        return self.logits(h), self.value(h).squeeze(-1)


class VAE(nn.Module):
    def __init__(self, inputs: int = 6, latent: int = 2):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(inputs, 8), nn.ReLU(), nn.Linear(8, 2 * latent))
        self.decoder = nn.Sequential(nn.Linear(latent, 8), nn.ReLU(), nn.Linear(8, inputs))

    def forward(self, x, beta):
        mu, log_var = self.encoder(x).chunk(2, dim=-1)
        z = torch.distributions.Normal(mu, (0.5 * log_var).exp()).rsample()
        reconstruction = F.mse_loss(self.decoder(z), x, reduction="sum") / x.shape[0]
        kl = -0.5 * torch.sum(1 + log_var - mu.square() - log_var.exp()) / x.shape[0]
        return reconstruction + beta * kl, kl


class Denoiser(nn.Module):
    """DDPM's training step: timesteps drawn, the schedule's buffers indexed by them, noise added
    and predicted."""

    def __init__(self, steps: int = 10, inputs: int = 4):
        super().__init__()
        betas = torch.linspace(1e-3, 0.2, steps)
        alphas = torch.cumprod(1 - betas, 0)
        self.register_buffer("sqrt_alphas", alphas.sqrt())
        self.register_buffer("sqrt_one_minus", (1 - alphas).sqrt())
        self.embed = nn.Embedding(steps, inputs)
        self.net = mlp(inputs, 8, inputs)

    def forward(self, x0):
        t = torch.randint(0, self.sqrt_alphas.shape[0], (x0.shape[0],))
        noise = torch.randn_like(x0)
        xt = self.sqrt_alphas[t, None] * x0 + self.sqrt_one_minus[t, None] * noise
        return F.mse_loss(self.net(xt + self.embed(t)), noise)


class Skew(nn.Module):
    def forward(self, x):
        a = x.triu(1)
        return torch.matrix_exp(a - a.mT)


class FakeQuantized(nn.Module):
    """Quantization-aware training: activations by ``fake_quantize_per_tensor_affine`` (its own
    clipped straight-through gradient), weights rounded with a straight-through estimator by hand."""

    def __init__(self):
        super().__init__()
        self.body = mlp()

    def forward(self, x):
        x = torch.fake_quantize_per_tensor_affine(x, 0.05, 0, -128, 127)
        for layer in self.body:
            if isinstance(layer, nn.Linear):
                w = layer.weight
                scale = w.abs().max().detach() / 7
                q = (w / scale).round().clamp(-8, 7) * scale
                x = F.linear(x, w + (q - w).detach(), layer.bias)
            else:
                x = layer(x)
        return x


def two_views(x):
    """SimCLR's augmentations drawn in the step: a feature mask and noise per view."""
    return [x * (torch.rand_like(x) > 0.2) + 0.1 * torch.randn_like(x) for _ in range(2)]


def info_nce(z1, z2, temperature=0.2):
    z = F.normalize(torch.cat([z1, z2]), dim=-1)
    similarity = (z @ z.T / temperature).fill_diagonal_(float("-inf"))
    n = z1.shape[0]
    targets = torch.cat([torch.arange(n, 2 * n), torch.arange(n)])
    return F.cross_entropy(similarity, targets)


class ActorCritic(nn.Module):
    """An actor and a critic apart, in one module (one jitted call returns both)."""

    def __init__(self):
        super().__init__()
        self.actor, self.critic = mlp(4, 8, 3), mlp(4, 8, 1)

    def forward(self, obs):
        return self.actor(obs), self.critic(obs).squeeze(-1)


class QuantAware(nn.Module):
    """Quantization-aware training with ``torch.ao``'s ``FakeQuantize`` modules: observers whose
    moving-average statistics, scale and zero point are buffers the forward writes."""

    def __init__(self):
        super().__init__()
        from torch.ao.quantization import FakeQuantize, MovingAverageMinMaxObserver

        self.q_in = FakeQuantize(observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255)
        self.body = mlp()
        self.q_out = FakeQuantize(observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255)

    def forward(self, x):
        return self.q_out(self.body(self.q_in(x)))


class DiscreteVAE(nn.Module):
    """A categorical latent by ``gumbel_softmax(hard=True)`` (its temperature annealed), a Beta
    weight and a Gamma penalty by ``rsample`` (reparametrized through their samplers' gradients)."""

    def __init__(self):
        super().__init__()
        self.encoder, self.decoder, self.concentration = mlp(6, 8, 4), mlp(4, 8, 6), nn.Linear(6, 2)

    def forward(self, x, tau):
        z = F.gumbel_softmax(self.encoder(x), tau=tau, hard=True)
        a, b = F.softplus(self.concentration(x)).add(0.5).unbind(-1)
        weight = torch.distributions.Beta(a, b).rsample()
        penalty = torch.distributions.Gamma(a, b).rsample().mean()
        return F.mse_loss(self.decoder(z) * weight[:, None], x) + 0.01 * penalty
