"""The recording in progress, and how prims and composite symbols are recorded into it.

The current ``Recorder`` (a Rust object) is held in a context variable set only while
acquisition runs a program, so recording is explicit and re-entrant.
"""

import contextlib
import contextvars
import weakref
import threading
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import FakeTensor

from thunder_rs import _core
from thunder_rs.core.base.dtypes import CODES
from thunder_rs.core.base.layouts import is_contiguous, is_dense, layout, layout_of, strides_in
from thunder_rs.core.base.proxies import TensorProxy, make_proxy, requires_grad_of
from thunder_rs.core.base.userframe import user_location
from thunder_rs.errors import ThunderError, ThunderNotImplementedError, ThunderRuntimeError, ThunderTypeError

_is_grad_enabled = torch.is_grad_enabled
_is_inference_mode_enabled = torch.is_inference_mode_enabled
_current: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_recorder", default=None)
_captures: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_captures", default=None)
#: Every proxy the acquisition in progress made, so escapes into user state can be found after it.
_made: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_made", default=None)
#: Per acquisition that answers reads of values (``values``): the tensor each trace input stands
#: for, in input order, on which a snapshot of the recording runs.
_real_inputs: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_real_inputs", default=None)


#: The recorder of the acquisition in progress in this thread, or None: ``active_recorder()``.
active_recorder = _current.get
#: The ``Captures`` of the acquisition in progress in this thread, or None.
active_captures = _captures.get
#: The tensors the trace inputs stand for, in input order (``_real_inputs``), or None.
real_inputs = _real_inputs.get


def current() -> "_core.Recorder":
    rec = _current.get()
    if rec is None:
        raise ThunderRuntimeError("recorder: thunder_rs symbols can only be called while thunder_rs traces a program")
    return rec


def _overrides(cls, name: str):
    impl = getattr(cls, name)
    return getattr(impl, "__func__", impl)


#: Overrides a traced input may have: a plain tensor's, a parameter's, and a fake tensor's (shapes
#: without data: how the CUDA policies are checked without a GPU, and what Dynamo passes).
_PLAIN_OVERRIDES = {
    "__torch_function__": {_overrides(torch.Tensor, "__torch_function__"), torch._C._disabled_torch_function_impl},
    "__torch_dispatch__": {
        _overrides(torch.Tensor, "__torch_dispatch__"),
        _overrides(FakeTensor, "__torch_dispatch__"),
    },
}


def refuse_unlike_strided(t: torch.Tensor) -> None:
    """Inputs a trace of dense tensors cannot stand for: sparse and nested layouts, and tensor
    subclasses that handle torch calls themselves (their handlers would not run)."""
    if t.layout != torch.strided or t.is_nested:
        kind = "nested" if t.is_nested else str(t.layout).removeprefix("torch.")
        raise ThunderNotImplementedError(
            f"jit: a {kind} tensor input is not supported; thunder_rs traces dense "
            "(strided) tensors: pass it dense (to_dense(), to_padded_tensor())"
        )
    for name, plain in _PLAIN_OVERRIDES.items():
        if _overrides(type(t), name) not in plain:
            raise ThunderNotImplementedError(
                f"jit: an input of tensor subclass {type(t).__qualname__} defines its own {name}, which a compiled "
                "call would not run; pass a plain tensor, or run this part with torch.compile"
            )


def _note_dual_input(t: torch.Tensor) -> None:
    """Notes an input that is a dual tensor made outside the jitted call (``dual_tensors`` refuses
    the program's own ``make_dual``/``unpack_dual`` then: the input's tangent does not reach the
    trace, whose executors' eager kernels alone carry it, as under ``torch.func.jvp`` of the call)."""
    level = torch.autograd.forward_ad._current_level
    holder = dual_levels.get()
    if level < 0 or holder is None:
        return
    with torch._C.DisableTorchFunction():
        if torch._unpack_dual(t, level=level)[1] is not None:
            holder[1] = True


