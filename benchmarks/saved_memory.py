"""Memory held for backward by training programs, eager against thunder_rs.jit and
torch.compile(backend="thunder_rs"), in float32 and under bf16 autocast (CPU).

    python benchmarks/saved_memory.py [--programs gpt,mlp] [--dtypes f32,bf16] [--out FILE]

For each program (a step that returns its loss) and each way of running it, after two warm-up steps:

- saved: the bytes of the distinct storages a ``saved_tensors_hooks`` pack hook sees during the forward
  (eager: its autograd nodes' saved tensors; a compiled call packs its residuals through the same hooks),
  all of them and those that are no parameter or input ("activations"), and the number of tensors packed;
- peak: the peak of live CPU tensor memory during the forward and backward, over what was live before, from
  the allocation and free events of ``torch.profiler`` (``profile_memory=True``), summed in time order.

Eager's autocast keeps its casts of the weights in a cache until the region exits; both ways count them
where they are saved. Dropout runs (the models are in training mode); the values are not compared here.
``hf-*-ckpt``: with ``gradient_checkpointing_enable()`` (non-reentrant, as HF's default).
``blocks-ckpt``: eager's non-reentrant checkpoint packs the region's saved tensors with hooks of its own (the
pack hook here sees none of them; it keeps the region's inputs): compare the peaks.

    python benchmarks/saved_memory.py --ops all [--modes eager,jit]

prints instead, per op (``_ops``), the bytes of the activations it keeps for backward, each way.
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

import thunder_rs  # noqa: E402


def saved_storages(step) -> tuple:
    """``(loss, {data_ptr: nbytes} of the storages packed, count of tensors packed)`` of one forward."""
    storages: dict = {}
    count = [0]

    def pack(t):
        count[0] += 1
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = step()
    return loss, storages, count[0]


def peak_bytes(fn) -> int:
    """The peak of live CPU tensor bytes while ``fn()`` runs, over those live before (profiler events)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    cpu = torch.autograd.DeviceType.CPU
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == cpu
    )
    live = top = 0
    for _, n in events:
        live += n
        top = max(top, live)
    return top


def _gpt(explicit: bool = False):
    from gpt import GPT, GPTConfig, random_tokens  # noqa: PLC0415

    config = GPTConfig(
        vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=64, dropout=0.1, explicit_attention=explicit
    )
    model = GPT(config, seed=0)
    idx, targets = random_tokens(config, 4, 32, seed=1), random_tokens(config, 4, 32, seed=2)
    return model, (idx, targets), lambda m, idx, targets: m(idx, targets)[1]


def _hf(kind: str, checkpointed: bool = False):
    import transformers  # noqa: PLC0415

    torch.manual_seed(0)
    small = dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=64, intermediate_size=128, vocab_size=128)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=128, n_positions=64)
        model = transformers.GPT2LMHeadModel(config)
    elif kind == "llama":
        config = transformers.LlamaConfig(num_key_value_heads=2, max_position_embeddings=64, **small)
        model = transformers.LlamaForCausalLM(config)
    else:
        model = transformers.BertForMaskedLM(transformers.BertConfig(max_position_embeddings=64, **small))
    if checkpointed:  # (HF's default: torch.utils.checkpoint with use_reentrant=False per layer)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, 128, (4, 32), generator=torch.Generator().manual_seed(1))
    return model, (ids,), lambda m, ids: m(input_ids=ids, labels=ids).loss


def _resnet18():
    import torchvision  # noqa: PLC0415

    torch.manual_seed(0)
    images = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 3, 7, 9])
    return torchvision.models.resnet18(num_classes=10), (images, labels), lambda m, x, y: F.cross_entropy(m(x), y)


def _vit():
    from torchvision.models import vision_transformer  # noqa: PLC0415

    torch.manual_seed(0)
    model = vision_transformer.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=10, dropout=0.1
    )
    images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 3, 7, 9])
    return model, (images, labels), lambda m, x, y: F.cross_entropy(m(x), y)


def _mlp():
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(
        nn.Linear(128, 512), nn.GELU(), nn.LayerNorm(512), nn.Linear(512, 128), nn.GELU(), nn.LayerNorm(128)
    )
    head = nn.Linear(128, 10)
    model.append(head)
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(1))
    labels = torch.arange(64) % 10
    return model, (x, labels), lambda m, x, y: F.cross_entropy(m(x), y)


