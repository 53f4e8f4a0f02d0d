"""Small models as users write them (a VAE, a graph network, CLIP, an actor-critic policy, ...), for
the training programs of ``test_user_programs.py``."""

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pad_packed_sequence


class VAE(nn.Module):
    """Encoder to a mean and log-variance, a reparametrised sample, a Bernoulli decoder; the loss
    is the reconstruction plus the KL divergence to the unit normal."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 8))
        self.decoder = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 12))

    def forward(self, x):
        mu, logvar = self.encoder(x).chunk(2, dim=-1)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        recon = self.decoder(z)
        reconstruction = F.binary_cross_entropy_with_logits(recon, x, reduction="sum") / x.shape[0]
        kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp(), dim=1).mean()
        return reconstruction + kl, recon


class GraphNet(nn.Module):
    """Two GCN layers over an edge list (degree-normalised messages gathered with index_select and
    summed with index_add_) and a max-pool of two graphs with scatter_reduce."""

    def __init__(self):
        super().__init__()
        self.lin1 = nn.Linear(6, 8)
        self.lin2 = nn.Linear(8, 3)

    @staticmethod
    def conv(x, edges, lin):
        src, dst = edges
        deg = torch.zeros(x.shape[0], dtype=x.dtype).index_add_(0, dst, torch.ones_like(dst, dtype=x.dtype)) + 1
        norm = deg.rsqrt()
        h = lin(x)
        messages = h.index_select(0, src) * (norm[src] * norm[dst]).unsqueeze(-1)
        return torch.zeros_like(h).index_add_(0, dst, messages) + h / deg.unsqueeze(-1)

    def forward(self, x, edges, labels):
        h = F.relu(self.conv(x, edges, self.lin1))
        graph = torch.arange(h.shape[0]) * 2 // h.shape[0]
        pooled = h.new_zeros(2, h.shape[1]).scatter_reduce(
            0, graph[:, None].expand_as(h), h, reduce="amax", include_self=False
        )
        logits = self.conv(h, edges, self.lin2)
        return F.cross_entropy(logits, labels) + pooled.sum() * 0.01, logits


class Clip(nn.Module):
    """Image and text towers to normalised embeddings; the logits are their cosine similarities
    scaled by a learnt temperature clamped at 100, the loss cross-entropy both ways."""

    def __init__(self):
        super().__init__()
        self.image = nn.Sequential(nn.Linear(10, 16), nn.GELU(), nn.Linear(16, 8))
        self.text = nn.Sequential(nn.Embedding(20, 16), nn.LayerNorm(16))
        self.text_projection = nn.Linear(16, 8, bias=False)
        self.logit_scale = nn.Parameter(torch.ones([]) * math.log(1 / 0.07))

    def forward(self, images, tokens):
        image = F.normalize(self.image(images), dim=-1)
        text = F.normalize(self.text_projection(self.text(tokens).mean(1)), dim=-1)
        logits = self.logit_scale.exp().clamp(max=100) * image @ text.t()
        labels = torch.arange(images.shape[0])
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2, logits


class Policy(nn.Module):
    """An actor-critic with a categorical and a normal action head: the policy-gradient loss with
    the advantage detached, the value loss and an entropy bonus; also returns fresh actions."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 16), nn.Tanh())
        self.logits = nn.Linear(16, 3)
        self.mean = nn.Linear(16, 2)
        self.log_std = nn.Parameter(torch.zeros(2))
        self.value = nn.Linear(16, 1)

    def forward(self, obs, actions, controls, returns):
        h = self.body(obs)
        discrete = torch.distributions.Categorical(logits=self.logits(h))
        continuous = torch.distributions.Normal(self.mean(h), self.log_std.exp())
        log_prob = discrete.log_prob(actions) + continuous.log_prob(controls).sum(-1)
        value = self.value(h).squeeze(-1)
        advantage = (returns - value).detach()
        entropy = discrete.entropy().mean() + continuous.entropy().sum(-1).mean()
        loss = -(log_prob * advantage).mean() + 0.5 * F.mse_loss(value, returns) - 0.01 * entropy
        return loss, discrete.sample(), continuous.rsample()


class TextClassifier(nn.Module):
    """A transformer encoder over padded token sequences (``src_key_padding_mask``), mean-pooled
    over the kept tokens into class logits."""

    def __init__(self, norm_first: bool, nested: bool = False):
        super().__init__()
        self.embedding = nn.Embedding(20, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True, norm_first=norm_first)
        self.encoder = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(16), enable_nested_tensor=nested)
        self.head = nn.Linear(16, 3)

    def forward(self, tokens, padding):
        h = self.encoder(self.embedding(tokens), src_key_padding_mask=padding)
        kept = (~padding).unsqueeze(-1).to(h.dtype)
        return self.head((h * kept).sum(1) / kept.sum(1))


