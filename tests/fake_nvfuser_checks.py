"""The argument checks of the stand-in ``fake_nvfuser_direct``'s data-movement ops, as the
``nvfuser_direct`` 0.2.36 bindings make them (``python/python_direct/ops.cpp``: ``NVF_CHECK``, a
``RuntimeError`` "Expected <condition> . <message>", ``fake_nvfuser_binding.nvf_check``)."""

import math

import torch

from fake_nvfuser_binding import nvf_check as _check
from fake_nvfuser_binding import nvf_error
from fake_nvfuser_promotion import DataType


def broadcast_in_dim(arg, shape, broadcast_dims, symbolic_extent) -> list:
    """``broadcast_in_dim_fn``: one output dim per input dim, each in range (``wrapDim``) and named
    once; the input's dims go to the named ones in their order (a mask of the broadcast dims: ``[2,
    1]`` is ``[1, 2]``), and ``expand`` takes an extent other than 1 only to itself. The named dims,
    wrapped and sorted."""
    _check(len(shape) >= len(broadcast_dims), "(output_shape.size())>=(nonbroadcast_dims.size())")
    _check(
        arg.ndim == len(broadcast_dims),
        "(input_ndim)==(std::ssize(nonbroadcast_dims))",
        f"Found {arg.ndim} vs {len(broadcast_dims)}. ",
    )
    for d in broadcast_dims:
        _check(
            -len(shape) <= d < len(shape),
            "dim >= 0 && dim < ndim",
            f"Tried to access out of boundary index {d if d >= 0 else d + len(shape)}. total index: {len(shape)}",
        )
    dims = [d % len(shape) for d in broadcast_dims]
    for d in dims:
        _check(
            dims.count(d) == 1,
            "is_broadcast_dim.at(nonbroadcast_dim)",
            f"nonbroadcast_dim ({d}) is specified more than once.",
        )
    dims.sort()
    for extent, d in zip(arg.meta.shape, dims):
        size = shape[d]
        _check(
            extent in (1, symbolic_extent) or type(size) is not int or size in (-1, extent),
            "inp_id_size_int == expanded_size_int",
            f"Invalid expand size, {size}, for an input extent {extent}",
        )
    return dims


def squeeze(arg, dims, squeeze_expanded, symbolic_extent) -> list:
    """``squeeze`` (csrc/ops/alias.cpp): at most as many dims as the input's, each in range, and each
    a broadcast (extent 1, or an expanded one under ``squeeze_expanded``) unless symbolic (it may
    concretize to one); torch's squeeze leaves a dim of another extent where nvFuser refuses it.
    The dims, wrapped."""
    _check(
        len(dims) <= arg.ndim,
        "(int64_t)dims.size() <= ndims",
        "The dims to squeeze must be <= the number of dims of the input tensor. "
        f"Squeeze dims: {len(dims)} Input Tensor dims: {arg.ndim}",
    )
    wrapped = [d + arg.ndim if d < 0 else d for d in dims]
    for d in wrapped:
        _check(
            0 <= d < arg.ndim,
            "(dim >= 0) && (static_cast<size_t>(dim) < to_squeeze.size())",
            f"Squeeze dim is outside of Tensor size! Tensor Size: {arg.ndim} Dim: {d}",
        )
    for d in wrapped:
        extent, expanded = arg.meta.shape[d], arg.expanded[d]
        if extent == symbolic_extent and not expanded:
            continue  # (symbolic: checked once concretized)
        _check(extent == 1 or expanded, "id->isBroadcast()", "Can not squeeze non-broadcasting dimension(s).")
        _check(
            squeeze_expanded or not expanded,
            "squeeze_expanded || !id->hasExpandedExtent()",
            f"Refusing to squeeze expanded IterDomain of dim {d}. To force removal of this axis, use "
            "squeeze_expanded=true.",
        )
    return wrapped


def slice_(arg, start, end, strides):
    """``slice_fn`` (python_direct/ops.cpp): as many bounds as dims, constant ones in order, unit steps."""
    _check(
        arg.ndim == len(start),
        "(num_dims)==(std::ssize(start_vec))",
        f"Found {arg.ndim} vs {len(start)}. Number of tensor dimensions does not match slice dimensions!",
    )
    _check(
        len(start) == len(end), "start_vec.size() == end_vec.size()", "Slice indexing attribute dimensions don't match!"
    )
    _check(
        strides is None or len(strides) == len(start),
        "start_vec.size() == stride_vec.size()",
        "Slice start_indices and strides don't match!",
    )
    for s, e, step in zip(start, end, strides or [1] * len(start)):
        _check(
            not isinstance(s, int) or s >= 0,
            "!start_idx->isConstInt() || start_idx->evaluate().as<int64_t>() >= 0",
            f"Slice operation start_indices must be greater than or equal to 0. Start Indices: {s}",
        )
        _check(
            not isinstance(s, int) or not isinstance(e, int) or e >= s,
            "!start_idx->isConstInt() || !end_idx->isConstInt() || "
            "end_idx->evaluate().as<int64_t>() >= start_idx->evaluate().as<int64_t>()",
            "Slice operation end_indices must be greater than or equal to start_indices. "
            f"Start Indices: {s} End Indices: {e}",
        )
        _check(
            step == 1,
            "stride_idx->isConstInt() && stride_idx->evaluate().as<int64_t>() == 1",
            "nvFuser Limitation: All slice operation strides must be of const size 1.",
        )


