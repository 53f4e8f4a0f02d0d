//! The backward of a call whose backward reaches only some of its outputs (`loss.backward()` of a
//! call returning the loss and the logits): the other outputs' cotangents are absent. Eager's
//! autograd never runs the backward of what only they reach, and adds nothing where they would
//! join another gradient; the trace's backward, given zeros for them, would compute that backward
//! on zeros (`g / x` of a `log` output is NaN where `x` is 0, and a gradient of the logits laid
//! out row-major by the zeros added first sums in another order than eager's) and add it.
//!
//! So the backward for this pattern drops every call that reads absent values and no value
//! computed from a present cotangent (a gradient rule is linear in the cotangents it reads: its
//! result is absent too), and an `add` of an absent value and another gradient of its dtype and
//! shape is that gradient. A gradient of an input that is absent is None, as eager gives it none.
//!
//! The pipeline first differentiates the program without the absent cotangents' flow
//! ([`crate::vjp::joint_without`], whose ops' backwards get None for them, as eager's nodes do);
//! this pruning is for a backward that needs a value the whole forward does not save
//! ([`crate::split::backward_from`]).

use rustc_hash::{FxHashMap, FxHashSet};
use trace_ir::prims::{Binary, Prim};
use trace_ir::{Arg, BoundSymbol, Symbol, TensorMeta, Trace, ValueId};

/// `backward` (inputs: residuals, then `num_cotangents` cotangents; [`crate::split`]'s) with the
/// cotangents at the indices `absent` absent, as the module doc says. None when an absent value
/// meets a present gradient other than in such an `add` (the caller then passes zeros, as eager
/// passes zeros for the outputs of one call that the backward does not reach).
pub fn without_cotangents(backward: &Trace, num_cotangents: usize, absent: &[usize]) -> Option<Trace> {
    let first = backward.inputs.len().checked_sub(num_cotangents)?;
    let cotangents = &backward.inputs[first..];
    let zeros: FxHashMap<ValueId, ValueId> =
        absent.iter().map(|&k| cotangents.get(k).map(|&v| (v, v))).collect::<Option<_>>()?;
    let present: FxHashMap<ValueId, ValueId> =
        cotangents.iter().filter(|v| !zeros.contains_key(v)).map(|&v| (v, v)).collect();
    let same = |a: ValueId, b: ValueId| same_tensor(backward.tensor(a), backward.tensor(b));
    let pruned = prune(&backward.bsyms, zeros, present, &same)?;
    let outputs = backward.outputs.map_values(&mut |v| pruned.resolve(v).map_or(Arg::None, Arg::Value));
    Some(backward.with_bsyms(pruned.kept, outputs))
}

/// The positions in `backward`'s outputs (a tuple; inputs: residuals, then `num_cotangents`
/// cotangents) of the gradients that are absent where the values `absent` are: gradients an
/// opaque call's backward gave none (eager's None; `core.lang.fallback.no_gradient` made zeros for
/// them). A value is absent where its call reads absent values and none computed from the
/// cotangents, as eager's nodes given only undefined gradients give undefined ones, except the
/// values `materialized` (a custom autograd.Function's backward is given zeros for an undefined
/// gradient); an input whose gradient is absent gets None, as eager leaves its `.grad`.
pub fn absent_outputs(
    backward: &Trace,
    num_cotangents: usize,
    absent: &[ValueId],
    materialized: &[ValueId],
) -> Vec<usize> {
    let first = backward.inputs.len().saturating_sub(num_cotangents);
    let given: FxHashSet<ValueId> = absent.iter().copied().collect();
    let mut zeros: FxHashMap<ValueId, ValueId> = FxHashMap::default();
    let mut present: FxHashMap<ValueId, ValueId> = backward.inputs[first..].iter().map(|&v| (v, v)).collect();
    present.extend(materialized.iter().map(|&v| (v, v)));
    for bsym in &backward.bsyms {
        let (reads_absent, reads_present) = (bsym.reads_any(&zeros), bsym.reads_any(&present));
        for &o in &bsym.outputs {
            if present.contains_key(&o) {
                continue;
            }
            if given.contains(&o) || (reads_absent && !reads_present) {
                zeros.insert(o, o);
            } else if reads_present {
                present.insert(o, o);
            }
        }
    }
    let Arg::Tuple(items) = &backward.outputs else { return Vec::new() };
    let is_absent = |a: &Arg| matches!(a, Arg::Value(v) if zeros.contains_key(v));
    items.iter().enumerate().filter(|(_, a)| is_absent(a)).map(|(i, _)| i).collect()
}

/// What is left of calls pruned of absent values ([`prune`]).
pub(crate) struct Pruned {
    /// The calls kept, reading the other addend of each add of an absent value dropped.
    pub kept: Vec<BoundSymbol>,
    /// Per output of an add of an absent value dropped, its other addend.
    subst: FxHashMap<ValueId, ValueId>,
    /// The absent values: those given, and the outputs of the calls dropped that read them.
    zeros: FxHashMap<ValueId, ValueId>,
}

