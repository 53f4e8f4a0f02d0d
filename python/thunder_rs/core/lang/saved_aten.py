"""What eager's autograd node of each one-tensor aten op saves of its tensor (``self``) and result,
as ``derivatives.yaml`` (shipped in torch's wheel: ``torchgen/packaged/autograd``) tells it: the
tensors its backward formulas name, less those only read for their sizes, dtype or options.

Generated, for the functional ops whose every overload takes one tensor and returns one, none
with a conditional saving (``wrap_opt_if``). ``saved_ops`` takes an in-place variant only where
the functional op saves no input (its result is ``self`` after the write; where eager's formula
reads ``self``, its in-place node saves a copy of it, which no write reaches).
``tests/test_saved_aten.py`` derives the table from the shipped file again (``--run-slow``) and
checks every entry against eager's own answer. ``saved_ops`` maps the names to torch's functions.
"""

#: The ops that save neither their tensor nor their result.
SAVES_NONE = frozenset(
    (
        "_conj _conj_physical _fft_c2c _fft_c2r _lazy_clone _neg_view _neg_view_copy _reshape_alias "
        "_reshape_copy _test_warn_in_autograd _to_copy _unsafe_view alias alias_copy as_strided "
        "as_strided_copy ceil channel_shuffle clone constant_pad_nd cumsum deg2rad diag_embed diagonal "
        "diagonal_copy expand expand_copy flip floor frac lift lift_fresh lift_fresh_copy mean narrow_copy "
        "neg permute permute_copy pixel_shuffle pixel_unshuffle poisson rad2deg repeat roll rot90 round "
        "select select_copy sign slice slice_copy squeeze squeeze_copy sum t t_copy trace transpose "
        "transpose_copy tril triu trunc unfold unfold_copy unsqueeze unsqueeze_copy upsample_bicubic2d "
        "upsample_bilinear2d upsample_linear1d upsample_nearest1d upsample_nearest2d view view_as_real "
        "view_as_real_copy view_copy "
    ).split()
)


#: The ops that save their tensor (``self``).
SAVES_SELF = frozenset(
    (
        "_adaptive_avg_pool2d _adaptive_avg_pool3d _fft_r2c _test_autograd_multiple_dispatch_view "
        "_test_autograd_multiple_dispatch_view_copy abs acos acosh angle asin asinh atan atanh avg_pool2d "
        "avg_pool3d celu cos cosh digamma elu erf erfc erfinv gelu glu hardshrink hardsigmoid hardswish "
        "hardtanh i0 leaky_relu lgamma linalg_matrix_exp linalg_matrix_sqrth log log10 log1p log2 logit "
        "max_pool2d mish mvlgamma nan_to_num nansum reflection_pad1d reflection_pad2d renorm "
        "replication_pad1d replication_pad2d silu sin sinc sinh softplus softshrink special_bessel_j0 "
        "special_bessel_y0 special_entr special_modified_bessel_i0 special_modified_bessel_k0 threshold var "
    ).split()
)


#: The ops that save their result.
SAVES_RESULT = frozenset(
    (
        "_log_softmax _safe_softmax _softmax exp exp2 expm1 reciprocal relu rsqrt sigmoid special_ndtri sqrt tan tanh "
    ).split()
)


#: The ops that save their tensor and their result.
SAVES_SELF_AND_RESULT = frozenset(
    (
        "_pdist_forward _sparse_log_softmax _sparse_softmax _standard_gamma amax amin cholesky_inverse "
        "cumprod linalg_vector_norm logcumsumexp logsumexp norm prod sgn special_bessel_j1 special_bessel_y1 "
        "special_erfcx special_i0e special_i1 special_i1e special_log_ndtr special_modified_bessel_i1 "
        "special_modified_bessel_k1 std "
    ).split()
)
