//! Elementwise prims: equal shapes, dtypes and devices; no broadcasting, no promotion.

use super::{check_invalid, check_valid, Invalid, Valid};
use trace_ir::prims::{Accepts, Binary, Output, Unary};
use trace_ir::ErrorKind::{NotImplemented, Type, Value};

/// A valid case of every elementwise prim of the tables, by what its declaration says it
/// accepts and gives (floats, or integers for the bitwise prims), then the cases below.
pub fn valid() -> Vec<Valid> {
    let f32_in: &'static [&'static str] = &["f32[2, 3]", "f32[2, 3]"];
    let i64_in: &'static [&'static str] = &["i64[4]", "i64[4]"];
    let case = |accepts: Accepts, output: Output, name: &'static str, args: &'static str| -> Valid {
        match (accepts, output) {
            (Accepts::IntOrBool, _) => (i64_in, name, args, &["i64[4]"][..]),
            (_, Output::Bool) => (f32_in, name, args, &["b8[2, 3]"][..]),
            _ => (f32_in, name, args, &["f32[2, 3]"][..]),
        }
    };
    let mut cases: Vec<Valid> = Vec::new();
    cases.extend(Unary::ALL.iter().map(|p| case(p.accepts(), p.output(), p.name(), "t0")));
    cases.extend(Binary::ALL.iter().map(|p| case(p.accepts(), p.output(), p.name(), "t0, t1")));
    cases.extend_from_slice(VALID);
    cases
}

const VALID: &[Valid] = &[
    (&["f32[2, 3]"], "signbit", "t0", &["b8[2, 3]"]),
    (&["f64[2, 3]"], "frexp", "t0", &["f64[2, 3]", "i32[2, 3]"]),
    (&["f32[2, 3]"], "isfinite", "t0", &["b8[2, 3]"]),
    (&["c64[2]"], "isfinite", "t0", &["b8[2]"]),
    (&["i32[3]"], "bitwise_not", "t0", &["i32[3]"]),
    (&["b8[3]"], "bitwise_not", "t0", &["b8[3]"]),
    (&["c64[2]"], "abs", "t0", &["f32[2]"]),
    (&["c128[2]"], "exp", "t0", &["c128[2]"]),
    (&["i64[3]"], "neg", "t0", &["i64[3]"]),
    (&["f32[]"], "sin", "t0", &["f32[]"]),
    (&["f32[0, 2]"], "exp", "t0", &["f32[0, 2]"]),
    (&["cuda:0 bf16[2]"], "tanh", "t0", &["cuda:0 bf16[2]"]),
    (&["f32[2, 3]"], "add", "t0, 2.0", &["f32[2, 3]"]),
    (&["f32[2, 3]"], "add", "2, t0", &["f32[2, 3]"]),
    (&["f32[2, 3]", "float 0.5"], "mul", "t0, t1", &["f32[2, 3]"]),
    (&["i32[3]"], "mul", "t0, 3", &["i32[3]"]),
    (&["b8[3]"], "bitwise_or", "t0, True", &["b8[3]"]),
    (&["c64[2]", "c64[2]"], "eq", "t0, t1", &["b8[2]"]),
    (&["cuda:1 f16[2]", "cuda:1 f16[2]"], "sub", "t0, t1", &["cuda:1 f16[2]"]),
    (&["b8[2, 3]", "f32[2, 3]", "f32[2, 3]"], "where", "t0, t1, t2", &["f32[2, 3]"]),
    (&["b8[2, 3]", "f32[2, 3]"], "where", "t0, t1, 0.0", &["f32[2, 3]"]),
    (&["b8[2, 3]", "i64[2, 3]"], "where", "t0, 1, t1", &["i64[2, 3]"]),
    (&["f32[2, 3]", "f32[2, 3]"], "where", "True, t0, t1", &["f32[2, 3]"]),
    (&["f32[2, 3]"], "polygamma", "t0, 1", &["f32[2, 3]"]),
    (&["f32[2, 3]"], "convert_element_type", "t0, torch.float16", &["f16[2, 3]"]),
    (&["i64[2]"], "convert_element_type", "t0, torch.bool", &["b8[2]"]),
    (&["f32[2, 3]"], "device_put", "t0, torch.device('cuda:0')", &["cuda:0 f32[2, 3]"]),
];

