"""The program's outputs in memory it made, and the node eager's autograd gives each at the
program's end (``saved_versions``' bookkeeping, read as the trace ends): where the caller writes
one in place between the call and a backward that reaches a node that saved it
(``out = jfn(x); out.mul_(2); out.sum().backward()`` of an ``exp``), eager's backward raises
"...which is output 0 of Exp, is at version 1; expected version 0 instead". The compiled call
checks those outputs' versions (``run.autograd._check_made``) whether or not its own backward
keeps them (a backward computing ``qr`` again from its input keeps neither output), and names
the node and eager's versions (``saved_errors.residual_error``): the compiled forward may write
an output's memory more often than eager, computing into a buffer it took over (``sigmoid_``).

What the node saves is asked on the error's path only, by a run of the call again
(``saved_versions._saved_by``), of a copy of the call that keeps no proxy (``_unrooted``).
"""

from torch._C import DisableTorchFunctionSubclass

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.saved_versions import (
    SavedVersions,
    _Call,
    _Tensor,
    _described,
    _leaves,
    _node_of,
    _one_tensor_op,
    _saved_by,
)
from thunder_rs.core.lang.saved_ops import SAVES_NO_OUTPUT, SAVES_NOTHING


def released(state: SavedVersions, out) -> tuple:
    """``(state.release(), outputs_made(state, out))``: read before the state forgets its calls."""
    made = outputs_made(state, out)
    return state.release(), made


def outputs_made(state: SavedVersions, out) -> dict:
    """``{value id: OutputMade}`` of the program's outputs (the tensors of ``out``) in memory the
    program made, not views, that require grad, whose node may save them (``_may_save``)."""
    made: dict = {}
    with DisableTorchFunctionSubclass():
        for p in _leaves(out, TensorProxy):
            if p._view is None and p._input_vid is None and p.requires_grad and p._vid not in made:
                last = _last_node(state, p)
                node = OutputMade.unrooted(last)
                if _may_save(node):
                    vids = (p._vid, *(() if last is None or type(last[0]) is str else last[0].vids))
                    made[p._vid] = OutputMade(node, state.versions.get(id(p), 0), vids)
    return made


def _symbolic(call) -> bool:
    """Whether a tensor of ``call`` (not described yet) has a symbolic size: describing it reads the
    sizes' hints and the views' strides, which would specialise the trace on them."""
    return any(not all(type(n) is int for n in t.shape) for t in _leaves((call.args, call.outs), TensorProxy))


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
            if call.func in SAVES_NOTHING or call.func in SAVES_NO_OUTPUT or _symbolic(call):
                return None  # (no output saved; or sizes a description would read the hints of)
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

    __slots__ = ("_node", "_made", "version", "vids", "reach")

    def __init__(self, node, version: int, vids: tuple = ()):
        self._node, self.version, self.vids = node, version, vids
        self.reach: frozenset = frozenset()
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

    @staticmethod
    def unrooted(node):
        """``node`` (``(call, its _Tensor)``) without the proxies its tensors stand for (kept past
        the trace, a proxy would be found stored: ``acquire._check_no_escape``); a name as it is."""
        if node is None or type(node[0]) is str:
            return node
        call, t = node
        made: dict = {}
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