impl Pruned {
    /// `v` as the kept calls have it (an add of an absent value: its other addend); None where it
    /// is absent.
    pub fn resolve(&self, v: ValueId) -> Option<ValueId> {
        let v = *self.subst.get(&v).unwrap_or(&v);
        (!self.zeros.contains_key(&v)).then_some(v)
    }
}

/// `bsyms` (a backward: linear in the gradients it reads) without the calls that read the absent
/// values `zeros` and no value computed from the present gradients `present` (their outputs are
/// absent too), an add of an absent value and a present gradient of its output's dtype and shape
/// being that gradient (`same(a, b)`: whether the values `a` and `b` have one dtype, device and
/// shape), and so a composite whose decomposition pruned keeps no call. None where an absent
/// value meets a present gradient otherwise.
pub(crate) fn prune(
    bsyms: &[BoundSymbol],
    mut zeros: FxHashMap<ValueId, ValueId>,
    mut present: FxHashMap<ValueId, ValueId>,
    same: &dyn Fn(ValueId, ValueId) -> bool,
) -> Option<Pruned> {
    let mut subst: FxHashMap<ValueId, ValueId> = FxHashMap::default();
    let mut kept = Vec::with_capacity(bsyms.len());
    for bsym in bsyms {
        let renamed = bsym.renamed(&subst);
        let (reads_absent, reads_present) = (renamed.reads_any(&zeros), renamed.reads_any(&present));
        if !reads_absent {
            if reads_present {
                present.extend(renamed.outputs.iter().map(|&o| (o, o)));
            }
            kept.push(renamed);
        } else if !reads_present {
            zeros.extend(renamed.outputs.iter().map(|&o| (o, o)));
        } else if let Some(other) = other_addend(&renamed, &zeros, same) {
            subst.insert(renamed.outputs[0], other);
        } else {
            // A composite whose decomposition, pruned, keeps no call (a grad rule's `ltorch.add`:
            // a broadcast of the absent operand to its own shape, then the add): each output is
            // what its decomposition's is.
            if renamed.subsymbols.is_empty() || matches!(renamed.symbol, Symbol::Prim(_)) {
                return None;
            }
            let inner = prune(&renamed.subsymbols, zeros.clone(), present.clone(), same)?;
            if !inner.kept.is_empty() {
                return None;
            }
            for &o in &renamed.outputs {
                match inner.resolve(o) {
                    Some(v) => subst.insert(o, v),
                    None => zeros.insert(o, o),
                };
            }
        }
    }
    Some(Pruned { kept, subst, zeros })
}

/// Whether two tensors have one dtype, device and shape. (Not `requires_grad`: the backward runs
/// without grad, and an absent value computed from a residual that required grad, `g / probs`, is
/// marked so where the other gradient is not.)
pub(crate) fn same_tensor(a: Option<&TensorMeta>, b: Option<&TensorMeta>) -> bool {
    a.zip(b).is_some_and(|(a, b)| a.dtype == b.dtype && a.device == b.device && a.shape == b.shape)
}

