"""The programs ``test_user_loops_round9.py`` trains and samples (harness: ``user_loops_round6.py``,
loop maker: ``user_loops_round7.py``): a WGAN's critic and generator, MoCo's encoders with a queue
and pointer kept as buffers, a multi-task model, a seq2seq GRU decoder called one token at a time,
a toy environment for REINFORCE, and language models sampled and searched by hand."""

import torch
import torch.nn.functional as F
from torch import nn

from user_loops_round7 import mlp


def optimized(make_optimizer, model=mlp, **extra):
    """A world builder: the model, its optimizer, and ``extra`` (schedulers take the optimizer)."""

    def build():
        net = model()
        optimizer = make_optimizer(net.parameters())
        made = {key: value(optimizer) if callable(value) else value for key, value in extra.items()}
        return {"model": net, "optimizer": optimizer, **made}

    return build


def critic():
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.LeakyReLU(0.2), nn.Linear(8, 1))


class Adversaries(nn.Module):
    """A generator from noise to samples and a critic (or discriminator) of samples."""

    def __init__(self):
        super().__init__()
        self.generator = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 4))
        self.critic = critic()


class KeyedEncoders(nn.Module):
    """MoCo: a query encoder, a key encoder the loop follows by ``torch._foreach_lerp_``, a queue
    of keys and its pointer kept as buffers the loop writes in place between the calls."""

    def __init__(self, dim: int = 4, size: int = 6):
        super().__init__()
        self.query = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, dim))
        self.key = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, dim))
        self.key.load_state_dict(self.query.state_dict())
        self.key.requires_grad_(False)
        self.register_buffer("queue", F.normalize(torch.randn(size, dim), dim=1))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))

    def forward(self, x, k, temperature: float = 0.3):
        q = F.normalize(self.query(x), dim=1)
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ self.queue.T], 1) / temperature
        return F.cross_entropy(logits, torch.zeros(x.shape[0], dtype=torch.long))

    def keys(self, x):
        return F.normalize(self.key(x), dim=1)

    @torch.no_grad()
    def enqueue(self, k):
        rows = (self.ptr + torch.arange(k.shape[0])) % self.queue.shape[0]
        self.queue.index_copy_(0, rows, k)
        self.ptr.add_(k.shape[0]).remainder_(self.queue.shape[0])


class MultiTask(nn.Module):
    """A regression and a classification head over one trunk, their losses weighted by learned
    log-variances (Kendall et al.) the loop reads."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
        self.regress = nn.Linear(8, 2)
        self.classify = nn.Linear(8, 3)
        self.log_vars = nn.Parameter(torch.zeros(2))

    def forward(self, x):
        h = self.trunk(x)
        return self.regress(h), self.classify(h)


class Seq2Seq(nn.Module):
    """A GRU encoder and a decoder step (embedding, ``GRUCell``, head) the loop calls per token."""

    def __init__(self, vocab: int = 9, dim: int = 8):
        super().__init__()
        self.source = nn.Embedding(vocab, dim)
        self.encoder = nn.GRU(dim, dim, batch_first=True)
        self.target = nn.Embedding(vocab, dim)
        self.cell = nn.GRUCell(dim, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, src):
        return self.encoder(self.source(src))[1][0]

    def decode(self, token, hidden):
        hidden = self.cell(self.target(token), hidden)
        return self.head(hidden), hidden


class Corridor:
    """A toy environment in Python: a position on a line of ``length`` cells, actions left, stay,
    right; reward 1 at the right end (which ends the episode), a small cost per step."""

    def __init__(self, length: int = 4):
        self.length, self.position = length, 0

    def reset(self):
        self.position = 0
        return self.observe()

    def observe(self):
        return torch.tensor([self.position / self.length, 1.0, float(self.position == 0), 0.5])

    def step(self, action: int):
        self.position = min(max(self.position + action - 1, 0), self.length)
        done = self.position == self.length
        return self.observe(), (1.0 if done else -0.05), done


def discounted(rewards: list, gamma: float = 0.9) -> list:
    returns, running = [], 0.0
    for r in reversed(rewards):
        running = r + gamma * running
        returns.insert(0, running)
    return returns


class TinyLM(nn.Module):
    """A causal language model over the whole sequence (no cache): embeddings with positions, one
    masked attention layer, a head; the logits of every position."""

    def __init__(self, vocab: int = 11, dim: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(16, dim)
        self.attention = nn.MultiheadAttention(dim, 2, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        h = self.embed(ids) + self.position(torch.arange(ids.shape[1]))
        mask = torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool).triu(1)
        h = h + self.attention(h, h, h, attn_mask=mask, need_weights=False)[0]
        return self.head(h)


class RecurrentLM(nn.Module):
    """A GRU language model stepped one token at a time with its hidden state."""

    def __init__(self, vocab: int = 11, dim: int = 8):
        super().__init__()
        self.embed, self.cell, self.head = nn.Embedding(vocab, dim), nn.GRUCell(dim, dim), nn.Linear(dim, vocab)

    def forward(self, token, hidden):
        hidden = self.cell(self.embed(token), hidden)
        return self.head(hidden), hidden


def sample_by_hand(step, prompt, new: int = 6, temperature: float = 0.8, penalty: float = 1.3, k: int = 5):
    """Sampling one token at a time from a recurrent model: a repetition penalty on the tokens seen
    (``gather``/``scatter_``), top-k filtering, ``torch.multinomial``."""
    hidden = torch.zeros(prompt.shape[0], 8)
    for t in range(prompt.shape[1]):
        logits, hidden = step(prompt[:, t], hidden)
    ids = prompt
    for _ in range(new):
        seen = logits.gather(1, ids)
        logits = logits.scatter(1, ids, torch.where(seen > 0, seen / penalty, seen * penalty)) / temperature
        kth = logits.topk(k, dim=-1).values[:, -1:]
        probs = torch.softmax(logits.masked_fill(logits < kth, float("-inf")), -1)
        token = torch.multinomial(probs, 1)
        ids = torch.cat([ids, token], 1)
        logits, hidden = step(token[:, 0], hidden)
    return ids


def beam_search_by_hand(model, prompt, beams: int = 3, new: int = 4):
    """Beam search without a cache over the growing sequence: the summed log-probabilities of each
    beam, the best ``beams`` of the ``beams * vocab`` continuations kept."""
    ids = prompt.repeat(beams, 1)
    scores = torch.tensor([0.0] + [float("-inf")] * (beams - 1))
    for _ in range(new):
        log_probs = torch.log_softmax(model(ids)[:, -1], -1)
        vocab = log_probs.shape[-1]
        scores, flat = (scores[:, None] + log_probs).flatten().topk(beams)
        ids = torch.cat([ids[flat // vocab], (flat % vocab)[:, None]], 1)
    return ids, scores


class EncoderClassifier(nn.Module):
    """Tokens through a ``TransformerEncoder`` (two layers, not nested), their mean over the kept
    positions, a head: in evaluation without grad eager runs its layers' fused kernels."""

    def __init__(self, vocab: int = 11, dim: int = 8, classes: int = 3):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, 2, 16, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids, padding):
        h = self.encoder(self.embed(ids), src_key_padding_mask=padding)
        kept = (~padding).unsqueeze(-1).float()
        return self.head((h * kept).sum(1) / kept.sum(1))
