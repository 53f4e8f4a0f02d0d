"""Inductor regions of a trace with symbolic sizes: one compile for every extent the trace leaves
symbolic (``Region.input_shapes``), instead of one per shape.

The region is traced to an FX graph over fake inputs of one ``ShapeEnv``: a tensor's symbolic
dims are symbols, its constant dims constant, and each size input (an int the region takes) a
symbolic int. As for torch.compile, equal sizes share a symbol (duck sizing), which the guards
check. Inductor compiles the graph with those symbols (``standalone_compile``, ``from_graph``);
what tracing and compiling assumed of them (equalities, ranges, strides, 0 and 1 kept apart)
are the ShapeEnv's guards, evaluated for a call's inputs before an artifact serves it: a call
they do not hold for compiles another artifact. Numbers the region takes that are not sizes are
constants of the graph, part of what an artifact serves.

thunder_rs's artifact cache (``inductor_cache``) keys artifacts by concrete layouts: symbolic
artifacts are not stored there (Inductor's own on-disk caches still serve a later process).
"""

from dataclasses import dataclass
from typing import Any

import torch

from thunder_rs import _core

_Tensor = torch.Tensor
_SymExpr = _core.SymExpr


def is_symbolic(input_shapes) -> bool:
    """Whether a region's inputs have symbolic sizes (``Region.input_shapes``)."""
    return any(
        type(shape) is _SymExpr or (type(shape) is tuple and any(type(d) is _SymExpr for d in shape))
        for shape in input_shapes
    )


def _graph_positions(args, input_shapes) -> list:
    """The positions of the graph's inputs among a region's: its tensors and its size inputs
    (whose shape is a size expression, not a tuple or None)."""
    taken = [isinstance(a, _Tensor) or type(s) not in (tuple, type(None)) for a, s in zip(args, input_shapes)]
    return [i for i, t in enumerate(taken) if t]


def _constants(args, positions) -> tuple:
    """The region's other inputs (numbers), which the graph holds as constants, typed."""
    taken = set(positions)
    return tuple((i, type(a), a) for i, a in enumerate(args) if i not in taken)


@dataclass(eq=False)
class SymbolicArtifact:
    """One compile of a region for all sizes its guards hold for: ``run(args) -> tuple``."""

    run: Any
    #: the ShapeEnv the guards are over
    env: Any
    guards: str | None
    positions: list
    constants: tuple

    def serves(self, args) -> bool:
        if _constants(args, self.positions) != self.constants:
            return False
        if self.guards is None:
            return True
        return self.env.evaluate_guards_expression(self.guards, [args[i] for i in self.positions])


def _fake_inputs(args, input_shapes, positions):
    """The ShapeEnv, and a fake input for each graph input: a tensor whose symbolic dims are
    symbols, a size input as a symbolic int."""
    from torch._dynamo.source import ConstantSource  # noqa: PLC0415 (with Inductor, imported late)
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv  # noqa: PLC0415
    from torch.fx.experimental.symbolic_shapes import StatelessSymbolicContext  # noqa: PLC0415

    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    fakes = []
    for i in positions:
        a, shape, source = args[i], input_shapes[i], ConstantSource(f"input{i}")
        if isinstance(a, _Tensor):
            dynamic = [DimDynamic.STATIC if type(d) is int else DimDynamic.DUCK for d in shape]
            context = StatelessSymbolicContext(dynamic_sizes=dynamic)
            fakes.append(mode.from_tensor(a, source=source, symbolic_context=context))
        else:
            symbol = env.create_symbol(a, source, DimDynamic.DUCK)
            fakes.append(env.create_symintnode(symbol, hint=a, source=source))
    return env, mode, fakes


def compile_symbolic(function, args, input_shapes, make_fx, compile_graph, decompositions) -> SymbolicArtifact:
    """``function`` (a region's eager callable) compiled by Inductor for the sizes ``input_shapes``
    leaves symbolic, traced on fake inputs laid out as ``args``."""
    positions = _graph_positions(args, input_shapes)
    constants = _constants(args, positions)
    env, mode, fakes = _fake_inputs(args, input_shapes, positions)
    full = list(args)

    def on_graph_inputs(*inputs):
        for i, x in zip(positions, inputs):
            full[i] = x
        return tuple(function(*full))

    # The execution traces run with grad mode and autocast off; the graph is traced so too. In
    # symbolic mode make_fx traces on the fake inputs' own mode and runs composite ops through
    # their Python decompositions (in "real" mode, ``constant_pad_nd``'s C++ kernel read the
    # sizes as ints: every size specialised).
    with torch.no_grad(), torch.autocast("cpu", enabled=False), torch.autocast("cuda", enabled=False):
        with mode:
            graph = make_fx(on_graph_inputs, decomposition_table=decompositions, tracing_mode="symbolic")(*fakes)
        compiled = compile_graph(graph, fakes, dynamic_shapes="from_graph", options={})
    guards = env.produce_guards_expression(fakes, ignore_static=False)

    def run(args):
        return tuple(compiled(*[args[i] for i in positions]))

    return SymbolicArtifact(run, env, guards, positions, constants)