def input_proxy(
    rec: "_core.Recorder", t: torch.Tensor, sizes: dict | None = None, strides=None, position: int | None = None
) -> TensorProxy:
    """A new trace input standing for the tensor ``t``. It requires grad as ``t`` does, whatever
    the grad mode: the mode in effect as each op is recorded decides whether gradients flow.
    ``sizes`` holds the size inputs (``_core.SymExpr``) of its symbolic dims, by dim; ``strides``
    a strided tensor's symbolic strides (``SymInt``s of size inputs: a slice of a buffer of a
    symbolic length); ``position`` that of an argument among the call's flat inputs (else every
    call takes ``t`` itself)."""
    dtype = CODES.get(t.dtype)
    if dtype is None:
        raise ThunderTypeError(f"jit: unsupported input dtype {t.dtype}")
    refuse_unlike_strided(t)
    _note_dual_input(t)
    requires_grad = t.requires_grad
    shape = tuple(t.shape) if not sizes else tuple(sizes.get(d, s) for d, s in enumerate(t.shape))
    vid = rec.tensor_input(dtype, str(t.device), shape, requires_grad)
    real = _real_inputs.get()
    proxy = make_proxy(vid, shape, dtype, str(t.device), requires_grad)
    if real is not None:
        proxy.__dict__["_real_at"] = len(real)
        real.append(t)
    proxy._input_vid = vid
    proxy._source = weakref.ref(t) if position is None else position
    proxy._inference = t.is_inference()
    if isinstance(t, torch.nn.Parameter):  # (``isinstance(p, nn.Parameter)`` reads it; the key holds the type)
        proxy._is_param = True
    if proxy._inference:
        INFERENCE_MADE[0] = True  # (its uses are checked: ``inference.check_call``)
    if requires_grad:
        try:
            proxy._leaf = t.is_leaf
        except RuntimeError as e:  # a view autograd refuses (eager raises it where an op would record)
            proxy._history_error = str(e)
        if t._is_view():
            proxy._view_grad = False
    offset = int(t.storage_offset())
    if offset:
        proxy._offset = offset
    if not t.is_contiguous():  # (dense in another order: strides of its symbolic sizes)
        own = strides_in(proxy._shape, layout(t)) if sizes else t.stride()
        proxy._strides = tuple(strides.get(d, n) for d, n in enumerate(own)) if strides and own else own
    made = _made.get()
    if made is not None:
        made.append(proxy)
    return proxy


