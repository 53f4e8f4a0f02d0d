"""Rust pass plugins (issue 27): the example crate in examples/rust_pass, copied out of the source
tree and built once per session with cargo against the installed package's crates (as a user of
the wheel builds it), loaded through ``thunder_rs.load_passes``, against eager PyTorch."""

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import thunder_rs
from thunder_rs import _core, plugins
from thunder_rs.errors import ThunderRuntimeError, ThunderTypeError, ThunderValueError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "rust_pass"
# Under the tree's ignored target/, so the build is cached between sessions: the dependencies'
# artifacts are reused, and only the copied crate itself compiles again (about a second).
TARGET = ROOT / "target" / "rust_pass_example"
MODULE = "thunder_rs_example_pass"
# The thunder_rs packages a plugin depends on, as crates.io names them, and their folders (the
# folders' names are the libraries': `use passes::...`).
CRATES = {"thunder_rs_trace_ir": "trace_ir", "thunder_rs_passes": "passes", "thunder_rs_plugin_abi": "plugin_abi"}
# One xdist worker builds and loads the plugin (also under --dist loadgroup): cargo's lock
# on the target directory would make a second worker's build wait and then find it done, only
# costing a second load.
pytestmark = pytest.mark.xdist_group("rust_plugin")


@pytest.fixture(scope="session")
def cargo():
    """The cargo executable."""
    found = shutil.which("cargo")
    if found is None:
        pytest.skip("cargo is not installed: the example plugin cannot be built")
    return found


@pytest.fixture(scope="session")
def example_project(tmp_path_factory):
    """The example crate copied outside the source tree, with the ``.cargo/config.toml`` the
    README has a user write from ``thunder_rs.cargo_config()``."""
    project = tmp_path_factory.mktemp("plugin_project") / "rust_pass"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("target", ".cargo"))
    (project / ".cargo").mkdir()
    (project / ".cargo" / "config.toml").write_text(thunder_rs.cargo_config())
    return project


