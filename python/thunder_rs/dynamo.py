"""thunder_rs as a ``torch.compile`` backend: ``torch.compile(model, backend="thunder_rs")``.

Dynamo captures the program as FX graphs of torch-level calls, handles Python semantics (side
effects, guards, data-dependent control flow) and splits the program at graph breaks; the backend
compiles each GraphModule it is handed with ``thunder_rs.jit``, which traces the graph's torch calls
through ltorch as it traces any Python function. This is the design of Thunder's ThunderFX.

Backward: the GraphModule is jitted as a whole, so its backward is thunder_rs's own VJP, split from
the forward by the Rust pipeline, exactly as for ``thunder_rs.jit(model)``. AOTAutograd is not used:
it would trace the graph once more into aten ops and hand thunder_rs two aten graphs, so thunder_rs
would compile an aten dialect it does not otherwise see, with torch's decompositions and
functionalisation in between; jitting the torch-level graph is one compiler for both directions,
the same traces, executors and gradients as ``thunder_rs.jit``, and fewer layers that could differ.

What Dynamo hands a backend:

- Parameters and buffers are graph inputs (``inline_inbuilt_nn_modules``, the default since torch
  2.5); constants the graph reads by ``get_attr`` are attributes of the GraphModule, which
  ``jit(gm)`` reads as module state.
- Dynamic shapes: once Dynamo sees a size change it marks the dim dynamic and the graph takes the
  size as an ``int`` input (a ``SymInt`` placeholder). The backend compiles nothing at that point:
  the graph is compiled at its first call, on real tensors and Python ints, with the sizes that
  Dynamo's example inputs hold as symbols (and the ``SymInt`` inputs) traced as symbolic from that
  first compile (``ThunderFunction.mark_dynamic``): one compile serves every size where the guards
  of thunder_rs's trace hold, as for ``thunder_rs.jit``'s own automatic dynamic shapes.
- Floats: once Dynamo sees a float argument change it passes it as a 0-d float64 tensor that the
  graph reads with ``.item()`` (``specialize_float=False``). The backend takes the float itself
  there (``_float_arguments``: the ``.item()`` calls dropped, the tensor's float passed), and the
  jitted graph takes it as a float input from its first compile (``core.acquisition.float_args``):
  one compile for every value, the float passed to torch as eager passes it.
- Outputs: Dynamo's graphs return a tuple (or list), which the jitted graph returns as it is.
- A graph with no calls (it returns its inputs, or constants) runs as the GraphModule itself.
- ``torch.vmap`` (Mamba's selective scan through torch's ``associative_scan``) arrives as
  functorch's level calls, which thunder_rs traces as its own vmap; a graph that drives another
  torch.func transform (``grad``, ``jvp``) runs eagerly, since tracing would change functorch's state.
- ``torch.utils.checkpoint`` and custom ``torch.autograd.Function``s arrive as higher-order ops of
  their regions' graphs, which are made the user's checkpoint and a Function again
  (``_user_checkpoints``, ``_user_functions``), traced as under ``jit``.
- A graph thunder_rs cannot trace (an op it refuses, a construct it cannot represent) runs eagerly
  as the GraphModule, with a warning that names the graph and the reason; torch calls thunder_rs
  has no decomposition for are eager fallbacks inside the compiled graph, as under ``jit``. Where
  eager raises too (the trace met the program's own error first), eager's error is raised alone
  and the graph stays compiled.

The backend is registered under ``"thunder_rs"`` through torch's ``torch_dynamo_backends`` entry
point (``pyproject.toml``), so the string works without importing thunder_rs; where the package is
not installed with its metadata (a source tree on ``sys.path``), importing thunder_rs registers it.
"""

import importlib.metadata
import threading
import warnings
import weakref

import torch
import torch._refs
from torch._functorch import predispatch
from torch._functorch.autograd_function import autograd_function_apply

