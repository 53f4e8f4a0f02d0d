"""The executor protocol, as in Thunder's ``extend``: operator executors map symbols to
implementations (optionally guarded by checkers), and ``add_operator_executor`` registers one
from a ``{torch_op_name: (impl_name, checker, impl)}`` table. Fusion executors take regions of
symbols: the Rust partitioner groups what they claim, and ``fuse(region)`` returns the callable
that runs each region.

It lives in core so that core (the jit, writeback, custom functions) depends on the protocol, not
on the executors: ``thunder_rs.executors`` registers into it. Each executor's implementations are
``Implementation`` records in its ``Registry``, whose ``version`` changes on every registration:
the tables go to Rust once per change of a version (``executor_table``, as ``_core.ExecutorRow``
records, where a prim name that names no prim is an error), and the Rust claim pass calls back
into Python only for entries with a checker.
"""

import builtins
import dataclasses
import functools
import importlib
import itertools
import keyword
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

from thunder_rs import _core
from thunder_rs.core.lang.fallback import qualified_name
from thunder_rs.core.lang.langctx import SYMBOLS
from thunder_rs.core.lang.recorder import KERNEL_IDS
from thunder_rs.errors import ThunderNotImplementedError, ThunderValueError

#: A symbol's key in executor registries: a prim's name or a composite's symbol id.
SymbolKey = str | int


@dataclass(frozen=True)
class Implementation:
    """How one executor runs one symbol."""

    #: The symbol: a prim's name (``"add"``) or an ltorch symbol's id.
    key: SymbolKey
    #: The global generated code calls it by (made unique per table: ``torch_softmax``).
    name: str
    #: The callable, with the symbol's positional and keyword arguments.
    fn: Callable
    #: Called with the call's arguments at claim time; the executor takes the call only where
    #: it returns true. None: it takes every call.
    checker: Callable | None = None
    #: A tensor method with ``fn``'s signature, called as ``t0.sin()`` when the first argument is
    #: a tensor (cheaper than ``torch.sin(t0)``).
    method: str | None = None
    #: A tensor method computing the same values into its receiver (``mul_`` for ``mul``):
    #: generated code calls it where the receiver is a fresh intermediate dying at the call (the
    #: Rust ``reuse`` step decides where that is safe).
    inplace_method: str | None = None
    #: Which of the call's arguments (a prim's operands, then its parameters) both methods take
    #: after their receiver, by position and in their order; None: all after the first. The prim
    #: ``index_add(a, index, source, dim)`` is ``a.index_add(dim, index, source)``: ``(3, 1, 2)``.
    method_args: tuple[int, ...] | None = None


#: Versions are never reused, across registries too: a new registry may reuse a collected
#: executor's id, which keys the table cache along with the versions. A shared counter also
#: keeps two threads bumping at once from writing back a version some table was cached under.
_versions = itertools.count(1)


class Registry(Mapping):
    """One executor's implementations by symbol key. Another thread may register while a table
    is built: readers take ``snapshot()``; every change draws a new ``version``."""

    def __init__(self):
        self._impls: dict[SymbolKey, Implementation] = {}
        self._lock = threading.Lock()
        self.version = next(_versions)

    def __getitem__(self, key: SymbolKey) -> Implementation:
        return self._impls[key]

    def __contains__(self, key) -> bool:  # Mapping's goes through __getitem__ and a KeyError
        return key in self._impls

    def __iter__(self) -> Iterator[SymbolKey]:
        return iter(self._impls.copy())

    def __len__(self) -> int:
        return len(self._impls)

    def snapshot(self) -> dict[SymbolKey, Implementation]:
        return self._impls.copy()

    def register(self, *impls: Implementation) -> None:
        """Adds ``impls``, replacing those of the same keys."""
        with self._lock:
            for impl in impls:
                self._impls[impl.key] = impl
            self.version = next(_versions)

    def update(self, key: SymbolKey, **changes) -> None:
        """Replaces fields of ``key``'s implementation (``method="sin"``)."""
        with self._lock:
            self._impls[key] = dataclasses.replace(self._impls[key], **changes)
            self.version = next(_versions)

    def remove(self, keys) -> dict[SymbolKey, Implementation]:
        """Removes ``keys`` (those present), returning what they had."""
        with self._lock:
            removed = {key: self._impls.pop(key) for key in keys if key in self._impls}
            self.version = next(_versions)
        return removed


