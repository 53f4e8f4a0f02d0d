"""What eager's autograd saves for a backward, and the in-place writes inside a traced program
that make eager's backward refuse it.

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
  last write are asked which tensors eager saves: the call is run again on CPU tensors of zeros
  (meta tensors where they hold more than ``_CPU_ELEMENTS``) of the same shapes, strides, dtypes
  and flags, and the saved tensors of the autograd nodes it made (``grad_fn._saved_*``) are
  matched to its arguments and outputs by storage. So the answer is eager's own, for every op:
  composite ones (``F.linear`` saves a view of its weight), conditional saving, in-place
  activations (``relu_`` saves its result, after its own write). It is kept per op and arguments'
  metadata; the ops most programs write the results of (a ReLU after a convolution,
  ``out += identity``) and the one-tensor aten ops (``sigmoid``, ``tanh``, ``exp``: ``saved_aten``,
  from ``derivatives.yaml``) are answered by ``saved_ops`` without a run (a first meta run imports
  sympy, and for some ops ``torch._dynamo``, through torch's Python meta kernels: seconds);
- a call that saved the written memory is stale. The acquisition keeps, per stale call, its
  outputs' value ids and eager's error (``stale``); the compiled call's backward raises it when
  the backward reaches one of the program's outputs computed from those values along gradients
  (``Trace.outputs_reaching``), as eager's backward raises when it runs that node: also a double
  backward, and a backward under ``torch.func.grad`` (``run.autograd._raising_backward``). A
  forward alone never raises; a call made under ``saved_tensors_hooks`` does not either (eager
  checks no version of a tensor its pack hook took).

A call that runs neither on (small enough) CPU tensors of zeros nor on meta tensors is taken to
save every tensor it takes and returns; its backward then raises a ``ThunderNotImplementedError``
that says so, rather than a gradient that may differ from eager's. Custom ``autograd.Function``s
say what they save themselves (``ctx.save_for_backward``: ``note_saved``). A write through
``.data`` to a saved tensor, which eager's backward reads unchecked, is refused by the compile
where a backward from the outputs reaches the node. The error's text (``saved_errors``) names the
node the tensor is an output of as eager's does (``node``: the calls run again for it, on this
path only), and counts versions from the trace inputs' versions at the call.
"""

import contextlib
import contextvars
import math
import warnings
import weakref

import torch
from torch._C import DisableTorchFunction, DisableTorchFunctionSubclass

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.base.userframe import user_location
from thunder_rs.core.lang.saved_errors import (
    UNKNOWN,
    UNSEEN,
    refusal,
    AT_CALL,
    MULTI_VIEW,
    MULTI_VIEW_WRITTEN,
    StaleSave,
    node_name,
    where_note,
)
from thunder_rs.core.lang.saved_ops import (
    ONE_TENSOR_OPS,
    KERNEL_CHOICES,
    KERNEL_NODES,
    SAVES_EVERY_TENSOR_ON_CUDA,
    kernel_node,
    SAVES_NO_OUTPUT,
    SAVES_NOTHING,
    wrapped_saves,
)
from thunder_rs.core.lang.recorder import paused_recording
from thunder_rs.core.lang.symint import SymInt
from thunder_rs.errors import ThunderRuntimeError

_get_creation_meta = torch._C._autograd._get_creation_meta
_MULTI_OUTPUT_NODE = torch._C._autograd.CreationMeta.MULTI_OUTPUT_NODE

_functorch = torch._C._functorch
_active: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_saved_versions", default=None)
_is_grad_enabled = torch.is_grad_enabled
#: The node eager's autograd gives a base written through a view of it
_COPY_SLICES = ("torch::autograd::CopySlices", 0)


class _Tensor:
    """A tensor of a noted call as it was then, standing for its proxy once the call is indexed
    (a proxy kept would keep a view alive, which every write to its root then recomputes)."""

    __slots__ = ("root", "view", "shape", "strides", "dtype", "device", "requires_grad", "multi")

    def __init__(self, p, real: bool = False):
        self.root = p if real else _root(p)
        self.view = p._base is not None if real else p._view is not None
        #: for one of the views a call made several of (``unbind``, ``chunk``): that call and its output
        self.multi: tuple | None = None
        self.shape = tuple(_hint(n) for n in p.shape)
        self.strides = (None if p.is_contiguous() else tuple(p.stride())) if real else _strides(p)
        self.dtype, self.device, self.requires_grad = p.dtype, p.device, p.requires_grad


