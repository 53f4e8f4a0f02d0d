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
one of a reader (``stand_in_cached_method``). One guard (``cached_guards``), last among the
entry's, makes each of those calls on every call of the compiled program, as eager does (so a
cleared cache is filled again outside any trace), and holds while each returns the same object
(an equal plain value). A changed result compiles again, and the new trace holds it.

A call with plain arguments that misses (a causal mask, a rotary table for a new length) runs as
eager runs it, outside the trace (``set_eager_caller``): the cache keeps the real tensor eager
keeps, and the trace holds it as it holds one found there. A symbolic size among its arguments is
specialised first (the entry serves that length; another compiles again), as torch.compile does
for a value it passes to a function it does not trace. Eager makes each call once per call of the
program; the compiled call's guards, its miss reason and the traces of a compile share the calls
of one program call (``made_call``), so ``cache_info()`` counts what eager's does.

A function of the standard library that a stand-in replaces while programs are traced (``time``'s
clocks and ``os.urandom``, which refuse to be read by the program; ``warnings.warn``, which records
the warning: ``acquisition.stdlib_state`` registers each, ``register_stand_in``) is looked up where
the program found it, not in its module, when the program bound it before (``from time import
perf_counter``, ``from warnings import warn``: a global, a closure cell, an object's or a module's
attribute): ``stand_in_cached`` puts its stand-in there too, as a cached function's reader.

Each cached function the program reads is watched (``CachedCalls``): a call that found its
arguments in the cache other than through a reader (an item of a dict, a ``functools.partial``)
is refused naming where it was read, once the trace is made.
"""

import functools
import sys
import threading
import types

import torch

from thunder_rs.core.base.proxies import SymbolicSize
from thunder_rs.core.state.guards import CellSource, GlobalsSource, InputSource, ObjectSource, StateGuard, is_simple
from thunder_rs.core.state.hook import thread_state
from thunder_rs.core.state.identity import READER_CODES
from thunder_rs.errors import ThunderNotImplementedError

#: ``(holder, name, cached, reader)`` where a reader stands in for a cached function: ``holder`` a
#: dict (globals, an instance's attributes), a closure cell with ``name`` None, or a class whose
#: ``name`` held the staticmethod or classmethod ``cached`` (``reader``: the one put in its place)
_bound: list = []
#: id of a reader put in place -> ``(the reader, the function it stands in for)``
_readers: dict = {}
#: id of a standard library function -> its stand-in while traced (``register_stand_in``)
_stdlib: dict = {}
#: id of such a stand-in -> the function it stands in for
_stdlib_readers: dict = {}


class CachedCalls:
    """What one trace's readers saw: ``results``, ``(cached, args, kwargs)`` -> what the call
    returned, and ``order``, those keys in the order the calls were made (each call again); ``watched``,
    id -> ``[cached, its cache's hits when the program read it, how many of them the readers made, where
    it was read]`` for each cached function the program read (a hit made otherwise, through a path no
    reader stands in, is refused: ``cached_guards``); ``codes``, the observer's code -> cached function
    (a call that misses is seen: ``identity.cached_call``)."""

    def __init__(self, codes: dict):
        self.results: dict = {}
        self.order: list = []
        self.counts: dict = {}  # (the calls with plain arguments made so far, by their key)
        self.watched: dict = {}
        self.codes = codes
        self.misses: dict = {}  # (id -> the cache's misses when its code last ran: ``identity.cached_call``)

    def watch(self, cached, where: str) -> None:
        self.codes[getattr(cached.__wrapped__, "__code__", None)] = cached
        self.misses.setdefault(id(cached), cached.cache_info().misses)
        if id(cached) not in self.watched:
            self.watched[id(cached)] = [cached, cached.cache_info().hits, 0, where]


class CachedReader:
    """Calls ``cached`` and notes into ``calls`` (a ``CachedCalls``) each call whose arguments are
    plain values, or, where the call found them in the cache, objects of lasting state
    (``_lasting``); one that found other objects there is refused naming the line. A call with plain
    arguments runs as eager runs it (``_EAGER``): one that misses computes real tensors and keeps them
    in the cache, where the trace then holds them as it holds those of a hit. A symbolic size among
    the arguments is specialised to its value first, as ``hash`` in the cache's lookup would."""

    def __init__(self, cached, calls: CachedCalls):
        self.cached, self.calls = cached, calls
        functools.update_wrapper(self, cached)
        del self.__wrapped__  # (read through ``__getattr__``: the function past the cache, as eager's)

    def __call__(self, *args, **kwargs):
        # (Called by a cached function's code that runs eagerly, or by another thread than the one
        # tracing: as eager calls it. No cache at all, ``maxsize=0``: the function, traced as any other.)
        if _made.eager or thread_state.observer is None or self.cached.cache_info().maxsize == 0:
            return self.cached(*args, **kwargs)
        concrete = tuple(map(_concrete, args)), {k: _concrete(v) for k, v in kwargs.items()}
        plain = all(_plain(v) or _held_object(v) for v in (*concrete[0], *concrete[1].values()))
        if plain:
            args, kwargs = concrete
        key = (self.cached, args, tuple(kwargs.items()))
        hits = self.cached.cache_info().hits
        if plain:
            self.calls.counts[key] = n = self.calls.counts.get(key, -1) + 1
            result = made_call(self.cached, args, kwargs, n, self._eagerly)
        else:
            result = self.cached(*args, **kwargs)
        hit = self.cached.cache_info().hits - hits  # (a miss's own calls of it too, made as eager's)
        if hit and (watched := self.calls.watched.get(id(self.cached))) is not None:
            watched[2] += hit if plain else 1
        if not plain:
            if not hit:  # (its code ran in the trace)
                return result
            if not all(_plain(v) or _lasting(v) for v in (*args, *kwargs.values())):
                raise _held_result_error(self.cached, sys._getframe(1))
        self.calls.results.setdefault(key, result)
        self.calls.order.append(key)
        return result

    def _eagerly(self, cached, args: tuple, kwargs: dict):
        """The call, made as eager makes it; one that misses and draws random numbers, or returns a
        tensor with an autograd history, is refused naming the caller's line."""
        _made.eager += 1
        try:
            result, drew = _EAGER[0](cached, args, kwargs)
        finally:
            _made.eager -= 1
        problem = "draws random numbers" if drew else _graph_in(result)
        if problem:
            self.cached.cache_clear()
            raise _eager_miss_error(self.cached, sys._getframe(3), problem)
        return result

    def __getattr__(self, name):  # (``cache_info``, ``cache_clear``, ``__wrapped__``)
        return getattr(self.cached, name)


