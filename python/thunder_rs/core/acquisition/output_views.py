"""Returned views of intermediates: taken outside the compiled call, as eager's views are.

A program that returns a view of a tensor it computed (``(x @ w).view(2, 3, 2).permute(0, 2,
1)``) returns in eager a view made by view ops, which the caller may write in place (``y /= 2``:
autograd rebases the view's history). Returned by the ``torch.autograd.Function`` of a training
call, the same tensor is a view the Function made, which torch refuses to write in place. So the
trace returns the view's root instead, and the call takes the view of it after the Function ran
(torch calls, recorded by autograd), as AOTAutograd regenerates such outputs from their base:
the caller's tensor is a view with eager's base, strides and history, and several views of one
intermediate (or the intermediate and its view) share its memory, as in eager.

An input returned, or a view of one, is likewise the caller's tensor or taken of it outside the
Function (inputs the program writes are the write-backs', ``writeback``). Only views through shape
prims (``writeback.replayable_view``) are taken again, only in calls with outputs that carry
gradients (others run no Function); other outputs cost a call nothing."""

from dataclasses import dataclass, replace

import torch

from thunder_rs.core.acquisition.writeback import refuse_rebased, replayable_view, view_taker
from thunder_rs.core.base.proxies import TensorProxy


@dataclass(frozen=True)
class OutputViews:
    """The program outputs a call takes as views of other outputs of its trace."""

    #: how the program's outputs are returned: "single", "tuple" or "list"
    out_kind: str
    #: (output position, whether its root is a trace input (None: the program's output at the
    #: position given, returned again), the position of that input or of the trace output
    #: holding the root, view steps, whether the view is taken under ``no_grad``, how many of the
    #: steps took a view whose memory the program wrote since: ``views.ViewLink.rebased``)
    views: tuple
    #: the names of the trace's size inputs (``writeback.WriteBacks.sizes``)
    sizes: tuple = ()
    #: (output position, trace output position) of views of memory written since they were taken,
    #: in calls that record no gradient, whose own values the trace also returns, after all its
    #: other outputs: where the write ran in place into the view (``passes::reinplace``), that value
    #: is the view itself, a view of the root, returned as it is (eager's own: ``y = x * 1; v =
    #: y[1:]; v.mul_(2); return v``), with no view taken again (~1.4 us)
    own: tuple = ()


def plan_views(out, out_kind: str, traced: list, sizes: tuple, is_read=None):
    """The outputs of ``out`` (the program's flat outputs) to take as views after the call, and
    the outputs the trace returns instead: at the first view of an intermediate the intermediate
    (unless the program returns it too), at the other views None. An input the program does not
    write, or a view of it, is the caller's tensor or taken of it (the Function would return its
    own view of it, which torch refuses to write in place). ``(None, out, ())`` when there are none;
    the third: ``OutputViews.own``'s views, ``(output position, proxy)`` (``own_outputs``).
    ``is_read(vid)``: whether a top-level call of the recording reads the value; an intermediate
    no top-level call reads is internal to a composite (``tensordot``'s product, which its output
    reshapes), which the trace cannot return: such a view is returned as it is.

    A call that runs no Function (no output requires grad) returns the executors' views, but for
    those the trace computes as their root itself (``x.view(x.shape)``, ``x.t().t()``), which
    eager's view ops return new views of, and views of memory the program wrote since they were
    taken (``y = x * 1; v = y[1:]; v.mul_(2); return v``: eager's ``v._base`` is ``y``, where the
    executors computed the written values apart). A view the program took under ``no_grad`` of a root
    that requires grad is taken under ``no_grad`` (eager's has no history)."""
    leaves = [out] if out_kind == "single" else list(out)
    trained = any(isinstance(o, TensorProxy) and o.requires_grad for o in leaves)
    # (no input requires grad: no autograd function around the trace, whose passes may run in place)
    ungraded = not trained and not any(p.requires_grad for p in traced)
    own: list = []
    inputs = {id(p): k for k, p in enumerate(traced)}
    held: dict = {}
    for i, o in enumerate(leaves):
        if isinstance(o, TensorProxy):
            held.setdefault(id(o), i)
    views: list = []
    taken: dict = {}  # id of an output taken as a view -> its first position
    for i, o in enumerate(leaves):
        if id(o) in taken:  # (``return v, v``: eager's one tensor twice)
            leaves[i] = None
            views.append((i, None, taken[id(o)], (), False, 0))
            continue
        planned = len(views)
        if id(o) in inputs:
            if trained and o._vid == o._input_vid:  # the input itself (a written one is the write-backs')
                leaves[i] = None
                views.append((i, True, inputs[id(o)], (), False, 0))
            continue
        link = replayable_view(o, sizes)
        # (a view of memory written since: the executors wrote a copy of it, not its root)
        written = getattr(link, "rebased", 0)
        if link is None or not (trained or link.folds_away(o) or written):
            continue
        k = inputs.get(id(link.root))
        rebased = written if trained and o.requires_grad else 0
        # (a root the program wrote since is its own tensor, though only the write reads its value)
        if k is None and is_read is not None and not is_read(link.root._vid) and not written:
            continue
        detached = link.root.requires_grad and not o.requires_grad
        if rebased:
            rebased = refuse_rebased(o, link, rebased)
        if k is None:
            at = held.setdefault(id(link.root), i)
            leaves[i] = link.root if at == i else None
            views.append((i, False, at, link.steps, detached, rebased))
            if written and ungraded and not detached:
                own.append((i, o))
        elif link.root._vid == link.root._input_vid:  # (a view of a written input is the write-backs')
            leaves[i] = None
            views.append((i, True, k, link.steps, detached, rebased))
        if len(views) > planned:
            taken[id(o)] = i
    if not views:
        return None, out, ()
    kept = leaves[0] if out_kind == "single" else type(out)(leaves)
    return OutputViews(out_kind, tuple(views), sizes), kept, tuple(own)