class _Call:
    """One of the program's torch calls made with grad on: its arguments and outputs (proxies,
    ``_Tensor``s once indexed), and, once asked, the memories (root ids) eager saves of them."""

    __slots__ = ("label", "func", "args", "outs", "vids", "saved", "fused")

    def __init__(self, func, args: tuple, outs: tuple, vids: tuple, saved: dict | None = None, label: str = ""):
        self.func, self.args, self.outs, self.vids, self.label = func, args, outs, vids, label
        #: ``{root id: the saved _Tensor}``; None until asked; False when eager's answer is unknown
        self.saved = saved
        #: for an op of ``KERNEL_CHOICES``: whether eager ran a fused kernel, as the switches were
        self.fused: bool | None = None

    @property
    def name(self) -> str:
        return self.label or _name(self.func)

    def tensors(self) -> tuple:
        return (*_leaves(self.args, _Tensor), *self.outs)


class SavedVersions:
    """The bookkeeping of one acquisition (see the module doc)."""

    def __init__(self):
        self.calls: list[_Call] = []
        #: per memory (root proxy id): the calls that touched it since its last write
        self.pending: dict[int, list[_Call]] = {}
        #: per memory: its writes so far (eager's version counter, from the trace's start)
        self.versions: dict[int, int] = {}
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
        for call in self.pending.pop(key, ()):
            if call.func in SAVES_NOTHING or (call.func in SAVES_NO_OUTPUT and _only_output(call, key)):
                continue  # (eager's answer, known without running the call again)
            if call.saved is None:
                call.saved = _saved_by(call)
            saved = call.saved.get(key) if call.saved is not False else _any_of(call, key)
            if saved is not None:
                why = UNSEEN if not counted else UNKNOWN if call.saved is False else None
                self.stale.append((call, saved, key, version, op, user_location(), why))

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
            choice = KERNEL_CHOICES.get(func)
            if choice is not None:  # (the switches the call ran under: a context may end before a write)
                with DisableTorchFunctionSubclass():
                    if any(o.requires_grad for o in outs):
                        call.fused = _fused(choice[0], arguments)
            state.calls.append(call)


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
    with DisableTorchFunctionSubclass():
        if not _root(dst).requires_grad:
            return
    node = _multi_node(entry[1:])
    if node is not None and node is not NOT_MULTI:
        raise ThunderRuntimeError(f"{MULTI_VIEW_WRITTEN.format(node[1], node[0])} ({op} at {user_location()})")


def _multi_view_call(call: _Call, args: tuple) -> bool:
    """Whether ``call``'s outputs are views eager marks as of a function that returns several (``unbind``,
    ``split``), or views of such a view among its ``args``, named by their own node (``a[0]``: Select)."""
    outs = call.outs
    if not outs or not all(o.view for o in outs) or len({id(o.root) for o in outs}) != 1:
        return False
    return len(outs) > 1 or any(t.multi is not None and t.root is outs[0].root for t in args)


def _multi_node(entry: tuple) -> tuple | None:
    """The node eager's error names for one of several views a call made, or a view of one (``entry``:
    ``(call, its output, the output proxy's prior entry)``); the prior's where eager's op returned its
    input itself (``contiguous`` of a contiguous tensor), whose proxy the trace gave the output."""
    call, out, prior = entry
    if len(call.outs) == 1:  # (a view of one is as eager made that one: a slice of tensor_split's is plain)
        of = next((t.multi for t in _leaves(call.args, _Tensor) if t.multi is not None and t.root is out.root), None)
        if of is not None and _multi_node(of) is NOT_MULTI:
            return NOT_MULTI
    node = _node_of(call, out, _ITSELF, multi=len(call.outs) > 1)  # (a view of one: its own probe is plain)
    if node is _ITSELF:
        return None if prior is None else _multi_node(prior)
    return node


_ITSELF = ("itself", 0)  # (``_node_of``'s answer where the call returned its input itself)


def _root(p):
    link = p._view
    return p if link is None else link.root


def _leaves(value, cls) -> tuple:
    """The instances of ``cls`` in ``value`` (nested tuples, lists and dicts), in order."""
    if isinstance(value, cls):
        return (value,)
    if isinstance(value, (tuple, list)):
        return tuple(p for v in value for p in _leaves(v, cls))
    if isinstance(value, dict):
        return _leaves(tuple(value.values()), cls)
    return ()


