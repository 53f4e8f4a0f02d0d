"""The whole GPU check of thunder_rs in one go (see ../shared/GPU.md for the machine).

    python benchmarks/gpu_check.py prepare gpu-carry          # on the CPU machine (make gpu-wheels)
    python benchmarks/gpu_check.py run --carried gpu-carry --results RESULTS   # on the GPU machine

``prepare`` puts into a folder the abi3 thunder_rs wheel (built by ``make gpu-wheels``) and the
nvFuser wheel for torch 2.10 / CUDA 13 from the package index, without its vendored NVRTC
library (``run`` links the GPU machine's own ``libnvrtc.so.13`` under that name), so that the
folder fits what a GPU session carries.

``run`` installs the carried wheels with ``pip --no-index`` into a target folder, prints the
versions, runs the CUDA tests (``-m gpu``), benchmarks eager, thunder_rs (torch executor),
thunder_rs+nvfuser, thunder_rs+inductor and torch.compile (first call and per call, GPT block
forward and training step in bfloat16 at n_embd 768, 12 heads, sequence 1024, batch 8, checked
against eager) and measures the host time of one nvFuser region call; it writes ``gpu_check.log``
and ``gpu_check.json`` into the results folder. Without CUDA it says so and stops (exit 2).
"""

import argparse
import base64
import glob
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NVFUSER = "nvfuser-cu130-torch210"


class Log:
    def __init__(self, path: Path):
        self.file = path.open("a")

    def __call__(self, *parts):
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


# -- prepare (CPU machine) ------------------------------------------------------------------------------

def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def strip_nvrtc(wheel: Path, out: Path) -> list[str]:
    """A copy of ``wheel`` without its vendored NVRTC libraries (RECORD rewritten); their names."""
    dropped, kept = [], []
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        record = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        for info in src.infolist():
            if "libnvrtc" in Path(info.filename).name:
                dropped.append(info.filename)
                continue
            if info.filename == record:
                continue
            data = src.read(info)
            dst.writestr(info, data)
            kept.append(_record_line(info.filename, data))
        dst.writestr(record, "\n".join([*kept, f"{record},,"]) + "\n")
    return dropped


def prepare(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    download = folder / "download"
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
                    "3.12", "--platform", "manylinux_2_28_x86_64", "-d", str(download), NVFUSER], check=True)
    for wheel in download.glob("nvfuser*.whl"):
        dropped = strip_nvrtc(wheel, folder / wheel.name)
        (folder / "nvrtc_names.txt").write_text("\n".join(dropped) + "\n")
        print(f"{wheel.name}: {wheel.stat().st_size >> 20} MiB -> {(folder / wheel.name).stat().st_size >> 20} MiB "
              f"without {dropped}")
    shutil.rmtree(download)
    print("carry:", sorted(p.name for p in folder.iterdir()))


# -- run (GPU machine) -----------------------------------------------------------------------------------

def install(carried: Path, target: Path, log: Log) -> None:
    """The carried wheels into ``target``, and the machine's NVRTC under the names nvFuser's
    wheel vendored (when ``prepare`` dropped them)."""
    wheels = sorted(glob.glob(str(carried / "*.whl")))
    log("installing", [Path(w).name for w in wheels], "into", target)
    for wheel in wheels:
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--upgrade",
                               "--target", str(target), wheel], capture_output=True, text=True)
        log(proc.stdout[-1000:], proc.stderr[-1000:])
        if proc.returncode:
            # pip refuses a wheel whose tags this interpreter does not list; a wheel is a zip
            # of files laid out for site-packages, so unpack it (the import will tell).
            log(f"pip refused {Path(wheel).name}: unpacking it into {target}")
            with zipfile.ZipFile(wheel) as z:
                z.extractall(target)
    names = carried / "nvrtc_names.txt"
    if names.exists():
        import torch  # noqa: PLC0415 (the machine's torch locates its NVRTC)

        found = sorted(glob.glob(str(Path(torch.__file__).parents[1] / "nvidia" / "**" / "libnvrtc.so*"),
                               recursive=True)) + sorted(glob.glob("/usr/local/cuda*/lib64/libnvrtc.so*"))
        log("machine NVRTC:", found)
        for name in names.read_text().split():
            link = target / name
            real = next((f for f in found if Path(f).name == Path(name).name), found[0] if found else None)
            if real is None:
                log(f"no libnvrtc on this machine for {name}: nvFuser will not import")
                continue
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                link.symlink_to(real)
            log("linked", link, "->", real)


