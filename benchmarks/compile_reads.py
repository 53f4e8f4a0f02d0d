"""Compile time of programs that read values while they are traced, one process.

    python benchmarks/compile_reads.py [--layers 2,4,8,16] [--device cuda] [--json out.json]

A tiny Hugging Face Qwen2-MoE (`dynamic_shapes.tiny_qwen2_moe`: 8 experts, top-2, the "eager" experts loop: a
``torch.where`` of the routing mask per expert and layer, read while tracing) is trained one
step (loss and backward) at each depth. For each: the first call under ``thunder_rs.jit``
(trace, compile and run), with the recording run in segments (``core/lang/snapshots.py``: each
read runs only the calls no earlier read ran) and, for comparison, run from its start at each
read (what thunder_rs did before segments: forced here by a kept-memory budget of 0), and eager's
step. The number of reads is the number of snapshot evaluations of the first call.
"""

import argparse
import json
import time
import warnings

import torch

import dynamic_shapes
import thunder_rs
from thunder_rs.core.lang import snapshots, values

DEVICE = torch.device("cpu")


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def step_s(call, ids) -> float:
    start = time.perf_counter()
    call(input_ids=ids, labels=ids).loss.backward()
    sync()
    return time.perf_counter() - start


class Counted(snapshots.Snapshots):
    """Snapshots counting the reads they answered."""

    reads = 0

    def values(self, wanted: list, inputs: list) -> list:
        Counted.reads += 1
        return super().values(wanted, inputs)


def first_call(layers: int, ids, segments: bool) -> tuple[float, int]:
    budget = snapshots._budget
    if not segments:
        snapshots._budget = lambda device: 0
    Counted.reads = 0
    try:
        return step_s(thunder_rs.jit(dynamic_shapes.tiny_qwen2_moe(layers)), ids), Counted.reads
    finally:
        snapshots._budget = budget


def main() -> None:
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="2,4,8,16")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    DEVICE = dynamic_shapes.DEVICE = torch.device(args.device)
    warnings.simplefilter("ignore")
    values.Snapshots = Counted
    ids = torch.randint(0, dynamic_shapes.VOCAB, (8, 64), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    results = []
    for layers in map(int, args.layers.split(",")):
        model = dynamic_shapes.tiny_qwen2_moe(layers)
        step_s(model, ids)  # (warm)
        segmented, reads = first_call(layers, ids, True)
        from_start, _ = first_call(layers, ids, False)
        row = {"layers": layers, "reads": reads, "segments_s": segmented, "from_start_s": from_start}
        row["eager_step_s"] = step_s(model, ids)
        results.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(DEVICE), "torch": torch.__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
