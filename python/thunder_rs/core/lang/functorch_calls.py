"""torch.func's differentiating transforms (``grad``, ``grad_and_value``, ``jacrev``, ``jacfwd``,
``hessian``, ``jvp``) of traced values, and ``torch.vmap`` of one of them.

``grad`` and ``grad_and_value`` are traced where their function traces (``traced_grads``: its ops
and their backward become ops of the program, under ``torch.vmap`` too: the per-sample gradients
of torch.func's tutorial, ``vmap(grad(loss), in_dims=(None, None, 0, 0))``), as are ``vjp`` and
``jvp`` (reverse mode twice: ``traced_grads.jvp``) and ``linearize``'s jvp function
(``Linearized``); ``jacrev``, ``jacfwd`` and ``hessian`` run torch's
own function, whose ``vmap`` over ``vjp``/``jvp`` is traced (``_traced_jacobian``). What cannot be
traced (a backward that runs an eager fallback) runs as one eager fallback: torch.func's own
transform on the call's tensors. functorch's transforms wrap tensors below
``__torch_function__``, where a proxy cannot go; running the transformed call eagerly on every
call gives eager's values exactly (the same kernels, in the same order), and what the function
reads (a module's structure, captured values) is read on each call, as in eager. The call's
outputs are differentiable as any fallback's: its backward runs the call again under torch's
autograd (``fallback._vjp_of``), differentiating the transform as eager does. The traced values
the function closes over (``lambda x: f(x, w)``) are inputs of the call (``closures``); tensors
requiring grad that it reads itself (a module's parameters) are refused, since eager's result
would carry gradients to them.

While tracing, ``torch.func.<transform>`` is ``transform(name)`` (``torch_overrides``): it returns a
``Transformed`` that calls torch.func's own transform on values not traced, and traces or records
an eager call on traced ones. An eager transform of values an enclosing ``torch.vmap`` batched
(``vmap(lambda x: jacrev(f)(x))``, or a ``jacrev`` made before tracing) raises ``MapsATransform`` to
that vmap, which then runs whole as one eager call.
"""

import functools

import torch
import torch.func
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.base.userframe import user_location
from thunder_rs.core.lang import closures, python_effects, traced_grads, vmap_state
from thunder_rs.core.lang.fallback import META_RULES, user_fallback
from thunder_rs.core.lang.symfloat import SymFloat
from thunder_rs.core.lang.recorder import active_recorder, lift_captured, paused_recording
from thunder_rs.core.state.hook import thread_state
from thunder_rs.errors import ThunderError, ThunderNotImplementedError, ThunderRuntimeError

#: torch.func's transforms, as torch defines them (read once: while tracing the names are ours).
TRANSFORMS = {name: getattr(torch.func, name) for name in ("grad", "grad_and_value", "jacrev", "jacfwd", "hessian")}
#: The transforms traced as ops of the program where their function traces (``traced_grads``).
TRACED = frozenset({"grad", "grad_and_value"})
#: The transforms that run torch's own function while tracing, whose ``vmap`` over ``vjp``/``jvp``
#: is traced where it can be (``_traced_jacobian``), else one eager call.
JACOBIANS = frozenset({"jacrev", "jacfwd", "hessian"})
#: The transforms a ``torch.vmap`` of them traces (where they cannot be, the vmap runs eagerly).
TRACED_IN_VMAP = TRACED | JACOBIANS


def _grad_options(func, argnums=0, has_aux=False):
    return argnums, has_aux


def _traced(tree) -> bool:
    return any(isinstance(x, TensorProxy) for x in tree_flatten(tree)[0])


def _eager(func, *trees) -> bool:
    """Whether a transform of ``func`` on ``trees`` runs as torch's own: outside tracing, or on
    values none of which is traced, in its arguments or in ``func``'s closure."""
    return active_recorder() is None or not (any(map(_traced, trees)) or closures.traced_values(func))


