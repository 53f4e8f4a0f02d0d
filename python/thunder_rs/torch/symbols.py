"""How an ltorch symbol is declared: ``@torchsymbol`` and ``register`` record it in core's registry
(``core.langctx``: ``SYMBOLS``, ``TORCH_TO_LTORCH``) and in ``ltorch``, the namespace the op
families call each other's symbols through (``ltorch.sum``).

The families import this module, not the package: the package imports every family, so a family
importing the package would close an import cycle.
"""

import functools
import types

import torch

from thunder_rs import _core
from thunder_rs.core.base import dtypes
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.langctx import PROPERTY_TO_LTORCH, SYMBOLS, TORCH_TO_LTORCH
from thunder_rs.core.lang.devices import indexed, refuse_pinned
from thunder_rs.core.lang.eager_layouts import LAYOUT_RULES
from thunder_rs.core.lang.recorder import ELEMENTWISE_KERNEL_IDS, KERNEL_IDS, record_composite, record_kernel
from thunder_rs.core.lang.symfloat import SymFloat
from thunder_rs.core.lang.symint import SymInt
from thunder_rs.errors import ThunderError
from thunder_rs.torch.layout_rules import RULES_BY_NAME

#: Every symbol as ``ltorch.<name>``, set as it is registered (``thunder_rs.torch`` exports the same).
ltorch = types.SimpleNamespace()


def register(
    symbol,
    sym_id: int,
    sym_name: str,
    torch_fns: tuple,
    *,
    properties: tuple[str, ...] = (),
    sequence: bool = False,
    opaque: bool = False,
):
    """Makes ``symbol`` ``ltorch.<name>`` for ``torch_fns`` (and tensor ``properties``): the one
    registry the language context, the namespace and the torch executor read. ``sequence``: the
    op returns a sequence of tensors (``unbind``), which may hold just one; ``opaque``: it has no
    decomposition (``factorizations.opaque``)."""
    symbol.symbol_id, symbol.symbol_name, symbol.torch_fns = sym_id, sym_name, torch_fns
    symbol.returns_sequence, symbol.opaque = sequence, opaque
    rule = RULES_BY_NAME.get(sym_name.removeprefix("ltorch."))
    for torch_fn in torch_fns:
        TORCH_TO_LTORCH[torch_fn] = symbol
    if rule is not None:  # by the torch callables, and the symbol for those mapped to it elsewhere
        LAYOUT_RULES.update(dict.fromkeys((*torch_fns, symbol), rule))
    for prop in properties:
        PROPERTY_TO_LTORCH[prop] = symbol
    SYMBOLS.append(symbol)
    setattr(ltorch, sym_name.removeprefix("ltorch."), symbol)
    return symbol


#: Errors of a decomposition that a symbolic int argument may cause (a check that wants a number,
#: a prim parameter that is one); any other error is the program's.
_SYMBOLIC_INT_ERRORS = (ThunderError, TypeError, AttributeError)


def _or_specialised(record, *params):
    """``record(*params)`` (its last two: the call's args and kwargs); where that fails with a
    symbolic int among the arguments (a size the program computed, ``x.shape[1] // 2``), the call
    again with them specialised (``int()`` records the guard): a decomposition that takes no
    symbolic int for an argument costs a compile per value, not every size's compile (an error
    out of a symbolic compile turns symbolic compiles off for the whole function). Where the
    call fails again, that error is raised, the one a static compile raises."""
    try:
        return record(*params)
    except _SYMBOLIC_INT_ERRORS:
        *head, args, kwargs = params
        ints = _specialised((args, kwargs))
        if ints is None:
            raise
    return record(*head, *ints)


def _specialised(call):
    """``(args, kwargs)`` with their symbolic ints (and those in tuples and lists) as ints, or None
    where they hold none."""
    found = False

    def plain(x):
        nonlocal found
        if type(x) is SymInt:
            found = True
            return int(x)
        if type(x) is SymFloat:
            found = True
            return float(x)
        if type(x) in (tuple, list):
            return type(x)(map(plain, x))
        return x

    args, kwargs = call
    out = tuple(map(plain, args)), {k: plain(v) for k, v in kwargs.items()}
    return out if found else None


def _number_read(x):
    """``x`` as eager's argument parser reads a tensor given for an int or a number: of a 0-d tensor
    or a one-element integer one, its value (``item()``, checked on each call: ``core.values``)."""
    if isinstance(x, TensorProxy) and (x.ndim == 0 or (dtypes.is_int(x.dtype) and x.numel() == 1)):
        return x.item()
    if type(x) in (tuple, list):
        return type(x)(map(_number_read, x))
    return x


