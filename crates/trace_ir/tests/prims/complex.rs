//! Complex prims: complex, polar, real, imag, conj, sgn, view_as_complex, view_as_real.

use super::{Invalid, Valid};
use trace_ir::ErrorKind::{NotImplemented, Runtime, Type, Value};

pub const VALID: &[Valid] = &[
    (&["f32[2, 3]", "f32[2, 3]"], "complex", "t0, t1", &["c64[2, 3]"]),
    (&["f64[0]", "f64[0]"], "complex", "t0, t1", &["c128[0]"]),
    (&["f32[4]", "f32[4]"], "polar", "t0, t1", &["c64[4]"]),
    (&["cuda:0 f64[2]", "cuda:0 f64[2]"], "polar", "t0, t1", &["cuda:0 c128[2]"]),
    (&["c64[2, 3]"], "real", "t0", &["f32[2, 3]"]),
    (&["c128[3]"], "imag", "t0", &["f64[3]"]),
    (&["c64[3]"], "conj", "t0", &["c64[3]"]),
    (&["f32[3]"], "conj", "t0", &["f32[3]"]),
    (&["c128[2, 2]"], "sgn", "t0", &["c128[2, 2]"]),
    (&["f32[3, 2]"], "view_as_complex", "t0, False", &["c64[3]"]),
    (&["f64[2]"], "view_as_complex", "t0, False", &["c128[]"]),
    (&["c64[3, 4]"], "view_as_real", "t0, False", &["f32[3, 4, 2]"]),
    (&["c128[]"], "view_as_real", "t0, True", &["f64[2]"]),
];

const INVALID: &[Invalid] = &[
    (&["f32[3]", "f64[3]"], "complex", "t0, t1", Runtime, &["imag", "scalar type"]),
    (&["i64[3]", "i64[3]"], "complex", "t0, t1", NotImplemented, &["real", "i64"]),
    (&["f16[3]", "f16[3]"], "polar", "t0, t1", NotImplemented, &["abs", "complex32"]),
    (&["f32[3]", "f32[2]"], "polar", "t0, t1", Value, &["abs", "angle"]),
    (&["f32[3]"], "complex", "t0, 1.0", Type, &["imag", "number"]),
    (&["f32[3]"], "real", "t0", Type, &["a", "complex"]),
    (&["f64[3]"], "imag", "t0", Type, &["a", "f64"]),
    (&["f32[3]"], "sgn", "t0", Type, &["a", "complex"]),
    (&["f32[3, 3]"], "view_as_complex", "t0, False", Runtime, &["a", "last dimension of size 2"]),
    (&["f32[]"], "view_as_complex", "t0, False", Runtime, &["a", "one or more dimensions"]),
    (&["bf16[3, 2]"], "view_as_complex", "t0, False", NotImplemented, &["a", "bf16"]),
    (&["f32[3, 2]"], "view_as_real", "t0, False", Type, &["a", "complex"]),
];

family_tests!();
