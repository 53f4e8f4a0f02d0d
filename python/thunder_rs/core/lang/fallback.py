"""Eager fallback symbols: torch calls with no ltorch mapping.

The call is recorded as an opaque symbol named after the torch callable; its outputs' metadata
come from running it on meta tensors (on fake tensors under autocast, which meta tensors escape).
The torch executor runs it eagerly, under the autocast state it was traced under, and torch's
autograd differentiates it. Random calls are effect symbols, drawn on every call; their backward
draws again from the generator state the forward started from.
``thunder_rs.examine`` counts fallbacks by name.
"""

import functools
import threading
import weakref
from collections.abc import Callable

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from thunder_rs import _core
from thunder_rs.core.lang import autocast, underived_grads
from thunder_rs.core.base import problems
from thunder_rs.core.lang.autocast import AutocastState
from thunder_rs.core.lang.devices import indexed, refuse_pinned
from thunder_rs.core.lang.meta_errors import reads_values
from thunder_rs.core.base.dtypes import CODES
from thunder_rs.core.base.lazy import LazyModule
from thunder_rs.core.base.logs import log_fallback
from thunder_rs.core.base.proxies import SymbolicSize, TensorProxy
from thunder_rs.core.base.trees import tree_leaves, tree_map
from thunder_rs.core.lang.recorder import backward_draws, current, output_meta, proxies, recording_backward
from thunder_rs.core.lang.recorder import note_gradient_through, paused_recording, refuse_gradient_in_inference_mode
from thunder_rs.core.lang.symfloat import SymFloat
from thunder_rs.core.lang.symint import SymInt
from thunder_rs.core.base.userframe import user_location
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, thunder_error_like

#: Symbolic output sizes of fallbacks (sympy and torch's ShapeEnv): for symbolic compiles only.
_SIZES = LazyModule("thunder_rs.core.lang.fallback_sizes")

_is_any_autocast_enabled = torch._C._is_any_autocast_enabled

#: symbol id -> the torch callable a fallback symbol runs.
FALLBACK_IMPLS: dict[int, Callable] = {}
_ids: dict[object, int] = {}
#: fallback name -> the callables registered under it, in order.
_names: dict[str, list] = {}
#: names of the effect symbols that only a compiled call makes, never tracing's runs of the
#: recording for a value read (``snapshots``): a trace holding one runs whole on its first call
#: (``cuda_queue``: waits, events, streams, nvtx ranges)
CALL_EFFECTS: set[str] = set()
#: those of them that wait or mark on the device queue: a trace holding one launches its kernels
#: one by one, in program order (no fusion region moves them)
QUEUE_EFFECTS: set[str] = set()


def qualified_name(func) -> str:
    """``torch.cumsum``, ``torch.Tensor.cumsum``, ``torch.nn.functional.unfold``; a property
    read as ``torch.Tensor.mH.__get__``."""
    name = getattr(func, "__name__", None) or type(func).__name__
    prop = getattr(getattr(func, "__self__", None), "__name__", None) if name == "__get__" else None
    if prop is not None:
        return f"torch.Tensor.{prop}.__get__"
    owner = getattr(func, "__objclass__", None) or getattr(getattr(func, "__self__", None), "__class__", None)
    if owner is not None and owner.__name__ in ("TensorBase", "Tensor"):
        return f"torch.Tensor.{name}"
    module = getattr(func, "__module__", None) or "torch"
    if module.startswith("torch._C"):
        module = "torch"
    return f"{module}.{name}"