class Transformed:
    """``torch.func.<name>(func, *options)`` made while tracing."""

    def __init__(self, name: str, func, options: tuple, keywords: dict):
        self.name, self.func, self.options, self.keywords = name, func, options, keywords
        functools.update_wrapper(self, func, updated=())  # (its name and doc, as torch.func's wrapper has)

    def maker(self):
        """``func -> torch.func.<name>(func, *options)``, holding neither this nor the function
        (an eager call keeps it after tracing)."""
        transform, options, keywords = TRANSFORMS[self.name], self.options, self.keywords
        return lambda func: transform(func, *options, **keywords)

    def __call__(self, *args, **kwargs):
        if _eager(self.func, args, kwargs):
            return self.maker()(self.func)(*args, **kwargs)
        if self.name in TRACED:
            _refuse_side_effects(self.func, f"torch.func.{self.name}")
            argnums, has_aux = _grad_options(self.func, *self.options, **self.keywords)
            with_value = self.name == "grad_and_value"
            out = traced_grads.grad(self.func, argnums, has_aux, with_value, args, kwargs)
            if out is not traced_grads.UNTRACED:
                return out
        elif self.name in JACOBIANS:  # (torch's, over thunder_rs's vmap and vjp/jvp: ``_wraps_in_trace``)
            return self.maker()(self.func)(*args, **kwargs)
        return eager_call(self.maker(), self.func, f"torch.func.{self.name}", args, kwargs)


def transform(name: str):
    """What ``torch.func.<name>`` is while tracing."""

    def make(func, *options, **keywords):
        return Transformed(name, func, options, keywords)

    make.__name__ = make.__qualname__ = name
    return make


_eager_impls = torch._functorch.eager_transforms
_jvp_with_argnums = _eager_impls._jvp_with_argnums


def _jvp_in_trace(func, primals, tangents, argnums, *, strict: bool = False, has_aux: bool):
    """torch's ``_jvp_with_argnums`` while tracing, which ``torch.func.jvp`` (also as imported
    before tracing) and ``jacfwd`` call: of traced values, traced by reverse mode twice where the
    function's backward traces (``traced_grads.jvp``), else one eager call."""
    if _eager(func, primals, tangents):
        return _jvp_with_argnums(func, primals, tangents, argnums, strict=strict, has_aux=has_aux)
    if not strict and isinstance(primals, tuple):  # (strict: eager's check that each output has a tangent)
        (primals, tangents), _ = lift_captured((primals, tangents), {})
        _refuse_side_effects(func, "torch.func.jvp")
        out = traced_grads.jvp(func, primals, tangents, argnums, has_aux)
        if out is not traced_grads.UNTRACED:
            return out
    make = lambda f: lambda p, t: _jvp_with_argnums(f, p, t, argnums, strict=strict, has_aux=has_aux)  # noqa: E731
    return eager_call(make, func, "torch.func.jvp", (primals, tangents), {})


_vjp_with_argnums = _eager_impls._vjp_with_argnums


