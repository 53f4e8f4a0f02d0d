//! Fourier transform prims: fft_r2c, fft_c2r, fft_c2c.

use super::{Invalid, Valid};
use trace_ir::ErrorKind::{Index, Runtime, Type, Value};

pub const VALID: &[Valid] = &[
    (&["f32[3, 8]"], "fft_r2c", "t0, (1,), 0, True", &["c64[3, 5]"]),
    (&["f64[3, 7]"], "fft_r2c", "t0, (1, 0), 2, True", &["c128[2, 7]"]),
    (&["f32[0, 4]"], "fft_r2c", "t0, (1,), 1, False", &["c64[0, 4]"]),
    (&["c64[3, 5]"], "fft_c2r", "t0, (1,), 2, 8", &["f32[3, 8]"]),
    (&["c128[4, 5]"], "fft_c2r", "t0, (1, 0), 0, 9", &["f64[9, 5]"]),
    (&["c64[2, 3]"], "fft_c2c", "t0, (0, 1), 1, True", &["c64[2, 3]"]),
    (&["c128[2]"], "fft_c2c", "t0, (), 0, False", &["c128[2]"]),
];

const INVALID: &[Invalid] = &[
    (&["i64[3]"], "fft_r2c", "t0, (0,), 0, True", Type, &["a", "float"]),
    (&["c64[3]"], "fft_r2c", "t0, (0,), 0, True", Type, &["a", "c64"]),
    (&["f32[3]"], "fft_r2c", "t0, (), 0, True", Runtime, &["dim", "at least one"]),
    (&["f32[3]"], "fft_r2c", "t0, (0,), 3, True", Value, &["normalization"]),
    (&["f32[3]"], "fft_c2r", "t0, (0,), 0, 4", Type, &["a", "complex"]),
    (&["c64[3]"], "fft_c2r", "t0, (0,), 0, 0", Runtime, &["last_dim_size", "data points"]),
    (&["c64[3, 2]"], "fft_c2c", "t0, (2,), 0, True", Index, &["dim", "out of range"]),
    (&["c64[3, 2]"], "fft_c2c", "t0, (1, 1), 0, True", Runtime, &["dim", "unique"]),
];

family_tests!();
