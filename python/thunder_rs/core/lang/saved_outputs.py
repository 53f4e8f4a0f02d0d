"""The program's outputs in memory it made, and the node eager's autograd gives each at the
program's end (``version_tracking``' bookkeeping, read as the trace ends): where the caller writes
one in place between the call and a backward that reaches a node that saved it
(``out = jfn(x); out.mul_(2); out.sum().backward()`` of an ``exp``), eager's backward raises
"...which is output 0 of Exp, is at version 1; expected version 0 instead". The compiled call
checks those outputs' versions (``run.autograd._check_made``) whether or not its own backward
keeps them (a backward computing ``qr`` again from its input keeps neither output), and names
the node and eager's versions (``saved_errors.residual_error``): the compiled forward may write
an output's memory more often than eager, computing into a buffer it took over (``sigmoid_``).

A backward reaches the node from any output computed from the values of its call (``reach``: a
backward from ``Q`` of ``qr`` unpacks the ``R`` it saved). The calls that read an output after its
last write (``_readers``: a ``sin`` of it, which saves it as its input) run before its node in
eager's backward, whose error then names the tensor's ``grad_fn`` at the backward (``named``).

What the nodes save is asked on the error's path only, by a run of the call again
(``saved_versions._saved_by``), of a copy of the call that keeps no proxy (``_unrooted``).
"""

from typing import Any

from torch._C import DisableTorchFunctionSubclass

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.saved_errors import node_name
from thunder_rs.core.lang.saved_versions import (
    _Call,
    _Tensor,
    _described,
    _leaves,
    _node_of,
    _one_tensor_op,
    _root,
    _saved_by,
)
from thunder_rs.core.lang.saved_ops import SAVES_NO_OUTPUT, SAVES_NOTHING
from thunder_rs.core.lang.version_tracking import SavedVersions


def released(state: SavedVersions, out) -> tuple:
    """``(state.release(), outputs_made(state, out))``: read before the state forgets its calls."""
    made = outputs_made(state, out)
    return state.release(), made


def outputs_made(state: SavedVersions, out) -> dict:
    """``{value id: OutputMade}`` of the program's outputs (the tensors of ``out``) in memory the
    program made, that require grad, a view's by its root (which the trace returns in its place:
    ``output_views``; the caller's write into ``r[1:]`` of ``qr``'s ``R`` writes ``R``); ``may_save``
    where their node may save them (``_may_save``)."""
    made: dict = {}
    readers = _unindexed_readers(state)
    with DisableTorchFunctionSubclass():
        for p in map(_root, _leaves(out, TensorProxy)):
            if p._input_vid is None and p.requires_grad and p._vid not in made:
                last, shared = _last_node(state, p), dict[object, Any]()
                node = OutputMade.unrooted(last, shared)
                vids = (p._vid, *(() if last is None or type(last[0]) is str else last[0].vids))
                output = made[p._vid] = OutputMade(node, state.versions.get(id(p), 0), vids)
                output.may_save = _may_save(node)
                output.readers = _readers(state, p, shared, readers.get(id(p), ()))
                output.root = shared.get(("root", id(p)))
    return made


def _unindexed_readers(state: SavedVersions) -> dict:
    """Per memory (its root proxy's id), the calls not indexed yet that take it as an argument."""
    readers: dict = {}
    for call in state.calls:
        for key in {id(_root(t)) for t in _leaves(call.args, TensorProxy)}:
            readers.setdefault(key, []).append(call)
    return readers


def _readers(state: SavedVersions, p, shared: dict, unindexed) -> tuple:
    """``(call, its outputs' value ids)`` of the program's calls since ``p``'s last write that took
    its memory as an argument and returned none of it (a ``sin`` of it, which saves it as its
    input), unrooted as its node (``shared``: one root per memory); calls with symbolic sizes left
    out (``_symbolic``). ``unindexed``: those of ``_unindexed_readers``."""
    key, found = id(p), []
    for call in state.pending.get(key, ()):  # (indexed: their tensors described)
        if any(id(t.root) == key for t in _leaves(call.args, _Tensor)) and all(id(o.root) != key for o in call.outs):
            found.append((OutputMade.unrooted((call, None), shared)[0], call.vids))
    for call in unindexed:  # (their tensors are proxies)
        if all(_root(o) is not p for o in call.outs) and call.func is not None and not _symbolic(call):
            described: dict = {}
            args, outs = _described(call.args, described), tuple(_described(o, described) for o in call.outs)
            found.append((OutputMade.unrooted((_Call(call.func, args, outs, ()), None), shared)[0], call.vids))
    return tuple(found)


def _symbolic(call) -> bool:
    """Whether a tensor of ``call`` (not described yet) has a symbolic size: describing it reads the
    sizes' hints and the views' strides, which would specialise the trace on them: a view's strides
    are worked out from its root's sizes (``x.unfold(1, 2, x.shape[1] // 2)``)."""
    tensors = _leaves((call.args, call.outs), TensorProxy)
    shapes = [t.shape for t in tensors] + [t._view.root.shape for t in tensors if t._view is not None]
    return any(not all(type(n) is int for n in shape) for shape in shapes)


