//! Open composite calls taken off a builder while another thread records: each thread's calls
//! nest in its own open calls, and a composite reaches the trace when it ends.

use trace_ir::parser::{parse_args, parse_value_type};
use trace_ir::{Arg, ErrorKind, SymbolKind, SymbolTable, TraceBuilder};

#[test]
fn calls_recorded_while_another_threads_composite_is_open_stay_at_the_top_level() {
    let mut b = TraceBuilder::new();
    let x = b.add_input(parse_value_type("cpu f32[2]").unwrap());
    let (args, kwargs) = parse_args("t0").unwrap();
    b.begin_composite(SymbolTable::register("test.outer", SymbolKind::Composite), args, kwargs);
    let inner = b.record_prim("sin", vec![Arg::Value(x)]).unwrap();

    let open = b.take_open(); // another thread records a top-level call meanwhile
    assert_eq!((open.len(), b.depth()), (1, 0));
    let other = b.record_prim("cos", vec![Arg::Value(x)]).unwrap();
    b.restore_open(open).unwrap();

    assert_eq!(b.depth(), 1);
    b.end_composite(inner.clone()).unwrap();
    let trace = b.finish(Arg::Tuple(vec![Arg::Value(inner[0]), Arg::Value(other[0])])).unwrap();
    let names: Vec<String> = trace.bsyms.iter().map(|s| s.symbol.qualified_name().to_string()).collect();
    assert_eq!(names, ["prims.cos", "test.outer"]);
    assert_eq!(trace.bsyms[1].subsymbols.len(), 1);
}

#[test]
fn restoring_over_open_calls_is_an_error() {
    let mut b = TraceBuilder::new();
    let symbol = SymbolTable::register("test.outer2", SymbolKind::Composite);
    b.begin_composite(symbol, vec![], vec![]);
    let open = b.take_open();
    b.begin_composite(symbol, vec![], vec![]);
    let err = b.restore_open(open).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Runtime);
}

#[test]
fn is_read_finds_reads_at_the_top_level_and_by_open_composites() {
    let mut b = TraceBuilder::new();
    let x = b.add_input(parse_value_type("cpu f32[2]").unwrap());
    let y = b.record_prim("sin", vec![Arg::Value(x)]).unwrap()[0];
    assert!(b.is_read(x));
    assert!(!b.is_read(y));
    let (args, kwargs) = parse_args(&format!("t{}", y.0)).unwrap();
    b.begin_composite(SymbolTable::register("test.reads", SymbolKind::Composite), args, kwargs);
    assert!(b.is_read(y)); // an argument of the open composite
    let z = b.record_prim("cos", vec![Arg::Value(x)]).unwrap();
    b.end_composite(z.clone()).unwrap();
    assert!(b.is_read(y) && !b.is_read(z[0]));
}
