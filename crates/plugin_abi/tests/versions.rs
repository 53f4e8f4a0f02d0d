//! The crates' version is the wheel's: a plugin built against plugin_abi x.y.z is for thunder_rs
//! x.y.z. The workspace version, pyproject.toml's and the internal dependencies' must agree.

use std::path::Path;

fn root_file(name: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::read_to_string(root.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The quoted value of the first line `key = "value"` in the section `[section]` of a TOML file.
fn value<'a>(toml: &'a str, section: &str, key: &str) -> &'a str {
    let body = toml.split(&format!("[{section}]\n")).nth(1).unwrap_or_else(|| panic!("no [{section}]"));
    let body = body.split("\n[").next().expect("a section has a body");
    let line = body.lines().find(|l| l.starts_with(&format!("{key} ="))).unwrap_or_else(|| panic!("no {key}"));
    line.split('"').nth(1).unwrap_or_else(|| panic!("{line}: no quoted value"))
}

#[test]
fn the_crates_version_is_the_wheels() {
    let pyproject = root_file("pyproject.toml");
    assert_eq!(
        env!("CARGO_PKG_VERSION"),
        value(&pyproject, "project", "version"),
        "set [workspace.package] version to pyproject.toml's"
    );
}

#[test]
fn the_example_plugin_requires_the_workspace_version() {
    // It names the crates as crates.io dependencies that `thunder_rs.cargo_config()` patches to
    // the installed package's sources; a patch of another version would be ignored.
    let example = root_file("examples/rust_pass/Cargo.toml");
    let version = value(&root_file("Cargo.toml"), "workspace.package", "version").to_string();
    for name in ["trace_ir", "passes", "plugin_abi"] {
        assert_eq!(value(&example, "dependencies", name), format!("={version}"), "examples/rust_pass: {name}");
    }
}

#[test]
fn internal_dependencies_require_the_workspace_version() {
    let cargo = root_file("Cargo.toml");
    let version = value(&cargo, "workspace.package", "version");
    for name in ["trace_ir", "passes", "plugin_abi"] {
        let line = cargo.lines().find(|l| l.starts_with(&format!("{name} ="))).expect("a workspace dependency");
        assert!(line.contains(&format!("version = \"={version}\"")), "{line}: must require ={version}");
    }
}
