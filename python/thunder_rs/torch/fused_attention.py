"""Differentiated attention on CUDA as eager runs it: the fused kernel torch's dispatcher chooses
(flash, memory-efficient or cuDNN), forward and backward.

Eager's ``scaled_dot_product_attention`` is a composite: it asks ``_fused_sdp_choice`` which
backend runs the call, prepares the inputs for that backend (flash pads the head size to a
multiple of 8; the others turn a bool mask into an additive one, memory-efficient aligns and
expands it), and calls one fused kernel; autograd then runs that kernel's backward on what the
forward returned (its output, the logsumexp of each row, the philox seed and offset of its
dropout). The grad rule does the same at trace time:

- ``fused_sdp_choice`` is torch's answer for the call: eager's composite run on fake CUDA
  tensors with the proxies' metadata (eager strides included), under a dispatch mode that sees
  which fused kernel it calls. The composite asks the CUDA ``select_sdp_backend`` as it does for
  eager: the device's capabilities, the cuDNN version, ``torch.backends.cuda``'s switches,
  ``sdpa_kernel`` and the priority order all decide. Without a GPU, torch finds no fused kernel
  available and takes the math path, as eager would. The switches are guarded
  (``core.sdp_state``): a changed switch compiles again. The fake tensors start where eager's
  start in their storage (``storage_offsets``: the memory-efficient kernel refuses q, k, v off a
  16-byte boundary), and where the choice depends on where a call's input starts, which the
  cache key leaves out, the entry guards it (``guard_offsets``).
- The chosen kernel and its backward are recorded, so the trace holds no [B, H, L, S] matrix
  where eager holds none. Where torch chooses the math path, ``fused_attention`` returns None and
  the rule differentiates thunder_rs's decomposition.

The kernels are opaque symbols (no decomposition, run by the torch executor as one aten call),
with meta rules written from torch's meta registrations (``tests/test_attention_kernels.py``
checks them against torch's). Their philox seed and offset are residuals no pass looks at; their
device in the trace is the query's, whatever the kernel puts them on. A forward with dropout
draws from the CUDA generator inside the kernel: it is recorded as an effect (never removed,
merged, moved or recomputed), so it draws in program order as eager's does, and its backward
replays those draws from the seed and offset it returned.
"""

import math

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from thunder_rs.torch.symbols import ltorch
from thunder_rs.torch.layout_rules import FUSED_ATTENTION_STRIDES
from thunder_rs.core.lang import sdp_state, symfloat
from thunder_rs.core.lang.saved_ops import KERNEL_CHOICES, KERNEL_NODES
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.symint import SymInt, at_sizes, hint
from thunder_rs.core.state.observe import check_sizes
from thunder_rs.core.state.offsets import can_guard, guard_offset
from thunder_rs.core.lang.dual_tensors import NO_FORWARD_AD
from thunder_rs.core.lang.langctx import user_location
from thunder_rs.core.lang.grad import get_grad, put_grad
from thunder_rs.errors import ThunderError, ThunderNotImplementedError, thunder_error_like
from thunder_rs.torch.common import OpaqueKernel, cast, sum_to
from thunder_rs.torch.storage_offsets import eager_offset, input_root
from thunder_rs.torch.strides import contiguous_strides, strides_of

SDPBackend = torch.nn.attention.SDPBackend
MATH, FLASH, EFFICIENT, CUDNN = (
    b.value
    for b in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION)
)

#: What eager's composite fills the False places of a bool mask with for cuDNN's kernel
#: (``convert_boolean_attn_mask_cudnn`` in aten/src/ATen/native/transformers/attention.cpp, from
#: torch 2.5 on; seen on an H100 with 2.11): a finite value, which cuDNN needs. It only shows in
#: rows the mask hides entirely; ``test_cuda.py``'s bool-mask case has one, against eager.
CUDNN_MASK_FILL = -65504.0

_OP = "ltorch.scaled_dot_product_attention"


# -- torch's choice --------------------------------------------------------------------------------


