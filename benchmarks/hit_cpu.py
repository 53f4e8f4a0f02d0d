"""CPU time of the hit path: the cache key of a call's tensor arguments and whole jitted calls.

    python benchmarks/hit_cpu.py [--rounds 25]

Thread CPU time (one thread), medians of interleaved rounds, which leaves out the time other
processes hold the cores: a loaded machine moves ``bench_overhead.py``'s wall-clock figures by
more than a key field costs. Reports the key and its lookup for one and two tensor arguments
(``fast_key_fn``), and per call under ``no_grad``, jitted and eager and their ratio: two small
functions and a ``Linear`` called with tensors (the positional fast path), then calls the general
path keys (``call_paths``): a keyword bool, an int (the same, and one changing every call: symbolic,
found by its class), None, a float, a bool, a list of two tensors, a tuple of tensor pairs, the ``Linear``
by keyword, a module of 100 parameters using one ``Linear`` (the per-call reads and checks of its
parameters), one writing a KV cache passed as an argument in place
(``k_cache[:, pos] = k``: the write-back's check that no parameter or buffer shares the cache's
memory; called with tensors, then with the int ``pos`` too, which the general path keys), and a
two-layer Llama called as Hugging Face calls it (``input_ids=``, ``attention_mask=``,
``use_cache=False``; where transformers is installed). Run it against another
checkout of the Python package (``PYTHONPATH=<other>/python``) to compare before and after.
"""

import argparse
import itertools
import statistics
import time
import timeit

import torch

import thunder_rs
from thunder_rs.core.acquisition.cache import fast_key_fn


def _per_call_ns(fn, number: int) -> float:
    return timeit.Timer(fn, timer=time.thread_time).timeit(number) / number * 1e9


def _tiny(a, b):
    return torch.exp(torch.sin((a + b) * a) - b)


def _double(a):
    return a * 2


def _flagged(a, *, flag):
    return a * 2 if flag else a


def _times(a, n):
    return a * n


def _scaled(a, lr):
    return a * lr


def _gated(a, flag):
    return a * 2 if flag else a


def _summed(a, items):
    return a + items[0] * items[1]


def _masked(a, mask):
    return a * 2 if mask is None else a * mask


def _pairs(a, past):
    for k, v in past:
        a = a + k * v
    return a


class _KVCacheWriter(torch.nn.Module):
    """100 parameters (50 ``Linear(4, 4)``, the first one used) and a KV cache argument written in
    place, as a hand-written decode step writes its cache: every call checks that the cache shares
    no memory with a parameter or buffer (``core.acquisition.writeback``)."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(50))

    def forward(self, x, k_cache, pos: int = 3):
        k_cache[:, pos] = self.layers[0](x)
        return k_cache[:, : pos + 1].sum(1)


class _Params100(torch.nn.Module):
    """100 parameters (50 ``Linear(4, 4)``, the first one used): a call's cost of reading and
    checking a module's parameters, as a decode step pays it once per token."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(50))

    def forward(self, x):
        return self.layers[0](x)


def _llama():
    """A two-layer Llama with seeded weights and its keyword batch, or None without transformers."""
    try:
        import transformers  # noqa: PLC0415
    except ImportError:
        return None
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=32,
        intermediate_size=64,
        max_position_embeddings=64,
        vocab_size=64,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 64, (1, 8))
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "use_cache": False}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=25)
    rounds = parser.parse_args().rounds
    torch.set_num_threads(1)
    table: dict = {}
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    for args in ((a,), (a, b)):  # (as ``ThunderFunction.__call__`` finds the key function and looks the key up)
        table[f"key + lookup, {len(args)} tensor(s)"] = {
            "ns": lambda args=args, cache={}: cache.get(fast_key_fn(len(args))(args, None))
        }
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    cases = [
        ("tiny 2 args", _tiny, (a, b), {}),
        ("one arg", _double, (a,), {}),
        ("Linear", lin, (a,), {}),
        ("keyword bool", _flagged, (a,), {"flag": True}),
        ("int arg", _times, (a, 3), {}),
        ("None arg", _masked, (a, None), {}),
        ("float arg", _scaled, (a, 0.5), {}),
        ("bool arg", _gated, (a, True), {}),
        ("list of 2 tensors", _summed, (a, [a, b]), {}),
        ("tuple of 2 pairs", _pairs, (a, ((a, b), (b, a))), {}),
        ("Linear by keyword", lin, (), {"input": a}),
        ("module of 100 params", _Params100(), (a,), {}),
        ("KV cache, 100 params", _KVCacheWriter(), (a, torch.zeros(4, 8, 4)), {}),
        ("KV cache, 100 params, pos", _KVCacheWriter(), (a, torch.zeros(4, 8, 4), 3), {}),
    ]
    steps = itertools.count(5)  # (an int changing every call: symbolic after two values, ``IntClasses``)
    cases.append(("int arg, changing", _times, (a, 3), {}))
    llama = _llama()
    if llama is not None:
        cases.append(("HF Llama 2 layers, keywords", llama[0], (), llama[1]))
    for name, fn, args, kwargs in cases:
        jfn = thunder_rs.jit(fn)
        with torch.no_grad():
            jfn(*args, **kwargs)
            if name.endswith("changing"):
                jfn(args[0], 4)
        if name.endswith("changing"):
            table[name] = {
                "jit ns": lambda jfn=jfn, a=args[0]: jfn(a, next(steps)),
                "eager ns": lambda fn=fn, a=args[0]: fn(a, next(steps)),
            }
            continue
        table[name] = {
            "jit ns": lambda jfn=jfn, args=args, kwargs=kwargs: jfn(*args, **kwargs),
            "eager ns": lambda fn=fn, args=args, kwargs=kwargs: fn(*args, **kwargs),
        }
    number = {name: 2000 for name in table} | {name: 50 for name, *_ in cases if name.startswith("HF")}
    samples: dict = {(row, col): [] for row, cols in table.items() for col in cols}
    with torch.no_grad():
        for _ in range(rounds):
            for row, cols in table.items():
                for col, fn in cols.items():
                    samples[row, col].append(_per_call_ns(fn, number[row]))
    for row, cols in table.items():
        medians = {col: statistics.median(samples[row, col]) for col in cols}
        ratio = f"  ratio {medians['jit ns'] / medians['eager ns']:5.2f}" if "eager ns" in medians else ""
        print(f"{row:28s} " + "  ".join(f"{col} {ns:9.0f}" for col, ns in medians.items()) + ratio)


if __name__ == "__main__":
    main()
