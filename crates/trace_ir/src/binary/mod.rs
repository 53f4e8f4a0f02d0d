//! The binary form of a trace: what crosses the plugin boundary (see the `plugin_abi` crate), about
//! ten times faster to write and read than the printed text, which stays the form for people
//! (dumps, golden tests).
//!
//! Layout (integers are LEB128 varints unless sized; signed ones zigzag-encoded):
//!
//! ```text
//! magic  b"TRB\0", format version (u16, little-endian: FORMAT_VERSION)
//! names  count, then per name: kind (u8: prim, composite, fallback, effect, region), UTF-8 bytes
//! values count, then per value: its kind (tensor: dtype, device, requires_grad, shape; number;
//!        size: hint)
//! inputs count, value ids
//! bsyms  count, then per bound symbol: name index, args, kwargs, subsymbols, outputs, grad rule
//! output one argument
//! counts count, value ids (sizes that may be 0 or 1: `sym::Facts::count`)
//! guards count, then per guard: relation (u8), expression
//! ```
//!
//! A size is a tag (constant: the int; symbolic: expression and hint); an expression is its terms'
//! count, then per term its coefficient and atoms (count; each a value id, or a floor division or
//! remainder: expression and divisor). Value ids in expressions are wire ids like any other.
//!
//! Symbols are named once per trace in the name table, never by a process-local id: a plugin's
//! copy of `trace_ir` has its own [`crate::SymbolTable`], and prims' names are stable where their
//! declaration order is not. A prim's parameters cross as its printed call arguments and are read
//! back by the same decoding as the parser's. Values keep the metadata the sender holds (dtype,
//! device, shape, requires_grad), so nothing is re-derived on the way.
//!
//! The decoder renumbers: values get ids in the order the stream first mentions them (inputs,
//! then each call's arguments, decomposition, outputs, grad rule), which for a well-formed trace
//! is definition order, and values nothing mentions are dropped; the sender may number as it
//! likes (a rewrite defines new values with high ids before old ones). A truncated or corrupt
//! buffer is an error naming the byte offset, never a panic; the decoder does not verify the
//! trace (the pass manager's verifier does).

mod decode;
mod encode;
mod sizes;

pub use decode::decode;
pub use encode::encode;

/// The first bytes of every encoded trace.
pub const MAGIC: [u8; 4] = *b"TRB\0";

/// The version of the layout above; bumped on any change to it (and with it the plugin ABI).
pub const FORMAT_VERSION: u16 = 3;

/// The kinds of entries of the name table.
const NAME_PRIM: u8 = 0;
const NAME_COMPOSITE: u8 = 1;
const NAME_FALLBACK: u8 = 2;
const NAME_EFFECT: u8 = 3;
const NAME_REGION: u8 = 4;

/// Argument tags; numbers (`ValueKind::Number`) reuse the scalar ones.
const ARG_VALUE: u8 = 0;
const ARG_FALSE: u8 = 1;
const ARG_TRUE: u8 = 2;
const ARG_INT: u8 = 3;
const ARG_FLOAT: u8 = 4;
const ARG_NONE: u8 = 5;
const ARG_ELLIPSIS: u8 = 6;
const ARG_STR: u8 = 7;
const ARG_DTYPE: u8 = 8;
const ARG_DEVICE: u8 = 9;
const ARG_TUPLE: u8 = 10;
const ARG_LIST: u8 = 11;
const ARG_SLICE: u8 = 12;
const ARG_PYCONST: u8 = 13;
const ARG_SYM: u8 = 14;
const ARG_SYMFLOAT: u8 = 15;

/// Node tags of a symbolic float's operations (after [`ARG_SYMFLOAT`]).
const FLOAT_LEAF: u8 = 0;
const FLOAT_NEG: u8 = 1;
const FLOAT_BIN: u8 = 2;
const FLOAT_SQRT: u8 = 3;
/// A function of `math` (`FloatFn`): its code, then its operand.
const FLOAT_MATH: u8 = 4;

/// Value kind tags.
const VALUE_TENSOR: u8 = 0;
const VALUE_NUMBER: u8 = 1;
const VALUE_SIZE: u8 = 2;

/// How deeply arguments and decompositions may nest: deeper is a corrupt buffer (the decoder
/// recurses, and a crafted buffer must not overflow its stack).
const MAX_DEPTH: usize = 128;
