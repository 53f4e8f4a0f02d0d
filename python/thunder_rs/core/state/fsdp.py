"""FSDP2 (``torch.distributed.fsdp.fully_shard``) modules under ``thunder_rs.jit``.

``fully_shard`` keeps each parameter as a sharded ``DTensor`` between calls and registers forward
hooks on every sharded module: the pre-hook all-gathers the shards and puts plain unsharded
parameters in the module's slots; the post-hook puts the shards back, and hooks the outputs so
that backward all-gathers again and reduce-scatters the gradients into the shards' ``.grad``.
Those hooks run collectives and keep FSDP's own state machine, so they cannot be traced. A jitted
FSDP module runs them eagerly around the compiled call instead: every sharded module's pre-hook
first (the jitted module's own, the root, with the call's arguments), then the compiled program
on the unsharded parameters (the traced clone of the module tree leaves FSDP's hooks out), then
the post-hooks innermost first on the program's output. The numbers are eager's; what differs is
memory and overlap: every group is all-gathered for the whole forward, and gradients are
reduce-scattered when backward ends (FSDP's final callback) rather than layer by layer.
"""

import sys

import torch

from thunder_rs.errors import ThunderNotImplementedError

#: FSDP2's state module: where its forward hooks are defined (bound ``FSDPState`` methods, or group
#: hooks wrapping them with ``functools.wraps``). Read from ``sys.modules``, never imported: a module
#: can only be sharded, and a DTensor only exist, once the program imported them, and importing
#: FSDP/DTensor here would cost every ``import thunder_rs`` seconds.
_STATE_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_state"
_WORKAROUND = "apply fully_shard to each submodule separately and to the model, then thunder_rs.jit(model)"


def _dtensor_type():
    tensor_module = sys.modules.get("torch.distributed.tensor")
    return getattr(tensor_module, "DTensor", None)


def is_fsdp_hook(hook) -> bool:
    func = getattr(hook, "__func__", hook)
    return getattr(func, "__module__", None) == _STATE_MODULE


def without_fsdp_hooks(store: dict) -> dict:
    """A module's hook store without FSDP's hooks (the traced clone's), or ``store`` itself when
    it has none."""
    if not any(is_fsdp_hook(h) for h in store.values()):
        return store
    return type(store)((k, h) for k, h in store.items() if not is_fsdp_hook(h))


class FSDPCall:
    """How a jitted module with ``fully_shard`` modules in its tree is called (see the module
    docstring); None from ``of`` when the tree has none."""

    def __init__(self, root: torch.nn.Module, states: list):
        self.root = root
        self.states = states

    @classmethod
    def of(cls, module: torch.nn.Module):
        state_module = sys.modules.get(_STATE_MODULE)
        if state_module is None:
            return None
        state_of = state_module._get_module_fsdp_state
        states = [(m, s) for m in module.modules() if (s := state_of(m)) is not None]
        if not states:
            return None
        if states[0][0] is not module:
            raise ThunderNotImplementedError(
                f"jit: {type(module).__name__} has fully_shard (FSDP2) submodules but is not sharded itself; "
                f"{_WORKAROUND}"
            )
        for mod, state in states:
            if len(state._modules) > 1:
                raise ThunderNotImplementedError(
                    f"jit: fully_shard of a group of modules ({type(mod).__name__} and {len(state._modules) - 1} more) "
                    f"is not supported under thunder_rs.jit; {_WORKAROUND}"
                )
            policy = state._mp_policy
            if mod is not module and (policy.param_dtype is not None or policy.output_dtype is not None):
                raise ThunderNotImplementedError(
                    f"jit: fully_shard of {type(mod).__name__} inside the jitted module has a MixedPrecisionPolicy "
                    "casting inputs or outputs, which thunder_rs would not apply inside the compiled program; "
                    "give the policy to the outermost fully_shard only"
                )
        return cls(module, states)

    def __call__(self, jfn, args: tuple, kwargs: dict):
        (root, root_state), inner = self.states[0], self.states[1:]
        args, kwargs = root_state._pre_forward(root, args, kwargs)
        for mod, state in inner:
            state._pre_forward(mod, (), {})
        _rebind_unsharded(jfn)
        out = jfn._call_general(args, kwargs)
        for mod, state in reversed(inner):
            out = state._post_forward(mod, (), out)
        return root_state._post_forward(root, args, out)


def refuse_dtensors(names, tensors) -> None:
    """A ``DTensor`` parameter reaching the trace (``fully_shard`` applied after ``jit``, or a
    tensor-parallel ``DTensor``) is refused with the parameter's name."""
    dtensor = _dtensor_type()
    if dtensor is None:
        return
    for name, t in zip(names, tensors):
        if isinstance(t, dtensor):
            raise ThunderNotImplementedError(
                f"jit: parameter or buffer {name} is a DTensor; thunder_rs traces plain tensors only. For FSDP2, "
                "apply fully_shard before thunder_rs.jit(model): its hooks then gather the parameters around the "
                f"compiled call ({_WORKAROUND})"
            )


def _rebind_unsharded(jfn) -> None:
    """The binding names slots by the tensors in them when it was made: FSDP swaps sharded and
    unsharded parameters in the slots without a module write, so a binding made on other tensors
    is made again (the slots, and so the cache, are the same)."""
    binding = jfn._binding
    if binding is not None and any(id(store[name]) not in binding._index_of for store, name in binding.unique):
        rebound = type(binding)(jfn._module)
        rebound.metadata.structure = binding.metadata.structure  # (the same structure: its entries serve)
        jfn._binding = rebound
