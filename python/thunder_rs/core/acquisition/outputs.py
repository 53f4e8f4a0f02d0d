"""What a compiled call returns: the trace's flat outputs, rebuilt into the program's output.

Registered pytree nodes (tuples, dicts, dataclasses, Hugging Face ``ModelOutput``) are flattened
by torch's pytree and rebuilt per call. A leaf that is some other Python object holding traced
tensors, such as the ``DynamicCache`` a Hugging Face decoder returns as ``past_key_values``, is
rebuilt per call too: its tensors become outputs of the trace, and every call returns a new object
of the same class whose attributes hold that call's tensors, as eager returns a new cache per call.
Returning the trace-time object would hand the caller ``TensorProxy`` stand-ins, the same for
every call. An object the program made (``returned_objects``: a ``SimpleNamespace``, a plain class
instance, a set, also without traced tensors) is made anew by every call too, with new lists,
dicts and objects of its own, as eager makes them; what it found in its state is shared.

Only the objects and containers on a path to a traced tensor are rebuilt (``cls.__new__`` and the
instance dict, as ``copy`` does); everything else they reference (ints, classes, configs,
parameters) is shared, as it is in eager. An object the program was given (an argument) is
returned as each call's own argument; what the program set on it is set again by every call
(``thunder_rs.core.state.state``). So is a list or dict passed as an argument (which the flatten
of the call copied for tracing), which the output holds as the ``argument_containers.ArgumentContainer``
that finds it in each call's arguments. A container the program returns in two places, found in
its state or its arguments, or stored on its state (``returned_identities``) keeps eager's identity:
one object per call, the state's own, or the one the call stored.
"""

import collections
from collections.abc import Callable
import copy
import math
import types

import torch
from torch.utils._pytree import tree_flatten

from thunder_rs.core.acquisition.argument_containers import ArgumentContainer
from thunder_rs.core.acquisition.returned_objects import MadeObjects, base_new, rebuild_kind, refuse_made
from thunder_rs.core.acquisition.returned_objects import MADE_AGAIN, LEAVES, children, is_full, refuse_module_tensors
from thunder_rs.core.acquisition.returned_identities import At, Identities
from thunder_rs.core.state.guards import slot_names
from thunder_rs.core.base.proxies import SymbolicSize, TensorProxy
from thunder_rs.core.lang.symfloat import ARG, OPERATORS, SymFloat
from thunder_rs.core.lang.symint import SymInt
from thunder_rs.errors import ThunderNotImplementedError

_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size)
_PLAIN_TYPES = frozenset(_PLAIN)
#: What a rebuilt object shares with the trace-time one rather than copies (what the walk leaves).
_SHARED = LEAVES


# Template nodes are plain slotted classes, not dataclasses: nothing compares or hashes them
# (templating and ``_build`` go by identity), and a dataclass costs the first compile about 1 ms
# each to generate its methods.


class _Slot:
    """A traced tensor at position ``index`` of the trace's outputs."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


class _Input:
    """The call's own flat input at ``position`` (an object the program was given and returns)."""

    __slots__ = ("position",)

    def __init__(self, position: int):
        self.position = position


class SizesFloat:
    """A float the program computed from sizes alone (a ``SymFloat``: ``T / 2``, ``T ** -0.5``):
    the Python operations it performed, each size a ``_Slot`` of the call's outputs, performed
    again on every call's sizes with Python's own operators and ``math``, so the value is eager's
    bit for bit and the sizes stay symbolic. ``get(outputs)`` is the call's float."""

    __slots__ = ("ops",)

    def __init__(self, ops):
        self.ops = ops

    @staticmethod
    def of(x: SymFloat, flat: list) -> "SizesFloat | float":
        """The per-call float for ``x``, its sizes appended to ``flat`` as outputs; ``x``'s value
        (its sizes specialised) where it reads a float input or is a NumPy scalar."""
        if x.numpy or _reads_float_inputs(x.ops):
            return x.value()
        return SizesFloat(_slotted(x.ops, flat))

    def get(self, outputs) -> float:
        return _evaluated(self.ops, outputs)


def _reads_float_inputs(ops) -> bool:
    if type(ops) is not tuple:
        return False
    return ops[0] == ARG or any(_reads_float_inputs(part) for part in ops[1:])


