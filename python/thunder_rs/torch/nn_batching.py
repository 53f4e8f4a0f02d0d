"""Batching rules of ``torch.vmap`` over traced tensors for the layers of ``torch.func``'s model
ensembling and per-sample programs (``core.lang.vmap``): matmul and linear, convolution, pooling,
batch_norm, layer_norm, group_norm, embedding, einsum, scaled_dot_product_attention, dropout,
cross_entropy and nll_loss.

- matmul broadcasts its batch dims, so the operands' level dims are its leading batch dims
  (a vector operand is made a matrix first, as matmul does);
- a convolution of a batched input with unbatched weights folds the levels into its batch dim;
  with batched weights it folds them into the channels and runs one grouped convolution, each
  (level, group) a group of its own (functorch's rule);
- pooling works per plane: the levels fold into the first logical dim;
- batch_norm folds the levels into the channels (its statistics and parameters are per channel);
  in training it updates running statistics the vmap maps (an ensemble's stacked buffers, as
  eager's), and refuses unbatched ones with eager's error;
- dropout in eval is the identity; in training it draws, which eager's default
  ``randomness="error"`` refuses (the same error here);
- cross_entropy and nll_loss fold the levels into the batch dim with ``reduction="none"`` and
  reduce per example as eager's reduction does (the mean over the weights of the targets that are
  not ignored);
- group_norm folds the levels into the batch dim, embedding looks batched indices up in one
  table (a batched table: each example's rows gathered from its own), einsum gives the levels
  subscripts of their own, scaled_dot_product_attention folds them into a leading batch dim.
"""

import string

import torch
import torch.nn.functional as F

from thunder_rs.core.lang.langctx import user_location
from thunder_rs.core.lang.vmap import (
    batched_call,
    batching_rule,
    elementwise,
    levels_of,
    physical,
    randomness,
    refusal,
    wrap,
)
from thunder_rs.core.lang import vmap_state
from thunder_rs.core.lang.vmap_state import full
from thunder_rs.core.lang.vmap_state import random_error
from thunder_rs.errors import ThunderNotImplementedError, ThunderRuntimeError

T = torch.Tensor


def _bind(names: tuple, defaults: dict, args, kwargs) -> dict:
    bound = dict(defaults)
    bound.update(zip(names, args))
    bound.update(kwargs)
    return bound


def _pad(phys, depth: int, rank: int):
    """``phys`` (``depth`` level dims) with size-1 dims after the levels up to logical ``rank``."""
    missing = rank - (phys.ndim - depth)
    if missing <= 0:
        return phys
    return phys.reshape((*phys.shape[:depth], *(1,) * missing, *phys.shape[depth:]))


# -- matmul ----------------------------------------------------------------------------------------

#: Products that take exactly these ranks, as eager checks them: (callable, name, ranks).
_FIXED_RANKS = {torch.mm: (2, 2), T.mm: (2, 2), torch.bmm: (3, 3), T.bmm: (3, 3)}
_FIXED_RANKS.update({torch.mv: (2, 1), T.mv: (2, 1), torch.dot: (1, 1), T.dot: (1, 1)})


@batching_rule(torch.matmul, T.matmul, T.__matmul__, T.__rmatmul__, *_FIXED_RANKS)
def _matmul(func, args, kwargs):
    a, b = args[0], args[1] if len(args) > 1 else next(iter(kwargs.values()))
    if func is T.__rmatmul__:
        a, b = b, a
    ranks = _FIXED_RANKS.get(func)
    if ranks is not None and (a.ndim, b.ndim) != ranks:
        raise ThunderRuntimeError(
            f"{func.__name__}: expected tensors of ranks {ranks}, got {a.ndim} and {b.ndim} at {user_location()}"
        )
    if a.ndim == 0 or b.ndim == 0:
        raise ThunderRuntimeError(f"matmul: both arguments need at least 1 dimension at {user_location()}")
    depth = max(levels_of(a), levels_of(b))
    if b.ndim == 1 and levels_of(a) == 0:
        return _batched_vector(a, b, depth)
    pa, pb = physical(a, depth), physical(b, depth)
    if a.ndim == 1:
        pa = pa.unsqueeze(-2)
    if b.ndim == 1:
        pb = pb.unsqueeze(-1)
    rank = max(a.ndim, b.ndim, 2)
    out = torch.matmul(_pad(pa, depth, rank), _pad(pb, depth, rank))
    if b.ndim == 1:
        out = out.squeeze(-1)
    if a.ndim == 1:
        out = out.squeeze(-1 if b.ndim == 1 else -2)
    return wrap(out, depth)


