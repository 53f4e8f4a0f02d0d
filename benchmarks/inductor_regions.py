"""The Inductor executor's costs, single-threaded: Inductor's one-time start-up in a process, the
compile time of each region of the demo GPT's training step (forward and backward) with the
on-disk caches cold and then warm, and the per-call overhead of a compiled region over the
compiled artifact's own call.

    python benchmarks/inductor_regions.py

runs three fresh processes on a fresh Inductor cache directory and a fresh thunder_rs artifact
cache (``THUNDER_RS_CACHE_DIR``): the first compiles every region (cold: the C++ compiler runs)
and stores them in both caches; the second has thunder_rs's artifact cache off, so each region
is traced to an FX graph and Inductor loads it from its own caches by its key; the third loads
each region from thunder_rs's artifact cache.
"""

import os
import statistics
import subprocess
import sys
import tempfile
import timeit

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import gpt  # noqa: E402
import thunder_rs  # noqa: E402
from thunder_rs.executors import Region, inductor_ex  # noqa: E402


def compile_gpt_training_step() -> None:
    """One training step of the demo GPT under jit(executors=["inductor"]): every region of its
    forward and backward compiles."""
    model = gpt.GPT(gpt.GPTConfig(), seed=0)
    idx = gpt.random_tokens(model.config, 2, 32)
    jmodel = thunder_rs.jit(model, executors=["inductor"])
    jmodel(idx, idx)[1].backward()


def call_overhead_us() -> tuple[float, float]:
    """µs per call of a compiled three-op region on 4-element tensors, and of the Inductor
    artifact it calls."""
    impls = {name: impl for name, _, impl in inductor_ex.inductor_ex.implmap.values()}
    source = "def region(t0, t1):\n    t2 = prim_add(t0, t1)\n    t3 = prim_mul(t2, t0)\n    return (prim_sin(t3),)\n"
    exec(source, impls)
    function = impls["region"]

    region = Region("region", source, source, function, ("add", "mul", "sin"), 2, 1)
    a, b = torch.randn(4), torch.randn(4)
    compiled = inductor_ex.inductor_ex.fuse(region)
    compiled(a, b)
    artifact, _ = inductor_ex.compile_artifact(function, (a, b))

    def best(fn, n=20000):
        return min(timeit.repeat(fn, number=n, repeat=7)) / n * 1e6

    return best(lambda: compiled(a, b)), best(lambda: artifact(a, b))


def child() -> None:
    torch.set_num_threads(1)
    compile_gpt_training_step()
    stats = inductor_ex.stats()
    times = [1e3 * t for t in stats.compile_s]
    print(f"  start-up: {stats.startup_s['cpu']:.2f} s (imports and a first one-op compile)")
    print(
        f"  {stats.misses} region compiles: {stats.artifact_hits} loaded from thunder_rs's artifact cache, "
        f"{stats.disk_hits} from Inductor's disk caches; {stats.hits} shared in-process"
    )
    print(
        f"  per region: median {statistics.median(times):.0f} ms, min {min(times):.0f} ms, max {max(times):.0f} ms "
        f"(in order: {', '.join(f'{t:.0f}' for t in times)} ms)"
    )
    if "--call-overhead" in sys.argv:
        region_call, artifact_call = call_overhead_us()
        print(
            f"  per call: compiled region {region_call:.1f} µs, its Inductor artifact {artifact_call:.1f} µs "
            f"(overhead {region_call - artifact_call:.1f} µs)"
        )


RUNS = (
    ("cold (fresh cache directories)", {}, []),
    ("warm Inductor caches, thunder_rs's artifact cache off (a second process)", {"THUNDER_RS_CACHE_DIR": ""}, []),
    ("warm thunder_rs artifact cache (a third process)", {}, ["--call-overhead"]),
)


def main() -> None:
    if "--child" in sys.argv:
        child()
        return
    with tempfile.TemporaryDirectory() as cache:
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache, "inductor"),
            "THUNDER_RS_CACHE_DIR": os.path.join(cache, "thunder_rs"),
        }
        for label, overrides, flags in RUNS:
            print(label)
            subprocess.run([sys.executable, __file__, "--child", *flags], env={**env, **overrides}, check=True)


if __name__ == "__main__":
    main()
