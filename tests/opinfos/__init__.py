"""The OpInfo table: every op thunder_rs must compute exactly as eager PyTorch does, one family per module.

`tests/test_ops.py` walks `OPINFOS`. To add an op, add one entry to its family's `OPS` list.
"""

from . import (
    activations,
    arrange,
    autograd,
    complex_values,
    conv,
    creation,
    creation_extra,
    elementwise,
    indexing,
    interpolate,
    layers,
    linalg,
    linalg_opaque,
    losses,
    nn,
    normalization,
    norms,
    padding,
    pooling,
    products,
    random,
    reductions,
    scan,
    scatter,
    shape,
    special,
    spectral,
    statistics,
)
from .core import ErrorInput, OpInfo, SampleInput, Tolerance

OPINFOS: list[OpInfo] = [
    *elementwise.OPS,
    *reductions.OPS,
    *scan.OPS,
    *shape.OPS,
    *indexing.OPS,
    *creation.OPS,
    *linalg.OPS,
    *linalg_opaque.OPS,
    *products.OPS,
    *creation_extra.OPS,
    *norms.OPS,
    *statistics.OPS,
    *nn.OPS,
    *conv.OPS,
    *random.OPS,
    *padding.OPS,
    *arrange.OPS,
    *scatter.OPS,
    *special.OPS,
    *spectral.OPS,
    *activations.OPS,
    *losses.OPS,
    *pooling.OPS,
    *interpolate.OPS,
    *normalization.OPS,
    *layers.OPS,
    *autograd.OPS,
    *complex_values.OPS,
]

_ids = [op.id for op in OPINFOS]
assert len(_ids) == len(set(_ids)), f"duplicate OpInfo ids: {sorted({i for i in _ids if _ids.count(i) > 1})}"

__all__ = ["OPINFOS", "ErrorInput", "OpInfo", "SampleInput", "Tolerance"]