from thunder_rs.core.run.autograd import unseen_by_dynamo
from thunder_rs.core.run.jit import ThunderModule
from thunder_rs.core.lang.vmap import PREDISPATCH
from thunder_rs.errors import ThunderError

NAME = "thunder_rs"
_ENTRY_POINT_GROUP = "torch_dynamo_backends"
#: The distribution (``pyproject.toml``'s ``name``) that declares the entry point.
_DISTRIBUTION = "thunder_rs"
#: Every graph the backend was handed and that is still alive (for ``compiled_graphs`` and ``reset``).
_graphs: "weakref.WeakSet[CompiledGraph]" = weakref.WeakSet()


class CompiledGraph:
    """One Dynamo graph: its ``thunder_rs.jit`` module, or the GraphModule itself once thunder_rs
    could not trace it."""

    def __init__(self, gm: torch.fx.GraphModule, jit_options: dict, example_inputs: list | tuple = ()):
        self.gm = gm
        _trace_constructors(gm)
        _data_reads(gm)
        _data_writes(gm)
        _numpy_operators(gm)
        _requires_grad_flags(gm)
        #: whether the graph enters inference mode (then a trace given up part way leaves it)
        self.enters_inference = _inference_modes(gm)
        _user_checkpoints(gm, example_inputs)
        _user_functions(gm)
        transform = _transform_call(gm)
        #: the positions of the float arguments Dynamo passes as tensors, which the graph takes as floats
        self.floats = _float_arguments(gm)
        self.jitted: ThunderModule | None = (
            ThunderModule(gm, **jit_options) if _has_calls(gm) and transform is None else None
        )
        if self.jitted is not None:
            self.jitted._jfn.mark_dynamic(_symbolic_places(gm, example_inputs))
            self.jitted._jfn.mark_floats(self.floats)
        self.eager_because: str | None = None
        if transform is not None:
            # Tracing would run the transform's state changes for real and leave them half done.
            self.eager_because = f"it calls {transform}, a torch.func transform's state change"
            warnings.warn(
                f"thunder_rs backend: graph {gm._get_name()} runs eagerly: {self.eager_because}", stacklevel=2
            )
        elif self.jitted is None:
            self.eager_because = "the graph makes no calls"
        _graphs.add(self)

    def __call__(self, *args):
        if self.floats:
            args = _floats_of(args, self.floats)
        jitted = self.jitted
        if jitted is None:
            return self.gm(*args)
        stats = jitted._jfn._stats
        hits, misses = stats.cache_hits, stats.cache_misses
        entered = len(_inference_contexts()) if self.enters_inference else 0
        try:
            return jitted(*args)
        except BaseException as e:
            if self.enters_inference:
                _leave_inference_modes(entered)
            if not isinstance(e, ThunderError):
                raise
            if (stats.cache_hits, stats.cache_misses) != (hits, misses):
                raise  # compiled (or found) and failed while running: eager would have run it
            failure = e
        # Tracing runs on proxies, so nothing has run yet: the graph runs eagerly, and from now on
        # unless eager raises too (the program's own error, which the trace met first: an inference
        # tensor saved for backward): then that is eager's error, raised as eager raises it, and the
        # graph stays thunder_rs's for the next call.
        out = self.gm(*args)
        self.jitted, self.eager_because = None, f"{type(failure).__name__}: {failure}"
        warnings.warn(
            f"thunder_rs backend: graph {self.gm._get_name()} runs eagerly: {self.eager_because}", stacklevel=2
        )
        return out


#: Modules of the calls Dynamo puts in a graph for torch.func transforms (``grad``, ``vjp``,
#: ``jvp``, ``jacrev``): they change functorch's interpreter stack as they run.
_TRANSFORM_MODULES = ("torch._C._functorch", "torch._functorch")
#: ``torch.vmap``'s calls, which thunder_rs traces as its own vmap levels (``core/lang/vmap.py``);
#: loading functorch's batching decompositions changes nothing a trace sees.
_TRACED_TRANSFORM_CALLS = frozenset(
    (*PREDISPATCH.values(), *(getattr(predispatch, name) for name in PREDISPATCH), predispatch.lazy_load_decompositions)
)


