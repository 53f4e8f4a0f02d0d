"""The programs ``test_user_loops_round10.py`` trains and samples (harness: ``user_loops_round6.py``,
loop maker: ``user_loops_round7.py``): replicas synchronised by parameter hooks outside a
``no_sync`` context, a CLIP pair with a learned temperature, a masked language model, a CTC tagger,
a ``nn.Transformer`` translator, a Q network, a RealNVP flow, a noise predictor sampled by DDIM,
observers of quantization written in place, a block checkpointed by a flag, a domain classifier
behind a gradient reversal."""

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from user_loops_round7 import mlp


class Replicated(nn.Module):
    """A data-parallel wrapper by hand: the module's parameters register, outside :meth:`no_sync`,
    as ready (``register_post_accumulate_grad_hook``) when their gradient is accumulated, as
    DDP's reducer does; the loop averages the ready gradients over the replicas."""

    def __init__(self, module):
        super().__init__()
        self.module, self.require_sync, self.ready = module, True, []
        for name, p in module.named_parameters():
            p.register_post_accumulate_grad_hook(lambda p, name=name: self.accumulated(name))

    def accumulated(self, name: str) -> None:
        if self.require_sync:
            self.ready.append(name)

    @contextlib.contextmanager
    def no_sync(self):
        self.require_sync = False
        try:
            yield
        finally:
            self.require_sync = True

    def forward(self, x):
        return self.module(x)


class ClipPair(nn.Module):
    """CLIP: an image and a text tower, a learned log temperature (``logit_scale``)."""

    def __init__(self):
        super().__init__()
        self.image, self.text = mlp(6, 8, 4), nn.EmbeddingBag(10, 4, mode="mean")
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, images, tokens):
        a, b = F.normalize(self.image(images), dim=-1), F.normalize(self.text(tokens), dim=-1)
        logits = self.logit_scale.exp() * a @ b.T
        targets = torch.arange(images.shape[0])
        return (F.cross_entropy(logits, targets) + F.cross_entropy(logits.T, targets)) / 2


