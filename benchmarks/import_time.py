"""What ``import thunder_rs`` costs on top of ``import torch``, in fresh interpreters.

    python benchmarks/import_time.py [--runs N] [--json PATH]

Each run is a new process that times ``import torch`` and then ``import thunder_rs`` with
``perf_counter`` (and the process's CPU time, which other processes on the cores leave alone);
the report gives the median and spread of both, the machine's load average while it ran, and
which optional heavy modules (Dynamo, Inductor, FSDP/DTensor) the import loaded (none should be:
they load when a program uses them). Target (issue 25): at most 100 ms over torch.

The runs read compiled bytecode as an installed package does: ``PYTHONDONTWRITEBYTECODE`` is
dropped for them, and one run first writes what is missing (else every run would compile the
package's sources, about half a second, and time that).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HEAVY = ("torch._dynamo", "torch._inductor", "torch.distributed.fsdp", "torch.distributed.tensor")
PROBE = f"""
import sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
c1 = time.process_time()
import thunder_rs
t2 = time.perf_counter()
c2 = time.process_time()
print(t1 - t0, t2 - t1, c2 - c1, [m for m in {HEAVY!r} if m in sys.modules])
"""
#: The runs' environment: bytecode read and written as without the variable.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def one_run() -> tuple[float, float, float, list[str]]:
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env=ENV)
    out = run.stdout.split(" ", 3)
    return float(out[0]), float(out[1]), float(out[2]), eval(out[3])  # noqa: S307 (our own probe's list of names)


def measure(runs: int) -> dict:
    one_run()  # writes the bytecode the runs read
    load_before = os.getloadavg()[0]
    samples = [one_run() for _ in range(runs)]
    ours = [s[1] for s in samples]
    return {
        "runs": runs,
        "torch_ms": 1e3 * statistics.median(s[0] for s in samples),
        "thunder_rs_ms": 1e3 * statistics.median(ours),
        "thunder_rs_min_ms": 1e3 * min(ours),
        "thunder_rs_max_ms": 1e3 * max(ours),
        "thunder_rs_cpu_ms": 1e3 * statistics.median(s[2] for s in samples),
        "load_average": [load_before, os.getloadavg()[0]],
        "cpus": os.cpu_count(),
        "heavy_loaded": sorted({m for s in samples for m in s[3]}),
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
    print(f"  its CPU time:               {result['thunder_rs_cpu_ms']:8.1f} ms (median)")
    load = result["load_average"]
    print(f"load average (1 min):        {load[0]:8.2f} before, {load[1]:.2f} after, on {result['cpus']} CPUs")
    print(f"optional heavy modules loaded: {result['heavy_loaded'] or 'none'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