def _fake(meta):
    """A fake tensor of ``meta`` (``_metadata``'s, at concrete sizes), strides and storage offset as
    eager's are."""
    shape, strides, offset, dtype, device, requires_grad = meta
    differentiable = requires_grad and dtype.is_floating_point
    if not offset:
        return torch.empty_strided(shape, strides, dtype=dtype, device=device, requires_grad=differentiable)
    extent = 0 if 0 in shape else 1 + sum((n - 1) * stride for n, stride in zip(shape, strides))
    storage = torch.empty(offset + extent, dtype=dtype, device=device)
    return storage.as_strided(shape, strides, offset).detach().requires_grad_(differentiable)


_aten = torch.ops.aten
#: The fused kernels eager's composite calls, by the backend each is.
_BACKEND_OF = {
    _aten._scaled_dot_product_flash_attention.default: FLASH,
    _aten._scaled_dot_product_efficient_attention.default: EFFICIENT,
    _aten._scaled_dot_product_cudnn_attention.default: CUDNN,
}


class _KernelSeen(TorchDispatchMode):
    """Sees which fused kernel, if any, the ops run under it call: the backend torch chose."""

    backend = MATH

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.backend = _BACKEND_OF.get(func, self.backend)
        return func(*args, **(kwargs or {}))


def eager_choice(query, key, value, attn_mask, dropout_p: float, is_causal: bool, scale, enable_gqa: bool) -> int:
    """The backend eager's composite runs with on these (fake) tensors, as the kernel it calls.

    Not ``torch._fused_sdp_choice``: under FakeTensorMode that op reaches its meta kernel with
    the tensors seen as meta ones, and the CUDA ``select_sdp_backend`` refuses every fused kernel
    for them. The composite asks it directly, with the fake tensors on their CUDA device."""
    with _KernelSeen() as seen:
        _aten.scaled_dot_product_attention.default(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )
    return seen.backend


def _metadata(x):
    """(shape, strides, storage offset, dtype, device, requires_grad) of eager's tensor for ``x``;
    the offset None where no rule tells it (``storage_offsets.eager_offset``)."""
    if x is None:
        return None
    return (tuple(x.shape), tuple(strides_of(x)), eager_offset(x), x.dtype, x.device, x.requires_grad)


def _symbolic(meta) -> bool:
    return meta is not None and any(type(s) is SymInt for s in (*meta[0], *meta[1], meta[2]))


def _at_hints(meta):
    """``meta`` with its sizes at their hints, none of them specialised (an unknown offset at 0)."""
    if meta is None:
        return None
    shape, strides, offset, *rest = meta
    return (tuple(map(hint, shape)), tuple(map(hint, strides)), hint(offset or 0), *rest)


def _sized(meta):
    """``meta`` as a function of the size values by name (``symint.at_sizes``), or None."""
    if meta is None:
        return lambda env: None
    shape, strides, offset, *rest = meta
    sizes = at_sizes((shape, strides, offset or 0))
    return lambda env: (*sizes(env), *rest)


#: Choices made, by the calls' metadata and the switches: the layers of a model ask once.
_choices: dict = {}


def _choose(metas: list, dropout_p: float, is_causal: bool, scale, enable_gqa: bool) -> int:
    """The backend eager's dispatcher runs a call of concrete ``metas`` (query, key, value, mask)
    with, grad mode on; torch's error where it has none."""
    call = (*metas, dropout_p, is_causal, scale, enable_gqa, sdp_state.state())
    backend = _choices.get(call)
    if backend is None:
        try:
            with torch._C.DisableTorchFunction(), FakeTensorMode(), torch.enable_grad():
                q, k, v, mask = (None if m is None else _fake(m) for m in metas)
                backend = eager_choice(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa)
        except RuntimeError as e:
            raise thunder_error_like(e, f"{_OP}: {e}") from e
        if len(_choices) > 4096:
            _choices.clear()
        # Stored under the switches as they are after the choice: the first one of a process may
        # set the priority order (see ``chosen_backend``).
        _choices[call[:-1] + (sdp_state.state(),)] = backend
    return backend