class Captures:
    """Tensors the program reads from outside its inputs (closures, globals, module attributes
    that are not parameters or buffers). Each becomes a trace input the first time a traced
    call takes it, and every call of the compiled function passes that same tensor object, so
    its current values are read (as eager reads them); rebinding the name to another tensor is
    not seen. Torch calls on such tensors alone run eagerly while tracing (they may steer
    Python control flow), so a tensor derived from them there is captured as computed then.

    A tensor an argument object holds (``held``: id -> ``reached.ArgumentTensor``) is instead
    read by every call where the call's arguments hold it: ``tensors`` then has that record in
    its place."""

    def __init__(self, rec: "_core.Recorder", held: dict | None = None):
        self._rec = rec
        self._held = held or {}
        self._proxies: dict[int, TensorProxy] = {}
        #: the captured tensors, or the ``ArgumentTensor`` records of those read per call
        self.tensors: list = []
        #: the trace inputs standing for ``tensors``, in the same order
        self.proxies: list[TensorProxy] = []
        #: tensors the program created from Python values while traced (``torch.tensor([1., 2.])``),
        #: by id: kept alive while the trace may still take them
        self._created: dict[int, torch.Tensor] = {}
        #: ``(leaf proxy, proxy of its cast, device type, dtype)`` of the autocast casts taken as
        #: inputs (``cast_input``)
        self.casts: list = []

    def note_created(self, result) -> None:
        """Notes tensors a call without tensor arguments returned: eager makes them anew on every
        call, so the trace takes a copy of them per call (``proxy``)."""
        for t in result if type(result) in (list, tuple) else (result,):
            if isinstance(t, torch.Tensor) and not isinstance(t, TensorProxy) and not t.is_meta:
                self._created[id(t)] = t

    def alias(self, t: torch.Tensor, proxy: TensorProxy) -> None:
        """Stands ``proxy`` (a module's parameter or buffer input) for ``t`` wherever the program
        reaches ``t`` by another path than its module tree (a plain list of its submodules, as
        UperNet's pyramid pooling keeps them): one trace input, written back to its slot."""
        self._proxies[id(t)] = proxy

    def hold(self, t: torch.Tensor, held) -> None:
        """Reads ``t`` by every call where ``held`` (a ``reached.ArgumentTensor``) says."""
        self._held[id(t)] = held

    def is_created(self, x) -> bool:
        return isinstance(x, torch.Tensor) and self._created.get(id(x)) is x

    def release(self) -> list:
        """The captured tensors, in trace-input order; drops the proxies standing for them."""
        self._proxies.clear()
        self.proxies, self.casts = [], []
        return self.tensors

    def proxy(self, t: torch.Tensor, sizes: dict | None = None, strides: dict | None = None) -> TensorProxy:
        """The proxy standing for ``t``: the trace input that captures it or, for a tensor the
        program created while traced, a copy of that input made on every call, which the program's
        outputs and writes may hold (eager gives each call a tensor of its own). ``sizes`` are the
        size inputs of its symbolic dims, by dim, for the first take (``strides`` of its strides)."""
        p = self._proxies.get(id(t))
        if p is None:
            p = self._proxies[id(t)] = input_proxy(self._rec, t, sizes, strides)
            held = self._held.get(id(t))
            if held is not None:  # (read per call from the argument object, guarded on its metadata)
                p._source, p._held = None, held
            self.tensors.append(t if held is None else held.used())
            self.proxies.append(p)
            if self.is_created(t):
                copy = torch.clone(p)
                assert isinstance(copy, TensorProxy)  # recorded: the clone of a proxy is a proxy
                copy._input_vid, copy._per_call = copy._vid, True
                self._proxies[id(t)] = copy
                return copy
        return p

    def cast_input(self, leaf: TensorProxy, dtype: torch.dtype, cast: torch.Tensor | None) -> TensorProxy:
        """A trace input standing for torch's cached autocast cast of the trace input ``leaf`` to
        ``dtype`` (``autocast._lifted``; ``cast``: the tensor now, where reads of values need it).
        Among the captured tensors it holds an empty stand-in, which every call replaces by the cast
        of its own leaf (``torch_casts.with_cached_casts``, placed by ``cast_positions``)."""
        stand_in = torch.empty(0, dtype=dtype, requires_grad=True)
        vid = self._rec.tensor_input(CODES[dtype], str(leaf.device), tuple(leaf.shape), True)
        p = make_proxy(vid, tuple(leaf.shape), CODES[dtype], str(leaf.device), True)
        p._input_vid, p._source, p._inference = vid, weakref.ref(stand_in), False
        if leaf._strides is not None:  # (torch's cast keeps a dense layout)
            p._strides = leaf._strides
        real = _real_inputs.get()
        if real is not None:
            real.append(cast)
        made = _made.get()
        if made is not None:
            made.append(p)
        self._proxies[id(stand_in)] = p
        self.tensors.append(stand_in)
        self.proxies.append(p)
        self.casts.append((leaf, p, leaf.device.type, dtype))
        return p

    def cast_positions(self, traced: tuple) -> tuple:
        """``(position, leaf position, device type, dtype)`` of each cast input among the trace's
        inputs ``traced`` (``with_cached_casts``)."""
        at = {id(p): k for k, p in enumerate(traced)}
        return tuple((at[id(p)], at[id(leaf)], device, dtype) for leaf, p, device, dtype in self.casts)

    def written(self) -> dict:
        """The proxies of the captured tensors the program wrote in place, by the id of the tensor
        (of a tensor the program created, the proxy of its copy)."""
        return {key: p for key, p in self._proxies.items() if p._vid != p._input_vid}

    def written_in(self, values) -> bool:
        """Whether ``values`` (or lists of them) hold a captured tensor the program has written."""
        if not self.proxies:
            return False
        for x in values:
            for t in x if type(x) in (list, tuple) else (x,):
                p = self._proxies.get(id(t)) if isinstance(t, torch.Tensor) else None
                if p is not None and p._vid != p._input_vid:
                    return True
        return False