class _Block(torch.nn.Module):
    """A pre-norm residual MLP block."""

    def __init__(self, d: int):
        super().__init__()
        nn = torch.nn
        self.norm, self.mlp = nn.LayerNorm(d), nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class _Blocks(torch.nn.Module):
    """Three blocks and a head; each block under ``torch.utils.checkpoint`` (``use_reentrant``
    True or False) unless ``reentrant`` is None."""

    def __init__(self, reentrant: bool | None, d: int = 128):
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block(d) for _ in range(3))
        self.head, self.reentrant = torch.nn.Linear(d, 10), reentrant

    def forward(self, x):
        for block in self.blocks:
            if self.reentrant is None:
                x = block(x)
            else:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=self.reentrant)
        return self.head(x)


def _blocks(reentrant: bool | None):
    torch.manual_seed(0)
    x = torch.randn(512, 128, generator=torch.Generator().manual_seed(1))  # (activations over the grads)
    labels = torch.arange(512) % 10
    return _Blocks(reentrant), (x, labels), lambda m, x, y: F.cross_entropy(m(x), y)


PROGRAMS = {
    "gpt": _gpt,
    "gpt-explicit": lambda: _gpt(explicit=True),
    "hf-gpt2": lambda: _hf("gpt2"),
    "hf-llama": lambda: _hf("llama"),
    "hf-bert": lambda: _hf("bert"),
    "hf-gpt2-ckpt": lambda: _hf("gpt2", checkpointed=True),
    "hf-llama-ckpt": lambda: _hf("llama", checkpointed=True),
    "resnet18": _resnet18,
    "vit": _vit,
    "mlp": _mlp,
    "blocks": lambda: _blocks(None),
    "blocks-ckpt": lambda: _blocks(False),
    "blocks-ckpt-reentrant": lambda: _blocks(True),
}
MODES = {
    "eager": lambda m: m,
    "jit": thunder_rs.jit,
    "compile": lambda m: torch.compile(m, backend="thunder_rs"),
}


def measure(name: str, dtype: str, mode: str) -> dict:
    """The saved bytes and peak of one program run one way (after two warm-up steps)."""
    model, inputs, loss_of = PROGRAMS[name]()
    model.train()
    run = MODES[mode](model)
    autocast = dtype == "bf16"

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return loss_of(run, *inputs)

    def train_step():
        step().backward()

    for _ in range(2):
        saved_storages(step)[0].backward()
        train_step()
    held = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers(), *inputs]}
    model.zero_grad(set_to_none=True)
    loss, storages, count = saved_storages(step)
    loss.backward()
    del loss
    model.zero_grad(set_to_none=True)
    peak = peak_bytes(train_step)
    activations = sum(n for ptr, n in storages.items() if ptr not in held)
    return {"saved": sum(storages.values()), "activations": activations, "count": count, "peak": peak}


def _ops() -> dict:
    """Per-op programs: name -> (fn, leaf shapes), each called as ``fn(p, *leaves)``. The op reads
    activations, ``a @ p`` of a leaf ``a`` and the identity ``p`` (an input that requires no grad:
    eager's matmul keeps only ``p``), so what it keeps for backward shows among the activations;
    in float32, and in bfloat16 under autocast (the matmul casts)."""
    x, w64 = (16, 64), (64,)
    return {
        "div": (lambda p, a, b: (a @ p) / ((b @ p).abs() + 1), [x, x]),
        "div-self": (lambda p, a: (a @ p) / ((a @ p).abs() + 1), [x]),
        "div-leaf": (lambda p, a: a / ((a @ p).abs() + 1), [x]),
        "mul": (lambda p, a, b: (a @ p) * (b @ p), [x, x]),
        "exp": (lambda p, a: (a @ p).exp(), [x]),
        "tanh": (lambda p, a: (a @ p).tanh(), [x]),
        "sigmoid": (lambda p, a: (a @ p).sigmoid(), [x]),
        "rsqrt": (lambda p, a: ((a @ p).abs() + 1).rsqrt(), [x]),
        "pow": (lambda p, a: (a @ p).pow(3), [x]),
        "softmax": (lambda p, a: (a @ p).softmax(-1), [x]),
        "log_softmax": (lambda p, a: (a @ p).log_softmax(-1), [x]),
        "layer_norm": (lambda p, a, w, b: F.layer_norm(a @ p, (64,), w, b), [x, w64, w64]),
        "rms_norm": (lambda p, a, w: F.rms_norm(a @ p, (64,), w), [x, w64]),
        "gelu": (lambda p, a: F.gelu(a @ p), [x]),
        "gelu-tanh": (lambda p, a: F.gelu(a @ p, approximate="tanh"), [x]),
        "silu": (lambda p, a: F.silu(a @ p), [x]),
        "relu": (lambda p, a: F.relu(a @ p), [x]),
        "dropout": (lambda p, a: F.dropout(a @ p, 0.1), [x]),
        "matmul": (lambda p, a, w: (a @ p) @ w, [x, (64, 32)]),
        "linear": (lambda p, a, w, b: F.linear(a @ p, w, b), [x, (32, 64), (32,)]),
        "conv2d": (lambda p, a, w, b: F.conv2d((a @ p).view(4, 4, 8, 8), w, b, padding=1), [x, (8, 4, 3, 3), (8,)]),
        "batch_norm": (
            lambda p, a, w, b: F.batch_norm((a @ p).view(4, 4, 8, 8), None, None, w, b, training=True),
            [x, (4,), (4,)],
        ),
        "max_pool2d": (lambda p, a: F.max_pool2d((a @ p).view(4, 4, 8, 8), 2), [x]),
        "embedding": (lambda p, w: F.embedding(torch.arange(16) % 8, w @ p), [(8, 64)]),
        "cross_entropy": (lambda p, a: F.cross_entropy(a @ p, torch.arange(16)), [x]),
        "sdpa": (lambda p, a: F.scaled_dot_product_attention(*((a @ p).view(2, 2, 4, 64),) * 3, is_causal=True), [x]),
    }


