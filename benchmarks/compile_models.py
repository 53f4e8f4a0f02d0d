"""First-call compile time of the real-model tests' models under thunder_rs.jit.

    python benchmarks/compile_models.py

Builds the tiny Hugging Face models (GPT-2, Llama, BERT) and the ResNet-18 of the model tests
(tests/test_hf_models.py, tests/test_cnn.py), and reports for each, single-threaded: the first
call (compile and run), the compile alone with its acquisition part (``compile_stats``), and a
second call (a cache hit). One-time work (imports, the first trace) is paid before the timings.
"""

import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import thunder_rs  # noqa: E402
from test_cnn import ResNet18, images  # noqa: E402
from test_hf_models import padded_batch, tiny_model  # noqa: E402


def measure(label: str, model, *args, **kwargs) -> str:
    jmodel = thunder_rs.jit(model)
    start = time.perf_counter()
    jmodel(*args, **kwargs)
    first = time.perf_counter() - start
    stats = thunder_rs.compile_stats(jmodel)
    start = time.perf_counter()
    jmodel(*args, **kwargs)
    hit = time.perf_counter() - start
    return f"{label:36} {first * 1e3:10.1f} {stats.last_compile_s * 1e3:10.1f} {stats.stage_s['acquire'] * 1e3:10.1f} {hit * 1e3:10.2f}"


def main() -> None:
    torch.set_num_threads(1)
    # One-time work outside the timings: torch._decomp's import (meta batch norm), the first trace.
    thunder_rs.jit(torch.nn.BatchNorm2d(2).eval())(torch.randn(2, 2, 3, 3))
    thunder_rs.jit(tiny_model("gpt2"))(**padded_batch("gpt2", "left"))
    print(f"{'model':36} {'first ms':>10} {'compile ms':>10} {'acquire ms':>10} {'hit ms':>10}")
    for name in ("gpt2", "llama", "bert"):
        for mode in ("train", "eval"):
            model = getattr(tiny_model(name), mode)()
            print(measure(f"{name} {mode}", model, **padded_batch(name, "left")))
    x, _ = images(0)
    # Out-of-place variants: in-place ops (`out += identity`, ReLU(inplace=True), BatchNorm's
    # running statistics) are not traced yet.
    print(measure("resnet18 w16 train (batch stats)", ResNet18(inplace=False, track_running_stats=False).train(), x))
    print(measure("resnet18 w16 eval", ResNet18(inplace=False).eval(), x))


if __name__ == "__main__":
    main()
