//! Reentrant activation checkpoints in the backward: eager sums each region's gradients apart.
//!
//! `torch.utils.checkpoint(fn, *inputs, use_reentrant=True)` runs `fn` inside an autograd
//! Function whose backward runs `fn` again on detached inputs and calls `torch.autograd.backward`
//! on what it returned: a backward of its own. So eager sums the gradients within the region
//! first: each input's gradient is the region's total, which the outer backward then adds to the
//! input's other gradients, and each parameter the region reads gets the region's total added to
//! its `.grad` when that inner backward ends (the outer backward adds its own total once it has
//! differentiated its last use of the parameter). The trace holds the region's calls inline; the
//! VJP pass sums as eager does, from each region's extent (the values its function defined: the
//! recorder numbers values in order) and the tensors passed to it. A parameter given several
//! totals gets them all, in eager's order, which the runtime adds to its `.grad` one by one (a
//! `.grad` from an earlier backward, micro-batches without `zero_grad`, rounds their sum otherwise).
//!
//! A tensor the region reads without being passed to it (captured by the function) that the
//! program computed gets its gradient as eager's: the region's backward goes on through the calls
//! before the region that computed it (a checkpoint among them runs its own backward), within its
//! own, and the program inputs those reach get what it found added to their `.grad`. Eager's
//! backward frees the graph of the calls it went through: where another backward (the outer one,
//! or another region's) reaches them too, eager's fails, and the trace's is refused (also where
//! eager's would not, the calls having saved no tensor: `w + 1`).

use crate::vjp::{backprop, Cotangents};
use rustc_hash::{FxHashMap, FxHashSet};
use std::ops::Range;
use trace_ir::grad::Emitter;
use trace_ir::{bail, BoundSymbol, Result, Trace, ValueId, ValueKind};

/// One reentrant checkpoint the program ran: the ids of the values its function defined and the
/// tensors passed to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// The ids of the values recorded while the function ran.
    pub values: Range<usize>,
    /// The tensors passed to `checkpoint` (the inputs the region's backward returns gradients for).
    pub inputs: Vec<ValueId>,
    /// Where the program called `checkpoint` (the user's file and line), named in errors.
    pub location: String,
}

/// The gradients each program input gets added to its `.grad` (eager's leaves) in turn, in the
/// order eager's backward adds them: all but the last are returned before it, as
/// `(first, ..., last)` in the input's place (see [`backprop_checkpointed`]).
pub(crate) type Landed = FxHashMap<ValueId, Vec<ValueId>>;

/// How the backward sums: the checkpoints, and per program input (eager's leaves) what is added
/// to its `.grad`, in turn.
struct Sums<'a> {
    checkpoints: &'a [Checkpoint],
    inputs: FxHashSet<ValueId>,
    landed: Landed,
    /// Per top-level call: the inputs whose outer total is added to `.grad` once it is differentiated.
    landings: FxHashMap<usize, Vec<ValueId>>,
    /// Per top-level call a backward differentiated: the checkpoint whose backward did (through
    /// the calls before it, see [`region`]), None for the outer backward.
    differentiated: FxHashMap<usize, Option<usize>>,
}

impl Sums<'_> {
    /// Whether checkpoint `c`'s function defined `v`: a value numbered while it ran that is not a
    /// program input (a tensor the function reads through a closure or a global, a module's
    /// parameter, becomes an input of the program where it is first read, numbered in the region).
    fn defined_in(&self, c: &Checkpoint, v: ValueId) -> bool {
        c.values.contains(&v.index()) && !self.inputs.contains(&v)
    }

    /// Adds `g` to `v`'s `.grad` (after what was added before).
    fn land(&mut self, v: ValueId, g: ValueId) {
        self.landed.entry(v).or_default().push(g);
    }

    /// The outermost checkpoint inside `within` (any when None) that defined an output of `bsym`.
    fn region_of(&self, bsym: &BoundSymbol, within: Option<usize>) -> Option<usize> {
        let inside = |k: usize| match within {
            None => true,
            Some(w) => {
                let (outer, inner) = (&self.checkpoints[w].values, &self.checkpoints[k].values);
                k != w && outer.start <= inner.start && inner.end <= outer.end
            }
        };
        let defines = |k: usize| bsym.outputs.iter().any(|o| self.checkpoints[k].values.contains(&o.index()));
        (0..self.checkpoints.len())
            .filter(|&k| inside(k) && defines(k))
            .min_by_key(|&k| (self.checkpoints[k].values.start, usize::MAX - self.checkpoints[k].values.end))
    }
}

