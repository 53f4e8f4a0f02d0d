"""The torch language context: what a torch call on proxies means while tracing.

Calls with an ltorch mapping run that decomposition; real tensors they take alongside proxies
(captured from outside the program's inputs) become trace inputs; metadata queries answer from the proxy;
data-dependent calls (``bool(t)``, ``t.item()``, ``nonzero``) get this call's value, on which the
trace is specialised with a check (``values``); anything else becomes an eager fallback symbol.
While a program is traced, ``LanguageMode`` also sends torch calls that take no tensor at all
(``torch.zeros(2, 3)``) to their ltorch symbols.
"""

import contextlib
import contextvars
import inspect
import sys
import types
import warnings

import torch
from torch._C import DisableTorchFunctionSubclass
from torch.overrides import TorchFunctionMode

from thunder_rs.core.base import problems
from thunder_rs.core.base.captured_outputs import ORIGINALS  # (wraps torch.autograd.grad and backward)

from thunder_rs.core.lang import values
from thunder_rs.core.lang.reads import READERS
from thunder_rs.core.lang.complex_calls import complex_call, involves_complex
from thunder_rs.core.lang.eager_layouts import LAYOUT_RULES, laid_out, take_layouts
from thunder_rs.core.lang.fallback import qualified_name, user_fallback
from thunder_rs.core.state.observe import thread_state
from thunder_rs.core.base.proxies import TensorProxy, grad_error, numel, set_language_context
from thunder_rs.core.lang import dual_tensors, inference, inner_leaves, regrown, tensor_hooks, vmap_state
from thunder_rs.core.lang.recorder import (
    INFERENCE_MADE,
    active_captures,
    active_recorder,
    dual_levels,
    grad_mode_cuts,
    lift_captured,
    record_composite,
    record_kernel,
)
from thunder_rs.core.lang.autocast import cast_inputs
from thunder_rs.core.lang.numpy_scalars import as_python
from thunder_rs.core.lang.rng import RANDOM, note_draw
from thunder_rs.core.lang.version_tracking import note_arguments, note_call
from thunder_rs.core.lang.symfloat import SymFloat
from thunder_rs.core.lang.symint import SymInt
from thunder_rs.core.base.userframe import handling_frame
from thunder_rs.core.base.userframe import is_user_file, user_frame, user_location  # noqa: F401 (re-exported)
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError

#: Every ltorch symbol, in registration order: what the torch executor, the claim tables and
#: ``add_operator_executor`` walk. Filled by ``@torchsymbol`` (``thunder_rs.torch.register``).
SYMBOLS: list = []
#: torch callables (functions, methods, operators) -> ltorch symbols. Filled by ``@torchsymbol``.
TORCH_TO_LTORCH: dict = {}
#: Tensor property names (``T``, ``mT``) -> ltorch symbols.
PROPERTY_TO_LTORCH: dict = {}
#: torch callables that write a tensor argument in place (``thunder_rs.torch.inplace`` fills it).
MUTATING: set = set()
#: Data-dependent reads some callers make in ways thunder_rs can follow: func -> a handler
#: returning the value to give instead, or None to raise as for any other data-dependent read.
VALUE_READS: dict = {}
#: What a call given ``out=`` means: ``handler(func, args, kwargs)``; set by ``thunder_rs.torch.inplace``.
_out_handler = None


def set_out_handler(handler) -> None:
    global _out_handler
    _out_handler = handler


def torch_symbol(func):
    """The ltorch symbol of the torch callable ``func`` (``torch_symbol(torch.clone)(p)``): how core
    records a torch op itself, as the program's own call of ``func`` would, without importing the
    torch language, which is built on core and registers its symbols when ``thunder_rs`` is imported."""
    return TORCH_TO_LTORCH[func]


_T = torch.Tensor
_METADATA_METHODS = {
    _T.size,
    _T.dim,
    _T.ndimension,
    _T.numel,
    _T.nelement,
    _T.stride,
    _T.is_contiguous,
    _T.is_floating_point,
    _T.is_complex,
    _T.element_size,
    _T.__len__,
    _T.__hash__,
    _T.get_device,
    _T.__format__,
    _T.__repr__,
    _T.storage_offset,
    _T.is_signed,
}


