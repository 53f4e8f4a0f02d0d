//! The verifier: SSA (one definition, before every use), prim arities, and recorded metadata
//! that agrees with the meta rules.

use std::sync::Arc;
use trace_ir::parser::parse_trace;
use trace_ir::verify::verify;
use trace_ir::{Arg, ErrorKind, IrError, Trace, ValueId, ValueKind};

/// t0 -> exp -> sin, and a var_mean.
fn sample() -> Trace {
    parse_trace(
        "def computation(t0):
  # t0: \"cpu f32[4]\"
  t1 = prims.exp(t0)  # t1: \"cpu f32[4]\"
  t2 = prims.sin(t1)  # t2: \"cpu f32[4]\"
  (t3, t4) = prims.var_mean(t2, (0,), 1)  # t3: \"cpu f32[]\", t4: \"cpu f32[]\"
  return (t2, t4)
",
    )
    .unwrap()
}

fn assert_fails(trace: &Trace, op: &str, fragments: &[&str]) -> IrError {
    let e = verify(trace).expect_err("the trace is malformed");
    assert_eq!((e.kind, e.op.as_str()), (ErrorKind::Runtime, op), "{e}");
    for fragment in fragments {
        assert!(e.message.contains(fragment), "{fragment:?} not in {e}");
    }
    e
}

#[test]
fn accepts_a_recorded_trace() {
    verify(&sample()).unwrap();
}

#[test]
fn rejects_a_redefinition() {
    let mut trace = sample();
    trace.bsyms.insert(1, trace.bsyms[0].clone());
    assert_fails(&trace, "verify", &["prims.exp redefines t1"]);
}

#[test]
fn rejects_redefining_an_input() {
    let mut trace = sample();
    trace.bsyms[0].outputs = vec![ValueId(0)];
    assert_fails(&trace, "verify", &["prims.exp redefines t0"]);
}

#[test]
fn rejects_a_use_before_its_definition() {
    let mut trace = sample();
    trace.bsyms.swap(0, 1);
    assert_fails(&trace, "verify", &["prims.sin uses t1 before it is defined"]);
}

#[test]
fn rejects_a_use_of_an_unknown_value() {
    let mut trace = sample();
    trace.bsyms[1].args = vec![Arg::Value(ValueId(99))];
    assert_fails(&trace, "verify", &["prims.sin uses t99"]);
}

#[test]
fn rejects_an_output_outside_the_value_table() {
    let mut trace = sample();
    trace.bsyms[0].outputs = vec![ValueId(42)];
    assert_fails(&trace, "verify", &["prims.exp defines t42, which is not in the value table"]);
}

#[test]
fn rejects_undefined_trace_outputs() {
    let mut trace = sample();
    trace.bsyms.truncate(2);
    assert_fails(&trace, "verify", &["output t4 is never defined"]);
}

#[test]
fn rejects_a_wrong_recorded_meta() {
    let mut trace = sample();
    let mut values = (*trace.values).clone();
    let ValueKind::Tensor(t1) = &mut values[1] else { unreachable!() };
    t1.shape = vec![5.into()];
    trace.values = Arc::new(values);
    assert_fails(&trace, "prims.exp", &["output t1 is cpu f32[5] but its meta rule gives cpu f32[4]"]);
}

#[test]
fn rejects_a_number_where_a_prim_gives_a_tensor() {
    let mut trace = sample();
    let mut values = (*trace.values).clone();
    values[2] = ValueKind::Number(trace_ir::Scalar::Float(1.0));
    trace.values = Arc::new(values);
    assert_fails(&trace, "prims.sin", &["output t2 is not a tensor"]);
}

#[test]
fn rejects_a_wrong_number_of_outputs() {
    let mut trace = sample();
    trace.bsyms[2].outputs.pop();
    trace.outputs = Arg::Value(ValueId(2));
    assert_fails(&trace, "prims.var_mean", &["has 1 outputs but its meta rule gives 2"]);
}

#[test]
fn rejects_a_wrong_number_of_operands_without_panicking() {
    let mut trace = sample();
    trace.bsyms[1].args.clear();
    assert_fails(&trace, "prims.sin", &["has 0 operand(s)"]);
    let mut trace = sample();
    trace.bsyms[1].args.push(Arg::Value(ValueId(0)));
    assert_fails(&trace, "prims.sin", &["has 2 operand(s)"]);
}

#[test]
fn reports_meta_rule_errors() {
    let mut trace = sample();
    let mut values = (*trace.values).clone();
    let ValueKind::Tensor(t0) = &mut values[0] else { unreachable!() };
    t0.dtype = trace_ir::DType::I32;
    trace.values = Arc::new(values);
    let e = verify(&trace).unwrap_err();
    assert_eq!((e.kind, e.op.as_str()), (ErrorKind::Type, "prims.exp"), "{e}");
    assert!(e.message.contains("tensor for a, got i32"), "{e}");
    let mut trace = sample();
    trace.bsyms[1].args = vec![Arg::Str("x".into())];
    assert_fails(&trace, "prims.sin", &["is not a value or number"]);
}
