//! Symbolic sizes: traces whose sizes are expressions over size values read back from text and
//! the binary form, meta rules compute with them and record what they decided on hints alone as
//! guards, prims without symbolic rules specialise, and the verifier refuses a trace that lost
//! its guards or reads sizes from something that is no size input.

use std::sync::Arc;
use trace_ir::binary::{decode, encode};
use trace_ir::parser::parse_trace;
use trace_ir::printer::print_trace;
use trace_ir::sym::{Dim, Facts, Rel};
use trace_ir::verify::verify;
use trace_ir::{Arg, DType, Device, ErrorKind, TensorMeta, Trace, TraceBuilder, ValueId, ValueKind};

/// `def f(t0, t1, t2)` with sizes `t0 = 7`, `t1 = 5` and a tensor `[2, t0, 16]`.
fn builder() -> (TraceBuilder, Dim, Dim, ValueId) {
    let mut b = TraceBuilder::new();
    let t = b.add_input(ValueKind::Size(7));
    let s = b.add_input(ValueKind::Size(5));
    let (t, s) = (Dim::size(t, 7), Dim::size(s, 5));
    let x = b.add_input(tensor(vec![2.into(), t.clone(), 16.into()]));
    (b, t, s, x)
}

fn tensor(shape: Vec<Dim>) -> ValueKind {
    ValueKind::Tensor(TensorMeta::with_dims(DType::F32, Device::CPU, shape))
}

fn shape_of(b: &TraceBuilder, v: ValueId) -> Vec<Dim> {
    b.value(v).and_then(ValueKind::as_tensor).unwrap().shape.clone()
}

#[test]
fn shape_prims_compute_with_symbolic_sizes() {
    let (mut b, t, _, x) = builder();
    let two_t = Dim::Const(2).mul(&t);
    let flat = b.record_prim("reshape", vec![Arg::Value(x), Arg::dims(&[two_t.clone(), 16.into()])]).unwrap()[0];
    assert_eq!(shape_of(&b, flat), vec![two_t.clone(), 16.into()]);
    let start = Arg::dims(&[0.into(), 1.into(), 0.into()]);
    let end = Arg::dims(&[2.into(), t.clone(), 16.into()]);
    let tail = b.record_prim("slice", vec![Arg::Value(x), start, end, Arg::ints(&[1, 1, 1])]).unwrap()[0];
    let joined = b.record_prim(
        "cat",
        vec![Arg::List(vec![Arg::Value(x), Arg::Value(tail)]), Arg::Scalar(trace_ir::Scalar::Int(1))],
    );
    let joined = joined.unwrap()[0];
    assert_eq!(shape_of(&b, joined)[1].to_string(), "2*t0 - 1");
    assert_eq!(shape_of(&b, joined)[1].hint(), 13);
    let summed = b.record_prim("sum", vec![Arg::Value(joined), Arg::ints(&[0])]).unwrap()[0];
    assert_eq!(shape_of(&b, summed), vec![Dim::Const(2).mul(&t).sub(&1.into()), 16.into()]);
    let half = b.record_prim("reshape", vec![Arg::Value(flat), Arg::dims(&[t.clone(), 32.into()])]).unwrap()[0];
    assert_eq!(shape_of(&b, half), vec![t.clone(), 32.into()]);
    let positions = b.record_prim("iota", vec![Arg::dim(&t), Arg::ints(&[0])]);
    assert!(positions.is_err(), "iota takes its start, step, device and dtype too");
}

