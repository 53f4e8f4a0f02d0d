"""The whole GPU check of thunder_rs in one process tree (see ../shared/GPU.md for the machine).

    make gpu-wheels      # on the CPU machine: gpu-carry/ (git-ignored; carry it), about 37 MiB
    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py run --carried gpu-carry --results $OUT --budget 520
    python benchmarks/gpu_check.py report RESULTS > benchmarks/results/cuda.md      # back on the CPU machine

``run`` works through its phases in priority order, each within what is left of ``--budget``
seconds, and rewrites ``gpu_check.json`` after each, so that a run cut short still leaves what it
did: whether CUDA is there at all (asked of torch before anything is installed: without it the
check stops in seconds); install the carried wheels (``gpu_carry``) into a target folder and
continue in a child process that imports them; the versions; the symbolic-size CUDA checks
(``SYMBOLIC_TESTS``: nvFuser's symbolic extents and Double inputs, Inductor's dynamic-shape Triton
code, changing lengths on the default executors), which no GPU has run yet, with long tracebacks
in ``symbolic.txt``; the rest of the CUDA tests (``-m gpu`` under xdist, collecting only the CUDA
test files, never test_ops.py's 47,000 CPU and CUDA parameters) with the failures' short
tracebacks in ``tests.txt``; the benchmark (``gpu_bench``: eager, thunder_rs with the torch
executor, thunder_rs's defaults, thunder_rs with Inductor, torch.compile and Lightning Thunder 0.2.6,
forward and training step of the bf16 GPT block, each checked against eager), profiled into
``profile.txt`` unless ``--no-profile``; nvFuser's host overhead per region; ``dynamic_shapes.py``
on the device (padding lengths, batch sizes, a KV-cache decode; ``dynamic.txt``) unless
``--skip-dynamic``; ``cuda.md``, the page ``report`` makes. The results folder holds seven files:
``gpu_check.log``, ``gpu_check.json``, ``symbolic.txt``, ``tests.txt``, ``profile.txt``,
``dynamic.txt`` and ``cuda.md``.

The device time of a session is 15 minutes, starts included (a fresh machine takes 35 s to a few
minutes), and one command 10 minutes: the default ``--budget`` of 520 s, run with the device's
command limit at about 560 s (pytest's grace after its deadline), leaves a rerun of one phase
(``--skip-*``, ``--tests``) its time. The check imports thunder_rs from the carried wheel and its
tests from the tree: a wheel built before the tree's last change to ``python/thunder_rs`` is named
in the log and the report (``thunder_rs_sources``).

Without CUDA ``run`` says so and stops (exit 2), unless ``--device cpu`` asks for the dry run
(the benchmark's code path on the CPU, ``--tiny`` sizes; what the unit tests run).
"""

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import gpu_bench  # noqa: E402
import gpu_carry  # noqa: E402
import gpu_report  # noqa: E402

