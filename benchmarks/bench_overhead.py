"""Per-call overhead of thunder_rs's hit path, and first-call (compile) time.

    python benchmarks/bench_overhead.py [--quick] [--json PATH]

Cases are chosen so that per-call bookkeeping dominates: a five-op function on 4x4 tensors;
modules with 50 parameters on a 1x4 input, one reading no Python attributes in forward and one
reading many (dropout rates, a temperature, a config object: guarded reads); and one of 300
parameters whose forward runs three of its 150 layers. Reports eager and thunder_rs per call
(median, interleaved) and their difference in microseconds; the same for training steps
(forward, ``loss.backward()``, SGD step, ``zero_grad``) of a Linear returning (loss, logits), of
one returning the loss, of the 50-parameter MLP and of the 300-parameter module; per call of
an entry with symbolic sizes against a static compile at the same size (issue 26: within 1 us);
and the first-call time of the demo GPT, forward and training. Calls with keywords
(``KEYWORD_CASES``: a tensor, a float and None; a module by keyword; a two-layer Llama called as
Hugging Face calls it) are measured as the per-call cases. Runs single-threaded on CPU. Run it
against another checkout of the Python package (``PYTHONPATH=<other>/python``) to compare before
and after.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

import harness  # noqa: E402
from gpt import GPT, GPTConfig, random_tokens  # noqa: E402


def tiny_fn(a, b):
    return torch.exp(torch.sin((a + b) * a) - b)


def plain_50() -> nn.Module:
    """25 Linear layers: 50 parameters, no Python attribute read in any forward."""
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(4, 4) for _ in range(25)]).eval()


class Holds50(nn.Module):
    """50 parameters and a one-op forward that reads no Python attribute: the call is all
    bookkeeping (the cache key reads every parameter's metadata)."""

    def __init__(self):
        super().__init__()
        self.weights = nn.ParameterList([nn.Parameter(torch.randn(2)) for _ in range(50)])

    def forward(self, x):
        return x * 2


class Linears(nn.Module):
    """150 ``Linear(4, 4)`` layers (300 parameters) of which forward runs three, as a decode step
    of an LLM runs little per parameter on the host: the cache key covers every parameter."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(150)])

    def forward(self, x):
        return self.layers[2](self.layers[1](self.layers[0](x)))


@dataclass
class Settings:
    scale: float = 1.0
    temperature: float = 0.5


class Reader(nn.Module):
    """A layer whose forward reads Python state: a config object and plain attributes."""

    def __init__(self, settings: Settings):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.settings = settings
        self.temperature = 2.0
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return self.drop(self.linear(x)) * self.settings.scale / self.temperature


def reading_50() -> nn.Module:
    """25 ``Reader`` layers: 50 parameters and about 150 guarded reads."""
    torch.manual_seed(0)
    settings = Settings()
    return nn.Sequential(*[Reader(settings) for _ in range(25)]).eval()


CASES = {
    "tiny 5-op 4x4": (lambda: tiny_fn, lambda: (torch.randn(4, 4), torch.randn(4, 4))),
    "module 50 params, one-op forward": (Holds50, lambda: (torch.randn(4),)),
    "module 50 params, no reads": (plain_50, lambda: (torch.randn(1, 4),)),
    "module 50 params, 150 guarded reads": (reading_50, lambda: (torch.randn(1, 4),)),
    "module 300 params, 3 of 150 layers run": (lambda: Linears().eval(), lambda: (torch.randn(1, 4),)),
}


def scaled(x, *, mask, scale, bias=None):
    return x * mask * scale if bias is None else x * mask * scale + bias


def llama_2_layers() -> nn.Module:
    """A two-layer Llama of width 32 with seeded weights (transformers), in eval mode."""
    import transformers  # noqa: PLC0415

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=32,
        intermediate_size=64,
        max_position_embeddings=64,
        vocab_size=64,
    )
    return transformers.LlamaForCausalLM(config).eval()


def _token_batch() -> dict:
    ids = torch.randint(0, 64, (1, 8))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "use_cache": False}


#: Calls with keywords or non-tensor arguments (the general path, ``call_paths``), each
#: ``(make, make_args, make_kwargs)``: the structures Hugging Face models are called with.
KEYWORD_CASES = {
    "keywords: tensor, float, None": (
        lambda: scaled,
        lambda: (torch.randn(4, 4),),
        lambda: {"mask": torch.randn(4, 4), "scale": 0.5, "bias": None},
    ),
    "module 50 params, no reads, by keyword": (plain_50, lambda: (), lambda: {"input": torch.randn(1, 4)}),
    "HF Llama 2 layers, keywords": (llama_2_layers, lambda: (), _token_batch),
}


class LossAndLogits(nn.Module):
    """A classifier returning its loss and logits, as Hugging Face models do: ``loss.backward()``
    reaches the loss alone (eager's logits get no cotangent)."""

    def __init__(self, logits: bool = True):
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.logits = nn.Linear(16, 4), logits

    def forward(self, x, y):
        logits = self.lin(x)
        loss = nn.functional.cross_entropy(logits, y)
        return (loss, logits) if self.logits else loss


class Mlp50Loss(nn.Module):
    """``plain_50`` and an MSE loss, in training."""

    def __init__(self):
        super().__init__()
        self.layers = plain_50().train()

    def forward(self, x, y):
        return nn.functional.mse_loss(self.layers(x), y)


class Linears300Loss(nn.Module):
    """``Linears`` and an MSE loss, in training (SGD steps the three layers that get grads)."""

    def __init__(self):
        super().__init__()
        self.layers = Linears()

    def forward(self, x, y):
        return nn.functional.mse_loss(self.layers(x), y)


def _labels():
    return torch.randn(8, 16), torch.randint(0, 4, (8,))


TRAIN_CASES = {
    "train Linear(16,4) (loss, logits)": (LossAndLogits, _labels),
    "train Linear(16,4) loss only": (lambda: LossAndLogits(False), _labels),
    "train MLP 50 params": (Mlp50Loss, lambda: (torch.randn(1, 4), torch.randn(1, 4))),
    "train 300 params, 3 of 150 layers run": (Linears300Loss, lambda: (torch.randn(1, 4), torch.randn(1, 4))),
}


def train_step(model: nn.Module):
    """``step(*args)``: forward, ``backward()`` of the loss (the first output), SGD step and
    ``zero_grad(set_to_none=True)``."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(*args):
        out = model(*args)
        (out[0] if isinstance(out, tuple) else out).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def train_rows(settings: harness.Settings) -> list[dict]:
    """Per-step host cost of a training step, eager against thunder_rs (each its own copy)."""
    import thunder_rs

    rows = []
    for name, (make_model, make_args) in TRAIN_CASES.items():
        args = make_args()
        steps = {"eager": train_step(make_model()), "thunder_rs": train_step(thunder_rs.jit(make_model()))}
        rows.append(_measured_row(name, steps, args, settings))
    return rows


def _measured_row(name: str, calls: dict, args, settings: harness.Settings) -> dict:
    """Eager's and thunder_rs's median per call of ``calls``, interleaved, as a result row."""
    results, errors = harness.measure_per_call_interleaved(
        calls, args, repeats=settings.repeats, inner=max(1, int(200 * settings.inner_scale))
    )
    if errors:
        raise next(iter(errors.values()))
    eager, jit = results["eager"].median_us, results["thunder_rs"].median_us
    return {"case": name, "eager_us": eager, "thunder_rs_us": jit, "overhead_us": jit - eager, "ratio": jit / eager}


def per_call_rows(settings: harness.Settings) -> list[dict]:
    import thunder_rs

    rows = []
    for name, (make_fn, make_args) in CASES.items():
        fn, args = make_fn(), make_args()
        jfn = thunder_rs.jit(fn)
        with torch.no_grad():
            torch.testing.assert_close(jfn(*args), fn(*args))
            rows.append(_measured_row(name, {"eager": fn, "thunder_rs": jfn}, args, settings))
    for name, (make_fn, make_args, make_kwargs) in KEYWORD_CASES.items():
        try:
            fn = make_fn()
        except ImportError:  # (transformers not installed)
            continue
        args, kwargs = make_args(), make_kwargs()
        jfn = thunder_rs.jit(fn)
        calls = {"eager": functools.partial(fn, **kwargs), "thunder_rs": functools.partial(jfn, **kwargs)}
        with torch.no_grad():
            torch.testing.assert_close(calls["thunder_rs"](*args), calls["eager"](*args))
            rows.append(_measured_row(name, calls, args, settings))
    return rows


class Attention(nn.Module):
    """One attention layer over (batch, length, 8) with a (batch, length) padding mask: views by
    both sizes, a mask of length x length, so that a symbolic entry checks several relations."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.qkv, self.out = nn.Linear(8, 24), nn.Linear(8, 8)

    def forward(self, x, mask):
        b, t, c = x.shape
        q, k, v = (y.view(b, t, 2, 4).transpose(1, 2) for y in self.qkv(x).split(8, dim=-1))
        scores = (q @ k.transpose(-1, -2)).masked_fill(mask[:, None, None, :] == 0, float("-inf"))
        return self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c))


