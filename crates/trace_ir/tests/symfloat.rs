//! Symbolic floats: Python float operations over sizes as prim operands, printed as the Python
//! that computes them (each operation parenthesised, never simplified), read back from text and
//! the binary form, and seen as uses of the sizes they read.

use std::sync::Arc;
use trace_ir::binary::{decode, encode};
use trace_ir::parser::parse_trace;
use trace_ir::printer::print_trace;
use trace_ir::sym::Dim;
use trace_ir::verify::verify;
use trace_ir::{Arg, FloatExpr, FloatFn, FloatOp, SymFloat, ValueId};

const TEXT: &str = "def computation(t0, t1):
  # t0: \"size 9\"
  # t1: \"cpu f32[t0, 4]\"
  t2 = prims.mul(t1, (t0 ** (-0.5)))  # t2: \"cpu f32[t0, 4]\"
  t3 = prims.add(t2, ((1.0 / (2*t0 + 1)) - torch.sym_sqrt(t0)))  # t3: \"cpu f32[t0, 4]\"
  t4 = prims.mul(t3, (-((t0 * 0.5) + (-3))))  # t4: \"cpu f32[t0, 4]\"
  t5 = prims.mul(t4, ((-0.5) ** (t0 / 3)))  # t5: \"cpu f32[t0, 4]\"
  return t5
";

fn float_operand(trace: &trace_ir::Trace, i: usize) -> Arc<SymFloat> {
    match &trace.bsyms[i].args[1] {
        Arg::SymFloat(s) => s.clone(),
        other => panic!("expected a symbolic float, got {other:?}"),
    }
}

#[test]
fn symbolic_floats_read_back_from_text_and_binary() {
    let trace = parse_trace(TEXT).unwrap();
    verify(&trace).unwrap();
    let printed = print_trace(&trace, "computation");
    for line in TEXT.lines().skip(3).take(4) {
        let call = line.split("  #").next().unwrap();
        assert!(printed.contains(call), "{call} not in {printed}");
    }
    assert_eq!(parse_trace(&printed).unwrap(), trace);
    assert_eq!(decode(&encode(&trace)).unwrap(), trace);
}

#[test]
fn hints_are_the_values_python_computes_in_the_program_order() {
    let trace = parse_trace(TEXT).unwrap();
    let t = 9.0_f64;
    assert_eq!(float_operand(&trace, 0).hint.0, t.powf(-0.5));
    assert_eq!(float_operand(&trace, 1).hint.0, 1.0 / (2.0 * t + 1.0) - t.sqrt());
    assert_eq!(float_operand(&trace, 2).hint.0, -(t * 0.5 + -3.0));
    assert_eq!(float_operand(&trace, 3).hint.0, -0.125); // (-0.5) ** (9 / 3)
}

#[test]
fn a_symbolic_float_is_a_use_of_the_sizes_it_reads() {
    let trace = parse_trace(TEXT).unwrap();
    for i in 0..4 {
        let mut reads = Vec::new();
        trace.bsyms[i].for_each_input(|v| reads.push(v));
        assert!(reads.contains(&ValueId(0)), "{i}: {reads:?}");
    }
    // Renaming the size renames it inside the float; the operations stay as written.
    let renamed = trace.bsyms[0].args[1].map_values(&mut |v| Arg::Value(ValueId(v.0 + 7)));
    let Arg::SymFloat(s) = renamed else { panic!("{renamed:?}") };
    assert_eq!(s.expr.to_string(), "(t7 ** (-0.5))");
}

#[test]
fn floats_compare_by_bits_and_operations_are_never_simplified() {
    let t = Dim::size(ValueId(0), 4);
    let half = |x: f64| FloatExpr::bin(FloatOp::Mul, FloatExpr::Int(t.clone()), FloatExpr::Float(x));
    assert_ne!(half(0.0), half(-0.0));
    assert_eq!(half(0.5), half(0.5));
    // (t0 * 0.5) * 2.0 is not t0: the program's two roundings are kept.
    let twice = FloatExpr::bin(FloatOp::Mul, half(0.5), FloatExpr::Float(2.0));
    assert_eq!(twice.to_string(), "((t0 * 0.5) * 2.0)");
    assert_eq!(FloatExpr::Float(f64::INFINITY).to_string(), "(float('inf'))");
}

