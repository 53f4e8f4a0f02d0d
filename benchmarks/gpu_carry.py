"""What the GPU check carries to the GPU machine, and how it is installed there (../shared/GPU.md).

The GPU machine has Python 3.12, torch 2.11 with CUDA 13, and no package index. ``prepare``
(on the CPU machine, through ``make gpu-wheels``) fills a folder with what it lacks:

- the abi3 thunder_rs wheel (built by the Makefile with zig, so that it loads on glibc 2.28);
- nvFuser's wheel for torch 2.10 / CUDA 13 without its vendored NVRTC (44 of its 80 MB): the
  install links the machine's own ``libnvrtc.so.13`` under the vendored file name;
- Lightning Thunder 0.2.6 and those of its requirements the machine's image does not hold
  (read from the wheel's metadata; the image's packages are listed in the workplace's notes).

``install`` (on the GPU machine) puts the carried wheels into one target folder with pip, offline,
but for a requirement of Lightning Thunder the machine turns out to hold. The folder's manifest,
``carry.json``, names the dropped NVRTC files and the Lightning Thunder wheels (its own first).
"""

import base64
import glob
import hashlib
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

NVFUSER = "nvfuser-cu130-torch210"
LIGHTNING_THUNDER = "lightning-thunder==0.2.6"
#: The GPU machine's interpreter and platform, for ``pip download``.
PLATFORM = [
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    "--platform",
    "manylinux_2_28_x86_64",
    "--platform",
    "manylinux_2_27_x86_64",
    "--platform",
    "manylinux_2_17_x86_64",
    "--platform",
    "manylinux2014_x86_64",
]
#: Distributions the GPU machine's image already holds (the workplace's list of its packages, read
#: 2026-11-17) among those Lightning Thunder's wheels require: not carried.
ON_THE_GPU_MACHINE = frozenset(
    {
        "torch",
        "numpy",
        "networkx",
        "opt-einsum",
        "mpmath",
        "lightning-utilities",
        "packaging",
        "typing-extensions",
        "setuptools",
        "sympy",
        "filelock",
        "jinja2",
        "fsspec",
        "triton",
        "markupsafe",
    }
)
#: What the carried folder may weigh: the GPU session carries 64 MiB with the working tree.
LIMIT_BYTES = 56 << 20
MANIFEST = "carry.json"


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


def canonical(name: str) -> str:
    """A distribution's name as package indexes compare them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(wheel: Path) -> list[str]:
    """The requirements a wheel's metadata names for an install without extras on the GPU
    machine's Python (3.12, Linux)."""
    from packaging.requirements import Requirement  # noqa: PLC0415 (pip's own dependency; prepare only)

    with zipfile.ZipFile(wheel) as z:
        metadata = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(metadata).decode().splitlines()
    environment = {
        "python_version": "3.12",
        "python_full_version": "3.12.3",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "os_name": "posix",
        "extra": "",
    }
    needed = []
    for line in lines:
        if line.startswith("Requires-Dist:"):
            requirement = Requirement(line.split(":", 1)[1].strip())
            if requirement.marker is None or requirement.marker.evaluate(environment):
                needed.append(str(requirement))
    return needed


def _download(specs: list[str], folder: Path) -> list[Path]:
    before = set(folder.glob("*.whl"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            *PLATFORM,
            "-d",
            str(folder),
            *specs,
        ],
        check=True,
    )
    return sorted(set(folder.glob("*.whl")) - before)


def carry_lightning_thunder(folder: Path) -> list[str]:
    """Lightning Thunder's wheel and, transitively, each requirement the GPU machine lacks, into
    ``folder``; their file names."""
    from packaging.requirements import Requirement  # noqa: PLC0415 (as above)

    wheels = _download([LIGHTNING_THUNDER], folder)
    pending, seen = list(wheels), {canonical("lightning-thunder")}
    while pending:
        for spec in requirements(pending.pop()):
            name = canonical(Requirement(spec).name)
            if name in seen or name in ON_THE_GPU_MACHINE:
                continue
            seen.add(name)
            new = _download([spec], folder)
            wheels += new
            pending += new
    return [w.name for w in wheels]


