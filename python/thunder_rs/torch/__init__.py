"""ltorch: the torch language. Each ``@torchsymbol`` function is a composite symbol whose body is
its decomposition into clang helpers and prims, one family of ops per file: beside each op its
grad rule (``register_grad``) and the backward kernels of eager's autograd it calls, so that an
op, its decomposition, its gradient and its kernels read in one file. Helpers several families
share are ``common.py``'s.

The torch callables a symbol stands for are listed in its decorator; the first is also what the
torch executor runs when it claims the symbol whole, so an ltorch function takes exactly the
arguments of that torch callable.
"""

from typing import TYPE_CHECKING

from thunder_rs.core.lang.langctx import SYMBOLS
from thunder_rs.torch.symbols import register, torchsymbol  # noqa: F401 (the package's API)

if TYPE_CHECKING:
    # ``ltorch.<name>`` is set from the registry at import (``_export_symbols``), which type
    # checkers cannot follow.
    # Unannotated on purpose: an annotated return type is left unanalyzed by mypy inside the
    # ltorch import cycle (python/mypy#5345), whereas an unannotated one is plain Any.
    def __getattr__(name): ...


from thunder_rs.torch.elementwise import *  # noqa: E402,F401,F403
from thunder_rs.torch.reductions import *  # noqa: E402,F401,F403
from thunder_rs.torch.scan import *  # noqa: E402,F401,F403
from thunder_rs.torch.conv import *  # noqa: E402,F401,F403
from thunder_rs.torch.creation import *  # noqa: E402,F401,F403
from thunder_rs.torch.shape import *  # noqa: E402,F401,F403
from thunder_rs.torch.joins import *  # noqa: E402,F401,F403
from thunder_rs.torch.conversions import *  # noqa: E402,F401,F403
from thunder_rs.torch.indexing import *  # noqa: E402,F401,F403
from thunder_rs.torch.gathers import *  # noqa: E402,F401,F403
from thunder_rs.torch.linalg import *  # noqa: E402,F401,F403
from thunder_rs.torch.factorizations import *  # noqa: E402,F401,F403
from thunder_rs.torch.spectral import *  # noqa: E402,F401,F403
from thunder_rs.torch.nn import *  # noqa: E402,F401,F403
from thunder_rs.torch.layer_norms import *  # noqa: E402,F401,F403
from thunder_rs.torch.batch_norms import *  # noqa: E402,F401,F403
from thunder_rs.torch.base_losses import *  # noqa: E402,F401,F403
from thunder_rs.torch.attention import *  # noqa: E402,F401,F403
from thunder_rs.torch.multihead_attention import *  # noqa: E402,F401,F403
from thunder_rs.torch.pooling import *  # noqa: E402,F401,F403
from thunder_rs.torch.unpooling import *  # noqa: E402,F401,F403
from thunder_rs.torch.adaptive_pooling import *  # noqa: E402,F401,F403
from thunder_rs.torch.sliding_blocks import *  # noqa: E402,F401,F403
from thunder_rs.torch.interpolate import *  # noqa: E402,F401,F403
from thunder_rs.torch.autograd import *  # noqa: E402,F401,F403
from thunder_rs.torch.random import *  # noqa: E402,F401,F403
from thunder_rs.torch.special import *  # noqa: E402,F401,F403
from thunder_rs.torch.incomplete_gamma import *  # noqa: E402,F401,F403
from thunder_rs.torch.predicates import *  # noqa: E402,F401,F403
from thunder_rs.torch.activations import *  # noqa: E402,F401,F403
from thunder_rs.torch.distances import *  # noqa: E402,F401,F403
from thunder_rs.torch.losses import *  # noqa: E402,F401,F403
from thunder_rs.torch.margin_losses import *  # noqa: E402,F401,F403
from thunder_rs.torch.label_losses import *  # noqa: E402,F401,F403
from thunder_rs.torch.view_scatters import *  # noqa: E402,F401,F403
from thunder_rs.torch import views  # noqa: E402,F401
from thunder_rs.torch import view_ops  # noqa: E402,F401 (registers the view ops views.py links)
from thunder_rs.torch import batching, nn_batching  # noqa: E402,F401 (torch.vmap's batching rules)
from thunder_rs.torch.padding import *  # noqa: E402,F401,F403
from thunder_rs.torch.arrange import *  # noqa: E402,F401,F403
from thunder_rs.torch.diagonals import *  # noqa: E402,F401,F403
from thunder_rs.torch.copies import *  # noqa: E402,F401,F403
from thunder_rs.torch.scatter import *  # noqa: E402,F401,F403
from thunder_rs.torch.index_scatter import *  # noqa: E402,F401,F403
from thunder_rs.torch.masked_index import *  # noqa: E402,F401,F403
from thunder_rs.torch import contiguous_writes  # noqa: E402,F401
from thunder_rs.torch import inplace  # noqa: E402,F401
from thunder_rs.torch import forward_writes, setitem  # noqa: E402,F401 (register with inplace.assign)
from thunder_rs.torch.complex_values import *  # noqa: E402,F401,F403
from thunder_rs.torch import underived  # noqa: E402,F401 (wraps the mappings above: imported last)


def _export_symbols() -> None:
    """``ltorch.<name>`` for every registered symbol: the namespace is built from the registry,
    so no list of names can leave a symbol out (``ltorch.add``, ``ltorch.float``)."""
    for symbol in SYMBOLS:
        globals()[symbol.symbol_name.removeprefix("ltorch.")] = symbol


_export_symbols()

from thunder_rs.torch.products import *  # noqa: E402,F401,F403
from thunder_rs.torch.einsum import *  # noqa: E402,F401,F403
from thunder_rs.torch.norms import *  # noqa: E402,F401,F403
from thunder_rs.torch.statistics import *  # noqa: E402,F401,F403
from thunder_rs.torch.finite_differences import *  # noqa: E402,F401,F403
from thunder_rs.torch.combinations import *  # noqa: E402,F401,F403
from thunder_rs.torch.tensor_linalg import *  # noqa: E402,F401,F403
from thunder_rs.torch.nonzero_static import *  # noqa: E402,F401,F403
from thunder_rs.torch.normalization import *  # noqa: E402,F401,F403
from thunder_rs.torch.layers import *  # noqa: E402,F401,F403
from thunder_rs.torch.sampling import *  # noqa: E402,F401,F403
from thunder_rs.torch.grid_samplers import *  # noqa: E402,F401,F403
from thunder_rs.torch.fft_shifts import *  # noqa: E402,F401,F403
from thunder_rs.torch.fourier import *  # noqa: E402,F401,F403
from thunder_rs.torch.segment_reductions import *  # noqa: E402,F401,F403
from thunder_rs.torch.fractional_pooling import *  # noqa: E402,F401,F403
from thunder_rs.torch.histograms import *  # noqa: E402,F401,F403
from thunder_rs.torch.lowrank import *  # noqa: E402,F401,F403
from thunder_rs.torch.aten_resizes import *  # noqa: E402,F401,F403
from thunder_rs.torch import written_arguments  # noqa: E402,F401
from thunder_rs.torch import foreach  # noqa: E402,F401
from thunder_rs.torch import amp  # noqa: E402,F401
from thunder_rs.torch import data_setter  # noqa: E402,F401
from thunder_rs.torch import transformer_fast_paths  # noqa: E402,F401