def _described(value, made: dict, kind: type = TensorProxy):
    """``value`` with each proxy (each tensor of ``kind``) a ``_Tensor``, one per proxy: ``x * x``
    takes one tensor twice."""
    if isinstance(value, kind):
        t = made.get(id(value))
        if t is None:
            t = made[id(value)] = _Tensor(value, kind is not TensorProxy)
        return t
    if isinstance(value, (tuple, list)):
        items = [_described(v, made, kind) for v in value]
        return type(value)(items) if type(value) in (tuple, list) else items
    if isinstance(value, dict):
        return {k: _described(v, made, kind) for k, v in value.items()}
    return value


def _only_output(call: _Call, key: int) -> bool:
    """Whether memory ``key`` is among ``call``'s outputs' only, not its arguments'."""
    return all(id(t.root) != key for t in _leaves(call.args, _Tensor))


def eager_saves(func, args: tuple, kwargs: dict) -> frozenset:
    """The positions, among the tensors ``args`` and ``kwargs`` hold and then ``func``'s outputs
    (each tensor once), of those whose memory eager's autograd saves for ``func``'s backward:
    the run noted calls are answered by, here of real tensors (``saved_ops`` is checked by it)."""
    with DisableTorchFunction():
        outs = _leaves(func(*args, **kwargs), torch.Tensor)
    made: dict = {}
    described = _described((args, kwargs), made, torch.Tensor)
    call = _Call(func, described, tuple(_described(o, made, torch.Tensor) for o in outs), ())
    saved = _probe(call, {id(t): i for i, t in enumerate(made.values())})
    if saved is False:
        raise RuntimeError(f"{_name(func)} runs on neither CPU nor meta tensors")
    return frozenset(saved)


def taken_as_saved(func, args: tuple, kwargs: dict, outs: tuple) -> frozenset:
    """The positions (as ``eager_saves``'s, ``outs`` the call's outputs) of the tensors a write finds
    a call of ``func`` saved: the tables', a kernel choice's or a run again's answer."""
    made: dict = {}
    described = _described((args, kwargs), made, torch.Tensor)
    call = _Call(func, described, tuple(_described(o, made, torch.Tensor) for o in outs), ())
    saved = _saved_by(call)
    if saved is False:
        raise RuntimeError(f"{_name(func)} runs on neither CPU nor meta tensors")
    roots = {id(t.root) for t in saved.values()}
    return frozenset(i for i, t in enumerate(made.values()) if id(t.root) in roots)


def _name(func) -> str:
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    module = getattr(func, "__module__", None) or ""
    if name.startswith(("Tensor.", "TensorBase.")) or module.startswith("torch._C"):
        return f"torch.{name.replace('TensorBase.', 'Tensor.')}"
    return f"{module}.{name}" if module else name


def _any_of(call: _Call, key: int):
    """The first of ``call``'s tensors in memory ``key``: what an unknown call is taken to save."""
    return next((t for t in call.tensors() if id(t.root) == key), None)


def _hint(n) -> int:
    return n if type(n) is int else n.hint


def _strides(p) -> tuple | None:
    """The eager strides of ``p`` where known and not contiguous's, else None."""
    link = p._view
    strides = p._strides if link is None else link.strides
    if strides is None or not all(type(s) is int for s in strides):
        return None
    return tuple(strides)


# -- eager's answer: the call run again ---------------------------------------------------------


def _saved_by(call: _Call):
    """``{root id: _Tensor}`` of the call's tensors eager's autograd saves; ``{}`` where it makes
    no node (no tensor requires grad), False where the call runs again on neither CPU nor meta
    tensors. The
    answer is kept per op and arguments' metadata (a model's repeated layers run once)."""
    if call.func is None or not any(t.requires_grad for t in call.tensors()):
        return {}
    cuda = any(t.device.type == "cuda" for t in call.tensors())
    choice = KERNEL_CHOICES.get(call.func)
    fused = None if choice is None else call.fused if call.fused is not None else _fused(choice[0], call.args)
    # (a fused kernel's run again on small CPU tensors says which views of them it saves)
    fused_on_cpu = fused and not cuda and sum(math.prod(t.shape) for t in call.tensors()) <= _CPU_ELEMENTS
    if (call.func in SAVES_EVERY_TENSOR_ON_CUDA and cuda) or (fused and not fused_on_cpu):
        return _kernel_saves(call) if fused and cuda else _every_tensor(call)
    known = _one_tensor_op(call)
    if known is not None:
        return known
    index: dict = {}
    try:
        key = (call.func, fused, _key(call.args, index))
    except (_Unkeyed, TypeError):  # (an argument eager's answer may depend on: asked each time)
        key = None
    tensors = {id(t): t for t in call.tensors()}
    for t in tensors.values():
        index.setdefault(id(t), len(index))
    saved = _ANSWERS.get(key) if key is not None else None
    if saved is None:
        # (the kernel chosen as the call ran; its composite on CUDA: run on meta tensors, not the
        # CPU's, whose math path differs: attention upcasts half precision on the CPU only. Its
        # switches set and restored unrecorded: no effect of the program's)
        with paused_recording(), contextlib.nullcontext() if choice is None else choice[1](fused):
            found = _run_cpu(call) if fused_on_cpu else None
            saved = _probe(call, index, choice is not None and cuda) if not fused_on_cpu else _numbered(found, index)
        if fused_on_cpu and saved is False:
            return _every_tensor(call)
        if key is not None:
            if len(_ANSWERS) >= _KEPT:
                _ANSWERS.clear()
            _ANSWERS[key] = saved
    if saved is False:
        return False
    return {id(t.root): _as_saved(t, saved[index[k]]) for k, t in tensors.items() if index[k] in saved}


