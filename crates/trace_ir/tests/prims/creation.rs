//! Creation prims: full, iota, uniform.

use super::{Invalid, Valid};
use trace_ir::ErrorKind::{Type, Value};

pub const VALID: &[Valid] = &[
    (&[], "full", "(2, 3), 1.5, torch.device('cpu'), torch.float32", &["f32[2, 3]"]),
    (&[], "full", "(), 1, torch.device('cpu'), torch.int64", &["i64[]"]),
    (&[], "full", "(0,), True, torch.device('meta'), torch.bool", &["meta b8[0]"]),
    (&[], "full", "(2,), float('-inf'), torch.device('cuda:0'), torch.float16", &["cuda:0 f16[2]"]),
    (&[], "iota", "5, 0, 1, torch.device('cpu'), torch.int64", &["i64[5]"]),
    (&[], "iota", "0, 3, -1, torch.device('cpu'), torch.float32", &["f32[0]"]),
    (&[], "uniform", "(2, 2), 0.0, 1.0, torch.device('cuda:0'), torch.bfloat16", &["cuda:0 bf16[2, 2]"]),
    (&[], "uniform", "(3,), -1, 1, torch.device('cpu'), torch.float64", &["f64[3]"]),
    (&[], "uniform", "(3,), 0.5, 0.5, torch.device('cpu'), torch.float32", &["f32[3]"]),
];

const INVALID: &[Invalid] = &[
    // full
    (&[], "full", "(2, -1), 0.0, torch.device('cpu'), torch.float32", Value, &["shape", "negative"]),
    (&[], "full", "3, 0.0, torch.device('cpu'), torch.float32", Type, &["shape", "sequence of ints"]),
    (&[], "full", "(3,), None, torch.device('cpu'), torch.float32", Type, &["fill_value"]),
    (&[], "full", "(3,), 0.0, 'cpu', torch.float32", Type, &["device"]),
    (&[], "full", "(3,), 0.0, torch.device('cpu')", Type, &["dtype", "missing"]),
    (&[], "full", "(3,), 0.0, torch.device('cpu'), 'float32'", Type, &["dtype"]),
    // iota
    (&[], "iota", "-1, 0, 1, torch.device('cpu'), torch.int64", Value, &["length", "non-negative"]),
    (&[], "iota", "3, 0, 1, torch.device('cpu'), torch.bool", Type, &["dtype", "b8"]),
    (&[], "iota", "3, 0, 1, torch.device('cpu'), torch.complex64", Type, &["dtype", "c64"]),
    (&[], "iota", "3.0, 0, 1, torch.device('cpu'), torch.int64", Type, &["length", "int"]),
    (&[], "iota", "3, 0, 1.5, torch.device('cpu'), torch.int64", Type, &["step", "int"]),
    // uniform
    (&[], "uniform", "(3,), 0.0, 1.0, torch.device('cpu'), torch.int64", Type, &["dtype", "i64"]),
    (&[], "uniform", "(-3,), 0.0, 1.0, torch.device('cpu'), torch.float32", Value, &["shape", "negative"]),
    (&[], "uniform", "(3,), 'a', 1.0, torch.device('cpu'), torch.float32", Type, &["minval"]),
    (&[], "uniform", "(3,), 0.0, None, torch.device('cpu'), torch.float32", Type, &["maxval"]),
    (&[], "uniform", "(3,), 1.0, 0.0, torch.device('cpu'), torch.float32", Value, &["minval", "maxval"]),
];

family_tests!();
