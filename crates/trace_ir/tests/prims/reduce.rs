//! Reduction prims: sum, prod, amax, amin, var, var_mean, argmax, argmin.

use super::{Invalid, Valid};
use trace_ir::ErrorKind::{Index, Type};

pub const VALID: &[Valid] = &[
    (&["f32[2, 3]"], "sum", "t0, (1,)", &["f32[2]"]),
    (&["f32[2, 3]"], "sum", "t0, (0, 1)", &["f32[]"]),
    (&["f32[2, 3]"], "sum", "t0, ()", &["f32[2, 3]"]),
    (&["f32[0, 3]"], "sum", "t0, (0,)", &["f32[3]"]),
    (&["i32[2, 3]"], "prod", "t0, (0,)", &["i32[3]"]),
    (&["f32[2, 3, 4]"], "amax", "t0, (0, 2)", &["f32[3]"]),
    (&["cuda:0 f16[2, 3]"], "amin", "t0, (1,)", &["cuda:0 f16[2]"]),
    (&["f32[2, 3]"], "var", "t0, (1,), 1", &["f32[2]"]),
    (&["c64[2, 3]"], "var", "t0, (0, 1), 0.5", &["f32[]"]),
    (&["f64[2, 3]"], "var_mean", "t0, (1,), 0", &["f64[2]", "f64[2]"]),
    (&["c128[2, 3]"], "var_mean", "t0, (0,), 1", &["f64[3]", "c128[3]"]),
    (&["f32[2, 3]"], "argmax", "t0, None", &["i64[]"]),
    (&["f32[2, 3]"], "argmax", "t0, 1", &["i64[2]"]),
    (&["i32[2, 3]"], "argmin", "t0, 0", &["i64[3]"]),
];

const INVALID: &[Invalid] = &[
    (&["f32[2, 3]"], "sum", "t0, (2,)", Index, &["dims", "out of range"]),
    (&["f32[2, 3]"], "sum", "t0, (1, 1)", trace_ir::ErrorKind::Value, &["dims", "more than once"]),
    (&["f32[2, 3]"], "sum", "t0, (-1,)", Index, &["dims", "canonical"]),
    (&["f32[2, 3]"], "prod", "t0, 1", Type, &["dims", "sequence of ints"]),
    (&[], "sum", "1.0, ()", Type, &["a", "tensor"]),
    (&["f32[0, 3]"], "amax", "t0, (0,)", Index, &["dims", "size 0"]),
    (&["f32[2, 3]"], "amin", "t0, (3,)", Index, &["dims", "out of range"]),
    (&["i64[2, 3]"], "var", "t0, (1,), 1", Type, &["a", "i64"]),
    (&["f32[2, 3]"], "var", "t0, (1,), 'x'", Type, &["correction"]),
    (&["f32[2, 3]"], "var_mean", "t0, (5,), 1", Index, &["dims"]),
    (&["b8[2, 3]"], "var_mean", "t0, (1,), 1", Type, &["a", "b8"]),
    (&["f32[2, 3]"], "argmax", "t0, 2", Index, &["dim", "out of range"]),
    (&["f32[2, 0]"], "argmax", "t0, 1", Index, &["dim", "size 0"]),
    (&["f32[0]"], "argmin", "t0, None", Index, &["a", "empty"]),
    (&["f32[2, 3]"], "argmin", "t0, (1,)", Type, &["dim", "int or None"]),
    (&["f32[2, 3]"], "argmin", "t0, -1", Index, &["dim", "canonical"]),
];

family_tests!();