def reads_written_capture(args: tuple, kwargs: dict) -> bool:
    """Whether a call takes a captured tensor the program has written: its value while tracing
    is stale, so the call must be traced rather than run eagerly."""
    captures = _captures.get()
    return captures is not None and captures.written_in((*args, *kwargs.values()))


def _lift(x, captures: Captures):
    if isinstance(x, torch.Tensor) and not isinstance(x, TensorProxy):
        return captures.proxy(x)
    if type(x) in (list, tuple):
        return type(x)(_lift(y, captures) for y in x)
    return x


def _holds_real_tensor(x) -> bool:
    if isinstance(x, torch.Tensor):
        return not isinstance(x, TensorProxy)
    return type(x) in (list, tuple) and any(isinstance(y, torch.Tensor) and not isinstance(y, TensorProxy) for y in x)


def lift_captured(args: tuple, kwargs: dict):
    """``args`` and ``kwargs`` with real tensors replaced by the trace inputs that capture them."""
    captures = _captures.get()
    if captures is None or not any(map(_holds_real_tensor, (*args, *kwargs.values()))):
        return args, kwargs
    return _lift(args, captures), {k: _lift(v, captures) for k, v in kwargs.items()}


#: Per acquisition: symbol id -> the checkers (None: no checker) of the executors that can run
#: that symbol whole (``extend.whole_runners``); None when every decomposition must be recorded.
_whole: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_whole", default=None)

#: Per acquisition, a list holding the dual level the program made duals at (``dual_tensors``), or
#: None, and whether an input is a dual made outside the call (``_note_dual_input``).
dual_levels: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_dual_levels", default=None)


#: While a dual lives (``dual_tensors``): composites are recorded with their decompositions, not
#: their grad rules (whose backward differentiates only the inputs that required grad then).
_without_rules: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_without_grad_rules", default=False)


def recording_decompositions_from_now():
    """``recording_decompositions``, and composites without their grad rules, until the function
    it returns is called (a dual level's end, which no ``with`` block of thunder_rs spans), or
    the acquisition ends."""
    tokens = [(_whole, _whole.set(None)), (_without_rules, _without_rules.set(True))]

    def restore() -> None:
        while tokens:
            var, token = tokens.pop()
            try:
                var.reset(token)
            except ValueError:  # (set in another context: the acquisition's end reset it)
                pass

    return restore


#: While ``torch.func.jvp``'s function is traced (reverse mode standing for forward mode), a list
#: of the calls recorded with grad mode off on values that require grad (``no_grad`` inside it):
#: eager's forward mode carries tangents through them, reverse mode no gradient
#: (``traced_grads.jvp`` runs such a jvp as one eager call).
grad_mode_cuts: contextvars.ContextVar = contextvars.ContextVar("thunder_rs_grad_mode_cuts", default=None)


def _note_cut(name: str, args: tuple, kwargs: dict) -> None:
    cuts = grad_mode_cuts.get()
    if cuts is not None and _requires_grad(args, kwargs):
        cuts.append(name)


@contextlib.contextmanager
def recording(
    rec: "_core.Recorder", captures: Captures | None = None, made: list | None = None, whole: dict | None = None
):
    """Records into ``rec``; real tensors become trace inputs through ``captures``; every proxy
    made is appended to ``made``; kernels that ``whole`` says an executor runs whole are recorded
    without their decompositions (``record_kernel``)."""
    token = _current.set(rec)
    rules_token = _without_rules.set(False)
    captures_token = _captures.set(captures)
    made_token = _made.set(made)
    whole_token = _whole.set(whole)
    duals: list = [None, False]
    duals_token = dual_levels.set(duals)
    try:
        yield rec
    finally:
        duals[0] = None  # (the duals' proxies do not outlive the acquisition)
        dual_levels.reset(duals_token)
        _whole.reset(whole_token)
        _without_rules.reset(rules_token)
        _made.reset(made_token)
        _captures.reset(captures_token)
        _current.reset(token)