#[test]
fn decisions_on_hints_alone_become_guards() {
    let (mut b, _, _, x) = builder();
    // Another size of the same hint: adding the tensors relies on t0 == t3.
    let other = b.add_input(ValueKind::Size(7));
    let y = b.add_input(tensor(vec![2.into(), Dim::size(other, 7), 16.into()]));
    b.record_prim("add", vec![Arg::Value(x), Arg::Value(y)]).unwrap();
    let guards = b.facts().guards().to_vec();
    assert_eq!(guards.len(), 1, "{guards:?}");
    assert_eq!((guards[0].rel, guards[0].to_string()), (Rel::Eq, "t0 - t3 == 0".to_string()));
    // A size that differs by hint is an error, naming the prim, with no guard recorded.
    let (mut b, _, s, x) = builder();
    let z = b.add_input(tensor(vec![2.into(), s, 16.into()]));
    let err = b.record_prim("add", vec![Arg::Value(x), Arg::Value(z)]).unwrap_err();
    assert_eq!((err.kind, err.op.as_str()), (ErrorKind::Value, "prims.add"));
    assert!(err.message.contains("[2, t0, 16]") && err.message.contains("[2, t1, 16]"), "{err}");
    assert!(b.facts().is_empty(), "a failed call leaves the guards as they were");
    // Same expression: nothing to guard.
    let (mut b, t, _, x) = builder();
    let w = b.add_input(tensor(vec![2.into(), t, 16.into()]));
    b.record_prim("mul", vec![Arg::Value(x), Arg::Value(w)]).unwrap();
    assert!(b.facts().is_empty());
}

#[test]
fn a_reshape_relies_on_its_element_count() {
    let (mut b, t, s, x) = builder();
    // [2, t0, 16] as [t1 + 2, 32]: 32*t0 == 32*t1 + 64 holds for the hints (7 and 5) only.
    let rows = s.add(&2.into());
    let out = b.record_prim("reshape", vec![Arg::Value(x), Arg::dims(&[rows, 32.into()])]).unwrap();
    assert_eq!(shape_of(&b, out[0])[0].to_string(), "t1 + 2");
    let guard = &b.facts().guards()[0];
    assert_eq!(guard.to_string(), "t0 - t1 - 2 == 0");
    assert!(guard.holds(&|v| if v.0 == 0 { 9 } else { 7 }) && !guard.holds(&|v| if v.0 == 0 { 9 } else { 6 }));
    let err = b.record_prim("reshape", vec![Arg::Value(x), Arg::dims(&[t, 17.into()])]).unwrap_err();
    assert!(err.message.contains("shape [t0, 17] is invalid for input of size 32*t0"), "{err}");
}

fn conv_args(image: ValueId, weight: ValueId, kernel_stride: i64, padding: i64) -> Vec<Arg> {
    vec![
        Arg::Value(image),
        Arg::Value(weight),
        Arg::None,
        Arg::ints(&[kernel_stride, kernel_stride]),
        Arg::ints(&[padding, padding]),
        Arg::ints(&[1, 1]),
        Arg::Scalar(trace_ir::Scalar::Bool(false)),
        Arg::ints(&[0, 0]),
        Arg::Scalar(trace_ir::Scalar::Int(1)),
    ]
}

#[test]
fn a_convolution_keeps_batch_and_spatial_sizes_symbolic_and_specialises_channels() {
    let (mut b, t, s, _) = builder();
    // [1, 3, t0, t0] by a 3x3 kernel, stride 2, padding 1: (t0 - 1) // 2 + 1 rows and columns.
    let image = b.add_input(tensor(vec![1.into(), 3.into(), t.clone(), t.clone()]));
    let weight = b.add_input(tensor(vec![4.into(), 3.into(), 3.into(), 3.into()]));
    let out = b.record_prim("convolution", conv_args(image, weight, 2, 1)).unwrap()[0];
    let shape = shape_of(&b, out);
    assert_eq!((shape[1].clone(), shape[2].to_string(), shape[2].hint()), (4.into(), "((t0 + 1) // 2)".into(), 4));
    assert!(b.facts().guards().is_empty(), "{:?}", b.facts().guards());
    // Channels are the weight's: a symbolic channel count is taken at its hint (t1 is 5).
    let image = b.add_input(tensor(vec![t.clone(), s.clone(), 9.into(), 9.into()]));
    let weight = b.add_input(tensor(vec![4.into(), 5.into(), 3.into(), 3.into()]));
    let out = b.record_prim("convolution", conv_args(image, weight, 1, 0)).unwrap()[0];
    assert_eq!(shape_of(&b, out), vec![t.clone(), 4.into(), 7.into(), 7.into()]);
    let guards: Vec<String> = b.facts().guards().iter().map(|g| g.to_string()).collect();
    assert_eq!(guards, vec!["t1 - 5 == 0"]);
}

