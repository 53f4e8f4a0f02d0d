//! Traces for benchmarks and tests outside this crate (the pass-scaling benchmark, the plugin
//! crossing cost, the binary form's round trips); not part of the IR's API.

use crate::dtype::{DType, Device};
use crate::trace::{Trace, TraceBuilder};
use crate::value::{Arg, TensorMeta, ValueKind};

/// The synthetic program of `make bench-passes`: a chain of `n` elementwise prims over two
/// grad-requiring `f32[16, 16]` inputs in which every third step recomputes an earlier value
/// (work for CSE) and every fifth step is never used (work for DCE).
pub fn synthetic_chain(n: usize) -> Trace {
    let mut b = TraceBuilder::new();
    let meta = TensorMeta { requires_grad: true, ..TensorMeta::new(DType::F32, Device::CPU, vec![16, 16]) };
    let x = b.add_input(ValueKind::Tensor(meta.clone()));
    let y = b.add_input(ValueKind::Tensor(meta));
    let (mut live, mut previous) = (x, y);
    for i in 0..n {
        let out = match i % 5 {
            0 => b.record_prim("exp", vec![Arg::Value(previous)]),
            1 => b.record_prim("add", vec![Arg::Value(live), Arg::Value(y)]),
            2 => b.record_prim("exp", vec![Arg::Value(previous)]), // duplicates step 0
            3 => b.record_prim("mul", vec![Arg::Value(live), Arg::Value(live)]),
            _ => b.record_prim("sin", vec![Arg::Value(x)]), // dead
        }
        .expect("synthetic prims are valid")[0];
        if i % 5 != 4 {
            previous = live;
            live = out;
        }
    }
    b.finish(Arg::Value(live)).expect("synthetic trace is complete")
}
