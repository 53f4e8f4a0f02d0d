//! Convolution prims: convolution (plain and transposed) and convolution_backward.

use super::{Invalid, Valid};
use trace_ir::ErrorKind::{Runtime, Type, Value};

pub const VALID: &[Valid] = &[
    (
        &["f32[2, 3, 8, 8]", "f32[4, 3, 3, 3]", "f32[4]"],
        "convolution",
        "t0, t1, t2, (1, 1), (1, 1), (1, 1), False, (0, 0), 1",
        &["f32[2, 4, 8, 8]"],
    ),
    (
        &["f32[2, 4, 9]", "f32[6, 2, 3]"],
        "convolution",
        "t0, t1, None, (2,), (0,), (1,), False, (0,), 2",
        &["f32[2, 6, 4]"],
    ),
    (
        &["f32[1, 4, 5, 5]", "f32[4, 3, 3, 3]"],
        "convolution",
        "t0, t1, None, (2, 2), (1, 1), (1, 1), True, (1, 1), 1",
        &["f32[1, 3, 10, 10]"],
    ),
    (
        &["f32[2, 4, 6, 6]", "f32[2, 3, 8, 8]", "f32[4, 3, 3, 3]"],
        "convolution_backward",
        "t0, t1, t2, (1, 1), (0, 0), (1, 1), False, (0, 0), 1, True, True, True",
        &["f32[2, 3, 8, 8]", "f32[4, 3, 3, 3]", "f32[4]"],
    ),
    (
        &["f32[2, 4, 6, 6]", "f32[2, 3, 8, 8]", "f32[4, 3, 3, 3]"],
        "convolution_backward",
        "t0, t1, t2, (1, 1), (0, 0), (1, 1), False, (0, 0), 1, False, True, False",
        &["f32[4, 3, 3, 3]"],
    ),
];

const INVALID: &[Invalid] = &[
    (
        &["f32[2, 3, 8, 8]", "f32[4, 2, 3, 3]"],
        "convolution",
        "t0, t1, None, (1, 1), (0, 0), (1, 1), False, (0, 0), 1",
        Runtime,
        &["a", "channels"],
    ),
    (
        &["f32[2, 3, 8]", "f32[4, 3, 3, 3]"],
        "convolution",
        "t0, t1, None, (1, 1), (0, 0), (1, 1), False, (0, 0), 1",
        Value,
        &["a", "batched"],
    ),
    (
        &["f32[2, 3, 8, 8]", "f64[4, 3, 3, 3]"],
        "convolution",
        "t0, t1, None, (1, 1), (0, 0), (1, 1), False, (0, 0), 1",
        Type,
        &["weight"],
    ),
    (
        &["f32[2, 3, 8, 8]", "f32[4, 3, 3, 3]"],
        "convolution",
        "t0, t1, None, (1,), (0, 0), (1, 1), False, (0, 0), 1",
        Value,
        &["stride"],
    ),
    (
        &["f32[2, 3, 2, 2]", "f32[4, 3, 3, 3]"],
        "convolution",
        "t0, t1, None, (1, 1), (0, 0), (1, 1), False, (0, 0), 1",
        Runtime,
        &["too small"],
    ),
    (
        &["f32[2, 3, 8, 8]", "f32[4, 3, 3, 3]", "f32[3]"],
        "convolution",
        "t0, t1, t2, (1, 1), (0, 0), (1, 1), False, (0, 0), 1",
        Runtime,
        &["bias"],
    ),
    (
        &["f32[2, 4, 5, 5]", "f32[2, 3, 8, 8]", "f32[4, 3, 3, 3]"],
        "convolution_backward",
        "t0, t1, t2, (1, 1), (0, 0), (1, 1), False, (0, 0), 1, True, True, True",
        Value,
        &["grad"],
    ),
];

family_tests!();
