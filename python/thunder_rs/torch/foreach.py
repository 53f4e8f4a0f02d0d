"""``torch._foreach_*_``: in-place ops over lists of tensors (an EMA's ``_foreach_mul_`` and
``_foreach_add_``, optimizers' updates), as eager's reference path runs them on the CPU: the
tensor method's in-place op on each tensor in turn (``inplace``'s functionalised ``mul_``,
``add_``, ``lerp_``), with the i-th item of each list argument and the other arguments as they
are. ``_foreach_maximum_`` and ``_foreach_minimum_``, which have no tensor method, stay refused."""

import torch

from thunder_rs.core.base.userframe import user_location
from thunder_rs.core.lang.langctx import MUTATING, TORCH_TO_LTORCH
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError, check


#: Ops whose third argument may be a tensor of one scalar per tensor.
_SCALARS_TENSOR = frozenset({"_foreach_addcmul_", "_foreach_addcdiv_"})


def _per_tensor(name: str, method):
    """The handler of ``torch.<name>``: ``method`` (a handler of an in-place tensor method) on each tensor."""

    def foreach(tensors, *args, **kwargs):
        count = len(tensors)
        for arg in (*args, *kwargs.values()):
            if isinstance(arg, (list, tuple)):
                check(
                    len(arg) == count,
                    f"torch.{name}",
                    lambda: (
                        f"Tensor lists must have the same number of tensors, got {count} and {len(arg)} (at "
                        f"{user_location()})"
                    ),
                    ThunderRuntimeError,
                )
        if name in _SCALARS_TENSOR and len(args) > 2 and isinstance(args[2], torch.Tensor):
            # (their ``Tensor scalars`` overload holds one scalar per tensor: a read of its values)
            raise ThunderNotImplementedError(
                f"torch.{name} at {user_location()}: scalars given as a tensor are not supported; give a list of "
                "numbers"
            )
        if name in _SCALARS_TENSOR and len(args) > 2:  # (the tensor methods take it as ``value=``)
            args, kwargs = args[:2], {**kwargs, "value": args[2]}
        for i, tensor in enumerate(tensors):
            picked = {k: v[i] if isinstance(v, (list, tuple)) else v for k, v in kwargs.items()}
            method(tensor, *(a[i] if isinstance(a, (list, tuple)) else a for a in args), **picked)

    foreach.__name__ = foreach.__qualname__ = name
    return foreach


def _register() -> None:
    for name in dir(torch):
        if not (name.startswith("_foreach_") and name.endswith("_")):
            continue
        method = TORCH_TO_LTORCH.get(getattr(torch.Tensor, name.removeprefix("_foreach_"), None))
        if method is not None:
            fn = getattr(torch, name)
            TORCH_TO_LTORCH[fn] = _per_tensor(name, method)
            MUTATING.add(fn)


_register()
