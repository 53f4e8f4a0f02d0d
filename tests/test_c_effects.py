"""Effects a traced program makes outside itself through C functions (a file object's ``write``,
``os.write``, ``os.kill``, ``time.sleep``, a socket's ``send``) and through ``subprocess`` and
``torch.save``: tracing made them once where eager makes them on every call, so each is refused
naming the user's line (``core/state/c_effects.py``, ``core/acquisition/stdlib_state.py``);
``print`` to a held file, logging and reads run as eager over three calls."""

import io
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError


def _refused(fn, what: str) -> None:
    """``fn`` jitted is refused on its first call, naming ``what`` and the line that makes it."""
    line = fn.__code__.co_firstlineno + 1
    jf = thunder_rs.jit(fn)
    for _ in range(3):
        with pytest.raises(
            ThunderNotImplementedError, match=rf"{what}: the program calls it at .*test_c_effects.py:{line}"
        ):
            jf(torch.ones(3))


def test_writing_to_a_held_text_file_is_refused_naming_the_line(tmp_path):
    f = open(tmp_path / "a.txt", "w")  # noqa: SIM115 (held by the program)

    def fn(x):
        f.write("step\n")
        return x + 1

    _refused(fn, r"_io.TextIOWrapper.write")
    f.close()
    assert (tmp_path / "a.txt").read_text() == ""  # refused before it wrote


@pytest.mark.parametrize("kind", ["writelines", "flush", "binary", "stringio", "append", "held_stdout"])
def test_writes_to_file_objects_are_refused(tmp_path, kind):
    text, binary, sio = open(tmp_path / "t", "w"), open(tmp_path / "b", "wb"), io.StringIO()  # noqa: SIM115
    path, held = tmp_path / "appended", sys.stdout  # (bound before the program is traced)
    cases = {
        "writelines": (lambda x: (text.writelines(["a\n"]), x + 1)[1], "_io.TextIOWrapper.writelines"),
        "flush": (lambda x: (text.flush(), x + 1)[1], "_io.TextIOWrapper.flush"),
        "binary": (lambda x: (binary.write(b"ab"), x + 1)[1], "_io.BufferedWriter.write"),
        "stringio": (lambda x: (sio.write("ab"), x + 1)[1], "_io.StringIO.write"),
        "append": (lambda x: (open(path, "a").write("q"), x + 1)[1], r"open\(.*appended', 'a'\)"),  # noqa: SIM115
        "held_stdout": (lambda x: (held.write("out\n"), x + 1)[1], r"\.write"),
    }
    fn, what = cases[kind]
    jf = thunder_rs.jit(fn)
    for _ in range(3):
        with pytest.raises(ThunderNotImplementedError, match=rf"{what}: the program calls it at .*test_c_effects.py:"):
            jf(torch.ones(3))
    assert sio.getvalue() == ""
    text.close()
    binary.close()


def test_os_write_kill_sleep_socket_subprocess_and_torch_save_are_refused(tmp_path):
    fd = os.open(tmp_path / "fd", os.O_WRONLY | os.O_CREAT)
    handled = []
    previous = signal.signal(signal.SIGUSR1, lambda *a: handled.append(a))
    a, b = socket.socketpair()
    try:

        def writes(x):
            os.write(fd, b"w")
            return x + 1

        def kills(x):
            os.kill(os.getpid(), signal.SIGUSR1)
            return x + 1

        def sleeps(x):
            time.sleep(0.001)
            return x + 1

        def sends(x):
            a.send(b"k")
            return x + 1

        def runs(x):
            subprocess.run(["true"], check=False)
            return x + 1

        def saves(x):
            torch.save(x, tmp_path / "x.pt")
            return x + 1

        _refused(writes, "os.write")
        _refused(kills, "os.kill")
        _refused(sleeps, "time.sleep")
        _refused(sends, "socket.socket.send")
        _refused(runs, "subprocess.run")
        _refused(saves, "torch.save")
        assert handled == [] and os.path.getsize(tmp_path / "fd") == 0
        assert not (tmp_path / "x.pt").exists()
    finally:
        signal.signal(signal.SIGUSR1, previous)
        os.close(fd)
        a.close()
        b.close()
    # Outside a program they run as before (the wrappers are put back).
    assert subprocess.run(["true"], check=False).returncode == 0
    torch.save(torch.ones(1), tmp_path / "y.pt")