def _symbolic(args) -> bool:
    return bool(args) and getattr(args[0], "_symbolic", False)


def _size(t, dim=None):
    return t._shape if dim is None else t._shape[dim]


#: What a proxy with a symbolic size answers from its ``SymShape`` (torch's own implementations
#: would answer the hints, with nothing recording that the program relied on them).
_SIZE_METHODS = {
    _T.size: _size,
    _T.numel: lambda t: numel(t._shape),
    _T.nelement: lambda t: numel(t._shape),
    _T.__len__: lambda t: t._shape[0],
}
_METADATA_PROPERTIES = {
    "shape",
    "dtype",
    "device",
    "ndim",
    "requires_grad",
    "is_leaf",
    "grad_fn",
    "layout",
    "is_cuda",
    "is_cpu",
    "is_meta",
    "is_sparse",
    "is_quantized",
    "is_nested",
    "names",
    "grad",
    "_base",
    "is_mkldnn",
    "is_mps",
    "is_xpu",
    "itemsize",
    "nbytes",
    "output_nr",
    "_version",
}
_DATA_DEPENDENT = {
    _T.__bool__,
    _T.item,
    _T.tolist,
    _T.__int__,
    _T.__float__,
    _T.__index__,
    _T.__complex__,
    _T.numpy,
    _T.__array__,
    _T.data_ptr,
    _T.nonzero,
    torch.nonzero,
}


def _property_name(func):
    """The property a ``getset_descriptor.__get__`` reads, or None for other callables."""
    if getattr(func, "__name__", None) != "__get__":
        return None
    return getattr(getattr(func, "__self__", None), "__name__", None)


def is_metadata_query(func) -> bool:
    """Whether ``func`` reads a tensor's metadata (``size()``, ``.shape``), which proxies answer."""
    return func in _METADATA_METHODS or _property_name(func) in _METADATA_PROPERTIES


#: Per acquisition: the data-dependent reads refused so far, so that one the program catches
#: (``try: n = int(t.sum()) except Exception: n = 1``) still fails the trace.
_refused: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_refused", default=None)


@contextlib.contextmanager
def refusals_not_swallowed():
    """Raises, after the ``with`` body traced a program, a data-dependent refusal the program caught."""
    refused: list = []
    token = _refused.set(refused)
    try:
        yield
    finally:
        _refused.reset(token)
    if refused:
        raise ThunderRuntimeError(
            f"{refused[0]}. The program caught this error (an except clause around that line) and went on, "
            "so the trace would not compute what eager computes"
        )


def refuse_data_dependent(func) -> None:
    """Raises when ``func`` reads a traced tensor's values where thunder_rs cannot answer it: a
    read ``values`` has no reader for (``numpy()``, ``data_ptr()``), or a read of a batched
    tensor under ``torch.vmap``, whose values differ per batch element."""
    if func in _DATA_DEPENDENT:
        name = getattr(func, "__name__", str(func))
        message = (
            f"{name}: data-dependent control flow or value access on a traced tensor at "
            f"{user_location()}; thunder_rs specialises a trace on values read through bool(), int(), float(), "
            "item(), tolist() and the sizes of nonzero-like calls, outside torch.vmap"
        )
        refused = _refused.get()
        if refused is not None:
            refused.append(message)
        raise ThunderRuntimeError(message)


#: Calls whose output sizes depend on values: eager fallbacks sized by the values (``values``).
_SIZED_BY_VALUES = frozenset({_T.nonzero, torch.nonzero})
#: Calls that raise on some values of their inputs (``torch.linalg.LinAlgError`` for a matrix that
#: is not positive definite, or singular; an index out of range): made inside the program's
#: ``try`` block, whether they raise is read (``ValueReads.raised``), so that its ``except``
#: clause runs where eager's does. (Random calls are not among them: a read would draw.)
RAISE_ON_VALUES = frozenset(
    {
        torch.nn.functional.embedding,
        torch.embedding,
        torch.nn.functional.one_hot,
        torch.bincount,
        _T.bincount,
        _T.__getitem__,
        torch.gather,
        _T.gather,
        torch.index_select,
        _T.index_select,
        torch.take,
        _T.take,
        torch.linalg.cholesky,
        torch.cholesky,
        _T.cholesky,
        torch.linalg.inv,
        torch.inverse,
        _T.inverse,
        torch.linalg.solve,
        torch.linalg.lu_factor,
        torch.linalg.ldl_factor,
        torch.cholesky_inverse,
    }
)


