"""The order in which the stand-in ``fake_nvfuser_direct`` allocates a fusion's outputs: a port, in
its own words, of nvFuser's pre-segmentation pass ``AllocationDomainPass`` (NVIDIA/Fuser 81c4b22:
``csrc/preseg_passes/allocation_order_inference.cpp``, ``inferAllocationOrder`` and
``mapAllocationDomain``), with the ``ops.stride_order`` binding (``python/python_direct/ops.cpp``)
that gives an output an allocation domain of its own, which the pass leaves alone.

The pass relates IterDomains by IdModel's EXACT graph. The stand-in keeps it as a union-find of
groups (``Groups``) over each definition's dims: every tensor value has a group per logical dim
(``ids``), a reduction's result also the groups of the dims it reduced (``reduced``: nvFuser keeps
them in its logical domain, marked reduction), and the fusion inputs it depends on (``deps``). Each
op says which of its operands' dims each output dim is exact-mapped to (the rules below); a
broadcast operand dim is not mapped to an output dim that is not one (``mapBroadcast(false)``).

For each output without an allocation domain (``order``): the reference is the input it depends on
with the most allocated dims that are not broadcasts; an equal count keeps the earlier reference
only if the two inputs' such dims map pairwise in allocation order, else neither is taken (unless a
later input has more). Inputs and outputs two of whose dims share a group (self mapping) take no
part. The reference's allocated dims are walked from the innermost: each finds the output dim of
its group, one of the output's reduced groups is passed over, a broadcast without one is passed
over too, any other dim without one ends the walk. The output is allocated with its dims the walk
did not find outermost, in logical order, then those it found, the last found outermost.

Approximations (where nvFuser follows the IterDomain transforms, the stand-in guesses by extents):
a reshape maps the common leading dims of equal extent and the common trailing ones, not overlapping
(nvFuser's ``analyzeView`` maps exactly the dims it leaves alone); a slice maps only dims it keeps
whole with constant bounds (``start`` 0, ``end`` at least the constant extent); a pad the dims it
pads by constant zeros; a cat its other dims to every operand's; iota, full and the gathers
(``gather``, ``index_select``, ``take_along_axis``) make new dims. A dim is a broadcast where its
extent is 1 or it is an expanded broadcast (an input's dim declared so, or of contiguity None).
Matmul, linear and SDPA outputs, which the pass skips, the stand-in has none of.
"""

from fake_nvfuser_binding import nvf_check


class Groups:
    """The EXACT graph's groups: a union-find over the definition's dims."""

    def __init__(self):
        self.parent: list = []

    def new(self) -> int:
        self.parent.append(len(self.parent))
        return len(self.parent) - 1

    def find(self, node) -> int:
        while self.parent[node] != node:
            self.parent[node] = self.parent[self.parent[node]]
            node = self.parent[node]
        return node

    def union(self, a, b):
        self.parent[self.find(a)] = self.find(b)


def broadcast(value, d) -> bool:
    """Whether dim ``d`` of a tensor value is a broadcast IterDomain."""
    return bool(value.expanded[d]) or value.meta.shape[d] == 1


def stride_order_allocation(stride_order, rank) -> list:
    """The logical dims, outermost first, of ``stride_order`` (``stride_order[d]`` the rank of dim
    ``d``'s stride, ``rank - 1`` outermost; empty for row-major): ``strideOrderToAllocation``."""
    if not stride_order:
        return list(range(rank))
    allocation = [0] * rank
    for d, order in enumerate(stride_order):
        allocation[rank - 1 - order] = d
    return allocation


def check_stride_order(arg, stride_order):
    """What ``ops.stride_order`` checks of its ``stride_order`` (``[]`` asks for none)."""
    if not stride_order:
        return
    nvf_check(
        arg.ndim == len(stride_order),
        "(ndims)==(std::ssize(stride_order))",
        f"Found {arg.ndim} vs {len(stride_order)}. ",
        "Operator stride_order expects `stride_order` argument to have the same length as input!",
    )
    nvf_check(
        sorted(stride_order) == list(range(arg.ndim)),
        "std::is_permutation( stride_order.begin(), stride_order.end(), inc_vec.begin())",
        f"Stride order is not valid: {', '.join(map(str, stride_order))}",
    )


def define_input(fd, tv, stride_order):
    """A tensor input: new groups, and its allocation (``define_tensor``'s ``stride_order``)."""
    tv.deps = frozenset([tv.slot])
    tv.ids = tuple(fd.groups.new() for _ in range(tv.ndim))
    tv.alloc = stride_order_allocation(stride_order, tv.ndim)


def link(fd, operands, made, rule=None):
    """Relates the outputs ``made`` of an op of ``operands``: their inputs, and each tensor output's
    groups by ``rule(out) -> (sources, reduced)``: ``sources[d]`` the ``(operand, dim)`` pairs dim
    ``d`` is exact-mapped to, ``reduced`` those of its reduction dims (``elementwise`` by default)."""
    deps = frozenset().union(*(v.deps for v in operands))
    for out in made:
        out.deps = deps
        if not out.is_tensor():
            continue
        sources, reduced = (rule or elementwise(operands))(out)
        ids = []
        for d, pairs in enumerate(sources):
            node = fd.groups.new()
            for v, vd in pairs:
                if broadcast(out, d) or not broadcast(v, vd):
                    fd.groups.union(node, v.ids[vd])
            ids.append(node)
        out.ids, out.reduced = tuple(ids), tuple(v.ids[vd] for v, vd in reduced)


# -- which operand dims each op's output dims map to -------------------------------------------------


