"""Forward-pass benchmark: thunder_rs against eager PyTorch (and Lightning Thunder / torch.compile).

    python benchmarks/bench_forward.py [--quick] [--with-compile] [--json PATH] [--cases a,b]

Runs single-threaded on CPU. Backends that cannot be imported are skipped with a one-line note, so
this runs before thunder_rs exists. See benchmarks/harness.py for what is measured and how.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

import harness  # noqa: E402
from gpt import Block, GPTConfig  # noqa: E402

CHAIN_LENGTH = 200


# ----------------------------------------------------------------------------- case functions


def tiny_fn(a, b):
    c = a + b
    d = c * a
    e = torch.sin(d)
    f = e - b
    return torch.exp(f)


def make_mlp(width: int = 64) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(width, width),
        nn.GELU(),
        nn.Linear(width, width),
        nn.GELU(),
        nn.Linear(width, width),
        nn.GELU(),
    ).eval()


def softmax_matmul(a, b, c):
    return torch.softmax(a @ b, dim=-1) @ c


def make_gpt_block() -> nn.Module:
    torch.manual_seed(0)
    return Block(GPTConfig(block_size=32, n_embd=64, n_head=4, dropout=0.0)).eval()


# One line per torch call; every step reads the previous value, so nothing is dead code. Each group of
# ten starts with a bounded op (sin), so values stay finite for any number of groups.
_CHAIN_STEPS = [
    "t = torch.sin({p})",
    "t = {p} * b",
    "t = torch.cos({p})",
    "t = torch.exp({p})",
    "t = torch.add({p}, a)",
    "t = torch.tanh({p})",
    "t = torch.mul({p}, 0.5)",
    "t = {p} - b",
    "t = torch.sigmoid({p})",
    "t = {p} + a",
]


def chain_source(n_ops: int = CHAIN_LENGTH, name: str = "chain_fn") -> str:
    lines = [f"def {name}(a, b):"]
    prev = "a"
    for i in range(n_ops):
        lines.append("    " + _CHAIN_STEPS[i % len(_CHAIN_STEPS)].format(p=prev).replace("t =", f"t{i} =", 1))
        prev = f"t{i}"
    lines.append(f"    return {prev}")
    return "\n".join(lines) + "\n"


def make_chain_fn(n_ops: int = CHAIN_LENGTH):
    """A real Python function with ``n_ops`` straight-line torch calls (source registered in linecache)."""
    import linecache

    source = chain_source(n_ops)
    filename = f"<generated chain_fn_{n_ops}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"torch": torch}
    exec(compile(source, filename, "exec"), namespace)
    return namespace["chain_fn"]


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def build_cases() -> list[harness.Case]:
    chain_fn = make_chain_fn()
    return [
        harness.Case(
            "tiny_5op_4x4",
            lambda: tiny_fn,
            lambda: (_randn(4, 4), _randn(4, 4, seed=1)),
            inner=400,
            description="5 elementwise ops on 4x4 (per-call overhead)",
        ),
        harness.Case(
            "mlp_3x64_b32",
            make_mlp,
            lambda: (_randn(32, 64),),
            inner=200,
            no_grad=True,
            description="3 x (Linear 64->64 + GELU), batch 32, eval, no_grad",
        ),
        harness.Case(
            "softmax_matmul_64",
            lambda: softmax_matmul,
            lambda: (_randn(64, 64), _randn(64, 64, seed=1), _randn(64, 64, seed=2)),
            inner=200,
            description="softmax(a @ b) @ c, 64x64",
        ),
        harness.Case(
            "gpt_block_b4_t32",
            make_gpt_block,
            lambda: (_randn(4, 32, 64),),
            inner=50,
            no_grad=True,
            description="GPT block n_embd 64, 4 heads, seq 32, batch 4, eval, no_grad",
        ),
        harness.Case(
            "chain_200op_16x16",
            lambda: chain_fn,
            lambda: (_randn(16, 16), _randn(16, 16, seed=1)),
            inner=20,
            description=f"{CHAIN_LENGTH} elementwise ops on 16x16",
        ),
    ]


# ----------------------------------------------------------------------------- targets

# (case, metric, limit, label); metric "ratio" is per call vs eager, "first_ms" the first-call time.
TARGETS = [
    ("tiny_5op_4x4", "ratio", 1.5, "per call, tiny fn       <= 1.5x eager"),
    ("gpt_block_b4_t32", "ratio", 1.05, "per call, GPT block     <= 1.05x eager"),
    ("gpt_block_b4_t32", "first_ms", 50.0, "first call, GPT block   < 50 ms"),
    ("chain_200op_16x16", "first_ms", 30.0, "first call, 200-op chain < 30 ms"),
]


# ----------------------------------------------------------------------------- main


def main(argv=None) -> int:
    args = harness.parse_args(__doc__, argv)
    torch.set_num_threads(1)
    cases = harness.select(build_cases(), args.cases)
    backends = harness.backends_from_args(args)
    print(harness.format_skipped(backends))
    load_before = os.getloadavg()[0]
    rows = harness.run_all(cases, backends, harness.settings_for(args.quick))
    print(f"\n{harness.format_header(load_before, args.quick, backends)}\n")
    print(harness.format_table(rows))
    targets = harness.evaluate_targets(TARGETS, rows)
    print()
    print(harness.format_targets(targets))
    if args.json:
        harness.write_json(args.json, rows, targets, backends, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