def _vjp_in_trace(func, *primals, argnums=None, has_aux: bool = False):
    """torch's ``_vjp_with_argnums`` while tracing, which ``torch.func.vjp`` and a ``jacrev`` made
    before tracing call: of traced values, the function traced once as the program's own ops (on
    stand-ins that require grad: ``traced_grads.vjp_forward``), and a vjp function that traces
    its backward from those ops (``traced_grads.vjp_backward``)."""
    if _eager(func, primals):
        return _vjp_with_argnums(func, *primals, argnums=argnums, has_aux=has_aux)
    (primals, _) = lift_captured(primals, {})
    _refuse_side_effects(func, "torch.func.vjp")
    nums = range(len(primals)) if argnums is None else (argnums,) if isinstance(argnums, int) else argnums
    chosen = [p for i, p in enumerate(primals) if i in nums or i - len(primals) in nums]
    others = [p for i, p in enumerate(primals) if not (i in nums or i - len(primals) in nums)]
    forward = traced_grads.vjp_forward(func, primals, argnums, has_aux)  # (traced once, as eager runs it)
    written: list = []
    if forward is not None:
        out, forward = forward
        written += [True] if forward.wrote else []
    else:
        with traced_grads.scope(active_recorder(), writable=others, differentiated=chosen, written=written):
            out = func(*primals)
    aux = None
    if has_aux:
        if not (isinstance(out, tuple) and len(out) == 2):
            raise ThunderRuntimeError(
                "vjp(f, *primals): output of function f should be a tuple: (output, aux) if has_aux is True"
            )
        out, aux = out
    flat, spec = tree_flatten(out)
    if not flat or not all(isinstance(t, torch.Tensor) and t.dtype.is_floating_point for t in flat):
        raise ThunderNotImplementedError(
            f"torch.func.vjp at {user_location()}: the function returns {[type(t).__name__ for t in flat]}; "
            "thunder_rs traces vjp of functions returning floating-point tensors (eager raises for other outputs)"
        )

    def vjp_fn(cotangents, retain_graph=True, create_graph=None):
        if active_recorder() is None:  # (an eager call of a vmap over it: each call's tensors)
            eager_fn = _vjp_with_argnums(func, *primals, argnums=argnums, has_aux=has_aux)[1]
            return eager_fn(cotangents, retain_graph, create_graph)
        return _vjp_backward(func, primals, argnums, has_aux, spec, cotangents, forward, bool(written))

    return (out, vjp_fn, aux) if has_aux else (out, vjp_fn)


def _vjp_backward(func, primals, argnums, has_aux, spec, cotangents, forward, wrote: bool):
    """The traced backward of ``vjp``'s function; under ``torch.vmap``, where it cannot be traced,
    the enclosing vmap runs eagerly (``MapsATransform``), but for a function that ``wrote`` its
    arguments (the eager call would run it, and its writes, again)."""
    (cotangents,), _ = lift_captured((cotangents,), {})
    out = traced_grads.vjp_backward(func, primals, argnums, has_aux, spec, cotangents, forward, wrote)
    if out is not traced_grads.UNTRACED:
        return out
    if wrote:
        raise ThunderNotImplementedError(
            f"torch.func.vjp at {user_location()}: its function writes its arguments in place, and its backward "
            "cannot be traced from the forward thunder_rs traced (under torch.vmap: a jacrev's); an eager call "
            "would run the function, and its writes, again. Write the arguments outside the transformed function"
        )
    if any(hasattr(t, "physical") for t in tree_flatten((cotangents, primals))[0]):
        raise MapsATransform(f"torch.func.vjp's function of values batched by torch.vmap at {user_location()}")
    raise ThunderNotImplementedError(
        f"torch.func.vjp at {user_location()}: its function's backward cannot be traced (it runs an eager fallback, "
        "draws random numbers, or the cotangents do not match the outputs); call torch.func.vjp outside the jitted "
        "function, or use torch.func.grad/jacrev, which run such functions as one eager call"
    )


_lazy_dynamo_disallow = _eager_impls.lazy_dynamo_disallow


def _disallow_in_trace(fn):
    """torch's ``lazy_dynamo_disallow`` while tracing, through which ``torch.func.linearize`` (also
    as imported before tracing) traces its function's jvp, ``lazy_dynamo_disallow(make_fx)(trace_fn)
    (tangents)``, and folds that graph's constants: over traced primals, a ``Linearized`` stands for
    the graph (``make_fx`` would fail on the proxy's storage)."""
    if fn is _eager_impls.make_fx:
        return _make_fx_in_trace
    if fn is _eager_impls.const_fold.split_const_subgraphs:
        return lambda graph, *a, **k: (
            graph if isinstance(graph, Linearized) else _lazy_dynamo_disallow(fn)(graph, *a, **k)
        )
    return _lazy_dynamo_disallow(fn)