def _batched_vector(a, b, depth: int):
    """An unbatched matrix times a batched vector: functorch's ``mv`` rule, the innermost
    level's vectors the columns of one matrix (``a @ [I, L]``) and the level moved back from
    the last dim (eager's layout)."""
    pb = physical(b, depth).movedim(depth - 1, -1)
    pb = pb.reshape((*pb.shape[: depth - 1], *(1,) * max(a.ndim - 2, 0), *pb.shape[depth - 1 :]))
    out = torch.matmul(a if a.ndim > 1 else a.unsqueeze(0), pb)
    out = out if a.ndim > 1 else out.squeeze(-2)
    return wrap(out.movedim(-1, depth - 1), depth)


@batching_rule(F.linear)
def _linear(func, args, kwargs):
    bound = _bind(("input", "weight", "bias"), {"bias": None}, args, kwargs)
    x, w, bias = bound["input"], bound["weight"], bound["bias"]
    if w.ndim == 2:
        w = wrap(physical(w, levels_of(w)).transpose(-1, -2), levels_of(w))
    out = _matmul(torch.matmul, (x, w), {})
    return out if bias is None else batched_call(torch.add, (out, bias), {})


_ACTIVATIONS: tuple = (
    F.relu,
    torch.relu,
    T.relu,
    F.threshold,
    torch.threshold,
    F.hardtanh,
    F.relu6,
    F.leaky_relu,
    F.elu,
)
_ACTIVATIONS += (F.softplus, F.logsigmoid, F.gelu, F.silu, F.hardshrink, T.hardshrink, F.softshrink, F.tanhshrink)
_ACTIVATIONS += (F.softsign, F.mish, F.hardswish, F.hardsigmoid, F.selu, torch.selu, F.celu, torch.celu, F.sigmoid)


@batching_rule(*_ACTIVATIONS)
def _activation(func, args, kwargs):
    """Elementwise activations; in place they would write a physical tensor that views of the
    input do not share here (views are batched as copies), so ``inplace=True`` is refused."""
    if kwargs.get("inplace") or any(a is True for a in args[1:]):
        raise refusal(func, "an activation in place")
    return elementwise(func, args, kwargs)


# -- convolution -----------------------------------------------------------------------------------

_CONVS = (torch.conv1d, torch.conv2d, torch.conv3d)


@batching_rule(*_CONVS)
def _conv(func, args, kwargs):
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    bound = _bind(names, {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1}, args, kwargs)
    x, w, bias, groups = bound["input"], bound["weight"], bound["bias"], bound["groups"]
    options = (bound["stride"], bound["padding"], bound["dilation"])
    if x.ndim == w.ndim - 1:  # one example without its batch dim
        out = _conv(func, (x.unsqueeze(0), w, bias, *options, groups), {})
        return out.squeeze(0)
    depth = max(levels_of(x), levels_of(w), levels_of(bias))
    if levels_of(w) == 0 and levels_of(bias) == 0:
        px = physical(x, depth)
        out = func(px.flatten(0, depth), w, bias, *options, groups)
        return wrap(out.unflatten(0, (*px.shape[: depth + 1],)), depth)
    levels = tuple(range(depth))
    px = full(x, depth).movedim(levels, tuple(range(1, depth + 1))).flatten(1, depth + 1)
    pw = full(w, depth)
    sizes = tuple(pw.shape[:depth])
    pb = None if bias is None else full(bias, depth).flatten(0, depth)
    # (groups symbolic with the level sizes: a new batch of per-sample gradients compiles nothing)
    out = func(px, pw.flatten(0, depth), pb, *options, groups * _product(sizes))
    out = out.unflatten(1, (*sizes, w.shape[0])).movedim(tuple(range(1, depth + 1)), levels)
    return wrap(out, depth)


def _product(sizes):
    total = 1
    for s in sizes:
        total = total * s
    return total


# -- pooling ---------------------------------------------------------------------------------------

_POOLS: tuple = (F.max_pool1d, F.max_pool2d, F.max_pool3d, torch.max_pool1d, torch.max_pool2d, torch.max_pool3d)
_POOLS += (F.max_pool1d_with_indices, F.max_pool2d_with_indices, F.max_pool3d_with_indices)
_POOLS += (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d, F.lp_pool1d, F.lp_pool2d, F.lp_pool3d)
_POOLS += (F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d)
_POOLS += (F.adaptive_max_pool1d, F.adaptive_max_pool2d, F.adaptive_max_pool3d)
_POOLS += (F.adaptive_max_pool1d_with_indices, F.adaptive_max_pool2d_with_indices)
_POOLS += (F.adaptive_max_pool3d_with_indices,)


