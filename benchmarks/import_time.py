"""What ``import thunder_rs`` costs on top of ``import torch``, in fresh interpreters.

    python benchmarks/import_time.py [--runs N] [--json PATH]

Each run is a new process that times ``import torch`` and then ``import thunder_rs`` with
``perf_counter``; the report gives the median and spread of both, and which optional heavy
modules (Dynamo, Inductor, FSDP/DTensor) the import loaded (none should be: they load when a
program uses them). Target (issue 25): at most 100 ms over torch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

HEAVY = ("torch._dynamo", "torch._inductor", "torch.distributed.fsdp", "torch.distributed.tensor")
PROBE = f"""
import sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import thunder_rs
t2 = time.perf_counter()
print(t1 - t0, t2 - t1, [m for m in {HEAVY!r} if m in sys.modules])
"""


def one_run() -> tuple[float, float, list[str]]:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout.split(" ", 2)
    return float(out[0]), float(out[1]), eval(out[2])  # noqa: S307 (our own probe's list of names)


def measure(runs: int) -> dict:
    samples = [one_run() for _ in range(runs)]
    torch_s = [s[0] for s in samples]
    ours = [s[1] for s in samples]
    return {
        "runs": runs,
        "torch_ms": 1e3 * statistics.median(torch_s),
        "thunder_rs_ms": 1e3 * statistics.median(ours),
        "thunder_rs_min_ms": 1e3 * min(ours),
        "thunder_rs_max_ms": 1e3 * max(ours),
        "heavy_loaded": sorted({m for s in samples for m in s[2]}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    result = measure(args.runs)
    print(f"import torch:                {result['torch_ms']:8.1f} ms (median of {args.runs})")
    print(
        f"import thunder_rs after it:  {result['thunder_rs_ms']:8.1f} ms "
        f"(min {result['thunder_rs_min_ms']:.1f}, max {result['thunder_rs_max_ms']:.1f}; target <= 100 ms)"
    )
    print(f"optional heavy modules loaded: {result['heavy_loaded'] or 'none'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