#: ``[call(fn, args, kwargs) -> (result, whether it drew random numbers)]``: a call made as eager
#: makes it in the middle of a trace (no recording, no torch function handling, the observer not
#: watching), set by ``core.lang`` (``set_eager_caller``)
_EAGER: list = [None]


def set_eager_caller(call) -> None:
    _EAGER[0] = call


#: How many program calls began (``core.run`` counts each one): the calls of cached functions one
#: makes are shared by its guards and traces (``made_call``), not by the next one.
PROGRAM_CALLS = [0]


class _Made(threading.local):
    """Per thread, the calls of cached functions the program call in progress (``epoch``) made:
    id of the cached function -> ``[its cache_info() after the last of them, {(args, kwargs, n):
    what the n-th call with those arguments returned}, the function]``; ``eager``, how deep the
    thread is in a call made as eager makes it (``CachedReader._eagerly``)."""

    epoch = -1
    eager = 0

    def __init__(self):
        self.by_function: dict = {}


_made = _Made()


def made_call(cached, args: tuple, kwargs: dict, n: int, call):
    """What the ``n``-th call of ``cached`` with these arguments returns in this program call: eager
    makes it once, where the compiled call's guards of several entries, the miss reason and the
    traces of a compile ask for it. Made (``call(cached, args, kwargs)``) when none of them made it,
    or when the cache changed since the last call made here (called otherwise, cleared, or an entry
    evicted by a miss: each might return another object now)."""
    if _made.epoch != PROGRAM_CALLS[0]:
        _made.epoch, _made.by_function = PROGRAM_CALLS[0], {}
    info = cached.cache_info()
    known = _made.by_function.get(id(cached))
    if known is None or known[0] != info:
        known = _made.by_function[id(cached)] = [info, {}, cached]
    key = (args, tuple(kwargs.items()), n)
    if key in known[1]:
        return known[1][key]
    result = call(cached, args, kwargs)
    after = cached.cache_info()
    if after.misses > info.misses and after.currsize <= info.currsize:  # (an entry evicted)
        known[1].clear()
    known[0] = after
    known[1][key] = result
    return result