#[test]
fn a_convolution_too_small_for_its_kernel_fails_and_one_that_fits_is_guarded() {
    let (mut b, t, _, _) = builder();
    let image = b.add_input(tensor(vec![1.into(), 3.into(), t.clone(), t.clone()]));
    let big = b.add_input(tensor(vec![4.into(), 3.into(), 9.into(), 9.into()]));
    let err = b.record_prim("convolution", conv_args(image, big, 1, 0)).unwrap_err();
    assert!(err.message.contains("calculated output size t0 - 8 at spatial dim 0 is too small"), "{err}");
    let fits = b.add_input(tensor(vec![4.into(), 3.into(), 5.into(), 5.into()]));
    b.facts_mut().truncate(0);
    let out = b.record_prim("convolution", conv_args(image, fits, 1, 0)).unwrap()[0];
    assert_eq!(shape_of(&b, out)[2].to_string(), "t0 - 4");
    let guards: Vec<String> = b.facts().guards().iter().map(|g| g.to_string()).collect();
    assert_eq!(guards, vec!["t0 - 5 >= 0"]);
}

const TEXT: &str = "def computation(t0, t1):
  # t0: \"size 9\"
  # t1: \"cpu f32[t0, 4]\"
  t2 = prims.reshape(t1, (t0 // 2*2 + t0 % 2, 2, 2))  # t2: \"cpu f32[2*(t0 // 2) + (t0 % 2), 2, 2]\"
  t3 = prims.slice(t1, (0, 0), ((t0 - 1) // 2, 4), (1, 1))  # t3: \"cpu f32[((t0 + 1) // 2) - 1, 4]\"
  t4 = prims.mul(t3, t0)  # t4: \"cpu f32[((t0 + 1) // 2) - 1, 4]\"
  return (t2, t4)
";

#[test]
fn text_and_binary_forms_read_back_symbolic_traces() {
    let trace = parse_trace(TEXT).unwrap();
    verify(&trace).unwrap();
    let t2 = trace.tensor(trace.bsyms[0].outputs[0]).unwrap();
    assert_eq!(t2.hints(), vec![9, 2, 2]);
    assert_eq!(trace.tensor(trace.bsyms[1].outputs[0]).unwrap().hints(), vec![4, 4]);
    let printed = print_trace(&trace, "computation");
    // `t0 // 2 * 2 + t0 % 2` is t0 for every t0: `t0 - (t0 % 2)` is `2*(t0 // 2)` in the canonical
    // form, so the reshape relies on no guard.
    assert!(!printed.contains("(t0 % 2) == 0"), "{printed}");
    assert!(printed.contains("prims.mul(t3, t0)"), "{printed}");
    assert_eq!(parse_trace(&printed).unwrap(), trace);
    assert_eq!(decode(&encode(&trace)).unwrap(), trace);
    // The size operand is a symbolic int, which DCE and the split see as a use of t0.
    let mut reads = Vec::new();
    trace.bsyms[2].for_each_input(|v| reads.push(v));
    assert!(reads.contains(&ValueId(0)), "{reads:?}");
}

#[test]
fn expressions_parse_with_python_precedence() {
    let text = "def f(t0, t1):
  # t0: \"size 6\"
  # t1: \"cpu f32[2*t0 + 1]\"
  t2 = prims.slice(t1, (t0 - 2*3 + 1,), (2*(t0 + 1) - 1,), (1,))  # t2: \"cpu f32[t0 + 6]\"
  return t2
";
    let trace = parse_trace(text).unwrap();
    assert_eq!(trace.tensor(ValueId(1)).unwrap().hints(), vec![13]);
    assert_eq!(trace.tensor(ValueId(2)).unwrap().hints(), vec![12]);
    let bad = text.replace("(t0 - 2*3 + 1,)", "(t0 // t0,)");
    let err = parse_trace(&bad).unwrap_err();
    assert!(err.message.contains("divided by a positive constant"), "{err}");
    let bad = text.replace("2*t0 + 1]", "2*t5 + 1]");
    assert!(parse_trace(&bad).unwrap_err().message.contains("t5"));
}

#[test]
fn the_verifier_refuses_lost_guards_and_sizes_that_are_no_inputs() {
    let trace = parse_trace(TEXT).unwrap();
    assert!(!trace.facts.is_empty());
    let lost = Trace { facts: Arc::new(Facts::default()), ..trace.clone() };
    let err = verify(&lost).unwrap_err();
    assert!(err.message.contains("which is not among the trace's guards"), "{err}");
    // A tensor whose size reads a tensor value.
    let mut values = (*trace.values).clone();
    let ValueKind::Tensor(t1) = &mut values[1] else { unreachable!() };
    t1.shape[1] = Dim::size(ValueId(2), 4);
    let bad = Trace { values: Arc::new(values), ..trace.clone() };
    let err = verify(&bad).unwrap_err();
    assert!(err.message.contains("which is no size defined before it"), "{err}");
}

/// A trace whose size `n` (`t1`) a fallback computes from values (a count: it may be 0 or 1),
/// its output `[n, 3]`.
fn counted() -> (TraceBuilder, Dim, ValueId) {
    let mut b = TraceBuilder::new();
    let x = b.add_input(tensor(vec![8.into(), 3.into()]));
    let n = b.add_unbacked_size(5);
    let count = Dim::size(n, 5);
    let meta = TensorMeta::with_dims(DType::F32, Device::CPU, vec![count.clone(), 3.into()]);
    let symbol = trace_ir::SymbolTable::register("torch.counted_rows", trace_ir::SymbolKind::Fallback);
    let rows = b.record_sized(trace_ir::Symbol::Fallback(symbol), vec![Arg::Value(x)], vec![], vec![meta], vec![n])[0];
    (b, count, rows)
}

#[test]
fn decisions_about_a_count_that_0_or_1_would_change_are_guards() {
    let (mut b, count, rows) = counted();
    assert!(b.facts().is_count(ValueId(1)));
    b.record_prim("amax", vec![Arg::Value(rows), Arg::ints(&[0])]).unwrap();
    assert!(!b.facts_mut().equal(&count, &Dim::Const(1)));
    let guards: Vec<String> = b.facts().guards().iter().map(|g| g.to_string()).collect();
    assert_eq!(guards, vec!["t1 != 0", "t1 - 1 != 0"]);
    // The same decisions about an input's size leave nothing to check.
    let (mut b, t, _, x) = builder();
    b.record_prim("amax", vec![Arg::Value(x), Arg::ints(&[1])]).unwrap();
    assert!(!b.facts_mut().equal(&t, &Dim::Const(1)));
    assert!(b.facts().is_empty() && !b.facts().is_count(ValueId(0)), "{:?}", b.facts().guards());
}

#[test]
fn counts_survive_renaming_and_the_binary_form() {
    let (mut b, _, rows) = counted();
    let top = b.record_prim("amax", vec![Arg::Value(rows), Arg::ints(&[0])]).unwrap()[0];
    let trace = b.finish(Arg::Value(top)).unwrap();
    let decoded = decode(&encode(&trace)).unwrap();
    assert_eq!(decoded.facts.counts().collect::<Vec<_>>(), vec![ValueId(1)]);
    assert_eq!(decoded.facts, trace.facts);
    let renamed = trace.facts.renamed(&|v| ValueId(v.0 + 10));
    assert!(renamed.is_count(ValueId(11)) && !renamed.is_count(ValueId(1)));
    verify(&trace).unwrap();
}
