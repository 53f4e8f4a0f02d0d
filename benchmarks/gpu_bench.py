"""The GPU check's benchmark: the GPT block's forward and training step in one process, for each
variant (eager, thunder_rs with the torch executor alone, thunder_rs's defaults, thunder_rs with
Inductor regions, torch.compile, Lightning Thunder 0.2.6), checked against eager and timed.

    python benchmarks/gpu_bench.py --cases eager:forward,thunder_rs:torch:train_step,... \\
        --progress FILE.jsonl --log gpu_check.log [--profile profile.txt] [--device cpu --tiny]

``gpu_check.py run`` starts it and restarts it after a crash with the cases left; it appends one
JSON line to ``--progress`` when a case starts and one with its result, so that a crash or the
end of the budget loses only the case in flight. Each process first computes eager's outputs
and gradients (the reference of every check) and times eager itself, so that every ratio to
eager is of one process. One variant's failure is its row's ``error``, never the end of the run.
"""

import argparse
import contextlib
import copy
import json
import os
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import torch  # noqa: E402

from gpt import Block, GPTConfig  # noqa: E402

CASES = ("forward", "train_step")
VARIANTS = (
    "eager",
    "thunder_rs:torch",
    "thunder_rs:default",
    "thunder_rs:inductor",
    "torch.compile",
    "lightning-thunder",
)
#: nvFuser's host overhead per region call (``region_overhead``), run as a case of its own.
OVERHEAD = "nvfuser-overhead:host"
#: (n_embd, n_head, sequence, batch): the benchmark's GPT block, and the CPU dry run's.
SIZE, TINY = (768, 12, 1024, 8), (64, 4, 32, 2)
#: A case does not start with less time than this left before the deadline.
MIN_CASE_S = 10.0
#: Largest difference from eager, relative to eager's largest magnitude, that counts as a match
#: in bfloat16 (its epsilon is 2**-7; reductions over 8,192 tokens round differently).
BF16_REL_TOL = 5e-2


class Log:
    """Prints each line and appends it to the log file."""

    def __init__(self, path: Path | None, echo: bool = True):
        self.file = path.open("a") if path else None
        self.echo = echo

    def __call__(self, *parts):
        line = " ".join(str(p) for p in parts)
        if self.echo:
            print(line, flush=True)
        if self.file:
            self.file.write(line + "\n")
            self.file.flush()


# -- variants -----------------------------------------------------------------------------------------


#: Lightning Thunder's module, or the error its import raised: a second import of a package whose
#: first import failed half-way fails differently (its registries are half filled).
_lightning_thunder: list = []


def import_lightning_thunder():
    """Lightning Thunder 0.2.6 (imported once; a failed import raises its first error again)."""
    if not _lightning_thunder:
        try:
            _lightning_thunder.append(_import_lightning_thunder())
        except Exception as e:  # noqa: BLE001 (kept and raised for every case of the variant)
            _lightning_thunder.append(e)
    if isinstance(_lightning_thunder[0], Exception):
        raise _lightning_thunder[0]
    return _lightning_thunder[0]


def _import_lightning_thunder():
    """Lightning Thunder, imported beside thunder_rs: torch attributes its op tables name but this
    torch removed get stand-ins that raise when called; ``nvfuser_direct`` is imported first with
    lazily bound symbols (its wheel is for torch 2.10) and ``nvfuser`` aliased to it, the old
    module name Thunder still imports one helper from."""
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.find_spec("thunder")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("lightning-thunder is not installed (gpu-carry has its wheel)")
    _stand_in_removed_torch_attributes((Path(spec.origin).parent / "torch" / "default_torch_ops.py").read_text())
    if torch.cuda.is_available() and "nvfuser" not in sys.modules:
        from thunder_rs.executors.nvfuser_ex import import_nvfuser_direct  # noqa: PLC0415

        with contextlib.suppress(ImportError):
            sys.modules["nvfuser"] = import_nvfuser_direct()
    import thunder  # noqa: PLC0415 (optional: only this variant needs it)

    return thunder


def _stand_in_removed_torch_attributes(source: str) -> list[str]:
    import re  # noqa: PLC0415

    added = []
    for path in sorted(set(re.findall(r"\b(torch(?:\.[A-Za-z_][A-Za-z0-9_]*)+)", source))):
        owner = torch
        for part in path.split(".")[1:]:
            if not hasattr(owner, part):

                def missing(*args, _name=path, **kwargs):
                    raise NotImplementedError(f"{_name} is not in torch {torch.__version__}")

                missing.__name__ = part
                with contextlib.suppress(AttributeError, TypeError):
                    setattr(owner, part, missing)
                    added.append(path)
                break
            owner = getattr(owner, part)
    return added