def _slotted(ops, flat: list):
    """``ops`` with each size expression a ``_Slot`` of ``flat`` (the size appended there)."""
    if type(ops) is tuple:
        return (ops[0], *(_slotted(part, flat) for part in ops[1:]))
    if type(ops) in (int, float):
        return ops
    flat.append(SymInt(ops))
    return _Slot(len(flat) - 1)


def _evaluated(ops, outputs):
    if type(ops) is _Slot:
        return outputs[ops.index]
    if type(ops) is not tuple:
        return ops
    if ops[0] == "neg":
        return -_evaluated(ops[1], outputs)
    if len(ops) == 2:  # a function of ``math`` (``sqrt``, ``log``)
        return getattr(math, ops[0])(_evaluated(ops[1], outputs))
    return OPERATORS[ops[0]](_evaluated(ops[1], outputs), _evaluated(ops[2], outputs))


class _Rebuilt:
    """A container or object rebuilt per call: ``kind`` says how, ``parts`` are its contents."""

    __slots__ = ("kind", "cls", "parts")

    def __init__(self, kind: str, cls: type, parts: tuple):
        self.kind, self.cls, self.parts = kind, cls, parts


class _Templater:
    """Turns an output object into a template: traced tensors become ``_Slot``s (appended to
    ``flat``), containers and objects holding them become ``_Rebuilt``, the rest stays shared.
    An object reached twice gets one template (and is rebuilt once per call)."""

    def __init__(self, flat: list, inputs: dict, made: MadeObjects | None, arguments: dict, identities=None):
        self.flat = flat
        self._inputs = inputs
        self._made = made
        #: the program's own containers behind the traced ones, and which keep their identity
        self._identities: Identities | None = identities
        #: the ``ArgumentContainer`` of each copy of an argument's list or dict, by its id
        self._arguments = arguments
        #: whether the output holds a container of the call's arguments (an ``ArgumentContainer``)
        self.takes_call = False
        self._memo: dict = {}
        self._open: set = set()  # objects being templated
        self._cyclic: set = set()  # of those, the ones referred to from inside themselves

    def __call__(self, x):
        if isinstance(x, TensorProxy) or type(x) is SymInt:  # a size computed per call is an output too
            self.flat.append(x)
            return _Slot(len(self.flat) - 1)
        if type(x) is SymFloat:  # a float of sizes as a result: computed per call (``SizesFloat``)
            return SizesFloat.of(x, self.flat)
        if type(x) is SymbolicSize or (type(x) is torch.Size and any(type(s) is SymInt for s in x)):
            return _Rebuilt("tuple", torch.Size, tuple(map(self, x)))
        if isinstance(x, _SHARED):
            return x
        x = self._arguments.get(id(x), x)  # (an argument's list an object the program made holds)
        if isinstance(x, torch.nn.Module) and self._identities is not None:  # (the clone it ran on: the user's)
            x = self._identities.modules.get(id(x), x)
        if type(x) is ArgumentContainer:
            self.takes_call = True
            return x
        if id(x) in self._inputs:
            return _Input(self._inputs[id(x)])
        ids = self._identities
        o = x if ids is None else ids.origins.get(id(x), x)  # (the program's own container)
        key = id(o)
        if key in self._memo:
            return self._memo[key]
        kept = None if ids is None else ids.kept(o)  # (stored, an argument's, or found in state)
        if kept is not None:
            self._memo[key] = kept
            return kept
        if ids is not None and ids.unplaced(o):
            raise ThunderNotImplementedError(
                f"jit: {self._made.where if self._made else 'the program'} returns a {type(o).__qualname__} it "
                "also stored on its state inside a function (a closure variable of one, or the variable itself); "
                "each compiled call would make it twice, once there and once in what it returns, where eager makes "
                "it once. Return the stored function, or store and return the object apart"
            )
        if key in self._open:  # a cycle: fine unless x turns out to hold traced tensors
            self._cyclic.add(key)
            return x
        self._open.add(key)
        node = self._node(x, o)
        self._open.discard(key)
        if node is not x and key in self._cyclic:
            raise ThunderNotImplementedError(
                f"jit: the program returns a {type(x).__name__} that refers to itself "
                "and holds traced tensors; thunder_rs cannot rebuild cyclic outputs"
            )
        self._memo[key] = node
        return node

    def _node(self, x, o):
        made = self._made is not None and o in self._made
        if type(x) in (list, tuple) or isinstance(x, tuple) and hasattr(x, "_fields"):
            parts = tuple(map(self, x))
            kind = "namedtuple" if hasattr(x, "_fields") else type(x).__name__
            return _Rebuilt(kind, type(x), parts) if made or any(p is not y for p, y in zip(parts, x)) else x
        if isinstance(x, dict):
            parts = tuple((k, self(v)) for k, v in x.items())
            if not made and all(p is x[k] for k, p in parts):
                return x
            if type(x) is collections.defaultdict:  # (``cls(pairs)`` would take the pairs for its factory)
                return _Rebuilt("defaultdict", x.default_factory, parts)
            return _Rebuilt("counter" if type(x) is collections.Counter else "dict", type(x), parts)
        if made:
            return self._made_node(x)
        if isinstance(x, MADE_AGAIN):  # a module or function it found: that same object, as in eager
            return x
        for name in slot_names(type(x)):
            if hasattr(x, name) and self(getattr(x, name)) is not getattr(x, name):
                raise ThunderNotImplementedError(
                    f"jit: the program returns a {type(x).__name__} whose __slots__ hold traced tensors; thunder_rs "
                    "rebuilds returned objects through their instance dict and cannot rebuild this one"
                )
        state = getattr(x, "__dict__", None)
        if state is None:
            return x
        parts = tuple((k, self(v)) for k, v in state.items())
        if all(p is state[k] for k, p in parts):
            return x
        # Rebuilt per call, its own lists, dicts and sets are too (``info={}`` made by each eager call).
        return _Rebuilt("object", type(x), tuple((k, _Copied(p) if type(p) in _MUTABLE else p) for k, p in parts))

    def _made_node(self, x):
        """An object the program made (``returned_objects``), made anew by every call as eager does."""
        made = self._made
        assert made is not None
        kind = rebuild_kind(x)
        if kind == "function":
            return self._function_node(x)
        if kind == "method":  # (the user's module where the program ran on its clone)
            return _Rebuilt("method", types.MethodType, (self(x.__func__), self(x.__self__)))
        if isinstance(x, torch.nn.Module):
            refuse_module_tensors(x, made)
        if kind is None or kind != "object" and any(isinstance(c, TensorProxy) or c in made for c in children(x)):
            refuse_made(x, made)
        if kind != "object":
            return x if kind == "shared" else _Copied(x)
        # (noted before its parts: an object that refers to itself is rebuilt referring to its new self)
        node = self._memo[id(x)] = _Rebuilt("made", type(x), ())
        state = getattr(x, "__dict__", {})
        parts = [(k, self(v), False) for k, v in state.items()]
        parts += [(n, self(getattr(x, n)), True) for n in slot_names(type(x)) if hasattr(x, n)]
        node.parts = tuple(parts)
        return node

    def _function_node(self, f):
        """A function the program made (a lambda, a closure): a new function of its code for each
        call, with new cells for those it made, holding that call's values, as eager makes it."""
        node = self._memo[id(f)] = _Rebuilt("function", f, ())
        cells = tuple(self._cell(c, f) for c in f.__closure__ or ())
        state = tuple((k, self(v)) for k, v in vars(f).items())
        node.parts = (cells, self(f.__defaults__), self(f.__kwdefaults__), state)
        return node

    def _cell(self, c, f):
        if id(c) in self._memo:  # (a cell two of its functions share)
            return self._memo[id(c)]
        made = self._made
        assert made is not None
        if c in made:
            node = self._memo[id(c)] = _Rebuilt("cell", types.CellType, (_EMPTY,))
            node.parts = (self(c.cell_contents) if is_full(c) else _EMPTY,)
            return node
        if is_full(c) and self(c.cell_contents) is not c.cell_contents:
            code = f.__code__
            raise ThunderNotImplementedError(
                f"jit: {made.where} returns the function {f.__qualname__} ({code.co_filename}:{code.co_firstlineno}) "
                "it made, whose closure shares a variable holding traced values with a function kept elsewhere "
                "(stored on state); thunder_rs cannot make that shared variable anew for each call. Return the "
                "values, or keep the function apart from the one stored"
            )
        return c