def indexing(arg, index, dim):
    """gather's and take_along_axis's (python_direct/ops.cpp): ranks equal, ``dim`` in range."""
    _check(
        arg.ndim == index.ndim,
        "arg->nDims() == index->nDims()",
        f"Tensor arguments have different dimensions {arg.ndim} and {index.ndim}",
    )
    _check(
        -arg.ndim <= dim < arg.ndim,
        "dim >= -num_dims && dim < num_dims",
        f"Tensor arguments have dimension {arg.ndim} so dim argument must satisfy {-arg.ndim} <= dim < {arg.ndim}, "
        f"but received {dim}",
    )


def wrap_dim(dim: int, ndim: int) -> int:
    """``wrapDim`` (csrc/base.h): a dim in [-ndim, ndim), wrapped; else nvFuser's RuntimeError."""
    wrapped = dim + ndim if dim < 0 else dim
    _check(
        0 <= wrapped < ndim,
        "dim >= 0 && dim < ndim",
        f"Tried to access out of boundary index {wrapped}. total index: {ndim}",
    )
    return wrapped


def permute(ndim, dims):
    _check(
        len(dims) == ndim,
        "(num_dims)==(std::ssize(dims))",
        f"Found {ndim} vs {len(dims)}. Operator permute expects `dims` argument to have the same length as input!",
    )
    # ir/utils.cpp normalizeNew2Old (past permute's early return for a 0-dim tensor)
    _check(
        all(0 <= (d + ndim if d < 0 else d) < ndim for d in dims),
        "std::ranges::none_of(new2old, [ndims](int64_t entry) { return entry < 0 || entry >= ndims; })",
        f"New2Old axes are not within the number of dimensions of the provided domain.\t{list(dims)}",
    )


def _same_category(a, b):
    """``hasSimilarDtype`` (alias.cpp): both floating, both integral, or both bool."""
    return a == b or (a.is_floating_point == b.is_floating_point and (a == torch.bool) == (b == torch.bool))


def pad(ndim, widths, dtype, value_dtype):
    """``pad_fn`` and ``pad`` (alias.cpp): at most two widths per dim, a value of the tensor's kind."""
    _check(
        len(widths) <= 2 * ndim,
        "(int64_t)pad_widths.size() <= 2 * arg->nDims()",
        "Number of pad widths must be at most twice the input dimension",
    )
    _check(
        value_dtype is None or _same_category(dtype, value_dtype),
        "hasSimilarDtype(dt, value->getDataType())",
        "Tensor arg and pad value must have the same dtype.",
    )


def cat(dtypes, ranks, dim):
    """``cat`` (alias.cpp): some tensors, of one dtype and one rank, ``dim`` in range."""
    _check(len(dtypes) > 0, "!inputs.empty()", "No input tensor given")
    _check(
        all(d == dtypes[0] for d in dtypes),
        "inp->getDataType() == dtype",
        "Can't concatenate tensors with different data types: " + ", ".join(DataType(d).name for d in dtypes),
    )
    _check(all(r == ranks[0] for r in ranks), "ndims == i_ndims", f"Unexpected number of dimensions: {ranks}")
    wrapped = dim + ranks[0] if dim < 0 else dim
    _check(0 <= wrapped < ranks[0], "cat_dim >= 0 && cat_dim < ndims", f"Invalid dimension to cat: {wrapped}")


def iota(length, start, step, dtype):
    """``iota`` (arith.cpp), given its operands' dtypes: an integral length, a start and step of
    ``dtype``'s kind."""
    _check(
        not length.is_floating_point,
        "isIntegralType(length->getDataType())",
        f"length must be integer, but get dtype {length}",
    )
    for what, got in (("start", start), ("step", step)):
        _check(
            got is None or got.is_floating_point == dtype.value.is_floating_point,
            f"isIntegralType({what}->getDataType()) == isIntegralType(dtype) && ...",
            f"iota: {what} dtype does not match specified dtype argument, should be {dtype.name} but get {got}",
        )


def iota_constants(start, step) -> None:
    """``iota``'s checks of its constant start and step (arith.cpp, ``NVF_ERROR``: internal asserts):
    a floating one finite, a step not zero. ``None``: not a constant (a scalar input or computed)."""
    for what, value, line in (("start", start, 427), ("step", step, 433)):
        if isinstance(value, float) and not math.isfinite(value):
            condition = f"std::isfinite({what}->value().as<double>())"
            message = "iota: length, start, step must be finite numbers."
            nvf_error(False, condition, message, at=f"csrc/ops/arith.cpp:{line}")
    if step is not None and step == 0:
        nvf_error(
            False,
            "!step->isConstScalar() || !step->isZero()",
            "iota: step value must not equal zero.",
            at="csrc/ops/arith.cpp:438",
        )