def _symbolic_places(gm: torch.fx.GraphModule, example_inputs) -> list:
    """Where the graph's inputs are symbolic: ``(position, dim)`` of a tensor's symbolic size,
    ``(position, None)`` of a ``SymInt`` input, as the placeholders' fake values (Dynamo's
    ``example_value``; the example inputs are real tensors) hold them."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    places: list = []
    for i, x in enumerate(example_inputs):
        if i < len(placeholders):
            x = placeholders[i].meta.get("example_value", x)
        if isinstance(x, torch.SymInt):
            places.append((i, None))
        elif isinstance(x, torch.Tensor):
            places.extend((i, d) for d, s in enumerate(x.shape) if isinstance(s, torch.SymInt))
    return places


def _float_arguments(gm: torch.fx.GraphModule) -> tuple:
    """The positions of the graph's inputs that are float arguments Dynamo passes as 0-d float64
    tensors (``GraphArg.pass_arg_as_tensor``) and reads only with ``.item()``: the graph is made to
    take the float itself there (each ``.item()`` replaced by the input), and ``_floats_of`` passes it."""
    positions = []
    for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        example = node.meta.get("example_value")
        wrapped = getattr(node.meta.get("grapharg"), "pass_arg_as_tensor", False)
        if (
            not wrapped
            or not isinstance(example, torch.Tensor)
            or example.dim() != 0
            or not example.is_floating_point()
        ):
            continue
        users = list(node.users)
        if not users or any(u.op != "call_method" or u.target != "item" or len(u.args) != 1 for u in users):
            continue
        for user in users:
            user.replace_all_uses_with(node)
            gm.graph.erase_node(user)
        positions.append(i)
    if positions:
        gm.recompile()
    return tuple(positions)


def _floats_of(args: tuple, positions: tuple) -> tuple:
    """The call's arguments with the floats at ``positions`` (``_float_arguments``) as Python floats:
    the float64 tensor Dynamo made of each holds it exactly."""
    passed = list(args)
    for i in positions:
        passed[i] = passed[i].item()
    return tuple(passed)


def _trace_constructors(gm: torch.fx.GraphModule) -> None:
    """Dynamo writes ``torch.tensor`` of a ``SymInt`` (``torch.tensor(x.shape[0])``) as
    ``torch._refs.tensor``, whose code detaches the new tensor in place, which a traced tensor
    cannot; ``torch.tensor`` is the same call in eager and traces with the size symbolic."""
    refs = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch._refs.tensor]
    for node in refs:
        node.target = torch.tensor
    if refs:
        gm.recompile()


def _data_of(t: torch.Tensor) -> torch.Tensor:
    """``t.data``, the call ``_data_reads`` puts where Dynamo wrote ``_get_data_attr(t)``."""
    return t.data


def _data_reads(gm: torch.fx.GraphModule) -> None:
    """Dynamo writes ``t.data`` as ``torch._C._autograd._get_data_attr(t)``, a C function that no
    ``__torch_function__`` sees: traced, it reached torch dispatch and the whole graph ran eagerly
    (an EMA codebook or a momentum encoder written through ``.data``). It is made ``t.data``
    again, which thunder_rs traces as under ``jit``."""
    get_data = torch._C._autograd._get_data_attr  # type: ignore[attr-defined]
    reads = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is get_data]
    for node in reads:
        node.target = _data_of
    if reads:
        gm.recompile()


class _NumpyOperator:
    """Dynamo's ``numpy_operator_wrapper`` (``-x`` of a NumPy value Dynamo holds as a tensor:
    ``-np.log(r)``), which applies the operator with ``torch._C.DisableTorchFunction``: traced, its
    ``torch.neg`` bypassed thunder_rs and the whole graph ran eagerly. The same operator on the same
    ``torch._numpy`` arrays, with torch functions seen."""

    def __init__(self, op):
        self.op, self.__name__ = op, f"wrapped_{op.__name__}"

    def __call__(self, *args):
        from torch._dynamo.utils import numpy_to_tensor
        from torch._numpy import ndarray

        return numpy_to_tensor(self.op(*(ndarray(a) if isinstance(a, torch.Tensor) else a for a in args)))


def _numpy_operators(gm: torch.fx.GraphModule) -> None:
    from torch._dynamo.utils import numpy_operator_wrapper

    calls = [n for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.target, numpy_operator_wrapper)]
    for node in calls:
        node.target = _NumpyOperator(node.target.op)
    if calls:
        gm.recompile()


def _requires_grad_flags(gm: torch.fx.GraphModule) -> None:
    """Dynamo writes ``t.requires_grad_()`` between ``set_inplace_requires_grad_allowed(True)`` and
    ``(False)``, functorch's flag that lets a transform's tensors be made to require grad: outside a
    transform it changes nothing, yet its calls made the whole graph run eagerly (MRA's
    ``torch.zeros_like(q).requires_grad_()`` in evaluation). Where the graph calls no transform, the
    flag's calls go; thunder_rs traces ``requires_grad_`` as under ``jit``."""
    setter = torch._C._functorch.set_inplace_requires_grad_allowed
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is setter]
    if not calls or _transform_call(gm, ignoring=setter) is not None or any(n.users for n in calls):
        return
    for node in calls:
        gm.graph.erase_node(node)
    gm.recompile()


