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


def _hf(kind: str):
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


PROGRAMS = {
    "gpt": _gpt,
    "gpt-explicit": lambda: _gpt(explicit=True),
    "hf-gpt2": lambda: _hf("gpt2"),
    "hf-llama": lambda: _hf("llama"),
    "hf-bert": lambda: _hf("bert"),
    "resnet18": _resnet18,
    "vit": _vit,
    "mlp": _mlp,
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


def _kib(n: int) -> str:
    return f"{n / 1024:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", default=",".join(PROGRAMS))
    parser.add_argument("--dtypes", default="f32,bf16")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
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
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
