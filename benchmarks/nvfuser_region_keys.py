"""Per-call host cost of an nvFuser region's key (issue 26: a module with symbolic dims within 1 us of
a static one): which definition serves a call is looked up by a key of its inputs' layouts. A static
region's key is each tensor's dtype, shape, strides and negation bit (``nvfuser_ex.layout``); a
symbolic region's holds -1 at its symbolic dims and nvFuser's contiguity and stride order, which
``compute_tensor_descriptor`` computes (``nvfuser_symbolic.symbolic_layout``). Rows: the static key,
the symbolic key computed per call (before stop 64), and the symbolic key looked up by the static
one (``symbolic_layouts``), over a region of four inputs (two of a symbolic length) at 40 lengths in
turn. The descriptor is the stand-in's (``tests/fake_nvfuser_layouts.py``, Python); nvFuser's is a
C++ binding, cheaper per call but still a call with two lists converted per tensor.

    PYTHONPATH=python python benchmarks/nvfuser_region_keys.py [--calls N]
"""

import argparse
import itertools
import os
import sys
import timeit
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import fake_nvfuser_direct as fake  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the executor module warns that the real nvfuser_direct is absent
    from thunder_rs.executors.nvfuser_ex import layout  # noqa: E402
from thunder_rs.executors.nvfuser_symbolic import symbolic_layout, symbolic_layouts  # noqa: E402

LENGTHS = range(5, 45)
DIMS = ((1,), (1,), (), ())


def _inputs(n: int) -> list:
    return [torch.randn(2, n, 32), torch.randn(2, n, 32), torch.randn(32), torch.randn(32)]


def rows(calls: int) -> list[tuple[str, float]]:
    sets = [_inputs(n) for n in LENGTHS]
    memoized = symbolic_layouts(DIMS, fake.compute_tensor_descriptor, layout)
    keys = {
        "static key (nvfuser_ex.layout)": layout,
        "symbolic key per call (symbolic_layout)": lambda a: symbolic_layout(a, DIMS, fake.compute_tensor_descriptor),
        "symbolic key looked up (symbolic_layouts)": memoized,
    }
    for args in sets:
        memoized(args)  # (each length's layout seen once, as after the first calls of a run)
    out = []
    for name, key in keys.items():
        turn = itertools.cycle(sets)
        best = min(timeit.repeat(lambda: key(next(turn)), number=calls, repeat=7))
        out.append((name, best / calls * 1e6))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for name, us in rows(args.calls):
        print(f"{name:45} {us:8.2f} us")


if __name__ == "__main__":
    main()
