"""The executor API, as in Thunder's ``extend``: operator executors map symbols to
implementations (optionally guarded by checkers), and ``add_operator_executor`` registers one
from a ``{torch_op_name: (impl_name, checker, impl)}`` table.

The tables go to Rust once per change (``executor_table``); the Rust claim pass calls back into
Python only for entries with a checker.
"""

from thunder_rs import _core
from thunder_rs.core.fallback import qualified_name
from thunder_rs.errors import ThunderValueError


class Executor:
    """Maps symbols (prim names or ltorch symbol ids) to implementations."""

    def __init__(self, name: str):
        self.name = name
        #: key (prim name or symbol id) -> (impl_name, checker or None, callable)
        self.implmap: dict = {}
        #: key -> name of a tensor method with the implementation's signature, called as
        #: ``t0.sin()`` when the first argument is a tensor (cheaper than ``torch.sin(t0)``)
        self.methods: dict = {}

    def register_implementation(self, symbol, impl, *, impl_name: str | None = None, checker=None):
        """Runs ``symbol`` (an ltorch symbol, a prim entry point or a prim name) with ``impl``."""
        key = symbol_key(symbol)
        name = impl_name or f"{self.name}_{getattr(impl, '__name__', 'impl')}"
        self.implmap[key] = (name.replace(".", "_"), checker, impl)
        _bump()

    def implements(self, key) -> bool:
        return key in self.implmap


OperatorExecutor = Executor


def symbol_key(symbol):
    """The key a symbol has in executor tables: a prim's name or a composite's id."""
    if isinstance(symbol, str):
        return symbol
    sid = getattr(symbol, "symbol_id", None)
    if sid is not None:
        return sid
    return symbol.__name__


_executors: list[Executor] = []
_version = [0]
_table_cache: dict = {}


def _bump():
    _version[0] += 1


def register_executor(executor: Executor, *, priority: int | None = None) -> Executor:
    """Adds ``executor`` before the torch executor (or at ``priority``)."""
    if executor in _executors:
        return executor
    _executors.insert(len(_executors) - 1 if priority is None and _executors else (priority or 0), executor)
    _bump()
    return executor


def deregister_executor(executor: Executor) -> None:
    if executor in _executors:
        _executors.remove(executor)
        _bump()


def default_executors() -> list[Executor]:
    return list(_executors)


def add_operator_executor(name: str, op_map: dict, *, add_to_default_executors: bool = True) -> Executor:
    """Registers an executor for torch ops by name: ``{"torch.nn.functional.gelu": (impl_name, checker, impl)}``."""
    from thunder_rs.torch import SYMBOLS

    by_name = {}
    for sym in SYMBOLS:
        for fn in sym.torch_fns:
            by_name.setdefault(qualified_name(fn), sym)
    executor = Executor(name)
    for torch_name, (impl_name, checker, impl) in op_map.items():
        sym = by_name.get(torch_name)
        if sym is None:
            raise ThunderValueError(f"add_operator_executor: thunder_rs has no symbol for {torch_name!r} (argument op_map)")
        executor.register_implementation(sym, impl, impl_name=impl_name, checker=checker)
    if add_to_default_executors:
        register_executor(executor)
    return executor


def executor_table(executors: list[Executor]):
    """The Rust table of ``executors`` and the implementations by generated-code name."""
    key = (tuple(id(e) for e in executors), _version[0])
    cached = _table_cache.get("table")
    if cached is not None and cached[0] == key:
        return cached[1], cached[2]
    rows, impls = [], {}
    for executor in executors:
        entries = []
        for sym_key, (impl_name, checker, impl) in executor.implmap.items():
            entries.append((sym_key, impl_name, checker is not None, executor.methods.get(sym_key)))
            impls[impl_name] = impl
        rows.append((executor.name, entries))
    table = _core.ExecutorTable(rows)
    _table_cache["table"] = (key, table, impls)
    return table, impls
