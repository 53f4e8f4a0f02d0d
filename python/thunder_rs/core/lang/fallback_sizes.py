"""The output metadata of a fallback whose inputs have symbolic sizes, kept symbolic.

A fallback runs torch itself, so its output sizes come from torch's meta kernels. With symbolic
inputs they are computed on fake tensors of a ``ShapeEnv`` whose symbols are the recording's
size values (each with its hint): an input's size expression (``t0 * 4``, ``t1 // 2``) becomes
the same expression over those symbols, and the sizes the kernel returns are read back as
expressions over the size values (sums, products, floor division and remainder by constants;
a ``min`` or ``max`` as the side the traced sizes take, decided).
What the kernel decided on the way (``t0 > 16``, ``t0 == 11``) are the ShapeEnv's guards, each
recorded as the recording's own decision, so the compiled program checks it on each call.
The kernels run under the Python dispatcher, as Dynamo runs them: without it, ATen's C++
composites that read a fake tensor's sizes as ints (``permute`` in the FFTs' stride computation,
``to`` a complex dtype in ``polar`` and ``complex``) guarded each symbolic size on its value, so
``torch.fft.rfft`` of a signal compiled once per length.

A ShapeEnv imports ``torch._dynamo`` (seconds, once per process, unless the program has: Hugging
Face models do); finding the user's frame for torch's own messages would import Inductor too, so
it is not looked for.

Where that cannot be followed (a size torch makes from the data, a size expression or a guard
thunder_rs has no form for) the call's sizes are specialised, as before: ``symbolic_metadata``
returns None and the caller goes the static way.
"""

import sympy  # type: ignore[import-untyped]
import torch
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils._sympy.functions import FloorDiv, Max, Min, Mod, PythonMod

from thunder_rs.core.base.lazy import LazyModule
from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.lang.meta_errors import reads_values
from thunder_rs.core.lang.recorder import current, paused_recording
from thunder_rs.core.lang.symint import SymInt, wrap

#: A symbol's source (``ConstantSource``); a ShapeEnv imports torch._dynamo when made anyway.
_DYNAMO_SOURCES = LazyModule("torch._dynamo.source")


#: What torch says of a kernel that cannot take fake tensors of symbolic sizes ("Cannot call
#: numel() on tensor with symbolic sizes/strides").
_SYMBOLIC_REFUSED = "with symbolic sizes/strides"


class _Unfollowed(Exception):
    """A size or a guard with no thunder_rs form: the call is specialised instead."""


#: What ``symbolic_metadata`` returns for a call whose output sizes its data tell (``nonzero``):
#: read from its values (``core.lang.values``), with no size of its inputs specialised.
FROM_VALUES = object()