def measure_op(name: str, dtype: str, mode: str) -> tuple:
    """``(activation bytes, tensors packed)`` one op keeps for backward, run one way (its second call)."""
    fn, shapes = _ops()[name]
    run = MODES[mode](fn)
    p = torch.eye(64)
    for _ in range(2):
        g = torch.Generator().manual_seed(0)
        leaves = [torch.randn(s, generator=g).requires_grad_() for s in shapes]
        torch.manual_seed(0)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            out, storages, count = saved_storages(lambda: run(p, *leaves))
        out.float().sum().backward()
    held = {t.untyped_storage().data_ptr() for t in [p, *leaves]}
    return sum(n for ptr, n in storages.items() if ptr not in held), count


def main_ops(args) -> list:
    """The ``--ops`` table: each op's activation bytes kept for backward, each way."""
    modes = args.modes.split(",")
    lines = [
        "| op | dtype | " + " | ".join(f"{m} act bytes [n]" for m in modes) + " |",
        "|" + "---|" * (2 + len(modes)),
    ]
    print(lines[0], flush=True)
    for name in _ops() if args.ops == "all" else args.ops.split(","):
        for dtype in args.dtypes.split(","):
            r = {m: measure_op(name, dtype, m) for m in modes}
            more = " (more)" if any(r[m][0] > r[modes[0]][0] for m in modes) else ""
            cells = " | ".join(f"{r[m][0]} [{r[m][1]}]" for m in modes)
            lines.append(f"| {name}{more} | {dtype} | {cells} |")
            print(lines[-1], flush=True)
    return lines


def _kib(n: int) -> str:
    return f"{n / 1024:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", default=",".join(PROGRAMS))
    parser.add_argument("--dtypes", default="f32,bf16")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--ops", default=None, help="'all' or names: the per-op table instead of the models'")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    lines = main_ops(args) if args.ops else main_programs(args)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


def main_programs(args) -> list:
    """The models' table: saved bytes and peak, each way."""
    modes = args.modes.split(",")
    cols = " | ".join(f"{m} {k}" for k in ("saved (act) KiB [n]", "peak KiB") for m in modes)
    lines = [f"| program | dtype | {cols} |", "|" + "---|" * (2 + 2 * len(modes))]
    print(lines[0], flush=True)
    for name in args.programs.split(","):
        for dtype in args.dtypes.split(","):
            r = {m: measure(name, dtype, m) for m in modes}
            saved = [f"{_kib(r[m]['saved'])} ({_kib(r[m]['activations'])}) [{r[m]['count']}]" for m in modes]
            peaks = [_kib(r[m]["peak"]) for m in modes]
            lines.append(f"| {name} | {dtype} | " + " | ".join(saved + peaks) + " |")
            print(lines[-1], flush=True)
    return lines


if __name__ == "__main__":
    main()