class Executor:
    """Maps symbols (prim names or ltorch symbol ids) to implementations."""

    #: Whether the executor runs regions of symbols (``FusionExecutor``).
    fusion = False
    #: Registers implementations of the symbols created since its last call (the torch
    #: executor's fallbacks, the custom Functions traced so far); ``executor_table`` calls it
    #: before reading the registry, so a compile sees every symbol its acquisition created.
    sync: Callable[[], None] | None = None

    def __init__(self, name: str, *, sync: Callable[[], None] | None = None):
        self.name = name
        self.registry = Registry()
        self.sync = sync

    def register_implementation(
        self,
        symbol,
        impl,
        *,
        impl_name: str | None = None,
        checker=None,
        method: str | None = None,
        inplace_method: str | None = None,
        method_args: tuple[int, ...] | None = None,
    ) -> Implementation:
        """Runs ``symbol`` (an ltorch symbol, a prim entry point or a prim name) with ``impl``."""
        name = impl_name or f"{self.name}_{getattr(impl, '__name__', 'impl')}"
        record = Implementation(
            symbol_key(symbol), name.replace(".", "_"), impl, checker, method, inplace_method, method_args
        )
        self.registry.register(record)
        return record

    def implements(self, key) -> bool:
        return key in self.registry


OperatorExecutor = Executor


@dataclass(frozen=True)
class Region:
    """One fusion region of an execution trace, as handed to ``FusionExecutor.fuse``."""

    #: Unique within its execution trace: the global its call site reads (``inductor_fusion0``).
    name: str
    #: Equal for regions that compute the same thing on inputs of the same metadata (the source
    #: with values renamed by first appearance, and the inputs' dtypes, devices and shapes).
    key: str
    #: The Python source of ``def <name>(t0, t1, ...)``: the region's calls with the torch
    #: implementations, returning a tuple of its outputs.
    source: str
    #: ``source`` exec'ed: an eager callable ``(*inputs) -> tuple``.
    function: Callable
    symbol_names: tuple
    num_inputs: int
    num_outputs: int
    #: For executors that translate prims (``fuses_decompositions``): the region's input and
    #: output value names (``t12``), in the function's order, and its calls with every composite
    #: replaced by its decomposition, as ``_core.LeafCall`` records: ``name`` is ``prims.add``
    #: (or the qualified name of a symbol without decomposition), ``args`` the positional
    #: arguments as printed, values named as strings (prims take no string parameters), and
    #: ``outputs`` the names of the values it computes.
    #: Empty for the other executors.
    inputs: tuple = ()
    calls: tuple = ()
    outputs: tuple = ()
    #: For the same executors: the torch dtype of each tensor among the inputs and the calls'
    #: outputs, by name (eager's: an executor whose ops compute in other dtypes casts to them).
    dtypes: Mapping[str, Any] = field(default_factory=dict)
    #: For executors that fuse symbolic sizes (``fuses_symbolic``): each input's sizes as the
    #: trace knows them, in the function's order: a tensor's shape (ints, and ``_core.SymExpr``
    #: where a dimension may change between calls: ``str`` of it is a Python expression over the
    #: size values' names, ``values()`` their numbers), a size value's own ``SymExpr`` (an int
    #: input that may change between calls), None for a number. Empty for the other executors.
    input_shapes: tuple = ()
    #: For executors that write inputs (``writes_inputs``): ``(output name, input name)`` of the
    #: outputs whose value the call writes into that input after the trace, without autograd, and
    #: which no other call reads: the region may write the input's memory itself and return it.
    writes: tuple = ()


class FusionExecutor(Executor):
    """An executor that runs regions: its registry names what it may take (each with the torch
    executor's implementation name and callable, so region code can call them), and ``fuse``
    turns a region into the callable that runs it. A symbol goes to it only where a later
    executor can run it alone too: the partitioner leaves single ops and shape-only groups out
    of regions."""

    fusion = True
    #: Whether it also claims a composite it has no entry for when it claims every prim of the
    #: composite's decomposition (an executor that translates prims); its regions then carry
    #: their decomposed ``calls``.
    fuses_decompositions = False
    #: Whether its regions may have symbolic sizes (the same region called with other extents
    #: where ``Region.input_shapes`` says they may change): a trace with symbolic sizes runs
    #: without the fusion executors that do not (they compile per shape, seconds each).
    fuses_symbolic = False
    #: Whether its regions take float inputs (``core.acquisition.float_args``) as inputs of one
    #: compile: a trace with float inputs runs without the fusion executors that compile per value.
    fuses_float_inputs = False
    #: Whether its regions may write an input's memory with an output's value (``Region.writes``).
    writes_inputs = False

    def take_from(self, executor: Executor, keys=None) -> None:
        """Takes ``executor``'s implementations of ``keys`` (all of them by default) as its own."""
        impls = executor.registry.snapshot()
        self.registry.register(*(impls[key] for key in (impls if keys is None else keys)))

    def fuse(self, region: Region) -> Callable:
        """The callable that runs ``region``: called with its inputs, it returns the same tuple
        ``region.function`` returns. Called once per region of each compiled trace."""
        raise ThunderNotImplementedError(f"{type(self).__name__}.fuse: a FusionExecutor must define fuse(region)")


