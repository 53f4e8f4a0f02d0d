//! The pass manager: the registry of named passes, and the [`Manager`] that runs the pipeline's
//! table ([`crate::pipeline::PIPELINE`]): it times each stage, verifies its output (in debug
//! builds, and when `THUNDER_RS_VERIFY=1`) and keeps it for dumping.
//!
//! Nothing here prints: each [`PassRecord`] says whether `THUNDER_RS_DUMP` asked for it, and the
//! caller (Python's `logging`, in the bindings) shows it, so dumps can be captured.

use crate::pipeline::{ClaimChecker, Half, Options, Output, PassCx, Run, Stage, Unit, PIPELINE};
use crate::plan::Plan;
use crate::rewrite::{check, rewrite, RewriteRule};
use crate::{cse::cse, dce::dce, views, vjp::vjp};
use rustc_hash::FxHashMap;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Instant;
use trace_ir::verify::verify;
use trace_ir::{bail, Result, Trace};

/// A pass: a new trace computing what `trace` computes.
pub type PassFn = fn(&Trace, &PassCx) -> Result<Trace>;

/// A named pass.
pub type Pass = (&'static str, PassFn);

/// The passes registered in every process.
pub const BUILTIN_PASSES: &[Pass] = &[("dce", dce), ("cse", cse), ("vjp", vjp), ("views", views::views)];

fn registry() -> &'static RwLock<FxHashMap<String, PassFn>> {
    static REGISTRY: OnceLock<RwLock<FxHashMap<String, PassFn>>> = OnceLock::new();
    REGISTRY.get_or_init(|| RwLock::new(BUILTIN_PASSES.iter().map(|&(n, f)| (n.to_string(), f)).collect()))
}

/// Refuses `name` when it names a pipeline stage that is no registered pass (`claim`), or is
/// `all`: a jit and `THUNDER_RS_DUMP` could not tell the two apart.
fn check_name(name: &str, passes: &FxHashMap<String, PassFn>) -> Result<()> {
    if name.is_empty() || name == "all" || (crate::pipeline::is_stage(name) && !passes.contains_key(name)) {
        bail!(Value, "register_pass", "name {name:?} is reserved for a pipeline stage (argument name)");
    }
    Ok(())
}

/// Registers `run` under `name`, so a `jit(fn, passes=[name])` runs it and `THUNDER_RS_DUMP`
/// can name it. Registering the same function again is a no-op; another function under a taken
/// name, or a pipeline stage's name, is an error.
///
/// ```
/// use passes::{register_pass, PassCx};
/// use trace_ir::{Result, Trace};
///
/// /// Moves nothing: the identity, which a plugin's pass-through stage starts from.
/// fn pass_through(trace: &Trace, _cx: &PassCx) -> Result<Trace> {
///     Ok(trace.clone())
/// }
/// register_pass("pass_through", pass_through)?;
/// register_pass("pass_through", pass_through)?; // the same function again: a no-op
/// assert!(passes::registered().contains(&"pass_through".to_string()));
/// assert!(register_pass("dce", pass_through).is_err()); // a built-in's name is taken
/// assert!(register_pass("lifetimes", pass_through).is_err()); // a stage's name is reserved
/// # Ok::<(), trace_ir::IrError>(())
/// ```
pub fn register_pass(name: &str, run: PassFn) -> Result<()> {
    let mut passes = registry().write().expect("pass registry poisoned");
    check_name(name, &passes)?;
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

/// A registered stage of a jit's own: a stateful pass, or a rule set whose output notes which
/// rules fired.
pub(crate) type DynStage = Arc<dyn Fn(&Trace, &PassCx) -> Result<Output> + Send + Sync>;

fn dyn_registry() -> &'static RwLock<FxHashMap<String, DynStage>> {
    static REGISTRY: OnceLock<RwLock<FxHashMap<String, DynStage>>> = OnceLock::new();
    REGISTRY.get_or_init(|| RwLock::new(FxHashMap::default()))
}

/// Registers the stateful pass `run` under `name`, like [`register_pass`]; registering a name
/// again replaces the pass (reloading a plugin), but a name a [`PassFn`] holds is an error.
pub fn register_dyn_pass(name: &str, run: DynPass) -> Result<()> {
    register_dyn_stage(name, Arc::new(move |trace, cx| run(trace, cx).map(Output::from)))
}

