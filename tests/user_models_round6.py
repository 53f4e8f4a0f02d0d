"""The models and losses ``test_user_loops_round6.py`` trains: DDP's ``no_sync`` by hand,
checkpointed blocks, a discriminator, learned loss weights, MoCo, a seq2seq GRU, a character LSTM,
focal and NT-Xent losses."""

import contextlib

import torch
import torch.nn.functional as F
from torch import nn


def mlp():
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


class DataParallelLike(nn.Module):
    """DDP's ``no_sync``: a context manager turning the sync flag off; the synced micro-batches
    counted in a buffer."""

    def __init__(self):
        super().__init__()
        self.module = mlp()
        self.require_backward_grad_sync = True
        self.register_buffer("synced", torch.zeros(()))

    @contextlib.contextmanager
    def no_sync(self):
        old, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def forward(self, x):
        if self.require_backward_grad_sync:
            self.synced += 1
        return self.module(x)


class Checkpointed(nn.Module):
    """Two residual blocks with dropout, each recomputed in the backward (``use_reentrant=False``)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8), nn.GELU(), nn.Dropout(0.2)) for _ in range(2)
        )
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = h + torch.utils.checkpoint.checkpoint(block, h, use_reentrant=False)
        return self.out(h)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.2), nn.Linear(8, 8), nn.SiLU(), nn.Linear(8, 1))

    def forward(self, x):
        return self.net(x)


class MultiTask(nn.Module):
    """A shared trunk, a classification and a regression head, and learned log variances weighting
    the two losses (Kendall et al.'s uncertainty weighting)."""

    def __init__(self):
        super().__init__()
        self.trunk, self.cls, self.reg = nn.Linear(4, 8), nn.Linear(8, 3), nn.Linear(8, 2)
        self.log_vars = nn.Parameter(torch.zeros(2))

    def forward(self, x, y, target):
        h = self.trunk(x).relu()
        losses = torch.stack([F.cross_entropy(self.cls(h), y), F.mse_loss(self.reg(h), target)])
        return (torch.exp(-self.log_vars) * losses + self.log_vars).sum(), losses.detach()


def focal_loss(logits, y, gamma=2.0, alpha=0.25, smoothing=0.1):
    """Focal loss on label-smoothed one-hot targets."""
    target = F.one_hot(y, logits.shape[-1]).float() * (1 - smoothing) + smoothing / logits.shape[-1]
    log_p = logits.log_softmax(-1)
    return (-alpha * (1 - log_p.exp()) ** gamma * target * log_p).sum(-1).mean()


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(1, 4, 3, padding=1), nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(self.conv(x).relu().mean((2, 3)))


class Teacher(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))

    def forward(self, x):
        return self.net(x)


class MoCo(nn.Module):
    """MoCo v2: a query encoder, a key encoder following it by momentum, a queue of keys written
    in place at a pointer, and InfoNCE over the positive key and the queue."""

    def __init__(self, queue: int = 8, dim: int = 4):
        super().__init__()
        self.encoder_q = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, dim))
        self.encoder_k = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, dim))
        self.encoder_k.load_state_dict(self.encoder_q.state_dict())
        self.encoder_k.requires_grad_(False)
        self.register_buffer("queue", F.normalize(torch.randn(dim, queue), dim=0))
        self.ptr = 0

    def forward(self, x_q, x_k, temperature: float = 0.2):
        q = F.normalize(self.encoder_q(x_q), dim=1)
        with torch.no_grad():
            for p_k, p_q in zip(self.encoder_k.parameters(), self.encoder_q.parameters()):
                p_k.mul_(0.9).add_(p_q.detach(), alpha=0.1)
            k = F.normalize(self.encoder_k(x_k), dim=1)
        positive = (q * k).sum(1, keepdim=True)
        negative = q @ self.queue.clone().detach()
        logits = torch.cat([positive, negative], 1) / temperature
        loss = F.cross_entropy(logits, torch.zeros(logits.shape[0], dtype=torch.long))
        with torch.no_grad():
            self.queue[:, self.ptr : self.ptr + k.shape[0]] = k.T
            self.ptr = (self.ptr + k.shape[0]) % self.queue.shape[1]
        return loss


def nt_xent(z1, z2, temperature=0.5):
    """SimCLR's loss: each view's positive the other's, the rest of the batch its negatives."""
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    sim = z @ z.T / temperature
    sim = sim.masked_fill(torch.eye(z.shape[0], dtype=torch.bool), float("-inf"))
    n = z1.shape[0]
    targets = torch.cat([torch.arange(n, 2 * n), torch.arange(n)])
    return F.cross_entropy(sim, targets)


class Seq2Seq(nn.Module):
    """A GRU encoder and a GRUCell decoder fed the target (teacher forcing) or its own argmax,
    chosen per step by a draw."""

    def __init__(self, vocab: int = 7, hidden: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.encoder, self.decoder = nn.GRU(hidden, hidden, batch_first=True), nn.GRUCell(hidden, hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, src, tgt, ratio: float = 0.5):
        _, h = self.encoder(self.embed(src))
        h, token, logits = h[0], tgt[:, 0], []
        for t in range(1, tgt.shape[1]):
            h = self.decoder(self.embed(token), h)
            logits.append(self.out(h))
            token = tgt[:, t] if torch.rand(()).item() < ratio else logits[-1].argmax(-1)
        return torch.stack(logits, 1)


class CharLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.lstm, self.out = nn.Embedding(6, 8), nn.LSTM(8, 8, batch_first=True), nn.Linear(8, 6)

    def forward(self, ids, state=None):
        out, state = self.lstm(self.embed(ids), state)
        return self.out(out), state


class CheckpointedNorm(nn.Module):
    """A checkpointed block with BatchNorm: eager's recomputation in the backward runs the block's
    forward again, updating the running statistics a second time."""

    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU())
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        return self.out(torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False))