/// Emits the backward of `trace`'s calls as [`crate::vjp::joint`] does, summing each
/// checkpoint's gradients apart as eager does. Each program input's gradients are what eager adds
/// to its `.grad` one after the other (each region's total when its backward ends, the outer
/// backward's once it has differentiated its last use): the last is left in `cots`, and the
/// others, in order, returned. The runtime adds those to the `.grad` as eager does (an
/// AccumulateGrad each, through autograd) and returns the last to autograd: with a `.grad` from
/// an earlier backward (micro-batches), eager's sum is `((grad + first) + second) + ...`, which
/// the sum of the pieces added to it once would round otherwise.
pub(crate) fn backprop_checkpointed(
    e: &mut Emitter,
    cots: &mut Cotangents,
    trace: &Trace,
    checkpoints: &[Checkpoint],
) -> Result<Landed> {
    let inputs: FxHashSet<ValueId> = trace.inputs.iter().copied().collect();
    let mut sums = Sums {
        checkpoints,
        inputs,
        landed: FxHashMap::default(),
        landings: FxHashMap::default(),
        differentiated: FxHashMap::default(),
    };
    sums.landings = landings(trace, &sums);
    walk(e, cots, &trace.bsyms, &mut sums, Within::Outer)?;
    for &i in &trace.inputs {
        if let Some(g) = cots.take(i) {
            sums.land(i, g);
        }
    }
    let mut early = Landed::default();
    for (i, mut pieces) in sums.landed {
        let last = pieces.pop().expect("an input lands a gradient at least once");
        cots.set(i, last);
        if !pieces.is_empty() {
            early.insert(i, pieces);
        }
    }
    Ok(early)
}

/// Per top-level call, the program inputs it is the first differentiated reader of in the outer
/// backward (a call outside the checkpoints, or one inside a checkpoint passed them): eager's
/// outer backward adds its total to their `.grad` right after differentiating it (a leaf's
/// accumulation runs as soon as its last gradient arrives).
fn landings(trace: &Trace, sums: &Sums) -> FxHashMap<usize, Vec<ValueId>> {
    let wants = |v: ValueId| matches!(trace.values.get(v.index()), Some(ValueKind::Tensor(t)) if t.requires_grad);
    let mut live: FxHashSet<ValueId> = crate::vjp::differentiable_outputs(trace).into_iter().collect();
    let mut first: FxHashMap<ValueId, usize> = FxHashMap::default();
    for (i, b) in trace.bsyms.iter().enumerate().rev() {
        if !b.outputs.iter().any(|o| live.contains(o)) {
            continue;
        }
        // (a checkpoint's backward returns its inputs' gradients to the outer one; what it reads
        // without being passed it gets its gradient in the checkpoint's own backward)
        let region = sums.region_of(b, None).map(|k| &sums.checkpoints[k]);
        let outer = |v: ValueId| region.is_none_or(|c| c.inputs.contains(&v) || sums.defined_in(c, v));
        b.for_each_input(|v| {
            if wants(v) && outer(v) {
                live.insert(v);
                if sums.inputs.contains(&v) {
                    first.insert(v, i);
                }
            }
        });
    }
    let mut at: FxHashMap<usize, Vec<ValueId>> = FxHashMap::default();
    let mut sorted: Vec<(ValueId, usize)> = first.into_iter().collect();
    sorted.sort_unstable();
    for (v, i) in sorted {
        at.entry(i).or_default().push(v);
    }
    at
}

/// Which backward [`walk`] emits: the outer one, that of checkpoint `k`'s calls, or checkpoint
/// `k`'s going on through the top-level calls before it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Within {
    Outer,
    Region(usize),
    Before(usize),
}

