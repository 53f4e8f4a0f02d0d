"""How much of PyTorch's own operator database thunder_rs runs natively.

For every OpInfo in ``torch.testing._internal.common_methods_invocations.op_db`` that has a float32
CPU sample, the first samples are traced with ``thunder_rs.examine`` and run under ``thunder_rs.jit``
against eager. An op is *native* when every sample traces without an eager fallback and matches
eager, *fallback* when it runs correctly but some sample falls back, *wrong* when a result differs,
and *fails* when thunder_rs raises. Run: ``python benchmarks/op_coverage.py [--samples N] [--list]``.
"""

import argparse
import collections
import warnings

import torch
from torch.testing._internal.common_methods_invocations import op_db

import thunder_rs

warnings.filterwarnings("ignore")


def _call(op, sample):
    return op.op(sample.input, *sample.args, **sample.kwargs)


def _metadata(value):
    leaves = value if isinstance(value, (tuple, list)) else [value]
    return [(t.shape, t.dtype, t.device) if isinstance(t, torch.Tensor) else t for t in leaves]


def _classify(op, samples) -> tuple[str, str]:
    fell_back = set()
    for sample in samples:
        fn = lambda *a, **k: op.op(*a, **k)  # noqa: E731  a fresh function: a fresh cache
        args = (sample.input, *sample.args)
        try:
            torch.manual_seed(0)  # random ops must draw what eager draws
            expected = fn(*args, **sample.kwargs)
        except Exception:  # noqa: BLE001  eager rejects it: not a sample we can judge
            continue
        try:
            fell_back |= set(thunder_rs.examine(fn, *args, **sample.kwargs).fallbacks)
            jfn = thunder_rs.jit(fn)
            torch.manual_seed(0)
            actual = jfn(*args, **sample.kwargs)
        except Exception as e:  # noqa: BLE001
            return "fails", f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        if "empty" in op.name:  # uninitialised memory: only the metadata is defined
            if _metadata(actual) != _metadata(expected):
                return "wrong", f"{_metadata(actual)} != {_metadata(expected)}"
            continue
        try:
            torch.testing.assert_close(actual, expected, equal_nan=True, atol=1e-4, rtol=1e-4)
        except Exception as e:  # noqa: BLE001
            return "wrong", str(e).splitlines()[0][:120]
    if fell_back:
        return "fallback", ", ".join(sorted(fell_back))
    return "native", ""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--list", action="store_true", help="print every op with its class")
    parser.add_argument("--only", default="", help="comma-separated op names")
    options = parser.parse_args()
    only = set(filter(None, options.only.split(",")))
    classes = collections.defaultdict(list)
    for op in op_db:
        if only and op.name not in only:
            continue
        if torch.float32 not in op.supported_dtypes("cpu"):
            continue
        torch.manual_seed(0)
        try:
            samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))[: options.samples]
        except Exception:  # noqa: BLE001
            continue
        if not samples:
            continue
        cls, why = _classify(op, samples)
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        classes[cls].append((name, why))
    total = sum(len(v) for v in classes.values())
    for cls in ("native", "fallback", "wrong", "fails"):
        print(f"{cls:9} {len(classes[cls]):4}  ({100 * len(classes[cls]) / max(total, 1):.0f}%)")
    print(f"{'total':9} {total:4}   ltorch symbols: {len(thunder_rs.ltorch.SYMBOLS)}")
    if options.list:
        for cls in ("fallback", "wrong", "fails"):
            for name, why in sorted(classes[cls]):
                print(f"{cls:9} {name:40} {why}")


if __name__ == "__main__":
    main()
