"""Write-backs: a compiled call leaves the caller's tensors as eager's in-place ops leave them.

While tracing, an in-place op rebinds the proxy of the tensor it writes
(``thunder_rs.torch.inplace``). When that tensor is a trace input (an argument, a module
parameter or buffer, a captured tensor), its final value becomes an extra output of the trace,
and the compiled call copies it into the caller's tensor after running: with autograd recording
the copy when eager's in-place op would have given the tensor history (it requires grad and is
not a leaf), under ``torch.no_grad()`` otherwise (buffers, tensors that do not require grad,
leaves written under ``no_grad``; those by one ``torch._foreach_copy_`` per dtype and device, their
version counters set to eager's counts). A module buffer reassigned in forward (``self.n = self.n + 1``,
which ``nn.Module.__setattr__`` stores in ``_buffers``) gets the new tensor in its slot. An output
that is a written input itself (``x.add_(1); return x``) is the caller's tensor, as in eager.

A fusion region may write such a buffer itself and return it (``WriteBacks.in_place``,
``Region.writes``: BatchNorm's running statistics in nvFuser regions); its copy is then skipped.

A value the call computed may share memory with a tensor it is about to overwrite (an input
read before the write, through ``contiguous()`` or a view the executor made); such values are
cloned before the copies, so the order of the copies cannot change what they write.
"""

from dataclasses import dataclass, field, replace

import torch

from thunder_rs.core.acquisition.module_memory import module_sharing, root_id
from thunder_rs.core.state.modules import write_epoch
from thunder_rs.core.lang.executor_api import torch_executor
from thunder_rs.core.lang.symint import SymInt, at_sizes
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.errors import ThunderNotImplementedError


@dataclass(frozen=True)
class WriteBacks:
    """What a compiled call does after running its trace, whose outputs are the program's
    ``num_outputs`` flat outputs followed by the values written back."""

    num_outputs: int
    #: how the program's outputs are returned: "single", "tuple" or "list"
    out_kind: str
    #: (trace input index, trace output index, whether autograd records the copy)
    copies: tuple
    #: (store, name, trace output index or None for None, whether it carries autograd history):
    #: module slots given a new value
    slots: tuple
    #: (output position, trace input index): outputs that are a written input itself
    aliases: tuple
    #: positions of the program's outputs that are tensors the call computes (a tensor the trace
    #: returns as a constant, ``return self.acc`` after a write through ``self.acc[0]``, is that
    #: tensor, which eager returns as the writes leave it: not cloned before the copies)
    tensor_outputs: tuple
    #: trace inputs that must not share memory with a written one: the arguments and captured
    #: tensors, and where one of those is written, the module's parameters and buffers too (an
    #: argument may be a view of one: eager's read of the buffer after the write sees it)
    separate: tuple = ()
    #: (output position, trace input index, view steps, how many of them eager's autograd takes
    #: again as ``as_strided``: ``views.ViewLink.rebased``): outputs that are a view of a written
    #: input (``cache[pos] = new; return cache[: pos + 1]``), taken of the caller's tensor after
    #: the copies, so they alias it as in eager
    views: tuple = ()
    #: the names (``t3``) of the trace's size inputs, its last inputs, in order: the symbolic
    #: sizes the views' steps take are computed from them on each call
    sizes: tuple = ()
    #: ``(start, stop)`` of the trace inputs that are the module's parameters and buffers
    module: tuple = (0, 0)
    #: the module binding's ``MetadataCheck``, which holds the tensors of its last calls: the written
    #: tensors are checked against them without reading each (``module_memory``); None for a function
    memory: object = field(default=None, compare=False)
    #: (trace input index, ("output", trace output index) or ("input", trace input index)): inputs
    #: given the memory of a value by ``t.data = value`` (``torch.data_setter``), given it as eager
    #: does, after the copies: their old memory, which other tensors may share, is left as it was
    rebinds: tuple = ()
    #: (trace input index, how many writes of the program bumped eager's version counter of its
    #: memory) of the copied inputs whose count is not the copy's one: set after the copies, so the
    #: caller's tensor (its views, its base) is at eager's version (``x.add_(1); x.mul_(2)``: two)
    versions: tuple = ()
    #: whether a slot goes from None to a tensor or back (``if self.k is None: self.k = ...`` on a
    #: buffer registered as None): the binding of the module's slots changes, which a call must
    #: say (``modules.write_epoch``), as ``nn.Module.__setattr__`` does for eager's write
    restructures: bool = False
    #: groups (of 2 or more) of the inputs written back without autograd that share a dtype and a
    #: device: each copied by one ``torch._foreach_copy_`` (``_untracked_lines``)
    batched: tuple = ()
    #: the module's tensors among the inputs written back without autograd whose final value has
    #: their dtype and shape: a fusion region computing it may write their memory itself
    #: (``Region.writes``), which the copies then skip (``_in_place_term``)
    in_place: tuple = ()

    @property
    def targets(self) -> tuple[int, ...]:
        """Trace inputs the call overwrites."""
        return tuple(k for k, _, _ in self.copies)

    @property
    def non_differentiable(self) -> frozenset:
        """Trace outputs written back without autograd: not differentiable outputs of the call."""
        untracked = [j for _, j, grad in self.copies if not grad]
        untracked += [j for _, (kind, j) in self.rebinds if kind == "output" and j >= self.num_outputs]
        untracked += [j for _, _, j, grad in self.slots if j is not None and not grad]
        return frozenset(untracked)


