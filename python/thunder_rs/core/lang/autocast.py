"""torch's autocast policy, applied while a program is traced.

Under ``torch.autocast`` eager PyTorch casts the floating inputs of some ops before running them
(matmuls to the autocast dtype, precision-sensitive ops to float32). Tracing never reaches
torch's dispatcher, so the language context applies the same policy to each torch call the
program makes (``cast_inputs``): the casts are recorded as ``convert_element_type`` prims, so
proxies carry the dtypes eager gives and the backward casts gradients back as eager's does. A
float32 leaf that requires grad (a parameter) is cast to the autocast dtype once per autocast
region, as eager's cache of casts does (``_cached_cast``): the backward sums its uses' gradients
in that dtype and casts the sum once, as eager's does.

The table follows ``aten/src/ATen/autocast_mode.cpp`` (CPU lists, ``TORCH_LIBRARY_IMPL(aten,
AutocastCPU, m)``) and ``aten/src/ATen/autocast_mode.h`` (the ``AT_FORALL_*`` lists registered for
CUDA) of PyTorch 2.9 to 2.15; ``tests/test_contexts.py`` checks it op by op against the installed
torch. Ops are named as aten names them; overloads share one policy, as they do there.
"""

import contextlib
import contextvars
from typing import NamedTuple

import torch

from thunder_rs import prims
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang import torch_casts
from thunder_rs.core.lang.eager_layouts import laid_out, take_layouts
from thunder_rs.core.lang.torch_casts import nesting
from thunder_rs.core.lang.recorder import active_captures, current, real_inputs
from thunder_rs.core.state.observe import thread_state
from thunder_rs.errors import ThunderRuntimeError

_is_any_autocast_enabled = torch._C._is_any_autocast_enabled

#: Cast every eligible input to the autocast dtype.
LOWER = "lower_precision_fp"
#: Cast every eligible input to float32.
FP32 = "fp32"
#: Cast the first input to float32 when it is eligible and no output dtype is given (aten sets
#: the op's ``dtype`` argument instead, which computes the same); ``fp32_append_dtype`` (norm)
#: behaves the same way.
FP32_SET_OPT_DTYPE = "fp32_set_opt_dtype"
#: Cast every eligible input to the widest eligible dtype (float32 over the autocast dtype).
PROMOTE = "promote"

_CUDA_LOWER = """
    _convolution conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d conv_transpose3d
    convolution cudnn_convolution cudnn_convolution_transpose prelu addmm addmv addr matmul einsum
    mm mv linalg_vecdot linear addbmm baddbmm bmm chain_matmul linalg_multi_dot
    _thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell
    _scaled_dot_product_flash_attention scaled_dot_product_attention
"""
_CUDA_FP32 = """
    acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow softplus
    layer_norm native_layer_norm rms_norm group_norm frobenius_norm nuclear_norm cosine_similarity
    poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div l1_loss
    smooth_l1_loss huber_loss mse_loss margin_ranking_loss multilabel_margin_loss soft_margin_loss
    triplet_margin_loss multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm
    logsumexp upsample_nearest1d _upsample_nearest_exact1d upsample_nearest2d
    _upsample_nearest_exact2d upsample_nearest3d _upsample_nearest_exact3d upsample_linear1d
    upsample_bilinear2d _upsample_bilinear2d_aa upsample_trilinear3d upsample_bicubic2d
    _upsample_bicubic2d_aa
"""
_CUDA_FP32_SET_OPT_DTYPE = """
    prod softmax log_softmax cumprod cumsum linalg_vector_norm linalg_matrix_norm sum norm
"""
_CUDA_PROMOTE = """
    addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot scatter_add
"""
_CPU_LOWER = """
    conv1d conv2d conv3d bmm mm linalg_vecdot baddbmm addmm _addmm_activation addbmm linear
    _convolution matmul conv_tbc mkldnn_rnn_layer conv_transpose1d conv_transpose2d
    conv_transpose3d prelu scaled_dot_product_attention _native_multi_head_attention
"""
_CPU_FP32 = """
    avg_pool3d binary_cross_entropy grid_sampler polar prod quantile nanquantile stft cdist
    grid_sampler_2d _grid_sampler_2d_cpu_fallback grid_sampler_3d trace view_as_complex cholesky
    cholesky_inverse cholesky_solve inverse lu_solve orgqr ormqr pinverse max_pool3d max_unpool2d
    max_unpool3d adaptive_avg_pool3d reflection_pad1d reflection_pad2d replication_pad1d
    replication_pad2d replication_pad3d mse_loss cosine_embedding_loss nll_loss nll_loss2d
    hinge_embedding_loss poisson_nll_loss smooth_l1_loss cross_entropy_loss l1_loss huber_loss
    margin_ranking_loss soft_margin_loss triplet_margin_loss multi_margin_loss ctc_loss kl_div
    multilabel_margin_loss binary_cross_entropy_with_logits fft_fft fft_ifft fft_fft2 fft_ifft2
    fft_fftn fft_ifftn fft_rfft fft_irfft fft_rfft2 fft_irfft2 fft_rfftn fft_irfftn fft_hfft
    fft_ihfft linalg_cond linalg_matrix_rank linalg_solve linalg_cholesky linalg_svdvals
    linalg_eigvals linalg_eigvalsh linalg_inv linalg_householder_product linalg_tensorinv
    linalg_tensorsolve fake_quantize_per_tensor_affine geqrf _lu_with_info qr svd
    triangular_solve fractional_max_pool2d fractional_max_pool3d adaptive_max_pool3d
    multilabel_margin_loss_forward linalg_qr linalg_cholesky_ex linalg_svd linalg_eig linalg_eigh
    linalg_lstsq linalg_inv_ex
"""
_CPU_PROMOTE = "stack cat index_copy"