@pytest.fixture(scope="session")
def plugin(tmp_path_factory, cargo, example_project):
    """The example plugin module, built with cargo (a release build: the crossing is timed)."""
    # cargo reads .cargo/config.toml from the directory it runs in.
    build = subprocess.run(
        [cargo, "build", "--release", "--target-dir", str(TARGET)],
        cwd=example_project,
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    suffix = {"darwin": "dylib", "win32": "dll"}.get(sys.platform, "so")
    built = TARGET / "release" / f"lib{MODULE}.{suffix}"
    if sys.platform == "win32":
        built = TARGET / "release" / f"{MODULE}.dll"
    module_path = tmp_path_factory.mktemp("plugin") / f"{MODULE}.{'pyd' if sys.platform == 'win32' else 'so'}"
    shutil.copy(built, module_path)
    spec = importlib.util.spec_from_file_location(MODULE, module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    loaded = thunder_rs.load_passes(module)
    assert loaded["example_silu"] == "forward" and loaded["example_refuses"] == "program"
    return module


def _silu_fn(x):
    return x * torch.sigmoid(x) + 1.0


def test_the_example_builds_outside_the_tree_against_the_packages_crates_only(cargo, example_project, plugin):
    assert not example_project.is_relative_to(ROOT), example_project
    crates = thunder_rs.rust_crates_dir()
    config = (example_project / ".cargo" / "config.toml").read_text()
    for package, folder in CRATES.items():
        assert f'{package} = {{ path = "{(crates / folder).as_posix()}" }}' in config, config
    # What cargo resolved: each thunder_rs crate from the package's folder, none from a registry.
    metadata = subprocess.run(
        [cargo, "metadata", "--format-version", "1", "--offline"],
        cwd=example_project,
        capture_output=True,
        text=True,
    )
    assert metadata.returncode == 0, metadata.stderr[-4000:]
    packages = {p["name"]: p for p in json.loads(metadata.stdout)["packages"]}
    for package, folder in CRATES.items():
        assert packages[package]["source"] is None, packages[package]
        assert Path(packages[package]["manifest_path"]) == crates / folder / "Cargo.toml"
        assert packages[package]["version"] == thunder_rs.__version__
        assert [t["name"] for t in packages[package]["targets"] if "lib" in t["kind"]] == [folder]
    # Built against them, the plugin loads, its rule fires, and the result is eager's.
    jfn = thunder_rs.jit(_silu_fn, passes=["example_silu"])
    x = torch.randn(6)
    torch.testing.assert_close(jfn(x), _silu_fn(x))
    assert "silu" in str(thunder_rs.last_traces(jfn)[-1])


def test_rewrite_rule_fires_and_matches_eager(plugin):
    jfn = thunder_rs.jit(_silu_fn, passes=["example_silu"])
    x = torch.randn(8, 16)
    torch.testing.assert_close(jfn(x), _silu_fn(x))
    final = str(thunder_rs.last_traces(jfn)[-1])
    assert "silu" in final and "sigmoid" not in final, final


def test_the_capsule_loader_names_each_pass_and_its_stage(plugin):
    loaded = _core.load_plugin_capsule(plugin.thunder_rs_passes)
    assert _core.LoadedPass in {type(p) for p in loaded} and len({type(p) for p in loaded}) == 1
    by_name = {p.name: p for p in loaded}
    assert by_name["example_silu"].stage == "forward" and by_name["example_refuses"].stage == "program"
    assert repr(by_name["example_silu"]) == "LoadedPass(name='example_silu', stage='forward')"
    assert loaded == _core.load_plugin_capsule(plugin.thunder_rs_passes)  # loading again replaces them


def test_rewrite_rule_under_autograd(plugin):
    jfn = thunder_rs.jit(_silu_fn, passes=["example_silu"])
    x = torch.randn(4, 5, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    out, expected = jfn(x), _silu_fn(xe)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(x.grad, xe.grad)


def test_custom_pass_and_identity_match_eager(plugin):
    for name in ["example_inline_sigmoid", "example_identity"]:
        jfn = thunder_rs.jit(_silu_fn, passes=[name])
        x = torch.randn(3, 7)
        torch.testing.assert_close(jfn(x), _silu_fn(x))
    assert "example_identity" in thunder_rs.registered_passes()


def test_program_stage_pass_keeps_grad_rules(plugin):
    # sigmoid's registered grad rule crosses the boundary (binary form) and back: gradients match.
    jfn = thunder_rs.jit(_silu_fn, passes=["example_identity"])
    x = torch.randn(3, 4, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    out, expected = jfn(x), _silu_fn(xe)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(x.grad, xe.grad)


def test_panic_in_plugin_names_the_pass(plugin):
    jfn = thunder_rs.jit(_silu_fn, passes=["example_explode"])
    with pytest.raises(ThunderRuntimeError, match="example_explode panicked: the example.s explode pass always panics"):
        jfn(torch.randn(2))


def test_a_rule_naming_no_prim_is_an_error_naming_the_rule(plugin):
    jfn = thunder_rs.jit(_silu_fn, passes=["example_misspelt"])
    with pytest.raises(
        ThunderRuntimeError, match=r'example_misspelt failed: .*rule mul-sigmoid-misspelt names "reciprocl"'
    ):
        jfn(torch.randn(2))


def test_broken_trace_is_named_by_the_verifier(plugin):
    # Plugin output is always verified, whatever THUNDER_RS_VERIFY says.
    jfn = thunder_rs.jit(_silu_fn, passes=["example_breaks"])
    with pytest.raises(ThunderRuntimeError, match="pass example_breaks returned an invalid trace"):
        jfn(torch.randn(2))


def test_error_in_plugin_names_the_pass(plugin):
    jfn = thunder_rs.jit(_silu_fn, passes=["example_refuses"])
    with pytest.raises(ThunderRuntimeError, match="pass example_refuses failed: example_refuses: this pass refuses"):
        jfn(torch.randn(2))


@pytest.fixture
def skipping(plugin):
    """The plugin loaded with ``on_error="skip"``, loaded back with the default after the test."""
    thunder_rs.load_passes(plugin, on_error="skip")
    yield plugin
    thunder_rs.load_passes(plugin)


@pytest.mark.parametrize(
    "name, error",
    [
        ("example_refuses", "failed: example_refuses: this pass refuses every trace"),
        ("example_explode", "panicked: the example.s explode pass always panics"),
        ("example_breaks", "returned an invalid trace: verify: output t. is never defined"),
    ],
)
def test_on_error_skip_compiles_without_the_pass_with_one_warning(skipping, name, error):
    jfn = thunder_rs.jit(_silu_fn, passes=[name, "example_silu"])
    x = torch.randn(3, 5)
    with pytest.warns(RuntimeWarning) as caught:
        torch.testing.assert_close(jfn(x), _silu_fn(x))
    messages = [str(w.message) for w in caught if "plugin pass" in str(w.message)]
    assert len(messages) == 1, messages
    assert re.search(f"plugin pass {name} failed and was skipped .on_error=.skip.\\): .*{error}", messages[0]), messages
    # The passes after the skipped one still ran.
    assert "silu" in str(thunder_rs.last_traces(jfn)[-1])


def test_a_failed_compile_leaves_the_cache_as_it_was(plugin):
    jfn = thunder_rs.jit(_silu_fn, passes=["example_explode"])
    thunder_rs.load_passes(plugin, on_error="skip")
    try:
        with pytest.warns(RuntimeWarning, match="example_explode failed and was skipped"):
            jfn(torch.randn(2))
    finally:
        thunder_rs.load_passes(plugin)
    function = thunder_rs._function(jfn)

    def cache_state():
        return dict(function._cache), {key: list(entries) for key, entries in function._variants.items()}

    before = cache_state()
    assert len(before[0]) == 1
    for _ in range(2):
        with pytest.raises(ThunderRuntimeError, match="example_explode panicked"):
            jfn(torch.randn(3))
        assert cache_state() == before
    hits = thunder_rs.cache_hits(jfn)
    x = torch.randn(2)
    torch.testing.assert_close(jfn(x), _silu_fn(x))
    assert thunder_rs.cache_hits(jfn) == hits + 1


def test_load_passes_rejects_an_unknown_on_error(plugin):
    with pytest.raises(ThunderValueError, match='on_error is "raise" or "skip", got .ignore.'):
        thunder_rs.load_passes(plugin, on_error="ignore")


def test_an_installed_package_finds_its_crates_and_cargo_config_points_at_them(tmp_path, monkeypatch):
    # As installed from the wheel: no checkout around the package, the crates in its rust_crates.
    tomllib = pytest.importorskip("tomllib")  # Python 3.11's

    monkeypatch.setattr(plugins, "__file__", str(tmp_path / "site" / "thunder_rs" / "plugins.py"))
    packaged = tmp_path / 'we"ird site' / "rust_crates"
    monkeypatch.setattr(plugins, "PACKAGED_CRATES", packaged)
    with pytest.raises(ThunderRuntimeError, match="this thunder_rs has no Rust crate sources"):
        thunder_rs.rust_crates_dir()
    for folder in CRATES.values():
        (packaged / folder).mkdir(parents=True)
        (packaged / folder / "Cargo.toml").write_text("")
    assert thunder_rs.rust_crates_dir() == packaged
    patch = tomllib.loads(thunder_rs.cargo_config())["patch"]["crates-io"]
    assert patch == {package: {"path": (packaged / folder).as_posix()} for package, folder in CRATES.items()}


def test_abi_version_mismatch_names_both_versions():
    ctypes = pytest.importorskip("ctypes")

    class Table(ctypes.Structure):
        _fields_ = [
            ("abi_version", ctypes.c_uint32),
            ("n_passes", ctypes.c_size_t),
            ("passes", ctypes.c_void_p),
            ("free", ctypes.c_void_p),
        ]

    table = Table(999, 0, None, None)
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype = ctypes.py_object
    new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    name = ctypes.c_char_p(b"thunder_rs.plugin_table")
    capsule = new_capsule(ctypes.addressof(table), name, None)
    with pytest.raises(ThunderRuntimeError, match="plugin ABI version 999, this thunder_rs reads version 2"):
        thunder_rs.load_passes(capsule)


def test_load_passes_rejects_other_objects():
    with pytest.raises(ThunderTypeError, match="has no 'thunder_rs_passes' capsule"):
        thunder_rs.load_passes(sys)
    with pytest.raises(ThunderTypeError, match="expected a plugin module or its capsule"):
        thunder_rs.load_passes(42)
