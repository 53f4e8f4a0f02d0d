"""Regions of a symbolic trace in nvFuser: one ``FusionDefinition`` serves every extent of the
region's symbolic sizes, as nvFuser's definitions are meant to (it caches kernels per input sizes
itself).

A tensor input's symbolic dims are defined with extent -1 (``TensorViewBuilder::shape``,
csrc/tensor_view.cpp: -1 makes a symbolic ``Index`` extent, 1 a broadcast, any other number a
constant that ``ExpressionEvaluator::bind_`` checks on each execute), a size value input is an Int
``define_scalar`` input, and each symbolic prim parameter (a reshape's shape, a slice's bounds, an
iota's length...) is built from them with nvFuser's scalar arithmetic. Its atoms (size values
``t3``) bind to the region's size input of that value, else to ``ops.size`` of an input tensor
whose shape has exactly that atom at that dim; an atom bound to neither makes the definition fail,
and the region runs eagerly (``NvFuserRegion._fallback``).

Python's ``//`` and ``%`` are built from nvFuser's ``div`` and ``mod``, which are C++'s ``/`` and
``%`` (``BinaryOp::evaluate``, csrc/ir/internal_nodes.cpp: they truncate toward zero): the
remainder is made non-negative first, ``((p % k) + k) % k``, and the quotient is then an exact
division, ``(p - r) / k``, so a negative dividend (a slice bound ``t3 - 8`` before it is clamped)
floors as Python does.

A float computed from sizes (``SymFloat``: ``T ** -0.5``) is a Double ``define_scalar`` input,
never a constant of the definition: ``host_floats`` computes it on the host on each call with the
program's own Python operations on that call's sizes, so it is the float eager computes, bit for
bit, and one definition serves every value of it.
"""

import ast
import math
import re
import struct

import torch

from thunder_rs._core import SymExpr
from thunder_rs.errors import ThunderNotImplementedError

_ATOM = re.compile(r"t(\d+)")
#: The size values a float's text reads (``(t0 ** (-0.5))``).
_ATOMS_IN_TEXT = re.compile(r"\bt(\d+)\b")
_FLOAT32 = struct.Struct("f")
#: The half dtypes by the names ``host_floats``' code reads them.
_HALF_NAMES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def symbolic_dims(input_shapes) -> tuple:
    """Per region input, the dims of a tensor's shape that are symbolic (``Region.input_shapes``)."""
    return tuple(
        tuple(d for d, size in enumerate(shape) if isinstance(size, SymExpr)) if isinstance(shape, tuple) else ()
        for shape in input_shapes
    )


def symbolic_layout(args, dims, descriptor) -> tuple:
    """What a definition of a region with symbolic dims ``dims`` is specialised on: each tensor's
    dtype, its sizes with -1 at the symbolic dims, its contiguity and stride order (``descriptor``,
    nvFuser's ``compute_tensor_descriptor``: where its broadcasts are and in which order its dims
    are laid out, not its strides, which change with the sizes) and its lazy negation bit; each
    number's type. A symbolic extent of 0 (a count, which may be 0) is a definition of its own:
    compiled on the empty inputs, or left to the eager calls where nvFuser fails on them, rather
    than an empty tensor reaching a definition compiled for others."""
    key: list = []
    for a, symbolic in zip(args, dims):
        if isinstance(a, torch.Tensor):
            sizes = tuple(-1 if d in symbolic and size else size for d, size in enumerate(a.shape))
            contiguity, stride_order = descriptor(list(a.shape), list(a.stride()))
            key += (a.dtype, sizes, tuple(contiguity), tuple(stride_order), a.is_neg())
        else:
            key.append(type(a))
    return tuple(key)


#: How many concrete layouts a symbolic region remembers the key of (then it starts over).
LAYOUTS_KEPT = 512


def symbolic_layouts(dims, descriptor, layout):
    """The per-call key function of a region with symbolic dims ``dims``: ``symbolic_layout`` of
    the call's arguments, computed once per concrete ``layout`` (dtypes, shapes, strides: what the
    static regions' key reads) and looked up after, so that a call costs what a static region's
    does and a dict lookup, not a ``descriptor`` call per tensor (issue 26: within 1 us)."""
    seen: dict = {}
    interned: dict = {}

    def key(args) -> tuple:
        concrete = layout(args)
        found = seen.get(concrete)
        if found is None:
            if len(seen) >= LAYOUTS_KEPT:
                seen.clear()
            made = symbolic_layout(args, dims, descriptor)
            found = seen[concrete] = interned.setdefault(made, made)
        return found

    return key


def _atom(expr) -> int | None:
    """The value number of a SymExpr that is one size value, else None."""
    match = isinstance(expr, SymExpr) and _ATOM.fullmatch(str(expr))
    return int(match.group(1)) if match else None


