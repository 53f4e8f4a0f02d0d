"""What a program reads of the file system besides files' contents (``os.path.exists``,
``getsize``, ``os.listdir``, ``glob``, ``pathlib.Path.exists``, ``os.getcwd``) is guarded
(``core/state/fs_reads.py``): tracing read it once, and every compiled call reused it (a
checkpoint that appeared, a directory's new files). A change recompiles; no change compiles once."""

import glob
import os
import pathlib

import pytest
import torch

import thunder_rs

DIRECTORY: list = []


def _path(name: str) -> str:
    return os.path.join(DIRECTORY[0], name)


_PROGRAMS = {
    "exists": (lambda x: x * (2 if os.path.exists(_path("b")) else 1), "os.stat"),
    "getsize": (lambda x: x * os.path.getsize(_path("a")), "os.stat"),
    "listdir": (lambda x: x * len(os.listdir(DIRECTORY[0])), "os.listdir"),
    "glob": (lambda x: x * len(glob.glob(_path("*"))), "os."),
    "pathlib": (lambda x: x * (2 if pathlib.Path(_path("b")).is_file() else 1), "os.stat"),
    "getcwd": (lambda x: x * len(os.getcwd()), "os.getcwd"),
}


@pytest.mark.parametrize("kind", sorted(_PROGRAMS))
def test_a_file_system_read_changed_between_calls_recompiles_as_eager(kind, tmp_path, monkeypatch):
    DIRECTORY[:] = [str(tmp_path)]
    (tmp_path / "a").write_text("x")
    monkeypatch.chdir(tmp_path)
    program, read = _PROGRAMS[kind]
    jf, x = thunder_rs.jit(program), torch.ones(2)
    for step in range(3):
        torch.testing.assert_close(jf(x), program(x), rtol=0, atol=0)
        if step == 0:  # (another file, a longer one, a deeper directory)
            (tmp_path / "b").write_text("y")
            (tmp_path / "a").write_text("xyz")
            (tmp_path / "deeper").mkdir()
            monkeypatch.chdir(tmp_path / "deeper")
    misses = thunder_rs.compile_stats(jf).miss_reasons
    assert len(misses) == 2 and misses[1].startswith(read), misses


def test_an_unchanged_file_system_compiles_once(tmp_path):
    DIRECTORY[:] = [str(tmp_path)]
    (tmp_path / "a").write_text("x")

    def fn(x):
        return x * (os.path.getsize(_path("a")) + len(os.listdir(DIRECTORY[0])))

    jf = thunder_rs.jit(fn)
    for _ in range(3):
        torch.testing.assert_close(jf(torch.ones(2)), fn(torch.ones(2)), rtol=0, atol=0)
    assert thunder_rs.compile_stats(jf).cache_misses == 1
    assert os.stat.__module__ == "posix" or type(os.stat).__name__ == "builtin_function_or_method"
