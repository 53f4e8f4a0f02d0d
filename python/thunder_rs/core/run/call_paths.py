"""The per-call path of calls with keyword or non-tensor arguments (``ThunderFunction._call_general``).

A call the positional fast path does not take is keyed by the function of its structure
(``call_keys``) and, found, runs at once; else (a miss, a failed check, a structure left to the
general path) it is flattened (``callflat``), keyed with ``leaf_key`` and looked up again, and a
miss compiles. Both key a call alike, so an entry compiled by one serves the other.
"""

import torch
from torch.autograd import forward_ad as _forward_ad

from thunder_rs.core.acquisition.argument_containers import arguments_made_again, hold_call, release_call
from thunder_rs.core.acquisition.argument_containers import StateAliased, container_places, refuse_aliased
from thunder_rs.core.acquisition.argument_containers import refuse_aliased_at
from thunder_rs.core.acquisition.cache import forward_ad_duals, global_key, leaf_key, tensor_aliases
from thunder_rs.core.base.userframe import callable_name, warn_at_user_frame
from thunder_rs.core.lang.reads import Diverged
from thunder_rs.core.lang.recorder import active_recorder
from thunder_rs.core.run.call_keys import call_key, structure_of
from thunder_rs.core.run.callflat import compile_spec, flatten_call
from thunder_rs.core.state.cached_reads import PROGRAM_CALLS
from thunder_rs.errors import runtime_error

#: The ``Entry.container_places`` of an entry whose calls ``refuse_aliased`` walks each time.
_WALKED = ("walked",)
#: True only while Dynamo traces (it answers the call itself): eager returns False.
_is_dynamo_compiling = torch.compiler.is_dynamo_compiling


def call_general(jfn, args, kwargs, module_state=None, structure=None):
    """Runs the call of ``jfn`` (a ``ThunderFunction``) with ``args`` and ``kwargs``;
    ``module_state``: ``(its module's tensors, binding, key state)`` where the positional path
    read them for this call already (each read checks every tensor's metadata: ~10 us at 100);
    ``structure``: the call's ``call_keys.structure_of``, where the positional path has it (it
    found no program being traced, as below)."""
    # Called by a program being traced, by thunder_rs or by Dynamo (torch.compile of a model
    # with a jitted part): part of that program's trace.
    if structure is None and (active_recorder() is not None or _is_dynamo_compiling()):
        return jfn._fn(*args, **kwargs)
    PROGRAM_CALLS[0] += 1  # (the calls of cached functions it makes: ``cached_reads.made_call``)
    module = jfn._module
    params = binding = state = None
    if module_state is not None:
        params, binding, state = module_state
    elif module is not None:
        params = jfn._module_tensors()
        binding = jfn._binding
        state = (module.training, binding.metadata(params))
        if _forward_ad._current_level >= 0:  # (which of its tensors are duals there: ``forward_ad_duals``)
            state = (*state, forward_ad_duals(params)[1])
    # Lists and dicts the program only writes into are keyed by their type (``written_only``).
    if jfn._written is None:
        keyed_call = None
        keyed = call_key(args, kwargs, state, structure)
    else:
        keyed_call = jfn._written.keyed(args, kwargs)
        keyed = call_key(*keyed_call, state, None if keyed_call[0] is not args else structure)
    if keyed is not None:
        key, flat = keyed
        if jfn._floats.wide:  # (float arguments the entries take as inputs: ``float_args``)
            key = jfn._floats.key(key)
        entry = _found(jfn, key, flat)
        if entry is not None:
            return _run(jfn, entry, key, flat, params, args, kwargs, keyed_call)
    return _flattened(jfn, args, kwargs, state, params, binding, keyed_call)


