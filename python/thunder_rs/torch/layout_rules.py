"""How ATen lays out the outputs of each kind of op (``core.lang.eager_layouts``), by symbol name:
the torch callables each symbol stands for take its rule. Ops named nowhere here are taken to
return contiguous tensors (matmul, softmax, layer_norm, reductions, cat do on the CPU and CUDA).
"""

import functools
import math

import torch

from thunder_rs import prims
from thunder_rs.core.lang import sdp_state
from thunder_rs.core.lang.symint import hint
from thunder_rs.core.lang.eager_layouts import (
    COLUMN_MAJOR,
    LIKE,
    POINTWISE,
    SUGGESTED,
    SUGGESTED_ALL,
    SUGGESTED_ANY,
    dense_strides,
    layout,
    like_strides,
    pointwise_strides,
    rule_strides,
)
from thunder_rs.torch.strides import contiguous_strides, viewed_strides

#: TensorIterator's ops: their output's dims ordered as their operands' strides order them.
_POINTWISE = {
    *prims.DERIVED["Unary"],
    *prims.DERIVED["Binary"],
    *("rpow", "rremainder", "rsub", "rtruediv"),
    *("add", "sub", "true_divide", "div", "floor_divide", "round", "where", "clamp", "clamp_min", "clamp_max"),
    *("lerp", "addcmul", "addcdiv", "copysign", "hypot", "logaddexp", "logaddexp2", "fmax", "fmin", "heaviside"),
    *("xlogy", "xlog1py", "float_power", "ldexp", "nan_to_num", "frac", "sgn", "square", "sinc", "logit", "positive"),
    *("deg2rad", "rad2deg", "isnan", "isinf", "isposinf", "isneginf", "isreal", "logical_not", "logical_and"),
    *("logical_or", "logical_xor", "ndtr", "entr", "tensor_polygamma", "polygamma", "angle", "normalize"),
    *("sigmoid", "relu", "threshold", "hardtanh", "relu6", "leaky_relu", "elu", "softplus", "logsigmoid", "gelu"),
    *("silu", "hardshrink", "softshrink", "tanhshrink", "softsign", "mish", "hardswish", "hardsigmoid", "selu"),
    *("celu", "isclose", "prelu", "min", "max"),  # (min and max of two tensors; their reductions aside)
    # losses with ``reduction="none"`` (a reduced loss is 0-dim)
    *("l1_loss", "mse_loss", "huber_loss", "smooth_l1_loss", "soft_margin_loss", "kl_div", "binary_cross_entropy"),
    *("binary_cross_entropy_with_logits", "poisson_nll_loss", "hinge_embedding_loss", "gaussian_nll_loss"),
    "native_dropout_backward",
}

#: ``empty_like`` of the first tensor (``preserve_format``): copies and conversions, random fills.
_LIKE = {
    *("clone", "to", "type_as", "float", "double", "half", "bfloat16", "int", "long", "short", "char", "byte"),
    *("bool", "type", "dropout", "alpha_dropout", "feature_alpha_dropout", "empty_like", "zeros_like"),
    *("dropout1d", "dropout2d", "dropout3d"),  # (the input times a mask broadcast over it)
    *("ones_like", "full_like", "rand_like", "randn_like", "randint_like", "bernoulli", "fill", "flip", "fliplr"),
    *("flipud", "sort", "argsort", "index_fill", "index_put", "put", "slice_scatter"),
    *("select_scatter", "diagonal_scatter"),
}

#: The memory format the first tensor's strides suggest: pooling, normalization and resampling of
#: images, whose kernels have channels_last forms. (Not the 3-D poolings: an unbatched 4-D input
#: is not channels_last for them.)
_SUGGESTED = {
    *("max_pool2d", "max_pool2d_with_indices", "avg_pool2d", "lp_pool2d", "adaptive_avg_pool2d"),
    *("adaptive_max_pool2d", "adaptive_max_pool2d_with_indices", "pixel_shuffle", "pixel_unshuffle"),
    *("batch_norm", "group_norm", "native_group_norm", "interpolate"),
}

#: Convolutions: channels_last where the input's or the weight's strides suggest it.
_SUGGESTED_ANY = {"conv1d", "conv2d", "conv3d", "conv_transpose2d", "conv_transpose3d", "convolution"}