def _assert(condition, message):
    """``torch._assert`` of a traced condition: eager's ``assert condition, message``, whose
    ``bool()`` reads the condition's value (``values``: the trace checks it on every call)."""
    if not condition:
        raise AssertionError(message)


TORCH_TO_LTORCH[torch._assert] = _assert


def _data_dependent(func, args, kwargs):
    """A read of a traced tensor's values: answered with the value this call has, on which the
    trace is specialised (``values``). Under ``examine``, or where values cannot be read, notes
    the read and gives a stand-in value, or raises."""
    reads = values.active()
    if reads is not None and (func in READERS or func in _SIZED_BY_VALUES):
        args, kwargs = lift_captured(args, kwargs)
        if func in _SIZED_BY_VALUES:
            return user_fallback(func, args, kwargs)
        return reads.read(func, args, kwargs)
    name = getattr(func, "__name__", str(func))
    stand_in = problems.data_dependent_stand_in(name)
    if stand_in is not None and problems.note(
        problems.DATA_DEPENDENT,
        qualified_name(func),
        f"{name} reads a traced tensor's value; examine went on with {stand_in!r}",
    ):
        return stand_in
    refuse_data_dependent(func)


_is_inference_mode_enabled = torch.is_inference_mode_enabled


def torch_function(func, args, kwargs):
    """What a torch call on proxies means. What runs meanwhile is not the program's own code, so
    its reads are not guarded (``observe``)."""
    state = thread_state
    if INFERENCE_MADE[0] and state.inside == 0 and not _is_inference_mode_enabled():
        inference.check_call(func, args, kwargs)
    if regrown.REGROWN[0] and state.inside == 0:
        regrown.check_call(func, args, kwargs)
    if state.inside == 0:  # the program's own call: what eager's autograd saves of it is noted
        args, kwargs = _own_containers(args), _own_containers(kwargs)
        if func in RAISE_ON_VALUES and (reads := values.active()) is not None and _may_raise(func, args):
            out = reads.raised(func, *lift_captured(args, kwargs), _fusable(func, args, kwargs))
            if out is not None:  # (the op, recorded as its own check)
                note_call(func, args, kwargs, out)
                return out
        out = _observed(_torch_function, func, args, kwargs) if _hook_set(state) else _inside(func, args, kwargs)
        note_call(func, args, kwargs, out)
        return out
    return _inside(func, args, kwargs)


def _may_raise(func, args) -> bool:
    """Whether ``func(*args)``, one of ``RAISE_ON_VALUES``, may raise on the values of its tensors
    where the program handles what it raises (in a ``try`` body). Indexing may where an index is
    an integer tensor (one past the end raises ``IndexError``)."""
    if func is _T.__getitem__ and not any(
        isinstance(i, TensorProxy) and not i.dtype.is_floating_point and i.dtype is not torch.bool
        for i in (args[1] if type(args[1]) is tuple else (args[1],))
    ):
        return False
    return handling_frame() is not None


def _fusable(func, args, kwargs) -> bool:
    """Whether ``func(*args, **kwargs)``, one of ``RAISE_ON_VALUES`` made in a ``try`` body, may be
    recorded as its own check (``ValueReads.raised``): an eager call whose outputs require no
    gradient (its grad rule needs the op recorded), write nothing (``out=``, an embedding's
    ``max_norm`` renormalising its weight) and are no view (indexing may return one), on tensors
    of constant sizes (an eager call's symbolic output sizes come from fake tensors, on which a
    factorisation's check of its values fails: the compile would fall back to constant sizes)."""
    if func is _T.__getitem__ or "out" in kwargs or kwargs.get("max_norm") is not None:
        return False
    if func is torch.nn.functional.embedding and len(args) > 3 and args[3] is not None:
        return False
    tensors = [x for x in (*args, *kwargs.values()) if isinstance(x, TensorProxy)]
    if any(x._symbolic for x in tensors):
        return False
    return not (torch.is_grad_enabled() and any(x.requires_grad for x in tensors))


