//! Traces for benchmarks and tests outside this crate (the pass-scaling benchmark, the plugin
//! crossing cost, the binary form's round trips); not part of the IR's API.

use crate::dtype::{DType, Device};
use crate::ids::ValueId;
use crate::symbols::{SymbolKind, SymbolTable};
use crate::trace::{Trace, TraceBuilder};
use crate::value::{Arg, TensorMeta, ValueKind};

/// The synthetic program of `make bench-passes`: a chain of `n` elementwise prims over two
/// grad-requiring `f32[16, 16]` inputs in which every third step recomputes an earlier value
/// (work for CSE) and every fifth step is never used (work for DCE).
pub fn synthetic_chain(n: usize) -> Trace {
    synthetic_chain_of(n, false)
}

/// [`synthetic_chain`], each step a composite `bench.step` whose decomposition is three prims
/// when `composite` is set (what clones and passes pay for decompositions).
pub fn synthetic_chain_of(n: usize, composite: bool) -> Trace {
    let mut b = TraceBuilder::new();
    let meta = TensorMeta { requires_grad: true, ..TensorMeta::new(DType::F32, Device::CPU, vec![16, 16]) };
    let x = b.add_input(ValueKind::Tensor(meta.clone()));
    let y = b.add_input(ValueKind::Tensor(meta));
    let (mut live, mut previous) = (x, y);
    for i in 0..n {
        let b = &mut b;
        let out = match i % 5 {
            0 => step(b, composite, "exp", vec![Arg::Value(previous)]),
            1 => step(b, composite, "add", vec![Arg::Value(live), Arg::Value(y)]),
            2 => step(b, composite, "exp", vec![Arg::Value(previous)]), // duplicates step 0
            3 => step(b, composite, "mul", vec![Arg::Value(live), Arg::Value(live)]),
            _ => step(b, composite, "sin", vec![Arg::Value(x)]), // dead
        };
        if i % 5 != 4 {
            previous = live;
            live = out;
        }
    }
    b.finish(Arg::Value(live)).expect("synthetic trace is complete")
}

/// Records `prims.<name>(*args)`, inside a composite call when `composite` is set.
fn step(b: &mut TraceBuilder, composite: bool, name: &str, args: Vec<Arg>) -> ValueId {
    if !composite {
        return b.record_prim(name, args).expect("synthetic prims are valid")[0];
    }
    b.begin_composite(SymbolTable::register("bench.step", SymbolKind::Composite), args.clone(), Vec::new());
    let negated = b.record_prim("neg", vec![args[0].clone()]).expect("neg is valid")[0];
    let first = b.record_prim("neg", vec![Arg::Value(negated)]).expect("neg is valid")[0];
    let rest = args[1..].iter().map(|a| if *a == args[0] { Arg::Value(first) } else { a.clone() });
    let out = b.record_prim(name, std::iter::once(Arg::Value(first)).chain(rest).collect()).expect("valid")[0];
    b.end_composite(vec![out]).expect("the composite is open");
    out
}
