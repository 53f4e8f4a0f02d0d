"""Data-dependent reads: a traced program that reads a tensor's value gets that value, and its
trace is specialised on it, with a check where the read was.

A read (``bool(t)``, ``t.item()``, ``int(t)``, ``t.tolist()``, and the output sizes of calls
whose sizes depend on values: ``nonzero``, ``masked_select``, ``unique``, boolean-mask indexing)
is answered while tracing by evaluating the program up to that point: the calls recorded so far
are compiled as a snapshot (``Recorder.snapshot``) for the jit's executors that run symbols one by
one, and run on the call's own tensors with nothing of it visible (generators restored, no
write-back). The value goes back to the program, which runs on as eager would, and the trace
records a check (``check_value``): every compiled call reads the value at that point, as eager's
host sync does, and raises ``Diverged`` when it differs. Nothing the call does is visible before
its last check has passed: its writes to inputs and the effects it repeats come after the
trace, and the generators it drew from are restored (``abandonable``). The jit then runs, or
compiles, the variant of the program for the value read (``ValueTree``).

Each variant is a whole trace, so passes, fusion and one autograd function see the path the
values took, and the gradient flows through it as in eager. The cost is paid where values steer
the program: a call whose values take another path than the variant tried first runs up to the
check twice.
"""

import contextlib
import contextvars
import dataclasses
import functools
import re
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from thunder_rs import _core
from thunder_rs.core.lang import fallback
from thunder_rs.core.state.observe import thread_state
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.recorder import current, noting_inputs, paused_recording, recording_backward
from thunder_rs.core.base.userframe import user_location
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError

_T = torch.Tensor
#: The reads of a tensor's value that are answered: each check reads the value by the same call.
READERS = frozenset({_T.__bool__, _T.item, _T.tolist, _T.__int__, _T.__float__, _T.__index__, _T.__complex__})


class Diverged(Exception):
    """Raised by a compiled call's check: the value read at ``read`` is ``value``, not the one
    the trace was specialised on."""

    def __init__(self, read: "Read", value):
        super().__init__(read, value)
        self.read, self.value = read, value

    def __str__(self) -> str:  # (made only when shown: a divergence is part of a call's run)
        return self.read.describe(self.value)


@dataclasses.dataclass(frozen=True, eq=False)
class Read:
    """One data-dependent read of a traced program: the ``index``-th it made, what it called, at
    which line of the user's code, and the value it got."""

    index: int
    what: str
    where: str
    value: object
    #: ``reader(*tensors)``: the value, read as the program read it
    reader: Callable[..., Any] = dataclasses.field(repr=False, default=_T.__bool__)
    #: For the output sizes of a call sized by values read as symbolic sizes (``widened``): the
    #: ``(output, dim)`` of each such size, in groups that hold one size
    sizes: tuple = ()
    #: the names of those sizes in the trace (one per group), and of its size inputs then
    names: tuple = ()
    inputs: tuple = ()
    #: ``guard(shapes, sizes)`` of the guards of the trace on those sizes (``place_guards``)
    guards: list = dataclasses.field(default_factory=list, repr=False)

    def answered(self, value) -> "Read":
        """This read answered with ``value``, its sizes constant."""
        return dataclasses.replace(self, value=value, sizes=(), names=(), inputs=(), guards=[])

    def key(self):
        """The read as a step of the variants' ``ValueTree``: its value, or for symbolic sizes
        their pattern (``pattern``)."""
        return ("sized", self.pattern()) if self.sizes else decision(self.value)

    def pattern(self) -> tuple:
        """The shapes read, each symbolic size as ``(group,)``."""
        groups = {at: (g,) for g, group in enumerate(self.sizes) for at in group}
        shapes: Any = self.value
        return tuple(tuple(groups.get((i, d), n) for d, n in enumerate(shape)) for i, shape in enumerate(shapes))

    def describe(self, value) -> str:
        return (
            f"the value read by {self.what} at {self.where} was {_shown(value)} where the compiled variant "
            f"has {_shown(self.value)}"
        )


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def decision(value):
    """``value`` as a key of the variants: equal exactly when the values are the same (floats by
    their bits, so NaN equals NaN and -0.0 differs from 0.0), lists as tuples."""
    kind = type(value)
    if kind is bool or kind is int or kind is torch.Size:
        return value
    if kind is float:
        return ("f", value.hex())
    if kind is complex:
        return ("c", value.real.hex(), value.imag.hex())
    if kind in (list, tuple):
        return tuple(map(decision, value))
    return value


