//! Shape prims: broadcast_in_dim, reshape, transpose, slice, squeeze, cat, pad, flip.

use super::{Invalid, Valid};
use trace_ir::ErrorKind::{Index, Type, Value};

pub const VALID: &[Valid] = &[
    (&["f32[1, 3]"], "broadcast_in_dim", "t0, (4, 2, 3), (1, 2)", &["f32[4, 2, 3]"]),
    (&["f32[3]"], "broadcast_in_dim", "t0, (2, 3), (1,)", &["f32[2, 3]"]),
    (&["f32[]"], "broadcast_in_dim", "t0, (2, 2), ()", &["f32[2, 2]"]),
    (&["f32[1]"], "broadcast_in_dim", "t0, (0,), (0,)", &["f32[0]"]),
    (&["i64[2, 3]"], "reshape", "t0, (3, 2)", &["i64[3, 2]"]),
    (&["f32[1]"], "reshape", "t0, ()", &["f32[]"]),
    (&["f32[0, 3]"], "reshape", "t0, (3, 0, 5)", &["f32[3, 0, 5]"]),
    (&["f32[2, 3]"], "transpose", "t0, (1, 0)", &["f32[3, 2]"]),
    (&["f32[2, 3, 4]"], "transpose", "t0, (2, 0, 1)", &["f32[4, 2, 3]"]),
    (&["f32[4, 3]"], "slice", "t0, (0, 1), (2, 3), (1, 1)", &["f32[2, 2]"]),
    (&["f32[5, 3]"], "slice", "t0, (0, 0), (5, 3), (2, 2)", &["f32[3, 2]"]),
    (&["f32[4]"], "slice", "t0, (2,), (2,), (1,)", &["f32[0]"]),
    (&["f32[1, 3, 1]"], "squeeze", "t0, (0, 2)", &["f32[3]"]),
    (&["f32[2]"], "squeeze", "t0, ()", &["f32[2]"]),
    (&["f32[2, 3]", "f32[4, 3]"], "cat", "[t0, t1], 0", &["f32[6, 3]"]),
    (&["f32[2, 3]", "f32[2, 1]"], "cat", "[t0, t1, t0], 1", &["f32[2, 7]"]),
    (&["f32[2]"], "cat", "(t0,), 0", &["f32[2]"]),
    (&["f32[2, 3]"], "pad", "t0, 0.0, ((1, 1, 0), (0, 2, 1))", &["f32[4, 7]"]),
    (&["f32[2, 3]"], "pad", "t0, 1.0, ((-1, 0, 0), (0, -3, 0))", &["f32[1, 0]"]),
    (&["f32[0]"], "pad", "t0, 0.0, ((1, 2, 5),)", &["f32[3]"]),
    (&["f32[2, 3]"], "flip", "t0, (0, 1)", &["f32[2, 3]"]),
    (&["f32[2, 3]"], "flip", "t0, ()", &["f32[2, 3]"]),
];

