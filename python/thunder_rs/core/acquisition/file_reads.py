"""Files a traced program opens: what it reads is guarded, an open that writes is refused.

Tracing bakes what the program read from a file into the trace (``float(open(p).read())``,
``Path.read_text()``, ``json.load(open(p))``, ``np.load(p)``): a later call after the file changed
would compute with the old contents where eager reads the new ones. A demanding user expects the
eager result, so each file the program opens to read is guarded, as ``os.environ`` reads are
(``stdlib_state``): the entry holds while the file's ``os.stat`` (device, inode, size, modification
and change times, or its absence) is what it was, and a changed file compiles again (the miss
names the file). A file modified within ``_RACY_NS`` of its reading could change again with the
same times (the file system's clock is coarse), so its contents' digest is compared too until that
window has passed. Opening a file to write (``"w"``, ``"a"``, ``"x"``, ``"+"``: ``Path.write_text``,
``shutil.copy``) is refused, naming the line: tracing creates or truncates it once, where eager does
on every call.

``builtins.open`` and ``io.open`` (``pathlib``'s) call a checking wrapper only while some program is
traced (``put_open``, ``put_back_open``), and only opens the program makes (its own code, or the
standard library's, torch's or an installed library's on its behalf, not thunder_rs's nor the
import system's) count. Left out: a file descriptor opened with ``os.open`` and read with
``os.read``; reads of a file object held from outside are refused by the observer
(``core.state.c_effects``).
"""

import builtins
import hashlib
import io
import os
import sys
import time
from typing import Any

from thunder_rs.core.base.userframe import PACKAGE_DIR
from thunder_rs.core.state.c_effects import site
from thunder_rs.core.state.code_reads import interesting
from thunder_rs.core.state.guards import StateGuard
from thunder_rs.core.state.hook import program_frame, thread_state
from thunder_rs.errors import ThunderNotImplementedError

_open = io.open
_time_ns = time.time_ns
#: how long after a file's last change its times may not tell a later change (coarse clocks)
_RACY_NS = 2_000_000_000


def _stat(path) -> tuple | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _digest(path) -> bytes | None:
    try:
        with _open(path, "rb") as f:
            return hashlib.blake2b(f.read(), digest_size=16).digest()
    except (OSError, ValueError):
        return None


class FileState:
    """What a guard reads of the file at ``path``: its ``_stat``; while it was changed too
    recently for its times to tell another change, its contents' digest must also be the same
    (a differing one reads as ``("contents changed",)``)."""

    __slots__ = ("path", "digest", "until")

    def __init__(self, path):
        self.path, self.digest, self.until = path, None, 0
        state, now = _stat(path), _time_ns()
        if state is not None and max(state[3], state[4]) + _RACY_NS > now:
            self.digest, self.until = _digest(path), max(state[3], state[4]) + _RACY_NS

    def __call__(self):
        state = _stat(self.path)
        if self.digest is not None and state is not None:
            if _digest(self.path) != self.digest:
                return ("contents changed",)
            if _time_ns() > self.until:  # (a change from now on has later times)
                self.digest = None
        return state


def _show(state) -> str:
    if state is None:
        return "absent"
    if len(state) == 1:
        return state[0]
    return f"{state[2]} bytes modified at {state[3]} ns"


def _writes(mode) -> bool:
    return isinstance(mode, str) and any(c in mode for c in "wax+")


def _not_the_programs(code) -> bool:
    """Whether the frames of ``code`` are passed on the way out to the program's that opens a file:
    the standard library's, torch's and installed libraries' (``program_frame``), not thunder_rs's."""
    return not interesting(code) and not code.co_filename.startswith(PACKAGE_DIR)


def _opening(file, mode="r", *args, **kwargs):
    observer: Any = thread_state.observer
    if observer is not None and not thread_state.inside and isinstance(file, (str, bytes, os.PathLike, int)):
        caller = sys._getframe(1)
        program = program_frame(caller, _not_the_programs)
        if program is not None and type(file) is int:  # (a descriptor: no path to guard the contents of)
            raise ThunderNotImplementedError(
                f"open({file}): the program opens a file descriptor at {site(caller)}; what it reads would be "
                "baked into the compiled call (no path to guard, as an opened path is). Open the file by its path"
            )
        if program is not None:
            where = f"{program.f_code.co_filename}:{program.f_lineno}"
            if _writes(mode):
                raise ThunderNotImplementedError(
                    f"open({os.fsdecode(file)!r}, {mode!r}): the program calls it at {site(caller)}, an effect outside "
                    "the program (it creates or changes the file); tracing made it once, and a compiled call would "
                    "not make it again where eager makes it on every call. Write files outside the jitted function"
                )
            path = os.path.abspath(os.fsdecode(file))
            read = FileState(path)
            observer.guard_state(StateGuard(f"the file {path} (read at {where})", read, read(), _show))
    return _open(file, mode, *args, **kwargs)


def put_open() -> None:
    """Puts the checking ``open`` in (while some program is traced)."""
    builtins.open = io.open = _opening


def put_back_open() -> None:
    builtins.open = io.open = _open