def test_print_to_a_held_file_logging_and_reads_run_as_eager(tmp_path, caplog):
    source = tmp_path / "in.txt"
    source.write_text("3")
    log = logging.getLogger("thunder_rs.test_c_effects")

    def fn(x, out):
        scale = float(open(source).read())  # a read, not an effect
        print("step", file=out)
        log.warning("step")
        return x * scale

    eager_out, jit_out = io.StringIO(), io.StringIO()
    jf = thunder_rs.jit(fn)
    with caplog.at_level(logging.WARNING, logger=log.name):
        for _ in range(3):
            torch.testing.assert_close(jf(torch.ones(3), jit_out), fn(torch.ones(3), eager_out), rtol=0, atol=0)
    assert jit_out.getvalue() == eager_out.getvalue() == "step\n" * 3
    assert [r.getMessage() for r in caplog.records] == ["step"] * 6


def test_an_in_memory_stream_the_program_makes_runs_as_eager():
    def fn(x):
        buffer = io.StringIO()
        buffer.write("abc")
        buffer.flush()
        return x * len(buffer.getvalue())

    jf = thunder_rs.jit(fn)
    for _ in range(3):
        torch.testing.assert_close(jf(torch.ones(3)), fn(torch.ones(3)), rtol=0, atol=0)


@pytest.mark.parametrize("held", ["argument", "attribute"])
def test_an_in_memory_stream_held_outside_is_refused(held):
    class Logger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.buffer = io.StringIO()

        def forward(self, x):
            self.buffer.write("step")
            return x + 1

    def fn(x, buffer):
        buffer.write("step")
        return x + 1

    module = Logger()
    jf = thunder_rs.jit(fn) if held == "argument" else thunder_rs.jit(module)
    args = (torch.ones(3), io.StringIO()) if held == "argument" else (torch.ones(3),)
    with pytest.raises(
        ThunderNotImplementedError, match=r"_io.StringIO.write: the program calls it at .*test_c_effects"
    ):
        jf(*args)
    assert module.buffer.getvalue() == ""


def test_a_write_made_by_an_installed_library_names_the_users_line_too(tmp_path):
    np = pytest.importorskip("numpy")
    path = tmp_path / "a.npy"

    def fn(x):
        np.save(path, np.ones(2))
        return x + 1

    line = fn.__code__.co_firstlineno + 1
    refused = rf"open\(.*'wb'\): the program calls it at .*numpy.*reached from .*test_c_effects.py:{line}"
    with pytest.raises(ThunderNotImplementedError, match=refused):
        thunder_rs.jit(fn)(torch.ones(3))


@pytest.mark.parametrize("kind", ["json", "write_text", "shutil", "csv", "csv_writer_kept"])
def test_writes_the_standard_library_makes_for_the_program_are_refused(tmp_path, kind):
    import csv
    import json
    import pathlib
    import shutil

    held, source, target = open(tmp_path / "held", "w"), tmp_path / "src", tmp_path / "dst"  # noqa: SIM115
    source.write_text("s")
    kept = csv.writer(held)
    cases = {
        "json": (lambda x: (json.dump([1], held), x + 1)[1], r"TextIOWrapper.write"),
        "write_text": (lambda x: (pathlib.Path(target).write_text("w"), x + 1)[1], r"open\(.*dst', 'w'\)"),
        "shutil": (lambda x: (shutil.copy(source, target), x + 1)[1], r"open\(.*dst', 'wb'\)"),
        "csv": (lambda x: (csv.writer(held).writerow([1, 2]), x + 1)[1], r"_csv.writer.writerow"),
        "csv_writer_kept": (lambda x: (kept.writerow([1, 2]), x + 1)[1], r"_csv.writer.writerow"),
    }
    fn, what = cases[kind]
    line = fn.__code__.co_firstlineno
    jf = thunder_rs.jit(fn)
    for _ in range(3):
        with pytest.raises(ThunderNotImplementedError, match=rf"{what}: the program calls it at .*_effects.py:{line}"):
            jf(torch.ones(3))
    held.close()
    assert (tmp_path / "held").read_text() == "" and not target.exists()


