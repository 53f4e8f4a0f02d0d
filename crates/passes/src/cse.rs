//! Common-subexpression elimination.

use crate::PassCx;
use rustc_hash::{FxHashMap, FxHashSet, FxHasher};
use std::hash::{Hash, Hasher};
use trace_ir::{Arg, BoundSymbol, Result, Symbol, Trace, ValueId};

/// Whether each output requires grad: a call recorded under `torch.no_grad()` differs from the
/// same call recorded with grad mode on, whose outputs gradients flow through.
fn output_grads(trace: &Trace, bsym: &BoundSymbol) -> u64 {
    bsym.outputs
        .iter()
        .enumerate()
        .map(|(i, &o)| u64::from(trace.tensor(o).is_some_and(|t| t.requires_grad)) << (i % 64))
        .fold(0, |a, b| a | b)
}

/// The hash of a call's identity: what it calls, with which (renamed) arguments, and which
/// outputs require grad.
fn call_hash(trace: &Trace, bsym: &BoundSymbol) -> u64 {
    let mut h = FxHasher::default();
    (&bsym.symbol, &bsym.args, &bsym.kwargs, output_grads(trace, bsym)).hash(&mut h);
    h.finish()
}

fn same_call(trace: &Trace, a: &BoundSymbol, b: &BoundSymbol) -> bool {
    a.symbol == b.symbol
        && a.args == b.args
        && a.kwargs == b.kwargs
        && a.outputs.len() == b.outputs.len()
        && a.outputs
            .iter()
            .zip(&b.outputs)
            .all(|(&x, &y)| trace.tensor(x).map(|t| t.requires_grad) == trace.tensor(y).map(|t| t.requires_grad))
}

/// Whether two equal calls are guaranteed to give equal results.
fn is_pure(symbol: &Symbol) -> bool {
    match symbol {
        Symbol::Prim(p) => !p.is_random(),
        Symbol::Composite(_) => true,
        Symbol::Fallback(_) | Symbol::Region(_) => false,
    }
}

/// Replaces each call equal to an earlier call by the earlier call's outputs. Random prims,
/// fallbacks and effects are never merged; a composite containing a random prim is not merged
/// either; nor are two calls of which one's outputs require grad and the other's do not; nor two
/// calls whose outputs are both returned.
///
/// Calls are found by hash and confirmed by comparison with the kept call, so no key is cloned;
/// a hash collision can only miss a merge, never make a wrong one.
pub fn cse(trace: &Trace, _cx: &PassCx) -> Result<Trace> {
    merge_repeated(trace, false)
}

/// [`cse`] of the calls no gradient flows through, before autodiff. Two equal calls a gradient
/// flows through are two nodes of eager's autograd graph: DebertaLayerNorm's two `x - mean`
/// each reduce their cotangent for `mean`, which one merged call would reduce once, summed
/// (another rounding). The forward half merges them after the split, where no gradient is
/// computed from them any more.
pub fn cse_undifferentiated(trace: &Trace, _cx: &PassCx) -> Result<Trace> {
    merge_repeated(trace, true)
}

fn merge_repeated(trace: &Trace, keep_differentiable: bool) -> Result<Trace> {
    let mut subst: FxHashMap<ValueId, ValueId> = FxHashMap::default();
    let mut seen: FxHashMap<u64, usize> = FxHashMap::default();
    let mut kept: Vec<BoundSymbol> = Vec::with_capacity(trace.bsyms.len());
    let mut returned = FxHashSet::default();
    trace.outputs.for_each_value(&mut |v| {
        returned.insert(v);
    });
    // Two returned values stay two tensors (`return torch.zeros(n), torch.zeros(n)`, two equal
    // gradients): eager gives separate memory, which a caller may write to one at a time.
    let returns = |b: &BoundSymbol| b.outputs.iter().any(|o| returned.contains(o));
    for bsym in &trace.bsyms {
        let renamed = bsym.renamed(&subst);
        if !is_pure_deep(&renamed) || (keep_differentiable && output_grads(trace, &renamed) != 0) {
            kept.push(renamed);
            continue;
        }
        let hash = call_hash(trace, &renamed);
        match seen.get(&hash).map(|&i| &kept[i]) {
            Some(earlier) if same_call(trace, earlier, &renamed) && !(returns(earlier) && returns(&renamed)) => {
                for (&o, &e) in renamed.outputs.iter().zip(&earlier.outputs) {
                    subst.insert(o, e);
                }
            }
            _ => {
                seen.insert(hash, kept.len());
                kept.push(renamed);
            }
        }
    }
    let outputs = trace.outputs.map_values(&mut |v| Arg::Value(*subst.get(&v).unwrap_or(&v)));
    Ok(trace.with_bsyms(kept, outputs))
}