_MUTABLE = (list, dict, set)
#: An empty cell's contents (a variable assigned after the closure that reads it was made).
_EMPTY = object()


class _Copied:
    """A list, dict or set without traced tensors in a rebuilt object: a shallow copy per call."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _build(node, outputs, inputs, built: dict):
    """The object ``node`` stands for, with this call's ``outputs`` and ``inputs``; ``built`` keeps
    one object per template node, so an object shared in the trace-time output is shared in each
    call's too."""
    if isinstance(node, _Slot):
        return outputs[node.index]
    if isinstance(node, _Input):
        return inputs[node.position]
    if type(node) is At:  # (after the call's effects: what it stored there, or the call's argument's)
        return node.find(inputs)
    if type(node) is ArgumentContainer:  # (the call's, noted by ``argument_containers.hold_call``)
        return node.object(inputs)
    if isinstance(node, _Copied):
        return copy.copy(node.value)
    if type(node) is SizesFloat:
        return node.get(outputs)
    if not isinstance(node, _Rebuilt):
        return node
    obj = built.get(id(node))
    if obj is not None:
        return obj
    parts = node.parts
    if node.kind in ("list", "tuple"):
        obj = node.cls(_build(p, outputs, inputs, built) for p in parts)
    elif node.kind == "namedtuple":
        obj = node.cls(*(_build(p, outputs, inputs, built) for p in parts))
    elif node.kind == "dict":
        obj = node.cls((k, _build(p, outputs, inputs, built)) for k, p in parts)
    elif node.kind in ("defaultdict", "counter"):
        obj = collections.defaultdict(node.cls) if node.kind == "defaultdict" else collections.Counter()
        dict.update(obj, ((k, _build(p, outputs, inputs, built)) for k, p in parts))
    elif node.kind == "function":
        obj = _new_function(node, outputs, inputs, built)
    elif node.kind == "method":
        obj = types.MethodType(*(_build(p, outputs, inputs, built) for p in parts))
    elif node.kind == "made":
        obj = built[id(node)] = base_new(node.cls)
        for k, p, slot in parts:
            value = _build(p, outputs, inputs, built)
            object.__setattr__(obj, k, value) if slot else obj.__dict__.__setitem__(k, value)
    else:
        obj = node.cls.__new__(node.cls)  # type: ignore[call-overload]  # mypy takes it for type.__new__
        obj.__dict__.update((k, _build(p, outputs, inputs, built)) for k, p in parts)
    built[id(node)] = obj
    return obj


