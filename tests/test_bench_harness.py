"""Smoke tests of the benchmark harness, the training benchmark's steps and the example model (a few
seconds; eager only, except one run of the training benchmark under thunder_rs on tiny sizes)."""

import dis
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import bench_forward  # noqa: E402
import bench_train  # noqa: E402
import harness  # noqa: E402
from gpt import GPT, Block, GPTConfig, random_tokens  # noqa: E402

TINY = GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=16, dropout=0.0)


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
    assert all(t["status"] == "n/a" for t in harness.evaluate_targets(bench_forward.TARGETS, rows))


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


def tiny_train_cases():
    return bench_train.build_cases(block_config=TINY, gpt_config=TINY, batch=2)


def test_train_cases_run_eagerly_on_tiny_sizes():
    backends = [bench_train.module_backend(harness.eager_backend())]
    rows = harness.run_all(tiny_train_cases(), backends, harness.Settings(1, 2, 0.02), log=lambda msg: None)
    assert [(r.case, r.backend) for r in rows] == [
        ("gpt_block_train", "eager"),
        ("nanogpt_train", "eager"),
        ("nanogpt_dropout_train", "eager"),
    ]
    assert all(r.error is None and r.per_us > 0 and r.ratio == 1.0 for r in rows)
    assert "per step (us)" in harness.format_table(rows, per_label="per step")
    assert all(t["status"] == "n/a" for t in harness.evaluate_targets(bench_train.TARGETS, rows))


def test_train_backends_wrap_the_module_not_the_step():
    wrapped = []

    def spy(module):
        def forward(*args):
            wrapped.append(type(module))
            return module(*args)

        return forward

    backend = bench_train.module_backend(harness.Backend("spy", wrap=spy))
    for case, model_type in zip(tiny_train_cases(), (Block, GPT, GPT)):
        train_step = case.make_fn()
        step = backend.wrap(train_step)
        args = case.make_args()
        before = [p.detach().clone() for p in train_step.module.parameters()]
        loss = step(*args)
        first_grads = [p.grad.clone() for p in train_step.module.parameters()]
        step(*args)
        assert wrapped == [model_type, model_type], "each step calls the wrapped module once"
        wrapped.clear()
        assert loss.ndim == 0 and not loss.requires_grad
        after = [p.detach() for p in train_step.module.parameters()]
        if model_type is GPT:  # AdamW stepped the parameters of the module the backend wrapped
            assert any(not torch.equal(a, b) for a, b in zip(before, after))
        else:  # no optimizer: same weights, so equal gradients unless a step accumulated into them
            assert all(torch.equal(a, b) for a, b in zip(before, after))
            for first, p in zip(first_grads, train_step.module.parameters()):
                torch.testing.assert_close(p.grad, first)


def test_train_benchmark_runs_thunder_rs_on_tiny_sizes():
    backend = harness.thunder_rs_backend()
    if not backend.available:
        pytest.skip(backend.note)
    backends = [bench_train.module_backend(b) for b in (harness.eager_backend(), backend)]
    rows = harness.run_all(tiny_train_cases(), backends, harness.Settings(1, 2, 0.02), log=lambda msg: None)
    # A thunder_rs row has numbers only if its first step's loss matched eager's (else: "mismatch").
    assert [(r.case, r.backend, r.error) for r in rows] == [
        ("gpt_block_train", "eager", None),
        ("gpt_block_train", "thunder_rs", None),
        ("nanogpt_train", "eager", None),
        ("nanogpt_train", "thunder_rs", None),
        ("nanogpt_dropout_train", "eager", None),
        ("nanogpt_dropout_train", "thunder_rs", None),
    ]
    assert all(r.first_ms > 0 and r.per_us > 0 and r.ratio > 0 for r in rows)


def test_inductor_first_calls_compile_their_regions_afresh(monkeypatch):
    """The regions a jit compiled are shared by later jits of the process; a fresh jit's first
    call must not find them, or the first-call column shows a warm process."""
    from thunder_rs.executors import inductor_ex

    backend = harness.thunder_rs_backend(("inductor",))
    compiled = {("region key", ()): lambda args: args}
    monkeypatch.setattr(inductor_ex, "_compiled", compiled)  # this process's own regions stay
    backend.reset()
    assert compiled == {}
    assert "inductor" not in harness.format_header(0.0, True, [harness.thunder_rs_backend()])
    monkeypatch.setenv("THUNDER_RS_CACHE_DIR", "")
    assert "thunder_rs's artifact cache off" in harness.format_header(0.0, True, [backend])


def test_host_overhead_steps_equal_eager_and_time_their_parts():
    import host_overhead  # noqa: PLC0415 (benchmarks/, on the path above)

    workload = host_overhead.Workload("float32")
    names = host_overhead.backends(with_compile=False)
    phases = host_overhead.Counter()
    eager = workload.step("train step", names["eager"])
    with host_overhead.timing_generated_code(phases):
        jitted = workload.step("train step", names["thunder_rs (torch)"], phases)
        for _ in range(2):  # the second step also runs after an optimizer step on both sides
            torch.testing.assert_close(jitted(), eager())
    assert {"generated forward", "generated backward", "forward call", "backward"} <= set(phases)
    assert host_overhead.count_ops(jitted)["aten._scaled_dot_product_flash_attention_for_cpu_backward"] == 1


def test_guard_check_benchmark_sees_the_entries_it_times(monkeypatch):
    import guard_check  # noqa: PLC0415 (benchmarks/, on the path above)
    import thunder_rs  # noqa: PLC0415
    from thunder_rs.core.run import entry as entries  # noqa: PLC0415

    monkeypatch.setattr(entries, "make_check", entries.make_check)  # put back after the test
    seen = guard_check.watch_checks()
    lin = torch.nn.Linear(4, 4)
    jitted = thunder_rs.jit(lambda x, scale: lin(x) * scale)
    x = torch.randn(2, 4)
    for _ in range(2):
        torch.testing.assert_close(jitted(x, 3.0), lin(x) * 3.0)
    assert seen["flat"][0] is x and id(seen["entry"]) in seen["checks"]