def call_plain(jfn, args, kwargs, structure=None):
    """``call_general`` of a call the caller found no program tracing (nor Dynamo) for and counted
    (``PROGRAM_CALLS``), in one frame where ``jfn`` has no module (a step counter, a learning rate,
    a flag, None, a list of tensors, keywords: the frames of ``call_general``, ``_found`` and
    ``_run`` cost a hit ~0.5 us): keyed by ``call_key`` and looked up as ``_found`` does, an entry
    that changes no argument container run as ``_run`` runs it. The same key, entry, checks and
    order of lookups; a miss or a failed check goes on as ``call_general`` does."""
    if jfn._module is not None:
        return call_general(jfn, args, kwargs, None, structure or structure_of(args, kwargs))
    if jfn._written is None:
        keyed_call = None
        keyed = call_key(args, kwargs, None, structure)
    else:  # (lists and dicts the program only writes into, or reads at constant keys: ``written_only``)
        keyed_call = jfn._written.keyed(args, kwargs)
        keyed = call_key(*keyed_call, None, None if keyed_call[0] is not args else structure)
    if keyed is None:
        return _flattened(jfn, args, kwargs, None, None, None, keyed_call)
    key, flat = keyed
    floats = jfn._floats
    if floats.wide:  # (float arguments the entries take as inputs: ``float_args``)
        key = floats.key(key)
    entry = jfn._cache.get(key)
    if entry is None:
        if not jfn._int_classes.tables:
            return _flattened(jfn, args, kwargs, None, None, None, keyed_call)
        entry = jfn._int_classes.find(key, flat)
        if entry is None:
            return _flattened(jfn, args, kwargs, None, None, None, keyed_call)
    elif entry.check is not None and not entry.check(flat):
        return _flattened(jfn, args, kwargs, None, None, None, keyed_call)
    entry.last_used = jfn._stats.cache_hits = jfn._stats.cache_hits + 1
    if entry.call_args or entry.state_aliases is not None:  # (its arguments' containers checked: ``_run``)
        return _run(jfn, entry, key, flat, None, args, kwargs, keyed_call)
    tail = entry.tail  # (tensors argument objects hold, a KV cache's, read per call)
    held = () if tail is None or tail is no_tail else tail(flat)
    positions = entry.positions
    try:
        out = entry.fn(*(flat if positions is None else map(flat.__getitem__, positions)), *held)
    except Exception as e:
        return _failed(e, jfn, entry, key, flat, args, kwargs)
    return out if entry.post is None else entry.post(out, flat)


def _flattened(jfn, args, kwargs, state, params, binding, keyed_call):
    """The call keyed from its flatten (of ``keyed_call``: ``args`` and ``kwargs`` as keyed, or None
    where they are keyed as they are); a miss compiles. ``state``: the module's part of the key,
    read with ``params`` (its tensors) from ``binding``."""
    keyed_call = keyed_call or (args, kwargs)
    flat, spec = flatten_call(*keyed_call)
    key = (global_key(state, tensor_aliases(flat), flat), tuple(map(leaf_key, flat)), spec)
    if jfn._floats.wide:
        key = jfn._floats.key(key)
    entry = _found(jfn, key, flat)
    if entry is None:
        torch_spec = compile_spec(*keyed_call, flat)
        if torch_spec is None:  # a node type optree does not know: torch's pytree from now on
            return jfn._call_general(args, kwargs)
        try:
            entry = jfn._miss(flat, torch_spec, key)
        except BaseException as e:  # the program's own error: its changes of argument containers made
            arguments_made_again(e, args, kwargs)
            raise
        if jfn._module is not None:
            params = jfn._module_tensors()
            if jfn._binding is not binding:  # (another thread changed the module's structure)
                return jfn._call_general(args, kwargs)
    return _run(jfn, entry, key, flat, params, args, kwargs, keyed_call)


def _found(jfn, key, flat):
    """The entry of ``key`` whose checks the call of ``flat`` passes, counted as a hit, or None (a
    miss). A key not stored may be of a class a symbolic entry serves (an int argument it takes
    symbolic, at a new value: ``dynamic.IntClasses``)."""
    entry = jfn._cache.get(key)
    if entry is None:
        if not jfn._int_classes.tables:
            return None
        entry = jfn._int_classes.find(key, flat)
        if entry is None:
            return None
    elif entry.check is not None and not entry.check(flat):
        return None
    entry.last_used = jfn._stats.cache_hits = jfn._stats.cache_hits + 1
    return entry


