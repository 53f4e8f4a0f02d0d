"""What the callables a program calls carry besides their code: the objects bound to them, and
the arguments a ``functools.partial`` holds, as guards.

A partial's ``keywords`` is a dict that changes in place (``p.keywords["negative_slope"] = 0.2``)
with no attribute of an object written: a guard on the partial by identity, or on the attribute
holding it, does not see it. Each keyword is guarded by its value (equality for numbers and
strings, identity otherwise) and the set of names as one: a keyword changed, added or removed
between calls recompiles, naming it. Its ``args`` is a tuple and its ``func`` read-only.
"""

import functools
import sys
import types

import torch

from thunder_rs.core.state.code_reads import library_module
from thunder_rs.core.state.guards import Guard, ItemSource, NamesGuard, attributes_of, is_simple

#: Code and types: guarded by identity, never followed as state objects.
CODE_TYPES = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    type,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.ModuleType,
)


def guard_partial(guards: dict, partial: functools.partial, label: str, origin: str) -> None:
    """Adds to ``guards`` (keyed as the observer keys them) the keywords of ``partial``, found
    as ``label`` by code at ``origin``."""
    keywords = partial.keywords
    source = ItemSource(keywords, f"{label}.keywords")
    if ("names", id(keywords)) not in guards:
        guards[("names", id(keywords))] = NamesGuard(source, frozenset(keywords), origin)
    for name, value in keywords.items():
        if (source.key, name) not in guards:
            guards[(source.key, name)] = Guard(source, name, value, origin)


def partial_origin(partial: functools.partial) -> str:
    """Where the function a partial calls is defined (its ``file:line``), else its name."""
    code = getattr(partial.func, "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else repr(partial.func)


def bound_objects(fn) -> list:
    """The objects a call of ``fn`` reads beyond its arguments: the instance of a bound method or
    of a callable object, a ``functools.partial``'s arguments, and objects among its default
    arguments (``def f(x, cfg=DEFAULT)``): program state like a module's attributes."""
    found = []
    if isinstance(fn, functools.partial):
        found += [*fn.args, *fn.keywords.values()]
        fn = fn.func
    receiver = getattr(fn, "__self__", None)
    if receiver is not None:
        found.append(receiver)
    elif not isinstance(fn, (types.FunctionType, *CODE_TYPES)):
        found.append(fn)  # a callable object: its __call__ reads ``self``
    fn = getattr(fn, "__func__", fn)
    found += [*(getattr(fn, "__defaults__", None) or ()), *(getattr(fn, "__kwdefaults__", None) or {}).values()]
    return [
        o
        for o in found
        if attributes_of(o) is not None
        and not is_simple(o)
        and not isinstance(o, (torch.Tensor, torch.nn.Module, *CODE_TYPES))
    ]


def program_method(value) -> bool:
    """Whether ``value``, found on a class, is a method of the program's own code (a function,
    classmethod or staticmethod not defined by torch or the standard library)."""
    fn = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
    if not isinstance(fn, types.FunctionType):
        return False
    home = sys.modules.get(fn.__module__ or "")
    return home is not None and not library_module(home)
