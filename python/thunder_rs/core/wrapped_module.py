"""How a ``ThunderModule`` presents the module it wraps: its state dict has the wrapped module's
keys, so checkpoints move freely between ``model`` and ``thunder_rs.jit(model)``.

The wrapped module is the ThunderModule's submodule ``_model``, so torch would prefix every key
with ``_model.``. Two state-dict hooks strip that prefix on save and restore it on load; being
hooks, they also apply when the ThunderModule is itself a submodule of a bigger model (torch
passes each hook the module's own prefix).
"""

import torch

WRAPPED = "_model"


def _strip(state_dict: dict, prefix: str) -> None:
    """Renames ``{prefix}_model.{key}`` to ``{prefix}{key}`` in place, keeping the order."""
    inner = f"{prefix}{WRAPPED}."
    entries = [(k, state_dict.pop(k)) for k in list(state_dict) if k.startswith(inner)]
    state_dict.update((prefix + k[len(inner):], v) for k, v in entries)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        inner_module = inner[:-1]
        for k in [k for k in metadata if k == inner_module or k.startswith(inner)]:
            metadata[prefix + k[len(inner):] if k != inner_module else prefix[:-1]] = metadata.pop(k)


def _save_hook(module, state_dict, prefix, local_metadata) -> None:
    _strip(state_dict, prefix)


def _add_prefix(state_dict: dict, prefix: str) -> None:
    """Renames ``{prefix}{key}`` to ``{prefix}_model.{key}`` in place (the inverse of ``_strip``)."""
    inner = f"{prefix}{WRAPPED}."
    keys = [k for k in list(state_dict) if k.startswith(prefix) and not k.startswith(inner)]
    for k in keys:
        state_dict[inner + k[len(prefix):]] = state_dict.pop(k)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        own = prefix[:-1]
        for k in [k for k in metadata if (k == own or k.startswith(prefix)) and not k.startswith(inner)]:
            metadata[inner + k[len(prefix):] if k != own else inner[:-1]] = metadata.pop(k)


def _load_hook(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs) -> None:
    _add_prefix(state_dict, prefix)


def present_state_dict_as_wrapped(module: torch.nn.Module) -> None:
    """Makes ``module.state_dict()`` and ``module.load_state_dict()`` use the keys of
    ``module._model``."""
    module.register_state_dict_post_hook(_save_hook)
    module.register_load_state_dict_pre_hook(_load_hook)