def symbol_id(
    func,
    effect: bool = False,
    autocast_state: AutocastState | None = None,
    replay: bool = False,
    sized: tuple = (),
    grad_mode: tuple | None = None,
) -> int:
    """The fallback symbol of ``func`` (run under ``autocast_state`` when not None, its forward
    under the grad mode ``grad_mode`` when not None: ``GRAD_MODE_KERNELS``), registered
    on first use with its ``<name>.vjp``. An effect (a random call) has a ``.vjp`` only as a
    ``replay`` symbol: one that returns, last, the generator state its draws started from, from
    which its backward draws the same numbers again. A ``sized`` symbol (groups of ``(output,
    dim)``, ``values.widened``) returns, after its tensors, the size at the first place of each
    group, and has the backward of its tensors (unless it draws: ``replay``)."""
    key = (func, autocast_state, replay, sized, grad_mode)
    sid = _ids.get(key)
    if sid is None:
        name, impl = qualified_name(func), func
        if autocast_state is not None:
            name += "".join(f".autocast_{d}_{str(t).removeprefix('torch.')}" for d, t in autocast_state.devices())
            impl = _under_autocast(func, autocast_state)
        if replay:
            name += ".replayable"
        if sized:
            name += ".sized_" + "_".join(f"{i}_{d}" for i, d in (g[0] for g in sized))
        if grad_mode is not None:
            name += (".grad_mode_" if grad_mode[0] else ".no_grad_mode_") + "".join(str(int(f)) for f in grad_mode[1])
        # The registry is by name: two callables of one name must not share a symbol.
        taken = sum(1 for other in _names.get(name, ()) if other is not func)
        _names.setdefault(name, []).append(func)
        name += f".{taken}" if taken else ""
        sid = _ids[key] = _core.register_symbol(name, fallback=True, effect=effect)
        forward = impl if grad_mode is None else _under_grad_mode(impl, grad_mode)
        run = _returning_generator_state(forward) if replay else _flat_outputs(forward)
        FALLBACK_IMPLS[sid] = _returning_sizes(forward, sized) if sized else run
        if replay or not effect:  # (a sized call's backward takes its tensors' cotangents; its sizes have none)
            vjp = _replaying(_vjp_of(impl)) if replay else _vjp_of(impl)
            FALLBACK_IMPLS[_core.register_symbol(f"{name}.vjp", fallback=True)] = vjp
            LOGGED_VJPS.add(f"{name}.vjp")
    return sid


def _named_generator(args, kwargs) -> torch.Generator | None:
    """The generator a random call names: its ``generator=``, or one it takes positionally
    (``torch.rrelu(x, lower, upper, True, g)``); None where it draws from a default one."""
    gen = kwargs.get("generator")
    return gen if gen is not None else next((a for a in args if type(a) is torch.Generator), None)


def _generator(args, kwargs) -> torch.Generator:
    """The generator a random call draws from: the one it names, else the default one of the
    device its outputs go to (``_device``)."""
    gen = _named_generator(args, kwargs)
    if gen is not None:
        return gen
    tensors = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    device = torch.device(_device(tensors, kwargs))
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    return torch.default_generator


def _tensor_leaves(out) -> list:
    """The outputs a fallback symbol binds: the leaves of ``out`` but its Nones (outputs not
    asked for, such as ``multi_head_attention_forward``'s weights under ``need_weights=False``,
    which the trace keeps as constants in the output's structure)."""
    return [x for x in tree_leaves(out) if x is not None]


def _flat_outputs(func):
    """``func`` returning its tensors as the trace binds a fallback's outputs: one alone, several
    as a flat tuple (``torch.gradient`` of a 1-d tensor returns a tuple of one, which would
    otherwise be bound whole to the output)."""

    @functools.wraps(func)
    def run(*args, **kwargs):
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            return out
        if out is None:  # (an effect's: no pytree walk, 20 us, on every call)
            return ()
        leaves = _tensor_leaves(out)
        return leaves[0] if len(leaves) == 1 else tuple(leaves)

    return run


def _returning_sizes(func, sized: tuple):
    """``func``'s flat outputs followed by the size at the first place of each group of ``sized``."""

    @functools.wraps(func)
    def run(*args, **kwargs):
        leaves = _tensor_leaves(func(*args, **kwargs))
        return (*leaves, *(leaves[i].shape[d] for (i, d), *_ in sized))

    return run


def _returning_generator_state(func):
    """``func``'s flat outputs followed by the state of the generator before it drew."""

    @functools.wraps(func)
    def run(*args, **kwargs):
        state = _generator(args, kwargs).get_state()
        return (*_tensor_leaves(func(*args, **kwargs)), state)

    return run


def _replaying(vjp):
    """A random call's backward: reruns it from the generator state its forward started from (and
    leaves the generator as it was), so that it draws the same numbers. A generator the call names
    is not touched: the rerun draws from a generator of its own at that state (the named one may
    be drawn from meanwhile: a generator argument's stand-in, ``generator_inputs``, by the next call)."""

    @functools.wraps(vjp)
    def run(args, cotangents, wanted, state, **kwargs):
        named = _named_generator(args, kwargs)
        if named is not None:
            own = torch.Generator(device=named.device)
            own.set_state(state)
            args = tuple(own if a is named else a for a in args)
            kwargs = {k: own if v is named else v for k, v in kwargs.items()}
            return vjp(args, cotangents[:-1], wanted, **kwargs)
        gen = _generator(args, kwargs)
        now = gen.get_state()
        gen.set_state(state)
        try:
            return vjp(args, cotangents[:-1], wanted, **kwargs)
        finally:
            gen.set_state(now)

    return run


