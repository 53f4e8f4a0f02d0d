"""Side effects the program makes through C functions: refused while it is traced, naming the line.

Tracing runs the program once, and a compiled call runs only its trace: what the program wrote to a
file object it holds (``f.write``, ``sys.stdout.write``), to a file descriptor (``os.write``), to a
socket (``sock.send``), or did to the system (``os.kill``, ``os.system``, ``time.sleep``), would
happen on the first call only where eager does it on every call. These are C functions no wrapper
replaces on the objects the program holds: the observer's profile hook reports the program's calls
of builtins bound to ``C_WRITERS``' owners (a module, a type, or an instance of the type: the file
object ``f.write`` is bound to), and ``refuse_c_effect`` refuses those that write. An in-memory
stream the program makes itself is its own (made again by every call). What the hook does not see
is not refused here: calls made by the standard library or another library on the program's behalf
(``json.dump(obj, f)``) or through a C caller (``functools.partial(os.kill, ...)``); ``subprocess``
and ``torch.save``, Python functions, are refused where the program calls them (``stdlib_state``).
``print`` and logging are made again by every call instead (``acquisition.effects``); reading files
and the environment is not an effect.
"""

import _pickle
import _socket
import io
import os
import signal
import sys
import time

from thunder_rs.errors import ThunderNotImplementedError

_FILE_WRITES = frozenset({"write", "writelines", "flush", "truncate"})

#: owner (a module, or a type whose instances' methods count) -> the names of its builtins that
#: write outside the program, whose calls by the program the profile hook reports
C_WRITERS: dict = {
    io.TextIOWrapper: _FILE_WRITES,  # (sys.stdout, sys.stderr, open(p, "w"))
    io.BufferedWriter: _FILE_WRITES,
    io.BufferedRandom: _FILE_WRITES,
    io.FileIO: _FILE_WRITES,
    io.StringIO: _FILE_WRITES,
    io.BytesIO: _FILE_WRITES,
    _socket.socket: frozenset({"send", "sendall", "sendto", "sendmsg"}),
    sys.modules[os.write.__module__]: frozenset(  # (``posix``)
        "write writev pwrite pwritev sendfile kill killpg system truncate ftruncate remove unlink rename replace "
        "mkdir rmdir link symlink chmod utime".split()
    ),
    time: frozenset({"sleep"}),
    sys.modules[signal.raise_signal.__module__]: frozenset(
        {"raise_signal", "pthread_kill", "alarm", "setitimer"}
    ),  # (``_signal``)
    _pickle: frozenset({"dump"}),
}


def _owner_name(owner) -> str:
    if isinstance(owner, type(os)):
        return {"posix": "os", "nt": "os", "_signal": "signal", "_pickle": "pickle"}.get(owner.__name__, owner.__name__)
    kind = owner if isinstance(owner, type) else type(owner)
    return f"{kind.__module__}.{kind.__qualname__}"


def writes(owner, name: str) -> bool:
    """Whether the builtin ``name`` bound to ``owner`` is one of ``C_WRITERS``'."""
    if isinstance(owner, type(os)):
        return name in C_WRITERS.get(owner, ())
    return not isinstance(owner, type) and any(name in C_WRITERS.get(base, ()) for base in type(owner).__mro__)


def _site(frame) -> str:
    """``file:line`` of ``frame``, and where it runs an installed library's code (``np.save``'s
    ``write``), the line outside such code that called it."""
    site, caller = f"{frame.f_code.co_filename}:{frame.f_lineno}", frame
    while caller is not None and _installed(caller.f_code.co_filename):
        caller = caller.f_back
    if caller is frame or caller is None:
        return site
    return f"{site}, reached from {caller.f_code.co_filename}:{caller.f_lineno}"


def _installed(path: str) -> bool:
    return f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path


def refuse_c_effect(frame, function, observer) -> None:
    """Refuses ``function``, a builtin bound to one of ``C_WRITERS``' owners (or an instance of
    one), called by the program's ``frame``, if it writes outside the program: an in-memory stream
    (``io.StringIO``, ``io.BytesIO``) only where ``observer`` saw it reached from outside (one the
    program makes and reads back is its own, made again by every call)."""
    owner, name = function.__self__, function.__name__
    if not writes(owner, name):
        return
    if isinstance(owner, (io.StringIO, io.BytesIO)) and not observer.reached_from_outside(owner):
        return
    raise ThunderNotImplementedError(
        f"{_owner_name(owner)}.{name}: the program calls it at {_site(frame)}, an "
        "effect outside the program (a write to a file, a stream, a socket or the system); tracing made it once, "
        "and a compiled call would not make it again where eager makes it on every call. Make it outside the "
        "jitted function (print and logging calls inside it are made on every call)"
    )
