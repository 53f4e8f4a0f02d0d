"""The release wheel (``make wheel``): its manylinux tag, its contents, and a jit call against eager
in a fresh virtual environment that has only the wheel and its dependencies; then the example pass
plugin, copied out of the tree and built against the crates that wheel installed, loaded there."""

import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SMOKE = """
import pathlib, sys, torch, thunder_rs
assert pathlib.Path(thunder_rs.__file__).is_relative_to(pathlib.Path(sys.prefix)), thunder_rs.__file__
def f(x, y):
    return torch.nn.functional.gelu(x @ y).softmax(-1)
x, y = torch.randn(4, 8, requires_grad=True), torch.randn(8, 3)
out = thunder_rs.jit(f)(x, y)
torch.testing.assert_close(out, f(x, y))
(g,) = torch.autograd.grad((out * out).sum(), x)
(e,) = torch.autograd.grad((f(x, y) * f(x, y)).sum(), x)
torch.testing.assert_close(g, e)
print("ok")
"""
# Loads the example plugin built against the installed wheel (its path in argv[1]).
PLUGIN = """
import importlib.util, sys, torch, thunder_rs
spec = importlib.util.spec_from_file_location("thunder_rs_example_pass", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
assert thunder_rs.load_passes(module)["example_silu"] == "forward"
def f(x):
    return x * torch.sigmoid(x) + 1.0
jfn = thunder_rs.jit(f, passes=["example_silu"])
x = torch.randn(8, 16)
torch.testing.assert_close(jfn(x), f(x))
final = str(thunder_rs.last_traces(jfn)[-1])
assert "silu" in final and "sigmoid" not in final, final
print("ok")
"""
# The thunder_rs packages a plugin depends on (crates.io names) and their folders in the wheel.
RUST_CRATES = {"thunder_rs_trace_ir": "trace_ir", "thunder_rs_passes": "passes", "thunder_rs_plugin_abi": "plugin_abi"}


@pytest.mark.slow
def test_wheel_installs_and_runs(tmp_path):
    uv = shutil.which("uv", path=str(pathlib.Path(sys.prefix) / "bin")) or shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not installed (make build installs it)")
    subprocess.run(["make", "wheel", f"WHEEL_DIR={tmp_path / 'dist'}"], cwd=ROOT, check=True)
    (wheel,) = (tmp_path / "dist").glob("thunder_rs-*.whl")
    assert wheel.name.endswith("-cp310-abi3-manylinux_2_28_x86_64.whl"), wheel.name
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"thunder_rs/_core.pyi", "thunder_rs/py.typed", "thunder_rs/_core.abi3.so"} <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), sorted(names)
    for folder in RUST_CRATES.values():
        assert {f"thunder_rs/rust_crates/{folder}/Cargo.toml", f"thunder_rs/rust_crates/{folder}/src/lib.rs"} <= names
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    subprocess.run([uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), str(wheel)], check=True)
    run = subprocess.run([str(venv / "bin" / "python"), "-c", SMOKE], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
    _builds_and_loads_the_example_plugin(venv / "bin" / "python", tmp_path)


def _builds_and_loads_the_example_plugin(python, tmp_path):
    """examples/rust_pass copied out of the tree, built against the installed wheel's crates
    (``thunder_rs.cargo_config()``), loaded in the fresh environment: the rule fires, outputs equal
    eager's."""
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.skip("cargo is not installed: the example plugin cannot be built")
    config = subprocess.run(
        [str(python), "-c", "import thunder_rs; print(thunder_rs.cargo_config(), end='')"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    site = str(python.parent.parent)
    assert all(f'{package} = {{ path = "{site}' in config for package in RUST_CRATES), config
    project = tmp_path / "rust_pass"
    shutil.copytree(ROOT / "examples" / "rust_pass", project, ignore=shutil.ignore_patterns("target", ".cargo"))
    (project / ".cargo").mkdir()
    (project / ".cargo" / "config.toml").write_text(config)
    # A target directory kept between runs: the wheel's crates compile again (their path is new),
    # pyo3 does not.
    target = ROOT / "target" / "rust_pass_wheel"
    build = subprocess.run(
        [cargo, "build", "--release", "--target-dir", str(target)], cwd=project, capture_output=True, text=True
    )
    assert build.returncode == 0, build.stderr[-4000:]
    module = tmp_path / "thunder_rs_example_pass.so"
    shutil.copy(target / "release" / "libthunder_rs_example_pass.so", module)
    run = subprocess.run([str(python), "-c", PLUGIN, str(module)], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