#: linalg's results, computed by LAPACK (cuSOLVER, MAGMA) in place: their matrices column-major.
_COLUMN_MAJOR = {
    *("inverse", "linalg_inv", "linalg_solve_triangular"),  # (linalg_solve: ``_solution``)
    *("linalg_cholesky", "cholesky_solve", "cholesky_inverse"),
    *("ormqr", "lu_solve", "linalg_ldl_solve"),
    *("linalg_householder_product", "orgqr"),  # (LAPACK's orgqr writes Q over a column-major copy)
}

#: linalg's results of which some are matrices (column-major, as ``_COLUMN_MAJOR``'s) and others
#: not: eigenvalues, pivots, Householder scalars, ``info`` (contiguous, however many batch dims).
_FACTORS = {
    **dict.fromkeys(("linalg_qr", "triangular_solve"), (COLUMN_MAJOR, COLUMN_MAJOR)),
    **dict.fromkeys(("linalg_eigh", "linalg_eig"), (None, COLUMN_MAJOR)),
    "linalg_svd": (COLUMN_MAJOR, None, COLUMN_MAJOR),
    **dict.fromkeys(("geqrf", "linalg_inv_ex", "linalg_cholesky_ex"), (COLUMN_MAJOR, None)),
    **dict.fromkeys(("lu", "linalg_lu_factor", "linalg_lu_factor_ex"), (COLUMN_MAJOR, None, None)),
    **dict.fromkeys(("linalg_ldl_factor", "linalg_ldl_factor_ex"), (COLUMN_MAJOR, None, None)),
}

# -- rules chosen by the call's arguments (``core.lang.eager_layouts``: a rule function) -------------


def _solution(*args, left=True, **kwargs):
    """``linalg.solve``, ``lu_solve``: LAPACK's column-major solution; with ``left=False`` ATen
    solves the adjoint system and returns its solution transposed, row-major (the meta of
    ``linalg_lu_solve``). (``solve_triangular``'s stays column-major either way.)"""
    return (COLUMN_MAJOR, None) if left else None  # (``linalg_solve_ex``'s ``info``: contiguous)


def _lstsq(A, B, rcond=None, *, driver=None):
    """``linalg.lstsq``'s solution: LAPACK solves in place of a column-major copy of ``B`` with
    ``max(m, n)`` rows, of which the solution is the first ``n`` (not dense for a tall ``A``); a
    vector ``B`` is that of a column, squeezed. Its other outputs are contiguous."""
    rows = max(hint(A.shape[-2]), hint(A.shape[-1]))
    vector = B.ndim == A.ndim - 1

    def strides(shape):
        *batch, n, k = (*shape, 1) if vector else shape
        inner = (1, rows) if not vector else (1,)
        return (*contiguous_strides((*batch, rows * k))[:-1], *inner) if batch else inner

    return (strides, None, None, None)


def _matrix_power(A, n, *, out=None):
    """``matrix_power(A, -1)`` is eager's ``linalg_inv(A)`` itself; other powers a contiguous
    clone (of ``A`` or of the inverse), the identity or products."""
    return COLUMN_MAJOR if n == -1 else None


def _tensorinv(A, ind=2, *, out=None):
    """Eager's composite: ``inv`` of ``A`` as a square matrix (column-major), reshaped back: a view
    of it."""

    def strides(shape):
        rows = math.prod(shape[: A.ndim - ind])
        return viewed_strides((rows, rows), (1, rows), tuple(shape))

    return strides


def _svd(input, some=True, compute_uv=True):
    """U column-major (LAPACK's; V is Vh's conjugate transpose: row-major); without
    ``compute_uv`` U and V are zeros, V made as a transpose of a row-major tensor."""
    return (COLUMN_MAJOR, None, None) if compute_uv else (None, None, COLUMN_MAJOR)


def _inner(input, other):
    """ATen's ``inner`` of a 0-dim tensor is ``input * other``; otherwise a matrix product."""
    return POINTWISE if getattr(input, "ndim", 1) == 0 or getattr(other, "ndim", 1) == 0 else None


def _quantile(input, q, *args, **kwargs):
    """ATen gathers each row's quantiles into the last dim of a contiguous tensor and moves that
    dim first (``quantile_compute``): a 1-D ``q``'s dim has stride 1."""
    if getattr(q, "ndim", 0) != 1:
        return None
    return lambda shape: dense_strides(shape, (*range(1, len(shape)), 0))