@batching_rule(*_POOLS)
def _pool(func, args, kwargs):
    """Pooling computes each plane (the last dims) alone: the levels fold into the first dim."""
    x = args[0]
    lv = x.levels
    lead = tuple(x.physical.shape[: lv + 1])
    out = func(x.physical.flatten(0, lv), *args[1:], **kwargs)
    unfold = lambda o: wrap(o.unflatten(0, lead), lv)  # noqa: E731
    return unfold(out) if isinstance(out, torch.Tensor) else type(out)(map(unfold, out))


# -- batch_norm ------------------------------------------------------------------------------------


@batching_rule(F.batch_norm)
def _batch_norm(func, args, kwargs):
    """Batch norm with the levels folded into the channels; in training, running statistics the
    vmap mapped (an ensemble's stacked buffers) are updated per example as eager's are: the
    folded call updates copies, written back into the statistics' physical tensors."""
    names = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
    defaults = {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5}
    bound = _bind(names, defaults, args, kwargs)
    x, mean, var = bound["input"], bound["running_mean"], bound["running_var"]
    if x.ndim < 2:
        raise refusal(func, f"a {x.ndim}-d input")
    tensors = (x, mean, var, bound["weight"], bound["bias"])
    depth = max(map(levels_of, tensors))
    updated = bound["training"] and (mean is not None or var is not None)
    if updated:
        _check_updated_stats(x, mean, var, depth)
    levels = tuple(range(depth))
    px = full(x, depth).movedim(levels, tuple(range(1, depth + 1))).flatten(1, depth + 1)
    per_channel = [None if t is None else full(t, depth).flatten(0, depth) for t in tensors[1:]]
    if updated:
        per_channel[:2] = [t.clone() for t in per_channel[:2]]  # (updated, then written back whole)
    out = func(px, *per_channel, bound["training"], bound["momentum"], bound["eps"])
    if updated:
        with torch.no_grad():  # (eager's kernel updates them where autograd does not see)
            for stat, flat in zip((mean, var), per_channel[:2]):
                stat.physical.copy_(flat.view(stat.physical.shape))
    sizes = tuple(full(x, depth).shape[:depth])
    return wrap(out.unflatten(1, (*sizes, x.shape[1])).movedim(tuple(range(1, depth + 1)), levels), depth)


def _check_updated_stats(x, mean, var, depth: int) -> None:
    """Running statistics batch norm updates in training must be mapped arguments of the vmap,
    batched over every level (eager's error where they are not batched)."""
    sizes = vmap_state.levels.get()[:depth]
    for stat in (mean, var):
        if stat is None or levels_of(stat) != depth or tuple(stat.physical.shape[:depth]) != sizes:
            raise ThunderRuntimeError(
                "Batch norm got a batched tensor as input while the running_mean or running_var, which will be "
                "updated in place, were not batched.\nIf you are using a module and do not need eval mode, please "
                "set `track_running_stats` to be False.If you are using a prebuilt module and do not need eval "
                "mode, please see the functorch website for resources on how to patch your module to work with vmap "
                f"(at {user_location()})"
            )
        if not stat.mapped_argument:
            raise ThunderNotImplementedError(
                f"torch.vmap: batch_norm in training updates running statistics that are not arguments the vmap "
                f"maps at {user_location()} (views or results inside the vmapped function); thunder_rs updates only "
                "the mapped arguments themselves (an ensemble's stacked buffers)"
            )


@batching_rule(F.layer_norm)
def _layer_norm(func, args, kwargs):
    """Normalised over the trailing dims, which the level dims never are: the physical call, with
    batched affine parameters applied after it (functorch's rule)."""
    names = ("input", "normalized_shape", "weight", "bias", "eps")
    bound = _bind(names, {"weight": None, "bias": None, "eps": 1e-5}, args, kwargs)
    x, w, b, shape = bound["input"], bound["weight"], bound["bias"], bound["normalized_shape"]
    if levels_of(w) == 0 and levels_of(b) == 0:
        return wrap(func(x.physical, shape, w, b, bound["eps"]), x.levels)
    out = wrap(func(physical(x, levels_of(x)), shape, None, None, bound["eps"]), levels_of(x))
    out = out if w is None else batched_call(torch.mul, (out, w), {})
    return out if b is None else batched_call(torch.add, (out, b), {})


