//! Snapshots of a recording in progress: what a data-dependent read evaluates (the calls so far,
//! open composites' decompositions included), the recording going on unchanged.

use trace_ir::parser::{parse_args, parse_value_type};
use trace_ir::verify::verify;
use trace_ir::{Arg, ErrorKind, SymbolKind, SymbolTable, TraceBuilder, ValueKind};

#[test]
fn a_snapshot_returns_the_values_asked_for_without_gradient_and_the_recording_goes_on() {
    let mut b = TraceBuilder::new();
    let x = b.add_input(parse_value_type("cpu f32[2] requires_grad").unwrap());
    let y = b.record_prim("sin", vec![Arg::Value(x)]).unwrap()[0];
    let (args, kwargs) = parse_args("t0").unwrap();
    b.begin_composite(SymbolTable::register("test.snapshot_outer", SymbolKind::Composite), args, kwargs);
    let z = b.record_prim("cos", vec![Arg::Value(y)]).unwrap()[0];

    let snapshot = b.snapshot(&[z]).unwrap();
    verify(&snapshot).unwrap();
    let names: Vec<String> = snapshot.bsyms.iter().map(|s| s.symbol.qualified_name().to_string()).collect();
    assert_eq!(names, ["prims.sin", "prims.cos"]); // the open composite's decomposition, flat
    assert_eq!(snapshot.outputs, Arg::Tuple(vec![Arg::Value(z)]));
    assert!(matches!(snapshot.value(z), ValueKind::Tensor(t) if !t.requires_grad));

    b.end_composite(vec![z]).unwrap();
    let trace = b.finish(Arg::Value(z)).unwrap();
    assert!(matches!(trace.value(z), ValueKind::Tensor(t) if t.requires_grad));
    assert_eq!(trace.bsyms.len(), 2);
}

#[test]
fn a_snapshot_of_a_number_is_an_error() {
    let mut b = TraceBuilder::new();
    let n = b.add_input(parse_value_type("int 3").unwrap());
    assert_eq!(b.snapshot(&[n]).unwrap_err().kind, ErrorKind::Runtime);
}
