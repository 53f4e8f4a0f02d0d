//! Golden tests of the passes, in the style of cranelift's filetests.
//!
//! Each `tests/golden/*.trace` file starts with `# pass: <names>`, the passes to run in order
//! (`dce`, `cse`, `dce,cse`), then holds an input trace as `print_trace` prints it, and
//! `# check: <text>` and `# check-not: <text>` lines about the printed output of the passes.
//! As in LLVM's FileCheck, each `check` must match a line after the previous check's match, and
//! each `check-not` must match no line between the matches of the checks around it (the start
//! and the end of the output where there is none). Other comments at column 0 are notes.
//!
//! `split` (last in the list) differentiates the trace and prints the forward then the
//! backward of the split, as `def forward(...)` and `def backward(...)`; input types ending in
//! ` requires_grad` say which inputs gradients flow to.

use passes::cse::cse;
use passes::dce::dce;
use passes::views::{views, views_with_tensordot};
use passes::vjp::vjp;
use passes::{run_passes, Pass, PassCx};
use std::path::Path;
use trace_ir::parser::parse_trace;
use trace_ir::printer::print_trace;

/// The passes a golden file can name.
const PASSES: &[Pass] =
    &[("dce", dce), ("cse", cse), ("vjp", vjp), ("views", views), ("views_with_tensordot", views_with_tensordot)];

#[derive(Debug)]
enum Check {
    Match(String),
    Not(String),
}

/// A golden file's passes and checks; the trace is the rest of the file.
struct Golden {
    passes: Vec<Pass>,
    /// Split into forward and backward after the passes.
    split: bool,
    checks: Vec<Check>,
}

fn read_directives(text: &str) -> Result<Golden, String> {
    let mut passes = None;
    let mut split = false;
    let mut checks = Vec::new();
    for line in text.lines() {
        if let Some(names) = line.strip_prefix("# pass:") {
            let names = match names.trim().strip_suffix("split") {
                Some(rest) => {
                    split = true;
                    rest.trim_end_matches(',')
                }
                None => names,
            };
            let named = names.split(',').filter(|n| !n.trim().is_empty()).map(|n| {
                let n = n.trim();
                PASSES.iter().find(|(name, _)| *name == n).copied().ok_or(format!("unknown pass `{n}`"))
            });
            passes = Some(named.collect::<Result<Vec<_>, _>>()?);
        } else if let Some(pattern) = line.strip_prefix("# check:") {
            checks.push(Check::Match(pattern.trim().to_string()));
        } else if let Some(pattern) = line.strip_prefix("# check-not:") {
            checks.push(Check::Not(pattern.trim().to_string()));
        }
    }
    let passes = passes.ok_or("no `# pass:` line")?;
    if !checks.iter().any(|c| matches!(c, Check::Match(_))) {
        return Err("no `# check:` line".into());
    }
    Ok(Golden { passes, split, checks })
}

/// Runs the checks over `output`, FileCheck style.
fn run_checks(output: &str, checks: &[Check]) -> Result<(), String> {
    let lines: Vec<&str> = output.lines().collect();
    let mut from = 0;
    let mut nots: Vec<&str> = Vec::new();
    let forbid = |nots: &[&str], region: &[&str]| match nots.iter().find(|n| region.iter().any(|l| l.contains(**n))) {
        Some(n) => Err(format!("`check-not: {n}` matched")),
        None => Ok(()),
    };
    for check in checks {
        match check {
            Check::Not(pattern) => nots.push(pattern),
            Check::Match(pattern) => {
                let Some(at) = (from..lines.len()).find(|&i| lines[i].contains(pattern.as_str())) else {
                    return Err(format!("`check: {pattern}` matched no line after line {from}"));
                };
                forbid(&nots, &lines[from..at])?;
                nots.clear();
                from = at + 1;
            }
        }
    }
    forbid(&nots, &lines[from..])
}

fn run_golden(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let golden = read_directives(&text)?;
    let trace = parse_trace(&text).map_err(|e| e.to_string())?;
    let cx = PassCx { verify: true, dump: Vec::new() };
    let (out, _) = run_passes(&trace, &golden.passes, &cx).map_err(|e| e.to_string())?;
    let printed = if golden.split {
        let joint = passes::joint(&out).map_err(|e| e.to_string())?.ok_or("no output requires grad")?;
        let halves = passes::split(&joint).map_err(|e| e.to_string())?;
        let (forward, _) = run_passes(&halves.forward, &[("dce", dce)], &cx).map_err(|e| e.to_string())?;
        let (backward, _) =
            run_passes(&halves.backward, &[("dce", dce), ("cse", cse)], &cx).map_err(|e| e.to_string())?;
        format!("{}\n{}", print_trace(&forward, "forward"), print_trace(&backward, "backward"))
    } else {
        print_trace(&out, "computation")
    };
    run_checks(&printed, &golden.checks).map_err(|e| format!("{e} in the output:\n{printed}"))
}

#[test]
fn golden_files() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/golden exists")
        .map(|e| e.expect("readable directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "trace"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 8, "expected the golden files in {}", dir.display());
    let failures: Vec<String> = paths
        .iter()
        .filter_map(|p| run_golden(p).err().map(|e| format!("{}: {e}", p.file_name().unwrap().to_string_lossy())))
        .collect();
    assert!(failures.is_empty(), "{} golden file(s) failed:\n\n{}", failures.len(), failures.join("\n\n"));
}

#[test]
fn checks_match_in_order_and_check_nots_between_matches() {
    let output = "a\nb\nc\nd\n";
    let m = |s: &str| Check::Match(s.into());
    let n = |s: &str| Check::Not(s.into());
    assert!(run_checks(output, &[m("a"), m("c")]).is_ok());
    assert!(run_checks(output, &[m("c"), m("a")]).is_err());
    assert!(run_checks(output, &[m("a"), n("b"), m("c")]).is_err());
    assert!(run_checks(output, &[m("b"), n("a"), m("c")]).is_ok());
    assert!(run_checks(output, &[m("c"), n("d")]).is_err());
    assert!(run_checks(output, &[n("x"), m("a")]).is_ok());
}

#[test]
fn directives_name_known_passes() {
    assert!(read_directives("# pass: dce,cse\n# check: x\n").is_ok_and(|g| g.passes.len() == 2));
    assert!(read_directives("# pass: licm\n# check: x\n").is_err());
    assert!(read_directives("# check: x\n").is_err());
    assert!(read_directives("# pass: dce\n").is_err());
    assert!(read_directives("# pass: cse,split\n# check: x\n").is_ok_and(|g| g.split && g.passes.len() == 1));
}