# Composite ops run their decomposition under autocast, so they take the policy of the listed op
# that decides their result: ``cross_entropy`` is ``log_softmax`` (float32 on CUDA) then
# ``nll_loss`` (float32), ``hstack``/``vstack`` are ``cat``, ``inner`` is ``tensordot`` (on the
# CPU an ``mm``), as are ``einsum`` and ``multi_dot`` on the CPU; ``matrix_power`` is ``matmul``;
# ``affine_grid`` on the CPU a ``bmm``; except in the cases ``_runs_unlisted`` names.
_CUDA_COMPOSITE = {"cross_entropy_loss": FP32, "inner": PROMOTE, "linalg_matrix_power": LOWER, "matrix_power": LOWER}
_CPU_COMPOSITE = {
    "inner": LOWER,
    "hstack": PROMOTE,
    "vstack": PROMOTE,
    "tensordot": LOWER,
    "einsum": LOWER,
    "linalg_multi_dot": LOWER,
    "linalg_matrix_power": LOWER,
    "matrix_power": LOWER,
    "affine_grid": LOWER,
}


def _runs_unlisted(op: str, device_type: str, args) -> bool:
    """Calls of composite ops that reach no listed op: ``inner`` with a 0-d operand is a product,
    and on the CPU ``inner`` of two vectors a dot product and ``einsum`` of one operand a sum;
    ``matrix_power`` to the power 0 or 1 (or a negative one, refused under autocast) multiplies
    nothing."""
    if op == "einsum" and device_type == "cpu":
        return (
            sum(isinstance(x, torch.Tensor) for x in args)
            + sum(isinstance(y, torch.Tensor) for x in args if isinstance(x, (list, tuple)) for y in x)
            <= 1
        )
    if op in ("linalg_matrix_power", "matrix_power"):
        return len(args) > 1 and isinstance(args[1], int) and args[1] < 2
    if op != "inner":
        return False
    ndims = [x.ndim for x in args[:2] if isinstance(x, torch.Tensor)]
    return 0 in ndims or (device_type == "cpu" and ndims == [1, 1])


def _policies(**lists) -> dict[str, str]:
    table: dict[str, str] = {}
    for policy, names in lists.items():
        table.update((name, policy) for name in names.split())
    return table


#: device type -> aten op name -> cast policy.
POLICIES: dict[str, dict[str, str]] = {
    "cuda": {
        **_policies(
            lower_precision_fp=_CUDA_LOWER,
            fp32=_CUDA_FP32,
            fp32_set_opt_dtype=_CUDA_FP32_SET_OPT_DTYPE,
            promote=_CUDA_PROMOTE,
        ),
        **_CUDA_COMPOSITE,
    },
    "cpu": {**_policies(lower_precision_fp=_CPU_LOWER, fp32=_CPU_FP32, promote=_CPU_PROMOTE), **_CPU_COMPOSITE},
}