def own_outputs(plan: OutputViews | None, out, own: tuple) -> tuple:
    """``plan`` and the trace's outputs ``out`` (the program's, then the effects'), with the own
    values of ``plan_views``'s ``own`` views (``(output position, proxy)``) returned after them."""
    if plan is None or not own:
        return plan, out
    kept = tuple(out) if type(out) in (tuple, list) else (out,)
    at = tuple((i, len(kept) + r) for r, (i, _) in enumerate(own))
    return replace(plan, own=at), (*kept, *(o for _, o in own))


def _same_output(t, inputs):
    return t


def _taker(steps, sizes: tuple, detached: bool, rebased: int = 0):
    """``view_taker``'s function (``rebased``: see there), run under ``no_grad`` where ``detached``
    (a view taken under ``no_grad``, whose use after its memory was written eager refuses)."""
    take = view_taker(steps, sizes, rebased)
    if not detached:
        return take

    def take_detached(t, inputs):
        with torch.no_grad():
            return take(t, inputs)

    return take_detached


def with_views(fn, plan: OutputViews):
    """``fn`` returning the program's outputs, each of ``plan.views`` taken of its root; the
    others as ``fn`` returns them."""
    same = _same_output  # (a position returned again: no view to take)
    takes = [
        (i, of_input, at, same if of_input is None else _taker(steps, plan.sizes, detached, rebased))
        for i, of_input, at, steps, detached, rebased in plan.views
    ]
    if plan.own:
        return _with_own(fn, plan, takes)
    if plan.out_kind == "single":
        _, of_input, k, take = takes[0]
        if of_input:
            return lambda *inputs: (fn(*inputs), take(inputs[k], inputs))[1]
        one = getattr(take, "op_call", None)  # (a view one op takes: called here, no frame of its taker)
        if one is not None:
            op, args = one
            return lambda *inputs: op(fn(*inputs), *args)
        return lambda *inputs: take(fn(*inputs), inputs)
    as_list = plan.out_kind == "list"

    def call(*inputs):
        roots = fn(*inputs)
        outs = list(roots)
        for i, of_input, at, take in takes:
            if of_input is None:  # the same output again
                outs[i] = outs[at]
            else:
                outs[i] = take(inputs[at] if of_input else roots[at], inputs)
        return outs if as_list else tuple(outs)

    return call


def _with_own(fn, plan: OutputViews, takes: list):
    """``with_views``'s callable where the trace also returns the own values of views (``plan.own``,
    its last outputs): each returned as it is where it is a view of its root (its write ran in place),
    else taken of the root as the other views are."""
    own = dict(plan.own)
    end = min(own.values())  # (the trace's outputs before the own values: the program's, the effects')
    if plan.out_kind == "single":
        (_, _, at, take), j = takes[0], own[0]

        def call_single(*inputs):
            roots = fn(*inputs)
            root, value = roots[at], roots[j]
            return value if value._base is root else take(root, inputs)

        return call_single
    as_list = plan.out_kind == "list"

    def call(*inputs):
        roots = fn(*inputs)
        outs = list(roots[:end])
        for i, of_input, at, take in takes:
            if of_input is None:  # the same output again
                outs[i] = outs[at]
            elif i in own and (value := roots[own[i]])._base is roots[at]:
                outs[i] = value
            else:
                outs[i] = take(inputs[at] if of_input else roots[at], inputs)
        return outs if as_list else tuple(outs)

    return call