def _kernel_node(call: _Call) -> tuple | None:
    """``saved_ops.kernel_node`` of a call on CUDA, else None."""
    if call.func not in KERNEL_NODES or not any(t.device.type == "cuda" for t in call.tensors()):
        return None
    fused = call.fused if call.fused is not None else _fused(KERNEL_CHOICES[call.func][0], call.args)
    return kernel_node(call.func, call.args, fused)


def _kernel_saves(call: _Call) -> dict:
    """What a fused kernel on CUDA saves: every tensor, or where it pads the last dim (``KERNEL_NODES``)
    its output whole, of which the call's output is a view (and copies of its inputs)."""
    node = _kernel_node(call)
    if node is None or not node[1] or len(call.outs) != 1:
        return _every_tensor(call)
    out = call.outs[0]
    return {id(out.root): _as_saved(out, (*out.shape[:-1], out.shape[-1] + node[1]))}


def _every_tensor(call: _Call) -> dict:
    return {id(t.root): t for t in reversed(call.tensors())}


def _as_saved(t: _Tensor, shape: tuple | None) -> _Tensor:
    """``t``, or the view of its memory of ``shape`` eager's node saved (``_view_shape``)."""
    if shape is None or (shape == t.shape and t.view):
        return t
    view = object.__new__(_Tensor)
    view.root, view.view, view.shape, view.strides = t.root, True, shape, None
    view.dtype, view.device, view.requires_grad, view.multi = t.dtype, t.device, t.requires_grad, None
    return view


def _one_tensor_op(call: _Call) -> dict | None:
    """What eager saves of a call of an op of ``saved_ops.ONE_TENSOR_OPS`` on its first positional
    argument, the only tensor it takes, returning one: None for any other call."""
    args, kwargs = call.args
    saves = ONE_TENSOR_OPS.get(call.func) or wrapped_saves(call.func, args, kwargs)
    if saves is None or len(call.outs) != 1:
        return None
    tensors = _leaves(call.args, _Tensor)
    if len(tensors) != 1 or not args or args[0] is not tensors[0]:
        return None
    saved = {id(call.outs[0].root): call.outs[0]} if saves[1] else {}
    if saves[0]:
        saved[id(args[0].root)] = args[0]
    return saved


#: Eager's answers (``_probe``) by op and arguments' metadata (``_key``), up to ``_KEPT`` of them.
_ANSWERS: dict = {}
_KEPT = 4096
_PLAIN = (bool, int, float, complex, str, torch.dtype, torch.device, torch.layout, torch.memory_format)


class _Unkeyed(Exception):
    """An argument that is not plain data, whose effect on what eager saves a key cannot hold."""


def _key(value, index: dict):
    """The metadata of ``value`` that what eager saves depends on; ``index`` numbers its tensors."""
    if isinstance(value, _Tensor):
        number = index.setdefault(id(value), len(index))
        return (number, value.shape, value.strides, value.dtype, value.device, value.requires_grad)
    if type(value) in (tuple, list, torch.Size):
        return (type(value), *(_key(v, index) for v in value))
    if type(value) is dict:
        return (dict, *((k, _key(v, index)) for k, v in value.items()))
    if value is None or type(value) in _PLAIN:
        return value
    if type(value) is SymInt:
        return value.hint
    raise _Unkeyed


