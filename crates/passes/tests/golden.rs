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
//!
//! `claim`, `partition` and `lifetimes` (last in the list) run the execution stages for the
//! executors the file declares, in priority order, one per line:
//! `# executor: <name> [fusion] [decompositions] [inplace]: <symbols>`, the symbols being prim
//! names (`exp`), qualified composite or fallback names (`ltorch.softmax`), or `*` for every
//! symbol in the trace (a torch executor). Each implementation is called `<name>_<symbol>`
//! (`torch_exp`); `inplace` gives it method (`exp`) and in-place (`exp_`) forms. `claim` prints
//! the claimed trace then who runs each top-level call (`# t2 <- fuser, else torch_exp`);
//! `partition` prints the partitioned trace; `lifetimes` prints the generated Python module
//! (deletions after last uses, in-place forms of dying intermediates) and each region's.
//!
//! A file may end with an `# output:` line followed by the whole expected output, each line
//! prefixed by `# | `: the output must then equal it exactly. `THUNDER_RS_BLESS=1 cargo test -p
//! passes --test golden` rewrites that block in place with the actual output (to create one,
//! end the file with an empty `# output:` line and bless); the checks still apply.

use passes::claim::{claim, Assignment, ExecutorSpec, ImplSpec, SymKey};
use passes::cse::cse;
use passes::dce::dce;
use passes::lifetimes::del_last_used;
use passes::partition::{partition, Partition};
use passes::reuse::reuse_receivers;
use passes::views::{views, views_with_tensordot};
use passes::vjp::vjp;
use passes::{run_passes, Pass, PassCx, Plan};
use std::fmt::Write;
use std::path::Path;
use trace_ir::parser::parse_trace;
use trace_ir::printer::print_trace;
use trace_ir::pysrc::Callee;
use trace_ir::{BoundSymbol, PrimId, Symbol, SymbolTable, Trace};

/// The passes a golden file can name.
const PASSES: &[Pass] =
    &[("dce", dce), ("cse", cse), ("vjp", vjp), ("views", views), ("views_with_tensordot", views_with_tensordot)];

#[derive(Debug)]
enum Check {
    Match(String),
    Not(String),
}

/// What runs after the passes, and what is printed.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Last {
    /// The trace the passes return.
    Trace,
    /// Split into forward and backward.
    Split,
    Claim,
    Partition,
    Lifetimes,
}

const LAST: &[(&str, Last)] =
    &[("split", Last::Split), ("claim", Last::Claim), ("partition", Last::Partition), ("lifetimes", Last::Lifetimes)];

/// An `# executor:` line: name, flags, symbols.
struct Executor {
    name: String,
    fusion: bool,
    decompositions: bool,
    inplace: bool,
    symbols: Vec<String>,
}

/// A golden file's passes and checks; the trace is the rest of the file.
struct Golden {
    passes: Vec<Pass>,
    last: Last,
    executors: Vec<Executor>,
    checks: Vec<Check>,
}

fn read_executor(line: &str) -> Result<Executor, String> {
    let (head, symbols) = line.split_once(':').ok_or(format!("`# executor:{line}` has no `:` before its symbols"))?;
    let mut words = head.split_whitespace();
    let name = words.next().ok_or("an executor without a name")?.to_string();
    let (mut fusion, mut decompositions, mut inplace) = (false, false, false);
    for flag in words {
        match flag {
            "fusion" => fusion = true,
            "decompositions" => decompositions = true,
            "inplace" => inplace = true,
            other => return Err(format!("unknown executor flag `{other}`")),
        }
    }
    let symbols = symbols.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
    Ok(Executor { name, fusion, decompositions, inplace, symbols })
}

