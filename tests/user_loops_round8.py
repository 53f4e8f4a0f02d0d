"""The models and harnesses of ``test_user_loops_round8.py`` (training loops: ``user_loops_round6.py``'s
harness, ``user_loops_round7.py``'s loop maker): a token-level language model, LoRA, DINO's heads,
tiny Hugging Face configs, and a harness running one generation recipe eager, over the model
jitted and over its forward compiled by ``torch.compile(backend="thunder_rs")``, comparing what it
returns and the random state after it, and reading the compile counts."""

import torch
import torch.nn.functional as F
from torch import nn

import thunder_rs
from thunder_rs.dynamo import compiled_graphs

VOCAB = 99
PAD = -100


class TokenLM(nn.Module):
    """A small language model whose forward returns the summed cross entropy over the tokens that
    are not padding (``PAD`` targets), for a loss scaled by the number of tokens of the whole
    accumulated batch."""

    def __init__(self, vocab: int = 13, dim: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids, targets):
        logits = self.head(F.gelu(self.mix(self.embed(ids))))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=PAD, reduction="sum")


def token_batch(rows: int = 3, length: int = 5, vocab: int = 13):
    """Ids and targets with a random number of padded targets at the end of each row."""
    ids = torch.randint(0, vocab, (rows, length))
    targets = torch.randint(0, vocab, (rows, length))
    lengths = torch.randint(1, length + 1, (rows,))
    targets[torch.arange(length)[None, :] >= lengths[:, None]] = PAD
    return ids, targets


class LoRALinear(nn.Module):
    """A frozen base ``Linear`` and a trainable low-rank ``B @ A``, merged into the base's weight
    (and the adapter then skipped) or unmerged by the user between phases."""

    def __init__(self, inputs: int = 4, outputs: int = 6, rank: int = 2, alpha: float = 4.0):
        super().__init__()
        self.base = nn.Linear(inputs, outputs)
        self.base.requires_grad_(False)
        self.A = nn.Parameter(torch.randn(rank, inputs) * 0.3)
        self.B = nn.Parameter(torch.randn(outputs, rank) * 0.1)
        self.scale = alpha / rank
        self.merged = False

    def forward(self, x):
        out = self.base(x)
        if not self.merged:
            out = out + (x @ self.A.T @ self.B.T) * self.scale
        return out

    @torch.no_grad()
    def merge(self):
        self.base.weight += (self.B @ self.A) * self.scale
        self.merged = True

    @torch.no_grad()
    def unmerge(self):
        self.base.weight -= (self.B @ self.A) * self.scale
        self.merged = False


class LoRAClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.adapted = LoRALinear()
        self.head = nn.Linear(6, 3)
        self.head.requires_grad_(False)

    def forward(self, x):
        return self.head(torch.tanh(self.adapted(x)))


class DinoHead(nn.Module):
    """A backbone and a projection to ``prototypes`` logits, normalized in between (DINO's head)."""

    def __init__(self, inputs: int = 6, prototypes: int = 5):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(inputs, 8), nn.GELU(), nn.Linear(8, 8))
        self.prototypes = nn.Linear(8, prototypes, bias=False)

    def forward(self, x):
        return self.prototypes(F.normalize(self.backbone(x), dim=-1))


# ------------------------------------------------------------------------------- generation

COMMON = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2)
LLAMA = dict(
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_size=32,
    intermediate_size=64,
    max_position_embeddings=128,
    **COMMON,
)


def tiny(name: str, layers: int = 2, dropout: float = 0.0) -> nn.Module:
    """A tiny model of ``name`` ("gpt2", "llama", "t5") from seed 0, in eval mode."""
    import transformers as T

    torch.manual_seed(0)
    if name == "gpt2":
        drops = dict(resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
        config = T.GPT2Config(n_layer=layers, n_head=4, n_embd=32, n_positions=128, **drops, **COMMON)
        return T.GPT2LMHeadModel(config).eval()
    if name == "llama":
        config = T.LlamaConfig(**dict(LLAMA, num_hidden_layers=layers, attention_dropout=dropout))
        return T.LlamaForCausalLM(config).eval()
    config = T.T5Config(
        num_layers=layers,
        num_heads=2,
        d_model=32,
        d_kv=16,
        d_ff=64,
        decoder_start_token_id=0,
        dropout_rate=dropout,
        **COMMON,
    )
    return T.T5ForConditionalGeneration(config).eval()


def prompts(seed: int = 1) -> dict:
    """Three prompts of 7, 4 and 6 tokens, padded on the left (a T5 source: on the right)."""
    ids = torch.randint(3, VOCAB, (3, 7), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    for row, pads in ((1, 3), (2, 1)):
        ids[row, :pads], mask[row, :pads] = 0, 0
    return dict(input_ids=ids, attention_mask=mask)


def source() -> dict:
    ids = torch.randint(3, VOCAB, (3, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[1, 4:], mask[1, 4:] = 0, 0
    return dict(input_ids=ids, attention_mask=mask)


def same(got, expected, path: str = "result", **tol) -> None:
    """Tensors (bit for bit unless ``tol``), dicts and ``ModelOutput``s, lists and numbers alike."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), path
        tol = tol if got.is_floating_point() else {}
        torch.testing.assert_close(
            got, expected, equal_nan=True, **(tol or dict(rtol=0, atol=0)), msg=lambda m: f"{path}: {m}"
        )
    elif isinstance(expected, dict):
        assert list(got.keys()) == list(expected.keys()), path
        for key in expected:
            same(got[key], expected[key], f"{path}[{key!r}]", **tol)
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected), path
        for i, (g, e) in enumerate(zip(got, expected)):
            same(g, e, f"{path}[{i}]", **tol)
    elif expected is None or isinstance(expected, (int, float, bool, str)):
        assert got == expected, f"{path}: {got!r} != {expected!r}"


def _recorded(recipe, call, model):
    torch.manual_seed(7)
    with torch.no_grad():
        result = recipe(call, model)
    return result, torch.get_rng_state()


def generates_as_eager(
    name: str, recipe, modes=("jit", "compile"), layers: int = 2, dropout: float = 0.0, **tol
) -> dict:
    """``recipe(call, model)`` (``call`` the model to call, ``model`` the module itself) eager,
    then under each of ``modes`` from the same seed: the same results and RNG state. Returns
    the compile counts: under ``jit`` the jitted model's cache misses (and no eager fallback),
    under ``compile`` (the forward compiled, the results compared with eager's within ``tol``:
    transformers takes other paths under Dynamo) thunder_rs's compiles per graph."""
    eager = tiny(name, layers, dropout)
    expected = _recorded(recipe, eager, eager)
    counts = {}
    for mode in modes:
        model = tiny(name, layers, dropout)
        if mode == "jit":
            jmodel = thunder_rs.jit(model)
            same(_recorded(recipe, jmodel, model), expected)
            stats = thunder_rs.compile_stats(jmodel)
            assert stats.eager_calls == 0, stats
            counts[mode] = stats.cache_misses
        else:
            torch._dynamo.reset()
            before = compiled_graphs()
            model.forward = torch.compile(model.forward, backend="thunder_rs")
            same(_recorded(recipe, model, model), expected, **tol)
            new = [g for g in compiled_graphs() if all(g is not b for b in before)]
            counts[mode] = [thunder_rs.compile_stats(g.jitted).cache_misses for g in new if g.jitted is not None]
            assert counts[mode], "nothing compiled"
    return counts