def _fused(choose, arguments: tuple) -> bool:
    """Whether eager runs a fused kernel for a call of ``arguments`` (proxies, or ``_Tensor``s;
    ``saved_ops.KERNEL_CHOICES``), which saves every tensor: also where that is unknown (``choose``
    answers None, or fails)."""
    args, kwargs = arguments
    try:
        return choose(*args, **kwargs) is not False
    except Exception:  # noqa: BLE001 (no answer: taken as saving everything, never less than eager)
        return True


def _probe(call: _Call, index: dict, on_meta: bool = False):
    """``{number: None, or the shape of the view of it saved}`` of the call's tensors (``index``)
    whose memory eager's autograd saves, from the
    call run on small enough CPU tensors of zeros (what autograd saves does not depend on the
    values; CPU kernels are C++, where a first meta run imports sympy, and for some ops
    ``torch._dynamo``, through their Python meta kernels), else on meta tensors, or on the other
    of the two where the first refuses (an op that reads values: indexing with a mask, which has
    no meta kernel; one that refuses zeros); False where neither runs."""
    small = not on_meta and sum(math.prod(t.shape) for t in call.tensors()) <= _CPU_ELEMENTS
    found = _run_cpu(call) if small else _run(call, "meta")
    if found is None:
        found = _run(call, "meta") if small else None
    return _numbered(found, index)


def _numbered(found, index: dict):
    """``_probe``'s answer from a run's (``_run``), False where it did not run."""
    if found is None:
        return False
    storages, saved = found
    return {index[id(storages[s])]: shape for s, shape in saved.items() if s in storages}


#: The most elements a call's tensors may hold to be run again on the CPU (``_probe``).
_CPU_ELEMENTS = 1 << 16


def _run_cpu(call: _Call):
    """``_run`` on the CPU, the default CPU generator's state kept (a random op draws: the program's
    draws are eager's). Through the generator itself: ``torch.random.fork_rng`` calls
    ``get_rng_state``/``set_rng_state``, which a trace records as the program's own calls."""
    state = _GENERATOR.get_state()
    try:
        return _run(call, "cpu")
    finally:
        _GENERATOR.set_state(state)


_GENERATOR = torch.default_generator


def _run(call: _Call, device: str):
    """``(storages, saved)``: the call run on ``device``, its tensors by storage and, per storage
    its autograd nodes saved, the shape of the view of it they saved (None: the tensor itself);
    None where it fails there."""
    storages: dict = {}
    made: dict = {}
    try:
        with _probing(device):
            args, kwargs = _stand_ins(call.args, storages, made, device)
            before = {id(t.grad_fn) for t in made.values() if t.grad_fn is not None}  # (an in-place op rebases)
            results = _leaves(call.func(*args, **kwargs), torch.Tensor)
            for t, described in zip(results, call.outs):
                storages.setdefault(_storage(t), described)
            stand = {_storage(t): t for t in (*results, *made.values())}
            saved = _saved_storages(results, before)
            return storages, {s: _view_shape(t, stand.get(s)) for s, t in saved.items()}
    except Exception:  # noqa: BLE001 (any refusal of the run: no answer from it)
        return None


def _view_shape(saved, stand_in) -> tuple | None:
    """The shape of ``saved`` where it is a view of ``stand_in`` (a node saved ``x.view(...)``:
    eager's error names that view), else None."""
    if stand_in is None or (saved.shape, saved.stride(), saved.storage_offset()) == (
        stand_in.shape,
        stand_in.stride(),
        stand_in.storage_offset(),
    ):
        return None
    return tuple(saved.shape)


