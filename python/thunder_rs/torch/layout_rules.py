"""How ATen lays out the outputs of each kind of op (``core.lang.eager_layouts``), by symbol name:
the torch callables each symbol stands for take its rule. Ops named nowhere here are taken to
return contiguous tensors (matmul, softmax, layer_norm, reductions, cat do on the CPU and CUDA).
"""

from thunder_rs import prims
from thunder_rs.core.lang.eager_layouts import (
    COLUMN_MAJOR,
    LIKE,
    POINTWISE,
    SUGGESTED,
    SUGGESTED_ALL,
    SUGGESTED_ANY,
)

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
    *("inverse", "linalg_inv", "linalg_inv_ex", "linalg_solve", "linalg_solve_ex", "linalg_solve_triangular"),
    *("triangular_solve", "linalg_cholesky", "linalg_cholesky_ex", "cholesky_solve", "cholesky_inverse"),
    *("linalg_qr", "geqrf", "ormqr", "linalg_svd", "linalg_eigh", "linalg_lu_factor", "linalg_lu_factor_ex"),
    *("lu", "linalg_lu_solve", "lu_solve", "linalg_ldl_factor", "linalg_ldl_factor_ex", "linalg_ldl_solve"),
}

#: symbol name (without ``ltorch.``) -> its rule; ``symbols.register`` gives each symbol's torch
#: callables theirs as it registers them.
RULES_BY_NAME = {
    **dict.fromkeys(_POINTWISE, POINTWISE),
    **dict.fromkeys(_LIKE, LIKE),
    **dict.fromkeys(_SUGGESTED, SUGGESTED),
    **dict.fromkeys(_SUGGESTED_ANY, SUGGESTED_ANY),
    **dict.fromkeys(("cat", "concatenate"), SUGGESTED_ALL),  # (ATen's ``compute_output_memory_format``)
    **dict.fromkeys(_COLUMN_MAJOR, COLUMN_MAJOR),
    "svd": (COLUMN_MAJOR, None, None),  # (U; V is Vh's conjugate transpose: row-major)
}