#: Ops whose CPU kernel torch chooses by grad mode and by which of its tensors require grad: the
#: RNNs' oneDNN kernel runs its training primitive under grad, and their cells' products fold their
#: operands by whether one requires grad, in float32 and float64 alike (a bidirectional 2-layer
#: LSTM's output is 1e-8 off otherwise). Their fallback runs under the grad mode it was traced in,
#: on tensors requiring grad as the traced ones did, as eager's call does (the compiled forward
#: runs without grad, on tensors most of which require none).
GRAD_MODE_KERNELS = frozenset({torch.lstm, torch.gru, torch.rnn_tanh, torch.rnn_relu})


def _grad_mode(func, arg_leaves) -> tuple | None:
    """For a call of ``GRAD_MODE_KERNELS``, the grad mode and which of its tensor arguments
    require grad (``_under_grad_mode``); None for another."""
    if func not in GRAD_MODE_KERNELS:
        return None
    return torch.is_grad_enabled(), tuple(x.requires_grad for x in arg_leaves if isinstance(x, torch.Tensor))


def _under_grad_mode(func, grad_mode: tuple):
    """``func`` run under grad mode ``grad_mode[0]``, on its tensors detached and requiring grad
    where ``grad_mode[1]`` (one flag per tensor leaf of the arguments) says; its outputs detached
    (torch's autograd differentiates the compiled call, not this run)."""
    enabled, flags = grad_mode

    @functools.wraps(func)
    def run(*args, **kwargs):
        leaves, spec = tree_flatten((args, kwargs))
        wants = iter(flags)
        leaves = [x.detach().requires_grad_(next(wants)) if isinstance(x, torch.Tensor) else x for x in leaves]
        args, kwargs = tree_unflatten(leaves, spec)
        with torch.set_grad_enabled(enabled):
            out = func(*args, **kwargs)
        return tree_map(lambda x: x.detach() if isinstance(x, torch.Tensor) else x, out)

    return run


def _under_autocast(func, recorded: AutocastState):
    """``func`` run under the autocast state it was traced under (the generated code runs with
    autocast off), so that the casts torch's autocast makes inside it happen as in eager."""

    @functools.wraps(func)
    def run(*args, **kwargs):
        with autocast.entered(recorded):
            return func(*args, **kwargs)

    return run


#: Zeros that a backward of an opaque symbol gives an input its op gave no gradient (eager's
#: None: a custom op's backward returning None, a loss of outputs that do not read the input),
#: by id: the trace's values are tensors, so the compiled backward computes with zeros, and
#: ``absent_as_none`` gives None where they, or only values computed from them, reach an input.
_ABSENT: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
#: The names of the backwards ``_vjp_of`` makes, which log which of their gradients are absent.
LOGGED_VJPS: set[str] = set()


class _AbsentLog(threading.local):
    """Per thread: for each call of a ``LOGGED_VJPS`` backward in the compiled backward running
    (``absent_as_none``), which of its gradients are absent; None outside one."""

    calls: list | None = None


_absent_log = _AbsentLog()


def no_gradient(w: torch.Tensor) -> torch.Tensor:
    """Zeros like ``w``, standing for eager's None (``_ABSENT``)."""
    zeros = torch.zeros_like(w)
    _ABSENT[id(zeros)] = zeros
    return zeros


def absent_as_none(backward, trace, num_cotangents: int):
    """``backward`` (a compiled backward, the execution trace ``trace``, whose last
    ``num_cotangents`` inputs are cotangents) giving None, as eager's autograd does, for the inputs
    whose gradient ``no_gradient``'s zeros alone reach (``_core.Trace.absent_outputs``): through a
    view, a product with a saved tensor, another op's backward, as eager's nodes given only
    undefined gradients give undefined ones. ``x.grad`` stays None, ``autograd.grad(...,
    allow_unused=True)`` gives None (and raises eager's error without ``allow_unused``)."""
    calls = trace.call_outputs(LOGGED_VJPS)
    materialized = [v for outs in trace.call_outputs({_MATERIALIZED}) for v in outs]

    @functools.wraps(backward)
    def run(*args):
        outer, _absent_log.calls = _absent_log.calls, []
        deferred = underived_grads.start()
        try:
            grads = backward(*args)
        finally:
            logged, _absent_log.calls = _absent_log.calls, outer
            errors = underived_grads.finish(deferred)
        if errors:
            underived_grads.raise_where_reached(errors, calls, trace)
        if not any(any(m) for m in logged):
            return grads
        if len(logged) != len(calls):  # (backwards the trace does not show: only the zeros themselves)
            return tuple(None if _ABSENT.get(id(g)) is g else g for g in grads)
        absent = [v for outs, mask in zip(calls, logged) for v, a in zip(outs, mask) if a]
        gone = set(trace.absent_outputs(absent, num_cotangents, materialized))
        return tuple(None if i in gone else g for i, g in enumerate(grads))

    return run