def plan(
    inputs: list,
    slot_values: list,
    out,
    out_kind: str,
    separate: tuple = (),
    sizes: tuple = (),
    module: tuple = (0, 0),
    writes=None,
):
    """The write-backs of a traced program, and the outputs its trace returns; ``(None, out)``
    when it wrote no input.

    ``inputs`` are the trace's input proxies in order; ``slot_values`` holds, for each module
    parameter or buffer slot, ``(store, name, input proxy, value in the slot after tracing)``;
    ``separate`` are the inputs (arguments, captured tensors) a call must not pass aliased with a
    written one: the trace took them as distinct tensors; ``sizes`` the names of its size inputs.
    Where one of them is written, no input may share its memory (a module's buffer an argument is
    a view of is read as the trace read it, before the write). ``module``: ``(start, stop)`` of the
    inputs that are the module's tensors. ``writes(proxy)``: how many writes of the program bumped
    eager's version counter of an input's memory (``SavedVersions.writes``; None: one each).
    """
    written = [(k, p) for k, p in enumerate(inputs) if p._vid != p._input_vid]
    if any(k in separate for k, _ in written):
        separate = tuple(range(len(inputs)))
    reassigned = [(d, n, v) for d, n, p, v in slot_values if v is not p]
    restructures = any((p is None) != (v is None) for _, _, p, v in slot_values)
    if not written and not reassigned:
        return None, out
    leaves = [out] if out_kind == "single" else list(out)
    extra: list = []
    copies = []
    rebinds = _rebinds(written, inputs, leaves, extra)
    rebound = {k for k, _ in rebinds}
    for k, p in written:
        if k not in rebound:
            copies.append((k, len(leaves) + len(extra), bool(p.requires_grad) and not p._leaf))
            extra.append(p)
    slots: list = []
    for d, n, v in reassigned:
        if v is not None and not isinstance(v, TensorProxy):
            raise ThunderNotImplementedError(
                f"module state: buffer {n!r} was given a {type(v).__name__} while tracing; a buffer may be given a "
                "tensor the program computes, or None"
            )
        if v is None:
            slots.append((d, n, None, False))
        else:
            slots.append((d, n, len(leaves) + len(extra), bool(v.requires_grad)))
            extra.append(v)
    position = {id(p): k for k, p in written}
    aliases = tuple((i, position[id(o)]) for i, o in enumerate(leaves) if id(o) in position)
    views = tuple(
        (i, position[id(link.root)], link.steps, _rebased(o, link))
        for i, o in enumerate(leaves)
        if (link := replayable_view(o, sizes)) is not None and id(link.root) in position and id(o) not in position
    )
    tensors = tuple(i for i, o in enumerate(leaves) if isinstance(o, TensorProxy))
    wb = WriteBacks(
        len(leaves),
        out_kind,
        tuple(copies),
        tuple(slots),
        aliases,
        tensors,
        tuple(separate),
        views,
        tuple(sizes),
        tuple(module),
        rebinds=rebinds,
        versions=tuple((k, n) for k, _, _ in copies if writes is not None and (n := writes(inputs[k])) != 1),
        restructures=restructures,
        batched=_batched(inputs, copies) if _set_counters is not None else (),
        in_place=_in_place(inputs, copies, extra, len(leaves), module),
    )
    return wb, tuple(leaves + extra)


