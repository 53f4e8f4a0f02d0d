//! The one error type of the IR and its passes.
//!
//! Every error names the op and the offending argument; its kind says which Python built-in
//! exception it becomes at the binding layer.

use std::fmt;

/// Which Python built-in exception an [`IrError`] maps to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// `ValueError`: an argument has the right type and a wrong value (a shape mismatch).
    Value,
    /// `TypeError`: an argument has the wrong type (a float where a prim takes an integer tensor).
    Type,
    /// `IndexError`: a dimension or index out of range.
    Index,
    /// `RuntimeError`: a failure not caused by one argument (a trace that does not verify, a pass
    /// that fails).
    Runtime,
    /// `NotImplementedError`: a case thunder_rs does not handle yet (a prim without a rule for a
    /// dtype).
    NotImplemented,
}

/// An error raised while recording, verifying or transforming a trace.
#[derive(Clone, Debug, PartialEq)]
pub struct IrError {
    /// Which Python exception the binding layer raises.
    pub kind: ErrorKind,
    /// The op the error is about, as printed in traces (`prims.add`, `ltorch.softmax`).
    pub op: String,
    /// What is wrong, naming the offending argument; [`Display`](std::fmt::Display) prints it
    /// after `op` and a colon.
    pub message: String,
}

/// The result of every fallible function of the IR and of the passes.
pub type Result<T> = std::result::Result<T, IrError>;

impl IrError {
    /// An error about `op`; most code builds one through [`bail!`](crate::bail).
    ///
    /// ```
    /// use trace_ir::{ErrorKind, IrError};
    /// let error = IrError::new(ErrorKind::Value, "prims.add", "shapes [2] and [3] differ");
    /// assert_eq!(error.to_string(), "prims.add: shapes [2] and [3] differ");
    /// ```
    pub fn new(kind: ErrorKind, op: impl Into<String>, message: impl Into<String>) -> Self {
        IrError { kind, op: op.into(), message: message.into() }
    }
}

impl fmt::Display for IrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.op, self.message)
    }
}

impl std::error::Error for IrError {}

/// Builds an `Err` of the given kind: `bail!(Value, "prims.add", "shapes differ")`.
#[macro_export]
macro_rules! bail {
    ($kind:ident, $op:expr, $($fmt:tt)+) => {
        return Err($crate::IrError::new($crate::ErrorKind::$kind, $op, format!($($fmt)+)))
    };
}
