"""The package's layers point one way (DESIGN.md, "Layers and who owns what"), read from the source
with ``ast``: no layer imports one above it, core imports nothing inside its functions, no
thunder_rs module is imported inside a function to dodge a cycle, and no import cycle exists
between thunder_rs modules. A lower layer owns a protocol and its registry (``core.langctx``'s
symbols, ``core.executor_api``'s executors); the layers above register into it at import. A
module loaded when first needed (``core.base.lazy.LazyModule``) is imported as far as these checks
go: laziness defers the cost, never a dependency.
"""

import ast
import functools
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from thunder_rs.core.lang.recorder import GRAD_RULES, KERNEL_IDS
from thunder_rs.torch import SYMBOLS

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

#: Imports of thunder_rs modules the layers above core may make inside a function, as ``(module,
#: imported module)`` with the reason (test_no_import_cycle does not see them). None: a module
#: loaded when first needed is declared at module level (``LAZY_MODULES``), where it does.
FRONT_LAZY_IMPORTS: dict[tuple[str, str], str] = {}


#: The package's modules that another loads when first needed (``LazyModule`` declarations,
#: ``core.base.lazy``), as ``(module, lazy module)`` with the reason. The checks above read each as
#: an import; this table says why the import waits. Acquisition and what only a compile uses
#: (effects, escapes, outputs, reached Python state, stdlib state, torch overrides, Python draws,
#: write-backs, returned views, the cache entry: 11 modules, about 12 ms of ``import thunder_rs``) load at a
#: program's first compile, never before.
LAZY_MODULES: dict[tuple[str, str], str] = {
    ("thunder_rs.core.run.jit", "thunder_rs.core.acquisition.acquire"): "acquisition runs at the first compile",
    ("thunder_rs.core.run.jit", "thunder_rs.core.run.entry"): "a cache entry is made by the first compile",
    ("thunder_rs.core.run.jit", "thunder_rs.core.acquisition.generator_inputs"): (
        "generator arguments are traced as stand-ins at the first compile"
    ),
    ("thunder_rs.core.run.generate", "thunder_rs.core.acquisition.writeback"): (
        "write-backs wrap an entry whose program writes its inputs, made by a compile"
    ),
    ("thunder_rs.core.run.generate", "thunder_rs.core.acquisition.output_views"): (
        "returned views are taken again only by an entry whose training call returns some, made by a compile"
    ),
    ("thunder_rs.torch.complex_views", "thunder_rs.core.acquisition.writeback"): (
        "eager's calls taking views again, for writes into complex tensors with gradients, which a compile records"
    ),
    ("thunder_rs.core.run.examine", "thunder_rs.core.acquisition.acquire"): (
        "examine acquires the program it reports on, when called"
    ),
    ("thunder_rs.core.run.autograd", "thunder_rs.core.acquisition.writeback"): (
        "residuals are unshared from inputs only by an entry with write-backs, which a compile loaded"
    ),
    ("thunder_rs.core.lang.fallback", "thunder_rs.core.lang.fallback_sizes"): (
        "symbolic output sizes of fallbacks (sympy, a ShapeEnv), for symbolic compiles only"
    ),
    ("thunder_rs.torch.factorizations", "thunder_rs.core.lang.fallback_sizes"): (
        "symbolic output sizes of the opaque factorisations and solvers, for symbolic compiles only"
    ),
    # Front-door names resolved at their first use (PEP 562 ``__getattr__``).
    ("thunder_rs", "thunder_rs.rules"): "rewrite rules as data (4 frozen dataclasses), for programs that register some",
    ("thunder_rs", "thunder_rs.core.run.examine"): "thunder_rs.examine and its report (a dataclass), when called",
}


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
    found += [Import(m, name, line, not at_top) for m, line, name, at_top in lazy_modules(package) if name in known]
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
        if i.in_function
        and not LAYERS[layer_of(i.module)][0].startswith("core")
        and (i.module, i.target) not in FRONT_LAZY_IMPORTS
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
    at module level)``; the class under any name a module imports it as (``_LazyModule`` in the
    package's ``__init__``, which keeps its namespace to the public API)."""
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
        names = {"LazyModule"} | {
            alias.asname
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
            if alias.name == "LazyModule" and alias.asname
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in names:
                name = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else "?"
                found.append((module, node.lineno, name, id(node) not in in_functions))
    return found


def test_lazy_modules_are_declared_at_module_level_and_each_of_ours_says_why():
    """A module loaded when first needed (``LazyModule``) is named by a constant where imports
    stand, so the checks above read it as an import; each of the package's is in
    ``LAZY_MODULES`` with its reason, and the table lists no declaration that is gone."""
    found = lazy_modules()
    assert ("thunder_rs.core.run.callflat", "torch.utils._cxx_pytree") in {(f[0], f[2]) for f in found}
    assert [f for f in found if f[2] == "?" or not f[3]] == []
    ours = {(f[0], f[2]) for f in found if f[2].split(".")[0] == "thunder_rs"}
    assert ours == set(LAZY_MODULES)
    assert ours <= {(i.module, i.target) for i in imports()[0] if not i.in_function}


def test_our_lazy_modules_load_at_first_use_not_at_import():
    """``import thunder_rs`` loads none of ``LAZY_MODULES``' lazy modules (one that another module
    imports outright waits for nothing, and its reason no longer holds); a program's first
    compile, a symbolic one with a fallback and the first read of the lazy front-door names load
    them."""
    lazy = sorted({target for _, target in LAZY_MODULES})
    code = (
        "import sys, torch, thunder_rs\n"
        f"lazy = {lazy!r}\n"
        "before = [m for m in lazy if m in sys.modules]\n"
        "x = torch.randn(3)\n"
        "assert torch.equal(thunder_rs.jit(lambda t: t.sin() * 2)(x), x.sin() * 2)\n"
        "assert thunder_rs.examine(torch.sin, x).supported and thunder_rs.Rule is thunder_rs.rules.Rule\n"
        # A fallback (an index_put) with symbolic sizes.
        "def inverse(t):\n    p = t.argsort()\n    i = torch.empty_like(p)\n"
        "    i[p] = torch.arange(p.size(0))\n    return i\n"
        "assert torch.equal(thunder_rs.jit(inverse, dynamic=True)(x), inverse(x))\n"
        "print(before, [m for m in lazy if m not in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] []", out


def test_the_checks_see_what_they_forbid(tmp_path):
    """Each check finds a planted violation: an upward import, imports inside functions, a cycle,
    and an upward import and a cycle made through a lazy declaration."""
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
        "core/state/e.py": (
            "from thunder_rs.core.base.lazy import LazyModule\n\n_F = LazyModule('thunder_rs.core.run.f')\n"
        ),
        "core/run/f.py": "from thunder_rs.core.state import e\n",
    }
    for name, source in sources.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(source)
    found, in_functions = imports(package)
    assert upward_imports(found) == [
        "thunder_rs.core.a:2 imports thunder_rs.torch (core.base -> torch)",
        "thunder_rs.core.state.c:1 imports thunder_rs.core.run.d (core.state -> core.run)",
        "thunder_rs.core.state.e:3 imports thunder_rs.core.run.f (core.state -> core.run)",
    ]
    assert function_level_imports(found, in_functions) == [
        "thunder_rs.core.b:5: import numpy",
        "thunder_rs.torch:5 imports thunder_rs.torch.shape inside a function",
    ]
    assert cycles(found) == [
        ["thunder_rs.core.a", "thunder_rs.torch"],
        ["thunder_rs.core.run.f", "thunder_rs.core.state.e"],
    ]


# -- ltorch by op family ---------------------------------------------------------------------------
# A reader finds an op, its decomposition, its grad rule and its kernels in one file: the module
# that declares the op's ``@torchsymbol`` (issue 25). Declarations come from the registry (a
# family declares some symbols in loops over tables, which the source names only as variables);
# grad rules and kernels from the source.

#: Names an ltorch module may not have: files named for holding an op's pieces apart from the op
#: (its grad rules, its kernels) or for being more of another family.
SPLIT_SUFFIXES = ("_grads", "_kernels", "_extra", "_opaque")


class Site(NamedTuple):
    module: str
    line: int
    symbol: str


def _is_call_of(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Call) and ast.unparse(node.func).rpartition(".")[2] == name


def _symbol_named(node: ast.expr) -> str | None:
    """``ltorch.X`` or a bare ``X`` as the symbol name ``X``; None for anything else."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ltorch":
        return node.attr
    return node.id if isinstance(node, ast.Name) else None


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}


def _grad_targets(tree: ast.AST, call: ast.Call, parents: dict) -> list[str]:
    """The symbols ``register_grad(target)`` registers: the target's name, or where the target is
    a parameter of an enclosing helper (``_define_full_median_grad(symbol)``), what each call of
    that helper in the module passes for it. A target made by a ``@torchsymbol`` def of the same
    module (``sampler``, one per row of a table) sits beside its rule by construction: ``""``."""
    target = call.args[0]
    if isinstance(target, ast.Name):
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == target.id:
                for decorator in node.decorator_list:
                    if _is_call_of(decorator, "torchsymbol"):
                        named = [k.value for k in decorator.keywords if k.arg == "name"]
                        if not named:
                            return [node.name]
                        return [named[0].value if isinstance(named[0], ast.Constant) else ""]
        child, scope = call, parents.get(call)
        while scope is not None:
            # The function a rule decorates is not its scope: its parameters are the rule's.
            if isinstance(scope, ast.FunctionDef) and child not in scope.decorator_list:
                params = [a.arg for a in scope.args.args]
                if target.id in params:
                    index = params.index(target.id)
                    calls = [n for n in ast.walk(tree) if _is_call_of(n, scope.name) and len(n.args) > index]
                    return [t for n in calls if (t := _symbol_named(n.args[index])) is not None]
            child, scope = scope, parents.get(scope)
    return [_symbol_named(target) or ast.unparse(target)]


def _kernel_name(node: ast.FunctionDef) -> str | None:
    """The symbol a ``@torchsymbol(..., meta=...)`` decorator makes of ``node``, else None."""
    for decorator in node.decorator_list:
        if _is_call_of(decorator, "torchsymbol") and any(k.arg == "meta" for k in decorator.keywords):
            named = [k.value.value for k in decorator.keywords if k.arg == "name" and isinstance(k.value, ast.Constant)]
            return named[0] if named else node.name
    return None


def _referenced(tree: ast.AST, name: str, skip: ast.AST) -> bool:
    """Whether ``name`` (bare or as ``ltorch.name``) is read anywhere in ``tree`` but ``skip``."""
    inside = {id(n) for n in ast.walk(skip)}
    return any(
        _symbol_named(n) == name and id(n) not in inside and isinstance(getattr(n, "ctx", None), ast.Load)
        for n in ast.walk(tree)
    )


@functools.cache
def family_sites(package: Path = PACKAGE) -> tuple[tuple[Site, ...], tuple[Site, ...], frozenset[str]]:
    """Every grad rule registration of ltorch (``register_grad``) as the symbol it registers, every
    kernel, and the modules that register a grad rule, read from ``<package>/torch``. A kernel's
    site names the kernel when its module reads it outside its definition, else ``?<kernel>``."""
    grads, kernels, with_rules = [], [], set()
    for module, path in modules(package).items():
        if not module.startswith(f"{package.name}.torch.") or path.suffix != ".py":
            continue
        tree = ast.parse(path.read_text())
        parents = _parents(tree)
        for node in ast.walk(tree):
            if _is_call_of(node, "register_grad") and node.args:
                with_rules.add(module)
                grads += [Site(module, node.lineno, target) for target in _grad_targets(tree, node, parents)]
            elif isinstance(node, ast.FunctionDef) and (kernel := _kernel_name(node)) is not None:
                used = _referenced(tree, node.name, node) or _referenced(tree, kernel, node)
                kernels.append(Site(module, node.lineno, kernel if used else f"?{kernel}"))
    return tuple(grads), tuple(kernels), frozenset(with_rules)


def misplaced(
    grads: Sequence[Site], kernels: Sequence[Site], with_rules: frozenset[str], declared: dict[str, str]
) -> list[str]:
    """Grad rules registered away from the module that declares their symbol (``declared``: symbol
    name to module), and kernels that no grad rule of their own module calls."""
    out = [
        f"{g.module}:{g.line} registers the grad rule of {g.symbol}, declared in {declared.get(g.symbol)}"
        for g in grads
        if g.symbol and declared.get(g.symbol) != g.module
    ]
    out += [
        f"{k.module}:{k.line} declares the kernel {k.symbol.lstrip('?')}, which no grad rule of its module calls"
        for k in kernels
        if k.symbol.startswith("?") or k.module not in with_rules
    ]
    return out


def split_modules(package: Path = PACKAGE) -> list[str]:
    """Modules of ``<package>.torch`` named for a piece held apart from its family."""
    return sorted(m for m in modules(package) if m.startswith(f"{package.name}.torch.") and m.endswith(SPLIT_SUFFIXES))


def declaring_modules() -> dict[str, str]:
    """Each registered ltorch symbol's name (``tanh``) and the module its ``@torchsymbol`` is in."""
    return {s.symbol_name.removeprefix("ltorch."): s.__module__ for s in SYMBOLS}


def test_each_grad_rule_and_kernel_sits_beside_its_op():
    grads, kernels, with_rules = family_sites()
    declared = declaring_modules()
    # The source shows every rule the registry holds: each symbol with a rule is a site's, or
    # declared in a module whose rule is made per row of a table (a ``""`` site).
    with_rule = {s.symbol_name.removeprefix("ltorch.") for s in SYMBOLS if s.symbol_id in GRAD_RULES}
    per_row = {g.module for g in grads if not g.symbol}
    assert {name for name in with_rule - {g.symbol for g in grads} if declared[name] not in per_row} == set()
    assert {k.symbol.lstrip("?") for k in kernels} == {
        s.symbol_name.removeprefix("ltorch.") for s in SYMBOLS if s.symbol_id in KERNEL_IDS
    }
    assert misplaced(grads, kernels, with_rules, declared) == []


def test_no_ltorch_module_holds_pieces_apart_from_their_family():
    assert split_modules() == []


def test_the_family_checks_see_what_they_forbid(tmp_path):
    """A grad rule in another module than its op's (directly, and through a helper's parameter), a
    kernel in a module without the rule that calls it, and a ``*_grads`` module are each found."""
    package = tmp_path / "thunder_rs"
    sources = {
        "__init__.py": "",
        "_core.pyi": "",
        "torch/__init__.py": "",
        "torch/nn.py": (
            "@torchsymbol(F.gelu)\ndef gelu(input):\n    return input\n\n\n"
            "@register_grad(ltorch.gelu)\ndef gelu_grad(input):\n    return gelu_backward(input)\n\n\n"
            "@torchsymbol(name='gelu_backward', meta=_meta)\ndef gelu_backward(g):\n    return g\n"
        ),
        "torch/nn_grads.py": (
            "@register_grad(ltorch.relu)\ndef relu_grad(input):\n    return input\n\n\n"
            "def _define(symbol):\n    @register_grad(symbol)\n    def rule(input):\n        return input\n\n\n"
            "_define(ltorch.median)\n"
        ),
        "torch/kernels.py": (
            "@torchsymbol(name='softmax_backward', meta=_meta)\ndef softmax_backward(g):\n    return g\n"
        ),
    }
    for name, source in sources.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(source)
    declared = {"gelu": "thunder_rs.torch.nn", "relu": "thunder_rs.torch.nn", "median": "thunder_rs.torch.statistics"}
    assert misplaced(*family_sites(package), declared) == [
        "thunder_rs.torch.nn_grads:1 registers the grad rule of relu, declared in thunder_rs.torch.nn",
        "thunder_rs.torch.nn_grads:7 registers the grad rule of median, declared in thunder_rs.torch.statistics",
        "thunder_rs.torch.kernels:2 declares the kernel softmax_backward, which no grad rule of its module calls",
    ]
    assert split_modules(package) == ["thunder_rs.torch.nn_grads"]
