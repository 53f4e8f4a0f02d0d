//! Snapshots of a recording in progress: what a data-dependent read evaluates (the calls so far,
//! open composites' decompositions included), the recording going on unchanged; segments of it, each running only the calls no earlier one ran.

use rustc_hash::FxHashSet;
use trace_ir::parser::{parse_args, parse_value_type};
use trace_ir::verify::verify;
use trace_ir::{
    Arg, DType, Device, ErrorKind, Segment, SymbolId, SymbolKind, SymbolTable, TensorMeta, TraceBuilder, ValueId,
    ValueKind,
};

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

fn meta() -> TensorMeta {
    TensorMeta::new(DType::F32, Device::CPU, vec![3])
}

fn draw(b: &mut TraceBuilder) -> ValueId {
    let random = SymbolTable::register("test.snapshot_draw", SymbolKind::Effect);
    b.record_fallback(random, Vec::new(), Vec::new(), vec![meta()])[0]
}

fn segment(b: &TraceBuilder, wanted: &[ValueId], known: &[ValueId], checks: &[SymbolId]) -> Option<Segment> {
    let known: FxHashSet<ValueId> = known.iter().copied().collect();
    let segment = b.segment(wanted, &known, checks).unwrap();
    if let Some(s) = &segment {
        verify(&s.trace).unwrap();
    }
    segment
}

#[test]
fn a_segment_runs_only_the_calls_no_earlier_one_ran_and_takes_their_tensors() {
    let mut b = TraceBuilder::new();
    let x = b.add_input(ValueKind::Tensor(meta()));
    let e = b.record_prim("exp", vec![Arg::Value(x)]).unwrap()[0];
    let first = segment(&b, &[e], &[], &[]).unwrap();
    assert_eq!((first.trace.bsyms.len(), first.known_inputs.clone(), first.returned.clone()), (1, vec![], vec![e]));
    let y = b.record_prim("add", vec![Arg::Value(e), Arg::Value(x)]).unwrap()[0];
    let second = segment(&b, &[y], &[e], &[]).unwrap();
    assert_eq!((second.trace.bsyms.len(), second.known_inputs, second.returned), (1, vec![e], vec![y]));
    assert_eq!(second.trace.inputs, vec![x, e]);
    // A wanted input is returned as it is.
    assert_eq!(segment(&b, &[x], &[e, y], &[]).unwrap().returned, vec![x]);
}

#[test]
fn a_segment_takes_only_the_inputs_it_reads_or_returns() {
    let mut b = TraceBuilder::new();
    let (w0, w1, w2) = (
        b.add_input(ValueKind::Tensor(meta())),
        b.add_input(ValueKind::Tensor(meta())),
        b.add_input(ValueKind::Tensor(meta())),
    );
    let e = b.record_prim("exp", vec![Arg::Value(w0)]).unwrap()[0];
    let first = segment(&b, &[e], &[], &[]).unwrap();
    assert_eq!((first.taken.clone(), first.trace.inputs.clone()), (vec![0], vec![w0]));
    let y = b.record_prim("mul", vec![Arg::Value(e), Arg::Value(w2)]).unwrap()[0];
    let second = segment(&b, &[y, w1], &[e], &[]).unwrap();
    assert_eq!((second.taken, second.known_inputs, second.returned), (vec![1, 2], vec![e], vec![y, w1]));
    // Its own values only, numbered in order: w1, w2, e taken, y defined.
    assert_eq!(second.trace.values.len(), 4);
    assert_eq!(second.trace.inputs, vec![ValueId(0), ValueId(1), ValueId(2)]);
    let mut returned = Vec::new();
    second.trace.outputs.for_each_value(&mut |v| returned.push(v));
    assert_eq!(returned, vec![ValueId(3), ValueId(0)]);
}

#[test]
fn draws_that_ran_are_not_drawn_again_and_a_state_effect_starts_over() {
    let mut b = TraceBuilder::new();
    let r = draw(&mut b);
    let s = draw(&mut b);
    assert_eq!(segment(&b, &[s], &[r], &[]).unwrap().returned, vec![s]);
    let seed = SymbolTable::register("test.snapshot_seed", SymbolKind::Effect);
    b.record_fallback(seed, Vec::new(), Vec::new(), Vec::new());
    assert!(segment(&b, &[], &[r, s], &[]).is_none());
    assert_eq!(segment(&b, &[], &[], &[]).unwrap().trace.bsyms.len(), 3);
}