def _own_containers(x):
    """``x``, a torch call's arguments, with its lists, tuples and dicts copied (nested alike):
    what the recording keeps of the call (its ops, views and saved arguments) holds no container
    of the program's. ``returned_objects.made_objects`` takes a list the program made that is held
    elsewhere for one found in its state: ``sizes = [1, 2]`` split by and returned would be returned
    as that same list on every call, where eager returns a new one from each."""
    t = type(x)  # (the leaves, most items, are kept without a call for each)
    if t is tuple:
        return tuple([_own_containers(v) if type(v) in _COPIED else v for v in x])
    if t is list:
        return [_own_containers(v) if type(v) in _COPIED else v for v in x]
    if t is dict:
        return {k: _own_containers(v) if type(v) in _COPIED else v for k, v in x.items()}
    return x


_COPIED = frozenset({list, tuple, dict})


def _inside(func, args, kwargs):
    state = thread_state
    state.inside += 1
    try:
        return _torch_function(func, args, kwargs)
    finally:
        state.inside -= 1


#: CPython before 3.12 runs every instruction on a slower path while a profile hook is set, so the
#: observer's hook is removed while thunder_rs handles a torch call (most of acquisition). From
#: 3.12 the hook is built on ``sys.monitoring``, where each removal re-instruments the code run
#: afterwards: there it stays on.
PAUSE_HOOK_PER_CALL = sys.version_info < (3, 12)


def _hook_set(state) -> bool:
    """Whether this thread's observer hook may be set, to be paused around a torch call. A thread
    whose profile hook another profiler holds (``python -m cProfile``, a debugger) observes
    without it, and may never have made one."""
    return PAUSE_HOOK_PER_CALL and state.observer is not None and state.hook is not None


def _observed(handle, *call):
    """``handle(*call)``, a torch call of the program, with the observer's profile hook paused."""
    state = thread_state
    state.inside += 1
    state.hook.pause()
    try:
        return handle(*call)
    finally:
        state.inside -= 1
        state.hook.resume()


#: Calls whose first argument is a proxy, answered as eager answers for the tensor it stands for
#: (``views`` fills it): ``Tensor.stride``/``is_contiguous`` (a proxy's own metadata is contiguous
#: whatever that tensor's layout), ``torch.as_tensor``/``asarray`` of a tensor (the tensor itself).
PROXY_CALLS: dict = {
    torch.Tensor.is_inference: inference.is_inference,
    torch.Tensor.register_hook: tensor_hooks.register_hook,
}
_CONVERSIONS = (torch.as_tensor, torch.asarray)
_register_hook = torch.Tensor.register_hook
#: Calls that make a tensor of Python data (``torch.tensor(x.shape[0])``, ``Tensor.new_tensor``),
#: answered by their handler (``creation`` fills it) where the data holds a symbolic size: a
#: tensor the trace computes from the size, where eager's call would read (and guard) its value.
SIZE_DATA: dict = {}


def _holds_size(values) -> bool:
    """Whether ``values`` (nested lists and tuples) hold a symbolic size (or a float of sizes)."""
    return any(_holds_size(v) if isinstance(v, (list, tuple)) else type(v) in (SymInt, SymFloat) for v in values)


def _size_data(func, args, kwargs):
    """``func``'s tensor of symbolic sizes, or None where it is not such a call."""
    handler = SIZE_DATA.get(func)
    if handler is None or not _holds_size((*args, *kwargs.values())):
        return None
    return handler(*args, **kwargs)


#: NumPy's names torch's argument parser takes for its own (``torch.cat(ts, axis=1)``).
_NUMPY_NAMES = {"axis": "dim", "keepdims": "keepdim"}


