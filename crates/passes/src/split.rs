//! Splits a joint forward+backward trace into a forward that returns its outputs plus the
//! residuals, and a backward that takes the residuals and the cotangents.
//!
//! Residuals are chosen to keep saved bytes small: walking the values the backward needs from
//! the last defined to the first, a value made by a cheap prim (elementwise, shape, creation) is
//! recomputed in the backward instead of saved when the inputs that recomputing it needs, and
//! that are not needed anyway, take no more bytes than it does. The forward's inputs cost
//! nothing to save (the caller holds them). Random prims are never recomputed, and neither is a
//! conversion of a forward input to a narrower dtype (autocast's bfloat16 copy of a float32
//! weight): see `narrows_input`.
//!
//! A composite in the forward stays whole (an executor may run it as one call) unless a
//! residual is defined inside it; then it is replaced by its decomposition.
//!
//! Non-reentrant activation checkpoints (`torch.utils.checkpoint(fn, ..., use_reentrant=False)`)
//! are kept as eager keeps them: eager's backward runs the checkpointed function again on its
//! inputs instead of keeping what its nodes saved. The calls the program recorded while such a
//! function ran (`regions`: ranges of value ids) are run again in the backward, whole, where it
//! reads a value they define: only what they read from outside the region is saved. A random
//! call or an effect in a region runs once, in the forward (its output is saved: eager's
//! recompute draws the same numbers from the generator state it restores), but for a dropout
//! Python records as a call of no effect drawing from the generator state its region started
//! from (chained through the region's draws; `replayed_draws`), which is run again like the
//! others: only the state is saved, as eager keeps it.

use crate::partition::for_each_param_size;
use crate::vjp::Joint;
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BinaryHeap;
use std::ops::Range;
use trace_ir::prims::{Elementwise, Prim};
use trace_ir::{bail, Arg, BoundSymbol, Result, Symbol, Trace, ValueId, ValueKind};

/// The two halves of a joint trace.
#[derive(Clone, Debug)]
pub struct Split {
    /// Returns `(outputs, (residuals...))`.
    pub forward: Trace,
    /// Takes `(residuals..., cotangents...)` and returns one gradient or None per forward input.
    pub backward: Trace,
    /// The forward values the backward reads, in the order the forward returns them.
    pub residuals: Vec<ValueId>,
}

/// Where the backward can get a forward value from.
#[derive(Clone, Copy)]
enum Source<'a> {
    /// Saved for free: a forward input.
    Input,
    /// Made by a prim the backward could run again.
    Prim(&'a BoundSymbol),
    /// Made by something that must run in the forward (a composite's output, a fallback).
    Opaque,
}

/// Splits `joint` (from [`crate::vjp::joint`]) at its forward's end into the two halves,
/// choosing the residuals as the module doc says: cheap prims the backward needs are
/// recomputed there when that saves bytes, other values are saved.
///
/// Errors (`RuntimeError`) when `joint` does not return `(outputs, grads)`, the form
/// [`crate::vjp::joint`] builds.
pub fn split(joint: &Joint, regions: &[Range<usize>]) -> Result<Split> {
    let t = &joint.trace;
    let (forward, backward) = t.bsyms.split_at(joint.num_forward);
    let (primal_inputs, cot_inputs) = t.inputs.split_at(t.inputs.len() - joint.num_cotangents);
    let Arg::Tuple(parts) = &t.outputs else { bail!(Runtime, "split", "a joint trace returns (outputs, grads)") };
    let [outputs, grads] = parts.as_slice() else { bail!(Runtime, "split", "a joint trace returns (outputs, grads)") };

    let backward = live_backward(t, backward, grads);
    let backward = backward.as_slice();
    let sources = sources(t, primal_inputs, forward);
    let needed = needed_values(t, backward, cot_inputs, grads);
    let regions = Regions::new(t, forward, regions);
    let (residuals, recomputed, regions) = choose_residuals(t, &sources, regions, needed);

    let mut is_residual = vec![false; t.values.len()];
    residuals.iter().for_each(|v| is_residual[v.index()] = true);
    let mut fwd_bsyms = Vec::with_capacity(forward.len());
    forward.iter().for_each(|b| flatten_where_needed(b, &is_residual, &mut fwd_bsyms));

    let residual_args = Arg::Tuple(residuals.iter().map(|&v| Arg::Value(v)).collect());
    let fwd = Trace {
        values: t.values.clone(),
        inputs: primal_inputs.to_vec(),
        bsyms: fwd_bsyms,
        outputs: Arg::Tuple(vec![outputs.clone(), residual_args]),
        facts: t.facts.clone(),
    };
    let bwd_bsyms = regions.scheduled(t, recomputed, backward.to_vec());
    let bwd = Trace {
        values: t.values.clone(),
        inputs: residuals.iter().chain(cot_inputs).copied().collect(),
        bsyms: bwd_bsyms,
        outputs: grads.clone(),
        facts: t.facts.clone(),
    };
    Ok(Split { forward: fwd, backward: bwd, residuals })
}

