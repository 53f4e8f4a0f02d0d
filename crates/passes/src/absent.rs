//! The backward of a call whose backward reaches only some of its outputs (`loss.backward()` of a
//! call returning the loss and the logits): the other outputs' cotangents are absent, which is
//! zeros. Where an absent cotangent only joins another gradient (`add` of the logits' cotangent
//! and the loss's contribution to the logits' gradient), that `add` is the other gradient: the
//! backward for this pattern needs neither the zeros nor the add, which a step would otherwise
//! make in Python and run.

use rustc_hash::FxHashMap;
use trace_ir::prims::{Binary, Prim};
use trace_ir::{Arg, BoundSymbol, Symbol, Trace, ValueId};

/// `backward` (inputs: residuals, then `num_cotangents` cotangents; [`crate::split`]'s) with the
/// cotangents at the indices `absent` taken as zeros: each `add` of such a cotangent and a value
/// of the add's dtype and shape becomes that value. None when an absent cotangent has any other
/// use (an operand of another call, a returned gradient): the caller then passes zeros.
pub fn without_cotangents(backward: &Trace, num_cotangents: usize, absent: &[usize]) -> Option<Trace> {
    let first = backward.inputs.len().checked_sub(num_cotangents)?;
    let zeros: FxHashMap<ValueId, ValueId> =
        absent.iter().map(|&k| backward.inputs.get(first + k).map(|&v| (v, v))).collect::<Option<_>>()?;
    let mut returned = false;
    backward.outputs.for_each_value(&mut |v| returned |= zeros.contains_key(&v));
    if returned {
        return None;
    }
    let mut subst: FxHashMap<ValueId, ValueId> = FxHashMap::default();
    let mut kept = Vec::with_capacity(backward.bsyms.len());
    for bsym in &backward.bsyms {
        let renamed = bsym.renamed(&subst);
        match other_addend(backward, &renamed, &zeros) {
            Some(Some(other)) => {
                subst.insert(renamed.outputs[0], other);
            }
            Some(None) => return None,
            None => kept.push(renamed),
        }
    }
    let outputs = backward.outputs.map_values(&mut |v| Arg::Value(*subst.get(&v).unwrap_or(&v)));
    Some(backward.with_bsyms(kept, outputs))
}

/// For a call reading a value of `zeros` (at any depth): `Some(Some(other))` when it adds it to `other` of the
/// output's dtype and shape, `Some(None)` for any other use. None when it reads none of them.
fn other_addend(trace: &Trace, bsym: &BoundSymbol, zeros: &FxHashMap<ValueId, ValueId>) -> Option<Option<ValueId>> {
    if !bsym.reads_any(zeros) {
        return None;
    }
    let Symbol::Prim(Prim::Binary(Binary::Add)) = bsym.symbol else { return Some(None) };
    let (Some(a), Some(b)) = (bsym.args[0].as_value(), bsym.args[1].as_value()) else { return Some(None) };
    let other = match (zeros.contains_key(&a), zeros.contains_key(&b)) {
        (true, false) => b,
        (false, true) => a,
        _ => return Some(None),
    };
    let same = trace.tensor(other).zip(trace.tensor(bsym.outputs[0])).is_some_and(|(o, out)| {
        o.dtype == out.dtype && o.device == out.device && o.shape == out.shape && o.requires_grad == out.requires_grad
    });
    Some(same.then_some(other))
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace_ir::{DType, Device, TensorMeta, TraceBuilder, ValueKind};

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
    fn any_other_use_is_refused() {
        let t = backward();
        assert!(without_cotangents(&t, 2, &[0]).is_none(), "the loss's cotangent feeds a mul");
        assert!(without_cotangents(&t, 5, &[0]).is_none(), "more cotangents than inputs");
    }
}