def symbol_key(symbol) -> SymbolKey:
    """The key a symbol has in executor registries: a prim's name or a composite's id (a key
    is its own)."""
    if isinstance(symbol, (str, int)):
        return symbol
    sid = getattr(symbol, "symbol_id", None)
    if sid is not None:
        return sid
    return symbol.__name__


_executors: list[Executor] = []
#: Executors that run a program under torch's autograd (``core.differentiable``) before the
#: torch executor: ``register_differentiable_executor``.
_differentiable: list[Executor] = []
#: Executors ``jit(fn, executors=[...])`` can name, by name.
_named: dict[str, Executor] = {}
#: Names whose executor a module registers at import, imported on first use (importing Inductor
#: takes seconds, which jit without it must not pay): ``register_lazy_executor``.
_lazy: dict[str, str] = {}
#: The tables last built, by the executors they list (``executor_table``): a compile's snapshots
#: (executors that run symbols one by one) and its passes (all of the jit's) take two tables in
#: turn, which one slot would rebuild twice a compile (2 ms each).
_table_cache: dict = {}
_TABLES_KEPT = 8


def register_executor(executor: Executor, *, priority: int | None = None) -> Executor:
    """Adds ``executor`` before the torch executor (or at ``priority``)."""
    _named.setdefault(executor.name, executor)
    if executor in _executors:
        return executor
    _executors.insert(len(_executors) - 1 if priority is None and _executors else (priority or 0), executor)
    return executor


def deregister_executor(executor: Executor) -> None:
    if executor in _executors:
        _executors.remove(executor)


def default_executors() -> list[Executor]:
    return list(_executors)


def register_named_executor(executor: Executor) -> Executor:
    """Makes ``executor`` available by name to ``jit(fn, executors=[...])`` without adding it to
    the defaults."""
    _named[executor.name] = executor
    return executor


def register_lazy_executor(name: str, module: str) -> None:
    """Makes the executor ``module`` registers (``register_named_executor``) at import available by
    ``name``, importing ``module`` on its first use."""
    _lazy[name] = module


def register_differentiable_executor(executor: Executor) -> Executor:
    """Adds ``executor`` to those a program runs under torch's autograd with (a double backward,
    torch.func transforms), before the torch executor."""
    if executor not in _differentiable:
        _differentiable.append(executor)
    return executor


def differentiable_executors() -> list[Executor]:
    """The executors, in priority order, that run a program under torch's autograd."""
    return resolve_executors(_differentiable)


def torch_executor() -> Executor:
    """The executor that runs every symbol as torch calls, last in every list of executors
    (``thunder_rs.executors.torch_ex`` registers it)."""
    return _named_executor("torch")


def known_executor_names() -> list[str]:
    return sorted(set(_named) | set(_lazy))


def _named_executor(name: str) -> Executor:
    if name not in _named and name in _lazy:
        importlib.import_module(_lazy[name])  # registers its executor (register_named_executor)
    if name not in _named:
        raise ThunderValueError(
            f"jit: unknown executor {name!r}; known executors: {', '.join(known_executor_names())} (argument executors)"
        )
    return _named[name]


def resolve_executors(executors) -> list[Executor]:
    """``executors`` (executor objects or names, in priority order) as executors, the torch
    executor appended last when it is not among them."""
    if isinstance(executors, (str, Executor)):
        executors = [executors]
    resolved = []
    for item in executors:
        if isinstance(item, str):
            item = _named_executor(item)
        elif not isinstance(item, Executor):
            raise ThunderValueError(
                f"jit: executors must be executor objects or names, got {type(item).__name__} (argument executors)"
            )
        if item not in resolved:
            resolved.append(item)
    torch_ex = torch_executor()
    if torch_ex in resolved:
        resolved.remove(torch_ex)
    return [*resolved, torch_ex]


def add_operator_executor(name: str, op_map: dict, *, add_to_default_executors: bool = True) -> Executor:
    """Registers an executor for torch ops by name: ``{"torch.nn.functional.gelu": (impl_name, checker, impl)}``."""
    by_name: dict[str, Any] = {}
    for sym in SYMBOLS:
        for fn in sym.torch_fns:
            by_name.setdefault(qualified_name(fn), sym)
    executor = Executor(name)
    for torch_name, (impl_name, checker, impl) in op_map.items():
        sym = by_name.get(torch_name)
        if sym is None:
            raise ThunderValueError(
                f"add_operator_executor: thunder_rs has no symbol for {torch_name!r} (argument op_map)"
            )
        executor.register_implementation(sym, impl, impl_name=impl_name, checker=checker)
    if add_to_default_executors:
        register_executor(executor)
    return executor


