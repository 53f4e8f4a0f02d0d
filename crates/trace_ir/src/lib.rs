//! The trace IR of thunder_rs: plain data describing one recorded program.
//!
//! A [`Trace`] is a topologically ordered list of [`BoundSymbol`]s over SSA values held in one
//! arena. Prims ([`Prim`]) carry typed parameters and their meta rules; composite and fallback
//! symbols are registered by name from Python ([`symbols`]). Traces are immutable once built:
//! passes build new traces. This crate has no Python dependency.

pub mod binary;
pub mod dtype;
pub mod error;
pub mod grad;
pub mod ids;
pub mod parser;
pub mod prims;
pub mod printer;
pub mod pysrc;
pub mod symbols;
#[doc(hidden)]
pub mod testing;
pub mod trace;
pub mod value;
pub mod verify;

pub use dtype::{DType, Device, DeviceKind};
pub use error::{ErrorKind, IrError, Result};
pub use ids::{SymbolId, ValueId};
pub use prims::{Prim, PrimId};
pub use symbols::{SymbolKind, SymbolTable};
pub use trace::{BoundSymbol, GradRule, OpenCalls, Symbol, Trace, TraceBuilder};
pub use value::{Arg, Kwargs, Scalar, TensorMeta, ValueKind};
