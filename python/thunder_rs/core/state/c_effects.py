"""Side effects the program makes through C functions: refused while it is traced, naming the line.

Tracing runs the program once, and a compiled call runs only its trace: what the program wrote to a
file object it holds (``f.write``), to a file descriptor (``os.write``), to a socket
(``sock.send``), or did to the system (``os.kill``, ``os.system``, ``time.sleep``), would happen on
the first call only where eager does it on every call. These are C functions: the observer's
profile hook reports calls of builtins bound to ``C_WRITERS``' owners (a module, a type, or an
instance of the type: the file object ``f.write`` is bound to), and ``refuse_c_effect`` refuses
those that write (``effect``) where the program's code calls them, or the standard library's or an
installed library's for it (``json.dump(obj, f)``, ``csv.writer(f).writerow``, ``np.save``; not the
import system's ``.pyc`` writes), naming the program's line that reached them. An in-memory stream
the program makes itself is its own (made again by every call). Reads of a file object held
outside the program (``f.read()``, ``json.load(f)``, ``f.seek``) and of a file descriptor
(``os.read``, ``os.pread``, ``os.lseek``: ``C_FD_READS``) are refused too: tracing baked what they
read.

The hook does not see the calls a C caller makes (``functools.partial(f.write, s)()``,
``map(os.write, ...)``): stand-ins that refuse the same way take those functions' places while the
program is traced (``core.state.handed_effects``). Elsewhere: opening a file to write is refused,
and the files the program reads are guarded (``acquisition.file_reads``); ``sys.stdout.write``
(``acquisition.stream_writes``), ``print`` and logging (``acquisition.effects``) are made again by
every call; ``subprocess`` and ``torch.save``, Python functions, are refused where the program calls
them (``stdlib_state``).
"""

import _csv
import _pickle
import _socket
import gc
import io
import os
import signal
import sys
import time
import types

from thunder_rs.core.state.code_reads import in_stdlib, installed
from thunder_rs.errors import ThunderNotImplementedError

_FILE_WRITES = frozenset({"write", "writelines", "flush", "truncate"})
#: a file object's reads: refused on one held outside the program (tracing baked what it read, and
#: moved its position once, where eager reads on from there on every call)
FILE_READS = frozenset({"read", "read1", "readline", "readlines", "readinto", "readinto1", "readall", "seek"})
FILES = (io.TextIOWrapper, io.BufferedReader, io.BufferedRandom, io.FileIO, io.StringIO, io.BytesIO)

_CSV_WRITER = type(_csv.writer(io.StringIO()))
#: owner (a module, or a type whose instances' methods count) -> the names of its builtins that
#: write outside the program, whose calls by the program the profile hook reports
C_WRITERS: dict = {
    io.TextIOWrapper: _FILE_WRITES,  # (sys.stdout, sys.stderr, open(p, "w"))
    io.BufferedWriter: _FILE_WRITES,
    io.BufferedRandom: _FILE_WRITES,
    io.FileIO: _FILE_WRITES,
    io.StringIO: _FILE_WRITES,
    io.BytesIO: _FILE_WRITES,
    io.BufferedReader: frozenset(),  # (its reads: ``FILE_READS``)
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
    _CSV_WRITER: frozenset({"writerow", "writerows"}),  # (their file's ``write``)
}
#: module -> its builtins that read a file descriptor (or move its position): refused, as a held
#: file object's reads are (tracing baked what they read; a compiled call would not read on)
C_FD_READS: dict = {sys.modules[os.read.__module__]: frozenset({"read", "readv", "pread", "preadv", "lseek"})}


def _csv_stream(writer):
    """The file object a ``csv.writer`` writes to (the ``__self__`` of the ``write`` it keeps), if
    that ``write`` is one of ``C_WRITERS``' (a Python ``write`` the hook sees when it runs)."""
    for kept in gc.get_referents(writer):
        kept = getattr(kept, "__wrapped__", kept)  # (a stand-in while traced: ``handed_effects``)
        if type(kept) is types.BuiltinMethodType and kept.__name__ == "write" and writes(kept.__self__, "write"):
            return kept.__self__
    return None


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


def site(frame) -> str:
    """``file:line`` of ``frame``, and where it runs an installed library's or the standard
    library's code (``np.save``'s ``write``, ``json.dump``'s), the line outside such code that
    called it."""
    site, caller = f"{frame.f_code.co_filename}:{frame.f_lineno}", frame
    while caller is not None and (installed(caller.f_code.co_filename) or in_stdlib(caller.f_code.co_filename)):
        caller = caller.f_back
    if caller is frame or caller is None:
        return site
    return f"{site}, reached from {caller.f_code.co_filename}:{caller.f_lineno}"


def refuse_c_effect(frame, function, observer) -> None:
    """Refuses ``function``, a builtin bound to one of ``C_WRITERS``' owners (or an instance of
    one), called by the program's ``frame``, if it writes outside the program (``effect``), or
    reads a file object held outside it."""
    owner, name = function.__self__, function.__name__
    if name in FILE_READS and isinstance(owner, FILES) and observer.reached_from_outside(owner):
        raise ThunderNotImplementedError(
            f"{_owner_name(owner)}.{name}: the program reads a file object it did not open at {site(frame)}; tracing "
            "read it once (a compiled call would reuse what it read, and not move the file on where eager reads on). "
            "Open the file inside the jitted function (what it reads there is guarded) or read it outside"
        )
    if isinstance(owner, type(os)) and name in C_FD_READS.get(owner, ()):
        raise ThunderNotImplementedError(
            f"{_owner_name(owner)}.{name}: the program reads a file descriptor at {site(frame)}; tracing read it once "
            "(a compiled call would reuse what it read, and not move the descriptor on where eager reads on). Read it "
            "outside the jitted function and pass what it read in"
        )
    made = effect(function, observer)
    if made is not None:
        raise ThunderNotImplementedError(
            f"{made}: the program calls it at {site(frame)}, an effect outside the program (a write to a file, a "
            "stream, a socket or the system); tracing made it once, and a compiled call would not make it again where "
            "eager makes it on every call. Make it outside the jitted function (print and logging calls inside it are "
            "made on every call)"
        )


def effect(function, observer) -> str | None:
    """The name of ``function`` (``_io.TextIOWrapper.write``) if it is a builtin that writes
    outside the program: one of ``C_WRITERS``', bound to its owner or an instance of it; an
    in-memory stream's (``io.StringIO``, ``io.BytesIO``) only where ``observer`` saw the stream
    reached from outside (one the program makes and reads back is its own, made again by every
    call). None otherwise."""
    if type(function) is not types.BuiltinMethodType:
        return None
    owner, name = function.__self__, function.__name__
    if owner is None or not writes(owner, name):
        return None
    stream = _csv_stream(owner) if isinstance(owner, _CSV_WRITER) else owner
    if stream is None or (isinstance(stream, (io.StringIO, io.BytesIO)) and not observer.reached_from_outside(stream)):
        return None
    return f"{_owner_name(owner)}.{name}"