# -- dropout ---------------------------------------------------------------------------------------

_DROPOUTS = (F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout)


@batching_rule(*_DROPOUTS)
def _dropout(func, args, kwargs):
    bound = _bind(("input", "p", "training", "inplace"), {"p": 0.5, "training": True, "inplace": False}, args, kwargs)
    if not bound["training"] or bound["p"] == 0:
        return bound["input"]  # eager's dropout in eval, or of p 0, returns its input
    if randomness() == "error":
        raise random_error(func)
    raise refusal(func, f"dropout in training under randomness={randomness()!r}")


# -- losses over class indices ---------------------------------------------------------------------


@batching_rule(F.cross_entropy, F.nll_loss)
def _label_loss(func, args, kwargs):
    names = ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction", "label_smoothing")
    defaults = {"weight": None, "size_average": None, "ignore_index": -100, "reduce": None, "reduction": "mean"}
    bound = _bind(names, defaults, args, kwargs)
    x, target, weight, reduction = bound["input"], bound["target"], bound["weight"], bound["reduction"]
    if bound["size_average"] is not None or bound["reduce"] is not None:
        raise refusal(func, "the legacy size_average/reduce arguments")
    if target.dtype.is_floating_point:
        raise refusal(func, "class probabilities as targets")
    if levels_of(weight):
        raise refusal(func, "batched class weights")
    if bound.get("label_smoothing") and weight is not None and reduction == "mean":
        # (eager's vmap fails in the masked_select this combination computes its mean with)
        raise refusal(func, "label_smoothing with class weights and reduction='mean', which eager's vmap refuses too")
    depth = max(levels_of(x), levels_of(target))
    px, pt = full(x, depth), full(target, depth)
    sizes = tuple(pt.shape[:depth])
    last = depth - 1 if x.ndim == 1 else depth  # one example's [C] folds the levels into a batch dim
    options = {k: bound[k] for k in ("weight", "ignore_index")}
    if "label_smoothing" in bound:
        options["label_smoothing"] = bound["label_smoothing"]
    losses = func(px.flatten(0, last), pt.flatten(0, last), reduction="none", **options)
    losses = losses.reshape((*sizes, *target.shape))
    if reduction == "none":
        return wrap(losses, depth)
    dims = tuple(range(depth, depth + target.ndim))
    total = losses.sum(dims) if dims else losses
    if reduction == "sum":
        return wrap(total, depth)
    kept = pt != bound["ignore_index"]
    if weight is None:
        counted = kept.to(losses.dtype)
    else:
        counted = torch.where(kept, weight[torch.where(kept, pt, 0)], 0).to(losses.dtype)
    return wrap(total / (counted.sum(dims) if dims else counted), depth)


# -- embedding, group_norm, einsum -----------------------------------------------------------------