def wrappers() -> dict:
    """Each variant's ``wrap(module) -> callable``; imports happen when a variant is wrapped."""
    import thunder_rs  # noqa: PLC0415

    return {
        "eager": lambda m: m,
        "thunder_rs:torch": lambda m: thunder_rs.jit(m, executors=[]),
        "thunder_rs:default": thunder_rs.jit,
        "thunder_rs:inductor": lambda m: thunder_rs.jit(m, executors=["inductor"]),
        "torch.compile": torch.compile,
        "lightning-thunder": lambda m: import_lightning_thunder().jit(m),
    }


# -- the workload ---------------------------------------------------------------------------------------


class Workload:
    """The GPT block in bfloat16 on ``device``, its input and output gradient, and eager's
    forward output, training-step output and gradients (the reference of every check)."""

    def __init__(self, device: str, size=SIZE, dtype=torch.bfloat16):
        n_embd, n_head, seq, batch = size
        self.device, self.size = device, size
        torch.manual_seed(0)
        config = GPTConfig(n_embd=n_embd, n_head=n_head, block_size=seq, dropout=0.0)
        self.base = Block(config).to(device=device, dtype=dtype)
        self.x = torch.randn(batch, seq, n_embd, device=device, dtype=dtype)
        self.g = torch.randn_like(self.x)
        self.reference = {}
        for case in CASES:
            step, captured = self.step(case, copy.deepcopy(self.base), lambda m: m)
            step()
            self.reference[case] = captured[0]

    def sync(self):
        if self.device == "cuda":
            torch.cuda.synchronize()

    def step(self, case: str, block, wrap):
        """``(step, captured)``: one call of ``case`` of ``wrap(block)``; its first call leaves
        its output (and for the training step the input's and parameters' gradients) in
        ``captured``."""
        fn, x, captured = wrap(block), self.x, []
        if case == "forward":

            def forward():
                with torch.no_grad():
                    out = fn(x)
                if not captured:
                    captured.append({"out": out.detach().clone()})
                return out

            forward.fn = fn
            return forward, captured
        opt = torch.optim.AdamW(block.parameters(), lr=1e-4)
        xg = x.detach().clone().requires_grad_()

        def train_step():
            out = fn(xg)
            out.backward(self.g)
            if not captured:
                grads = [xg.grad] + [p.grad for p in block.parameters()]
                captured.append(
                    {"out": out.detach().clone(), "grads": [None if t is None else t.clone() for t in grads]}
                )
            opt.step()
            opt.zero_grad(set_to_none=True)
            xg.grad = None
            return out

        train_step.fn = fn
        return train_step, captured


def relative_difference(actual, expected) -> float:
    """max |actual - expected| / max |expected| (inf where a value is missing or its shape or dtype
    differs: a result that differs from eager in kind is no match)."""
    if actual is None or expected is None:
        return 0.0 if actual is expected else float("inf")
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return float("inf")
    scale = expected.float().abs().max().item() or 1.0
    return (actual.float() - expected.float()).abs().max().item() / scale


def check(captured: dict, reference: dict) -> dict:
    out = relative_difference(captured["out"], reference["out"])
    grads = max(
        (relative_difference(a, e) for a, e in zip(captured.get("grads", []), reference.get("grads", []))), default=0.0
    )
    return {"out_rel_diff": out, "grad_rel_diff": grads, "matches_eager": max(out, grads) <= BF16_REL_TOL}