def _torch_names(fn, kwargs: dict) -> dict:
    """``kwargs`` with NumPy's names of arguments in torch's, where ``fn`` takes torch's only."""
    if not any(name in kwargs for name in _NUMPY_NAMES):
        return kwargs
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature to read: the call takes what it is given
        return kwargs
    return {
        _NUMPY_NAMES[k] if k in _NUMPY_NAMES and k not in params and _NUMPY_NAMES[k] in params else k: v
        for k, v in kwargs.items()
    }


def _torch_function(func, args, kwargs):
    args, kwargs = as_python(func, args, kwargs)
    if kwargs and "generator" in kwargs:
        note_draw(kwargs)
    if kwargs and kwargs.get("out") is not None:
        return _out_handler(func, *lift_captured(args, kwargs))
    made = _size_data(func, args, kwargs)
    if made is not None:
        return made
    by_proxy = PROXY_CALLS.get(func)
    if by_proxy is not None and args and func in _CONVERSIONS and type(args[0]) is torch.Tensor:
        args, kwargs = lift_captured(args, kwargs)  # ``torch.as_tensor(t, device=...)`` of a tensor the program made
    elif func is _register_hook and args and not isinstance(args[0], TensorProxy):
        args, kwargs = lift_captured(args, kwargs)  # a hook on a captured tensor: on the tensor each call takes
    if by_proxy is not None and args and isinstance(args[0], TensorProxy):
        return by_proxy(*args, **kwargs)
    ltorch_fn = TORCH_TO_LTORCH.get(func)
    if ltorch_fn is not None:
        args, kwargs = cast_inputs(func, *lift_captured(args, _torch_names(ltorch_fn, kwargs) if kwargs else kwargs))
        # What the program's own call runs its op on: captured tensors lifted, autocast's casts.
        if thread_state.inside == 1:
            note_arguments(func, args, kwargs)
        op = func if func in LAYOUT_RULES else ltorch_fn  # (``torch.subtract`` is ``ltorch.sub``'s)
        if func not in MUTATING and not getattr(ltorch_fn, "takes_complex", False) and involves_complex(args, kwargs):
            call = complex_call  # (its results laid out as a real call's: ``z.t().exp()``, ``linalg.inv(z)``)
        elif problems.collecting():
            return _examined(func, ltorch_fn, args, kwargs)
        else:
            call = None
        if not laid_out(op, args, kwargs):
            return ltorch_fn(*args, **kwargs) if call is None else call(func, ltorch_fn, args, kwargs)
        out = ltorch_fn(*args, **kwargs) if call is None else call(func, ltorch_fn, args, kwargs)
        take_layouts(op, args, kwargs, out)
        return out
    prop = _property_name(func)
    if prop is not None:
        if prop == "nbytes" and _symbolic(args):
            return int(numel(args[0]._shape)) * args[0].element_size()
        if prop in _METADATA_PROPERTIES:
            with DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        ltorch_fn = PROPERTY_TO_LTORCH.get(prop)
        if ltorch_fn is not None:
            args, _ = lift_captured(args, {})  # (``w.data`` of a tensor the program captured)
            if involves_complex(args, {}) and not getattr(ltorch_fn, "takes_complex", False):
                return complex_call(func, ltorch_fn, args, {})
            return ltorch_fn(*args)
    if func in _SIZE_METHODS and _symbolic(args):
        return _SIZE_METHODS[func](*args, **kwargs)
    if func in _METADATA_METHODS:
        with DisableTorchFunctionSubclass():
            return func(*args, **kwargs)
    if func in VALUE_READS:
        value = VALUE_READS[func](args)
        if value is not None:
            return value
    if func in _DATA_DEPENDENT:
        return _data_dependent(func, args, kwargs)
    if func in _OBJECT_QUERIES:
        _refuse_after_write(func, args)
    return user_fallback(func, *lift_captured(args, kwargs), effect=func in RANDOM)


#: Queries of what a tensor object is (a view, lazily negated or conjugated), which an in-place
#: write leaves as they were. They are answered per call on the value the trace holds, which after
#: a write to an input is the new value's (a fresh tensor), not the caller's tensor eager asks.
_OBJECT_QUERIES = {_T.is_neg, _T.is_conj, _T._is_view}


