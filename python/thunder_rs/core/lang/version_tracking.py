"""The in-place writes inside a traced program that make eager's backward refuse it: one
acquisition's bookkeeping of the program's calls and writes (``SavedVersions``).

Eager's autograd node of a differentiable call keeps the tensors its backward formula reads
(``derivatives.yaml``: ``self`` of ``sin``, ``result`` of ``exp``/``sigmoid``/``relu``, each factor
of ``mul`` only where the other needs a gradient) with the version of their memory then. An
in-place write to that memory before the backward (a write through any view of it bumps the one
version counter they share) makes the backward that runs the node raise "one of the variables
needed for gradient computation has been modified by an inplace operation". The trace is
functional: it would compute the gradient from the old values, silently another result. So,
while a program is traced:

- each of the program's own torch calls (the language context's calls at depth 0) made with grad
  on is noted (``note_call``: one append), with its outputs' value ids and the arguments its op
  ran on (``note_arguments``: captured tensors lifted, autocast's casts, whose copies eager saves);
- at an in-place write that bumps eager's version counter (``written``), the calls noted since the
  last write are indexed by the memory their tensors belong to (the root proxy of a view), with
  their tensors' requires-grad flags then; the calls that touched the written memory since its
  last write are asked which tensors eager saves (``saved_versions``: eager's own answer);
- a call that saved the written memory is stale. The acquisition keeps, per stale call, its
  outputs' value ids and eager's error (``stale``); the compiled call's backward raises it when
  the backward reaches one of the program's outputs computed from those values along gradients
  (``Trace.outputs_reaching``), as eager's backward raises when it runs that node: also a double
  backward, and a backward under ``torch.func.grad`` (``run.autograd._raising_backward``). A
  forward alone never raises; a call made under ``saved_tensors_hooks`` does not either (eager
  checks no version of a tensor its pack hook took).

Custom ``autograd.Function``s say what they save themselves (``ctx.save_for_backward``:
``note_saved``). A write through ``.data`` to a saved tensor, which eager's backward reads
unchecked, is refused by the compile where a backward from the outputs reaches the node. The
error's text (``saved_errors``) names the node the tensor is an output of as eager's does
(``SavedVersions.node``), and counts versions from the trace inputs' versions at the call.
"""

import contextlib
import contextvars
import weakref

import torch
from torch._C import DisableTorchFunctionSubclass

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.base.userframe import user_location
from thunder_rs.core.lang.saved_errors import (
    UNKNOWN,
    UNSEEN,
    refusal,
    AT_CALL,
    MULTI_VIEW,
    MULTI_VIEW_NO_NODE_WRITTEN,
    MULTI_VIEW_WRITTEN,
    StaleSave,
    where_note,
)
from thunder_rs.core.lang.saved_ops import KERNEL_CHOICES, SAVES_NO_OUTPUT, SAVES_NOTHING
from thunder_rs.core.lang.saved_versions import (
    NO_GRAD_MULTI,
    NOT_MULTI,
    _Call,
    _Tensor,
    _described,
    _fused,
    _kernel_node,
    _leaves,
    _node_of,
    _root,
    _saved_by,
)
from thunder_rs.errors import ThunderRuntimeError

_active: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_saved_versions", default=None)


_is_grad_enabled = torch.is_grad_enabled


#: The node eager's autograd gives a base written through a view of it
_COPY_SLICES = ("torch::autograd::CopySlices", 0)


