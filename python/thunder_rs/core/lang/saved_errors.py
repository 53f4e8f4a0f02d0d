"""The error eager's backward raises for an autograd node whose saved tensor was written in place
since it was saved (``saved_versions``), made when the compiled call's backward reaches it.

Eager's text (``SavedVariable::unpack``) names the tensor's type and shape, the node it is an
output of, and the versions of its memory then and at the save: "[torch.FloatTensor [3]], which
is output 0 of Mul, is at version 2; expected version 1 instead." The node is the saving node
itself for a tensor it saved of its outputs, and the tensor's own ``grad_fn`` at the backward for
one of its inputs (none for a leaf): the last in-place op autograd recorded on it, ``CopySlices``
on a base written through a view, ``AsStrided`` on a view of memory written since, else the op
that made it. A node is named by its class less ``Backward0`` (``FillBackward2``: ``Fill2``).

Versions count from the memory's version at the call: a trace input the caller wrote before the
call (``x.mul_(2)`` three times: version 3) saved and written inside counts from there, as
eager's, read from the tensor at each call of a program with such a node (``at_call``).
"""

import re

import torch
from torch._C import DisableTorchFunction
from torch.utils._python_dispatch import _disable_current_modes

from thunder_rs.errors import ThunderNotImplementedError

_LEADING = "one of the variables needed for gradient computation has been modified by an inplace operation: "
_ANOMALY_ON = (
    "Hint: the backtrace further above shows the operation that failed to compute its gradient. The variable in "
    "question was changed in there or anywhere later. Good luck!"
)
_WHERE = (
    " (thunder_rs: the tensor was saved for the backward of {saver} and written in place by {writer} at {where}, "
    "inside a compiled call; change the in-place operation to an out-of-place one, or clone the tensor before it)"
)
_SUFFIX = re.compile(r"Backward(\d*)$")

#: ``StaleSave.node`` of a tensor whose node is the trace input's ``grad_fn`` at the call
AT_CALL = "at call"
#: ``StaleSave.node[0]`` of one of several views a call made (``(MULTI_VIEW, name, output number)``),
#: whose use eager refuses once their memory is written
MULTI_VIEW = "multi view"
_MULTI_VIEW = (
    "Output {} of {} is a view and its base or another view of its base has been modified inplace. This view is "
    "the output of a function that returns multiple views. Such functions do not allow the output views to be "
    "modified inplace. You should replace the inplace operation by an out-of-place one."
)
_MULTI_VIEW_WRITTEN_WHY = (
    "This view is the output of a function that returns multiple views. Such functions do not allow the output "
    "views to be modified inplace. You should replace the inplace operation by an out-of-place one."
)
#: Eager's error for a write autograd sees into one of several views a call made
MULTI_VIEW_WRITTEN = "Output {} of {} is a view and is being modified inplace. " + _MULTI_VIEW_WRITTEN_WHY
#: Eager's error for a write of a value that requires grad into one of several views of memory that does not
MULTI_VIEW_NO_NODE_WRITTEN = (
    "A view was created in no_grad mode and is being modified inplace with grad mode enabled. "
    + _MULTI_VIEW_WRITTEN_WHY
)


def node_name(name: str) -> str:
    """Eager's name of an autograd node in the error: its class less ``Backward0``, or ``Backward``
    before another overload's number (``MulBackward0``: ``Mul``; ``FillBackward2``: ``Fill2``)."""
    return _SUFFIX.sub(lambda m: "" if m[1] == "0" else m[1], name)