def _refuse_after_write(func, args) -> None:
    """Refuses ``func`` (``_OBJECT_QUERIES``) of an input written in place, or of a view of one."""
    p = args[0] if args else None
    if not isinstance(p, TensorProxy):
        return
    root = p if p._view is None else p._view.root
    if root._input_vid is not None and root._vid != root._input_vid:
        raise ThunderNotImplementedError(
            f"Tensor.{func.__name__}: read at {user_location()} of an input the program wrote in place; a compiled "
            "call holds the written value as a new tensor, while eager asks the caller's tensor: ask before the write"
        )


def _examined(func, ltorch_fn, args, kwargs):
    """Under ``examine``: a symbol that refuses its arguments is noted and recorded as an eager
    fallback instead, when torch can compute its outputs' metadata."""
    try:
        return ltorch_fn(*args, **kwargs)
    except ThunderNotImplementedError as e:
        problems.note(problems.UNSUPPORTED, qualified_name(func), str(e))
        return user_fallback(func, args, kwargs, effect=func in RANDOM)


_functorch = torch._C._functorch


def _wraps_proxy(x) -> bool:
    """Whether ``x`` is a functorch wrapper (``torch.vmap``'s batched tensor) around a proxy."""
    if not isinstance(x, torch.Tensor) or not _functorch.is_functorch_wrapped_tensor(x):
        return False
    while _functorch.is_functorch_wrapped_tensor(x):
        x = _functorch.get_unwrapped(x)
    return isinstance(x, TensorProxy)


def _refuse_functorch_transform(func, args, kwargs) -> None:
    """functorch's transforms wrap proxies in tensors that run below ``__torch_function__``, where a
    proxy cannot go; refuse with the user's line instead of failing at dispatch. (While tracing,
    ``torch.vmap`` is thunder_rs's own; this catches ``torch.func.grad``/``jacrev`` and a functorch
    vmap bound before tracing began.)"""
    if _functorch.peek_interpreter_stack() is None:
        return
    if any(_wraps_proxy(x) for x in (*args, *kwargs.values())):
        name = getattr(func, "__name__", str(func))
        raise ThunderNotImplementedError(
            f"functorch: transforms over traced tensors are not supported ({name} at {user_location()}); "
            "use torch.vmap, which thunder_rs batches, and torch.func's grad/grad_and_value/vjp (traced) and "
            "jacrev/jacfwd/hessian/jvp (one eager call each), or run the function eagerly"
        )


def _tensor_kind(args, kwargs) -> int:
    """0: the call takes no tensor; 1: only meta tensors (thunder_rs's own metadata queries);
    2: a real tensor, directly or in a list (``torch.cat([a, b])``)."""
    kind = 0
    for x in (*args, *kwargs.values()):
        for y in x if type(x) in (list, tuple) else (x,):
            if isinstance(y, torch.Tensor):
                if not y.is_meta:
                    return 2
                kind = 1
    return kind


_GRAD_DESCRIPTOR = vars(torch._C.TensorBase)["grad"]
_GRAD_GET = _GRAD_DESCRIPTOR.__get__
#: ``.grad`` of a tensor the program did not get as a proxy (a global, an optimizer's parameters):
#: read or set while tracing, it would be the first call's.
_GRAD_ACCESS = frozenset({_GRAD_GET, _GRAD_DESCRIPTOR.__set__})
#: Differentiation the program runs itself (a gradient penalty, an inner optimisation step).
_AUTOGRAD_CALLS = frozenset({torch.autograd.grad, torch.autograd.backward, torch.Tensor.backward, *ORIGINALS})


#: Forward-mode differentiation through dual tensors (``torch.autograd.forward_ad``): traced by
#: ``dual_tensors``.
_NO_DUALS = (None,)
_FORWARD_AD_CALLS = {torch._make_dual: dual_tensors.make_dual, torch._unpack_dual: dual_tensors.unpack_dual}


