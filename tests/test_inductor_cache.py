"""The Inductor executor's caches: a later process loads a compiled region from Inductor's disk
cache, and thunder_rs's artifact cache (``executors/inductor_cache.py``) keys entries by the
region's structure, layout, callees and settings, refuses what it cannot describe stably, reports
damaged entries instead of loading them, and never exposes a half-written one.

Regions are the hand-built ones of ``test_inductor_ex``.
"""

import hashlib
import json
import os
import subprocess
import sys
import threading

import pytest
import torch

from thunder_rs.executors import inductor_cache, inductor_ex
from test_inductor_ex import CHAIN, IMPLS, Region, assert_same, region

_IN_A_FRESH_PROCESS = """
import sys, torch
sys.path.insert(0, {tests!r})
from test_inductor_ex import CHAIN, region
from thunder_rs.executors import inductor_ex
r = region(CHAIN, "t0, t1, n")
inductor_ex.inductor_ex.fuse(r)(torch.randn(8, 16), torch.randn(8, 16), 0.125)
s = inductor_ex.stats()
print(s.misses, s.disk_hits)
"""


@pytest.mark.slow
def test_a_later_process_loads_the_compiled_region_from_inductors_disk_cache(tmp_path):
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path), inductor_cache.ENV: ""}
    script = _IN_A_FRESH_PROCESS.format(tests=os.path.dirname(__file__))

    def run():
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert run() == ["1", "0"]  # compiled by Inductor
    assert run() == ["1", "1"]  # loaded from the cache the first process left


# -- thunder_rs's artifact cache (inductor_cache) --------------------------------------------------


def _entry(r: Region, *args):
    return inductor_cache.entry(r.key, inductor_ex.layout(args), r.function)


def test_artifact_keys_change_with_layout_callees_and_settings(tmp_path, monkeypatch):
    monkeypatch.setenv(inductor_cache.ENV, str(tmp_path))
    r = region(CHAIN, "t0, t1, n")
    a, b = torch.randn(8, 16), torch.randn(8, 16)
    key = _entry(r, a, b, 2.0).key
    assert _entry(region(CHAIN, "t0, t1, n"), a, b, 2.0).key == key  # structural: another region, same key
    assert _entry(r, a, b, 3.0).key != key and _entry(r, a, b, 2).key != key
    assert _entry(r, torch.randn(16, 8).t(), b, 2.0).key != key
    # Another dtype is another region key (it holds the inputs' metadata).
    assert _entry(region(CHAIN, "t0, t1, n", "f64[8, 16]"), a.double(), b, 2.0).key != key

    # A region calling an implementation from outside thunder_rs is keyed on its code and what
    # its closure holds.
    def user_impl(factor):
        return lambda x: x * factor

    keys = set()
    for impl in (user_impl(2.0), user_impl(3.0), lambda x: x + 2.0):
        source = "def inductor_fusion_user(t0):\n    t1 = user_op(t0)\n    return (prim_sin(t1),)\n"
        namespace = {**IMPLS, "user_op": impl}
        exec(source, namespace)
        keys.add(inductor_cache.entry("user region", inductor_ex.layout((a,)), namespace["inductor_fusion_user"]).key)
    assert len(keys) == 3

    # Inductor's config and the thread count are in the key.
    from torch._inductor import config

    with config.patch(max_autotune=not config.max_autotune):
        assert _entry(r, a, b, 2.0).key != key
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert _entry(r, a, b, 2.0).key != key
    finally:
        torch.set_num_threads(threads)
    assert _entry(r, a, b, 2.0).key == key


def test_a_changed_thunder_rs_source_changes_every_artifact_key(tmp_path):
    package = tmp_path / "thunder_rs"
    (package / "executors").mkdir(parents=True)
    impl = package / "executors" / "torch_ex.py"
    impl.write_text("def sin(a):\n    return a.sin()\n")
    before = inductor_cache.sources_digest(package)
    impl.write_text("def sin(a):\n    return a.cos()\n")
    changed = inductor_cache.sources_digest(package)
    assert changed != before
    impl.rename(package / "torch_ex.py")  # the same code in another module is another package
    assert inductor_cache.sources_digest(package) != changed
    assert inductor_cache._process_fingerprint()[-1] == f"thunder_rs {inductor_cache._package_digest()}"


def test_no_artifact_entry_without_a_stable_description(tmp_path, monkeypatch):
    monkeypatch.setenv(inductor_cache.ENV, str(tmp_path))
    r = region(CHAIN, "t0, t1, n")
    a, b = torch.randn(8, 16), torch.randn(8, 16)
    assert _entry(r, a, b, object()) is None
    namespace = {**IMPLS, "opaque": type("Opaque", (), {"__call__": lambda self, x: x})()}
    exec("def inductor_fusion_opaque(t0):\n    return (opaque(t0),)\n", namespace)
    assert inductor_cache.entry("k", inductor_ex.layout((a,)), namespace["inductor_fusion_opaque"]) is None
    monkeypatch.setenv(inductor_cache.ENV, "")  # the cache is off
    assert _entry(r, a, b, 2.0) is None


