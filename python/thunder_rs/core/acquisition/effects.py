"""Python side effects of a traced program that every call repeats: ``print``, attributes it
sets on its modules and on the Python objects it reads as state, and items it sets in lists and
dicts of its arguments.

``print`` cannot be seen through ``__torch_function__``. While a program is traced, the
``print`` it calls is recorded instead of run (``builtins.print`` is wrapped once, on the first
trace; the wrapper prints as before in every other case). Tensors among the arguments become
extra outputs of the trace, and the compiled call prints after running, with that call's values.
Text that already holds a formatted stand-in (``print(f"{loss}")``) cannot be printed with later
values: that is refused with an error naming the line. Text of symbolic sizes made only to be
printed (``print(f"T={x.shape[1]}")``) holds placeholders that every call fills with its sizes
(``core.lang.printed_text``).
"""

import builtins
import contextvars
import weakref
from collections.abc import Callable

import torch
from torch.utils import _pytree as pytree

from thunder_rs.core.acquisition.argument_containers import ArgumentContainer, Old, held_call, merge_contents
from thunder_rs.core.acquisition.written_only import replay
from thunder_rs.core.state.guards import MISSING, InputSource
from thunder_rs.core.lang.langctx import user_location
from thunder_rs.core.lang.printed_text import Text, at_hints, formatting, resolved, stop_formatting
from thunder_rs.core.state.observe import thread_state
from thunder_rs.core.acquisition.outputs import MOST_WRITTEN_LEAVES, MadeAgain, Unwritten, ValueSource, is_size
from thunder_rs.core.acquisition.outputs import SizesFloat, written_unflatten
from thunder_rs.core.base.proxies import SymbolicSize, TensorProxy
from thunder_rs.core.lang.symfloat import SymFloat
from thunder_rs.core.lang.symint import SymInt
from thunder_rs.errors import ThunderNotImplementedError

_prints: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_prints", default=None)
_builtin_print = builtins.print


def _print(*args, **kwargs):
    recorded = _prints.get()
    if recorded is None or thread_state.inside:
        if recorded is not None:  # (text of sizes it formats holds placeholders: their values)
            args, kwargs = at_hints((args, kwargs))
        return _builtin_print(*args, **kwargs)
    texts = pytree.tree_leaves((args, kwargs))
    refuse_formatted(texts, "print: the text printed", user_location(), "pass the tensor to print as an argument")
    recorded.append(resolved((args, kwargs)))
    return None


def refuse_formatted(texts, what: str, site: str, instead: str) -> None:
    """Refuses text the program prints, writes or logs (a string among ``texts``) that formats a
    traced tensor: its proxy's text, which a compiled call would repeat where eager formats each
    call's values. ``what`` names the text, ``site`` where it is made, ``instead`` what to do."""
    if any(isinstance(text, str) and "TensorProxy(t" in text for text in texts):
        raise ThunderNotImplementedError(
            f"{what} at {site} formats a traced tensor (an f-string or str() of it), which a compiled call cannot "
            f"make with later values; {instead}"
        )


def recording_prints(prints: list):
    """Records the program's ``print`` calls into ``prints`` while the returned token is set."""
    if builtins.print is not _print:
        builtins.print = _print
    return _prints.set(prints), formatting([])


def stop_recording_prints(token) -> None:
    _prints.reset(token[0])
    stop_formatting(token[1])


def recorded_effects() -> list | None:
    """The list the program's ``print`` calls are recorded into while it is traced (else None):
    other effects made in program order (``stdlib_state``: logging, ``warnings.warn``) go there
    too, as objects with ``effect(extras)`` giving what each call applies."""
    return _prints.get()


def print_effects(prints: list, extras: list) -> list:
    """The effects of the recorded ``prints`` (and other effects recorded among them), in order."""
    return [PrintCall(p[0], p[1], extras) if type(p) is tuple else p.effect(extras) for p in prints]