/// Differentiates `bsyms` in reverse; the calls of a checkpoint inside `within` (the whole
/// program's top level outside [`Within::Region`]) as one region.
fn walk(e: &mut Emitter, cots: &mut Cotangents, bsyms: &[BoundSymbol], sums: &mut Sums, within: Within) -> Result<()> {
    let (region_in, top) = match within {
        Within::Region(k) => (Some(k), false),
        _ => (None, true),
    };
    let mut end = bsyms.len();
    while end > 0 {
        let Some(k) = sums.region_of(&bsyms[end - 1], region_in) else {
            if top {
                differentiating(sums, cots, &bsyms[end - 1..end], end - 1, within)?;
            }
            backprop(e, cots, &bsyms[end - 1..end])?;
            if within == Within::Outer {
                land_outer(cots, sums, end - 1..end);
            }
            end -= 1;
            continue;
        };
        let mut start = end - 1;
        while start > 0 && sums.region_of(&bsyms[start - 1], region_in) == Some(k) {
            start -= 1;
        }
        if top {
            differentiating(sums, cots, &bsyms[start..end], start, within)?;
        }
        // (a top-level checkpoint's backward goes on through the calls before it)
        region(e, cots, (&bsyms[start..end], top.then(|| &bsyms[..start])), k, sums)?;
        if within == Within::Outer {
            land_outer(cots, sums, start..end);
        }
        end = start;
    }
    Ok(())
}

/// Notes that the backward `within` differentiates the top-level calls `calls` (from index
/// `first`) where a cotangent reaches them; refused where another backward differentiated them.
fn differentiating(
    sums: &mut Sums,
    cots: &Cotangents,
    calls: &[BoundSymbol],
    first: usize,
    within: Within,
) -> Result<()> {
    if !calls.iter().any(|b| b.outputs.iter().any(|&o| cots.get(o).is_some())) {
        return Ok(());
    }
    let by = match within {
        Within::Before(k) => Some(k),
        _ => None,
    };
    for i in first..first + calls.len() {
        let Some(earlier) = sums.differentiated.insert(i, by) else { continue };
        let k = earlier.or(by).expect("the outer backward differentiates a call once");
        bail!(
            NotImplemented,
            "checkpoint",
            "torch.utils.checkpoint (use_reentrant=True) at {}: the checkpointed function reads a tensor \
             that requires grad, computed before the call, without it being passed to checkpoint (a closure or a \
             keyword argument); eager's checkpoint backpropagates its gradient through the calls that computed \
             it in the checkpoint's own backward, which frees their graph, and the gradient the rest of the \
             program (or another checkpoint) sends through them then fails ('Trying to backward through the \
             graph a second time'). Pass the tensor to checkpoint as a positional argument",
            sums.checkpoints[k].location
        );
    }
    Ok(())
}

/// Adds the outer backward's totals to the `.grad` of the program inputs whose last outer
/// gradient the top-level calls `calls` gave.
fn land_outer(cots: &mut Cotangents, sums: &mut Sums, calls: Range<usize>) {
    for i in calls.rev() {
        for v in sums.landings.remove(&i).unwrap_or_default() {
            if let Some(g) = cots.take(v) {
                sums.land(v, g);
            }
        }
    }
}