def _run(jfn, entry, key, flat, params, args, kwargs, keyed_call):
    """Runs ``entry`` for the call of ``flat`` (``params``: the module's tensors, or None;
    ``keyed_call``: ``args`` and ``kwargs`` as keyed, or None)."""
    inputs = [flat[i] for i in entry.positions] if entry.positions is not None else list(flat)
    if params is not None:
        inputs.extend(params)
    tail = entry.tail
    if tail is not None and tail is not no_tail:  # tensors argument objects hold (a KV cache's), read per call
        inputs.extend(tail(flat))
    if entry.state_aliases is not None:  # (a list or dict passed twice, or also read as state)
        try:
            refuse_aliased(args, kwargs, keyed_call, entry.state_aliases, entry.call_args, flat)
        except StateAliased as aliased:
            return _aliased_eagerly(jfn, aliased, args, kwargs)
    elif entry.call_args:
        places = entry.container_places
        if places is None:  # (found on its first call)
            places = container_places(args, kwargs, keyed_call)
            places = entry.container_places = _WALKED if places is None else places
        if places is _WALKED:
            refuse_aliased(args, kwargs, keyed_call)
        else:
            refuse_aliased_at(places, args, kwargs, keyed_call)
    try:
        out = entry.fn(*inputs)
    except Exception as e:
        return _failed(e, jfn, entry, key, flat, args, kwargs)
    return out if entry.post is None else _posted(entry, out, flat, args, kwargs)


def _posted(entry, out, flat, args, kwargs):
    """``entry.post(out, flat)``, with the call's arguments noted where it changes their containers."""
    if not entry.call_args:
        return entry.post(out, flat)
    hold_call(args, kwargs)
    try:
        return entry.post(out, flat)
    finally:
        release_call()


def _aliased_eagerly(jfn, aliased: StateAliased, args, kwargs):
    """A call passing a list or dict the program also reads as state (``aliased`` says where): the
    program runs as eager code, its reads of the one seeing its writes into the other. Warns once."""
    jfn._stats.aliased_calls += 1
    if jfn._stats.aliased_calls == 1:
        warn_at_user_frame(
            f"thunder_rs: {callable_name(jfn._fn)} runs eagerly the calls that pass a list, dict or deque it also "
            f"reads as state: {aliased}. Pass a distinct container, or reach it one way only, to run it compiled"
        )
    return jfn._fn(*args, **kwargs)


def no_tail(flat) -> tuple:
    """The tail of an entry whose tensors argument objects hold none (an entry that picks its
    inputs by position, which the positional path then takes through ``_inputs``)."""
    return ()


def _failed(e: Exception, jfn, entry, key, flat, args, kwargs):
    """After ``entry``'s call raised ``e``: a divergence hands over to the variant for the values
    the call read (``_other_path``) and returns its outputs; any other error is raised as the
    program's, at the user's line."""
    if not isinstance(e, Diverged):
        raise runtime_error(e, entry.filename, entry.source) from e
    keyed_args, keyed_kwargs = (args, kwargs) if jfn._written is None else jfn._written.keyed(args, kwargs)
    torch_spec = compile_spec(keyed_args, keyed_kwargs, flat)
    if torch_spec is None:  # nothing of the call is visible yet: flattened anew, it runs again
        return jfn._call_general(args, kwargs)
    run = lambda variant: variant.fn(*jfn._inputs(variant, flat))  # noqa: E731
    eager = lambda: jfn._fn(*args, **kwargs)  # noqa: E731
    variant, out = jfn._other_path(e, entry, key, flat, lambda: torch_spec, run, eager)
    return out if variant is None or variant.post is None else _posted(variant, out, flat, args, kwargs)
