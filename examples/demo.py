"""thunder_rs demo: jit a small GPT, check it against eager, show its traces, compile time and speed.

    python examples/demo.py [--lines N]

Two parts, on CPU, single thread: inference (no_grad), then training (a few AdamW steps under
thunder_rs.jit next to an eager copy of the model, losses side by side, the forward trace and,
where thunder_rs compiles its own backward, the backward trace).
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpt import GPT, GPTConfig, random_tokens  # noqa: E402

CONFIG = GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=64, dropout=0.0)
BATCH = 4
TRAIN_STEPS = 8
TRAIN_LR = 1e-3


def import_thunder_rs():
    try:
        import thunder_rs

        thunder_rs.jit  # noqa: B018 - fails on an unbuilt namespace package
        return thunder_rs
    except (ImportError, AttributeError) as exc:
        print(f"thunder_rs is not available ({type(exc).__name__}: {exc}); build it first.")
        return None


def median_call_us(fns: dict, args: tuple, repeats: int = 15, inner: int = 20) -> dict[str, float]:
    """Median per-call time in microseconds; the callables alternate so drift hits all alike."""
    samples = {name: [] for name in fns}
    for rep in range(repeats + 1):
        for name, fn in fns.items():
            t0 = time.perf_counter_ns()
            for _ in range(inner):
                fn(*args)
            if rep > 0:  # repeat 0 is the warmup
                samples[name].append((time.perf_counter_ns() - t0) / 1e3 / inner)
    return {name: statistics.median(s) for name, s in samples.items()}


def print_trace(trace, max_lines: int, title: str = "last execution trace") -> None:
    lines = str(trace).splitlines()
    print(f"--- {title} ({len(lines)} lines) ---")
    print("\n".join(lines[:max_lines]))
    if len(lines) > max_lines:
        print(f"... ({len(lines) - max_lines} more lines; pass --lines {len(lines)} to see all)")
    print("---")


def print_compile_stats(stats) -> None:
    print(
        f"compile: {stats.last_compile_s * 1e3:.1f} ms "
        f"(calls {stats.calls}, cache hits {stats.cache_hits}, misses {stats.cache_misses})"
    )
    for stage, seconds in stats.stage_s.items():
        print(f"  {stage:<24} {seconds * 1e3:8.2f} ms")
    for reason in stats.miss_reasons:
        print(f"  miss: {reason}")


def fresh_compile_ms(thunder_rs, model, idx) -> float:
    jmodel = thunder_rs.jit(model)
    with torch.no_grad():
        jmodel(idx)
    return thunder_rs.compile_stats(jmodel).last_compile_s * 1e3


def inference_demo(thunder_rs, max_lines: int) -> None:
    model = GPT(CONFIG, seed=0).eval()
    idx = random_tokens(CONFIG, batch=BATCH, seq=CONFIG.block_size, seed=1)
    print(
        f"GPT: {model.num_params()} parameters, {CONFIG.n_layer} layers, {CONFIG.n_head} heads, "
        f"n_embd {CONFIG.n_embd}; input tokens {tuple(idx.shape)}"
    )

    jmodel = thunder_rs.jit(model)
    with torch.no_grad():
        gc.collect()
        t0 = time.perf_counter()
        logits, _ = jmodel(idx)
        first_ms = (time.perf_counter() - t0) * 1e3
        expected, _ = model(idx)
    torch.testing.assert_close(logits, expected)
    print(f"logits {tuple(logits.shape)} match eager (first call {first_ms:.1f} ms wall)")

    print_trace(thunder_rs.last_traces(jmodel)[-1], max_lines)
    print_compile_stats(thunder_rs.compile_stats(jmodel))
    print(
        f"compile of a second, fresh jit of the model (one-time process costs paid): "
        f"{fresh_compile_ms(thunder_rs, model, idx):.1f} ms"
    )

    with torch.no_grad():
        times = median_call_us({"eager": model, "thunder_rs": jmodel}, (idx,))
    ratio = times["thunder_rs"] / times["eager"]
    print(
        f"per call (median): eager {times['eager']:.1f} us, thunder_rs {times['thunder_rs']:.1f} us "
        f"({ratio:.2f}x eager)"
    )
    print(f"cache: {thunder_rs.cache_hits(jmodel)} hits, {thunder_rs.cache_misses(jmodel)} misses")


def adamw_step(forward, optimizer, idx, targets) -> torch.Tensor:
    optimizer.zero_grad(set_to_none=True)
    _, loss = forward(idx, targets)
    loss.backward()
    optimizer.step()
    return loss.detach()


def training_demo(thunder_rs, max_lines: int) -> None:
    model = GPT(CONFIG, seed=0).train()
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    steps = {
        "eager": (eager, torch.optim.AdamW(eager.parameters(), lr=TRAIN_LR)),
        "thunder_rs": (jmodel, torch.optim.AdamW(model.parameters(), lr=TRAIN_LR)),
    }
    print(
        f"\ntraining: {TRAIN_STEPS} AdamW steps (lr {TRAIN_LR}) on random tokens, thunder_rs.jit next to an "
        f"eager copy of the model"
    )
    print(f"  {'step':>4} {'eager loss':>12} {'thunder_rs loss':>16}")
    losses = {name: [] for name in steps}
    for step in range(TRAIN_STEPS):
        idx = random_tokens(CONFIG, batch=BATCH, seq=CONFIG.block_size, seed=100 + 2 * step)
        targets = random_tokens(CONFIG, batch=BATCH, seq=CONFIG.block_size, seed=101 + 2 * step)
        for name, (forward, optimizer) in steps.items():
            losses[name].append(adamw_step(forward, optimizer, idx, targets))
        print(f"  {step:>4} {losses['eager'][-1].item():>12.6f} {losses['thunder_rs'][-1].item():>16.6f}")
    torch.testing.assert_close(torch.stack(losses["thunder_rs"]), torch.stack(losses["eager"]), rtol=1e-4, atol=1e-5)
    eager_params = dict(eager.named_parameters())
    drift = max((p - eager_params[n]).abs().max().item() for n, p in model.named_parameters())
    print(f"losses match eager; largest parameter difference after {TRAIN_STEPS} steps: {drift:.1e}")

    print_trace(thunder_rs.last_traces(jmodel)[-1], max_lines, "forward execution trace")
    backward = thunder_rs.last_backward_traces(jmodel) if hasattr(thunder_rs, "last_backward_traces") else []
    if backward:
        print_trace(backward[-1], max_lines, "backward execution trace")
    else:
        print("(gradients flow through torch autograd over the generated forward; no backward trace)")
    print_compile_stats(thunder_rs.compile_stats(jmodel))

    step_fns = {
        name: (lambda i, t, f=forward, o=optimizer: adamw_step(f, o, i, t))
        for name, (forward, optimizer) in steps.items()
    }
    times = median_call_us(step_fns, (idx, targets), repeats=7, inner=5)
    ratio = times["thunder_rs"] / times["eager"]
    print(
        f"per training step (median): eager {times['eager'] / 1e3:.2f} ms, thunder_rs "
        f"{times['thunder_rs'] / 1e3:.2f} ms ({ratio:.2f}x eager)"
    )
    print(f"cache: {thunder_rs.cache_hits(jmodel)} hits, {thunder_rs.cache_misses(jmodel)} misses")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=60, help="trace lines to print (default 60)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    thunder_rs = import_thunder_rs()
    if thunder_rs is None:
        return 1
    inference_demo(thunder_rs, args.lines)
    training_demo(thunder_rs, args.lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