def size_sources(input_shapes) -> dict:
    """Where a region's inputs hold each size value its shapes name: value number -> the index of
    the size input that is it, else (index of a tensor input, dim) whose extent it is."""
    sources: dict = {}
    for i, shape in enumerate(input_shapes):
        if _atom(shape) is not None:
            sources[_atom(shape)] = i
    for i, shape in enumerate(input_shapes):
        for d, size in enumerate(shape if isinstance(shape, tuple) else ()):
            if _atom(size) is not None:
                sources.setdefault(_atom(size), (i, d))
    return sources


class Extents:
    """The symbolic sizes of a definition being built, as nvFuser Int scalars."""

    def __init__(self, ops, region_name: str, input_shapes, inputs):
        """``inputs``: the definition's input values, in the order of ``input_shapes``."""
        self.ops, self.region_name = ops, region_name
        #: value number -> the scalar input standing for it, or (tensor input, dim) whose extent it is
        self._atoms: dict = {
            value: inputs[at] if isinstance(at, int) else (inputs[at[0]], at[1])
            for value, at in size_sources(input_shapes).items()
        }
        self._built: dict = {}

    def of(self, expr: SymExpr):
        """``expr`` as an nvFuser scalar (one per distinct expression)."""
        text = str(expr)
        if text not in self._built:
            self._built[text] = self._build(ast.parse(text, mode="eval").body)
        return self._built[text]

    def _build(self, node):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name) and _ATOM.fullmatch(node.id):
            return self._bound(int(node.id[1:]))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return self.ops.neg(self._build(node.operand))
        if isinstance(node, ast.BinOp):
            a, b = self._build(node.left), self._build(node.right)
            arithmetic = {ast.Add: self.ops.add, ast.Sub: self.ops.sub, ast.Mult: self.ops.mul}.get(type(node.op))
            if arithmetic is not None:
                return arithmetic(a, b)
            if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and type(b) is int and b > 0:
                remainder = self.ops.mod(self.ops.add(self.ops.mod(a, b), b), b)
                return remainder if isinstance(node.op, ast.Mod) else self.ops.div(self.ops.sub(a, remainder), b)
        raise ThunderNotImplementedError(f"nvfuser executor: no nvFuser scalar for {ast.unparse(node)}")

    def _bound(self, value: int):
        bound = self._atoms.get(value)
        if bound is None:
            raise ThunderNotImplementedError(
                f"nvfuser executor: region {self.region_name} reads the size t{value}, which is neither one of "
                "its size inputs nor an extent of one of its tensor inputs"
            )
        if isinstance(bound, tuple):
            tensor, dim = bound
            bound = self._atoms[value] = self.ops.size(tensor, dim)
        return bound


def _float32(value: float) -> float:
    """``value`` rounded to float32 as torch rounds it (C's conversion: to nearest, inf beyond)."""
    try:
        return _FLOAT32.unpack(_FLOAT32.pack(value))[0]
    except OverflowError:
        return float(torch.tensor(value, dtype=torch.float32))


def _rounded(value: float, dtype: torch.dtype) -> float:
    """``value`` rounded to a half ``dtype`` as a constant float of the definition is."""
    return float(torch.tensor(value, dtype=dtype))


def _rounding(text: str, dtype: torch.dtype) -> str:
    """The code of the float ``text`` rounded to ``dtype``."""
    if dtype == torch.float64:
        return text
    if dtype == torch.float32:
        return f"_float32({text})"
    return f"_rounded({text}, {str(dtype).removeprefix('torch.')})"


def host_floats(region_name: str, input_shapes, floats, names=()):
    """The function of a region's inputs that computes the Double inputs of its definition
    (``floats``: each symbolic float's text and the dtype its value is rounded to, in input
    order), or None where it has none. It is generated code: each float is the text the trace
    prints, the program's own Python operations in its order, on the sizes of the call (a size
    input, else the extent of a tensor input) and the float inputs among the region's inputs
    (``names``: their value names; a float argument that changes between calls), so its value is
    eager's. A float meeting a float32 or half tensor is rounded to the dtype as a constant float
    of the definition is."""
    if not floats:
        return None
    sources = size_sources(input_shapes)
    lines = []
    for value in sorted({int(n) for text, _ in floats for n in _ATOMS_IN_TEXT.findall(text)}):
        at = sources.get(value)
        if at is None and f"t{value}" in names:  # a float input of the region
            at = list(names).index(f"t{value}")
        if at is None:
            raise ThunderNotImplementedError(
                f"nvfuser executor: region {region_name} computes a float from the size t{value}, which is neither "
                "one of its size inputs nor an extent of one of its tensor inputs"
            )
        read = f"inputs[{at}]" if isinstance(at, int) else f"inputs[{at[0]}].shape[{at[1]}]"
        lines.append(f"    t{value} = {read}\n")
    values = ", ".join(_rounding(text, dtype) for text, dtype in floats)
    source = f"def host_floats(inputs):\n{''.join(lines)}    return ({values},)\n"
    namespace = {"torch": torch, "math": math, "_float32": _float32, "_rounded": _rounded, **_HALF_NAMES}
    exec(compile(source, f"<{region_name} floats>", "exec"), namespace)  # noqa: S102 (our own text)
    return namespace["host_floats"]
