"""Eager's strides for the tensors a traced call computes.

The trace decides from strides where eager copies and where it views (``reshape``, ``view``,
``contiguous()``), and answers the program's ``stride()`` and ``is_contiguous()``. Trace inputs
carry their tensors' strides and views follow their roots'. A tensor a call computes was taken to
be contiguous, which eager's is not where the call's inputs are laid out in another order
(``x_channels_last.relu()``, ``x.t() * 2``: eager's outputs keep their inputs' order) or the call
asks for a layout (``x.clone(memory_format=torch.channels_last)``). Taking those for contiguous
let ``x.t().exp().view(-1)`` run where eager raises, and made ``y.reshape(-1)`` of such a ``y`` a
view, so that a write through it changed ``y``, where eager's reshape copies.

For such calls (``laid_out``), the rule of the op's kind (``LAYOUT_RULES``, which the op families
fill) tells the outputs' layout as ATen lays them out: ``POINTWISE``, TensorIterator's order of
its operands' strides; ``LIKE``, ``empty_like`` of the first tensor; ``SUGGESTED``, the memory
format the first tensor's strides suggest (pooling, normalization); ``SUGGESTED_ANY``, any
tensor's (convolution: the input's or the weight's); ``SUGGESTED_ALL``, the one every tensor of
the list suggests, if one (``cat``); ``COLUMN_MAJOR``, LAPACK's order for the matrices of linalg's
results, whatever the inputs' layout (a tuple of rules: one per output); an explicit ``memory_format`` decides over
the rule. A rule may also be a function of the call's arguments (``rule(*args, **kwargs)``) for ops
whose layout depends on them (``linalg.solve(A, B, left=False)`` is row-major, ``svd`` without
``compute_uv`` lays out V, not U, column-major) or that lay out what their decomposition computes
(``kron``'s product of its operands' views, ``diff``'s differences of slices): it returns the
call's rule, or a function of an output's sizes that gives its strides (``pointwise_strides``,
``dense_strides`` and the other helpers here, over the ``layout`` of the call's tensors). Ops of
other kinds stay contiguous, as before. (Eager's meta kernels would tell every
op's layout, but most are torch's Python references: 100 us a call, and the first imports Dynamo,
seconds.) A dense order holds for symbolic sizes as it does for a trace input
(``core.base.layouts``); sizes are at their hints where orders are compared, which hold for every
size a variant serves (2 or more).
"""

from typing import Any

import torch

from thunder_rs.core.base.layouts import is_contiguous, is_dense, layout_of, strides_in
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.symint import hint

#: Formats that lay out a computed tensor in another order than its dims'.
_ORDERS = (torch.channels_last, torch.channels_last_3d)

POINTWISE, LIKE, SUGGESTED, SUGGESTED_ANY, SUGGESTED_ALL = "pointwise", "like", "suggested", "any", "all"
COLUMN_MAJOR = "column_major"

#: torch callable -> the rule that lays out its outputs (see the module doc); the op families fill it.
LAYOUT_RULES: dict = {}


def eager_strides(p) -> tuple | None:
    """The strides eager's tensor for proxy ``p`` has, or None where it is contiguous (a tensor a
    call computed is, unless ``take_layouts`` said otherwise)."""
    link = p._view
    return p._strides if link is None else link.strides


def _reordered(p) -> bool:
    """Whether ``p``'s elements may lie in another order than its dims': a tensor with strides of
    its own, or a view whose root has them or that transposes (slices, broadcasts and reshapes of a
    contiguous root keep the order, and their strides are not worked out here)."""
    link = p._view
    if link is None:
        return p._strides is not None and not _in_order(p._shape, p._strides)
    if link.root._strides is None and all(getattr(s, "name", None) != "transpose" for s in link.steps):
        return False
    return not _in_order(p._shape, link.strides)


def _in_order(shape, strides) -> bool:
    """Whether strides fall from the outer dims to the inner ones (at the sizes' hints): eager's
    outputs of such inputs are contiguous."""
    last = None
    for size, stride in zip(shape, strides):
        if hint(size) > 1:
            stride = hint(stride)
            if last is not None and stride > last:
                return False
            last = stride
    return True


