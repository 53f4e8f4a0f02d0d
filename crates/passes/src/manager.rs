//! The pass manager: the registry of named passes, and the [`Manager`] that runs every stage of a
//! compilation, times it, verifies its output (in debug builds, and when `THUNDER_RS_VERIFY=1`)
//! and keeps it for dumping.
//!
//! Nothing here prints: each [`PassRecord`] says whether `THUNDER_RS_DUMP` asked for it, and the
//! caller (Python's `logging`, in the bindings) shows it, so dumps can be captured.

use crate::plan::Plan;
use crate::rewrite::{rewrite, Rule};
use rustc_hash::FxHashMap;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Instant;
use trace_ir::verify::verify;
use trace_ir::{bail, Result, Trace};

/// A pass: a new trace computing what `trace` computes.
pub type PassFn = fn(&Trace, &PassCx) -> Result<Trace>;

/// A named pass.
pub type Pass = (&'static str, PassFn);

/// The stages of the compile pipeline that are not registered passes (see [`crate::pipeline`]).
pub const STAGES: &[&str] = &["acquired", "split", "claim", "fuse", "lifetimes"];

fn registry() -> &'static RwLock<FxHashMap<String, PassFn>> {
    static REGISTRY: OnceLock<RwLock<FxHashMap<String, PassFn>>> = OnceLock::new();
    REGISTRY
        .get_or_init(|| RwLock::new(crate::pipeline::BUILTIN_PASSES.iter().map(|&(n, f)| (n.to_string(), f)).collect()))
}

/// Registers `run` under `name`, so a `jit(fn, passes=[name])` runs it and `THUNDER_RS_DUMP`
/// can name it. Registering the same function again is a no-op; another function under a taken
/// name, or a pipeline stage's name, is an error.
pub fn register_pass(name: &str, run: PassFn) -> Result<()> {
    if name.is_empty() || STAGES.contains(&name) || name == "all" {
        bail!(Value, "register_pass", "name {name:?} is reserved for a pipeline stage (argument name)");
    }
    let mut passes = registry().write().expect("pass registry poisoned");
    match passes.get(name) {
        Some(existing) if *existing as usize != run as usize => {
            bail!(Value, "register_pass", "a different pass is already registered as {name:?} (argument name)")
        }
        _ => {
            passes.insert(name.to_string(), run);
            Ok(())
        }
    }
}

/// The pass registered as `name`.
pub fn lookup(name: &str) -> Result<PassFn> {
    match registry().read().expect("pass registry poisoned").get(name) {
        Some(run) => Ok(*run),
        None => bail!(Value, "passes", "no pass is registered as {name:?}; registered: {}", registered().join(", ")),
    }
}

/// A pass that carries state, such as a pass a plugin loaded at run time (a plain [`PassFn`]
/// cannot hold the plugin's function table).
pub type DynPass = Arc<dyn Fn(&Trace, &PassCx) -> Result<Trace> + Send + Sync>;

fn dyn_registry() -> &'static RwLock<FxHashMap<String, DynPass>> {
    static REGISTRY: OnceLock<RwLock<FxHashMap<String, DynPass>>> = OnceLock::new();
    REGISTRY.get_or_init(|| RwLock::new(FxHashMap::default()))
}

/// Registers the stateful pass `run` under `name`, like [`register_pass`]; registering a name
/// again replaces the pass (reloading a plugin), but a name a [`PassFn`] holds is an error.
pub fn register_dyn_pass(name: &str, run: DynPass) -> Result<()> {
    if name.is_empty() || STAGES.contains(&name) || name == "all" {
        bail!(Value, "register_pass", "name {name:?} is reserved for a pipeline stage (argument name)");
    }
    if registry().read().expect("pass registry poisoned").contains_key(name) {
        bail!(Value, "register_pass", "a different pass is already registered as {name:?} (argument name)");
    }
    dyn_registry().write().expect("pass registry poisoned").insert(name.to_string(), run);
    Ok(())
}

fn stage_registry() -> &'static RwLock<FxHashMap<String, String>> {
    static REGISTRY: OnceLock<RwLock<FxHashMap<String, String>>> = OnceLock::new();
    REGISTRY.get_or_init(|| RwLock::new(FxHashMap::default()))
}

/// Declares that the pass `name` runs at `stage` (`program`, `forward` or `backward`; see
/// [`crate::pipeline::compile`]) when a jit names it.
pub fn set_stage(name: &str, stage: &str) {
    stage_registry().write().expect("pass registry poisoned").insert(name.to_string(), stage.to_string());
}

/// The stage the pass `name` runs at when a jit names it: `program` unless declared otherwise.
pub fn stage_of(name: &str) -> String {
    stage_registry().read().expect("pass registry poisoned").get(name).cloned().unwrap_or_else(|| "program".into())
}

/// The pass registered as `name`, stateful or not.
fn lookup_any(name: &str) -> Result<DynPass> {
    if let Some(run) = dyn_registry().read().expect("pass registry poisoned").get(name) {
        return Ok(run.clone());
    }
    let run = lookup(name)?;
    Ok(Arc::new(run))
}

/// The registered passes' names, sorted.
pub fn registered() -> Vec<String> {
    let mut names: Vec<String> = registry().read().expect("pass registry poisoned").keys().cloned().collect();
    names.extend(dyn_registry().read().expect("pass registry poisoned").keys().cloned());
    names.sort();
    names
}

/// Settings shared by the stages of one compilation.
#[derive(Clone, Debug)]
pub struct PassCx {
    /// Verify the trace after every stage (always on in debug builds).
    pub verify: bool,
    /// Stages whose output is dumped (`all` for every one).
    pub dump: Vec<String>,
}

