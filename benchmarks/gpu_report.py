"""The markdown page of a GPU check (``benchmarks/results/cuda.md``) from its ``gpu_check.json``:
the benchmark table with each variant's ratio to eager measured in the same process, the checks
against eager, where compile time went, nvFuser's host overhead and the CUDA tests' outcome."""

import gpu_bench

CASE_TITLES = {"forward": "forward", "train_step": "train step"}


def _ms(value) -> str:
    return "—" if value is None else f"{value:.3f} ms"


def _s(value) -> str:
    return "—" if value is None else f"{value:.2f} s"


def _ratio(row, eager) -> str:
    if not row or not eager or row.get("per_call_ms") is None or not eager.get("per_call_ms"):
        return "—"
    return f"{row['per_call_ms'] / eager['per_call_ms']:.2f}x"


def _outcome(row) -> str:
    if row is None:
        return "—"
    if "error" in row:
        return "**fails**"
    if "skipped" in row:
        return "not run"
    return ""


def _cells(row, eager) -> list[str]:
    """first call, per call, ratio to eager: the row's, or what happened instead."""
    outcome = _outcome(row)
    if outcome:
        return [outcome, "", ""]
    return [_s(row["first_s"]), _ms(row["per_call_ms"]), _ratio(row, eager)]


def _check(rows) -> str:
    parts = []
    for case, row in rows.items():
        if row and "out_rel_diff" in row:
            grads = f" / {row['grad_rel_diff']:.2g}" if case == "train_step" else ""
            mark = "" if row.get("matches_eager") else " **differs**"
            parts.append(f"{row['out_rel_diff']:.2g}{grads}{mark}")
    return "; ".join(parts) or "—"


def _by_process(rows: list[dict]) -> dict:
    """{process: {variant: {case: row}}}, variants in the benchmark's order."""
    table: dict = {}
    for row in rows:
        table.setdefault(row.get("process"), {}).setdefault(row["variant"], {})[row["case"]] = row
    return table


