"""Ops whose answer to "which tensors does eager's autograd save?" is known without running them
again on meta tensors (``saved_versions``): the calls most programs write the results of in place
(``nn.ReLU(inplace=True)`` after a Linear, a convolution or a batch norm; ``out += identity``).

Only answers that no tensor, or no output, is saved are kept: an op here is never taken to save
more than eager does, and what an op saves of its arguments (conditional, through views, or a
cast copy under autocast) is still eager's own answer. ``tests/test_inplace_saved_versions.py``
checks every entry against that answer (``saved_versions.eager_saves``).
"""

import torch
import torch.nn.functional as F

_T = torch.Tensor

#: Ops whose autograd nodes save none of the tensors they take or return (sizes, scalar types and
#: options only; dropout its own mask): a write to any of them leaves their backward valid.
SAVES_NOTHING = frozenset(
    {
        _T.__add__,
        _T.__radd__,
        _T.__iadd__,
        _T.__sub__,
        _T.__rsub__,
        _T.__isub__,
        _T.__neg__,
        _T.add,
        _T.add_,
        _T.sub,
        _T.sub_,
        _T.neg,
        torch.add,
        torch.sub,
        torch.neg,
        _T.view,
        _T.reshape,
        _T.flatten,
        _T.transpose,
        _T.permute,
        _T.unsqueeze,
        _T.squeeze,
        _T.contiguous,
        _T.clone,
        _T.expand,
        _T.float,
        _T.to,
        torch.reshape,
        torch.flatten,
        torch.transpose,
        torch.permute,
        torch.cat,
        torch.stack,
        torch.clone,
        F.dropout,
    }
)

#: Ops whose autograd nodes save none of the tensors they return (their arguments, or values of
#: their own such as a norm's mean and inverse deviation): a write to their output leaves their
#: backward valid.
SAVES_NO_OUTPUT = frozenset(
    {
        F.linear,
        torch.conv1d,
        torch.conv2d,
        torch.conv3d,
        F.conv_transpose1d,
        F.conv_transpose2d,
        F.batch_norm,
        F.layer_norm,
        F.group_norm,
        F.embedding,
        F.gelu,
        F.silu,
        _T.__mul__,
        _T.__rmul__,
        _T.mul,
        torch.mul,
        _T.__matmul__,
        torch.matmul,
        torch.mm,
        torch.bmm,
    }
)
