//! The compile pipeline as one table: every stage from the acquired trace to the execution
//! traces, in order, with the half of the program it works on and when it runs. The
//! [`crate::manager`] runs the table (timing, verifying and recording each stage); nothing here
//! runs a stage itself.
//!
//! The program half runs first. A program with an output that requires grad is differentiated
//! (`vjp`) and split into a forward and a backward half; without a split the program is the
//! forward, and there is no backward half. Each executed half ends views → claim → fuse →
//! lifetimes, the last writing the execution trace and its plan. The jit's own passes (registered
//! or loaded from a plugin, each declaring the half it runs at) run at their half's `jit passes`
//! row. A program compiled `differentiable` skips the VJP and the in-place forms (see
//! [`crate::differentiable`]).

use crate::claim::{Assignment, ExecutorSpec};
use crate::differentiable::detached_outputs;
use crate::lifetimes::del_last_used;
use crate::materialized::drop_markers;
use crate::partition::{partition, Partition, RegionPlan};
use crate::plan::Plan;
use crate::reentrant::Checkpoint;
use crate::reinplace::reinplace_slice_writes;
use crate::reuse::reuse_receivers;
use crate::rewrite::Rule;
use crate::vjp::{differentiable_outputs, Joint};
use crate::{
    cse::{cse, cse_undifferentiated},
    dce::dce,
    views,
};
use std::ops::Range;
use trace_ir::pysrc::Callee;
use trace_ir::verify::verify;
use trace_ir::{bail, Arg, BoundSymbol, Result, Trace};

/// The part of the program a stage works on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Half {
    /// The program as acquired, before any split.
    Program,
    /// The forward of a split program, or the program itself when it is not split.
    Forward,
    /// The backward of a split program.
    Backward,
}

impl Half {
    /// The half's name, which is also the stage a plugin pass declares (`plugin_abi::PLUGIN_STAGES`).
    pub fn name(self) -> &'static str {
        match self {
            Half::Program => "program",
            Half::Forward => "forward",
            Half::Backward => "backward",
        }
    }
}

/// When a stage runs, beyond its half being compiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// Whenever the half is compiled.
    Always,
    /// The program has an output that requires grad and is not compiled `differentiable`.
    GradOutputs,
    /// `vjp` has made the joint trace.
    Joint,
    /// `split` has split the program.
    Split,
    /// A fusion executor is among the jit's executors (else there is nothing to group).
    Fusing,
}

impl When {
    /// The condition in words, for the printed table.
    pub fn says(self) -> &'static str {
        match self {
            When::Always => "always",
            When::GradOutputs => "an output requires grad (not `differentiable`)",
            When::Joint => "after vjp",
            When::Split => "after split",
            When::Fusing => "a fusion executor is in the table",
        }
    }
}

