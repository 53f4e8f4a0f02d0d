//! Cotangent markers a backward does not need.
//!
//! A custom `torch.autograd.Function`'s backward reads each cotangent through a marker call
//! (`thunder_rs.core.lang.fallback.materialized`, an opaque identity) at which the walk of absent
//! gradients ([`crate::absent::absent_outputs`]) stops: eager gives such a backward zeros for an
//! undefined gradient. Absent gradients come only from opaque backwards (`<fallback>.vjp` calls);
//! a backward without one never walks them, and its markers are plain identities. [`drop_markers`]
//! removes them there, so that they cost no call per cotangent and split no fusion region.

use crate::PassCx;
use rustc_hash::FxHashMap;
use trace_ir::{Arg, BoundSymbol, Result, Symbol, Trace, ValueId};

/// The name of the marker's symbol (the qualified name of the Python function the marker calls);
/// a symbol registered under an autocast state has suffixes (`.autocast_cuda_bfloat16`).
pub const MARKER: &str = "thunder_rs.core.lang.fallback._materialize";

fn is_marker(b: &BoundSymbol) -> bool {
    if !matches!(b.symbol, Symbol::Fallback(_)) || b.outputs.len() != 1 {
        return false;
    }
    let name = b.symbol.qualified_name();
    name.strip_prefix(MARKER).is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

/// Whether a call at any depth is an opaque backward (`<fallback>.vjp`), which may give absent
/// gradients.
fn has_opaque_backward(bsyms: &[BoundSymbol]) -> bool {
    bsyms.iter().any(|b| {
        (matches!(b.symbol, Symbol::Fallback(_)) && b.symbol.qualified_name().ends_with(".vjp"))
            || has_opaque_backward(&b.subsymbols)
    })
}

/// `trace` without its top-level marker calls, each output replaced by the marker's input, where
/// no opaque backward gives absent gradients; else `trace` as it is (the markers stop them).
pub fn drop_markers(trace: &Trace, _cx: &PassCx) -> Result<Trace> {
    if !trace.bsyms.iter().any(is_marker) || has_opaque_backward(&trace.bsyms) {
        return Ok(trace.clone());
    }
    let mut subst: FxHashMap<ValueId, ValueId> = FxHashMap::default();
    let mut bsyms = Vec::with_capacity(trace.bsyms.len());
    for b in &trace.bsyms {
        let b = b.renamed(&subst);
        match (is_marker(&b), b.args.as_slice()) {
            (true, [Arg::Value(input)]) if b.kwargs.is_empty() => {
                subst.insert(b.outputs[0], *input);
            }
            _ => bsyms.push(b),
        }
    }
    let outputs = trace.outputs.map_values(&mut |v| Arg::Value(*subst.get(&v).unwrap_or(&v)));
    Ok(trace.with_bsyms(bsyms, outputs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace_ir::symbols::{SymbolKind, SymbolTable};
    use trace_ir::{DType, Device, TensorMeta, TraceBuilder, ValueKind};

    fn tensor() -> ValueKind {
        ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, vec![4]))
    }

    /// `g -> marker -> exp`, returning the marker's output too; with `vjp`, an opaque backward
    /// gives the cotangent first.
    fn backward(vjp: bool) -> Trace {
        let mut b = TraceBuilder::new();
        let g = b.add_input(tensor());
        let g = if vjp {
            let id = SymbolTable::register("tests.opaque.vjp", SymbolKind::Fallback);
            let out = b.add_value(tensor());
            b.push_bsym(BoundSymbol::new(Symbol::Fallback(id), vec![Arg::Value(g)], vec![out]));
            out
        } else {
            g
        };
        let marker = SymbolTable::register(&format!("{MARKER}.autocast_cuda_bfloat16"), SymbolKind::Fallback);
        let m = b.add_value(tensor());
        b.push_bsym(BoundSymbol::new(Symbol::Fallback(marker), vec![Arg::Value(g)], vec![m]));
        let e = b.record_prim("exp", vec![Arg::Value(m)]).unwrap()[0];
        b.finish(Arg::Tuple(vec![Arg::Value(e), Arg::Value(m)])).unwrap()
    }

    #[test]
    fn markers_go_without_opaque_backwards_and_stay_with_one() {
        let cx = PassCx { verify: true, dump: vec![] };
        let dropped = drop_markers(&backward(false), &cx).unwrap();
        trace_ir::verify::verify(&dropped).unwrap();
        assert_eq!(dropped.bsyms.len(), 1);
        let g = dropped.inputs[0];
        assert_eq!(dropped.bsyms[0].args, vec![Arg::Value(g)]);
        assert!(matches!(&dropped.outputs, Arg::Tuple(items) if items[1] == Arg::Value(g)));
        let kept = backward(true);
        assert_eq!(drop_markers(&kept, &cx).unwrap(), kept);
    }
}
