"""Per-call guard check of a symbolic entry: the greedy decode of ``dynamic_shapes.py`` (a tiny GPT-2
with a growing KV cache), its per-token CPU time, and the CPU time of the entry's ``check`` on each
token's inputs (its compiled guards, the captured tensors' metadata, hooks), medians.

    python benchmarks/guard_check.py [--runs 3] [--tokens 64]

One thread (``torch.set_num_threads(1)``) and the thread's CPU time, which leaves out the time other
processes hold the cores. Run it against another checkout of the Python package
(``PYTHONPATH=<other>/python``) to compare before and after.
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dynamic_shapes as ds  # noqa: E402
import thunder_rs  # noqa: E402
from thunder_rs.core.run import entry as entries  # noqa: E402

clock = time.thread_time_ns


def watch_checks() -> dict:
    """Makes each new entry's ``check`` note the entry and the inputs it was last called with."""
    seen: dict = {"checks": {}}
    make = entries.make_check

    def make_check(entry, guards, *rest):
        check = make(entry, guards, *rest)
        if check is None:
            return None
        seen["checks"][id(entry)] = check

        def noted(flat):
            seen["entry"], seen["flat"] = entry, flat
            return check(flat)

        return noted

    entries.make_check = make_check
    return seen


def run(tokens: int, seen: dict, steps: list, checks: list, repeats: int = 100) -> None:
    model = ds.tiny_gpt2().eval()
    call = thunder_rs.jit(model)
    ids = torch.randint(3, ds.VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    step, _ = ds.decoder(call, ds.cache_keyword(model), ids)
    for i in range(tokens + 1):
        start = clock()
        step()
        took = clock() - start
        if i < 5:  # the prompt, and the tokens that compile
            continue
        steps.append(took / 1e3)
        check, flat = seen["checks"][id(seen["entry"])], seen["flat"]
        start = clock()
        for _ in range(repeats):
            check(flat)
        checks.append((clock() - start) / 1e3 / repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="decodes, each with a new model and jit")
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    seen = watch_checks()
    steps: list = []
    checks: list = []
    for _ in range(args.runs):
        run(args.tokens, seen, steps, checks)
    entry = seen["entry"]
    print(f"guards of the symbolic entry: {len(entry.guards.per_call)} per call, {len(entry.guards.modules)} modules")
    print(f"decode step CPU us:  median {statistics.median(steps):.1f} (n={len(steps)})")
    print(f"entry.check CPU us:  median {statistics.median(checks):.2f}  min {min(checks):.2f}")


if __name__ == "__main__":
    main()