@contextlib.contextmanager
def recording_decompositions(enabled: bool = True):
    """Kernels recorded with their decompositions (when ``enabled``), whichever executor runs them
    whole: a traced ``torch.func.grad`` that the program's gradient may go through differentiates
    its calls through their decompositions, whose backward it can differentiate again."""
    token = _whole.set(None) if enabled else None
    try:
        yield
    finally:
        if token is not None:
            _whole.reset(token)


@contextlib.contextmanager
def noting_inputs(inputs: list | None):
    """Appends the tensor each new trace input stands for to ``inputs`` (when not None)."""
    token = _real_inputs.set(inputs)
    try:
        yield
    finally:
        _real_inputs.reset(token)


@contextlib.contextmanager
def paused_recording():
    """No recording in this context: real computation in the middle of an acquisition (a value
    the program reads) runs as eager code runs."""
    tokens = [(var, var.set(None)) for var in (_current, _captures, _made, _whole)]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


#: Whether a proxy was made under inference mode since the last acquisition began, or a trace input
#: stands for an inference tensor: until one is, no call needs ``inference.check_call``.
INFERENCE_MADE = [False]


def proxies(recorded: list) -> list[TensorProxy]:
    """The proxies of the tensors the recorder made (``_core.RecordedTensor`` each)."""
    out = [make_proxy(r.vid, r.shape, r.dtype_code, r.device, r.requires_grad) for r in recorded]
    if not INFERENCE_MADE[0] and _is_inference_mode_enabled():
        INFERENCE_MADE[0] = True
    made = _made.get()
    if made is not None:
        made.extend(out)
    return out


#: Per thread, the lists that each prim call it records is appended to as ``(name, args,
#: outputs)``: views capture what a view op records (``thunder_rs.torch.views``).
_prim_logs: dict[int, list[list]] = {}


def start_prim_log(log: list) -> None:
    """Appends the prims this thread records to ``log`` until ``stop_prim_log``; nests."""
    _prim_logs.setdefault(threading.get_ident(), []).append(log)


def stop_prim_log() -> None:
    ident = threading.get_ident()
    logs = _prim_logs[ident]
    logs.pop()
    if not logs:
        del _prim_logs[ident]


#: Per thread, the draws ``(args, output)`` that the next ``prims.uniform`` calls return again
#: instead of drawing (``replaying_draws``).
_replays: dict[int, list] = {}


@contextlib.contextmanager
def replaying_draws(draws: list):
    """While it lasts, each ``prims.uniform`` this thread records with the arguments of the next of
    ``draws`` returns that draw's output: a reentrant checkpoint's function traced a second time,
    whose draws eager makes again from the generator state of the first (``preserve_rng_state``).
    Raises where the calls draw otherwise."""
    ident = threading.get_ident()
    _replays[ident] = list(draws)
    try:
        yield
        if _replays[ident]:
            raise ThunderNotImplementedError(
                f"torch.utils.checkpoint (use_reentrant=True) at {user_location()}: the checkpointed function draws "
                "fewer random numbers without grad than with it"
            )
    finally:
        del _replays[ident]


def _replayed(args: tuple):
    """The output of the draw ``replaying_draws`` gives again for ``prims.uniform(*args)``."""
    replay = _replays[threading.get_ident()]
    if not replay or replay[0][0] != args:
        raise ThunderNotImplementedError(
            f"torch.utils.checkpoint (use_reentrant=True) at {user_location()}: the checkpointed function draws "
            "other random numbers without grad than with it"
        )
    return replay.pop(0)[1]


