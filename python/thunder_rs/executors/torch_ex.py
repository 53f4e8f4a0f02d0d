"""The torch executor: runs every symbol with eager PyTorch.

Composites run whole as the torch callable they stand for (``ltorch.softmax`` as
``torch.softmax``); prims and fallbacks run as the torch calls below. It always comes last.
"""

import contextlib
import dataclasses
import operator
import threading
from typing import Any

import torch

from thunder_rs import prims
from thunder_rs.core.lang.fallback import FALLBACK_IMPLS
from thunder_rs.core.lang.executor_api import Executor, Implementation, register_executor
from thunder_rs.torch import SYMBOLS, fused_attention
from thunder_rs.torch.interpolate import TORCH_IMPLS as RESIZE_IMPLS
from thunder_rs.torch.normalization import TORCH_IMPLS as NORM_IMPLS
from thunder_rs.torch.sampling import TORCH_IMPLS as SAMPLING_IMPLS
from thunder_rs.torch.segment_reductions import TORCH_IMPLS as SEGMENT_IMPLS
from thunder_rs.torch.histograms import TORCH_IMPLS as HISTOGRAM_IMPLS
from thunder_rs.torch.layers import TORCH_IMPLS as BAG_IMPLS
from thunder_rs.torch.losses import TORCH_IMPLS as LOSS_IMPLS
from thunder_rs.torch.scan import TORCH_IMPLS as SCAN_IMPLS
from thunder_rs.torch.index_scatter import TORCH_IMPLS as SCATTER_IMPLS
from thunder_rs.torch.symbols import ltorch

torch_ex = Executor("torch")


def _number_safe(fn):
    """Wraps a torch binary that needs tensor operands so numbers work on either side, as a 0-dim
    tensor of the other operand's dtype filled on its device (the values ``torch.tensor`` gives).
    Never ``torch.tensor(number, device=...)``: on CUDA that copies from pageable host memory,
    which waits for the stream on every call (the host idles until the GPU has caught up). A CPU
    scalar would cost no kernel in eager calls, but Inductor regions trace these implementations,
    and a fill is what every backend takes."""

    def impl(a, b):
        if not isinstance(a, torch.Tensor):
            a = torch.full((), a, dtype=b.dtype, device=b.device)
        elif not isinstance(b, torch.Tensor):
            b = torch.full((), b, dtype=a.dtype, device=a.device)
        return fn(a, b)

    return impl


def _div(a, b):
    exact = (a if isinstance(a, torch.Tensor) else b).dtype
    if exact.is_floating_point or exact.is_complex:
        return operator.truediv(a, b)
    return torch.div(a, b, rounding_mode="trunc")


def broadcast_in_dim(a, shape, broadcast_dimensions):
    if broadcast_dimensions == tuple(range(len(shape) - a.ndim, len(shape))):
        return a.expand(shape)  # numpy-style: a's dims are the trailing ones
    view = [1] * len(shape)
    for i, d in enumerate(broadcast_dimensions):
        view[d] = a.shape[i]
    return a.reshape(view).expand(shape)


def slice_prim(a, start, end, strides):
    return a[tuple(slice(s, e, st) for s, e, st in zip(start, end, strides))]


def pad(a, value, config):
    # torch 2.9's F.pad rejects padding a tensor with a zero-size dim; the general path below
    # takes empty tensors in every version.
    plain = all(d == 0 for _, _, d in config) and all(lo >= 0 and hi >= 0 for lo, hi, _ in config)
    if plain and a.numel():
        flat = [p for lo, hi, _ in reversed(config) for p in (lo, hi)]
        return torch.nn.functional.pad(a, flat, value=value)
    # Interior and positive padding into a filled buffer, then negative padding cropped off it.
    grown = [(max(lo, 0), max(hi, 0), d) for lo, hi, d in config]
    shape = [lo + hi + (s + (s - 1) * d if s else 0) for s, (lo, hi, d) in zip(a.shape, grown)]
    out = torch.full(shape, value, dtype=a.dtype, device=a.device)
    out[tuple(slice(lo, lo + ((s - 1) * (d + 1) + 1 if s else 0), d + 1) for s, (lo, _, d) in zip(a.shape, grown))] = a
    return out[tuple(slice(max(-lo, 0), n - max(-hi, 0)) for n, (lo, hi, _) in zip(shape, config))]