def _materialize(g):
    return g


#: The name of ``materialized``'s symbol.
_MATERIALIZED = qualified_name(_materialize)


def materialized(g):
    """``g``, a cotangent a custom autograd.Function's backward reads, through a call at which the
    compiled backward's absent gradients stop (``absent_as_none``): eager gives such a backward
    zeros for an undefined gradient (``ctx.set_materialize_grads``), and its results are defined.
    A backward holding no opaque backward (``LOGGED_VJPS``), where no gradient is absent, drops the
    call (``passes::materialized``, whose ``MARKER`` is ``_MATERIALIZED``): it costs no call there
    and splits no fusion region."""
    return fallback(_materialize, (g,), {})


def _vjp_of(func):
    """The backward of a fallback: runs ``func`` again under torch.autograd on the saved inputs
    and returns the gradients of ``wanted`` (inputs that require grad in the trace)."""

    def vjp(args, cotangents, wanted, **kwargs):
        copies = {id(w): w.detach().requires_grad_(True) for w in wanted}
        swap = lambda x: copies.get(id(x), x) if isinstance(x, torch.Tensor) else x  # noqa: E731
        args, kwargs = tree_map(swap, (args, kwargs))
        with torch.enable_grad():
            outs = _tensor_leaves(func(*args, **kwargs))
        pairs = [(o, c) for o, c in zip(outs, cotangents) if c is not None and o.requires_grad]
        grads = underived_grads.grads(
            pairs, wanted, copies, None if _absent_log.calls is None else len(_absent_log.calls)
        )
        # Values of the trace that are one tensor when it runs (a cast to its own dtype returns its
        # input) are one leaf here: its gradient, the sum of their uses, goes to the first of them
        # (it was given to each, and the program's backward added them up again: twice eager's).
        first = {id(w): i for i, w in reversed(list(enumerate(wanted)))}
        if _absent_log.calls is not None:
            _absent_log.calls.append(tuple(g is None for g in grads))
        grads = tuple(
            no_gradient(w) if g is None else torch.zeros_like(w) if first[id(w)] != i else g
            for i, (w, g) in enumerate(zip(wanted, grads))
        )
        return grads[0] if len(grads) == 1 else grads

    vjp.__name__ = f"{getattr(func, '__name__', 'op')}_vjp"
    return vjp


def _concrete(shape):
    """A proxy's shape in ints: a fallback runs torch itself, so its symbolic sizes are
    specialised (``int()`` records the guard)."""
    return tuple(map(int, shape))


def _differentiable(x) -> bool:
    """Whether the stand-in of the proxy ``x`` requires grad: where it does, the call's outputs
    say which of them eager's autograd differentiates (``native_batch_norm``'s saved mean is none)."""
    return x.requires_grad and (x.dtype.is_floating_point or x.dtype.is_complex)


def _to_meta(x):
    if isinstance(x, TensorProxy):
        shape = _concrete(x.shape) if x._symbolic else x.shape
        return torch.empty(shape, dtype=x.dtype, device="meta", requires_grad=_differentiable(x))
    return int(x) if type(x) is SymInt else x


def _to_fake(x):
    """A fake tensor on the proxy's device (fake CUDA tensors need no GPU), which torch's
    autocast treats as it treats real ones."""
    if isinstance(x, TensorProxy):
        shape = _concrete(x.shape) if x._symbolic else x.shape
        return torch.empty(shape, dtype=x.dtype, device=x.device, requires_grad=_differentiable(x))
    return int(x) if type(x) is SymInt else x


def _device(in_leaves, kwargs) -> str:
    """Where a call puts its outputs: the device it names (``torch.randn_like(x, device="cuda")``,
    ``x.new_tensor(data, device=...)``), else its first tensor's, else the default device."""
    device = kwargs.get("device")
    if device is not None:
        return str(indexed(torch.device(device)))
    return str(in_leaves[0].device if in_leaves else torch.get_default_device())


#: Errors of fake tensors (under autocast) for calls whose output sizes depend on values.
_DATA_DEPENDENT_ERRORS = (DynamicOutputShapeException, DataDependentOutputException)