def _in_place(inputs: list, copies: list, extra: list, first: int, module: tuple) -> tuple:
    """``WriteBacks.in_place``: the module's tensors copied without autograd from a value of their
    dtype and shape (``extra[j - first]`` is the value of output ``j``)."""
    start, stop = module
    found = []
    for k, j, grad in copies:
        value, target = extra[j - first], inputs[k]
        # (static shapes only: comparing symbolic sizes would guard on them)
        shapes = tuple(value.shape), tuple(target.shape)
        static = all(type(s) is int for shape in shapes for s in shape)
        if not grad and start <= k < stop and value.dtype == target.dtype and static and shapes[0] == shapes[1]:
            found.append(k)
    return tuple(found)


def _batched(inputs: list, copies: list) -> tuple:
    """``WriteBacks.batched``: the inputs copied without autograd, grouped by dtype and device."""
    groups: dict = {}
    for k, _, grad in copies:
        if not grad:
            groups.setdefault((inputs[k].dtype, inputs[k].device), []).append(k)
    return tuple(tuple(group) for group in groups.values() if len(group) > 1)


def _rebased(o, link) -> int:
    """``link.rebased`` of a returned view ``o`` that requires grad (``REFUSED_USE`` where eager's
    autograd refuses its use: ``refuse_rebased``), else 0."""
    with torch._C.DisableTorchFunctionSubclass():
        grad = o.requires_grad
    rebased = getattr(link, "rebased", 0) if grad else 0
    return refuse_rebased(o, link, rebased) if rebased else 0


def _rebinds(written: list, inputs: list, leaves: list, extra: list) -> tuple:
    """``WriteBacks.rebinds`` of the ``written`` inputs given a value's memory: the value an output
    of the trace (the program's own where it returns it, so that the two share memory as in eager,
    else one added to ``extra``) or the input it is. Refused, naming the line, where the input or
    the value was written in place after."""
    rebinds = []
    for k, p in written:
        if p._rebound is None:
            continue
        source, source_vid, own_vid, where = p._rebound
        p._rebound = None  # (read once: no computed tensor stays on the input's proxy)
        if p._vid != own_vid or source._vid != source_vid:
            raise ThunderNotImplementedError(
                f"Tensor.data = value at {where}: the tensor or the value is written in place (or given other "
                "memory) after, which eager makes in memory the two share and a traced program cannot; write the "
                "values in instead (with torch.no_grad(): tensor.copy_(value))"
            )
        if source._input_vid is not None:
            rebinds.append((k, ("input", next(m for m, q in enumerate(inputs) if q is source))))
        elif any(o is source for o in leaves):
            rebinds.append((k, ("output", next(i for i, o in enumerate(leaves) if o is source))))
        else:
            rebinds.append((k, ("output", len(leaves) + len(extra))))
            extra.append(source)
    return tuple(rebinds)


def replayable_view(o, sizes: tuple):
    """``o``'s view link when ``o`` is a view through steps torch calls can take again of a real
    tensor (shape prims, and view ops with an eager replay such as ``diagonal``) whose symbolic
    sizes are computed from the size inputs ``sizes`` (not from counts a call computes), else None."""
    link = getattr(o, "_view", None) if isinstance(o, TensorProxy) else None
    if link is None and isinstance(o, TensorProxy) and o._piece_of is not None:
        link = o._piece_of.link(o)  # (a piece of ``unsafe_split``, taken again by it)
    if link is None or not all(step.replayable for step in link.steps):
        return None
    # (an eager replay holds no symbolic size; a view op's replay holds those of its int arguments)
    params = [step.params for step in link.steps if step.is_prim]
    params += [step.call[1:3] for step in link.steps if step.is_prim and step.call is not None]
    params += [step.group[1:3] for step in link.steps if step.is_prim and step.group is not None]
    params += [step.eager_params for step in link.steps if not step.is_prim]
    read = {f"t{v}" for p in params for size in _symbolic(p) for v in size.expr.values()}
    return link if read <= set(sizes) else None


def _symbolic(params) -> list:
    """The symbolic sizes among ``params`` (nested in tuples, lists, dicts and slices)."""
    if isinstance(params, (tuple, list)):
        return [size for p in params for size in _symbolic(p)]
    if isinstance(params, dict):
        return _symbolic(tuple(params.values()))
    if isinstance(params, slice):
        return _symbolic((params.start, params.stop, params.step))
    return [params] if type(params) is SymInt else []


def _evaluator(params, names: tuple):
    """``params`` as a function of the size inputs' values (``names``, in order): a symbolic size
    is computed from them, as the compiled program computes its sizes."""
    sized = at_sizes(params)
    return lambda values: sized(dict(zip(names, values)))


