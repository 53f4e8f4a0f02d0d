"""Shapes that change between calls (issue 26): compile counts and time against eager, one process.

    python benchmarks/dynamic_shapes.py [--steps 40] [--device cuda] [--runs padding,batch,decode,images,moe,moe_decode]
        [--executors inductor] [--with-compile] [--with-backend] [--paired]
        [--json out.json]

Five runs, each against eager on the same weights and inputs:

  padding   a tiny Hugging Face GPT-2 trained with dynamic padding: each step's batch of 8 is padded
            to a length drawn from 16..128 (seeded; 36 distinct lengths in 40 steps), AdamW.
            Target: at most 1.1x eager's wall time, at most 3 compiles.
  batch     the demo GPT (examples/gpt.py) at batch sizes 1..32, no_grad: compiles, and per-call time
            at a few sizes against a compile for that size alone (`symbolic_over_static_at_N`), and
            the first call of the symbolic compile against a static compile's (`first_call_ratio`).
            Target: at most 3 compiles, per-call within 5% of a static compile's, first call at
            most 1.5x.
  decode    a 64-token greedy decode with a growing KV cache through the jitted GPT-2.
            Target: at most 3 compiles.
  images    torchvision's ResNet-18 trained (SGD) on batches of 4 images whose height and width
            are drawn from 64..160 in steps of 16 (seeded; `--steps` // 2 steps): compiles and
            wall time against eager (no target in the issue; a compile per size before).
  moe       a tiny Hugging Face Qwen2-MoE (8 experts, top-2) with transformers' "eager" experts loop
            trained (AdamW) on `--steps` // 2 batches of 8x64 tokens: each expert's token count
            (`torch.where` of its routing mask) changes every step. Compiles and wall time against
            eager (a compile per routing before sizes computed from values were symbolic).
  moe_decode  Mixtral's sparse MoE block as transformers wrote it before 4.46 (every expert on the
            tokens `torch.where` of its routing mask gives it, `index_add_`; 8 experts, top-2),
            `--tokens` decode steps of one token per sequence at batches 1 and 4, no_grad: each
            expert's count is 0 or 1 (a few at batch 4). Compiles (`b1_*`, `b4_*`; one per routing
            before counts of 0 and 1 were traced symbolic at 2) and seconds against eager.

Wall times include the compiles (that is the user's cost). torch.compile is not run here (its
recompiles and automatic dynamic shapes are what the targets compare with: `--with-compile` adds it).
`--with-backend` adds `torch.compile(model, backend="thunder_rs")` to the padding run: Dynamo's
graphs compiled by thunder_rs, the sizes Dynamo makes dynamic symbolic (`backend_ratio`; its
compiles are thunder_rs's, over all of Dynamo's graphs).

`--paired` runs the padding, decode and moe runs' backends step by step in turn (the same batch or
token for each, on identically initialised models; the order flips every step), so that load from
other processes hits them alike, and splits each backend's time against eager (`paired_report`)
into the steps that compiled and the others:

  thunder_rs_compile_s          the seconds thunder_rs's compiles took (its own wall-time figures)
  thunder_rs_compile_excess_s   the compiling steps' seconds over eager's same steps
  thunder_rs_step_ratio         the median ratio to eager's of the other steps (`*_step_ms`: medians)
  thunder_rs_ratio_from_parts   1 + `*_compile_share` + `*_step_share`: the ratio of the wall times
                                these parts predict, steadier than `ratio` when eager's own time moves

`--clock cpu` times the paired steps by the process's CPU time instead, which leaves out the time
other processes of a shared machine hold the cores; so it does the batch run's per-call and first-call
times (its wall times, `*_s`, stay wall times).
"""

import argparse
import copy
import gc
import inspect
import json
import os
import random
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import gpt  # noqa: E402
import thunder_rs  # noqa: E402
from thunder_rs.dynamo import compiled_graphs  # noqa: E402

VOCAB = 1000
BATCH = 8
#: Where the models and inputs live (``--device``).
DEVICE = torch.device("cpu")
#: thunder_rs's executors (``--executors``; None: the defaults).
EXECUTORS = None
#: What ``--paired`` steps are timed by (``--clock``): wall time, or this process's CPU time, which
#: leaves out the time other processes of a shared machine hold the cores.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
CLOCK = time.perf_counter