def _make_fx_in_trace(trace_fn, *options, **keywords):
    """``make_fx(trace_fn)`` while tracing: of linearize's ``trace_fn`` over traced primals (its
    closure holds ``func``, ``flat_primals`` and ``primals_argspec``), a ``Linearized``."""
    names = trace_fn.__code__.co_freevars
    cells = dict(zip(names, (c.cell_contents for c in trace_fn.__closure__ or ())))
    traced = {"func", "flat_primals", "primals_argspec"} <= set(cells) and not _eager(
        cells["func"], cells["flat_primals"]
    )
    if not traced:
        return _lazy_dynamo_disallow(_eager_impls.make_fx)(trace_fn, *options, **keywords)
    if any(hasattr(p, "physical") for p in cells["flat_primals"]):  # (a BatchedProxy: a value of torch.vmap's levels)
        raise ThunderRuntimeError(
            "Batching rule not implemented for aten::_make_dual; the fallback path doesn't work on out= or view ops. "
            f"(torch.func.linearize of values torch.vmap batched, at {user_location()})"
        )
    func, primals = cells["func"], tree_unflatten(list(cells["flat_primals"]), cells["primals_argspec"])
    return lambda flat_tangents: Linearized(func, primals)


class Linearized:
    """``torch.func.linearize``'s jvp graph of ``func`` at traced ``primals``: called with the
    flat tangents (which eager's jvp function checked), their flat tangents out; traced by
    reverse mode twice where ``func``'s backward traces (``traced_grads.linearize``), else each
    call one eager call of torch's linearize on the primals, detached (eager's graph holds them as
    constants)."""

    def __init__(self, func, primals: tuple):
        (primals, _) = lift_captured(primals, {})
        _refuse_side_effects(func, "torch.func.linearize")
        self.func, self.primals = func, primals
        self.transposed = traced_grads.linearize(func, primals)

    def __call__(self, *flat_tangents):
        detached = tuple(
            tree_unflatten([_detached(x) for x in tree_flatten(p)[0]], tree_flatten(p)[1]) for p in self.primals
        )
        if self.transposed is not traced_grads.UNTRACED and vmap_state.levels.get():
            return self._under_vmap(detached, flat_tangents)
        if self.transposed is not traced_grads.UNTRACED:
            return traced_grads.linearized_tangents(self.transposed, list(flat_tangents))
        return eager_call(_linearized_eagerly, self.func, "torch.func.linearize", (detached, flat_tangents), {})

    def _under_vmap(self, detached: tuple, flat_tangents: tuple) -> list:
        """``vmap(jvp_fn)(tangents)``: each example's ``J t`` as ``torch.func.jvp`` traces it under the
        vmap (``J^T u``, traced outside its levels, would sum the examples' cotangents)."""
        tangents = tree_unflatten(list(flat_tangents), tree_flatten(self.primals)[1])
        out = None
        if active_recorder() is self.transposed.recorder:
            out = traced_grads.jvp(self.func, detached, tangents, None, False)
        if out is None or out is traced_grads.UNTRACED:
            raise ThunderNotImplementedError(
                f"torch.func.linearize's jvp function under torch.vmap at {user_location()}: thunder_rs cannot trace "
                "its function's jvp there (or it was made in another jitted call); call torch.func.jvp under the vmap"
            )
        return tree_flatten(out[1])[0]


def _detached(x):
    return x.detach() if isinstance(x, torch.Tensor) else x


def _linearized_eagerly(func):
    def call(primals, flat_tangents):
        primal_spec = tree_flatten(primals)[1]
        # (the compiled call runs inside an autograd.Function, whose forward turns forward mode off;
        # linearize's graph would then carry no tangent, as torch.func.jvp's turns it on itself)
        with torch.autograd.forward_ad._set_fwd_grad_enabled(True):
            jvp_fn = _eager_impls.linearize(func, *primals)[1]
            return tree_flatten(jvp_fn(*tree_unflatten(list(flat_tangents), primal_spec)))[0]

    return call