# Prim reductions over no dims reduce nothing; torch reads empty dims as "all dims".
def _reduce(fn):
    def impl(a, dims):
        return fn(a, dims) if dims else a.clone()

    return impl


def _sum(a, dims):
    # Keep the input dtype, as the prim's meta rule does (torch.sum widens integers to int64).
    return torch.sum(a, dims, dtype=a.dtype) if dims else a.clone()


def _prod(a, dims):
    out = a
    for d in sorted(dims, reverse=True):
        out = torch.prod(out, d, dtype=a.dtype)
    return out if dims else a.clone()


def _over_one_sample(fn):
    """``var``/``var_mean`` over no dims: each element is a sample of size one."""

    def impl(a, dims, correction):
        if not dims:
            a, dims = a.unsqueeze(-1), (-1,)
        return fn(a, dims, correction=correction)

    return impl


def _conj(a):
    """``torch.conj_physical``, of the data under a broadcast: the conjugate of an operand the
    trace expanded (``g * conj(b)`` in ``mul``'s gradient) keeps the stride-0 layout eager's
    unexpanded operand has, since a complex ``mul`` over a dense copy rounds otherwise."""
    strides = a.stride()
    if 0 not in strides:
        return torch.conj_physical(a)
    data = a.as_strided([1 if st == 0 else n for n, st in zip(a.shape, strides)], strides)
    return torch.conj_physical(data).expand(a.shape)


def _view_as_complex(a, contiguous):
    """``torch.view_as_complex``, of a row-major copy where ``contiguous`` (eager's backward views
    ``grad.contiguous()``) or where ``a``'s layout cannot be viewed so (the program's own calls
    are checked against eager's layout rules while tracing)."""
    if contiguous:
        a = a.contiguous()
    if a.stride(-1) != 1 or a.storage_offset() % 2 or any(s % 2 for s in a.stride()[:-1]):
        a = a.clone(memory_format=torch.contiguous_format)
    return torch.view_as_complex(a)


def _convolution_backward(g, a, weight, stride, padding, dilation, transposed, output_padding, groups, *mask):
    channels = weight.shape[1] * groups if transposed else weight.shape[0]
    grads = _aten.convolution_backward.default(
        g, a, weight, [channels], stride, padding, dilation, transposed, output_padding, groups, list(mask)
    )
    kept = [x for x, wanted in zip(grads, mask) if wanted]
    return kept[0] if len(kept) == 1 else tuple(kept)


def _complex_prims() -> dict[str, Any]:
    # (``real``/``imag`` are views, never receivers of in-place forms: ``passes::reuse``)
    return {
        "real": torch.real,
        "imag": torch.imag,
        "conj": _conj,
        "sgn": torch.sgn,
        "complex": torch.complex,
        "polar": torch.polar,
        "view_as_complex": _view_as_complex,
        "view_as_real": lambda a, contiguous: torch.view_as_real(a.contiguous() if contiguous else a),
        "fft_r2c": _aten._fft_r2c.default,
        "fft_c2r": _aten._fft_c2r.default,
        "fft_c2c": _aten._fft_c2c.default,
    }