class SavedVersions:
    """The bookkeeping of one acquisition (see the module doc)."""

    def __init__(self):
        self.calls: list[_Call] = []
        #: per memory (root proxy id): the calls that touched it since its last write
        self.pending: dict[int, list[_Call]] = {}
        #: per memory: its writes so far (eager's version counter, from the trace's start)
        self.versions: dict[int, int] = {}
        #: per memory written: a weak reference to its root proxy (``writes``)
        self.roots: dict[int, weakref.ref] = {}
        self.stale: list[tuple] = []
        #: ``(func, (args, kwargs))`` the call in progress runs its op on (``note_arguments``)
        self.arguments: tuple | None = None
        #: per memory: the call that made it, and its output that is the memory's tensor
        self.makers: dict[int, tuple] = {}
        #: per memory: the node eager's autograd gave it at its last write autograd saw (``_COPY_SLICES``,
        #: or the writing call and its tensor, which a run again names); None where unknown
        self.nodes: dict[int, tuple | None] = {}
        #: the memories written by the call in progress, whose node that call gives (``wrote``)
        self.writing: list[int] = []
        #: per proxy (its id) that is one of the views a call made several of: ``(a weak reference
        #: to it, the call, its output)``; eager refuses their use once their memory is written
        self.multi_views: dict[int, tuple] = {}

    def index(self) -> None:
        calls, self.calls = self.calls, []
        with DisableTorchFunctionSubclass():
            for call in calls:
                made: dict = {}
                call.args = _described(call.args, made)
                for pid, t in made.items():
                    entry = self.multi_views.get(pid)
                    if entry is not None and entry[0]() is not None:  # (alive: the id is still its)
                        t.multi = entry[1:]
                taken, arg_tensors = {id(t.root) for t in made.values()}, tuple(made.values())
                proxies = call.outs
                call.outs = tuple(_described(o, made) for o in call.outs)
                if _multi_view_call(call, arg_tensors):
                    for p, o in zip(proxies, call.outs):
                        prior = self.multi_views.get(id(p))  # (a view the trace gives its input's proxy)
                        prior = prior[1:] if prior is not None and prior[0]() is p else None
                        self.multi_views[id(p)] = (weakref.ref(p), call, o, prior)
                for key in {id(t.root) for t in made.values()}:
                    self.pending.setdefault(key, []).append(call)
                for o in call.outs:  # (an in-place call returns the tensor it took: not its maker)
                    if not o.view and id(o.root) not in taken:
                        self.makers.setdefault(id(o.root), (call, o))

    def wrote(self, func, arguments: tuple, out) -> None:
        """The call in progress (``func`` of ``arguments``, returning ``out``) wrote ``writing``."""
        keys, self.writing = self.writing, []
        made: dict = {}
        with DisableTorchFunctionSubclass():
            args = _described(arguments, made)
            outs = _leaves(out, TensorProxy)
            call = _Call(func, args, tuple(_described(o, made) for o in outs), tuple(o._vid for o in outs))
        for key in keys:
            dst = next((t for t in made.values() if id(t.root) == key and not t.view), None)
            if dst is not None:
                self.nodes[key] = (call, dst)

    def written(self, root, op: str, counted: bool, node: str | None = None) -> None:
        self.index()
        key = id(root)
        if node == "view":
            self.nodes[key] = _COPY_SLICES
        elif node == "call":
            self.nodes[key] = None
            self.writing.append(key)
        version = self.versions.get(key, 0)
        self.versions[key] = version + counted
        if key not in self.roots or self.roots[key]() is not root:
            self.roots[key] = weakref.ref(root)
        for call in self.pending.pop(key, ()):
            if call.func in SAVES_NOTHING or (call.func in SAVES_NO_OUTPUT and _only_output(call, key)):
                continue  # (eager's answer, known without running the call again)
            if call.saved is None:
                call.saved = _saved_by(call)
            saved = call.saved.get(key) if call.saved is not False else _any_of(call, key)
            if saved is not None:
                why = UNSEEN if not counted else UNKNOWN if call.saved is False else None
                self.stale.append((call, saved, key, version, op, user_location(), why))

    def writes(self, root) -> int:
        """How many writes of the program bumped eager's version counter of the memory of ``root``
        (a root proxy: an input's, or a tensor the program made), the writes a call's outputs and
        written inputs are given (``writeback.eager_versions``)."""
        ref = self.roots.get(id(root))
        return self.versions.get(id(root), 0) if ref is not None and ref() is root else 0

    def release(self) -> tuple:
        """``(error, value ids)`` per stale call: what its node's backward raises, and the
        values it computed, through which a backward reaches it. Forgets the calls and proxies."""
        out = []
        for call, saved, key, version, op, where, why in self.stale:
            node = None if why is not None else self.node(call, saved, key)
            error = StaleSave(
                saved,
                node,
                version,
                self.versions[key],
                where_note(call.name, op, where),
                refusal(call.name, saved, op, where, why),
                saved.root._input_vid,
                why is UNSEEN,
            )
            out.append((error, call.vids))
        self.calls, self.pending, self.stale, self.arguments = [], {}, [], None
        self.makers, self.nodes, self.multi_views = {}, {}, {}
        return tuple(out)

    def node(self, call: _Call, saved: _Tensor, key: int):
        """The node eager's error names for ``saved`` (``saved_errors``): the saving call's for one
        of its outputs; for one of its inputs, its own ``grad_fn`` at the backward."""
        if call.func is None:  # (a custom Function's node: its class name and ``Backward``)
            i = next((i for i, o in enumerate(call.outs) if o.root is saved.root and not saved.view), None)
            if i is not None:
                return call.label.removesuffix(".apply").rsplit(".", 1)[-1], i
        elif any(o.root is saved.root for o in call.outs) and (kernel := _kernel_node(call)) is not None:
            return kernel[0], 0  # (its node's output, the kernel's, which a run again does not choose)
        elif any(o is saved for o in call.outs):
            return _node_of(call, saved)
        if saved.view:  # (a view of memory written since: autograd makes its node again)
            if not (saved.requires_grad or key in self.nodes):
                return None
            if saved.multi is not None:  # (which eager refuses for one of several views a call made)
                node = _multi_node(saved.multi)
                node = None if node is NO_GRAD_MULTI else node
                if node is not NOT_MULTI:
                    return None if node is None else (MULTI_VIEW, *node)
            return ("AsStrided", 0)
        if key in self.nodes:
            node = self.nodes[key]
            return node if node is None or type(node[0]) is str else _node_of(*node)
        made = self.makers.get(key)
        if made is not None:
            return _node_of(*made) if made[1].requires_grad else None
        return AT_CALL if saved.root._input_vid is not None else None