/// What a stage does with the trace of its half.
#[derive(Clone, Copy)]
pub enum Run {
    /// A pass: a new trace computing what the trace computes.
    Pass(fn(&Trace, &PassCx) -> Result<Trace>),
    /// A rewrite rule set applied in one sweep; the record notes which rules fired.
    Rewrite(&'static [Rule]),
    /// A stage that also reads or leaves state for the stages after it (see [`Unit`]).
    Stateful(fn(&Trace, &mut Unit, &PassCx) -> Result<Output>),
    /// The jit's own passes declared at this half, in the jit's order, each a stage of its own.
    JitPasses,
}

/// One row of the pipeline.
#[derive(Clone, Copy)]
pub struct Stage {
    /// The stage's name: what `THUNDER_RS_DUMP` and the records call it.
    pub name: &'static str,
    /// The half whose trace it reads and writes.
    pub half: Half,
    /// Its condition, beyond its half existing.
    pub when: When,
    /// What it does to the trace.
    pub run: Run,
    /// What the stage does, in a few words, for the printed table.
    pub what: &'static str,
}

const fn stage(name: &'static str, half: Half, when: When, run: Run, what: &'static str) -> Stage {
    Stage { name, half, when, run, what }
}

use Half::{Backward, Forward, Program};
use Run::{JitPasses, Pass, Rewrite, Stateful};

/// Every stage of a compilation, in the order the manager runs them. Rows are grouped by half:
/// program, then forward, then backward.
pub const PIPELINE: &[Stage] = &[
    stage("acquired", Program, When::Always, Stateful(acquired), "verifies the acquired trace"),
    stage("dce", Program, When::Always, Pass(dce), "removes unused calls"),
    stage("cse", Program, When::Always, Pass(cse_undifferentiated), "merges repeated calls no gradient flows through"),
    stage("jit passes", Program, When::Always, JitPasses, "the jit's passes declared at `program`"),
    stage("vjp", Program, When::GradOutputs, Stateful(vjp), "builds the joint forward and backward trace"),
    stage("split", Program, When::Joint, Stateful(split), "splits it into halves, choosing residuals"),
    stage("dce", Forward, When::Split, Pass(dce), "removes unused calls"),
    stage("cse", Forward, When::Split, Pass(cse), "merges repeated calls"),
    stage("jit passes", Forward, When::Always, JitPasses, "the jit's passes declared at `forward`"),
    stage("views", Forward, When::Always, Rewrite(views::RULES), "folds chains of views"),
    stage("claim", Forward, When::Always, Stateful(claim), "assigns each call an executor"),
    stage("fuse", Forward, When::Fusing, Stateful(fuse), "groups fusion executors' calls into regions"),
    stage("lifetimes", Forward, When::Always, Stateful(lifetimes), "frees values, picks in-place forms, writes code"),
    stage("dce", Backward, When::Always, Pass(dce), "removes unused calls"),
    stage("materialized", Backward, When::Always, Pass(drop_markers), "drops Functions' unneeded cotangent markers"),
    stage("cse", Backward, When::Always, Pass(cse), "merges repeated calls"),
    stage("jit passes", Backward, When::Always, JitPasses, "the jit's passes declared at `backward`"),
    stage("views", Backward, When::Always, Rewrite(views::RULES), "folds chains of views"),
    stage("claim", Backward, When::Always, Stateful(claim), "assigns each call an executor"),
    stage("fuse", Backward, When::Fusing, Stateful(fuse), "groups fusion executors' calls into regions"),
    stage("lifetimes", Backward, When::Always, Stateful(lifetimes), "frees values, picks in-place forms, writes code"),
];

/// The pipeline printed as a Markdown table (README.md's "The pipeline's stages" lists it).
pub fn table() -> String {
    let mut out = String::from("| stage | half | when | what |\n| --- | --- | --- | --- |\n");
    for s in PIPELINE {
        let name = if matches!(s.run, JitPasses) { s.name.to_string() } else { format!("`{}`", s.name) };
        out += &format!("| {name} | {} | {} | {} |\n", s.half.name(), s.when.says(), s.what);
    }
    out
}

/// The halves a jit's own pass may declare (a plugin's `stage`): those with a `jit passes` row.
pub fn jit_pass_halves() -> Vec<&'static str> {
    PIPELINE.iter().filter(|s| matches!(s.run, JitPasses)).map(|s| s.half.name()).collect()
}

/// Whether `name` names a stage of the pipeline (a jit-passes row names none).
pub fn is_stage(name: &str) -> bool {
    PIPELINE.iter().any(|s| s.name == name && !matches!(s.run, JitPasses))
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
    /// Whether the stage `name`'s output is dumped.
    pub fn dumps(&self, name: &str) -> bool {
        self.dump.iter().any(|d| d == name || d == "all")
    }
}

/// The checker callback of claiming: `(executor index, trace, bound symbol) -> accepted`.
pub type ClaimChecker<'a> = dyn FnMut(usize, &Trace, &BoundSymbol) -> Result<bool> + 'a;

/// The executors and the jit's own passes one compilation uses.
pub struct Options<'a> {
    /// The executors' tables in priority order (the torch executor last), as sent from Python.
    pub executors: &'a [ExecutorSpec],
    /// Registered passes, each run at the half it declares (`program` unless declared otherwise).
    pub passes: &'a [String],
    /// Compile the program to run under torch's autograd (see [`crate::differentiable`]): no
    /// VJP, no in-place forms, and values the trace computed without grad detached.
    pub differentiable: bool,
    /// Compile only the backward, for a call whose backward reaches only some of its outputs:
    /// the indices (among the cotangents, in grad output order) of those it does not reach, from
    /// which no gradient flows (see [`crate::vjp::joint_without`], [`crate::split::backward_from`]
    /// and [`crate::absent`]). Empty for a whole compilation.
    pub absent_cotangents: &'a [usize],
    /// The reentrant activation checkpoints the program ran, whose gradients the VJP pass sums
    /// apart as eager does (see [`crate::reentrant`]).
    pub checkpoints: &'a [Checkpoint],
    /// The non-reentrant activation checkpoints the program ran (the ids of the values recorded
    /// while each function ran), whose calls the backward runs again instead of saving what they
    /// define (see [`crate::split`]).
    pub recomputed: &'a [Range<usize>],
}