def padded_tokens(lengths: list, length: int = 7):
    """Random tokens and their padding mask (True past each row's length)."""
    padding = torch.arange(length) >= torch.tensor(lengths)[:, None]
    return torch.randint(0, 20, (len(lengths), length)), padding


class MaskedLM(nn.Module):
    """A masked-language-model step: 30% of the tokens, drawn with ``torch.bernoulli`` from the
    caller's generator, replaced by a mask token and predicted."""

    def __init__(self, vocab: int = 30):
        super().__init__()
        self.vocab = vocab
        self.embedding = nn.Embedding(vocab, 16)
        self.position = nn.Parameter(torch.randn(8, 16) * 0.02)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, activation="gelu")
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.lm_head = nn.Linear(16, vocab)

    def forward(self, tokens, generator):
        masked = torch.bernoulli(torch.full(tokens.shape, 0.3), generator=generator).bool()
        inputs = tokens.masked_fill(masked, self.vocab - 1)
        labels = tokens.masked_fill(~masked, -100)
        logits = self.lm_head(self.encoder(self.embedding(inputs) + self.position))
        return F.cross_entropy(logits.view(-1, self.vocab), labels.view(-1)), masked


class Seq2Seq(nn.Module):
    """A bidirectional encoder over a packed batch of token ids (embedded as packed data) and a
    decoder fed the targets shifted by one (teacher forcing)."""

    def __init__(self, cell: str):
        super().__init__()
        rnn = getattr(nn, cell)
        self.embedding = nn.Embedding(12, 8)
        self.encoder = rnn(8, 16, batch_first=True, bidirectional=True)
        self.bridge = nn.Linear(32, 16)
        self.decoder = rnn(8, 16, batch_first=True)
        self.out = nn.Linear(16, 12)

    def forward(self, source: PackedSequence, target):
        embedded = PackedSequence(
            self.embedding(source.data), source.batch_sizes, source.sorted_indices, source.unsorted_indices
        )
        encoded, last = self.encoder(embedded)
        encoded, _ = pad_packed_sequence(encoded, batch_first=True)
        last = last[0] if isinstance(last, tuple) else last
        state = torch.tanh(self.bridge(torch.cat([last[0], last[1]], -1)))[None]
        if isinstance(self.decoder, nn.LSTM):
            state = (state, torch.zeros_like(state))
        decoded, _ = self.decoder(self.embedding(target[:, :-1]), state)
        logits = self.out(decoded)
        return F.cross_entropy(logits.reshape(-1, 12), target[:, 1:].reshape(-1), ignore_index=0), encoded


class SpectralMask(nn.Module):
    """Speech enhancement: a mask predicted by 1-d convolutions over the log magnitude of the STFT,
    applied to the spectrum, and the waveform resynthesised with the inverse STFT."""

    def __init__(self):
        super().__init__()
        self.register_buffer("window", torch.hann_window(32))
        self.net = nn.Sequential(nn.Conv1d(17, 24, 3, padding=1), nn.ReLU(), nn.Conv1d(24, 17, 3, padding=1))

    def forward(self, wave):
        spectrum = torch.stft(wave, n_fft=32, hop_length=8, window=self.window, return_complex=True)
        magnitude = spectrum.abs()
        mask = torch.sigmoid(self.net(torch.log1p(magnitude)))
        length = wave.shape[-1]
        enhanced = torch.istft(spectrum * mask, n_fft=32, hop_length=8, window=self.window, length=length)
        return F.l1_loss(enhanced, wave), magnitude


def gan(dtype):
    """A generator (with batch norm) and a discriminator (with dropout) of 6-d samples."""
    generator = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.LeakyReLU(0.2), nn.Linear(16, 6), nn.Tanh())
    discriminator = nn.Sequential(nn.Linear(6, 16), nn.LeakyReLU(0.2), nn.Dropout(0.3), nn.Linear(16, 1))
    return generator.to(dtype), discriminator.to(dtype)


class Siamese(nn.Module):
    """Metric learning: one embedding network for anchors, positives and negatives; a triplet
    margin loss plus a contrastive loss over the anchors' cosine similarities to the positives."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))

    def forward(self, anchor, positive, negative):
        a, p, n = self.embed(anchor), self.embed(positive), self.embed(negative)
        similarity = F.cosine_similarity(a[:, None], p[None], dim=-1) / 0.1
        contrastive = F.cross_entropy(similarity, torch.arange(a.shape[0]))
        return F.triplet_margin_loss(a, p, n, margin=0.5) + contrastive, similarity


class MultiLabelTagger(nn.Module):
    """Tags each of a batch of documents (bags of token embeddings) with any of 20 labels."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(50, 16)
        self.head = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 20))

    def forward(self, tokens, labels):
        logits = self.head(self.embedding(tokens).mean(1))
        return F.multilabel_soft_margin_loss(logits, labels), logits