def _register_prims() -> None:
    simple = {
        "add": operator.add,
        "sub": operator.sub,
        "mul": operator.mul,
        "div": _div,
        "pow": operator.pow,
        "eq": operator.eq,
        "ne": operator.ne,
        "lt": operator.lt,
        "le": operator.le,
        "gt": operator.gt,
        "ge": operator.ge,
        "bitwise_and": operator.and_,
        "bitwise_or": operator.or_,
        "bitwise_xor": operator.xor,
        "fmod": _number_safe(torch.fmod),
        "remainder": operator.mod,
        "maximum": _number_safe(torch.maximum),
        "minimum": _number_safe(torch.minimum),
        "atan2": _number_safe(torch.atan2),
        "where": torch.where,
        "convert_element_type": lambda a, dtype: a.to(dtype),
        "device_put": lambda a, device: a.to(device),
        "broadcast_in_dim": broadcast_in_dim,
        "reshape": torch.reshape,
        "transpose": torch.permute,
        "slice": slice_prim,
        "squeeze": lambda a, dims: a.squeeze(dims) if dims else a,
        "cat": torch.cat,
        "pad": pad,
        "flip": lambda a, dims: torch.flip(a, dims) if dims else a,
        "full": lambda shape, fill, device, dtype: torch.full(shape, fill, device=device, dtype=dtype),
        "iota": lambda length, start, step, device, dtype: torch.arange(
            start, start + length * step, step, device=device, dtype=dtype
        ),
        "uniform": lambda shape, low, high, device, dtype: torch.empty(shape, device=device, dtype=dtype).uniform_(
            low, high
        ),
        "sum": _sum,
        "prod": _prod,
        "amax": _reduce(torch.amax),
        "amin": _reduce(torch.amin),
        "var": _over_one_sample(torch.var),
        "var_mean": _over_one_sample(torch.var_mean),
        "argmax": lambda a, dim: torch.argmax(a, dim),
        "argmin": lambda a, dim: torch.argmin(a, dim),
        "matmul": torch.matmul,
        "linear": torch.nn.functional.linear,
        "embedding": torch.nn.functional.embedding,
        "take": lambda a, index, dim: torch.index_select(a, dim, index),
        "take_along_axis": torch.take_along_dim,
        "gather": lambda a, index, dim: torch.gather(a, dim, index),
        "scatter_add": lambda a, index, src, dim: torch.scatter_add(a, dim, index, src),
        "scatter": lambda a, index, src, dim: torch.scatter(a, dim, index, src),
        "index_add": lambda a, index, source, dim: torch.index_add(a, dim, index, source),
        "topk": lambda a, k, dim, largest, sorted: tuple(torch.topk(a, k, dim, largest, sorted)),
        "sort": lambda a, dim, descending, stable: tuple(torch.sort(a, dim=dim, descending=descending, stable=stable)),
        "polygamma": lambda a, n: torch.polygamma(n, a),
        "cumsum": lambda a, dim: torch.cumsum(a, dim, dtype=a.dtype),
        "cumprod": lambda a, dim: torch.cumprod(a, dim, dtype=a.dtype),
        "cummax": lambda a, dim: tuple(torch.cummax(a, dim)),
        "cummin": lambda a, dim: tuple(torch.cummin(a, dim)),
        "convolution_backward": _convolution_backward,
        "frexp": lambda a: tuple(torch.frexp(a)),
        **_complex_prims(),
        "nextafter": _number_safe(torch.nextafter),
        "zeta": _number_safe(torch.special.zeta),
        **{
            name: _number_safe(getattr(torch.special, name)) for name in prims.DERIVED["Binary"] if "polynomial" in name
        },
    }
    _register_prim_table(simple)


#: The writes at indices, whose tensor methods take ``dim`` first: the prim
#: ``index_add(a, index, source, dim)`` is ``a.index_add(dim, index, source)``, and its in-place
#: form ``a.index_add_(dim, index, source)`` (what ``passes::reuse`` calls on a dying buffer).
_DIM_FIRST_METHODS = {"index_add": (3, 1, 2), "scatter_add": (3, 1, 2), "scatter": (3, 1, 2)}


def _register_prim_table(simple: dict) -> None:
    """Every prim as ``simple`` runs it, the others as the torch function of their name with the
    prim's arguments, and as the tensor method of that name where there is one. The
    operator-backed arithmetic prims (numbers on either side) are these methods when their first
    operand is a tensor. One registration for all (each one is a new registry version)."""
    methods = {"add", "sub", "mul", *_DIM_FIRST_METHODS}
    torch_ex.registry.register(
        *(
            Implementation(
                name,
                f"prim_{name}",
                simple.get(name) or getattr(torch, name, None) or getattr(torch.special, name),
                method=name if name in methods or (name not in simple and hasattr(torch.Tensor, name)) else None,
                method_args=_DIM_FIRST_METHODS.get(name),
            )
            for name in prims.NAMES
        )
    )


#: Methods whose out-of-place forms write a new contiguous tensor whatever their receiver's layout
#: (``masked_fill`` clones it contiguous, the products and scans allocate contiguous results):
#: their in-place forms would keep a transposed receiver's layout where eager's result is row-major
#: (``masked_fill`` in xlogy's gradient of transposed inputs).
_CONTIGUOUS_RESULTS = {"masked_fill", "masked_scatter", "addmm", "addmv", "addbmm", "baddbmm", "cumsum", "cumprod"}
_CONTIGUOUS_RESULTS |= {"tril", "triu", "renorm", "mvlgamma"}


