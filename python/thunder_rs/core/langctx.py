"""The torch language context: what a torch call on proxies means while tracing.

Calls with an ltorch mapping run that decomposition; real tensors they take alongside proxies
(captured from outside the program's inputs) become trace inputs; metadata queries answer from the proxy;
data-dependent calls (``bool(t)``, ``t.item()``) raise an error naming the user's line; anything
else becomes an eager fallback symbol. While a program is traced, ``LanguageMode`` also sends torch
calls that take no tensor at all (``torch.zeros(2, 3)``) to their ltorch symbols.
"""

import os
import traceback

import torch
from torch._C import DisableTorchFunctionSubclass
from torch.overrides import TorchFunctionMode

from thunder_rs.core.fallback import fallback
from thunder_rs.core.proxies import TensorProxy, set_language_context
from thunder_rs.core.recorder import lift_captured, reads_written_capture
from thunder_rs.errors import ThunderRuntimeError

#: torch callables (functions, methods, operators) -> ltorch symbols. Filled by ``@torchsymbol``.
TORCH_TO_LTORCH: dict = {}
#: Tensor property names (``T``, ``mT``) -> ltorch symbols.
PROPERTY_TO_LTORCH: dict = {}
#: torch callables that write a tensor argument in place (``thunder_rs.torch.inplace`` fills
#: it): while a program is traced they are traced even when they take captured tensors alone.
MUTATING: set = set()
#: Data-dependent reads some callers make in ways thunder_rs can follow: func -> a handler
#: returning the value to give instead, or None to raise as for any other data-dependent read.
VALUE_READS: dict = {}
#: What a call given ``out=`` means: ``handler(func, args, kwargs)``; set by ``thunder_rs.torch.inplace``.
_out_handler = None


def set_out_handler(handler) -> None:
    global _out_handler
    _out_handler = handler

_T = torch.Tensor
_METADATA_METHODS = {
    _T.size, _T.dim, _T.ndimension, _T.numel, _T.nelement, _T.stride, _T.is_contiguous,
    _T.is_floating_point, _T.is_complex, _T.element_size, _T.__len__, _T.__hash__,
    _T.get_device, _T.__format__, _T.__repr__, _T.storage_offset, _T.is_signed,
}
_METADATA_PROPERTIES = {
    "shape", "dtype", "device", "ndim", "requires_grad", "is_leaf", "grad_fn", "layout",
    "is_cuda", "is_cpu", "is_meta", "is_sparse", "is_quantized", "is_nested", "names", "grad",
    "_base", "is_mkldnn", "is_mps", "is_xpu", "itemsize", "nbytes", "output_nr", "_version",
}
_DATA_DEPENDENT = {
    _T.__bool__, _T.item, _T.tolist, _T.__int__, _T.__float__, _T.__index__, _T.__complex__,
    _T.numpy, _T.__array__, _T.data_ptr, _T.nonzero, torch.nonzero,
}
_PACKAGE_DIR = os.path.dirname(os.path.dirname(__file__))
_TORCH_DIR = os.path.dirname(torch.__file__)


def _property_name(func):
    """The property a ``getset_descriptor.__get__`` reads, or None for other callables."""
    if getattr(func, "__name__", None) != "__get__":
        return None
    return getattr(getattr(func, "__self__", None), "__name__", None)


def user_location() -> str:
    """``file:line`` of the innermost frame outside thunder_rs and torch."""
    for frame in reversed(traceback.extract_stack()):
        path = os.path.abspath(frame.filename)
        if not (path.startswith(_PACKAGE_DIR) or path.startswith(_TORCH_DIR) or "<frozen" in path):
            return f"{frame.filename}:{frame.lineno}"
    return "<unknown>"


def torch_function(func, args, kwargs):
    if kwargs and kwargs.get("out") is not None:
        return _out_handler(func, *lift_captured(args, kwargs))
    ltorch_fn = TORCH_TO_LTORCH.get(func)
    if ltorch_fn is not None:
        args, kwargs = lift_captured(args, kwargs)
        return ltorch_fn(*args, **kwargs)
    prop = _property_name(func)
    if prop is not None:
        if prop in _METADATA_PROPERTIES:
            with DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        ltorch_fn = PROPERTY_TO_LTORCH.get(prop)
        if ltorch_fn is not None:
            return ltorch_fn(*args)
    if func in _METADATA_METHODS:
        with DisableTorchFunctionSubclass():
            return func(*args, **kwargs)
    if func in _DATA_DEPENDENT:
        read = VALUE_READS.get(func)
        value = None if read is None else read(args)
        if value is not None:
            return value
        name = getattr(func, "__name__", str(func))
        raise ThunderRuntimeError(
            f"{name}: data-dependent control flow or value access on a traced tensor at "
            f"{user_location()}; thunder_rs specialises on shapes, not values"
        )
    return fallback(func, *lift_captured(args, kwargs))


def _takes_tensor(args, kwargs) -> bool:
    """Whether a call takes a tensor, directly or in a list (``torch.cat([a, b])``)."""
    for x in (*args, *kwargs.values()):
        if isinstance(x, torch.Tensor) or (type(x) in (list, tuple) and any(isinstance(y, torch.Tensor) for y in x)):
            return True
    return False


class LanguageMode(TorchFunctionMode):
    """Routes torch calls while a program is traced (``acquire`` enters it around the program).

    A call that takes no proxy never reaches ``TensorProxy.__torch_function__``, so creation ops
    (``torch.zeros(2, 3)``, ``torch.arange(n)``) reach their ltorch symbols here and give proxies.
    Calls on proxies go to ``torch_function``, as the proxy would send them, and so do in-place
    calls on captured tensors (their writes happen at every call) and calls that read a captured
    tensor after such a write; other calls on real tensors alone run eagerly, as before.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if TensorProxy in types or func in MUTATING or kwargs.get("out") is not None or reads_written_capture(args, kwargs):
            return torch_function(func, args, kwargs)
        ltorch_fn = TORCH_TO_LTORCH.get(func)
        if ltorch_fn is not None and not _takes_tensor(args, kwargs):
            return ltorch_fn(*args, **kwargs)
        return func(*args, **kwargs)


set_language_context(torch_function)