@contextlib.contextmanager
def tracking():
    """Notes the calls and writes of the acquisition in this context (``SavedVersions``)."""
    state = SavedVersions()
    token = _active.set(state)
    try:
        yield state
    finally:
        _active.reset(token)


def note_arguments(func, args: tuple, kwargs: dict) -> None:
    """The arguments the program's call of ``func`` in progress runs its op on: captured tensors
    lifted to proxies, and cast by autocast (eager's op saves the cast copy, not the tensor)."""
    state = _active.get()
    if state is not None:
        state.arguments = (func, (args, kwargs))


def note_call(func, args: tuple, kwargs: dict, out) -> None:
    """Notes a torch call of the program (made at depth 0) with its result."""
    state = _active.get()
    if state is None:
        return
    noted, state.arguments = state.arguments, None
    arguments = noted[1] if noted is not None and noted[0] is func else (args, kwargs)
    if state.writing:
        state.wrote(func, arguments, out)
    if _is_grad_enabled():
        outs = _leaves(out, TensorProxy)
        if outs:
            call = _Call(func, arguments, outs, tuple(o._vid for o in outs))
            call.several = isinstance(out, (tuple, list))
            choice = KERNEL_CHOICES.get(func)
            if choice is not None:  # (the switches the call ran under: a context may end before a write)
                with DisableTorchFunctionSubclass():
                    if any(o.requires_grad for o in outs):
                        call.fused = _fused(choice[0], arguments)
            state.calls.append(call)


def note_view(func, args: tuple, out, itself: bool = False) -> None:
    """Notes ``out``, a view the trace takes as eager's ``func(*args)`` inside another call (``a[key] = v``
    writes through ``a[key]``), or where ``itself``, as eager's ``args[0]`` itself (``a[:] = v`` writes
    into ``a``): a write through it into one of several views is refused as eager's."""
    state = _active.get()
    if state is None or not _is_grad_enabled():
        return
    if not itself:
        state.calls.append(_Call(func, (args, {}), (out,), (out._vid,)))
        return
    state.index()
    entry = state.multi_views.get(id(args[0]))
    if entry is not None and entry[0]() is args[0]:
        state.multi_views[id(out)] = (weakref.ref(out), *entry[1:])