def test_unusable_artifact_entries_are_reported_not_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv(inductor_cache.ENV, str(tmp_path))
    found = _entry(region(CHAIN, "t0, t1, n"), torch.randn(8, 16), torch.randn(8, 16), 2.0)
    assert inductor_cache.load(found) == (None, None)  # no entry: a plain miss
    artifact = tmp_path / f"{found.name}.a.artifact"
    artifact.write_bytes(b"not an artifact")
    digest = hashlib.sha256(artifact.read_bytes()).hexdigest()

    def problem(record):
        found.record.write_text(record if isinstance(record, str) else json.dumps(record))
        loaded, why = inductor_cache.load(found)
        assert loaded is None
        return why

    name = artifact.name
    assert "key differs" in problem({"key": found.key + "x", "artifact": name, "sha256": digest})
    assert "does not match" in problem({"key": found.key, "artifact": name, "sha256": "0" * 64})
    assert "unreadable record" in problem('{"key": ')
    assert "another entry" in problem({"key": found.key, "artifact": f"../{name}", "sha256": digest})
    assert problem({"key": found.key, "artifact": f"{found.name}.missing.artifact", "sha256": digest})
    assert problem({"key": found.key, "artifact": name, "sha256": digest})  # Inductor refuses it
    assert problem([found.key])


@pytest.mark.slow
def test_threads_storing_one_artifact_entry_at_once_never_expose_a_partial_entry(tmp_path, monkeypatch, one_thread):
    monkeypatch.setenv(inductor_cache.ENV, str(tmp_path))
    r, args = region(CHAIN, "t0, t1, n"), (torch.randn(8, 16), torch.randn(8, 16), 0.625)
    found = _entry(r, *args)
    compiled, _ = inductor_ex.compile_artifact(r.function, args)
    problems, outcomes = [], []

    def store():
        for _ in range(5):
            problems.append(inductor_cache.save(found, compiled))

    def read():  # one reader: loads run under the executor's lock, one at a time
        for _ in range(20):
            loaded, problem = inductor_cache.load(found)
            problems.append(problem)
            outcomes.append(loaded is not None)

    threads = [threading.Thread(target=f) for f in (store, store, store, read)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    loaded, problem = inductor_cache.load(found)
    assert problems == [None] * 35 and len(outcomes) == 20 and problem is None
    assert not list(tmp_path.glob(".*.tmp"))
    assert_same(tuple(loaded(*args[:2])), r.function(*args))


_ARTIFACT_PROCESS = """
import json, sys, torch
sys.path.insert(0, {tests!r})
from test_inductor_ex import CHAIN, assert_same, region
from thunder_rs.executors import inductor_ex
torch.manual_seed(0)
r, args = region(CHAIN, "t0, t1, n"), (torch.randn(8, 16), torch.randn(8, 16), 0.375)
assert_same(inductor_ex.inductor_ex.fuse(r)(*args), r.function(*args))
s = inductor_ex.stats()
print(json.dumps([s.misses, s.artifact_hits, s.artifact_saves, s.artifact_errors]))
"""


@pytest.mark.slow
def test_a_later_process_loads_regions_from_the_artifact_cache_and_never_runs_a_damaged_entry(tmp_path):
    cache = tmp_path / "thunder_rs"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), inductor_cache.ENV: str(cache)}
    command = [sys.executable, "-c", _ARTIFACT_PROCESS.format(tests=os.path.dirname(__file__))]

    def finish(process):
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err
        return json.loads(out.splitlines()[-1])

    def start():
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    # Two processes compile the same region at once (the later may find the earlier's entry):
    # each renames complete files into place, so the entry is whole whichever wins.
    first, second = start(), start()
    assert finish(first) == [1, 0, 1, 0] and finish(second) in ([1, 0, 1, 0], [1, 1, 0, 0])
    assert finish(start()) == [1, 1, 0, 0]  # loaded: no FX graph, no Inductor key

    # A damaged artifact is refused (its content no longer matches its record): the region is
    # compiled again, with eager's values, and stored afresh.
    [record] = cache.glob("*.json")
    artifact = cache / json.loads(record.read_text())["artifact"]
    artifact.write_bytes(artifact.read_bytes()[:-100] + bytes(100))
    assert finish(start()) == [1, 0, 1, 1]
    stored = json.loads(record.read_text())
    assert hashlib.sha256((cache / stored["artifact"]).read_bytes()).hexdigest() == stored["sha256"]
    assert finish(start()) == [1, 1, 0, 0]