#: torch's implementations behind ``grad``/``grad_and_value``, which a transform made before tracing
#: (``from torch.func import grad`` at import) calls.
IMPLS = {"grad_impl": _eager_impls.grad_impl, "grad_and_value_impl": _eager_impls.grad_and_value_impl}


def _impl(name: str):
    """What torch's ``<name>_impl(func, argnums, has_aux, args, kwargs)`` is while tracing."""
    original = IMPLS[f"{name}_impl"]

    def impl(func, argnums, has_aux, args, kwargs):
        if _eager(func, args, kwargs):
            return original(func, argnums, has_aux, args, kwargs)
        return Transformed(name, func, (argnums, has_aux), {})(*args, **kwargs)

    impl.__name__ = impl.__qualname__ = original.__name__
    return impl


_wraps = _eager_impls._wraps_without_dynamo_attrs


def _wraps_in_trace(func):
    """torch's ``_wraps_without_dynamo_attrs`` while tracing, which ``jacrev`` and ``jacfwd`` (also
    as imported before tracing, and in ``hessian``) wrap the function they return with: that
    function, called on traced values, runs as one eager call."""
    wrap_as_func = _wraps(func)

    def decorate(wrapper):
        name = wrapper.__qualname__.partition(".")[0]
        if name not in ("jacrev", "jacfwd"):
            return wrap_as_func(wrapper)

        def call(*args, **kwargs):
            if _eager(wrapper, args, kwargs):
                return wrapper(*args, **kwargs)
            out = _traced_jacobian(wrapper, f"torch.func.{name}", args, kwargs)
            if out is not traced_grads.UNTRACED:
                return out
            return eager_call(lambda f: f, wrapper, f"torch.func.{name}", args, kwargs)

        return wrap_as_func(call)

    return decorate


def _traced_jacobian(wrapper, name: str, args: tuple, kwargs: dict):
    """torch's ``jacrev``/``jacfwd`` function traced as ops of the program: its ``vmap`` over
    ``vjp``'s function (over ``jvp``) on a basis, which thunder_rs batches and differentiates; or
    ``UNTRACED``, nothing recorded, where it cannot be (it then runs as one eager call). A
    function that wrote its arguments before that is refused (the eager call would write again)."""
    rec = active_recorder()
    mark, first = rec.mark(), rec.num_values
    try:
        with traced_grads.refusing_argument_writes():  # (refused before they are made: the eager call makes them)
            return wrapper(*args, **kwargs)
    except MapsATransform:
        raise  # (the enclosing torch.vmap runs eagerly)
    except Exception as e:  # (the eager call computes it, or raises eager's error)
        written = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, TensorProxy) and (t._vid or 0) >= first]
        if written:
            raise traced_grads.unwritten(name, e) from e
        rec.rewind(mark)
        return traced_grads.UNTRACED


#: What tracing sets in torch (``torch_overrides``): the transforms and the implementations above.
OVERRIDES: dict[tuple[object, str], object] = {
    **{(torch.func, name): transform(name) for name in TRANSFORMS},
    (_eager_impls, "_jvp_with_argnums"): _jvp_in_trace,
    (_eager_impls, "_vjp_with_argnums"): _vjp_in_trace,
    (_eager_impls, "lazy_dynamo_disallow"): _disallow_in_trace,
    **{(_eager_impls, f"{name}_impl"): _impl(name) for name in ("grad", "grad_and_value")},
    (_eager_impls, "_wraps_without_dynamo_attrs"): _wraps_in_trace,
}


class MapsATransform(ThunderNotImplementedError):
    """A transform of values batched by thunder_rs's ``vmap`` (``vmap(lambda x: grad(f)(x))``): the
    ``vmap`` that batched them runs whole as an eager call instead; raised to it (and refused where
    no such ``vmap`` is there to catch it: Dynamo's level calls)."""


