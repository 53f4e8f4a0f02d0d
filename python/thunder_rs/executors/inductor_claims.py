"""What the Inductor executor claims: the torch executor's keys whose implementations are pure
torch calls that Inductor compiles to eager's values, by prim family and by ltorch family file,
less the symbols listed below with the reason each stays with the torch executor.

A family is claimed only when listed, so that a new family (a new file of ltorch symbols) stays
eager until someone has checked it against Inductor.
"""

import math
from collections.abc import Mapping
from dataclasses import replace

import torch
from torch._subclasses.fake_tensor import is_fake

from thunder_rs.torch import SYMBOLS
from thunder_rs.torch.onednn import tensor_gelu_at_inf

#: Prim families (``prims.TABLE``) whose prims are pure tensor functions.
PRIM_FAMILIES = frozenset({"Unary", "Binary", "Elementwise", "Shape", "Reduce", "Scan", "Linalg", "Conv", "Index"})
#: Prims claimed from other families.
PRIMS = frozenset({"full", "iota"})
#: ltorch family files (``thunder_rs.torch.<name>``) whose symbols Inductor compiles.
SYMBOL_FAMILIES = frozenset(
    {
        "elementwise",
        "reductions",
        "scan",
        "conv",
        "creation",
        "shape",
        "joins",
        "conversions",
        "indexing",
        "linalg",
        "nn",
        "layer_norms",
        "batch_norms",
        "base_losses",
        "attention",
        "pooling",
        "adaptive_pooling",
        "sliding_blocks",
        "interpolate",
        "autograd",
        "special",
        "activations",
        "losses",
        "view_scatters",
        "padding",
        "arrange",
        "diagonals",
        "copies",
        "products",
        "norms",
        "normalization",
        "layers",
        "sampling",
    }
)

#: Keys (prim names, ``ltorch.`` symbol names) of the families above left to the torch executor.
NOT_CLAIMED = {
    "device_put": "moves data between devices, outside what one kernel computes",
    # Eager checks these on tensor values, which Inductor's decompositions do not.
    "ltorch.binary_cross_entropy": "eager checks that input is in [0, 1]",
    "ltorch.gaussian_nll_loss": "eager checks that var >= 0",
    "ltorch.mvlgamma": "eager checks that every element is > (p - 1) / 2",
    "ltorch.linalg_matrix_power": "a negative power inverts, which eager checks for singular matrices",
    "ltorch.linalg_matrix_norm": "the 2-norm and nuclear norm are SVDs (opaque linear algebra)",
    "ltorch.linalg_norm": "matrix orders are SVDs (opaque linear algebra)",
    # Random ops draw from eager's generator in program order.
    "ltorch.dropout": "random",
    "ltorch.native_dropout": "random",
    "ltorch.scaled_dot_product_attention": "dropout_p draws random numbers; the CPU flash kernel runs eagerly",
    # They write their inputs.
    "ltorch.batch_norm": "writes running_mean and running_var",
    "ltorch.instance_norm": "writes running statistics",
    # Inductor runs aten._embedding_bag as a fallback kernel (eager's, on contiguous copies): nothing to fuse.
    # (max_norm's write of weight is ltorch.embedding_renorm's, before the bags.)
    "ltorch.embedding_bag": "Inductor runs eager's kernel for it (make_fallback), on contiguous copies",
    "ltorch.embedding_bag_forward": (
        "eager's kernel whose bookkeeping the backward reads: its CPU sum fast path leaves the position-to-bag map "
        "empty (filled in by the implementation), where a compiled graph takes the meta kernel's shape"
    ),
    # The result depends on tensor values beyond what a layout fixes, or on memory.
    "ltorch.repeat_interleave": "a tensor of repeats sets the output's shape",
    "ltorch.as_strided": "reads storage as laid out in memory, which a compiled graph need not keep",
    "ltorch.as_strided_copy": "reads storage as laid out in memory",
    "ltorch.max_unpool1d": "scatters to indices from the data",
    "ltorch.max_unpool2d": "scatters to indices from the data",
    "ltorch.max_unpool3d": "scatters to indices from the data",
    # Eager's kernels round by a formula Inductor's lowerings do not follow (ulps to a unit off).
    "ltorch.linspace": "eager's kernel rounds one FMA per point (bfloat16's in float32); Inductor's lowering does not",
    "ltorch.logspace": "eager's kernel takes std::pow in float64 of exponents summed in float64",
    # Uninitialised memory, complex conjugation views: nothing for Inductor to compute.
    "ltorch.empty": "uninitialised",
    "ltorch.empty_like": "uninitialised",
    "ltorch.empty_strided": "uninitialised, laid out by its strides",
    "ltorch.new_empty": "uninitialised",
    "ltorch.new_empty_strided": "uninitialised, laid out by its strides",
    "ltorch.conj": "a conjugate view",
    "ltorch.resolve_conj": "a conjugate view",
    "ltorch.resolve_neg": "a negative view",
    "ltorch.conj_physical": "complex",
}


