"""The package's layers point one way (DESIGN.md, "Layers and who owns what"), read from the source
with ``ast``: no layer imports one above it, core imports nothing inside its functions, no
thunder_rs module is imported inside a function to dodge a cycle, and no import cycle exists
between thunder_rs modules. A lower layer owns a protocol and its registry (``core.langctx``'s
symbols, ``core.executor_api``'s executors); the layers above register into it at import.
"""

import ast
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "thunder_rs"

#: The layers, lowest first, each as the module prefixes it holds: a module may import its own
#: layer and those below. Core's sub-packages are layers of their own, in the order they stand on
#: each other. The prim entry points record through core's recorder and core's language records
#: prims, so they are that layer; ``plugins`` and ``dynamo`` are front doors like the package.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("thunder_rs._core", "thunder_rs.errors")),
    ("core.base", ("thunder_rs.core", "thunder_rs.core.base")),
    ("core.state", ("thunder_rs.core.state",)),
    ("core.lang", ("thunder_rs.core.lang", "thunder_rs.prims")),
    ("core.acquisition", ("thunder_rs.core.acquisition",)),
    ("core.run", ("thunder_rs.core.run",)),
    ("clang", ("thunder_rs.clang",)),
    ("torch", ("thunder_rs.torch",)),
    ("executors", ("thunder_rs.executors",)),
    ("front", ("thunder_rs", "thunder_rs.dynamo", "thunder_rs.plugins")),
)

#: Imports core may make inside a function, as ``(module, import statement)`` with the reason.
#: None: optional subsystems are read from ``sys.modules`` once the program imported them
#: (FSDP and DTensor in ``core.fsdp``, Dynamo in ``core.acquire``, NumPy's generator in
#: ``core.pydraws``), which costs nothing and needs no import.
CORE_LAZY_IMPORTS: dict[tuple[str, str], str] = {}


class Import(NamedTuple):
    module: str
    target: str
    line: int
    in_function: bool


def module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name, the Rust extension (``_core``) included."""
    found = {module_name(path, package): path for path in package.rglob("*.py")}
    found[f"{package.name}._core"] = package / "_core.pyi"
    return found


def _targets(module: str, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> list[str]:
    """The modules ``node`` imports: ``from a import b`` is module ``a.b`` when there is one, else
    ``a``; third-party modules are left out."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module if known[module].name == "__init__.py" else module.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = f"{package}.{base}" if base else package
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    out = []
    for name in names:
        while name not in known and "." in name:
            name = name.rpartition(".")[0]
        if name in known:
            out.append(name)
    return out


def _imports_in(node: ast.AST, in_function: bool):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, in_function
        else:
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from _imports_in(child, inside)


@functools.cache  # parsed once for the three checks
def imports(package: Path = PACKAGE) -> tuple[tuple[Import, ...], tuple[tuple[str, int, str], ...]]:
    """Every import of a thunder_rs module (``if TYPE_CHECKING:`` blocks included: a cycle hidden
    from the interpreter is still one), and every import inside a function as ``(module, line,
    source)``, of any module."""
    known = modules(package)
    found, in_functions = [], []
    for module, path in known.items():
        if path.suffix != ".py":
            continue
        for node, in_function in _imports_in(ast.parse(path.read_text()), False):
            if in_function:
                in_functions.append((module, node.lineno, ast.unparse(node)))
            found += [Import(module, target, node.lineno, in_function) for target in _targets(module, node, known)]
    return tuple(found), tuple(in_functions)


def layer_of(module: str) -> int:
    """The index in ``LAYERS`` of the longest prefix holding ``module``."""
    best = (-1, -1)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best[0]:
                best = (len(prefix), index)
    assert best[1] >= 0, f"{module} is in no layer of LAYERS"
    return best[1]


def upward_imports(found: Sequence[Import]) -> list[str]:
    return [
        f"{i.module}:{i.line} imports {i.target} ({LAYERS[layer_of(i.module)][0]} -> {LAYERS[layer_of(i.target)][0]})"
        for i in found
        if layer_of(i.target) > layer_of(i.module)
    ]