class _NeedsValues(Exception):
    """A call whose output metadata torch cannot compute without data: its sizes depend on its
    arguments' values (``nonzero``, ``one_hot`` sizing itself), or the op has no meta kernel.
    ``refusal`` is the error to raise where values cannot be read."""

    def __init__(self, refusal: Exception):
        super().__init__(str(refusal))
        self.refusal = refusal


def _data_dependent_error(name: str) -> ThunderRuntimeError:
    return ThunderRuntimeError(
        f"{name}: data-dependent: its result depends on a traced tensor's values (read at "
        f"{user_location()}); only thunder_rs.jit reads them, outside torch.vmap"
    )


#: Output metadata of ops torch has no meta kernel for, whose outputs are sized as an input is:
#: ``torch._dirichlet_grad`` (the backward of ``Beta``'s and ``Dirichlet``'s ``rsample``, elementwise
#: over its first argument).
META_RULES: dict[Callable, Callable] = {torch._dirichlet_grad: lambda x, concentration, total: torch.empty_like(x)}


def _shift_meta(func):
    """A shift's meta kernel given integer operands: eager shifts a bool operand promoted to the
    result's dtype (``bool_tensor << 1`` is int64), where torch's meta kernel refuses bool."""

    def meta(a, b, *args, **kwargs):
        dtype = torch.result_type(a, b)
        if dtype != torch.bool:
            a, b = (x.to(dtype) if isinstance(x, torch.Tensor) and x.dtype == torch.bool else x for x in (a, b))
        return func(a, b, *args, **kwargs)

    return meta


def _no_bool_shift(name: str, args) -> None:
    """Eager's refusal of a shift of two bools (its kernels have no bool one: a NotImplementedError,
    ``"lshift_cpu" not implemented for 'Bool'``), where torch's meta kernel raises a RuntimeError."""
    bools = [type(x) is bool or (isinstance(x, torch.Tensor) and x.dtype == torch.bool) for x in args[:2]]
    if len(bools) == 2 and all(bools):
        a = args[0] if isinstance(args[0], torch.Tensor) else args[1]
        kind = "lshift" if "left" in name or "lshift" in name else "rshift"
        raise ThunderNotImplementedError(
            f"{name}: \"{kind}_{a.device.type}\" not implemented for 'Bool' (at {user_location()})"
        )


#: Eager's checks of arguments that torch's meta kernels make otherwise: ``check(name, args)``.
EAGER_CHECKS: dict[Callable, Callable] = {}

for _shift in (
    torch.bitwise_left_shift,
    torch.bitwise_right_shift,
    torch.Tensor.bitwise_left_shift,
    torch.Tensor.bitwise_right_shift,
    torch.Tensor.__lshift__,
    torch.Tensor.__rshift__,
    torch.Tensor.__rlshift__,
    torch.Tensor.__rrshift__,
):
    META_RULES[_shift] = _shift_meta(_shift)
    EAGER_CHECKS[_shift] = _no_bool_shift


def _output_metadata(func, name: str, args, kwargs, autocast_state, factory: bool):
    """Runs ``func`` on meta tensors, or on fake ones under autocast; a ``factory`` (a call that
    takes no tensor, such as ``torch.randint``) on the meta device, so that nothing is drawn. A
    generator does not change what a call returns, so the call goes without it. Raises
    ``_NeedsValues`` where only the real values tell."""
    kwargs = {k: v for k, v in kwargs.items() if k != "generator"}
    if (eager_check := EAGER_CHECKS.get(func)) is not None:
        eager_check(name, args)
    # (recording paused: a custom op's autograd.Function runs on its stand-ins as eager's does)
    with torch._C.DisableTorchFunctionSubclass(), paused_recording():
        try:
            if autocast_state is not None:
                with FakeTensorMode():
                    fake_args, fake_kwargs = tree_map(_to_fake, (args, kwargs))
                    return META_RULES.get(func, func)(*fake_args, **fake_kwargs)
            meta_args, meta_kwargs = tree_map(_to_meta, (args, kwargs))
            if factory:
                meta_kwargs["device"] = "meta"
            return META_RULES.get(func, func)(*meta_args, **meta_kwargs)
        except _DATA_DEPENDENT_ERRORS as e:
            raise _NeedsValues(_data_dependent_error(name)) from e
        except NotImplementedError as e:
            raise _NeedsValues(
                ThunderNotImplementedError(
                    f"{name}: no thunder_rs decomposition, and torch cannot compute its output metadata on meta "
                    f"tensors ({e})"
                )
            ) from e
        except Exception as e:
            # The op reads values (``one_hot`` sizing itself, ``repeat_interleave``, torchvision's ``nms``;
            # a packed sequence's RNN steps through its ``batch_sizes``, which it wants on the CPU).
            if reads_values(e):
                raise _NeedsValues(_data_dependent_error(name)) from e
            # Invalid arguments: what eager raises for them, with the op's name.
            raise thunder_error_like(e, f"{name}: {e}") from e