def test_what_the_standard_library_writes_to_a_stream_the_program_makes_runs_as_eager():
    import csv
    import json

    def fn(x):
        text, rows = io.StringIO(), io.StringIO()
        json.dump({"n": 3}, text)
        csv.writer(rows).writerow([1, 2])
        return x * json.loads(text.getvalue())["n"] + len(rows.getvalue())

    jf = thunder_rs.jit(fn)
    for _ in range(3):
        torch.testing.assert_close(jf(torch.ones(3)), fn(torch.ones(3)), rtol=0, atol=0)


def test_a_module_the_program_imports_first_is_not_refused_for_its_pyc(tmp_path, monkeypatch):
    (tmp_path / "thunder_rs_lazily_imported.py").write_text("SCALE = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)

    def fn(x):
        import thunder_rs_lazily_imported

        return x * thunder_rs_lazily_imported.SCALE

    try:
        torch.testing.assert_close(thunder_rs.jit(fn)(torch.ones(3)), torch.ones(3) * 2, rtol=0, atol=0)
        assert list((tmp_path / "__pycache__").iterdir())  # (it wrote one while traced)
    finally:
        sys.modules.pop("thunder_rs_lazily_imported", None)


def test_sys_stdout_and_stderr_writes_are_made_by_every_call_as_eager(capsys):
    import pprint

    def fn(x):
        sys.stdout.write("a\n")
        print("b", x.sum())
        sys.stderr.writelines(["e", "\n"])
        sys.stderr.flush()
        pprint.pprint({"k": 1})  # (the standard library writes to sys.stdout for the program)
        return x + 1

    jf = thunder_rs.jit(fn)
    for i in range(3):
        got = jf(torch.ones(2) * i)
        jit_out, jit_err = capsys.readouterr()
        torch.testing.assert_close(got, fn(torch.ones(2) * i), rtol=0, atol=0)
        assert (jit_out, jit_err) == capsys.readouterr()
        assert jit_out.startswith("a\nb tensor(") and jit_out.endswith("{'k': 1}\n") and jit_err == "e\n"


def test_a_file_object_of_a_python_subclass_the_program_holds_stays_open(tmp_path):
    class Log(io.TextIOWrapper):
        pass

    log = Log(open(tmp_path / "log", "wb"), encoding="utf-8")  # noqa: SIM115

    def fn(x):
        return x * len(log.name)  # (its observer found its position, which closed it)

    try:
        for _ in range(2):
            torch.testing.assert_close(thunder_rs.jit(fn)(torch.ones(3)), fn(torch.ones(3)), rtol=0, atol=0)
        assert not log.closed
    finally:
        log.close()


def test_a_type_decided_once_per_trace_still_sees_its_instances_and_subclasses(tmp_path):
    """The profile hook decides once per type whether its builtins are watched
    (``CallObserver.watches``, a decision kept until the trace ends): a write to an instance of a
    Python subclass of an in-memory stream held outside is refused after builtins of unwatched
    types ran, in each of two traces (a new subclass each)."""
    buffers = []

    def make(kind):
        class Held(kind):
            pass

        buffers.append(Held())
        return buffers[-1]

    for kind in (io.StringIO, io.BytesIO):
        held, payload = make(kind), ("s" if kind is io.StringIO else b"s")

        def fn(x, held=held, payload=payload):
            {}.get(1), [1].index(1), "a".startswith("a")  # (builtins of unwatched types first)
            held.write(payload)
            return x + 1

        with pytest.raises(ThunderNotImplementedError, match=r"Held\.write: the program calls it"):
            thunder_rs.jit(fn)(torch.ones(2))
        assert held.getvalue() == payload[:0]  # refused before it wrote
