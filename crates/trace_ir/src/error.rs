//! The one error type of the IR and its passes.
//!
//! Every error names the op and the offending argument; its kind says which Python built-in
//! exception it becomes at the binding layer.

use std::fmt;

/// Which Python built-in exception an [`IrError`] maps to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    Value,
    Type,
    Index,
    Runtime,
    NotImplemented,
}

/// An error raised while recording, verifying or transforming a trace.
#[derive(Clone, Debug, PartialEq)]
pub struct IrError {
    pub kind: ErrorKind,
    /// The op the error is about, as printed in traces (`prims.add`, `ltorch.softmax`).
    pub op: String,
    pub message: String,
}

pub type Result<T> = std::result::Result<T, IrError>;

impl IrError {
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