def _max_unpooled(input, *args, **kwargs):
    """``max_unpool2d`` on the CPU: the format the input suggests; CUDA's kernel writes a
    contiguous output."""
    return SUGGESTED if input.device.type == "cpu" else None


def _addr(input, vec1, vec2, *, beta=1, alpha=1):
    """TensorIterator's order for ``input``, ``vec1`` as a column and ``vec2`` (ATen's
    ``build_addr_iter``)."""
    (n,), strides = layout(vec1)
    column = ((n, 1), viewed_strides((n,), strides, (n, 1)))
    return lambda shape: pointwise_strides(shape, [layout(input), column, layout(vec2)])


def _strided(size, stride, **kwargs):
    """``empty_strided``: the strides it is given (at their hints)."""
    return lambda shape: tuple(hint(n) for n in stride)


def _kron(input, other, *, out=None):
    """The product of views of the operands with their dims interleaved (``a``'s sizes at even
    dims, ``b``'s at odd ones), viewed as ``kron``'s sizes (ATen's ``KronImpl``)."""

    def strides(shape):
        (a, a_strides), (b, b_strides) = layout(input), layout(other)
        ndim = max(len(a), len(b))
        a_dims, b_dims = (1,) * (ndim - len(a)) + a, (1,) * (ndim - len(b)) + b
        a_view = tuple(n for size in a_dims for n in (size, 1))
        b_view = tuple(n for size in b_dims for n in (1, size))
        both = tuple(n for pair in zip(a_dims, b_dims) for n in pair)
        product = pointwise_strides(
            both, [(a_view, viewed_strides(a, a_strides, a_view)), (b_view, viewed_strides(b, b_strides, b_view))]
        )
        return None if product is None else viewed_strides(both, product, tuple(shape))

    return strides


def _diff(input, n=1, dim=-1, prepend=None, append=None):
    """ATen's ``diff``: ``n`` times the difference of two slices of the last result (a
    TensorIterator's output), from the input or its ``cat`` with ``prepend`` and ``append``;
    with ``n=0``, that tensor's copy (``zeros_like`` of it, copied into)."""
    parts = [t for t in (prepend, input, append) if t is not None]

    def strides(shape):
        sizes, strides = layout(input)
        d = dim % len(sizes)
        if len(parts) > 1:
            sizes = (*sizes[:d], sum(layout(t)[0][d] for t in parts), *sizes[d + 1 :])
            strides = rule_strides(SUGGESTED_ALL, sizes, parts) or contiguous_strides(sizes)
        if n == 0:
            return like_strides(shape, (sizes, strides))
        for _ in range(min(n, sizes[d])):
            sizes = (*sizes[:d], sizes[d] - 1, *sizes[d + 1 :])
            strides = pointwise_strides(sizes, [(sizes, strides)] * 2) or contiguous_strides(sizes)
        return strides

    return strides


#: ``fused_attention.output_strides``, which that module puts here (it imports the symbols, which
#: import this module): the layout of the fused kernel torch chooses for an attention call on CUDA.
FUSED_ATTENTION_STRIDES: list = []


def _attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """On the CPU, where torch runs its flash kernel, the layout that kernel gives the output (on
    torch 2.15 the query's order; older kernels allocated ``[B, L, H, D]``): asked of torch once
    per order of the query's dims. Elsewhere the math path's matmul (contiguous); on CUDA the
    fused kernels' records tell their own (``fused_attention``). Where the two layouts differ,
    the choice reads torch's kernel switches (``sdpa_kernel``), which the entry is guarded on."""
    if query.device.type == "cuda":  # (the call recorded whole, under no_grad: the kernel's layout)
        args = (attn_mask, float(dropout_p), bool(is_causal), scale, bool(enable_gqa))
        return FUSED_ATTENTION_STRIDES[0](query, key, value, *args) if FUSED_ATTENTION_STRIDES else None
    order = flash_order_if_otherwise(query)
    if order is None:
        return None
    tensors = tuple(layout(t) if t is not None else None for t in (query, key, value, attn_mask))
    dtypes = tuple(None if t is None else t.dtype for t in (query, key, value, attn_mask))
    choice = _cpu_choice(tensors, dtypes, float(dropout_p), bool(is_causal), scale, bool(enable_gqa), sdp_state.guard())
    return (lambda shape: dense_strides(shape, order)) if choice == _FLASH else None


