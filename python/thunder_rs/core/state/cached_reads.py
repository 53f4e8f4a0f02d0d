"""Functions cached by ``functools.lru_cache`` (or ``functools.cache``) that the program calls:
what each call returned is guarded, so a cleared or changed cache compiles again.

A call that finds its arguments in the cache runs no Python code, and the trace holds what it
returned as a constant. Eager calls the function on every call: once its cache is cleared
(``helper.cache_clear()`` after a config change) or the entry is evicted, the function runs again
and may return something else, which a compiled call would never see. So while a program is
traced, a cached function it reads as a global, a closure variable or an attribute of an object
it holds (of a module: in the clone the program runs) is replaced there by a reader
(``stand_in_cached``, put back once no program is traced) that calls it and notes the arguments
and the result of each call with plain arguments (or classes: a classmethod's), or, for a call
that finds them in the cache, objects of lasting state, whose identity the entry's guards hold
(an argument object found in the cache is refused naming the line: another one, on a later call,
would be looked up again). A class's cached staticmethod or classmethod is replaced on the class by
one of a reader (``stand_in_cached_method``). One guard (``cached_guards``), first among the
entry's, makes each of those calls on every call of the compiled program, as eager does (so a
cleared cache is filled again outside any trace), and holds while each returns the same object
(an equal plain value). A changed result compiles again, and the new trace holds it.

Each cached function the program reads is watched (``CachedCalls``): a call that found its
arguments in the cache other than through a reader (an item of a dict, a ``functools.partial``)
is refused naming where it was read, once the trace is made.
"""

import functools
import sys
from functools import partial as _partial  # (the type: ``functools.partial`` is a stand-in while traced)

from thunder_rs.core.state.guards import CellSource, GlobalsSource, InputSource, ObjectSource, StateGuard, is_simple
from thunder_rs.core.state.hook import thread_state
from thunder_rs.core.state.identity import READER_CODES
from thunder_rs.errors import ThunderNotImplementedError

#: ``(holder, name, cached, reader)`` where a reader stands in for a cached function: ``holder`` a
#: dict (globals, an instance's attributes), a closure cell with ``name`` None, or a class whose
#: ``name`` held the staticmethod or classmethod ``cached`` (``reader``: the one put in its place)
_bound: list = []
#: id of a reader -> the reader
_readers: dict = {}


class CachedCalls:
    """What one trace's readers saw: ``results``, ``(cached, args, kwargs)`` -> what the call
    returned; ``watched``, id -> ``[cached, its cache's hits when the program read it, how many of
    them the readers made, where it was read]`` for each cached function the program read (a hit
    made otherwise, through a path no reader stands in, is refused: ``cached_guards``); ``codes``,
    the observer's code -> cached function (a call that misses is seen: ``identity.cached_call``)."""

    def __init__(self, codes: dict):
        self.results: dict = {}
        self.watched: dict = {}
        self.codes = codes

    def watch(self, cached, where: str) -> None:
        self.codes[getattr(cached.__wrapped__, "__code__", None)] = cached
        if id(cached) not in self.watched:
            self.watched[id(cached)] = [cached, cached.cache_info().hits, 0, where]


class CachedReader:
    """Calls ``cached`` and notes into ``calls`` (a ``CachedCalls``) each call whose arguments are
    plain values, or, where the call found them in the cache, objects of lasting state
    (``_lasting``); one that found other objects there is refused naming the line."""

    def __init__(self, cached, calls: CachedCalls):
        self.cached, self.calls = cached, calls
        functools.update_wrapper(self, cached)

    def __call__(self, *args, **kwargs):
        hits = self.cached.cache_info().hits
        result = self.cached(*args, **kwargs)
        hit = self.cached.cache_info().hits > hits
        if hit and (watched := self.calls.watched.get(id(self.cached))) is not None:
            watched[2] += 1
        values = (*args, *kwargs.values())
        if not all(map(_plain, values)):
            if not hit:  # (its code ran in the trace)
                return result
            if not all(_plain(v) or _lasting(v) for v in values):
                raise _held_result_error(self.cached, sys._getframe(1))
        self.calls.results.setdefault((self.cached, args, tuple(kwargs.items())), result)
        return result

    def __getattr__(self, name):  # (``cache_info``, ``cache_clear``, ``__wrapped__``)
        return getattr(self.cached, name)


READER_CODES.add(CachedReader.__call__.__code__)


def _plain(value) -> bool:
    """Whether a call's argument can be kept by the guard: a plain value, or a class (``cls``)."""
    return is_simple(value) or isinstance(value, type)


def _lasting(value) -> bool:
    """Whether ``value`` is an object the traced program found as lasting state (reached from a global,
    a closure variable or a module), whose identity the entry's guards hold, not one of its arguments."""
    observer = thread_state.observer
    source = None if observer is None else observer.state.source_of(value)
    return source is not None and not isinstance(source, InputSource)


def _held_result_error(cached, caller) -> ThunderNotImplementedError:
    name = getattr(cached, "__qualname__", repr(cached))
    return ThunderNotImplementedError(
        f"thunder_rs.jit: {name}, cached by functools, is called at {caller.f_code.co_filename}:{caller.f_lineno} "
        "with an object it finds in its cache (one of the program's arguments, or made by it), while traced: the "
        "trace would hold what it returned, where eager looks the object up again on every call. Pass plain "
        f"values (numbers, strings, tuples of them) to {name}, or call it outside the jitted function and pass the "
        "result in"
    )