#: Python names of torch callables whose aten op has another name.
_ATEN_NAMES = {
    "__matmul__": "matmul",
    "__rmatmul__": "matmul",
    "__pow__": "pow",
    "__rpow__": "pow",
    "cross_entropy": "cross_entropy_loss",
    "concat": "cat",
    "concatenate": "cat",
    "grid_sample": "grid_sampler",
}
#: ``F.pad``'s modes whose aten op autocast lists (by the number of padded dims): ``circular`` pads
#: by slices and ``cat``, ``constant`` by ``constant_pad_nd``, neither listed.
_PAD_OPS = {"reflect": "reflection_pad", "replicate": "replication_pad"}
#: ``F.interpolate``'s aten op by mode (``{}``: the number of resized dims; antialiased bilinear
#: and bicubic are ``_upsample_*_aa``): CUDA's autocast lists the upsamples as float32, the CPU's
#: ``adaptive_avg_pool3d`` (``area`` of a 5-D input)
_INTERPOLATE_OPS = {
    "nearest": "upsample_nearest{}d",
    "nearest-exact": "_upsample_nearest_exact{}d",
    "linear": "upsample_linear1d",
    "bilinear": "upsample_bilinear2d",
    "bicubic": "upsample_bicubic2d",
    "trilinear": "upsample_trilinear3d",
    "area": "adaptive_avg_pool{}d",
}


class AutocastState(NamedTuple):
    """The autocast dtype of the CPU and of CUDA, None where autocast is off; part of the cache
    key, so that entering, leaving or changing autocast recompiles."""

    cpu: torch.dtype | None
    cuda: torch.dtype | None

    def devices(self):
        return [(d, dtype) for d, dtype in (("cpu", self.cpu), ("cuda", self.cuda)) if dtype is not None]


#: One ``AutocastState`` per pair of dtypes (a handful a process): ``state`` makes none per call.
_STATES: dict = {}
_is_autocast_enabled, _get_autocast_dtype = torch.is_autocast_enabled, torch.get_autocast_dtype


def state() -> AutocastState | None:
    """The current autocast state, None when autocast is off everywhere (the common, cheap case).
    Read on every compiled call inside a region (its cache key): no list, ``any`` or tuple made
    (~1.6 us before, ~0.8 after)."""
    if not _is_any_autocast_enabled():
        return None
    cpu = _get_autocast_dtype("cpu") if _is_autocast_enabled("cpu") else None
    cuda = _get_autocast_dtype("cuda") if _is_autocast_enabled("cuda") else None
    if cpu is None and cuda is None:
        return None
    found = _STATES.get((cpu, cuda))
    if found is None:
        found = _STATES[(cpu, cuda)] = AutocastState(cpu, cuda)
    return found


def aten_name(func, args: tuple = (), kwargs: dict | None = None) -> str:
    """The aten op eager's autocast sees for a call of ``func``: ``F.pad`` by its mode and padding
    (``reflection_pad2d``), ``F.interpolate`` by its mode and rank (``upsample_bilinear2d``),
    others by name."""
    name = getattr(func, "__name__", "")
    if name == "pad" and func in (torch.nn.functional.pad, torch._C._nn.pad):
        kwargs = kwargs or {}
        mode = args[2] if len(args) > 2 else kwargs.get("mode", "constant")
        padding = args[1] if len(args) > 1 else kwargs.get("pad", ())
        return f"{_PAD_OPS[mode]}{len(padding) // 2}d" if mode in _PAD_OPS else name
    if name == "interpolate" and func is torch.nn.functional.interpolate:
        return _interpolate_op(args, kwargs or {})
    return _ATEN_NAMES.get(name, name)


def _interpolate_op(args: tuple, kwargs: dict) -> str:
    x = args[0] if args else kwargs.get("input")
    mode = args[3] if len(args) > 3 else kwargs.get("mode", "nearest")
    antialias = args[6] if len(args) > 6 else kwargs.get("antialias", False)
    op = _INTERPOLATE_OPS.get(mode, "interpolate").format(getattr(x, "ndim", 2) - 2)
    return f"_{op}_aa" if antialias and mode in ("bilinear", "bicubic") else op


def _eligible(x, device_type: str) -> bool:
    """Tensors autocast casts: floating, on the autocast's device, not float64."""
    return (
        isinstance(x, TensorProxy)
        and x.device.type == device_type
        and x.dtype.is_floating_point
        and x.dtype != torch.float64
    )


def _tensors(args, kwargs):
    for x in (*args, *kwargs.values()):
        if type(x) in (list, tuple):
            yield from x
        else:
            yield x


def _promoted(op: str, device_type: str, lower: torch.dtype, args, kwargs) -> torch.dtype:
    """The widest eligible dtype, as ``at::autocast::promote_type``."""
    current = lower
    for x in _tensors(args, kwargs):
        if not _eligible(x, device_type):
            continue
        if torch.float32 in (current, x.dtype):
            current = torch.float32
        elif x.dtype != lower:
            raise ThunderRuntimeError(
                f"{op}: Unexpected floating ScalarType in at::autocast::prioritize "
                f"({x.dtype} under {device_type} autocast to {lower})"
            )
    return current


