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
tells the check after tracing that the program did not change it; a module attribute's guard,
checked only after a module write, is then checked by every call: ``checked_by_the_next_call``).
Left out: a read the observer does not see (``getattr(obj, computed_name)``) of an attribute the
interruption changed later is guarded with the new value, and the lists and dicts the program
reads are compared as they were read.
"""

import _signal  # type: ignore[import-not-found]  # (no stubs: signal's C module)
import contextlib
import operator
import signal
import threading
import types

from thunder_rs.core.state.guards import MISSING, DictGuard, Guard, ObjectSource
from thunder_rs.core.state.items import container_copy, same_attributes
from thunder_rs.core.state.modules import found_attributes
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
            if _signal.getsignal(signum) is wrapper:  # (unless the program set another)
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
        # A module's changes go to its clone, which the program reads on, and to what the clone's
        # writes are found against (``modules.found_attributes``).
        places = [
            (original, original.__dict__, (clone.__dict__, found_attributes(clone, original)))
            for clone, original in pairs
        ]
        places += [(obj, live, (found,)) for obj, live, found in observer.state.found_attributes()]
        images.append((observer, [(obj, live, found, dict(live)) for obj, live, found in places]))
    return images


def fold(images) -> None:
    """Takes what changed since ``snapshot`` made ``images`` as what the programs found."""
    for observer, places in images or ():
        for obj, live, founds, before in places:
            if live.keys() == before.keys() and all(map(operator.is_, live.values(), before.values())):
                continue
            guard, state = observer.guard_of(obj), observer.state
            for name in live.keys() | before.keys():
                value = live.get(name, MISSING)
                if value is before.get(name, MISSING) or name in _STORES:
                    continue
                for found in founds:
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


class _EveryCall(Guard):
    """A module attribute's guard checked by every call, not only after a module write: code other
    than the program changed the attribute after the program read it, before the entry was made."""

    per_call = True


def checked_by_the_next_call(guard, interrupted: set):
    """``guard`` (failing after tracing) as the entry keeps it when it fails only on attributes code
    other than the program set while it was traced (``interrupted``: ``(id(obj), name)``), so that
    the next call compiles again; None when the program changed what it guards."""
    source = getattr(guard, "source", None)
    if not interrupted or not isinstance(source, ObjectSource):
        return None
    key = id(source.obj)
    if type(guard) is Guard:
        if (key, guard.name) not in interrupted:
            return None
        if guard.per_call:
            return guard
        rechecked = object.__new__(_EveryCall)
        rechecked.__dict__.update(guard.__dict__)
        return rechecked
    if type(guard) is DictGuard:
        now, found = source.fixed(), guard.found
        names = now.keys() | found.keys()
        differ = [k for k in names if not same_attributes({k: now.get(k, MISSING)}, {k: found.get(k, MISSING)})]
        return guard if all((key, k) in interrupted for k in differ) else None
    return None


def interrupting(code):
    """``code`` (a signal handler) wrapped to run as code that is not the program: unobserved, its
    changes to the traced program's state taken as found (``snapshot``, ``fold``)."""

    def run(*args):
        # Inside first: ``snapshot`` and ``fold`` are thunder_rs's own work (an object's Python
        # ``__getattribute__`` run by them, observed, added state objects while they were iterated).
        thread_state.inside += 1
        try:
            images = snapshot()
            try:
                return code(*args)
            finally:
                fold(images)
        finally:
            thread_state.inside -= 1

    return run


def _wrap_handlers() -> list:
    """Puts ``interrupting`` around each Python signal handler: ``(signal, handler, wrapper)``."""
    wrapped = []
    # (``_signal``'s own functions: ``signal``'s wrappers turn each number and handler into an enum,
    # some 10 µs a signal, 0.5 ms for each compile)
    for signum in _signal.valid_signals():
        try:
            handler = _signal.getsignal(signum)
        except ValueError:
            continue
        if callable(handler) and not isinstance(handler, types.BuiltinFunctionType):
            wrapper = interrupting(handler)
            signal.signal(signum, wrapper)
            wrapped.append((signum, handler, wrapper))
    return wrapped
