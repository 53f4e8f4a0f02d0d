"""Python line events of one cache-hit call: a count that a loaded machine does not move.

    python benchmarks/hit_lines.py [--top 12]

For the programs of ``inplace_views.py`` (an argument written twice; a view returned after its
base was written through it) and for the forward of 4 x ``nn.Linear(64, 64)`` in a bfloat16
autocast region (``autocast_step.py``: its casts looked up in torch's cache), counts with
``sys.settrace`` the lines Python runs in one warm call, per function (own lines). Work in C
(torch's ops, the Rust core) is not counted: time that with ``inplace_views.py`` and
``autocast_step.py``.
"""

import argparse
import collections
import os
import sys

import torch

import thunder_rs

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from inplace_views import twice, vw  # noqa: E402


def _counted(call) -> collections.Counter:
    own: collections.Counter = collections.Counter()

    def start(frame, event, arg):
        code = frame.f_code
        name = f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}:{code.co_name}"

        def line(frame, event, arg):
            if event == "line":
                own[name] += 1
            return line

        return line

    sys.settrace(start)
    try:
        call()
    finally:
        sys.settrace(None)
    return own


def _autocast_forward():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    jm, x = thunder_rs.jit(model), torch.randn(8, 64)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return jm(x)

    for _ in range(3):
        step().float().sum().backward()
        model.zero_grad(set_to_none=True)

    return step  # (its region's enter and exit counted too)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(1)
    calls = []
    for fn in (twice, vw):
        jf, x = thunder_rs.jit(fn), torch.randn(8, 8)
        for _ in range(3):
            jf(x)
        calls.append((fn.__name__, lambda jf=jf, x=x: jf(x)))
    calls.append(("autocast forward, 4 Linear", _autocast_forward()))
    for name, call in calls:
        own = _counted(call)
        print(f"{name}: {sum(own.values())} lines")
        for where, n in own.most_common(args.top):
            print(f"  {n:5d} {where}")


if __name__ == "__main__":
    main()