/// The backward of checkpoint `k`'s calls, as its own: from the cotangents of the values it
/// defined, summed apart; its inputs' totals go to `cots` (the backward around it), the program
/// inputs it read but was not passed to their `.grad`. The other tensors it read without being
/// passed (computed before it, captured by its function) get theirs as eager's checkpoint gives
/// them: its backward (`torch.autograd.backward` of what the function returned) goes on through
/// the top-level calls `before` it that computed them, within its own backward (a checkpoint
/// inside another gives them to the backward around it).
fn region(
    e: &mut Emitter,
    cots: &mut Cotangents,
    (bsyms, before): (&[BoundSymbol], Option<&[BoundSymbol]>),
    k: usize,
    sums: &mut Sums,
) -> Result<()> {
    let checkpoint = &sums.checkpoints[k];
    let (values, passed) = (checkpoint.values.clone(), checkpoint.inputs.clone());
    let mut inner = cots.apart();
    for b in bsyms {
        for &o in &b.outputs {
            if values.contains(&o.index()) {
                if let Some(c) = cots.take(o) {
                    inner.set(o, c);
                }
            }
        }
    }
    walk(e, &mut inner, bsyms, sums, Within::Region(k))?;
    let mut reached = inner.into_values();
    reached.retain(|(v, _)| !values.contains(&v.index()) || sums.inputs.contains(v));
    reached.sort_unstable();
    let mut own = cots.apart();
    for (v, g) in reached {
        if passed.contains(&v) || (before.is_none() && !sums.inputs.contains(&v)) {
            cots.accumulate(e, v, g)?;
        } else {
            own.set(v, g);
        }
    }
    if let Some(before) = before {
        // (a program input none of the calls before gives a gradient gets its total first:
        // eager's AccumulateGrad runs as soon as its last gradient arrives)
        let captured = own.values().filter(|v| !sums.inputs.contains(v));
        let upstream = reached_before(before, captured.collect(), sums);
        let mut first: Vec<ValueId> = own.values().filter(|v| !upstream.contains(v)).collect();
        first.sort_unstable();
        for v in first {
            let g = own.take(v).expect("a gradient reached it");
            sums.land(v, g);
        }
        walk(e, &mut own, before, sums, Within::Before(k))?;
    }
    // (the values computed before it have passed theirs on to the program inputs)
    let mut landed = own.into_values();
    landed.retain(|(v, _)| sums.inputs.contains(v));
    landed.sort_unstable();
    for (v, g) in landed {
        sums.land(v, g);
    }
    Ok(())
}

