"""Where an iterator the program reads is, so that a trace which consumed it can be refused
(``Observer.refuse_consumed_iterators``)."""

import io
import os
import types

from thunder_rs.core.state.guards import is_simple


def iterator_position(value, depth: int = 0):
    """Where an iterator is, comparable before and after tracing: a generator's instruction; else
    what its ``__reduce__`` gives (``count(2)``, a list iterator's index), with the positions of the
    iterators it holds (``zip``'s) and other objects by identity. An iterator whose type does not
    say (``object.__reduce__``) is one by identity: ``object.__reduce__`` of a Python subclass of a
    C type makes a new object of the C type from it (``TextIOWrapper(f)`` of a file object, whose
    collection closed ``f``)."""
    if isinstance(value, types.GeneratorType):
        return ("generator", None if value.gi_frame is None else value.gi_frame.f_lasti)
    if isinstance(value, tuple) and depth < 4:
        return tuple(iterator_position(v, depth + 1) for v in value)
    if is_simple(value):
        return value
    if isinstance(value, io.IOBase):  # (a file read by ``for line in f``: its position in the file)
        return ("file", _file_position(value))
    if not hasattr(type(value), "__next__") or depth >= 4 or type(value).__reduce__ is object.__reduce__:
        return id(value)
    try:
        reduced = value.__reduce__()
    except Exception:  # noqa: BLE001 (an iterator that cannot say where it is)
        return id(value)
    return (type(value), iterator_position(reduced[1:], depth + 1))


def _file_position(file):
    """Where the file object ``file`` is: its descriptor's offset, an in-memory stream's position;
    else itself (by identity)."""
    try:
        if isinstance(file, (io.StringIO, io.BytesIO)):
            return file.tell()
        return os.lseek(file.fileno(), 0, os.SEEK_CUR)
    except (OSError, ValueError):
        return id(file)
