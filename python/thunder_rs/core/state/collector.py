"""What the garbage collector runs while a program is traced is not the program's.

A collection can start on any allocation, so while a program is traced its frames may be
interrupted by a ``gc.callbacks`` function, a ``__del__`` method or a ``weakref.finalize``
callback of garbage the collector frees. That code runs when the collector decides (eager runs
it at other times, or not at all), so what it reads is not the program's state and what it
writes is not the program's effect: observed as the program's, a callback's global counter was
guarded and recompiled every call. CPython calls ``gc.callbacks`` with ``"start"`` before a
collection and ``"stop"`` after it, and runs finalizers and weakref callbacks in between, so two
callbacks mark the thread as inside thunder_rs's own work (``thread_state.inside``, which the
observer and the standard library's wrappers skip) for the whole collection: one first in the
list, for ``"start"``, one last, for ``"stop"``. ``keep_out`` puts them there whenever a program
starts being traced (a callback added since goes between them). They stay installed: removed while
another thread collects, its ``"stop"`` would never come. What the collection's code sets in the
traced program's state is taken as what the program found, not as its write (``bystanders``).
A ``KeyboardInterrupt`` landing in them (Ctrl-C during a compile) is not lost, as CPython loses
what a collection's callback raises: ``_core.GcCallback`` calls them again until they ran, and
makes the interrupt pending again after the collection, where it stops the compile.
"""

import gc
import threading

from thunder_rs import _core
from thunder_rs.core.state.bystanders import fold, snapshot
from thunder_rs.core.state.observe import thread_state


class _Collecting(threading.local):
    """Per thread: whether a collection this thread runs marked it inside (``_enter``)."""

    marked = False
    #: the traced programs' state before the collection (``bystanders.snapshot``)
    images = None


_collecting = _Collecting()


def _enter(phase: str, info: dict) -> None:
    if phase == "start" and not _collecting.marked:
        _collecting.marked = True
        thread_state.inside += 1
        _collecting.images = snapshot()


def _leave(phase: str, info: dict) -> None:
    if phase == "stop" and _collecting.marked:
        _collecting.marked = False
        images, _collecting.images = _collecting.images, None
        try:
            fold(images)  # (inside: the copies it keeps may run a container's Python ``__copy__``)
        finally:
            thread_state.inside -= 1


_ENTER, _LEAVE = _core.GcCallback(_enter, False), _core.GcCallback(_leave, True)


def keep_out() -> None:
    """Makes the collections of every thread unobserved: ``_enter`` first among ``gc.callbacks``
    and ``_leave`` last (the caller holds the lock that serialises tracings' setup)."""
    callbacks = gc.callbacks
    if callbacks and callbacks[0] is _ENTER and callbacks[-1] is _LEAVE:
        return
    for callback in (_ENTER, _LEAVE):
        while callback in callbacks:
            callbacks.remove(callback)
    callbacks.insert(0, _ENTER)
    callbacks.append(_LEAVE)