#: Per acquisition: ``(id of the recorder, id of a proxy)`` -> ``(recorder, proxy, its cast, the
#: autocast region it was cast in)`` of the casts eager's autocast caches (``_cached_cast``), and
#: under ``ENTRY`` the region the call began in (None outside any region, or with the cache off).
_casts: contextvars.ContextVar[dict | None] = contextvars.ContextVar("thunder_rs_autocast_casts", default=None)
ENTRY = "entry"


@contextlib.contextmanager
def caching_casts():
    """Casts of leaves that require grad are made once per autocast region while the block traces
    a program, as eager's autocast cache makes them (``_cached_cast``)."""
    entry = _region() if nesting() > 0 and torch.is_autocast_cache_enabled() else None
    token = _casts.set({ENTRY: entry})
    try:
        yield
    finally:
        _casts.reset(token)


def _region():
    """The autocast region whose casts torch's cache holds now: a weak reference to its cast of a
    sentinel of ours, the same object until torch clears the cache (``torch.autocast`` does as the
    outermost region is left, and the program may enter and leave regions while it is traced)."""
    return torch_casts.generation()


def _cached_cast(x: TensorProxy, dtype: torch.dtype, lower: torch.dtype):
    """``x`` cast to ``dtype`` as ``at::autocast::cached_cast`` casts it: a float32 leaf that
    requires grad (a parameter, an input leaf; not a view) cast to the autocast dtype is cast once
    per autocast region while torch's cache is enabled (not in inference mode), and every op of the
    region reads that cast, so its backward sums the uses' gradients in the autocast dtype and
    casts the sum once. The cache is keyed by the tensor alone, as torch's: a nested region with
    another autocast dtype reads the cast of the outer one. The cast is made with grad mode on, as
    torch makes it (pytorch#158232), so a use under ``no_grad`` first still carries gradients to
    the uses after it. A cast of a trace input in the region the call began in outlives the call:
    it is torch's cached tensor itself, looked up per call (``_lifted``)."""
    casts = _casts.get()
    leaf = (
        casts is not None
        and dtype == lower
        and x.dtype == torch.float32
        and x.requires_grad
        and x._leaf
        and x._view_grad is None
        and not torch.is_inference_mode_enabled()
    )
    observer = thread_state.observer
    if leaf and observer is not None:
        observer.autocast_cache_read()
    if casts is None or not leaf or not torch.is_autocast_cache_enabled():
        return _to(x, dtype)
    rec, region = current(), _region()
    key = (id(rec), id(x))
    hit = casts.get(key)
    if hit is not None and hit[3] is region:
        return hit[2]
    cast = _lifted(x, dtype) if region is casts[ENTRY] else None
    if cast is None:
        grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(True)
        try:
            cast = _to(x, dtype)
        finally:
            torch._C._set_grad_enabled(grad)
    casts[key] = (rec, x, cast, region)
    return cast


def _to(x: TensorProxy, dtype: torch.dtype) -> TensorProxy:
    """``x.to(dtype)`` as autocast's casts make it (``at::autocast::cached_cast``): a copy laid out
    as ``x`` (preserve_format), so that a cast of a transposed view keeps its order, as eager's
    does, and the ops after it (attention's output, a ``contiguous()`` of its transpose) are laid
    out, and view or copy, as eager's."""
    cast = prims.convert_element_type(x, dtype)
    if laid_out(torch.Tensor.to, (x, dtype), {}):
        take_layouts(torch.Tensor.to, (x, dtype), {}, cast)
    return cast


def _lifted(x: TensorProxy, dtype: torch.dtype) -> TensorProxy | None:
    """A trace input standing for torch's cached cast of the trace input ``x``, which every call
    looks up in torch's cache as it begins (``torch_casts.with_cached_casts``): the region the
    call began in outlives it, so eager's later ops and calls in that region read that same cast,
    and their gradients are summed in ``dtype`` at its ``ToCopyBackward0`` and cast once (a
    siamese pass, a model called on two inputs). None where ``x`` is not such an input as it was
    passed (written since, made per call, of symbolic sizes)."""
    captures = active_captures()
    if captures is None or x._input_vid != x._vid or x._per_call or x._symbolic or x._rebound is not None:
        return None
    real = real_inputs()
    at = getattr(x, "_real_at", None)
    if real is not None and at is None:
        return None
    cast = None if real is None else torch_casts.cached_cast(real[at], x.device.type, dtype)
    return captures.cast_input(x, dtype, cast)


