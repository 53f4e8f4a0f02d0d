"""The release wheel (``make wheel``): its manylinux tag, its contents, and a jit call against eager
in a fresh virtual environment that has only the wheel and its dependencies."""

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
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    subprocess.run([uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), str(wheel)], check=True)
    run = subprocess.run([str(venv / "bin" / "python"), "-c", SMOKE], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
