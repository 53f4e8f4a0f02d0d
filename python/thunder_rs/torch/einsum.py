"""``torch.einsum`` as eager's ``at::einsum`` computes it, so that its products round alike and
its gradients are laid out alike (by the same views, those of dims of size 1 too).

Eager aligns every operand's dims in one order (the output's labels, then the ellipsis dims it
sums, then the other summed labels, A-Z before a-z), with a dim of size 1 for each label an
operand lacks, treats a dim of size 1 as absent (broadcast), and contracts the operands left to
right: a label summed by the pair (in both, and in no later operand) is the inner dim of one
batched product, a label only one operand still has is summed on it first, and a pair with
nothing to sum is a broadcast multiplication. The product's batch, rows and columns are the dims
both, only the left and only the right operand have (a dim of size 1 in both counts as the
right's); where all of the right's come before the left's, eager swaps the operands (so that the
product is laid out as the output), which changes how the matrix kernel rounds
(``sumproduct_pair``).
"""

import math
import string

import torch

from thunder_rs import clang, prims
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.langctx import TORCH_TO_LTORCH
from thunder_rs.errors import ThunderRuntimeError, ThunderTypeError, check
from thunder_rs.torch.common import require_tensor
from thunder_rs.torch.products import same_dtype
from thunder_rs.torch.symbols import ltorch, torchsymbol

__all__ = ["einsum"]

# A label is a letter, or ("...", i): the i-th of the ellipsis dims, which are aligned from the
# right across operands (broadcast like a shape's leading dims).

_OP = "ltorch.einsum"


def _sublist_term(sublist) -> str:
    check(
        isinstance(sublist, (list, tuple)),
        _OP,
        "expected a list of ints or ... as a sublist (argument operands)",
        ThunderTypeError,
    )
    for s in sublist:
        check(
            s is Ellipsis or (isinstance(s, int) and 0 <= s < 52),
            _OP,
            f"subscript in subscript list is not within the valid range [0, 52), got {s!r} (argument operands)",
            ThunderRuntimeError,
        )
    return "".join("..." if s is Ellipsis else string.ascii_letters[s] for s in sublist)


def _equation_and_operands(args):
    """``einsum(equation, *operands)``, ``einsum(equation, [operands])`` or the sublist form
    ``einsum(op0, sublist0, op1, sublist1, ..., [out_sublist])``."""
    check(len(args) > 0, _OP, "must provide an equation", ThunderTypeError)
    if isinstance(args[0], str):
        operands = args[1:]
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = operands[0]
        return args[0], list(operands)
    pairs = len(args) // 2
    terms = [_sublist_term(args[2 * i + 1]) for i in range(pairs)]
    equation = ",".join(terms) + ("->" + _sublist_term(args[-1]) if len(args) % 2 else "")
    return equation, [args[2 * i] for i in range(pairs)]


def _term_labels(term: str, x, index: int, ellipsis_dims: int | None):
    """The labels of one operand's term; ``ellipsis_dims`` is None while they are being counted."""
    letters = term.replace("...", "")
    check(
        term.count("...") <= 1 and all(c in string.ascii_letters for c in letters),
        _OP,
        f"invalid subscript term {term!r} for operand {index} (argument equation)",
        ThunderRuntimeError,
    )
    if "..." not in term:
        check(
            x.ndim == len(letters),
            _OP,
            f"the number of subscripts in the equation ({len(letters)}) does not match the number of dimensions "
            f"({x.ndim}) for operand {index} and no ellipsis was given",
            ThunderRuntimeError,
        )
        return list(letters)
    own = x.ndim - len(letters)
    check(
        own >= 0,
        _OP,
        f"the number of subscripts in the equation ({len(letters)}) is more than the number of dimensions ({x.ndim}) "
        f"for operand {index}",
        ThunderRuntimeError,
    )
    head, tail = term.split("...")
    total = own if ellipsis_dims is None else ellipsis_dims
    return [*head, *(("...", total - own + i) for i in range(own)), *tail]