def read_numbers(args: tuple, kwargs: dict, start: int) -> tuple[tuple, dict]:
    """``args`` from ``start`` on and ``kwargs`` with the tensors read that eager reads as numbers
    (``x.view(b, chunks + 1, w)``, ``torch.arange(chunks)`` of ``chunks = torch.div(seq_len, w) - 1``
    in Longformer). Read before the symbol is recorded, so that the reads sit at the trace's top
    level, where a compiled call checks them."""
    read = tuple(map(_number_read, args[start:]))
    return (*args[:start], *read), {k: _number_read(v) for k, v in kwargs.items()}


def _unindexed_cuda(x) -> bool:
    return (type(x) is str and x == "cuda") or (type(x) is torch.device and x.type == "cuda" and x.index is None)


def _index_of_current(x):
    if not _unindexed_cuda(x):
        return x
    device = indexed(torch.device(x))
    return str(device) if type(x) is str else device


def indexed_devices(name: str, args: tuple, kwargs: dict, cuda_device_at: int | None) -> tuple[tuple, dict]:
    """``args`` and ``kwargs`` with a CUDA device named without an index named with the current
    device's (``devices.indexed``), and a ``device`` at ``cuda_device_at`` left ``None`` named so
    (``Tensor.cuda()``'s): a compiled call puts its tensors where the trace did, whatever device is
    current when it runs (the program may have chosen another one by then: ``set_device``). A
    call of ``name`` pinning memory is refused (``devices.refuse_pinned``)."""
    if kwargs.get("pin_memory"):
        refuse_pinned(f"{name}(pin_memory=True)")
    if cuda_device_at is not None:
        if len(args) > cuda_device_at:
            if args[cuda_device_at] is None:
                args = (*args[:cuda_device_at], "cuda", *args[cuda_device_at + 1 :])
        elif kwargs.get("device") is None:
            kwargs = {**kwargs, "device": "cuda"}
    if any(map(_unindexed_cuda, args)) or any(map(_unindexed_cuda, kwargs.values())):
        args = tuple(map(_index_of_current, args))
        kwargs = {k: _index_of_current(v) for k, v in kwargs.items()}
    return args, kwargs


def torchsymbol(
    *torch_fns,
    name: str | None = None,
    properties: tuple[str, ...] = (),
    sequence: bool = False,
    meta=None,
    reads_numbers_from: int | None = None,
    reads=None,
    cuda_device_at: int | None = None,
    elementwise: bool = False,
):
    """Registers the decorated decomposition as ``ltorch.<name>`` for ``torch_fns`` (see ``register``).
    A kernel (``layer_norms.native_layer_norm``) gives ``meta``, which describes its outputs as ``(shape, dtype)``
    pairs (or returns None to have the decomposition recorded), so that it can be recorded
    whole (``record_kernel``). ``reads_numbers_from``: the position from which the op takes sizes
    or numbers that may be given as tensors (``read_numbers``); ``reads(args, kwargs)``, instead, the
    arguments with such tensors read as the op's eager overload checks and reads them (``narrow``'s
    0-dim start, ``tensor_split``'s split points); ``cuda_device_at``: the position of a
    device that is the current CUDA device when left ``None`` (``indexed_devices``); ``elementwise``: the
    kernel (with ``meta``) computes each element from its operands' broadcast elements."""

    def decorate(fn):
        sym_name = f"ltorch.{name or fn.__name__}"
        sym_id = _core.register_symbol(sym_name)

        if meta is None:

            @functools.wraps(fn)
            def symbol(*args, **kwargs):
                if reads is not None:
                    args, kwargs = reads(args, kwargs)
                if reads_numbers_from is not None:
                    args, kwargs = read_numbers(args, kwargs, reads_numbers_from)
                args, kwargs = indexed_devices(sym_name, args, kwargs, cuda_device_at)
                return _or_specialised(record_composite, sym_id, sym_name, fn, args, kwargs)
        else:
            KERNEL_IDS.add(sym_id)
            if elementwise:
                ELEMENTWISE_KERNEL_IDS.add(sym_id)

            @functools.wraps(fn)
            def symbol(*args, **kwargs):
                args, kwargs = indexed_devices(sym_name, args, kwargs, cuda_device_at)
                return _or_specialised(record_kernel, sym_id, sym_name, fn, meta, args, kwargs)

        return register(symbol, sym_id, sym_name, torch_fns, properties=properties, sequence=sequence)

    return decorate