def _set_data_of(t: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``t.data = value``, the call ``_data_writes`` puts where Dynamo wrote ``shallow_copy_data_``."""
    t.data = value
    return t


def _data_writes(gm: torch.fx.GraphModule) -> None:
    """Dynamo writes ``t.data = value`` as ``torch.ops.aten.shallow_copy_data_(t, value)``, which
    thunder_rs has no functional form for: the whole graph ran eagerly (a momentum encoder's
    ``param_k.data = param_k * m + param_q * (1 - m)``). It is made ``t.data = value`` again,
    traced (or refused naming the line) as under ``jit``."""
    copy_data = torch.ops.aten.shallow_copy_data_.default
    writes = [
        n
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target in (copy_data, torch.ops.aten.shallow_copy_data_)
    ]
    for node in writes:
        node.target = _set_data_of
    if writes:
        gm.recompile()


#: The inference-mode contexts the graphs' calls entered and have not left, on this thread.
_ENTERED = threading.local()


def _inference_contexts() -> list:
    if not hasattr(_ENTERED, "contexts"):
        _ENTERED.contexts = []
    return _ENTERED.contexts


def _enter_inference_mode(mode: bool):
    """``torch.autograd.grad_mode._enter_inference_mode``, the context kept until its exit."""
    context = torch.autograd.grad_mode._enter_inference_mode(mode)
    _inference_contexts().append(context)
    return context


def _exit_inference_mode(context) -> None:
    contexts = _inference_contexts()
    if contexts and contexts[-1] is context:
        contexts.pop()
    torch.autograd.grad_mode._exit_inference_mode(context)


def _leave_inference_modes(depth: int) -> None:
    """Leaves the inference-mode contexts entered above ``depth``: those of a trace given up
    between the graph's entry and exit calls."""
    contexts = _inference_contexts()
    while len(contexts) > depth:
        torch.autograd.grad_mode._exit_inference_mode(contexts.pop())


def _inference_modes(gm: torch.fx.GraphModule) -> bool:
    """Dynamo writes ``with torch.inference_mode():`` as the calls ``_enter_inference_mode(True)``
    ... ``_exit_inference_mode(context)``; a trace refused between them left inference mode on,
    for the graph's eager run and everything after it (no output required grad). They are made
    calls that keep the context entered (``_ENTERED``), left where a trace stops part way. Returns
    whether the graph makes such calls (only then does a call count the contexts entered)."""
    targets = {
        torch.autograd.grad_mode._enter_inference_mode: _enter_inference_mode,
        torch.autograd.grad_mode._exit_inference_mode: _exit_inference_mode,
    }
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in targets]
    for node in calls:
        node.target = targets[node.target]
    if calls:
        gm.recompile()
    return bool(calls)


