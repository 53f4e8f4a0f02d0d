"""``TensorProxy``: stands in for a tensor while a program is traced.

A wrapper subclass with real metadata (shape, dtype, device) and no storage, so ordinary
PyTorch code (``isinstance``, ``.shape``, ``torch.nn`` modules) runs on it unchanged. Every torch
call on it arrives at ``__torch_function__`` and goes to the language context; nothing may reach
``__torch_dispatch__``.
"""

import sys
import weakref
from operator import attrgetter
from typing import Callable

import torch

from thunder_rs.core.base.dtypes import DTYPES
from thunder_rs.core.base.userframe import user_location
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError

#: What torch calls on proxies mean; installed by ``thunder_rs.core.lang.langctx`` when it is imported.
_language_context = None
#: Makes a symbolic size (``_core.SymExpr``) the ``SymInt`` programs see; installed by
#: ``thunder_rs.core.lang.symint`` when it is imported.
_size: Callable = int  # replaced when symint is imported (always, by thunder_rs)
#: The texts of a shape's sizes for the code of a frame (installed with ``_size``).
_size_texts: Callable = lambda sizes, frame: map(str, sizes)  # noqa: E731


def set_language_context(torch_function) -> None:
    global _language_context
    _language_context = torch_function


def set_size_wrapper(wrap, texts) -> None:
    global _size, _size_texts
    _size, _size_texts = wrap, texts


def numel(shape):
    """The number of elements of a shape of ints and ``SymInt``s (symbolic when a size is)."""
    n = 1
    for s in shape:
        n = n * s
    return n


class SymbolicSize(tuple):
    """The ``torch.Size`` of a proxy with a symbolic size: ``numel()`` is the product of its
    sizes, symbolic where one is. torch's own reads each size as an int, which specialises it
    (torch's ``associative_scan`` tests ``result.shape.numel() > 0``: Mamba's batch stayed
    constant), and ``torch.Size`` cannot be subclassed. A tuple that the program sees as a
    ``torch.Size`` (``isinstance``, ``__class__``), whose slices, concatenations and repetitions
    stay one, as torch.Size's do; C code sees a tuple, which torch's argument parser takes as a
    size."""

    __slots__ = ()

    @property  # type: ignore[misc]
    def __class__(self):
        return torch.Size

    def numel(self):
        return numel(self)

    def __getitem__(self, key):
        item = tuple.__getitem__(self, key)
        return size_of(item) if type(key) is slice else item

    def __add__(self, other):
        joined = tuple.__add__(self, other)
        return size_of(joined) if type(joined) is tuple else joined

    def __mul__(self, n):
        return size_of(tuple.__mul__(self, n))

    __rmul__ = __mul__

    def __reduce__(self):
        return (SymbolicSize, (tuple(self),))

    def _thunder_type_read(self, site: str, exact: bool) -> None:
        """``type()`` of the shape read at ``site`` (``core.state.type_reads``): ``torch.Size`` in
        eager, which this tuple cannot be; where the read is surely of it, the compile fails (and
        takes the sizes constant)."""
        if exact:
            raise ThunderNotImplementedError(
                f"thunder_rs.jit: type() of a shape of symbolic sizes at {site} is torch.Size in eager, which the "
                "trace's stand-in for it cannot be: compiled with the sizes constant"
            )

    def __repr__(self):
        """Eager's text (the sizes' values) where the program makes it: ``str(x.shape)``,
        ``f"{x.shape}"``, a logging call's ``%s`` (``SymInt.__str__``); the expressions where
        thunder_rs does (its messages)."""
        return f"torch.Size([{', '.join(_size_texts(self, sys._getframe(1)))}])"


def size_of(sizes: tuple) -> "torch.Size | SymbolicSize":
    """A ``torch.Size`` of ``sizes``, a ``SymbolicSize`` where one is symbolic."""
    return torch.Size(sizes) if all(type(s) is int for s in sizes) else SymbolicSize(sizes)


#: ``read(source, name)``: the Python attribute ``name`` (``x.scale``) of the tensor a trace input
#: stands for (``TensorProxy._source``: the call's flat input at a position, or a tensor every call
#: takes), which the acquisition's observer guards (``state.observe``).
TENSOR_ATTRIBUTE_READS: list = [None]


_make_wrapper = torch.Tensor._make_wrapper_subclass


