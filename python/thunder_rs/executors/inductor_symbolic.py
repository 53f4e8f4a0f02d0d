"""Inductor regions of a trace with symbolic sizes: one compile for every extent the trace leaves
symbolic (``Region.input_shapes``), instead of one per shape.

The region is traced to an FX graph over fake inputs of one ``ShapeEnv``: a tensor's symbolic
dims are symbols, its constant dims constant, and each size input (an int the region takes) a
symbolic int. As for torch.compile, equal sizes share a symbol (duck sizing), which the guards
check. Inductor compiles the graph with those symbols (``standalone_compile``, ``from_graph``);
what tracing and compiling assumed of them (equalities, ranges, strides, 0 and 1 kept apart)
are the ShapeEnv's guards, evaluated for a call's inputs before an artifact serves it: a call
they do not hold for compiles another artifact. Floats the region takes are inputs of the graph
(``inductor_floats``); other numbers that are not sizes are constants of the graph, part of what
an artifact serves.

thunder_rs's artifact cache (``inductor_cache``) keys artifacts by concrete layouts: symbolic
artifacts are not stored there (Inductor's own on-disk caches still serve a later process).
"""

from dataclasses import dataclass
from typing import Any

import torch

from thunder_rs import _core
from thunder_rs.executors.inductor_floats import (
    host_floats,
    lifted,
    python_math_refused,
    read_floats,
    refuse_half,
    without_lifted,
)

_Tensor = torch.Tensor
_SymExpr = _core.SymExpr


def is_symbolic(input_shapes) -> bool:
    """Whether a region's inputs have symbolic sizes (``Region.input_shapes``)."""
    return any(
        type(shape) is _SymExpr or (type(shape) is tuple and any(type(d) is _SymExpr for d in shape))
        for shape in input_shapes
    )


def has_floats(args, input_shapes) -> bool:
    """Whether a region takes floats (float inputs of the trace, or floats it computed) that are
    inputs of its graph, one compile for every value (``compile_symbolic``): where the trace told
    its inputs' sizes (``Region.input_shapes``), as it does for the Inductor executor's regions."""
    return len(input_shapes) == len(args) and any(type(a) is float for a in args)


def _graph_positions(args, input_shapes) -> list:
    """The positions of the graph's inputs among a region's: its tensors, its size inputs (whose
    shape is a size expression, not a tuple or None) and its floats."""
    taken = [
        isinstance(a, _Tensor) or type(a) is float or type(s) not in (tuple, type(None))
        for a, s in zip(args, input_shapes)
    ]
    return [i for i, t in enumerate(taken) if t]


def _graph_inputs(args, positions) -> list:
    """The graph's inputs for a region's ``args``: a float as a 0-d double tensor (which the graph
    reads as a number, ``_local_scalar_dense``), the others as they are."""
    return [_tensor(args[i]) if type(args[i]) is float else args[i] for i in positions]


def _tensor(x: float):
    return torch.tensor(x, dtype=torch.float64)


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
        return self.env.evaluate_guards_expression(self.guards, _graph_inputs(args, self.positions))


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
        if type(a) is float:
            fakes.append(mode.from_tensor(_tensor(a), source=source))
        elif isinstance(a, _Tensor):
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
    floats = {k for k, i in enumerate(positions) if type(args[i]) is float}

    def on_graph_inputs(*inputs):
        for k, (i, x) in enumerate(zip(positions, inputs)):
            full[i] = x.item() if k in floats else x
        return tuple(function(*full))

    # The execution traces run with grad mode and autocast off; the graph is traced so too. In
    # symbolic mode make_fx traces on the fake inputs' own mode and runs composite ops through
    # their Python decompositions (in "real" mode, ``constant_pad_nd``'s C++ kernel read the
    # sizes as ints: every size specialised).
    with torch.no_grad(), torch.autocast("cpu", enabled=False), torch.autocast("cuda", enabled=False):
        with python_math_refused(floats), mode:
            graph = make_fx(on_graph_inputs, decomposition_table=decompositions, tracing_mode="symbolic")(*fakes)
        host, extra = None, []
        if floats:  # the floats the region computes from its floats: computed before the graph runs
            reads = read_floats(graph, floats)
            nodes = lifted(graph, reads)
            if nodes:
                host = host_floats(graph, reads, nodes)
                extra = [mode.from_tensor(_tensor(v)) for v in host([args[i] for i in positions])]
                with mode:
                    graph = make_fx(without_lifted(graph, nodes), tracing_mode="symbolic")(*fakes, *extra)
            refuse_half(graph)
        with python_math_refused(floats):
            compiled = compile_graph(graph, [*fakes, *extra], dynamic_shapes="from_graph", options={})
    guards = env.produce_guards_expression(fakes, ignore_static=False)

    def inputs(args) -> list:
        if not floats:
            return [args[i] for i in positions]
        given = _graph_inputs(args, positions)
        return given if host is None else [*given, *map(_tensor, host([args[i] for i in positions]))]

    def run(args):
        return tuple(compiled(*inputs(args)))

    return SymbolicArtifact(run, env, guards, positions, constants)