/// The backward half of `joint` (a joint trace [`crate::vjp::joint_without`] made, for a
/// backward that reaches only some outputs) taking the residuals `residuals` that [`split`] chose
/// for the whole backward of the same forward, so that it runs from what that forward saved:
/// inputs `(residuals..., cotangents...)`, the absent cotangents among them unread. The forward
/// values it needs that are not among them are recomputed where cheap prims make them from
/// residuals; None where one is neither (the caller then prunes the whole backward).
pub fn backward_from(joint: &Joint, residuals: &[ValueId], regions: &[Range<usize>]) -> Result<Option<Trace>> {
    let t = &joint.trace;
    let (forward, backward) = t.bsyms.split_at(joint.num_forward);
    let (primal_inputs, cot_inputs) = t.inputs.split_at(t.inputs.len() - joint.num_cotangents);
    let Arg::Tuple(parts) = &t.outputs else { bail!(Runtime, "split", "a joint trace returns (outputs, grads)") };
    let [_, grads] = parts.as_slice() else { bail!(Runtime, "split", "a joint trace returns (outputs, grads)") };
    let backward = live_backward(t, backward, grads);
    let sources = sources(t, primal_inputs, forward);
    let mut regions = Regions::new(t, forward, regions);
    let mut seen = vec![false; t.values.len()];
    residuals.iter().for_each(|v| seen[v.index()] = true);
    let mut heap = BinaryHeap::new();
    fn need(v: ValueId, seen: &mut [bool], heap: &mut BinaryHeap<ValueId>) {
        if !std::mem::replace(&mut seen[v.index()], true) {
            heap.push(v);
        }
    }
    needed_values(t, &backward, cot_inputs, grads).into_iter().for_each(|v| need(v, &mut seen, &mut heap));
    let mut recomputed = Vec::new();
    while let Some(v) = heap.pop() {
        if regions.take(t, v, &mut |i| need(i, &mut seen, &mut heap)) {
            continue;
        }
        let Some(Source::Prim(bsym)) = sources.get(&v).copied() else { return Ok(None) };
        if !recomputable(bsym) {
            return Ok(None);
        }
        bsym.for_each_input(|i| need(i, &mut seen, &mut heap));
        for_each_param_size(t, bsym, &mut |i| need(i, &mut seen, &mut heap));
        recomputed.push(BoundSymbol { subsymbols: Default::default(), grad: None, ..bsym.clone() });
    }
    let recomputed = regions.with_calls(recomputed);
    let recomputed = regions.scheduled(t, recomputed, backward);
    Ok(Some(Trace {
        values: t.values.clone(),
        inputs: residuals.iter().chain(cot_inputs).copied().collect(),
        bsyms: recomputed,
        outputs: grads.clone(),
        facts: t.facts.clone(),
    }))
}

