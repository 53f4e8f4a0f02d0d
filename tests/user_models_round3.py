"""Small models as users write them for the programs of ``test_user_programs_round3.py``: a
contrastive head with a learnt temperature, a LoRA adapter switched on and off between calls, a
forward taking optional tensors and ``**kwargs``, and a recurrent classifier over padded batches of
variable lengths (no packing)."""

import math

import torch
import torch.nn.functional as F
from torch import nn


class LearntTemperatureContrast(nn.Module):
    """CLIP's symmetric InfoNCE: two views through one encoder, cosine similarities over a learnt
    temperature (a log-parameter, clamped), cross-entropy both ways; returns the loss and the logits."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))
        self.log_temperature = nn.Parameter(torch.tensor(math.log(0.07)))

    def forward(self, a, b):
        za, zb = F.normalize(self.encoder(a), dim=-1), F.normalize(self.encoder(b), dim=-1)
        logits = za @ zb.t() / self.log_temperature.exp().clamp(min=0.01)
        labels = torch.arange(a.shape[0])
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2, logits


class LoRALinear(nn.Module):
    """A linear layer with a low-rank adapter the program switches on and off (``enabled``) and
    rescales (``scale``) between calls, as PEFT's ``disable_adapter`` and ``scaling`` do."""

    def __init__(self, in_features: int, out_features: int, rank: int = 2):
        super().__init__()
        self.base = nn.Linear(in_features, out_features)
        self.A = nn.Parameter(torch.randn(rank, in_features) * 0.1)
        self.B = nn.Parameter(torch.randn(out_features, rank) * 0.1)
        self.enabled, self.scale = True, 0.5

    def forward(self, x):
        y = self.base(x)
        if self.enabled:
            y = y + self.scale * (x @ self.A.t() @ self.B.t())
        return y


def lora_mlp() -> nn.Module:
    return nn.Sequential(LoRALinear(4, 6), nn.GELU(), LoRALinear(6, 2))


class OptionalInputs(nn.Module):
    """A forward with optional tensors (None in some calls) and ``**kwargs`` it reads by ``get``."""

    def __init__(self):
        super().__init__()
        self.proj, self.gate = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x, mask=None, bias=None, **kwargs):
        y = self.proj(x)
        if mask is not None:
            y = y.masked_fill(~mask, 0.0)
        if bias is not None:
            y = y + bias
        if kwargs.get("gate") is not None:
            y = y * torch.sigmoid(self.gate(kwargs["gate"]))
        return y * kwargs.get("scale", 1.0)


class RecurrentClassifier(nn.Module):
    """Embeds a right-padded batch, runs a bidirectional two-layer RNN over it whole (no packing),
    and classifies each sequence from its last real step and its mean over the real steps."""

    def __init__(self, cell):
        super().__init__()
        self.embed = nn.Embedding(10, 6, padding_idx=0)
        self.rnn = cell(6, 5, num_layers=2, batch_first=True, bidirectional=True, dropout=0.2)
        self.head = nn.Linear(10, 3)

    def forward(self, tokens, lengths):
        out, _ = self.rnn(self.embed(tokens))
        real = (torch.arange(tokens.shape[1])[None, :] < lengths[:, None]).unsqueeze(-1)
        last = out.gather(1, (lengths - 1).view(-1, 1, 1).expand(-1, 1, out.shape[-1])).squeeze(1)
        return self.head(last + (out * real).sum(1) / lengths[:, None])


