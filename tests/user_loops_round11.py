"""The programs ``test_user_loops_round11.py`` trains and samples (harness: ``user_loops_round6.py``,
loop maker: ``user_loops_round7.py``): adversarial examples by FGSM and PGD, a residual network
with stochastic depth, a convolutional network for ``channels_last`` batches, an LSTM over packed
sequences, a VQ-VAE with its codebook moved by EMAs in place, an energy model sampled by Langevin
dynamics, a soft prompt over a frozen model, an actor and twin critics, a Lookahead optimizer
wrapping another, and a causal language model with a key/value cache written by hand for
speculative decoding (with rollback), beam search (the cache reordered) and contrastive decoding."""

import math

import torch
import torch.nn.functional as F
from torch import nn

from user_loops_round7 import mlp


def fgsm(call, x, y, eps: float = 0.1):
    """The fast gradient sign method: the input's gradient through ``call``, one signed step, the
    example clamped in place to the data's range."""
    x = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad(F.cross_entropy(call(x), y), x)
    return (x.detach() + eps * grad.sign()).clamp_(-2, 2)


def pgd(call, x, y, eps: float = 0.2, alpha: float = 0.08, steps: int = 3):
    """Projected gradient descent from a uniform random start: signed steps on ``delta``, projected
    back onto the ``eps`` ball and the data range in place (``clamp_``) under ``no_grad``."""
    delta = torch.empty_like(x).uniform_(-eps, eps).requires_grad_()
    for _ in range(steps):
        loss = F.cross_entropy(call(x + delta), y)
        loss.backward()
        with torch.no_grad():
            delta.add_(alpha * delta.grad.sign()).clamp_(-eps, eps)
            delta.copy_((x + delta).clamp_(-2, 2) - x)
        delta.grad = None
    return (x + delta).detach()


class DeepResidual(nn.Module):
    """Residual blocks each dropped per sample during training (stochastic depth: a Bernoulli
    draw per row by ``torch.rand``, the kept rows scaled by the survival probability)."""

    def __init__(self, blocks: int = 3, dim: int = 8, survival: float = 0.7):
        super().__init__()
        self.stem, self.head, self.survival = nn.Linear(4, dim), nn.Linear(dim, 3), survival
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.GELU()) for _ in range(blocks)
        )

    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            out = block(h)
            if self.training:
                keep = (torch.rand(h.shape[0], 1) < self.survival).to(h.dtype) / self.survival
                out = out * keep
            h = h + out
        return self.head(h)


class ManifoldMixer(nn.Module):
    """Manifold mixup: the hidden states of a layer drawn per step mixed with a permutation of the
    batch by a Beta-drawn weight."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 3)])

    def forward(self, x, layer: int, lam, order):
        for i, linear in enumerate(self.layers):
            if i == layer:
                x = lam * x + (1 - lam) * x[order]
            x = linear(x)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return x


class SmallConvNet(nn.Module):
    """Convolutions with batch norm and pooling, for ``channels_last`` batches."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 8, 3)
        )
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


class PackedTagger(nn.Module):
    """An LSTM over ``pack_padded_sequence`` of unsorted lengths, the last hidden state classified,
    and the padded outputs unpacked for a per-token loss."""

    def __init__(self, vocab: int = 9, dim: int = 6):
        super().__init__()
        self.embed, self.rnn = nn.Embedding(vocab, dim, padding_idx=0), nn.LSTM(dim, dim, batch_first=True)
        self.head, self.tagger = nn.Linear(dim, 3), nn.Linear(dim, vocab)

    def forward(self, ids, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(self.embed(ids), lengths, batch_first=True, enforce_sorted=False)
        out, (h, _) = self.rnn(packed)
        padded, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=ids.shape[1])
        return self.head(h[-1]), self.tagger(padded)


class VectorQuantizer(nn.Module):
    """A VQ-VAE: the encoder's outputs snapped to the nearest code (straight through), the codebook
    moved by exponential moving averages of the assigned counts and sums kept as buffers the
    forward writes in place (``mul_``, ``index_add_``) in training."""

    def __init__(self, codes: int = 5, dim: int = 3, decay: float = 0.8):
        super().__init__()
        self.encoder, self.decoder, self.decay = mlp(6, 8, dim), mlp(dim, 8, 6), decay
        self.register_buffer("codebook", torch.randn(codes, dim))
        self.register_buffer("counts", torch.ones(codes))
        self.register_buffer("sums", self.codebook.clone())

    def forward(self, x):
        z = self.encoder(x)
        index = torch.cdist(z, self.codebook).argmin(1)
        q = self.codebook[index]
        if self.training:
            with torch.no_grad():
                self.counts.mul_(self.decay).index_add_(0, index, torch.full_like(index, 1 - self.decay, dtype=z.dtype))
                self.sums.mul_(self.decay).index_add_(0, index, (1 - self.decay) * z.detach())
                self.codebook.copy_(self.sums / self.counts.clamp_min(1e-3)[:, None])
        commitment = F.mse_loss(z, q.detach())
        out = self.decoder(z + (q - z).detach())
        return F.mse_loss(out, x) + 0.25 * commitment, index


