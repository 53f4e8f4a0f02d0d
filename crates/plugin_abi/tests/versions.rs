//! The crates' version is the wheel's: a plugin built against thunder_rs_plugin_abi x.y.z is for
//! thunder_rs x.y.z. The workspace version, pyproject.toml's and the internal dependencies' must
//! agree.

use std::path::Path;

/// The crates a plugin depends on: each package's name on crates.io, and its library's name, which
/// is also its folder under crates/.
const CRATES: [(&str, &str); 3] =
    [("thunder_rs_trace_ir", "trace_ir"), ("thunder_rs_passes", "passes"), ("thunder_rs_plugin_abi", "plugin_abi")];

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
fn the_packages_have_their_crates_io_names_and_the_libraries_their_folders() {
    for (package, library) in CRATES {
        let manifest = root_file(&format!("crates/{library}/Cargo.toml"));
        assert_eq!(value(&manifest, "package", "name"), package, "crates/{library}/Cargo.toml");
        assert_eq!(value(&manifest, "lib", "name"), library, "crates/{library}/Cargo.toml: `use {library}::...`");
    }
}

#[test]
fn the_example_plugin_requires_the_workspace_version() {
    // It names the packages as crates.io dependencies that `thunder_rs.cargo_config()` patches
    // to the installed package's sources; a patch of another version would be ignored.
    let example = root_file("examples/rust_pass/Cargo.toml");
    let version = value(&root_file("Cargo.toml"), "workspace.package", "version").to_string();
    for (name, _) in CRATES {
        assert_eq!(value(&example, "dependencies", name), format!("={version}"), "examples/rust_pass: {name}");
    }
}

#[test]
fn internal_dependencies_require_the_workspace_version() {
    let cargo = root_file("Cargo.toml");
    let version = value(&cargo, "workspace.package", "version");
    for (name, _) in CRATES {
        let line = cargo.lines().find(|l| l.starts_with(&format!("{name} ="))).expect("a workspace dependency");
        assert!(line.contains(&format!("version = \"={version}\"")), "{line}: must require ={version}");
    }
}