def _concrete(value):
    """``value`` with the trace's symbolic sizes and floats in it specialised to their values (a
    plain int, a float, a ``torch.Size`` of ints), as eager passes them; other values as they are."""
    kind = type(value).__name__
    if kind == "SymInt":
        return int(value)
    if kind == "SymFloat":
        return value.value()  # (a ``numpy.float64`` where the caller passed one)
    if isinstance(value, tuple) and type(value) in (tuple, torch.Size, SymbolicSize):
        items = tuple(map(_concrete, value))
        return tuple(items) if type(value) is tuple else torch.Size(items)
    return value


def _graph_in(result) -> str:
    """What of a cached call's result the trace cannot hold as eager's: a tensor with an autograd
    history (a backward through it reaches what made it, once), in it or in its lists and tuples."""
    items = result if type(result) in (tuple, list) else (result,)
    if any(isinstance(t, torch.Tensor) and t.grad_fn is not None for t in items):
        return "returns a tensor with an autograd history (computed from tensors that require grad)"
    return ""


def _eager_miss_error(cached, caller, problem: str) -> ThunderNotImplementedError:
    name = getattr(cached, "__qualname__", repr(cached))
    return ThunderNotImplementedError(
        f"thunder_rs.jit: {name}, cached by functools.lru_cache, is called at {caller.f_code.co_filename}:"
        f"{caller.f_lineno} with arguments it has not cached, and {problem}: a compiled program holds what it "
        f"returned, which it cannot reproduce as eager does (thunder_rs cleared its cache). Call {name} outside "
        "the jitted function and pass the result in, or call its __wrapped__ there (computed by every call)"
    )


class CachedMethodReader(CachedReader):
    """A reader standing in on its class for a method cached by functools: bound as the method is."""

    def __get__(self, instance, owner=None):
        return self if instance is None else types.MethodType(self, instance)


READER_CODES.add(CachedReader.__call__.__code__)


def _plain(value) -> bool:
    """Whether a call's argument can be kept by the guard: a plain value, or a class (``cls``)."""
    return is_simple(value) or isinstance(value, type)


def _held_object(value) -> bool:
    """Whether ``value`` is an object of lasting state other than a module (a helper object whose
    method is cached, keyed by it: the same object on every call, which the entry's guards hold; a
    module is traced as a copy, another key)."""
    return not isinstance(value, torch.nn.Module) and not isinstance(value, torch.Tensor) and _lasting(value)


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


def stand_in_cached(source, name: str, value, calls: CachedCalls, holder=None, origin: str = "", handed=None) -> None:
    """If ``value``, read as ``name`` at ``source`` (by the code at ``origin``), is a cached function
    held by a globals dict, a closure cell or an object's attributes, puts a reader noting its calls
    into ``calls`` there until tracing ends; one held otherwise (an item of a dict, a partial's) is
    watched only. ``holder``: the instance dict the program reads instead of the source's (a clone's).
    A standard library function registered here (``register_stand_in``) gets its stand-in there; any
    other, the one ``handed()`` makes, if any (``handed_effects.bound_stand_in``: ``emit = f.write``)."""
    if type(value) is functools.partial and type(value.func) is functools._lru_cache_wrapper:
        calls.watch(value.func, f"held by the partial {source.describe(name)}, read at {origin}")
    stand_in = _stdlib.get(id(value))
    if stand_in is None and handed is not None:
        stand_in = handed()
    if stand_in is not None:  # (``from time import perf_counter``, ``from warnings import warn``)
        _stand_in(source, name, value, stand_in, holder)
    if type(value) is not functools._lru_cache_wrapper:
        return
    calls.watch(value, f"{source.describe(name)}, read at {origin}")
    _stand_in(source, name, value, CachedReader(value, calls), holder)


def register_stand_in(real, stand_in) -> None:
    """While a program is traced, ``stand_in`` replaces ``real``, a function of the standard library,
    on its module (``acquisition.stdlib_state``) and, where the program bound ``real`` before
    (``from time import perf_counter``, which tracing would read once), at that name too."""
    _stdlib[id(real)] = stand_in
    _stdlib_readers[id(stand_in)] = real


def forget_stand_in(real) -> None:
    """``real`` has no stand-in any more (one made again for each tracing: ``cuda_state``'s)."""
    stand_in = _stdlib.pop(id(real), None)
    if stand_in is not None:
        _stdlib_readers.pop(id(stand_in), None)