def _new_function(node, outputs, inputs, built: dict):
    """A new function of ``node``'s code (``_Templater._function_node``): its cells made first and
    filled once it exists (a closure may hold the function itself)."""
    f = node.cls
    cells, defaults, kwdefaults, state = node.parts
    closure, pending = [], []
    for c in cells:
        if type(c) is _Rebuilt:
            cell = built.get(id(c))
            if cell is None:
                cell = built[id(c)] = types.CellType()
                pending.append((cell, c.parts[0]))
            c = cell
        closure.append(c)
    defaults = _build(defaults, outputs, inputs, built)
    obj = built[id(node)] = types.FunctionType(
        f.__code__, f.__globals__, f.__name__, defaults, tuple(closure) if f.__closure__ is not None else None
    )
    obj.__kwdefaults__ = _build(kwdefaults, outputs, inputs, built)
    obj.__qualname__ = f.__qualname__
    if f.__annotations__:
        obj.__annotations__ = dict(f.__annotations__)
    obj.__dict__.update((k, _build(p, outputs, inputs, built)) for k, p in state)
    for cell, content in pending:
        if content is not _EMPTY:
            cell.cell_contents = _build(content, outputs, inputs, built)
    return obj


class MadeAgain:
    """An object the program made and stored on its state (``self.last = SimpleNamespace(n=3)``),
    made anew for each call as eager makes it (a ``TracedValue`` part; its tensors in ``extras``)."""

    __slots__ = ("node",)

    def __init__(self, x, stored: Identities, extras: list):
        self.node = _Templater(extras, {}, stored.made_objects, {}, stored)(x)

    def get(self, extras):
        return _build(self.node, extras, (), {})

    def shared(self) -> list:
        """The objects each call's object holds as the call traced them (``RebuiltOutput.shared``)."""
        return _shared_of([self.node])


class PlainOutput:
    """The output structure of a trace whose outputs are tensors and constants in containers."""

    def __init__(self, spec):
        self._spec = spec
        #: what ``unflatten`` returns of the flat outputs, written on its first call
        self._rebuild: Callable | None = None

    def unflatten(self, flat, inputs):
        rebuild = self._rebuild
        if rebuild is None:
            count = self._spec.num_leaves
            rebuild = written_unflatten(self._spec, [None] * count, [(i, i) for i in range(count)])
            rebuild = self._rebuild = rebuild or self._unflattened
        return rebuild(flat)

    def _unflattened(self, flat):
        return self._spec.unflatten(list(flat))


