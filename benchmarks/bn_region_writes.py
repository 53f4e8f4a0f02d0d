"""Host CPU time of the write-backs after a compiled call whose fusion regions wrote BatchNorm's
running statistics themselves (``Region.writes``: the call returns the buffers, the write-backs
check that and bump the counts) against the write-backs copying them (two ``_foreach_copy_``s,
the counters set after), for ResNet-18's 20 BatchNorms (40 float statistics of 64-512 channels, 20
int64 counts). The trace's function is a stand-in returning the values, so this times the
generated write-back code alone, on CPU tensors (a GPU adds the foreach copies' two launches to
the copies' path). Rounds alternate the two so that the machine's load moves both alike.

    OMP_NUM_THREADS=1 PYTHONPATH=python python benchmarks/bn_region_writes.py --rounds 7 --calls 20000
"""

import argparse
import sys
import time

import torch

from thunder_rs.core.acquisition.writeback import WriteBacks, with_writebacks

CHANNELS = [64] * 5 + [128] * 5 + [256] * 5 + [512] * 5


def _buffers() -> list:
    stats = [torch.zeros(c) for c in CHANNELS for _ in range(2)]
    return stats + [torch.zeros((), dtype=torch.int64) for _ in CHANNELS]


def _writebacks(n: int, in_place: bool) -> WriteBacks:
    """The write-backs of a call with one argument (input ``n``) and ``n`` buffers (inputs 0..n-1),
    returning one output then the buffers' values."""
    copies = tuple((k, 1 + k, False) for k in range(n))
    floats, ints = tuple(range(2 * len(CHANNELS))), tuple(range(2 * len(CHANNELS), n))
    return WriteBacks(
        1,
        "single",
        copies,
        (),
        (),
        (0,),
        separate=(n,),
        module=(0, n),
        versions=tuple((k, 0) for k in floats),
        batched=(floats, ints),
        in_place=tuple(range(n)) if in_place else (),
    )


def _call(in_place: bool):
    buffers, x = _buffers(), torch.randn(4)
    values = buffers if in_place else [b.clone() + 1 for b in buffers]
    out = x * 2

    def fn(*inputs):
        return (out, *values)

    return with_writebacks(fn, _writebacks(len(buffers), in_place)), (*buffers, x)


def _cpu_us(call, inputs, calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        call(*inputs)
    return (time.process_time() - start) / calls * 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args(argv)
    paths = {"regions write": _call(True), "copies": _call(False)}
    figures: dict = {name: [] for name in paths}
    with torch.no_grad():
        for _ in range(args.rounds):
            for name, (call, inputs) in paths.items():
                figures[name].append(_cpu_us(call, inputs, args.calls))
    for name, values in figures.items():
        runs = ", ".join(f"{v:.1f}" for v in values)
        print(f"{name}: median {sorted(values)[len(values) // 2]:.1f} us CPU a call ({runs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
