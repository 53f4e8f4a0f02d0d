"""Ops whose answer to "which tensors does eager's autograd save?" is known without running them
again (``saved_versions``): the calls most programs write the results of in place
(``nn.ReLU(inplace=True)`` after a Linear, a convolution or a batch norm; ``out += identity``),
and the one-tensor aten ops, whose node saves their tensor, their result, both or neither as
``derivatives.yaml`` says (``saved_aten``: ``ONE_TENSOR_OPS``, and the Python functions that run
one of them, ``F.relu``, ``F.softmax``: ``WRAPPERS``; checked against eager by
``tests/test_saved_aten.py``).

Of the others only answers that no tensor, or no output, is saved are kept: an op here is never
taken to save more than eager does, and what an op saves of its arguments (conditional, through
views, or a cast copy under autocast) is still eager's own answer.
``tests/test_inplace_saved_versions.py`` checks every entry against that answer
(``saved_versions.eager_saves``). Except for the ops whose eager kernel, and so what it saves,
depends on the device and its libraries, which a run on meta or CPU tensors does not choose as
eager does (``SAVES_EVERY_TENSOR_ON_CUDA``), or which torch chooses by their metadata and switches
(``KERNEL_CHOICES``: attention)."""

import types

import torch
import torch.nn.functional as F

from thunder_rs.core.lang import saved_aten

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

#: Ops whose eager kernel depends on the device: cuDNN's RNNs (``_VF.lstm`` on CUDA) save their
#: input, weights, states and output. They are taken to save every tensor they take and return: a
#: write to one of them raises eager's error at the backward.
SAVES_EVERY_TENSOR_ON_CUDA = frozenset({torch._VF.lstm, torch._VF.gru, torch._VF.rnn_tanh, torch._VF.rnn_relu})

#: Ops whose eager kernel, and so what it saves, torch chooses by the tensors' device, dtype and
#: layout, and its switches: ``{op: (choose, composite)}``. ``choose(*args, **kwargs)`` (tensors as
#: ``saved_versions`` describes them) says whether eager runs a fused kernel, taken to save every
#: tensor it takes and returns (fused attention, CPU's flash kernel and CUDA's, saves the query,
#: key, value, mask and output), or its composite (False), which a run again answers for under
#: ``composite(fused)`` (attention's math path saves a scaled copy of the query, and the value; a run
#: of small CPU tensors under the fused kernel says which views of them it saves). None, or a
#: failure, is taken as fused: an error where eager's might not raise, never another gradient.
#: Registered by the layer that knows the kernels (``thunder_rs.torch.fused_attention``).
KERNEL_CHOICES: dict = {}

#: Of ``KERNEL_CHOICES``' ops: ``{op: node(*args, **kwargs)}``, for a call on CUDA that runs a fused
#: kernel, ``(the name eager's error gives its autograd node, how many elements it pads the last dim
#: of its tensors by)``: a kernel that pads (flash attention's head size, to a multiple of 8) saves
#: copies of its inputs and its output whole, of which the call returns a view. None where unknown.
KERNEL_NODES: dict = {}


def kernel_node(func, arguments: tuple, fused: bool) -> tuple | None:
    """``KERNEL_NODES``' answer for a call on CUDA of ``func`` of ``arguments`` (``(args, kwargs)``)
    that runs a fused kernel (``fused``), else None."""
    node = KERNEL_NODES.get(func)
    if node is None or not fused:
        return None
    args, kwargs = arguments
    try:
        return node(*args, **kwargs)
    except Exception:  # noqa: BLE001 (no answer: the kernel's tensors taken as saved, its node unnamed)
        return None


def _one_tensor_ops() -> dict:
    """``{torch function: (saves its tensor, saves its result)}`` of the functions bound to one
    of ``saved_aten``'s ops (torch's, ``Tensor``'s, ``torch.special``'s, ``torch.linalg``'s and
    ``torch.nn.functional``'s builtins of the name; in-place variants, see ``saved_aten``)."""
    table: dict = {}
    kinds = (types.BuiltinFunctionType, types.MethodDescriptorType)
    owners = [getattr(torch._C, owner) for owner in ("_VariableFunctions", "TensorBase", "_nn", "_special", "_linalg")]
    groups = (
        (saved_aten.SAVES_NONE, (False, False)),
        (saved_aten.SAVES_SELF, (True, False)),
        (saved_aten.SAVES_RESULT, (False, True)),
        (saved_aten.SAVES_SELF_AND_RESULT, (True, True)),
    )
    for names, saves in groups:
        for name in names:
            variants = (name, f"{name}_") if not saves[0] else (name,)
            for owner in owners:
                for variant in variants:
                    func = getattr(owner, variant, None)
                    if isinstance(func, kinds):
                        table[func] = saves
    return table


#: Ops that take one tensor and return one: ``(saves its tensor, saves its result)`` as eager's node
#: does (``saved_aten``), whichever of them a write reaches.
ONE_TENSOR_OPS = _one_tensor_ops()


def _wrappers() -> dict:
    """``{function: (saves, saves in place or None, position of its ``inplace`` argument or None)}``
    of the Python functions (``torch.nn.functional``'s activations, softmax) and composite builtins
    whose call runs one of ``saved_aten``'s ops on its tensor, or its in-place variant where
    ``inplace`` is true (none where the functional op saves its tensor, as ``ONE_TENSOR_OPS``)."""
    saves = {
        name: flags
        for names, flags in (
            (saved_aten.SAVES_NONE, (False, False)),
            (saved_aten.SAVES_SELF, (True, False)),
            (saved_aten.SAVES_RESULT, (False, True)),
            (saved_aten.SAVES_SELF_AND_RESULT, (True, True)),
        )
        for name in names
    }
    wrapped = {
        F.relu: ("relu", 1),
        F.elu: ("elu", 2),
        F.celu: ("celu", 2),
        F.hardtanh: ("hardtanh", 3),
        F.hardsigmoid: ("hardsigmoid", 1),
        F.hardswish: ("hardswish", 1),
        F.leaky_relu: ("leaky_relu", 2),
        F.mish: ("mish", 1),
        F.silu: ("silu", 1),
        F.threshold: ("threshold", 3),
        F.sigmoid: ("sigmoid", None),
        F.tanh: ("tanh", None),
        F.glu: ("glu", None),
        # (a dtype casts the tensor first, autocast before the call: the result is saved either way)
        F.softmax: ("_softmax", None),
        F.softmin: ("_softmax", None),  # (of the tensor's negation, which saves nothing)
        F.log_softmax: ("_log_softmax", None),
        torch.softmax: ("_softmax", None),
        torch.log_softmax: ("_log_softmax", None),
        _T.softmax: ("_softmax", None),
        _T.log_softmax: ("_log_softmax", None),
    }
    return {func: (saves[name], None if saves[name][0] else saves[name], at) for func, (name, at) in wrapped.items()}


#: Functions that run one of ``ONE_TENSOR_OPS``'s ops on their one tensor (``wrapped_saves``).
WRAPPERS = _wrappers()


def wrapped_saves(func, args: tuple, kwargs: dict) -> tuple | None:
    """``(saves its tensor, saves its result)`` of a call of one of ``WRAPPERS`` (``ONE_TENSOR_OPS``'s
    answer for the op it runs); None for another function, or an ``inplace`` not a bool."""
    entry = WRAPPERS.get(func)
    if entry is None:
        return None
    saves, saves_in_place, at = entry
    if at is None:
        return saves
    inplace = kwargs.get("inplace", args[at] if len(args) > at else False)
    if type(inplace) is not bool:
        return None
    return saves_in_place if inplace else saves
