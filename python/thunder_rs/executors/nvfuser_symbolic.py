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
"""

import ast
import re

import torch

from thunder_rs._core import SymExpr
from thunder_rs.errors import ThunderNotImplementedError

_ATOM = re.compile(r"t(\d+)")


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


def _atom(expr) -> int | None:
    """The value number of a SymExpr that is one size value, else None."""
    match = isinstance(expr, SymExpr) and _ATOM.fullmatch(str(expr))
    return int(match.group(1)) if match else None


class Extents:
    """The symbolic sizes of a definition being built, as nvFuser Int scalars."""

    def __init__(self, ops, region_name: str, input_shapes, inputs):
        """``inputs``: the definition's input values, in the order of ``input_shapes``."""
        self.ops, self.region_name = ops, region_name
        #: value number -> the scalar input standing for it, or (tensor input, dim) whose extent it is
        self._atoms: dict = {}
        for shape, value in zip(input_shapes, inputs):
            if _atom(shape) is not None:
                self._atoms[_atom(shape)] = value
        for shape, value in zip(input_shapes, inputs):
            for d, size in enumerate(shape if isinstance(shape, tuple) else ()):
                if _atom(size) is not None:
                    self._atoms.setdefault(_atom(size), (value, d))
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
