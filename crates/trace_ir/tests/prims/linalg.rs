//! matmul and linear, with torch's rules for 1-D operands and batch broadcasting.

use super::{Invalid, Valid};
use trace_ir::ErrorKind::{Type, Value};

pub const VALID: &[Valid] = &[
    (&["f32[2, 3]", "f32[3, 4]"], "matmul", "t0, t1", &["f32[2, 4]"]),
    (&["f32[3]", "f32[3]"], "matmul", "t0, t1", &["f32[]"]),
    (&["f32[3]", "f32[3, 4]"], "matmul", "t0, t1", &["f32[4]"]),
    (&["f32[2, 3]", "f32[3]"], "matmul", "t0, t1", &["f32[2]"]),
    (&["f32[3]", "f32[5, 3, 4]"], "matmul", "t0, t1", &["f32[5, 4]"]),
    (&["f32[5, 2, 3]", "f32[3, 4]"], "matmul", "t0, t1", &["f32[5, 2, 4]"]),
    (&["f32[5, 1, 2, 3]", "f32[4, 3, 2]"], "matmul", "t0, t1", &["f32[5, 4, 2, 2]"]),
    (&["i64[2, 3]", "i64[3, 2]"], "matmul", "t0, t1", &["i64[2, 2]"]),
    (&["f32[2, 3]", "f32[4, 3]"], "linear", "t0, t1, None", &["f32[2, 4]"]),
    (&["f32[2, 3]", "f32[4, 3]", "f32[4]"], "linear", "t0, t1, t2", &["f32[2, 4]"]),
    (&["f32[5, 2, 3]", "f32[4, 3]", "f32[2, 4]"], "linear", "t0, t1, t2", &["f32[5, 2, 4]"]),
    (&["f32[3]", "f32[4, 3]"], "linear", "t0, t1, None", &["f32[4]"]),
    (&["f32[2, 3]", "f32[3]", "f32[]"], "linear", "t0, t1, t2", &["f32[2]"]),
];

const INVALID: &[Invalid] = &[
    (&["f32[2, 3]", "f64[3, 4]"], "matmul", "t0, t1", Type, &["b", "f64"]),
    (&["f32[2, 3]", "cuda:0 f32[3, 4]"], "matmul", "t0, t1", Value, &["b", "cuda:0"]),
    (&["b8[2, 3]", "b8[3, 4]"], "matmul", "t0, t1", Type, &["a", "bool"]),
    (&["f32[]", "f32[3]"], "matmul", "t0, t1", Value, &["a", "at least 1D"]),
    (&["f32[2, 3]", "f32[4, 5]"], "matmul", "t0, t1", Value, &["a", "b", "inner dimensions 3 and 4"]),
    (&["f32[2, 2, 3]", "f32[3, 3, 4]"], "matmul", "t0, t1", Value, &["a", "b", "batch dimensions"]),
    (&["f32[2, 3]"], "matmul", "t0, 2.0", Type, &["b", "tensor"]),
    (&["f32[2, 3]", "f32[2, 4, 3]"], "linear", "t0, t1, None", Value, &["weight", "rank 1 or 2"]),
    (&["f32[2, 3]", "f32[4, 5]"], "linear", "t0, t1, None", Value, &["weight", "in features"]),
    (&["f32[2, 3]", "f64[4, 3]"], "linear", "t0, t1, None", Type, &["weight", "f64"]),
    (&["f32[2, 3]", "f32[4, 3]", "f32[5]"], "linear", "t0, t1, t2", Value, &["bias", "[5]"]),
    (&["f32[2, 3]", "f32[4, 3]", "f32[3, 4]"], "linear", "t0, t1, t2", Value, &["bias", "[3, 4]"]),
    (&["f32[2, 3]", "f32[4, 3]", "f64[4]"], "linear", "t0, t1, t2", Type, &["bias", "f64"]),
    (&["f32[2, 3]", "f32[4, 3]"], "linear", "t0, t1, 1.0", Type, &["bias", "tensor or None"]),
    (&["f32[2, 3]", "f32[4, 3]"], "linear", "t0, t1", Type, &["bias", "missing"]),
];

family_tests!();