class _Sizes:
    """The ShapeEnv whose symbols stand for the recording's size values, and the two ways
    between the recording's sizes and torch's."""

    def __init__(self):
        self.env = ShapeEnv()
        # Where a symbol or guard came from is for torch's messages (see the module doc).
        self.env._get_user_frame = lambda: None
        self._by_value: dict = {}  # size value id -> torch.SymInt
        self._by_symbol: dict = {}  # sympy symbol -> the recording's SymExpr

    def to_torch(self, size):
        """A torch int for one of the recording's sizes (an int, a ``SymInt`` or a ``SymExpr``)."""
        expr = size.expr if type(size) is SymInt else size
        if type(expr) is int:
            return expr
        scope = {f"t{v}": self._symbol(v) for v in expr.values()}
        return eval(str(expr), {"__builtins__": {}}, scope)  # noqa: S307 (the printer's own arithmetic)

    def _symbol(self, value: int):
        found = self._by_value.get(value)
        if found is None:
            atom = current().size_value(value)
            assert not isinstance(atom, float)  # (a size's value: float inputs are no sizes)
            source = _source(f"t{value}")
            symbol = self.env.create_symbol(atom.hint, source, DimDynamic.DYNAMIC)
            found = self._by_value[value] = self.env.create_symintnode(symbol, hint=atom.hint, source=source)
            self._by_symbol[symbol] = atom
        return found

    def from_torch(self, size):
        """The recording's size for a torch int: an int, or a ``SymInt``."""
        if type(size) is int:
            return size
        if not isinstance(size, torch.SymInt):
            raise _Unfollowed(f"a size of type {type(size).__name__}")
        return wrap(self.from_sympy(size.node.expr))

    def from_sympy(self, e):
        if isinstance(e, sympy.Integer):
            return int(e)
        if isinstance(e, sympy.Symbol):
            if e not in self._by_symbol:
                raise _DataSized(f"a size from the data ({e})")
            return self._by_symbol[e]
        if isinstance(e, sympy.Add):
            return _fold(map(self.from_sympy, e.args), lambda a, b: a + b)
        if isinstance(e, sympy.Mul):
            return _fold(map(self.from_sympy, e.args), lambda a, b: a * b)
        if isinstance(e, sympy.Pow) and isinstance(e.exp, sympy.Integer) and int(e.exp) > 0:
            return _fold([self.from_sympy(e.base)] * int(e.exp), lambda a, b: a * b)
        if isinstance(e, (Min, Max, sympy.Min, sympy.Max)):
            # ``min(m, n)`` of a factorisation: the side the sizes take, a decision on them.
            keeps = "le" if isinstance(e, (Min, sympy.Min)) else "ge"
            return _fold(map(self.from_sympy, e.args), lambda a, b: a if _decide(keeps, a, b) else b)
        if isinstance(e, (FloorDiv, Mod, PythonMod)):
            a, b = map(self.from_sympy, e.args)
            if type(b) is not int or b <= 0:
                raise _Unfollowed(f"{e}")
            return a // b if isinstance(e, FloorDiv) else a % b
        raise _Unfollowed(f"{e}")

    def record_guards(self) -> None:
        """Records what torch decided on the symbols as the recording's decisions."""
        for guard in self.env.guards:
            if not _always(guard.expr):
                self._record(guard.expr)
        for symbol, value in self.env.replacements.items():
            if symbol in self._by_symbol and value != symbol:
                self._record(sympy.Eq(symbol, value))

    def _record(self, relation) -> None:
        ops = {
            sympy.Eq: "eq",
            sympy.Ne: "ne",
            sympy.StrictLessThan: "lt",
            sympy.LessThan: "le",
            sympy.StrictGreaterThan: "gt",
            sympy.GreaterThan: "ge",
        }
        op = ops.get(type(relation))
        if op is None:
            raise _Unfollowed(f"the guard {relation}")
        a, b = (self.from_sympy(side) for side in relation.args)
        if not current().decide(op, a, b):
            raise _Unfollowed(f"the guard {relation} fails at the traced sizes")


def _decide(op: str, a, b) -> bool:
    """``a op b`` for sizes (ints or the recording's expressions), recorded as a decision where
    one is symbolic."""
    if type(a) is int and type(b) is int:
        return {"le": a <= b, "ge": a >= b}[op]
    return current().decide(op, a, b)


def _always(relation) -> bool:
    """Whether a guard torch took holds whatever the sizes, so that none is needed: a reshape's
    check that a length divides the numel, ``Mod(3*(t//2) + 3, t//2 + 1) == 0`` (``irfft``), which
    sympy proves once the quotients are plain integers."""
    quotients = {q: sympy.Dummy(integer=True, nonnegative=True) for q in relation.atoms(FloorDiv)}
    plain = relation.xreplace(quotients).replace(
        lambda e: isinstance(e, (Mod, PythonMod)), lambda e: sympy.Mod(*e.args)
    )
    return plain is sympy.true


def _fold(items, op):
    items = iter(items)
    out = next(items)
    for x in items:
        out = op(out, x)
    return out


def _source(name: str):
    return _DYNAMO_SOURCES.load().ConstantSource(name)