fn register_dyn_stage(name: &str, run: DynStage) -> Result<()> {
    let passes = registry().read().expect("pass registry poisoned");
    check_name(name, &passes)?;
    if passes.contains_key(name) {
        bail!(Value, "register_pass", "a different pass is already registered as {name:?} (argument name)");
    }
    dyn_registry().write().expect("pass registry poisoned").insert(name.to_string(), run);
    Ok(())
}

/// Registers the rewrite rule set `rules` (compiled-in [`crate::rewrite::Rule`]s, or rules
/// given as data) as the pass `name` (see [`register_dyn_pass`]), once every prim its patterns
/// name is known: a misspelt prim would never match, and nothing would say so. The error names
/// the rule set, the rule and the name. The stage's record notes which rules fired, and its
/// output is always verified, as a plugin's is: the rules are the user's.
///
/// ```
/// use passes::rewrite::{any, call, Replacement, Rule};
///
/// /// neg(neg(x)) -> x
/// const NEG_NEG: Rule = Rule {
///     name: "neg-neg",
///     pattern: || call("neg", [call("neg", [any("x")])]),
///     rewrite: |m| m.value("x").map(Replacement::Value),
/// };
/// passes::register_rules("fold_negations", &[NEG_NEG])?;
///
/// /// A misspelt prim is refused at registration, naming the rule.
/// const TYPO: Rule = Rule { name: "typo", pattern: || call("nge", [any("x")]), rewrite: |_| None };
/// let error = passes::register_rules("typos", &[TYPO]).unwrap_err();
/// assert!(error.message.contains("typo"), "{error}");
/// # Ok::<(), trace_ir::IrError>(())
/// ```
pub fn register_rules<R, S>(name: &str, rules: S) -> Result<()>
where
    R: RewriteRule,
    S: AsRef<[R]> + Send + Sync + 'static,
{
    check(rules.as_ref()).map_err(|mut e| {
        e.message = format!("rule set {name:?}: {}", e.message);
        e
    })?;
    register_dyn_stage(
        name,
        Arc::new(move |trace, cx| {
            let (trace, report) = rewrite(trace, rules.as_ref(), cx)?;
            if !cx.verify {
                verify(&trace)?;
            }
            Ok(Output { note: report.to_string(), ..trace.into() })
        }),
    )
}

fn stage_registry() -> &'static RwLock<FxHashMap<String, String>> {
    static REGISTRY: OnceLock<RwLock<FxHashMap<String, String>>> = OnceLock::new();
    REGISTRY.get_or_init(|| RwLock::new(FxHashMap::default()))
}

/// Declares that the pass `name` runs at `stage` (`program`, `forward` or `backward`: the half
/// whose `jit passes` row runs it, see [`crate::pipeline::PIPELINE`]) when a jit names it.
pub fn set_stage(name: &str, stage: &str) {
    stage_registry().write().expect("pass registry poisoned").insert(name.to_string(), stage.to_string());
}

/// The stage the pass `name` runs at when a jit names it: `program` unless declared otherwise.
pub fn stage_of(name: &str) -> String {
    stage_registry().read().expect("pass registry poisoned").get(name).cloned().unwrap_or_else(|| "program".into())
}

/// The pass registered as `name`, stateful or not.
pub(crate) fn lookup_any(name: &str) -> Result<DynStage> {
    if let Some(run) = dyn_registry().read().expect("pass registry poisoned").get(name) {
        return Ok(run.clone());
    }
    let run = lookup(name)?;
    Ok(Arc::new(move |trace, cx| run(trace, cx).map(Output::from)))
}

/// The registered passes' names, sorted.
pub fn registered() -> Vec<String> {
    let mut names: Vec<String> = registry().read().expect("pass registry poisoned").keys().cloned().collect();
    names.extend(dyn_registry().read().expect("pass registry poisoned").keys().cloned());
    names.sort();
    names
}

