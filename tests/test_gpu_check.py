"""The GPU check (``benchmarks/gpu_check.py``) on the CPU: what it carries and how it installs it,
its benchmark's code path at tiny sizes (each variant checked against eager, one variant's failure
kept to its row, nvFuser's overhead measured on the stand-in module), a crashed or timed-out
child process, the time budget, and the markdown report. The real check needs a GPU."""

import argparse
import json
import sys
import time
import warnings
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_bench  # noqa: E402
import gpu_carry  # noqa: E402
import gpu_check  # noqa: E402
import gpu_report  # noqa: E402


def make_wheel(folder: Path, name: str, files: dict, requires=()) -> Path:
    """A minimal wheel of ``files`` (path -> text) with a RECORD and METADATA naming ``requires``."""
    info = f"{name}-1.0.dist-info"
    metadata = (
        "\n".join(
            ["Metadata-Version: 2.1", f"Name: {name}", "Version: 1.0", *[f"Requires-Dist: {r}" for r in requires]]
        )
        + "\n"
    )
    contents = {
        **files,
        f"{info}/METADATA": metadata,
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    records = [gpu_carry._record_line(path, text.encode()) for path, text in contents.items()]
    wheel = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in contents.items():
            z.writestr(path, text)
        z.writestr(f"{info}/RECORD", "\n".join([*records, f"{info}/RECORD,,"]) + "\n")
    return wheel


# -- what is carried, and its install --------------------------------------------------------------------


def test_a_stripped_wheel_installs_offline_and_the_machines_nvrtc_is_linked_under_the_vendored_name(tmp_path):
    source, carried, target = tmp_path / "download", tmp_path / "carry", tmp_path / "site"
    source.mkdir(), carried.mkdir()
    files = {"fuser/__init__.py": "VALUE = 1\n", "fuser.libs/libnvrtc-a49e67e8.so.13.0.88": "big library"}
    dropped = gpu_carry.strip_nvrtc(make_wheel(source, "fuser", files), carried / "fuser-1.0-py3-none-any.whl")
    assert dropped == ["fuser.libs/libnvrtc-a49e67e8.so.13.0.88"]
    # A requirement of Lightning Thunder this machine holds stays the machine's (pytest here).
    shadow = make_wheel(carried, "pytest", {"pytest/__init__.py": "raise ImportError('shadowed')\n"}).name
    manifest = {"nvrtc": dropped, "lightning_thunder": ["lightning_thunder-0.2.6-py3-none-any.whl", shadow]}
    (carried / gpu_carry.MANIFEST).write_text(json.dumps(manifest))
    machine = tmp_path / "cuda" / "libnvrtc.so.13"
    machine.parent.mkdir()
    machine.write_text("the machine's NVRTC")
    lines = []
    original = gpu_carry.machine_nvrtc
    gpu_carry.machine_nvrtc = lambda: [str(machine)]
    try:
        done = gpu_carry.install(carried, target, lambda *parts: lines.append(parts))
    finally:
        gpu_carry.machine_nvrtc = original
    assert (target / "fuser" / "__init__.py").read_text() == "VALUE = 1\n" and not done["unpacked"]
    assert done["present"] == [shadow] and not (target / "pytest").exists()
    link = target / dropped[0]
    assert link.is_symlink() and link.resolve() == machine.resolve()
    assert done["nvrtc_links"] == {dropped[0]: str(machine)}


def test_lightning_thunders_requirements_are_carried_transitively_unless_the_gpu_machine_has_them(
    tmp_path, monkeypatch
):
    index = tmp_path / "index"
    index.mkdir()
    make_wheel(
        index,
        "lightning_thunder",
        {},
        requires=[
            "torch>=2.7.1",
            "looseversion==1.3.0",
            "numpy",
            "optree>=0.12.1",
            "dill>=0.3.8",
            'pytest; extra == "test"',
            'tomli; python_version < "3.11"',
        ],
    )
    make_wheel(index, "optree", {}, requires=["typing-extensions>=4.6.0", "helper"])
    for name in ("looseversion", "dill", "helper"):
        make_wheel(index, name, {})
    downloads = []

    def download(specs, folder):
        from packaging.requirements import Requirement

        name = gpu_carry.canonical(Requirement(specs[0]).name).replace("-", "_")
        downloads.append(name)
        wheel = next(index.glob(f"{name}-*.whl"))
        (folder / wheel.name).write_bytes(wheel.read_bytes())
        return [folder / wheel.name]

    monkeypatch.setattr(gpu_carry, "_download", download)
    carried = gpu_carry.carry_lightning_thunder(tmp_path)
    assert sorted(downloads) == ["dill", "helper", "lightning_thunder", "looseversion", "optree"]
    assert len(carried) == 5


def test_the_carry_folder_stays_under_its_limit(tmp_path, capsys):
    (tmp_path / "a.whl").write_bytes(b"x" * 1000)
    assert gpu_carry.check_size(tmp_path) == 1000
    (tmp_path / "b.whl").write_bytes(b"x" * (gpu_carry.LIMIT_BYTES + 1))
    with pytest.raises(SystemExit, match="over"):
        gpu_carry.check_size(tmp_path)


# -- the benchmark's code path ----------------------------------------------------------------------------


def bench_args(tmp_path, cases, **overrides):
    values = {
        "cases": cases,
        "device": "cpu",
        "tiny": True,
        "calls": 1,
        "overhead_calls": 10,
        "progress": str(tmp_path / "progress.jsonl"),
        "log": None,
        "profile": None,
        "deadline": None,
    }
    return argparse.Namespace(**{**values, **overrides})


def results_of(tmp_path) -> dict:
    entries = gpu_check.read_progress(tmp_path / "progress.jsonl")
    return {f"{e['variant']}:{e['case']}": e for e in entries if e.get("event") == "result"}


def test_every_variant_is_checked_against_eager_and_a_failing_variant_is_its_rows_error(tmp_path, monkeypatch):
    wrappers = gpu_bench.wrappers()

    def broken(module):
        raise RuntimeError("expected mat1 and mat2 to have the same dtype")

    monkeypatch.setattr(gpu_bench, "wrappers", lambda: {**wrappers, "broken": broken})
    cases = "eager:forward,broken:forward,thunder_rs:torch:forward,thunder_rs:torch:train_step"
    gpu_bench.run_cases(bench_args(tmp_path, cases, profile=str(tmp_path / "profile.txt")), lambda *a: None)
    rows = results_of(tmp_path)
    assert rows["broken:forward"]["error"] == "RuntimeError: expected mat1 and mat2 to have the same dtype"
    for key in ("eager:forward", "thunder_rs:torch:forward", "thunder_rs:torch:train_step"):
        assert rows[key]["matches_eager"] and rows[key]["first_s"] > 0 and rows[key]["per_call_ms"] > 0, rows[key]
    assert rows["thunder_rs:torch:train_step"]["regions"] == {"forward": 0, "backward": 0}
    profile = (tmp_path / "profile.txt").read_text()
    assert "######## thunder_rs:torch train_step" in profile and "last backward execution trace" in profile


def test_a_result_that_differs_from_eager_is_no_match():
    import torch

    expected = torch.tensor([1.0, -2.0])
    assert gpu_bench.relative_difference(torch.tensor([1.0, -2.0]), expected) == 0
    assert gpu_bench.relative_difference(torch.tensor([1.0, -1.0]), expected) == 0.5
    assert gpu_bench.relative_difference(expected.bfloat16(), expected) == float("inf")
    captured = {"out": expected, "grads": [expected, torch.tensor([0.0, 0.0])]}
    found = gpu_bench.check(captured, {"out": expected, "grads": [expected, expected]})
    assert found["grad_rel_diff"] == 1.0 and not found["matches_eager"]


def test_no_case_starts_after_the_deadline(tmp_path):
    gpu_bench.run_cases(
        bench_args(tmp_path, "eager:forward,thunder_rs:torch:forward", deadline=time.time()), lambda *a: None
    )
    rows = results_of(tmp_path)
    assert all("budget" in row["skipped"] for row in rows.values()) and len(rows) == 2


def test_nvfuser_overhead_is_measured_on_the_stand_in(tmp_path, monkeypatch):
    import fake_nvfuser_direct as fake

    monkeypatch.setitem(sys.modules, "nvfuser_direct", fake)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the named executor, made on import, warns that nvfuser_direct is absent
        from thunder_rs.executors.nvfuser_ex import NvFuserExecutor
    executor = NvFuserExecutor("nvfuser_fake_overhead", module=fake, allow_cpu=True)
    found = gpu_bench.region_overhead(lambda *a: None, device="cpu", calls=5, executor=executor)
    assert found["fd_execute_us"] > 0 and found["thunder_rs_region_overhead_us"] == pytest.approx(
        found["region_call_us"] - found["fd_execute_us"]
    )


def test_lightning_thunders_import_gives_removed_torch_attributes_stand_ins_that_raise():
    import torch

    added = gpu_bench._stand_in_removed_torch_attributes("ops = [torch.nn.functional.relu, torch.no_such_op_here]")
    try:
        assert added == ["torch.no_such_op_here"]
        with pytest.raises(NotImplementedError, match="no_such_op_here"):
            torch.no_such_op_here()
    finally:
        del torch.no_such_op_here


# -- processes, budget and results ------------------------------------------------------------------------


def test_a_crashed_process_loses_only_its_case_and_a_timed_out_one_ends_the_benchmark():
    cases = ["eager:forward", "a:forward", "b:forward", "c:forward"]
    entries = [
        {"event": "process", "size": [1, 2, 3, 4]},
        {"event": "start", "variant": "eager", "case": "forward"},
        {"event": "result", "variant": "eager", "case": "forward", "per_call_ms": 1.0},
        {"event": "start", "variant": "a", "case": "forward"},
    ]
    rows: list = []
    left = gpu_check._collect(entries, 0, -11, False, cases, rows)
    assert left == ["b:forward", "c:forward"]
    assert rows[1] == {
        "process": 0,
        "variant": "a",
        "case": "forward",
        "error": "the process died (exit status -11) during this case",
    }
    assert gpu_check._collect(entries, 1, -9, True, cases, []) == []
    assert gpu_check.bench_cases(["torch.compile"], overhead=True) == [
        "eager:forward",
        "eager:train_step",
        "torch.compile:forward",
        "torch.compile:train_step",
        gpu_bench.OVERHEAD,
    ]


def test_a_command_out_of_time_is_interrupted_so_that_it_can_report(tmp_path):
    script = (
        "import time\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n"
        "    print('1 passed, 1 failed in 1.0s (interrupted)')\n"
    )
    output = tmp_path / "out.txt"
    start = time.perf_counter()
    # -S: no site import, so that the interpreter reaches the try block well within the 3 s even
    # on loaded cores (an interrupt before it kills the process silently).
    rc, timed_out = gpu_check.run_bounded([sys.executable, "-S", "-c", script], output, 3)
    assert timed_out and time.perf_counter() - start < 30
    summary = gpu_check.summarize_tests(output.read_text())
    assert summary["summary"] == "1 passed, 1 failed in 1.0s (interrupted)"


def test_the_tests_are_skipped_when_the_budget_leaves_them_too_little(tmp_path):
    results = gpu_check.Results(tmp_path, budget=100)
    args = argparse.Namespace(test_budget=170, skip_bench=False, tests=None, workers=2, skip_symbolic=False)
    assert "budget" in gpu_check.run_tests(results, args)["skipped"]
    command = gpu_check.pytest_command(gpu_check.TESTS, workers=1)
    assert "tests/test_ops.py" not in command and "-m" in command and "--tb=short" in command


@pytest.mark.skipif(gpu_check.cuda_missing() is None, reason="CUDA is available: the check would run")
def test_without_cuda_the_check_stops_before_installing_anything(tmp_path):
    start = time.perf_counter()
    rc = gpu_check.main(["run", "--carried", str(tmp_path / "absent"), "--results", str(tmp_path / "out")])
    assert rc == 2 and time.perf_counter() - start < 5  # torch is imported already: no install, no thunder_rs
    assert "CUDA is not available on this machine" in (tmp_path / "out" / "gpu_check.log").read_text()
    assert json.loads((tmp_path / "out" / "gpu_check.json").read_text())["status"] == "no-cuda"


def test_the_symbolic_checks_run_first_then_the_suite_with_tracebacks_then_the_benchmark(tmp_path, monkeypatch):
    """The phases' order and commands on a simulated GPU machine: the symbolic-size checks with
    long tracebacks in symbolic.txt, then the suite without them (deselected where it runs their
    files) with short ones in tests.txt, then the benchmark; each phase within the budget."""
    ran = []

    def pytest_run(cmd, output, seconds, env=None, log=None):
        ran.append((output.name, cmd, seconds))
        output.write_text("1 passed in 1.0s\n")
        return 0, False

    monkeypatch.setattr(gpu_check, "cuda_missing", lambda: None)
    monkeypatch.setattr(gpu_check, "versions", lambda log: {"cuda_available": True, "torch": "2.11"})
    monkeypatch.setattr(gpu_check, "run_bounded", pytest_run)
    monkeypatch.setattr(gpu_check, "run_benchmark", lambda results, args: ran.append(("benchmark", None, None)))
    rc = gpu_check.main(["run", "--results", str(tmp_path), "--skip-dynamic", "--budget", "520"])
    assert rc == 0 and [name for name, _, _ in ran] == ["symbolic.txt", "tests.txt", "benchmark"]
    (_, symbolic, seconds), (_, suite, suite_seconds) = ran[:2]
    assert "--tb=long" in symbolic and "tests/test_nvfuser_symbolic.py" in symbolic and seconds <= 120
    assert "--tb=short" in suite and "tests/test_nvfuser_symbolic.py" not in suite and suite_seconds <= 230
    assert "--deselect=tests/test_cuda.py::test_gpt_trains_with_changing_lengths_under_autocast" in suite
    assert "tests/test_cuda.py" in suite and "-m" in suite and "gpu" in suite
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert list(report["phases_s"]) == ["versions", "symbolic", "tests", "benchmark"]
    assert "## Symbolic sizes on CUDA (run first)" in (tmp_path / "cuda.md").read_text()
    assert len(list(tmp_path.iterdir())) <= 8


def test_a_carried_wheel_older_than_the_trees_sources_is_named(tmp_path):
    import shutil

    tree = ROOT / "python" / "thunder_rs"
    assert gpu_check.sources_as_the_tree(tree) == "as the tree's"
    wheel = tmp_path / "thunder_rs"
    shutil.copytree(tree, wheel, ignore=shutil.ignore_patterns("__pycache__", "*.so", "rust_crates"))
    assert gpu_check.sources_as_the_tree(wheel) == "as the tree's"
    (wheel / "executors" / "nvfuser_ex.py").write_text("# an older nvfuser_ex\n")
    assert gpu_check.sources_as_the_tree(wheel) == gpu_check.STALE_WHEEL
    page = gpu_report.markdown({"versions": {"thunder_rs_sources": gpu_check.STALE_WHEEL}})
    assert "Rebuild it (make gpu-wheels)" in page


def test_the_report_gives_each_ratio_to_eager_of_the_same_process():
    row = {"out_rel_diff": 0.01, "grad_rel_diff": 0.02, "matches_eager": True}
    rows = [
        {"process": 0, "variant": "eager", "case": "forward", "first_s": 1.0, "per_call_ms": 0.4, **row},
        {"process": 0, "variant": "eager", "case": "train_step", "first_s": 1.0, "per_call_ms": 2.0, **row},
        {"process": 0, "variant": "thunder_rs:default", "case": "forward", "first_s": 0.5, "per_call_ms": 0.3, **row},
        {
            "process": 0,
            "variant": "thunder_rs:default",
            "case": "train_step",
            "error": "the process died (exit status -11) during this case",
        },
        {"process": 1, "variant": "eager", "case": "forward", "first_s": 1.0, "per_call_ms": 0.8, **row},
        {
            "process": 1,
            "variant": "torch.compile",
            "case": "forward",
            "first_s": 3.0,
            "per_call_ms": 0.4,
            **row,
            "matches_eager": False,
        },
        {"process": 1, "variant": "lightning-thunder", "case": "train_step", "skipped": "the budget ran out"},
        {
            "process": 1,
            "variant": "nvfuser-overhead",
            "case": "host",
            "fd_execute_us": 18.5,
            "region_call_us": 22.5,
            "jit_call_us": 22.9,
            "eager_one_op_us": 7.4,
            "thunder_rs_region_overhead_us": 4.0,
        },
    ]
    text = gpu_report.markdown(
        {
            "versions": {"gpu": "NVIDIA H100"},
            "benchmark": {"calls": 20, "rows": rows},
            "tests": {
                "rc": 1,
                "summary": "2 failed, 3 passed in 100s",
                "seconds": 100,
                "failed": ["FAILED tests/test_cuda.py::x - boom"],
            },
        }
    )
    assert "| thunder_rs:default (process 0) | 0.50 s | 0.300 ms | 0.75x | **fails** |" in text
    assert "| torch.compile (process 1) | 3.00 s | 0.400 ms | 0.50x |" in text and "**differs**" in text
    assert "lightning-thunder train step: not run (the budget ran out)" in text
    assert "4.0 µs of thunder_rs" in text and "`FAILED tests/test_cuda.py::x - boom`" in text


@pytest.mark.slow
def test_the_dry_run_on_the_cpu_writes_every_result_file(tmp_path):
    """The whole ``run`` without CUDA (``--device cpu --tiny``): versions, the benchmark in its
    child process (Lightning Thunder fails alone where it is not installed), the profile, the JSON
    and the markdown."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nvfuser_direct is absent here
        rc = gpu_check.main(
            [
                "run",
                "--device",
                "cpu",
                "--tiny",
                "--skip-tests",
                "--results",
                str(tmp_path),
                "--calls",
                "1",
                "--variant",
                "thunder_rs:torch",
                "--variant",
                "lightning-thunder",
                "--no-overhead",
                "--dynamic-sizes",
                "2",
                "2",
                "--budget",
                "300",
            ]
        )
    assert rc == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert set(report["dynamic"]["runs"]) == {"padding", "batch", "decode", "images"}, report["dynamic"]
    assert report["dynamic"]["runs"]["decode"]["same_tokens"] == "True"
    assert "## Shapes that change between calls" in (tmp_path / "cuda.md").read_text()
    rows = {(r["variant"], r["case"]): r for r in report["benchmark"]["rows"]}
    assert set(rows) == {
        (v, c) for v in ("eager", "thunder_rs:torch", "lightning-thunder") for c in ("forward", "train_step")
    }
    assert rows[("thunder_rs:torch", "train_step")]["matches_eager"]
    assert {p.name for p in tmp_path.iterdir()} == {
        "gpu_check.json",
        "gpu_check.log",
        "profile.txt",
        "cuda.md",
        "dynamic.txt",
    }
    assert "| thunder_rs:torch |" in (tmp_path / "cuda.md").read_text()


def test_a_benchmark_process_that_cannot_start_fails_every_case_once_with_its_error_in_the_log(tmp_path):
    """Here the benchmark asks for CUDA on a machine without it: the child process fails before its
    first case; the check records that for each case and starts no other."""
    results = gpu_check.Results(tmp_path, budget=300)
    args = argparse.Namespace(
        variant=["thunder_rs:torch"], no_overhead=True, calls=1, device="cuda", tiny=True, no_profile=True
    )
    bench = gpu_check.run_benchmark(results, args)
    assert len(bench["rows"]) == 4 and all("before its first case" in row["error"] for row in bench["rows"])
    assert "failed outside its cases" in (tmp_path / "gpu_check.log").read_text()


def test_after_a_crash_a_fresh_process_times_eager_again_and_runs_the_cases_left(tmp_path, monkeypatch):
    """The child processes are simulated: each writes its progress as gpu_bench does, and the
    first dies (signal 11) in thunder_rs:default's training step."""
    commands = []

    def child(cmd, output, seconds, env=None, log=None):
        cases = cmd[cmd.index("--cases") + 1].split(",")
        commands.append(cases)
        with open(cmd[cmd.index("--progress") + 1], "a") as progress:
            progress.write(json.dumps({"event": "process", "size": [64, 4, 32, 2]}) + "\n")
            for case in cases:
                variant, _, name = case.rpartition(":")
                progress.write(json.dumps({"event": "start", "variant": variant, "case": name}) + "\n")
                if case == "thunder_rs:default:train_step" and len(commands) == 1:
                    return -11, False
                progress.write(
                    json.dumps(
                        {"event": "result", "variant": variant, "case": name, "first_s": 1.0, "per_call_ms": 1.0}
                    )
                    + "\n"
                )
        return 0, False

    monkeypatch.setattr(gpu_check, "run_bounded", child)
    args = argparse.Namespace(
        variant=["thunder_rs:default", "torch.compile"],
        no_overhead=True,
        calls=1,
        device="cuda",
        tiny=False,
        no_profile=True,
    )
    bench = gpu_check.run_benchmark(gpu_check.Results(tmp_path, budget=300), args)
    assert commands[1] == ["eager:forward", "eager:train_step", "torch.compile:forward", "torch.compile:train_step"]
    crashed = [r for r in bench["rows"] if "error" in r]
    assert crashed == [
        {
            "process": 0,
            "variant": "thunder_rs:default",
            "case": "train_step",
            "error": "the process died (exit status -11) during this case",
        }
    ]
    assert {(r["process"], r["variant"]) for r in bench["rows"] if "error" not in r} == {
        (0, "eager"),
        (0, "thunder_rs:default"),
        (1, "eager"),
        (1, "torch.compile"),
    }
    assert json.loads((tmp_path / "gpu_check.json").read_text())["benchmark"]["rows"] == bench["rows"]


def cuda_marked_tests(source: str) -> list[tuple[str, str]]:
    """``(test, marker)`` for each test function of ``source`` that a ``gpu`` or ``requires_cuda``
    marker reaches: on the function, on a parameter of it (``pytest.param("cuda", marks=...)``, a
    CUDA variant of a CPU test), or on the whole module (``pytestmark``)."""
    import ast  # noqa: PLC0415
    import re  # noqa: PLC0415

    marker = re.compile(r"\bmark\.(gpu|requires_cuda)\b")
    tree = ast.parse(source)
    module = [
        m.group(1)
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets)
        for m in marker.finditer(ast.get_source_segment(source, node) or "")
    ]
    found = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            decorators = (ast.get_source_segment(source, d) or "" for d in node.decorator_list)
            marks = [m.group(1) for d in decorators for m in marker.finditer(d)]
            found += [(node.name, kind) for kind in dict.fromkeys(marks + module)]
    return found


