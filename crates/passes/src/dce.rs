//! Dead-code elimination.

use crate::PassCx;
use trace_ir::{Result, Trace};

/// Removes top-level bound symbols none of whose outputs reach the trace's outputs, except
/// calls with an effect (random draws advance the generator even when their values are unused).
pub fn dce(trace: &Trace, _cx: &PassCx) -> Result<Trace> {
    let mut live = vec![false; trace.values.len()];
    trace.outputs.for_each_value(&mut |v| live[v.index()] = true);
    let mut kept = Vec::with_capacity(trace.bsyms.len());
    for bsym in trace.bsyms.iter().rev() {
        if bsym.outputs.iter().any(|o| live[o.index()]) || bsym.has_effect() {
            bsym.for_each_input(|v| live[v.index()] = true);
            kept.push(bsym.clone());
        }
    }
    kept.reverse();
    Ok(trace.with_bsyms(kept, trace.outputs.clone()))
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