// The settings type lives with the pipeline, whose stages take it; reading them from the
// environment is the manager's, which owns dumps and verification and knows the registered names.
impl PassCx {
    /// Settings from `THUNDER_RS_VERIFY=1` and `THUNDER_RS_DUMP=name,name` (or `all`). A name
    /// that is neither a stage nor a registered pass is an error listing the known ones.
    pub fn from_env() -> Result<PassCx> {
        let verify = cfg!(debug_assertions) || std::env::var("THUNDER_RS_VERIFY").is_ok_and(|v| v == "1");
        let dump: Vec<String> = std::env::var("THUNDER_RS_DUMP")
            .map(|v| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
            .unwrap_or_default();
        let known = if dump.is_empty() { Vec::new() } else { registered() };
        let is_known = |d: &str| d == "all" || crate::pipeline::is_stage(d) || known.iter().any(|k| k == d);
        if let Some(bad) = dump.iter().find(|d| !is_known(d)) {
            let stages = PIPELINE.iter().filter(|s| !matches!(s.run, Run::JitPasses)).map(|s| s.name);
            let mut names: Vec<&str> = stages.chain(known.iter().map(String::as_str)).collect();
            names.sort();
            names.dedup();
            bail!(Value, "THUNDER_RS_DUMP", "unknown stage {bad:?}; known: all, {}", names.join(", "));
        }
        Ok(PassCx { verify, dump })
    }
}

/// One stage's result: its output, how long it took, and whether it is to be dumped.
#[derive(Clone, Debug)]
pub struct PassRecord {
    /// The stage's name (`dce`, `claim`, a jit pass's registered name), as `THUNDER_RS_DUMP` names it.
    pub name: String,
    /// Wall time of the stage, verification excluded.
    pub seconds: f64,
    /// The stage's output, which the next stage of its half reads.
    pub trace: Trace,
    /// For an execution trace: how to run it, and its generated source.
    pub plan: Option<Arc<Plan>>,
    /// Whether `THUNDER_RS_DUMP` asked for this stage.
    pub dump: bool,
    /// What the stage reports besides its trace (which rewrite rules fired), shown in its dump.
    pub note: String,
}

/// What a compilation produced: every stage's record for the program (or forward) and, for a
/// program with differentiable outputs, for the backward; the last record of each carries the
/// execution plan.
pub struct Compiled {
    /// The records of the program half's stages and then the forward's, in order.
    pub forward: Vec<PassRecord>,
    /// The backward's records; empty when the program was not split.
    pub backward: Vec<PassRecord>,
    /// Positions of the flat outputs (a single output is position 0) that receive cotangents.
    pub grad_outputs: Vec<usize>,
    /// How many residuals the forward saves for the backward.
    pub residuals: usize,
}

/// Compiles an acquired trace: runs every row of [`PIPELINE`] whose half exists and whose
/// condition holds, in order, each as a stage of one [`Manager`].
///
/// `checker` is asked about each call whose executor entry has a checker; the error of any
/// stage (a pass's, a plugin's, the verifier's) ends the compilation and names the stage.
///
/// ```
/// use passes::{compile, ExecutorSpec, ImplSpec, Options, PassCx, SymKey};
/// use trace_ir::{parser::parse_trace, pysrc::Callee, PrimId};
///
/// // An executor that runs `exp` and `mul` by calling `torch_exp` and `torch_mul`.
/// let impls = ["exp", "mul"]
///     .map(|name| {
///         let callee = Callee::function(format!("torch_{name}"));
///         (SymKey::Prim(PrimId::from_name(name).unwrap()), ImplSpec { callee, has_checker: false })
///     })
///     .into_iter()
///     .collect();
/// let executors = [ExecutorSpec { name: "torch".into(), impls, ..Default::default() }];
/// let options = Options { executors: &executors, passes: &[], differentiable: false, absent_cotangents: &[], checkpoints: &[], recomputed: &[] };
///
/// let acquired = parse_trace(concat!(
///     "def computation(t0):\n",
///     "  # t0: \"cpu f32[4]\"\n",
///     "  t1 = prims.exp(t0)  # t1: \"cpu f32[4]\"\n",
///     "  t2 = prims.mul(t1, t0)  # t2: \"cpu f32[4]\"\n",
///     "  return t2\n",
/// ))?;
/// let compiled = compile(&acquired, &options, &mut |_, _, _| Ok(true), &PassCx::default())?;
/// // No input requires grad: one half, no backward.
/// assert!(compiled.backward.is_empty());
/// let stages: Vec<&str> = compiled.forward.iter().map(|r| r.name.as_str()).collect();
/// assert_eq!(stages, ["acquired", "dce", "cse", "views", "claim", "lifetimes"]);
/// let plan = compiled.forward.last().unwrap().plan.as_ref().unwrap();
/// assert!(plan.source.contains("torch_exp(t0)"), "{}", plan.source);
/// # Ok::<(), trace_ir::IrError>(())
/// ```
pub fn compile(acquired: &Trace, options: &Options, checker: &mut ClaimChecker, cx: &PassCx) -> Result<Compiled> {
    let mut unit = Unit::new(options, checker);
    let mut m = Manager::new(cx);
    // The backward half as the split made it, and the records before it once it begins.
    let (mut backward, mut forward) = (None, None);
    for stage in PIPELINE {
        if stage.half == Half::Backward && forward.is_none() {
            if backward.is_none() {
                continue; // no split, no backward half
            }
            forward = Some(std::mem::take(&mut m.records));
        }
        if stage.half == Half::Forward && !options.absent_cotangents.is_empty() {
            continue; // a backward-only compilation: the forward is the whole one's
        }
        unit.half = stage.half;
        let start = if forward.is_some() { backward.as_ref().unwrap_or(acquired) } else { acquired };
        if let Some(made) = m.run(stage, start, &mut unit)? {
            backward = Some(made);
        }
    }
    let (forward, backward) = match forward {
        Some(forward) => (forward, m.records),
        None => (m.records, Vec::new()),
    };
    Ok(Compiled { forward, backward, grad_outputs: unit.grad_outputs, residuals: unit.residuals.unwrap_or(0) })
}

/// Runs the stages of one compilation and keeps a record of each.
pub struct Manager<'a> {
    cx: &'a PassCx,
    /// A record per stage run so far, in order.
    pub records: Vec<PassRecord>,
}