def note_saved(name: str, saved: tuple, outs: tuple) -> None:
    """Notes a custom ``autograd.Function``'s call, which saved ``saved`` (its
    ``ctx.save_for_backward``) for a backward eager runs when it reaches ``outs``."""
    state = _active.get()
    if state is None or not _is_grad_enabled():
        return
    outs = _leaves(outs, TensorProxy)
    with DisableTorchFunctionSubclass():
        if not any(o.requires_grad for o in outs):
            return
        kept = {id(t.root): t for t in map(_Tensor, _leaves(saved, TensorProxy))}
    state.calls.append(_Call(None, saved, outs, tuple(o._vid for o in outs), kept, name))


def read_since_made(t) -> bool:
    """Whether a call of the program other than the one that made ``t`` took ``t``'s memory since
    it was made or last written (with grad on; True when no acquisition notes calls). ``detach_``
    of it is then refused: eager's backward of a call that saved it rejects a tensor detached in
    place ("Trying to use a saved tensor that has been detached in-place")."""
    state = _active.get()
    if state is None:
        return True
    state.index()
    key = id(_root(t))
    maker = state.makers.get(key)
    return any(maker is None or call is not maker[0] for call in state.pending.get(key, ()))


def written(dst, op: str, counted: bool = True, node: str | None = None) -> None:
    """An in-place write into ``dst``, which bumps eager's version counter of its memory unless
    not ``counted`` (a write through ``.data``: eager's backward then reads the new values), and
    gives it the autograd node ``node``: none, ``"view"`` (``CopySlices``) or ``"call"`` (that of
    the program's call in progress)."""
    state = _active.get()
    if state is not None:
        state.written(_root(dst), op, counted, node)
        if node == "view":
            _refuse_multi_view(state, dst, op)


def _refuse_multi_view(state: SavedVersions, dst, op: str) -> None:
    """Raises eager's error for a write autograd sees into one of several views a call made
    (``unbind``, ``chunk``) of memory that requires grad."""
    entry = state.multi_views.get(id(dst))
    if entry is None or entry[0]() is not dst:
        return
    node = _multi_node(entry[1:])
    if node is NO_GRAD_MULTI:  # (eager's view has no node: its memory requires no grad, the value does)
        raise ThunderRuntimeError(f"{MULTI_VIEW_NO_NODE_WRITTEN} ({op} at {user_location()})")
    if node is not None and node is not NOT_MULTI:
        raise ThunderRuntimeError(f"{MULTI_VIEW_WRITTEN.format(node[1], node[0])} ({op} at {user_location()})")


def _multi_view_call(call: _Call, args: tuple) -> bool:
    """Whether ``call``'s outputs are views eager marks as of a function that returns several (``unbind``,
    ``split``, a sequence of one: eager probed by ``_multi_node``), or views of such a view among its
    ``args``, named by their own node (``a[0]``: Select)."""
    outs = call.outs
    if not outs or not all(o.view for o in outs) or len({id(o.root) for o in outs}) != 1:
        return False
    return call.several or any(t.multi is not None and t.root is outs[0].root for t in args)


def _multi_node(entry: tuple) -> tuple | None:
    """The node eager's error names for one of several views a call made, or a view of one (``entry``:
    ``(call, its output, the output proxy's prior entry)``); the prior's where eager's op returned its
    input itself (``contiguous`` of a contiguous tensor), whose proxy the trace gave the output."""
    call, out, prior = entry
    if not call.several:  # (a view of one is as eager made that one: a slice of tensor_split's is plain)
        of = next((t.multi for t in _leaves(call.args, _Tensor) if t.multi is not None and t.root is out.root), None)
        outer = None if of is None else _multi_node(of)
        if outer is NOT_MULTI or outer is NO_GRAD_MULTI:  # (a view of one of memory requiring no grad: no node)
            return outer
    node = _node_of(call, out, _ITSELF, multi=call.several)  # (a view of one: its own probe is plain)
    if node is _ITSELF:
        return None if prior is None else _multi_node(prior)
    return node


_ITSELF = ("itself", 0)  # (``_node_of``'s answer where the call returned its input itself)


def _only_output(call: _Call, key: int) -> bool:
    """Whether memory ``key`` is among ``call``'s outputs' only, not its arguments'."""
    return all(id(t.root) != key for t in _leaves(call.args, _Tensor))


def _any_of(call: _Call, key: int):
    """The first of ``call``'s tensors in memory ``key``: what an unknown call is taken to save."""
    return next((t for t in call.tensors() if id(t.root) == key), None)