def _user_checkpoints(gm: torch.fx.GraphModule, example_inputs=()) -> None:
    """Dynamo writes ``torch.utils.checkpoint.checkpoint(fn, ...)`` as the higher-order op
    ``tag_activation_checkpoint`` of ``fn``'s graph, whose implementation runs it with
    ``preserve_rng_state=False`` (Inductor replays random draws itself; run as it is, the backward
    recomputes with other draws than the forward's: other gradients than eager's) through an FX
    Interpreter (whose progress bar writes ``tqdm``'s class state, which a trace refuses). The call is
    made the user's checkpoint of that graph again, traced (or run eagerly) as eager runs it.

    Dynamo passes the region every tensor it reads, the parameters it captures too (graph inputs).
    A reentrant checkpoint's backward adds a captured parameter's gradient to its ``.grad`` by a
    backward of its own, one passed it returns to the outer backward, which sums it with the
    parameter's others: the parameters among the graph's inputs (``example_inputs``) are captured
    by the region again (``_CAPTURED``), as the user's function captured them (their gradients
    were an ulp off eager's where a ``.grad`` accumulates over micro-batches or a parameter is read
    outside the region too)."""
    hop = torch.ops.higher_order.tag_activation_checkpoint
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is hop]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    params = {n for n, x in zip(placeholders, example_inputs) if isinstance(x, torch.nn.Parameter)}
    for node in calls:
        node.target = _checkpoint
        captured = tuple(i for i, a in enumerate(node.args[1:]) if a in params)
        if node.kwargs.get("use_reentrant") and captured:
            node.kwargs = {**node.kwargs, _CAPTURED: captured}
    if calls:
        gm.recompile()


#: The keyword of ``_checkpoint`` naming the positions of the arguments its region captures.
_CAPTURED = "thunder_rs_captured"


def _checkpoint(body: torch.fx.GraphModule, *args, **kwargs):
    """``torch.utils.checkpoint.checkpoint`` of a checkpointed region's graph with the user's
    arguments (a selective checkpoint's ``context_fn`` is in the graph's ``meta``), the arguments
    at the positions ``kwargs[_CAPTURED]`` captured by the region instead of passed to it."""
    from torch.utils.checkpoint import checkpoint

    context_fn = body.meta.get("_checkpoint_context_fn")
    if context_fn is not None:
        kwargs["context_fn"] = context_fn
    held = dict.fromkeys(kwargs.pop(_CAPTURED, ()))
    if not held:
        return checkpoint(body, *args, **kwargs)
    held = {i: args[i] for i in held}

    def region(*passed):
        given = iter(passed)
        return body(*[held[i] if i in held else next(given) for i in range(len(args))])

    return checkpoint(region, *[a for i, a in enumerate(args) if i not in held], **kwargs)


def _user_functions(gm: torch.fx.GraphModule) -> None:
    """Dynamo writes a custom ``torch.autograd.Function``'s ``apply`` as the higher-order op
    ``autograd_function_apply`` of its forward's and backward's graphs, whose implementation keeps the
    saved tensors in a closure (which a trace refuses, so the whole graph ran eagerly). The call is
    made a Function of those graphs again (``_function_of``), which thunder_rs traces as it traces
    the user's Function under ``jit``: its forward, and its backward as the grad rule."""
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is autograd_function_apply]
    for node in calls:
        fwd, bwd = (getattr(gm, n.target) for n in node.args[:2])
        fwd._thunder_rs_function = _function_of(fwd, bwd, **node.kwargs)
        node.target = _apply_function
    if calls:
        gm.recompile()