class MaskedLM(nn.Module):
    """A bidirectional encoder with dropout and a head tied to the embedding."""

    def __init__(self, vocab: int = 12, dim: int = 8):
        super().__init__()
        self.embed, self.position = nn.Embedding(vocab, dim), nn.Parameter(0.02 * torch.randn(8, dim))
        layer = nn.TransformerEncoderLayer(dim, 2, 16, dropout=0.1, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.bias = nn.Parameter(torch.zeros(vocab))

    def forward(self, ids, labels):
        h = self.encoder(self.embed(ids) + self.position[: ids.shape[1]])
        logits = h @ self.embed.weight.T + self.bias
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


def mask_tokens(ids, vocab: int = 12, mask_id: int = 1, p: float = 0.3):
    """BERT's masking drawn per step: ``p`` of the tokens chosen, 80% replaced by the mask token,
    10% by a random token, 10% kept; the others' labels ignored."""
    chosen = torch.bernoulli(torch.full(ids.shape, p)).bool()
    labels = ids.masked_fill(~chosen, -100)
    replaced = torch.bernoulli(torch.full(ids.shape, 0.8)).bool() & chosen
    randomized = torch.bernoulli(torch.full(ids.shape, 0.5)).bool() & chosen & ~replaced
    ids = ids.masked_fill(replaced, mask_id)
    return torch.where(randomized, torch.randint(0, vocab, ids.shape), ids), labels


class CtcTagger(nn.Module):
    """Frames through a bidirectional GRU to the log-probabilities of the blank and the labels."""

    def __init__(self, features: int = 5, labels: int = 6):
        super().__init__()
        self.rnn, self.head = nn.GRU(features, 6, bidirectional=True), nn.Linear(12, labels + 1)

    def forward(self, frames):
        return self.head(self.rnn(frames)[0]).log_softmax(-1)


class Translator(nn.Module):
    """``nn.Transformer`` with embeddings, causal target masks and key padding masks."""

    def __init__(self, vocab: int = 10, dim: int = 8):
        super().__init__()
        self.source, self.target = nn.Embedding(vocab, dim), nn.Embedding(vocab, dim)
        self.transformer = nn.Transformer(dim, 2, 1, 1, 16, dropout=0.1, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, src, tgt, src_padding):
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        h = self.transformer(
            self.source(src),
            self.target(tgt),
            tgt_mask=causal,
            src_key_padding_mask=src_padding,
            memory_key_padding_mask=src_padding,
            tgt_is_causal=True,
        )
        return self.head(h)


def greedy_translate(call, src, src_padding, length: int = 4, start: int = 1):
    """Greedy decoding over the growing target, the whole model called per token."""
    tgt = torch.full((src.shape[0], 1), start)
    for _ in range(length):
        tgt = torch.cat([tgt, call(src, tgt, src_padding)[:, -1].argmax(-1, keepdim=True)], 1)
    return tgt


class Coupling(nn.Module):
    """A RealNVP affine coupling: the masked half scales and shifts the other (``tanh`` scales)."""

    def __init__(self, mask):
        super().__init__()
        self.register_buffer("mask", mask)
        self.net = mlp(mask.numel(), 8, 2 * mask.numel())

    def forward(self, x):
        s, t = self.net(x * self.mask).chunk(2, -1)
        s = torch.tanh(s) * (1 - self.mask)
        return x * self.mask + (1 - self.mask) * (x * s.exp() + t), s.sum(-1)

    def inverse(self, y):
        s, t = self.net(y * self.mask).chunk(2, -1)
        s = torch.tanh(s) * (1 - self.mask)
        return y * self.mask + (1 - self.mask) * (y - t) * (-s).exp()


class Flow(nn.Module):
    """Couplings with alternating masks; the log-likelihood under a standard normal base."""

    def __init__(self, dim: int = 4, layers: int = 3):
        super().__init__()
        masks = [(torch.arange(dim) + i) % 2 for i in range(layers)]
        self.layers = nn.ModuleList(Coupling(m.float()) for m in masks)

    def forward(self, x):
        log_det = torch.zeros(x.shape[0])
        for layer in self.layers:
            x, s = layer(x)
            log_det = log_det + s
        base = torch.distributions.Normal(0.0, 1.0).log_prob(x).sum(-1)
        return -(base + log_det).mean()

    def sample(self, z):
        for layer in reversed(self.layers):
            z = layer.inverse(z)
        return z


class NoisePredictor(nn.Module):
    """The noise of ``x_t`` predicted from ``x_t`` and its timestep (a sinusoidal embedding), with
    a cosine schedule's cumulative alphas as a buffer."""

    def __init__(self, steps: int = 20, inputs: int = 4):
        super().__init__()
        s = torch.arange(steps + 1) / steps
        f = torch.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2
        self.register_buffer("alphas", (f[1:] / f[0]).clamp(1e-4, 0.9999))
        self.net = mlp(inputs + 4, 16, inputs)

    def forward(self, x, t):
        angles = t[:, None].float() * torch.tensor([1.0, 0.3, 0.1, 0.03])
        return self.net(torch.cat([x, angles.sin()], -1))

    def loss(self, x0):
        t = torch.randint(0, self.alphas.shape[0], (x0.shape[0],))
        noise = torch.randn_like(x0)
        a = self.alphas[t, None]
        return F.mse_loss(self(a.sqrt() * x0 + (1 - a).sqrt() * noise, t), noise)


def ddim_sample(call, alphas, x, stride: int = 5, eta: float = 0.0):
    """DDIM from ``x`` at the last timestep every ``stride`` steps down to 0 (``eta`` > 0 draws)."""
    times = list(range(alphas.shape[0] - 1, -1, -stride))
    for t, prev in zip(times, times[1:] + [-1]):
        a, a_prev = alphas[t], alphas[prev] if prev >= 0 else torch.tensor(1.0)
        eps = call(x, torch.full((x.shape[0],), t))
        x0 = (x - (1 - a).sqrt() * eps) / a.sqrt()
        sigma = eta * ((1 - a_prev) / (1 - a) * (1 - a / a_prev)).sqrt()
        x = a_prev.sqrt() * x0 + (1 - a_prev - sigma**2).sqrt() * eps
        if eta > 0:
            x = x + sigma * torch.randn_like(x)
    return x


class Observed(nn.Module):
    """Quantization-aware training by hand: a min/max observer of the activations whose buffers the
    forward moves in place (``lerp_`` under ``no_grad``) while training, their scale and zero point
    tensors passed to ``fake_quantize_per_tensor_affine``; the weights fake-quantized per channel."""

    def __init__(self):
        super().__init__()
        self.body = mlp()
        self.register_buffer("low", torch.zeros(()))
        self.register_buffer("high", torch.ones(()))

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                self.low.lerp_(x.min().clamp(max=0), 0.1)
                self.high.lerp_(x.max().clamp(min=0), 0.1)
        scale = ((self.high - self.low) / 255).clamp(min=1e-6).reshape(1)
        zero = (-self.low / scale).round().int().clamp(0, 255)
        x = torch.fake_quantize_per_tensor_affine(x, scale, zero, 0, 255)
        for layer in self.body:
            if isinstance(layer, nn.Linear):
                w = layer.weight
                scales = (w.detach().abs().amax(1) / 127).clamp(min=1e-6)
                w = torch.fake_quantize_per_channel_affine(
                    w, scales, torch.zeros_like(scales, dtype=torch.int), 0, -128, 127
                )
                x = F.linear(x, w, layer.bias)
            else:
                x = layer(x)
        return x


class Checkpointed(nn.Module):
    """Two residual blocks with dropout, each run under ``checkpoint`` while :attr:`checkpointing`
    (the loop turns it on and off between epochs)."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Dropout(0.2), nn.Linear(8, 4)) for _ in range(2)
        )
        self.head, self.checkpointing = nn.Linear(4, 3), False

    def forward(self, x):
        for block in self.blocks:
            x = x + (checkpoint(block, x, use_reentrant=False) if self.checkpointing else block(x))
        return self.head(x)


class Reverse(torch.autograd.Function):
    """The gradient reversal of domain-adversarial training: identity forward, ``-lam`` times the
    gradient backward."""

    @staticmethod
    def forward(ctx, x, lam):
        ctx.lam = lam
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -ctx.lam * grad, None


class DomainAdversarial(nn.Module):
    def __init__(self):
        super().__init__()
        self.features, self.label, self.domain = (
            nn.Sequential(nn.Linear(4, 8), nn.ReLU()),
            nn.Linear(8, 3),
            mlp(8, 8, 1),
        )

    def forward(self, x, lam: float):
        h = self.features(x)
        return self.label(h), self.domain(Reverse.apply(h, lam)).squeeze(-1)


def nucleus_translate(call, src, src_padding, length: int = 5, top_p: float = 0.8, eos: int = 0, start: int = 1):
    """Sampling translations token by token: temperature, nucleus (top-p) filtering by a sorted
    cumulative sum scattered back, ``torch.multinomial``; a finished row (its EOS drawn) gets EOS."""
    tgt, done = torch.full((src.shape[0], 1), start), torch.zeros(src.shape[0], dtype=torch.bool)
    for _ in range(length):
        logits = call(src, tgt, src_padding)[:, -1] / 0.7
        sorted_logits, order = logits.sort(-1, descending=True)
        drop = sorted_logits.softmax(-1).cumsum(-1) - sorted_logits.softmax(-1) > top_p
        logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
        token = torch.multinomial(logits.softmax(-1), 1).masked_fill(done[:, None], eos)
        done |= token[:, 0] == eos
        tgt = torch.cat([tgt, token], 1)
    return tgt, done
