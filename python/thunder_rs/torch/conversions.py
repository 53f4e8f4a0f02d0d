"""Dtype and device moves: ``Tensor.to``, ``Tensor.cuda``, ``type_as``, ``Tensor.type`` and
``Tensor.float()`` and its kin. A move to the tensor's own dtype and device returns the input
itself, so its composite dissolves from the trace; ``cuda`` without an index is the current CUDA
device (``devices.indexed``), as in eager.
"""

import torch

from thunder_rs import clang, prims
from thunder_rs.core.lang.devices import indexed
from thunder_rs.core.lang.eager_layouts import aliases_to
from thunder_rs.errors import (
    ThunderNotImplementedError,
    ThunderRuntimeError,
    ThunderTypeError,
    ThunderValueError,
    check,
)
from thunder_rs.torch.symbols import torchsymbol
from thunder_rs.torch.shape import clone

Tensor = torch.Tensor
__all__ = ["to", "cuda", "cpu", "type_as", "tensor_type"]


# -- dtype and device -----------------------------------------------------------------------------


def _device(op: str, device) -> torch.device:
    try:
        return indexed(torch.device(device))
    except (RuntimeError, TypeError) as e:
        raise ThunderRuntimeError(f"{op}: {e} (argument device)") from None


def _same_device(a, device: torch.device) -> bool:
    """Whether ``a`` is on ``device`` (an indexed one: eager moves a tensor on ``cuda:1`` that is
    sent to ``cuda`` while ``cuda:0`` is current)."""
    return device.type == a.device.type and device.index in (None, a.device.index)


def _parse_to(args, kwargs):
    """(device, dtype, copy) from the three forms of ``Tensor.to``."""
    kwargs = dict(kwargs)
    device, dtype, copy = kwargs.pop("device", None), kwargs.pop("dtype", None), kwargs.pop("copy", False)
    other = kwargs.pop("other", None)
    kwargs.pop("non_blocking", None)
    memory_format = kwargs.pop("memory_format", None)
    check(not kwargs, "ltorch.to", lambda: f"unexpected keyword arguments {sorted(kwargs)}", ThunderTypeError)
    args = list(args)
    if args and isinstance(args[0], torch.Tensor):
        other = args.pop(0)
    elif args and isinstance(args[0], torch.dtype):
        dtype = args.pop(0)
    elif args and (args[0] is None or isinstance(args[0], (str, int, torch.device))):
        device = args.pop(0)
        if args and (args[0] is None or isinstance(args[0], torch.dtype)):
            dtype = args.pop(0)
    check(len(args) <= 2, "ltorch.to", f"unexpected arguments {args!r}", ThunderTypeError)
    if len(args) == 2:
        copy = args[1]
    if other is not None:
        device, dtype = other.device, other.dtype
    return None if device is None else _device("ltorch.to", device), dtype, copy, memory_format


@torchsymbol(Tensor.to)
def to(a, *args, **kwargs):
    device, dtype, copy, memory_format = _parse_to(args, kwargs)
    out = a
    if dtype is not None and dtype != a.dtype:
        out = prims.convert_element_type(out, dtype)
    if device is not None and not _same_device(a, device):
        out = prims.device_put(out, device)
    if memory_format not in (None, torch.preserve_format) and (
        out is not a or copy or not aliases_to(a, memory_format)
    ):
        return clone(out, memory_format=memory_format)
    return clone(out) if copy and out is a else out


@torchsymbol(Tensor.cuda, cuda_device_at=1)
def cuda(a, device=None, non_blocking=False, memory_format=torch.preserve_format):
    """``Tensor.cuda()``: ``to`` the CUDA device named, the current one without an index, so the
    tensor itself when it is there already. ``non_blocking`` changes no value."""
    target = _device("ltorch.cuda", "cuda" if device is None else device)
    invalid = "Invalid device, must be cuda device (argument device)"
    check(target.type == "cuda", "ltorch.cuda", invalid, ThunderRuntimeError)
    return to(a, target, memory_format=memory_format)


@torchsymbol(Tensor.cpu)
def cpu(a, memory_format=torch.preserve_format):
    """``Tensor.cpu()``: ``to("cpu")``, so the tensor itself when it is on the CPU already (eager's
    alias: a write through either is seen by the other)."""
    return to(a, torch.device("cpu"), memory_format=memory_format)


@torchsymbol(Tensor.type_as)
def type_as(a, other):
    return clang.maybe_convert(a, other.dtype)


_TENSOR_TYPES = {
    "FloatTensor": torch.float32,
    "DoubleTensor": torch.float64,
    "HalfTensor": torch.float16,
    "BFloat16Tensor": torch.bfloat16,
    "ByteTensor": torch.uint8,
    "CharTensor": torch.int8,
    "ShortTensor": torch.int16,
    "IntTensor": torch.int32,
    "LongTensor": torch.int64,
    "BoolTensor": torch.bool,
}


def _type_name(a) -> str:
    name = next((n for n, d in _TENSOR_TYPES.items() if d == a.dtype), None)
    check(
        name is not None,
        "ltorch.type",
        f"no legacy tensor type name for {a.dtype} (argument a)",
        ThunderNotImplementedError,
    )
    return f"torch.cuda.{name}" if a.device.type == "cuda" else f"torch.{name}"


@torchsymbol(Tensor.type, name="type")
def tensor_type(a, dtype=None, non_blocking=False, **kwargs):
    """``Tensor.type``: the type name without ``dtype``, else a conversion (and device move for cuda types)."""
    if dtype is None:
        return _type_name(a)
    if not isinstance(dtype, (str, torch.dtype)):
        dtype = f"{dtype.__module__}.{dtype.__name__}"
    if isinstance(dtype, torch.dtype):
        return clang.maybe_convert(a, dtype)
    *prefix, name = dtype.split(".")
    check(
        name in _TENSOR_TYPES and prefix in (["torch"], ["torch", "cuda"]),
        "ltorch.type",
        f"invalid type: '{dtype}' (argument dtype)",
        ThunderValueError,
    )
    out = clang.maybe_convert(a, _TENSOR_TYPES[name])
    device = indexed(torch.device("cuda" if "cuda" in prefix else "cpu"))
    return out if _same_device(a, device) else prims.device_put(out, device)


def _define_conversion(method: str, dtype: torch.dtype):
    @torchsymbol(getattr(Tensor, method), name=method)
    def convert(a, memory_format=torch.preserve_format):
        """``a`` in ``dtype``: itself when it has it (eager's alias), or converted; laid out in
        ``memory_format`` where one is given, as ``to`` lays it out."""
        out = clang.maybe_convert(a, dtype)
        if memory_format not in (None, torch.preserve_format) and (out is not a or not aliases_to(a, memory_format)):
            return clone(out, memory_format=memory_format)
        return out

    return convert


#: ``Tensor.float()`` and friends, by method name. Not module globals: they would shadow builtins.
CONVERSIONS = {
    method: _define_conversion(method, dtype)
    for method, dtype in {
        "float": torch.float32,
        "double": torch.float64,
        "half": torch.float16,
        "bfloat16": torch.bfloat16,
        "int": torch.int32,
        "long": torch.int64,
        "short": torch.int16,
        "char": torch.int8,
        "byte": torch.uint8,
        "bool": torch.bool,
        "cfloat": torch.complex64,
        "cdouble": torch.complex128,
    }.items()
}
# A conversion's VJP rule (``convert_element_type``'s: the gradient converted back, a complex one
# of a real input its real part, as eager's ``_to_copy_backward``) holds for complex values.
CONVERSIONS["cfloat"].complex_grads = CONVERSIONS["cdouble"].complex_grads = True
