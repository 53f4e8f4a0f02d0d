"""What code that is not the program changes in its state while it is traced is not the program's
write.

A program's writes to Python objects are found after tracing by comparing each state object's
attributes (``state.ProgramState``) and each module clone's (``modules.attribute_writes``) with
what they held when the program found them: every compiled call then sets them again. Code that
interrupts the program's frames is no part of it: a garbage collection's ``gc.callbacks``,
finalizers and ``__del__`` methods (``collector``), a signal handler (``interrupting``). What it sets
happens once, when it runs, as in eager, so it must neither be undone nor repeated by every call.
Such code runs between ``snapshot``, which copies the attributes of the state the traced programs
of the thread keep, and ``fold``, which takes what it changed as what the program found: into the
baseline the comparison reads (a state object's first attributes, a module clone's instance dict,
which the program reads on, as eager reads the module the code changed) and, where the program
has not read it, into the guard that holds the object whole. One dict copy per state object and
module per collection while a program is traced; nothing otherwise.

A value the program had read before the interruption changed it stays guarded as the program
read it (the trace relied on it): the next call compiles again (``ProgramState.interrupted``
tells the check after tracing that the program did not change it). Left out: a module attribute
read so is still refused after tracing as changed (its guard is checked only after a module
write, and the write came before the entry), and the lists and dicts the program reads are
compared as they were read.
"""

import contextlib
import operator
import signal
import threading
import types

from thunder_rs.core.state.guards import MISSING, DictGuard
from thunder_rs.core.state.items import container_copy
from thunder_rs.core.state.observe import thread_state

#: A module's stores, which the clone keeps apart (its own parameters' dict, its submodules' clones).
_STORES = frozenset({"_parameters", "_buffers", "_modules"})


class _Tracked(threading.local):
    """Per thread: ``(observer, module pairs)`` of each acquisition in progress, innermost last."""

    states: tuple = ()


_tracked = _Tracked()


@contextlib.contextmanager
def kept_apart():
    """While a program is traced and its writes are found: the state ``track`` marks is the
    program's until then, and the Python signal handlers run as code that is not the program
    (``interrupting``; where the thread is the main thread, the only one they run in)."""
    outer = _tracked.states
    wrapped = _wrap_handlers() if threading.current_thread() is threading.main_thread() else []
    try:
        yield
    finally:
        _tracked.states = outer
        for signum, handler, wrapper in wrapped:
            if signal.getsignal(signum) is wrapper:  # (unless the program set another)
                signal.signal(signum, handler)


def track(observer, pairs: list) -> None:
    """Marks ``observer``'s state objects and the ``(clone, original)`` module ``pairs`` as a traced
    program's, for ``snapshot`` and ``fold``, until ``kept_apart`` ends."""
    _tracked.states = (*_tracked.states, (observer, pairs))


def traced_modules() -> list:
    """The module clones the traced programs of this thread run (``modules.ModuleBinding``)."""
    return [clone for _, pairs in _tracked.states for clone, _ in pairs]


def snapshot():
    """Copies of the attributes of the state the traced programs of this thread keep, before code
    that is not the program runs; None when no program is traced."""
    if not _tracked.states:
        return None
    images = []
    for observer, pairs in _tracked.states:
        places = [(original, original.__dict__, clone.__dict__) for clone, original in pairs]
        places += observer.state.found_attributes()
        images.append((observer, [(obj, live, found, dict(live)) for obj, live, found in places]))
    return images


def fold(images) -> None:
    """Takes what changed since ``snapshot`` made ``images`` as what the programs found."""
    for observer, places in images or ():
        for obj, live, found, before in places:
            if live.keys() == before.keys() and all(map(operator.is_, live.values(), before.values())):
                continue
            guard, state = observer.guard_of(obj), observer.state
            for name in live.keys() | before.keys():
                value = live.get(name, MISSING)
                if value is before.get(name, MISSING) or name in _STORES:
                    continue
                _put(found, name, value)
                state.interrupted.add((id(obj), name))
                # What the program read before stays guarded as it read it (the next call compiles again).
                if type(guard) is DictGuard and not state.was_read(obj, name):
                    _put(guard.found, name, value if value is MISSING else container_copy(value))


def _put(attributes: dict, name: str, value) -> None:
    if value is MISSING:
        attributes.pop(name, None)
    else:
        attributes[name] = value


def interrupting(code):
    """``code`` (a signal handler) wrapped to run as code that is not the program: unobserved, its
    changes to the traced program's state taken as found (``snapshot``, ``fold``)."""

    def run(*args):
        images = snapshot()
        thread_state.inside += 1
        try:
            return code(*args)
        finally:
            thread_state.inside -= 1
            fold(images)

    return run


def _wrap_handlers() -> list:
    """Puts ``interrupting`` around each Python signal handler: ``(signal, handler, wrapper)``."""
    wrapped = []
    for signum in signal.valid_signals():
        try:
            handler = signal.getsignal(signum)
        except ValueError:
            continue
        if callable(handler) and not isinstance(handler, types.BuiltinFunctionType):
            wrapper = interrupting(handler)
            signal.signal(signum, wrapper)
            wrapped.append((signum, handler, wrapper))
    return wrapped