def timed(step, calls: int, sync) -> tuple[float, float]:
    """(first call s, median per-call s over ``calls`` calls after one more warm-up call)."""
    sync()
    start = time.perf_counter()
    step()
    sync()
    first = time.perf_counter() - start
    step()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return first, sorted(times)[len(times) // 2]


# -- one case ---------------------------------------------------------------------------------------------


def run_case(work: Workload, variant: str, case: str, calls: int, profile_log) -> dict:
    """Times ``case`` of ``variant`` and checks it against eager; with ``profile_log``, profiles
    it and writes the table (and thunder_rs's execution traces) there."""
    wrap = wrappers()[variant]
    before = _executor_stats()
    step, captured = work.step(case, copy.deepcopy(work.base), wrap)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, per_call = timed(step, calls, work.sync)
    row = {"first_s": first, "per_call_ms": per_call * 1e3, **check(captured[0], work.reference[case])}
    messages = sorted({f"{w.category.__name__}: {w.message}"[:300] for w in caught})
    if messages:
        row["warnings"] = messages[:5]
    row.update(_regions(step.fn))
    row.update(_compile_stages(step.fn))
    row.update(_stats_since(before))
    if profile_log is not None:
        row.update(profile(step, work, f"{variant} {case}", profile_log))
    return row


def _regions(fn) -> dict:
    """How many fusion regions thunder_rs's last forward and backward execution traces hold."""
    if not _is_thunder_rs(fn):
        return {}
    import thunder_rs  # noqa: PLC0415

    forward, backward = thunder_rs.last_traces(fn), thunder_rs.last_backward_traces(fn)
    return {
        "regions": {
            "forward": len(forward[-1].regions()) if forward else 0,
            "backward": len(backward[-1].regions()) if backward else 0,
        }
    }


def _compile_stages(fn) -> dict:
    """Where thunder_rs's last compile spent its time (acquiring the trace, the passes, code
    generation, making the regions' callables); nvFuser's own define and compile times are in
    its stats (``_stats_since``), so a first call splits into trace, passes, definition, compile."""
    if not _is_thunder_rs(fn):
        return {}
    import thunder_rs  # noqa: PLC0415

    stats = thunder_rs.compile_stats(fn)
    return {"compile": {"last_compile_s": stats.last_compile_s, "stage_s": dict(stats.stage_s)}}


def _is_thunder_rs(fn) -> bool:
    return type(fn).__module__.split(".")[0] == "thunder_rs"


def _executor_stats() -> dict:
    """Copies of the counters of the executors that compile regions (those imported)."""
    stats = {}
    if "thunder_rs.executors.inductor_ex" in sys.modules:
        stats["inductor"] = sys.modules["thunder_rs.executors.inductor_ex"].stats()
    if "thunder_rs.executors.nvfuser_ex" in sys.modules:
        stats["nvfuser"] = dict(sys.modules["thunder_rs.executors.nvfuser_ex"].nvfuser_executor().stats)
    return stats


def _stats_since(before: dict) -> dict:
    """What the region compilers did during a case: Inductor's start-up and per-region compile
    times and cache hits; nvFuser's definitions and failures."""
    after, found = _executor_stats(), {}
    if "inductor" in after:
        new, old = after["inductor"], before.get("inductor")
        done = len(old.compile_s) if old else 0
        startup = {k: v for k, v in new.startup_s.items() if not old or k not in old.startup_s}
        if startup or new.compile_s[done:]:
            found["inductor"] = {
                "startup_s": startup,
                "compile_s": new.compile_s[done:],
                "disk_hits": new.disk_hits - (old.disk_hits if old else 0),
                "artifact_hits": new.artifact_hits - (old.artifact_hits if old else 0),
                "failures": new.failures - (old.failures if old else 0),
            }
    if "nvfuser" in after:
        old = before.get("nvfuser", {})
        delta = {k: v - old.get(k, 0) for k, v in after["nvfuser"].items()}
        if any(delta.values()):
            found["nvfuser"] = delta
    return found


# -- the profile ------------------------------------------------------------------------------------------


def profile(step, work: Workload, title: str, log, steps: int = 3) -> dict:
    """Profiles ``steps`` calls of ``step``: writes the top 15 kernels by device time (CPU time on
    the CPU) to ``log``, and for thunder_rs the execution traces that ran; returns the kernels and
    device time per call."""
    from torch.profiler import ProfilerActivity  # noqa: PLC0415
    from torch.profiler import profile as torch_profile  # noqa: PLC0415

    cuda = work.device == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the profiler's notes on its own cycles
        with torch_profile(activities=activities) as prof:
            for _ in range(steps):
                step()
            work.sync()
    events = prof.key_averages()
    on_device = [e for e in events if e.device_type != torch.autograd.DeviceType.CPU]
    kernels = sum(e.count for e in on_device) / steps
    device_ms = sum(_self_device_us(e) for e in on_device) / steps / 1e3
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    log(f"\n######## {title}: {kernels:.0f} kernels and {device_ms:.3f} ms of device time per call")
    log(events.table(sort_by=sort, row_limit=15, max_name_column_width=90))
    if _is_thunder_rs(step.fn):
        import thunder_rs  # noqa: PLC0415

        fn = step.fn
        for half, traces in (
            ("forward", thunder_rs.last_traces(fn)),
            ("backward", thunder_rs.last_backward_traces(fn)),
        ):
            if traces:
                log(f"---- {title}: last {half} execution trace\n{str(traces[-1])[:12000]}")
    return {"kernels_per_call": kernels, "device_ms_per_call": device_ms}


def _self_device_us(event) -> float:
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, name, None)
        if value is not None:
            return value
    return 0.0


# -- nvFuser's host overhead ------------------------------------------------------------------------------


