"""Where eager's tensor for a proxy starts in its storage (``Tensor.storage_offset()``), for the
decisions torch takes on it (which attention kernel runs: ``fused_attention``).

A view starts where its root does plus what its steps add (a slice: its start times the stride
of each dim it narrows); a root the program computed is a new tensor, which starts at 0; a trace
input starts where its tensor did when traced (``TensorProxy._offset``), which a later call's
tensor may not: the cache key leaves the offset out, so a decision that depends on it guards it
(``core.state.offsets``).
"""

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.torch.strides import strides_of


def input_root(p) -> TensorProxy | None:
    """The trace input that eager's tensor for ``p`` is (a view of), or None where the program
    computed it: the root of a view; a copy the call makes of a tensor the program created is the
    call's own."""
    root = p if p._view is None else p._view.root
    return root if root._input_vid is not None and not root._per_call else None


def eager_offset(p):
    """The storage offset of eager's tensor for ``p`` (a ``SymInt`` where a slice starts at a
    symbolic size), or None where a step of its view adds what no rule here tells (an eager view
    op run as a fallback, ``diagonal``)."""
    link = p._view
    root = p if link is None else link.root
    offset = root._offset if input_root(p) is not None else 0
    if link is None:
        return offset
    shape, strides = tuple(root.shape), strides_of(root)
    for step in link.steps:
        if step.is_prim and step.name == "slice":
            for start, stride in zip(step.params[0], strides):
                if type(start) is not int or start:
                    offset = offset + start * stride
        elif not step.is_prim and not step.detached:
            return None
        layout = step.layout(shape, strides)
        if layout is None:
            return None
        shape, strides = layout
    return offset