#: The CUDA tests (``-m gpu``) after the symbolic ones (``SYMBOLIC_TESTS``): the OpInfo table on CUDA
#: in float32, bfloat16 and float16 with the default executors, attention and the GPT block and
#: training (test_cuda.py); nvFuser's type rules and its OpInfo subset with the real
#: ``nvfuser_direct``, and the definitions it refused on the H200 (test_nvfuser_refusals.py);
#: multi-head attention under CUDA autocast and CUDA as the default device; the Inductor executor on
#: CUDA (half-precision regions rounding as eager); random draws across reads; channels_last layouts
#: through nvFuser regions; training under CUDA autocast and CUDA random draws (test_contexts.py,
#: test_random.py); CUDA generator arguments and a module's CUDA generator (test_generators.py);
#: torch.vmap's batching rules on CUDA (test_vmap_rules.py, 79 cases); ``cuda`` without an index as
#: the current device in factories and moves (test_cuda_devices.py); torch.func's grad, vjp and
#: vmap of grad and complex values (RoPE, polar) through the default executors (test_cuda_transforms.py);
#: rotary tables of functools.lru_cache'd helpers made on the GPU by misses (test_cached_misses.py);
#: ``torch.cuda.set_device``, ``with torch.cuda.device``, ``current_device()``, synchronizations and
#: a stream made and entered inside the program (test_cuda_contexts.py; two GPUs for device 1);
#: ``torch.accelerator``'s device index, ``empty_cache``, ``record_stream``, an event waited on, the
#: devices' count and capability read, and refused event readings and allocator statistics
#: (test_cuda_runtime_api.py); waits between real streams, an event made and waited on, kernels on a
#: side stream inside ``with torch.cuda.stream`` and nvtx ranges on every call, ``with torch.Stream``
#: refused, and the backward of a block on a side stream run on that stream as eager's autograd runs
#: it (test_cuda_queue.py).
#: About 3,800 tests, 3.5 minutes with 12 workers on an H200 machine (2026-11-28). test_ops.py's
#: 20,000 CUDA parameters are left out: collecting its 47,000 items costs each worker 40 s, running
#: them 10 minutes.
TESTS = [
    "tests/test_cuda.py",
    "tests/test_nvfuser_ex.py",
    "tests/test_nvfuser_opinfos.py",
    "tests/test_nvfuser_refusals.py",
    "tests/test_multihead_attention.py",
    "tests/test_default_device.py",
    "tests/test_inductor_ex.py::test_cuda_region_equals_its_eager_calls",
    "tests/test_inductor_jit.py::test_on_cuda_half_precision_regions_round_each_op_as_eager",
    "tests/test_snapshots.py::test_random_draws_and_generator_state_are_eagers_across_reads",
    "tests/test_eager_layouts.py::test_on_cuda_channels_last_blocks_keep_eagers_layouts_with_the_default_executors",
    "tests/test_fusion_layouts.py::test_on_cuda_nvfusers_regions_hand_on_eagers_layouts",
    "tests/test_fusion_layouts.py::test_on_cuda_a_channels_last_resnet_trains_as_eager_with_nvfusers_regions",
    "tests/test_contexts.py::test_cuda_autocast_training_matches_eager",
    "tests/test_contexts.py::test_cuda_random_ops_draw_as_eager_over_calls",
    "tests/test_random.py::test_cuda_draws_as_eager",
    "tests/test_generators.py::test_on_cuda_generator_arguments_and_a_module_held_generator_draw_as_eager",
    "tests/test_kernel_fidelity.py::test_on_cuda_grid_sample_gradients_follow_the_forwards_switch_as_eagers",
    "tests/test_vmap_rules.py::test_batched_ops_on_cuda_match_eagers_vmap",
    "tests/test_cuda_devices.py::test_on_cuda_devices_without_an_index_are_the_current_one_as_in_eager",
    "tests/test_cuda_transforms.py::test_on_cuda_transforms_and_complex_values_match_eager",
    "tests/test_cached_misses.py::test_on_cuda_training_with_cached_tables_matches_eager_gradients",
    "tests/test_cuda_contexts.py::test_on_cuda_the_current_device_the_program_sets_or_reads_is_eagers",
    "tests/test_cuda_runtime_api.py::test_on_cuda_the_runtime_api_the_program_uses_is_eagers",
    "tests/test_cuda_queue.py::test_on_cuda_the_device_queue_work_of_the_program_is_eagers",
    "tests/test_cuda_queue.py::test_on_cuda_the_backward_of_a_block_on_a_stream_runs_on_that_stream_as_eagers",
    "tests/test_cuda_backward_streams.py::test_on_cuda_each_calls_backward_runs_on_the_stream_that_call_made_as_eagers",
]
#: The symbolic-size CUDA checks, run first and apart (``symbolic.txt``): what issue 26 added
#: (nvFuser definitions with -1 extents, Int size inputs and Double inputs of floats of sizes,
#: ``nvfuser_symbolic``; what the stand-in assumes of Double inputs, size-1 symbolic extents, the
#: device of a definition without tensor inputs and the errors of mismatched inputs,
#: test_nvfuser_contracts.py; the calls the stand-in refuses as the 0.2.36 bindings do,
#: test_nvfuser_api.py, and its define_tensor of sizes and strides and complex parts,
#: test_nvfuser_define_tensor.py; dims out of range, iota's constants and constant powers as the
#: source decides them; powers, remainders and divisions by numbers as eager's, test_nvfuser_standin_fidelity.py;
#: sums over expanded dims as products with the extent in Fuser's own code, and as eager's sums of
#: the copies through the translator, variances as welford's M2 divided by the count,
#: test_nvfuser_kernel_fidelity.py; half tensors with Python numbers in opmath as torch's pointwise
#: kernels (add/sub alpha, lerp, addcmul, addcdiv, softplus), test_nvfuser_opmath.py; outputs aliased to inputs,
#: ``add_output(output, alias_input)``, as the stand-in takes and refuses them, and BatchNorm regions writing
#: their running statistics with no copy, test_nvfuser_aliases_round15.py) and the other paths where
#: sizes change between calls on CUDA. Entries of files the main suite also runs are deselected there.
SYMBOLIC_TESTS = [
    "tests/test_nvfuser_symbolic.py",
    "tests/test_nvfuser_contracts.py",
    "tests/test_nvfuser_api.py",
    "tests/test_nvfuser_define_tensor.py",
    "tests/test_nvfuser_standin_fidelity.py",
    "tests/test_nvfuser_kernel_fidelity.py",
    "tests/test_nvfuser_opmath.py",
    "tests/test_nvfuser_aliases_round15.py",
    "tests/test_inductor_jit.py::test_on_cuda_a_region_with_symbolic_sizes_compiles_once_for_every_length",
    "tests/test_dynamic_data_sizes.py::test_on_cuda_counts_are_symbolic_with_the_default_executors",
    "tests/test_cuda.py::test_gpt_trains_with_changing_lengths_under_autocast",
    "tests/test_cuda.py::test_hf_gpt2_sdpa_with_padding_lengths_on_cuda",
    "tests/test_dynamic_round14.py::test_the_real_bindings_reshape_with_an_inferred_size_so",
    "tests/test_dynamic_round14.py::test_the_real_bindings_bind_symbolic_extents_layouts_and_ranks_so",
]
#: Seconds the benchmark keeps for itself out of the budget when the tests run first.
BENCH_RESERVE_S = 150
#: Seconds kept at the end for the report and the JSON.
CLOSING_S = 5
#: Seconds pytest gets, after being interrupted at its deadline, to print its summary.
PYTEST_GRACE_S = 20