def _declare_inplace_methods() -> None:
    """``m_`` for every method ``m`` that has one: ``passes::reuse`` calls it for calls that
    compute (elementwise, and writes at indices such as ``index_add``) whose receiver is a fresh
    intermediate dying there, where it computes the same values laid out as eager's (it never picks
    random draws, whose in-place forms mean something else)."""
    torch_ex.registry.register(
        *(
            dataclasses.replace(impl, inplace_method=f"{impl.method}_")
            for impl in torch_ex.registry.snapshot().values()
            if impl.method is not None
            and hasattr(torch.Tensor, f"{impl.method}_")
            and not (isinstance(impl.key, int) and impl.method in _CONTIGUOUS_RESULTS)
        )
    )


def _defined(fn):
    """``fn``, a masked aten backward whose last argument is its output mask, with the outputs
    the mask leaves out dropped (one output alone). Eager kernels leave those undefined (None);
    the fake and meta kernels that Inductor's tracing runs compute them all, so the mask decides."""

    def impl(*args):
        outs = [o for o, wanted in zip(fn(*args), args[-1]) if wanted and o is not None]
        return outs[0] if len(outs) == 1 else tuple(outs)

    return impl


def _on_cpu(first, *args) -> bool:
    return first.device.type == "cpu"


_aten = torch.ops.aten


def _last_dim_dense(*tensors):
    """``tensors`` with a last-dim stride of 1, as the CPU flash kernels need (torch 2.9 gives
    wrong results for others; eager's dispatcher never sends it them)."""
    return [x if x.stride(-1) == 1 else x.contiguous() for x in tensors]


def _sdpa_flash(q, k, v, is_causal, scale, attn_mask=None):
    q, k, v = _last_dim_dense(q, k, v)
    return torch._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal, attn_mask=attn_mask, scale=scale)


def _sdpa_flash_backward(g, q, k, v, out, lse, is_causal, scale, attn_mask=None):
    g, q, k, v, out = _last_dim_dense(g, q, k, v, out)
    return _aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
        g, q, k, v, out, lse, 0.0, is_causal, attn_mask=attn_mask, scale=scale
    )


# The CUDA attention kernels of ``thunder_rs.torch.fused_attention``, called as eager's composite
# and autograd call them. Their inputs' last dims are made dense where they are not, as the
# kernels need (a no-op for the layouts eager's choice lets through).

#: The dtype flash's philox seed and offset have in aten; the trace carries them as int64.
_FLASH_RNG_DTYPE = torch.int64 if torch.version.hip else torch.uint64


def _rng_as(t, dtype):
    """``t`` reinterpreted (same bits) as ``dtype``; an undefined philox tensor stays None."""
    return None if t is None or t.dtype == dtype else t.view(dtype)


def _flash_attention(q, k, v, dropout_p, is_causal, scale):
    q, k, v = _last_dim_dense(q, k, v)
    out, lse, _, _, _, _, seed, offset, _ = _aten._scaled_dot_product_flash_attention.default(
        q, k, v, dropout_p, is_causal, False, scale=scale
    )
    return out, lse, _rng_as(seed, torch.int64), _rng_as(offset, torch.int64)


def _flash_attention_backward(g, q, k, v, out, lse, seed, offset, dropout_p, is_causal, scale):
    g, q, k, v, out = _last_dim_dense(g, q, k, v, out)
    return tuple(
        _aten._scaled_dot_product_flash_attention_backward.default(
            g,
            q,
            k,
            v,
            out,
            lse,
            None,
            None,
            q.shape[2],
            k.shape[2],
            dropout_p,
            is_causal,
            _rng_as(seed, _FLASH_RNG_DTYPE),
            _rng_as(offset, _FLASH_RNG_DTYPE),
            scale=scale,
        )
    )


