"""First-call compile time of the real-model tests' models under thunder_rs.jit.

    python benchmarks/compile_models.py

Builds the tiny Hugging Face models (GPT-2, Llama, BERT, Mamba) and the ResNet-18 of the model tests
(tests/test_hf_models.py, tests/test_cnn.py), and the data-dependent models of
tests/test_data_dependent.py (DeBERTa-v2, Wav2Vec2-CTC, Qwen2-MoE), and reports for each, single-threaded: the first
call (compile and run), the compile alone with its acquisition part (``compile_stats``), and a
median of repeated cache hits, next to eager's median per call. One-time work (imports, the first
trace) is paid before the timings. BERT's classifier sets ``config.problem_type`` on its first call
with labels (as in eager), so its second call compiles once more: ``compiles`` counts them.
"""

import copy
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import thunder_rs  # noqa: E402
from test_cnn import ResNet18, images  # noqa: E402
from test_data_dependent import deberta_v2_classifier, qwen2_moe_eager_experts, wav2vec2_ctc  # noqa: E402
from test_hf_models import padded_batch, tiny_model  # noqa: E402


def _per_call_ms(fn, args, kwargs, repeats: int = 7) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args, **kwargs)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def measure(label: str, model, *args, **kwargs) -> str:
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    start = time.perf_counter()
    jmodel(*args, **kwargs)
    first = time.perf_counter() - start
    stats = thunder_rs.compile_stats(jmodel)
    compile_s, acquire_s = stats.last_compile_s, stats.stage_s["acquire"]
    jmodel(*args, **kwargs)  # a second compile where the first call changed the config
    hit = _per_call_ms(jmodel, args, kwargs)
    eager_ms = _per_call_ms(eager, args, kwargs)
    return (
        f"{label:36} {first * 1e3:10.1f} {compile_s * 1e3:10.1f} {acquire_s * 1e3:10.1f} {stats.cache_misses:8d} "
        f"{hit:10.2f} {eager_ms:10.2f}"
    )


def main() -> None:
    torch.set_num_threads(1)
    # One-time work outside the timings: torch._decomp's import (meta batch norm), the first trace.
    thunder_rs.jit(torch.nn.BatchNorm2d(2).eval())(torch.randn(2, 2, 3, 3))
    thunder_rs.jit(tiny_model("gpt2"))(**padded_batch("gpt2", "left"))
    print(
        f"{'model':36} {'first ms':>10} {'compile ms':>10} {'acquire ms':>10} {'compiles':>8} {'hit ms':>10} "
        f"{'eager ms':>10}"
    )
    for name in ("gpt2", "llama", "bert", "mamba"):
        for mode in ("train", "eval"):
            model = getattr(tiny_model(name), mode)()
            print(measure(f"{name} {mode}", model, **padded_batch(name, "left")))
    x, _ = images(0)
    print(measure("resnet18 w16 train (running stats)", ResNet18().train(), x))
    print(measure("resnet18 w16 eval", ResNet18().eval(), x))
    # Programs that read tensor values (tests/test_data_dependent.py): the trace is specialised on
    # what they read, so the first call evaluates the program up to each read while tracing.
    for label, build in (
        ("deberta-v2 cls (nonzero labels)", deberta_v2_classifier),
        ("wav2vec2 ctc (label checks)", wav2vec2_ctc),
        ("qwen2-moe eager experts", qwen2_moe_eager_experts),
    ):
        model, batches = build()
        print(measure(label, model, **batches[0]))


if __name__ == "__main__":
    main()