def _parse_einsum(equation: str, operands):
    """Labels of each operand and of the output."""
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    check(
        len(terms) == len(operands),
        _OP,
        f"the equation has {len(terms)} operand terms but {len(operands)} operands were given (argument operands)",
        ThunderRuntimeError,
    )
    counted = [_term_labels(t, x, i, None) for i, (t, x) in enumerate(zip(terms, operands))]
    ellipsis_dims = max((sum(isinstance(lab, tuple) for lab in labels) for labels in counted), default=0)
    labels = [_term_labels(t, x, i, ellipsis_dims) for i, (t, x) in enumerate(zip(terms, operands))]
    present = [lab for ls in labels for lab in ls]
    ellipsis = [("...", i) for i in range(ellipsis_dims)]
    if not arrow:
        once = sorted(c for c in set(present) if isinstance(c, str) and present.count(c) == 1)
        return labels, [*ellipsis, *once]
    check(
        rhs.count("...") <= 1 and all(c in string.ascii_letters for c in rhs.replace("...", "")),
        _OP,
        f"invalid output subscripts {rhs!r} (argument equation)",
        ThunderRuntimeError,
    )
    head, _, tail = rhs.partition("...")
    out = [*head, *(ellipsis if "..." in rhs else ()), *tail]
    for c in out:
        check(
            isinstance(c, tuple) or c in present,
            _OP,
            f"output subscript {c} does not appear in the equation for any input operand",
            ThunderRuntimeError,
        )
        check(out.count(c) == 1, _OP, f"output subscript {c} appears more than once in the output", ThunderRuntimeError)
    return labels, out


def _sizes(labelled) -> dict:
    """The size of each label: operands agree on it, or have it of size 1 (broadcast)."""
    sizes: dict = {}
    for x, labels in labelled:
        for lab, n in zip(labels, x.shape):
            known = sizes.setdefault(lab, n)
            check(
                n == known or n == 1 or known == 1,
                _OP,
                f"operands do not broadcast with remapped shapes: subscript {lab} has sizes {known} and {n}",
                ThunderRuntimeError,
            )
            if known == 1:
                sizes[lab] = n
    return sizes


def _take_diagonals(x, labels, diagonal=None):
    """``x`` with each repeated label of one operand reduced to its diagonal (moved last), by
    ``diagonal`` (``ltorch.diagonal`` when None)."""
    diagonal = diagonal or ltorch.diagonal
    while len(set(labels)) < len(labels):
        lab = next(c for c in labels if labels.count(c) > 1)
        i = labels.index(lab)
        j = labels.index(lab, i + 1)
        check(
            x.shape[i] == x.shape[j],
            _OP,
            f"subscript {lab} is repeated for operand but the sizes don't match, {x.shape[i]} != {x.shape[j]}",
            ThunderRuntimeError,
        )
        x = diagonal(x, 0, i, j)
        labels = [c for k, c in enumerate(labels) if k not in (i, j)] + [lab]
    return x, labels


def _aligned(out_labels, labels) -> dict:
    """Each label's position in eager's order of the dims: the output's labels, then the ellipsis
    dims it sums, then the other summed labels in the order of their letters (A-Z, then a-z)."""
    present = {c for ls in labels for c in ls} - set(out_labels)
    summed_ellipsis = sorted(c for c in present if isinstance(c, tuple))
    summed = sorted(c for c in present if isinstance(c, str))
    return {c: i for i, c in enumerate([*out_labels, *summed_ellipsis, *summed])}


def _aligned_operand(x, labels, position: dict):
    """``x`` as eager aligns it: a repeated label's diagonal moved to its first dim, a dim of
    size 1 added for each label it lacks, and its dims permuted to eager's order (``position``)."""
    permutation: list = [None] * len(position)
    dim = 0
    for lab in labels:
        at = permutation[position[lab]]
        if at is None:
            permutation[position[lab]] = dim
            dim += 1
            continue
        check(
            x.shape[dim] == x.shape[at],
            _OP,
            f"subscript {lab} is repeated for operand but the sizes don't match, {x.shape[dim]} != {x.shape[at]}",
            ThunderRuntimeError,
        )
        x = ltorch.movedim(ltorch.diagonal(x, 0, at, dim), -1, at)
    for p, at in enumerate(permutation):
        if at is None:
            x = ltorch.unsqueeze(x, dim)
            permutation[p], dim = dim, dim + 1
    return ltorch.permute(x, permutation)