#: The most leaves and levels of nesting a value ``written_unflatten`` writes out has (past them,
#: ``tree_unflatten``: the source would cost more to compile than the calls it saves).
MOST_WRITTEN_LEAVES = 256
_MOST_LEVELS = 16


class Unwritten(Exception):
    """A value ``ValueSource`` does not write out: a node of another type, or too deep."""


class ValueSource:
    """Python source making the value torch's ``tree_unflatten`` makes of ``leaves`` with each of
    ``outputs`` put in (``(leaf index, where a call's values e hold it)``, or ``(leaf index, an
    object whose get(e) makes it)``; a torch.Size of those of type ``sized``): ``expression(spec)``
    as one display of tuples, lists and dicts, the leaves taken in order, the constants it names
    in ``scope``."""

    def __init__(self, leaves: list, outputs: list, sized: type | None = None):
        self.leaves, self.at, self.sized = leaves, dict(outputs), sized
        self.scope: dict = {"Size": torch.Size}
        #: the index of the next leaf
        self.next = 0

    def named(self, value) -> str:
        name = f"c{len(self.scope)}"
        self.scope[name] = value
        return name

    def constant(self, node):
        """The constant the leaf ``node`` (the next) holds, or ``Unwritten`` where it is none (an
        output, or not a leaf), not taken then."""
        if not node.is_leaf() or self.next in self.at:
            return Unwritten
        return self.leaves[self.next]

    def expression(self, node, level: int = 0) -> str:
        if node.is_leaf():
            i = self.next
            self.next += 1
            if i not in self.at:
                return self.named(self.leaves[i])
            output = self.at[i]
            if type(output) is int:
                return f"e[{output}]"
            got = f"{self.named(output)}.get(e)"
            return f"Size({got})" if type(output) is self.sized else got
        if level >= _MOST_LEVELS or node.type not in (tuple, list, dict):
            raise Unwritten
        items = [self.expression(child, level + 1) for child in node.children()]
        if node.type is dict:  # (torch's unflatten: ``dict(zip(keys, values))``, in the spec's key order)
            return "{" + ", ".join(f"{self.named(k)}: {v}" for k, v in zip(node.context, items)) + "}"
        if node.type is list:
            return f"[{', '.join(items)}]"
        return f"({', '.join(items)},)" if items else "()"

    def function(self, lines: list):
        """The function ``lines`` (its body) make of a call's values ``e``."""
        source = "def written(e):\n" + "".join(f"    {line}\n" for line in lines)
        exec(compile(source, "<thunder_rs written value>", "exec"), self.scope)
        return self.scope["written"]


def written_unflatten(spec, leaves: list, outputs: list, sized: type | None = None):
    """A function of a call's values ``e`` that makes what torch's ``tree_unflatten(leaves, spec)``
    makes with each of ``outputs`` put in (``ValueSource``), written as one display where the nodes
    are tuples, lists and dicts (what every call rebuilds, returns, prints or writes into an
    argument container: torch's unflatten costs ~1 us a node); None for another node type."""
    if spec.num_leaves > MOST_WRITTEN_LEAVES:
        return None
    source = ValueSource(leaves, outputs, sized)
    try:
        return source.function([f"return {source.expression(spec)}"])
    except Unwritten:
        return None


class RebuiltOutput:
    """The output structure of a trace whose outputs include objects rebuilt per call, or the
    call's own input objects: ``unflatten(flat_outputs, inputs)`` gives what the program returned,
    with this call's tensors and objects."""

    def __init__(self, spec, leaves: list, takes_call: bool = False):
        self._spec = spec
        self._leaves = leaves
        #: whether it returns containers of the call's arguments (``Entry.call_args``)
        self.takes_call = takes_call

    def unflatten(self, flat, inputs):
        built: dict = {}
        return self._spec.unflatten([_build(leaf, flat, inputs, built) for leaf in self._leaves])

    def shared(self) -> list:
        """The objects every call returns as the call traced returned them (holding no traced tensor)."""
        return _shared_of(self._leaves)