const INVALID: &[Invalid] = &[
    // broadcast_in_dim
    (&["f32[1, 3]"], "broadcast_in_dim", "t0, (2, 3), (1,)", Value, &["broadcast_dimensions", "rank 2"]),
    (&["f32[3, 1]"], "broadcast_in_dim", "t0, (1, 3), (1, 0)", Value, &["broadcast_dimensions", "strictly increasing"]),
    (&["f32[3]"], "broadcast_in_dim", "t0, (3,), (1,)", Index, &["broadcast_dimensions", "out of range"]),
    (&["f32[2]"], "broadcast_in_dim", "t0, (3,), (0,)", Value, &["shape", "size 2"]),
    (&["f32[1]"], "broadcast_in_dim", "t0, (-1,), (0,)", Value, &["shape", "negative"]),
    (&["f32[1]"], "broadcast_in_dim", "t0, (2,), (-1,)", Index, &["broadcast_dimensions", "canonical"]),
    (&["f32[1]"], "broadcast_in_dim", "t0, 2, (0,)", Type, &["shape", "sequence of ints"]),
    // reshape
    (&["f32[2, 3]"], "reshape", "t0, (4, 2)", Value, &["shape", "size 6"]),
    (&["f32[2, 3]"], "reshape", "t0, (-1, 6)", Value, &["shape", "negative"]),
    (&["f32[2, 3]"], "reshape", "t0, (2.0, 3)", Type, &["shape", "ints"]),
    (&["f32[2, 3]"], "reshape", "t0", Type, &["shape", "missing"]),
    // transpose
    (&["f32[2, 3]"], "transpose", "t0, (0,)", Value, &["permutation", "rank 2"]),
    (&["f32[2, 3]"], "transpose", "t0, (0, 0)", Value, &["permutation", "more than once"]),
    (&["f32[2, 3]"], "transpose", "t0, (0, 2)", Index, &["permutation", "out of range"]),
    // slice
    (&["f32[4, 3]"], "slice", "t0, (0,), (2, 3), (1, 1)", Value, &["start_indices", "rank 2"]),
    (&["f32[4]"], "slice", "t0, (0,), (2,), (0,)", Value, &["strides", "positive"]),
    (&["f32[4]"], "slice", "t0, (0,), (5,), (1,)", Index, &["end_indices", "size 4"]),
    (&["f32[4]"], "slice", "t0, (3,), (2,), (1,)", Index, &["end_indices"]),
    (&["f32[4]"], "slice", "t0, (5,), (5,), (1,)", Index, &["start_indices", "size 4"]),
    (&["f32[4]"], "slice", "t0, (-1,), (2,), (1,)", Index, &["start_indices"]),
    // squeeze
    (&["f32[1, 3]"], "squeeze", "t0, (1,)", Value, &["dims", "size 3"]),
    (&["f32[1, 3]"], "squeeze", "t0, (2,)", Index, &["dims", "out of range"]),
    (&["f32[1, 3]"], "squeeze", "t0, (0, 0)", Value, &["dims", "more than once"]),
    (&["f32[1, 3]"], "squeeze", "t0, (-2,)", Index, &["dims", "canonical"]),
    // cat
    (&[], "cat", "[], 0", Value, &["tensors", "non-empty"]),
    (&["f32[2]"], "cat", "[t0, t0], 1", Index, &["dim", "rank 1"]),
    (&["f32[]"], "cat", "[t0], 0", Index, &["dim", "rank 0"]),
    (&["f32[2]", "f64[2]"], "cat", "[t0, t1], 0", Type, &["tensors[1]", "f64"]),
    (&["f32[2]", "cuda:0 f32[2]"], "cat", "[t0, t1], 0", Type, &["tensors[1]", "cuda:0"]),
    (&["f32[2, 3]", "f32[2, 4]"], "cat", "[t0, t1], 0", Value, &["tensors[1]", "[2, 4]"]),
    (&["f32[2, 3]", "f32[2]"], "cat", "[t0, t1], 0", Value, &["tensors[1]"]),
    (&["f32[2]"], "cat", "[t0, 1.0], 0", Type, &["tensors", "sequence of tensors"]),
    (&["f32[2]"], "cat", "t0, 0", Type, &["tensors"]),
    (&["f32[2]"], "cat", "[t0], -1", Index, &["dim", "canonical"]),
    // pad
    (&["f32[2, 3]"], "pad", "t0, 0.0, ((1, 1, 0),)", Value, &["padding_config", "rank 2"]),
    (&["f32[2]"], "pad", "t0, 0.0, ((1, 1, -1),)", Value, &["padding_config", "dilation"]),
    (&["f32[2]"], "pad", "t0, 0.0, ((-2, -1, 0),)", Value, &["padding_config", "negative size"]),
    (&["f32[2]"], "pad", "t0, 0.0, ((1, 1),)", Type, &["padding_config", "(lo, hi, dilation)"]),
    (&["f32[2]"], "pad", "t0, None, ((1, 1, 0),)", Type, &["padding_value"]),
    // flip
    (&["f32[2, 3]"], "flip", "t0, (2,)", Index, &["dims", "out of range"]),
    (&["f32[2, 3]"], "flip", "t0, (1, 1)", Value, &["dims", "more than once"]),
    (&["f32[2, 3]"], "flip", "t0, (-1,)", Index, &["dims", "canonical"]),
    (&[], "flip", "1.0, (0,)", Type, &["a", "tensor"]),
];

family_tests!();