def _cast_all(args, kwargs, device_type: str, dtype: torch.dtype):
    lower = torch.get_autocast_dtype(device_type)

    def cast(x):
        if type(x) in (list, tuple):
            return type(x)(cast(y) for y in x)
        if _eligible(x, device_type) and x.dtype != dtype:
            return _cached_cast(x, dtype, lower)
        return x

    return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}


def _gives_dtype(args, kwargs) -> bool:
    return kwargs.get("dtype") is not None or any(isinstance(a, torch.dtype) for a in args)


def _apply(op: str, policy: str, device_type: str, args, kwargs):
    observer = thread_state.observer
    if observer is not None:
        observer.autocast_entered(device_type)
    lower = torch.get_autocast_dtype(device_type)
    if policy == LOWER:
        return _cast_all(args, kwargs, device_type, lower)
    if policy == FP32:
        return _cast_all(args, kwargs, device_type, torch.float32)
    if policy == PROMOTE:
        return _cast_all(args, kwargs, device_type, _promoted(op, device_type, lower, args, kwargs))
    key = None if args else "input" if "input" in kwargs else "self"
    first = args[0] if args else kwargs.get(key)
    if not _eligible(first, device_type) or _gives_dtype(args, kwargs) or first.dtype == torch.float32:
        return args, kwargs
    cast = _to(first, torch.float32)
    return ((cast, *args[1:]), kwargs) if args else (args, {**kwargs, key: cast})


#: The composite depth at which the program's own code runs: 0, or inside a custom Function's
#: composite, its forward's.
_user_depth: contextvars.ContextVar[int] = contextvars.ContextVar("thunder_rs_user_depth", default=0)


@contextlib.contextmanager
def user_code():
    """The block is the program's own code (a custom Function's forward), though it runs inside
    a composite: autocast casts its calls, as eager's autocast does."""
    token = _user_depth.set(current().depth)
    try:
        yield
    finally:
        _user_depth.reset(token)


@contextlib.contextmanager
def user_code_without_autocast():
    """The block is the program's own code run as eager runs a custom Function's backward: with
    autocast off (``torch.amp.custom_bwd`` turns the forward's state back on)."""
    with contextlib.ExitStack() as stack:
        for device_type in ("cpu", "cuda"):
            if torch.is_autocast_enabled(device_type):
                stack.enter_context(torch.autocast(device_type, enabled=False))
        stack.enter_context(user_code())
        yield


def cast_inputs(func, args: tuple, kwargs: dict):
    """``args`` and ``kwargs`` of a torch call as autocast passes them to the op: cast by the
    policy of each device whose autocast is on. Only calls the program makes are cast; the calls
    inside a decomposition (an open composite) run as aten kernels do, unautocast."""
    if not _is_any_autocast_enabled() or current().depth != _user_depth.get():
        return args, kwargs
    op = aten_name(func, args, kwargs)
    for device_type in ("cpu", "cuda"):
        policy = POLICIES[device_type].get(op)
        if policy is not None and torch.is_autocast_enabled(device_type) and not _runs_unlisted(op, device_type, args):
            args, kwargs = _apply(op, policy, device_type, args, kwargs)
    return args, kwargs


def cast_inside(op: str, *args):
    """``args`` of aten ``op`` called by a torch function that eager writes in Python
    (``F.local_response_norm``), whose ops ltorch calls one by one from the program's own code:
    eager's autocast casts each op such a function calls, by that op's policy. Unchanged inside a
    decomposition (where aten kernels run unautocast)."""
    if not _is_any_autocast_enabled() or current().depth != _user_depth.get():
        return args
    for device_type in ("cpu", "cuda"):
        policy = POLICIES[device_type].get(op)
        if policy is not None and torch.is_autocast_enabled(device_type):
            args, _ = _apply(op, policy, device_type, args, {})
    return args


@contextlib.contextmanager
def entered(recorded: AutocastState):
    """Runs the block under the autocast state ``recorded``, whatever the caller's."""
    with contextlib.ExitStack() as stack:
        for device_type in ("cpu", "cuda"):
            dtype = getattr(recorded, device_type)
            if dtype is not None:
                stack.enter_context(torch.autocast(device_type, dtype=dtype))
            elif torch.is_autocast_enabled(device_type):
                stack.enter_context(torch.autocast(device_type, enabled=False))
        yield
