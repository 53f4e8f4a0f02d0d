"""How a guard compares the items of a list, dict or set the program read (``guards.Guard``):
by identity, save tensors read per call and objects guarded through their own paths, which
other tensors and other objects of the type may replace."""

import abc
import array
import collections
import copy
import operator
import sys
import types
import weakref
from itertools import chain

import torch

#: Containers that change in place, which no write counter sees: their guards check every call.
#: Their subclasses too (``Counter``, ``defaultdict``, ``OrderedDict``, ``deque``): ``isinstance``.
#: Buffers of numbers too (``bytearray``, ``array.array``: a global one appended to between calls).
#: The weak containers too (a ``WeakKeyDictionary`` cache keyed by a module), compared through the
#: weak references they hold (``members``), which keep nothing alive.
_WEAK = (weakref.WeakKeyDictionary, weakref.WeakValueDictionary, weakref.WeakSet)
#: The standard library's containers that keep their items in plain dicts and lists (``wrapped``),
#: read by its own code (``ChainMap.__getitem__``, ``UserDict.__getitem__``), which the observer does
#: not follow, or by C (``MappingProxyType``): compared by what they hold now (``members``).
WRAPPERS = (collections.ChainMap, collections.UserDict, collections.UserList)
#: A ``memoryview`` of a buffer too (of a ``bytearray`` or shared memory), compared by its bytes.
MUTABLE = (
    *(list, dict, set, collections.deque, bytearray, array.array, memoryview),
    *(*WRAPPERS, types.MappingProxyType, *_WEAK),
)
#: The dicts whose items a program's writes are replayed in (``containers``), read by key as a dict
#: is: ``dict`` and the standard library's subclasses (a ``Counter`` of calls, a ``defaultdict``),
#: whose ``__setitem__`` and ``__delitem__`` are dict's. Other subclasses may define their own.
DICTS = (dict, collections.Counter, collections.OrderedDict, collections.defaultdict)


def members(container) -> tuple:
    """A container's elements (a dict's keys and values, in order); a buffer's bytes (and an
    array's typecode), as numbers below 256, which are the same objects each time they are read; a
    weak container's weak references (and values); a memoryview's bytes; a mapping proxy's keys and
    values; the dicts and lists a ``wrapped`` container keeps and the members of each."""
    if isinstance(container, dict):
        return tuple(chain.from_iterable(container.items()))
    if isinstance(container, _WEAK):
        data = vars(container)["data"]  # (its store: the stubs do not declare it)
        return tuple(chain.from_iterable(data.items())) if isinstance(data, dict) else tuple(data)
    if isinstance(container, array.array):
        return (container.typecode, *memoryview(container).cast("B"))
    if isinstance(container, memoryview):
        return tuple(container.tobytes())
    if isinstance(container, types.MappingProxyType):
        return tuple(chain.from_iterable(container.items()))
    inner = wrapped(container)
    if inner is not None:  # (the count of dicts and lists, those, then each one's count and members)
        held = [members(m) if isinstance(m, MUTABLE) else () for m in inner]
        return (len(held), *inner, *chain.from_iterable((len(h), *h) for h in held))
    return tuple(container)


def wrapped(container) -> list | None:
    """The plain dicts and lists a ``WRAPPERS`` container, a ``queue.Queue`` or a ``configparser``
    parser keeps its items in (a ``ChainMap``'s list of maps and the maps; a queue's deque, list or
    heap; a parser's defaults and sections), else None."""
    if isinstance(container, collections.ChainMap):
        return [container.maps, *container.maps]
    if isinstance(container, (collections.UserDict, collections.UserList)):
        return [container.data]
    queues = sys.modules.get("queue")  # (a ``queue.Queue``'s deque or list: ``put`` is stdlib code)
    if queues is not None and isinstance(container, queues.Queue):
        return [vars(container)["queue"]]
    parsers = sys.modules.get("configparser")  # (none made unless it was imported)
    if parsers is not None and isinstance(container, parsers.RawConfigParser):
        found = vars(container)
        return [found["_defaults"], found["_sections"], *found["_sections"].values()]
    return None


