"""Compiles and nvFuser definitions of symbolic traces on the CUDA path without a GPU (issue 26):
HF GPT-2 / Llama training steps over six lengths and four batch sizes, and a 64-token decode with a
growing KV cache, on fake CUDA tensors through the stand-in ``nvfuser_direct`` then torch, as
``tests/test_dynamic_round14.py`` runs them (each call's metadata checked against eager's there).
Counts, not times: ``benchmarks/results/dynamic_shapes_stop64_cuda.md``.

    PYTHONPATH=python python benchmarks/dynamic_fake_cuda.py [gpt2-float32 llama-bf16 decode-float32 ...]
"""

import contextlib
import logging
import os
import sys
import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
warnings.filterwarnings("ignore")  # (the executor warns that the real nvfuser_direct is absent)
logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)  # (the stand-in's retries)

import fake_nvfuser_direct as fake  # noqa: E402
import thunder_rs  # noqa: E402
from test_cuda_training import _backward_checked, _cuda_autocast, _made_in  # noqa: E402
from test_dynamic_round14 import SHAPES, AlibiDecoder, _decode, _hf_on_fake_cuda  # noqa: E402
from thunder_rs._core import SymExpr  # noqa: E402
from thunder_rs.executors.nvfuser_ex import NvFuserExecutor  # noqa: E402
from thunder_rs.torch import fused_attention as fa  # noqa: E402

RUNS = ("gpt2-float32", "gpt2-bf16", "llama-float32", "llama-bf16", "decode-float32", "decode-bf16")


def _executor(patch) -> tuple:
    patch.setitem(sys.modules, "nvfuser_direct", fake)
    patch.setattr(fa, "fused_sdp_choice", lambda q, *a: fa.CUDNN if q.element_size() == 2 else fa.EFFICIENT)
    executor, regions = NvFuserExecutor("nvfuser_stand_in_cuda", module=fake), []
    fuse = executor.fuse
    executor.fuse = lambda region: regions.append(fuse(region)) or regions[-1]
    return executor, regions


def _train(name: str, bf16: bool, executor, patch) -> tuple:
    model = _hf_on_fake_cuda(name)
    jmodel, defined = thunder_rs.jit(model, executors=[executor, "torch"]), []
    for batch, length in SHAPES:
        ids = torch.randint(3, 99, (batch, length), device="cuda")
        with _cuda_autocast(patch, torch.bfloat16) if bf16 else contextlib.nullcontext():
            loss = jmodel(input_ids=ids, labels=ids).loss
        _backward_checked(loss)
        defined.append(executor.stats["definitions"])
    return jmodel, defined


def run(which: str) -> str:
    name, dtype = which.split("-")
    with pytest.MonkeyPatch.context() as patch, FakeTensorMode():
        executor, regions = _executor(patch)
        if name == "decode":
            with _made_in(torch.bfloat16 if dtype == "bf16" else torch.float32):
                model = AlibiDecoder().eval()
            jfn, defined = _decode(model, 64, model.slopes.dtype, executors=[executor, "torch"])
        else:
            jfn, defined = _train(name, dtype == "bf16", executor, patch)
    symbolic = [r for r in regions if any(isinstance(s, SymExpr) for s in _sizes(r.region.input_shapes))]
    per_region = sorted({len(r.definitions) for r in symbolic})
    return (
        f"{which}: compiles {thunder_rs.compile_stats(jfn).cache_misses}, definitions after each call "
        f"{_runs(defined)}, regions {len(regions)} ({len(symbolic)} with symbolic tensor inputs, "
        f"definitions each {per_region}), dense copies {executor.stats['dense_copies']}, "
        f"failures {executor.stats['failures']}"
    )


def _sizes(shapes):
    return [s for shape in shapes if isinstance(shape, tuple) for s in shape]


def _runs(values: list) -> str:
    """``values`` as ``value x count`` runs."""
    out: list = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return ", ".join(f"{v} x{n}" if n > 1 else str(v) for v, n in out)


def main(argv=None) -> None:
    for which in (argv if argv is not None else sys.argv[1:]) or RUNS:
        print(run(which), flush=True)


if __name__ == "__main__":
    main()