def vmapped(func, in_dims, out_dims, randomness: str, chunk_size, args, kwargs):
    """``torch.vmap(func, ...)(*args, **kwargs)`` as one eager call: ``func`` a ``Transformed``
    (``vmap(grad(f))``), or a function that transforms the values it batches."""
    vmap = torch._functorch.apis.vmap  # (torch's: ``torch.vmap`` is thunder_rs's while tracing)
    if isinstance(func, Transformed):
        make, func, name = func.maker(), func.func, f"torch.func.vmap({func.name})"
    else:
        make, name = (lambda f: f), "torch.func.vmap"

    def batched(f):
        return vmap(make(f), in_dims, out_dims, randomness, chunk_size=chunk_size)

    return eager_call(batched, func, name, args, kwargs)


def _untraced(fn):
    """``fn`` run as thunder_rs's own work: torch.func's autograd calls and the function's reads
    are not the traced program's (it runs on every call, reading them then)."""

    def run(*args, **kwargs):
        thread_state.inside += 1
        try:
            with paused_recording():  # (its output metadata, computed while tracing, on meta tensors)
                return fn(*args, **kwargs)
        finally:
            thread_state.inside -= 1

    return run


class _Call:
    """What one recorded eager call runs: ``make(function)`` on the call's tensors put back among
    its constant arguments. The trace holds it as a constant argument of the call (freed with the
    trace), so that every compile of a transform shares one fallback symbol (``_runner``)."""

    __slots__ = ("make", "template", "positions", "constants", "spec", "name", "devices", "grad_enabled", "traced")

    def __init__(self, make, template, positions, constants, spec, name, devices, grad_enabled):
        self.make, self.template, self.positions, self.constants, self.spec = make, template, positions, constants, spec
        self.name, self.devices, self.grad_enabled = name, devices, grad_enabled
        self.traced = None  # (where, the outputs' sizes and dtypes) the trace was made with: ``_on_fake_tensors``

    def __call__(self, given: tuple):
        flat = list(self.constants)
        for i, t in zip(self.positions, given):
            flat[i] = t
        call_args, call_kwargs = tree_unflatten(flat, self.spec)
        bound = closures.filled(self.template, given[len(self.positions) :])
        # Under the grad mode the program called it in, as eager (the compiled forward runs with
        # grad off; torch's forward mode over reverse mode differs under no_grad: det's hessian).
        with torch.set_grad_enabled(self.grad_enabled or torch.is_grad_enabled()):
            return _untraced(self.make(bound))(*call_args, **call_kwargs)


#: fallback name (``torch.func.jacrev``) -> the one callable its symbol runs, ``run(call, *tensors)``.
_RUNNERS: dict = {}


def _runner(name: str):
    """The callable the fallback symbol ``name`` runs: the ``_Call`` it is given, on its tensors."""
    run = _RUNNERS.get(name)
    if run is None:

        def run(call, *given):
            out = call(given)
            _check_as_traced(call, out)
            return out

        module, _, short = name.rpartition(".")
        run.__name__ = run.__qualname__ = short
        run.__module__ = module
        META_RULES[run] = _on_fake_tensors
        run = _RUNNERS.setdefault(name, run)
    return run


def eager_call(make, func, name: str, args: tuple, kwargs: dict):
    """Records ``make(func)(*args, **kwargs)`` as an eager fallback named ``name`` that takes the
    call's tensors and the traced tensors ``func``'s closure holds (``closures``); real tensors the
    program captured become trace inputs, read on each call."""
    args, kwargs = lift_captured(args, kwargs)
    leaves, spec = tree_flatten(closures.plain((args, kwargs)))
    # Tensors and the traced sizes and floats are the call's inputs, as are those of the closure.
    positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor) or closures.is_traced(x)]
    captured = closures.traced_values(func)
    tensors = (*(leaves[i] for i in positions), *captured)
    if any(hasattr(t, "physical") for t in tensors):  # (a BatchedProxy: a value of torch.vmap's levels)
        raise MapsATransform(
            f"{name} of values batched by torch.vmap at {user_location()}: thunder_rs runs the transform eagerly, "
            "on whole tensors, so the torch.vmap around it must run so too; here it cannot"
        )
    _refuse_side_effects(func, name)
    constants = [None if i in set(positions) else x for i, x in enumerate(leaves)]
    template = closures.with_slots(func, captured) if captured else func  # (the call keeps no proxy)
    del func, captured
    devices = [t.device if isinstance(t, torch.Tensor) else None for t in tensors]
    call = _Call(make, template, positions, constants, spec, name, devices, torch.is_grad_enabled())
    try:
        with torch._C.DisableTorchFunction():  # (as a torch call's handler runs)
            return user_fallback(_runner(name), (call, *tensors), {})
    except Exception as e:
        if isinstance(e.__cause__, _Refused):
            raise ThunderNotImplementedError(str(e.__cause__)) from None
        raise


