"""Inference tensors a traced program makes under ``torch.inference_mode()``, as eager makes them.

A proxy made while inference mode is on is itself an inference tensor (torch marks the wrapper
it is), which is what eager's op returns there; a view is one where its base is (a view taken
under inference mode of a normal tensor is normal, one taken outside it of an inference tensor is
an inference tensor). The trace records such a region as ``no_grad``; what is left is what eager
does with inference tensors:

- it returns them: the compiled call's outputs that eager's program makes so are made inference
  tensors again after the call (``inference_outputs``), aliasing the same memory;
- it raises for them outside inference mode: an in-place write to one ("Inplace update to
  inference tensor outside InferenceMode is not allowed"), or an op that saves one for its
  backward ("Inference tensors cannot be saved for backward"). Which ops save which inputs is
  torch's autograd formulas' business, so a torch call outside inference mode that takes an
  inference proxy runs on meta tensors alike (``check_call``), raising eager's error.

Inference tensors the caller passes in are checked alike: whether an input is one is part of its
cache key (``cache.TENSOR_FIELDS``) and of its proxy (``TensorProxy._inference``). One that
requires grad (made with ``requires_grad=True`` under inference mode, as the parameters of a
module built there are) is refused in a call with grad mode on: eager's ops give some results of
it a gradient and others none, and its backward never fills the tensor's ``.grad``.
"""

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.base.userframe import user_location
from thunder_rs.core.lang.symint import SymInt, hint
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError

_is_inference_mode_enabled = torch.is_inference_mode_enabled
_native_is_inference = torch._C.TensorBase.is_inference


def _native(p: TensorProxy) -> bool:
    with torch._C.DisableTorchFunctionSubclass():
        return _native_is_inference(p)


def _requires_grad(p: TensorProxy) -> bool:
    with torch._C.DisableTorchFunctionSubclass():
        return p.requires_grad


def root_of(p: TensorProxy) -> TensorProxy:
    link = p._view
    return p if link is None else link.root


def made_in_inference(p: TensorProxy) -> bool | None:
    """Whether eager's tensor for ``p`` is an inference tensor; None where it is an input's
    normal tensor (or a view of one), which the call's tensor itself is. Inputs are keyed on it
    (arguments) or guarded (the tensors argument objects hold)."""
    root = root_of(p)
    if root._input_vid is not None:
        return True if root._inference else None
    return _native(root)


def is_inference(p: TensorProxy) -> bool:
    """``p.is_inference()`` in a traced program: an input's is in the cache key."""
    root = root_of(p)
    if root._input_vid is None:
        return _native(root)
    if root._inference is None:
        raise ThunderNotImplementedError(
            f"Tensor.is_inference at {user_location()}: of a tensor an argument object holds (or a view of one), "
            "which the compiled call does not specialise on; read it outside the jitted function"
        )
    return root._inference


def _to_meta(x, inference: bool):
    """A meta tensor standing for ``x`` (an inference tensor where ``inference``), of its sizes at
    their hints where they are symbolic: whether torch raises for inference tensors does not
    depend on them (a symbolic size made the check fail, and symbolic compiles stop for good)."""
    with torch.inference_mode(inference):
        t = torch.empty(tuple(hint(s) for s in x.shape), dtype=x.dtype, device="meta")
    return t if inference or not _requires_grad(x) else t.requires_grad_(True)


def _hinted(x):
    """A symbolic size argument (``x.view(B, -1)``) at its hint, as its tensors are (``_to_meta``)."""
    return hint(x) if isinstance(x, SymInt) else x


def check_call(func, args, kwargs) -> None:
    """Raises eager's error for a torch call made outside inference mode that takes a tensor the
    program made under it, where eager's raises one (found by running the call on meta tensors)."""
    flat, spec = tree_flatten((args, kwargs))
    # A tensor not yet a proxy (an argument object's, which the call captures) is the caller's own.
    marks = [
        made_in_inference(x) if isinstance(x, TensorProxy) else (isinstance(x, torch.Tensor) and x.is_inference())
        for x in flat
    ]
    if not any(marks):
        return
    if torch.is_grad_enabled() and any(m and _requires_grad(x) for x, m in zip(flat, marks)):
        _refuse_inference_requiring_grad(func)
    meta = [_to_meta(x, bool(m)) if isinstance(x, TensorProxy) else _hinted(x) for x, m in zip(flat, marks)]
    meta_args, meta_kwargs = tree_unflatten(meta, spec)
    try:
        with torch._C.DisableTorchFunctionSubclass():
            func(*meta_args, **meta_kwargs)
    except RuntimeError as e:
        if "nference" in str(e):
            name = getattr(func, "__name__", str(func))
            raise ThunderRuntimeError(f"{e} ({name} at {user_location()})") from None
    except Exception:  # noqa: BLE001 (the call's own errors are the trace's to raise)
        return


def _refuse_inference_requiring_grad(func) -> None:
    """An inference tensor that requires grad (made under inference mode with
    ``requires_grad=True``, as a module's parameters built there are) used with grad mode on:
    eager's ops outside inference mode give some results a gradient and others none (``x * 2``
    one, ``x.sin()`` none), and its backward leaves the tensor's ``.grad`` None."""
    name = getattr(func, "__name__", str(func))
    raise ThunderNotImplementedError(
        f"{name} at {user_location()}: takes an inference tensor that requires grad (made under "
        "torch.inference_mode() with requires_grad=True, as the parameters of a module built there are) with grad "
        "mode on: eager's autograd gives some results of it a gradient and others none, and never fills its .grad; "
        "thunder_rs does not trace that. Clone it outside inference mode, or call under torch.no_grad()"
    )


def inference_outputs(out) -> tuple[int, ...]:
    """The positions among ``out``'s leaves of the tensors eager's program returns as inference
    tensors that it made (not views of its inputs). Raises where the program returns a tensor it made
    outside inference mode (under ``torch.inference_mode(False)``) from a call made inside it:
    the compiled call runs whole under the caller's inference mode, where that is an inference tensor."""
    leaves = tree_flatten(out)[0]
    marks = [made_in_inference(x) if isinstance(x, TensorProxy) else None for x in leaves]
    if _is_inference_mode_enabled():
        if any(m is False for m in marks):
            raise ThunderNotImplementedError(
                "thunder_rs.jit: the program returns a tensor it made outside inference mode "
                "(under torch.inference_mode(False)) from a call made under torch.inference_mode(); the compiled "
                "call runs under the caller's inference mode, where it would be an inference tensor"
            )
        return ()
    return tuple(i for i, m in enumerate(marks) if m)


def _as_inference(t: torch.Tensor) -> torch.Tensor:
    """``t`` as an inference tensor aliasing its memory (a tensor set to its storage, made under
    inference mode)."""
    if t.is_inference():
        return t
    with torch.inference_mode():
        return torch.empty(0, dtype=t.dtype, device=t.device).set_(
            t.untyped_storage(), t.storage_offset(), t.size(), t.stride()
        )


def making_inference(post, positions: tuple[int, ...]):
    """An entry's ``post`` (or None) followed by turning the outputs at ``positions`` (leaves of
    the program's output) into inference tensors."""

    def convert(out, flat):
        if post is not None:
            out = post(out, flat)
        leaves, spec = tree_flatten(out)
        for i in positions:
            leaves[i] = _as_inference(leaves[i])
        return tree_unflatten(leaves, spec)

    return convert