def view_taker(steps, sizes: tuple = (), rebased: int = 0):
    """A function of a real tensor and the call's inputs, taking of the tensor the view ``steps``
    take of its proxy; symbolic sizes among their parameters are computed from the size inputs
    (``sizes``, the call's last inputs) of the call. The first ``rebased`` steps (a view of memory
    the program wrote since it was taken) by ``_rebased_taker``; where ``rebased`` is
    ``REFUSED_USE``, by ``_refused_taker``."""
    if rebased in (REFUSED_USE, REFUSED_NO_GRAD):
        return _refused_taker(view_taker(steps, sizes), rebased == REFUSED_NO_GRAD)
    if rebased:
        return _rebased_taker(steps, sizes, rebased)
    calls = eager_calls(steps)
    if not any(_symbolic(params) for _, params in calls):
        if len(calls) == 1:  # (one op: called at once, ~0.4 us a call less than the loop)
            ((op, args),) = calls
            take_one = lambda t, inputs: op(t, *args)  # noqa: E731
            take_one.op_call = (op, args)  # type: ignore[attr-defined]  # (``output_views.with_views``)
            return take_one

        def take(t, inputs):
            for call, params in calls:
                t = call(t, *params)
            return t

        return take
    evaluated = [(call, _evaluator(tuple(params), sizes)) for call, params in calls]
    n = len(sizes)

    def take_sized(t, inputs):
        values = inputs[len(inputs) - n :]
        for call, params in evaluated:
            t = call(t, *params(values))
        return t

    return take_sized


def _rebased_taker(steps, sizes: tuple, rebased: int):
    """Takes the view ``steps[:rebased]`` as eager's autograd makes a view's node again after a
    write to its memory: ``as_strided`` of the base at the view's sizes, strides and offset (an
    ``AsStridedBackward0``, ``_base`` the base), then the other steps by their own ops (a view taken
    of it after the write: ``y.mul_(2); v.t()`` a TBackward0 of the AsStridedBackward0). Where a
    step changes what ``as_strided`` cannot (the dtype, ``view_as_real``; a conjugate), eager
    replays the view ops up to it and takes ``as_strided`` of that, as here."""
    replays = [view_taker(steps[:k], sizes) for k in range(rebased + 1)]  # (a step alone may be part of an op)
    rest = view_taker(steps[rebased:], sizes)
    symbolic = bool(_symbolic([eager_calls(steps[:rebased])]))
    layouts: dict = {}  # (of a base with constant sizes: its layout -> the view's, offset relative to it)

    def take(t, inputs):
        key = None if symbolic else (t.dtype, t.is_conj(), t.is_neg(), t.shape, t.stride())
        known = layouts.get(key) if key is not None else None
        if known is not None:
            size, stride, offset = known
            return rest(t.as_strided(size, stride, t.storage_offset() + offset), inputs)
        last, at = 0, t
        with torch.no_grad():
            for k in range(1, rebased + 1):
                before, at = at, replays[k](t, inputs)
                if at.dtype != before.dtype or at.is_conj() != before.is_conj() or at.is_neg() != before.is_neg():
                    last = k
        if key is not None and not last and len(layouts) < 8:
            layouts[key] = (at.size(), at.stride(), at.storage_offset() - t.storage_offset())
        base = replays[last](t, inputs) if last else t
        return rest(base.as_strided(at.size(), at.stride(), at.storage_offset()), inputs)

    return take


#: ``rebased`` of a returned view whose use eager's autograd refuses (``refuse_rebased``): one of
#: several views an op made, and a view taken under ``no_grad``
REFUSED_USE, REFUSED_NO_GRAD = -1, -2


def refuse_rebased(o, link, rebased: int) -> int:
    """``rebased``, or ``REFUSED_USE`` for a returned view that requires grad whose memory the
    program wrote since it was taken, where eager's autograd refuses the view's use (its
    ``grad_fn``, an op with grad, an in-place write; not the call that returns it): a view taken
    under ``no_grad`` (``views._refuse_history``), and one of several views an op made (``unbind``,
    ``split``, ``chunk``, or a view of one: "Output 1 of Unbind is a view and its base or another
    view of its base has been modified inplace"), as eager answers for the view taken of a meta
    tensor whose version is bumped. Such a view is taken by eager's ops before its root's last
    bump (``_refused_taker``), so that torch refuses its use as eager's (or, for one eager's op made
    plain, makes its node again). Refused where that view's
    error would not be eager's: one of several views of memory that required no grad then (eager's
    has no node: "A view was created in no_grad mode ... returns multiple views"), a view taken
    with grad of one taken under ``no_grad`` ("The tensor is a view of a view which was created"),
    and views with steps taken after the write."""
    why, before = o._history_error, rebased == len(link.steps)  # (all its steps taken before the write)
    if why is not None and getattr(link, "no_grad", 0) == 1 and before:  # (``views.MADE_WITHOUT_GRAD``)
        return REFUSED_NO_GRAD
    if why is None and any(getattr(s, "group", None) is not None for s in link.steps[:rebased]):
        root_grad = getattr(link, "root_grad", True)
        if root_grad and before:  # (eager's ops then decide, as eager's: also at symbolic sizes)
            return REFUSED_USE
        why = _eager_refusal(link.root, link.steps[:rebased], root_grad)
    if why is not None:
        raise ThunderNotImplementedError(
            f"Tensor view: the program returns a view whose memory it wrote in place at {link.written_at}, and "
            f"eager's autograd refuses any use of the view: {why} A tensor a compiled call returns cannot do that; "
            "clone() the view before the write, or take it after the write"
        )
    return rebased