impl<'a> Manager<'a> {
    /// A manager with no stages run yet, verifying and dumping as `cx` says.
    pub fn new(cx: &'a PassCx) -> Self {
        Manager { cx, records: Vec::new() }
    }

    /// The trace the next stage reads: the last record's, or `start` before the first.
    fn input<'t>(&'t self, start: &'t Trace) -> &'t Trace {
        self.records.last().map_or(start, |r| &r.trace)
    }

    /// Runs the pipeline row `stage` when its condition holds; returns the backward half when the
    /// stage split the program.
    fn run(&mut self, stage: &Stage, start: &Trace, unit: &mut Unit) -> Result<Option<Trace>> {
        if !unit.holds(stage.when, self.input(start)) {
            return Ok(None);
        }
        let cx = self.cx;
        match stage.run {
            Run::Pass(run) => self.stage(stage.name, start, |t| run(t, cx).map(Output::from)),
            Run::Rewrite(rules) => self.stage(stage.name, start, |t| {
                let (trace, report) = rewrite(t, rules, cx)?;
                Ok(Output { note: report.to_string(), ..trace.into() })
            }),
            Run::Stateful(run) => self.stage(stage.name, start, |t| run(t, unit, cx)),
            Run::JitPasses => {
                let half = stage.half.name();
                for name in unit.options().passes.iter().filter(|name| stage_of(name) == half) {
                    let run = lookup_any(name)?;
                    self.stage(name, start, |t| run(t, cx))?;
                }
                Ok(None)
            }
        }
    }

    /// Runs the stage `name` on the last record's trace (or `start`), timing only `run`;
    /// verifies what it made and records it. Returns the backward half it split off, if any.
    pub fn stage(
        &mut self,
        name: &str,
        start: &Trace,
        run: impl FnOnce(&Trace) -> Result<Output>,
    ) -> Result<Option<Trace>> {
        let started = Instant::now();
        let Output { trace, backward, note, plan } = run(self.input(start))?;
        let seconds = started.elapsed().as_secs_f64();
        if self.cx.verify {
            let halves = std::iter::once(("", &trace)).chain(backward.iter().map(|b| (" (backward)", b)));
            for (half, t) in halves {
                verify(t).map_err(|mut e| {
                    e.message = format!("after pass {name}{half}: {}", e.message);
                    e
                })?;
            }
        }
        let dump = self.cx.dumps(name);
        let plan = plan.map(Arc::new);
        self.records.push(PassRecord { name: name.to_string(), seconds, trace, plan, dump, note });
        Ok(backward)
    }
}

/// Runs `passes` in order from `trace`, returning the final trace and a record per pass.
pub fn run_passes(trace: &Trace, passes: &[Pass], cx: &PassCx) -> Result<(Trace, Vec<PassRecord>)> {
    let mut manager = Manager::new(cx);
    for (name, run) in passes {
        manager.stage(name, trace, |t| run(t, cx).map(Output::from))?;
    }
    let last = manager.records.last().map_or_else(|| trace.clone(), |r| r.trace.clone());
    Ok((last, manager.records))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(trace: &Trace, _cx: &PassCx) -> Result<Trace> {
        Ok(trace.clone())
    }

    /// Not `identity`'s body: a release build merges identical functions into one pointer.
    fn other(trace: &Trace, cx: &PassCx) -> Result<Trace> {
        crate::dce::dce(trace, cx)
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
