"""Fresh-compile time of the demo GPT under thunder_rs.jit: medians of 9 first calls of new jits,
inference (no_grad) and training (forward and backward), single-threaded.

    python benchmarks/compile_gpt.py [--clock cpu]

``--clock cpu`` times each compile (``ThunderFunction._compile_with``) by the process's CPU time
instead of the compile's own wall-time figure, which leaves out the time other processes of a
shared machine hold the cores.
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import gpt  # noqa: E402
import thunder_rs  # noqa: E402
from thunder_rs.core.run import jit  # noqa: E402

#: The CPU time of the last compile (``--clock cpu``), or None to read the compile's wall time.
_cpu_ms: list | None = None


def _cpu_timed(compile_with):
    def timed(self, *args, **kwargs):
        start = time.process_time()
        try:
            return compile_with(self, *args, **kwargs)
        finally:
            assert _cpu_ms is not None
            _cpu_ms.append((time.process_time() - start) * 1e3)

    return timed


def fresh_compile_ms(model, idx, train: bool) -> float:
    jmodel = thunder_rs.jit(model)
    if train:
        jmodel(idx)[0].sum().backward()
    else:
        with torch.no_grad():
            jmodel(idx)
    return _cpu_ms[-1] if _cpu_ms is not None else thunder_rs.compile_stats(jmodel).last_compile_s * 1e3


def main() -> None:
    global _cpu_ms
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    if parser.parse_args().clock == "cpu":
        _cpu_ms = []
        jit.ThunderFunction._compile_with = _cpu_timed(jit.ThunderFunction._compile_with)
    torch.set_num_threads(1)
    config = gpt.GPTConfig()
    model = gpt.GPT(config)
    gpt.init_weights(model, 0)
    idx = gpt.random_tokens(config, 2, 32)
    for train in (False, True):
        fresh_compile_ms(model, idx, train)  # one-time process costs
        times = [fresh_compile_ms(model, idx, train) for _ in range(9)]
        print(f"{'training' if train else 'inference'}: median compile {statistics.median(times):.1f} ms")


if __name__ == "__main__":
    main()