/// The forward values `backward` (the live backward of a joint trace, whose cotangent inputs are
/// `cot_inputs` and gradients `grads`) reads, with the size values their shapes and its prims'
/// parameters read.
fn needed_values(t: &Trace, backward: &[BoundSymbol], cot_inputs: &[ValueId], grads: &Arg) -> Vec<ValueId> {
    let mut in_backward = vec![false; t.values.len()];
    cot_inputs.iter().for_each(|v| in_backward[v.index()] = true);
    backward.iter().for_each(|b| b.for_each_defined(&mut |v| in_backward[v.index()] = true));
    let mut needed = Vec::new();
    backward.iter().for_each(|b| b.for_each_input(|v| needed.push(v)));
    grads.for_each_value(&mut |v| needed.push(v));
    needed.retain(|v| !in_backward[v.index()]);
    // The backward computes its symbolic sizes from the size values they read: those are saved,
    // and so are the sizes its prims read through their parameters alone (a pad by a start read
    // from a tensor's value, the gradient of a `narrow` at it).
    let mut sizes = Vec::new();
    let backward_values =
        needed.iter().chain(cot_inputs).copied().chain(backward.iter().flat_map(|b| b.outputs.clone()));
    backward_values.for_each(|v| {
        t.tensor(v).iter().for_each(|m| m.shape.iter().for_each(|d| d.for_each_value(&mut |s| sizes.push(s))))
    });
    backward.iter().for_each(|b| for_each_param_size(t, b, &mut |s| sizes.push(s)));
    sizes.retain(|s| !needed.contains(s));
    sizes.sort_unstable();
    sizes.dedup();
    needed.extend(sizes);
    needed
}

/// The backward's bound symbols that contribute to a gradient (rules emit some that do not,
/// such as the gradient of an operand that requires none), so that nothing is saved for them,
/// and its effects of no outputs (the switches of the stream a block's backward runs on:
/// [`crate::vjp`]; none around a block whose backward runs nothing).
fn live_backward(t: &Trace, backward: &[BoundSymbol], grads: &Arg) -> Vec<BoundSymbol> {
    let mut live = vec![false; t.values.len()];
    grads.for_each_value(&mut |v| live[v.index()] = true);
    let mut kept: Vec<BoundSymbol> = backward
        .iter()
        .rev()
        .filter(|b| {
            let used = b.outputs.iter().any(|o| live[o.index()]) || (b.outputs.is_empty() && b.symbol.is_effect());
            if used {
                b.for_each_input(|v| live[v.index()] = true);
            }
            used
        })
        .cloned()
        .collect();
    kept.reverse();
    crate::vjp::without_empty_switches(kept)
}

/// How each forward value could reach the backward.
fn sources<'a>(t: &Trace, inputs: &[ValueId], forward: &'a [BoundSymbol]) -> FxHashMap<ValueId, Source<'a>> {
    // A composite's outputs, nested ones too, come from the composite as a whole (an executor
    // runs it as one call, such as a fused kernel returning its statistics); the values only
    // its decomposition defines come from their prims.
    fn add<'a>(bsym: &'a BoundSymbol, out: &mut FxHashMap<ValueId, Source<'a>>) {
        match bsym.symbol {
            Symbol::Prim(_) => bsym.outputs.iter().for_each(|&v| {
                out.insert(v, Source::Prim(bsym));
            }),
            _ => {
                bsym.subsymbols.iter().for_each(|sub| add(sub, out));
                bsym.outputs.iter().for_each(|&v| {
                    out.insert(v, Source::Opaque);
                });
            }
        }
    }
    let mut out: FxHashMap<ValueId, Source<'a>> = FxHashMap::default();
    out.reserve(t.values.len());
    forward.iter().for_each(|b| add(b, &mut out));
    inputs.iter().for_each(|&v| {
        out.insert(v, Source::Input);
    });
    out
}

/// Prims cheap enough to run again in the backward rather than save their result.
fn recomputable(bsym: &BoundSymbol) -> bool {
    match &bsym.symbol {
        Symbol::Prim(p) => bsym.outputs.len() == 1 && p.is_cheap_to_recompute(),
        _ => false,
    }
}