#: Where the jit reads values (set by ``thunder_rs.core.lang.values``; each returns None elsewhere):
#: ``sized(impl, args, kwargs)``, for a call whose output metadata only its real values tell, its
#: real outputs and ``checked(outs)``, which records the check of the traced outputs' sizes;
#: ``read(impl, args, kwargs)``, for a call that returns Python values (``torch.equal``), ``(value,)``.
_by_values = None


def set_by_values(hooks) -> None:
    global _by_values
    _by_values = hooks


def _metadata(func, name: str, args, kwargs, autocast_state, factory: bool, symbolic: bool):
    """The outputs ``func`` gives, as tensors of their metadata, ``shape(t)`` of such an output
    (symbolic where the inputs' sizes are, when ``symbolic``: ``fallback_sizes``), and for a call
    sized by values ``checked(outs)`` (else None)."""
    if symbolic:
        kwargs = {k: v for k, v in kwargs.items() if k != "generator"}
        sizes = _SIZES.load()
        found = sizes.symbolic_metadata(func, args, kwargs, factory, requires_grad=_differentiable)
        if found is not None and found is not sizes.FROM_VALUES:
            return found[0], found[1], None
    try:
        if symbolic and found is sizes.FROM_VALUES:  # (a meta run would specialise the inputs' sizes)
            raise _NeedsValues(_data_dependent_error(name))
        return _output_metadata(func, name, args, kwargs, autocast_state, factory), _shape, None
    except _NeedsValues as e:
        impl = func if autocast_state is None else _under_autocast(func, autocast_state)
        sized = _by_values.sized(impl, args, kwargs) if _by_values is not None else None
        if sized is None:
            raise e.refusal from e.__cause__
        return sized[0], getattr(sized[1], "shape", _shape), sized[1]


#: Calls whose outputs are never negative (the indices of ``nonzero``).
_NONNEGATIVE = frozenset({torch.nonzero, torch.Tensor.nonzero, torch.argwhere, torch.Tensor.argwhere})


def _shape(t):
    return t.shape


def _has_symbolic(leaves) -> bool:
    """Whether a call's argument leaves hold a symbolic size (a tensor's or an int's)."""
    return any(type(x) is SymInt or (isinstance(x, TensorProxy) and x._symbolic) for x in leaves)


#: Tensor methods that act on the tensor's autograd node, which a traced tensor does not have.
#: (``register_hook`` is traced: ``core.lang.tensor_hooks``.)
_AUTOGRAD_NODE_METHODS = frozenset({"register_post_accumulate_grad_hook", "retain_grad"})


def _refuse_autograd_node_methods(func, name: str) -> None:
    if getattr(func, "__name__", None) in _AUTOGRAD_NODE_METHODS and name.startswith("torch."):
        raise ThunderNotImplementedError(
            f"{name} at {user_location()}: hooks and retained gradients on tensors inside the jitted program are not "
            "supported (their gradients are computed inside the compiled backward); register them on the jitted "
            "call's inputs or outputs outside it"
        )