class TracedValue:
    """A Python value that may hold tensors the trace computed and symbolic sizes (in lists,
    tuples, dicts): each is an extra output of the trace, and ``get(extras)`` rebuilds the value
    with a call's tensors and sizes."""

    __slots__ = ("leaves", "spec", "outputs", "rebuild")

    def __init__(self, value, extras: list, kept: dict | None = None, made=None):
        #: ``rebuild(extras)``: what ``get`` returns, written on its first call (``written_unflatten``)
        self.rebuild: Callable | None = None
        leaves, self.spec = pytree.tree_flatten(value, is_leaf=is_size)
        self.outputs: list[tuple[int, "int | TracedValue | TracedText | MadeAgain | SizesFloat"]] = []
        for i, leaf in enumerate(leaves):
            if kept and id(leaf) in kept:  # a captured tensor as it is: that same object
                leaves[i] = kept[id(leaf)]
            elif kept and type(leaf) is weakref.ref and id(leaf()) in kept:  # nn.LSTM's _flat_weight_refs
                leaves[i] = weakref.ref(kept[id(leaf())])
            elif isinstance(leaf, TensorProxy) or type(leaf) is SymInt:  # a size: this call's value
                extras.append(leaf)
                self.outputs.append((i, len(extras) - 1))
                leaves[i] = None
            elif type(leaf) is SymbolicSize:  # a shape with symbolic sizes: this call's torch.Size
                self.outputs.append((i, TracedValue(tuple(leaf), extras)))
                leaves[i] = None
            elif type(leaf) is SymFloat:  # a float of sizes: computed per call (``SizesFloat``)
                leaves[i] = SizesFloat.of(leaf, extras)
                if type(leaves[i]) is SizesFloat:
                    self.outputs.append((i, leaves[i]))
                    leaves[i] = None
            elif type(leaf) is Text:  # printed text of sizes: this call's
                self.outputs.append((i, TracedText(leaf, extras)))
                leaves[i] = None
            elif made is not None and made.made(leaf):  # an object the program made: each call's own
                self.outputs.append((i, MadeAgain(leaf, made, extras)))
                leaves[i] = None
        self.leaves = leaves

    def get(self, extras):
        rebuild = self.rebuild
        if rebuild is None:
            rebuild = written_unflatten(self.spec, self.leaves, self.outputs, TracedValue)
            rebuild = self.rebuild = rebuild or self._unflattened
        return rebuild(extras)

    def _unflattened(self, extras):
        if not self.outputs:
            return pytree.tree_unflatten(self.leaves, self.spec)
        leaves = list(self.leaves)
        for i, output in self.outputs:
            kind = type(output)
            if kind is int:
                leaves[i] = extras[output]
            else:
                leaves[i] = torch.Size(output.get(extras)) if kind is TracedValue else output.get(extras)
        return pytree.tree_unflatten(leaves, self.spec)


class TracedText:
    """Printed text holding symbolic sizes (a ``printed_text.Text``): each size an extra output of
    the trace, and ``get(extras)`` the text eager makes of a call's sizes."""

    __slots__ = ("parts",)

    def __init__(self, text: Text, extras: list):
        self.parts: list = [p if type(p) is str else (TracedValue(p[0], extras), p[1]) for p in text.parts]

    def get(self, extras) -> str:
        return "".join(p if type(p) is str else p[1](p[0].get(extras)) for p in self.parts)


class PrintCall:
    """One recorded ``print``, repeated with each call's tensors."""

    __slots__ = ("arguments",)

    def __init__(self, args, kwargs, extras: list):
        self.arguments = TracedValue((args, kwargs), extras)

    def apply(self, extras, flat) -> None:
        args, kwargs = self.arguments.get(extras)
        _builtin_print(*args, **kwargs)


class AttributeWrite:
    """An attribute the program set (or deleted) on a module or a state object, repeated after
    every call. ``holder`` is the object, or an ``InputSource`` for an argument object (found in
    each call's inputs); ``value`` is a ``TracedValue``, or None for a deletion."""

    __slots__ = ("holder", "name", "value")

    def __init__(self, holder, name, value):
        self.holder, self.name, self.value = holder, name, value

    def apply(self, extras, flat) -> None:
        holder = self.holder.object(flat) if isinstance(self.holder, InputSource) else self.holder
        if self.value is None:
            delattr(holder, self.name)
        else:
            setattr(holder, self.name, self.value.get(extras))


class ItemWrite:
    """An item the program set (or removed) in a list or dict reached from its arguments
    (``cache.is_updated[i] = True``) or of lasting state (a module's cache), repeated after every
    call on that call's container, found at ``source`` (an ``InputSource``, a
    ``containers.ContainerAt``); ``key`` a full slice for a list's new contents, ``value`` a
    ``TracedValue``, or None for a removal."""

    __slots__ = ("source", "key", "value")

    def __init__(self, source, key, value):
        self.source, self.key, self.value = source, key, value

    def apply(self, extras, flat) -> None:
        container = self.source.object(flat)
        key = self.key.get(extras) if type(self.key) is TracedValue else self.key
        if self.value is None:
            del container[key]
        else:
            container[key] = self.value.get(extras)


