"""Forwards that write their arguments while a program is traced: batch norm's running statistics
and embedding's ``max_norm`` renormalisation of ``weight``, ``inplace.assign``ed where autograd does
not see, as eager writes them under ``torch.no_grad()``."""

import itertools
import sys

import torch
import torch.nn.functional as F

from thunder_rs import clang
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.langctx import MUTATING, TORCH_TO_LTORCH, VALUE_READS
from thunder_rs.torch import batch_norms, layers, nn
from thunder_rs.torch.inplace import assign

#: nn.BatchNorm with ``momentum=None`` averages its running statistics over all batches so far,
#: with factor ``1.0 / float(self.num_batches_tracked)``: a value read from a buffer. That read is
#: answered with a stand-in number, and the factor it becomes is mapped back to the buffer here.
_count_factors: dict[float, TensorProxy] = {}
_stand_ins = itertools.count(1)
_COUNTING_FORWARDS = frozenset(
    cls.forward.__code__ for cls in (torch.nn.modules.batchnorm._BatchNorm, torch.nn.SyncBatchNorm)
)


def _batch_count(args):
    """``float(self.num_batches_tracked)`` in nn.BatchNorm's forward: a stand-in number, else None."""
    frame = sys._getframe(1)
    for _ in range(6):
        if frame is None or frame.f_code in _COUNTING_FORWARDS:
            break
        frame = frame.f_back
    if frame is None or frame.f_code not in _COUNTING_FORWARDS or not isinstance(args[0], TensorProxy):
        return None
    stand_in = float(2**52 + next(_stand_ins))
    _count_factors[1.0 / stand_in] = args[0]
    return stand_in


def _momentum(momentum):
    """``momentum`` as batch norm's update takes it: the cumulative factor 1 / count as a tensor."""
    count = _count_factors.pop(momentum, None) if isinstance(momentum, float) else None
    if count is None:
        return momentum
    return 1.0 / clang.maybe_convert(count, torch.float64)


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-05):
    """``F.batch_norm``: in training mode with running statistics, the output and the updated
    statistics, written into ``running_mean`` and ``running_var`` where autograd does not see."""
    momentum = _momentum(momentum)
    if not training or running_mean is None:
        return batch_norms.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    batch_norms.check_batch_norm("batch_norm", input, running_mean, running_var, weight, bias, training)
    batch_norms.check_stats_apart("batch_norm", running_mean, running_var)
    out, _, _, new_mean, new_var = batch_norms.native_batch_norm(
        input, weight, bias, running_mean, running_var, True, momentum, eps
    )
    assign(running_mean, new_mean, "batch_norm", tracked=False)
    assign(running_var, new_var, "batch_norm", tracked=False)
    return out


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False):
    """``F.embedding``: with ``max_norm``, the rows ``input`` references renormalised in ``weight``
    first, written where autograd does not see (eager's ``embedding_renorm_`` under
    ``torch.no_grad()``), then looked up; the gradient goes to ``weight`` as to eager's."""
    _renorm_rows(weight, input, max_norm, norm_type, "embedding(max_norm=)")
    return nn.embedding(input, weight, padding_idx, None, norm_type, scale_grad_by_freq, sparse)


def embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2, *args, **kwargs):
    """``F.embedding_bag``: with ``max_norm``, as ``embedding``, then the bags."""
    _renorm_rows(weight, input, max_norm, norm_type, "embedding_bag(max_norm=)")
    return layers.embedding_bag(input, weight, offsets, None, norm_type, *args, **kwargs)


def _renorm_rows(weight, indices, max_norm, norm_type, op: str) -> None:
    """Writes ``weight`` with the rows ``indices`` references renormalised, when ``max_norm`` is given."""
    if max_norm is not None:
        with torch.no_grad():
            value = nn.embedding_renorm(weight, indices, max_norm, norm_type)
        assign(weight, value, op, tracked=False, versioned=True)  # (eager's embedding_renorm_ bumps it)


def _register() -> None:
    for fn, handler in {F.batch_norm: batch_norm, F.embedding: embedding, F.embedding_bag: embedding_bag}.items():
        TORCH_TO_LTORCH[fn] = handler
        MUTATING.add(fn)
    VALUE_READS[torch.Tensor.__float__] = _batch_count


_register()
