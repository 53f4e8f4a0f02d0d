"""What reading recorded outputs as records costs acquisition (issue 25): the outputs the recorder
describes while the demo GPT is acquired, the time to read one output's five fields
(``_core.RecordedTensor`` getters, what ``recorder.proxies`` reads), and their product as a share
of the acquire stage: a bound on what records cost over the tuples they replaced, which were
unpacked too, their fields made when recorded. The per-output figure is the fastest of many
short batches, so that other load on the machine shows less in it than in the stage's median.

    python benchmarks/recorder_outputs.py
"""

import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import gpt  # noqa: E402
import thunder_rs  # noqa: E402
from thunder_rs import _core  # noqa: E402
from thunder_rs.core.lang import recorder  # noqa: E402


def best_ns(fn, number: int = 500, repeat: int = 200) -> float:
    """The fastest of ``repeat`` batches of ``number`` calls, per call."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, time.perf_counter() - start)
    return best / number * 1e9


def field_read_ns() -> float:
    """Reading the five fields of one recorded output."""
    rec = _core.Recorder()
    with recorder.recording(rec):
        a = recorder.input_proxy(rec, torch.randn(4, 8))
        (out,) = rec.prim("add", (a, a), False)
    return best_ns(lambda: (out.vid, out.shape, out.dtype_code, out.device, out.requires_grad))


def acquired(model, idx, train: bool) -> tuple[int, float]:
    """The outputs recorded while a fresh jit of ``model`` is acquired, and the acquire stage's seconds."""
    seen = [0]
    make = recorder.make_proxy

    def counting(*fields):
        seen[0] += 1
        return make(*fields)

    recorder.make_proxy = counting  # proxies() makes one per recorded output (inputs too, counted apart)
    try:
        jmodel = thunder_rs.jit(model)
        if train:
            jmodel(idx)[0].sum().backward()
        else:
            with torch.no_grad():
                jmodel(idx)
    finally:
        recorder.make_proxy = make
    inputs = len(thunder_rs.last_traces(jmodel)[0].input_requires_grad())
    return seen[0] - inputs, thunder_rs.compile_stats(jmodel).stage_s["acquire"]


def main() -> None:
    torch.set_num_threads(1)
    config = gpt.GPTConfig()
    model = gpt.GPT(config)
    gpt.init_weights(model, 0)
    idx = gpt.random_tokens(config, 2, 32)
    read_ns = field_read_ns()
    print(f"reading one recorded output's fields: {read_ns:.0f} ns")
    for train in (False, True):
        acquired(model, idx, train)  # one-time process costs
        runs = [acquired(model, idx, train) for _ in range(9)]
        outputs, acquire_s = runs[0][0], statistics.median(s for _, s in runs)
        share = outputs * read_ns * 1e-9 / acquire_s
        print(
            f"{'training' if train else 'inference'}: {outputs} recorded outputs, acquire {acquire_s * 1e3:.1f} ms "
            f"(median), field reads {outputs * read_ns * 1e-3:.1f} us = {share:.2%} of it"
        )


if __name__ == "__main__":
    main()