/// Whether `bsym` converts a forward input to a dtype of fewer bytes, such as the bfloat16 copy
/// of a float32 weight that autocast makes for a matmul. Such a copy is saved rather than
/// recomputed: recomputing reads the wider input, more bytes than loading the copy, in a kernel
/// of its own (under autocast its consumer is a matmul, which no fusion region absorbs), and eager keeps the
/// same copy alive until the backward anyway (autocast's weight cache holds it, and `mm` saves
/// its operands, cast explicitly or not), so saving it holds what eager holds.
fn narrows_input(t: &Trace, sources: &FxHashMap<ValueId, Source>, bsym: &BoundSymbol) -> bool {
    let Symbol::Prim(Prim::Elementwise(Elementwise::ConvertElementType { .. })) = bsym.symbol else { return false };
    let Some(&Arg::Value(x)) = bsym.args.first() else { return false };
    matches!(sources.get(&x), Some(Source::Input)) && bytes(t, bsym.outputs[0]) < bytes(t, x)
}

fn bytes(t: &Trace, v: ValueId) -> i64 {
    match t.value(v) {
        ValueKind::Tensor(m) => m.numel_hint() * m.dtype.itemsize() as i64,
        ValueKind::Number(_) | ValueKind::Size(_) => 0,
    }
}

/// Decides, from the last-defined needed value to the first, what the backward saves and what
/// it recomputes. Returns the residuals (by id) and the prims to recompute.
fn choose_residuals<'a>(
    t: &Trace,
    sources: &FxHashMap<ValueId, Source>,
    mut regions: Regions<'a>,
    needed: Vec<ValueId>,
) -> (Vec<ValueId>, Vec<BoundSymbol>, Regions<'a>) {
    let mut seen = vec![false; t.values.len()];
    let mut heap = BinaryHeap::new();
    for v in needed {
        if !std::mem::replace(&mut seen[v.index()], true) {
            heap.push(v);
        }
    }
    let (mut residuals, mut recomputed) = (Vec::new(), Vec::new());
    while let Some(v) = heap.pop() {
        let mut need = |i: ValueId| {
            if !std::mem::replace(&mut seen[i.index()], true) {
                heap.push(i);
            }
        };
        if regions.take(t, v, &mut need) {
            continue;
        }
        let bsym = match sources.get(&v) {
            Some(Source::Prim(b)) if recomputable(b) && !narrows_input(t, sources, b) => *b,
            _ => {
                residuals.push(v);
                continue;
            }
        };
        let mut extra = 0;
        bsym.for_each_input(|i| {
            let free = matches!(sources.get(&i), Some(Source::Input));
            if !seen[i.index()] && !free {
                extra += bytes(t, i);
            }
        });
        if extra > bytes(t, v) {
            residuals.push(v);
            continue;
        }
        let mut need = |i: ValueId| {
            if !std::mem::replace(&mut seen[i.index()], true) {
                heap.push(i);
            }
        };
        bsym.for_each_input(&mut need);
        for_each_param_size(t, bsym, &mut need);
        recomputed.push(BoundSymbol { subsymbols: Default::default(), grad: None, ..bsym.clone() });
    }
    residuals.sort_unstable();
    let recomputed = regions.with_calls(recomputed);
    (residuals, recomputed, regions)
}

/// The forward's calls recorded inside non-reentrant checkpoints that the backward may run again
/// (see the module doc), and which of them it does.
#[derive(Clone)]
struct Regions<'a> {
    /// The calls, in program order: those without a random part (the backward could run a
    /// random call's decomposition around its draws, a dropout's product with its mask, but the
    /// forward's executor may compute it otherwise: eager's CPU dropout scales by `1 / (1 - p)`
    /// rounded to bfloat16 first).
    calls: Vec<&'a BoundSymbol>,
    /// Per value one of `calls` defines: its index there.
    call_of: FxHashMap<ValueId, usize>,
    /// The calls the backward runs again, by index.
    taken: Vec<bool>,
    /// The values the backward reads that a call defines inside its decomposition (the call is
    /// then run again decomposed, as the forward is where a residual is defined inside it).
    inner: Vec<bool>,
}

