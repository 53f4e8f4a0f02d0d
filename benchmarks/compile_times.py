"""CPU time of each compile of dynamic_shapes.py's decode and padding runs: medians over fresh processes.

    python benchmarks/compile_times.py [--processes 7] [--runs decode,padding] [--repeats 1]

Each process builds the run's tiny GPT-2, collects garbage (a full collection of a process that
imported torch and transformers costs some 0.2 s of CPU and, left to fall due, lands in whichever
compile allocates next), then times each compile (``ThunderFunction._compile_with``) by the
process's CPU time: decode compiles three times in its 65 calls (prompt, first token, symbolic),
padding twice in its first steps (static, then symbolic). The first compile of a process is cold
(bytecode walks, modules loaded at the first compile). A check of guards compiled at an entry's
first hit is in that call's time, not a compile's.

``--repeats N`` runs the run N times in each process, each on a fresh model: the compiles of the
runs after the first are warm ones, reported as medians per compile of the run (``warm``) over
all processes' repeats.
"""

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def one_process(run: str, repeats: int = 1) -> list[float]:
    """This process's compile CPU times (ms) for ``run``, done ``repeats`` times."""
    import torch  # noqa: PLC0415 (in the child only)

    sys.path.insert(0, HERE)
    import dynamic_shapes as ds  # noqa: PLC0415
    import thunder_rs  # noqa: PLC0415
    from thunder_rs.core.run import jit  # noqa: PLC0415

    times: list[float] = []
    compile_with = jit.ThunderFunction._compile_with

    def timed(self, *args, **kwargs):
        start = time.process_time()
        try:
            return compile_with(self, *args, **kwargs)
        finally:
            times.append((time.process_time() - start) * 1e3)

    jit.ThunderFunction._compile_with = timed
    torch.set_num_threads(1)
    for _ in range(repeats):
        if run == "decode":
            model = ds.tiny_gpt2().eval()
            ids = torch.randint(3, ds.VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
            step, _ = ds.decoder(thunder_rs.jit(model), ds.cache_keyword(model), ids)
            gc.collect()
            for _ in range(65):
                step()
        else:
            model = ds.tiny_gpt2()
            step = ds.trainer(model, thunder_rs.jit(model))
            gc.collect()
            for batch in ds.padded_batches(4):
                step(batch)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=7)
    parser.add_argument("--runs", default="decode,padding")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_process(args.child, args.repeats)))
        return
    for run in args.runs.split(","):
        rows = []
        for _ in range(args.processes):
            command = [sys.executable, __file__, "--child", run, "--repeats", str(args.repeats)]
            out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
        per_run = len(rows[0]) // args.repeats
        first = [r[:per_run] for r in rows]
        per = [statistics.median(r[i] for r in first if len(r) > i) for i in range(per_run)]
        total = statistics.median(sum(r) for r in first)
        print(f"{run}: compiles (CPU ms, medians of {len(rows)}) {[round(p, 1) for p in per]}  total {total:.1f}")
        if args.repeats > 1:
            warm = [
                statistics.median(r[k] for r in rows for k in range(per_run + i, len(r), per_run))
                for i in range(per_run)
            ]
            print(
                f"{run}: warm compiles (CPU ms, medians of {len(rows)}x{args.repeats - 1})",
                [round(w, 1) for w in warm],
            )


if __name__ == "__main__":
    main()
