"""Eager's "backward through the graph a second time" error for a backward through a node of a
compiled call that an earlier backward ran and freed: a node that two outputs share (``h = x @ w``
returned as ``h.sin().sum()`` and ``(h * 2).cos().sum()``: one ``MmBackward0``), or one a single
output reaches, run again (``a.backward()`` twice, ``a`` a ``(x * w).sum()`` returned with others).

The call's backward frees the residuals it read (``autograd._free_read``), and a later backward
reading one raises; but never the call's inputs, which eager's nodes save (``MmBackward0`` saves
``x`` and ``w``, which the caller holds): such a second backward ran, accumulating the gradients
``retain_graph=True`` would give. Eager's graph is the trace's top-level calls: a backward whose
cotangents are present at some outputs runs the calls those outputs reach along gradients
(``Trace.outputs_reaching``), and eager's node of a call in ``SAVING`` always saves a tensor, so
running it again raises. A call not in ``SAVING`` (``linear``, a custom op) is taken to save
nothing: run again, it runs, as it did before. Asked only at a call's second backward (the first
keeps its pattern of absent cotangents), once per pair of patterns."""

from thunder_rs.core.lang.saved_aten import SAVES_RESULT, SAVES_SELF, SAVES_SELF_AND_RESULT

#: The top-level symbols whose eager autograd node saves a tensor whenever it is made: the
#: one-tensor aten ops ``derivatives.yaml`` says save their tensor or result (``saved_aten``), and
#: calls whose node saves the argument other than one requiring grad (``x * 2`` its wrapped
#: scalar), or tensors of their own (``layer_norm`` its statistics, ``embedding`` its indices).
#: ``linear`` saves where its input or weight requires grad (``SAVING_WITH``): given only a bias
#: requiring grad, ``AddmmBackward0`` saves none. ``tests/test_second_backward.py`` checks each
#: against eager.
SAVING = frozenset(
    "ltorch." + name
    for name in (
        *SAVES_SELF,
        *SAVES_RESULT,
        *SAVES_SELF_AND_RESULT,
        *"matmul mm bmm mul div true_divide pow square softmax log_softmax layer_norm embedding".split(),
    )
)


#: Symbols whose node saves a tensor where one of their positional arguments at the positions given
#: requires grad.
SAVING_WITH = {"ltorch.linear": (0, 1)}


def _saving_calls(trace) -> list:
    """The output value ids of each top-level call of ``trace`` whose eager node saves a tensor."""
    calls = trace.call_outputs(set(SAVING))
    for name, positions in SAVING_WITH.items():
        flags = trace.call_args_requiring_grad({name})
        outs = trace.call_outputs({name})
        calls += [o for o, f in zip(outs, flags) if any(f[i] for i in positions if i < len(f))]
    return calls


class SavingNodes:
    """Of a call with several grad outputs: whether a backward from the outputs at ``now`` (grad
    position indices) runs a node of ``SAVING`` that an earlier one, from those at ``earlier``,
    ran."""

    def __init__(self, trace, grad_positions: list):
        self.trace, self.positions = trace, list(grad_positions)
        self.reaches: set[frozenset] | None = None
        self.known: dict[tuple, bool] = {}

    def shared(self, earlier: frozenset, now: frozenset) -> bool:
        key = (earlier, now)
        if key not in self.known:
            if self.reaches is None:
                index = {p: k for k, p in enumerate(self.positions)}
                calls = _saving_calls(self.trace)
                reach = self.trace.outputs_reaching
                self.reaches = {frozenset(index[i] for i in reach(vids, self.positions)) for vids in calls}
            self.known[key] = any(r & earlier and r & now for r in self.reaches)
        return self.known[key]


def present(patterns: tuple, n: int) -> frozenset:
    """The grad position indices, of ``n``, of the cotangents present in one of the backwards of
    ``patterns`` (``autograd._Unreached``'s entries of the absent ones; None: all present)."""
    everything = frozenset(range(n))
    return frozenset().union(*(everything.difference(p[0] if p is not None else ()) for p in patterns))