def test_cuda_marked_tests_are_found_on_functions_parameters_and_modules():
    source = (
        "import pytest\n@pytest.mark.gpu\ndef test_a():\n    pass\n"
        '@pytest.mark.parametrize("d", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])\n'
        "def test_b(d):\n    pass\ndef test_c():\n    pass\n"
    )
    assert cuda_marked_tests(source) == [("test_a", "gpu"), ("test_b", "gpu")]
    assert cuda_marked_tests("import pytest\npytestmark = [pytest.mark.gpu]\ndef test_d():\n    pass\n") == [
        ("test_d", "gpu")
    ]


def test_every_cuda_test_is_in_the_checks_selection():
    """Each test marked ``gpu`` or ``requires_cuda`` (the suite runs ``-m gpu``), or with a CUDA
    parameter so marked, is in a file or node the check selects, test_ops.py's CUDA parameters
    excepted (left out for their collection time)."""
    selected = gpu_check.TESTS + gpu_check.SYMBOLIC_TESTS
    missing = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        name = f"tests/{path.name}"
        for test, kind in cuda_marked_tests(path.read_text()):
            node = f"{name}::{test}"
            if kind != "gpu" or not (name in selected or node in selected or name == "tests/test_ops.py"):
                missing.append(f"{node} ({kind})")
    assert not missing


def test_every_test_the_check_names_exists():
    """A node id of a renamed test would stop pytest before it runs anything ("not found"):
    each file the check selects exists, and each node names a test function of its file."""
    import re  # noqa: PLC0415

    missing = []
    for entry in gpu_check.TESTS + gpu_check.SYMBOLIC_TESTS:
        path, _, test = entry.partition("::")
        source = (ROOT / path).read_text() if (ROOT / path).exists() else None
        if source is None or (test and not re.search(rf"^def {re.escape(test)}\(", source, re.MULTILINE)):
            missing.append(entry)
    assert not missing