/// The values a backward from `seeds` through the top-level calls `before` reaches in the same
/// backward: a checkpoint among them passes on to the tensors passed to it only (its own backward
/// gives the others theirs).
fn reached_before(before: &[BoundSymbol], seeds: Vec<ValueId>, sums: &Sums) -> FxHashSet<ValueId> {
    let mut live: FxHashSet<ValueId> = seeds.into_iter().collect();
    for b in before.iter().rev() {
        if !b.outputs.iter().any(|o| live.contains(o)) {
            continue;
        }
        let region = sums.region_of(b, None).map(|k| &sums.checkpoints[k]);
        b.for_each_input(|v| {
            if region.is_none_or(|c| c.inputs.contains(&v) || sums.defined_in(c, v)) {
                live.insert(v);
            }
        });
    }
    live
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vjp::joint_checkpointed;
    use trace_ir::{Arg, DType, Device, TensorMeta, TraceBuilder};

    /// `x.sin() + x.cos()` in a checkpoint, then `+ x.exp()` outside it: x's gradient, and the
    /// value the exponential's backward made.
    fn gradient_of_x(checkpointed: bool) -> (Trace, ValueId, ValueId) {
        let mut b = TraceBuilder::new();
        let meta = TensorMeta { requires_grad: true, ..TensorMeta::new(DType::F32, Device::CPU, vec![4]) };
        let x = b.add_input(ValueKind::Tensor(meta));
        let start = b.num_values();
        let s = b.record_prim("sin", vec![Arg::Value(x)]).unwrap()[0];
        let c = b.record_prim("cos", vec![Arg::Value(x)]).unwrap()[0];
        let inside = b.record_prim("add", vec![Arg::Value(s), Arg::Value(c)]).unwrap()[0];
        let region = Checkpoint { values: start..b.num_values(), inputs: vec![x], location: String::new() };
        let d = b.record_prim("exp", vec![Arg::Value(x)]).unwrap()[0];
        let out = b.record_prim("add", vec![Arg::Value(inside), Arg::Value(d)]).unwrap()[0];
        let trace = b.finish(Arg::Value(out)).unwrap();
        let checkpoints = if checkpointed { vec![region] } else { vec![] };
        let joint = joint_checkpointed(&trace, &checkpoints).unwrap().unwrap().trace;
        let Arg::Tuple(parts) = &joint.outputs else { panic!("(outputs, grads)") };
        let Arg::Tuple(grads) = &parts[1] else { panic!("grads") };
        let Arg::Value(g) = grads[0] else { panic!("x gets a gradient") };
        (joint, g, d)
    }

    /// Whether `g` is the sum of the exponential's gradient and another value.
    fn adds_the_exponentials_gradient(trace: &Trace, g: ValueId, d: ValueId) -> bool {
        let defining = |v: ValueId| trace.bsyms.iter().find(|b| b.outputs.contains(&v)).unwrap();
        let reads = |b: &BoundSymbol, v: ValueId| b.args.contains(&Arg::Value(v));
        let total = defining(g);
        total.args.iter().any(|a| matches!(a, Arg::Value(p) if reads(defining(*p), d)))
    }

    #[test]
    fn a_parameter_read_by_two_checkpoints_gets_each_total_in_turn() {
        // w read by two regions, passed x only: eager adds each region's total to w's `.grad`
        let mut b = TraceBuilder::new();
        let meta = TensorMeta { requires_grad: true, ..TensorMeta::new(DType::F32, Device::CPU, vec![4]) };
        let (x, w) = (b.add_input(ValueKind::Tensor(meta.clone())), b.add_input(ValueKind::Tensor(meta)));
        let mut h = x;
        let mut checkpoints = vec![];
        for _ in 0..2 {
            let start = b.num_values();
            h = b.record_prim("mul", vec![Arg::Value(h), Arg::Value(w)]).unwrap()[0];
            checkpoints.push(Checkpoint { values: start..b.num_values(), inputs: vec![x], location: String::new() });
        }
        let trace = b.finish(Arg::Value(h)).unwrap();
        let joint = joint_checkpointed(&trace, &checkpoints).unwrap().unwrap().trace;
        trace_ir::verify::verify(&joint).unwrap();
        let Arg::Tuple(parts) = &joint.outputs else { panic!("(outputs, grads)") };
        let Arg::Tuple(grads) = &parts[1] else { panic!("grads") };
        assert!(matches!(&grads[0], Arg::Value(_)), "x gets one gradient: {:?}", grads[0]);
        assert!(matches!(&grads[1], Arg::Tuple(pieces) if pieces.len() == 2), "w gets two: {:?}", grads[1]);
    }

    #[test]
    fn a_parameter_first_read_inside_a_checkpoint_gets_its_total() {
        // w, a module's parameter the function reads through a global: an input numbered in the region
        let mut b = TraceBuilder::new();
        let meta = TensorMeta { requires_grad: true, ..TensorMeta::new(DType::F32, Device::CPU, vec![4]) };
        let x = b.add_input(ValueKind::Tensor(meta.clone()));
        let start = b.num_values();
        let w = b.add_input(ValueKind::Tensor(meta));
        let h = b.record_prim("mul", vec![Arg::Value(x), Arg::Value(w)]).unwrap()[0];
        let checkpoints = vec![Checkpoint { values: start..b.num_values(), inputs: vec![x], location: String::new() }];
        let trace = b.finish(Arg::Value(h)).unwrap();
        let joint = joint_checkpointed(&trace, &checkpoints).unwrap().unwrap().trace;
        trace_ir::verify::verify(&joint).unwrap();
        let Arg::Tuple(parts) = &joint.outputs else { panic!("(outputs, grads)") };
        let Arg::Tuple(grads) = &parts[1] else { panic!("grads") };
        assert!(matches!(&grads[1], Arg::Value(_)), "w gets the region's total: {:?}", grads[1]);
    }

    #[test]
    fn a_checkpoint_s_inputs_get_its_total_as_eager_sums_them() {
        // eager: exp's gradient + (cos's + sin's), the checkpoint's total summed in its own backward
        let (trace, g, d) = gradient_of_x(true);
        trace_ir::verify::verify(&trace).unwrap();
        assert!(adds_the_exponentials_gradient(&trace, g, d));
        // without the checkpoint: (exp's + cos's) + sin's
        let (trace, g, d) = gradient_of_x(false);
        assert!(!adds_the_exponentials_gradient(&trace, g, d));
    }
}