def langevin(energy, x, steps: int = 3, size: float = 0.1):
    """Stochastic gradient Langevin dynamics on the input: the energy's input gradient, a step down
    it and Gaussian noise, written in place, the samples clamped."""
    x = x.clone()
    for _ in range(steps):
        x.requires_grad_()
        (grad,) = torch.autograd.grad(energy(x).sum(), x)
        x = x.detach()
        x.sub_(size * grad).add_(0.05 * torch.randn_like(x)).clamp_(-3, 3)
    return x


class SoftPrompt(nn.Module):
    """Prompt tuning: learned embeddings prepended to a frozen model's token embeddings."""

    def __init__(self, vocab: int = 11, dim: int = 8, prompt: int = 3):
        super().__init__()
        self.embed, self.mix, self.head = nn.Embedding(vocab, dim), nn.Linear(dim, dim), nn.Linear(dim, 3)
        self.requires_grad_(False)
        self.prompt = nn.Parameter(0.1 * torch.randn(prompt, dim))

    def forward(self, ids):
        h = torch.cat([self.prompt.expand(ids.shape[0], -1, -1), self.embed(ids)], 1)
        return self.head(torch.tanh(self.mix(h)).mean(1))


class Actor(nn.Module):
    """A squashed Gaussian policy (SAC's): ``rsample``, ``tanh``, the log-probability corrected."""

    def __init__(self):
        super().__init__()
        self.net = mlp(3, 8, 4)

    def forward(self, obs):
        mean, log_std = self.net(obs).chunk(2, -1)
        normal = torch.distributions.Normal(mean, log_std.clamp(-5, 2).exp())
        u = normal.rsample()
        action = torch.tanh(u)
        return action, (normal.log_prob(u) - torch.log1p(-action.square() + 1e-6)).sum(-1)


class TwinCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.q1, self.q2 = mlp(5, 8, 1), mlp(5, 8, 1)

    def forward(self, obs, action):
        sa = torch.cat([obs, action], -1)
        return self.q1(sa).squeeze(-1), self.q2(sa).squeeze(-1)


class Lookahead(torch.optim.Optimizer):
    """Lookahead as users wrap an optimizer: the inner optimizer's groups shared, slow weights kept
    in ``self.state``, pulled toward the fast ones every ``k`` steps and copied back."""

    def __init__(self, inner, k: int = 2, alpha: float = 0.5):
        super().__init__(inner.param_groups, inner.defaults)
        self.inner, self.k, self.alpha = inner, k, alpha
        self.param_groups, self.state = inner.param_groups, inner.state
        self.counter = 0

    def step(self, closure=None):
        loss = self.inner.step(closure)
        self.counter += 1
        if self.counter % self.k == 0:
            with torch.no_grad():
                for group in self.param_groups:
                    for p in group["params"]:
                        slow = self.state[p].setdefault("slow", p.detach().clone())
                        slow.add_(p - slow, alpha=self.alpha)
                        p.copy_(slow)
        return loss

    def zero_grad(self, set_to_none: bool = True):
        self.inner.zero_grad(set_to_none)


class CachedLM(nn.Module):
    """A causal language model with one attention head over a key/value cache passed in and
    returned (``torch.cat``), the positions offset by the cache's length."""

    def __init__(self, vocab: int = 11, dim: int = 8):
        super().__init__()
        self.embed, self.position = nn.Embedding(vocab, dim), nn.Embedding(24, dim)
        self.qkv, self.out, self.head = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), nn.Linear(dim, vocab)

    def forward(self, ids, keys, values):
        past, n = keys.shape[1], ids.shape[1]
        h = self.embed(ids) + self.position(torch.arange(past, past + n))
        q, k, v = self.qkv(h).chunk(3, -1)
        keys, values = torch.cat([keys, k], 1), torch.cat([values, v], 1)
        scores = q @ keys.transpose(1, 2) / math.sqrt(q.shape[-1])
        future = torch.arange(past + n)[None, :] > torch.arange(past, past + n)[:, None]
        attended = torch.softmax(scores.masked_fill(future, float("-inf")), -1) @ values
        return self.head(h + self.out(attended)), keys, values


def empty_cache(rows: int = 1, dim: int = 8):
    return torch.zeros(rows, 0, dim), torch.zeros(rows, 0, dim)


