"""Ops whose answer to "which tensors does eager's autograd save?" is known without running them
again on meta tensors (``saved_versions``): the calls most programs write the results of in place
(``nn.ReLU(inplace=True)`` after a Linear, a convolution or a batch norm; ``out += identity``).

Only answers that no tensor, or no output, is saved are kept: an op here is never taken to save
more than eager does, and what an op saves of its arguments (conditional, through views, or a
cast copy under autocast) is still eager's own answer. ``tests/test_inplace_saved_versions.py``
checks every entry against that answer (``saved_versions.eager_saves``). Except for the ops whose
eager kernel, and so what it saves, depends on the device and its libraries, which a meta run
does not choose as eager does (``SAVES_EVERY_TENSOR``).
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

#: Ops whose eager kernel depends on the device: fused attention (CPU's flash kernel and CUDA's)
#: saves the query, key, value, mask and output where the meta run takes the math path, which saves
#: a scaled copy of the query and the value; cuDNN's RNNs (``_VF.lstm`` on CUDA) save their input,
#: weights, states and output. They are taken to save every tensor they take and return: a write
#: to one of them raises eager's error at the backward, also where eager's kernel would not have
#: saved it (the math path of attention: an error, never another gradient).
SAVES_EVERY_TENSOR = frozenset({F.scaled_dot_product_attention})
SAVES_EVERY_TENSOR_ON_CUDA = frozenset({torch._VF.lstm, torch._VF.gru, torch._VF.rnn_tanh, torch._VF.rnn_relu})