def _autograd_call_error(func) -> ThunderNotImplementedError:
    return ThunderNotImplementedError(
        f"{qualified_name(func)}: the program differentiates at {user_location()} while it is traced; thunder_rs "
        "differentiates the whole jitted call, not inside it (a gradient penalty or an inner training step). Call it "
        "outside the jitted function, on the jitted call's outputs"
    )


def _untraced_call(func, args, kind: int, kwargs):
    """A call without proxies or real tensors (``kind`` as ``_tensor_kind`` says): a creation op
    (its ltorch symbol), or thunder_rs's own computation on meta tensors."""
    ltorch_fn = TORCH_TO_LTORCH.get(func)
    if ltorch_fn is not None and kind == 0:
        args, kwargs = as_python(func, args, kwargs)
        if not getattr(ltorch_fn, "takes_complex", False) and involves_complex(args, kwargs):
            return complex_call(func, ltorch_fn, args, kwargs)  # (``torch.full(size, 1j)``: eager's where it must)
        out = ltorch_fn(*args, **kwargs)
        if func in LAYOUT_RULES and laid_out(func, args, kwargs):  # (``empty_strided``: by its strides)
            take_layouts(func, args, kwargs, out)
        return out
    made = _size_data(func, args, kwargs) if kind == 0 else None
    if made is not None:
        return made
    captures = active_captures()
    if func is torch.tensor and captures is not None and args and _is_ndarray(args[0]) and set(kwargs) <= {"dtype"}:
        return _copied_array(captures, args[0], kwargs.get("dtype"))
    result = func(*args, **kwargs)
    if kind == 0 and captures is not None and _python_values((*args, *kwargs.values())):
        captures.note_created(result)
    return result


_FLAG_SETTER = torch.Tensor.requires_grad_


def _made_leaf(func, args, kwargs, on_proxies: bool):
    """``torch.zeros(3, requires_grad=True)``, ``torch.ones_like(x, requires_grad=True)``: the
    tensor made as without the flag, then made a leaf that requires grad (``requires_grad_``), as
    eager's is (``inner_leaves``)."""
    kwargs = {**kwargs, "requires_grad": False}
    if on_proxies:
        out = torch_function(func, args, kwargs)
    else:
        thread_state.inside += 1
        try:
            out = _untraced_call(func, args, _tensor_kind(args, kwargs), kwargs)
        finally:
            thread_state.inside -= 1
    if not isinstance(out, TensorProxy):
        raise ThunderNotImplementedError(
            f"{qualified_name(func)}: requires_grad=True at {user_location()} makes a leaf inside the program from "
            "data thunder_rs keeps as a constant; create the tensor outside and pass it in"
        )
    TORCH_TO_LTORCH[torch.Tensor.requires_grad_](out)
    inner_leaves.note(out, f"{qualified_name(func)}(requires_grad=True)")
    return out


def _is_ndarray(x) -> bool:
    return type(x).__name__ == "ndarray" and type(x).__module__ == "numpy"


def _copied_array(captures, array, dtype):
    """``torch.tensor(array)`` of a NumPy array: a copy made on every call of the array's memory
    (captured as a tensor sharing it), so an array refilled between calls is read anew."""
    with warnings.catch_warnings():  # a read-only array: the trace only reads it
        warnings.simplefilter("ignore", UserWarning)
        shared = torch.from_numpy(array)
    copy = torch.clone(captures.proxy(shared))  # recorded: the proxy's call
    return copy if dtype is None or dtype == copy.dtype else copy.to(dtype)


def _python_values(values) -> bool:
    """Whether ``values`` are plain Python data (numbers, strings, dtypes, nested lists): a tensor
    made from them is new memory, where one made from a NumPy array or a buffer shares theirs."""
    return all(
        _python_values(v)
        if type(v) in (list, tuple)
        else v is None or isinstance(v, (bool, int, float, complex, str, torch.dtype, torch.device))
        for v in values
    )


#: The ``types`` of a call whose only tensor subclass is the proxy (most calls while tracing).
_PROXY_TYPES = (TensorProxy,)


