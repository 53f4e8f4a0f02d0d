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

Sizes read this way (output sizes of ``nonzero``-like calls, ints of ``item()`` and ``tolist()``)
that change between calls are made symbolic sizes of the next variant (``value_sizes``): one
variant serves every count then, instead of one per count. A compile compares each of its reads
with the read at the same site and count of the compile before (the variant whose check
failed, else the entry compiled last), so every size that changed turns symbolic in that one
compile, as torch.compile's automatic dynamic marks each size that changed since the last
compile, rather than one site per compile as each check fails in its turn.
"""

import contextlib
import contextvars
import dataclasses
import functools
import sys

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from thunder_rs.core.lang import fallback
from thunder_rs.core.lang.caller_code import only_truncated
from thunder_rs.core.lang.reads import CHECK, Diverged, Read, _shapes, decision, int_leaves
from thunder_rs.core.lang.snapshots import (
    FirstOutputs,
    Snapshots,
    generator_states,
    outside_the_trace,
    restore_generators,
)
from thunder_rs.core.lang.symint import SymInt
from thunder_rs.core.lang.value_sizes import SymbolicInts, SymbolicSizes, _applies, _fits, _fits_flat, widened
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.base.trees import tree_leaves, tree_map
from thunder_rs.core.lang.recorder import current, noting_inputs, recording, recording_backward
from thunder_rs.core.lang.rng import is_random
from thunder_rs.core.base.userframe import PACKAGE_DIR, user_location
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError


def _places(groups: tuple) -> set:
    return {place for group in groups for place in group}


class ValueReads:
    """The data-dependent reads of one acquisition. ``evaluate(snapshot, consts, inputs)`` runs a
    snapshot of the recording on the real inputs; ``forced`` are the reads a call's divergence
    settled (the reads of the variant that diverged up to there, then the value it read): they
    are answered with those values, as long as the program makes them in the same places."""

    def __init__(self, evaluate, forced: tuple = (), sites: dict | None = None, prior: tuple = ()):
        self.snapshots = Snapshots(evaluate)
        self._forced = forced
        #: ``{(what, where): groups}``: the calls whose output sizes changed before (``widened``):
        #: their sizes there are symbolic from the first read
        self._sites = sites or {}
        #: the reads of the compile before, by site and the number of the read there: a read whose
        #: sizes differ from its counterpart's is symbolic at once (``_groups``)
        self._prior = _by_site(prior)
        self._seen: dict = {}
        #: the sites this acquisition found changed since the compile before: ``{(what, where): groups}``
        self.widened: dict = {}
        #: the sizes the calls read so far made (``SymbolicSizes``): later checks may compare with them
        self._made: list = []
        self.reads: list[Read] = []
        #: the tensor each trace input stands for, in order (``recorder.input_proxy`` appends)
        self.inputs: list = []
        self._with_data = 0  # how many of them are known to hold data (``evaluate``)

    def read(self, func, args: tuple, kwargs: dict):
        """``func(*args, **kwargs)``, a call that returns Python values computed from the values of
        its traced tensors (``bool(t)``, ``t.item()``, ``torch.equal(a, b)``): its value for this
        call, with a check recorded that makes the call again."""
        proxies = _proxies_in(args, kwargs)
        forced = self._next_forced(func)
        site = (fallback.qualified_name(func), user_location())
        groups: tuple = forced.sizes if forced is not None else self._sites.get(site, ())
        if forced is None or groups:  # (symbolic: the call's own ints are the hints)
            value = self._run(func, args, kwargs, proxies)
        else:
            value = forced.value
        reader = func if args == (proxies[0],) and not kwargs else _Remade(func, args, kwargs)
        # ``int(t.item())``: the int is what counts (a forced answer is that int already)
        if type(value) in (float, int) and only_truncated(_caller()):
            value, reader = int(value), _Truncated(reader)
        groups = self._groups(site, forced, groups, value)
        leaves = int_leaves(value) if groups and type(groups[0][0]) is int else None
        if leaves is not None and _applies(groups, tuple(leaves)):
            made = SymbolicInts(groups, value)
            self._record(reader, func, value, proxies, made)
            return made.value
        self._record(reader, func, value, proxies)
        return value

    def raised(self, func, args, kwargs, fused: bool = False):
        """``func(*args, **kwargs)``, a call that raises on some values of its tensors (a
        factorisation of a matrix that is not positive definite), made inside the program's
        ``try`` block: whether it raises on this call's values is a read (the trace checks it on
        every call, and the variant for the other outcome runs there); where it raises, it raises
        here as in eager, so that the program's ``except`` clause runs while traced.

        ``fused`` (the caller's outputs require no gradient): where the call succeeds, the check
        is the call itself, recorded as an eager call that raises ``Diverged`` where it raises
        (``_Checked``), and its outputs are returned: a compiled call runs the op once, not a
        check and then the op. Otherwise (None returned) the caller records the op after the
        check, for its gradient."""
        if any(t.is_meta or type(t).__name__ == "FakeTensor" for t in self.inputs):
            return None  # (on inputs without data, eager's call raises on none either)
        if fused and (out := self._checked_call(func, args, kwargs)) is not _RAISES:
            return out
        raised = self.read(_Raised(func), args, kwargs)
        if raised is not None:
            self._run(func, args, kwargs, _proxies_in(args, kwargs))  # (raises, with eager's message)
            raise raised(f"{fallback.qualified_name(func)} raised {raised.__name__} on these values")
        return None

    def _checked_call(self, func, args, kwargs):
        """``func(*args, **kwargs)`` recorded as its own check (``raised``): its outputs where it
        succeeds on this call's values (or a forced answer says so), else ``_RAISES`` (no read is
        recorded then: ``read`` makes it)."""
        reader, proxies = _Raised(func), _proxies_in(args, kwargs)
        forced = self._next_forced(reader)
        value = self._run(reader, args, kwargs, proxies) if forced is None else forced.value
        if value is not None:
            return _RAISES
        site = (fallback.qualified_name(reader), user_location())
        self._seen[site] = self._seen.get(site, -1) + 1  # (counted as ``read`` counts its reads)
        read = Read(len(self.reads), site[0], site[1], None, reader)
        self.reads.append(read)
        return fallback.fallback(_checked(func), (read, *args), kwargs, effect=True)

    def sized(self, func, args, kwargs):
        """The real outputs of ``func(*args, **kwargs)``, a call whose output sizes depend on the
        values of its tensor arguments: their metadata is what the trace records. Returns them and
        ``checked(outs)``, which records the check of the traced outputs' sizes. A symbolic size
        among the arguments (``bincount``'s ``minlength=N``) is taken at its value in this call,
        unguarded: the recorded call takes it on each call, and its outputs' sizes are checked
        or symbolic, so no guard is needed (one would compile once per ``N``)."""
        out = self._run(func, args, kwargs, _proxies_in(args, kwargs), _hint)
        forced = self._next_forced(func)
        leaves = [x for x in tree_leaves(out) if isinstance(x, torch.Tensor)]
        site = (fallback.qualified_name(func), user_location())
        groups = forced.sizes if forced is not None else self._sites.get(site, ())
        groups = self._groups(site, forced, groups, _shapes(*leaves))
        if leaves and groups and _applies(groups, _shapes(*leaves)):
            return out, SymbolicSizes(self, func, groups, leaves)  # the call's own sizes are the hints
        if forced is not None and leaves:
            out = _resized(out, forced.value)  # (a call returning no tensor is a ``read`` next)
        return out, functools.partial(self._checked, func)

    def _groups(self, site, forced: Read | None, groups: tuple, value) -> tuple:
        """The symbolic sizes of the read at ``site`` that got ``value``: ``groups`` (forced, or
        the site's since it was widened), or where it has none, those that differ from the read
        at the same site and count in the compile before (``widened``): as torch.compile makes a
        size that changed since the last compile symbolic, every read of this compile whose sizes
        changed is, not only the one whose check failed."""
        count = self._seen[site] = self._seen.get(site, -1) + 1
        prior = self._prior.get((site, count))
        if forced is not None or (groups and (prior is None or prior.reader is not _shapes)):
            return groups
        if site in self.widened:  # an earlier read there changed: so may this one
            return self.widened[site]
        # (with the site's groups: a size they have constant that changed too, a packed sequence's
        # longest length where its total was symbolic)
        wide = widened(prior.answered(prior.value), value, groups) if prior is not None else None
        if wide is None or _places(wide.sizes) == _places(groups):
            return groups
        self.widened[site] = wide.sizes
        return wide.sizes

    def _run(self, func, args, kwargs, proxies: list, size=None):
        """``func`` run on this call's values of its traced tensors, its symbolic sizes as ``size``
        makes them (specialised unless told)."""
        real = dict(zip(map(id, proxies), self.evaluate(proxies)))
        size = size or _specialised
        swap = lambda x: real[id(x)] if isinstance(x, TensorProxy) else size(x)  # noqa: E731
        real_args, real_kwargs = tree_map(swap, (args, kwargs))
        with outside_the_trace(is_random(func)):
            return func(*real_args, **real_kwargs)

    def _checked(self, func, outs) -> None:
        tensors = [x for x in tree_leaves(outs) if isinstance(x, TensorProxy)]
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

    def _record(self, reader, func, value, tensors, sized: "SymbolicSizes | SymbolicInts | None" = None) -> None:
        read = Read(len(self.reads), fallback.qualified_name(func), user_location(), value, reader)
        if sized is None:
            current().call(CHECK, (read, *tensors), None, [])
        else:
            inputs = [*current().size_inputs(), *self._made]
            self._made.extend(sized.sizes)
            names = tuple(f"t{s.values()[0]}" for s in sized.sizes)
            inputs_named = tuple(f"t{s.values()[0]}" for s in inputs)
            forced = self._forced[read.index] if read.index < len(self._forced) else None
            side = forced.side if forced is not None else 0  # (the guards' outcome it was forced for)
            read = dataclasses.replace(read, sizes=sized.dims, names=names, inputs=inputs_named, side=side)
            sized.record(read, tensors, inputs)
        self.reads.append(read)

    def first_outputs(self, rec, outputs) -> FirstOutputs | None:
        """What the compiled call of the traced call returns (``outputs``, the recording's
        outputs: proxies, constants and tuples or lists of them) where the reads computed the
        program's values (``Snapshots.last``) and no gradient is to be recorded; else None. The
        tensors kept for the reads are dropped either way."""
        try:
            leaves: list = []
            if not _plain_outputs(outputs, leaves) or any(p.requires_grad for p in leaves):
                return None
            with recording(rec):
                found = self.snapshots.last([p._vid for p in leaves], self.inputs)
            if found is None:
                return None
            values, generators = found
            real = dict(zip(map(id, leaves), values))
            return FirstOutputs(self.inputs, _substituted(outputs, real), generators)
        finally:
            self.snapshots.forget()

    def evaluate(self, proxies: list) -> list:
        """The values of ``proxies`` for this call: the program so far, run on its inputs with
        nothing of it visible (``snapshots``)."""
        if recording_backward():
            raise ThunderNotImplementedError(
                f"data-dependent control flow or value access at {user_location()} in a backward (a custom "
                "autograd.Function's backward or a grad rule): a compiled call's backward runs after its forward has "
                "returned, too late to choose the variant for the value; read it in the forward and save the result"
            )
        new, self._with_data = self.inputs[self._with_data :], len(self.inputs)  # (those not checked yet)
        if any(t.is_meta or type(t).__name__ == "FakeTensor" for t in new):
            raise ThunderRuntimeError(
                f"data-dependent control flow or value access at {user_location()} on inputs without data (meta or "
                "fake tensors); thunder_rs reads the values of real inputs"
            )
        return self.snapshots.values([p._vid for p in proxies], self.inputs)


def _plain_outputs(outputs, leaves: list) -> bool:
    """Whether ``outputs`` are proxies, constants and tuples or lists of them (as the compiled
    call returns them); appends the proxies to ``leaves``."""
    if isinstance(outputs, TensorProxy):
        leaves.append(outputs)
        return True
    if type(outputs) in (tuple, list):
        return all(_plain_outputs(x, leaves) for x in outputs)
    return outputs is None or type(outputs) in (bool, int, float, str)


def _substituted(outputs, real: dict):
    """``outputs`` with each proxy replaced by ``real[id(proxy)]``."""
    if isinstance(outputs, TensorProxy):
        return real[id(outputs)]
    if type(outputs) in (tuple, list):
        return type(outputs)(_substituted(x, real) for x in outputs)
    return outputs


def _by_site(reads: tuple) -> dict:
    """``{((what, where), count): read}``: each read by its site and how many reads there came before it."""
    counts: dict = {}
    found = {}
    for read in reads:
        site = (read.what, read.where)
        counts[site] = counts.get(site, -1) + 1
        found[(site, counts[site])] = read
    return found


def _proxies_in(args, kwargs) -> list:
    return [x for x in tree_leaves((args, kwargs)) if isinstance(x, TensorProxy)]


def _specialised(x):
    """An argument of a call run on real values as torch takes it: a symbolic size (a
    ``bincount`` minlength from a tensor's length) as its int, which records the guard."""
    return int(x) if type(x) is SymInt else x


def _hint(x):
    """A symbolic size as its value in this call, with no guard recorded."""
    return x.hint if type(x) is SymInt else x


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


class _Raised:
    """A read of whether ``func`` raises on the values of its tensors: the class of the exception
    it raises, or None."""

    def __init__(self, func):
        self._func = func
        self.__name__ = f"{getattr(func, '__name__', 'call')} raises"
        self.__module__ = getattr(func, "__module__", None) or "torch"

    def __call__(self, *args, **kwargs):
        try:
            self._func(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 (which one the variant is for)
            return type(e)
        return None


#: ``_checked_call``'s answer where the call raises on this call's values.
_RAISES = object()


class _Checked:
    """``func`` run by a compiled call as the check that it raises nothing (``raised``): its
    outputs, or ``Diverged`` with the class of what it raised (the variant for that outcome runs
    instead, as after a failed check). On tensors without data (the outputs' metadata) its errors
    are its own. It is named as ``func`` (``fallback.qualified_name``), so that the reads of its
    output sizes (``bincount``'s) are at the site of ``func``'s, as where it is not fused."""

    def __init__(self, func):
        self._func = func
        self.__name__ = getattr(func, "__name__", "call")
        self.__module__ = getattr(func, "__module__", None) or "torch"
        if hasattr(func, "__objclass__"):  # (a Tensor method: ``torch.Tensor.bincount``)
            self.__objclass__ = func.__objclass__

    def __call__(self, read: Read, *args, **kwargs):
        try:
            return self._func(*args, **kwargs)
        except Exception as e:
            tensors = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
            if any(t.is_meta or type(t).__name__ == "FakeTensor" for t in tensors):
                raise
            raise Diverged(read, type(e)) from e


@functools.cache
def _checked(func) -> _Checked:
    """One ``_Checked`` per ``func``: one fallback symbol for each."""
    return _Checked(func)


class _Truncated:
    """A check's reader for a float the program passes straight to ``int`` (``caller_code``):
    the int of the value read."""

    def __init__(self, reader):
        self._reader = reader

    def __call__(self, *tensors):
        return int(self._reader(*tensors))


def _caller():
    """The frame that made the call being answered: the innermost outside thunder_rs."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(PACKAGE_DIR):
        frame = frame.f_back
    return frame


def _resized(out, shapes: tuple):
    """``out`` with its tensors as large as ``shapes`` says (the sizes a compiled call read, where
    the snapshot's numerics may have given others): what the trace is specialised on."""
    sizes = iter(shapes)

    def resize(t):
        return torch.empty(next(sizes), dtype=t.dtype, device=t.device) if isinstance(t, torch.Tensor) else t

    return tree_map(resize, out)


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

    def agreeing(self, entry, index: int, value, tried: set):
        """The latest variant not ``tried`` whose reads take what a call of ``entry`` read: the
        values of ``entry``'s reads before ``index`` (or, where those are symbolic, the same
        pattern) and ``value`` at ``index``. The prefixes of ``get`` find a variant only where its
        reads are of the kind of ``entry``'s, constant or symbolic: a call with the values of the
        first call compiled again once a symbolic variant came between. None if none does."""
        known = entry.reads[:index]
        for other in reversed({id(e): e for e in self._by_prefix.values()}.values()):
            if id(other) in tried or len(other.reads) <= index:
                continue
            if all(map(_same_answer, other.reads, known)) and _takes(other.reads[index], value):
                return other
        return None

    def remove(self, entry) -> None:
        for prefix in [p for p, e in self._by_prefix.items() if e is entry]:
            del self._by_prefix[prefix]

    def __len__(self) -> int:
        return len(set(map(id, self._by_prefix.values())))


def _same_answer(read: Read, known: Read) -> bool:
    """Whether ``read`` (of a variant) may take what a call read at ``known`` (of the variant it
    ran): ``known``'s value; where ``known`` is symbolic (the call's value fit its pattern, which
    value is not kept), the same pattern and side, or a constant that fits it: a guess, which the
    variant's own check settles when it runs (a variant that diverges is not tried again)."""
    if (read.what, read.where) != (known.what, known.where):
        return False
    if not known.sizes:
        return _takes(read, known.value)
    return read.key() == known.key() or (not read.sizes and _takes(known, read.value))


def _takes(read: Read, value) -> bool:
    """Whether ``read``'s check passes ``value`` as to its pattern (a symbolic read's guards are
    checked when the variant runs)."""
    if not read.sizes:
        return decision(read.value) == decision(value)
    if read.reader is _shapes:
        return _fits(read.pattern, value)
    leaves = int_leaves(value)
    return leaves is not None and _fits_flat(read.pattern, leaves)


#: The data-dependent reads of the acquisition in progress in this context, or None: values
#: are then refused, as where no inputs are at hand (``examine``, ``vmap``).
_active: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_value_reads", default=None)
active = _active.get


@contextlib.contextmanager
def reading(reads: ValueReads | None):
    """Answers the data-dependent reads of the acquisition in this context through ``reads``. The
    tensors they kept are dropped on a failure, else by ``first_outputs`` once the trace ends."""
    token = _active.set(reads)
    try:
        with noting_inputs(None if reads is None else reads.inputs):
            yield reads
    except BaseException:
        if reads is not None:
            reads.snapshots.forget()  # (the tensors computed while tracing: not kept past it)
        raise
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