impl<'a> Regions<'a> {
    fn new(t: &Trace, forward: &'a [BoundSymbol], regions: &[Range<usize>]) -> Self {
        let mut out =
            Regions { calls: Vec::new(), call_of: FxHashMap::default(), taken: Vec::new(), inner: Vec::new() };
        if regions.is_empty() {
            return out;
        }
        let outermost = |v: ValueId| regions.iter().filter(|r| r.contains(&v.index())).map(|r| r.start).min();
        // A value read outside its region (by a later call, or returned) may be saved by a node
        // eager's checkpoint does not pack (`y = checkpoint(f, x); z = y * w` saves `y`): it is
        // saved, as eager's node keeps it, and so is whatever the call defining it defines.
        let mut exported = FxHashSet::default();
        for b in forward {
            let at = b.outputs.first().and_then(|&o| outermost(o));
            reads(b, &mut |r| {
                if outermost(r).is_some() && (b.outputs.is_empty() || outermost(r) != at) {
                    exported.insert(r);
                }
            });
        }
        t.outputs.for_each_value(&mut |v| {
            exported.insert(v);
        });
        let inside = |v: &ValueId| outermost(*v).is_some() && !exported.contains(v);
        forward.iter().for_each(|b| out.add(b, &inside));
        (out.taken, out.inner) = (vec![false; out.calls.len()], vec![false; t.values.len()]);
        out
    }

    /// Adds `b` to the calls where it is pure and defines only values inside a region; a
    /// composite whose only effects read and set the generator around a dropout drawn from its
    /// region's saved generator state (a call of no effect: Python's `replayed_draws`) adds its
    /// decomposition's calls instead. (Another composite drawing inside runs in the forward:
    /// its executor may draw otherwise than its decomposition.)
    fn add(&mut self, b: &'a BoundSymbol, inside: &impl Fn(&ValueId) -> bool) {
        let mut defined = FxHashSet::default();
        b.for_each_defined(&mut |v| {
            defined.insert(v);
        });
        if b.outputs.is_empty() || !defined.iter().all(inside) {
            return;
        }
        if pure(b) {
            let i = self.calls.len();
            self.calls.push(b);
            defined.into_iter().for_each(|v| {
                self.call_of.insert(v, i);
            });
        } else if matches!(b.symbol, Symbol::Composite(_)) && only_replayed_draws(b) {
            b.subsymbols.iter().for_each(|sub| self.add(sub, inside));
        }
    }

    /// Whether `v` is defined by a call inside a region: then that call runs again in the
    /// backward, and `need` is told what it reads from outside it (operands, sizes).
    fn take(&mut self, t: &Trace, v: ValueId, need: &mut impl FnMut(ValueId)) -> bool {
        let Some(&i) = self.call_of.get(&v) else { return false };
        let b = self.calls[i];
        if !b.outputs.contains(&v) {
            self.inner[v.index()] = true;
        }
        if std::mem::replace(&mut self.taken[i], true) {
            return true;
        }
        let mut defined = FxHashSet::default();
        b.for_each_defined(&mut |d| {
            defined.insert(d);
        });
        let mut outside = |r: ValueId| {
            if !defined.contains(&r) {
                need(r)
            }
        };
        reads(b, &mut outside);
        for_each_param_size(t, b, &mut outside);
        for &d in &defined {
            t.tensor(d).iter().for_each(|m| m.shape.iter().for_each(|s| s.for_each_value(&mut outside)));
        }
        true
    }

    /// `recomputed` (prims) with the calls taken, in program order.
    fn with_calls(&self, recomputed: Vec<BoundSymbol>) -> Vec<BoundSymbol> {
        let mut groups: Vec<(ValueId, Vec<BoundSymbol>)> =
            recomputed.into_iter().map(|b| (b.outputs[0], vec![b])).collect();
        for (b, _) in self.calls.iter().zip(&self.taken).filter(|(_, &taken)| taken) {
            let mut calls = Vec::new();
            flatten_where_needed(&BoundSymbol { grad: None, ..(*b).clone() }, &self.inner, &mut calls);
            groups.push((b.outputs[0], calls));
        }
        groups.sort_by_key(|(v, _)| *v);
        groups.into_iter().flat_map(|(_, calls)| calls).collect()
    }
}