def _efficient_bias(bias, q, k):
    """An additive mask as eager's composite hands it to the memory-efficient kernel
    (``preprocess_mask``): rows aligned to 16 elements (padded and cut back when they are not),
    expanded to [B, H, L, S]."""
    if bias is None:
        return None
    aligned = bias.stride(-1) == 1 and all(s % 16 == 0 for s in bias.stride()[:-1])
    if not aligned:
        size = bias.shape[-1]
        bias = torch.nn.functional.pad(bias, (0, 16 - size % 16))[..., :size]
    return bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


def _efficient_attention(q, k, v, bias, dropout_p, is_causal, scale):
    q, k, v = _last_dim_dense(q, k, v)
    return tuple(
        _aten._scaled_dot_product_efficient_attention.default(
            q, k, v, _efficient_bias(bias, q, k), True, dropout_p, is_causal, scale=scale
        )
    )


def _efficient_attention_backward(
    g, q, k, v, bias, out, lse, seed, offset, dropout_p, grad_input_mask, is_causal, scale
):
    g, q, k, v, out = _last_dim_dense(g, q, k, v, out)
    grads = _aten._scaled_dot_product_efficient_attention_backward.default(
        g,
        q,
        k,
        v,
        _efficient_bias(bias, q, k),
        out,
        lse,
        seed,
        offset,
        dropout_p,
        list(grad_input_mask),
        is_causal,
        scale=scale,
    )
    kept = [x for x, wanted in zip(grads, grad_input_mask) if wanted]
    return kept[0] if len(kept) == 1 else tuple(kept)


def _cudnn_attention(q, k, v, bias, dropout_p, is_causal, scale):
    q, k, v = _last_dim_dense(q, k, v)
    out, lse, _, _, _, _, seed, offset, _ = _aten._scaled_dot_product_cudnn_attention.default(
        q, k, v, bias, True, dropout_p, is_causal, False, scale=scale
    )
    return out, lse, seed, offset


def _cudnn_attention_backward(g, q, k, v, out, lse, seed, offset, bias, dropout_p, is_causal, scale):
    g, q, k, v, out = _last_dim_dense(g, q, k, v, out)
    return tuple(
        _aten._scaled_dot_product_cudnn_attention_backward.default(
            g,
            q,
            k,
            v,
            out,
            lse,
            seed,
            offset,
            bias,
            None,
            None,
            q.shape[2],
            k.shape[2],
            dropout_p,
            is_causal,
            scale=scale,
        )
    )


#: The kernels of ``thunder_rs.torch.fused_attention``, each one aten call (a forward's
#: ``_dropout`` form is the same call).
_FUSED_ATTENTION = {
    "flash_attention": _flash_attention,
    "flash_attention_dropout": _flash_attention,
    "flash_attention_backward": _flash_attention_backward,
    "efficient_attention": _efficient_attention,
    "efficient_attention_dropout": _efficient_attention,
    "efficient_attention_backward": _efficient_attention_backward,
    "cudnn_attention": _cudnn_attention,
    "cudnn_attention_dropout": _cudnn_attention,
    "cudnn_attention_backward": _cudnn_attention_backward,
}