def stand_in_cached(source, name: str, value, calls: CachedCalls, holder=None, origin: str = "") -> None:
    """If ``value``, read as ``name`` at ``source`` (by the code at ``origin``), is a cached function
    held by a globals dict, a closure cell or an object's attributes, puts a reader noting its calls
    into ``calls`` there until tracing ends; one held otherwise (an item of a dict, a partial's) is
    watched only. ``holder``: the instance dict the program reads instead of the source's (a clone's)."""
    if type(value) is _partial and type(value.func) is functools._lru_cache_wrapper:
        calls.watch(value.func, f"held by the partial {source.describe(name)}, read at {origin}")
    if type(value) is not functools._lru_cache_wrapper:
        return
    calls.watch(value, f"{source.describe(name)}, read at {origin}")
    reader = CachedReader(value, calls)
    if holder is None and isinstance(source, CellSource):
        source.cell.cell_contents = reader
        _bound.append((source.cell, None, value, reader))
    else:
        mapping = source.fixed() if holder is None and type(source) in (GlobalsSource, ObjectSource) else holder
        if isinstance(mapping, dict) and mapping.get(name) is value:
            mapping[name] = reader
            _bound.append((mapping, name, value, reader))
    _readers[id(reader)] = reader


def stand_in_cached_method(cls: type, name: str, calls: CachedCalls) -> None:
    """If ``cls`` holds a cached function as the staticmethod or classmethod ``name`` (``@staticmethod``
    over ``@functools.lru_cache``), puts one of a reader noting its calls into ``calls`` in its place on
    the class that defines it until tracing ends."""
    owner = next((klass for klass in cls.__mro__ if name in vars(klass)), None)
    found = None if owner is None else vars(owner)[name]
    if owner is None or not isinstance(found, (staticmethod, classmethod)):
        return
    if type(found.__func__) is not functools._lru_cache_wrapper:
        return
    cached = found.__func__
    calls.watch(cached, f"{owner.__qualname__}.{name}")
    reader = CachedReader(cached, calls)
    stand_in = type(found)(reader)
    setattr(owner, name, stand_in)
    _bound.append((owner, name, found, stand_in))
    _readers[id(reader)] = reader


def is_cached_reader(value) -> bool:
    """Whether ``value`` is a reader standing in for a cached function (not a write of the program's)."""
    return id(value) in _readers


def original(value):
    """The cached function ``value`` stands in for, if it is a reader; else ``value``."""
    return value.cached if id(value) in _readers else value


def put_back_cached() -> None:
    """Puts back the cached functions ``stand_in_cached`` replaced (once no program is traced)."""
    while _bound:
        holder, name, cached, reader = _bound.pop()
        if name is None:
            if holder.cell_contents is reader:
                holder.cell_contents = cached
        elif isinstance(holder, type):
            if vars(holder).get(name) is reader:
                setattr(holder, name, cached)
        elif holder.get(name) is reader:
            holder[name] = cached
    _readers.clear()


def _unseen_hit_error(cached, where: str) -> ThunderNotImplementedError:
    name = getattr(cached, "__qualname__", repr(cached))
    return ThunderNotImplementedError(
        f"thunder_rs.jit: {name}, cached by functools ({where}), is called while traced in a way thunder_rs does "
        "not follow (an item of a dict or list, a functools.partial, a function that returns it) with arguments it "
        "finds in its cache: that call runs no code, and the trace would hold what it returned, where eager calls it "
        f"again on every call (and computes anew after {name}.cache_clear()). Call {name} by its name (a global, a "
        "closure variable or an attribute), or call it outside the jitted function and pass the result in"
    )


def _returns(cached, args, kwargs, result) -> bool:
    try:
        now = cached(*args, **kwargs)
    except Exception:  # noqa: BLE001 (a miss: the compile that follows calls it where the program does)
        return False
    return now is result or (is_simple(result) and type(now) is type(result) and now == result)


def _label(cached, args, kwargs) -> str:
    shown = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs)])
    return f"{getattr(cached, '__qualname__', repr(cached))}({shown})"


def _same_results(calls: tuple) -> tuple:
    """Whether each call returns what it did; every one is made, as eager makes each (a call that
    finds its cache cleared fills it again before the compile that follows)."""
    return tuple([_returns(*call) for call in calls])


def cached_guards(calls: CachedCalls) -> list:
    """One guard on the calls noted by the readers: each cached function still returns what it did.
    Raises where a cached function the program read found arguments in its cache other than through
    a reader: what it returned, the trace holds, and no guard would call it again."""
    for cached, hits, seen, where in calls.watched.values():
        if cached.cache_info().hits - hits > seen:
            raise _unseen_hit_error(cached, where)
    if not calls.results:
        return []
    made = tuple((cached, args, dict(kwargs), result) for (cached, args, kwargs), result in calls.results.items())
    labels = [_label(cached, args, kwargs) for cached, args, kwargs, _ in made]

    def show(same: tuple) -> str:
        return ", ".join(label for label, kept in zip(labels, same) if not kept) or "none"

    label = "the calls of functions cached by functools that return another value than when traced"
    return [StateGuard(label, functools.partial(_same_results, made), (True,) * len(made), show=show)]