def function_level_imports(found: Sequence[Import], in_functions: Sequence[tuple[str, int, str]]) -> list[str]:
    """Any import inside a core function not in ``CORE_LAZY_IMPORTS``, and imports of thunder_rs
    modules inside functions of the other layers (a cycle dodged)."""
    core = [
        f"{module}:{line}: {source}"
        for module, line, source in in_functions
        if LAYERS[layer_of(module)][0].startswith("core") and (module, source) not in CORE_LAZY_IMPORTS
    ]
    others = [
        f"{i.module}:{i.line} imports {i.target} inside a function"
        for i in found
        if i.in_function and not LAYERS[layer_of(i.module)][0].startswith("core")
    ]
    return core + others


def cycles(found: Sequence[Import]) -> list[list[str]]:
    """The import cycles between modules at module level: strongly connected components of more
    than one module, or a module importing itself (Tarjan's algorithm, iterative). Importing
    ``a.b`` is an edge to ``a.b`` alone, not to the package ``a`` Python initialises first: a
    package importing its families is how it is built (the families import ``torch.symbols``,
    not the package)."""
    graph: dict[str, set[str]] = {}
    for i in found:
        if not i.in_function:
            graph.setdefault(i.module, set()).add(i.target)
            graph.setdefault(i.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph[node]:
                        components.append(sorted(component))
    return components


def test_no_layer_imports_one_above_it():
    found, _ = imports()
    assert upward_imports(found) == []


def test_no_import_inside_a_core_function_and_no_cycle_dodged_inside_one():
    found, in_functions = imports()
    assert function_level_imports(found, in_functions) == []


def test_no_import_cycle_between_modules():
    found, _ = imports()
    assert cycles(found) == []


def lazy_modules(package: Path = PACKAGE) -> list[tuple[str, int, str, bool]]:
    """Every ``LazyModule("name")`` declaration (``core.base.lazy``) as ``(module, line, name,
    at module level)``."""
    found = []
    for module, path in modules(package).items():
        if path.suffix != ".py":
            continue
        tree = ast.parse(path.read_text())
        in_functions = {
            id(node)
            for function in ast.walk(tree)
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for node in ast.walk(function)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "LazyModule":
                name = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else "?"
                found.append((module, node.lineno, name, id(node) not in in_functions))
    return found


def test_lazy_modules_are_third_party_and_declared_at_module_level():
    """A module loaded when first needed (``LazyModule``) is declared where imports stand and is
    never a thunder_rs module, so no dependency between the package's modules is hidden from the
    checks above."""
    found = lazy_modules()
    assert found, "core.run.callflat declares optree lazily"
    assert [f for f in found if f[2] == "?" or f[2].split(".")[0] == "thunder_rs" or not f[3]] == []


def test_the_checks_see_what_they_forbid(tmp_path):
    """Each check finds a planted violation: an upward import, imports inside functions, a cycle."""
    package = tmp_path / "thunder_rs"
    sources = {
        "__init__.py": "",
        "_core.pyi": "",
        "core/__init__.py": "",
        "core/a.py": "from thunder_rs.core import b\nfrom thunder_rs import torch as ltorch\n",
        "core/b.py": "import json\n\n\ndef f():\n    import numpy\n",
        "torch/__init__.py": "from thunder_rs.core.a import ltorch\n\n\ndef g():\n    from . import shape\n",
        "torch/shape.py": "",
        "core/state/__init__.py": "",
        "core/state/c.py": "from thunder_rs.core.run import d\n",
        "core/run/__init__.py": "",
        "core/run/d.py": "",
    }
    for name, source in sources.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(source)
    found, in_functions = imports(package)
    assert upward_imports(found) == [
        "thunder_rs.core.a:2 imports thunder_rs.torch (core.base -> torch)",
        "thunder_rs.core.state.c:1 imports thunder_rs.core.run.d (core.state -> core.run)",
    ]
    assert function_level_imports(found, in_functions) == [
        "thunder_rs.core.b:5: import numpy",
        "thunder_rs.torch:5 imports thunder_rs.torch.shape inside a function",
    ]
    assert cycles(found) == [["thunder_rs.core.a", "thunder_rs.torch"]]
