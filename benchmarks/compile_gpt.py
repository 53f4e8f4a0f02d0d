"""Fresh-compile time of the demo GPT under thunder_rs.jit: medians of 9 first calls of new jits,
inference (no_grad) and training (forward and backward), single-threaded.

    python benchmarks/compile_gpt.py
"""

import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import gpt  # noqa: E402
import thunder_rs  # noqa: E402


def fresh_compile_ms(model, idx, train: bool) -> float:
    jmodel = thunder_rs.jit(model)
    if train:
        jmodel(idx)[0].sum().backward()
    else:
        with torch.no_grad():
            jmodel(idx)
    return thunder_rs.compile_stats(jmodel).last_compile_s * 1e3


def main() -> None:
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