def sync() -> None:
    """Waits for the device's queued work, so that wall times include it."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def tiny_gpt2():
    import transformers  # noqa: PLC0415 (optional: only this benchmark's HF runs need it)

    config = transformers.GPT2Config(
        n_layer=2, n_head=4, n_embd=64, n_positions=256, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).to(DEVICE)


def padded_batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each step: token ids and an attention mask, padded (on the right) to the step's longest row."""
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    batches = []
    for _ in range(steps):
        length = rng.randint(16, 128)
        lengths = torch.randint(max(1, length // 2), length + 1, (BATCH,), generator=gen)
        lengths[0] = length
        mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
        ids = torch.randint(3, VOCAB, (BATCH, length), generator=gen) * mask
        batches.append((ids.to(DEVICE), mask.to(DEVICE)))
    return batches


def trainer(model, call):
    """A training step on a batch (loss on the unpadded tokens, backward, AdamW), as a function of the
    batch."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(batch) -> None:
        ids, mask = batch
        labels = ids.masked_fill(mask == 0, -100)
        call(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def collected() -> None:
    """Collects garbage before a timed loop. ``torch._dynamo.reset()`` imports some 900 modules
    (Dynamo, Inductor, sympy, triton: 140,000 objects), and the full collection that makes due
    (0.2 s of CPU) otherwise falls on whichever timed step allocates next: a thunder_rs compile
    in one run, one of eager's steps in another."""
    gc.collect()


def train(model, call, batches) -> float:
    """Seconds for the training steps."""
    step = trainer(model, call)
    collected()
    start = time.perf_counter()
    for batch in batches:
        step(batch)
    sync()
    return time.perf_counter() - start


def run_padding(steps: int, backends: dict, paired: bool = False) -> dict:
    batches = padded_batches(steps)
    result = {"steps": steps, "distinct_lengths": len({ids.shape[1] for ids, _ in batches})}
    if paired:
        torch._dynamo.reset()
        models = {name: tiny_gpt2() for name in backends}
        calls = {name: make(models[name]) for name, make in backends.items()}
        steps_of = {name: trainer(models[name], call) for name, call in calls.items()}
        collected()
        result.update(paired_report(interleaved(steps_of, batches, calls)))
        result.update({f"{name}_compiles": compiles(call) for name, call in calls.items()})
    for name, make in backends.items() if not paired else ():
        model = tiny_gpt2()
        torch._dynamo.reset()
        call = make(model)
        result[f"{name}_s"] = train(model, call, batches)
        result[f"{name}_compiles"] = compiles(call)
    result["ratio"] = result["thunder_rs_s"] / result["eager_s"]
    if "torch.compile thunder_rs" in backends:
        result["backend_ratio"] = result["torch.compile thunder_rs_s"] / result["eager_s"]
    return result


def interleaved(steps_of: dict, inputs: list, calls: dict) -> dict:
    """Each backend's step on each input in turn (the order flips every input): ``{name: [(seconds,
    compile seconds or None)]}``, a step's compile seconds being what ``calls[name]``'s compiles in
    that step reported (None: it did not compile, or is not a thunder_rs callable)."""
    samples: dict = {name: [] for name in steps_of}
    names = list(steps_of)
    for i, x in enumerate(inputs):
        for name in names if i % 2 == 0 else names[::-1]:
            before = compiles(calls[name])
            sync()
            start = CLOCK()
            steps_of[name](x)
            sync()
            seconds = CLOCK() - start
            compiled = before is not None and compiles(calls[name]) != before
            samples[name].append((seconds, compile_seconds(calls[name]) if compiled else None))
    return samples


def compile_seconds(call) -> float:
    """The seconds a thunder_rs callable's last compile took (0 under torch.compile's backend)."""
    try:
        return thunder_rs.compile_stats(call).last_compile_s
    except Exception:  # noqa: BLE001 (torch.compile(backend="thunder_rs"): over several graphs)
        return 0.0


def paired_report(samples: dict) -> dict:
    """Each backend's time against eager's, from ``interleaved``'s samples, in parts: the steps that
    compiled (their seconds over eager's same steps, ``*_compile_excess_s``) and the median
    per-step ratio of the others (``*_step_ratio``); ``*_ratio_from_parts`` is the ratio they predict."""
    eager = [seconds for seconds, _ in samples["eager"]]
    result = {"eager_s": sum(eager)}
    for name, own in samples.items():
        result[f"{name}_s"] = sum(seconds for seconds, _ in own)
        if name == "eager":
            continue
        compiled = [i for i, (_, compile_s) in enumerate(own) if compile_s is not None]
        steady = [i for i in range(len(own)) if i not in compiled]
        step_ratio = statistics.median(own[i][0] / eager[i] for i in steady)
        excess = sum(own[i][0] - eager[i] for i in compiled)
        result[f"{name}_compile_steps"] = len(compiled)
        result[f"{name}_compile_s"] = sum(own[i][1] for i in compiled)
        result[f"{name}_compile_excess_s"] = excess
        result[f"{name}_step_ms"] = statistics.median(own[i][0] for i in steady) * 1e3
        result[f"{name}_step_ratio"] = step_ratio
        result[f"{name}_compile_share"] = excess / sum(eager)
        result[f"{name}_step_share"] = (step_ratio - 1) * sum(eager[i] for i in steady) / sum(eager)
        result[f"{name}_ratio_from_parts"] = 1 + result[f"{name}_compile_share"] + result[f"{name}_step_share"]
    result["eager_step_ms"] = statistics.median(eager) * 1e3
    return result


def compiles(call) -> int | None:
    """How many times a thunder_rs callable compiled; under ``torch.compile(backend="thunder_rs")``,
    how many times thunder_rs compiled Dynamo's graphs (None for the others)."""
    if getattr(call, "backend", None) == "thunder_rs":
        return sum(thunder_rs.cache_misses(g.jitted) for g in compiled_graphs() if g.jitted is not None)
    try:
        return thunder_rs.compile_stats(call).cache_misses
    except Exception:  # noqa: BLE001 (not a thunder_rs callable: eager or torch.compile)
        return None


def backend_compiled(model):
    """``torch.compile(model, backend="thunder_rs")``, marked for ``compiles``."""
    compiled = torch.compile(copy.copy(model), backend="thunder_rs")
    compiled.backend = "thunder_rs"
    return compiled


def per_call_us(calls: dict, x, repeats: int = 41) -> dict:
    """Median per-call time of each callable on ``x``, the callables alternating within each repeat
    so that load from other processes hits them alike."""
    samples: dict = {name: [] for name in calls}
    with torch.no_grad():
        for call in calls.values():
            call(x)
        for _ in range(repeats):
            for name, call in calls.items():
                sync()
                start = CLOCK()
                call(x)
                sync()
                samples[name].append((CLOCK() - start) * 1e6)
    return {name: statistics.median(times) for name, times in samples.items()}


def run_batch(backends: dict) -> dict:
    config = gpt.GPTConfig()
    model = gpt.GPT(config)
    gpt.init_weights(model, 0)
    model.to(DEVICE)
    result, calls = {}, {}
    for name, make in backends.items():
        calls[name] = call = make(model)
        start = time.perf_counter()
        with torch.no_grad():
            for batch in range(1, 33):
                call(gpt.random_tokens(config, batch, 32).to(DEVICE))
        sync()
        result[f"{name}_s"] = time.perf_counter() - start
        result[f"{name}_compiles"] = compiles(call)
    for batch in (1, 8, 32):
        x = gpt.random_tokens(config, batch, 32).to(DEVICE)
        if "thunder_rs" in calls:  # the symbolic entry against a compile for this batch size alone
            calls["static"] = thunder_rs.jit(model, dynamic=False, executors=EXECUTORS)
        for name, us in per_call_us(calls, x).items():
            result[f"{name}_us_at_{batch}"] = us
        if "thunder_rs" in calls:
            result[f"symbolic_over_static_at_{batch}"] = (
                result[f"thunder_rs_us_at_{batch}"] / result[f"static_us_at_{batch}"]
            )
    if "thunder_rs" in calls:
        result.update(first_calls(model, config))
    return result


def first_call_s(jfn, x) -> float:
    start = CLOCK()
    with torch.no_grad():
        jfn(x)
    sync()
    return CLOCK() - start


def first_calls(model, config, repeats: int = 5) -> dict:
    """Median time (``CLOCK``) of the call that compiles with the batch size symbolic (the second size a
    fresh jit sees) and of a static compile's first call at that size."""
    small, x = gpt.random_tokens(config, 1, 32).to(DEVICE), gpt.random_tokens(config, 2, 32).to(DEVICE)
    symbolic, static = [], []
    for _ in range(repeats):
        jfn = thunder_rs.jit(model, executors=EXECUTORS)
        first_call_s(jfn, small)
        symbolic.append(first_call_s(jfn, x))
        static.append(first_call_s(thunder_rs.jit(model, dynamic=False, executors=EXECUTORS), x))
    result = {"symbolic_first_call_s": statistics.median(symbolic), "static_first_call_s": statistics.median(static)}
    result["first_call_ratio"] = result["symbolic_first_call_s"] / result["static_first_call_s"]
    return result


def decoder(call, keyword: str, ids: torch.Tensor):
    """A greedy decode's calls, one per step: the prompt, then one call per token with the cache the
    last call returned; and the list of the tokens produced."""
    produced: list = []
    last: list = []

    def step(_=None) -> None:
        with torch.no_grad():
            if not last:
                last.append(call(input_ids=ids, use_cache=True))
                return
            out = last.pop()
            produced.append(out.logits[:, -1].argmax(-1, keepdim=True))
            cache = out["cache"] if "cache" in out else out["past_key_values"]
            last.append(call(input_ids=produced[-1], use_cache=True, **{keyword: cache}))

    return step, produced


def cache_keyword(model) -> str:
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def run_decode(tokens: int, backends: dict, paired: bool = False) -> dict:
    ids = torch.randint(3, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    result, outputs = {"tokens": tokens}, {}
    if paired:
        models = {name: tiny_gpt2().eval() for name in backends}
        calls = {name: make(models[name]) for name, make in backends.items()}
        decoders = {name: decoder(call, cache_keyword(models[name]), ids) for name, call in calls.items()}
        collected()
        samples = interleaved({name: step for name, (step, _) in decoders.items()}, range(tokens + 1), calls)
        result.update(paired_report(samples))
        result.update({f"{name}_compiles": compiles(call) for name, call in calls.items()})
        outputs = {name: torch.cat(produced, 1) for name, (_, produced) in decoders.items()}
    for name, make in backends.items() if not paired else ():
        model = tiny_gpt2().eval()
        call = make(model)
        step, produced = decoder(call, cache_keyword(model), ids)
        collected()
        start = time.perf_counter()
        for _ in range(tokens + 1):
            step()
        sync()
        result[f"{name}_s"] = time.perf_counter() - start
        result[f"{name}_compiles"] = compiles(call)
        outputs[name] = torch.cat(produced, 1)
    result["same_tokens"] = all(torch.equal(out, outputs["eager"]) for out in outputs.values())
    return result


def run_images(steps: int, backends: dict) -> dict:
    import torchvision  # noqa: PLC0415 (optional: only this run needs it)

    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    sizes = [(rng.randrange(64, 161, 16), rng.randrange(64, 161, 16)) for _ in range(steps)]
    images = [torch.randn(4, 3, h, w, generator=gen).to(DEVICE) for h, w in sizes]
    result = {"steps": steps, "distinct_sizes": len(set(sizes))}
    for name, make in backends.items():
        torch.manual_seed(0)
        model = torchvision.models.resnet18(num_classes=10).to(DEVICE).train()
        call = make(model)
        result[f"{name}_s"] = timed_steps(model, torch.optim.SGD, lambda x: call(x).square().mean(), images)
        result[f"{name}_compiles"] = compiles(call)
    result["ratio"] = result["thunder_rs_s"] / result["eager_s"]
    return result


def timed_steps(model, optimizer, loss, batches: list) -> float:
    """Seconds for a training step on each batch: ``loss(batch)``, backward, ``optimizer`` (lr 1e-3)."""
    opt = optimizer(model.parameters(), lr=1e-3)
    start = time.perf_counter()
    for batch in batches:
        loss(batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync()
    return time.perf_counter() - start


def tiny_qwen2_moe(layers: int = 2):
    """A tiny Hugging Face Qwen2-MoE with transformers' "eager" experts loop (each expert on the
    tokens ``torch.where`` routes to it: counts that change every step), ``layers`` deep."""
    import transformers  # noqa: PLC0415 (optional: only this run needs it)

    config = transformers.Qwen2MoeConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
    )
    config._experts_implementation = "eager"
    torch.manual_seed(0)
    return transformers.Qwen2MoeForCausalLM(config).to(DEVICE).train()


def moe_trainer(model, call):
    """A training step of the MoE on a batch of token ids (AdamW), as a function of the batch."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(ids) -> None:
        call(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def run_moe(steps: int, backends: dict, paired: bool = False) -> dict:
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, VOCAB, (BATCH, 64), generator=gen).to(DEVICE) for _ in range(steps)]
    result: dict = {"steps": steps}
    if paired:
        models = {name: tiny_qwen2_moe() for name in backends}
        calls = {name: make(models[name]) for name, make in backends.items()}
        steps_of = {name: moe_trainer(models[name], call) for name, call in calls.items()}
        collected()
        result.update(paired_report(interleaved(steps_of, batches, calls)))
        result.update({f"{name}_compiles": compiles(call) for name, call in calls.items()})
    for name, make in backends.items() if not paired else ():
        model = tiny_qwen2_moe()
        call = make(model)
        result[f"{name}_s"] = timed_steps(
            model, torch.optim.AdamW, lambda ids: call(input_ids=ids, labels=ids).loss, batches
        )
        result[f"{name}_compiles"] = compiles(call)
    result["ratio"] = result["thunder_rs_s"] / result["eager_s"]
    return result


class OldMixtralMoe(torch.nn.Module):
    """transformers' ``MixtralSparseMoeBlock`` of 4.36 to 4.45: every expert on the tokens its
    routing mask gives it (``torch.where``), added back with ``index_add_``."""

    def __init__(self, dim: int = 64, experts: int = 8, ffn: int = 128):
        super().__init__()
        self.gate = torch.nn.Linear(dim, experts, bias=False)
        self.w1 = torch.nn.ModuleList(torch.nn.Linear(dim, ffn, bias=False) for _ in range(experts))
        self.w2 = torch.nn.ModuleList(torch.nn.Linear(ffn, dim, bias=False) for _ in range(experts))
        self.w3 = torch.nn.ModuleList(torch.nn.Linear(dim, ffn, bias=False) for _ in range(experts))

    def forward(self, x):
        h = x.view(-1, x.shape[-1])
        weights, chosen = torch.topk(torch.softmax(self.gate(h), dim=1, dtype=torch.float), 2, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(h.dtype)
        out = torch.zeros_like(h)
        mask = torch.nn.functional.one_hot(chosen, num_classes=len(self.w1)).permute(2, 1, 0)
        for e in range(len(self.w1)):
            slot, token = torch.where(mask[e])
            rows = h[None, token].reshape(-1, h.shape[-1])
            y = self.w2[e](torch.nn.functional.silu(self.w1[e](rows)) * self.w3[e](rows)) * weights[token, slot, None]
            out.index_add_(0, token, y.to(h.dtype))
        return out.view(x.shape)


def run_moe_decode(tokens: int, backends: dict) -> dict:
    result: dict = {"tokens": tokens}
    for batch in (1, 4):
        gen = torch.Generator().manual_seed(batch)
        xs = [torch.randn(batch, 1, 64, generator=gen).to(DEVICE) for _ in range(tokens)]
        outputs = {}
        for name, make in backends.items():
            torch.manual_seed(0)
            call = make(OldMixtralMoe().to(DEVICE))
            collected()
            start = time.perf_counter()
            with torch.no_grad():
                outputs[name] = [call(x) for x in xs]
            sync()
            result[f"b{batch}_{name}_s"] = time.perf_counter() - start
            result[f"b{batch}_{name}_compiles"] = compiles(call)
        same = (torch.allclose(a, b) for out in outputs.values() for a, b in zip(out, outputs["eager"]))
        result[f"b{batch}_same_outputs"] = all(same)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--with-compile", action="store_true")
    parser.add_argument("--with-backend", action="store_true", help='also torch.compile(backend="thunder_rs")')
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument(
        "--runs", default="padding,batch,decode,images,moe,moe_decode", help="which runs, comma-separated"
    )
    parser.add_argument("--executors", help="thunder_rs's executors, comma-separated (default: the defaults)")
    parser.add_argument("--paired", action="store_true", help="padding, decode, moe: backends in turn, step by step")
    parser.add_argument("--clock", choices=CLOCKS, default="wall", help="what --paired's steps are timed by")
    parser.add_argument("--json")
    args = parser.parse_args()
    global DEVICE, EXECUTORS, CLOCK
    CLOCK = CLOCKS[args.clock]
    DEVICE = torch.device(args.device)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="thunder_rs.*recompiled")
    EXECUTORS = args.executors.split(",") if args.executors else None
    backends = {"eager": lambda m: m, "thunder_rs": lambda m: thunder_rs.jit(m, cache=512, executors=EXECUTORS)}
    if args.with_compile:
        backends["torch.compile"] = lambda m: torch.compile(copy.copy(m))
    if args.with_backend:
        backends["torch.compile thunder_rs"] = backend_compiled
    # (The thunder_rs backend of torch.compile is measured on the padding run.)
    others = {k: v for k, v in backends.items() if k != "torch.compile thunder_rs"}
    runs = {
        "padding": lambda: run_padding(args.steps, backends, args.paired),
        "batch": lambda: run_batch(others),
        "decode": lambda: run_decode(args.tokens, others, args.paired),
        "images": lambda: run_images(args.steps // 2, others),
        "moe": lambda: run_moe(args.steps // 2, others, args.paired),
        "moe_decode": lambda: run_moe_decode(args.tokens, others),
    }
    results: dict = {"device": str(DEVICE), **({"paired_clock": args.clock} if args.paired else {})}
    for name in args.runs.split(","):
        # Printed as each run ends: a run cut short by a time limit still shows the ones before.
        result = results[name] = runs[name]()
        line = "  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items())
        print(f"{name:8s} {line}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