def benchmark_table(bench: dict) -> list[str]:
    rows = [r for r in bench.get("rows", []) if r["variant"] in gpu_bench.VARIANTS]
    processes = _by_process(rows)
    several = len([p for p in processes if p is not None]) > 1
    lines = [
        "| variant | forward first call | forward per call | forward / eager | train step first call "
        "| train step per call | train step / eager | vs eager: forward; train out / grads | kernels per "
        "train step |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for process, variants in processes.items():
        eager = variants.get("eager", {})
        for variant in sorted(variants, key=gpu_bench.VARIANTS.index):
            cases = variants[variant]
            forward, train = cases.get("forward"), cases.get("train_step")
            name = variant if not several else f"{variant} (process {process})"
            kernels = (train or {}).get("kernels_per_call") or None  # none counted on the CPU
            lines.append(
                "| "
                + " | ".join(
                    [
                        name,
                        *_cells(forward, eager.get("forward")),
                        *_cells(train, eager.get("train_step")),
                        _check({"forward": forward, "train_step": train}),
                        "—" if kernels is None else f"{kernels:.0f}",
                    ]
                )
                + " |"
            )
    return lines


def problems(bench: dict) -> list[str]:
    lines = []
    for row in bench.get("rows", []):
        what = f"{row['variant']} {CASE_TITLES.get(row['case'], row['case'])}"
        if "error" in row:
            lines.append(f"- {what}: `{row['error'][:400]}`")
        elif "skipped" in row:
            lines.append(f"- {what}: not run ({row['skipped']})")
        for warning in row.get("warnings", []):
            lines.append(f"- {what} warned: `{warning[:300]}`")
    return lines


def compile_notes(bench: dict) -> list[str]:
    lines = []
    for row in bench.get("rows", []):
        what = f"{row['variant']} {CASE_TITLES.get(row['case'], row['case'])}"
        if "regions" in row:
            lines.append(
                f"- {what}: {row['regions']['forward']} forward and {row['regions']['backward']} backward regions"
            )
        inductor = row.get("inductor")
        if inductor:
            startup = ", ".join(f"{k} {v:.1f} s" for k, v in inductor["startup_s"].items()) or "already done"
            times = ", ".join(f"{t:.1f}" for t in inductor["compile_s"])
            lines.append(
                f"  - Inductor: start-up {startup}; region compiles [{times}] s; "
                f"{inductor['disk_hits']} from Inductor's disk cache, {inductor['artifact_hits']} from "
                f"thunder_rs's artifact cache, {inductor['failures']} failed"
            )
        if row.get("nvfuser"):
            lines.append(f"  - nvFuser: {row['nvfuser']}")
    return lines


def overhead(bench: dict) -> list[str]:
    row = next((r for r in bench.get("rows", []) if f"{r['variant']}:{r['case']}" == gpu_bench.OVERHEAD), None)
    if row is None:
        return []
    if "fd_execute_us" not in row:
        return [f"nvFuser host overhead: {row.get('error') or row.get('skipped')}"]
    return [
        f"nvFuser host overhead (tiny inputs): `fd.execute` {row['fd_execute_us']:.1f} µs, thunder_rs's "
        f"region call {row['region_call_us']:.1f} µs ({row['thunder_rs_region_overhead_us']:.1f} µs of "
        f"thunder_rs), the whole jitted call {row['jit_call_us']:.1f} µs, one eager op "
        f"{row['eager_one_op_us']:.1f} µs."
    ]


def tests_section(tests: dict, title: str = "CUDA tests", output: str = "tests.txt") -> list[str]:
    if not tests:
        return []
    if "skipped" in tests:
        return [f"## {title}", "", f"Not run: {tests['skipped']}.", ""]
    lines = [
        f"## {title}",
        "",
        f"`{tests.get('summary', '')}` (exit status {tests.get('rc')}, "
        f"{tests.get('seconds', 0):.0f} s{', stopped at its time limit' if tests.get('timed_out') else ''}; "
        f"tracebacks in `{output}`).",
    ]
    failed = tests.get("failed", [])
    if failed:
        lines += ["", *[f"- `{line[:250]}`" for line in failed[:80]]]
        if len(failed) > 80:
            lines.append(f"- … and {len(failed) - 80} more")
    return [*lines, ""]


def markdown(report: dict) -> str:
    v = report.get("versions", {})
    bench = report.get("benchmark", {})
    size = next((r.get("size") for r in bench.get("rows", []) if r.get("size")), None) or gpu_bench.SIZE
    lines = [
        f"# thunder_rs on {v.get('gpu', bench.get('device', 'CUDA'))} ({report.get('date', '')})",
        "",
        f"Python {v.get('python')}, torch {v.get('torch')} (CUDA {v.get('cuda')}), Triton {v.get('triton')}, "
        f"nvFuser {v.get('nvfuser')}, Lightning Thunder {v.get('lightning-thunder')}; thunder_rs's default "
        f"executors: {v.get('default_executors')}; Inductor: {v.get('inductor')}. Made by "
        "`benchmarks/gpu_check.py`.",
        "",
    ]
    if v.get("thunder_rs_sources", "as the tree's") != "as the tree's":
        lines += [f"**thunder_rs's Python sources: {v['thunder_rs_sources']}.**", ""]
    if bench:
        n_embd, n_head, seq, batch = size
        lines += [
            f"GPT block (`examples/gpt.py`) in bfloat16: n_embd {n_embd}, {n_head} heads, sequence {seq}, "
            f"batch {batch}. Forward under `no_grad`; the training step is forward, `backward(g)`, AdamW "
            f"step, `zero_grad` (the optimizer runs eagerly in every row). Medians of {bench.get('calls')} "
            'calls; each ratio to eager is to eager measured in the same process. "vs eager" is the '
            "largest difference from eager's output (and gradients) after the first call, relative to "
            "eager's largest magnitude. The first variant that compiles with Inductor in a process pays "
            "Inductor's start-up (thunder_rs:inductor runs before torch.compile); its compile notes below "
            "give it apart.",
            "",
            *benchmark_table(bench),
            "",
        ]
        for section in (problems(bench), compile_notes(bench), overhead(bench)):
            if section:
                lines += [*section, ""]
    lines += tests_section(report.get("symbolic", {}), "Symbolic sizes on CUDA (run first)", "symbolic.txt")
    lines += tests_section(report.get("tests", {}))
    lines += dynamic_section(report.get("dynamic", {}))
    return "\n".join(lines).rstrip() + "\n"


def dynamic_section(dynamic: dict) -> list[str]:
    """``dynamic_shapes.py`` on the device: each run's figures as it printed them."""
    if not dynamic:
        return []
    lines = ["## Shapes that change between calls (`benchmarks/dynamic_shapes.py`)", ""]
    if "skipped" in dynamic:
        return [*lines, f"Skipped: {dynamic['skipped']}."]
    for name, figures in dynamic.get("runs", {}).items():
        lines.append(f"- {name}: " + ", ".join(f"{k} {v}" for k, v in figures.items()))
    if dynamic.get("timed_out"):
        lines.append("- stopped at the check's time limit: the runs not listed did not finish")
    return lines