def laid_out(func, args: tuple, kwargs: dict) -> bool:
    """Whether a call's outputs may be laid out otherwise than contiguously in eager: it asks for
    a format, or it is an op with a rule (``LAYOUT_RULES``) that takes a tensor in another order
    (``_reordered``)."""
    if kwargs and kwargs.get("memory_format") in _ORDERS:
        return True
    rule = LAYOUT_RULES.get(func)
    if rule is None:
        return False
    if rule is COLUMN_MAJOR or type(rule) is tuple or callable(rule):  # (a function: its call tells)
        return True
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, TensorProxy):
            if (a._strides is not None or a._view is not None) and _reordered(a):
                return True
        elif type(a) in (list, tuple):
            if any(isinstance(x, TensorProxy) and _reordered(x) for x in a):
                return True
    return False


def suggested_format(p):
    """The memory format ATen's ``suggest_memory_format`` gives for proxy ``p``'s eager strides."""
    return _suggested(p)


def aliases_to(p, memory_format) -> bool:
    """Whether eager's ``p.to(memory_format=...)`` returns ``p`` itself (its strides already
    suggest that format), rather than a copy laid out in it."""
    return _suggested(p) == memory_format


def take_layouts(func, args: tuple, kwargs: dict, out) -> None:
    """Gives the tensors ``out`` that the call ``func(*args, **kwargs)`` computed eager's strides
    where they are not contiguous (see the module doc)."""
    outs = (out,) if isinstance(out, TensorProxy) else out if isinstance(out, (list, tuple)) else ()
    rule = ruled = LAYOUT_RULES.get(func)
    if callable(rule):
        rule = rule(*args, **kwargs)  # (None: contiguous, as an op without a rule)
    given = (*args, *kwargs.values())
    if rule is SUGGESTED_ALL and args and type(args[0]) in (list, tuple):
        given = tuple(args[0])  # (``cat``'s tensors)
    operands = [a for a in given if isinstance(a, TensorProxy)]
    taken = {id(a) for a in operands}
    if ruled is not None:
        _own_memory(outs, taken | {id(_root(a)) for a in operands})
    made = [(i, o) for i, o in enumerate(outs) if isinstance(o, TensorProxy) and _computed(o, taken)]
    if not made:
        return
    fmt = kwargs.get("memory_format") if kwargs else None
    for i, o in made:
        shape = [hint(s) for s in o._shape]
        strides = _rule_strides(rule[i] if type(rule) is tuple else rule, fmt, shape, operands)
        # (Strides of a contiguous tensor too: a channels_last [N, C, 1, 1] has eager's own.)
        if strides is not None and strides != _contiguous(tuple(shape)):
            _take(o, strides)


def _rule_strides(rule, fmt, shape: list, operands: list) -> tuple | None:
    """Eager's strides (at the sizes' hints) of an output of sizes ``shape`` (at their hints) of
    ``operands``, or None where they are contiguous or unknown."""
    if fmt in _ORDERS:
        return _format_strides(shape, fmt)
    if callable(rule):  # (the strides a rule function worked out)
        return rule(tuple(shape))
    if not operands or fmt == torch.contiguous_format:
        return None
    if rule is LIKE or (rule is not None and fmt == torch.preserve_format):
        return _like(shape, operands[0])
    if rule is POINTWISE:
        return _pointwise(shape, operands)
    if rule is SUGGESTED or rule is SUGGESTED_ANY:
        formats = {_suggested(a) for a in (operands if rule is SUGGESTED_ANY else operands[:1])}
        found = next((f for f in _ORDERS if f in formats), None)
        return None if found is None else _format_strides(shape, found)
    if rule is COLUMN_MAJOR:
        return _dense(shape, (*range(len(shape) - 2), len(shape) - 1, len(shape) - 2)) if len(shape) >= 2 else None
    if rule is SUGGESTED_ALL:
        formats = {_suggested(a) for a in operands}
        return (
            _format_strides(shape, formats.pop())
            if len(formats) == 1 and not formats & {torch.contiguous_format}
            else None
        )
    return None