fn read_directives(text: &str) -> Result<Golden, String> {
    let mut passes = None;
    let mut last = Last::Trace;
    let mut executors = Vec::new();
    let mut checks = Vec::new();
    for line in text.lines() {
        if let Some(executor) = line.strip_prefix("# executor:") {
            executors.push(read_executor(executor)?);
        } else if let Some(names) = line.strip_prefix("# pass:") {
            let names = match LAST.iter().find_map(|(n, l)| names.trim().strip_suffix(n).map(|rest| (rest, *l))) {
                Some((rest, l)) => {
                    last = l;
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
    if executors.is_empty() != matches!(last, Last::Trace | Last::Split) {
        return Err("`# executor:` lines go with a last pass of claim, partition or lifetimes".into());
    }
    Ok(Golden { passes, last, executors, checks })
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

/// The symbols of `bsyms` at every depth, each once, in order: what `*` claims.
fn all_symbols(bsyms: &[BoundSymbol], out: &mut Vec<Symbol>) {
    for bsym in bsyms {
        if !out.contains(&bsym.symbol) {
            out.push(bsym.symbol.clone());
        }
        all_symbols(&bsym.subsymbols, out);
    }
}

/// The executor tables the file declares, for `trace`.
fn executor_specs(executors: &[Executor], trace: &Trace) -> Result<Vec<ExecutorSpec>, String> {
    let mut every = Vec::new();
    all_symbols(&trace.bsyms, &mut every);
    let key = |name: &str| match name.contains('.') {
        true => SymbolTable::lookup(name).map(SymKey::Symbol).ok_or(format!("no symbol `{name}` in the trace")),
        false => PrimId::from_name(name).map(SymKey::Prim).ok_or(format!("no prim `{name}`")),
    };
    let short = |key: &SymKey| match key {
        SymKey::Prim(prim) => prim.name().to_string(),
        SymKey::Symbol(id) => SymbolTable::name(*id).rsplit('.').next().unwrap_or_default().to_string(),
    };
    let spec = |e: &Executor| -> Result<ExecutorSpec, String> {
        let keys: Vec<SymKey> = match e.symbols.as_slice() {
            [all] if all == "*" => every.iter().filter_map(SymKey::of).collect(),
            names => names.iter().map(|n| key(n)).collect::<Result<_, _>>()?,
        };
        let impls = keys.into_iter().map(|k| {
            let name = short(&k);
            let function = format!("{}_{name}", e.name);
            let callee = if e.inplace { Callee::with_methods(function, &name) } else { Callee::function(function) };
            (k, ImplSpec { callee, has_checker: false })
        });
        let (fusion, fuses_decompositions) = (e.fusion, e.decompositions);
        Ok(ExecutorSpec { name: e.name.clone(), impls: impls.collect(), fusion, fuses_decompositions })
    };
    executors.iter().map(spec).collect()
}

/// `# t2 <- fuser, else torch_exp`: who runs each top-level call of a claimed trace.
fn print_claims(trace: &Trace, assignments: &[Assignment], specs: &[ExecutorSpec]) -> String {
    let mut out = print_trace(trace, "computation");
    out.push_str("# claims:\n");
    for (bsym, a) in trace.bsyms.iter().zip(assignments) {
        let outputs: Vec<String> = bsym.outputs.iter().map(ToString::to_string).collect();
        let runs = match &a.fusion {
            Some((i, callee)) => format!("{} ({}), else {}", specs[*i].name, callee.function, a.callee.function),
            None => a.callee.function.to_string(),
        };
        writeln!(out, "#   {} {} <- {runs}", bsym.symbol.qualified_name(), outputs.join(", ")).unwrap();
    }
    out
}

/// Claims, partitions when a fusion executor is declared, and generates the code with each
/// value deleted after its last use, as the pipeline's execution stages do.
fn print_execution(trace: &Trace, specs: &[ExecutorSpec], last: Last) -> Result<String, String> {
    let (claimed, assignments) = claim(trace, specs, &mut |_, _| Ok(true)).map_err(|e| e.to_string())?;
    if last == Last::Claim {
        return Ok(print_claims(&claimed, &assignments, specs));
    }
    let names: Vec<&str> = specs.iter().map(|e| e.name.as_str()).collect();
    let Partition { trace, callees: mut impls, regions } = if specs.iter().any(|e| e.fusion) {
        partition(&claimed, &assignments, &names).map_err(|e| e.to_string())?
    } else {
        let callees = assignments.into_iter().map(|a| a.callee).collect();
        Partition { trace: claimed, callees, regions: Vec::new() }
    };
    if last == Last::Partition {
        return Ok(print_trace(&trace, "computation"));
    }
    let dels = del_last_used(&trace, 0);
    let exec = reuse_receivers(&trace, &mut impls, &dels, false);
    let plan = Plan::new(&exec, impls, dels, None, "computation", &regions, Vec::new());
    Ok(plan.regions.iter().fold(plan.source, |out, region| format!("{out}\n{}", region.source)))
}

fn printed_output(text: &str, golden: &Golden) -> Result<String, String> {
    let trace = parse_trace(text).map_err(|e| e.to_string())?;
    let cx = PassCx { verify: true, dump: Vec::new() };
    let (out, _) = run_passes(&trace, &golden.passes, &cx).map_err(|e| e.to_string())?;
    match golden.last {
        Last::Trace => Ok(print_trace(&out, "computation")),
        Last::Split => {
            let joint = passes::joint(&out).map_err(|e| e.to_string())?.ok_or("no output requires grad")?;
            let halves = passes::split(&joint, &[]).map_err(|e| e.to_string())?;
            let (forward, _) = run_passes(&halves.forward, &[("dce", dce)], &cx).map_err(|e| e.to_string())?;
            let (backward, _) =
                run_passes(&halves.backward, &[("dce", dce), ("cse", cse)], &cx).map_err(|e| e.to_string())?;
            Ok(format!("{}\n{}", print_trace(&forward, "forward"), print_trace(&backward, "backward")))
        }
        last => print_execution(&out, &executor_specs(&golden.executors, &out)?, last),
    }
}

/// The `# output:` line that starts a file's expected output.
const OUTPUT: &str = "# output:";

/// A file's text up to its `# output:` line included, and the expected output after it.
fn split_output(text: &str) -> Option<(&str, String)> {
    let at = text.lines().scan(0, |offset, line| {
        let start = *offset;
        *offset += line.len() + 1;
        Some((start, line))
    });
    let (start, _) = at.filter(|(_, line)| line.trim_end() == OUTPUT).last()?;
    let head = &text[..(start + OUTPUT.len() + 1).min(text.len())];
    let expected = text[head.len()..].lines().map(|l| l.strip_prefix("# | ").unwrap_or(l.trim_start_matches('#')));
    Some((head, expected.map(|l| format!("{l}\n")).collect()))
}

/// `output` as an expected-output block.
fn output_block(output: &str) -> String {
    output.lines().map(|l| if l.is_empty() { "#\n".to_string() } else { format!("# | {l}\n") }).collect()
}

/// The first line (counting from 0) where `got` and `want` differ, and its two texts.
fn first_difference<'a>(got: &'a str, want: &'a str) -> (usize, &'a str, &'a str) {
    let (got, want): (Vec<&str>, Vec<&str>) = (got.lines().collect(), want.lines().collect());
    let at = |lines: &[&'a str], i: usize| lines.get(i).copied().unwrap_or("<the end>");
    let line = (0..got.len().max(want.len())).find(|&i| at(&got, i) != at(&want, i)).unwrap_or(0);
    (line, at(&got, line), at(&want, line))
}

fn blessing() -> bool {
    std::env::var("THUNDER_RS_BLESS").is_ok_and(|v| v == "1")
}

fn run_golden(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let golden = read_directives(&text)?;
    let printed = printed_output(&text, &golden)?;
    if let Some((head, expected)) = split_output(&text) {
        if blessing() && expected != printed {
            let head = if head.ends_with('\n') { head.to_string() } else { format!("{head}\n") };
            std::fs::write(path, head + &output_block(&printed)).map_err(|e| e.to_string())?;
        } else if expected != printed {
            let (line, got, want) = first_difference(&printed, &expected);
            return Err(format!(
                "the output differs from the file's `# output:` block (THUNDER_RS_BLESS=1 accepts it) at its \
                 line {}: `{got}`, expected `{want}`; the output:\n{printed}",
                line + 1
            ));
        }
    }
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
    assert!(
        read_directives("# pass: cse,split\n# check: x\n").is_ok_and(|g| g.last == Last::Split && g.passes.len() == 1)
    );
    let claim = "# pass: dce,claim\n# executor: fuser fusion: exp\n# executor: torch: *\n# check: x\n";
    assert!(read_directives(claim).is_ok_and(|g| g.last == Last::Claim && g.executors.len() == 2));
    assert!(read_directives("# pass: claim\n# check: x\n").is_err());
    assert!(read_directives("# pass: dce\n# executor: torch: *\n# check: x\n").is_err());
    assert!(read_directives("# pass: claim\n# executor: torch fast: *\n# check: x\n").is_err());
}

#[test]
fn output_blocks_round_trip_through_blessing() {
    let output = "def f(t0):\n\n  return t0\n";
    let file = format!("# pass: dce\n# check: x\n{OUTPUT}\n{}", output_block(output));
    let (head, expected) = split_output(&file).unwrap();
    assert_eq!((head, expected.as_str()), ("# pass: dce\n# check: x\n# output:\n", output));
    assert_eq!(split_output("# pass: dce\n# output:").unwrap(), ("# pass: dce\n# output:", String::new()));
    assert!(split_output("# pass: dce\n").is_none());
}