impl Regions<'_> {
    /// The backward: `recomputed` (in program order), then `backward`. With checkpoints, each
    /// call recomputed runs just before the first call that reads what it defines, as eager's
    /// backward computes a checkpoint's region again when it reaches it: one region's values are
    /// live at a time, not all of them.
    fn scheduled(&self, t: &Trace, recomputed: Vec<BoundSymbol>, backward: Vec<BoundSymbol>) -> Vec<BoundSymbol> {
        if self.calls.is_empty() {
            return recomputed.into_iter().chain(backward).collect();
        }
        let mut defined_by = FxHashMap::default();
        for (i, b) in recomputed.iter().enumerate() {
            b.for_each_defined(&mut |v| {
                defined_by.insert(v, i);
            });
        }
        let mut emitted = vec![false; recomputed.len()];
        let mut out = Vec::with_capacity(recomputed.len() + backward.len());
        let mut before = |b: &BoundSymbol, out: &mut Vec<BoundSymbol>| {
            let (mut stack, mut due) = (Vec::new(), Vec::new());
            touched(t, b, &mut |v| stack.extend(defined_by.get(&v).copied()));
            while let Some(i) = stack.pop() {
                if !std::mem::replace(&mut emitted[i], true) {
                    due.push(i);
                    touched(t, &recomputed[i], &mut |v| stack.extend(defined_by.get(&v).copied()));
                }
            }
            due.sort_unstable();
            out.extend(due.into_iter().map(|i| recomputed[i].clone()));
        };
        for b in backward {
            before(&b, &mut out);
            out.push(b);
        }
        // (what only the gradients returned read)
        out.extend(recomputed.iter().zip(&emitted).filter(|(_, &e)| !e).map(|(b, _)| b.clone()));
        out
    }
}

/// Calls `f` on the values `bsym` needs defined before it runs: what it reads, the sizes its
/// parameters and its outputs' shapes read.
fn touched(t: &Trace, bsym: &BoundSymbol, f: &mut impl FnMut(ValueId)) {
    reads(bsym, f);
    for_each_param_size(t, bsym, f);
    bsym.for_each_defined(&mut |d| {
        t.tensor(d).iter().for_each(|m| m.shape.iter().for_each(|s| s.for_each_value(&mut *f)))
    });
}

/// Calls `f` on what `bsym` reads, its decomposition's reads included (a custom Function's
/// forward reads its module's parameters there), its grad rule's not.
fn reads(bsym: &BoundSymbol, f: &mut impl FnMut(ValueId)) {
    bsym.for_each_input(&mut *f);
    bsym.subsymbols.iter().for_each(|s| reads(s, f));
}

/// The module of the effects that read and set a generator around a draw from a checkpoint
/// region's saved state (see `Regions::add`).
const REPLAYED_DRAWS: &str = "thunder_rs.core.lang.replayed_draws.";

/// Whether the effects in `bsym`'s decomposition, at any depth, are all `REPLAYED_DRAWS`' ones.
fn only_replayed_draws(bsym: &BoundSymbol) -> bool {
    bsym.subsymbols.iter().all(|s| match s.symbol.is_effect() {
        true => s.symbol.qualified_name().starts_with(REPLAYED_DRAWS),
        false => only_replayed_draws(s),
    })
}

/// Whether running `bsym` again changes nothing outside the trace and gives the same values: no
/// random call or effect at any depth.
fn pure(bsym: &BoundSymbol) -> bool {
    !bsym.symbol.is_effect() && bsym.subsymbols.iter().all(pure)
}