#: Cases whose sizes change (issue 26), each ``(make, make_args(size))``: per call of a symbolic
#: entry against a static compile at the same size; the issue's target is within 1 us.
SYMBOLIC_CASES = {
    "tiny 5-op (n, 4)": (lambda: tiny_fn, lambda n: (torch.randn(n, 4), torch.randn(n, 4))),
    "module 50 params, no reads (n, 4)": (plain_50, lambda n: (torch.randn(n, 4),)),
    "attention (n, n + 1, 8), mask": (
        lambda: Attention().eval(),
        lambda n: (torch.randn(n, n + 1, 8), torch.ones(n, n + 1)),
    ),
}


def symbolic_rows(calls: int) -> list[dict]:
    """Per call of a symbolic entry (compiled at sizes 2 and 3, called at 5) against a static
    compile at 5 (``jit(dynamic=False)``): the median of ``calls`` single calls of each, the two
    alternating call by call (blocks of calls drift apart by more than the difference on a shared
    machine)."""
    import thunder_rs

    rows = []
    for name, (make_fn, make_args) in SYMBOLIC_CASES.items():
        fn, args = make_fn(), make_args(5)
        symbolic, static = thunder_rs.jit(fn), thunder_rs.jit(fn, dynamic=False)
        samples: dict = {"static": [], "symbolic": []}
        with torch.no_grad():
            for n in (2, 3, 5):
                symbolic(*make_args(n))
            assert thunder_rs.compile_stats(symbolic).cache_misses == 2  # the second compile serves 5
            static(*args)
            for i in range(calls):
                for which, call in ((("static", static), ("symbolic", symbolic)))[:: 1 if i % 2 else -1]:
                    start = time.perf_counter_ns()
                    call(*args)
                    samples[which].append((time.perf_counter_ns() - start) / 1e3)
        at_static, at_symbolic = statistics.median(samples["static"]), statistics.median(samples["symbolic"])
        rows.append(
            {"case": name, "static_us": at_static, "symbolic_us": at_symbolic, "over_us": at_symbolic - at_static}
        )
    return rows