def flash_order_if_otherwise(query) -> tuple | None:
    """The order (outermost dim first) of the output torch's CPU flash kernel gives a 4-D CPU
    ``query`` where it is not row-major (the math path's); else None: which kernel runs does not
    change the layout then, and nothing need be guarded on the switches for it."""
    if query.device.type != "cpu" or query.ndim != 4:
        return None
    strides = layout(query)[1]
    order = _flash_order(tuple(sorted(range(4), key=lambda d: -strides[d])), query.dtype)
    return None if order == (0, 1, 2, 3) else order


_FLASH = 1  # (``torch.nn.attention.SDPBackend.FLASH_ATTENTION``)


@functools.lru_cache(maxsize=256)
def _cpu_choice(
    tensors: tuple, dtypes: tuple, dropout_p: float, is_causal: bool, scale, enable_gqa: bool, switches
) -> int:
    """``torch._fused_sdp_choice`` of CPU tensors laid out as ``tensors`` (sizes, strides): made
    with ``empty_strided``, whose pages nothing touches; under the kernel ``switches`` in force
    (``sdp_state.state()``: part of the cache key)."""
    q, k, v = (torch.empty_strided(*t, dtype=d) for t, d in zip(tensors[:3], dtypes))
    mask = None if tensors[3] is None else torch.empty_strided(*tensors[3], dtype=dtypes[3])
    with torch._C.DisableTorchFunction():
        try:
            return torch._fused_sdp_choice(q, k, v, mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        except RuntimeError:
            return -1  # (no backend: the call raises torch's error elsewhere)


@functools.cache
def _flash_order(order: tuple, dtype) -> tuple:
    """The order (outermost dim first) of the output of torch's CPU flash kernel for a query whose
    dims are laid out in ``order``: one small call of the kernel."""
    sizes = (2, 3, 5, 4)
    query = torch.empty([sizes[d] for d in order], dtype=dtype).permute([order.index(d) for d in range(4)])
    key = torch.empty(2, 3, 6, 4, dtype=dtype)
    with torch._C.DisableTorchFunction(), torch.no_grad():
        try:
            out = torch._scaled_dot_product_flash_attention_for_cpu(query, key, key)[0]
        except RuntimeError:  # (a dtype the kernel lacks: torch never chooses it then)
            return (0, 1, 2, 3)
    strides = out.stride()
    return tuple(sorted(range(4), key=lambda d: -strides[d]))


def _stft(input, *args, **kwargs):
    """ATen's ``stft``: the FFT of each frame is contiguous, transposed to ``(..., freq, frames)``;
    a real result (``return_complex=False``) is ``view_as_real`` of it."""

    def strides(shape):
        complex_dims = len(shape) - input.ndim - 1  # (1 where the pairs are a last dim)
        *batch, freq, frames = shape[: len(shape) - complex_dims]
        scale = 2 if complex_dims else 1
        batched = (freq * frames * scale,) if batch else ()
        return (*batched, scale, freq * scale, *((1,) if complex_dims else ()))

    return strides


#: symbol name (without ``ltorch.``) -> its rule; ``symbols.register`` gives each symbol's torch
#: callables theirs as it registers them.
RULES_BY_NAME = {
    **dict.fromkeys(_POINTWISE, POINTWISE),
    **dict.fromkeys(_LIKE, LIKE),
    **dict.fromkeys(_SUGGESTED, SUGGESTED),
    **dict.fromkeys(_SUGGESTED_ANY, SUGGESTED_ANY),
    **dict.fromkeys(("cat", "concatenate"), SUGGESTED_ALL),  # (ATen's ``compute_output_memory_format``)
    **dict.fromkeys(_COLUMN_MAJOR, COLUMN_MAJOR),
    **_FACTORS,
    "linalg_lstsq": _lstsq,
    "linalg_tensorinv": _tensorinv,
    "linalg_matrix_power": _matrix_power,
    **dict.fromkeys(("linalg_solve", "linalg_solve_ex", "linalg_lu_solve"), _solution),
    **dict.fromkeys(("quantile", "nanquantile"), _quantile),
    "svd": _svd,
    "inner": _inner,
    "max_unpool2d": _max_unpooled,
    "addr": _addr,
    "kron": _kron,
    "diff": _diff,
    "stft": _stft,
    "empty_strided": _strided,
    "new_empty_strided": lambda self, size, stride, **kwargs: _strided(size, stride),
    "scaled_dot_product_attention": _attention,
}