class ContentsWrite:
    """The new contents of a list or dict passed as an argument (``argument_containers``), given
    after every call to that call's container; ``contents`` a ``TracedValue``. The writes into a
    container only written into, and the items set in a dict read at constant keys, are written
    out as Python on the first call (``_written_writes``)."""

    __slots__ = ("source", "contents", "written")
    #: (``Entry.call_args``)
    changes_arguments = True

    def __init__(self, source, contents):
        self.source, self.contents = source, contents
        self.written: Callable | None = None

    def apply(self, extras, flat) -> None:
        written = self.written
        if written is None:
            written = self.written = _written_writes(self.source, self.contents) or self._made
        written(extras)

    def _made(self, extras) -> None:
        self.source.made(self.source.object(None), self.contents.get(extras))


def _written_writes(source: ArgumentContainer, contents: TracedValue):
    """``ContentsWrite.apply`` as a function of a call's extras, written out: the call's container
    found, the values made (as ``contents.get`` makes them), then each write ``written_only.replay``
    makes of them (``container.append(v)``) or each item ``merge_contents`` sets (``Old`` items
    read before the first is set); None for another ``made`` or node type."""
    if source.made not in (replay, merge_contents) or contents.spec.num_leaves > MOST_WRITTEN_LEAVES:
        return None
    values = ValueSource(contents.leaves, contents.outputs, TracedValue)
    steps = "".join(f"[{values.named(step)}]" for step in source.path)
    lines = [f"container = {values.named(held_call)}.arguments{steps}"]
    try:
        writes = (_replayed if source.made is replay else _merged)(values, contents.spec, lines)
    except Unwritten:
        return None
    return values.function(lines + writes)


def _replayed(values: ValueSource, spec, lines: list) -> list:
    """The writes of ``written_only.WriteLog`` ops (``spec``: a list of ``(method, value)``),
    their values made into locals on ``lines``."""
    if spec.type is not list:
        raise Unwritten
    writes = []
    for op in spec.children():
        if op.type is not tuple or op.num_children != 2:
            raise Unwritten
        method, value = values.constant(op.child(0)), op.child(1)
        values.next += 1
        if method == "setitem":  # (``(key, value)``)
            if value.type is not tuple or value.num_children != 2:
                raise Unwritten
            key = _local(lines, values.expression(value.child(0)))
            writes.append(f"container[{key}] = {_local(lines, values.expression(value.child(1)))}")
        elif method in ("append", "extend", "appendleft", "extendleft"):
            writes.append(f"container.{method}({_local(lines, values.expression(value))})")
        else:
            raise Unwritten
    return writes


def _merged(values: ValueSource, spec, lines: list) -> list:
    """The items ``merge_contents`` sets of ``spec`` (a dict), in its order, their values made into
    locals on ``lines``, then the items moved (``Old`` of another key) read as the container held them."""
    if spec.type is not dict:
        raise Unwritten
    items, moved = [], []
    for key, value in zip(spec.context, spec.children()):
        held = values.constant(value)
        if type(held) is not Old:
            items.append((values.named(key), _local(lines, values.expression(value))))
            continue
        values.next += 1
        if held.key != key:  # (an item kept under its key is left as it is)
            moved.append(f"container[{values.named(held.key)}]")
            items.append((values.named(key), f"m{len(moved) - 1}"))
    lines.extend(f"m{i} = {read}" for i, read in enumerate(moved))
    return [f"container[{key}] = {value}" for key, value in items]


def _local(lines: list, expression: str) -> str:
    """A local on ``lines`` holding ``expression``."""
    lines.append(f"v{len(lines)} = {expression}")
    return f"v{len(lines) - 1}"


def item_writes(writes, extras: list, kept: dict | None = None) -> list:
    """``ItemWrite`` for each ``(source, key, value)`` (MISSING: removed), as ``attribute_writes``;
    a key that holds sizes is each call's (``keyed``: a cache by sequence length). A container
    passed as an argument (an ``ArgumentContainer``) gets its new contents (``ContentsWrite``)."""
    return [
        ContentsWrite(source, TracedValue(value, extras, kept))
        if type(source) is ArgumentContainer
        else ItemWrite(
            source,
            TracedValue(key, extras) if _holds_size(key) else key,
            None if value is MISSING else TracedValue(value, extras, kept),
        )
        for source, key, value in writes
    ]


def _holds_size(key) -> bool:
    return type(key) is SymInt or (type(key) is tuple and any(map(_holds_size, key)))


def attribute_writes(writes, extras: list, kept: dict | None = None, made=None) -> list:
    """``AttributeWrite`` for each ``(holder, name, value)`` (MISSING: deleted); tensors the trace
    computed among the values become extra outputs (appended to ``extras``), captured tensors
    stored as they are (``kept``, by the id of their proxies) are stored as themselves, objects
    the program made (``made``: a ``returned_identities.Identities`` of what it stored) are made
    anew by every call."""
    return [
        AttributeWrite(holder, name, None if value is MISSING else TracedValue(value, extras, kept, made))
        for holder, name, value in writes
    ]