def _floating(*operands, **kwargs) -> bool:
    """Whether a division computes in floating point: integer division by zero raises in eager
    and is unchecked, or kills the process, in Inductor's kernels, so integer divisions (floor,
    trunc, fmod, remainder) stay eager."""
    for a in operands[:2]:
        if isinstance(a, torch.Tensor) and (a.dtype.is_floating_point or a.dtype.is_complex):
            return True
        if isinstance(a, (float, complex)):
            return True
    return False


def _true_or_floating_division(a, b, *, rounding_mode=None, **kwargs) -> bool:
    """``torch.div`` without a rounding mode divides integers in floating point."""
    return rounding_mode is None or _floating(a, b)


def _same_device(a, *args, **kwargs) -> bool:
    """``Tensor.to`` that keeps the device (a copy to another device is not a kernel's work)."""
    for x in (*args, *kwargs.values()):
        if isinstance(x, torch.Tensor):
            if x.device != a.device:
                return False
        elif isinstance(x, (str, torch.device)):
            if torch.device(x) != a.device:
                return False
        elif isinstance(x, int) and not isinstance(x, bool):
            return False  # a CUDA device ordinal
    return True


def _no_mask(a, key) -> bool:
    """Indexing by a boolean mask gives a shape that depends on the mask's values."""
    entries = key if isinstance(key, tuple) else (key,)
    return not any(isinstance(e, torch.Tensor) and e.dtype in (torch.bool, torch.uint8) for e in entries)


def _avg_pool_backward_divisor_exact(
    grad_output, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override=None
) -> bool:
    """Inductor's avg_pool backward divides a window that ``ceil_mode`` lets overhang the input by
    the whole kernel size where eager divides by the clipped window when ``count_include_pad``
    (pytorch/pytorch#198119, open in torch 2.15): those stay eager."""
    return not (ceil_mode and count_include_pad and divisor_override is None)


def _upsample_backward_scales_exact(grad_output, input_size, mode, align_corners, scales, antialias=False) -> bool:
    """Inductor's ``upsample_*_backward`` maps indices by the sizes' ratio, ignoring explicit
    scales, where eager uses the scales (``interpolate(scale_factor=1.7)``): those stay eager
    unless every scale is the sizes' ratio."""
    spatial_out, spatial_in = tuple(grad_output.shape)[2:], tuple(input_size)[2:]
    return all(
        s is None or (_is_int(o) and _is_int(i) and s == o / i) for s, o, i in zip(scales, spatial_out, spatial_in)
    )


def _nonempty_convolution(grad_output, input, weight, *args, **kwargs) -> bool:
    """For an empty batch eager's ``convolution_backward`` returns the (zero) weight gradient
    with other strides than its meta kernel says, which the compiled region asserts on: eager.
    A symbolic size is 2 or more (claiming runs outside tracing: a size is not compared there)."""
    return not any(_is_int(n) and n == 0 for n in (*input.shape, *grad_output.shape))


def _raises_unless_eager(grad_output, input, negative_slope, self_is_result=False) -> bool:
    """An in-place leaky relu's backward with a negative slope is an error eager's kernel raises
    when it runs, which Inductor's decomposition would not: eager's."""
    return not (self_is_result and negative_slope < 0)


def gelu_as_eager(input, approximate="none"):
    """``ltorch.gelu`` in an Inductor region: Inductor's gelu, with eager's value at +inf where
    eager's gelu of a tensor of this layout runs oneDNN's kernel (NaN with AVX-512, where
    Inductor's kernel gives inf; elsewhere within float32's rounding of eager's). Decided while
    the region is traced to its FX graph, on the layout the graph gives the tensor (eager's), with
    ``torch.backends.mkldnn.enabled`` as the region's call reads it (``CompiledRegion``)."""
    out = torch.nn.functional.gelu(input, approximate=approximate)
    value = tensor_gelu_at_inf(input, approximate)
    return out if value is None else torch.where(input == math.inf, value, out)


def _fused_alpha(input, other, alpha) -> bool:
    """Whether eager's CPU kernel computes ``input + alpha * other`` as one FMA that Inductor's
    lowering (a multiply, then an add) would round twice: float32 or float64 tensors of one dtype
    and a constant ``alpha``, while the region is traced to its FX graph (fake tensors; run
    eagerly, the torch call is eager's)."""
    return (
        type(alpha) in (int, float)
        and alpha != 1
        and isinstance(other, torch.Tensor)
        and is_fake(input)
        and input.dtype in (torch.float32, torch.float64)
        and other.dtype == input.dtype
        and input.device.type == other.device.type == "cpu"
    )


def _fma(input, other, alpha):
    input, other = torch.broadcast_tensors(input, other)
    return torch.ops.prims.fma(other, torch.scalar_tensor(alpha, dtype=input.dtype), input)


def add_as_eager(input, other, *, alpha=1):
    """``torch.add`` in an Inductor region: with an ``alpha``, eager's ``fma(other, alpha, input)``."""
    return _fma(input, other, alpha) if _fused_alpha(input, other, alpha) else torch.add(input, other, alpha=alpha)


