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

use crate::partition::for_each_param_size;
use crate::vjp::Joint;
use rustc_hash::FxHashMap;
use std::collections::BinaryHeap;
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
pub fn split(joint: &Joint) -> Result<Split> {
    let t = &joint.trace;
    let (forward, backward) = t.bsyms.split_at(joint.num_forward);
    let (primal_inputs, cot_inputs) = t.inputs.split_at(t.inputs.len() - joint.num_cotangents);
    let Arg::Tuple(parts) = &t.outputs else { bail!(Runtime, "split", "a joint trace returns (outputs, grads)") };
    let [outputs, grads] = parts.as_slice() else { bail!(Runtime, "split", "a joint trace returns (outputs, grads)") };

    let backward = live_backward(t, backward, grads);
    let backward = backward.as_slice();
    let sources = sources(t, primal_inputs, forward);
    let needed = needed_values(t, backward, cot_inputs, grads);
    let (residuals, mut recomputed) = choose_residuals(t, &sources, needed);
    recomputed.sort_by_key(|b| b.outputs[0]);

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
    let mut bwd_bsyms = recomputed;
    bwd_bsyms.extend(backward.iter().cloned());
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
pub fn backward_from(joint: &Joint, residuals: &[ValueId]) -> Result<Option<Trace>> {
    let t = &joint.trace;
    let (forward, backward) = t.bsyms.split_at(joint.num_forward);
    let (primal_inputs, cot_inputs) = t.inputs.split_at(t.inputs.len() - joint.num_cotangents);
    let Arg::Tuple(parts) = &t.outputs else { bail!(Runtime, "split", "a joint trace returns (outputs, grads)") };
    let [_, grads] = parts.as_slice() else { bail!(Runtime, "split", "a joint trace returns (outputs, grads)") };
    let backward = live_backward(t, backward, grads);
    let sources = sources(t, primal_inputs, forward);
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
        let Some(Source::Prim(bsym)) = sources.get(&v).copied() else { return Ok(None) };
        if !recomputable(bsym) {
            return Ok(None);
        }
        bsym.for_each_input(|i| need(i, &mut seen, &mut heap));
        for_each_param_size(t, bsym, &mut |i| need(i, &mut seen, &mut heap));
        recomputed.push(BoundSymbol { subsymbols: Default::default(), grad: None, ..bsym.clone() });
    }
    recomputed.sort_by_key(|b| b.outputs[0]);
    recomputed.extend(backward);
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
fn choose_residuals(
    t: &Trace,
    sources: &FxHashMap<ValueId, Source>,
    needed: Vec<ValueId>,
) -> (Vec<ValueId>, Vec<BoundSymbol>) {
    let mut seen = vec![false; t.values.len()];
    let mut heap = BinaryHeap::new();
    for v in needed {
        if !std::mem::replace(&mut seen[v.index()], true) {
            heap.push(v);
        }
    }
    let (mut residuals, mut recomputed) = (Vec::new(), Vec::new());
    while let Some(v) = heap.pop() {
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
    (residuals, recomputed)
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
    use trace_ir::{DType, Device, TensorMeta, TraceBuilder};

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
        let whole = split(&joint(&trace).unwrap().unwrap()).unwrap();
        let partial = joint_without(&trace, &[0]).unwrap().unwrap();
        let backward = backward_from(&partial, &whole.residuals).unwrap().expect("its values are saved");
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

    #[test]
    fn a_backward_without_a_cotangent_needing_a_value_not_saved_is_none() {
        let partial = joint_without(&two_outputs(), &[0]).unwrap().unwrap();
        assert!(backward_from(&partial, &[]).unwrap().is_none(), "sin's backward reads x, not saved");
    }
}