def _batch_norm_functional(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """Batch norm in training mode with the running statistics updated in new tensors. Eager's CPU
    kernel takes another path (rounding otherwise) for running statistics that are not
    contiguous (``buffer[::2]``), which the functional op clones contiguous: those are copied as
    they are laid out and updated in place by eager's own kernel."""
    if isinstance(momentum, torch.Tensor):  # (nn.BatchNorm's cumulative average: ``1 / float(n)``, as eager reads it)
        momentum = momentum.item()
    if running_mean.is_contiguous() and running_var.is_contiguous():
        return tuple(
            _aten._native_batch_norm_legit_functional.default(
                input, weight, bias, running_mean, running_var, training, momentum, eps
            )
        )
    mean, var = _strided_copy(running_mean), _strided_copy(running_var)
    out, save_mean, save_invstd = _aten._native_batch_norm_legit.default(
        input, weight, bias, mean, var, training, momentum, eps
    )
    return out, save_mean, save_invstd, mean, var


def _strided_copy(t):
    """A copy of ``t`` with its strides (which ``clone`` keeps only for a dense tensor)."""
    copy = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return copy.copy_(t)


def _numeric_momentum(input, weight, bias, running_mean, running_var, training, momentum, eps) -> bool:
    # nn.BatchNorm's cumulative average gives a 0-d float64 tensor momentum (``1 / float(n)``): read
    # as the number eager's module passes its kernel, the kernel updates the running statistics in
    # double as eager's does (the decomposition's float32 update differed by ulps). A float input
    # (a momentum scheduled between calls: ``float_args``) reaches the kernel as the call's float.
    numeric = isinstance(momentum, (int, float, torch.SymFloat))
    return numeric or (isinstance(momentum, torch.Tensor) and momentum.ndim == 0)


def _batch_norm_no_stats(input, weight, bias, eps):
    return tuple(_aten._native_batch_norm_legit.no_stats(input, weight, bias, True, 0.0, eps))


def _batch_norm_backward(
    grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask
):
    """aten's batch-norm backward. In eval mode thunder_rs saves no statistics (None), which the
    CPU kernel takes; CUDA's ``batch_norm_backward_cuda`` (aten/src/ATen/native/cuda/Normalization.cu)
    asserts ``save_mean->defined()`` and ``save_invstd->defined()`` where it does not take its fused
    kernel (always for 2-D and channels-last inputs), and reads empty ones as "use the running
    statistics" (``TORCH_CHECK(!train && running_mean->defined())``), as cudnn_batch_norm's eval mode
    passes them. So CUDA gets empty ones, of the dtype its kernels read saved statistics in
    (``toAccumulateType(input, /*is_cuda=*/true)``): the same mean and invstd as eager's."""
    if save_mean is None and input.is_cuda:
        stats_dtype = torch.float64 if input.dtype == torch.float64 else torch.float32
        save_mean = save_invstd = input.new_empty((0,), dtype=stats_dtype)
    return _aten.native_batch_norm_backward.default(
        grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask
    )


def _cdist_backward(grad, x1, x2, p, cdist):
    """Eager's derivative of ``_cdist_forward`` hands the kernel contiguous cotangents and
    distances (x2's are transposed)."""
    return _aten._cdist_backward.default(grad.contiguous(), x1, x2, p, cdist.contiguous())


def _pdist_backward(grad, input, p, pdist):
    """Eager's derivative of ``_pdist_forward`` (of ``input.contiguous()``, as ``torch.pdist``
    calls it) hands the kernel contiguous distances. Of no rows, its zeros: the kernel crashes
    there (eager's backward of ``F.pdist`` of a (0, n) tensor ends the process)."""
    if input.numel() == 0:
        return torch.zeros(input.shape, dtype=input.dtype, device=input.device)
    return _aten._pdist_backward.default(grad, input.contiguous(), p, pdist.contiguous())


def _sdpa_not_math(query, key, value, attn_mask=None, dropout_p=0.0, *args, **kwargs) -> bool:
    """Whether eager's dispatch of the call is F.scaled_dot_product_attention's on tensors that
    require no grad: on the CPU a mask that requires grad takes the math path (recorded op by op)."""
    return not (query.device.type == "cpu" and attn_mask is not None and attn_mask.requires_grad and dropout_p == 0)


def _kept_weight_total(target, weight, ignore_index: int):
    """Eager's divisor of a label-smoothed, class-weighted mean (``cross_entropy_loss_label_smoothing``)."""
    return weight.gather(0, target.masked_select(target != ignore_index).flatten()).sum()


def _masked_rows_sum(g, mask, start: int, shape):
    """Eager's gradient of the values of ``input[..., mask] = values`` (autograd's ``sum_to``)."""
    return g[(slice(None),) * start + (mask.bool(),)].sum_to_size(shape)


#: The fused kernels of ltorch's families (``layer_norms``, ``nn``, ...), each one aten call (with its checker).
_KERNELS = {
    "native_layer_norm": (torch.native_layer_norm, None),
    "native_layer_norm_backward": (_defined(_aten.native_layer_norm_backward.default), None),
    "native_dropout": (torch.native_dropout, None),
    "native_dropout_backward": (_aten.native_dropout_backward.default, None),
    "gelu_backward": (
        lambda g, x, approximate="none": _aten.gelu_backward.default(g, x, approximate=approximate),
        None,
    ),
    "threshold_backward": (_aten.threshold_backward.default, None),
    "leaky_relu_backward": (
        lambda g, x, slope, self_is_result=False: _aten.leaky_relu_backward.default(g, x, slope, self_is_result),
        None,
    ),
    "hardtanh_backward": (_aten.hardtanh_backward.default, None),
    "softplus_backward": (_aten.softplus_backward.default, None),
    "elu_backward": (_aten.elu_backward.default, None),
    "tanh_backward": (_aten.tanh_backward.default, None),
    "sigmoid_backward": (_aten.sigmoid_backward.default, None),
    "silu_backward": (_aten.silu_backward.default, None),
    "mish_backward": (_aten.mish_backward.default, None),
    "hardswish_backward": (_aten.hardswish_backward.default, None),
    "softmax_backward": (lambda g, out, dim: torch._softmax_backward_data(g, out, dim, out.dtype), None),
    "log_softmax_backward": (lambda g, out, dim: torch._log_softmax_backward_data(g, out, dim, out.dtype), None),
    "embedding_backward": (_aten.embedding_dense_backward.default, None),
    "nll_loss_forward": (_aten.nll_loss_forward.default, None),
    "nll_loss_backward": (_aten.nll_loss_backward.default, None),
    "kept_weight_total": (_kept_weight_total, None),
    "masked_rows_sum": (_masked_rows_sum, None),
    "multi_margin_loss_backward": (_aten.multi_margin_loss_backward.default, None),
    "multilabel_margin_loss_backward": (_aten.multilabel_margin_loss_backward.default, None),
    "trilinear": (_aten._trilinear.default, None),
    "cdist_forward": (_aten._cdist_forward.default, None),
    "cdist_backward": (_cdist_backward, None),
    "pdist_backward": (_pdist_backward, None),
    "sdpa_flash": (_sdpa_flash, _on_cpu),
    "sdpa_flash_backward": (_sdpa_flash_backward, _on_cpu),
    "native_batch_norm": (_batch_norm_functional, _numeric_momentum),
    "native_batch_norm_no_stats": (_batch_norm_no_stats, None),
    "native_batch_norm_backward": (_defined(_batch_norm_backward), None),
}


def _register_kernels() -> None:
    for name, (impl, checker) in _KERNELS.items():
        torch_ex.register_implementation(getattr(ltorch, name), impl, impl_name=f"torch_{name}", checker=checker)
    for name, impl in _FUSED_ATTENTION.items():
        torch_ex.register_implementation(getattr(fused_attention, name), impl, impl_name=f"torch_{name}")
    sdpa, impl = ltorch.scaled_dot_product_attention, torch.nn.functional.scaled_dot_product_attention
    torch_ex.register_implementation(sdpa, impl, impl_name="torch_scaled_dot_product_attention", checker=_sdpa_not_math)
    for table in (
        RESIZE_IMPLS,
        NORM_IMPLS,
        SAMPLING_IMPLS,
        SEGMENT_IMPLS,
        HISTOGRAM_IMPLS,
        BAG_IMPLS,
        LOSS_IMPLS,
        SCAN_IMPLS,
        SCATTER_IMPLS,
    ):
        for symbol, impl in table.items():
            name = symbol.symbol_name.removeprefix("ltorch.")
            torch_ex.register_implementation(symbol, impl, impl_name=f"torch_{name}")


def _unpacked(torch_fn):
    """``torch_fn`` returning the one tensor of a one-tensor sequence bare: a composite call has
    as many outputs as tensors it returns, and the code that runs it binds a single output to
    the whole result, which the result's structure then wraps again."""

    def run(*args, **kwargs):
        out = torch_fn(*args, **kwargs)
        return out[0] if isinstance(out, (tuple, list)) and len(out) == 1 else out

    run.__name__ = run.__qualname__ = f"{getattr(torch_fn, '__name__', 'op')}_unpacked"
    return run


#: Composites whose eager kernels compute singular values (eigenvalues) with the vectors where an
#: input requires grad, which LAPACK gives other last bits than the values alone: the compiled
#: forward runs without grad, so a call of them whole would take the values alone. Such a call
#: runs the decomposition (``linalg.singular_values``) instead.
_GRAD_MODE_DEPENDENT = {"linalg_matrix_norm", "linalg_norm", "norm", "tensor_norm", "nuclear_norm", "linalg_cond"}


def _no_input_requires_grad(*args, **kwargs) -> bool:
    return not any(getattr(x, "requires_grad", False) for x in (*args, *kwargs.values()))


def _register_composites() -> None:
    impls = []
    for sym in SYMBOLS:
        if sym.torch_fns and sym.symbol_id not in torch_ex.registry:
            name = sym.symbol_name.removeprefix("ltorch.")
            impl = _unpacked(sym.torch_fns[0]) if sym.returns_sequence else sym.torch_fns[0]
            method = None if sym.returns_sequence else _same_signature_method(sym.torch_fns)
            method = _WRITE_BACK_METHODS.get(name, method)
            checker = _no_input_requires_grad if name in _GRAD_MODE_DEPENDENT else None
            impls.append(Implementation(sym.symbol_id, f"torch_{name}", impl, checker=checker, method=method))
    torch_ex.registry.register(*impls)


#: Symbols of the recording's own whose torch function is a method's under another name: the
#: write-back of an in-place op through a slice (``view_scatters.slice_overwrite``), which
#: ``passes::reinplace`` may drop, runs as ``base.slice_scatter(...)`` where it stays (no frame of ours)
_WRITE_BACK_METHODS = {"slice_overwrite": "slice_scatter"}

# Same-named methods whose receiver is not the function's first argument:
# ``x.where(cond, y)`` is ``torch.where(cond, x, y)``.
_RECEIVER_IS_NOT_FIRST = {"where"}
#: torch's namespace as its module dict: a name not in it goes through torch's module
#: ``__getattr__`` (lazy submodules, deprecated names: never a symbol's function), whose
#: AttributeError for each name that is no torch function was 2 ms of ``import thunder_rs``.
_TORCH_NAMESPACE = vars(torch)


def _same_signature_method(torch_fns):
    """``name`` when the symbol runs ``torch.name`` and also stands for ``Tensor.name``: the
    method takes the same arguments with the first one as its receiver."""
    name = getattr(torch_fns[0], "__name__", None)
    if name is None or name.startswith("_") or name in _RECEIVER_IS_NOT_FIRST:
        return None
    if torch_fns[0] is not _TORCH_NAMESPACE.get(name):
        return None
    method = getattr(torch.Tensor, name, None)
    return name if method is not None and method in torch_fns else None


@contextlib.contextmanager
def decomposing():
    """While active, the torch executor claims no symbol that has a decomposition (composites and
    fused kernels; opaque symbols have none): each runs as its prims, as a fusion executor would
    take it. Tests use it to check decompositions against eager; compiles made inside keep it
    (use a fresh jit)."""
    saved = torch_ex.registry.remove([sym.symbol_id for sym in SYMBOLS if not sym.opaque])
    try:
        yield
    finally:
        torch_ex.registry.register(*saved.values())


_fallbacks_lock = threading.Lock()
#: ``(fallbacks, registry version)`` when the last call found every fallback registered: while
#: neither changed (fallbacks are only ever added), there is nothing to add. A compile asks once
#: per value its program reads (a snapshot runs), and the walk over some 700 fallbacks took 0.2 ms.
_synced: list = [None]


def sync_fallbacks() -> None:
    """Adds the fallback symbols recorded since the last call. Under a lock, and bumped before it
    is released: a thread that finds its symbol added by another must also find the version the
    other bumped, or it would compile with a table cached before the symbol was there."""
    if _synced[0] == (len(FALLBACK_IMPLS), torch_ex.registry.version):
        return
    with _fallbacks_lock:
        added = []
        seen = len(FALLBACK_IMPLS)  # (before the walk: one added meanwhile makes the next call walk again)
        for sid, func in list(FALLBACK_IMPLS.items()):  # another thread may be registering one
            if sid not in torch_ex.registry:
                name = "eager_" + "".join(c if c.isalnum() else "_" for c in getattr(func, "__name__", "op"))
                added.append(Implementation(sid, f"{name}_{sid}", func))
        if added:
            torch_ex.registry.register(*added)
        _synced[0] = (seen, torch_ex.registry.version)


_register_prims()
_register_kernels()
_register_composites()
_declare_inplace_methods()
torch_ex.sync = sync_fallbacks
register_executor(torch_ex)