def sub_as_eager(input, other, *, alpha=1):
    """``torch.sub`` in an Inductor region: with an ``alpha``, eager's ``fma(other, -alpha, input)``."""
    return _fma(input, other, -alpha) if _fused_alpha(input, other, alpha) else torch.sub(input, other, alpha=alpha)


def rsub_as_eager(a, b, *, alpha=1):
    """``torch.rsub`` (``b - alpha * a``) in an Inductor region: with an ``alpha``, eager's
    ``fma(a, -alpha, b)`` (its kernel is ``sub(b, a, alpha)``)."""
    if isinstance(b, torch.Tensor) and _fused_alpha(b, a, alpha):
        return _fma(b, a, -alpha)
    return torch.rsub(a, b, alpha=alpha)


def _alpha_as_eager(input, other, *, alpha=1) -> bool:
    """add, sub and rsub with an ``alpha`` on the CPU: claimed where the region computes eager's
    values: without one, of integers, or as eager's one FMA of float32/float64 tensors of one
    dtype (``_fused_alpha``). Elsewhere eager's kernel rounds by the element's place in its loop:
    in half precision its vectorised loop rounds ``fma(other, alpha, input)`` in float32 once and
    the scalar loop of each iteration's last elements (a count set by the CPU's vector width and
    the iteration's layout) rounds the product to the dtype first; with a number ``other`` the
    scalar loop adds ``alpha * other`` rounded once for the loop, in float32 too; mixed dtypes
    cast in the loop. Those stay with the torch executor, eager's kernel. (On CUDA the claim is
    as it was.)"""
    if type(alpha) in (int, float) and alpha == 1:
        return True
    tensors = [t for t in (input, other) if isinstance(t, torch.Tensor)]
    if any(t.device.type != "cpu" for t in tensors):
        return True
    if all(type(x) is int or (isinstance(x, torch.Tensor) and not x.dtype.is_floating_point) for x in (input, other)):
        return type(alpha) is int and not any(t.dtype.is_complex for t in tensors)
    return (
        type(alpha) in (int, float)
        and len(tensors) == 2
        and tensors[0].dtype == tensors[1].dtype
        and tensors[0].dtype in (torch.float32, torch.float64)
        and not any(_one_element(t) for t in tensors)  # (eager's kernel takes one as a number)
    )


def _one_element(t) -> bool:
    """Whether ``t`` has one element (or may have: a symbolic size), which eager's CPU kernel reads
    as a scalar operand, rounding ``alpha * other`` once for the loop's last elements."""
    return not all(type(n) is int for n in t.shape) or math.prod(t.shape) == 1


#: Symbols whose region implementation is not the torch executor's, by name (called as functions).
REGION_FUNCTIONS = {
    "ltorch.gelu": gelu_as_eager,
    "ltorch.add": add_as_eager,
    "ltorch.sub": sub_as_eager,
    "ltorch.rsub": rsub_as_eager,
}
#: Symbols whose region implementation reads ``torch.backends.mkldnn.enabled`` when traced.
SWITCH_READERS = frozenset({"ltorch.gelu"})


def _is_int(n) -> bool:
    """Whether a size is a constant (a symbolic one, a ``SymInt``, is only compared while tracing)."""
    return type(n) is int


CHECKERS = {
    **{name: _floating for name in ("div", "fmod", "remainder")},
    **{f"ltorch.{name}": _floating for name in ("floor_divide", "fmod", "remainder", "rremainder")},
    "ltorch.div": _true_or_floating_division,
    "ltorch.to": _same_device,
    "ltorch.getitem": _no_mask,
    "ltorch.avg_pool2d_backward": _avg_pool_backward_divisor_exact,
    "ltorch.avg_pool3d_backward": _avg_pool_backward_divisor_exact,
    "ltorch.upsample_backward": _upsample_backward_scales_exact,
    "convolution_backward": _nonempty_convolution,
    "ltorch.leaky_relu_backward": _raises_unless_eager,
    **{f"ltorch.{name}": _alpha_as_eager for name in ("add", "sub", "rsub")},
}


def claimed_implementations(torch_impls: Mapping, prim_table) -> list:
    """The Inductor executor's ``Implementation`` records: those of the keys of ``torch_impls``
    (the torch executor's records) it claims, which have no checker there, with Inductor's
    checker, its region function where it has one (``REGION_FUNCTIONS``) and no in-place form
    (regions are compiled whole)."""
    names = {info.name for info in prim_table if info.family in PRIM_FAMILIES} | PRIMS
    keys = {name: name for name in names}
    for sym in SYMBOLS:
        if sym.__module__.removeprefix("thunder_rs.torch.") in SYMBOL_FAMILIES and not sym.opaque:
            keys[sym.symbol_id] = sym.symbol_name
    claimed = []
    for key, name in keys.items():
        impl = torch_impls.get(key)
        if impl is None or impl.checker is not None or name in NOT_CLAIMED:
            continue
        if name in REGION_FUNCTIONS:
            impl = replace(impl, fn=REGION_FUNCTIONS[name], method=None, method_args=None)
        claimed.append(replace(impl, checker=CHECKERS.get(name), inplace_method=None))
    return claimed
