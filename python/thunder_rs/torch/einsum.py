"""``torch.einsum`` as eager's ``at::einsum`` computes it, so that its products round alike.

Eager aligns every operand's dims in one order (the output's labels, then the ellipsis dims it
sums, then the other summed labels, A-Z before a-z), treats a dim of size 1 as absent (broadcast),
and contracts the operands left to right: a label summed by the pair (in both, and in no later
operand) is the inner dim of one batched product, a label only one operand still has is summed
on it first, and a pair with nothing to sum is a broadcast multiplication. The product's rows and
columns are the dims only the left and only the right operand has; where all of the right's come
before the left's in the output, eager swaps the operands (so that the product is laid out as the
output), which changes how the matrix kernel rounds (``sumproduct_pair``).
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


def _aligned(out_labels, labelled) -> dict:
    """Each label's position in eager's order of the dims: the output's labels, then the ellipsis
    dims it sums, then the other summed labels in the order of their letters (A-Z, then a-z)."""
    present = {c for _, labels in labelled for c in labels} - set(out_labels)
    summed_ellipsis = sorted(c for c in present if isinstance(c, tuple))
    summed = sorted(c for c in present if isinstance(c, str))
    return {c: i for i, c in enumerate([*out_labels, *summed_ellipsis, *summed])}


def _present(x, labels) -> list:
    """The labels of ``x``'s dims of a size other than 1, which eager counts as the operand's."""
    return [c for c, n in zip(labels, x.shape) if n != 1]


def _sum_out(x, labels, drop):
    dims = [i for i, c in enumerate(labels) if c in drop]
    if not dims:
        return x, labels
    return ltorch.sum(x, dims), [c for c in labels if c not in drop]


def _flatten(x, labels, groups):
    """``x`` with its dims permuted to the labels of ``groups`` in turn (its other dims, of size 1,
    last) and each group flattened into one dim."""
    size = dict(zip(labels, x.shape))
    order = [c for group in groups for c in group]
    rest = [i for i, c in enumerate(labels) if c not in order]
    x = ltorch.permute(x, [labels.index(c) for c in order] + rest)
    return ltorch.reshape(x, tuple(math.prod(size[c] for c in group) for group in groups))


def _lay_out(x, labels, wanted):
    """``x`` with its dims in the order of ``wanted`` (a label it lacks, or has of size 1, as a dim
    of size 1); its other labels must be of size 1."""
    size = dict(zip(labels, x.shape))
    present = [c for c in wanted if size.get(c, 1) != 1]
    return ltorch.reshape(_flatten(x, labels, [[c] for c in present]), tuple(size.get(c, 1) for c in wanted))


def _contract_pair(a, la, b, lb, counts: dict, position: dict, out_labels: set):
    """Eager's contraction of ``a`` and ``b`` (labels ``la``, ``lb``): the summed labels only one
    of them has where no other operand has them (``counts``, which it updates), summed on it;
    those both have and no later operand, the inner dim of one batched product (or, where there
    are none, a broadcast product). Returns the product and its labels (of size other than 1)."""
    in_a, in_b = set(_present(a, la)), set(_present(b, lb))
    summed: list = []
    sum_a: set = set()
    sum_b: set = set()
    for c in sorted((set(la) | set(lb)) - out_labels, key=position.__getitem__):
        if c in in_a and c in in_b:
            counts[c] -= 1
            if counts[c] == 1:
                summed.append(c)
                counts[c] = 0
        elif counts[c] == 1 and (c in in_a or c in in_b):
            (sum_a if c in in_a else sum_b).add(c)
            counts[c] = 0
    (a, la), (b, lb) = _sum_out(a, la, sum_a), _sum_out(b, lb, sum_b)
    in_a, in_b = in_a - sum_a, in_b - sum_b
    kept = sorted((in_a | in_b) - set(summed), key=position.__getitem__)
    if not summed:
        return ltorch.mul(_lay_out(a, la, kept), _lay_out(b, lb, kept)), kept
    both = [c for c in kept if c in in_a and c in in_b]
    left, right = [c for c in kept if c not in in_b], [c for c in kept if c not in in_a]
    if left and right and position[right[-1]] < position[left[0]]:  # (eager's swap_lo_ro)
        a, la, b, lb, left, right = b, lb, a, la, right, left
    shape = {c: n for x, labels in ((a, la), (b, lb)) for c, n in zip(labels, x.shape) if n != 1}
    product = prims.matmul(_flatten(a, la, [both, left, summed]), _flatten(b, lb, [both, summed, right]))
    labels = both + left + right
    return ltorch.reshape(product, tuple(shape[c] for c in labels)), labels


@torchsymbol(torch.einsum)
def einsum(*args):
    """Diagonals for repeated labels, then eager's contraction of the operands left to right
    (``_contract_pair``), or of one operand its sum over the labels not in the output."""
    equation, operands = _equation_and_operands(args)
    for i, x in enumerate(operands):
        require_tensor(_OP, x, f"operands[{i}]")
    check(len(operands) > 0, _OP, "must provide at least one operand", ThunderRuntimeError)
    same_dtype(_OP, operands, "expected all operands to have the same dtype")
    labels, out_labels = _parse_einsum(equation, operands)
    compute = torch.int64 if operands[0].dtype == torch.bool else operands[0].dtype
    labelled = [_take_diagonals(clang.maybe_convert(x, compute), list(ls)) for x, ls in zip(operands, labels)]
    _sizes(labelled)
    position = _aligned(out_labels, labelled)
    summed = set(position) - set(out_labels)
    out, out_l = labelled[0]
    if len(labelled) == 1:
        out, out_l = _sum_out(out, out_l, summed)
    counts = {c: sum(c in _present(x, ls) for x, ls in labelled) for c in summed}
    for x, ls in labelled[1:]:
        out, out_l = _contract_pair(out, out_l, x, ls, counts, position, set(out_labels))
    return clang.maybe_convert(_lay_out(out, out_l, out_labels), operands[0].dtype)


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