def _refused_taker(take, no_grad: bool):
    """``take`` (eager's view ops; under ``no_grad`` where ``no_grad``) run with the version of the
    tensor it takes the view of one short of its count, then set back: the view, as eager's, was
    taken before the last write of its memory, so that torch refuses its use where eager's
    autograd does (``refuse_rebased``)."""

    def take_before_write(t, inputs):
        version = 0 if t.is_inference() or _set_counters is None else t._version
        if version:
            _set_counters((t,), (version - 1,))
        try:
            if no_grad:
                with torch.no_grad():
                    view = take(t, inputs)
            else:
                view = take(t, inputs)
        finally:
            if version:
                _set_counters((t,), (version,))
        return view

    return take_before_write


def _eager_refusal(root, steps, root_grad: bool) -> str | None:
    """Eager's error at the ``grad_fn`` of the view ``steps`` take of a tensor like ``root`` (one
    that requires grad where ``root_grad``, else written with a value that does) once its memory is
    written, or None (also where the steps' sizes are symbolic)."""
    try:
        shape = tuple(int(getattr(n, "hint", n)) for n in root.shape)
        base = torch.empty(shape, dtype=root.dtype, device="meta", requires_grad=root_grad)
        base = base * 1 if root_grad else base
        view = view_taker(steps)(base, ())
        if root_grad:
            torch.autograd.graph.increment_version(base)
        else:
            base.add_(torch.empty(shape, dtype=root.dtype, device="meta", requires_grad=True))
    except Exception:  # (a symbolic size among the steps' parameters)
        return None
    try:
        view.grad_fn
    except RuntimeError as e:
        return str(e)
    return None


def eager_calls(steps) -> list:
    """``(torch call, params after the tensor)`` taking the view ``steps`` take: a shape prim's
    torch implementation, a view op's eager replay, and for the prims of an op returning several
    views (``step.group``), that op, so that the view is one of eager's multi-output views; for
    those of one returning one (``step.call``), that op, so that its autograd node is eager's."""
    registry = torch_executor().registry
    calls: list = []
    for step in steps:
        if not step.is_prim:
            calls.append((step.eager, step.eager_params))
            continue
        calls.append((registry[step.name].fn, step.params))
        if step.group is not None:
            op, args, kwargs, index, count = step.group
            del calls[len(calls) - count :]
            if _symbolic((args, kwargs)):  # (its int arguments at the call's sizes: ``view_taker``)
                calls.append((lambda t, a, k, op=op, i=index: op(t, *a, **k)[i], (args, kwargs)))
            else:
                calls.append((lambda t, *_, op=op, a=args, k=kwargs, i=index: op(t, *a, **k)[i], ()))
        elif step.call is not None:
            op, args, kwargs, count = step.call
            del calls[len(calls) - count :]
            if _symbolic((args, kwargs)):  # (its int arguments at the call's sizes: ``view_taker``)
                calls.append((lambda t, a, k, op=op: op(t, *a, **k), (args, kwargs)))
            elif not kwargs:  # (the op itself, called ``op(t, *args)``: no frame of ours around it)
                calls.append((op, tuple(args)))
            else:
                calls.append((lambda t, *_, op=op, a=args, k=kwargs: op(t, *a, **k), ()))
    return calls


_set_counters = getattr(torch._C._autograd, "_unsafe_set_version_counter", None)