def elementwise(operands):
    """Unary, binary and ternary ops, casts, scans, ``set``: each dim to the same dim of every
    tensor operand of the output's rank (``ops::newOutputDomain``)."""

    def rule(out):
        same_rank = [v for v in operands if v.is_tensor() and v.ndim == out.ndim]
        return [[(v, d) for v in same_rank] for d in range(out.ndim)], ()

    return rule


def new_dims(out):
    """Factories and gathers (and what the stand-in does not follow): no dim mapped."""
    return [[] for _ in range(out.ndim)], ()


def permuted(arg, dims):
    return lambda out: ([[(arg, d % arg.ndim)] for d in dims], ())


def squeezed(arg, dims):
    gone = {d % arg.ndim for d in dims}
    return lambda out: ([[(arg, d)] for d in range(arg.ndim) if d not in gone], ())


def reduction(arg, axes, keepdim):
    """A reduction over ``axes``: its kept dims map; without keepdim its result keeps the reduced
    groups as reduction dims, with keepdim (a broadcast of that result) they are new broadcasts."""
    if not axes:  # over no dims: a set
        return elementwise((arg,))
    if keepdim:
        return lambda out: ([[] if d in axes else [(arg, d)] for d in range(arg.ndim)], ())
    return lambda out: ([[(arg, d)] for d in range(arg.ndim) if d not in axes], [(arg, d) for d in axes])


def broadcast_in_dim(arg, broadcast_dims):
    def rule(out):
        sources = [[] for _ in range(out.ndim)]
        for i, d in enumerate(broadcast_dims):
            sources[d] = [(arg, i)]
        return sources, ()

    return rule


def reshaped(arg):
    """A reshape: the common leading dims of equal extent and the common trailing ones (approximate)."""

    def rule(out):
        old, new = list(arg.meta.shape), list(out.meta.shape)
        sources = [[] for _ in new]
        lead = 0
        while lead < min(len(old), len(new)) and old[lead] == new[lead]:
            sources[lead] = [(arg, lead)]
            lead += 1
        trail = 1
        while trail <= min(len(old), len(new)) - lead and old[-trail] == new[-trail]:
            sources[len(new) - trail] = [(arg, len(old) - trail)]
            trail += 1
        return sources, ()

    return rule


def sliced(arg, start, end):
    """A slice: the dims it keeps whole, by constant bounds (approximate)."""

    def whole(d):
        s, e, extent = start[d], end[d], arg.meta.shape[d]
        return isinstance(s, int) and isinstance(e, int) and s == 0 and e >= extent and not arg.fd.symbolic

    return lambda out: ([[(arg, d)] if whole(d) else [] for d in range(arg.ndim)], ())


def padded(arg, widths):
    """A pad: the dims it pads by nothing (``widths`` innermost dim first, as torch's)."""

    def unpadded(d):
        i = arg.ndim - 1 - d
        return 2 * i + 1 >= len(widths) or (
            all(isinstance(w, int) for w in widths[2 * i : 2 * i + 2]) and widths[2 * i] == widths[2 * i + 1] == 0
        )

    return lambda out: ([[(arg, d)] if unpadded(d) else [] for d in range(arg.ndim)], ())


def catted(tensors, dim):
    """A cat: pads of each operand (by nothing but at ``dim``), then an elementwise op of them."""

    def rule(out):
        at = dim % out.ndim
        return [[(t, d) for t in tensors] if d != at or len(tensors) == 1 else [] for d in range(out.ndim)], ()

    return rule


# -- the pass ------------------------------------------------------------------------------------------


def _self_mapped(fd, nodes) -> bool:
    groups = [fd.groups.find(n) for n in nodes]
    return len(set(groups)) != len(groups)


def _non_trivial(tv) -> list:
    """The groups of a tensor input's allocated dims that are not broadcasts, outermost first."""
    return [tv.ids[d] for d in tv.alloc if not broadcast(tv, d)]


def _reference(fd, out):
    """The input whose allocation ``out`` takes, or None (``inferAllocationOrder``)."""
    ref, high = None, 0
    for tv, _ in fd._inputs:
        if not tv.is_tensor() or tv.slot not in out.deps or _self_mapped(fd, tv.ids):
            continue
        count = len(_non_trivial(tv))
        if count > high:
            ref, high = tv, count
        elif count == high and ref is not None:
            pairs = zip(_non_trivial(ref), _non_trivial(tv))
            if any(fd.groups.find(a) != fd.groups.find(b) for a, b in pairs):
                ref = None  # ambiguous: no reference unless a later input has more dims
    return ref


def _mapped_order(fd, ref, out) -> list:
    """``out``'s dims, outermost first, as they map to ``ref``'s allocation (``mapAllocationDomain``)."""
    where = {fd.groups.find(node): d for d, node in enumerate(out.ids)}
    where.update({fd.groups.find(node): None for node in out.reduced})  # None: a reduction dim
    found = []
    for r in reversed(ref.alloc):
        group = fd.groups.find(ref.ids[r])
        if group not in where:
            if broadcast(ref, r):
                continue
            break
        d = where[group]
        if d is not None and d not in found:
            found.append(d)
    return [d for d in range(out.ndim) if d not in found] + found[::-1]


def order(fd, out) -> list:
    """The dims of output ``out``, outermost first, in which it is allocated (None for a scalar)."""
    if not out.is_tensor():
        return None
    if out.alloc is not None:  # an allocation domain of its own (an input, ops.stride_order)
        return out.alloc
    if _self_mapped(fd, out.ids + out.reduced):
        return list(range(out.ndim))
    ref = _reference(fd, out)
    return list(range(out.ndim)) if ref is None else _mapped_order(fd, ref, out)