def record_prim(name: str, args: tuple):
    """Records ``prims.<name>(*args)`` under the grad mode in effect now; returns one proxy or a
    tuple of them."""
    if _replays and name == "uniform" and threading.get_ident() in _replays:
        return _replayed(args)
    grad = _is_grad_enabled()
    if not grad:
        _note_cut(name, args, {})
    recorded = current().prim(name, args, grad)
    if grad:
        note_gradient_through(recorded, args)
    outs = proxies(recorded)
    if _prim_logs:
        for log in _prim_logs.get(threading.get_ident(), ()):
            log.append((name, args, outs))
    return outs[0] if len(outs) == 1 else tuple(outs)


def note_gradient_through(outputs: list, args: tuple) -> None:
    """Notes the view inputs (``TensorProxy._view_grad``) among ``args`` of an op whose
    ``outputs`` (``_core.RecordedTensor``s) require grad; raises eager's error for one whose
    history eager refuses (``_history_error``): eager raises it as such an op records its
    gradient, where ops under ``no_grad`` and ops without a gradient (``v > 0``, ``v.detach()``)
    read it."""
    if not any(o.requires_grad for o in outputs):
        return
    if _is_inference_mode_enabled():
        refuse_gradient_in_inference_mode()
    for a in args:
        for t in a if type(a) in (list, tuple) else (a,):
            if isinstance(t, TensorProxy):
                note_gradient_into(t)


def refuse_gradient_in_inference_mode() -> None:
    """Raises for an op that would record a gradient while inference mode is on: grad mode enabled
    inside ``torch.inference_mode()`` (``torch.enable_grad()``), where eager's ops record none
    (inference mode leaves autograd out whatever grad mode says) and return inference tensors."""
    raise ThunderNotImplementedError(
        f"thunder_rs.jit: grad mode is enabled inside torch.inference_mode() at {user_location()} (torch.enable_grad() "
        "or torch.set_grad_enabled(True) inside it, or the jitted call made under it): eager records no gradient "
        "there, which thunder_rs cannot trace. Leave grad mode off inside inference mode, or use torch.no_grad()"
    )


def note_gradient_into(t: TensorProxy) -> None:
    """Notes that a gradient flows into ``t`` (see ``note_gradient_through``)."""
    if t._view_grad is False:
        if t._history_error is not None:
            raise ThunderRuntimeError(f"{t._history_error} (at {user_location()})")
        t._view_grad = True


def output_meta(shape, dtype: torch.dtype, device, requires_grad: bool) -> "_core.TensorMeta":
    """The metadata of a call's output whose values Python describes (a fallback run on fake
    tensors, a kernel recorded whole): ``device`` a ``torch.device`` or its name."""
    return _core.TensorMeta(
        dtype_code=CODES[dtype], device=str(device), shape=tuple(shape), requires_grad=requires_grad
    )


def output_vids(out) -> list[int]:
    """Value ids of a composite's outputs; empty when an output is not a proxy."""
    if isinstance(out, TensorProxy):
        return [out._vid]
    if isinstance(out, (tuple, list)) and out and all(isinstance(o, TensorProxy) for o in out):
        return [o._vid for o in out]
    return []


#: symbol id -> the grad rule registered for it (``thunder_rs.register_grad``).
GRAD_RULES: dict[int, Callable[..., Any]] = {}


class _RulesRunning(threading.local):
    """Per thread (programs may be traced in several threads at once): the grad rules running."""

    def __init__(self):
        #: symbol ids whose grad rule is running: a rule calling its own symbol records the plain
        #: decomposition.
        self.symbols: set[int] = set()
        #: one flag per grad rule running, innermost last: whether it has asked for a cotangent.
        #: What a rule records from then on is a backward, which nothing differentiates, so the
        #: symbols it calls record their plain decompositions rather than rules of their own.
        self.in_backward: list[bool] = []
        #: the ids of the generators random calls recorded in a backward named (``backward_draws``)
        self.backward_draws: set[int] = set()


_running = _RulesRunning()


def backward_draws() -> set[int]:
    """The ids of the generators that random calls recorded in a grad rule's backward (a custom
    Function's) named, in this thread: its caller clears it (``generator_inputs``)."""
    return _running.backward_draws


