"""The OpInfo table: every op thunder_rs must compute exactly as eager PyTorch does, one family per module.

`tests/test_ops.py` walks `OPINFOS`. To add an op, add one entry to its family's `OPS` list.
"""

from . import creation, elementwise, indexing, interpolate, layers, linalg, nn, normalization, pooling, reductions, shape
from .core import ErrorInput, OpInfo, SampleInput, Tolerance

OPINFOS: list[OpInfo] = [
    *elementwise.OPS,
    *reductions.OPS,
    *shape.OPS,
    *indexing.OPS,
    *creation.OPS,
    *linalg.OPS,
    *nn.OPS,
    *pooling.OPS,
    *interpolate.OPS,
    *normalization.OPS,
    *layers.OPS,
]

_ids = [op.id for op in OPINFOS]
assert len(_ids) == len(set(_ids)), f"duplicate OpInfo ids: {sorted({i for i in _ids if _ids.count(i) > 1})}"

__all__ = ["OPINFOS", "ErrorInput", "OpInfo", "SampleInput", "Tolerance"]
