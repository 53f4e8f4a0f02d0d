//! Indexing prims: embedding, take, take_along_axis, gather, scatter_add, scatter, index_add, topk, sort.

use super::{Invalid, Valid};
use trace_ir::ErrorKind::{Index, Type, Value};

pub const VALID: &[Valid] = &[
    (&["i64[2, 3]", "f32[10, 4]"], "embedding", "t0, t1", &["f32[2, 3, 4]"]),
    (&["i32[]", "f16[10, 4]"], "embedding", "t0, t1", &["f16[4]"]),
    (&["f32[4, 5]", "i64[3]"], "take", "t0, t1, 0", &["f32[3, 5]"]),
    (&["f32[4, 5]", "i32[]"], "take", "t0, t1, 1", &["f32[4, 1]"]),
    (&["f32[4, 5]", "i64[4, 2]"], "take_along_axis", "t0, t1, 1", &["f32[4, 2]"]),
    (&["f32[4, 5]", "i64[7, 5]"], "take_along_axis", "t0, t1, 0", &["f32[7, 5]"]),
    (&["f32[4, 5]", "i64[2, 5]"], "gather", "t0, t1, 0", &["f32[2, 5]"]),
    (&["f32[4, 5]", "i64[2, 3]"], "gather", "t0, t1, 1", &["f32[2, 3]"]),
    (&["f32[4, 5]", "i64[2, 5]", "f32[2, 5]"], "scatter_add", "t0, t1, t2, 0", &["f32[4, 5]"]),
    (&["f32[4, 5]", "i64[2, 3]", "f32[3, 6]"], "scatter_add", "t0, t1, t2, 1", &["f32[4, 5]"]),
    (&["f32[4, 5]", "i64[2, 3]", "f32[3, 6]"], "scatter", "t0, t1, t2, 1", &["f32[4, 5]"]),
    (&["f32[4, 5]", "i64[3]", "f32[3, 5]"], "index_add", "t0, t1, t2, 0", &["f32[4, 5]"]),
    (&["f32[4, 5]", "i64[2]", "f32[4, 2]"], "index_add", "t0, t1, t2, 1", &["f32[4, 5]"]),
    (&["f32[4, 5]"], "topk", "t0, 2, 1, True, True", &["f32[4, 2]", "i64[4, 2]"]),
    (&["f32[4, 5]"], "topk", "t0, 0, 0, False, False", &["f32[0, 5]", "i64[0, 5]"]),
    (&["f32[4, 5]"], "sort", "t0, 0, False, True", &["f32[4, 5]", "i64[4, 5]"]),
    (&["i32[3]"], "sort", "t0, 0, True, False", &["i32[3]", "i64[3]"]),
];

const INVALID: &[Invalid] = &[
    // embedding
    (&["f32[2]", "f32[10, 4]"], "embedding", "t0, t1", Type, &["indices", "integer"]),
    (&["i64[2]", "f32[10]"], "embedding", "t0, t1", Value, &["weight", "rank 2"]),
    // take
    (&["f32[4, 5]", "f32[3]"], "take", "t0, t1, 0", Type, &["index", "integer"]),
    (&["f32[4, 5]", "i64[3, 1]"], "take", "t0, t1, 0", Value, &["index", "rank 0 or 1"]),
    (&["f32[4, 5]", "i64[3]"], "take", "t0, t1, 2", Index, &["dim", "out of range"]),
    (&["f32[4, 5]", "i64[3]"], "take", "t0, t1, -1", Index, &["dim", "canonical"]),
    // take_along_axis and gather
    (&["f32[4, 5]", "i64[4]"], "take_along_axis", "t0, t1, 0", Value, &["index", "rank"]),
    (&["f32[4, 5]", "i64[4, 6]"], "gather", "t0, t1, 0", Value, &["index", "dimension 1"]),
    (&["f32[4, 5]", "i64[4, 5]"], "gather", "t0, t1, 2", Index, &["dim", "out of range"]),
    (&["f32[4, 5]", "b8[4, 5]"], "gather", "t0, t1, 0", Type, &["index", "integer"]),
    // scatter_add
    (&["f32[4, 5]", "i64[2, 5]", "f64[2, 5]"], "scatter_add", "t0, t1, t2, 0", Type, &["source", "f64"]),
    (&["f32[4, 5]", "i64[2, 5]", "f32[2, 5]"], "scatter_add", "t0, t1, t2, 2", Index, &["dim", "out of range"]),
    (&["f32[4, 5]", "f32[2, 5]", "f32[2, 5]"], "scatter_add", "t0, t1, t2, 0", Type, &["index", "integer"]),
    (&["f32[4, 5]", "i64[2]", "f32[2, 5]"], "scatter_add", "t0, t1, t2, 0", Value, &["index", "rank"]),
    (&["f32[4, 5]", "i64[2, 5]", "f32[2]"], "scatter_add", "t0, t1, t2, 0", Value, &["source", "rank"]),
    (
        &["f32[4, 5]", "i64[2, 5]", "f32[2, 4]"],
        "scatter_add",
        "t0, t1, t2, 0",
        Value,
        &["index", "source", "dimension 1"],
    ),
    (&["f32[4, 5]", "i64[2, 6]", "f32[2, 6]"], "scatter_add", "t0, t1, t2, 0", Value, &["index", "a", "dimension 1"]),
    // scatter
    (&["f32[4, 5]", "i64[2, 5]", "f64[2, 5]"], "scatter", "t0, t1, t2, 0", Type, &["source", "f64"]),
    (&["f32[4, 5]", "i64[2, 6]", "f32[2, 6]"], "scatter", "t0, t1, t2, 0", Value, &["index", "a", "dimension 1"]),
    // index_add
    (&["f32[4, 5]", "i64[3, 1]", "f32[3, 5]"], "index_add", "t0, t1, t2, 0", Value, &["index", "rank 0 or 1"]),
    (&["f32[4, 5]", "i64[3]", "f32[2, 5]"], "index_add", "t0, t1, t2, 0", Value, &["source", "dimension 0"]),
    (&["f32[4, 5]", "i64[3]", "f32[3, 4]"], "index_add", "t0, t1, t2, 0", Value, &["source", "dimension 1"]),
    (&["f32[4, 5]", "i64[3]", "f32[3]"], "index_add", "t0, t1, t2, 0", Value, &["source", "rank"]),
    (&["f32[4, 5]", "i64[3]", "i64[3, 5]"], "index_add", "t0, t1, t2, 0", Type, &["source", "i64"]),
    // topk and sort
    (&["f32[4, 5]"], "topk", "t0, 6, 1, True, True", Index, &["k", "size 5"]),
    (&["f32[4, 5]"], "topk", "t0, -1, 1, True, True", Index, &["k"]),
    (&["f32[4, 5]"], "topk", "t0, 2, 2, True, True", Index, &["dim", "out of range"]),
    (&["f32[4, 5]"], "topk", "t0, 2, 1, 1, True", Type, &["largest", "bool"]),
    (&["f32[4, 5]"], "sort", "t0, 2, False, True", Index, &["dim", "out of range"]),
    (&["f32[4, 5]"], "sort", "t0, 0, 'desc', True", Type, &["descending", "bool"]),
    (&["f32[4, 5]"], "sort", "t0, 0, False", Type, &["stable", "missing"]),
];

family_tests!();
