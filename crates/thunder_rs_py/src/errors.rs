//! The single mapping from IR errors to Python exceptions.
//!
//! The exception classes live in `thunder_rs/errors.py` (each subclasses both `ThunderError` and
//! the matching built-in), so Rust looks them up there once.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use trace_ir::{ErrorKind, IrError};

/// An [`IrError`] on its way to Python.
pub struct PyIrError(pub IrError);

impl From<IrError> for PyIrError {
    fn from(e: IrError) -> Self {
        PyIrError(e)
    }
}

fn class_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Value => "ThunderValueError",
        ErrorKind::Type => "ThunderTypeError",
        ErrorKind::Index => "ThunderIndexError",
        ErrorKind::Runtime => "ThunderRuntimeError",
        ErrorKind::NotImplemented => "ThunderNotImplementedError",
    }
}

static ERRORS_MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

impl From<PyIrError> for PyErr {
    fn from(PyIrError(e): PyIrError) -> PyErr {
        Python::attach(|py| {
            let module = ERRORS_MODULE.get_or_try_init(py, || py.import("thunder_rs.errors").map(|m| m.unbind()));
            let class = module.and_then(|m| m.bind(py).getattr(class_name(e.kind)));
            match class {
                Ok(class) => match class.call1((e.to_string(),)) {
                    Ok(instance) => PyErr::from_value(instance),
                    Err(err) => err,
                },
                Err(_) => PyRuntimeError::new_err(e.to_string()),
            }
        })
    }
}

/// Converts a `Result<T, IrError>` into a `PyResult<T>`.
pub fn py_result<T>(r: trace_ir::Result<T>) -> PyResult<T> {
    r.map_err(|e| PyIrError(e).into())
}

/// Runs `f`, turning a panic into `ThunderRuntimeError` naming `op`, so that no panic crosses
/// the FFI (PyO3 would raise `PanicException`, a `BaseException` that `except Exception` misses).
pub fn no_panic<T>(op: &str, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_string());
        let message = format!("internal error, a bug in thunder_rs: {message}");
        Err(PyIrError(IrError::new(ErrorKind::Runtime, op, message)).into())
    })
}
