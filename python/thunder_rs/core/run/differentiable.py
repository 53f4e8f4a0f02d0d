"""A compiled call's program as plain torch calls, which torch's autograd and functorch transform
as they transform eager code: what a double backward through the call runs (``create_graph=True``:
gradient penalties, meta-learning's inner step), and what torch.func transforms over it run
(``grad``, ``vjp``, ``jacrev``, ``vmap`` of ``grad``, ``hessian``).

The generated forward and backward of a training call are not differentiable themselves: the
backward is thunder_rs's VJP run with grad off, and fusion regions and in-place forms are opaque
to autograd. So the program is compiled a second time, on its first such use, to run under
autograd (``passes::differentiable``): the torch executor alone (custom ``autograd.Function``s run
whole, so that their own backward runs), no VJP, no in-place forms, and values the trace computed
without grad detached. Autograd records it as it records eager code, so gradients of gradients
are eager's, and an op without a double backward fails as it fails in eager.

A call's first double backward computes its forward again from the call's inputs under grad
mode (as activation checkpointing does), since the saved residuals are not connected to them. So
that it computes what the forward computed, each training call keeps: references to its inputs,
the versions of those the recomputation reads and no residual holds (written in place since,
they raise eager's error instead of giving other gradients), a copy of each input the call
overwrites and reads (a vector a power iteration starts from), and for a program that draws
random numbers the states its generators started from. From then on the entry's calls run the
program under autograd directly (``recording``), as eager runs them: a gradient penalty calls
the same entry every step, and computing each call twice cost a WGAN-GP step 37% over eager.
A call that writes its inputs after it runs (BatchNorm's running statistics) stays with the
recomputation, whose saved tensors those writes cannot reach.
"""

import operator
import threading

import torch

from thunder_rs.core.lang.underived_grads import executes
from thunder_rs.errors import ThunderNotImplementedError

_version_of = operator.attrgetter("_version")
_set_autocast_enabled = torch.set_autocast_enabled
_is_autocast_enabled = torch.is_autocast_enabled
#: The devices whose autocast a recomputation turns off: the trace holds the casts it made.
_AUTOCAST_DEVICES = ("cpu", "cuda")


def version_counters(tensors) -> list:
    """The version counters of ``tensors``; -1 for what has none: a value that is no tensor, and
    an inference tensor (made under ``inference_mode``: a cached one a later call reads), which
    nothing can write in place outside that mode."""
    try:
        return list(map(_version_of, tensors))  # the common case: tensors made outside inference_mode
    except (AttributeError, RuntimeError):
        return [t._version if isinstance(t, torch.Tensor) and not t.is_inference() else -1 for t in tensors]


def transforms_active() -> bool:
    """Whether a torch.func transform (``grad``, ``vmap``, ...) is running."""
    return torch._C._functorch.peek_interpreter_stack() is not None


def _picker(positions: tuple):
    """``inputs -> [inputs[i] for i in positions]``, at C speed."""
    if not positions:
        return lambda inputs: []
    if len(positions) == 1:
        get = operator.itemgetter(positions[0])
        return lambda inputs: [get(inputs)]
    many = operator.itemgetter(*positions)
    return lambda inputs: list(many(inputs))