def _refuse_side_effects(func, name: str) -> None:
    """Refuses a function that writes Python state outside itself (``python_effects``): the eager
    call runs it once more than eager while compiling, and again in the backward."""
    what = python_effects.side_effect(func)
    if what is not None:
        raise ThunderNotImplementedError(
            f"{name} at {user_location()}: the transformed function has a Python side effect ({what}); thunder_rs "
            "runs it once more than eager while compiling (on fake tensors, for its output's shapes) and again in "
            "the backward, so the effect would happen more often than in eager. Move it out of the transformed "
            'function, or use torch.compile(backend="thunder_rs")'
        )


def _fake(x, device):
    """A fake tensor for a meta one, on ``device``; a traced float as its value when traced."""
    if isinstance(x, torch.Tensor):
        return torch.empty(x.shape, dtype=x.dtype, device=device)
    return x.hint if isinstance(x, SymFloat) else x


class _Refused(Exception):
    """What the transformed function does cannot run as an eager call (the fallback's metadata run
    wraps what it raises, this included, in an error of the same kind)."""


def _on_fake_tensors(call: _Call, *metas):
    """The output metadata of ``call``: the call on fake tensors of the traced ones (on
    their devices), next to the real tensors the function reads itself (a module's parameters),
    which meta tensors could not meet. Where those give the result a gradient (they require grad),
    eager's result would carry it to them, which the trace's call cannot: refused."""
    with FakeTensorMode(allow_non_fake_inputs=True), torch.set_grad_enabled(call.grad_enabled):
        fakes = [_fake(m, d) for m, d in zip(metas, call.devices)]
        try:
            out = call(tuple(fakes))
        except ThunderError as e:
            if not isinstance(e.__cause__ or e, ThunderError) or "thunder_rs proxy" not in str(e):
                raise
            raise _Refused(
                f"{call.name} at {user_location()}: the function computes with a traced tensor that is not one of its "
                "arguments (a closure over a value of the jitted program); an eager call of the transform "
                "cannot see it. Pass it as an argument of the transformed function"
            ) from None
    call.traced = (user_location(), _metadata(out))
    if any(t.requires_grad for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)):
        raise _Refused(
            f"{call.name} at {user_location()}: the function reads tensors that require grad besides its arguments "
            "(a module's parameters, a captured tensor); eager's result carries gradients to them, which "
            "thunder_rs's eager call of the transform cannot. Pass them as arguments (torch.func.functional_call), "
            "or detach them"
        )
    return out


def _metadata(out) -> tuple:
    return tuple((tuple(t.shape), t.dtype) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))


def _check_as_traced(call: _Call, out) -> None:
    """Refuses outputs of another size or dtype than the trace was made with: they depend on Python
    state the transformed function reads on each call (which the trace does not guard), and the
    program's later operations were traced for the first ones."""
    if call.traced is not None and _metadata(out) != call.traced[1]:
        where, then = call.traced
        raise ThunderRuntimeError(
            f"{call.name} at {where}: the transformed function's outputs are {_metadata(out)} (sizes, dtype) on this "
            f"call where they were {then} when the program was compiled; they depend on Python state the function "
            "reads, which thunder_rs does not guard. Pass that state as an argument of the jitted function"
        )
