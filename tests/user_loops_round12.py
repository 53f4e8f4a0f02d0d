"""Programs of ``test_user_loops_round12.py``: hand-written key/value-cache decoders as serving code
writes them (a preallocated cache written in place, read through ``torch.narrow`` views, the
position a Python int or a tensor; slots of a batch that finish at different steps; a ring buffer
for a sliding window; beams reordering the cache in place) and the loops around them: prefill then
decode, continuous batching, speculative decoding with rollback, generation then training."""

import math

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, HEADS, LENGTH = 13, 16, 2, 32


class Attention(nn.Module):
    """Two heads over a cache of ``(slots, heads, LENGTH, head_dim)`` buffers; an optional LoRA on
    the query projection (``lora_a``/``lora_b``, scaled by ``self.scale``)."""

    def __init__(self, slots: int, lora: int = 0):
        super().__init__()
        self.qkv, self.out = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.register_buffer("keys", torch.zeros(slots, HEADS, LENGTH, DIM // HEADS))
        self.register_buffer("values", torch.zeros(slots, HEADS, LENGTH, DIM // HEADS))
        self.lora_a = nn.Parameter(torch.randn(lora, DIM) * 0.3) if lora else None
        self.lora_b = nn.Parameter(torch.randn(3 * DIM, lora) * 0.3) if lora else None
        self.scale = 1.0

    def project(self, h):
        """Queries, keys and values of ``h`` as ``(batch, heads, n, head_dim)``."""
        qkv = self.qkv(h)
        if self.lora_a is not None and self.scale:
            qkv = qkv + self.scale * (h @ self.lora_a.t() @ self.lora_b.t())
        b, n = h.shape[:2]
        return qkv.view(b, n, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4).unbind(0)

    def attend(self, q, keys, values, hidden):
        scores = q @ keys.transpose(-1, -2) / math.sqrt(q.shape[-1])
        out = torch.softmax(scores.masked_fill(hidden, float("-inf")), -1) @ values
        return self.out(out.transpose(1, 2).flatten(2))


class Decoder(nn.Module):
    """A two-layer decoder over preallocated caches. ``forward(ids, start)`` feeds ``ids`` at
    positions ``start``.. of every slot: ``start`` a Python int (written through ``narrow``) or a
    1-d tensor of positions (``index_copy_``); ``detach_cache`` writes detached keys, so that
    the cache holds no graph when a training step runs over it."""

    def __init__(self, slots: int = 2, lora: int = 0, detach_cache: bool = True):
        super().__init__()
        self.embed, self.position = nn.Embedding(VOCAB, DIM), nn.Embedding(LENGTH, DIM)
        self.layers = nn.ModuleList(Attention(slots, lora) for _ in range(2))
        self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)
        self.detach_cache = detach_cache

    def forward(self, ids, start):
        n = ids.shape[1]
        positions = torch.arange(start, start + n) if isinstance(start, int) else start
        h = self.embed(ids) + self.position(positions)
        for layer in self.layers:
            q, k, v = layer.project(h)
            k, v = (k.detach(), v.detach()) if self.detach_cache else (k, v)
            if isinstance(start, int):
                layer.keys.narrow(2, start, n).copy_(k)
                layer.values.narrow(2, start, n).copy_(v)
                keys, values = layer.keys.narrow(2, 0, start + n), layer.values.narrow(2, 0, start + n)
                hidden = torch.arange(start + n)[None, :] > positions[:, None]
            else:
                layer.keys.index_copy_(2, positions, k)
                layer.values.index_copy_(2, positions, v)
                keys, values = layer.keys, layer.values
                hidden = torch.arange(LENGTH)[None, :] > positions[:, None]
            h = h + layer.attend(q, keys, values, hidden)
        return self.head(self.norm(h))

    def keys_too(self, ids, start: int):
        """The logits and the first layer's keys so far, a ``narrow`` view of its buffer."""
        return self(ids, start), self.layers[0].keys.narrow(2, 0, start + ids.shape[1])


class LazyCacheDecoder(Decoder):
    """``Decoder`` whose cache tensors its first call makes (plain attributes, not buffers): made
    under ``inference_mode``, they are inference tensors, which eager refuses to write outside it."""

    def __init__(self):
        super().__init__()
        for layer in self.layers:
            del layer.keys, layer.values
            layer.keys = layer.values = None

    def forward(self, ids, start):
        for layer in self.layers:
            if layer.keys is None:
                layer.keys, layer.values = (torch.zeros(2, HEADS, LENGTH, DIM // HEADS) for _ in range(2))
        return super().forward(ids, start)


class IntCountingDecoder(Decoder):
    """``Decoder`` keeping its position as a Python int attribute that each call advances."""

    def __init__(self):
        super().__init__()
        self.pos = 0

    def forward(self, ids, start=None):
        logits = super().forward(ids, self.pos)
        self.pos += ids.shape[1]
        return logits


class TensorStartDecoder(Decoder):
    """``Decoder`` fed its start as a 0-d tensor: keys written through ``narrow(2, start, n)``,
    values by a slice assignment ``[start : start + n]``; the whole buffers attended (masked)."""

    def forward(self, ids, start):
        n = ids.shape[1]
        positions = start + torch.arange(n)
        h = self.embed(ids) + self.position(positions)
        hidden = torch.arange(LENGTH)[None, :] > positions[:, None]
        for layer in self.layers:
            q, k, v = layer.project(h)
            layer.keys.narrow(2, start, n).copy_(k)
            layer.values[:, :, start : start + n] = v
            h = h + layer.attend(q, layer.keys, layer.values, hidden)
        return self.head(self.norm(h))


class GrowingAttention(nn.Module):
    """One head over keys and values grown by ``torch.cat``, wherever the caller keeps them."""

    def __init__(self):
        super().__init__()
        self.embed, self.kv, self.head = nn.Embedding(VOCAB, DIM), nn.Linear(DIM, 2 * DIM), nn.Linear(DIM, VOCAB)

    def step(self, ids, keys, values):
        h = self.embed(ids)
        k, v = self.kv(h).chunk(2, -1)
        keys, values = torch.cat([keys, k], 1), torch.cat([values, v], 1)
        attended = torch.softmax(h @ keys.transpose(1, 2) / math.sqrt(DIM), -1) @ values
        return self.head(h + attended), keys, values


class CachedOnModule(GrowingAttention):
    """The cache rebound on the module each call: ``self.keys = torch.cat([self.keys, k], 1)``."""

    def __init__(self):
        super().__init__()
        self.keys, self.values = torch.zeros(2, 0, DIM), torch.zeros(2, 0, DIM)

    def forward(self, ids, start=None):
        logits, self.keys, self.values = self.step(ids, self.keys, self.values)
        return logits


class DictCached(GrowingAttention):
    """The cache a dict the caller passes, its items rebound by the call."""

    def forward(self, ids, cache):
        logits, cache["keys"], cache["values"] = self.step(ids, cache["keys"], cache["values"])
        return logits


class CountingDecoder(Decoder):
    """``Decoder`` keeping its own position as a buffer (``filled``, a 1-element tensor) that each
    call advances in place: the loop passes only tokens; ``rewind(n)`` moves it back."""

    def __init__(self, slots: int = 2):
        super().__init__(slots)
        self.register_buffer("filled", torch.zeros(1, dtype=torch.long))

    def forward(self, ids):
        positions = self.filled + torch.arange(ids.shape[1])
        logits = super().forward(ids, positions)
        self.filled += ids.shape[1]
        return logits


class SlottedDecoder(Decoder):
    """Continuous batching: every slot at its own length (``lengths``, a tensor the loop keeps).
    ``decode(ids, lengths)`` feeds one token per slot at its length (advanced-index writes);
    ``prefill(ids, slot)`` writes a new request's prompt into one slot (a Python int)."""

    def decode(self, ids, lengths):
        rows = torch.arange(ids.shape[0])
        h = self.embed(ids) + self.position(lengths)[:, None]
        hidden = (torch.arange(LENGTH)[None, :] > lengths[:, None])[:, None, None]
        for layer in self.layers:
            q, k, v = layer.project(h)
            layer.keys[rows, :, lengths] = k[:, :, 0]
            layer.values[rows, :, lengths] = v[:, :, 0]
            h = h + layer.attend(q, layer.keys, layer.values, hidden)
        return self.head(self.norm(h))[:, -1]

    def prefill(self, ids, slot: int):
        n = ids.shape[1]
        h = self.embed(ids) + self.position(torch.arange(n))
        hidden = torch.arange(n)[None, :] > torch.arange(n)[:, None]
        for layer in self.layers:
            q, k, v = layer.project(h)
            layer.keys[slot, :, :n] = k[0]
            layer.values[slot, :, :n] = v[0]
            h = h + layer.attend(q, k, v, hidden)
        return self.head(self.norm(h))[:, -1]

    def forward(self, ids, lengths):
        return self.decode(ids, lengths)


class RingDecoder(Decoder):
    """A sliding window of ``window`` positions kept in a ring buffer: position ``p`` is written at
    ``p % window`` (one token a call, ``p`` a 0-d tensor), attending to the last ``window``."""

    def __init__(self, window: int = 5):
        super().__init__(slots=1)
        self.window = window

    def forward(self, ids, p):
        h = self.embed(ids) + self.position(p)[None, None]
        slot = (p % self.window)[None]
        stored = torch.arange(self.window)
        age = (slot - stored) % self.window  # how far back each ring entry was written
        hidden = (age > p)[None, None, None]  # entries not written yet
        for layer in self.layers:
            q, k, v = layer.project(h)
            layer.keys.index_copy_(2, slot, k)
            layer.values.index_copy_(2, slot, v)
            keys, values = layer.keys.narrow(2, 0, self.window), layer.values.narrow(2, 0, self.window)
            h = h + layer.attend(q, keys, values, hidden)
        return self.head(self.norm(h))[:, -1]


class BeamDecoder(Decoder):
    """``Decoder`` whose step first reorders every slot's cache in place by the beams' parents."""

    def forward(self, ids, start: int, parents):
        for layer in self.layers:
            layer.keys.copy_(layer.keys.index_select(0, parents))
            layer.values.copy_(layer.values.index_select(0, parents))
        return super().forward(ids, start)


def prefill_and_decode(call, prompt, new: int = 6, as_tensor: bool = False):
    """Greedy: the prompt at 0, then one token a call at its position (an int, or a tensor)."""
    logits, start, out = call(prompt, torch.arange(prompt.shape[1]) if as_tensor else 0), prompt.shape[1], []
    for _ in range(new):
        token = logits[:, -1:].argmax(-1)
        out.append(token)
        logits = call(token, torch.tensor([start]) if as_tensor else start)
        start += 1
    return torch.cat(out, 1), logits


def sampled_decode(call, prompt, generator, new: int = 6, top_k: int = 5, temperature: float = 0.8):
    """Top-k sampling from a seeded generator, ``narrow`` positions as ints."""
    logits, start, out = call(prompt, 0), prompt.shape[1], []
    for _ in range(new):
        top = (logits[:, -1] / temperature).topk(top_k)
        pick = torch.multinomial(top.values.softmax(-1), 1, generator=generator)
        token = top.indices.gather(1, pick)
        out.append(token)
        logits = call(token, start)
        start += 1
    return torch.cat(out, 1)


def counted_decode(call, model, prompt, rewind_at: int = 3, new: int = 6):
    """``CountingDecoder``'s loop: prompt, tokens; once, its position moved back two (a retry)."""
    logits, out = call(prompt), []
    for i in range(new):
        token = logits[:, -1:].argmax(-1)
        out.append(token)
        if i == rewind_at:
            model.filled.sub_(2)
        logits = call(token)
    return torch.cat(out, 1), logits


def fed_one_by_one(call, prompt, new: int = 5, start=int):
    """Greedy: the prompt, then a token a call; ``start(i)`` makes the position argument."""
    logits, out = call(prompt, start(0) if start else None), []
    for i in range(new):
        token = logits[:, -1:].argmax(-1)
        out.append(token)
        logits = call(token, start(prompt.shape[1] + i) if start else None)
    return torch.cat(out, 1), logits


def continuous_batching(decode, prefill, requests, budgets, eos: int = 0):
    """Two slots served from a queue of prompts: a slot's request ends at ``eos`` or its budget,
    and the next request is prefilled into it; the others keep decoding. Returns each request's
    tokens, in the order they finished."""
    queue, done = list(zip(requests, budgets)), []
    slots: list = [None, None]
    lengths, tokens = torch.zeros(2, dtype=torch.long), torch.zeros(2, 1, dtype=torch.long)
    while queue or any(s is not None for s in slots):
        for i in range(2):
            if slots[i] is None and queue:
                prompt, budget = queue.pop(0)
                last = prefill(prompt, i)
                tokens[i, 0] = last.argmax(-1)[0]
                lengths[i] = prompt.shape[1]
                slots[i] = ([int(tokens[i, 0])], budget)
        logits = decode(tokens, lengths)
        lengths = lengths + 1
        tokens = logits.argmax(-1, keepdim=True)
        for i in range(2):
            if slots[i] is None:
                continue
            got, budget = slots[i]
            got.append(int(tokens[i, 0]))
            if got[-1] == eos or len(got) >= budget:
                done.append(got)
                slots[i] = None
    return done


def speculative_greedy(target, draft, prompt, rounds: int = 4, k: int = 3):
    """Greedy speculative decoding over two ``Decoder``s (positions as ints): the draft proposes
    ``k`` tokens, the target checks them in one call and keeps the agreeing prefix plus its own
    next token; both caches roll back by their filled length (the stale entries overwritten)."""
    ids, filled, accepted = prompt, [0, 0], []
    for _ in range(rounds):
        feed, proposal = ids[:, filled[1] :], []
        for _ in range(k):
            logits = draft(feed, filled[1])
            filled[1] += feed.shape[1]
            feed = logits[:, -1:].argmax(-1)
            proposal.append(feed)
        fed = torch.cat([ids[:, filled[0] :]] + proposal, 1)
        checked = target(fed, filled[0])[:, -k - 1 :].argmax(-1)
        guesses = torch.cat(proposal, 1)
        n = int((checked[:, :k] == guesses).cumprod(1).sum())
        ids = torch.cat([ids, guesses[:, :n], checked[:, n : n + 1]], 1)
        filled = [ids.shape[1] - 1, min(filled[1], ids.shape[1] - 1)]
        accepted.append(n)
    return ids, accepted


def ring_decode(call, prompt, new: int = 9):
    """Tokens fed one by one through the ring (the prompt too), greedy after it."""
    out, token = [], prompt[:, :1]
    for p in range(prompt.shape[1] + new):
        logits = call(token, torch.tensor(p))
        token = prompt[:, p + 1 : p + 2] if p + 1 < prompt.shape[1] else logits.argmax(-1, keepdim=True)
        out.append(token)
    return torch.cat(out, 1)


def beam_decode(call, prompt, beams: int = 3, new: int = 5):
    """Beam search over ``BeamDecoder``: the prompt's cache in every slot, then each step's
    parents reorder the caches before the beams' tokens are fed."""
    logits = call(prompt.repeat(beams, 1), 0, torch.arange(beams))
    ids, scores, start = prompt.repeat(beams, 1), torch.tensor([0.0] + [-math.inf] * (beams - 1)), prompt.shape[1]
    for _ in range(new):
        log_probs = logits[:, -1].log_softmax(-1)
        scores, flat = (scores[:, None] + log_probs).flatten().topk(beams)
        parents, tokens = flat // VOCAB, (flat % VOCAB)[:, None]
        ids = torch.cat([ids.index_select(0, parents), tokens], 1)
        logits = call(tokens, start, parents)
        start += 1
    return ids, scores


def lm_loss(call, ids):
    """Next-token cross-entropy of ``ids`` fed from position 0 (the cache overwritten)."""
    logits = call(ids[:, :-1], 0)
    return F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())


def rotary_frequencies(dim: int, end: int, theta: float = 10000.0):
    """Complex rotations ``e^{i t f}`` for positions ``t < end`` (Meta's reference Llama)."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    angles = torch.outer(torch.arange(end), freqs).float()
    return torch.polar(torch.ones_like(angles), angles)


def rotated(x, rotations):
    """``x``'s pairs of features as complex numbers, rotated, back to real (``view_as_complex``)."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * rotations.view(1, pairs.shape[1], 1, pairs.shape[-1])).flatten(3).type_as(x)


class ReferenceAttention(nn.Module):
    """Grouped-query attention as Meta's reference Llama writes it: caches of ``(max_batch,
    max_seq, kv_heads, head_dim)`` kept as plain attributes, rebound by ``.to(xq)`` each call,
    written by slice assignment at ``start_pos`` (a Python int), the keys repeated per group."""

    def __init__(self, dim: int = 32, heads: int = 4, kv_heads: int = 2, max_batch: int = 3, max_seq: int = 24):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.cache_k = torch.zeros(max_batch, max_seq, kv_heads, self.head_dim)
        self.cache_v = torch.zeros(max_batch, max_seq, kv_heads, self.head_dim)

    def forward(self, x, start_pos: int, rotations, mask):
        b, n, _ = x.shape
        xq = rotated(self.wq(x).view(b, n, self.heads, self.head_dim), rotations)
        xk = rotated(self.wk(x).view(b, n, self.kv_heads, self.head_dim), rotations)
        xv = self.wv(x).view(b, n, self.kv_heads, self.head_dim)
        self.cache_k, self.cache_v = self.cache_k.to(xq), self.cache_v.to(xq)
        self.cache_k[:b, start_pos : start_pos + n] = xk
        self.cache_v[:b, start_pos : start_pos + n] = xv
        repeat = self.heads // self.kv_heads
        keys = self.cache_k[:b, : start_pos + n].repeat_interleave(repeat, 2).transpose(1, 2)
        values = self.cache_v[:b, : start_pos + n].repeat_interleave(repeat, 2).transpose(1, 2)
        scores = xq.transpose(1, 2) @ keys.transpose(2, 3) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask
        out = F.softmax(scores.float(), dim=-1).type_as(xq) @ values
        return self.wo(out.transpose(1, 2).contiguous().view(b, n, -1))


class ReferenceLlama(nn.Module):
    """Meta's reference Llama in small: its ``forward`` decorated ``@torch.inference_mode()``,
    the rotations sliced at ``start_pos``, a mask only for a prompt (``hstack`` of zeros for the
    cached positions and a ``triu`` of -inf)."""

    def __init__(self, vocab: int = 50, dim: int = 32, layers: int = 2):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(ReferenceAttention(dim) for _ in range(layers))
        self.norm, self.output = nn.RMSNorm(dim, eps=1e-5), nn.Linear(dim, vocab, bias=False)
        self.freqs_cis = rotary_frequencies(dim // 4, 48)

    @torch.inference_mode()
    def forward(self, tokens, start_pos: int):
        n = tokens.shape[1]
        h = self.tok_embeddings(tokens)
        rotations, mask = self.freqs_cis[start_pos : start_pos + n], None
        if n > 1:
            mask = torch.triu(torch.full((n, n), float("-inf")), diagonal=1)
            mask = torch.hstack([torch.zeros((n, start_pos)), mask]).type_as(h)
        for layer in self.layers:
            h = h + layer(h, start_pos, rotations, mask)
        return self.output(self.norm(h)).float()


def reference_generate(call, prompts, pad: int = 0, new: int = 6, eos: int = 13, temperature: float = 0.8):
    """Meta's reference ``generate``: prompts of several lengths in one token buffer, fed from
    the shortest prompt's end (``tokens[:, prev_pos:cur_pos]``), each row keeping its prompt's
    tokens until its own prompt ends, sampled after, stopping when every row has met ``eos``."""
    shortest, longest = min(map(len, prompts)), max(map(len, prompts))
    tokens = torch.full((len(prompts), longest + new), pad, dtype=torch.long)
    for k, t in enumerate(prompts):
        tokens[k, : len(t)] = torch.tensor(t, dtype=torch.long)
    prev_pos, ended, given, logits_seen = 0, torch.zeros(len(prompts), dtype=torch.bool), tokens != pad, []
    with torch.inference_mode():
        for cur_pos in range(shortest, tokens.shape[1]):
            logits = call(tokens[:, prev_pos:cur_pos], prev_pos)
            sampled = torch.multinomial(torch.softmax(logits[:, -1] / temperature, dim=-1), num_samples=1).reshape(-1)
            tokens[:, cur_pos] = torch.where(given[:, cur_pos], tokens[:, cur_pos], sampled)
            ended |= ~given[:, cur_pos] & (tokens[:, cur_pos] == eos)
            prev_pos = cur_pos
            logits_seen.append(logits)
            if all(ended):
                break
    return tokens, logits_seen