def _apply_function(fwd: torch.fx.GraphModule, bwd: torch.fx.GraphModule, *args, **kwargs):
    """The Function ``_user_functions`` made of ``fwd`` and ``bwd``, applied to the call's inputs."""
    function: type[torch.autograd.Function] = getattr(fwd, "_thunder_rs_function")
    return function.apply(*args)


def _function_of(fwd, bwd, *, non_differentiable_idx, saved_for_backward_idx, dirty_idx=(), **unused):
    """The Function Dynamo's graphs of a custom Function compute: ``fwd`` returns the outputs and the
    values its backward reads (saved with ``save_for_backward`` where the user's forward saved them
    so, kept on ``ctx`` otherwise), ``bwd`` takes the cotangents and those values."""
    by_save = set(saved_for_backward_idx)

    def picked(output, idx) -> list:
        outs = output if isinstance(output, (tuple, list)) else (output,)
        return [outs[i] for i in sorted(set(idx))]

    class DynamoFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            output, saved = fwd(*args)
            ctx.save_for_backward(*(v for i, v in enumerate(saved) if i in by_save))
            ctx.kept = [(i, v) for i, v in enumerate(saved) if i not in by_save]
            if dirty_idx:
                ctx.mark_dirty(*picked(output, dirty_idx))
            if non_differentiable_idx:
                ctx.mark_non_differentiable(*picked(output, non_differentiable_idx))
            return output

        @unseen_by_dynamo
        def backward(ctx, *grads):
            saved = list(ctx.saved_tensors)
            for i, v in ctx.kept:
                saved.insert(i, v)
            return bwd(*grads, *saved)

    return DynamoFunction


def _transform_call(gm: torch.fx.GraphModule, ignoring=None) -> str | None:
    """The name of the first call in ``gm`` (but of ``ignoring``) that drives a torch.func
    transform thunder_rs does not trace, or None."""
    for node in gm.graph.nodes:
        module = getattr(node.target, "__module__", None) or ""
        if (
            node.op == "call_function"
            and module.startswith(_TRANSFORM_MODULES)
            and node.target not in _TRACED_TRANSFORM_CALLS
            and node.target is not ignoring
        ):
            return f"{module}.{getattr(node.target, '__name__', node.target)}"
    return None


def _has_calls(gm: torch.fx.GraphModule) -> bool:
    return any(node.op in ("call_function", "call_method", "call_module") for node in gm.graph.nodes)


def compiled_graphs() -> list[CompiledGraph]:
    """The graphs the backend was handed that are still alive (in no particular order)."""
    return list(_graphs)


def make_backend(**jit_options):
    """A Dynamo backend that jits each graph with ``jit_options`` (``executors=``, ``cache=``,
    ``passes=``): ``torch.compile(model, backend=thunder_rs.dynamo.make_backend(executors=[...]))``."""

    def thunder_rs_backend(gm: torch.fx.GraphModule, example_inputs: list):
        return CompiledGraph(gm, jit_options, example_inputs)

    return thunder_rs_backend


#: The backend ``torch.compile(..., backend="thunder_rs")`` runs: default jit options.
backend = make_backend()


def _installed_as_entry_point() -> bool:
    """Whether the installed thunder_rs distribution declares the backend's entry point. Only its
    own metadata is read: ``entry_points()`` would parse every installed distribution's, about
    5 ms of each ``import thunder_rs`` (issue 25)."""
    try:
        declared = importlib.metadata.distribution(_DISTRIBUTION).entry_points
    except importlib.metadata.PackageNotFoundError:
        return False
    return NAME in declared.select(group=_ENTRY_POINT_GROUP).names


def register() -> None:
    """Makes ``backend="thunder_rs"`` name this backend. An installed package needs nothing: torch
    loads the entry point by name (registering here as well would make torch's own registration of
    the entry point fail as a duplicate). Otherwise it is registered with Dynamo, which is imported
    for it only then, as importing it costs seconds."""
    if _installed_as_entry_point():
        return
    import torch._dynamo  # deferred: it takes seconds to import and is needed only here

    if NAME not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(backend, name=NAME)
