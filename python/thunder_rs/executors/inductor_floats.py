"""Float arguments of an Inductor region as inputs of its graph: one compile for every value.

A region of a trace with float inputs (``core.acquisition.float_args``) takes the caller's float,
and may compute floats from it in Python (``torch.sym_sqrt(s)``, ``1 / s``). The graph takes each
float as a 0-d double tensor which it reads as a number (``_local_scalar_dense``, as torch.compile
takes an unspecialised float): a symbolic float, so that the ops see a Python number as eager's
do (a wrapped number, which promotes no tensor: a 0-d double tensor operand would). The Python
arithmetic on those floats is not left to Inductor, whose symbolic expressions may fold constants
or reassociate (``s * 0.1 * 3`` as ``0.3 * s``): each float the graph's tensor ops read that the
region computes from its floats is computed before the graph runs (``host_floats``), by the
region's own Python operations on doubles, in its order, and taken by the graph as an input of
its own (``lifted``).

Half precision is left out: eager's kernels read a Python number meeting a bfloat16 or float16
tensor in ways that depend on the op, the side and the device (on the CPU, ``x + s`` rounds ``s``
to bfloat16 and ``x * s`` reads it in float32), which the graph is rewritten to follow for add,
sub, mul and div (``inductor_half``) and Inductor follows for other ops with constants in part and
with a symbolic number not at all (``s - x`` differed from eager in 3 of 4 values before that
rewrite): a region where a float input meets a half tensor is not compiled (``refuse_half``), and
runs as its eager torch calls.
"""

import contextlib

import torch
from torch.fx import Interpreter, Node

_ITEM = torch.ops.aten._local_scalar_dense.default
_SCALARS = (torch.SymFloat, torch.SymInt, torch.SymBool)


def _scalar(node) -> bool:
    return isinstance(node, Node) and isinstance(node.meta.get("val"), _SCALARS)


def read_floats(graph, float_inputs: set) -> dict:
    """``{node: k}``: the nodes reading the graph's ``k``-th input as a number, for the inputs at
    ``float_inputs`` (positions among the graph's inputs)."""
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    return {
        n: placeholders.index(n.args[0])
        for n in graph.graph.nodes
        if n.op == "call_function" and n.target is _ITEM and n.args[0] in placeholders
        if placeholders.index(n.args[0]) in float_inputs
    }


_HALF = (torch.float16, torch.bfloat16)


def _half(x) -> bool:
    val = x.meta.get("val") if isinstance(x, Node) else None
    return isinstance(val, torch.Tensor) and val.dtype in _HALF


def refuse_half(graph) -> None:
    """Raises where an op of ``graph`` computes on a half tensor with a float the graph takes as an
    input or computes from one (see the module doc)."""
    for n in graph.graph.nodes:
        numbers = [a for a in (*n.args, *n.kwargs.values()) if _number(a)]
        if n.op == "call_function" and numbers and (_half(n) or any(_half(a) for a in n.args)):
            raise NotImplementedError(
                f"{n.target} computes on a half-precision tensor with a float input, which Inductor reads otherwise "
                "than eager does"
            )


def _number(x) -> bool:
    return isinstance(x, Node) and isinstance(x.meta.get("val"), torch.SymFloat)


def lifted(graph, reads: dict) -> list:
    """The float nodes computed from the floats ``reads`` (and constants) alone that a tensor op
    of the graph reads: the floats to compute before the graph runs."""
    computed: set = set()
    out = []
    for n in graph.graph.nodes:
        if n.op != "call_function" or n in reads or not isinstance(n.meta.get("val"), torch.SymFloat):
            continue
        args = [a for a in (*n.args, *n.kwargs.values()) if isinstance(a, Node)]
        if n.kwargs or not all(a in reads or a in computed for a in args):
            continue
        computed.add(n)
        if any(not _scalar(user) for user in n.users):
            out.append(n)
    return out


def host_floats(graph, reads: dict, nodes: list):
    """``floats(graph inputs) -> list``: the values of ``nodes`` (``lifted``) for a call, the
    region's Python operations on the call's floats (``reads``: graph input positions) redone in
    order (``operator.truediv``, ``torch._sym_sqrt``, which is ``math.sqrt`` on a float)."""
    wanted: set = set()
    stack = list(nodes)
    while stack:
        n = stack.pop()
        if n not in wanted and n not in reads:
            wanted.add(n)
            stack.extend(a for a in n.args if isinstance(a, Node))
    order = [n for n in graph.graph.nodes if n in wanted]

    def floats(inputs) -> list:
        values = {n: inputs[k] for n, k in reads.items()}
        for n in order:
            values[n] = n.target(*[values[a] if isinstance(a, Node) else a for a in n.args])
        return [float(values[n]) for n in nodes]

    return floats


def without_lifted(graph, nodes: list):
    """``function(*graph inputs, *lifted floats as 0-d double tensors)``: ``graph`` run with each
    of ``nodes`` read from its input (to trace again)."""
    index = {n: j for j, n in enumerate(nodes)}
    count = sum(1 for n in graph.graph.nodes if n.op == "placeholder")

    class _Run(Interpreter):
        def run_node(self, n):
            if n in index:
                return self.extra[index[n]].item()
            return super().run_node(n)

    def function(*inputs):
        run = _Run(graph)
        run.extra = inputs[count:]
        return tuple(run.run(*inputs[:count]))

    return function


#: What torch raises where a region computes on a float its graph reads as a number with Python
#: functions it has no symbolic form of (``math.exp(s)`` asks the number's value; ``s ** 2.5``
#: Inductor cannot compile as a float expression).
_PYTHON_MATH_ERRORS = frozenset({"GuardOnDataDependentSymNode", "TensorifyScalarRestartAnalysis"})


@contextlib.contextmanager
def python_math_refused(floats):
    """Says so where the region computes on a float input with Python's math beyond arithmetic and
    ``torch.sym_sqrt`` (``math.exp(s)``, ``math.log(s)``, ``s ** 2.5``): Inductor's graph cannot
    compute those from its float input, and the region runs its eager torch calls (exact)."""
    try:
        yield
    except Exception as e:
        if floats and type(e).__name__ in _PYTHON_MATH_ERRORS:
            raise NotImplementedError(
                "the region computes on a float input with Python's math (math.exp, math.log, ** ...), which an "
                f"Inductor graph taking the float as an input cannot compute ({type(e).__name__})"
            ) from e
        raise