def speculative_cached(target, draft, prompt, rounds: int = 3, k: int = 3, temperature: float = 0.9):
    """Speculative sampling with caches: the draft proposes ``k`` tokens one at a time over its
    cache, the target scores them in one call over its own, each accepted with probability
    ``min(1, p / q)``; at the first rejection a token is drawn from ``max(p - q, 0)``; both caches
    are rolled back to the accepted prefix (sliced) and fed what they lack at the next round."""
    (tk, tv), (dk, dv), ids, accepted = empty_cache(), empty_cache(), prompt, []
    for _ in range(rounds):
        proposal, qs, feed = [], [], ids[:, dk.shape[1] :]
        for _ in range(k):
            logits, dk, dv = draft(feed, dk, dv)
            q = torch.softmax(logits[:, -1] / temperature, -1)
            feed = torch.multinomial(q, 1)
            proposal.append(feed)
            qs.append(q)
        logits, tk, tv = target(torch.cat([ids[:, tk.shape[1] :]] + proposal, 1), tk, tv)
        p = torch.softmax(logits[:, -k - 1 :] / temperature, -1)
        n = 0
        while n < k and torch.rand(1).item() < (p[0, n, proposal[n][0, 0]] / qs[n][0, proposal[n][0, 0]]).item():
            n += 1
        if n < k:
            residual = (p[:, n] - qs[n]).clamp_min(0)
            fresh = torch.multinomial(residual / residual.sum(-1, keepdim=True), 1)
        else:
            fresh = torch.multinomial(p[:, k], 1)
        kept = ids.shape[1] + n
        tk, tv, dk, dv = tk[:, :kept], tv[:, :kept], dk[:, :kept], dv[:, :kept]
        ids = torch.cat([ids] + proposal[:n] + [fresh], 1)
        accepted.append(n)
    return ids, accepted, tk.shape[1], dk.shape[1]


def beam_search_cached(model, prompt, beams: int = 3, new: int = 4):
    """Beam search over a key/value cache: after each step the beams' caches reordered by
    ``index_select`` on the surviving beams' parents."""
    keys, values = empty_cache(beams)
    logits, keys, values = model(prompt.repeat(beams, 1), keys, values)
    ids, scores = prompt.repeat(beams, 1), torch.tensor([0.0] + [float("-inf")] * (beams - 1))
    for _ in range(new):
        log_probs = torch.log_softmax(logits[:, -1], -1)
        vocab = log_probs.shape[-1]
        scores, flat = (scores[:, None] + log_probs).flatten().topk(beams)
        parents, tokens = flat // vocab, (flat % vocab)[:, None]
        ids = torch.cat([ids.index_select(0, parents), tokens], 1)
        keys, values = keys.index_select(0, parents), values.index_select(0, parents)
        logits, keys, values = model(tokens, keys, values)
    return ids, scores


def contrastive_decode(expert, amateur, prompt, new: int = 5, alpha: float = 0.1):
    """Contrastive decoding: greedy on the expert's log-probabilities minus the amateur's over the
    tokens the expert finds plausible (at least ``alpha`` times its most likely), both cached."""
    ek, ev = empty_cache(prompt.shape[0])
    ak, av = empty_cache(prompt.shape[0])
    ids, feed, picked = prompt, prompt, []
    for _ in range(new):
        e_logits, ek, ev = expert(feed, ek, ev)
        a_logits, ak, av = amateur(feed, ak, av)
        e, a = e_logits[:, -1].log_softmax(-1), a_logits[:, -1].log_softmax(-1)
        plausible = e >= e.max(-1, keepdim=True).values + math.log(alpha)
        score = (e - a).masked_fill(~plausible, float("-inf"))
        feed = score.argmax(-1, keepdim=True)
        picked.append(score.gather(1, feed))
        ids = torch.cat([ids, feed], 1)
    return ids, torch.cat(picked, 1)


def typical_sample(model, prompt, new: int = 5, mass: float = 0.8):
    """Locally typical sampling over the cache: the tokens whose surprisal is closest to the
    entropy kept until their probabilities reach ``mass``, then ``torch.multinomial``."""
    keys, values = empty_cache(prompt.shape[0])
    ids, feed = prompt, prompt
    for _ in range(new):
        logits, keys, values = model(feed, keys, values)
        log_p = logits[:, -1].log_softmax(-1)
        entropy = -(log_p.exp() * log_p).sum(-1, keepdim=True)
        order = (-log_p - entropy).abs().argsort(-1)
        sorted_p = log_p.exp().gather(1, order)
        cut = (sorted_p.cumsum(-1) - sorted_p) >= mass
        filtered = log_p.scatter(1, order, log_p.gather(1, order).masked_fill(cut, float("-inf")))
        feed = torch.multinomial(filtered.softmax(-1), 1)
        ids = torch.cat([ids, feed], 1)
    return ids