class TensorProxy(torch.Tensor):
    _vid: int
    _shape: torch.Size | SymbolicSize
    _dtype: torch.dtype
    _device: torch.device
    # Functionalisation state (``thunder_rs.torch.views``, ``thunder_rs.core.acquisition.writeback``); class
    # defaults, so that proxies no in-place op touches carry nothing.
    #: for a view: its ``ViewLink`` (root proxy, steps from the root, eager strides); a step
    #: with ``is_prim`` is the shape prim ``name`` with ``params`` after the tensor
    _view = None
    #: for a root that views were taken of: weak references to them
    _views = None
    #: for a root ``unsafe_split`` was taken of: weak references to its pieces, which share its
    #: memory apart from autograd (``torch.views.unsafe_pieces``)
    _pieces = None
    #: for such a piece: its ``PieceOf`` (the tensor split, and where in it)
    _piece_of = None
    #: for a trace input: the value id it had when made (it differs once the input is written)
    _input_vid: int | None = None
    #: for the copy a call makes of a tensor the program created from Python values
    #: (``recorder.Captures.proxy``): marked as an input for the writes to it, it is the call's own
    #: tensor, which nothing copies back (written whole, it keeps its layout as eager's does)
    _per_call: bool = False
    #: for a trace input standing for a leaf tensor that requires grad (in-place is an error)
    _leaf = False
    #: for a trace input: where each call finds its tensor, its position among the call's flat
    #: inputs or a weak reference to the tensor every call takes (a parameter, a captured tensor);
    #: None where calls take another (a tensor an argument object holds)
    _source: int | weakref.ref | None = None
    #: for a trace input: whether its tensor is an inference tensor, which every call's is (the
    #: cache key holds it, or the guard of a tensor an argument object holds)
    _inference: bool | None = None
    #: for a trace input standing for a view that requires grad: whether an op records a gradient
    #: through it. A call passes one no op records a gradient through detached: torch's autograd
    #: would ask for its history, which eager refuses to use once the base of a view made under
    #: ``no_grad`` or ``inference_mode`` (or of one of several views one op returned) is written
    #: in place, where the program only reads it (under ``no_grad``, ``detach()``)
    _view_grad: bool | None = None
    #: for such a view whose history eager refuses already: eager's error, which an op recording a
    #: gradient through it raises
    _history_error: str | None = None
    #: for a trace input whose tensor is not contiguous: its strides (views follow eager's)
    _strides: tuple[int, ...] | None = None
    #: for a trace input: where its tensor started in its storage when traced (a call's tensor may
    #: start elsewhere: only a decision that depends on it guards it, ``torch.offsets``)
    _offset: int = 0
    #: for a trace input given another tensor's memory by ``t.data = value`` (``torch.data_setter``):
    #: ``(source, source's value id, own value id, user's line)``, which the call gives it by ``.data =``
    _rebound: tuple | None = None
    #: for a tensor that requires grad given memory of other sizes or another dtype by
    #: ``t.data = value``: the user's line, an op recording a gradient into it after is refused
    #: (``core.lang.regrown``)
    _regrown: str | None = None
    #: for a view of a tensor taken before ``t.data = value`` gave the tensor other memory: the line
    #: of that assignment. It keeps the old values, as eager's keeps the old memory; a write to it
    #: (memory the trace no longer holds) is refused (``views.write``)
    _old_memory: str | None = None
    #: for a trace input that an argument object holds (``_source`` None): its
    #: ``reached.ArgumentTensor``, where each call's tensor is found
    _held = None
    #: for a root written through a view: the value ``views.rebase`` made it, which gives the
    #: write's gradient eager's layout
    _based_vid: int | None = None
    #: for a copy eager makes that the trace computes nothing for (``views.copy_of``)
    _copy_of = False
    #: for a tensor a factory made from sizes alone (``torch.zeros(n)``): eager's is contiguous, and
    #: stays so through in-place writes (``torch.inplace``)
    _made_contiguous = False
    #: whether a size of ``_shape`` is a ``SymInt`` (``core.lang.symint``)
    _symbolic = False
    #: for indices never negative (``nonzero``'s): indexing takes them without wrapping
    _nonnegative = False
    #: for a tensor the program registered hooks on (``core.lang.tensor_hooks``): ``(value id, Hooks)``,
    #: the value the hooks' call made, to which a further hook is added while it is still the tensor's
    _hooks: tuple | None = None

    @staticmethod
    def __new__(cls, vid: int, shape, dtype: torch.dtype, device: torch.device, requires_grad: bool):
        symbolic = not all(type(s) is int for s in shape)
        sizes = [_size(s) for s in shape] if symbolic else shape
        # A symbolic size is at its hint in torch's own metadata, which nothing of the program
        # reads: ``shape``, ``size()`` and ``numel()`` answer from ``_shape``.
        hints = [s if type(s) is int else s.hint for s in sizes] if symbolic else shape
        proxy = _make_wrapper(cls, hints, dtype=dtype, device=device, requires_grad=requires_grad)
        # Into the instance dict, as ``__setattr__`` would put these private names, without its
        # checks (a proxy is made per recorded tensor).
        attrs = proxy.__dict__
        attrs["_vid"] = vid
        attrs["_shape"] = SymbolicSize(sizes) if symbolic else torch.Size(sizes)
        if symbolic:
            attrs["_symbolic"] = True
        attrs["_dtype"] = dtype
        attrs["_device"] = device
        return proxy

    # Tracing reads these all the time: plain attributes answer without a trip through
    # __torch_function__ and the language context (and without a Python frame: a third of a
    # lambda's time; thousands of reads a compile).
    shape = property(attrgetter("_shape"))
    dtype = property(attrgetter("_dtype"))
    device = property(attrgetter("_device"))
    ndim = property(lambda self: len(self._shape))

    @property
    def grad(self):
        raise grad_error("reads")

    @grad.setter
    def grad(self, value):
        raise grad_error("sets")

    @property
    def is_leaf(self) -> bool:  # type: ignore[override]  # (an attribute in torch's stubs)
        """Eager's answer: a tensor that requires grad is a leaf only where it is an input that is one
        (the cache key tells them apart); an op's output that requires grad never is."""
        with torch._C.DisableTorchFunctionSubclass():
            return not self.requires_grad or self._leaf

    @property
    def grad_fn(self):
        """None where eager's is (a tensor that does not require grad, a leaf); any other tensor gets
        its autograd node when a compiled call runs, and none exists while it is traced."""
        if self.is_leaf:
            return None
        raise ThunderNotImplementedError(
            f"Tensor.grad_fn: read at {user_location()} on a traced tensor that requires grad and is not a leaf; "
            "its autograd node is made when a compiled call runs, and none exists while the program is traced"
        )

    @property
    def _base(self):
        raise call_state_error("_base", "whether a tensor is a view of another, and of which")

    @property
    def _version(self):
        raise call_state_error("_version", "the count of in-place writes to a tensor")

    def __getattr__(self, name: str):
        # (Only for a name neither the class nor the proxy has.) An argument's tensor may carry
        # Python attributes (``x.scale = 2.0``), which eager reads; a private name is thunder_rs's
        # or torch's own probe, which proxies answer as plain tensors do.
        source, read = self._source, TENSOR_ATTRIBUTE_READS[0]
        if name[0] == "_" or source is None or read is None:
            raise AttributeError(f"'Tensor' object has no attribute {name!r}")
        return read(source, name)

    def __setattr__(self, name: str, value) -> None:
        # A Python attribute the program sets on a tensor (``x.seen = True``) is on eager's tensor
        # after the call, which no compiled call sets; thunder_rs's own are private or declared
        # by its class (``BatchedProxy.physical``), torch's are the class's.
        kind = type(self)
        if name[0] != "_" and not hasattr(kind, name) and name not in kind.__annotations__:
            raise ThunderNotImplementedError(
                f"Tensor attribute: the program sets {name!r} on a traced tensor at {user_location()}; a compiled "
                "call does not set it on the tensor eager's would have it on (an argument, an output)"
            )
        super().__setattr__(name, value)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _language_context(func, args, kwargs or {})

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise ThunderRuntimeError(
            f"{func}: reached torch dispatch with a thunder_rs proxy; this call bypassed "
            "__torch_function__ and cannot be traced"
        )

    def __format__(self, format_spec: str) -> str:
        """As eager's: a 0-dim tensor formats its value (``f"expert_{idx[0]}"`` names a submodule
        by an index tensor, Switch Transformers' experts), read as ``item()`` reads it."""
        if self.ndim == 0:
            return format(self.item(), format_spec)
        return object.__format__(self, format_spec)

    def __repr__(self, *, tensor_contents=None):
        dims = ", ".join(str(d) for d in self.shape)
        return f'TensorProxy(t{self._vid}, "{self.device} {self.dtype}[{dims}]")'