def recording_backward() -> bool:
    """Whether a grad rule running in this thread records its backward (it asked for a cotangent)."""
    return True in _running.in_backward


def enter_backward() -> None:
    """Marks the innermost running grad rule as recording its backward (``get_grad``)."""
    if _running.in_backward:
        _running.in_backward[-1] = True


def _requires_grad(args: tuple, kwargs: dict) -> bool:
    for a in (*args, *kwargs.values()):
        if isinstance(a, TensorProxy):
            if requires_grad_of(a):
                return True
        elif isinstance(a, (tuple, list)) and any(isinstance(x, TensorProxy) and requires_grad_of(x) for x in a):
            return True
    return False


def _body(symbol_id: int, fn, args: tuple, kwargs: dict):
    """The decomposition, or the grad rule when one is registered and a gradient may flow (grad
    mode on and an input requires grad)."""
    rule = GRAD_RULES.get(symbol_id)
    if rule is None or not _is_grad_enabled() or _without_rules.get():
        return fn(*args, **kwargs)
    running = _running
    if symbol_id in running.symbols or True in running.in_backward or not _requires_grad(args, kwargs):
        return fn(*args, **kwargs)
    running.symbols.add(symbol_id)
    running.in_backward.append(False)
    try:
        return rule(*args, **kwargs)
    finally:
        running.symbols.discard(symbol_id)
        running.in_backward.pop()


#: Keyword arguments a composite's body reads that its recorded call does not carry: ``inplace=True``
#: (from ``thunder_rs.torch.inplace``) tells a grad rule that the op computed in place, whose eager
#: formula differentiates from the result (``elu_``); the call is out of place for every executor.
_BODY_ONLY = ("inplace",)


def record_composite(symbol_id: int, name: str, fn, args: tuple, kwargs: dict):
    """Runs the decomposition ``fn`` (or the symbol's grad rule) as the body of a composite call
    of ``symbol_id``.

    An error inside the decomposition is prefixed with ``name``, so it reads as a call path
    from the op the user called (``ltorch.masked_fill: ltorch.where: ...``).
    """
    rec = current()
    recorded = {k: v for k, v in kwargs.items() if k not in _BODY_ONLY} if kwargs else None
    try:
        rec.begin(symbol_id, args, recorded or None)
    except TypeError as e:
        # (an argument the trace has no value for, ``x.to(torch.float8_e4m3fn)``: a refusal, which
        # leaves the program's changes undone, as the call was not made)
        if isinstance(e, ThunderError):
            raise
        raise ThunderTypeError(f"{name}: {e}, called at {user_location()}") from None
    try:
        out = _body(symbol_id, fn, args, kwargs)
    except ThunderError as e:
        rec.abort()
        if e.args and isinstance(e.args[0], str) and not e.args[0].startswith(name + ":"):
            e.args = (f"{name}: {e.args[0]}", *e.args[1:])
        raise
    except BaseException:
        rec.abort()
        raise
    _unlink_inner_views(out, (*args, *kwargs.values()))
    rec.end(output_vids(out))
    return out


def _unlink_inner_views(out, given: tuple) -> None:
    """A composite's output that views a tensor only its decomposition computed (``tensordot``'s
    ``mm(...).reshape(...)``) is unlinked from it, keeping its eager strides: no call outside the
    composite names that tensor, so the trace cannot return it for the view to be taken again of
    it (``output_views``); an executor running the op whole returns eager's view. Views of the
    call's tensors, of another output, or of a root several outputs share (a write through one
    shows in the others) keep their links."""
    outs = (out,) if isinstance(out, TensorProxy) else out if isinstance(out, (list, tuple)) else ()
    if not any(isinstance(o, TensorProxy) and o._view is not None for o in outs):
        return  # (most calls: no output is a view)
    reachable = {id(o) for o in outs}
    for a in given:
        for t in a if type(a) in (list, tuple) else (a,):
            if isinstance(t, TensorProxy):
                reachable.add(id(t) if t._view is None else id(t._view.root))
                reachable.add(id(t))
    roots = [id(o._view.root) for o in outs if isinstance(o, TensorProxy) and o._view is not None]
    for o in outs:
        if isinstance(o, TensorProxy) and o._view is not None:
            root = id(o._view.root)
            if root not in reachable and roots.count(root) == 1:
                strides, o._view = o._view.strides, None
                _keep_strides(o, strides)


