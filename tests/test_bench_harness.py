"""Smoke tests of the benchmark harness and the example model (eager only, a few seconds)."""

import dis
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import bench_forward  # noqa: E402
import harness  # noqa: E402
from gpt import GPT, GPTConfig, random_tokens  # noqa: E402


def test_chain_is_200_straight_line_torch_calls():
    fn = bench_forward.make_chain_fn()
    ops = [i for i in dis.get_instructions(fn) if i.opname in ("CALL", "BINARY_OP")]
    assert len(ops) == bench_forward.CHAIN_LENGTH
    out = fn(torch.randn(16, 16), torch.randn(16, 16))
    assert torch.isfinite(out).all()


def test_gpt_attention_paths_agree():
    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32)
    idx = random_tokens(cfg, batch=2, seq=16)
    logits, loss = GPT(cfg, seed=0).eval()(idx, idx)
    explicit = GPT(GPTConfig(**{**cfg.__dict__, "explicit_attention": True}), seed=0).eval()
    torch.testing.assert_close(explicit(idx)[0], logits)
    assert logits.shape == (2, 16, 64) and loss.ndim == 0


def test_run_all_eager_rows_and_targets():
    cases = [c for c in bench_forward.build_cases() if c.name in ("tiny_5op_4x4", "gpt_block_b4_t32")]
    settings = harness.Settings(first_repeats=1, repeats=2, inner_scale=0.02)
    rows = harness.run_all(cases, [harness.eager_backend()], settings, log=lambda msg: None)
    assert [(r.case, r.backend) for r in rows] == [("tiny_5op_4x4", "eager"), ("gpt_block_b4_t32", "eager")]
    assert all(r.error is None and r.per_us > 0 and r.ratio == 1.0 for r in rows)
    assert "tiny_5op_4x4" in harness.format_table(rows)
    assert all(t["status"] == "n/a" for t in bench_forward.evaluate_targets(rows))


def test_failing_backend_becomes_an_error_row():
    def broken(fn):
        raise KeyError("no")

    backends = [harness.eager_backend(), harness.Backend("broken", wrap=broken)]
    case = bench_forward.build_cases()[0]
    rows = harness.run_all([case], backends, harness.Settings(1, 2, 0.02), log=lambda msg: None)
    assert rows[1].error == "KeyError" and rows[1].per_us is None
    assert "ERROR: KeyError" in harness.format_table(rows)


@pytest.mark.parametrize("name", ["nope"])
def test_unknown_backend_is_rejected(name):
    with pytest.raises(ValueError, match="unknown backend"):
        harness.default_backends(names={name})