def grad_error(what: str) -> ThunderNotImplementedError:
    return ThunderNotImplementedError(
        f"Tensor.grad: the program {what} the .grad of a tensor at {user_location()} while it is traced; a compiled "
        "call cannot read or set gradients (it would see those of the first call). Run what uses .grad (an "
        "optimizer step, zero_grad, gradient clipping) outside the jitted function, or pass the gradients as "
        "arguments"
    )


def call_state_error(name: str, what: str) -> ThunderNotImplementedError:
    """Eager's answer to ``Tensor.<name>`` differs from call to call; no compiled call specialises on it."""
    return ThunderNotImplementedError(
        f"Tensor.{name}: read at {user_location()} on a traced tensor; a compiled call does not specialise on "
        f"{what}, so the value could be another call's"
    )


_devices: dict[str, torch.device] = {}
_REQUIRES_GRAD = torch._C.TensorBase.__dict__["requires_grad"].__get__
_NO_SUBCLASS = torch._C.DisableTorchFunctionSubclass


def requires_grad_of(t) -> bool:
    """``t.requires_grad``, for a proxy read as its ``__torch_function__`` answers that metadata
    property (under ``DisableTorchFunctionSubclass``) without the trip there: some 10 µs, where
    the grad rules and the recorder read it for every operand of every op."""
    if type(t) is TensorProxy:
        with _NO_SUBCLASS():
            return _REQUIRES_GRAD(t)
    return t.requires_grad


def numel_of(t):
    """``t.numel()``, for a proxy the product of its sizes (symbolic where one is), as its
    ``__torch_function__`` answers, without the trip there."""
    return numel(t._shape) if type(t) is TensorProxy else t.numel()


def make_proxy(vid: int, shape, dtype_code: int, device: str, requires_grad: bool) -> TensorProxy:
    dev = _devices.get(device)
    if dev is None:
        dev = _devices[device] = torch.device(device)
    return TensorProxy(vid, shape, DTYPES[dtype_code], dev, requires_grad)