def check_value(read: Read, *tensors) -> None:
    """The check a trace records where it read a value: raises ``Diverged`` when the value now
    differs from the one the trace was specialised on."""
    value = read.reader(*tensors)
    if value is read.value or (type(value) is type(read.value) and decision(value) == decision(read.value)):
        return
    raise Diverged(read, value)


CHECK = _core.register_symbol("thunder_rs.check_value", fallback=True, effect=True)
fallback.FALLBACK_IMPLS[CHECK] = check_value


def check_sizes(read: Read, tensors: tuple, sizes: tuple) -> None:
    """The check a trace records where it read symbolic sizes from a call's outputs (``widened``):
    raises ``Diverged`` when the outputs' sizes do not fit the pattern, or fail a guard the trace
    relied on (``sizes``: the trace's size inputs, which guards may compare with)."""
    shapes = _shapes(*tensors)
    if _fits(read.pattern(), shapes) and all(guard(shapes, sizes) for guard in read.guards):
        return
    raise Diverged(read, shapes)


def _fits(pattern: tuple, shapes: tuple) -> bool:
    """Whether ``shapes`` fit ``pattern``: its constant sizes, and at each group's places one size
    of at least 2 (0 and 1 stay constant, as input sizes do)."""
    if len(pattern) != len(shapes):
        return False
    seen: dict = {}
    for want, shape in zip(pattern, shapes):
        if len(want) != len(shape):
            return False
        for w, n in zip(want, shape):
            if type(w) is tuple:
                if n < 2 or seen.setdefault(w, n) != n:
                    return False
            elif w != n:
                return False
    return True


def _applies(groups: tuple, shapes: tuple) -> bool:
    """Whether ``shapes`` have every place of ``groups``, with one size of at least 2 per group."""
    for group in groups:
        sizes = {shapes[i][d] if i < len(shapes) and d < len(shapes[i]) else -1 for i, d in group}
        if len(sizes) != 1 or min(sizes) < 2:
            return False
    return True


CHECK_SIZES = _core.register_symbol("thunder_rs.check_sizes", fallback=True, effect=True)
fallback.FALLBACK_IMPLS[CHECK_SIZES] = check_sizes


def widened(read: Read, value) -> Read | None:
    """``read``, of a call's output sizes, with the sizes that differ in ``value`` (a call's
    shapes) symbolic, each computed by the call (the count of ``nonzero``'s indices): a variant
    that serves every count (of at least 2). Sizes equal in both share a symbol. None where the
    read is of something else, or already symbolic, or a changed size is 0 or 1 now."""
    old: Any = read.value
    if read.reader is not _shapes or read.sizes or type(value) is not tuple or len(old) != len(value):
        return None
    if any(len(a) != len(b) for a, b in zip(old, value)):
        return None
    groups: dict = {}
    for i, (a, b) in enumerate(zip(old, value)):
        for d, (x, y) in enumerate(zip(a, b)):
            if x != y:
                groups.setdefault((x, y), []).append((i, d))
    if not groups or any(new < 2 for _, new in groups):
        return None
    return dataclasses.replace(read, value=value, sizes=tuple(map(tuple, groups.values())), guards=[])


def place_guards(reads, guards) -> list:
    """The guards of ``guards`` (the trace's, as text) an entry checks on its inputs' sizes: the
    others read sizes computed by calls (``widened``), and go to the check of the read that made
    them, and go to the check of the last read that made one, which runs right after it
    (``check_sizes``) and has the sizes made before it. Raises where a guard reads a size input
    made after that read."""
    made = {name: read for read in reads for name in read.names}
    kept = []
    by_read: dict = {}
    for guard in guards:
        names = set(_NAME.findall(guard))
        owners = [made[n] for n in names if n in made]
        if not owners:
            kept.append(guard)
            continue
        read = max(owners, key=lambda r: r.index)
        if not names <= {*read.names, *read.inputs}:
            raise ThunderNotImplementedError(
                f"the sizes {', '.join(sorted(names))} computed at {read.where} and later are compared by `{guard}`, "
                "which no check can test where the sizes are made"
            )
        by_read.setdefault(id(read), (read, []))[1].append(guard)
    for read, texts in by_read.values():
        read.guards.append(_guard_function(read, texts))
    return kept