class StaleSave:
    """What the backward of a node whose saved tensor the program wrote raises (see the module doc):
    the tensor's type and shape, ``node`` (``(name, output number)``, ``AT_CALL`` or None), the
    versions of its memory at the save and now counted from the call's, and where it was written.
    ``refusal``: the text of a ``ThunderNotImplementedError`` raised instead, where eager's answer is
    unknown or eager computes from values written unseen (``at_compile``: raised by the compile of
    a program whose outputs reach the node). ``input``: the position among the call's inputs of the
    trace input whose memory it is (``place``), whose version the counts start from."""

    __slots__ = (
        *("kind", "shape", "node", "version", "now", "note", "refusal"),
        *("input", "input_vid", "at_compile", "whole"),
    )

    def __init__(self, saved, node, version: int, now: int, note: str, refusal, input_vid, at_compile=False):
        self.kind, self.shape = type_name(saved.dtype, saved.device), list(saved.shape)
        self.node, self.version, self.now, self.note, self.refusal = node, version, now, note, refusal
        self.input, self.input_vid, self.at_compile = None, input_vid, at_compile
        #: the saved tensor is the trace input itself (not a view the program took of it)
        self.whole = input_vid is not None and not saved.view
        _hint()  # (eager's, learned while tracing: not inside the backward)

    def place(self, positions: dict) -> None:
        """Finds the position of the trace input (``positions``: by its value id as made)."""
        self.input = positions.get(self.input_vid)

    def error(self, at_call: dict | None = None) -> Exception:
        """The error, the input's ``(version, grad_fn, output number, tensor)`` at the call in
        ``at_call`` (``state_at_call``) where its memory is a trace input's."""
        if self.refusal is not None:
            return ThunderNotImplementedError(self.refusal)
        base, grad_fn, output, tensor = (at_call or {}).get(self.input, (0, None, 0, None))
        # (the caller's writes since the call: the call's write-back left it at eager's version)
        later = 0 if tensor is None else max(0, tensor._version - base - self.now)
        node = self.node
        if node is not None and node[0] == MULTI_VIEW:
            return RuntimeError(_MULTI_VIEW.format(node[2], node[1]) + self.note)
        recorded = node is not None and node != AT_CALL  # (a write autograd saw, in the program)
        if self.whole and tensor is not None and tensor._base is not None and (tensor.requires_grad or recorded):
            node = ("AsStrided", 0)  # (an input that is a view in eager: autograd makes its node again)
        if node == AT_CALL:
            node = None if grad_fn is None else (node_name(grad_fn.name()), output)
        which = "" if node is None else f", which is output {node[1]} of {node[0]},"
        hint = _ANOMALY_ON if torch.is_anomaly_enabled() else _hint()
        return RuntimeError(
            f"{_LEADING}[{self.kind} {self.shape}]{which} is at version {base + self.now + later}; expected version "
            f"{base + self.version} instead. {hint}{self.note}"
        )


_RESIDUAL = (
    " (thunder_rs: a tensor a compiled call saved for its backward; change the in-place operation to an "
    "out-of-place one, or run it after the backward)"
)


def residual_error(r, then: int, inputs, made=None, named=None) -> RuntimeError:
    """Eager's error for the tensor ``r`` a compiled call saved, at version ``then`` then: the
    node it is an output of is its ``grad_fn`` where it is one of the call's ``inputs`` (eager's
    saved original), and for one of the call's outputs the program made (``made``:
    ``saved_outputs.OutputMade``), the node eager gives it at the program's end, its versions
    counted from eager's then (the compiled forward may write its memory more often, computing
    into a buffer it took over). None is named for another (eager names the node of the op inside
    that saved it, which the compiled call does not know). ``named``: the node ``made.named`` says
    eager's error names (a reader of the output that saved it names its ``grad_fn`` then)."""
    which = ""
    now = r._version
    # (``grad_fn`` of an input only: that of a view the forward took of an output the caller wrote raises)
    if inputs is not None and any(r is t for t in inputs) and (node := r.grad_fn) is not None:
        which = f", which is output {r.output_nr} of {node_name(node.name())},"
    elif made is not None:
        named = made.node() if named is None else named
        which = "" if named is None else f", which is output {named[1]} of {named[0]},"
        now, then = made.version + now - then, made.version
    hint = _ANOMALY_ON if torch.is_anomaly_enabled() else _hint()
    return RuntimeError(
        f"{_LEADING}[{type_name(r.dtype, r.device)} {list(r.shape)}]{which} is at version {now}; expected "
        f"version {then} instead. {hint}{_RESIDUAL}"
    )