fn is_pure_deep(bsym: &BoundSymbol) -> bool {
    is_pure(&bsym.symbol) && bsym.subsymbols.iter().all(is_pure_deep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace_ir::{DType, Device, Scalar, TensorMeta, TraceBuilder, ValueKind};

    fn input(b: &mut TraceBuilder) -> ValueId {
        b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, vec![2, 2])))
    }

    #[test]
    fn merges_equal_pure_calls_and_renames_uses() {
        let mut b = TraceBuilder::new();
        let x = input(&mut b);
        let a = b.record_prim("exp", vec![Arg::Value(x)]).unwrap()[0];
        let a2 = b.record_prim("exp", vec![Arg::Value(x)]).unwrap()[0];
        let s = b.record_prim("add", vec![Arg::Value(a), Arg::Value(a2)]).unwrap()[0];
        let trace = b.finish(Arg::Value(s)).unwrap();
        let out = cse(&trace, &PassCx::default()).unwrap();
        assert_eq!(out.bsyms.len(), 2);
        assert_eq!(out.bsyms[1].args, vec![Arg::Value(a), Arg::Value(a)]);
    }

    #[test]
    fn never_merges_random_prims() {
        let mut b = TraceBuilder::new();
        let params = || {
            vec![
                Arg::ints(&[2]),
                Arg::Scalar(Scalar::Float(0.0)),
                Arg::Scalar(Scalar::Float(1.0)),
                Arg::Device(Device::CPU),
                Arg::DType(DType::F32),
            ]
        };
        let u1 = b.record_prim("uniform", params()).unwrap()[0];
        let u2 = b.record_prim("uniform", params()).unwrap()[0];
        let trace = b.finish(Arg::Tuple(vec![Arg::Value(u1), Arg::Value(u2)])).unwrap();
        assert_eq!(cse(&trace, &PassCx::default()).unwrap().bsyms.len(), 2);
    }

    #[test]
    fn never_merges_a_no_grad_call_with_a_differentiable_one() {
        let mut b = TraceBuilder::new();
        let mut meta = TensorMeta::new(DType::F32, Device::CPU, vec![2]);
        meta.requires_grad = true;
        let x = b.add_input(ValueKind::Tensor(meta));
        b.set_grad_enabled(false);
        let frozen = b.record_prim("mul", vec![Arg::Value(x), Arg::Scalar(Scalar::Float(3.0))]).unwrap()[0];
        b.set_grad_enabled(true);
        let live = b.record_prim("mul", vec![Arg::Value(x), Arg::Scalar(Scalar::Float(3.0))]).unwrap()[0];
        let trace = b.finish(Arg::Tuple(vec![Arg::Value(frozen), Arg::Value(live)])).unwrap();
        assert!(!trace.tensor(frozen).unwrap().requires_grad);
        assert_eq!(cse(&trace, &PassCx::default()).unwrap().bsyms.len(), 2);
    }

    #[test]
    fn before_autodiff_merges_only_calls_no_gradient_flows_through() {
        let mut b = TraceBuilder::new();
        let mut meta = TensorMeta::new(DType::F32, Device::CPU, vec![2]);
        meta.requires_grad = true;
        let x = b.add_input(ValueKind::Tensor(meta));
        let exp = |b: &mut TraceBuilder| b.record_prim("exp", vec![Arg::Value(x)]).unwrap()[0];
        let (e1, e2) = (exp(&mut b), exp(&mut b));
        let se = b.record_prim("add", vec![Arg::Value(e1), Arg::Value(e2)]).unwrap()[0];
        b.set_grad_enabled(false);
        let (f1, f2) = (exp(&mut b), exp(&mut b));
        let sf = b.record_prim("add", vec![Arg::Value(f1), Arg::Value(f2)]).unwrap()[0];
        let trace = b.finish(Arg::Tuple(vec![Arg::Value(se), Arg::Value(sf)])).unwrap();
        let out = cse_undifferentiated(&trace, &PassCx::default()).unwrap();
        assert_eq!(out.bsyms.len(), 5); // e1 and e2 kept apart, f2 merged into f1
        assert_eq!(out.bsyms[2].args, vec![Arg::Value(e1), Arg::Value(e2)]);
        assert_eq!(out.bsyms[4].args, vec![Arg::Value(f1), Arg::Value(f1)]);
        assert_eq!(cse(&trace, &PassCx::default()).unwrap().bsyms.len(), 4);
    }
}