class TiedLanguageModel(nn.Module):
    """A language model whose output layer shares the embedding's weight (``head.weight = embed.weight``)."""

    def __init__(self):
        super().__init__()
        self.embed, self.norm = nn.Embedding(10, 4), nn.LayerNorm(4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(self.norm(self.embed(tokens)))


class MaskedActionPolicy(nn.Module):
    """A policy over actions some of which are invalid (their logits -inf): its loss is the
    expected advantage under the action probabilities; it returns the log-probabilities too, for
    logging (-inf for the invalid actions)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 5))

    def forward(self, obs, invalid, advantages):
        probs = self.net(obs).masked_fill(invalid, float("-inf")).softmax(-1)
        return -(probs * advantages).sum(-1).mean(), probs.log()


class ContrastWithProbabilities(LearntTemperatureContrast):
    """The contrastive head returning its matching probabilities instead of its logits."""

    def forward(self, a, b):
        loss, logits = super().forward(a, b)
        return loss, logits.softmax(-1)


class ScheduledSampling(nn.Module):
    """A GRU decoder trained with scheduled sampling: at each step a draw (``torch.rand``) picks
    the true token or the model's own argmax as the next input."""

    def __init__(self):
        super().__init__()
        self.embed, self.cell, self.out = nn.Embedding(8, 6), nn.GRUCell(6, 6), nn.Linear(6, 8)

    def forward(self, targets, teacher_p: float):
        h, token, logits = targets.new_zeros(targets.shape[0], 6, dtype=torch.float32), targets[:, 0], []
        for t in range(1, targets.shape[1]):
            h = self.cell(self.embed(token), h)
            logits.append(self.out(h))
            token = torch.where(torch.rand(()) < teacher_p, targets[:, t], logits[-1].argmax(-1))
        return torch.stack(logits, 1)


def cutmix(model, images, labels, alpha: float = 1.0):
    """CutMix as a batch transform inside the jitted step: a box from torch draws (its sizes read
    as Python numbers), pasted from a permuted batch, the labels mixed by the box's area."""
    lam = torch.distributions.Beta(alpha, alpha).sample().item()
    height, width = images.shape[2:]
    cut = math.sqrt(1.0 - lam)
    cy, cx = torch.randint(height, ()).item(), torch.randint(width, ()).item()
    y1, y2 = max(cy - int(height * cut) // 2, 0), min(cy + int(height * cut) // 2, height)
    x1, x2 = max(cx - int(width * cut) // 2, 0), min(cx + int(width * cut) // 2, width)
    perm = torch.randperm(images.shape[0])
    images = images.clone()
    images[:, :, y1:y2, x1:x2] = images[perm, :, y1:y2, x1:x2]
    lam = 1 - (y2 - y1) * (x2 - x1) / (height * width)
    out = model(images)
    return lam * F.cross_entropy(out, labels) + (1 - lam) * F.cross_entropy(out, labels[perm]), out


def cutmix_by_mask(model, images, labels, alpha: float = 1.0):
    """CutMix kept in tensors: the box is a mask from the draws, the mix a ``where``."""
    lam = torch.distributions.Beta(torch.tensor(alpha), torch.tensor(alpha)).sample()
    height, width = images.shape[2:]
    half = (1 - lam).sqrt() / 2
    cy, cx = torch.randint(height, ()), torch.randint(width, ())
    rows = (torch.arange(height) - cy).abs() < (height * half).floor()
    cols = (torch.arange(width) - cx).abs() < (width * half).floor()
    box = rows[:, None] & cols[None, :]
    perm = torch.randperm(images.shape[0])
    out = model(torch.where(box, images[perm], images))
    lam = 1 - box.float().mean()
    return lam * F.cross_entropy(out, labels) + (1 - lam) * F.cross_entropy(out, labels[perm]), out


def small_convnet() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(4, 3))  # fmt: skip


class ScaledClip(nn.Module):
    """CLIP's heads: image and text embeddings, cosine similarities times a learnt logit scale
    (``logit_scale.exp() * image @ text.t()``, the scale first), cross-entropy both ways."""

    def __init__(self):
        super().__init__()
        self.image, self.text = nn.Linear(6, 4), nn.Embedding(10, 4)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, images, tokens):
        image = F.normalize(self.image(images), dim=-1)
        text = F.normalize(self.text(tokens).mean(1), dim=-1)
        logits = self.logit_scale.exp().clamp(max=100) * image @ text.t()
        labels = torch.arange(images.shape[0])
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2, logits