_NAME = re.compile(r"\bt\d+\b")


def _guard_function(read: Read, texts: list):
    """``guard(shapes, sizes)``: whether ``texts`` hold for a call's output ``shapes`` at ``read``
    and the trace's size inputs ``sizes``."""
    binds = "".join(f"    {n} = shapes[{g[0][0]}][{g[0][1]}]\n" for n, g in zip(read.names, read.sizes))
    binds += "".join(f"    {n} = sizes[{k}]\n" for k, n in enumerate(read.inputs))
    source = f"def guard(shapes, sizes):\n{binds}    return {' and '.join(f'({t})' for t in texts)}\n"
    scope: dict = {}
    exec(compile(source, "<thunder_rs size guards>", "exec"), scope)
    return scope["guard"]


def _shapes(*tensors) -> tuple:
    return tuple(t.shape for t in tensors)


class ValueReads:
    """The data-dependent reads of one acquisition. ``evaluate(snapshot, consts, inputs)`` runs a
    snapshot of the recording on the real inputs; ``forced`` are the reads a call's divergence
    settled (the reads of the variant that diverged up to there, then the value it read): they
    are answered with those values, as long as the program makes them in the same places."""

    def __init__(self, evaluate, forced: tuple = (), sites: dict | None = None):
        self._evaluate = evaluate
        self._forced = forced
        #: ``{(what, where): groups}``: the calls whose output sizes changed before (``widened``):
        #: their sizes there are symbolic from the first read
        self._sites = sites or {}
        #: the sizes the calls read so far made (``SymbolicSizes``): later checks may compare with them
        self._made: list = []
        self.reads: list[Read] = []
        #: the tensor each trace input stands for, in order (``recorder.input_proxy`` appends)
        self.inputs: list = []

    def read(self, func, args: tuple, kwargs: dict):
        """``func(*args, **kwargs)``, a call that returns Python values computed from the values of
        its traced tensors (``bool(t)``, ``t.item()``, ``torch.equal(a, b)``): its value for this
        call, with a check recorded that makes the call again."""
        proxies = _proxies_in(args, kwargs)
        forced = self._next_forced(func)
        value = forced.value if forced is not None else self._run(func, args, kwargs, proxies)
        reader = func if args == (proxies[0],) and not kwargs else _Remade(func, args, kwargs)
        self._record(reader, func, value, proxies)
        return value

    def sized(self, func, args, kwargs):
        """The real outputs of ``func(*args, **kwargs)``, a call whose output sizes depend on the
        values of its tensor arguments: their metadata is what the trace records. Returns them and
        ``checked(outs)``, which records the check of the traced outputs' sizes."""
        out = self._run(func, args, kwargs, _proxies_in(args, kwargs))
        forced = self._next_forced(func)
        leaves = [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]
        site = (fallback.qualified_name(func), user_location())
        groups = forced.sizes if forced is not None else self._sites.get(site)
        if leaves and groups and _applies(groups, _shapes(*leaves)):
            return out, SymbolicSizes(self, func, groups, leaves)  # the call's own sizes are the hints
        if forced is not None and leaves:
            out = _resized(out, forced.value)  # (a call returning no tensor is a ``read`` next)
        return out, functools.partial(self._checked, func)

    def _run(self, func, args, kwargs, proxies: list):
        """``func`` run on this call's values of its traced tensors."""
        real = dict(zip(map(id, proxies), self.evaluate(proxies)))
        swap = lambda x: real[id(x)] if isinstance(x, TensorProxy) else x  # noqa: E731
        real_args, real_kwargs = tree_map(swap, (args, kwargs))
        with _outside_the_trace():
            return func(*real_args, **real_kwargs)

    def _checked(self, func, outs) -> None:
        tensors = [x for x in tree_flatten(outs)[0] if isinstance(x, TensorProxy)]
        self._record(_shapes, func, _shapes(*tensors), tensors)

    def _next_forced(self, func) -> Read | None:
        """The forced answer of the next read, when the program makes it where the variant did."""
        index = len(self.reads)
        if index >= len(self._forced):
            return None
        forced = self._forced[index]
        if forced.what != fallback.qualified_name(func) or forced.where != user_location():
            self._forced = ()  # the program went elsewhere (its Python state changed): read anew
            return None
        return forced

    def _record(self, reader, func, value, tensors, sized: "SymbolicSizes | None" = None) -> None:
        read = Read(len(self.reads), fallback.qualified_name(func), user_location(), value, reader)
        if sized is None:
            current().call(CHECK, (read, *tensors), None, [])
        else:
            inputs = [*current().size_inputs(), *self._made]
            self._made.extend(sized.sizes)
            names = tuple(f"t{s.values()[0]}" for s in sized.sizes)
            inputs_named = tuple(f"t{s.values()[0]}" for s in inputs)
            read = dataclasses.replace(read, sizes=sized.dims, names=names, inputs=inputs_named)
            current().call(CHECK_SIZES, (read, tuple(tensors), tuple(inputs)), None, [])
        self.reads.append(read)

    def evaluate(self, proxies: list) -> list:
        """The values of ``proxies`` for this call: the program so far, run on its inputs with
        nothing of it visible."""
        rec = current()
        if recording_backward():
            raise ThunderNotImplementedError(
                f"data-dependent control flow or value access at {user_location()} in a backward (a custom "
                "autograd.Function's backward or a grad rule): a compiled call's backward runs after its forward has "
                "returned, too late to choose the variant for the value; read it in the forward and save the result"
            )
        if any(t.is_meta or type(t).__name__ == "FakeTensor" for t in self.inputs):
            raise ThunderRuntimeError(
                f"data-dependent control flow or value access at {user_location()} on inputs without data (meta or "
                "fake tensors); thunder_rs reads the values of real inputs"
            )
        snapshot = rec.snapshot([p._vid for p in proxies])
        # A trace with symbolic sizes takes them last: this call's are the values they were traced at.
        sizes = [rec.size_value(v).hint for v in snapshot.size_inputs()]
        with _outside_the_trace():
            return list(self._evaluate(snapshot, list(rec.consts()), [*self.inputs, *sizes]))