/// What a stage made: the trace the next stage of its half reads (and its record keeps).
pub struct Output {
    /// The trace the stage made.
    pub trace: Trace,
    /// The backward half, from the stage that splits the program.
    pub backward: Option<Trace>,
    /// What the stage reports besides its trace (which rewrite rules fired), shown in its dump.
    pub note: String,
    /// For an execution trace: how to run it, and its generated source.
    pub plan: Option<Plan>,
}

impl From<Trace> for Output {
    fn from(trace: Trace) -> Output {
        Output { trace, backward: None, note: String::new(), plan: None }
    }
}

/// What claiming decided for the calls of the half being compiled, as later stages leave it.
#[derive(Default)]
enum Claims {
    #[default]
    None,
    Assigned(Vec<Assignment>),
    Fused {
        callees: Vec<Callee>,
        regions: Vec<RegionPlan>,
    },
}

/// What the stages of one compilation share besides the trace: the options, and what a stage
/// leaves for later ones (the joint trace for `split`, claims for `fuse` and `lifetimes`).
pub struct Unit<'a> {
    options: &'a Options<'a>,
    checker: &'a mut ClaimChecker<'a>,
    /// The half being compiled (the manager sets it).
    pub(crate) half: Half,
    joint: Option<Joint>,
    /// For a backward compiled alone (`Options::absent_cotangents`): the joint trace without the
    /// absent cotangents' flow, whose backward `split` takes.
    partial: Option<Joint>,
    claims: Claims,
    /// Positions of the flat outputs (a single output is position 0) that receive cotangents.
    pub(crate) grad_outputs: Vec<usize>,
    /// How many residuals the forward saves for the backward, once split.
    pub(crate) residuals: Option<usize>,
}

impl<'a> Unit<'a> {
    pub(crate) fn new(options: &'a Options<'a>, checker: &'a mut ClaimChecker<'a>) -> Self {
        let (joint, partial, claims) = (None, None, Claims::None);
        Unit { options, checker, half: Program, joint, partial, claims, grad_outputs: Vec::new(), residuals: None }
    }

    /// The compilation's executors and passes.
    pub(crate) fn options(&self) -> &Options<'a> {
        self.options
    }

    /// Whether `when` holds with `trace` the trace of the half being compiled.
    pub(crate) fn holds(&self, when: When, trace: &Trace) -> bool {
        match when {
            When::Always => true,
            When::GradOutputs => !self.options.differentiable && !differentiable_outputs(trace).is_empty(),
            When::Joint => self.joint.is_some(),
            When::Split => self.residuals.is_some(),
            When::Fusing => self.options.executors.iter().any(|e| e.fusion),
        }
    }
}

/// Verifies the acquired trace, whatever the build (the recorder's output is checked once).
fn acquired(trace: &Trace, _unit: &mut Unit, _cx: &PassCx) -> Result<Output> {
    verify(trace)?;
    Ok(trace.clone().into())
}

/// The joint forward and backward trace (see [`crate::vjp`]).
fn vjp(trace: &Trace, unit: &mut Unit, _cx: &PassCx) -> Result<Output> {
    let Some(joint) = crate::vjp::joint_checkpointed(trace, unit.options.checkpoints)? else {
        bail!(Runtime, "vjp", "the program has no output that requires grad");
    };
    unit.grad_outputs = grad_output_positions(trace);
    let absent = unit.options.absent_cotangents;
    if !absent.is_empty() {
        unit.partial = crate::vjp::joint_with(trace, absent, unit.options.checkpoints)?;
    }
    let out = joint.trace.clone();
    unit.joint = Some(joint);
    Ok(out.into())
}

/// The forward half (the record's trace) and the backward half of the joint trace. For a
/// backward compiled alone with absent cotangents: the backward of the joint trace without their
/// flow (`vjp::joint_without`), from the residuals the whole forward saves; where it needs a value
/// they cannot give, the whole backward pruned of what only they reach (`absent`).
fn split(_trace: &Trace, unit: &mut Unit, _cx: &PassCx) -> Result<Output> {
    let Some(joint) = unit.joint.take() else { bail!(Runtime, "split", "runs after vjp") };
    let mut halves = crate::split::split(&joint, unit.options.recomputed)?;
    let absent = unit.options.absent_cotangents;
    if !absent.is_empty() {
        let partial = match unit.partial.take() {
            Some(partial) => crate::split::backward_from(&partial, &halves.residuals, unit.options.recomputed)?,
            None => None,
        };
        let pruned = || crate::absent::without_cotangents(&halves.backward, joint.num_cotangents, absent);
        let Some(backward) = partial.or_else(pruned) else {
            bail!(NotImplemented, "split", "an absent cotangent meets a present gradient other than in an add")
        };
        halves.backward = backward;
    }
    unit.residuals = Some(halves.residuals.len());
    Ok(Output { backward: Some(halves.backward), ..halves.forward.into() })
}

