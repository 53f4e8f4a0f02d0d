"""More small models as users write them (parametrized layers, policies and generative models
built on ``torch.distributions``, heads that update state under ``torch.no_grad()`` in their
forward), for the training programs of ``test_user_programs_round2.py``."""

import torch
import torch.distributions as D
import torch.nn.functional as F
import torch.nn.utils.parametrize as parametrize
from torch import nn
from torch.nn.utils import parametrizations


class LowRank(nn.Module):
    """A LoRA update as a parametrization: the frozen weight plus a trainable product ``B @ A``."""

    def __init__(self, out_features: int, in_features: int, rank: int = 2):
        super().__init__()
        self.A = nn.Parameter(torch.randn(rank, in_features) * 0.1)
        self.B = nn.Parameter(torch.randn(out_features, rank) * 0.1)

    def forward(self, weight):
        return weight + self.B @ self.A


class Symmetric(nn.Module):
    def forward(self, weight):
        return (weight + weight.T) / 2


class Scaled(nn.Module):
    """A learnt scale: a parametrization with a parameter of its own."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(1.5))

    def forward(self, tensor):
        return tensor * self.scale


def lora_mlp() -> nn.Module:
    """Both layers' weights frozen under a LoRA parametrization: only ``A``, ``B`` and the biases train."""
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 4))
    for layer in (model[0], model[2]):
        parametrize.register_parametrization(layer, "weight", LowRank(*layer.weight.shape))
        layer.parametrizations.weight.original.requires_grad_(False)
    return model


def chained_parametrizations() -> nn.Module:
    """Two parametrizations of one weight (symmetric, then scaled) and one of a bias."""
    model = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 3))
    parametrize.register_parametrization(model[0], "weight", Symmetric())
    parametrize.register_parametrization(model[0], "weight", Scaled())
    parametrize.register_parametrization(model[2], "bias", Scaled())
    return model


def spectral_discriminator() -> nn.Module:
    """A GAN discriminator with spectrally normalised convolution and linear layers."""
    return nn.Sequential(
        parametrizations.spectral_norm(nn.Conv2d(3, 4, 3)),
        nn.LeakyReLU(0.2),
        nn.Flatten(),
        parametrizations.spectral_norm(nn.Linear(4 * 6 * 6, 1)),
    )


def weight_normed_vocoder() -> nn.Module:
    """A HiFi-GAN-like block: weight-normalised 1-d convolution and transposed convolution."""
    return nn.Sequential(
        parametrizations.weight_norm(nn.Conv1d(2, 4, 3, padding=1)),
        nn.LeakyReLU(0.1),
        parametrizations.weight_norm(nn.ConvTranspose1d(4, 2, 4, stride=2, padding=1)),
    )


def orthogonal_mlp() -> nn.Module:
    """Orthogonal weights: a non-square one by the default map, a square one by the matrix exponential."""
    return nn.Sequential(
        parametrizations.orthogonal(nn.Linear(6, 4)),
        nn.Tanh(),
        parametrizations.orthogonal(nn.Linear(4, 4), orthogonal_map="matrix_exp"),
    )


class CachedSpectralNorm(nn.Module):
    """One spectrally normalised layer applied twice under ``parametrize.cached()``: the power
    iteration runs once per call."""

    def __init__(self):
        super().__init__()
        self.layer = parametrizations.spectral_norm(nn.Linear(4, 4))

    def forward(self, x):
        with parametrize.cached():
            return self.layer(self.layer(x).tanh())


class SquashedGaussianPolicy(nn.Module):
    """A SAC actor: a Gaussian squashed by tanh (``TransformedDistribution``), a reparametrised
    action and its log-probability."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 16), nn.ReLU())
        self.mean = nn.Linear(16, 2)
        self.log_std = nn.Linear(16, 2)

    def forward(self, obs):
        h = self.body(obs)
        base = D.Normal(self.mean(h), self.log_std(h).clamp(-5, 2).exp())
        policy = D.TransformedDistribution(base, [D.TanhTransform(cache_size=1)])
        action = policy.rsample()
        log_prob = policy.log_prob(action).sum(-1)
        return (0.2 * log_prob - action.square().sum(-1)).mean() - 0.01 * base.entropy().sum(), action


class ClippedPolicy(nn.Module):
    """A PPO actor-critic: the clipped ratio of categorical probabilities, an entropy bonus and a value loss."""

    def __init__(self):
        super().__init__()
        self.actor = nn.Linear(4, 3)
        self.critic = nn.Linear(4, 1)

    def forward(self, obs, actions, old_log_prob, advantages):
        policy = D.Categorical(logits=self.actor(obs))
        ratio = (policy.log_prob(actions) - old_log_prob).exp()
        clipped = torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)
        value_loss = (self.critic(obs).squeeze(-1) - advantages).square().mean()
        return -clipped.mean() - 0.01 * policy.entropy().mean() + value_loss, ratio


class DiagonalVAE(nn.Module):
    """A VAE whose posterior and prior are ``Independent(Normal)`` distributions, its KL term
    ``torch.distributions.kl_divergence`` of the two."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(10, 8)
        self.decoder = nn.Linear(4, 10)

    def forward(self, x):
        mean, scale = self.encoder(x).chunk(2, -1)
        posterior = D.Independent(D.Normal(mean, F.softplus(scale) + 1e-3), 1)
        prior = D.Independent(D.Normal(torch.zeros_like(mean), torch.ones_like(mean)), 1)
        z = posterior.rsample()
        recon = self.decoder(z)
        kl = D.kl_divergence(posterior, prior)
        return (F.mse_loss(recon, x, reduction="none").sum(-1) + kl).mean(), recon