def set_versions(tensors: tuple, bumps: tuple) -> None:
    """Moves the version counter of each of ``tensors`` (and of the tensors sharing it: its views,
    its base) on by its count in ``bumps`` (which may be negative: a copy eager's program did not
    make, its writes went through ``.data``); none of a tensor made under ``inference_mode``, which
    has no counter (as eager's writes leave it)."""
    kept = [(t, n) for t, n in zip(tensors, bumps) if n and not t.is_inference()]
    if not kept:
        return
    if _set_counters is not None:
        _set_counters(tuple(t for t, _ in kept), tuple(max(0, t._version + n) for t, n in kept))
        return
    for t, n in kept:  # (a torch without the setter: forward only)
        for _ in range(max(0, n)):
            torch.autograd.graph.increment_version(t)


def eager_versions(outputs: tuple, writes, skipped=()) -> tuple:
    """``(position, count)`` of the trace ``outputs`` in memory the program made (an input's is the
    write-backs') that writes of the program bumped eager's version counter of: the count (``writes``,
    ``SavedVersions.writes``) a call gives the tensor it returns there, and so the views taken of it,
    where its executor wrote it functionally (``y = x * 1; y[1:].mul_(2); return y[1:]``: one). Not
    at the positions ``skipped`` (``OutputViews.own``: views sharing their root's counter, or unused)."""
    found = []
    with torch._C.DisableTorchFunctionSubclass():
        for i, o in enumerate(outputs):
            if isinstance(o, TensorProxy) and i not in skipped:
                link = o._view
                root = o if link is None else link.root
                if root._input_vid is None and (n := writes(root)):
                    found.append((i, n))
    return tuple(found)


def with_versions(fn, versions: tuple, single: bool, forward: bool = False):
    """``fn`` (a trace's callable; a forward returning ``(outputs, residuals)`` where ``forward``)
    giving its outputs at the positions of ``versions`` (``eager_versions``) eager's counts; none
    to tensors made under ``inference_mode``, which have no counter."""
    if _set_counters is None:
        return fn
    positions, counts = tuple(i for i, _ in versions), tuple(n for _, n in versions)
    if len(versions) == 1 and not forward:  # (set only where the trace's own writes left another count)
        count, at = counts[0], positions[0]

        def call_single(*inputs):
            out = fn(*inputs)
            try:
                if (t := out if single else out[at])._version != count:
                    _set_counters((t,), counts)
            except RuntimeError:  # (an inference tensor)
                pass
            return out

        return call_single

    def call(*inputs):
        out = fn(*inputs)
        flat = out[0] if forward else out
        try:
            _set_counters((flat,) if single else tuple(flat[i] for i in positions), counts)
        except RuntimeError:  # (an inference tensor)
            pass
        return out

    return call


def _raise_aliased():
    raise ThunderNotImplementedError(
        "jit: a tensor the program writes in place was passed together with another argument, or held with a "
        "parameter or buffer of the module, that shares its memory (a view of it, or one sharing its storage); the "
        "compiled program took them as separate tensors (one tensor passed twice is one tensor to it)"
    )


def _shared_term(wb: WriteBacks, namespace: dict) -> str:
    """The generated test that a written input shares memory with another input the trace took as
    separate (``bases``: the written ones' roots): each argument and captured tensor is read; the
    module's tensors, where ``wb.memory`` holds them, are checked by ``module_memory``."""
    start, stop = wb.module
    others = [k for k in wb.separate if k not in wb.targets]
    in_module = tuple(k for k in others if start <= k < stop) if wb.memory is not None else ()
    terms = [f"len(bases) < {len(wb.targets)}"]
    terms += [f"root_id(inputs[{k}]) in bases" for k in others if k not in in_module]
    if in_module:
        namespace["module_shares"] = module_sharing(wb.memory, start, stop, wb.targets, in_module)
        terms.append("module_shares(inputs, bases)")
    return " or ".join(terms)


def _separate_lines(wb: WriteBacks, values: list, namespace: dict) -> list:
    """The lines that raise where a written input shares memory with another input the trace took
    as separate, and clone each value in ``values`` that shares a written input's memory. One
    written input and no other to check (``x.add_(1); x.mul_(2)``): its root compared with each
    value's, no set (~0.3 us a call less)."""
    if len(wb.targets) == 1 and not [k for k in wb.separate if k not in wb.targets]:
        if not values:
            return []
        # (``root_id`` inline: the storage's address, else the tensor's id)
        (k,) = wb.targets
        lines = [f"    base = inputs[{k}].untyped_storage().data_ptr() or id(inputs[{k}])"]
        term = "(o{0}.untyped_storage().data_ptr() or id(o{0})) == base"
    else:
        lines = [f"    bases = {{{', '.join(f'root_id(inputs[{k}])' for k in wb.targets)}}}"]
        lines.append(f"    if {_shared_term(wb, namespace)}: raise_aliased()")
        term = "root_id(o{0}) in bases"
    lines.extend(f"    if {term.format(j)}: o{j} = o{j}.clone()" for j in values)
    return lines