const MATH_TEXT: &str = "def computation(t0, t1):
  # t0: \"size 9\"
  # t1: \"cpu f32[t0, 4]\"
  t2 = prims.mul(t1, math.log(t0))  # t2: \"cpu f32[t0, 4]\"
  t3 = prims.div(t2, (math.log((t0 / 4)) / math.log(32.0)))  # t3: \"cpu f32[t0, 4]\"
  t4 = prims.mul(t3, math.exp((-(t0 / 8))))  # t4: \"cpu f32[t0, 4]\"
  t5 = prims.add(t4, ((math.log2(t0) + math.log10((2*t0 + 1))) - math.log1p(math.expm1((t0 * 0.5)))))  # t5: \"cpu f32[t0, 4]\"
  return t5
";

#[test]
fn functions_of_math_read_back_from_text_and_binary_with_libm_hints() {
    let trace = parse_trace(MATH_TEXT).unwrap();
    verify(&trace).unwrap();
    let printed = print_trace(&trace, "computation");
    for line in MATH_TEXT.lines().skip(3).take(4) {
        let call = line.split("  #").next().unwrap();
        assert!(printed.contains(call), "{call} not in {printed}");
    }
    assert_eq!(parse_trace(&printed).unwrap(), trace);
    assert_eq!(decode(&encode(&trace)).unwrap(), trace);
    let t = 9.0_f64;
    assert_eq!(float_operand(&trace, 0).hint.0, t.ln());
    assert_eq!(float_operand(&trace, 1).hint.0, (t / 4.0).ln() / 32.0_f64.ln());
    assert_eq!(float_operand(&trace, 2).hint.0, (-(t / 8.0)).exp());
    assert_eq!(float_operand(&trace, 3).hint.0, t.log2() + (2.0 * t + 1.0).log10() - (t * 0.5).exp_m1().ln_1p());
    // Each function is its own operation, seen as a use of the size it reads.
    let log = FloatExpr::Math(FloatFn::Log, Box::new(FloatExpr::Int(Dim::size(ValueId(0), 9))));
    assert_ne!(log, FloatExpr::Math(FloatFn::Log2, Box::new(FloatExpr::Int(Dim::size(ValueId(0), 9)))));
    assert_eq!(log.to_string(), "math.log(t0)");
    let mut reads = Vec::new();
    trace.bsyms[3].for_each_input(|v| reads.push(v));
    assert!(reads.contains(&ValueId(0)), "{reads:?}");
    assert!(parse_trace(&MATH_TEXT.replace("math.log(t0)", "math.gamma(t0)")).is_err());
}

/// A float argument that changes between calls is a float input (`float 0.25`): read in float
/// operations by its name, printed and read back so. (Alone, it reads back as the number input
/// itself, which the text cannot tell from a symbolic float of it alone.)
const FLOAT_INPUT: &str = "def computation(t0, t1):
  # t0: \"cpu f32[4]\"
  # t1: \"float 0.25\"
  t2 = prims.mul(t0, t1)  # t2: \"cpu f32[4]\"
  t3 = prims.add(t2, ((t1 * 2.0) + 1))  # t3: \"cpu f32[4]\"
  return t3
";

#[test]
fn float_inputs_are_operands_of_symbolic_floats() {
    let trace = parse_trace(FLOAT_INPUT).unwrap();
    verify(&trace).unwrap();
    assert_eq!(trace.bsyms[0].args[1], Arg::Value(ValueId(1)));
    let twice = FloatExpr::bin(FloatOp::Mul, FloatExpr::Input(ValueId(1), 0.25), FloatExpr::Float(2.0));
    let expr = FloatExpr::bin(FloatOp::Add, twice, FloatExpr::Int(Dim::Const(1)));
    assert_eq!(float_operand(&trace, 1).expr, expr);
    assert_eq!(float_operand(&trace, 1).hint.0, 1.5);
    assert!(float_operand(&trace, 1).expr.has_inputs());
    let mut reads = Vec::new();
    trace.bsyms[1].for_each_input(|v| reads.push(v));
    assert!(reads.contains(&ValueId(1)), "{reads:?}");
    let printed = print_trace(&trace, "computation");
    assert!(printed.contains("prims.mul(t0, t1)") && printed.contains("((t1 * 2.0) + 1)"), "{printed}");
    assert_eq!(parse_trace(&printed).unwrap(), trace);
    assert_eq!(decode(&encode(&trace)).unwrap(), trace);
}