def _shared_of(templates) -> list:
    """The objects that ``templates`` build as the call traced them, in every call: those they
    hold as they are or copy (a function rebuilt per call holds its cells' contents so)."""
    found: list = []
    seen: set = set()

    def walk(node):
        if isinstance(node, _Rebuilt):
            if id(node) not in seen:  # (a made object that refers to itself is one node)
                seen.add(id(node))
                for part in _parts_of(node):
                    walk(part)
        elif isinstance(node, _Copied):
            found.append(node.value)
        elif not isinstance(node, (_Slot, _Input, ArgumentContainer, At, SizesFloat)) and node is not _EMPTY:
            found.append(node)

    for template in templates:
        walk(template)
    return found


def _parts_of(node: _Rebuilt) -> tuple:
    """The templates a rebuilt object is made of."""
    if node.kind in ("list", "tuple", "namedtuple", "method", "cell"):
        return node.parts
    if node.kind == "function":
        cells, defaults, kwdefaults, state = node.parts
        return (*cells, defaults, kwdefaults, *(p for _, p in state))
    return tuple(part[1] for part in node.parts)


def is_size(x) -> bool:
    return type(x) is torch.Size or type(x) is SymbolicSize


def _is_proxy_holder(leaf) -> bool:
    # (exactly a plain type: a subclass of one, a ``numpy.float64`` or an ``IntEnum``, is returned as
    # the object it is, where the trace would return the plain value)
    return type(leaf) not in _PLAIN_TYPES and not isinstance(leaf, torch.Tensor)


def flatten_output(out, inputs: list, made: MadeObjects | None = None, arguments: dict | None = None, identities=None):
    """The trace's flat outputs for the program's output ``out``, and how to rebuild ``out`` from
    them on each call (an object with ``unflatten(flat, inputs)``). ``inputs`` are the call's flat
    inputs: an output object among them is returned as the later call's own input. ``made``: the
    objects the program made among those it returns (``returned_objects``), made anew by each call.
    ``arguments``: the copies of the arguments' lists and dicts tracing made, by id, each the
    ``ArgumentContainer`` finding the call's own (``TracedContainers.copies``). ``identities``:
    the containers that keep their identity (``returned_identities``), templated apart."""
    # A torch.Size is kept whole (torch's pytree would rebuild it as a plain tuple); the shapes of
    # a cache entry are fixed, so it is returned as the trace found it.
    # (torch's flatten keeps its ``is_leaf`` in a reference cycle until a collection: the identities,
    # which hold the traced output, are dropped from it after, or the escape check finds its proxies held)
    held = [identities.special] if identities is not None else []
    leaves, spec = tree_flatten(out, is_leaf=is_size if not held else lambda x: is_size(x) or held[0](x))
    held.clear()
    if not any(_is_proxy_holder(leaf) or is_size(leaf) for leaf in leaves):
        return tuple(leaves), PlainOutput(spec)
    given = {id(x): i for i, x in enumerate(inputs) if _is_proxy_holder(x)}
    flat: list = []
    template = _Templater(flat, given, made, arguments or {}, identities)
    templates = []
    for leaf in leaves:
        if is_size(leaf) and any(type(s) is SymInt for s in leaf):
            templates.append(template(leaf))
        elif is_size(leaf):
            templates.append(leaf)
        elif not _is_proxy_holder(leaf):
            templates.append(_Slot(len(flat)))
            flat.append(leaf)
        else:
            templates.append(template(leaf))
    return tuple(flat), RebuiltOutput(spec, templates, template.takes_call)


def as_written(out, written: dict):
    """``out`` with each tensor of ``written`` (captured tensors the program wrote in place, by id:
    ``Captures.written``) among its leaves replaced by the proxy of its final value, as a written
    input is returned: the write-backs return the captured tensor itself after copying that value
    into it (``return self.acc`` after ``self.acc.add_(x)``), where the trace would return the
    tensor as a constant, outside the write-backs and autograd's view of the call."""
    if not written:
        return out
    leaves, spec = tree_flatten(out, is_leaf=is_size)
    found = [written.get(id(leaf)) if _is_real(leaf) else None for leaf in leaves]
    if not any(p is not None for p in found):
        return out
    return spec.unflatten([leaf if p is None else p for leaf, p in zip(leaves, found)])


def _is_real(x) -> bool:
    return isinstance(x, torch.Tensor) and not isinstance(x, TensorProxy)


def is_plain(out) -> bool:
    """Outputs the generated code can return as they are: a leaf, or a flat tuple/list of leaves."""
    leaf = lambda x: isinstance(x, torch.Tensor) or type(x) in (bool, int, float) or x is None  # noqa: E731
    return leaf(out) or (type(out) in (tuple, list) and all(leaf(x) for x in out))