#[test]
fn a_composite_that_ran_in_part_with_a_draw_starts_over() {
    let mut b = TraceBuilder::new();
    let x = b.add_input(ValueKind::Tensor(meta()));
    b.begin_composite(
        SymbolTable::register("test.snapshot_noisy", SymbolKind::Composite),
        vec![Arg::Value(x)],
        Vec::new(),
    );
    let r = draw(&mut b);
    assert_eq!(segment(&b, &[r], &[], &[]).unwrap().returned, vec![r]);
    let y = b.record_prim("add", vec![Arg::Value(r), Arg::Value(x)]).unwrap()[0];
    b.end_composite(vec![y]).unwrap();
    assert!(segment(&b, &[y], &[r], &[]).is_none());
    assert!(segment(&b, &[y], &[r, y], &[]).unwrap().trace.bsyms.is_empty());
}

#[test]
fn checks_of_known_tensors_are_left_out() {
    let mut b = TraceBuilder::new();
    let x = b.add_input(ValueKind::Tensor(meta()));
    let e = b.record_prim("exp", vec![Arg::Value(x)]).unwrap()[0];
    let check = SymbolTable::register("test.snapshot_check", SymbolKind::Effect);
    b.record_fallback(check, vec![Arg::Value(e)], Vec::new(), Vec::new());
    assert_eq!(segment(&b, &[], &[], &[check]).unwrap().trace.bsyms.len(), 2);
    assert!(segment(&b, &[], &[e], &[check]).unwrap().trace.bsyms.is_empty());
    assert!(segment(&b, &[], &[e], &[]).is_none()); // (not a check: an effect on state)
}

#[test]
fn a_segment_numbers_anew_the_sizes_prim_parameters_read() {
    // `w` is not taken, so the size `n` (which a call of an earlier segment defined: a slice
    // bound read from a value) has another number in the segment than in the recording; the
    // slice reads it through its parameters, which no operand shows.
    let mut b = TraceBuilder::new();
    let _w = b.add_input(ValueKind::Tensor(meta()));
    let x = b.add_input(parse_value_type("cpu f32[10]").unwrap());
    let n = b.add_unbacked_size(4);
    let read = SymbolTable::register("test.snapshot_read_bound", SymbolKind::Fallback);
    b.record_sized(trace_ir::Symbol::Fallback(read), vec![Arg::Value(x)], Vec::new(), Vec::new(), vec![n]);
    let stop = Arg::Tuple(vec![Arg::Value(n)]);
    let y = b.record_prim("slice", vec![Arg::Value(x), Arg::ints(&[0]), stop, Arg::ints(&[1])]).unwrap()[0];
    let s = segment(&b, &[y], &[], &[]).unwrap(); // (verified: the slice relies on `n <= 10`)
    assert_eq!((s.taken, s.sizes), (vec![1], vec![n]));
    assert_eq!(s.trace.to_string().matches("prims.slice(t0, (0,), (t1,), (1,))").count(), 1, "{}", s.trace);
}

#[test]
fn a_last_segment_returns_only_the_wanted_tensors_not_known() {
    let mut b = TraceBuilder::new();
    let x = b.add_input(ValueKind::Tensor(meta()));
    let e = b.record_prim("exp", vec![Arg::Value(x)]).unwrap()[0];
    let s = b.record_prim("sin", vec![Arg::Value(e)]).unwrap()[0];
    let c = b.record_prim("cos", vec![Arg::Value(s)]).unwrap()[0];
    let known: FxHashSet<ValueId> = [e].into_iter().collect();
    let last = b.last_segment(&[c, e, x, c], &known, &[]).unwrap().unwrap();
    verify(&last.trace).unwrap();
    assert_eq!((last.trace.bsyms.len(), last.known_inputs, last.returned), (2, vec![e], vec![c, x]));
}