def versions(log: Log) -> dict:
    import torch  # noqa: PLC0415

    info = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
            "platform": platform.platform()}
    info["glibc"] = subprocess.run(["ldd", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    info["cuda_available"] = torch.cuda.is_available()
    if info["cuda_available"]:
        info["gpu"] = torch.cuda.get_device_name(0)
    try:
        import triton  # noqa: PLC0415

        info["triton"] = triton.__version__
    except ImportError as e:
        info["triton"] = f"absent ({e})"
    import thunder_rs  # noqa: PLC0415
    from thunder_rs.executors import nvfuser_ex  # noqa: PLC0415

    info["thunder_rs"] = f"{thunder_rs.__version__} from {Path(thunder_rs.__file__).parent}"
    executor = nvfuser_ex.nvfuser_executor()
    info["nvfuser"] = executor.module.version() if executor.available else f"unavailable: {executor.unavailable}"
    info["default_executors"] = [e.name for e in thunder_rs.executors.get_default_executors()]
    for key, value in info.items():
        log(f"{key}: {value}")
    return info


#: The CUDA tests: thunder_rs's own (bf16/fp16 OpInfos, nvFuser, GPT under autocast), Inductor
#: on CUDA, and test_ops' CUDA parameters (float32/float64/int64/bool forward, float64 gradients).
TESTS = ["tests/test_cuda.py", "tests/test_inductor_ex.py", "tests/test_ops.py"]


def run_tests(log: Log, results: Path, timeout: int, pytest_args: list) -> dict:
    junit = results / "cuda_tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", f"--junitxml={junit}",
           *(pytest_args or TESTS)]
    log("running", " ".join(cmd))
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        out, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (e.stdout or b"").decode() + f"\nTIMEOUT after {timeout} s", -1
    (results / "cuda_tests.txt").write_text(out)
    summary = out.strip().split("\n")[-1] if out.strip() else ""
    failed = [line for line in out.split("\n") if line.startswith("FAILED")]
    log(f"tests: rc={rc} in {time.perf_counter() - start:.0f} s: {summary}")
    for line in failed[:50]:
        log(" ", line)
    return {"rc": rc, "summary": summary, "failed": failed}


# -- benchmark ---------------------------------------------------------------------------------------------

def _timed(fn, calls: int) -> tuple[float, float]:
    """(first call s, median per-call s over ``calls`` calls, each synchronised)."""
    import torch  # noqa: PLC0415

    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return first, sorted(times)[len(times) // 2]


def _variants():
    import torch  # noqa: PLC0415
    import thunder_rs  # noqa: PLC0415

    return {
        "eager": lambda m: m,
        "thunder_rs": lambda m: thunder_rs.jit(m, executors=[]),
        "thunder_rs+nvfuser": lambda m: thunder_rs.jit(m, executors=["nvfuser"]),
        "thunder_rs+inductor": lambda m: thunder_rs.jit(m, executors=["inductor"]),
        "torch.compile": lambda m: torch.compile(m),
    }


#: (n_embd, n_head, sequence, batch) of the benchmarked GPT block.
SIZE = (768, 12, 1024, 8)


def benchmark(log: Log, calls: int, only: list, size=SIZE, device="cuda") -> dict:
    import copy  # noqa: PLC0415

    import torch  # noqa: PLC0415

    sys.path.insert(0, str(ROOT / "examples"))
    from gpt import Block, GPTConfig  # noqa: PLC0415

    n_embd, n_head, seq, batch = size
    config = GPTConfig(n_embd=n_embd, n_head=n_head, block_size=seq, dropout=0.0)
    torch.manual_seed(0)
    base = Block(config).to(device=device, dtype=torch.bfloat16)
    x = torch.randn(batch, seq, n_embd, device=device, dtype=torch.bfloat16)
    g = torch.randn_like(x)
    rows, reference = {}, {}
    for name, wrap in _variants().items():
        if only and name not in only:
            continue
        row = rows[name] = {}
        for case in ("forward", "train_step"):
            try:
                block = copy.deepcopy(base)
                fn = wrap(block)
                if case == "forward":
                    def step(fn=fn):
                        with torch.no_grad():
                            return fn(x)
                else:
                    opt = torch.optim.AdamW(block.parameters(), lr=1e-4)
                    xg = x.detach().clone().requires_grad_()

                    def step(fn=fn, opt=opt, xg=xg):
                        out = fn(xg)
                        out.backward(g)
                        opt.step()
                        opt.zero_grad(set_to_none=True)
                        return out
                first, per_call = _timed(step, calls)
                out = copy.deepcopy(block)(x) if case == "train_step" else step()
                ref = reference.setdefault(case, out.detach().float())
                err = (out.detach().float() - ref).abs().max().item()
                row[case] = {"first_s": first, "per_call_ms": per_call * 1e3, "max_abs_diff_vs_eager": err}
                log(f"{name:22s} {case:10s} first {first:8.3f} s   per call {per_call * 1e3:8.3f} ms   "
                    f"max |diff| vs eager {err:.3g}")
            except Exception as e:  # noqa: BLE001 (one variant's failure is a result, not the end of the check)
                row[case] = {"error": f"{type(e).__name__}: {e}"}
                log(f"{name:22s} {case:10s} FAILED {type(e).__name__}: {e}")
    return rows


def region_overhead(log: Log, calls: int = 2000) -> dict:
    """Host time of one nvFuser region call on tiny inputs (GPU work negligible): thunder_rs's
    region callable against ``fd.execute`` of its definition, and an eager op for scale."""
    import torch  # noqa: PLC0415

    from thunder_rs.executors import nvfuser_ex  # noqa: PLC0415

    executor = nvfuser_ex.nvfuser_executor()
    if not executor.available:
        return {"error": executor.unavailable}
    fused = []
    original = executor.fuse
    executor.fuse = lambda region: fused.append(original(region)) or fused[-1]
    try:
        import thunder_rs  # noqa: PLC0415

        jfn = thunder_rs.jit(lambda a, b: ((a * b + 1).exp() - a).sin(), executors=[executor])
        a, b = torch.randn(8, device="cuda"), torch.randn(8, device="cuda")
        jfn(a, b)
    finally:
        executor.fuse = original
    region = fused[0]
    (run,) = region.definitions.values()
    fd = run.fd
    measures = {}
    for name, fn in (("fd_execute", lambda: fd.execute([a, b])), ("region_call", lambda: region(a, b)),
                     ("jit_call", lambda: jfn(a, b)), ("eager_one_op", lambda: torch.sin(a))):
        fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        measures[name + "_us"] = (time.perf_counter() - start) / calls * 1e6
    measures["thunder_rs_region_overhead_us"] = measures["region_call_us"] - measures["fd_execute_us"]
    for key, value in measures.items():
        log(f"nvFuser host overhead: {key} {value:.1f}")
    return measures


def run(args) -> int:
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    log = Log(results / "gpu_check.log")
    report = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    if args.carried and not args.installed:
        target = Path(args.target)
        install(Path(args.carried), target, log)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(ROOT / "tests"),
                                                            os.environ.get("PYTHONPATH", "")])}
        forwarded = [a for a in sys.argv[2:] if a != "--carried" and a != args.carried]
        return subprocess.run([sys.executable, __file__, "run", "--installed", *forwarded], env=env).returncode
    report["versions"] = versions(log)
    if not report["versions"]["cuda_available"]:
        log("CUDA is not available on this machine (torch.cuda.is_available() is False): "
            "no CUDA tests, no GPU benchmark. Run this on the GPU machine.")
        report["status"] = "no-cuda"
        (results / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
        return 2
    if not args.skip_bench:
        report["region_overhead"] = region_overhead(log)
        report["benchmark"] = benchmark(log, args.calls, args.variant)
    if not args.skip_tests:
        report["tests"] = run_tests(log, results, args.test_timeout, args.pytest_args)
    report["status"] = "done"
    name = "gpu_check.json" if not (args.skip_tests or args.skip_bench) else (
        "gpu_check_bench.json" if args.skip_tests else "gpu_check_tests.json")
    (results / name).write_text(json.dumps(report, indent=2, default=str))
    log("wrote", results / name)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="download and strip the nvFuser wheel into a carry folder")
    p.add_argument("folder")
    r = sub.add_parser("run", help="the GPU check")
    r.add_argument("--carried", help="folder of wheels to install (prepare's output plus the thunder_rs wheel)")
    r.add_argument("--target", default="/tmp/thunder_rs_site", help="where to install the carried wheels")
    r.add_argument("--results", required=True)
    r.add_argument("--calls", type=int, default=20, help="timed calls per benchmark case")
    r.add_argument("--test-timeout", type=int, default=900)
    r.add_argument("--skip-tests", action="store_true")
    r.add_argument("--skip-bench", action="store_true")
    r.add_argument("--variant", action="append", help="benchmark only these (repeatable): " + ", ".join(
        ("eager", "thunder_rs", "thunder_rs+nvfuser", "thunder_rs+inductor", "torch.compile")))
    r.add_argument("--pytest-args", nargs=argparse.REMAINDER, help="instead of the default test files (last)")
    r.add_argument("--installed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(Path(args.folder))
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