class MixtureDensity(nn.Module):
    """A mixture density network: the negative log-likelihood under a mixture of Gaussians."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 9)

    def forward(self, x, y):
        logits, mean, log_scale = self.head(x).chunk(3, -1)
        mixture = D.MixtureSameFamily(D.Categorical(logits=logits), D.Normal(mean, log_scale.exp()))
        return -mixture.log_prob(y).mean(), mean


class CenteredTeacher(nn.Module):
    """A DINO-style head: the teacher's centre, a buffer, updated as an EMA under ``torch.no_grad()``
    inside the forward, and the centred, sharpened targets."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 2)
        self.register_buffer("center", torch.zeros(4))

    def forward(self, tokens):
        h = self.embedding(tokens)
        with torch.no_grad():
            self.center.mul_(0.9).add_(h.mean((0, 1)) * 0.1)
            target = ((h - self.center) / 0.1).softmax(-1)
        return self.head(h).sum() - (target * h.log_softmax(-1)).sum(), target


class Prototypes(nn.Module):
    """SwAV's prototypes, normalised in place under ``torch.no_grad()`` at the start of each forward."""

    def __init__(self):
        super().__init__()
        self.projection = nn.Linear(4, 6)
        self.prototypes = nn.Linear(6, 3, bias=False)

    def forward(self, x):
        with torch.no_grad():
            self.prototypes.weight.copy_(F.normalize(self.prototypes.weight.data.clone(), dim=1))
        scores = self.prototypes(F.normalize(self.projection(x), dim=1))
        return scores.logsumexp(-1).mean(), scores


class ClippedCritic(nn.Module):
    """A WGAN critic clipping its weights through ``.data`` at the start of each forward."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))

    def forward(self, real, fake):
        for p in self.layers.parameters():
            p.data.clamp_(-0.3, 0.3)
        return self.layers(fake).mean() - self.layers(real).mean(), self.layers[0].weight


class RenormedEmbedding(nn.Module):
    """An embedding with ``max_norm``: eager renormalises the rows it looks up in place."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(10, 4, max_norm=1.0)
        self.head = nn.Linear(4, 2)

    def forward(self, tokens):
        out = self.head(self.embedding(tokens))
        return out.square().mean(), out


class PaddedAttention(nn.Module):
    """Cross-attention with separate key and value sizes, a key padding mask, dropout and the
    per-head attention weights returned."""

    def __init__(self):
        super().__init__()
        self.attention = nn.MultiheadAttention(8, 2, dropout=0.1, batch_first=True, kdim=6, vdim=5)

    def forward(self, query, key, value, padding):
        out, weights = self.attention(
            query, key, value, key_padding_mask=padding, need_weights=True, average_attn_weights=False
        )
        return out.square().mean() + weights.square().sum(), weights


class Seq2SeqTransformer(nn.Module):
    """``nn.Transformer`` with a causal target mask and padding masks for source, target and memory."""

    def __init__(self):
        super().__init__()
        self.transformer = nn.Transformer(8, 2, 1, 1, 16, dropout=0.1, batch_first=True)

    def forward(self, source, target, source_padding, target_padding):
        causal = nn.Transformer.generate_square_subsequent_mask(target.shape[1])
        out = self.transformer(
            source,
            target,
            tgt_mask=causal,
            src_key_padding_mask=source_padding,
            tgt_key_padding_mask=target_padding,
            memory_key_padding_mask=source_padding,
            tgt_is_causal=True,
        )
        return out.square().mean(), out


class MomentumContrast(nn.Module):
    """MoCo: a key encoder following the query encoder by ``param_k.data = param_k.data * m +
    param_q.data * (1 - m)`` under ``torch.no_grad()`` in the forward, and a queue of keys written
    at a pointer read from a buffer (``int(self.queue_ptr)``)."""

    def __init__(self, queue: int = 8, momentum: float = 0.9):
        super().__init__()
        self.query = nn.Linear(4, 3)
        self.key = nn.Linear(4, 3)
        self.key.load_state_dict(self.query.state_dict())
        self.key.requires_grad_(False)
        self.momentum, self.size = momentum, queue
        self.register_buffer("queue", F.normalize(torch.randn(3, queue), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    def forward(self, a, b):
        q = F.normalize(self.query(a), dim=1)
        with torch.no_grad():
            for param_k, param_q in zip(self.key.parameters(), self.query.parameters()):
                param_k.data = param_k.data * self.momentum + param_q.data * (1.0 - self.momentum)
            k = F.normalize(self.key(b), dim=1)
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ self.queue.clone().detach()], 1) / 0.07
        with torch.no_grad():
            ptr = int(self.queue_ptr)
            self.queue[:, ptr : ptr + k.shape[0]] = k.T
            self.queue_ptr[0] = (ptr + k.shape[0]) % self.size
        return F.cross_entropy(logits, torch.zeros(a.shape[0], dtype=torch.long)), logits


class BoundedPolicy(nn.Module):
    """An actor for actions in [0, 1]: a Beta distribution (``Dirichlet`` underneath, its
    ``rsample`` differentiated through ``torch._dirichlet_grad``), a reparametrised action, its
    log-probability and entropy."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 4)

    def forward(self, obs):
        alpha, beta = (F.softplus(self.head(obs)) + 1).chunk(2, -1)
        policy = D.Beta(alpha, beta)
        action = policy.rsample()
        log_prob = policy.log_prob(action.clamp(1e-4, 1 - 1e-4)).sum(-1)
        return (0.1 * log_prob - action.sum(-1)).mean() - 0.01 * policy.entropy().mean(), action
