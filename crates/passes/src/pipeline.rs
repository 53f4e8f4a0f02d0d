//! The compile pipeline: every stage from the acquired trace to the execution traces, run
//! through the [`Manager`] (timed, verified, dumpable).
//!
//! Program: acquired → dce → cse → (the jit's own passes) → then, for a program with outputs
//! that require grad, vjp → split → dce on the forward. Each executed half then goes
//! views → claim → fuse (fusion regions, when a fusion executor is in the table) → lifetimes
//! (which also picks in-place forms for dying intermediates and generates the Python source). The backward first runs dce → cse.
//! A program compiled `differentiable` skips the VJP and the in-place forms (see [`crate::differentiable`]).

use crate::claim::{claim, ExecutorSpec};
use crate::lifetimes::del_last_used;
use crate::manager::{Manager, Pass, PassCx, PassRecord};
use crate::partition::{partition, Partition};
use crate::plan::Plan;
use crate::reuse::reuse_receivers;
use crate::{cse::cse, dce::dce, views, vjp::vjp};
use trace_ir::verify::verify;
use trace_ir::{Arg, BoundSymbol, Result, Trace};

/// The passes registered in every process.
pub const BUILTIN_PASSES: &[Pass] = &[("dce", dce), ("cse", cse), ("vjp", vjp), ("views", views::views)];

/// The passes run on the program before differentiation, before the jit's own.
const PROGRAM: &[&str] = &["dce", "cse"];
/// The passes run on the forward half after the split.
const FORWARD: &[&str] = &["dce"];
/// The passes run on the backward half after the split.
const BACKWARD: &[&str] = &["dce", "cse"];

/// The checker callback of claiming: `(executor index, trace, bound symbol) -> accepted`.
pub type ClaimChecker<'a> = dyn FnMut(usize, &Trace, &BoundSymbol) -> Result<bool> + 'a;

/// What a compilation produced: every stage's record for the program (or forward) and, for a
/// program with differentiable outputs, for the backward; the last record of each carries the
/// execution plan.
pub struct Compiled {
    pub forward: Vec<PassRecord>,
    pub backward: Vec<PassRecord>,
    /// Positions of the flat outputs (a single output is position 0) that receive cotangents.
    pub grad_outputs: Vec<usize>,
    /// How many residuals the forward saves for the backward.
    pub residuals: usize,
}

/// The executors and the jit's own passes one compilation uses.
pub struct Options<'a> {
    pub executors: &'a [ExecutorSpec],
    /// Registered passes run after the program's `dce` and `cse`.
    pub passes: &'a [String],
    /// Compile the program to run under torch's autograd (see [`crate::differentiable`]): no
    /// VJP, no in-place forms, and values the trace computed without grad detached.
    pub differentiable: bool,
}

/// Compiles an acquired trace.
pub fn compile(acquired: &Trace, options: &Options, checker: &mut ClaimChecker, cx: &PassCx) -> Result<Compiled> {
    let mut m = Manager::new(cx);
    m.stage("acquired", || verify(acquired).map(|()| (acquired.clone(), ())))?;
    let mut program = m.passes(PROGRAM, acquired)?;
    program = m.passes(&user_passes(options, "program"), &program)?;
    let joint = if options.differentiable { None } else { crate::vjp::joint(&program)? };
    let Some(joint) = joint else {
        // Without a split the program is the forward: a forward-stage pass runs on it.
        let program = m.passes(&user_passes(options, "forward"), &program)?;
        execution(&mut m, &program, options, checker, Half::Program)?;
        return Ok(Compiled { forward: m.records, backward: Vec::new(), grad_outputs: Vec::new(), residuals: 0 });
    };
    m.stage("vjp", || Ok((joint.trace.clone(), ())))?;
    let (forward, split) = m.stage("split", || crate::split::split(&joint).map(|s| (s.forward.clone(), s)))?;
    let forward = m.passes(FORWARD, &forward)?;
    let forward = m.passes(&user_passes(options, "forward"), &forward)?;
    execution(&mut m, &forward, options, checker, Half::Forward)?;
    let forward_records = std::mem::take(&mut m.records);

    let (backward, _) = m.stage("split", || Ok((split.backward.clone(), ())))?;
    let backward = m.passes(BACKWARD, &backward)?;
    let backward = m.passes(&user_passes(options, "backward"), &backward)?;
    execution(&mut m, &backward, options, checker, Half::Backward(split.residuals.len()))?;
    let grad_outputs = grad_output_positions(&program);
    Ok(Compiled { forward: forward_records, backward: m.records, grad_outputs, residuals: split.residuals.len() })
}

/// The jit's own passes that run at `stage` (see [`crate::manager::stage_of`]), in the jit's order.
fn user_passes<'a>(options: &'a Options, stage: &str) -> Vec<&'a str> {
    options.passes.iter().filter(|name| crate::manager::stage_of(name) == stage).map(String::as_str).collect()
}

/// Which executed half a trace is.
#[derive(Clone, Copy)]
enum Half {
    /// A program run as it is (no output requires grad, or grad mode is off), possibly with
    /// grad mode on.
    Program,
    /// The forward of a differentiated program, run inside an autograd function (grad off).
    Forward,
    /// The backward, taking its residuals packed (grad off).
    Backward(usize),
}

/// Folds views (see [`views`]), claims the trace for the executors, groups fusion executors'
/// symbols into regions (only when a fusion executor is in the table), then frees each value
/// after its last use and generates the code: the execution trace, whose record carries the plan.
fn execution(m: &mut Manager, trace: &Trace, options: &Options, checker: &mut ClaimChecker, half: Half) -> Result<()> {
    let (packed, name) = match half {
        Half::Backward(residuals) => (Some(residuals), "backward"),
        _ => (None, "computation"),
    };
    let folded = m.rewrite("views", views::RULES, trace)?;
    let trace = &folded;
    let (claimed, assignments) = m.stage("claim", || {
        let mut check = |i: usize, bsym: &BoundSymbol| checker(i, trace, bsym);
        claim(trace, options.executors, &mut check)
    })?;
    // Without a fusion executor there is nothing to partition, and no stage to pay for.
    let (fused, (impls, regions)) = if options.executors.iter().any(|e| e.fusion) {
        m.stage("fuse", || {
            let names: Vec<&str> = options.executors.iter().map(|e| e.name.as_str()).collect();
            let Partition { trace, callees, regions } = partition(&claimed, &assignments, &names)?;
            Ok((trace, (callees, regions)))
        })?
    } else {
        (claimed, (assignments.into_iter().map(|a| a.callee).collect(), Vec::new()))
    };
    let (exec, plan) = m.stage("lifetimes", || {
        let dels = del_last_used(&fused, packed.unwrap_or(0));
        let mut impls = impls;
        // Autograd saves values for its backward, which an in-place form would overwrite.
        let (exec, detached) = if options.differentiable {
            let detached = crate::differentiable::detached_outputs(&fused);
            (fused, detached)
        } else {
            (reuse_receivers(&fused, &mut impls, &dels), Vec::new())
        };
        let plan = Plan::new(&exec, impls, dels, packed, name, &regions, detached);
        Ok((exec, plan))
    })?;
    debug_assert_eq!(exec.bsyms.len(), plan.impls.len());
    m.attach_plan(plan);
    Ok(())
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
