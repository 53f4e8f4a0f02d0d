//! `SymExpr`: a symbolic size as Python holds it while a program is traced with sizes that may
//! change between calls (see `trace_ir::sym`). Arithmetic is done here, in the IR's canonical
//! form; comparisons are decisions the recording takes on hints, so they go through
//! `Recorder.decide`, which records the guards they rely on.

use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError, PyZeroDivisionError};
use pyo3::prelude::*;
use pyo3::types::PyInt;
use std::sync::Arc;
use trace_ir::sym::{Dim, SymDim};

/// A symbolic int: an expression over size values (`t0 + 1`), with its value when recorded.
#[pyclass(module = "thunder_rs._core", name = "SymExpr", frozen)]
pub struct PySymExpr {
    pub dim: Arc<SymDim>,
}

/// An int or a `SymExpr` as a size.
pub fn dim_of(obj: &Bound<'_, PyAny>) -> PyResult<Dim> {
    if let Ok(s) = obj.cast::<PySymExpr>() {
        return Ok(Dim::Sym(s.get().dim.clone()));
    }
    if obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<pyo3::types::PyBool>() {
        return Ok(Dim::Const(obj.extract()?));
    }
    // Python's `SymInt` holds its `SymExpr` as `expr`.
    if let Ok(expr) = obj.getattr("expr") {
        if let Ok(s) = expr.cast::<PySymExpr>() {
            return Ok(Dim::Sym(s.get().dim.clone()));
        }
    }
    Err(PyTypeError::new_err(format!("expected an int or a symbolic size, got {}", obj.get_type().name()?)))
}

/// A size as Python sees it: an int, or a `SymExpr` when symbolic.
pub fn dim_to_py<'py>(py: Python<'py>, d: &Dim) -> PyResult<Bound<'py, PyAny>> {
    match d {
        Dim::Const(c) => Ok(c.into_pyobject(py)?.into_any()),
        Dim::Sym(s) => Ok(Bound::new(py, PySymExpr { dim: s.clone() })?.into_any()),
    }
}

/// The sizes of a shape as Python sees them.
pub fn shape_to_py<'py>(py: Python<'py>, shape: &[Dim]) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
    let items = shape.iter().map(|d| dim_to_py(py, d)).collect::<PyResult<Vec<_>>>()?;
    pyo3::types::PyTuple::new(py, items)
}

/// `result` of `a op b`, or Python's `OverflowError` where it leaves `i64` (`Dim::checked_mul`):
/// an error the caller takes as a size it cannot keep symbolic, never a wrapped value.
fn checked(result: Option<Dim>, a: &Dim, op: &str, b: &Dim) -> PyResult<Dim> {
    result.ok_or_else(|| {
        PyOverflowError::new_err(format!(
            "the symbolic size ({a}) {op} ({b}) leaves int64 (at its hints {} {op} {})",
            a.hint(),
            b.hint()
        ))
    })
}

fn divisor(k: &Bound<'_, PyAny>, op: &str) -> PyResult<i64> {
    match dim_of(k)? {
        Dim::Const(0) => Err(PyZeroDivisionError::new_err(format!("symbolic size {op} by zero"))),
        Dim::Const(k) if k > 0 => Ok(k),
        other => Err(PyValueError::new_err(format!(
            "a symbolic size can only be divided by a positive int, not {other} (operator {op})"
        ))),
    }
}

#[pymethods]
impl PySymExpr {
    /// Its value when the trace was recorded.
    #[getter]
    fn hint(&self) -> i64 {
        self.dim.hint
    }

    /// The size values it reads, by value id.
    fn values(&self) -> Vec<u32> {
        let mut out = Vec::new();
        self.dim.expr.for_each_value(&mut |v| out.push(v.0));
        out.sort_unstable();
        out.dedup();
        out
    }

    /// A lower bound over sizes of at least `least` (2: a size of the inputs; 0: a count, which
    /// calls compute), or None where the expression has none (`12 - t0`).
    #[pyo3(signature = (least = 2))]
    fn lower_bound(&self, least: i64) -> Option<i64> {
        self.as_dim().poly().lower_bound_over(&|_| least)
    }

    /// Whether `other` is the same expression (as data, not a decision on hints).
    fn same(&self, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        Ok(dim_of(other)? == Dim::Sym(self.dim.clone()))
    }

    fn __add__<'py>(&self, other: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let (a, b) = (self.as_dim(), dim_of(other)?);
        dim_to_py(other.py(), &checked(a.checked_add(&b), &a, "+", &b)?)
    }

    fn __radd__<'py>(&self, other: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        self.__add__(other)
    }

    fn __sub__<'py>(&self, other: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let (a, b) = (self.as_dim(), dim_of(other)?);
        dim_to_py(other.py(), &checked(a.checked_sub(&b), &a, "-", &b)?)
    }

    fn __rsub__<'py>(&self, other: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let (a, b) = (dim_of(other)?, self.as_dim());
        dim_to_py(other.py(), &checked(a.checked_sub(&b), &a, "-", &b)?)
    }

    fn __mul__<'py>(&self, other: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let (a, b) = (self.as_dim(), dim_of(other)?);
        dim_to_py(other.py(), &checked(a.checked_mul(&b), &a, "*", &b)?)
    }

    fn __rmul__<'py>(&self, other: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        self.__mul__(other)
    }

    fn __neg__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let a = self.as_dim();
        dim_to_py(py, &checked(Dim::Const(0).checked_sub(&a), &Dim::Const(0), "-", &a)?)
    }

    fn __floordiv__<'py>(&self, other: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        dim_to_py(other.py(), &self.as_dim().floordiv(divisor(other, "//")?))
    }

    fn __mod__<'py>(&self, other: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        dim_to_py(other.py(), &self.as_dim().rem(divisor(other, "%")?))
    }

    /// `self / other` as a size when `other` divides it exactly as data (`B*T*C / (B*T)`),
    /// else None.
    fn exact_div<'py>(&self, other: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let divisor = dim_of(other)?;
        if divisor.hint() == 0 {
            return Ok(None);
        }
        match self.dim.expr.exact_div(&divisor.poly()) {
            Some(q) => dim_to_py(other.py(), &Dim::from_poly(q, self.dim.hint / divisor.hint())).map(Some),
            None => Ok(None),
        }
    }

    fn __str__(&self) -> String {
        self.dim.expr.to_string()
    }

    fn __repr__(&self) -> String {
        format!("SymExpr({}, hint={})", self.dim.expr, self.dim.hint)
    }
}

impl PySymExpr {
    fn as_dim(&self) -> Dim {
        Dim::Sym(self.dim.clone())
    }
}