def carried_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def prepare(folder: Path, lightning_thunder: bool = True) -> dict:
    """Fills ``folder`` (which holds the thunder_rs wheel the Makefile built) with the nvFuser
    wheel, stripped, and Lightning Thunder's wheels; writes the manifest; returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    download = folder / "download"
    download.mkdir(exist_ok=True)
    manifest: dict = {"nvrtc": [], "lightning_thunder": []}
    for wheel in _download([NVFUSER], download):
        manifest["nvrtc"] += strip_nvrtc(wheel, folder / wheel.name)
        print(
            f"{wheel.name}: {wheel.stat().st_size >> 20} MiB -> {(folder / wheel.name).stat().st_size >> 20} MiB "
            f"without {manifest['nvrtc']}"
        )
    shutil.rmtree(download)
    if lightning_thunder:
        manifest["lightning_thunder"] = carry_lightning_thunder(folder)
        print("Lightning Thunder and what the GPU machine lacks of its requirements:", manifest["lightning_thunder"])
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    if not list(folder.glob("thunder_rs-*abi3*.whl")):
        print(f"warning: no thunder_rs abi3 wheel in {folder} (make gpu-wheels builds it)")
    return manifest


def check_size(folder: Path) -> int:
    """Prints what ``folder`` holds and its total size; raises when it is over ``LIMIT_BYTES``."""
    total = carried_bytes(folder)
    for path in sorted(folder.iterdir()):
        print(f"  {path.stat().st_size / 2**20:7.2f} MiB  {path.name}")
    print(f"carry: {total / 2**20:.1f} MiB in {folder} (limit {LIMIT_BYTES >> 20} MiB of the session's 64)")
    if total > LIMIT_BYTES:
        raise SystemExit(f"{folder} holds {total / 2**20:.1f} MiB: over {LIMIT_BYTES >> 20} MiB")
    return total


# -- on the GPU machine ----------------------------------------------------------------------------------


def install(carried: Path, target: Path, log) -> dict:
    """Installs every wheel in ``carried`` into ``target`` (pip, offline, no dependencies), and
    links the machine's NVRTC under the names ``prepare`` dropped from nvFuser's wheel. Returns
    what was done, for the report."""
    manifest_path = carried / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    present = already_installed(manifest.get("lightning_thunder", [])[1:])
    if present:
        log("already on this machine, not installed:", present)
    wheels = sorted(w for w in glob.glob(str(carried / "*.whl")) if Path(w).name not in present)
    log("installing", [Path(w).name for w in wheels], "into", target)
    done: dict = {"wheels": [Path(w).name for w in wheels], "present": present, "unpacked": [], "nvrtc_links": {}}
    if not wheels:
        return done
    proc = _pip_install(wheels, target)
    if proc.returncode:
        log("pip:", proc.stdout[-2000:], proc.stderr[-2000:])
        for wheel in wheels:
            if _pip_install([wheel], target).returncode:
                # pip refuses a wheel whose tags this interpreter does not list; a wheel is a zip
                # of files laid out for site-packages, so unpack it (its import will tell).
                log(f"pip refused {Path(wheel).name}: unpacking it into {target}")
                with zipfile.ZipFile(wheel) as z:
                    z.extractall(target)
                done["unpacked"].append(Path(wheel).name)
    names = manifest.get("nvrtc", [])
    if names:
        done["nvrtc_links"] = link_nvrtc(names, target, machine_nvrtc(), log)
    return done


def already_installed(wheels: list[str]) -> list[str]:
    """Those of ``wheels`` (file names) whose distribution this interpreter already has: a copy in
    the target folder, ahead on the path, would shadow the machine's own (its torch imports it)."""
    import importlib.metadata  # noqa: PLC0415

    present = []
    for wheel in wheels:
        try:
            importlib.metadata.version(wheel.split("-")[0])
            present.append(wheel)
        except importlib.metadata.PackageNotFoundError:
            continue
    return present


def _pip_install(wheels: list, target: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--upgrade",
            "--target",
            str(target),
            *wheels,
        ],
        capture_output=True,
        text=True,
    )


def machine_nvrtc() -> list[str]:
    """The NVRTC libraries of this machine: torch's own CUDA wheels first, then the toolkit's."""
    import torch  # noqa: PLC0415 (the machine's torch locates its NVRTC)

    site = Path(torch.__file__).parents[1]
    return sorted(glob.glob(str(site / "nvidia" / "**" / "libnvrtc.so*"), recursive=True)) + sorted(
        glob.glob("/usr/local/cuda*/lib64/libnvrtc.so*")
    )


def link_nvrtc(names: list[str], target: Path, found: list[str], log) -> dict:
    """Links each dropped NVRTC file name under ``target`` to the machine's library of the same
    file name, else to its first NVRTC; returns {link: library}."""
    log("machine NVRTC:", found)
    links = {}
    for name in names:
        link = target / name
        real = next((f for f in found if Path(f).name == Path(name).name), found[0] if found else None)
        if real is None:
            log(f"no libnvrtc on this machine for {name}: nvFuser will not import")
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(real)
        links[name] = real
        log("linked", link, "->", real)
    return links