/// Keeps `bsym` whole unless a residual is defined inside it; then emits its decomposition,
/// recursively.
pub(crate) fn flatten_where_needed(bsym: &BoundSymbol, is_residual: &[bool], out: &mut Vec<BoundSymbol>) {
    if bsym.subsymbols.is_empty() {
        out.push(bsym.clone());
        return;
    }
    let mut inner_residual = false;
    bsym.for_each_defined(&mut |v| inner_residual |= is_residual[v.index()] && !bsym.outputs.contains(&v));
    if inner_residual {
        bsym.subsymbols.iter().for_each(|s| flatten_where_needed(s, is_residual, out));
    } else {
        out.push(bsym.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vjp::{joint, joint_without};
    use trace_ir::{DType, Device, SymbolKind, SymbolTable, TensorMeta, TraceBuilder};

    /// `x -> (exp(x), sin(x))`, `x` requiring grad.
    fn two_outputs() -> Trace {
        let mut b = TraceBuilder::new();
        let meta = TensorMeta { requires_grad: true, ..TensorMeta::new(DType::F32, Device::CPU, vec![4]) };
        let x = b.add_input(ValueKind::Tensor(meta));
        let e = b.record_prim("exp", vec![Arg::Value(x)]).unwrap()[0];
        let s = b.record_prim("sin", vec![Arg::Value(x)]).unwrap()[0];
        b.finish(Arg::Tuple(vec![Arg::Value(e), Arg::Value(s)])).unwrap()
    }

    #[test]
    fn a_backward_without_a_cotangent_runs_from_the_whole_forwards_residuals() {
        let trace = two_outputs();
        let whole = split(&joint(&trace).unwrap().unwrap(), &[]).unwrap();
        let partial = joint_without(&trace, &[0]).unwrap().unwrap();
        let backward = backward_from(&partial, &whole.residuals, &[]).unwrap().expect("its values are saved");
        assert_eq!(backward.inputs.len(), whole.backward.inputs.len(), "{backward}");
        assert_eq!(backward.inputs[..whole.residuals.len()], whole.residuals[..]);
        let absent = backward.inputs[whole.residuals.len()];
        let reads = backward.bsyms.iter().any(|b| b.reads_any(&[(absent, absent)].into_iter().collect()));
        assert!(!reads, "exp's absent cotangent is unread: {backward}");
        let e = trace.bsyms[0].outputs[0];
        assert!(whole.backward.bsyms.iter().any(|b| b.args.contains(&Arg::Value(e))), "{}", whole.backward);
        assert!(!backward.bsyms.iter().any(|b| b.args.contains(&Arg::Value(e))), "exp's backward is gone: {backward}");
        trace_ir::verify::verify(&backward).unwrap();
    }

    /// `(x, w) -> sin(x @ w) + 1`, both requiring grad, and the range of the ids of `x @ w` and
    /// its sine (a non-reentrant checkpoint's function).
    fn checkpointed_matmul() -> (Trace, Range<usize>) {
        let mut b = TraceBuilder::new();
        let meta = TensorMeta { requires_grad: true, ..TensorMeta::new(DType::F32, Device::CPU, vec![4, 4]) };
        let x = b.add_input(ValueKind::Tensor(meta.clone()));
        let w = b.add_input(ValueKind::Tensor(meta));
        let m = b.record_prim("matmul", vec![Arg::Value(x), Arg::Value(w)]).unwrap()[0];
        let s = b.record_prim("sin", vec![Arg::Value(m)]).unwrap()[0];
        let o = b.record_prim("add", vec![Arg::Value(s), Arg::Scalar(trace_ir::Scalar::Float(1.0))]).unwrap()[0];
        (b.finish(Arg::Value(o)).unwrap(), m.index()..s.index() + 1)
    }

    #[test]
    fn a_non_reentrant_checkpoints_calls_run_again_in_the_backward_instead_of_being_saved() {
        let (trace, region) = checkpointed_matmul();
        let m = trace.bsyms[0].outputs[0];
        let inline = split(&joint(&trace).unwrap().unwrap(), &[]).unwrap();
        assert!(inline.residuals.contains(&m), "sin's backward reads x @ w: {}", inline.forward);
        let halves = split(&joint(&trace).unwrap().unwrap(), &[region]).unwrap();
        assert!(!halves.residuals.contains(&m), "{}", halves.forward);
        assert_eq!(halves.backward.bsyms[0].outputs, vec![m], "the matmul first: {}", halves.backward);
        trace_ir::verify::verify(&halves.backward).unwrap();
    }

    #[test]
    fn a_checkpointed_value_read_after_its_region_is_saved() {
        // (eager's node outside the checkpoint, here the sine's, keeps it)
        let (trace, region) = checkpointed_matmul();
        let m = trace.bsyms[0].outputs[0];
        let first = region.start..region.start + 1;
        let halves = split(&joint(&trace).unwrap().unwrap(), std::slice::from_ref(&first)).unwrap();
        assert!(halves.residuals.contains(&m), "{}", halves.forward);
    }

    /// `x -> sin(dropout(x))` inside a checkpoint, the dropout's grad rule drawing from the
    /// generator's state as Python's `replayed_draws` records it (reading the state, a draw of no
    /// effect from it returning the state after, setting the generator to it), a mask `m` of
    /// floats; the mask and the draw's symbol.
    fn checkpointed_replayed_dropout() -> (Trace, Range<usize>, ValueId, Symbol) {
        let effect = |name: &str| SymbolTable::register(&format!("{REPLAYED_DRAWS}{name}"), SymbolKind::Effect);
        let (read, set) = (effect("_generator_state"), effect("_set_generator_state"));
        let draw = SymbolTable::register(&format!("{REPLAYED_DRAWS}_native_dropout_from"), SymbolKind::Fallback);
        let dropout = SymbolTable::register("ltorch.dropout", SymbolKind::Composite);
        let mut b = TraceBuilder::new();
        let meta = TensorMeta { requires_grad: true, ..TensorMeta::new(DType::F32, Device::CPU, vec![4, 4]) };
        let state = TensorMeta::new(DType::U8, Device::CPU, vec![5056]);
        let x = b.add_input(ValueKind::Tensor(meta.clone()));
        let start = x.index() + 1;
        b.begin_composite(dropout, vec![Arg::Value(x)], vec![]);
        let s = b.record_fallback(read, vec![], vec![], vec![state.clone()])[0];
        let mask = TensorMeta { requires_grad: false, ..meta.clone() };
        let drawn = b.record_fallback(draw, vec![Arg::Value(s), Arg::Value(x)], vec![], vec![meta, mask, state]);
        let empty = TensorMeta::new(DType::U8, Device::CPU, vec![0]);
        b.record_fallback(set, vec![Arg::Value(drawn[2])], vec![], vec![empty]);
        let g = b.get_grad(drawn[0]).unwrap();
        let gx = b.record_prim("mul", vec![Arg::Value(g), Arg::Value(drawn[1])]).unwrap()[0];
        b.put_grad(x, Arg::Value(gx)).unwrap();
        b.end_composite(vec![drawn[0]]).unwrap();
        let out = b.record_prim("sin", vec![Arg::Value(drawn[0])]).unwrap()[0];
        (b.finish(Arg::Value(out)).unwrap(), start..out.index() + 1, drawn[1], Symbol::Fallback(draw))
    }

    #[test]
    fn a_checkpoints_dropout_drawn_from_its_regions_state_is_drawn_again_not_saved() {
        let (trace, region, mask, draw) = checkpointed_replayed_dropout();
        let halves = split(&joint(&trace).unwrap().unwrap(), std::slice::from_ref(&region)).unwrap();
        let saved: Vec<_> = halves.residuals.iter().filter_map(|&v| trace.tensor(v).map(|m| m.dtype)).collect();
        assert!(saved.contains(&DType::U8), "the state is saved: {}", halves.forward);
        assert!(!halves.residuals.contains(&mask), "the mask is drawn again: {}", halves.forward);
        assert!(halves.backward.bsyms.iter().any(|b| b.symbol == draw), "drawn again: {}", halves.backward);
        let inline = split(&joint(&trace).unwrap().unwrap(), &[]).unwrap();
        assert!(!inline.backward.bsyms.iter().any(|b| b.symbol == draw), "{}", inline.backward);
        trace_ir::verify::verify(&halves.backward).unwrap();
    }

    #[test]
    fn a_backward_without_a_cotangent_needing_a_value_not_saved_is_none() {
        let partial = joint_without(&two_outputs(), &[0]).unwrap().unwrap();
        assert!(backward_from(&partial, &[], &[]).unwrap().is_none(), "sin's backward reads x, not saved");
    }
}