class DifferentiableProgram:
    """One entry's program as torch calls under autograd, compiled on its first use.

    ``compile_program()`` returns the generated source and function, which takes the entry's
    inputs and returns the program's outputs (one value when ``single``, else a sequence). ``outputs`` are
    the positions of the flat outputs that carry gradients; ``reads`` the positions of the inputs
    their computation reads, ``saved`` those the forward keeps among its residuals (their
    versions are checked with the residuals'); ``overwritten`` the inputs the call writes after
    it runs; ``generators`` the generators the program draws from, or None when it draws nothing.
    """

    def __init__(self, compile_program, single: bool, outputs, reads, saved, overwritten, generators):
        self._compile = compile_program
        self._fn = None
        #: The generated source, once compiled.
        self.source: str | None = None
        self._lock = threading.Lock()
        self._single = single
        self.outputs = tuple(outputs)
        reads = frozenset(reads)
        self._unsaved_at = tuple(sorted(reads - frozenset(saved) - frozenset(overwritten)))
        self._unsaved = _picker(self._unsaved_at)
        #: Inputs the call overwrites that the recomputation reads: kept as they were.
        self.copied = tuple(k for k in overwritten if k in reads)
        #: The others: computed again from a copy, which later calls do not write into.
        self._unread_writes = tuple(k for k in overwritten if k not in reads)
        self._generators = generators
        #: Set by the entry's first double backward: its calls then run the program under
        #: autograd, as eager runs (a gradient penalty would otherwise compute each call twice).
        #: Never for a call that writes its inputs after it runs: autograd may have saved them.
        self.recording = False
        self.may_record = not overwritten

    def _function(self):
        if self._fn is None:
            with self._lock:
                if self._fn is None:
                    self.source, self._fn = self._compile()
        return self._fn

    def flat(self, *inputs) -> tuple:
        """The program's outputs as a flat tuple (what the autograd function's ``apply`` returns),
        those that carry no gradient (values written back) detached, as the function marks them."""
        out = self._function()(*inputs)
        flat = (out,) if self._single else tuple(out)
        if any(isinstance(o, torch.Tensor) and o.requires_grad and i not in self.outputs for i, o in enumerate(flat)):
            flat = tuple(
                o.detach() if isinstance(o, torch.Tensor) and i not in self.outputs else o for i, o in enumerate(flat)
            )
        return flat

    def keep(self, ctx, inputs: tuple) -> None:
        """Keeps on ``ctx``, in a training call's forward, what computing it again needs."""
        ctx.inputs = inputs
        ctx.input_versions = version_counters(self._unsaved(inputs))
        ctx.copies = {k: inputs[k].clone() for k in self.copied} if self.copied else None
        ctx.generator_states = None if self._generators is None else [g.get_state() for g in self._generators]

    def gradients(self, ctx, cotangents: tuple, unread: tuple = ()) -> tuple:
        """The gradients of the call's inputs for ``cotangents`` (one per flat output), computed
        by autograd from the forward computed again, recorded so that they can be differentiated.
        ``unread``: the inputs no output with a cotangent reads, which the caller may have written
        since (eager's backward runs no node that saved them)."""
        inputs = list(ctx.inputs)
        if self._written_since(ctx, inputs, unread):
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace operation: an "
                "input of a thunder_rs-compiled call, which a double backward (create_graph=True) computes the call "
                "again from, was written in place after the call. Hint: run the in-place operation after the backward"
            )
        # (only those the engine takes: an input whose derivative eager lacks, ``zeta(x * 2, q)``'s
        # ``x``, raises only where its gradient is asked for, as eager's engine runs no node towards it)
        node = torch._C._current_autograd_node()
        wanted = [i for i, needed in enumerate(ctx.needs_input_grad) if needed and executes(node, i)]
        for k, copy in (ctx.copies or {}).items():
            if k in wanted:
                raise ThunderNotImplementedError(
                    "backward: create_graph=True through a thunder_rs-compiled call that writes in place into an input "
                    "that requires grad and reads it is not supported (its value before the call is not kept with its "
                    "graph); write a new tensor instead"
                )
            inputs[k] = copy
        for k in self._unread_writes:
            inputs[k] = inputs[k].detach().clone()
        with _RecomputeModes(self._generators, ctx.generator_states):
            for i in _passed_twice(inputs, wanted):  # one alias per use: each gets that use's gradient
                inputs[i] = inputs[i].view_as(inputs[i])
            outs = self.flat(*inputs)
        pairs = [
            (outs[i], cotangents[i])
            for i in self.outputs
            if cotangents[i] is not None and isinstance(outs[i], torch.Tensor) and outs[i].requires_grad
        ]
        grads: list = [None] * len(inputs)
        if pairs and wanted:
            found = torch.autograd.grad(
                [o for o, _ in pairs],
                [inputs[i] for i in wanted],
                [c for _, c in pairs],
                create_graph=True,
                allow_unused=True,
            )
            for i, g in zip(wanted, found):
                grads[i] = g
        return tuple(grads)

    def _written_since(self, ctx, inputs: list, unread: tuple) -> bool:
        """Whether an input the recomputation reads, not kept, was written since the call, other
        than those at ``unread``."""
        now = version_counters(self._unsaved(inputs))
        if now == ctx.input_versions:
            return False
        return any(a != b and k not in unread for k, a, b in zip(self._unsaved_at, now, ctx.input_versions))


def _passed_twice(inputs: list, wanted: list) -> list:
    """The positions in ``wanted`` of tensors passed at more than one of them. Only those get an
    alias: through one, all the gradients the recomputation sends a tensor would reach it summed
    as one, where eager's graph sends each use's on its own, so that a parameter also used outside
    the call (a critic's loss next to its gradient penalty) summed its parts in another order."""
    seen: dict[int, int] = {}
    for i in wanted:
        seen[id(inputs[i])] = seen.get(id(inputs[i]), 0) + 1
    return [i for i in wanted if seen[id(inputs[i])] > 1]


class _RecomputeModes:
    """The modes a recomputation runs under: grad mode on, autocast off (the trace holds the
    casts autocast made), and the generators at the states the forward's draws started from, so
    that it draws what the forward drew; the caller's generator states and modes are restored."""

    __slots__ = ("_generators", "_states", "_now", "_grad", "_autocast")

    def __init__(self, generators, states):
        self._generators, self._states = generators, states

    def __enter__(self):
        self._grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(True)
        self._autocast = [_is_autocast_enabled(d) for d in _AUTOCAST_DEVICES]
        for d in _AUTOCAST_DEVICES:
            _set_autocast_enabled(d, False)
        if self._generators is not None:
            self._now = [g.get_state() for g in self._generators]
            for g, state in zip(self._generators, self._states):
                g.set_state(state)
        return self

    def __exit__(self, *exc):
        if self._generators is not None:
            for g, state in zip(self._generators, self._now):
                g.set_state(state)
        for d, enabled in zip(_AUTOCAST_DEVICES, self._autocast):
            _set_autocast_enabled(d, enabled)
        torch._C._set_grad_enabled(self._grad)
        return False


def program_generators(consts) -> list:
    """The generators a program that draws random numbers may draw from: the CPU's default one,
    the CUDA devices' once CUDA is initialised, and those among its constants."""
    generators = [torch.default_generator]
    if torch.cuda.is_initialized():
        generators.extend(torch.cuda.default_generators)
    generators.extend(c for c in consts if isinstance(c, torch.Generator) and all(c is not g for g in generators))
    return generators
