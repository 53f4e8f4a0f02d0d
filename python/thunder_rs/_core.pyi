"""Type stubs of the Rust extension ``thunder_rs._core`` (hand-written; keep in sync)."""

from typing import Any, Callable, ClassVar, Sequence, final

import torch

# The extension's own __all__ (PyO3 lists what the module adds).
__all__ = [
    "Recorder",
    "Trace",
    "ExecutorTable",
    "ExecutorRow",
    "ImplEntry",
    "CallObserver",
    "GcCallback",
    "RecordedTensor",
    "TensorMeta",
    "Compiled",
    "PrimInfo",
    "LoadedPass",
    "RegionCode",
    "LeafCall",
    "SymExpr",
    "SlotIdentity",
    "DictStamps",
    "configure",
    "compile",
    "compile_backward",
    "prim_table",
    "registered_passes",
    "register_symbol",
    "dtype_names",
    "load_plugin_capsule",
    "register_rule_set",
    "same_objects",
    "dict_versions_stamped",
]

def configure(
    proxy: type,
    dtype: type,
    device: type,
    dtype_codes: dict[torch.dtype, int],
    symint: type | None = None,
    symfloat: type | None = None,
) -> None: ...
def compile(
    acquired: Trace,
    table: ExecutorTable,
    checker: Callable[[int, int | str, tuple, dict], bool],
    make_proxy: Callable[..., Any],
    consts: list,
    passes: list[str] = ...,
    differentiable: bool = ...,
    checkpoints: list[tuple[int, int, list[int], str]] = ...,
    recomputed: list[tuple[int, int]] = ...,
) -> Compiled: ...
def compile_backward(
    acquired: Trace,
    table: ExecutorTable,
    checker: Callable[[int, int | str, tuple, dict], bool],
    make_proxy: Callable[..., Any],
    consts: list,
    passes: list[str],
    absent_cotangents: list[int],
    checkpoints: list[tuple[int, int, list[int], str]] = ...,
    recomputed: list[tuple[int, int]] = ...,
) -> Compiled: ...
def prim_table() -> list[PrimInfo]: ...
def registered_passes() -> list[str]: ...
def load_plugin_capsule(capsule: Any, on_error: str = "raise") -> list[LoadedPass]: ...
def register_rule_set(name: str, stage: str, rules: list[tuple[str, tuple, tuple]]) -> None: ...
def register_symbol(name: str, fallback: bool = False, effect: bool = False) -> int: ...
def dtype_names() -> list[str]: ...

@final
class Trace:
    """An immutable trace; ``str()`` prints it (execution traces print their Python source)."""

    @property
    def label(self) -> str: ...
    @property
    def seconds(self) -> float: ...
    @property
    def dump(self) -> bool: ...
    @property
    def note(self) -> str: ...
    @property
    def num_bsyms(self) -> int: ...
    @property
    def num_inputs(self) -> int: ...
    def with_input_names(self, names: list[str]) -> Trace: ...
    def symbol_names(self) -> list[str]: ...
    def all_symbol_names(self) -> list[str]: ...
    def producer(self, vid: int) -> str | None: ...
    def has_effects(self) -> bool: ...
    def inputs_needed(self) -> list[int]: ...
    def inputs_read(self, outputs: list[int]) -> list[int]: ...
    def outputs_reaching(self, values: list[int], outputs: list[int]) -> list[int]: ...
    def values_read_along_gradients(self, values: list[int]) -> list[bool]: ...
    def inputs_returned(self, outputs: list[int]) -> list[int]: ...
    def absent_outputs(self, absent: list[int], num_cotangents: int, materialized: list[int]) -> list[int]:
        """The positions among a backward's outputs of the gradients only the values ``absent``
        (eager's None) reach, not through the values ``materialized``, the last ``num_cotangents``
        inputs being its cotangents."""
    def call_outputs(self, names: set[str]) -> list[list[int]]:
        """The value ids of the outputs of each top-level call of the symbols ``names``, in order."""
    def call_args_requiring_grad(self, names: set[str]) -> list[list[bool]]:
        """Per top-level call of the symbols ``names``, in order: per positional argument, whether it
        is a tensor that requires grad."""
    def output_callees(self) -> list[str | None] | None:
        """Per flat output of a differentiated forward, the global name of the callable computing it
        (None: no call computes it); None for a trace without an execution plan."""
    def input_requires_grad(self) -> list[bool]: ...
    def guards(self) -> list[str]:
        """The relations between sizes the trace relies on, as Python conditions (``t0 - 1 >= 0``)."""
    def size_inputs(self) -> list[int]:
        """The value ids of the size inputs, in input order."""
    def float_inputs(self) -> list[int]:
        """The value ids of the float inputs, in input order (the last)."""
    def regions(self) -> list[RegionCode]:
        """The fusion regions of an execution trace, in order (none for other traces)."""