def _hinted(p) -> tuple:
    """``p``'s sizes and eager strides at their hints: its layout, as the helpers for rule
    functions take tensors (``pointwise_strides``)."""
    shape = tuple(hint(s) for s in p._shape)
    strides = eager_strides(p)
    return shape, tuple(hint(s) for s in strides) if strides is not None else _contiguous(shape)


def _contiguous(shape) -> tuple:
    strides, step = [1] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        strides[d] = step
        step *= max(shape[d], 1)
    return tuple(strides)


def _format_strides(shape, fmt) -> tuple | None:
    rank = 4 if fmt == torch.channels_last else 5
    if len(shape) != rank:
        return None
    order = (0, *range(2, rank), 1)  # outermost first: N, the spatial dims, C
    return _dense(shape, order)


def _dense(shape, order) -> tuple:
    """Strides of a tensor dense in ``order`` (outermost dim first)."""
    strides, step = [0] * len(shape), 1
    for d in reversed(order):
        strides[d] = step
        step *= max(shape[d], 1)
    return tuple(strides)


def _suggested(p):
    """ATen's ``suggest_memory_format``: channels_last where the strides are laid out so (a 4-D
    or 5-D tensor), else contiguous."""
    shape, strides = _hinted(p)
    if len(shape) == 4 and _channels_last_like(shape, strides, (1, 3, 2, 0)):
        return torch.channels_last
    if len(shape) == 5 and _channels_last_like(shape, strides, (1, 4, 3, 2, 0)):
        return torch.channels_last_3d
    return torch.contiguous_format


def _channels_last_like(shape, strides, dims) -> bool:
    """ATen's ``is_channels_last_strides_2d_s4`` (and its 3-D form): C innermost, then W, H (D),
    N, with ambiguous layouts (size-1 dims of equal strides) taken as contiguous."""
    if strides[1] == 0:
        return False
    least = 0
    for d in dims:
        if shape[d] == 0 or strides[d] < least:
            return False
        if d == 0 and least == strides[1]:
            return False
        least = strides[d] * shape[d] if shape[d] > 1 else strides[d]
    return True


def _non_overlapping_and_dense(shape, strides) -> bool:
    order = sorted((d for d in range(len(shape)) if shape[d] != 1), key=lambda d: strides[d])
    step = 1
    for d in order:
        if strides[d] != step:
            return False
        step *= shape[d]
    return True


def _like(shape, p) -> tuple | None:
    """``empty_like(p)`` (preserve_format): ``p``'s strides where it is dense, else the order of
    its strides (``_pointwise`` of it alone)."""
    return like_strides(shape, _hinted(p))


def like_strides(shape, layout: tuple) -> tuple | None:
    """``_like`` of a tensor laid out as ``layout`` (sizes, strides), or None where contiguous."""
    own_shape, strides = layout
    if own_shape == tuple(shape) and _non_overlapping_and_dense(own_shape, strides):
        return None if strides == _contiguous(own_shape) else strides
    return pointwise_strides(shape, [layout])


def _own_memory(outs, reachable: set) -> None:
    """An op that is no view (it has a rule) returns new tensors, where the trace may have made
    an output as a view of a tensor of the op's decomposition (``group_norm`` reshapes its
    normalized groups back): one whose root is none of the call's tensors is unlinked, so that it
    takes the op's layout rather than that tensor's."""
    for o in outs:
        if isinstance(o, TensorProxy) and o._view is not None and id(o._view.root) not in reachable:
            o._view = None


def _root(p):
    """The tensor ``p`` views, or ``p``."""
    link: Any = p._view
    return p if link is None else link.root


def _computed(o, taken: set) -> bool:
    """Whether ``o`` is a tensor the call computed: not one it took, a view, or a trace input."""
    return (
        id(o) not in taken
        and o._view is None
        and o._input_vid is None
        and o._strides is None
        and not o._made_contiguous
    )