def region_overhead(log, device: str = "cuda", calls: int = 2000, executor=None) -> dict:
    """Host time of one nvFuser region call on tiny inputs (device work negligible): thunder_rs's
    region callable against ``fd.execute`` of its definition, and an eager op for scale."""
    import thunder_rs  # noqa: PLC0415
    from thunder_rs.executors import nvfuser_ex  # noqa: PLC0415

    executor = executor or nvfuser_ex.nvfuser_executor()
    if not executor.available:
        return {"error": executor.unavailable}
    fused = []
    original = executor.fuse
    executor.fuse = lambda region: fused.append(original(region)) or fused[-1]
    try:
        jfn = thunder_rs.jit(lambda a, b: ((a * b + 1).exp() - a).sin(), executors=[executor])
        a, b = torch.randn(8, device=device), torch.randn(8, device=device)
        jfn(a, b)
    finally:
        executor.fuse = original
    region = fused[0]
    (run,) = region.definitions.values()
    fd = run.fd
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    measures = {}
    for name, fn in (
        ("fd_execute", lambda: fd.execute([a, b])),
        ("region_call", lambda: region(a, b)),
        ("jit_call", lambda: jfn(a, b)),
        ("eager_one_op", lambda: torch.sin(a)),
    ):
        fn()
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        measures[name + "_us"] = (time.perf_counter() - start) / calls * 1e6
    measures["thunder_rs_region_overhead_us"] = measures["region_call_us"] - measures["fd_execute_us"]
    for key, value in measures.items():
        log(f"nvFuser host overhead: {key} {value:.1f}")
    return measures


# -- the process ------------------------------------------------------------------------------------------


def parse_cases(text: str) -> list[tuple[str, str]]:
    """``variant:case,...`` (a variant's name may hold a colon) as pairs."""
    pairs = []
    for item in filter(None, text.split(",")):
        variant, _, case = item.rpartition(":")
        pairs.append((variant, case))
    return pairs


def run_cases(args, log: Log) -> None:
    deadline = args.deadline or float("inf")
    progress = Path(args.progress).open("a") if args.progress else None
    profile_log = Log(Path(args.profile), echo=False) if args.profile else None

    def record(entry: dict):
        if progress:
            progress.write(json.dumps(entry, default=str) + "\n")
            progress.flush()

    work = Workload(args.device, TINY if args.tiny else SIZE)
    record({"event": "process", "pid": os.getpid(), "size": work.size, "device": args.device})
    for variant, case in parse_cases(args.cases):
        entry = {"variant": variant, "case": case}
        if time.time() > deadline - MIN_CASE_S:
            record({**entry, "event": "result", "skipped": "the check's time budget ran out"})
            continue
        record({**entry, "event": "start"})
        try:
            if (variant, case) == tuple(OVERHEAD.rsplit(":", 1)):
                row = region_overhead(log, args.device, args.overhead_calls)
            else:
                row = run_case(work, variant, case, args.calls, profile_log)
                log(
                    f"{variant:22s} {case:10s} first {row['first_s']:8.3f} s   per call {row['per_call_ms']:8.3f} ms"
                    f"   vs eager: out {row['out_rel_diff']:.3g}, grads {row['grad_rel_diff']:.3g} (relative)"
                )
        except Exception as e:  # noqa: BLE001 (one variant's failure is a result, not the end of the check)
            row = {"error": f"{type(e).__name__}: {str(e)[:2000]}"}
            log(f"{variant:22s} {case:10s} FAILED {row['error'][:300]}")
            if args.device == "cuda" and _breaks_the_context(str(e)):
                record({**entry, "event": "result", **row})
                log("the CUDA context is broken after this error: a fresh process takes the cases left")
                os._exit(3)
        record({**entry, "event": "result", **row})


def _breaks_the_context(message: str) -> bool:
    """Whether a CUDA error is sticky (an illegal address, a launch failure): every later CUDA call
    of the process fails with it, so the remaining cases need a fresh process."""
    return any(
        text in message
        for text in (
            "illegal memory access",
            "illegal instruction",
            "unspecified launch failure",
            "misaligned address",
            "device-side assert",
            "CUDA_ERROR_ILLEGAL",
        )
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases",
        required=True,
        help=f"variant:case,... (cases: forward, train_step; variants: {', '.join(VARIANTS)}; and {OVERHEAD})",
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help=f"the block at {TINY} (the CPU dry run)")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--overhead-calls", type=int, default=2000)
    parser.add_argument("--progress", help="JSON lines: each case's start and result")
    parser.add_argument("--log")
    parser.add_argument("--profile", help="profile each case; tables and traces appended to this file")
    parser.add_argument("--deadline", type=float, help="time.time() after which no case starts")
    args = parser.parse_args(argv)
    log = Log(Path(args.log) if args.log else None)
    try:
        run_cases(args, log)
    except Exception:
        import traceback  # noqa: PLC0415

        log("the benchmark process failed outside its cases:\n" + traceback.format_exc())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