class LanguageMode(TorchFunctionMode):
    """Routes torch calls while a program is traced (``acquire`` enters it around the program).

    A call that takes no proxy never reaches ``TensorProxy.__torch_function__``, so creation ops
    (``torch.zeros(2, 3)``, ``torch.arange(n)``) reach their ltorch symbols here and give proxies.
    Calls on proxies go to ``torch_function``, as the proxy would send them. So do calls on real
    tensors the program captured (globals, closures, plain module attributes): they become trace
    inputs, so what the program computes from them is computed again on every call, from their
    values then (``x * w.sum()`` after ``w.mul_(2)``). Calls on meta tensors are thunder_rs's own.
    Calls on a proxy subclass (vmap's ``BatchedProxy``) go to the subclass's own ``__torch_function__``.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if active_recorder() is None:  # (recording paused: thunder_rs's stand-ins computed as eager does)
            return func(*args, **kwargs)
        if func in _GRAD_ACCESS and thread_state.inside == 0:
            raise grad_error("reads" if func == _GRAD_GET else "sets")
        if func in _AUTOGRAD_CALLS and thread_state.inside == 0:
            raise _autograd_call_error(func)
        if func in _FORWARD_AD_CALLS and thread_state.inside == 0:
            return _FORWARD_AD_CALLS[func](*args, **kwargs)
        live = (dual_levels.get() or _NO_DUALS)[0] is not None or grad_mode_cuts.get() is not None
        if live and thread_state.inside == 0:  # (a dual lives, or a torch.func.jvp is traced)
            dual_tensors.check_forward_ad(func, args, kwargs)
        if types != _PROXY_TYPES and any(t is not TensorProxy and issubclass(t, TensorProxy) for t in types):
            return func(*args, **kwargs)  # a proxy subclass (vmap's BatchedProxy) handles its calls
        if func is torch.einsum and len(args) == 2 and isinstance(args[1], (list, tuple)):
            return func(args[0], *args[1], **kwargs)  # (operands in a list: torch sees their types so)
        if kwargs.get("requires_grad") and func not in RANDOM and thread_state.inside == 0 and func is not _FLAG_SETTER:
            return _made_leaf(func, args, kwargs, TensorProxy in types)
        if func in RANDOM:
            vmap_state.check_draw(func, args, kwargs)  # (under torch.vmap, as its randomness says)
        if TensorProxy in types or func in RANDOM:  # random calls are recorded: eager draws on every call
            return torch_function(func, args, kwargs)
        _refuse_functorch_transform(func, args, kwargs)
        kind = _tensor_kind(args, kwargs)
        if kind == 2:
            return torch_function(func, args, kwargs)
        state = thread_state
        if state.inside == 0 and _hook_set(state):
            return _observed(_untraced_call, func, args, kind, kwargs)
        state.inside += 1
        try:
            return _untraced_call(func, args, kind, kwargs)
        finally:
            state.inside -= 1


set_language_context(torch_function)


def decision_site() -> tuple | None:
    """Where the program is as a decision on sizes adds a guard (the recorder asks, for miss
    reasons): ``(file, line, function, op)`` of the user's innermost frame, ``op`` the torch call
    it made (``torch.Tensor.contiguous``; an ltorch symbol called directly, ``ltorch.sum``) whose
    decomposition took the decision on the program's behalf, None when the program took it itself
    (``if x.shape[1] % 4:``).
    None when no frame is the user's. Keeps no frame: a compile adds a few guards, each asks once."""
    frame: types.FrameType | None = sys._getframe(1)
    op = None
    while frame is not None:
        code = frame.f_code
        if is_user_file(code.co_filename):
            return code.co_filename, frame.f_lineno, code.co_name, op
        if code is _DISPATCH_CODE:
            op = qualified_name(frame.f_locals["func"])
        elif code is _COMPOSITE_CODE or code is _KERNEL_CODE:
            op = frame.f_locals.get("name", op)
        frame = frame.f_back
    return None


_DISPATCH_CODE, _COMPOSITE_CODE, _KERNEL_CODE = (
    _torch_function.__code__,
    record_composite.__code__,
    record_kernel.__code__,
)
