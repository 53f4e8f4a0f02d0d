"""ltorch: the torch language. Each ``@torchsymbol`` function is a composite symbol whose body is
its decomposition into clang helpers and prims, one family of ops per file.

The torch callables a symbol stands for are listed in its decorator; the first is also what the
torch executor runs when it claims the symbol whole, so an ltorch function takes exactly the
arguments of that torch callable.
"""

import functools
from typing import TYPE_CHECKING

from thunder_rs import _core
from thunder_rs.core.langctx import PROPERTY_TO_LTORCH, TORCH_TO_LTORCH
from thunder_rs.core.recorder import KERNEL_IDS, record_composite, record_kernel

if TYPE_CHECKING:
    # ``ltorch.<name>`` is set from the registry at import (``_export_symbols``), which type
    # checkers cannot follow.
    # Unannotated on purpose: an annotated return type is left unanalyzed by mypy inside the
    # ltorch import cycle (python/mypy#5345), whereas an unannotated one is plain Any.
    def __getattr__(name): ...

#: Every ltorch symbol, in registration order.
SYMBOLS: list = []


def register(symbol, sym_id: int, sym_name: str, torch_fns: tuple, *, properties: tuple[str, ...] = (),
             sequence: bool = False, opaque: bool = False):
    """Makes ``symbol`` ``ltorch.<name>`` for ``torch_fns`` (and tensor ``properties``): the one
    registry the language context, the namespace and the torch executor read. ``sequence``: the
    op returns a sequence of tensors (``unbind``), which may hold just one; ``opaque``: it has no
    decomposition (``torch/linalg_opaque.py``)."""
    symbol.symbol_id, symbol.symbol_name, symbol.torch_fns = sym_id, sym_name, torch_fns
    symbol.returns_sequence, symbol.opaque = sequence, opaque
    for torch_fn in torch_fns:
        TORCH_TO_LTORCH[torch_fn] = symbol
    for prop in properties:
        PROPERTY_TO_LTORCH[prop] = symbol
    SYMBOLS.append(symbol)
    return symbol


def torchsymbol(*torch_fns, name: str | None = None, properties: tuple[str, ...] = (), sequence: bool = False,
                meta=None):
    """Registers the decorated decomposition as ``ltorch.<name>`` for ``torch_fns`` (see ``register``).
    A kernel (``kernels.py``) gives ``meta``, which describes its outputs as ``(shape, dtype)``
    pairs (or returns None to have the decomposition recorded), so that it can be recorded
    whole (``record_kernel``)."""

    def decorate(fn):
        sym_name = f"ltorch.{name or fn.__name__}"
        sym_id = _core.register_symbol(sym_name)

        if meta is None:
            @functools.wraps(fn)
            def symbol(*args, **kwargs):
                return record_composite(sym_id, sym_name, fn, args, kwargs)
        else:
            KERNEL_IDS.add(sym_id)

            @functools.wraps(fn)
            def symbol(*args, **kwargs):
                return record_kernel(sym_id, sym_name, fn, meta, args, kwargs)

        return register(symbol, sym_id, sym_name, torch_fns, properties=properties, sequence=sequence)

    return decorate


from thunder_rs.torch.elementwise import *  # noqa: E402,F401,F403
from thunder_rs.torch.reductions import *  # noqa: E402,F401,F403
from thunder_rs.torch.scan import *  # noqa: E402,F401,F403
from thunder_rs.torch.conv import *  # noqa: E402,F401,F403
from thunder_rs.torch.creation import *  # noqa: E402,F401,F403
from thunder_rs.torch.shape import *  # noqa: E402,F401,F403
from thunder_rs.torch.indexing import *  # noqa: E402,F401,F403
from thunder_rs.torch.nn import *  # noqa: E402,F401,F403
from thunder_rs.torch.linalg import *  # noqa: E402,F401,F403
from thunder_rs.torch.pooling import *  # noqa: E402,F401,F403
from thunder_rs.torch.interpolate import *  # noqa: E402,F401,F403
from thunder_rs.torch.autograd import *  # noqa: E402,F401,F403
from thunder_rs.torch.random import *  # noqa: E402,F401,F403
from thunder_rs.torch.special import *  # noqa: E402,F401,F403
from thunder_rs.torch.activations import *  # noqa: E402,F401,F403
from thunder_rs.torch.losses import *  # noqa: E402,F401,F403
from thunder_rs.torch import kernels  # noqa: E402,F401
from thunder_rs.torch import grads  # noqa: E402,F401
from thunder_rs.torch import grads_elementwise  # noqa: E402,F401
from thunder_rs.torch.views import *  # noqa: E402,F401,F403
from thunder_rs.torch.padding import *  # noqa: E402,F401,F403
from thunder_rs.torch.arrange import *  # noqa: E402,F401,F403
from thunder_rs.torch.diagonals import *  # noqa: E402,F401,F403
from thunder_rs.torch.copies import *  # noqa: E402,F401,F403
from thunder_rs.torch.scatter import *  # noqa: E402,F401,F403
from thunder_rs.torch import inplace  # noqa: E402,F401


def _export_symbols() -> None:
    """``ltorch.<name>`` for every registered symbol: the namespace is built from the registry,
    so no list of names can leave a symbol out (``ltorch.add``, ``ltorch.float``)."""
    for symbol in SYMBOLS:
        globals()[symbol.symbol_name.removeprefix("ltorch.")] = symbol


_export_symbols()

from thunder_rs.torch.linalg_opaque import *  # noqa: E402,F401,F403
from thunder_rs.torch.creation_extra import *  # noqa: E402,F401,F403
from thunder_rs.torch.products import *  # noqa: E402,F401,F403
from thunder_rs.torch.norms import *  # noqa: E402,F401,F403
from thunder_rs.torch import norms_grads  # noqa: E402,F401
from thunder_rs.torch.statistics import *  # noqa: E402,F401,F403
from thunder_rs.torch import statistics_grads  # noqa: E402,F401
from thunder_rs.torch.normalization import *  # noqa: E402,F401,F403
from thunder_rs.torch.layers import *  # noqa: E402,F401,F403
from thunder_rs.torch.sampling import *  # noqa: E402,F401,F403
from thunder_rs.torch import pool_kernels, cnn_grads  # noqa: E402,F401