def with_writebacks(fn, wb: WriteBacks):
    """``fn`` (the trace's callable, returning a tuple) followed by ``wb``'s copies, returning the
    program's outputs. The copies are generated code, so the per-call cost is a few lines."""
    namespace = {
        "fn": fn,
        "grad_enabled": torch.is_grad_enabled,
        "set_grad_enabled": torch._C._set_grad_enabled,
        "root_id": root_id,
        "raise_aliased": _raise_aliased,
    }
    lines = ["def call(*inputs):", "    outs = fn(*inputs)"]
    aliased = dict(wb.aliases)
    viewed = {i for i, _, _, _ in wb.views}  # taken of the caller's tensor after the copies instead
    values = [j for j in wb.tensor_outputs if j not in aliased and j not in viewed]
    values += [j for _, j, _ in wb.copies] + [j for _, _, j, _ in wb.slots if j is not None]
    values += [j for _, (kind, j) in wb.rebinds if kind == "output" and j not in values]
    in_place = [(k, j) for k, j, grad in wb.copies if not grad and k in wb.in_place]
    if in_place and (len(wb.targets) > 1 or [k for k in wb.separate if k not in wb.targets]):
        # (refused before the call: its regions may write the inputs)
        lines[1:1] = [f"    bases = {{{', '.join(f'root_id(inputs[{k}])' for k in wb.targets)}}}"]
        lines[2:2] = [f"    if {_shared_term(wb, namespace)}: raise_aliased()"]
    for j in values:
        lines.append(f"    o{j} = outs[{j}]")
    if in_place:
        # (the outputs a region wrote into their inputs: ``Region.writes``; the trace's function of
        # a backward returns an input as a view of it, ``Function``'s outputs that are its inputs)
        term = " and ".join(f"(o{j} is inputs[{k}] or o{j}._base is inputs[{k}])" for k, j in in_place)
        written = _without_in_place(wb)
        lines.append(f"    if {term}:")
        kept = [j for j in values if j not in {j for _, j in in_place}]
        lines.extend("    " + line for line in _copy_lines(written, kept, namespace) or ["    pass"])
        counts = dict(wb.versions)
        bumps = tuple((k, counts.get(k, 1) + 1) for k, _ in in_place if counts.get(k, 1))
        lines.extend("    " + line for line in _version_lines(bumps, namespace))
        lines.append("    else:")
        lines.extend("    " + line for line in _copy_lines(wb, values, namespace))
    else:
        lines.extend(_copy_lines(wb, values, namespace))
    for i, (store, name, j, _) in enumerate(wb.slots):
        namespace[f"store{i}"] = store
        lines.append(f"    store{i}[{name!r}] = {'None' if j is None else f'o{j}'}")
    if wb.restructures:
        namespace["epoch"] = write_epoch
        lines.append("    epoch[0] += 1")
    results = [
        f"inputs[{aliased[i]}]" if i in aliased else f"o{i}" if i in values else f"outs[{i}]"
        for i in range(wb.num_outputs)
    ]
    for i, k, steps, rebased in wb.views:
        namespace[f"view{i}"] = view_taker(steps, wb.sizes, rebased)
        results[i] = f"view{i}(inputs[{k}], inputs)"
    if wb.out_kind == "single":
        lines.append(f"    return {results[0]}")
    elif wb.out_kind == "list":
        lines.append(f"    return [{', '.join(results)}]")
    else:
        lines.append(f"    return ({''.join(r + ', ' for r in results)})")
    exec(compile("\n".join(lines), "<thunder_rs write-backs>", "exec"), namespace)
    return namespace["call"]


def _without_in_place(wb: WriteBacks) -> WriteBacks:
    """``wb`` without the copies of ``wb.in_place`` (a region wrote those inputs itself)."""
    done = set(wb.in_place)
    copies = tuple(c for c in wb.copies if c[2] or c[0] not in done)
    groups = tuple(g for g in (tuple(k for k in group if k not in done) for group in wb.batched) if len(g) > 1)
    versions = tuple(v for v in wb.versions if v[0] not in done)
    return replace(wb, copies=copies, batched=groups, versions=versions, in_place=())


