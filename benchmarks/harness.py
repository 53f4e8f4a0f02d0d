"""Shared timing code for the thunder_rs benchmarks.

A *case* is a function or module plus its inputs. A *backend* turns the function into a callable:

  eager          the function itself
  thunder_rs     thunder_rs.jit           (skipped with a note when `import thunder_rs` fails)
  thunder        thunder.jit              (Lightning Thunder, only when `import thunder` works)
  torch.compile  torch.compile            (only with --with-compile or BENCH_TORCH_COMPILE=1)

For every (case, backend) pair we measure
  first call  wall time of the first call of a freshly jitted callable (ms, median over N fresh jits)
  per call    median per-call time (us) of a warm callable, timed with time.perf_counter_ns
and report the per-call ratio against eager measured in the same process. The first call's median
keeps one-time process costs (lazy imports paid by the first jit of a process) out of the number;
a backend's ``reset`` runs before each fresh jit, so that no fresh jit finds what an earlier one
compiled in the process: thunder_rs+inductor forgets its compiled regions (which the jits of one
process share), so its first call compiles every region again, from the on-disk caches when
they are on (``inductor_cache_note`` says which are);
the JSON output keeps every sample. Per-call timing alternates the backends within each repeat, so
load from other processes hits them alike. A backend that fails on a case gets a row with the
error's class name instead of numbers; the run goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch


# ----------------------------------------------------------------------------- cases and backends


@dataclass
class Case:
    name: str
    make_fn: Callable[[], Callable]  # returns a fresh function or nn.Module
    make_args: Callable[[], tuple]
    inner: int = 100  # calls per timed repeat (per-call measurement)
    no_grad: bool = False
    description: str = ""

    def context(self):
        return torch.no_grad() if self.no_grad else contextlib.nullcontext()


@dataclass
class Backend:
    name: str
    wrap: Callable[[Callable], Callable] | None  # None: not available
    note: str = ""  # why it is unavailable
    reset: Callable[[], None] = lambda: None  # called before each fresh wrap
    max_first_repeats: int | None = None  # cap on fresh compilations (torch.compile is slow)

    @property
    def available(self) -> bool:
        return self.wrap is not None


def _import_error(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {msg}"[:160]


def eager_backend() -> Backend:
    return Backend("eager", wrap=lambda fn: fn)


def thunder_rs_backend(executors: tuple[str, ...] = ()) -> Backend:
    """thunder_rs with its default executors, or with ``executors`` (names, in priority order)
    as ``thunder_rs+inductor``."""
    name = "+".join(("thunder_rs", *executors))
    try:
        import thunder_rs

        if not hasattr(thunder_rs, "jit"):
            raise ImportError("thunder_rs has no attribute 'jit' (package not built?)")
    except Exception as exc:  # noqa: BLE001 - any import failure means "skip"
        return Backend(name, None, note=f"import thunder_rs failed ({_import_error(exc)})")
    if not executors:
        return Backend(name, wrap=thunder_rs.jit)
    return Backend(
        name,
        wrap=lambda fn: thunder_rs.jit(fn, executors=list(executors)),
        reset=_forget_compiled_regions if "inductor" in executors else lambda: None,
    )


def _forget_compiled_regions() -> None:
    """Makes the next first call compile its Inductor regions, as a fresh process does."""
    from thunder_rs.executors import inductor_ex

    inductor_ex.clear_compiled()


def inductor_cache_note() -> str:
    """Which on-disk caches a thunder_rs+inductor first call can load its regions from in this
    process: Inductor's graph caches and thunder_rs's artifact cache, both off under
    --with-compile (cold compiles, as torch.compile's)."""
    from torch._inductor import config

    from thunder_rs.executors import inductor_cache

    graphs = config.fx_graph_cache and torch._functorch.config.enable_autograd_cache
    artifacts = inductor_cache.directory() is not None
    return (
        f"thunder_rs+inductor first call: regions compiled afresh per jit; Inductor's graph caches "
        f"{'on' if graphs else 'off'}, thunder_rs's artifact cache {'on' if artifacts else 'off'}"
    )


def thunder_backend() -> Backend:
    try:
        import thunder
    except Exception as exc:  # noqa: BLE001
        return Backend("thunder", None, note=f"import thunder failed ({_import_error(exc)})")
    return Backend("thunder", wrap=thunder.jit)


def torch_compile_backend(enabled: bool) -> Backend:
    if not enabled:
        return Backend("torch.compile", None, note="disabled (pass --with-compile or BENCH_TORCH_COMPILE=1)")
    # No background pool of compile workers: on a small machine they steal CPU from the timed loops.
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    # Cold compiles: every fresh torch.compile starts without the on-disk graph caches of earlier ones.
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
    # thunder_rs+inductor's first calls compile cold too, not from its artifact cache.
    os.environ.setdefault("THUNDER_RS_CACHE_DIR", "")
    return Backend("torch.compile", wrap=torch.compile, reset=torch._dynamo.reset, max_first_repeats=3)


def default_backends(
    with_compile: bool = False, names: set[str] | None = None, executor_sets: list[tuple[str, ...]] | None = None
) -> list[Backend]:
    """eager always comes first; ``names`` limits the others (unselected ones are not even
    imported). ``executor_sets`` makes one thunder_rs backend per set of executor names (``()``
    is the default executors)."""
    with_compile = with_compile or os.environ.get("BENCH_TORCH_COMPILE") == "1"
    sets = executor_sets or [()]
    factories = {
        "thunder_rs": lambda: [thunder_rs_backend(s) for s in sets],
        "thunder": thunder_backend,
        "torch.compile": lambda: torch_compile_backend(with_compile or "torch.compile" in (names or ())),
    }
    unknown = (names or set()) - set(factories) - {"eager"}
    if unknown:
        raise ValueError(f"unknown backend(s): {', '.join(sorted(unknown))}; known: eager, {', '.join(factories)}")
    backends = [eager_backend()]
    for name, make in factories.items():
        if names is None or name in names:
            made = make()
            backends.extend(made if isinstance(made, list) else [made])
    return backends


# ----------------------------------------------------------------------------- measurement


@dataclass
class FirstCall:
    median_ms: float
    samples_ms: list[float]
    last_callable: Callable  # the last fresh callable, already warm: reused for per-call timing
    last_output: Any


@dataclass
class PerCall:
    median_us: float
    min_us: float
    samples_us: list[float]


def measure_first_call(make_callable: Callable[[], Callable], args: tuple, repeats: int = 5) -> FirstCall:
    """Wall time of the first call of a fresh callable (``make_callable()`` is not timed)."""
    samples, fn, out = [], None, None
    for _ in range(repeats):
        fn = make_callable()
        gc.collect()
        t0 = time.perf_counter_ns()
        out = fn(*args)
        samples.append((time.perf_counter_ns() - t0) / 1e6)
    return FirstCall(statistics.median(samples), samples, fn, out)


def _time_calls(fn: Callable, args: tuple, inner: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(inner):
        fn(*args)
    return (time.perf_counter_ns() - t0) / 1e3 / inner


def measure_per_call(fn: Callable, args: tuple, warmup: int = 10, repeats: int = 21, inner: int = 100) -> PerCall:
    """Median over ``repeats`` of (time of ``inner`` back-to-back calls) / inner, in microseconds."""
    results, errors = measure_per_call_interleaved({"fn": fn}, args, warmup, repeats, inner)
    if errors:
        raise errors["fn"]
    return results["fn"]


def measure_per_call_interleaved(
    fns: dict[str, Callable], args: tuple, warmup: int = 10, repeats: int = 21, inner: int = 100
) -> tuple[dict[str, PerCall], dict[str, Exception]]:
    """Like ``measure_per_call`` for several callables, alternating them within each repeat so that
    drift on a noisy machine hits all of them alike. A callable that raises is dropped and its
    exception returned in the second dict."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    errors: dict[str, Exception] = {}
    active = dict(fns)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for rep in range(repeats + 1):  # repeat 0 is the warmup
            for name, fn in list(active.items()):
                try:
                    t = _time_calls(fn, args, warmup if rep == 0 else inner)
                except Exception as exc:  # noqa: BLE001
                    errors[name] = exc
                    del active[name]
                    continue
                if rep > 0:
                    samples[name].append(t)
    finally:
        if gc_was_enabled:
            gc.enable()
    results = {n: PerCall(statistics.median(s), min(s), s) for n, s in samples.items() if n in active}
    return results, errors


# ----------------------------------------------------------------------------- running


@dataclass
class Settings:
    first_repeats: int = 5
    repeats: int = 21
    inner_scale: float = 1.0
    check_outputs: bool = True


@dataclass
class Row:
    case: str
    backend: str
    first_ms: float | None = None
    per_us: float | None = None
    ratio: float | None = None  # per call / eager per call
    error: str | None = None  # error class name, shown in the table
    message: str | None = None  # full error message, in the footnotes and the JSON
    first_samples_ms: list[float] = field(default_factory=list)
    per_samples_us: list[float] = field(default_factory=list)


def _check_close(actual, expected) -> None:
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _set_error(row: Row, exc: Exception) -> None:
    row.error = "mismatch" if isinstance(exc, AssertionError) else type(exc).__name__
    row.message = f"{type(exc).__name__}: {str(exc).strip()}"


def first_call(case: Case, backend: Backend, settings: Settings, args: tuple, expected) -> tuple[Row, Callable]:
    """Measures the first call of fresh callables; returns the row and the last (warm) callable."""
    row = Row(case.name, backend.name)
    repeats = min(settings.first_repeats, backend.max_first_repeats or settings.first_repeats)

    def make_callable():
        backend.reset()
        fn = backend.wrap(case.make_fn())
        torch.manual_seed(0)  # random ops (dropout) draw what the expected output drew
        return fn

    try:
        first = measure_first_call(make_callable, args, repeats=repeats)
        if settings.check_outputs and expected is not None:
            _check_close(first.last_output, expected)
    except Exception as exc:  # noqa: BLE001 - a failing backend becomes a row, not a crash
        _set_error(row, exc)
        return row, None
    row.first_ms, row.first_samples_ms = first.median_ms, first.samples_ms
    return row, first.last_callable


def run_case(case: Case, backends: list[Backend], settings: Settings, log=progress) -> list[Row]:
    """First calls backend by backend, then per-call timing of all warm callables interleaved."""
    args = case.make_args()
    rows, warm = {}, {}
    with case.context():
        reference = case.make_fn()
        torch.manual_seed(0)
        expected = reference(*args)
        for backend in backends:
            log(f"  {case.name:<22} first call   {backend.name}")
            rows[backend.name], fn = first_call(case, backend, settings, args, expected)
            if fn is not None:
                warm[backend.name] = fn
        log(f"  {case.name:<22} per call     {', '.join(warm)}")
        inner = max(1, int(case.inner * settings.inner_scale))
        per, errors = measure_per_call_interleaved(
            warm, args, warmup=max(3, inner // 2), repeats=settings.repeats, inner=inner
        )
    for name, exc in errors.items():
        _set_error(rows[name], exc)
    eager = per.get("eager")
    for name, timing in per.items():
        rows[name].per_us, rows[name].per_samples_us = timing.median_us, timing.samples_us
        if eager is not None:
            rows[name].ratio = timing.median_us / eager.median_us
    return list(rows.values())


def run_all(cases: list[Case], backends: list[Backend], settings: Settings, log=progress) -> list[Row]:
    available = [b for b in backends if b.available]
    return [row for case in cases for row in run_case(case, available, settings, log)]


# ----------------------------------------------------------------------------- output


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(rows: list[Row], per_label: str = "per call") -> str:
    header = f"{'case':<22} {'backend':<20} {'first call (ms)':>16} {per_label + ' (us)':>14} {'vs eager':>9}"
    lines = [header, "-" * len(header)]
    for r in rows:
        if r.error:
            lines.append(f"{r.case:<22} {r.backend:<20}  ERROR: {r.error}")
            continue
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        lines.append(f"{r.case:<22} {r.backend:<20} {_fmt(r.first_ms, '16.2f')} {_fmt(r.per_us, '14.1f')} {ratio:>9}")
    errors = [r for r in rows if r.error]
    if errors:
        lines.append("")
        lines.extend(f"  [{r.case} / {r.backend}] {r.message.splitlines()[0][:200]}" for r in errors)
    return "\n".join(lines)


def format_skipped(backends: list[Backend]) -> str:
    return "\n".join(f"note: backend {b.name} skipped: {b.note}" for b in backends if not b.available)


def find_row(rows: list[Row], case: str, backend: str) -> Row | None:
    return next((r for r in rows if r.case == case and r.backend == backend), None)


# ----------------------------------------------------------------------------- targets


def evaluate_targets(targets: list[tuple], rows: list[Row], backend: str = "thunder_rs") -> list[dict]:
    """``targets`` holds (case, metric, limit, label); metric "ratio" is per call vs eager (limit
    inclusive), "first_ms" the first-call time (limit exclusive)."""
    results = []
    for case, metric, limit, label in targets:
        row = find_row(rows, case, backend)
        value = None if row is None else getattr(row, metric)
        if value is None:
            status = "n/a" if row is None else f"ERROR {row.error}" if row.error else "n/a"
        else:
            ok = value <= limit if metric == "ratio" else value < limit
            status = "PASS" if ok else "FAIL"
        results.append(
            {"target": label, "case": case, "metric": metric, "limit": limit, "measured": value, "status": status}
        )
    return results


def format_targets(results: list[dict], backend: str = "thunder_rs") -> str:
    lines = [f"targets ({backend}):"]
    for r in results:
        if r["measured"] is None:
            measured = "-"
        elif r["metric"] == "ratio":
            measured = f"{r['measured']:.2f}x"
        else:
            measured = f"{r['measured']:.1f} ms"
        lines.append(f"  {r['target']:<40} measured {measured:>9}   {r['status']}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- command line


def parse_args(description: str, argv=None):
    """The flags every benchmark script takes."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer repeats and calls (smoke test)")
    p.add_argument("--with-compile", action="store_true", help="also run torch.compile (slow)")
    p.add_argument("--json", metavar="PATH", help="write rows, targets and environment as JSON")
    p.add_argument("--cases", help="comma-separated case names to run (default: all)")
    p.add_argument(
        "--backends",
        help="comma-separated backends besides eager: thunder_rs, thunder, torch.compile "
        "(default: all available; naming torch.compile enables it)",
    )
    p.add_argument(
        "--executors",
        action="append",
        metavar="NAMES",
        help="a comma-separated executor set for thunder_rs (e.g. inductor); repeat the flag for "
        "several columns, 'default' for the default executors (default: default only)",
    )
    return p.parse_args(argv)


def executor_sets(values: list[str] | None) -> list[tuple[str, ...]]:
    """``--executors`` values as executor-name tuples; ``default`` is the empty tuple."""
    if not values:
        return [()]
    return [() if v == "default" else tuple(n for n in v.split(",") if n) for v in values]


def settings_for(quick: bool) -> Settings:
    if quick:
        return Settings(first_repeats=3, repeats=5, inner_scale=0.2)
    return Settings(first_repeats=5, repeats=21, inner_scale=1.0)


def select(items, names: str | None):
    """The items named in the comma-separated ``names`` (all when it is empty)."""
    if not names:
        return items
    wanted = set(names.split(","))
    unknown = wanted - {i.name for i in items}
    if unknown:
        raise SystemExit(f"unknown name(s): {', '.join(sorted(unknown))}")
    return [i for i in items if i.name in wanted]


def backends_from_args(args) -> list[Backend]:
    names = set(args.backends.split(",")) if args.backends else None
    try:
        return default_backends(
            with_compile=args.with_compile, names=names, executor_sets=executor_sets(getattr(args, "executors", None))
        )
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None


def format_header(load_before: float, quick: bool, backends: list[Backend] = ()) -> str:
    env = environment_info()
    header = (
        f"torch {env['torch']}, python {env['python']}, {env['num_threads']} thread "
        f"({env['cpu_count']} cpus, load {load_before:.2f} before / {env['load_average'][0]:.2f} after), "
        f"{'quick' if quick else 'full'} run"
    )
    if any("inductor" in b.name.split("+") and b.available for b in backends):
        header += "\n" + inductor_cache_note()
    return header


def write_json(path, rows, targets, backends, args) -> None:
    payload = {
        "environment": environment_info(),
        "quick": args.quick,
        "skipped_backends": {b.name: b.note for b in backends if not b.available},
        "rows": [asdict(r) for r in rows],
        "targets": targets,
    }
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
    print(f"wrote {path}")


def environment_info() -> dict:
    import platform

    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "num_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],  # other load makes timings noisy
    }