def fused_sdp_choice(query, key, value, attn_mask, dropout_p: float, is_causal: bool, scale, enable_gqa: bool) -> int:
    """The backend (an ``SDPBackend`` value) eager's dispatcher runs this call with, grad mode on;
    torch's error where it has none (every backend switched off or unable).

    With symbolic sizes the choice is made at their hints, and the trace's symbolic entry serves
    another call's sizes only where torch makes the same choice for them (a size check that asks
    again, on the miss path only): which sizes each kernel accepts is torch's to say."""
    metas = [_metadata(x) for x in (query, key, value, attn_mask)]
    args = (dropout_p, is_causal, scale, enable_gqa)
    backend = _choose([_at_hints(m) for m in metas], *args)
    guard_offsets((query, key, value), metas, args, backend)
    if any(map(_symbolic, metas)):
        sized = [_sized(m) for m in metas]

        def same_choice(env: dict) -> bool:
            try:
                return _choose([m(env) for m in sized], *args) == backend
            except Exception:  # noqa: BLE001 (no kernel for those sizes: not this entry's call)
                return False

        check_sizes(same_choice)
    return backend


def chosen_backend(query, key, value, attn_mask, dropout_p: float, is_causal: bool, scale, enable_gqa: bool) -> int:
    """``fused_sdp_choice`` for a CUDA call, with the switches it depends on guarded.

    The choice comes first, the guard after: torch's first choice in a process sets the priority
    order on GPUs where it prefers cuDNN's kernel (``priority_order`` in ``sdp_utils.cpp``, sm90 and
    newer: cuDNN first), so switches read before it would be stale; on an H200 the first traced
    attention of a process failed as a program that changed state it read."""
    backend = fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    sdp_state.guard()
    return backend


#: The boundary, in bytes, that the memory-efficient kernel wants q, k and v to start on, where
#: torch checks it (sm80 and newer: ``check_data_ptr_alignment_mem_efficient`` in sdp_utils.cpp, its
#: ``minimum_gemm_alignment``: 8 half-precision or 4 float32 elements).
ALIGNMENT_BYTES = 16


def _with_offset(meta, offset: int):
    shape, strides, _, *rest = meta
    return (shape, strides, offset, *rest)


def _depends_on_offsets(hinted: list, varied: list, moduli: list, args, backend: int) -> bool:
    """Whether torch chooses otherwise than ``backend`` where the tensors at ``varied`` all start on
    a boundary of their ``moduli``, or all one element past it. Torch looks at whether q, k and v
    all start on one: a call that changes that answer is one of the two (asked once each, as any
    choice)."""
    for start in (0, 1):
        tried = list(hinted)
        for i, m in zip(varied, moduli):
            offset = hinted[i][2]
            tried[i] = _with_offset(hinted[i], offset - offset % m + start)
        try:
            if _choose(tried, *args) != backend:
                return True
        except ThunderError:  # (no kernel there: a call starting there is not this entry's)
            return True
    return False


