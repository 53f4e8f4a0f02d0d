//! The trace IR of thunder_rs: plain data describing one recorded program.
//!
//! A [`Trace`] is a topologically ordered list of [`BoundSymbol`]s over SSA values held in one
//! arena. Prims ([`Prim`]) carry typed parameters and their meta rules; composite and fallback
//! symbols are registered by name from Python ([`symbols`]). Traces are immutable once built:
//! passes build new traces. This crate has no Python dependency.
//!
//! The parts, in the order a trace meets them:
//!
//! - [`TraceBuilder`] records calls, running each prim's meta rule ([`prims`]) for its outputs'
//!   dtype, device and shape; a call whose operands disagree is an [`IrError`] naming the prim.
//! - [`Trace`] is the result: an arena of values ([`ValueKind`], indexed by [`ValueId`]),
//!   inputs, top-level [`BoundSymbol`]s (a composite's decomposition nested under it), outputs.
//! - [`verify::verify`] checks SSA, arities and every prim's metadata.
//! - [`printer::print_trace`] writes Thunder's text form and [`parser::parse_trace`] reads it
//!   back (golden tests, dumps); [`binary`] is the compact form traces cross plugin boundaries
//!   in; [`pysrc`] emits the Python source of an execution trace.
//! - [`grad::Emitter`] is what each prim's VJP rule records the backward with.
//!
//! Errors carry an [`ErrorKind`] saying which Python exception they become, the op they are
//! about, and a message naming the offending argument.
//!
//! ```
//! use trace_ir::{parser::parse_trace, printer::print_trace, verify::verify};
//! use trace_ir::{Arg, DType, Device, TensorMeta, TraceBuilder, ValueKind};
//!
//! // Record `exp(x) * x` on a 2x3 float tensor.
//! let mut b = TraceBuilder::new();
//! let x = b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, vec![2, 3])));
//! let e = b.record_prim("exp", vec![Arg::Value(x)])?[0];
//! let y = b.record_prim("mul", vec![Arg::Value(e), Arg::Value(x)])?[0];
//! let trace = b.finish(Arg::Value(y))?;
//! verify(&trace)?;
//!
//! // The text form reads back to the same trace; so does the binary form.
//! let text = print_trace(&trace, "computation");
//! assert!(text.contains("t2 = prims.mul(t1, t0)  # t2: \"cpu f32[2, 3]\""));
//! assert_eq!(parse_trace(&text)?, trace);
//! assert_eq!(trace_ir::binary::decode(&trace_ir::binary::encode(&trace))?, trace);
//!
//! // Prims do not broadcast: a shape mismatch is an error naming the prim.
//! let mut b = TraceBuilder::new();
//! let x = b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, vec![2, 3])));
//! let row = b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, vec![3])));
//! let error = b.record_prim("add", vec![Arg::Value(x), Arg::Value(row)]).unwrap_err();
//! assert_eq!((error.kind, error.op.as_str()), (trace_ir::ErrorKind::Value, "prims.add"));
//! # Ok::<(), trace_ir::IrError>(())
//! ```

#![deny(missing_docs)]

pub mod binary;
pub mod dtype;
pub mod error;
pub mod grad;
pub mod ids;
pub mod parser;
pub mod prims;
pub mod printer;
pub mod pysrc;
pub mod sym;
pub mod symbols;
pub mod symfloat;
#[doc(hidden)]
pub mod testing;
pub mod trace;
pub mod value;
pub mod verify;

pub use dtype::{DType, Device, DeviceKind};
pub use error::{ErrorKind, IrError, Result};
pub use ids::{SymbolId, ValueId};
pub use prims::{Prim, PrimId};
pub use sym::{Dim, Facts};
pub use symbols::{SymbolKind, SymbolTable};
pub use symfloat::{FloatExpr, FloatFn, FloatOp, SymFloat};
pub use trace::{BoundSymbol, GradRule, OpenCalls, Segment, Symbol, Trace, TraceBuilder};
pub use value::{Arg, Kwargs, Scalar, TensorMeta, ValueKind};