class SymbolicSizes:
    """For a call sized by values whose read is symbolic (``widened``): the sizes it computes,
    made as sizes of the trace that it defines (``sizes``, one per group of ``dims``), its
    outputs' shapes with them (``shape(t)``), and, called with its traced outputs, the record of
    their check (``check_sizes``)."""

    def __init__(self, reads: ValueReads, func, groups: tuple, leaves: list):
        rec = current()
        self.dims = groups
        self.sizes = [rec.unbacked_size(leaves[g[0][0]].shape[g[0][1]]) for g in self.dims]
        at = {place: size for size, group in zip(self.sizes, self.dims) for place in group}
        self._shapes = {id(t): tuple(at.get((i, d), n) for d, n in enumerate(t.shape)) for i, t in enumerate(leaves)}
        self._reads, self._func, self._value = reads, func, _shapes(*leaves)

    @property
    def ids(self) -> list:
        return [s.values()[0] for s in self.sizes]

    def shape(self, t) -> tuple:
        return self._shapes[id(t)]

    def __call__(self, outs) -> None:
        tensors = [x for x in tree_flatten(outs)[0] if isinstance(x, TensorProxy)]
        self._reads._record(_shapes, self._func, self._value, tensors, self)


def _proxies_in(args, kwargs) -> list:
    return [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, TensorProxy)]


class _Remade:
    """A check's reader for a call with more than its one tensor: the call made again with the
    check's tensors in the places of the traced ones (``torch.allclose(a, b, rtol=...)``)."""

    def __init__(self, func, args, kwargs):
        leaves, self._spec = tree_flatten((args, kwargs))
        self._func = func
        self._leaves = [None if isinstance(x, TensorProxy) else x for x in leaves]
        self._slots = [i for i, x in enumerate(leaves) if isinstance(x, TensorProxy)]

    def __call__(self, *tensors):
        leaves = list(self._leaves)
        for i, t in zip(self._slots, tensors):
            leaves[i] = t
        args, kwargs = tree_unflatten(leaves, self._spec)
        return self._func(*args, **kwargs)