def guard_offsets(tensors, metas: list, args, backend: int) -> None:
    """Guards the storage offsets of the trace inputs that query, key and value are (views of)
    where torch's choice depends on them: a later call's tensors may start elsewhere in their
    storage (a slice of a packed projection), which the cache key leaves out; such a call
    compiles again and runs the kernel torch chooses for it. A choice that depends on an offset
    no rule tells is refused."""
    varied = [i for i, x in enumerate(tensors) if input_root(x) is not None or metas[i][2] is None]
    if not varied:
        return
    hinted = [_at_hints(m) for m in metas]
    moduli = [max(1, ALIGNMENT_BYTES // tensors[i].dtype.itemsize) for i in varied]
    if not _depends_on_offsets(hinted, varied, moduli, args, backend):
        return
    name = SDPBackend(backend).name
    for i, m in zip(varied, moduli):
        x, role = tensors[i], ("query", "key", "value")[i]
        root = input_root(x)
        if metas[i][2] is None or root is None or not can_guard(root):
            raise ThunderNotImplementedError(
                f"{_OP}: torch's choice of attention kernel depends on where the {role} starts in its storage, "
                f"which thunder_rs cannot tell for this view at {user_location()}; make it contiguous() first "
                f"(argument {role})"
            )
        delta = metas[i][2] - root._offset  # (where the view starts in the input's tensor)
        why = f"torch chose the {name} attention kernel for the {role} at offset {hinted[i][2]}"
        guard_offset(root, m, why, delta if type(delta) is int else None)


# -- kernel meta rules ----------------------------------------------------------------------------


def _matching_layout(query, shape) -> tuple:
    """The strides of a new tensor of ``shape`` with the query's order of dimensions
    (``alloc_with_matching_layout`` in torch's meta registrations)."""
    strides = strides_of(query)
    order = sorted(range(len(shape)), key=lambda d: strides[d] if strides[d] else math.inf)
    out, step = [0] * len(shape), 1
    for d in order:
        out[d], step = step, step * shape[d]
    return tuple(out)


def _output(query, shape, strides):
    """The attention output: query's dtype, differentiable, its strides kept when not contiguous."""
    return shape, query.dtype, True, None if strides == contiguous_strides(shape) else strides


def _residual(shape, dtype):
    return tuple(shape), dtype, False, None


def _rows(query) -> tuple:
    return tuple(query.shape[:3])


#: Flash's philox state: aten gives a uint64 [2] seed and a uint64 offset (int64 scalars on ROCm);
#: the trace carries them as int64 (the torch executor reinterprets the bits both ways).
_FLASH_RNG = ((), ()) if torch.version.hip else ((2,), ())


def _flash_meta(query, key, value, dropout_p, is_causal, scale):
    shape = (*query.shape[:-1], value.shape[-1])
    seed, offset = _FLASH_RNG
    return [
        _output(query, shape, _matching_layout(query, shape)),
        _residual(_rows(query), torch.float32),
        _residual(seed, torch.int64),
        _residual(offset, torch.int64),
    ]


def _efficient_meta(query, key, value, attn_bias, dropout_p, is_causal, scale):
    batch, heads, rows = _rows(query)
    shape = (batch, heads, rows, value.shape[-1])
    # aten allocates [B, L, H, D] and returns it transposed; the logsumexp's rows are padded to
    # a multiple of 32 (not on ROCm).
    strides = (rows * heads * shape[3], shape[3], heads * shape[3], 1)
    padded = rows if torch.version.hip else -(-rows // 32) * 32
    return [
        _output(query, shape, strides),
        _residual((batch, heads, padded), torch.float32),
        _residual((), torch.int64),
        _residual((), torch.int64),
    ]


def _cudnn_meta(query, key, value, attn_bias, dropout_p, is_causal, scale):
    shape = (*_rows(query), value.shape[-1])
    return [
        _output(query, shape, _matching_layout(query, shape)),
        _residual((*_rows(query), 1), torch.float32),
        _residual((), torch.int64),
        _residual((), torch.int64),
    ]


def output_strides(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """On CUDA, for a call recorded whole (not differentiated), a function of the output's sizes
    giving the strides of the output of the fused kernel torch chooses for it (its meta rule's, as
    a differentiated call records them); else None (the math path's matmul). Eager's
    ``y.transpose(1, 2).contiguous()`` of the memory-efficient kernel's ``[B, L, H, D]``-major
    output copies nothing, and a traced row-major one made it a copy."""
    differentiated = any(x is not None and x.requires_grad for x in (query, key, value, attn_mask))
    if query.ndim != 4 or differentiated and torch.is_grad_enabled():
        return None  # (the grad rule records the kernel with its layout, or the math path)
    backend = chosen_backend(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if backend not in (FLASH, EFFICIENT, CUDNN):
        return None
    hinted = tuple(hint(s) for s in strides_of(query))
    pad = -hint(query.shape[-1]) % 8 if backend == FLASH else 0

    def strides(shape: tuple) -> tuple | None:
        if backend == EFFICIENT:  # ([B, L, H, D] transposed)
            batch, heads, rows, dim = shape
            return (rows * heads * dim, dim, heads * dim, 1)
        if pad:  # (of the head size padded to a multiple of 8, row-major, cut back: ``_flash``)
            return contiguous_strides((*shape[:-1], shape[-1] + pad))
        order = sorted(range(4), key=lambda d: hinted[d] if hinted[d] else math.inf)
        out, step = [0] * 4, 1
        for d in order:  # (``alloc_with_matching_layout``: the query's order of dims)
            out[d], step = step, step * shape[d]
        return tuple(out)

    return strides


FUSED_ATTENTION_STRIDES.append(output_strides)


def _gradient(x):
    return tuple(x.shape), x.dtype, True, None


def _flash_backward_meta(grad_out, query, key, value, out, logsumexp, seed, offset, dropout_p, is_causal, scale):
    return [_gradient(query), _gradient(key), _gradient(value)]


def _efficient_backward_meta(
    grad_out, query, key, value, attn_bias, out, logsumexp, seed, offset, dropout_p, grad_input_mask, is_causal, scale
):
    """The gradients ``grad_input_mask`` asks for; the bias's has the [B, H, L, S] shape the
    kernel saw it expanded to."""
    bias = None if attn_bias is None else ((*_rows(query), key.shape[2]), attn_bias.dtype, True, None)
    grads = (_gradient(query), _gradient(key), _gradient(value), bias)
    return [g for g, wanted in zip(grads, grad_input_mask) if wanted]


def _cudnn_backward_meta(
    grad_out, query, key, value, out, logsumexp, seed, offset, attn_bias, dropout_p, is_causal, scale
):
    return [_gradient(query), _gradient(key), _gradient(value)]


#: ``(query, key, value, dropout_p, is_causal, scale) -> (out, logsumexp, seed, offset)``; the
#: ``_dropout`` form draws (``dropout_p > 0``).
flash_attention = OpaqueKernel("flash_attention", _flash_meta)
flash_attention_dropout = OpaqueKernel("flash_attention_dropout", _flash_meta, effect=True)
#: ``(grad_out, query, key, value, out, logsumexp, seed, offset, dropout_p, is_causal, scale)
#: -> (grad_query, grad_key, grad_value)``
flash_attention_backward = OpaqueKernel("flash_attention_backward", _flash_backward_meta)
#: ``(query, key, value, attn_bias, dropout_p, is_causal, scale) -> (out, logsumexp, seed, offset)``,
#: ``attn_bias`` additive (or None) and broadcastable to [B, H, L, S].
efficient_attention = OpaqueKernel("efficient_attention", _efficient_meta)
efficient_attention_dropout = OpaqueKernel("efficient_attention_dropout", _efficient_meta, effect=True)
#: ``(grad_out, query, key, value, attn_bias, out, logsumexp, seed, offset, dropout_p,
#: grad_input_mask, is_causal, scale)`` -> the gradients of query, key, value and attn_bias the
#: mask asks for.
efficient_attention_backward = OpaqueKernel("efficient_attention_backward", _efficient_backward_meta)
#: ``(query, key, value, attn_bias, dropout_p, is_causal, scale) -> (out, logsumexp, seed, offset)``
cudnn_attention = OpaqueKernel("cudnn_attention", _cudnn_meta)
cudnn_attention_dropout = OpaqueKernel("cudnn_attention_dropout", _cudnn_meta, effect=True)
#: ``(grad_out, query, key, value, out, logsumexp, seed, offset, attn_bias, dropout_p, is_causal,
#: scale) -> (grad_query, grad_key, grad_value)``
cudnn_attention_backward = OpaqueKernel("cudnn_attention_backward", _cudnn_backward_meta)


# -- the grad rule's fused path --------------------------------------------------------------------


def _put_grads(inputs, grads) -> None:
    for x, grad in zip(inputs, grads):
        if x.requires_grad:
            put_grad(x, grad)


def _pad_last(x, pad: int):
    return ltorch.pad(x, (0, pad)) if pad else x


def _flash(query, key, value, dropout_p, is_causal, scale):
    """Flash attention with the head size padded to a multiple of 8 and the output cut back, as
    eager's composite does (autograd then cuts the gradients back and pads the output's)."""
    size = query.shape[-1]
    pad = -size % 8
    # The scale of the original head size, computed as torch's ``calculate_scale``.
    scale = 1.0 / symfloat.sqrt(size) if scale is None else scale
    q, k, v = (_pad_last(x, pad) for x in (query, key, value))
    forward = flash_attention_dropout if dropout_p > 0 else flash_attention
    padded, lse, seed, offset = forward(q, k, v, dropout_p, is_causal, scale)
    out = ltorch.narrow(padded, -1, 0, size) if pad else padded
    g = _pad_last(get_grad(out), pad)
    grads = flash_attention_backward(g, q, k, v, padded, lse, seed, offset, dropout_p, is_causal, scale)
    _put_grads((query, key, value), (ltorch.narrow(x, -1, 0, size) if pad else x for x in grads))
    return out


def _additive(attn_mask, dtype, fill: float):
    """The mask as eager's composite hands it to a kernel: a bool mask as 0 where it is True and
    ``fill`` elsewhere, in the query's dtype; an additive one as it is."""
    if attn_mask is None or attn_mask.dtype != torch.bool:
        return attn_mask
    # A 0-d zero of the dtype makes ``where`` produce that dtype, as eager's conversion does.
    return ltorch.where(attn_mask, ltorch.zeros((), dtype=dtype, device=attn_mask.device), fill)


def _efficient(query, key, value, attn_mask, dropout_p, is_causal, scale):
    bias = _additive(attn_mask, query.dtype, float("-inf"))
    forward = efficient_attention_dropout if dropout_p > 0 else efficient_attention
    out, lse, seed, offset = forward(query, key, value, bias, dropout_p, is_causal, scale)
    wanted = [x.requires_grad for x in (query, key, value)] + [bias is not None and bias.requires_grad]
    grads = efficient_attention_backward(
        get_grad(out), query, key, value, bias, out, lse, seed, offset, dropout_p, wanted, is_causal, scale
    )
    grads = iter(grads)
    _put_grads((query, key, value), (next(grads) if w else None for w in wanted[:3]))
    if wanted[3]:  # the kernel's [B, H, L, S] gradient, summed as autograd sums an expanded mask's
        put_grad(attn_mask, cast(sum_to(next(grads), attn_mask.shape), attn_mask.dtype))
    return out


def _cudnn(query, key, value, attn_mask, dropout_p, is_causal, scale):
    if attn_mask is not None and attn_mask.requires_grad:
        raise ThunderNotImplementedError(
            f"{_OP}: torch chooses the cuDNN attention kernel for this call, whose backward gives no gradient for "
            "attn_mask, which requires grad (eager's backward has none either). Switch it off for the call: "
            "torch.backends.cuda.enable_cudnn_sdp(False) or torch.nn.attention.sdpa_kernel (argument attn_mask)"
        )
    bias = _additive(attn_mask, query.dtype, CUDNN_MASK_FILL)
    forward = cudnn_attention_dropout if dropout_p > 0 else cudnn_attention
    out, lse, seed, offset = forward(query, key, value, bias, dropout_p, is_causal, scale)
    grads = cudnn_attention_backward(
        get_grad(out), query, key, value, out, lse, seed, offset, bias, dropout_p, is_causal, scale
    )
    _put_grads((query, key, value), grads)
    return out


def fused_attention(query, key, value, attn_mask, dropout_p: float, is_causal: bool, scale, enable_gqa: bool):
    """The output of a differentiated attention on CUDA, recorded with the kernel torch chooses for
    it and that kernel's backward; None where torch chooses the math path, or where query, key and
    value need no gradient (eager's fused kernels then keep no logsumexp: the mask's gradient
    comes from the decomposition; with dropout, which eager's kernel draws, that is refused). The
    fused kernels take grouped keys and values (``enable_gqa``) as they are, as eager hands them
    over."""
    backend = chosen_backend(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if backend == MATH:
        return None
    if not any(x.requires_grad for x in (query, key, value)):
        if dropout_p > 0:
            # The decomposition would draw its dropout with aten's dropout, not in eager's kernel.
            raise ThunderNotImplementedError(
                f"{_OP}: torch chooses the {SDPBackend(backend).name} attention kernel for this call, which "
                "draws its dropout inside the kernel; with attn_mask the only input requiring grad thunder_rs "
                "differentiates the math path, whose dropout draws otherwise. Choose the math kernel for the call "
                "(torch.nn.attention.sdpa_kernel(SDPBackend.MATH)) or set dropout_p=0 (argument dropout_p)"
            )
        return None
    if backend == FLASH:  # torch never chooses it with a mask
        return _flash(query, key, value, dropout_p, is_causal, scale)
    if backend == EFFICIENT:
        return _efficient(query, key, value, attn_mask, dropout_p, is_causal, scale)
    if backend == CUDNN:
        return _cudnn(query, key, value, attn_mask, dropout_p, is_causal, scale)
    raise ThunderNotImplementedError(
        f"{_OP}: torch chooses the attention backend {SDPBackend(backend).name} for this "
        "call, which thunder_rs does not record"
    )


# -- what eager's kernel saves (``core.lang.saved_versions``) ---------------------------------------


def _runs_fused(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Whether eager runs a fused kernel for an attention call of these tensors (the program's
    proxies, or ``saved_versions``'s descriptions), which saves every tensor it takes and returns,
    or its math path (False); None on another device. On CUDA, the choice of the kernel recorded
    (``_choose``, kept); on the CPU, ``_fused_sdp_choice`` of empty tensors."""
    metas = [None if t is None else _at_hints(_meta(t)) for t in (query, key, value, attn_mask)]
    dropout_p, is_causal, enable_gqa = float(dropout_p), bool(is_causal), bool(enable_gqa)
    device = query.device.type
    if device == "cuda":
        return _choose(metas, dropout_p, is_causal, scale, enable_gqa) != MATH
    if device != "cpu":
        return None
    with torch._C.DisableTorchFunction(), torch.enable_grad():
        q, k, v, m = (None if meta is None else _empty(meta) for meta in metas)
        choice = torch._fused_sdp_choice(q, k, v, m, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    return choice != MATH


def _meta(t):
    """``_metadata`` of a proxy, or of ``saved_versions``'s description of a tensor (offset 0)."""
    if isinstance(t, TensorProxy):
        return _metadata(t)
    return (tuple(t.shape), t.strides or contiguous_strides(t.shape), 0, t.dtype, t.device, t.requires_grad)


def _empty(meta):
    """A CPU tensor of ``meta``, its memory unwritten (only its metadata is read)."""
    shape, strides, _, dtype, _, requires_grad = meta
    made = torch.empty_strided(shape, strides, dtype=dtype, device="cpu")
    return made.requires_grad_() if requires_grad and dtype.is_floating_point else made


def _chosen_kernel(fused: bool):
    """The kernel eager chose for a call run again: the CPU's flash kernel, or the math path."""
    return torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION if fused else SDPBackend.MATH)


#: The autograd nodes of the fused kernels eager's composite calls on CUDA, as its error names them
_NODES = {
    FLASH: "ScaledDotProductFlashAttention",
    EFFICIENT: "ScaledDotProductEfficientAttention",
    CUDNN: "ScaledDotProductCudnnAttention",
}


def _kernel_node(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """``saved_ops.KERNEL_NODES``' answer for a CUDA attention call: its kernel's node, and the
    padding of the head size flash's composite makes (``_flash``: it saves padded copies of the
    query, key and value, and the padded output, of which it returns a narrowed view)."""
    metas = [None if t is None else _at_hints(_meta(t)) for t in (query, key, value, attn_mask)]
    backend = _choose(metas, float(dropout_p), bool(is_causal), scale, bool(enable_gqa))
    name = _NODES.get(backend)
    return None if name is None else (name, -hint(query.shape[-1]) % 8 if backend == FLASH else 0)


KERNEL_CHOICES[torch.nn.functional.scaled_dot_product_attention] = (_runs_fused, _chosen_kernel)
KERNEL_NODES[torch.nn.functional.scaled_dot_product_attention] = _kernel_node


#: The fused kernels' names as eager's forward-mode error names them (none has a formula)
_KERNEL_NAMES = {
    FLASH: "_scaled_dot_product_flash_attention",
    EFFICIENT: "_scaled_dot_product_efficient_attention",
    CUDNN: "_scaled_dot_product_cudnn_attention",
}
_PARAMETERS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def _kernel_without_forward_ad(args: tuple, kwargs: dict) -> str | None:
    """The fused kernel eager runs an attention call with (it has no forward-mode formula), or
    None where eager takes its math path (ops that have one)."""
    call = {**dict(zip(_PARAMETERS, args)), **kwargs}
    query = call["query"]
    if query.device.type == "cpu":
        return "_scaled_dot_product_flash_attention_for_cpu" if _runs_fused(**call) else None
    if query.device.type != "cuda":
        return None
    return _KERNEL_NAMES.get(_choose_of(call))


def _choose_of(call: dict) -> int:
    metas = [None if call.get(n) is None else _at_hints(_meta(call[n])) for n in _PARAMETERS[:4]]
    return _choose(
        metas,
        float(call.get("dropout_p", 0.0)),
        bool(call.get("is_causal", False)),
        call.get("scale"),
        bool(call.get("enable_gqa", False)),
    )


NO_FORWARD_AD["scaled_dot_product_attention"] = _kernel_without_forward_ad