/// Claims each call for the executors (see [`crate::claim`]).
fn claim(trace: &Trace, unit: &mut Unit, _cx: &PassCx) -> Result<Output> {
    let checker = &mut *unit.checker;
    let mut check = |i: usize, bsym: &BoundSymbol| checker(i, trace, bsym);
    let (claimed, assignments) = crate::claim::claim(trace, unit.options.executors, &mut check)?;
    unit.claims = Claims::Assigned(assignments);
    Ok(claimed.into())
}

/// Groups the fusion executors' claims into regions (see [`crate::partition`]).
fn fuse(trace: &Trace, unit: &mut Unit, _cx: &PassCx) -> Result<Output> {
    let Claims::Assigned(assignments) = std::mem::take(&mut unit.claims) else {
        bail!(Runtime, "fuse", "runs after claim")
    };
    let names: Vec<&str> = unit.options.executors.iter().map(|e| e.name.as_str()).collect();
    let Partition { trace, callees, regions } = partition(trace, &assignments, &names)?;
    unit.claims = Claims::Fused { callees, regions };
    Ok(trace.into())
}

/// Frees each value after its last use, picks in-place forms for dying intermediates and
/// generates the code: the execution trace, with its plan.
fn lifetimes(trace: &Trace, unit: &mut Unit, _cx: &PassCx) -> Result<Output> {
    let (mut callees, mut regions) = match std::mem::take(&mut unit.claims) {
        Claims::Assigned(assignments) => (assignments.into_iter().map(|a| a.callee).collect(), Vec::new()),
        Claims::Fused { callees, regions } => (callees, regions),
        Claims::None => bail!(Runtime, "lifetimes", "runs after claim"),
    };
    let (packed, name) = match unit.half {
        Backward => (Some(unit.residuals.unwrap_or(0)), "backward"),
        _ => (None, "computation"),
    };
    // Autograd saves values for its backward, which an in-place form would overwrite.
    let (exec, detached) = if unit.options.differentiable {
        (trace.clone(), detached_outputs(trace))
    } else {
        (reinplace_slice_writes(trace, &mut callees, &mut regions), Vec::new())
    };
    let dels = del_last_used(&exec, packed.unwrap_or(0));
    let saves = matches!(unit.half, Forward) && unit.residuals.is_some();
    let exec = if unit.options.differentiable { exec } else { reuse_receivers(&exec, &mut callees, &dels, saves) };
    let plan = Plan::new(&exec, callees, dels, packed, name, &regions, detached);
    debug_assert_eq!(exec.bsyms.len(), plan.impls.len());
    Ok(Output { plan: Some(plan), ..exec.into() })
}

/// Positions of the flat outputs (a single output is position 0) that receive cotangents.
fn grad_output_positions(trace: &Trace) -> Vec<usize> {
    let items = match &trace.outputs {
        Arg::Tuple(items) | Arg::List(items) => items.as_slice(),
        single => std::slice::from_ref(single),
    };
    let differentiable = |a: &Arg| a.as_value().and_then(|v| trace.tensor(v)).is_some_and(|t| t.requires_grad);
    items.iter().enumerate().filter(|(_, a)| differentiable(a)).map(|(i, _)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_grouped_by_half() {
        let order = |h: Half| [Program, Forward, Backward].iter().position(|x| *x == h);
        assert!(PIPELINE.windows(2).all(|w| order(w[0].half) <= order(w[1].half)));
    }

    /// The stages `plugin_abi::PLUGIN_STAGES` documents to plugin authors.
    #[test]
    fn every_half_runs_jit_passes() {
        assert_eq!(jit_pass_halves(), ["program", "forward", "backward"]);
    }

    #[test]
    fn every_rewrite_row_names_known_prims() {
        for s in PIPELINE {
            if let Rewrite(rules) = s.run {
                crate::rewrite::check(rules).unwrap();
            }
        }
    }

    /// README.md lists the stages as [`table`] prints them; a change to the table is a change
    /// to what users read.
    #[test]
    fn the_readme_lists_the_table() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
        let table = table();
        assert!(readme.contains(&table), "README.md's stage table is not pipeline::table(); it prints:\n{table}");
    }
}
