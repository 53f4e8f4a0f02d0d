"""What a traced program reads from files (``open(p).read()``, ``Path.read_text``, ``json.load``,
``np.load``) is guarded: a call after the file changed computes with the new contents as eager
does (``core/acquisition/file_reads.py``); opening a file to write and reading a file object held
from outside are refused naming the line (``core/state/c_effects.py``)."""

import io
import json
import os
import pathlib

import pytest
import torch

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError


def test_a_changed_file_is_read_again_as_eager(tmp_path):
    text, config = tmp_path / "scale.txt", tmp_path / "config.json"

    def fn(x):
        a = float(open(text).read())  # noqa: SIM115
        b = float(pathlib.Path(text).read_text())
        with open(config) as f:
            c = json.load(f)["shift"]
        return x * a + b + c

    jf = thunder_rs.jit(fn)
    for value in (1, 2, 3, 45):  # (rewritten at once: the same size and, on a coarse clock, the same times)
        text.write_text(str(value))
        config.write_text(json.dumps({"shift": value}))
        torch.testing.assert_close(jf(torch.ones(3)), fn(torch.ones(3)), rtol=0, atol=0)
    hits = thunder_rs.cache_hits(jf)
    torch.testing.assert_close(jf(torch.ones(3)), fn(torch.ones(3)), rtol=0, atol=0)
    assert thunder_rs.cache_hits(jf) == hits + 1  # (unchanged files: no compile)


def test_a_file_made_after_the_first_call_is_read_as_eager(tmp_path):
    path = tmp_path / "maybe.txt"

    def fn(x):
        try:
            with open(path) as f:
                return x * float(f.read())
        except FileNotFoundError:
            return x

    jf = thunder_rs.jit(fn)
    torch.testing.assert_close(jf(torch.ones(3)), fn(torch.ones(3)), rtol=0, atol=0)
    path.write_text("4")
    torch.testing.assert_close(jf(torch.ones(3)), fn(torch.ones(3)), rtol=0, atol=0)
    os.remove(path)
    torch.testing.assert_close(jf(torch.ones(3)), fn(torch.ones(3)), rtol=0, atol=0)


def test_an_array_np_load_reads_is_read_again_as_eager(tmp_path):
    np = pytest.importorskip("numpy")
    path = tmp_path / "w.npy"

    def fn(x):
        return x * torch.from_numpy(np.load(path))

    jf = thunder_rs.jit(fn)
    for value in (1.0, 2.0):
        np.save(path, np.full(3, value, dtype=np.float32))
        torch.testing.assert_close(jf(torch.ones(3)), fn(torch.ones(3)), rtol=0, atol=0)


@pytest.mark.parametrize("how", ["read", "json", "seek"])
def test_reading_a_file_object_held_outside_is_refused(tmp_path, how):
    path = tmp_path / "held.json"
    path.write_text('{"n": 2}')
    held = open(path)  # noqa: SIM115
    cases = {
        "read": (lambda x: x * len(held.read()), r"TextIOWrapper.read"),
        "json": (lambda x: x * json.load(held)["n"], r"TextIOWrapper.read"),
        "seek": (lambda x: (held.seek(0), x + 1)[1], r"TextIOWrapper.seek"),
    }
    fn, what = cases[how]
    line = fn.__code__.co_firstlineno
    try:
        with pytest.raises(ThunderNotImplementedError, match=rf"{what}: the program reads .* at .*_reads.py:{line}"):
            thunder_rs.jit(fn)(torch.ones(3))
    finally:
        held.close()


def test_opening_a_file_to_write_is_refused_before_it_is_made(tmp_path):
    path = tmp_path / "out.txt"

    def fn(x):
        with open(path, "w") as f:
            f.write("x")
        return x + 1

    line = fn.__code__.co_firstlineno + 1
    with pytest.raises(ThunderNotImplementedError, match=rf"open\(.*'w'\): the program calls it at .*_reads.py:{line}"):
        thunder_rs.jit(fn)(torch.ones(3))
    assert not path.exists()


@pytest.mark.parametrize("kind", ["file", "stringio"])
def test_iterating_a_file_object_held_outside_is_refused(tmp_path, kind):
    path = tmp_path / "lines.txt"
    path.write_text("".join(f"{i}\n" for i in range(3)))
    held = open(path) if kind == "file" else io.StringIO(path.read_text())  # noqa: SIM115

    def fn(x):
        for line in held:  # (eager takes the next line on each call)
            return x * float(line)
        return x

    line = fn.__code__.co_firstlineno  # (where the function found it)
    try:
        with pytest.raises(ThunderNotImplementedError, match=rf"consumed the (TextIOWrapper|StringIO) .*s.py:{line}"):
            thunder_rs.jit(fn)(torch.ones(3))
    finally:
        held.close()


def test_a_file_opened_by_its_descriptor_is_refused_naming_the_line(tmp_path):
    # eager reads the descriptor's file on every call; a compiled call would keep the first call's contents
    path = tmp_path / "scale.txt"
    path.write_text("1.0")

    def f(x):
        fd = os.open(path, os.O_RDONLY)
        with open(fd) as fh:
            return x * float(fh.read())

    with pytest.raises(NotImplementedError, match=r"file descriptor at .*test_file_reads\.py:\d+"):
        thunder_rs.jit(f)(torch.ones(2))
