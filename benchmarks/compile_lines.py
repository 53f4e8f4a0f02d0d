"""Python line events of the warm compiles of compile_times.py's decode and padding runs: a count
that a loaded machine does not move.

    python benchmarks/compile_lines.py [--runs decode,padding] [--top 25] [--cold]

One process per run builds the run's tiny GPT-2 and runs it twice, each time on a fresh model, and
counts with ``sys.settrace`` the lines Python runs in the second run's compiles (``--cold``: in the
first run's, as ``dynamic_shapes.py`` has them: module loads and per-process scans included)
(``ThunderFunction._compile_with``), per compile and per function (own lines, calls). CPU times
(``compile_times.py``) move by 10-20% on a shared machine; these counts move only with the code, so
a change to the Python work of a compile shows at once, and where. Not counted: work in C (torch's
ops, the Rust core) and the observer's callbacks (the profile hook runs them with tracing off: time
those with ``thunder_rs.compile_stats`` or by wrapping its methods).
"""

import argparse
import collections
import gc
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


class LineCounter:
    """Counts the line events of the frames started while it is set, by function."""

    def __init__(self) -> None:
        self.own: collections.Counter = collections.Counter()
        self.calls: collections.Counter = collections.Counter()
        self.total = 0

    def call(self, frame, event, arg):
        code = frame.f_code
        name = f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}:{code.co_name}"
        self.calls[name] += 1

        def line(frame, event, arg):
            if event == "line":
                self.total += 1
                self.own[name] += 1
            return line

        return line


def one_process(run: str, top: int, cold: bool = False) -> None:
    import torch  # noqa: PLC0415 (after the arguments are read)

    sys.path.insert(0, HERE)
    import dynamic_shapes as ds  # noqa: PLC0415
    import thunder_rs  # noqa: PLC0415
    from thunder_rs.core.run import jit  # noqa: PLC0415

    counter, per_compile, counting = LineCounter(), [], [False]
    compile_with = jit.ThunderFunction._compile_with

    def counted(self, *args, **kwargs):
        if not counting[0]:
            return compile_with(self, *args, **kwargs)
        start = counter.total
        sys.settrace(counter.call)
        try:
            return compile_with(self, *args, **kwargs)
        finally:
            sys.settrace(None)
            per_compile.append(counter.total - start)

    jit.ThunderFunction._compile_with = counted
    torch.set_num_threads(1)
    try:
        for counting[0] in (True,) if cold else (False, True):
            model = ds.tiny_gpt2()
            if run == "decode":
                ids = torch.randint(3, ds.VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
                step, _ = ds.decoder(thunder_rs.jit(model.eval()), ds.cache_keyword(model), ids)
                steps: list = [None] * 65
            else:
                step, steps = ds.trainer(model, thunder_rs.jit(model)), ds.padded_batches(4)
            gc.collect()
            for s in steps:
                step(s)
    finally:
        jit.ThunderFunction._compile_with = compile_with  # (the next run's wraps the original)
    print(f"{run}: {'cold' if cold else 'warm'} compiles' line events {per_compile}  total {counter.total}")
    for name, n in counter.own.most_common(top):
        print(f"  {n:8d} lines {counter.calls[name]:6d} calls  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="decode,padding")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--cold", action="store_true", help="count the first run's compiles (the process's first)")
    args = parser.parse_args()
    for run in args.runs.split(","):
        one_process(run, args.top, args.cold)


if __name__ == "__main__":
    main()