@contextlib.contextmanager
def _probing(device: str):
    """The state a call is run again in (``_run``, ``_node_of``): eager's autograd, no transform,
    no autocast cast again, no torch function override, no warning."""
    with (
        _untransformed(),
        _no_autocast(device),
        DisableTorchFunction(),
        torch.enable_grad(),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        yield


#: The most elements a call's tensors may hold to be run again on the CPU to name a node
#: (``_node_of``; the error's path only, where a meta run would import sympy: seconds)
_NAMING_ELEMENTS = 1 << 22


#: ``_node_of(..., multi=True)`` of a view eager makes as any other (``tensor_split``'s slices): one
#: a program may write in place, and use once its memory was written
NOT_MULTI = ("not one of several views", 0)


def _node_of(call: _Call, t: _Tensor, itself: tuple | None = None, multi: bool = False) -> tuple | None:
    """``(name, output number)`` of the node eager's autograd gives ``t`` (one of ``call``'s
    outputs, or the tensor the call writes in place) as eager's error names it: from the call run
    again on tensors of zeros (CPU ones where small enough, else meta); None where it runs on
    neither or ``t`` gets no node; ``itself`` where given and the call returned one it took.
    ``multi``: ``NOT_MULTI`` unless eager makes ``t`` one of the views of a node with several
    (``split``, ``unbind``), which it refuses to write in place."""
    small = sum(math.prod(u.shape) for u in call.tensors()) <= _NAMING_ELEMENTS
    at = next((i for i, o in enumerate(call.outs) if o is t), None)
    for device in ("cpu", "meta") if small else ("meta", "cpu"):
        state = _GENERATOR.get_state()
        made: dict = {}
        try:
            with _probing(device):
                args, kwargs = _stand_ins(call.args, {}, made, device)
                results = _leaves(call.func(*args, **kwargs), torch.Tensor)
                got = made.get(id(t)) if at is None else results[at]
                if itself is not None and any(got is u for u in made.values()):
                    return itself
                if got is None or got.grad_fn is None:
                    return None
                # (``unsafe_split``'s are not views to autograd, whose node a write leaves: refused)
                if multi and got._is_view() and _get_creation_meta(got) != _MULTI_OUTPUT_NODE:
                    return NOT_MULTI
                return node_name(got.grad_fn.name()), got.output_nr
        except Exception:  # noqa: BLE001 (any refusal of the run: no answer from it)
            continue
        finally:
            _GENERATOR.set_state(state)
    return None


def _no_autocast(device: str):
    """The arguments are those the op ran on, autocast's casts already made: none again on the CPU."""
    return torch.autocast("cpu", enabled=False) if device == "cpu" else contextlib.nullcontext()


@contextlib.contextmanager
def _untransformed():
    """Outside the torch.func transforms a program may be traced under (``torch.func.grad`` of a
    compiled call): what eager's own autograd saves answers there too."""
    allowed = _functorch.get_inplace_requires_grad_allowed()
    _functorch.set_inplace_requires_grad_allowed(True)
    try:
        with torch._C._DisableFuncTorch():
            yield
    finally:
        _functorch.set_inplace_requires_grad_allowed(allowed)


def _stand_ins(value, storages: dict, made: dict, device: str):
    """``value`` with each ``_Tensor`` a tensor of zeros (none on the meta device) on ``device`` of
    its shape, strides, dtype and requires-grad flag (a non-leaf where it requires grad, as the
    program's are: writes into it are allowed)."""
    if isinstance(value, _Tensor):
        t = made.get(id(value))
        if t is None:
            strides = value.strides or torch.empty(value.shape, device="meta").stride()
            t = torch.empty_strided(value.shape, strides, dtype=value.dtype, device=device)
            if device != "meta":
                t.zero_()
            if value.requires_grad:
                t = t.requires_grad_().clone(memory_format=torch.preserve_format)
            made[id(value)] = t
            storages[_storage(t)] = value
        return t
    if isinstance(value, (tuple, list)):
        items = [_stand_ins(v, storages, made, device) for v in value]
        return type(value)(items) if type(value) in (tuple, list) else items
    if isinstance(value, dict):
        return {k: _stand_ins(v, storages, made, device) for k, v in value.items()}
    if type(value) is SymInt:
        return value.hint
    if isinstance(value, torch.Tensor):  # a tensor the program captured (a trace input by then)
        t = torch.zeros_like(value, device=device)
        return t.requires_grad_().clone() if value.requires_grad else t
    return value


def _storage(t) -> int:
    return t.untyped_storage()._cdata


def _saved_storages(results: tuple, inputs: set) -> dict:
    """The storages of the tensors the autograd nodes behind ``results`` saved, up to the nodes
    of the inputs (``inputs``: their ids), each with the first tensor saved of it."""
    found: dict = {}
    seen: set = set()
    stack = [t.grad_fn for t in results if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen or id(node) in inputs:
            continue
        seen.add(id(node))
        for name in dir(node):
            if name.startswith("_saved_"):
                try:
                    value = getattr(node, name)
                except RuntimeError:  # (freed, or written by the call itself: no value to match)
                    continue
                for t in _leaves(value, torch.Tensor):
                    found.setdefault(_storage(t), t)
        if isinstance(node, torch.autograd.function.BackwardCFunction):
            for t in node.saved_tensors:
                found.setdefault(_storage(t), t)
        stack.extend(n for n, _ in node.next_functions)
    return found