def schema_writes(schema) -> dict[str, int]:
    """The tensor arguments an aten schema writes in place other than ``out=`` (``Tensor(a!)
    running_min``): ``{name: position}``."""
    return {
        a.name: i
        for i, a in enumerate(schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write and not a.kwarg_only and str(a.type) == "Tensor"
    }


@functools.cache
def _written_arguments(func) -> tuple[str, ...]:
    """The tensor arguments ``func``'s aten op writes in place other than ``out=``, by the schemas
    of its overloads that are not ``out`` forms."""
    packet = getattr(torch.ops.aten, getattr(func, "__name__", ""), None)
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return ()
    written = (
        schema_writes(getattr(packet, overload)._schema) for overload in packet.overloads() if "out" not in overload
    )
    return tuple(dict.fromkeys(name for names in written for name in names))


class _DrawsAgain(threading.local):
    """Per thread: how many activation-checkpointed functions the traced program is inside
    (``regions``), and how many of them run with ``preserve_rng_state=False`` (``depth``)
    (``torch_overrides.checkpointed``)."""

    depth = 0
    regions = 0
    #: Random draws traced inside them with grad.
    draws = 0
    #: Draws and generator settings traced (``replayed_draws``' chains hold while none is made).
    uses = 0
    #: Kernels chosen inside them with grad that eager's forward, without grad, chooses otherwise
    #: (``torch_overrides._differentiated_checkpoint``).
    grad_kernels = 0


#: Eager runs such a function again in the backward with new random numbers.
draws_again = _DrawsAgain()


def refuse_draw_made_again(name: str, generator: torch.Generator | None = None) -> None:
    """Raises for a random draw (from ``generator``, None for a default one) that eager's backward
    makes again with other numbers: inside an activation-checkpointed function, which eager runs
    again in the backward, restoring only the default generators' states (and only with
    ``preserve_rng_state``)."""
    draws_again.uses += 1
    if not (draws_again.regions and torch.is_grad_enabled()):
        return
    draws_again.draws += 1
    if draws_again.depth:
        raise ThunderNotImplementedError(
            f"{name} at {user_location()}: a random draw inside torch.utils.checkpoint with preserve_rng_state=False; "
            "eager's backward runs the function again with new random numbers (a dropout mask other than the "
            "forward's), which a compiled call does not reproduce. Pass preserve_rng_state=True"
        )
    if generator is not None and not _is_default_generator(generator):
        raise ThunderNotImplementedError(
            f"{name} at {user_location()}: a random draw from a torch.Generator of the program's own (generator=) "
            "inside torch.utils.checkpoint; eager's backward runs the function again and draws other numbers from "
            "that generator (preserve_rng_state restores only the default generators), so its gradients use other "
            "draws than its forward, which a compiled call does not reproduce. Draw outside the checkpointed "
            "function, or from the default generator"
        )


def _is_default_generator(generator: torch.Generator) -> bool:
    if generator is torch.default_generator:
        return True
    return generator.device.type == "cuda" and any(generator is g for g in torch.cuda.default_generators)


def _refuse_unrepresentable(func, name: str, args, kwargs, effect: bool) -> None:
    """Raises for a call the fallback cannot record faithfully: an autograd node's method, a draw
    made again, an in-place call with no functional form, a call writing an argument, or one
    pinning memory."""
    _refuse_autograd_node_methods(func, name)
    if func is torch.Tensor.pin_memory or kwargs.get("pin_memory"):
        refuse_pinned(name)
    if effect:
        refuse_draw_made_again(name, _named_generator(args, kwargs))
    if (name.endswith("_") and not name.endswith("__")) or kwargs.get("inplace"):
        # thunder_rs.torch.inplace functionalises in-place calls first: the executor runs only
        # functions that write nothing.
        raise ThunderNotImplementedError(
            f"{name} at {user_location()}: an in-place call thunder_rs has no functional form for (a module built "
            "while the program is traced initialises its parameters so: build it outside the jitted call)"
            if name.startswith("torch.nn.init.")
            else f"{name} at {user_location()}: an in-place call thunder_rs has no functional form for"
        )
    written = _written_arguments(func) if name.startswith("torch.") else ()
    if written:
        # Run eagerly on the trace's tensors, the call would write them outside the trace, and
        # again in its backward (which runs it again).
        raise ThunderNotImplementedError(
            f"{name} at {user_location()}: writes its argument {' and '.join(written)} in place, which thunder_rs "
            "has no functional form for"
        )


def fallback(func, args, kwargs, effect: bool = False, requires_grad=None):
    """Records ``func(*args, **kwargs)`` as an eager fallback; an effect (a random draw) when
    ``effect``. ``requires_grad`` (a flag, or one per output) marks which floating outputs
    require grad when a caller's grad rule differentiates the call; the fallback then gets no
    backward of its own (no generator state is returned for one)."""
    name = qualified_name(func)
    _refuse_unrepresentable(func, name, args, kwargs, effect)
    if effect and recording_backward() and (named := _named_generator(args, kwargs)) is not None:
        backward_draws().add(id(named))
    arg_leaves = tree_leaves((args, kwargs))
    if any(type(x) is SymbolicSize for x in arg_leaves):  # (a shape of symbolic sizes: a tuple to C code)
        args, kwargs = tree_map(lambda x: tuple(x) if type(x) is SymbolicSize else x, (args, kwargs))
        arg_leaves = tree_leaves((args, kwargs))
    in_leaves = [x for x in arg_leaves if isinstance(x, TensorProxy)]
    autocast_state = autocast.state() if _is_any_autocast_enabled() and in_leaves else None
    symbolic = _has_symbolic(arg_leaves)
    described_args, described_kwargs = _float_hints(args, kwargs) if effect else (args, kwargs)
    out, shape, checked = _metadata(
        func, name, described_args, described_kwargs, autocast_state, not in_leaves, symbolic
    )
    structure, spec = tree_flatten(out)
    leaves = _tensor_leaves(out)
    if not leaves or not all(isinstance(t, torch.Tensor) for t in leaves):
        # A call returning Python values (``torch.equal``) computes them from the tensors' values.
        read = _by_values.read(func, args, kwargs) if _by_values is not None and in_leaves else None
        if read is not None:
            return read[0]
        raise ThunderNotImplementedError(f"{name}: fallback calls must return tensors, got {type(out).__name__}")
    for t in leaves:
        if t.dtype not in CODES:  # complex32 (``half_tensor * 1j``)
            raise ThunderNotImplementedError(f"{name}: its result's dtype {t.dtype} is one thunder_rs cannot represent")
    device = _device(in_leaves, kwargs)
    if requires_grad is None:
        flags = [torch.is_grad_enabled() and any(x.requires_grad for x in in_leaves)] * len(leaves)
        if checked is None and func not in META_RULES:  # (stand-ins requiring grad: eager's autograd tells)
            flags = [flag and t.requires_grad for flag, t in zip(flags, leaves)]
    else:
        flags = list(requires_grad) if isinstance(requires_grad, (tuple, list)) else [requires_grad] * len(leaves)
    if any(flags) and torch.is_inference_mode_enabled():
        refuse_gradient_in_inference_mode()
    # Complex results carry gradients as eager's do: the backward is torch's (``complex_calls``).
    metas = [
        output_meta(
            shape(t),
            t.dtype,
            t.device if autocast_state is not None else device,
            flag and (t.dtype.is_floating_point or t.dtype.is_complex),
        )
        for t, flag in zip(leaves, flags)
    ]
    sized = getattr(checked, "dims", ())
    replay = effect and requires_grad is None and any(m.requires_grad for m in metas)
    if sized and replay:  # (its backward draws again from the state it returns last, where its sizes go)
        raise ThunderNotImplementedError(f"{name}: symbolic sizes computed by a random call whose outputs require grad")
    if replay:
        state = _generator(args, kwargs).get_state()
        metas.append(output_meta(state.shape, state.dtype, state.device, False))
    sid = symbol_id(func, effect, autocast_state, replay, sized, _grad_mode(func, arg_leaves))
    if torch.is_grad_enabled():  # (a view input a gradient flows into: ``TensorProxy._view_grad``)
        note_gradient_through(metas, (*args, *(kwargs or {}).values()))
    if sized:
        recorded = current().call_sized(sid, tuple(args), kwargs or None, metas, checked.ids)
    else:
        recorded = current().call(sid, tuple(args), kwargs or None, metas)
    outs = proxies(recorded)[: len(leaves)]
    if func in _NONNEGATIVE:  # indices: indexing takes them without wrapping negative ones
        for t in outs:
            t._nonnegative = True
    if checked is not None:
        checked(outs)
    if isinstance(out, torch.Tensor):
        return outs[0]
    bound = iter(outs)
    return tree_unflatten([None if x is None else next(bound) for x in structure], spec)


def _float_hints(args, kwargs):
    """A draw's arguments for its output metadata: a float of sizes (``bernoulli_(1 - 1 / T)``'s
    probability, a mean) as its value when traced, which torch's meta kernels take where a
    ``SymFloat`` is none of theirs. A sampler's output sizes come from its tensor and size
    arguments, never from such a float, so they hold for every value; the recorded call takes
    the float itself, computed on each call."""
    return tree_map(lambda x: x.hint if type(x) is SymFloat else x, (args, kwargs))


def user_fallback(func, args, kwargs, effect: bool = False):
    """``fallback`` for a torch call of the user's program that thunder_rs has no symbol for (not
    one a decomposition makes): logged on ``thunder_rs.fallbacks`` and noted for ``examine``."""
    out = fallback(func, args, kwargs, effect)
    name = qualified_name(func)
    log_fallback(name, user_location)
    problems.note(problems.FALLBACK, name)
    return out


def record_effect(func, args: tuple, kwargs: dict, outputs: list):
    """Records ``func(*args, **kwargs)`` as an effect symbol (it acts on state outside the trace,
    such as the random number generator) whose outputs are tensors like ``outputs``."""
    metas = [output_meta(t.shape, t.dtype, t.device, False) for t in outputs]
    return proxies(current().call(symbol_id(func, effect=True), tuple(args), kwargs or None, metas))
