"""Sizes the house rules set (STYLE.md): Python files under 800 lines and functions under 80, Rust
files under 1,000 and functions under 80, checked here so that a review need not count."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY_FILE, PY_FUNCTION, RS_FILE, RS_FUNCTION = 800, 80, 1000, 80
# A Rust item that starts a function: visibility, qualifiers, then `fn name`.
RS_FN = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(unsafe\s+)?(extern\s+"C"\s+)?fn\s+(\w+)')
# What may hold braces without opening a block: string literals, char literals and line comments.
RS_NOISE = re.compile(r'"(\\.|[^"\\])*"|\'(\\.|[^\'\\])\'|//.*')


def python_files():
    """The package, its tests, benchmarks and examples."""
    folders = (ROOT / "python" / "thunder_rs", ROOT / "tests", ROOT / "benchmarks", ROOT / "examples")
    return sorted(p for folder in folders for p in folder.rglob("*.py") if "target" not in p.parts)


def rust_files():
    return sorted(p for crate in ("crates", "examples") for p in (ROOT / crate).rglob("src/**/*.rs"))


def python_functions(path):
    """(name, first line, lines) of every function in a Python file."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def rust_functions(text):
    """(name, first line, lines) of every Rust function with a body, by brace depth from its `fn`."""
    lines = text.split("\n")
    for start, line in enumerate(lines):
        found = RS_FN.match(line)
        if found:
            end = _body_end(lines, start)
            if end is not None:
                yield found.group(6), start + 1, end - start + 1


def _body_end(lines, start):
    depth, opened = 0, False
    for index in range(start, len(lines)):
        code = RS_NOISE.sub("", lines[index])
        depth += code.count("{") - code.count("}")
        opened = opened or "{" in code
        if opened and depth <= 0:
            return index
        if not opened and code.rstrip().endswith(";"):
            return None  # a declaration without a body (trait method, extern block)
    return None


def _rel(path):
    return str(path.relative_to(ROOT))


def test_python_files_and_functions_are_small():
    long_files = [f"{_rel(p)}: {n} lines" for p in python_files() if (n := len(p.read_text().splitlines())) > PY_FILE]
    long_functions = [
        f"{_rel(p)}:{line} {name}: {n} lines"
        for p in python_files()
        for name, line, n in python_functions(p)
        if n > PY_FUNCTION
    ]
    assert long_files == [], f"Python files over {PY_FILE} lines (split by family or stage)"
    assert long_functions == [], f"Python functions over {PY_FUNCTION} lines"


def test_rust_files_and_functions_are_small():
    long_files = [f"{_rel(p)}: {n} lines" for p in rust_files() if (n := len(p.read_text().splitlines())) > RS_FILE]
    long_functions = [
        f"{_rel(p)}:{line} {name}: {n} lines"
        for p in rust_files()
        for name, line, n in rust_functions(p.read_text())
        if n > RS_FUNCTION
    ]
    assert long_files == [], f"Rust files over {RS_FILE} lines (split by family or stage)"
    assert long_functions == [], f"Rust functions over {RS_FUNCTION} lines"


def test_the_rust_scanner_measures_bodies_and_skips_declarations():
    text = 'pub fn a(x: u32) -> u32 {\n    let s = "}";\n    // }\n    x\n}\ntrait T {\n    fn b(&self);\n}\n'
    assert list(rust_functions(text)) == [("a", 1, 5)]