def symbolic_metadata(func, args, kwargs, factory: bool, requires_grad=None):
    """``func``'s outputs computed on fake tensors with symbolic sizes, their sizes the
    recording's (``SymInt`` where symbolic), as ``(outputs, sizes)``: ``sizes(t)`` gives an
    output's shape. None where the call's sizes cannot be followed (see the module doc).
    ``requires_grad(proxy)``: whether its fake tensor requires grad (so that the outputs say which
    of them autograd differentiates; the caller enables grad); by default none does."""
    sizes = _Sizes()
    mode = FakeTensorMode(shape_env=sizes.env)

    def fake(x):
        if isinstance(x, TensorProxy):
            shape = [sizes.to_torch(d) for d in x.shape]
            differentiable = requires_grad is not None and requires_grad(x)
            return torch.empty(shape, dtype=x.dtype, device=x.device, requires_grad=differentiable)
        return sizes.to_torch(x) if type(x) is SymInt else x

    with torch._C.DisableTorchFunctionSubclass():
        try:
            with enable_python_dispatcher(), mode:
                fake_args, fake_kwargs = tree_map(fake, (args, kwargs))
                if factory:
                    fake_kwargs["device"] = "meta"
                with paused_recording():  # (a custom op's autograd.Function runs on them as eager's does)
                    out = _RULES.get(func, func)(*fake_args, **fake_kwargs)
            shapes = {
                id(t): tuple(sizes.from_torch(d) for d in t.shape)
                for t in tree_flatten(out)[0]
                if isinstance(t, torch.Tensor)
            }
            sizes.record_guards()
        except _DataSized:
            return FROM_VALUES
        except Exception as e:  # noqa: BLE001 (unfollowed, or the op's own error: the static way raises it)
            # An op that reads its arguments' data, or whose kernel takes no symbolic sizes (a CPU
            # kernel with no meta one: ``_pad_packed_sequence``) is sized by its values: the static
            # way would specialise the inputs' sizes, which it cannot where they are counts.
            return FROM_VALUES if reads_values(e) or _SYMBOLIC_REFUSED in str(e) else None
    return out, lambda t: shapes[id(t)]


def _recurrent_outputs(func):
    """``func`` (``torch.lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu``) with its outputs' metadata
    given by its arguments: torch's decomposition steps through the sequence in Python, which took
    a guard on its length (a compile per length), and through a packed sequence's ``batch_sizes``
    by their values (a data-dependent error: a compile per distinct packed sizes). Its kernel's
    layout: the output is computed time-major, a transposed view where ``batch_first``; over a
    packed sequence (``batch_sizes`` second) it has the packed data's rows; the last hidden states
    are ``hx``'s shapes (``(h, c)`` for an LSTM). A hidden state of another shape than the input's
    (torch's error) runs the decomposition."""

    def outputs(input, hx, params, *rest):
        if isinstance(hx, torch.Tensor) and hx.dim() == 1 and not hx.is_floating_point():
            return packed(input, hx, params, *rest)
        return padded(input, hx, params, *rest)

    def padded(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first=False):
        directions = 2 if bidirectional else 1
        batch = (input.shape[0 if batch_first else 1],) if input.dim() == 3 else ()
        states = _states(hx, num_layers * directions, batch)
        if states is None or not isinstance(params, (list, tuple)):
            return func(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
        features = states[0].shape[-1] * directions
        grads = _differentiable(input, states, params)
        if input.dim() == 3 and batch_first:
            steps = input.new_empty((input.shape[1], input.shape[0], features)).requires_grad_(grads).transpose(0, 1)
        else:
            steps = input.new_empty((*input.shape[:-1], features)).requires_grad_(grads)
        return (steps, *(h.new_empty(h.shape).requires_grad_(grads) for h in states))

    def packed(data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional):
        directions = 2 if bidirectional else 1
        states = _states(hx, num_layers * directions, None)
        if states is None or not isinstance(params, (list, tuple)) or data.dim() != 2:
            return func(data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional)
        grads = _differentiable(data, states, params)
        steps = data.new_empty((data.shape[0], states[0].shape[-1] * directions)).requires_grad_(grads)
        return (steps, *(h.new_empty(h.shape).requires_grad_(grads) for h in states))

    return outputs


def _states(hx, layers: int, batch: tuple | None) -> tuple | None:
    """The hidden states ``hx`` (one tensor, or ``(h, c)``) where each is ``layers`` by ``batch``
    (any one batch where None: a packed sequence's is its ``batch_sizes[0]``, a value) by features."""
    states = tuple(hx) if isinstance(hx, (list, tuple)) else (hx,)
    for h in states:
        if (
            not isinstance(h, torch.Tensor)
            or h.shape[0] != layers
            or h.dim() != (3 if batch is None else 2 + len(batch))
        ):
            return None
        if batch is not None and tuple(h.shape[1:-1]) != batch:
            return None
    return states


def _differentiable(input, states, params) -> bool:
    """Whether the kernel's outputs are differentiable (the caller reads which outputs autograd
    tracks)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in (input, *states, *params))


#: Calls whose outputs' symbolic metadata a rule gives instead of torch's fake kernel.
_RULES = {func: _recurrent_outputs(func) for func in (torch.lstm, torch.gru, torch.rnn_tanh, torch.rnn_relu)}


class _DataSized(Exception):
    """An output size that torch makes from the data (an unbacked symbol)."""
