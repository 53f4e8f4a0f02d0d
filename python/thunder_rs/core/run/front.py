"""The front door's small pieces: ``jit`` options checked by name, the registry of live jitted
callables, and ``reset``."""

import weakref

from thunder_rs.errors import ThunderTypeError

#: The options ``thunder_rs.jit`` takes.
JIT_OPTIONS = ("cache", "passes", "executors", "dynamic")
#: Every live ``ThunderFunction`` (a module's included), so that ``reset`` reaches them all.
live_functions: "weakref.WeakSet" = weakref.WeakSet()
#: Process-wide caches of compiled code outside the jits (an executor's compiled regions), cleared
#: by ``reset``: each module that keeps one registers its clearing function when imported.
process_caches: list = []


def check_options(options: dict) -> None:
    """Raises naming the first option ``jit`` does not know, with those it does."""
    for name in options:
        if name not in JIT_OPTIONS:
            raise ThunderTypeError(f"jit: unknown option {name!r}; the options are {', '.join(JIT_OPTIONS)}")


def reset() -> None:
    """Clears the compile cache of every live jitted function and module, and the executors'
    process-wide caches (the Inductor executor's compiled regions; on-disk caches are kept): each
    compiles again at its next call."""
    for clear in process_caches:
        clear()
    for jfn in list(live_functions):
        with jfn._lock:
            jfn._clear("thunder_rs.reset() cleared the cache")
            jfn._last_entry = None


def clear_jits_running(pass_name: str, reason: str) -> None:
    """Clears the compile cache of every live jitted function whose passes include ``pass_name``
    (its code was compiled with what the name held before): each compiles again at its next call."""
    for jfn in list(live_functions):
        if pass_name in jfn._passes:
            with jfn._lock:
                jfn._clear(reason)
                jfn._last_entry = None
