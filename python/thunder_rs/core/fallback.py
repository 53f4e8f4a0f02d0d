"""Eager fallback symbols: torch calls with no ltorch mapping.

The call is recorded as an opaque symbol named after the torch callable; its outputs' metadata
come from running it on meta tensors. The torch executor runs it eagerly, and torch's autograd
differentiates it. ``thunder_rs.examine`` counts fallbacks by name.
"""

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from thunder_rs import _core
from thunder_rs.core.dtypes import CODES
from thunder_rs.core.proxies import TensorProxy
from thunder_rs.core.recorder import current, proxies
from thunder_rs.errors import ThunderNotImplementedError, thunder_error_like

#: symbol id -> the torch callable a fallback symbol runs.
FALLBACK_IMPLS: dict[int, object] = {}
_ids: dict[object, int] = {}


def qualified_name(func) -> str:
    """``torch.cumsum``, ``torch.Tensor.cumsum``, ``torch.nn.functional.unfold``."""
    name = getattr(func, "__name__", None) or type(func).__name__
    owner = getattr(func, "__objclass__", None) or getattr(getattr(func, "__self__", None), "__class__", None)
    if owner is not None and owner.__name__ in ("TensorBase", "Tensor"):
        return f"torch.Tensor.{name}"
    module = getattr(func, "__module__", None) or "torch"
    if module.startswith("torch._C"):
        module = "torch"
    return f"{module}.{name}"


def symbol_id(func) -> int:
    """The fallback symbol of ``func``, registered (with its ``<name>.vjp``) on first use."""
    sid = _ids.get(func)
    if sid is None:
        name = qualified_name(func)
        sid = _ids[func] = _core.register_symbol(name, fallback=True)
        FALLBACK_IMPLS[sid] = func
        FALLBACK_IMPLS[_core.register_symbol(f"{name}.vjp", fallback=True)] = _vjp_of(func)
    return sid


def _vjp_of(func):
    """The backward of a fallback: runs ``func`` again under torch.autograd on the saved inputs
    and returns the gradients of ``wanted`` (inputs that require grad in the trace)."""

    def vjp(args, cotangents, wanted, **kwargs):
        copies = {id(w): w.detach().requires_grad_(True) for w in wanted}
        swap = lambda x: copies.get(id(x), x) if isinstance(x, torch.Tensor) else x  # noqa: E731
        args, kwargs = tree_map(swap, (args, kwargs))
        with torch.enable_grad():
            outs = tree_flatten(func(*args, **kwargs))[0]
        pairs = [(o, c) for o, c in zip(outs, cotangents) if c is not None and o.requires_grad]
        inputs = [copies[id(w)] for w in wanted]
        grads = torch.autograd.grad([o for o, _ in pairs], inputs, [c for _, c in pairs], allow_unused=True) if pairs else [None] * len(inputs)
        grads = tuple(torch.zeros_like(w) if g is None else g for w, g in zip(wanted, grads))
        return grads[0] if len(grads) == 1 else grads

    vjp.__name__ = f"{getattr(func, '__name__', 'op')}_vjp"
    return vjp


def _to_meta(x):
    if isinstance(x, TensorProxy):
        return torch.empty(x.shape, dtype=x.dtype, device="meta", requires_grad=False)
    return x


def fallback(func, args, kwargs):
    """Records ``func`` as an eager fallback. In-place calls never get here: ``thunder_rs.torch.inplace``
    functionalises them first, so the executor runs only functions that write nothing."""
    name = qualified_name(func)
    if (name.endswith("_") and not name.endswith("__")) or kwargs.get("inplace"):
        raise ThunderNotImplementedError(f"{name}: an in-place call thunder_rs has no functional form for")
    with torch._C.DisableTorchFunctionSubclass():
        meta_args, meta_kwargs = tree_map(_to_meta, (args, kwargs))
        try:
            out = func(*meta_args, **meta_kwargs)
        except NotImplementedError as e:
            raise ThunderNotImplementedError(
                f"{name}: no thunder_rs decomposition, and torch cannot compute its output metadata on meta tensors ({e})"
            ) from e
        except Exception as e:
            # Invalid arguments: what eager raises for them, with the op's name.
            raise thunder_error_like(e, f"{name}: {e}") from e
    leaves, spec = tree_flatten(out)
    if not leaves or not all(isinstance(t, torch.Tensor) for t in leaves):
        raise ThunderNotImplementedError(f"{name}: fallback calls must return tensors, got {type(out).__name__}")
    in_leaves = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, TensorProxy)]
    device = str(in_leaves[0].device) if in_leaves else "cpu"
    requires_grad = any(x.requires_grad for x in in_leaves)
    metas = [(CODES[t.dtype], device, tuple(t.shape), requires_grad and t.dtype.is_floating_point) for t in leaves]
    outs = proxies(current().fallback(symbol_id(func), tuple(args), kwargs or None, metas))
    return outs[0] if isinstance(out, torch.Tensor) else tree_unflatten(outs, spec)
