"""thunder_rs's on-disk cache of compiled Inductor regions: a later process loads a region's
compiled artifact (``torch._inductor.CompiledArtifact``) instead of tracing its FX graph and
having Inductor compute its own cache key from it.

An entry is keyed by everything the compiled code depends on: the region's structural key and
its inputs' layout; the code of the implementations it calls (thunder_rs's sources, and the code
objects of implementations from elsewhere); torch (its version and the hash of its sources
Inductor computes); the machine (Inductor's description of the system, the CPU's vector ISA,
Python's version); and the settings Inductor's own key reads (its config, the default dtype,
deterministic algorithms, matmul precision, the CPU thread count).

An entry is two files: the artifact, named by the hash of its content and never rewritten, and a
record naming it with the entry's full key, renamed into place after the artifact. A load checks
the record's key and the artifact's content hash and gives up on any mismatch or error, so that
the caller compiles: a stale or damaged entry never runs. Processes writing the same entry at
once each rename complete files into place; a reader sees one writer's record and the artifact
it names.

The directory is ``$THUNDER_RS_CACHE_DIR`` (set to the empty string, the cache is off), else
``thunder_rs/`` in Inductor's cache directory.
"""

import functools
import hashlib
import json
import marshal
import os
import platform
import sys
import threading
import types
from dataclasses import dataclass
from pathlib import Path

import torch

ENV = "THUNDER_RS_CACHE_DIR"
#: The first line of every key: a change of this module's format makes every entry a miss.
FORMAT = "thunder_rs inductor artifact 1"
_NUMBERS = (bool, int, float, complex)


@dataclass(frozen=True)
class Entry:
    """Where a region's compiled artifact for one key lives."""

    directory: Path
    #: everything the artifact depends on, one item a line; the record holds it to compare
    key: str

    @property
    def name(self) -> str:
        return hashlib.sha256(self.key.encode()).hexdigest()

    @property
    def record(self) -> Path:
        return self.directory / f"{self.name}.json"


def directory() -> Path | None:
    """The cache's directory, or None when ``$THUNDER_RS_CACHE_DIR`` is set empty (cache off)."""
    configured = os.environ.get(ENV)
    if configured is not None:
        return Path(configured) if configured else None
    try:
        return Path(_inductor_cache_dir()) / "thunder_rs"
    except OSError:  # Inductor could not make its own directory: no cache
        return None


def entry(region_key: str, layout: tuple, function) -> Entry | None:
    """The entry of ``function`` (a region's function; ``region_key`` its structural key)
    compiled for ``layout``, or None when something it depends on has no stable description
    (an input that is neither a tensor nor a number, an implementation without code to hash)."""
    root = directory()
    if root is None or not all(isinstance(item, _STABLE) for item in _flat(layout)):
        return None
    process, callees = _process_fingerprint(), _callees_digest(function)
    if process is None or callees is None:
        return None
    lines = (*process, *_settings(), f"callees {callees}", f"layout {layout!r}", region_key)
    return Entry(root, "\n".join(lines))


def load(found: Entry):
    """``(artifact, problem)``: the compiled artifact of ``found`` and None; ``(None, None)``
    when there is no entry; ``(None, why)`` when the entry is unusable (it must not run)."""
    try:
        with open(found.record, encoding="utf-8") as f:
            record = json.load(f)
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as e:
        return None, f"unreadable record: {e}"
    try:
        if record.get("key") != found.key:
            return None, "the record's key differs (a stale entry or a hash collision)"
        name = record["artifact"]
        if not (isinstance(name, str) and name.startswith(found.name) and Path(name).name == name):
            return None, f"the record names an artifact of another entry: {name!r}"
        path = found.directory / name
        if hashlib.sha256(path.read_bytes()).hexdigest() != record["sha256"]:
            return None, "the artifact's content does not match its record"
        return _compiled_artifact_type().load(path=str(path), format="binary"), None
    except Exception as e:  # noqa: BLE001 (any failure to load means: compile instead)
        return None, f"{type(e).__name__}: {e}"


def save(found: Entry, artifact) -> str | None:
    """Stores ``artifact`` (a ``CompiledArtifact``) as ``found``; returns None, or why it could
    not (an artifact Inductor cannot serialise, a read-only directory): the cache is an
    optimisation, so failing to write is not an error."""
    temporary = found.directory / f".{found.name}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        found.directory.mkdir(parents=True, exist_ok=True)
        artifact.save(path=str(temporary), format="binary")
        digest = hashlib.sha256(temporary.read_bytes()).hexdigest()
        artifact_name = f"{found.name}.{digest[:32]}.artifact"
        os.replace(temporary, found.directory / artifact_name)
        record = {"key": found.key, "artifact": artifact_name, "sha256": digest}
        temporary.write_text(json.dumps(record), encoding="utf-8")
        os.replace(temporary, found.record)
        return None
    except Exception as e:  # noqa: BLE001 (see the docstring)
        temporary.unlink(missing_ok=True)
        return f"{type(e).__name__}: {e}"


def available() -> bool:
    """Whether this torch has ``CompiledArtifact.save`` and ``load`` (torch >= 2.8)."""
    try:
        artifact_type = _compiled_artifact_type()
    except ImportError:
        return False
    return callable(getattr(artifact_type, "load", None)) and callable(getattr(artifact_type, "save", None))