class StaticCachedLM(CachedLM):
    """``CachedLM`` over a static cache: key and value buffers of a fixed length the forward writes
    in place at the positions it is given (``index_copy_``), attending to the positions up to each
    query's; a rollback only moves the loop's position back (the stale entries stay, masked)."""

    def __init__(self, vocab: int = 11, dim: int = 8, size: int = 24):
        super().__init__(vocab, dim)
        self.register_buffer("keys", torch.zeros(1, size, dim))
        self.register_buffer("values", torch.zeros(1, size, dim))

    def forward(self, ids, positions):
        h = self.embed(ids) + self.position(positions)
        q, k, v = self.qkv(h).chunk(3, -1)
        self.keys.index_copy_(1, positions, k)
        self.values.index_copy_(1, positions, v)
        scores = q @ self.keys.transpose(1, 2) / math.sqrt(q.shape[-1])
        hidden = torch.arange(self.keys.shape[1])[None, :] > positions[:, None]
        attended = torch.softmax(scores.masked_fill(hidden, float("-inf")), -1) @ self.values
        return self.head(h + self.out(attended))


def speculative_static(target, draft, prompt, rounds: int = 4, k: int = 3, temperature: float = 0.9):
    """``speculative_cached`` over static caches: each model fed the tokens past its filled length
    at their positions; a rejection moves the filled lengths back to the accepted prefix."""
    filled, ids, accepted = [0, 0], prompt, []
    for _ in range(rounds):
        proposal, qs, feed, at = [], [], ids[:, filled[1] :], torch.arange(filled[1], ids.shape[1])
        for _ in range(k):
            q = torch.softmax(draft(feed, at)[:, -1] / temperature, -1)
            at = at[-1:] + 1
            feed = torch.multinomial(q, 1)
            proposal.append(feed)
            qs.append(q)
        fed = torch.cat([ids[:, filled[0] :]] + proposal, 1)
        logits = target(fed, torch.arange(filled[0], filled[0] + fed.shape[1]))
        p = torch.softmax(logits[:, -k - 1 :] / temperature, -1)
        n = 0
        while n < k and torch.rand(1).item() < (p[0, n, proposal[n][0, 0]] / qs[n][0, proposal[n][0, 0]]).item():
            n += 1
        residual = (p[:, n] - qs[n]).clamp_min(0) if n < k else p[:, k]
        fresh = torch.multinomial(residual / residual.sum(-1, keepdim=True), 1)
        filled = [ids.shape[1] + n, min(ids.shape[1] + n, ids.shape[1] + k - 1)]
        ids = torch.cat([ids] + proposal[:n] + [fresh], 1)
        accepted.append(n)
    return ids, accepted


class Adaptable(nn.Module):
    """A frozen body whose first layer a LoRA adapter (``A``, ``B``, hand-written) can be attached to
    mid-run, later merged into its weight in place and detached; a trainable head."""

    def __init__(self, rank: int = 2, alpha: float = 4.0):
        super().__init__()
        self.first, self.head = nn.Linear(4, 8), nn.Linear(8, 3)
        self.first.requires_grad_(False)
        self.adapter: nn.ParameterDict | None = None
        self.rank, self.scale = rank, alpha / rank

    def attach(self) -> list:
        self.adapter = nn.ParameterDict(
            {"A": nn.Parameter(0.3 * torch.randn(self.rank, 4)), "B": nn.Parameter(torch.zeros(8, self.rank))}
        )
        return list(self.adapter.values())

    @torch.no_grad()
    def merge(self) -> None:
        self.first.weight.add_(self.adapter["B"] @ self.adapter["A"] * self.scale)
        self.adapter = None

    def forward(self, x):
        h = self.first(x)
        if self.adapter is not None:
            h = h + x @ self.adapter["A"].T @ self.adapter["B"].T * self.scale
        return self.head(torch.relu(h))


def symmetric_kl(a, b):
    """R-Drop's: the KL of each log-softmax to the other (``log_target``)."""
    la, lb = a.log_softmax(-1), b.log_softmax(-1)
    return F.kl_div(la, lb, log_target=True, reduction="batchmean") + F.kl_div(
        lb, la, log_target=True, reduction="batchmean"
    )


def symmetric_kl_of_probabilities(a, b):
    pa, pb = a.softmax(-1), b.softmax(-1)
    return F.kl_div(pb.log(), pa, reduction="batchmean") + F.kl_div(pa.log(), pb, reduction="batchmean")


def poisson_both_ways(a, b):
    t = b.exp()
    return F.poisson_nll_loss(a, t, full=True) + F.poisson_nll_loss(t, a.exp() + 2, log_input=False)