def _stand_in(source, name: str, value, reader, holder) -> None:
    """Puts ``reader`` in place of ``value`` where ``name`` holds it (``stand_in_cached``)."""
    if holder is None and isinstance(source, CellSource):
        source.cell.cell_contents = reader
        _bound.append((source.cell, None, value, reader))
    else:
        mapping = source.fixed() if holder is None and type(source) in (GlobalsSource, ObjectSource) else holder
        if isinstance(mapping, dict) and mapping.get(name) is value:
            mapping[name] = reader
            _bound.append((mapping, name, value, reader))
    _readers[id(reader)] = (reader, value)


def stand_in_cached_method(cls: type, name: str, calls: CachedCalls) -> None:
    """If ``cls`` holds a cached function as the staticmethod or classmethod ``name`` (``@staticmethod``
    over ``@functools.lru_cache``), puts one of a reader noting its calls into ``calls`` in its place on
    the class that defines it until tracing ends."""
    owner = next((klass for klass in cls.__mro__ if name in vars(klass)), None)
    found = None if owner is None else vars(owner)[name]
    if owner is not None and type(found) is functools._lru_cache_wrapper and not issubclass(cls, torch.nn.Module):
        calls.watch(found, f"{owner.__qualname__}.{name}")  # (a method keyed by its object: ``self.table(n)``)
        method = CachedMethodReader(found, calls)
        setattr(owner, name, method)
        _bound.append((owner, name, found, method))
        _readers[id(method)] = (method, found)
        return
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
    _readers[id(reader)] = (reader, cached)


def is_stand_in(value) -> bool:
    """Whether ``value`` is a reader standing in for a cached function or a standard library's
    function while traced (not a write of the program's)."""
    return id(value) in _readers or id(value) in _stdlib_readers


def holds_stand_in(values) -> bool:
    """Whether any of ``values`` is a reader (``is_stand_in``)."""
    ids = list(map(id, values))
    return not (_readers.keys().isdisjoint(ids) and _stdlib_readers.keys().isdisjoint(ids))


def original(value):
    """The function ``value`` stands in for, if it is a reader (``is_stand_in``); else ``value``."""
    found = _readers.get(id(value))
    return found[1] if found is not None else _stdlib_readers.get(id(value), value)


def put_back_cached() -> None:
    """Puts back the functions ``stand_in_cached`` replaced (once no program is traced)."""
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


def _returns(cached, args, kwargs, result, n: int) -> bool:
    try:
        now = made_call(cached, args, kwargs, n, _call)
    except Exception:  # noqa: BLE001 (a miss: the compile that follows calls it where the program does)
        return False
    return now is result or (is_simple(result) and type(now) is type(result) and now == result)


def _call(cached, args: tuple, kwargs: dict):
    return cached(*args, **kwargs)


def _label(cached, args, kwargs) -> str:
    shown = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs)])
    return f"{getattr(cached, '__qualname__', repr(cached))}({shown})"


def _same_results(made: tuple) -> tuple:
    """Whether each call returns what it did (``made``: ``(cached, args, kwargs, result)`` per call,
    in the order the program made them, repeated as it repeated them); every one is made, as eager
    makes each (a call that finds its cache cleared fills it again before the compile that follows),
    once in a program call (``made_call``: ``cache_info()`` counts what eager's do)."""
    seen: dict = {}
    same = []
    for cached, args, kwargs, result in made:
        key = (cached, args, tuple(kwargs.items()))
        seen[key] = n = seen.get(key, -1) + 1
        same.append(_returns(cached, args, kwargs, result, n))
    return tuple(same)


def cached_guards(calls: CachedCalls) -> list:
    """One guard on the calls noted by the readers: each cached function still returns what it did.
    Raises where a cached function the program read found arguments in its cache other than through
    a reader: what it returned, the trace holds, and no guard would call it again."""
    for cached, hits, seen, where in calls.watched.values():
        if cached.cache_info().hits - hits > seen:
            raise _unseen_hit_error(cached, where)
    if not calls.results:
        return []
    made = tuple((key[0], key[1], dict(key[2]), calls.results[key]) for key in calls.order)
    labels = [_label(cached, args, kwargs) for cached, args, kwargs, _ in made]

    def show(same: tuple) -> str:
        return ", ".join(dict.fromkeys(label for label, kept in zip(labels, same) if not kept)) or "none"

    label = "the calls of functions cached by functools that return another value than when traced"
    return [CachedCallsGuard(label, functools.partial(_same_results, made), (True,) * len(made), show=show)]


class CachedCallsGuard(StateGuard):
    """The guard of ``cached_guards``: its check calls the cached functions, as eager calls them,
    so only the check of an entry that may serve the call makes it (not one that compares another
    entry's guards with the call: ``dynamic.held_changes``)."""