def _sumproduct_pair(left, right, sum_dims: list):
    """Eager's ``sumproduct_pair`` of two aligned operands (keeping the summed dims, of size 1):
    a dim summed that only one of them has of a size other than 1 is summed on it first; the
    others, summed (the inner dim), in both (the batch dim) or in one (its rows or columns), are
    permuted and flattened into one batched product, which is viewed and permuted back."""
    if not sum_dims:
        return ltorch.mul(left, right)
    lro: list = []
    lo: list = []
    ro: list = []
    for i in range(left.ndim):
        sl, sr = left.shape[i] != 1, right.shape[i] != 1
        if i in sum_dims:
            if sl != sr:  # (in one only: summed on it right away)
                left, right = (ltorch.sum(left, [i], True), right) if sl else (left, ltorch.sum(right, [i], True))
        else:
            (lro if sl and sr else lo if sl else ro).append(i)
    if lo and ro and ro[-1] < lo[0]:  # (eager's swap_lo_ro: the product laid out as the output)
        left, right, lo, ro = right, left, ro, lo
    order = [*lro, *lo, *sum_dims, *ro]
    sizes = [math.prod(left.shape[d] for d in dims) for dims in (lro, lo, sum_dims)]
    ro_size = math.prod(right.shape[d] for d in ro)
    product = prims.matmul(
        ltorch.reshape(ltorch.permute(left, order), tuple(sizes)),
        ltorch.reshape(ltorch.permute(right, [*lro, *sum_dims, *ro, *lo]), (sizes[0], sizes[2], ro_size)),
    )
    out_size = (*(left.shape[d] for d in (*lro, *lo)), *(1 for _ in sum_dims), *(right.shape[d] for d in ro))
    return ltorch.permute(ltorch.reshape(product, out_size), sorted(range(len(order)), key=order.__getitem__))


def _summed_now(a, b, out_dims: int, counts: list) -> tuple[list, list, list]:
    """The dims eager sums contracting ``a`` and ``b``: those both have (of a size other than 1)
    and no later operand, in their product; those only one has and no later operand, on it
    first (``counts``: how many operands left have each dim, which it updates)."""
    both: list = []
    on_a: list = []
    on_b: list = []
    for d in range(out_dims, len(counts)):
        sa, sb = a.shape[d] != 1, b.shape[d] != 1
        if sa and sb:
            counts[d] -= 1
            if counts[d] == 1:
                both.append(d)
                counts[d] = 0
        elif counts[d] == 1 and (sa or sb):
            (on_a if sa else on_b).append(d)
            counts[d] = 0
    return both, on_a, on_b


@torchsymbol(torch.einsum)
def einsum(*args):
    """Eager's ``at::einsum``: each operand aligned to one order of the labels (``_aligned_operand``),
    then contracted left to right (``_sumproduct_pair``), or one operand summed over the labels not in
    the output; the same views, so that the gradients are laid out as eager's."""
    equation, operands = _equation_and_operands(args)
    for i, x in enumerate(operands):
        require_tensor(_OP, x, f"operands[{i}]")
    check(len(operands) > 0, _OP, "must provide at least one operand", ThunderRuntimeError)
    same_dtype(_OP, operands, "expected all operands to have the same dtype")
    labels, out_labels = _parse_einsum(equation, operands)
    compute = torch.int64 if operands[0].dtype == torch.bool else operands[0].dtype
    position = _aligned(out_labels, labels)
    ops = [_aligned_operand(clang.maybe_convert(x, compute), ls, position) for x, ls in zip(operands, labels)]
    order = sorted(position, key=position.__getitem__)
    _sizes([(x, order) for x in ops])
    counts = [sum(x.shape[d] != 1 for x in ops) for d in range(len(order))]
    out_dims = len(out_labels)
    out = ops[0]
    for x in ops[1:]:
        both, on_a, on_b = _summed_now(out, x, out_dims, counts)
        out = ltorch.sum(out, on_a, True) if on_a else out
        x = ltorch.sum(x, on_b, True) if on_b else x
        out = _sumproduct_pair(out, x, both)
    if len(order) > out_dims:
        if len(ops) > 1:  # (the summed dims are of size 1 now: eager views them away)
            out = ltorch.reshape(out, tuple(out.shape[:out_dims]))
        else:
            out = ltorch.sum(out, list(range(out_dims, len(order))))
    return clang.maybe_convert(out, operands[0].dtype)


def _einsum_of_one(*args):
    """``torch.einsum`` of one tensor that sums no label (a permutation of its dims, diagonals of
    repeated labels): eager's result is a view of the tensor (``at::einsum`` takes diagonals and
    permutes), so the trace takes it by the view ops, which link it to the tensor: a write
    through either is seen by the other, as in eager. Any other einsum makes a new tensor."""
    equation, operands = _equation_and_operands(args)
    x = operands[0] if len(operands) == 1 else None
    if type(x) is not TensorProxy:
        return einsum(*args)
    (labels,), out_labels = _parse_einsum(equation, operands)
    if set(labels) != set(out_labels):
        return einsum(*args)
    x, labels = _take_diagonals(x, list(labels), TORCH_TO_LTORCH[torch.diagonal])
    return TORCH_TO_LTORCH[torch.permute](x, [labels.index(c) for c in out_labels])


TORCH_TO_LTORCH[torch.einsum] = _einsum_of_one