def _hint(size) -> int:
    expr = getattr(size, "expr", None)  # (a ``SymInt``: its value when traced)
    return size if expr is None else expr.hint


def _keep_strides(o, strides) -> None:
    """Gives ``o`` (no view) the eager ``strides`` it had as a view where they are not contiguous:
    by their order for symbolic sizes, where they are dense (as ``eager_layouts`` does)."""
    if strides is None:
        return
    shape = tuple(_hint(s) for s in o._shape)
    hinted = tuple(_hint(s) for s in strides)
    if is_contiguous(shape, hinted):
        return
    lay = layout_of(shape, hinted)
    if is_dense(lay):
        o._strides = strides_in(o._shape, lay)
    elif all(type(s) is int for s in o._shape):
        o._strides = tuple(strides)


#: The symbol ids of the kernels (symbols with a meta rule, which ``record_kernel`` records).
KERNEL_IDS: set[int] = set()
#: Those of them whose kernel is elementwise, broadcasting its tensor operands (``tanh_backward``):
#: a backward batched over a jacobian's basis records them again on batched operands.
ELEMENTWISE_KERNEL_IDS: set[int] = set()


def record_kernel(symbol_id: int, name: str, fn, meta, args: tuple, kwargs: dict):
    """Records a call of the kernel ``symbol_id`` (a ``torchsymbol`` declared with ``meta=``, beside
    its op): whole, its outputs described by ``meta``, when an executor of the jit runs it whole and
    nothing will need its decomposition; else as ``record_composite`` does.

    Recording a decomposition is most of what a kernel costs at compile time (the GPT block's
    layer-norm and attention kernels take about 6 ms), and the torch executor never runs it.
    The decomposition is needed by an executor that translates prims (nvFuser), by the claim
    pass when no executor takes the kernel (its checkers refuse the call), and by the VJP pass
    when it differentiates the kernel, which only a grad rule's kernels escape.
    """
    outputs = _whole_outputs(symbol_id, meta, args, kwargs)
    if outputs is None:
        return record_composite(symbol_id, name, fn, args, kwargs)
    if _is_grad_enabled():
        note_gradient_through(outputs, (*args, *(kwargs or {}).values()))
    else:
        _note_cut(name, args, kwargs or {})
    outs = proxies(current().call(symbol_id, args, kwargs or None, outputs, whole=True))
    return outs[0] if len(outs) == 1 else tuple(outs)


def _whole_outputs(symbol_id: int, meta, args: tuple, kwargs: dict) -> list | None:
    """The outputs' ``_core.TensorMeta`` of a whole kernel call, or None when its
    decomposition must be recorded. ``meta`` describes each as ``(shape, dtype)``,
    or ``(shape, dtype, flows)`` where ``flows`` says whether a gradient can reach it from the
    inputs that require grad."""
    runners = _whole.get()
    checkers = None if runners is None else runners.get(symbol_id)
    if checkers is None:
        return None
    differentiable = _is_grad_enabled() and _requires_grad(args, kwargs)
    if differentiable and not _running.in_backward:
        return None  # not inside a grad rule: the VJP pass may differentiate the decomposition
    if not any(checker is None or checker(*args, **kwargs) for checker in checkers):
        return None
    described = meta(*args, **kwargs)
    if described is None:
        return None
    device = str(next(a for a in args if isinstance(a, TensorProxy)).device)
    outputs = []
    for shape, dtype, *flows in described:
        inexact = dtype.is_floating_point or dtype.is_complex
        outputs.append(output_meta(shape, dtype, device, differentiable and all(flows) and inexact))
    return outputs