const INVALID: &[Invalid] = &[
    // Element types each prim accepts.
    (&["i32[3]"], "exp", "t0", Type, &["a", "floating-point or complex", "i32"]),
    (&["c64[3]"], "erf", "t0", Type, &["a", "floating-point"]),
    // Dtypes torch has no kernel for are NotImplementedError, as in eager.
    (&["c64[3]"], "floor", "t0", NotImplemented, &["a", "real"]),
    (&["b8[3]"], "abs", "t0", NotImplemented, &["a", "b8"]),
    (&["f32[3]"], "bitwise_not", "t0", NotImplemented, &["a", "integer or bool"]),
    (&["f32[3]", "f32[3]"], "bitwise_xor", "t0, t1", NotImplemented, &["a", "integer or bool"]),
    (&["f32[3]"], "bitwise_and", "1, t0", NotImplemented, &["b", "integer or bool"]),
    (&["c64[3]", "c64[3]"], "lt", "t0, t1", NotImplemented, &["a", "real"]),
    (&["i64[3]"], "atan2", "1, t0", Type, &["b", "floating-point"]),
    (&["i64[3]"], "atan2", "1.5, t0", Type, &["a", "type promotion"]),
    // Operands.
    (&[], "exp", "2.0", Type, &["a", "tensor"]),
    (&["f32[3]"], "exp", "\"x\"", Type, &["operand 0"]),
    (&["f32[3]"], "add", "t0", Type, &["operand 1", "missing"]),
    (&["f32[3]"], "add", "t0, t0, t0", Type, &["takes 2 arguments"]),
    (&[], "add", "1.0, 2.0", Type, &["a", "b", "only numbers"]),
    // Shapes, dtypes and devices must agree.
    (&["f32[2, 3]", "f32[3, 2]"], "add", "t0, t1", Value, &["a", "b", "[2, 3]", "[3, 2]", "broadcast"]),
    (&["f32[3]", "f32[]"], "mul", "t0, t1", Value, &["b", "[]"]),
    (&["f32[3]", "f64[3]"], "add", "t0, t1", Type, &["a", "b", "f32", "f64", "promote"]),
    (&["f32[3]", "cuda:0 f32[3]"], "add", "t0, t1", Value, &["b", "cuda:0"]),
    (&["i32[3]"], "add", "t0, 2.5", Type, &["b", "float", "type promotion"]),
    (&["b8[3]"], "add", "1, t0", Type, &["a", "int", "type promotion"]),
    // where
    (&["f32[3]", "f32[3]", "f32[3]"], "where", "t0, t1, t2", Type, &["pred", "bool", "f32"]),
    (&["f32[3]", "f32[3]"], "where", "1, t0, t1", Type, &["pred"]),
    (&["b8[3]", "f32[3]", "f64[3]"], "where", "t0, t1, t2", Type, &["a", "b", "promote"]),
    (&["b8[3]"], "where", "t0, 1.0, 2.0", Type, &["a or b"]),
    (&["b8[2, 3]", "f32[3]", "f32[3]"], "where", "t0, t1, t2", Value, &["pred", "a", "[2, 3]"]),
    (&["b8[3]", "i32[3]"], "where", "t0, t1, 2.5", Type, &["a or b", "type promotion"]),
    // convert_element_type and device_put
    (&["f32[3]"], "convert_element_type", "t0, \"float16\"", Type, &["dtype"]),
    (&[], "convert_element_type", "1.0, torch.float16", Type, &["a", "tensor"]),
    (&["f32[3]"], "device_put", "t0, 'cuda'", Type, &["device"]),
    (&["f32[3]"], "device_put", "t0", Type, &["device", "missing"]),
    (&["f32[3]"], "convert_element_type", "t0, torch.float16, 1", Type, &["takes 2 arguments"]),
];

#[test]
fn valid_calls_give_their_output_types() {
    check_valid(&valid());
}

#[test]
fn invalid_calls_name_the_op_and_the_argument() {
    check_invalid(INVALID);
}