def _take(o, strides: tuple) -> None:
    """Sets ``o``'s eager strides: by their order for symbolic sizes, where they are dense."""
    lay = layout_of(tuple(hint(s) for s in o._shape), strides)
    if is_dense(lay):
        o._strides = strides_in(o._shape, lay)
    elif not o._symbolic:
        o._strides = tuple(strides)


def _pointwise(shape, operands: list) -> tuple | None:
    """TensorIterator's output strides for ``operands`` (ATen's ``fast_set_up`` and
    ``reorder_dimensions``): contiguous or channels_last where all are, their strides where all
    are dense alike, else their dims sorted by stride, operand by operand, broadcast dims aside."""
    return pointwise_strides(shape, [_hinted(p) for p in operands])


def pointwise_strides(shape, hinted: list) -> tuple | None:
    """``_pointwise`` of operands laid out as ``hinted`` (sizes, strides), or None where the
    output is contiguous."""
    shape = tuple(shape)
    if not all(_broadcasts(own, shape) for own, _ in hinted):
        return None  # (an output of a reduction: ``max(x, dim)`` is ``max(x, y)``'s symbol)
    if all(own == shape for own, _ in hinted):
        if all(is_contiguous(own, st) for own, st in hinted):
            return None
        if len(shape) == 4 and all(is_contiguous(*_nhwc(own, st)) for own, st in hinted):
            return _format_strides(shape, torch.channels_last)
        first = hinted[0][1]
        if all(st == first and _non_overlapping_and_dense(own, st) for own, st in hinted):
            return first
    strides = [_broadcast_strides(shape, own, st) for own, st in hinted]
    perm = list(range(len(shape) - 1, -1, -1))  # innermost first
    for i in range(1, len(perm)):
        moving = i
        for j in range(i - 1, -1, -1):
            order = _compare(strides, shape, perm[j], perm[moving])
            if order > 0:
                perm[j], perm[moving] = perm[moving], perm[j]
                moving = j
            elif order < 0:
                break
    strided, step = [0] * len(shape), 1
    for d in perm:
        strided[d] = step
        step *= shape[d]
    out = tuple(strided)
    return None if out == _contiguous(shape) else out


def _broadcasts(own, shape) -> bool:
    lead = len(shape) - len(own)
    return lead >= 0 and all(n in (1, shape[lead + d]) for d, n in enumerate(own))


def _compare(strides: list, shape, dim0: int, dim1: int) -> int:
    """ATen's ``should_swap``: 1 where ``dim0`` goes outside ``dim1``, -1 where it stays inside,
    0 where no operand tells."""
    for st in strides:
        s0, s1 = st[dim0], st[dim1]
        if s0 == 0 or s1 == 0:
            continue
        if s0 != s1:
            return -1 if s0 < s1 else 1
        if shape[dim0] > shape[dim1]:
            return 1
    return 0


def _broadcast_strides(shape, own, strides) -> tuple:
    lead = len(shape) - len(own)
    return tuple(
        0 if d < lead or (own[d - lead] == 1 and shape[d] != 1) else strides[d - lead] for d in range(len(shape))
    )


def _nhwc(shape, strides) -> tuple:
    return (shape[0], shape[2], shape[3], shape[1]), (strides[0], strides[2], strides[3], strides[1])


#: What rule functions (``torch.layout_rules``) work out strides with, besides ``pointwise_strides``
#: and ``like_strides``: a tensor's layout (its sizes and eager strides at their hints), the
#: strides of a tensor dense in an order of its dims (outermost first), and ``rule_strides``.
layout, dense_strides = _hinted, _dense


def rule_strides(rule, shape, operands: list) -> tuple | None:
    """The strides (at hints) a named rule gives an output of sizes ``shape`` of ``operands``
    (tensors), or None where they are contiguous."""
    strides = _rule_strides(rule, None, list(shape), operands)
    return None if strides is None or strides == _contiguous(tuple(shape)) else strides