def _resized(out, shapes: tuple):
    """``out`` with its tensors as large as ``shapes`` says (the sizes a compiled call read, where
    the snapshot's numerics may have given others): what the trace is specialised on."""
    sizes = iter(shapes)

    def resize(t):
        return torch.empty(next(sizes), dtype=t.dtype, device=t.device) if isinstance(t, torch.Tensor) else t

    return tree_map(resize, out)


@contextlib.contextmanager
def _outside_the_trace():
    """Runs real computation in the middle of an acquisition: no recording, no torch function
    handling (the language mode, proxies), no guarded reads, no autograd graph, no autocast (the
    snapshot's casts are recorded ops), and every generator as it was before."""
    states = generator_states(current().consts())
    autocasting = [d for d in ("cpu", "cuda") if torch.is_autocast_enabled(d)]
    thread_state.inside += 1
    try:
        for d in autocasting:
            torch.set_autocast_enabled(d, False)
        with paused_recording(), torch._C.DisableTorchFunction(), torch.no_grad():
            yield
    finally:
        for d in autocasting:
            torch.set_autocast_enabled(d, True)
        thread_state.inside -= 1
        restore_generators(states)


def generator_states(consts) -> list:
    """``(generator, state)`` for each generator a trace may draw from: the default ones, and
    those its calls name (``generator=g``, among its constants)."""
    generators = [torch.default_generator]
    if torch.cuda.is_initialized():
        generators.extend(torch.cuda.default_generators)
    generators.extend(c for c in consts if isinstance(c, torch.Generator))
    return [(g, g.get_state()) for g in generators]


def restore_generators(states: list) -> None:
    for generator, state in states:
        generator.set_state(state)


def abandonable(fn, consts):
    """``fn``, a compiled call with checks, leaving the generators as they were when a check
    fails: the call is abandoned and the variant for the value read runs instead."""
    generators = [g for g, _ in generator_states(consts)]

    def call(*inputs):
        states = [(g, g.get_state()) for g in generators]
        try:
            return fn(*inputs)
        except Diverged:
            restore_generators(states)
            raise

    return call


class ValueTree:
    """The variants of one cache key by the values their calls read: a trie, kept as a dict from
    each prefix of a variant's ``decisions`` to the latest variant with that prefix, so a call
    abandoned at its k-th read finds the variant that agrees with it up to there in one lookup."""

    def __init__(self):
        self._by_prefix: dict = {}

    def add(self, entry) -> None:
        for n in range(1, len(entry.decisions) + 1):
            self._by_prefix[entry.decisions[:n]] = entry

    def get(self, path: tuple):
        return self._by_prefix.get(path)

    def remove(self, entry) -> None:
        for prefix in [p for p, e in self._by_prefix.items() if e is entry]:
            del self._by_prefix[prefix]

    def __len__(self) -> int:
        return len(set(map(id, self._by_prefix.values())))


#: The data-dependent reads of the acquisition in progress in this context, or None: values
#: are then refused, as where no inputs are at hand (``examine``, ``vmap``).
_active: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_value_reads", default=None)
active = _active.get


@contextlib.contextmanager
def reading(reads: ValueReads | None):
    """Answers the data-dependent reads of the acquisition in this context through ``reads``."""
    token = _active.set(reads)
    try:
        with noting_inputs(None if reads is None else reads.inputs):
            yield reads
    finally:
        _active.reset(token)


class _ByValues:
    """What eager fallbacks ask where their metadata or result only values tell (``fallback``)."""

    @staticmethod
    def sized(impl, args, kwargs):
        reads = _active.get()
        return None if reads is None else reads.sized(impl, args, kwargs)

    @staticmethod
    def read(impl, args, kwargs):
        reads = _active.get()
        return None if reads is None else (reads.read(impl, args, kwargs),)


fallback.set_by_values(_ByValues)