/// For a call reading an absent value and a present gradient: the gradient, when the call is the
/// `add` prim of the two and its output has the gradient's dtype and shape; None for any other.
fn other_addend(
    bsym: &BoundSymbol,
    zeros: &FxHashMap<ValueId, ValueId>,
    same: &dyn Fn(ValueId, ValueId) -> bool,
) -> Option<ValueId> {
    let Symbol::Prim(Prim::Binary(Binary::Add)) = bsym.symbol else { return None };
    if bsym.args.len() != 2 || bsym.outputs.len() != 1 {
        return None;
    }
    let (Some(a), Some(b)) = (bsym.args[0].as_value(), bsym.args[1].as_value()) else { return None };
    let other = match (zeros.contains_key(&a), zeros.contains_key(&b)) {
        (true, false) => b,
        (false, true) => a,
        _ => return None,
    };
    same(other, bsym.outputs[0]).then_some(other)
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace_ir::{DType, Device, SymbolKind, SymbolTable, TraceBuilder, ValueKind};

    fn tensor(b: &mut TraceBuilder, shape: Vec<i64>) -> ValueId {
        b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, shape)))
    }

    /// `(saved, ct_loss, ct_logits) -> (saved * ct_loss + ct_logits,)`.
    fn backward() -> Trace {
        let mut b = TraceBuilder::new();
        let saved = tensor(&mut b, vec![2, 2]);
        let _ct_loss = tensor(&mut b, vec![2, 2]);
        let ct_logits = tensor(&mut b, vec![2, 2]);
        let g = b.record_prim("mul", vec![Arg::Value(saved), Arg::Value(_ct_loss)]).unwrap()[0];
        let sum = b.record_prim("add", vec![Arg::Value(ct_logits), Arg::Value(g)]).unwrap()[0];
        let e = b.record_prim("exp", vec![Arg::Value(sum)]).unwrap()[0];
        b.finish(Arg::Tuple(vec![Arg::Value(e)])).unwrap()
    }

    #[test]
    fn an_absent_cotangent_added_to_a_gradient_is_that_gradient() {
        let t = backward();
        let out = without_cotangents(&t, 2, &[1]).unwrap();
        assert_eq!(out.bsyms.len(), 2, "{out}");
        let g = t.bsyms[0].outputs[0];
        assert_eq!(out.bsyms[1].args, vec![Arg::Value(g)]);
    }

    #[test]
    fn what_only_an_absent_cotangent_reaches_is_dropped() {
        let t = backward();
        let out = without_cotangents(&t, 2, &[0]).unwrap();
        assert_eq!(out.bsyms.len(), 1, "the mul of the loss's cotangent and its add are gone: {out}");
        assert_eq!(out.bsyms[0].args, vec![Arg::Value(t.inputs[2])]);
    }

    #[test]
    fn an_absent_gradient_of_an_input_is_none() {
        let mut b = TraceBuilder::new();
        let saved = tensor(&mut b, vec![2, 2]);
        let (ct_a, ct_b) = (tensor(&mut b, vec![2, 2]), tensor(&mut b, vec![2, 2]));
        let ga = b.record_prim("mul", vec![Arg::Value(saved), Arg::Value(ct_a)]).unwrap()[0];
        let gb = b.record_prim("mul", vec![Arg::Value(saved), Arg::Value(ct_b)]).unwrap()[0];
        let t = b.finish(Arg::Tuple(vec![Arg::Value(ga), Arg::Value(gb)])).unwrap();
        let out = without_cotangents(&t, 2, &[1]).unwrap();
        assert_eq!(out.outputs, Arg::Tuple(vec![Arg::Value(ga), Arg::None]), "{out}");
    }

    #[test]
    fn a_composite_adding_an_absent_cotangent_to_a_gradient_is_that_gradient() {
        let id = SymbolTable::register("ltorch.test_absent_add", SymbolKind::Composite);
        let mut b = TraceBuilder::new();
        let (ct_a, ct_b) = (tensor(&mut b, vec![2, 2]), tensor(&mut b, vec![2, 2]));
        b.begin_composite(id, vec![Arg::Value(ct_a), Arg::Value(ct_b)], vec![]);
        let sum = b.record_prim("add", vec![Arg::Value(ct_a), Arg::Value(ct_b)]).unwrap()[0];
        b.end_composite(vec![sum]).unwrap();
        let e = b.record_prim("exp", vec![Arg::Value(sum)]).unwrap()[0];
        let t = b.finish(Arg::Tuple(vec![Arg::Value(e)])).unwrap();
        let out = without_cotangents(&t, 2, &[1]).unwrap();
        assert_eq!(out.bsyms.len(), 1, "{out}");
        assert_eq!(out.bsyms[0].args, vec![Arg::Value(ct_a)]);
    }

    #[test]
    fn an_absent_value_meeting_a_gradient_other_than_in_an_add_is_refused() {
        let mut b = TraceBuilder::new();
        let (ct_a, ct_b) = (tensor(&mut b, vec![2, 2]), tensor(&mut b, vec![2, 2]));
        let g = b.record_prim("mul", vec![Arg::Value(ct_a), Arg::Value(ct_b)]).unwrap()[0];
        let t = b.finish(Arg::Tuple(vec![Arg::Value(g)])).unwrap();
        assert!(without_cotangents(&t, 2, &[0]).is_none());
        assert!(without_cotangents(&backward(), 5, &[0]).is_none(), "more cotangents than inputs");
    }

    /// `(saved, ct) -> (g * saved, view(g) + ct, exp(saved))` where `g` is a gradient an opaque
    /// call gave none: the first is absent, the second meets the cotangent, the third reads neither.
    #[test]
    fn what_only_absent_gradients_reach_is_absent() {
        let mut b = TraceBuilder::new();
        let saved = tensor(&mut b, vec![2, 2]);
        let ct = tensor(&mut b, vec![2, 2]);
        let g = b.record_prim("neg", vec![Arg::Value(ct)]).unwrap()[0];
        let scaled = b.record_prim("mul", vec![Arg::Value(g), Arg::Value(saved)]).unwrap()[0];
        let twice = b.record_prim("mul", vec![Arg::Value(scaled), Arg::Value(saved)]).unwrap()[0];
        let met = b.record_prim("add", vec![Arg::Value(g), Arg::Value(ct)]).unwrap()[0];
        let e = b.record_prim("exp", vec![Arg::Value(saved)]).unwrap()[0];
        let t = b.finish(Arg::Tuple(vec![Arg::Value(twice), Arg::Value(met), Arg::Value(e)])).unwrap();
        assert_eq!(absent_outputs(&t, 1, &[g], &[]), vec![0]);
        assert_eq!(absent_outputs(&t, 1, &[], &[]), Vec::<usize>::new());
        assert_eq!(absent_outputs(&t, 1, &[scaled], &[]), vec![0], "absent past the call that made it");
        assert_eq!(absent_outputs(&t, 1, &[g], &[scaled]), Vec::<usize>::new(), "materialized: present");
    }
}
