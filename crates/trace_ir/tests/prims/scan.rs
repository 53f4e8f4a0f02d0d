//! Scan prims: cumsum, cumprod, cummax, cummin, logcumsumexp.

use super::{Invalid, Valid};
use trace_ir::ErrorKind::{Index, NotImplemented, Type};

pub const VALID: &[Valid] = &[
    (&["f32[2, 3]"], "cumsum", "t0, 1", &["f32[2, 3]"]),
    (&["i64[4]"], "cumsum", "t0, 0", &["i64[4]"]),
    (&["f32[]"], "cumsum", "t0, 0", &["f32[]"]),
    (&["f64[0, 3]"], "cumprod", "t0, 0", &["f64[0, 3]"]),
    (&["f32[2, 3]"], "cummax", "t0, 0", &["f32[2, 3]", "i64[2, 3]"]),
    (&["b8[3]"], "cummin", "t0, 0", &["b8[3]", "i64[3]"]),
    (&["f64[2, 3]"], "logcumsumexp", "t0, 1", &["f64[2, 3]"]),
];

const INVALID: &[Invalid] = &[
    (&["f32[2, 3]"], "cumsum", "t0, 2", Index, &["dim", "out of range"]),
    (&["f32[2, 3]"], "cumsum", "t0, -1", Index, &["dim", "canonical"]),
    (&["b8[3]"], "cumprod", "t0, 0", Type, &["a", "bool"]),
    (&["c64[3]"], "cummax", "t0, 0", NotImplemented, &["a", "c64"]),
    (&["i64[3]"], "logcumsumexp", "t0, 0", Type, &["a", "i64"]),
    (&["f32[3]"], "cummin", "t0, (0,)", Type, &["dim", "int"]),
];

family_tests!();