def inputs_at_call(stale: tuple) -> tuple:
    """The positions of the trace inputs whose versions the errors of ``stale`` (``(StaleSave,
    output positions)`` each) count from: read at each call (``state_at_call``)."""
    return tuple(sorted({s.input for s, _ in stale if s.input is not None}))


def state_at_call(inputs: tuple, positions: tuple) -> dict:
    """``{position: (version, grad_fn, output number, tensor)}`` of the inputs at ``positions``
    (the tensor, whose version at the backward counts the caller's writes since)."""
    return {k: (inputs[k]._version, inputs[k].grad_fn, inputs[k].output_nr, inputs[k]) for k in positions}


def _hint() -> str:
    """Eager's hint after its error without anomaly detection (its text varies between torch
    versions), from eager's own error, learned once (outside any dispatch mode a program may run
    under: ``FakeTensorMode``)."""
    if not _HINTS:
        try:
            with DisableTorchFunction(), torch._C._DisableFuncTorch(), torch.enable_grad():
                with torch.autograd.set_detect_anomaly(False), _disable_current_modes():
                    y = torch.zeros(1, requires_grad=True) * 1
                    z = y.sin()
                    y.mul_(2)
                    z.backward()
        except RuntimeError as e:
            _HINTS.append(str(e).partition(" instead. ")[2])
        except Exception:  # noqa: BLE001 (no eager error to learn it from here: the hint torch 2.15 gives)
            return _HINT
    return _HINTS[0] if _HINTS else _HINT


_HINTS: list = []
_HINT = (
    "Hint: enable anomaly detection to find the operation that failed to compute its gradient, with "
    "torch.autograd.set_detect_anomaly(True, check_nan=False)."
)


def where_note(saver: str, writer: str, where: str) -> str:
    return _WHERE.format(saver=saver, writer=writer, where=where)


def type_name(dtype: torch.dtype, device: torch.device) -> str:
    """Eager's name of a tensor's type in the error: the legacy name (``torch.FloatTensor``,
    ``torch.cuda.HalfTensor``) where the dtype has one, else the backend's (``CPUBFloat16Type``)."""
    with DisableTorchFunction():
        name = torch.empty(0, dtype=dtype).type()  # (torch.BFloat16Tensor, torch.ComplexFloatTensor)
    cuda = device.type == "cuda"
    if dtype in _LEGACY_NAMED:
        return name.replace("torch.", "torch.cuda.", 1) if cuda else name
    return f"{'CUDA' if cuda else 'CPU'}{name.removeprefix('torch.').removesuffix('Tensor')}Type"


_LEGACY_NAMED = frozenset(
    {
        torch.float16,
        torch.float32,
        torch.float64,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.bool,
    }
)


#: What the compile or the backward raises instead of eager's error (``saved_versions``).
UNKNOWN = (
    "could not be run again on meta or CPU tensors to learn which of its tensors eager's autograd saves, and {op} "
    "at {where} writes one of them in place ({tensor}) before the backward; thunder_rs takes it as saved and "
    "refuses a gradient that may differ from eager's"
)
UNSEEN = (
    "thunder_rs.jit: {op} at {where} writes where autograd does not see it (through .data, or into memory the "
    "pieces of unsafe_split share with their input) {tensor}, which {saver} saved for its backward, and a backward "
    "from the call's outputs reaches that node: eager's backward reads the values written (such a write bumps no "
    "version it checks), whereas the compiled backward would compute the gradient from the values the forward saw"
)


def refusal(saver: str, saved, op: str, where: str, why: str | None) -> str | None:
    """The text of the ``ThunderNotImplementedError`` raised instead of eager's error (``why``):
    by the backward where eager's answer is unknown; by the compile where eager computes from
    values written unseen (``.data``)."""
    if why is None:
        return None
    tensor = f"[{type_name(saved.dtype, saved.device)} {list(saved.shape)}]"
    text = why.format(op=op, where=where, tensor=tensor, saver=saver)
    prefix = "" if why is UNSEEN else f"backward: {saver} "
    return prefix + text + ". Clone the tensor before writing it, or write it after the backward"
