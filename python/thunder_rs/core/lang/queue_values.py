"""The streams a call's forward switched to (``with torch.cuda.stream(s)``, ``acquisition.cuda_queue``),
handed to that call's backward: eager's autograd runs each call's backward on the streams its forward
ran on, whichever thread runs it (autograd's device thread for CUDA) and whenever (two calls'
forwards, then their backwards). A stream the program makes is made anew by every call, and one
it takes again (``torch.cuda.current_stream()``) is the call's; the backward takes the one its own
forward took, not the one made or current last.

The forward notes what each of those arguments was in the call (``note``); the autograd function
keeps the notes of its call (``take``, on its ``ctx``) and puts them in place while its backward
runs (``running``), where the backward's effects find them (``of``). Per thread. Only a forward an
autograd function runs notes (``start`` to ``take``): one run without (under ``no_grad``, or with
no input requiring grad) has no backward, and its notes would stay on the thread, holding its
streams and events (of every program an inference loop compiles) until a backward's forward took them.
"""

import threading

__all__ = ["note", "of", "running", "start", "take"]

_local = threading.local()


def start() -> dict | None:
    """Opens the notes of the forward an autograd function runs next on this thread; returns those
    of a forward running around it (for ``take``)."""
    outer = _local.__dict__.get("notes")
    _local.notes = {}
    return outer


def note(held, value) -> None:
    """Notes that the effect argument ``held`` (a ``Made``, a stream taken again) is ``value`` in
    the call running on this thread, where its backward may run (``start``)."""
    notes = _local.__dict__.get("notes")
    if notes is not None:
        notes[held] = value


def take(outer: dict | None) -> dict | None:
    """The notes made on this thread since ``start`` (the forward just run), or None where none
    were; ``outer``: what ``start`` returned, put back."""
    notes = _local.__dict__.get("notes")
    _local.notes = outer
    return notes or None


def running(notes: dict | None):
    """A context that puts a call's notes in place while its backward runs on this thread; for a
    call that noted none (most: no stream switched to), one that does nothing."""
    return _NOTHING if notes is None else _Running(notes)


class _Running:
    __slots__ = ("notes", "outer")

    def __init__(self, notes: dict):
        self.notes = notes

    def __enter__(self) -> None:
        self.outer = _local.__dict__.get("backward")
        _local.backward = self.notes

    def __exit__(self, *exc) -> None:
        _local.backward = self.outer


class _Nothing:
    __slots__ = ()

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc) -> None:
        pass


_NOTHING = _Nothing()


def of(held, missing):
    """What ``held`` was in the call whose backward runs on this thread, or ``missing`` (a backward
    not run by a call's autograd function: none noted)."""
    notes = _local.__dict__.get("backward")
    return missing if notes is None else notes.get(held, missing)