def _may_save(node) -> bool:
    """Whether the node a call gives its output (``(call, the output)``) may save it: not where the
    tables say it does not (``saved_ops``: ``sum``, ``mul``, ``linear``; ``sin`` saves its input), so
    that a call returning a loss checks no version."""
    if node is None or type(node[0]) is str or node[0].func is None:  # (a custom Function's: not asked)
        return False
    call, t = node
    if call.func in SAVES_NOTHING or call.func in SAVES_NO_OUTPUT:
        return False
    known = _one_tensor_op(call)
    return known is None or id(t.root) in known


def _last_node(state: SavedVersions, p):
    """The node eager's autograd gives ``p`` (a tensor the program made) at the program's end, as
    ``SavedVersions.node`` finds it: from its last write autograd saw, else the call that made it
    (a call not indexed yet described here)."""
    key = id(p)
    if key in state.nodes:
        return state.nodes[key]
    for call in reversed(state.calls):  # (not indexed: their outputs are proxies)
        if any(o is p for o in call.outs):
            if _symbolic(call):
                return None  # (sizes a description would read the hints of)
            made: dict = {}
            args = _described(call.args, made)
            outs = tuple(_described(o, made) for o in call.outs)
            return _Call(call.func, args, outs, call.vids), made[key]
    return state.makers.get(key)


class OutputMade:
    """A program's output in memory it made: the node eager's autograd gives it at the program's end
    (``(name, output number)``, or ``(call, its _Tensor)``, named once asked; None where unknown) and
    its version then (the program's writes eager counts). ``vids``: the output's value id and those
    of the node's call's outputs (the others of a ``qr``), through which a backward reaches that
    node (``generate._made``: ``reach``, the flat output positions whose backward runs it)."""

    __slots__ = ("_node", "_made", "version", "vids", "reach", "may_save", "readers", "reader_reach", "root")

    def __init__(self, node, version: int, vids: tuple = ()):
        self._node, self.version, self.vids = node, version, vids
        self.reach: frozenset = frozenset()
        self.may_save = True
        #: ``_readers``, and per reader the flat outputs whose backward runs its node (``reach``'s)
        self.readers: tuple = ()
        self.reader_reach: tuple = ()
        #: the ``_Root`` of the output's memory in its node's and readers' copies (None: none has it)
        self.root: _Root | None = None
        #: ``(call, its _Tensor)`` of a node a call gives, asked what it saves (``saved``)
        self._made = None if node is None or type(node[0]) is str else node

    def node(self) -> tuple | None:
        node = self._node
        if node is not None and type(node[0]) is not str:
            self._node = node = _node_of(*node)
        return node

    def saved(self) -> bool:
        """Whether eager's node of the output saves it (a run again, on the error's path only): a
        write before a backward through that node makes eager's backward raise."""
        if self._made is None:
            return False
        call, t = self._made
        saved = _saved_by(call)
        return saved is False or id(t.root) in saved

    def reached(self, reached) -> bool:
        """Whether eager's backward, given the cotangents ``reached`` says are present, runs the
        output's node or a node of a call that read it (``named``)."""
        return any(map(reached, self.reach)) or any(any(map(reached, r)) for r in self.reader_reach)

    def named(self, out, own, reached) -> tuple | None:
        """The node eager's error names for this output ``out``, written by the caller, at the
        backward (``own``: the compiled call's node): its node at the program's end, where its own
        saved it; where a reader's node saved it (``sin`` of it), which eager's backward runs first,
        the tensor's ``grad_fn`` then (``Mul`` after the caller's ``mul_``; the node at the
        program's end where the write recorded none) as output 0 (eager keeps no output number
        of a tensor saved as an input). ``reached``: whether a flat output's cotangent is present."""
        node = self.node()
        for (call, _), reach in zip(reversed(self.readers), reversed(self.reader_reach)):  # (the last runs first)
            if any(map(reached, reach)):
                saved = _saved_by(call)
                if saved is False or id(self.root) in saved:
                    if saved is not False and saved[id(self.root)].view:  # (its node made again)
                        return "AsStrided", 0
                    now = out.grad_fn
                    if now is not None and now is not own:
                        return node_name(now.name()), 0
                    return None if node is None else (node[0], 0)
        return node

    @staticmethod
    def unrooted(node, made: dict | None = None):
        """``node`` (``(call, its _Tensor)``) without the proxies its tensors stand for (kept past
        the trace, a proxy would be found stored: ``acquire._check_no_escape``); a name as it is.
        ``made``: the copies so far (one root per memory)."""
        if node is None or type(node[0]) is str:
            return node
        call, t = node
        made = {} if made is None else made
        args = _unrooted(call.args, made)
        return _Call(call.func, args, tuple(_unrooted(o, made) for o in call.outs), ()), _unrooted(t, made)


class _Root:
    """The memory of an ``_unrooted`` tensor, standing for its root proxy."""

    __slots__ = ()
    _input_vid = None


def _unrooted(value, made: dict):
    """``value`` with each ``_Tensor`` a copy of it whose root is a ``_Root`` (one copy per tensor, one
    root per memory)."""
    if isinstance(value, _Tensor):
        copy = made.get(id(value))
        if copy is None:
            copy = made[id(value)] = object.__new__(_Tensor)
            for name in _Tensor.__slots__:
                setattr(copy, name, getattr(value, name))
            copy.root, copy.multi = made.setdefault(("root", id(value.root)), _Root()), None
        return copy
    if isinstance(value, (tuple, list)):
        items = [_unrooted(v, made) for v in value]
        return type(value)(items) if type(value) in (tuple, list) else items
    if isinstance(value, dict):
        return {k: _unrooted(v, made) for k, v in value.items()}
    return value