def _copy_lines(wb: WriteBacks, values: list, namespace: dict) -> list:
    """The write-backs' lines (indented by 4) from the copies' to the versions' (``with_writebacks``)."""
    lines: list = []
    if wb.copies:
        lines.extend(_separate_lines(wb, values, namespace))
    untracked = [(k, j) for k, j, grad in wb.copies if not grad]
    if untracked:
        # (``torch.no_grad()``'s enter and exit, ~1.2 us a call, as the two calls they make)
        copies = _untracked_lines(wb, untracked, namespace)
        lines.append("    if grad_enabled():")
        lines.append("        set_grad_enabled(False)")
        lines.append("        try:")
        lines.extend("        " + line for line in copies)
        lines.append("        finally:")
        lines.append("            set_grad_enabled(True)")
        lines.append("    else:")
        lines.extend("    " + line for line in copies)
    lines.extend(f"    inputs[{k}].copy_(o{j})" for k, j, grad in wb.copies if grad)
    for k, (kind, j) in wb.rebinds:  # (``.data =``: autograd does not see it)
        lines.append(f"    inputs[{k}].data = {f'o{j}' if kind == 'output' else f'inputs[{j}]'}")
    batched = {k for group in wb.batched for k in group}
    lines.extend(_version_lines(tuple(v for v in wb.versions if v[0] not in batched), namespace))
    return lines


def _untracked_lines(wb: WriteBacks, untracked: list, namespace: dict) -> list:
    """The lines (indented by 4) copying the values written back without autograd: one
    ``torch._foreach_copy_`` per group of ``wb.batched`` (one launch on CUDA where a ``copy_``
    each made one: BatchNorm's running statistics, 3 per layer), each other by its ``copy_``.
    ``_foreach_copy_`` bumps the targets' version counters or not (not under a dispatch mode), so
    they are set to eager's counts after it, from those read before; where one has no counter (an
    inference tensor), the group is copied one by one, its versions moved as ``set_versions`` does."""
    value_of = dict(untracked)
    grouped = {k for group in wb.batched for k in group}
    lines = [f"    inputs[{k}].copy_(o{j})" for k, j in untracked if k not in grouped]
    if not wb.batched:
        return lines
    counts = dict(wb.versions)
    namespace.update(foreach_copy=torch._foreach_copy_, set_counters=_set_counters, set_versions=set_versions)
    for g, group in enumerate(wb.batched):
        targets = "".join(f"inputs[{k}], " for k in group)
        bumps = [counts.get(k, 1) for k in group]
        lines += ["    try:", f"        b{g} = ({''.join(f'inputs[{k}]._version, ' for k in group)})"]
        lines += ["    except RuntimeError:", f"        b{g} = None", f"    if b{g} is None:"]
        lines += [f"        inputs[{k}].copy_(o{value_of[k]})" for k in group]
        lines.append(f"        set_versions(({targets}), ({''.join(f'{n - 1}, ' for n in bumps)}))")
        lines += ["    else:", f"        foreach_copy(({targets}), ({''.join(f'o{value_of[k]}, ' for k in group)}))"]
        after = "".join(f"b{g}[{i}] + {n}, " for i, n in enumerate(bumps))
        lines.append(f"        set_counters(({targets}), ({after}))")
    return lines


#: bumps the version counter of each tensor of a sequence once per time it is listed (none of a
#: tensor made under ``inference_mode``, which has none): one C call, ~0.1 us
_increment = getattr(torch._C, "_increment_version", None)


def _version_lines(versions: tuple, namespace: dict) -> list:
    """The write-backs' lines leaving each input of ``versions`` (``WriteBacks.versions``) at eager's
    count, after the copies, each of which bumped its tensor's version once: a few more bumps by one
    ``_increment_version`` call (``x.add_(1); x.mul_(2)``: one more), else the counter set."""
    lines: list = []
    bumped = [(k, n) for k, n in versions if 1 < n <= 9] if _increment is not None else []
    if bumped:
        namespace["increment"] = _increment
        lines.append(f"    increment(({''.join(f'inputs[{k}], ' * (n - 1) for k, n in bumped)}))")
    versions = tuple(v for v in versions if v not in bumped)
    if not versions:
        return lines
    namespace.update(set_versions=set_versions, set_counters=_set_counters)
    tensors = "".join(f"inputs[{k}], " for k, _ in versions)
    counts = "".join(f"inputs[{k}]._version + {n - 1}, " for k, n in versions)
    fallback = f"set_versions(({tensors}), ({''.join(f'{n - 1}, ' for _, n in versions)}))"
    if _set_counters is None:
        lines.append(f"    {fallback}")
    else:  # (a tensor made under inference_mode has no counter: ``set_versions`` leaves it)
        lines.extend(["    try:", f"        set_counters(({tensors}), ({counts}))", "    except RuntimeError:"])
        lines.append(f"        {fallback}")
    return lines