#: Names generated code gives other meanings: its module and functions, its values (``t12``),
#: hoisted constants (``_c0``, ``_dev0``) and fusion regions (``inductor_fusion0``), and the
#: builtins and keywords of Python.
_CODE_NAMES = frozenset({"torch", "computation", "backward", "saved", *dir(builtins), *keyword.kwlist})
_CODE_NAME_FORMS = re.compile(r"[tv]\d+|_c\d+|_dev\d+|\w*_fusion\d+")


def _identifier(name: str) -> str:
    """``name`` with every character an identifier cannot hold as ``_`` (``my-ex_<lambda>`` is
    ``my_ex__lambda_``), and ``_`` before a leading digit."""
    name = re.sub(r"\W", "_", name)
    return name if name[:1].isalpha() or name[:1] == "_" else f"_{name}"


def _unique(name: str, taken: dict, owner, reserved=None) -> str:
    """``name`` as an identifier that no other owner in ``taken`` has and that ``reserved`` (a
    predicate) does not hold back: numbered ``name_2``, ``name_3``, ... where needed; then taken
    by ``owner`` (two implementations under one name would both run the last one)."""
    base = code = name if name.isidentifier() else _identifier(name)
    n = 1
    while taken.get(code, owner) is not owner or (reserved is not None and reserved(code)):
        n += 1
        code = f"{base}_{n}"
    taken[code] = owner
    return code


@functools.cache  # tables are rebuilt whenever an implementation is registered: ~700 names each time
def _reserved(code: str) -> bool:
    return code in _CODE_NAMES or _CODE_NAME_FORMS.fullmatch(code) is not None


def _entry(impl: Implementation, code: str) -> _core.ImplEntry:
    """``impl``'s row in the Rust table, called by the generated-code name ``code``."""
    return _core.ImplEntry(
        symbol=impl.key,
        function=code,
        has_checker=impl.checker is not None,
        method=impl.method,
        inplace=impl.inplace_method,
        method_args=None if impl.method_args is None else list(impl.method_args),
    )


def executor_table(executors: list[Executor]):
    """The Rust table of ``executors`` and the implementations by generated-code name. Another
    thread may register implementations meanwhile (fallbacks, lazily imported executors): the
    versions are read before the registries' snapshots, so a registration racing the build makes
    the next compile rebuild."""
    for executor in executors:
        if executor.sync is not None:
            executor.sync()
    key = tuple((id(e), e.registry.version) for e in executors)
    listed = tuple(map(id, executors))
    cached = _table_cache.get(listed)
    if cached is not None and cached[0] == key:
        return cached[1], cached[2]
    rows: list[_core.ExecutorRow] = []
    impls: dict[str, Any] = {}
    names: dict[str, Executor] = {}
    for executor in executors:
        entries = [
            _entry(impl, _unique(impl.name, impls, impl.fn, _reserved))
            for impl in executor.registry.snapshot().values()
        ]
        # Rust names the executor's regions after it: ``{name}_fusion0``.
        name = _unique(executor.name, names, executor)
        decomposes = getattr(executor, "fuses_decompositions", False)
        rows.append(
            _core.ExecutorRow(name=name, fusion=executor.fusion, impls=entries, fuses_decompositions=decomposes)
        )
    table = _core.ExecutorTable(rows)
    if listed not in _table_cache and len(_table_cache) >= _TABLES_KEPT:
        _table_cache.pop(next(iter(_table_cache), None), None)  # (another thread may have dropped it)
    _table_cache[listed] = (key, table, impls)
    return table, impls


def whole_runners(executors: list[Executor]) -> dict | None:
    """What acquisition needs to record kernels whole (``recorder.record_kernel``): kernel
    symbol id -> the checkers (None for none) of the executors other than fusion executors that
    implement it; a fusion executor that takes a symbol needs one of those as its fallback.
    None when an executor translates decompositions (``fuses_decompositions``): it needs them all."""
    if any(getattr(e, "fuses_decompositions", False) for e in executors):
        return None
    runners: dict = {}
    for sid in KERNEL_IDS.copy():  # another thread may be importing symbols
        checkers = [impl.checker for e in executors if not e.fusion and (impl := e.registry.get(sid)) is not None]
        if checkers:
            runners[sid] = checkers
    return runners