def changes_in_place(value) -> bool:
    """Whether ``value`` is a container whose guard checks its items every call (``MUTABLE``, a parser)."""
    t = type(value)
    if t not in _BUILTINS:
        return _changes_in_place(value)
    if _ANSWERS_TOKEN[0] != abc.get_cache_token():  # (an ABC of ``MUTABLE`` may have registered one)
        _ANSWERS.clear()
        _ANSWERS_TOKEN[0] = abc.get_cache_token()
    found = _ANSWERS.get(t)
    if found is None:
        found = _ANSWERS[t] = _changes_in_place(value)
    return found


def _changes_in_place(value) -> bool:
    return isinstance(value, MUTABLE) or (not isinstance(value, (str, int, float)) and wrapped(value) is not None)


#: Builtin classes whose instances cannot claim another class (``__class__``, which ``isinstance``
#: reads) and which no program can change: ``changes_in_place`` of one of their instances is that
#: of any other, while no ABC registers a class (``abc.get_cache_token``; ``UserDict.register(int)``
#: would make ints one). Each ``isinstance`` of an ABC of ``MUTABLE`` runs Python (``ABCMeta``'s):
#: 4 us a value, 300 values of a GPT-2 compile's guards (functions, flags, names, numbers).
_BUILTINS = frozenset(
    (bool, int, float, complex, str, bytes, type(None), type, tuple, frozenset, list, dict, set, range, slice)
    + (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.CodeType)
)
_ANSWERS: dict = {}
_ANSWERS_TOKEN: list = [None]


def has_item(container, key) -> bool:
    """Whether ``container[key]`` reads an item: a dict's key, a list's or tuple's index."""
    if type(container) in DICTS:
        return key in container
    return type(key) is int and -len(container) <= key < len(container)


def container_copy(value):
    """What a guard keeps of an attribute to compare by content: a copy of a container."""
    t = type(value)
    if t in (list, dict, set):
        return t(value)
    if isinstance(value, memoryview):  # (which no copy makes: its bytes, which it equals while they hold)
        return value.tobytes()
    return copy.copy(value) if isinstance(value, MUTABLE) else value  # Counter, deque, a list subclass


def same_attributes(now: dict, found: dict) -> bool:
    """Whether an object's attributes ``now`` equal those kept by ``container_copy``."""
    try:
        return now == found
    except Exception:  # noqa: BLE001 (a tensor attribute replaced by another compares elementwise)
        return False


def same_items(container, expected: tuple) -> bool:
    """Whether ``container`` holds the very objects ``expected`` (compared by identity)."""
    now = members(container)
    return len(now) == len(expected) and all(map(operator.is_, now, expected))


def same_entries(now: dict, before: dict) -> bool:
    """Whether the dicts ``now`` and ``before`` hold the same keys in the same order, each with
    the very same value: a fast answer (in C) for the scans of a module's or namespace's entries
    that look for any that changed, where most often none did."""
    return (
        len(now) == len(before)
        and list(now) == list(before)  # (keys: strings, compared by identity first)
        and all(map(operator.is_, now.values(), before.values()))
    )


#: Stands for a tensor read per call among a container's items (``Guard``'s ``held``).
ANY_TENSOR = type("AnyTensor", (), {"__repr__": lambda self: "<any tensor>"})()


class SameType:
    """Stands for an object among a container's items that is guarded through its own path:
    matches any object of exactly its type (``Guard``'s ``reached``)."""

    __slots__ = ("type",)

    def __init__(self, t: type):
        self.type = t

    def __repr__(self):
        return f"<any {self.type.__name__}>"


def same_held_items(container, expected: tuple) -> bool:
    """``same_items``, where ``ANY_TENSOR`` among ``expected`` matches any tensor, a
    ``SameType`` any object of its type, and a string or int an equal one."""
    now = members(container)
    return len(now) == len(expected) and all(
        a is b
        or (b is ANY_TENSOR and isinstance(a, torch.Tensor))
        or (type(b) is SameType and type(a) is b.type)
        or (type(b) in (str, int) and type(a) is type(b) and a == b)  # a new dict's keys
        for a, b in zip(now, expected)
    )
