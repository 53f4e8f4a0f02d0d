//! Dead-code elimination.

use crate::PassCx;
use trace_ir::{Arg, BoundSymbol, Result, Trace};

/// Removes top-level bound symbols none of whose outputs reach the trace's outputs, except
/// calls with an effect (random draws advance the generator even when their values are unused).
pub fn dce(trace: &Trace, _cx: &PassCx) -> Result<Trace> {
    let live = live_calls(&trace.bsyms, &trace.outputs, trace.values.len());
    let kept = trace.bsyms.iter().zip(live).filter(|(_, l)| *l).map(|(b, _)| b.clone()).collect();
    Ok(trace.with_bsyms(kept, trace.outputs.clone()))
}

/// Whether each of `bsyms` is live: some output reaches `outputs`, or it has an effect.
pub(crate) fn live_calls(bsyms: &[BoundSymbol], outputs: &Arg, num_values: usize) -> Vec<bool> {
    let mut live = vec![false; num_values];
    outputs.for_each_value(&mut |v| live[v.index()] = true);
    let mut kept = vec![false; bsyms.len()];
    for (i, bsym) in bsyms.iter().enumerate().rev() {
        if bsym.outputs.iter().any(|o| live[o.index()]) || bsym.has_effect() {
            bsym.for_each_input(|v| live[v.index()] = true);
            kept[i] = true;
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace_ir::{Arg, DType, Device, TensorMeta, TraceBuilder, ValueKind};

    #[test]
    fn removes_unused_chains_and_keeps_used_ones() {
        let mut b = TraceBuilder::new();
        let x = b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, vec![4])));
        let dead = b.record_prim("exp", vec![Arg::Value(x)]).unwrap()[0];
        b.record_prim("sin", vec![Arg::Value(dead)]).unwrap();
        let live = b.record_prim("cos", vec![Arg::Value(x)]).unwrap()[0];
        let trace = b.finish(Arg::Value(live)).unwrap();
        let out = dce(&trace, &PassCx::default()).unwrap();
        let names: Vec<String> = out.bsyms.iter().map(|b| b.symbol.qualified_name()).collect();
        assert_eq!(names, ["prims.cos"]);
    }

    #[test]
    fn keeps_unused_random_draws() {
        let mut b = TraceBuilder::new();
        let x = b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, vec![2])));
        let params = vec![
            Arg::ints(&[2]),
            Arg::Scalar(trace_ir::Scalar::Float(0.0)),
            Arg::Scalar(trace_ir::Scalar::Float(1.0)),
            Arg::Device(Device::CPU),
            Arg::DType(DType::F32),
        ];
        b.record_prim("uniform", params).unwrap();
        let live = b.record_prim("cos", vec![Arg::Value(x)]).unwrap()[0];
        let trace = b.finish(Arg::Value(live)).unwrap();
        let out = dce(&trace, &PassCx::default()).unwrap();
        let names: Vec<String> = out.bsyms.iter().map(|b| b.symbol.qualified_name()).collect();
        assert_eq!(names, ["prims.uniform", "prims.cos"]);
    }
}
