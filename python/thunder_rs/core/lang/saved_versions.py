"""What eager's autograd saves for a call's backward, asked of eager: the call run again.

The calls that touched memory a program writes in place (``version_tracking``' bookkeeping) are asked
which tensors eager saves: the call is run again on CPU tensors of zeros (meta tensors where they
hold more than ``_CPU_ELEMENTS``) of the same shapes, strides, dtypes and flags, and the saved
tensors of the autograd nodes it made (``grad_fn._saved_*``) are matched to its arguments and
outputs by storage. So the answer is eager's own, for every op: composite ones (``F.linear`` saves
a view of its weight), conditional saving, in-place activations (``relu_`` saves its result, after
its own write). It is kept per op and arguments' metadata; the ops most programs write the results
of (a ReLU after a convolution, ``out += identity``) and the one-tensor aten ops (``sigmoid``,
``tanh``, ``exp``: ``saved_aten``, from ``derivatives.yaml``) are answered by ``saved_ops`` without
a run (a first meta run imports sympy, and for some ops ``torch._dynamo``, through torch's Python
meta kernels: seconds).

A call that runs neither on (small enough) CPU tensors of zeros nor on meta tensors is taken to
save every tensor it takes and returns; its backward then raises a ``ThunderNotImplementedError``
that says so, rather than a gradient that may differ from eager's. The error's text
(``saved_errors``) names the node the tensor is an output of as eager's does (``_node_of``: the
calls run again for it, on this path only).
"""

import contextlib
import math
import warnings

import torch
from torch._C import DisableTorchFunction

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.saved_errors import (
    node_name,
)
from thunder_rs.core.lang.saved_ops import (
    ONE_TENSOR_OPS,
    KERNEL_CHOICES,
    KERNEL_NODES,
    SAVES_EVERY_TENSOR_ON_CUDA,
    kernel_node,
    wrapped_saves,
)
from thunder_rs.core.lang.recorder import paused_recording
from thunder_rs.core.lang.symint import SymInt

_get_creation_meta = torch._C._autograd._get_creation_meta
_MULTI_OUTPUT_NODE = torch._C._autograd.CreationMeta.MULTI_OUTPUT_NODE

_functorch = torch._C._functorch


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

    __slots__ = ("label", "func", "args", "outs", "vids", "saved", "fused", "several")

    def __init__(self, func, args: tuple, outs: tuple, vids: tuple, saved: dict | None = None, label: str = ""):
        self.func, self.args, self.outs, self.vids, self.label = func, args, outs, vids, label
        #: ``{root id: the saved _Tensor}``; None until asked; False when eager's answer is unknown
        self.saved = saved
        #: for an op of ``KERNEL_CHOICES``: whether eager ran a fused kernel, as the switches were
        self.fused: bool | None = None
        #: whether the call returned its tensors in a sequence (``split`` into one piece: eager's
        #: node is still of several views), set by ``note_call``
        self.several = len(outs) > 1

    @property
    def name(self) -> str:
        return self.label or _name(self.func)

    def tensors(self) -> tuple:
        return (*_leaves(self.args, _Tensor), *self.outs)


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
#: ``_node_of(..., multi=True)`` of one of several views a call made of memory that requires no grad,
#: which eager refuses to write a value that requires grad into (its view has no node to name)
NO_GRAD_MULTI = ("no node", 0)


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
                if got is None or got.grad_fn is None:  # (a view of memory that requires no grad: no node)
                    multi &= got is not None and got._is_view() and _get_creation_meta(got) == _MULTI_OUTPUT_NODE
                    return NO_GRAD_MULTI if multi else None
                # (``unsafe_split``'s are not views to autograd, whose node a write leaves: refused)
                if multi and got._is_view() and _get_creation_meta(got) != _MULTI_OUTPUT_NODE:
                    return NOT_MULTI
                if multi and len(results) == 1 and not got._is_view():  # (``unsafe_split`` into one piece)
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