class Results:
    """The results folder: the log, and the JSON rewritten after each phase."""

    def __init__(self, folder: Path, budget: float, deadline: float | None = None):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.log = gpu_bench.Log(folder / "gpu_check.log")
        self.deadline = deadline or time.time() + budget
        self.json = folder / "gpu_check.json"
        self.report = json.loads(self.json.read_text()) if self.json.exists() else {}
        self.report.setdefault("date", time.strftime("%Y-%m-%d %H:%M:%S %Z"))
        self.report.setdefault("budget_s", budget)
        self.report.setdefault("phases_s", {})

    def left(self) -> float:
        return self.deadline - time.time()

    def save(self, **fields) -> None:
        self.report.update(fields)
        temporary = self.json.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.report, indent=2, default=str))
        temporary.replace(self.json)

    def phase(self, name: str, started: float) -> None:
        self.report["phases_s"][name] = round(time.perf_counter() - started, 1)
        self.save()


# -- versions -------------------------------------------------------------------------------------------


def versions(log) -> dict:
    import importlib.metadata  # noqa: PLC0415

    import torch  # noqa: PLC0415

    info = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    info["glibc"] = subprocess.run(["ldd", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    info["cuda_available"] = torch.cuda.is_available()
    if info["cuda_available"]:
        info["gpu"] = torch.cuda.get_device_name(0)
    for name in ("triton", "lightning-thunder", "pytest-xdist"):
        try:
            info[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            info[name] = "absent"
    import thunder_rs  # noqa: PLC0415
    from thunder_rs.executors import nvfuser_ex  # noqa: PLC0415

    info["thunder_rs"] = f"{thunder_rs.__version__} from {Path(thunder_rs.__file__).parent}"
    info["thunder_rs_sources"] = sources_as_the_tree(Path(thunder_rs.__file__).parent)
    executor = nvfuser_ex.nvfuser_executor()
    info["nvfuser"] = executor.module.version() if executor.available else f"unavailable: {executor.unavailable}"
    info["default_executors"] = [e.name for e in thunder_rs.executors.get_default_executors()]
    info["inductor"] = inductor_settings()
    for key, value in info.items():
        log(f"{key}: {value}")
    return info


STALE_WHEEL = (
    "DIFFERENT from this tree's python/thunder_rs: the carried wheel was built before the last change, and the "
    "tests (from the tree) run against its older code. Rebuild it (make gpu-wheels) before a GPU run"
)


def sources_as_the_tree(package: Path) -> str:
    """Whether the thunder_rs imported (the carried wheel's, on the GPU machine) has the tree's
    Python sources: the tests come from the tree, the code they test from the wheel."""
    from thunder_rs.executors.inductor_cache import sources_digest  # noqa: PLC0415

    return "as the tree's" if sources_digest(package) == sources_digest(ROOT / "python" / "thunder_rs") else STALE_WHEEL


def inductor_settings() -> str:
    """What decides Inductor's compile time here: its on-disk caches (a later process loads what an
    earlier one compiled), autotuning, and its compile workers."""
    try:
        import torch._functorch.config as functorch_config  # noqa: PLC0415
        from torch._inductor import config  # noqa: PLC0415
        from torch._inductor.async_compile import get_compile_threads  # noqa: PLC0415
        from torch._inductor.runtime.cache_dir_utils import cache_dir  # noqa: PLC0415
    except ImportError as e:
        return f"unknown ({e})"
    return (
        f"fx_graph_cache={config.fx_graph_cache} autograd_cache={functorch_config.enable_autograd_cache} "
        f"cache_dir={cache_dir()} max_autotune={config.max_autotune} compile_threads={get_compile_threads()}"
    )


# -- the CUDA tests ----------------------------------------------------------------------------------------


def pytest_command(tests: list[str], workers: int, tracebacks: str = "short", deselect=()) -> list[str]:
    """pytest on the CUDA tests: xdist's ``workers`` (each collects only ``tests``), the
    ``tracebacks`` (pytest's ``--tb``), a summary line per failure, a time limit per test where
    pytest-timeout is there; the ``deselect``ed node ids left out."""
    import importlib.util  # noqa: PLC0415

    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-m",
        "gpu",
        "--run-slow",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:hypothesispytest",  # its summary hook imports hypothesis: seconds past the last test
        f"--tb={tracebacks}",
        "-rfE",
        "--durations=10",
        *[f"--deselect={node}" for node in deselect],
    ]
    if workers > 1 and importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", str(workers)]
    if importlib.util.find_spec("pytest_timeout") is not None:
        cmd += ["--timeout=180"]
    return [*cmd, *tests]


def run_bounded(cmd: list[str], output: Path | None, seconds: float, env=None, log=None) -> tuple[int, bool]:
    """Runs ``cmd`` in its own process group, its output in ``output`` (else this process's); at
    ``seconds`` sends it SIGINT (pytest then prints what it has), and after ``PYTEST_GRACE_S`` more
    kills the group. Returns (exit status, whether it ran out of time)."""
    with output.open("w") if output else contextlib.nullcontext() as out:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT if output else None, env=env, start_new_session=True
        )
        try:
            return proc.wait(timeout=max(seconds, 1)), False
        except subprocess.TimeoutExpired:
            if log:
                log(f"{Path(cmd[0]).name} {' '.join(cmd[1:3])}...: out of time after {seconds:.0f} s: interrupted")
            proc.send_signal(signal.SIGINT)
            try:
                return proc.wait(timeout=PYTEST_GRACE_S), True
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                return proc.wait(), True
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


_SUMMARY = re.compile(r"^=* ?(\d+ (passed|failed|skipped|errors?)|no tests ran)\b.* in [\d.]+s")
_PROGRESS = re.compile(r"^([.sxXFE]+)\s+\[\s*\d+%\]$")


def summarize_tests(text: str) -> dict:
    """pytest's summary line (or, where pytest was stopped before printing it, the outcomes its
    progress lines show) and the failures' summary lines."""
    lines = text.strip().split("\n") if text.strip() else []
    summary = next((line.strip("= ") for line in reversed(lines) if _SUMMARY.match(line)), None)
    if summary is None:
        marks = "".join(m.group(1) for m in map(_PROGRESS.match, lines) if m)
        names = {".": "passed", "s": "skipped", "F": "failed", "E": "errors", "x": "xfailed", "X": "xpassed"}
        counted = ", ".join(f"{marks.count(c)} {n}" for c, n in names.items() if c in marks)
        summary = f"no summary; progress lines show {counted}" if marks else (lines[-1] if lines else "")
    failed = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
    return {"summary": summary, "failed": failed}


def _existing(tests: list[str]) -> list[str]:
    # A file another change renamed or removed would stop pytest before it runs anything.
    return [t for t in tests if (ROOT / t.split("::")[0]).exists()]


def run_symbolic(results: Results, args) -> dict:
    """The symbolic-size CUDA checks, first: with long tracebacks, at most ``--symbolic-budget``
    seconds, on a few workers (there are about 30 tests)."""
    seconds = min(args.symbolic_budget, results.left() - (0 if args.skip_bench else BENCH_RESERVE_S))
    cmd = pytest_command(_existing(SYMBOLIC_TESTS), min(args.workers, 6), tracebacks="long")
    return _run_pytest(results, "symbolic", cmd, results.folder / "symbolic.txt", seconds)


def run_tests(results: Results, args) -> dict:
    seconds = min(args.test_budget, results.left() - (0 if args.skip_bench else BENCH_RESERVE_S))
    # The symbolic checks, where their phase did not run them; else not again (their files' other tests are).
    together = args.skip_symbolic and not args.tests
    ran = [] if args.tests or together else [t for t in SYMBOLIC_TESTS if "::" in t]
    tests = args.tests or (TESTS + SYMBOLIC_TESTS if together else TESTS)
    cmd = pytest_command(_existing(tests), args.workers, deselect=ran)
    return _run_pytest(results, "tests", cmd, results.folder / "tests.txt", seconds)


def _run_pytest(results: Results, name: str, cmd: list[str], output: Path, seconds: float) -> dict:
    if seconds < 30:
        results.log(f"{name}: skipped, {seconds:.0f} s left for them")
        return {"skipped": "the check's time budget ran out"}
    env = {**os.environ, "THUNDER_RS_CUDA_SAMPLES": os.environ.get("THUNDER_RS_CUDA_SAMPLES", "1")}
    results.log("running", " ".join(cmd[1:]), f"(at most {seconds:.0f} s)")
    start = time.perf_counter()
    rc, timed_out = run_bounded(cmd, output, seconds, env, results.log)
    found = {
        "rc": rc,
        "timed_out": timed_out,
        "seconds": round(time.perf_counter() - start, 1),
        **summarize_tests(output.read_text(errors="replace")),
    }
    results.log(f"{name}: rc={rc} in {found['seconds']:.0f} s: {found['summary']}")
    for line in found["failed"][:60]:
        results.log(" ", line[:300])
    return found


# -- the benchmark -----------------------------------------------------------------------------------------


def bench_cases(variants: list[str], overhead: bool) -> list[str]:
    """Every case of ``variants`` (eager first: each process times it), then nvFuser's overhead."""
    ordered = ["eager", *[v for v in variants if v != "eager"]]
    return [f"{v}:{c}" for v in ordered for c in gpu_bench.CASES] + ([gpu_bench.OVERHEAD] if overhead else [])


def read_progress(path: Path) -> list[dict]:
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # the line a killed process was writing
    return entries


def run_benchmark(results: Results, args) -> dict:
    """The benchmark's cases in a child process; after a crash, the cases left in a new one (the
    crashed case recorded with the exit status), until all are done or the budget is spent."""
    cases = bench_cases(args.variant or list(gpu_bench.VARIANTS), not args.no_overhead)
    rows: list[dict] = []
    bench = {"calls": args.calls, "device": args.device, "rows": rows}
    with tempfile.TemporaryDirectory() as scratch:
        for process in range(4):
            left = results.left() - CLOSING_S
            if not cases or left < gpu_bench.MIN_CASE_S:
                break
            progress = Path(scratch) / f"progress{process}.jsonl"
            if process:  # a fresh process times eager again: ratios are of one process
                cases = [c for c in bench_cases([], overhead=False) if c not in cases] + cases
            cmd = [
                sys.executable,
                str(HERE / "gpu_bench.py"),
                "--cases",
                ",".join(cases),
                "--device",
                args.device,
                "--calls",
                str(args.calls),
                "--progress",
                str(progress),
                "--log",
                str(results.log.file.name),
                "--deadline",
                str(results.deadline - CLOSING_S),
            ]
            cmd += ["--tiny"] if args.tiny else []
            cmd += [] if args.no_profile else ["--profile", str(results.folder / "profile.txt")]
            results.log.file.flush()
            rc, timed_out = run_bounded(cmd, None, left, log=results.log)
            found = len(rows)
            cases = _collect(read_progress(progress), process, rc, timed_out, cases, rows)
            results.save(benchmark=bench)
            if timed_out:
                break
            if len(rows) == found and cases:
                # Nothing done: the process cannot start (its error is in the log); another would not either.
                for case in cases:
                    variant, _, name = case.rpartition(":")
                    rows.append(
                        {
                            "process": process,
                            "variant": variant,
                            "case": name,
                            "error": f"the benchmark process failed before its first case (exit status {rc})",
                        }
                    )
                cases = []
    for case in cases:
        variant, _, name = case.rpartition(":")
        rows.append({"process": None, "variant": variant, "case": name, "skipped": "the check's time budget ran out"})
    results.save(benchmark=bench)
    return bench


def _collect(entries: list[dict], process: int, rc: int, timed_out: bool, cases: list[str], rows: list) -> list[str]:
    """Adds one process's results to ``rows``; returns the cases it left (none after a time-out:
    the budget is spent), the case it died in recorded as failed."""
    head = next((e for e in entries if e.get("event") == "process"), {})
    done, started = set(), None
    for entry in entries:
        key = f"{entry.get('variant')}:{entry.get('case')}"
        if entry.get("event") == "start":
            started = key
        elif entry.get("event") == "result":
            done.add(key)
            fields = {k: v for k, v in entry.items() if k != "event"}
            rows.append({"process": process, "size": head.get("size"), **fields})
    if started is not None and started not in done:
        variant, _, name = started.rpartition(":")
        reason = "out of the check's time budget" if timed_out else f"the process died (exit status {rc})"
        rows.append({"process": process, "variant": variant, "case": name, "error": f"{reason} during this case"})
        done.add(started)
    return [] if timed_out else [c for c in cases if c not in done]


# -- shapes that change between calls ---------------------------------------------------------------


def run_dynamic(results: Results, args) -> dict:
    """``dynamic_shapes.py`` on the device (padding lengths, batch sizes, a KV-cache decode, images),
    within what is left of the budget; each run's result line as it ends (a run cut short keeps
    the ones before)."""
    seconds = results.left() - CLOSING_S
    if seconds < 20:
        results.log(f"dynamic shapes: skipped, {seconds:.0f} s left")
        return {"skipped": "the check's time budget ran out"}
    output = results.folder / "dynamic.txt"
    steps, tokens = map(str, args.dynamic_sizes)
    cmd = [
        sys.executable,
        str(HERE / "dynamic_shapes.py"),
        "--device",
        args.device,
        "--steps",
        steps,
        "--tokens",
        tokens,
    ]
    results.log("running", " ".join(cmd[1:]), f"(at most {seconds:.0f} s)")
    rc, timed_out = run_bounded(cmd, output, seconds, log=results.log)
    runs = {}
    for line in output.read_text(errors="replace").splitlines():
        name, _, rest = line.partition(" ")
        if name in ("padding", "batch", "decode", "images"):
            runs[name] = dict(kv.split("=", 1) for kv in rest.split())
    results.log(f"dynamic shapes: rc={rc}" + (" (out of time)" if timed_out else ""), runs)
    return {"rc": rc, "timed_out": timed_out, "runs": runs}


# -- run ---------------------------------------------------------------------------------------------------


NO_CUDA = (
    "CUDA is not available on this machine (torch {torch}: torch.cuda.is_available() is False): no CUDA tests, "
    "no GPU benchmark. Run this on the GPU machine (or --device cpu for the dry run)."
)


def cuda_missing() -> str | None:
    """Why this machine cannot run the GPU check, or None: asked of the machine's torch alone
    (seconds), before the install and the imports of thunder_rs and nvFuser."""
    import torch  # noqa: PLC0415 (the check's parent process imports nothing else of the stack)

    return None if torch.cuda.is_available() else NO_CUDA.format(torch=torch.__version__)


def run(args) -> int:
    results = Results(Path(args.results), args.budget, args.deadline)
    if args.device == "cuda" and not args.installed:
        missing = cuda_missing()
        if missing is not None:
            results.log(missing)
            results.save(status="no-cuda")
            return 2
    if args.carried and not args.installed:
        return _install_then_continue(results, args)
    started = time.perf_counter()
    results.save(versions=versions(results.log))
    results.phase("versions", started)
    if not results.report["versions"]["cuda_available"] and args.device == "cuda":
        results.log(NO_CUDA.format(torch=results.report["versions"]["torch"]))
        results.save(status="no-cuda")
        return 2
    if not (args.skip_tests or args.skip_symbolic or args.tests):
        started = time.perf_counter()
        results.save(symbolic=run_symbolic(results, args))
        results.phase("symbolic", started)
    if not args.skip_tests:
        started = time.perf_counter()
        results.save(tests=run_tests(results, args))
        results.phase("tests", started)
    if not args.skip_bench:
        started = time.perf_counter()
        run_benchmark(results, args)
        results.phase("benchmark", started)
    if not args.skip_dynamic:
        started = time.perf_counter()
        results.save(dynamic=run_dynamic(results, args))
        results.phase("dynamic", started)
    results.save(status="done")
    (results.folder / "cuda.md").write_text(gpu_report.markdown(results.report))
    results.log(
        "wrote", results.json, "and", results.folder / "cuda.md", f"({results.left():.0f} s of the budget left)"
    )
    return 0


def _install_then_continue(results: Results, args) -> int:
    """Installs the carried wheels, then runs the rest in a child process that imports them."""
    started = time.perf_counter()
    target = Path(args.target)
    results.save(install=gpu_carry.install(Path(args.carried), target, results.log))
    results.phase("install", started)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(target), str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    }
    forwarded = [a for a in args.argv[1:] if a not in ("--carried", args.carried)]
    child = [sys.executable, __file__, "run", "--installed", "--deadline", str(results.deadline), *forwarded]
    return subprocess.run(child, env=env).returncode