impl Default for PassCx {
    /// Verification as the build has it, no dumps; the environment is not read.
    fn default() -> Self {
        PassCx { verify: cfg!(debug_assertions), dump: Vec::new() }
    }
}

impl PassCx {
    /// Settings from `THUNDER_RS_VERIFY=1` and `THUNDER_RS_DUMP=name,name` (or `all`). A name
    /// that is neither a stage nor a registered pass is an error listing the known ones.
    pub fn from_env() -> Result<PassCx> {
        let verify = cfg!(debug_assertions) || std::env::var("THUNDER_RS_VERIFY").is_ok_and(|v| v == "1");
        let dump: Vec<String> = std::env::var("THUNDER_RS_DUMP")
            .map(|v| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
            .unwrap_or_default();
        let known = if dump.is_empty() { Vec::new() } else { registered() };
        if let Some(bad) = dump.iter().find(|d| *d != "all" && !STAGES.contains(&d.as_str()) && !known.contains(d)) {
            let mut names: Vec<&str> = STAGES.iter().copied().chain(known.iter().map(String::as_str)).collect();
            names.sort();
            bail!(Value, "THUNDER_RS_DUMP", "unknown stage {bad:?}; known: all, {}", names.join(", "));
        }
        Ok(PassCx { verify, dump })
    }

    fn dumps(&self, name: &str) -> bool {
        self.dump.iter().any(|d| d == name || d == "all")
    }
}

/// One stage's result: its output, how long it took, and whether it is to be dumped.
#[derive(Clone, Debug)]
pub struct PassRecord {
    pub name: String,
    pub seconds: f64,
    pub trace: Trace,
    /// For an execution trace: how to run it, and its generated source.
    pub plan: Option<Arc<Plan>>,
    pub dump: bool,
    /// What the stage reports besides its trace (which rewrite rules fired), shown in its dump.
    pub note: String,
}

/// Runs the stages of one compilation and keeps a record of each.
pub struct Manager<'a> {
    cx: &'a PassCx,
    pub records: Vec<PassRecord>,
}

impl<'a> Manager<'a> {
    pub fn new(cx: &'a PassCx) -> Self {
        Manager { cx, records: Vec::new() }
    }

    /// Runs the stage `name`, which returns a trace and anything else; times it, verifies the
    /// trace and records it.
    pub fn stage<T>(&mut self, name: &str, run: impl FnOnce() -> Result<(Trace, T)>) -> Result<(Trace, T)> {
        let start = Instant::now();
        let (trace, extra) = run()?;
        let seconds = start.elapsed().as_secs_f64();
        if self.cx.verify {
            verify(&trace).map_err(|mut e| {
                e.message = format!("after pass {name}: {}", e.message);
                e
            })?;
        }
        let dump = self.cx.dumps(name);
        self.records.push(PassRecord {
            name: name.to_string(),
            seconds,
            trace: trace.clone(),
            plan: None,
            dump,
            note: String::new(),
        });
        Ok((trace, extra))
    }

    /// Runs the pass `run` as the stage `name`.
    pub fn pass(&mut self, name: &str, run: PassFn, trace: &Trace) -> Result<Trace> {
        let cx = self.cx;
        Ok(self.stage(name, || Ok((run(trace, cx)?, ())))?.0)
    }

    /// Applies the rewrite rule set `rules` as the stage `name`; its record notes which rules
    /// fired and how often.
    pub fn rewrite(&mut self, name: &str, rules: &[Rule], trace: &Trace) -> Result<Trace> {
        let cx = self.cx;
        let (out, report) = self.stage(name, || rewrite(trace, rules, cx))?;
        if let Some(last) = self.records.last_mut() {
            last.note = report.to_string();
        }
        Ok(out)
    }

    /// Runs the registered passes `names` in order.
    pub fn passes(&mut self, names: &[&str], trace: &Trace) -> Result<Trace> {
        let mut current = trace.clone();
        for name in names {
            let run = lookup_any(name)?;
            let cx = self.cx;
            current = self.stage(name, || Ok((run(&current, cx)?, ())))?.0;
        }
        Ok(current)
    }

    /// Attaches `plan` to the last record (the stage that produced the execution trace).
    pub fn attach_plan(&mut self, plan: Plan) {
        if let Some(last) = self.records.last_mut() {
            last.plan = Some(Arc::new(plan));
        }
    }
}

/// Runs `passes` in order from `trace`, returning the final trace and a record per pass.
pub fn run_passes(trace: &Trace, passes: &[Pass], cx: &PassCx) -> Result<(Trace, Vec<PassRecord>)> {
    let mut manager = Manager::new(cx);
    let mut current = trace.clone();
    for (name, run) in passes {
        current = manager.pass(name, *run, &current)?;
    }
    Ok((current, manager.records))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(trace: &Trace, _cx: &PassCx) -> Result<Trace> {
        Ok(trace.clone())
    }

    fn other(trace: &Trace, _cx: &PassCx) -> Result<Trace> {
        Ok(trace.clone())
    }

    #[test]
    fn registers_and_looks_up_passes() {
        register_pass("test_identity", identity).unwrap();
        register_pass("test_identity", identity).unwrap();
        assert!(registered().contains(&"test_identity".to_string()));
        assert!(lookup("test_identity").is_ok());
        let err = register_pass("test_identity", other).unwrap_err();
        assert!(err.message.contains("already registered"), "{err}");
        let err = register_pass("claim", identity).unwrap_err();
        assert!(err.message.contains("reserved"), "{err}");
        let err = lookup("no_such_pass").unwrap_err();
        assert!(err.message.contains("dce") && err.message.contains("cse"), "{err}");
    }
}