@batching_rule(F.embedding)
def _embedding(func, args, kwargs):
    """Batched indices into one table: the physical indices looked up at once. Unbatched indices
    into a batched table: the tables side by side, looked up once. Both batched: each example's
    rows gathered from its own table (the same copy; its gradient sums as embedding's does)."""
    names = ("input", "weight", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse")
    defaults = {"padding_idx": None, "max_norm": None, "norm_type": 2.0, "scale_grad_by_freq": False, "sparse": False}
    bound = _bind(names, defaults, args, kwargs)
    idx, w = bound["input"], bound["weight"]
    if bound["max_norm"] is not None:
        raise refusal(func, "max_norm, which renormalises the table in place")
    if bound["sparse"]:
        raise refusal(func, "sparse gradients")
    options = (bound["padding_idx"], None, bound["norm_type"], bound["scale_grad_by_freq"], False)
    if levels_of(w) == 0:
        # looked up in the order of functorch's indices (the levels at their in_dims): eager's layout
        order = idx.order or tuple(range(idx.physical.ndim))
        out = func(idx.physical.permute(order), w, *options)
        return wrap(out.permute((*sorted(range(len(order)), key=order.__getitem__), len(order))), idx.levels)
    if levels_of(idx) == 0:
        return _shared_indices(func, idx, w, options)
    if bound["padding_idx"] is not None or bound["scale_grad_by_freq"]:
        raise refusal(func, "a batched table with padding_idx or scale_grad_by_freq")
    depth = max(levels_of(idx), levels_of(w))
    pw, pi = full(w, depth).flatten(0, depth - 1), full(idx, depth)
    rows = pi.reshape(pw.shape[0], -1).long()
    out = torch.gather(pw, 1, rows.unsqueeze(-1).expand(-1, -1, pw.shape[-1]))
    return wrap(out.reshape((*pi.shape, pw.shape[-1])), depth)


def _shared_indices(func, idx, w, options):
    """Unbatched indices into a batched table: functorch's rule, the levels folded into the
    embedding dim (``[E, L * D]``) and the rows looked up once, the level dims after the
    indices' (eager's layout)."""
    depth = levels_of(w)
    pw = full(w, depth)
    sizes = tuple(pw.shape[:depth])
    table = pw.movedim(tuple(range(depth)), tuple(range(1, depth + 1))).flatten(1, depth + 1)
    out = func(idx, table, *options).unflatten(-1, (*sizes, w.shape[-1]))
    return wrap(out.movedim(tuple(range(idx.ndim, idx.ndim + depth)), tuple(range(depth))), depth)


@batching_rule(F.group_norm)
def _group_norm(func, args, kwargs):
    """Each example normalised per group: the levels fold into the batch dim; batched affine
    parameters applied after the normalisation, as for layer_norm."""
    bound = _bind(
        ("input", "num_groups", "weight", "bias", "eps"), {"weight": None, "bias": None, "eps": 1e-5}, args, kwargs
    )
    x, w, b = bound["input"], bound["weight"], bound["bias"]
    if x.ndim < 2:
        raise refusal(func, f"a {x.ndim}-d input")
    depth = max(levels_of(x), levels_of(w), levels_of(b))
    affine = levels_of(w) == 0 and levels_of(b) == 0
    if levels_of(x):
        px, params = full(x, depth), (w, b) if affine else (None, None)
        out = func(px.flatten(0, depth), bound["num_groups"], *params, bound["eps"])
        out = wrap(out.unflatten(0, tuple(px.shape[: depth + 1])), depth)
    else:  # (normalised once, as eager's rule does, and its layout: the parameters broadcast over it)
        out = func(x, bound["num_groups"], None, None, bound["eps"])
    if affine:
        return out
    shape = (x.shape[1], *(1,) * (x.ndim - 2))
    out = out if w is None else batched_call(torch.mul, (out, w.reshape(shape)), {})
    return out if b is None else batched_call(torch.add, (out, b.reshape(shape)), {})


@batching_rule(torch.einsum)
def _einsum(func, args, kwargs):
    """The level dims as subscripts of their own, leading each batched operand and the output."""
    equation, operands = args[0], tuple(args[1:])
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not isinstance(equation, str) or kwargs:
        raise refusal(func, "the sublist form")
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    if not arrow:  # (implicit: the subscripts seen once, in order, after the ellipsis' dims)
        letters = [c for c in lhs if c.isalpha()]
        rhs = ("..." if "..." in lhs else "") + "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    depth = max(map(levels_of, operands))
    batch = "".join([c for c in string.ascii_letters if c not in equation][:depth])
    if len(batch) < depth:
        raise refusal(func, "an equation using every letter")
    terms = [batch + t if levels_of(x) else t for t, x in zip(lhs.split(","), operands)]
    physicals = [full(x, depth) if levels_of(x) else x for x in operands]
    return wrap(func(f"{','.join(terms)}->{batch}{rhs}", *physicals), depth)


@batching_rule(F.scaled_dot_product_attention)
def _attention(func, args, kwargs):
    """Attention over the last two dims: the levels fold into a leading batch dim of every operand
    (a mask padded to the query's rank first); dropout draws, refused as dropout is."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    defaults = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}
    bound = _bind(names, defaults, args, kwargs)
    if bound["dropout_p"]:
        raise random_error(func) if randomness() == "error" else refusal(func, "dropout under torch.vmap")
    q, k, v, mask = bound["query"], bound["key"], bound["value"], bound["attn_mask"]
    depth = max(map(levels_of, (q, k, v, mask)))
    fold = lambda t: full(t, depth).flatten(0, depth - 1)  # noqa: E731
    if mask is not None and levels_of(mask):
        mask = wrap(physical(mask, levels_of(mask), max(mask.ndim, q.ndim)), levels_of(mask))
    options = {key: bound[key] for key in ("dropout_p", "is_causal", "scale", "enable_gqa")}
    out = func(fold(q), fold(k), fold(v), None if mask is None else fold(mask) if levels_of(mask) else mask, **options)
    if out.device.type == "cpu":  # (eager's vmap stacks one call per example there: contiguous)
        out = out.contiguous()
    return wrap(out.unflatten(0, tuple(full(q, depth).shape[:depth])), depth)