def first_call_rows(repeats: int) -> list[dict]:
    import thunder_rs

    config = GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=64)
    idx, targets = random_tokens(config, batch=2, seq=32), random_tokens(config, batch=2, seq=32, seed=1)
    rows = []
    for label, training in (("demo GPT forward (no_grad)", False), ("demo GPT training (loss + grads)", True)):
        samples, acquire = [], []
        for _ in range(repeats):
            model = GPT(config, seed=0)
            jm = thunder_rs.jit(model)
            start = time.perf_counter()
            if training:
                jm(idx, targets)[1].backward()
            else:
                with torch.no_grad():
                    jm(idx, targets)
            samples.append((time.perf_counter() - start) * 1e3)
            acquire.append(thunder_rs.compile_stats(jm).stage_s.get("acquire", 0.0) * 1e3)
        rows.append(
            {"case": label, "first_call_ms": statistics.median(samples), "acquire_ms": statistics.median(acquire)}
        )
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke test)")
    parser.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    settings = harness.settings_for(args.quick)
    per_call = per_call_rows(settings) + train_rows(settings)
    symbolic = symbolic_rows(301 if args.quick else 3001)
    first = first_call_rows(3 if args.quick else 11)
    print(f"{'case':40} {'eager us':>9} {'thunder_rs us':>14} {'overhead us':>12} {'ratio':>6}")
    for r in per_call:
        print(
            f"{r['case']:40} {r['eager_us']:9.2f} {r['thunder_rs_us']:14.2f} {r['overhead_us']:12.2f} {r['ratio']:6.2f}"
        )
    print(f"\n{'symbolic sizes (issue 26)':40} {'static us':>9} {'symbolic us':>14} {'over us':>12}")
    for r in symbolic:
        print(f"{r['case']:40} {r['static_us']:9.2f} {r['symbolic_us']:14.2f} {r['over_us']:12.2f}")
    print(f"\n{'case':40} {'first call ms':>14} {'acquire ms':>11}")
    for r in first:
        print(f"{r['case']:40} {r['first_call_ms']:14.2f} {r['acquire_ms']:11.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "per_call": per_call,
                    "symbolic": symbolic,
                    "first_call": first,
                    "environment": harness.environment_info(),
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