def start() -> None:
    """Computes what every key of this process shares (hashes of torch's and thunder_rs's
    sources, the system's description), so that the first region's lookup does not pay it."""
    _process_fingerprint()


# -- what a key is made of -------------------------------------------------------------------------

#: Layout items with a ``repr`` that is the same in every process.
_STABLE = (*_NUMBERS, str, type(None), torch.dtype, torch.device, torch.Size, tuple)


def _flat(items):
    for item in items:
        if isinstance(item, tuple) and not isinstance(item, torch.Size):
            yield from _flat(item)
        elif isinstance(item, type):
            yield item.__name__  # a number's type, in the layout
        else:
            yield item


def _compiled_artifact_type():
    from torch._inductor import CompiledArtifact  # noqa: PLC0415 (Inductor's import takes seconds)

    return CompiledArtifact


def _inductor_cache_dir() -> str:
    from torch._inductor.runtime.cache_dir_utils import cache_dir  # noqa: PLC0415 (as above)

    return cache_dir()


@functools.cache
def _process_fingerprint() -> tuple[str, ...] | None:
    """What the compiled code depends on that stays the same for the life of a process; None
    (the cache is off) where this torch lacks a part of it."""
    try:
        from torch._inductor.codecache import CacheBase, torch_key  # noqa: PLC0415 (as above)
        from torch._inductor.cpu_vec_isa import pick_vec_isa  # noqa: PLC0415

        system = json.dumps(CacheBase.get_system(), sort_keys=True)
        isa, source = str(pick_vec_isa()), torch_key().hex()
    except Exception:  # noqa: BLE001 (Inductor's internals differ between versions: no cache then)
        return None
    return (
        FORMAT,
        f"torch {torch.__version__} {source}",
        f"python {sys.version}",
        f"machine {platform.machine()} {isa}",
        f"system {system}",
        f"thunder_rs {_package_digest()}",
    )


def _settings() -> tuple[str, ...]:
    """The global settings Inductor's compiled code depends on, as they are now."""
    from torch._inductor import config  # noqa: PLC0415 (as above)

    matmul = torch.backends.cuda.matmul
    deterministic = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        getattr(torch.utils.deterministic, "fill_uninitialized_memory", None),
    )
    precision = (
        getattr(matmul, "fp32_precision", None),
        matmul.allow_tf32,
        matmul.allow_fp16_reduced_precision_reduction,
        matmul.allow_bf16_reduced_precision_reduction,
    )
    return (
        f"inductor config {config.get_hash().hex()} {torch._functorch.config.get_hash().hex()}",
        f"default dtype {torch.get_default_dtype()}, threads {torch.get_num_threads()}",
        f"deterministic {deterministic}",
        f"matmul {precision}",
    )


@functools.cache
def _package_digest() -> str:
    """A hash of thunder_rs's Python sources: the implementations regions call and everything
    they call, so that a changed thunder_rs misses every entry."""
    return sources_digest(Path(__file__).resolve().parents[1])


def sources_digest(package: Path) -> str:
    """A hash of the names and contents of the Python files under ``package``."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _callees_digest(function) -> str | None:
    """A hash of what the region's function calls: each global it reads, described by
    ``_describe``; None when one has no stable description."""
    digest = hashlib.sha256()
    namespace = function.__globals__
    for name in function.__code__.co_names:
        if name in namespace:
            described = _describe(namespace[name], depth=0)
            if described is None:
                return None
            digest.update(f"{name}={described}\n".encode())
    return digest.hexdigest()


def _cells(function) -> list:
    held = []
    for cell in function.__closure__ or ():
        try:
            held.append(cell.cell_contents)
        except ValueError:  # an empty cell: a name the function defines later
            held.append(None)
    return held


def _describe(value, depth: int) -> str | None:
    """A description of ``value`` that changes when its behaviour can: torch's functions and
    operators by name (torch's sources are in the key), thunder_rs's by name (so are its
    sources) and what their defaults and closures hold, other functions by their code, defaults
    and closures, numbers and torch's value types by ``repr``; None for anything else."""
    if isinstance(value, (types.ModuleType, type)):
        return f"{value.__name__}"
    if isinstance(value, (*_NUMBERS, str, type(None), torch.dtype, torch.device)):
        return repr(value)
    if isinstance(value, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(value)
    if isinstance(value, (types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType)):
        return f"{getattr(value, '__module__', None)}.{value.__qualname__}"
    if isinstance(value, functools.partial):
        parts = [
            _describe(value.func, depth + 1),
            *(_describe(a, depth + 1) for a in value.args),
            *(_describe(v, depth + 1) for v in value.keywords.values()),
        ]
        return None if None in parts else f"partial({', '.join(map(str, parts))}, {sorted(value.keywords)})"
    if not isinstance(value, types.FunctionType) or depth > 4:
        return None
    module = (value.__module__ or "").split(".")[0]
    if module == "torch":
        return f"{value.__module__}.{value.__qualname__}"
    head = (
        f"{value.__module__}.{value.__qualname__}"
        if module == "thunder_rs"
        else hashlib.sha256(marshal.dumps(value.__code__)).hexdigest()
    )
    held = [*(value.__defaults__ or ()), *(value.__kwdefaults__ or {}).values(), *_cells(value)]
    parts = [_describe(v, depth + 1) for v in held]
    return None if None in parts else f"{head}({', '.join(map(str, parts))})"