def report(path: Path) -> int:
    found = json.loads((path / "gpu_check.json" if path.is_dir() else path).read_text())
    sys.stdout.write(gpu_report.markdown(found))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="fill a carry folder (after make gpu-wheels built thunder_rs's wheel there)")
    p.add_argument("folder")
    p.add_argument("--no-lightning-thunder", action="store_true")
    g = sub.add_parser("report", help="the markdown table of a results folder (or its gpu_check.json)")
    g.add_argument("results")
    r = sub.add_parser("run", help="the GPU check")
    r.add_argument("--carried", help="folder of wheels to install (prepare's output)")
    r.add_argument("--target", default="/tmp/thunder_rs_site", help="where to install the carried wheels")
    r.add_argument("--results", required=True)
    r.add_argument("--budget", type=float, default=520, help="seconds for the whole check (default 520)")
    r.add_argument(
        "--symbolic-budget", type=float, default=120, help="seconds at most for the symbolic-size CUDA checks (first)"
    )
    r.add_argument("--test-budget", type=float, default=230, help="seconds at most for the CUDA tests")
    r.add_argument("--workers", type=int, default=12, help="xdist workers for the CUDA tests")
    r.add_argument("--tests", nargs="+", help=f"pytest selection instead of {' '.join(TESTS)}")
    r.add_argument("--calls", type=int, default=20, help="timed calls per benchmark case")
    r.add_argument(
        "--variant",
        action="append",
        choices=gpu_bench.VARIANTS,
        help="benchmark only these (repeatable; eager always runs)",
    )
    r.add_argument("--no-profile", action="store_true", help="no profile.txt (kernels and traces per case)")
    r.add_argument("--no-overhead", action="store_true", help="no nvFuser host-overhead measurement")
    r.add_argument("--skip-tests", action="store_true", help="no CUDA tests (the symbolic checks included)")
    r.add_argument("--skip-symbolic", action="store_true", help="no separate symbolic phase (the suite runs them)")
    r.add_argument("--skip-bench", action="store_true")
    r.add_argument("--skip-dynamic", action="store_true", help="no dynamic_shapes.py run on the device")
    r.add_argument(
        "--dynamic-sizes", nargs=2, type=int, default=(40, 64), help="dynamic_shapes.py's --steps and --tokens"
    )
    r.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: the dry run of the code path")
    r.add_argument("--tiny", action="store_true", help="the benchmark at tiny sizes (with --device cpu)")
    r.add_argument("--installed", action="store_true", help=argparse.SUPPRESS)
    r.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.command == "prepare":
        gpu_carry.prepare(Path(args.folder), lightning_thunder=not args.no_lightning_thunder)
        gpu_carry.check_size(Path(args.folder))
        return 0
    if args.command == "report":
        return report(Path(args.results))
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