@final
class RegionCode:
    """One fusion region of an execution trace. ``inputs``, ``calls``, ``outputs`` and ``dtypes``
    describe it with composites decomposed to prims, values named as strings (``t12``);
    ``dtypes`` is the torch dtype of each tensor among the inputs and the calls' outputs."""

    @property
    def name(self) -> str: ...
    @property
    def executor(self) -> int: ...
    @property
    def source(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def symbol_names(self) -> list[str]: ...
    @property
    def num_inputs(self) -> int: ...
    @property
    def num_outputs(self) -> int: ...
    @property
    def inputs(self) -> list[str]: ...
    @property
    def input_shapes(self) -> tuple[tuple[int | SymExpr, ...] | SymExpr | None, ...]: ...
    @property
    def outputs(self) -> list[str]: ...
    @property
    def calls(self) -> list[LeafCall]: ...
    @property
    def dtypes(self) -> dict[str, torch.dtype]: ...
    def __eq__(self, value: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

@final
class LeafCall:
    """One call of a region's decomposition: ``name`` is ``prims.add`` (or the qualified name of a
    symbol without decomposition), ``args`` the positional arguments as printed, values named
    as strings."""

    @property
    def name(self) -> str: ...
    @property
    def args(self) -> tuple: ...
    @property
    def outputs(self) -> list[str]: ...
    def __eq__(self, value: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

@final
class Compiled:
    """What ``compile`` made: the forward's traces after each stage (the last is the execution
    trace), the backward's (empty without one), and the flat outputs that receive cotangents."""

    @property
    def forward(self) -> list[Trace]: ...
    @property
    def backward(self) -> list[Trace]: ...
    @property
    def grad_outputs(self) -> list[int]: ...

@final
class PrimInfo:
    """One prim: its name, its family, and the type promotion code of a parameterless
    elementwise prim whose ltorch symbol is derived (else None)."""

    @property
    def name(self) -> str: ...
    @property
    def family(self) -> str: ...
    @property
    def promotion(self) -> int | None: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class LoadedPass:
    """A pass a plugin registered and the stage it runs at."""

    @property
    def name(self) -> str: ...
    @property
    def stage(self) -> str: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class RecordedTensor:
    """A tensor value the recorder made: its id and metadata, as Python builds its proxy."""

    @property
    def vid(self) -> int: ...
    @property
    def shape(self) -> tuple[int | SymExpr, ...]: ...
    @property
    def dtype_code(self) -> int: ...
    @property
    def device(self) -> str: ...
    @property
    def requires_grad(self) -> bool: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class TensorMeta:
    """The metadata of an output of a call whose outputs Python computes; a bad dtype code or
    device raises when it is made."""

    def __new__(
        cls, *, dtype_code: int, device: str, shape: Sequence[int | SymExpr], requires_grad: bool
    ) -> TensorMeta: ...
    @property
    def dtype_code(self) -> int: ...
    @property
    def device(self) -> str: ...
    @property
    def shape(self) -> tuple[int | SymExpr, ...]: ...
    @property
    def requires_grad(self) -> bool: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class ImplEntry:
    """One implementation an executor offers: ``symbol`` a prim name or a registered symbol id,
    ``function`` the global generated code calls, ``method`` a tensor method with the same
    signature, ``inplace`` one computing the same values into its receiver, ``method_args`` the
    positions of the call's arguments both methods take after their receiver (None: those after
    the first)."""

    def __new__(
        cls,
        *,
        symbol: int | str,
        function: str,
        has_checker: bool,
        method: str | None = None,
        inplace: str | None = None,
        method_args: list[int] | None = None,
    ) -> ImplEntry: ...
    @property
    def symbol(self) -> int | str: ...
    @property
    def function(self) -> str: ...
    @property
    def has_checker(self) -> bool: ...
    @property
    def method(self) -> str | None: ...
    @property
    def inplace(self) -> str | None: ...
    @property
    def method_args(self) -> list[int] | None: ...

@final
class ExecutorRow:
    """One executor's table: ``fusion`` whether it runs regions, ``fuses_decompositions`` whether it
    claims composites whose whole decomposition it claims."""

    def __new__(
        cls, *, name: str, fusion: bool, impls: Sequence[ImplEntry], fuses_decompositions: bool = False
    ) -> ExecutorRow: ...
    @property
    def name(self) -> str: ...
    @property
    def fusion(self) -> bool: ...
    @property
    def impls(self) -> tuple[ImplEntry, ...]: ...
    @property
    def fuses_decompositions(self) -> bool: ...

@final
class ExecutorTable:
    """The executors' tables in priority order; a prim name that names no prim raises
    ``ThunderValueError`` naming the executor and the name."""

    def __new__(cls, executors: Sequence[ExecutorRow]) -> ExecutorTable: ...

@final
class Recorder:
    """Records one trace during acquisition."""

    def __new__(cls) -> Recorder: ...
    def tensor_input(self, dtype: int, device: str, shape: Sequence[int | SymExpr], requires_grad: bool) -> int: ...
    def size_input(self, hint: int) -> SymExpr:
        """A size read from the inputs on each call, ``hint`` now."""
    def unbacked_size(self, hint: int) -> SymExpr:
        """A size that the next ``call_sized`` given it computes from values, ``hint`` now: a count,
        which may be 0 or 1 (decisions that those would change are guards)."""
    def size_inputs(self) -> list[SymExpr]:
        """The size inputs made so far, in order."""
    def size_value(self, value: int) -> SymExpr | float:
        """The size value ``t{value}`` alone, with its hint (``SymExpr.values()`` names them)."""
    def decide(self, op: str, a: int | SymExpr, b: int | SymExpr) -> bool:
        """``a <op> b`` on the hints, the relation it relies on recorded as a guard."""
    def specialise(self, a: int | SymExpr) -> int:
        """The hint of ``a``, assumed from now on (a guard)."""
    def guard_sites(self) -> list[tuple[str, tuple[str, int, str, str | None] | None]]:
        """Each guard recorded and where the program took its decision (``langctx.decision_site``)."""
    def float_input(self, hint: float) -> int: ...
    def number_input(self, value: Any) -> int: ...
    def prim(self, name: str, args: tuple, grad_enabled: bool) -> list[RecordedTensor]: ...
    def set_requires_grad(self, value: int, flag: bool) -> None: ...
    @property
    def depth(self) -> int: ...
    def begin(self, symbol: int, args: tuple, kwargs: dict | None = None) -> None: ...
    def end(self, outputs: Sequence[int]) -> None: ...
    def abort(self) -> None: ...
    def is_read(self, value: int) -> bool:
        """Whether a call recorded so far reads the value ``t{value}``."""
    def mark(self) -> int:
        """A mark of what the current level has recorded, for ``differentiate`` and ``rewind``."""
    def rewind(self, mark: int) -> None:
        """Drops the calls recorded at the current level since ``mark``."""
    def differentiate(
        self, mark: int, seeds: Sequence[tuple[int, int]], wrt: Sequence[int], enabled: bool
    ) -> list[RecordedTensor | None]:
        """The backward of the calls since ``mark``, from ``(value, cotangent)`` ``seeds``, recorded
        after them: the gradient of each of ``wrt``; then the values since ``mark`` require grad as
        the level outside sees them, under its grad mode ``enabled``."""
    def grad_labels(self, first: int, end: int) -> list[tuple[int, bool]]:
        """Whether each tensor value made from ``first`` to before ``end`` requires grad now."""
    def differentiate_values(
        self,
        first: int,
        end: int,
        inner: Sequence[tuple[int, bool]],
        seeds: Sequence[tuple[int, int]],
        wrt: Sequence[int],
        enabled: bool,
    ) -> list[RecordedTensor | None]:
        """``differentiate`` of the calls defining the values made from ``first`` to before ``end``
        (a vjp's forward), labelled ``inner`` meanwhile, its backward after all recorded so far."""
    def batch_since(
        self,
        first: int,
        batched: Sequence[tuple[int, int]],
        lead: Sequence[int | SymExpr],
        enabled: bool,
        elementwise: Sequence[int],
    ) -> list[tuple[int, RecordedTensor]]:
        """The last calls, those defining only values from ``first`` on (a backward just emitted),
        recorded again with the values of ``batched``'s ``(value, batched value)`` pairs batched
        over the leading sizes ``lead``: ``(value, batched value)`` for each value they define
        that reads a batched one, requiring grad under ``enabled``; the kernels of the symbols
        ``elementwise`` batched as elementwise."""
    def dual_labels(self, mark: int, first: int, sources: Sequence[int], cuts: Sequence[int]) -> list[tuple[int, bool]]:
        """Whether each tensor value made from ``first`` on carries a tangent of the dual tensors
        ``sources``: computed from one by a call since ``mark``, but for ``cuts``."""
    @property
    def num_values(self) -> int:
        """How many values the recording has made: the next value's id."""
    def effects_since(self, mark: int) -> bool:
        """Whether a call recorded at the current level since ``mark`` acts on outside state."""
    def tensors(self, values: Sequence[int]) -> list[RecordedTensor]:
        """The metadata of the values ``values`` now."""
    def get_grad(self, value: int) -> list[RecordedTensor]: ...
    def put_grad(self, value: int, grad: Any) -> None: ...
    def call(
        self,
        symbol: int,
        args: tuple,
        kwargs: dict | None,
        outputs: Sequence[TensorMeta],
        whole: bool = False,
    ) -> list[RecordedTensor]: ...
    def call_sized(
        self,
        symbol: int,
        args: tuple,
        kwargs: dict | None,
        outputs: Sequence[TensorMeta],
        sizes: Sequence[int],
    ) -> list[RecordedTensor]:
        """``call`` of a fallback that also defines ``sizes`` (from ``unbacked_size``) after its tensors."""
    def consts(self) -> list[Any]: ...
    def snapshot(self, outputs: Sequence[int]) -> Trace:
        """What is recorded so far, returning the values ``outputs`` (a tuple) without gradient;
        the recording goes on."""
    def segment(
        self, wanted: Sequence[int], known: Sequence[int], checks: Sequence[int]
    ) -> tuple[Trace, list[int], list[int], list[int], list[int]] | None:
        """The calls no earlier segment ran (those whose tensors are all in ``known`` left out):
        ``(trace, taken, known_inputs, sizes, returned)``, the trace taking the recording's tensor
        inputs at the positions ``taken`` (those it reads or returns), the ``known_inputs``, then
        the size values ``sizes``, and returning the tensors ``returned`` (ids of the recording;
        the trace numbers its own values apart) (every one
        its calls compute, and the ``wanted`` inputs); None when a call with an effect on state
        (a random draw) would run again: run the recording from its start then."""
    def last_segment(
        self, wanted: Sequence[int], known: Sequence[int], checks: Sequence[int]
    ) -> tuple[Trace, list[int], list[int], list[int], list[int]] | None:
        """``segment``, returning only the tensors of ``wanted`` not in ``known``: the last one of
        a recording (its other tensors freed once last used, not kept)."""
    def finish(self, outputs: Any) -> Trace: ...

@final
class SymExpr:
    """A symbolic int: an expression over a recording's size values, with its hint."""

    @property
    def hint(self) -> int: ...
    def values(self) -> list[int]: ...
    def lower_bound(self, least: int = 2) -> int | None: ...
    def same(self, other: int | SymExpr) -> bool: ...
    def exact_div(self, other: int | SymExpr) -> int | SymExpr | None: ...
    def __add__(self, other: int | SymExpr, /) -> int | SymExpr: ...
    def __radd__(self, other: int | SymExpr, /) -> int | SymExpr: ...
    def __sub__(self, other: int | SymExpr, /) -> int | SymExpr: ...
    def __rsub__(self, other: int | SymExpr, /) -> int | SymExpr: ...
    def __mul__(self, other: int | SymExpr, /) -> int | SymExpr: ...
    def __rmul__(self, other: int | SymExpr, /) -> int | SymExpr: ...
    def __neg__(self) -> int | SymExpr: ...
    def __floordiv__(self, other: int, /) -> int | SymExpr: ...
    def __rfloordiv__(self, other: int, /) -> int | SymExpr: ...
    def __mod__(self, other: int, /) -> int | SymExpr: ...
    def __rmod__(self, other: int, /) -> int | SymExpr: ...

@final
class CallObserver:
    """A C-level profile hook: ``classify(code)`` once per code object (flags: 1 calls, 2 returns
    are reported, 4 a module body), then ``on_call(frame, importing)`` and ``on_return(frame,
    importing, value)`` (``value``: what the frame returns, None when it raises) for frames of code
    objects it marked (returns too where ``on_call`` returned true); ``importing``: a module body
    started since the hook did runs."""

    def __new__(
        cls,
        classify: Callable[[Any], int],
        on_call: Callable[[Any, bool], bool],
        on_return: Callable[[Any, bool, Any], None],
    ) -> CallObserver: ...
    def watch_c_calls(self, owners: list[Any], on_c_call: Callable[[Any, Any, bool, bool], None]) -> None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...

@final
class GcCallback:
    """A ``gc.callbacks`` entry calling ``func(phase, info)`` again until no ``KeyboardInterrupt``
    stops it; the one made with ``rearm`` makes a caught interrupt pending again when it returns."""

    def __new__(cls, func: Callable[[str, dict], None], rearm: bool) -> GcCallback: ...
    @property
    def func(self) -> Callable[[str, dict], None]: ...
    def __call__(self, phase: str, info: dict) -> None: ...

@final
class SlotIdentity:
    """``(store, name, tensor)`` slots of a module binding: ``holds()`` tells whether each store
    (a dict) still holds its tensor under its name (the name a string)."""

    def __new__(cls, slots: list[tuple[dict, str, Any]]) -> SlotIdentity: ...
    def holds(self) -> bool: ...
    def __len__(self) -> int: ...

@final
class DictStamps:
    """Dicts whose changes an entry watches: ``newest()`` is the newest change stamp among them
    (CPython's ``ma_version_tag``), which grows when any of them changes, however written."""

    def __new__(cls, dicts: Sequence[dict]) -> DictStamps: ...
    def newest(self) -> int: ...
    def __len__(self) -> int: ...

def dict_versions_stamped() -> bool:
    """Whether this interpreter stamps each change of a dict into it (CPython 3.10 to 3.12)."""

def same_objects(items: tuple, start: int, objects: list) -> bool:
    """Whether ``items[start:start + len(objects)]`` are the objects of ``objects``, each the same one."""
